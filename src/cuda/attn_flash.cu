/*
 * cuda/attn_flash.cu — the `flash` attention backend: our own FlashAttention-2-class kernels
 * (kernels/flash_fwd.cu, kernels/flash_bwd.cu), specialised per head dim, dtype, mask kind, diagonal
 * and ALiBi, compiled at run time with NVRTC and cached on disk (nvrtc_cache.h; the specialisations
 * and their launch shapes are in flash_specs.h).
 *
 * Serves: f16 / bf16 on sm_80+ (sm_90a cubins on Hopper); d_qk == d_v in {64, 128, 256}; sbhd, bshd,
 * thd (cu_seqlens and cu_seqlens_padded: per-sequence starts and lengths); no_mask, causal,
 * causal_bottom_right, their padding forms given by cu_seqlens, sliding windows; GQA/MQA; ALiBi
 * (default or custom slopes); LSE; any strides whose last dim is contiguous and 16-byte aligned (the
 * select views of a packed qkv buffer are read in place; gradients are written through the caller's
 * strides, so packed gradient buffers are filled in place); deterministic backward.
 * Declines, with the reason: f32/f64, other head dims, padding given as attention_mask tensors,
 * arbitrary masks, pre/post-scale bias, dropout, off-by-one/learnable softmax, return_max_logit,
 * strides that are not 16-byte tiles, extents beyond 32-bit indices, devices below sm_80, and a
 * missing kernel folder (the message lists where it looked).
 *
 * Forward: out (contiguous, q's format, zero-filled first when some rows are padding) and lse f32
 * [b, h, sq] (-inf for empty and padded rows), one kernel. Backward: bwd_pre (D = rowsum(dO O), lse
 * in log2 units, dQ accumulators zeroed), bwd (dK, dV written; dQ accumulated in f32), bwd_dq (dq).
 * thd gradients are zero-filled first (gaps between padded sequences are never visited otherwise).
 *
 * Variants (al_attn_inputs.variant: score_mod / mask_mod snippets, captures, a block mask): the
 * snippets become hook macros prepended to the kernel source (flash_specs.h, contract in
 * kernels/flash_common.cuh), compiled per (kernel family, spec, variant hash, block-mask flag) and kept
 * in an LRU of 64 loaded modules (below), which the Hopper forward's and backward's variants share
 * (al_flash_variant_function, attn_flash_sm90.cu); block_m / block_n must be multiples of 64.
 *
 * al_flash_info(buf, n) (exported, like al_fused_info): the NVRTC/cache counters and the log of
 * compiled / loaded specialisations with their times.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "attention_internal.h"
}
#include "cuda/cuda_internal.h"
#include "cuda/nvrtc_cache.h"
#include "cuda/flash_specs.h"
#include "cuda/attn_flash_sm90.h"
#include "cuda/flash_sm90_specs.h"
#include "cuda/host_profile.h"
#include "../../kernels/flash_params.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------------------------------- */
static int flash_dt(int32_t dtype) {
    switch (dtype) {
    case AL_DTYPE_F32: return AL_FLASH_DT_F32;
    case AL_DTYPE_F64: return AL_FLASH_DT_F64;
    case AL_DTYPE_F16: return AL_FLASH_DT_F16;
    case AL_DTYPE_BF16: return AL_FLASH_DT_BF16;
    default: return -1;
    }
}

/* The operand view of a q/k/v-like tensor in format fmt. */
static al_flash_op op_of(const al_tensor *t, int32_t fmt) {
    al_flash_op o;
    memset(&o, 0, sizeof o);
    o.ptr = al_tensor_data_ptr(t);
    o.dtype = flash_dt(t->dtype);
    if (fmt == AL_ATTN_FORMAT_THD) {
        o.sb = 0; o.st = t->stride[0]; o.sh = t->stride[1]; o.sc = t->stride[2];
    } else if (fmt == AL_ATTN_FORMAT_SBHD) {
        o.st = t->stride[0]; o.sb = t->stride[1]; o.sh = t->stride[2]; o.sc = t->stride[3];
    } else {
        o.sb = t->stride[0]; o.st = t->stride[1]; o.sh = t->stride[2]; o.sc = t->stride[3];
    }
    return o;
}

/* 1 when tiles of t can be read with 16-byte cp.async; else why not, into reason. */
static int tile_ok(const char *name, const al_tensor *t, int32_t fmt, char *reason, size_t n) {
    al_flash_op o = op_of(t, fmt);
    const int64_t es = al_dtype_size(t->dtype);
    if (o.sc != 1 || t->size[t->ndim - 1] * es % 16 != 0) {
        snprintf(reason, n, "%s: the head dim must be contiguous (stride 1, got %lld) for 16-byte tile loads",
                 name, (long long)o.sc);
        return 0;
    }
    if ((uintptr_t)o.ptr % 16 != 0 || (o.sb * es) % 16 != 0 || (o.st * es) % 16 != 0 || (o.sh * es) % 16 != 0) {
        snprintf(reason, n, "%s: start address (offset %lld elements) and batch/token/head strides (%lld, %lld, %lld "
                 "elements) must be multiples of 16 bytes for the flash kernels' cp.async tile loads",
                 name, (long long)t->offset, (long long)o.sb, (long long)o.st, (long long)o.sh);
        return 0;
    }
    return 1;
}

/* The specialisation of a plan (kind set by the caller). */
static al_flash_spec spec_of(const al_attn_plan *pl, int kind) {
    const al_attn_params *p = &pl->p;
    al_flash_spec s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.d = (int)p->d_qk;
    s.bf16 = pl->in.q->dtype == AL_DTYPE_BF16;
    s.alibi = p->bias_type == AL_ATTN_BIAS_ALIBI;
    if (p->window_left < 0 && p->window_right < 0) s.mask = AL_FLASH_MASK_NONE;
    else if (p->window_left < 0 && p->window_right == 0) s.mask = AL_FLASH_MASK_CAUSAL;
    else s.mask = AL_FLASH_MASK_WINDOW;
    s.bottom_right = (s.mask != AL_FLASH_MASK_NONE || s.alibi) ? pl->bottom_right : 0;
    const al_attn_variant *v = pl->in.variant;
    if (v) {
        const al_flash_hooks hk = al_flash_hooks_of(v);
        al_flash_spec_set_variant(&s, &hk, v->block_mask != NULL);
    }
    return s;
}

/* The NVRTC identity of a specialisation: file, -D options, function names, label. sm90 = 1: the
 * Hopper forward, 2 / 3: the Hopper backward's dK/dV / dQ kernel (flash_sm90_specs.h), else the
 * stage-1 kernels (flash_specs.h). */
typedef struct fl_build {
    const char *file;
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
    const char *optp[AL_FLASH_MAX_OPTS];
    int nopts;
    const char *names[4];
    int nfns;
    char label[128];
} fl_build;

static void build_of(const al_flash_spec *s, int sm90, fl_build *b) {
    if (sm90 >= 2) {
        b->file = al_flash_sm90_bwd_file();
        b->nopts = al_flash_sm90_bwd_options(s, sm90 - 2, b->opts);
        b->names[0] = al_flash_sm90_bwd_function(sm90 - 2);
        b->nfns = 1;
        al_flash_sm90_bwd_name(s, sm90 - 2, b->label, sizeof b->label);
    } else if (sm90) {
        b->file = al_flash_sm90_spec_file();
        b->nopts = al_flash_sm90_spec_options(s, b->opts);
        b->names[0] = al_flash_sm90_function();
        b->nfns = 1;
        al_flash_sm90_spec_name(s, b->label, sizeof b->label);
    } else {
        b->file = al_flash_spec_file(s);
        b->nopts = al_flash_spec_options(s, b->opts);
        b->nfns = al_flash_spec_functions(s, b->names);
        al_flash_spec_name(s, b->label, sizeof b->label);
    }
    for (int i = 0; i < b->nopts; i++) b->optp[i] = b->opts[i];
}

/* Compile or load a specialisation's functions (prefix: a variant's generated source, or NULL). */
static al_status nvrtc_functions(int32_t dev, const al_flash_spec *s, int sm90, const char *prefix, CUfunction *fns,
                                 int *nfns) {
    fl_build b;
    build_of(s, sm90, &b);
    *nfns = b.nfns;
    return al_nvrtc_get(dev, b.file, prefix, b.optp, b.nopts, b.names, b.nfns, b.label, fns);
}

/* ---- variant specialisations: an LRU of loaded modules ---------------------------------------------
 * Key: (device, kernel family: stage-1, the sm90 forward or one sm90 backward kernel, spec, the options that
 * depend on the environment: the backward kernels' persistence, ATTNLAB_FLASH_SM90_PERSIST) where the spec
 * carries the variant's 128-bit source hash and the block-mask flag
 * (al_flash_spec_set_variant hashes the five snippet strings on every call: FNV-1a over a few hundred
 * bytes, well under a microsecond, so the caller needs no stable key of its own). A hit costs that
 * hash plus a scan of FL_VCACHE entries; a miss builds the source and goes through nvrtc_cache (disk
 * cache, else NVRTC). The 65th distinct variant evicts the least recently used one and unloads its
 * module. g_vc_lock is held by a variant call from the lookup until its last kernel is queued, so no
 * thread can launch a function whose module another thread is unloading (al_nvrtc_unload also waits
 * for the device first, for kernels already queued). Default specialisations never pass through here. */
#define FL_VCACHE 64
typedef struct fl_ventry {
    int used;
    int32_t dev;
    int sm90;                  /* kernel family: 0 stage 1, 1 the Hopper forward, 2 / 3 the Hopper backward's kernels */
    int env_opts;              /* vc_env_opts: a module compiled persistent must not serve a per-item launch */
    al_flash_spec spec;
    char *prefix;              /* the generated source (needed again to unload) */
    fl_build build;            /* its file, options and names as built (to unload it under any later environment) */
    CUfunction fns[4];
    int nfns;
    uint64_t stamp;
} fl_ventry;
static fl_ventry g_vc[FL_VCACHE];
static uint64_t g_vc_clock;
static pthread_mutex_t g_vc_lock = PTHREAD_MUTEX_INITIALIZER;

/* The build options of a family that the environment chooses (build_of's option list reads it): the Hopper
 * backward kernels' -DAL_SM90_PERSIST (flash_sm90_specs.h; the launch grid follows the same switch) */
static int vc_env_opts(const al_flash_spec *s, int sm90) { return sm90 >= 2 ? al_flash_sm90_bwd_persist(s, sm90 - 2) : 0; }

/* The loaded variant module of (dev, family, spec) built with today's environment-chosen options, or NULL;
 * g_vc_lock held. */
static fl_ventry *vc_find(int32_t dev, const al_flash_spec *s, int sm90) {
    const int env_opts = vc_env_opts(s, sm90);
    for (int i = 0; i < FL_VCACHE; i++)
        if (g_vc[i].used && g_vc[i].dev == dev && g_vc[i].sm90 == sm90 && g_vc[i].env_opts == env_opts &&
            memcmp(&g_vc[i].spec, s, sizeof *s) == 0)
            return &g_vc[i];
    return NULL;
}

/* g_vc_lock held. */
static al_status variant_functions(int32_t dev, const al_flash_spec *s, int sm90, const al_attn_variant *v,
                                   CUfunction *fns, int *nfns) {
    int slot = -1;
    fl_ventry *hit = vc_find(dev, s, sm90);
    if (hit) {
        hit->stamp = ++g_vc_clock;
        memcpy(fns, hit->fns, sizeof hit->fns);
        *nfns = hit->nfns;
        return AL_OK;
    }
    const al_flash_hooks hk = al_flash_hooks_of(v);
    char *prefix = al_flash_variant_source(&hk, sm90 >= 2 ? al_flash_sm90_bwd_file()
                                           : sm90    ? al_flash_sm90_spec_file()
                                                     : al_flash_spec_file(s));
    if (!prefix) return al_error(AL_ERR_OOM, "out of host memory for a variant's source");
    al_status st = nvrtc_functions(dev, s, sm90, prefix, fns, nfns);
    if (st != AL_OK) {
        free(prefix);
        return al_error_prefix(st, "variant (score_mod/mask_mod) kernel");
    }
    for (int i = 0; i < FL_VCACHE && slot < 0; i++)
        if (!g_vc[i].used) slot = i;
    if (slot < 0) {   /* evict the least recently used variant */
        slot = 0;
        for (int i = 1; i < FL_VCACHE; i++)
            if (g_vc[i].stamp < g_vc[slot].stamp) slot = i;
        const fl_build *ob = &g_vc[slot].build;
        al_nvrtc_unload(g_vc[slot].dev, ob->file, g_vc[slot].prefix, ob->optp, ob->nopts, ob->names, ob->nfns);
        free(g_vc[slot].prefix);
    }
    fl_ventry *e = &g_vc[slot];
    e->used = 1;
    e->dev = dev;
    e->sm90 = sm90;
    e->env_opts = vc_env_opts(s, sm90);
    build_of(s, sm90, &e->build);              /* (its optp point into e->build itself) */
    e->spec = *s;
    e->prefix = prefix;
    memcpy(e->fns, fns, sizeof e->fns);
    e->nfns = *nfns;
    e->stamp = ++g_vc_clock;
    return AL_OK;
}

/* Compiles in parallel those of a call's kernel families (0 stage 1, 1 the Hopper forward, 2 / 3 the Hopper
 * backward's kernels) that are new (al_nvrtc_prefetch); variants: g_vc_lock held, families already in the
 * LRU skipped. The nvrtc_functions / variant_functions calls that follow then load them from disk. */
void al_flash_prefetch(int32_t dev, const al_flash_spec *s, const al_attn_variant *v, const int *families, int n) {
    fl_build b[4];
    al_nvrtc_prog pg[4];
    char *prefix[4] = {NULL, NULL, NULL, NULL};
    int np = 0;
    for (int i = 0; i < n && i < 4; i++) {
        const int fam = families[i];
        if (s->variant && vc_find(dev, s, fam)) continue;
        if (s->variant) {
            const al_flash_hooks hk = al_flash_hooks_of(v);
            prefix[np] = al_flash_variant_source(&hk, fam >= 2 ? al_flash_sm90_bwd_file()
                                                 : fam    ? al_flash_sm90_spec_file()
                                                          : al_flash_spec_file(s));
            if (!prefix[np]) break;
        }
        build_of(s, fam, &b[np]);
        pg[np].file = b[np].file;
        pg[np].prefix = prefix[np];
        pg[np].opts = b[np].optp;
        pg[np].nopts = b[np].nopts;
        pg[np].names = b[np].names;
        pg[np].nnames = b[np].nfns;
        pg[np].label = b[np].label;
        np++;
    }
    al_nvrtc_prefetch(dev, pg, np);
    for (int i = 0; i < np; i++) free(prefix[i]);
}

static al_status get_functions(int32_t dev, const al_attn_plan *pl, const al_flash_spec *s, CUfunction *fns,
                               int *nfns) {
    if (s->variant) return variant_functions(dev, s, 0, pl->in.variant, fns, nfns);
    return nvrtc_functions(dev, s, 0, NULL, fns, nfns);
}

al_status al_flash_variant_function(int32_t dev, const al_flash_spec *s, const al_attn_variant *v, int sm90,
                                    CUfunction *fn) {
    CUfunction fns[4];
    int nf = 0;
    AL_TRY(variant_functions(dev, s, sm90, v, fns, &nf));
    *fn = fns[0];
    return AL_OK;
}

static al_status launch(CUfunction f, const char *what, unsigned gx, unsigned gy, unsigned gz, unsigned threads,
                        unsigned smem, cudaStream_t s, al_flash_params *prm) {
    CUresult r = CUDA_SUCCESS;
    if (smem > 48 * 1024) r = cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem);
    void *args[] = {prm};
    al_cu_note_launch(what);   /* an asynchronous fault is reported later, naming it (launch_log.cu) */
    if (r == CUDA_SUCCESS) r = cuLaunchKernel(f, gx, gy, gz, threads, 1, 1, smem, (CUstream)s, args, NULL);
    if (r != CUDA_SUCCESS) {
        const char *msg = NULL, *nm = NULL;
        cuGetErrorString(r, &msg);
        cuGetErrorName(r, &nm);
        return al_error(AL_ERR_CUDA, "launching %s (grid %u x %u x %u, %u threads, %u bytes of shared memory) failed: "
                        "%s (%s)", what, gx, gy, gz, threads, smem, msg ? msg : "?", nm ? nm : "?");
    }
    return AL_OK;
}

/* ---- supports ------------------------------------------------------------------------------------- */
static int32_t fl_supports(const al_attn_plan *pl, char *reason, size_t n) {
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    if (q->device_type != AL_DEVICE_CUDA) { snprintf(reason, n, "tensors are on the cpu"); return 0; }
    const int32_t dev = q->device_index;
    if (dev < 0 || dev >= al_cu_ndev) { snprintf(reason, n, "device cuda:%d does not exist", dev); return 0; }
    int cc = 0;
    char arch[16];
    if (al_nvrtc_arch(dev, arch, sizeof arch, &cc) != AL_OK) {
        snprintf(reason, n, "cannot read cuda:%d's compute capability: %s", dev, al_last_error());
        al_clear_error();
        return 0;
    }
    if (cc < 80) {
        snprintf(reason, n, "cuda:%d is sm_%d: the flash kernels need sm_80 or newer (mma.sync bf16, cp.async)", dev, cc);
        return 0;
    }
    if (q->dtype != AL_DTYPE_F16 && q->dtype != AL_DTYPE_BF16) {
        snprintf(reason, n, "%s inputs: the flash kernels take f16 and bf16 (f32 runs on the unfused backend)",
                 al_dtype_name(q->dtype));
        return 0;
    }
    if (p->compute_dtype != AL_DTYPE_F32) {
        snprintf(reason, n, "compute_dtype=%s: the flash kernels compute in f32", al_dtype_name(p->compute_dtype));
        return 0;
    }
    if (p->d_qk != p->d_v || (p->d_qk != 64 && p->d_qk != 128 && p->d_qk != 256)) {
        snprintf(reason, n, "head dims d_qk=%lld, d_v=%lld: the flash kernels take d_qk == d_v in {64, 128, 256}",
                 (long long)p->d_qk, (long long)p->d_v);
        return 0;
    }
    if (p->mask_type == AL_ATTN_MASK_ARBITRARY) {
        snprintf(reason, n, "attn_mask_type=arbitrary: the flash kernels take no mask tensor (a mask_mod variant can)");
        return 0;
    }
    if (pl->q_valid || pl->kv_valid) {
        snprintf(reason, n, "padding given as attention_mask tensors: the flash kernels take padding as cu_seqlens "
                 "(per-sequence lengths)");
        return 0;
    }
    if (p->bias_type == AL_ATTN_BIAS_PRE_SCALE || p->bias_type == AL_ATTN_BIAS_POST_SCALE) {
        snprintf(reason, n, "core_attention_bias_type=%s: the flash kernels take no bias tensor (ALiBi is supported)",
                 p->bias_type == AL_ATTN_BIAS_PRE_SCALE ? "pre_scale_bias" : "post_scale_bias");
        return 0;
    }
    if (p->dropout_p > 0.0) {
        snprintf(reason, n, "attention_dropout=%g: the flash kernels have no dropout", p->dropout_p);
        return 0;
    }
    if (p->softmax_type != AL_ATTN_SOFTMAX_VANILLA) {
        snprintf(reason, n, "softmax_type=%s: the flash kernels implement the vanilla softmax only",
                 p->softmax_type == AL_ATTN_SOFTMAX_OFF_BY_ONE ? "off-by-one" : "learnable");
        return 0;
    }
    if (p->return_max_logit) {
        snprintf(reason, n, "return_max_logit: the flash kernels do not compute max_logit");
        return 0;
    }
    const al_tensor *kv[2] = {pl->in.k, pl->in.v};
    for (int t = 0; t < 2; t++)
        if (kv[t]->device_type != AL_DEVICE_CUDA || kv[t]->device_index != dev) {
            snprintf(reason, n, "%s is not on cuda:%d with q", t ? "v" : "k", dev);
            return 0;
        }
    const int32_t fmt = p->qkv_format;
    if (!tile_ok("q", q, fmt, reason, n) || !tile_ok("k", pl->in.k, fmt, reason, n) ||
        !tile_ok("v", pl->in.v, fmt, reason, n))
        return 0;
    if (p->sq > INT32_MAX / 2 || p->skv > INT32_MAX / 2 || p->b > 65535 || p->h > 65535 ||
        p->b * p->h * p->sq > INT32_MAX / 32) {
        snprintf(reason, n, "extents b=%lld h=%lld sq=%lld skv=%lld exceed the flash kernels' 32-bit indices / grid",
                 (long long)p->b, (long long)p->h, (long long)p->sq, (long long)p->skv);
        return 0;
    }
    const al_attn_variant *var = pl->in.variant;
    if (var && var->block_mask && (var->block_m % 64 != 0 || var->block_n % 64 != 0 || var->block_m > (1 << 30) ||
                                   var->block_n > (1 << 30))) {
        snprintf(reason, n, "block_mask blocks of %lld x %lld: the flash kernels need block_m and block_n multiples of 64 "
                 "(forward tiles 64 x %d, backward tiles 32 x 64), e.g. block=128",
                 (long long)var->block_m, (long long)var->block_n, p->d_qk == 256 ? 32 : 64);
        return 0;
    }
    char kdir[1024];
    if (al_nvrtc_kernel_dir(kdir, sizeof kdir) != AL_OK) {
        snprintf(reason, n, "%s", al_last_error());
        al_clear_error();
        return 0;
    }
    return 1;
}

/* ---- per-call context ------------------------------------------------------------------------------- */
typedef struct fl_ctx {
    int32_t dev;
    cudaStream_t s;
    void *tmp[8];
    int64_t tmp_bytes[8];
    int ntmp;
    al_tensor dout_copy;
} fl_ctx;

static al_status fl_alloc(fl_ctx *c, int64_t bytes, void **p) {
    *p = NULL;
    if (c->ntmp >= 8) return al_error(AL_ERR_INTERNAL, "too many temporaries");
    AL_TRY(al_cu_malloc(c->dev, bytes > 0 ? bytes : 1, p));
    c->tmp[c->ntmp] = *p;
    c->tmp_bytes[c->ntmp++] = bytes > 0 ? bytes : 1;
    return AL_OK;
}

static void fl_release(fl_ctx *c) {
    /* one stream per device: later work reusing these blocks is queued after this call's kernels */
    for (int i = 0; i < c->ntmp; i++) al_cu_free(c->dev, c->tmp[i], c->tmp_bytes[i]);
    c->ntmp = 0;
    al_tensor_release(&c->dout_copy);
}

/* Upload the plan's per-sequence arrays and slopes; fill the common params. */
static al_status fl_params(fl_ctx *c, const al_attn_plan *pl, al_flash_params *prm) {
    const al_attn_params *p = &pl->p;
    const int32_t fmt = p->qkv_format;
    const int64_t B = p->b, H = p->h;
    memset(prm, 0, sizeof *prm);
    prm->q = op_of(pl->in.q, fmt);
    prm->k = op_of(pl->in.k, fmt);
    prm->v = op_of(pl->in.v, fmt);
    prm->B = (int)B; prm->H = (int)H; prm->HG = (int)p->hg; prm->SQ = (int)p->sq; prm->SKV = (int)p->skv;
    prm->wl = (int)p->window_left;
    prm->wr = (int)p->window_right;
    prm->scale = (float)p->softmax_scale;
    prm->scale_log2 = (float)(p->softmax_scale * 1.4426950408889634);
    const al_attn_variant *var = pl->in.variant;
    if (var) {   /* captures and the block mask stay where the caller has them (validated by attention.c) */
        for (int k = 0; k < var->ncaptures; k++) {
            prm->cap[k] = al_tensor_data_ptr(var->captures[k]);
            prm->cap_grad[k] = var->capture_grads[k] ? (float *)al_tensor_data_ptr(var->capture_grads[k]) : NULL;
        }
        if (var->block_mask) {
            prm->bmask = (const unsigned char *)al_tensor_data_ptr(var->block_mask);
            prm->bm_sb = pl->bmask_stride[0];
            prm->bm_sh = pl->bmask_stride[1];
            prm->bm_sm = pl->bmask_stride[2];
            prm->bm_sn = pl->bmask_stride[3];
            prm->bm_block_m = (int)var->block_m;
            prm->bm_block_n = (int)var->block_n;
            prm->m_reverse = var->block_order ? 1 : 0;
        }
    }
    const int thd = fmt == AL_ATTN_FORMAT_THD;
    int lens = thd || pl->has_padding;
    for (int64_t i = 0; i < B && !lens; i++) lens = pl->q_len[i] != p->sq || pl->kv_len[i] != p->skv;
    const int64_t n_i64 = (thd ? 2 : 0) + (lens ? 2 : 0);
    const int64_t bytes = 8 * n_i64 * B + (pl->alibi ? 4 * B * H : 0);
    if (bytes == 0) return AL_OK;
    char *host = (char *)malloc((size_t)bytes);
    if (!host) return al_error(AL_ERR_OOM, "out of host memory");
    int64_t *hp = (int64_t *)host;
    int k = 0;
    if (thd) { memcpy(hp + k * B, pl->q_start, 8 * B); k++; memcpy(hp + k * B, pl->kv_start, 8 * B); k++; }
    if (lens) { memcpy(hp + k * B, pl->q_len, 8 * B); k++; memcpy(hp + k * B, pl->kv_len, 8 * B); k++; }
    if (pl->alibi) memcpy(host + 8 * n_i64 * B, pl->alibi, (size_t)(4 * B * H));
    void *d = NULL;
    al_status st = fl_alloc(c, bytes, &d);
    if (st == AL_OK) st = AL_CUDA_ST(cudaMemcpyAsync(d, host, (size_t)bytes, cudaMemcpyHostToDevice, c->s));
    if (st == AL_OK) st = AL_CUDA_ST(cudaStreamSynchronize(c->s));   /* host buffer freed below */
    free(host);
    AL_TRY(st);
    const long long *dp = (const long long *)d;
    k = 0;
    if (thd) { prm->q_start = dp + k * B; k++; prm->kv_start = dp + k * B; k++; }
    if (lens) { prm->q_len = dp + k * B; k++; prm->kv_len = dp + k * B; k++; }
    if (pl->alibi) prm->alibi = (const float *)((const char *)d + 8 * n_i64 * B);
    return AL_OK;
}

/* ---- forward ------------------------------------------------------------------------------------------ */
/* host profile of the forward (ATTNLAB_HOST_PROFILE=1, host_profile.h): pt[0..7] are the clock at the call's
 * start and after each stage; al_flash_info appends the means */
enum { FLP_BEGIN, FLP_OUTPUTS, FLP_PARAMS, FLP_TMAPS, FLP_LOOKUP, FLP_LAUNCH, FLP_TAIL, FLP_N };
static al_hprof g_fwd_prof = {"flash forward", FLP_N, {"begin", "outputs", "params", "tmaps", "lookup", "launch", "tail"},
                              {0}, 0};

static al_status fl_forward_inner(fl_ctx *c, const al_attn_plan *pl, al_tensor *out, al_tensor *lse, double *pt) {
    const al_attn_params *p = &pl->p;
    const al_tensor *q = pl->in.q;
    const al_flash_spec spec = spec_of(pl, AL_FLASH_FWD);
    const al_flash_tiles tl = al_flash_spec_tiles(&spec);

    int64_t osize[4];
    const int nd = q->ndim;
    for (int d = 0; d < nd; d++) osize[d] = q->size[d];
    osize[nd - 1] = p->d_v;
    AL_TRY(al_tensor_empty(out, nd, osize, q->dtype, AL_DEVICE_CUDA, c->dev));
    const int64_t lsize[3] = {p->b, p->h, p->sq};
    AL_TRY(al_tensor_empty(lse, 3, lsize, AL_DTYPE_F32, AL_DEVICE_CUDA, c->dev));
    if (pt) pt[FLP_OUTPUTS + 1] = al_hprof_now();

    al_flash_params prm;
    AL_TRY(fl_params(c, pl, &prm));
    prm.o = op_of(out, p->qkv_format);
    prm.lse = (float *)al_tensor_data_ptr(lse);
    /* rows past a sequence's length (padding, thd gaps) are never written by the kernel */
    if (prm.q_len) {
        int64_t nbytes = al_dtype_size(out->dtype);
        for (int d = 0; d < out->ndim; d++) nbytes *= out->size[d];     /* contiguous: numel elements */
        AL_CUDA_TRY(cudaMemsetAsync(al_tensor_data_ptr(out), 0, (size_t)nbytes, c->s));
    }
    if (pt) pt[FLP_PARAMS + 1] = al_hprof_now();
    if (p->sq == 0 || p->b == 0) return AL_OK;
    /* the Hopper (wgmma/TMA) forward where it applies (ATTNLAB_FLASH_SM90=0 turns it off); the
     * stage-1 kernel is compiled only when it does not */
    int done = 0;
    AL_TRY(al_flash_sm90_forward(c->dev, pl, &prm, c->s, &done, pt ? pt + FLP_TMAPS + 1 : NULL));
    if (done) {
        if (pt) pt[FLP_LAUNCH + 1] = al_hprof_now();
        return AL_OK;
    }
    if (pt) pt[FLP_TMAPS + 1] = al_hprof_now();   /* stage 1: no tensor maps */
    CUfunction fns[4];
    int nf = 0;
    AL_TRY(get_functions(c->dev, pl, &spec, fns, &nf));
    if (pt) pt[FLP_LOOKUP + 1] = al_hprof_now();
    const unsigned gx = (unsigned)((p->sq + tl.bm - 1) / tl.bm);
    al_status st = launch(fns[0], "al_flash_fwd", gx, (unsigned)p->h, (unsigned)p->b, (unsigned)tl.threads,
                          (unsigned)tl.smem, c->s, &prm);
    if (pt) pt[FLP_LAUNCH + 1] = al_hprof_now();
    return st;
}

static al_status fl_forward(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit) {
    double pt[FLP_N + 1];
    const int prof = al_hprof_on();
    if (prof) {
        pt[0] = al_hprof_now();
        pt[FLP_LAUNCH + 1] = 0.0;   /* stays 0 when nothing was launched: not recorded */
    }
    fl_ctx c;
    memset(&c, 0, sizeof c);
    c.dev = pl->in.q->device_index;
    al_status st = al_cu_begin("attention (flash)", c.dev, &c.s);
    if (prof) pt[FLP_BEGIN + 1] = al_hprof_now();
    if (pl->in.variant) pthread_mutex_lock(&g_vc_lock);     /* see the variant LRU above */
    if (st == AL_OK) st = fl_forward_inner(&c, pl, out, lse, prof ? pt : NULL);
    if (pl->in.variant) pthread_mutex_unlock(&g_vc_lock);
    fl_release(&c);
    if (st != AL_OK) {
        st = al_error_prefix(st, "attention_forward (flash)");
        al_tensor_release(out);
        al_tensor_release(lse);
        if (max_logit) al_tensor_release(max_logit);
    } else if (prof && pt[FLP_LAUNCH + 1] > 0.0) {
        pt[FLP_TAIL + 1] = al_hprof_now();
        al_hprof_add(&g_fwd_prof, pt);
    }
    return st;
}

/* ---- backward ----------------------------------------------------------------------------------------- */
static al_status fl_backward_inner(fl_ctx *c, const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout,
                                   const al_tensor *lse, al_tensor *dq, al_tensor *dk, al_tensor *dv) {
    const al_attn_params *p = &pl->p;
    const int32_t fmt = p->qkv_format;
    char b1[96];
    const al_tensor *dev_t[] = {out, dout, lse, dq, dk, dv};
    static const char *dev_n[] = {"out", "dout", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 6; i++)
        if (dev_t[i]->device_type != AL_DEVICE_CUDA || dev_t[i]->device_index != c->dev)
            return al_error(AL_ERR_ARG, "%s must be on cuda:%d with q, got %s", dev_n[i], c->dev,
                            al_tensor_describe(dev_t[i], b1, sizeof b1));
    for (int i = 0; i < 6; i++)
        if (i != 2 && flash_dt(dev_t[i]->dtype) < 0)
            return al_error(AL_ERR_ARG, "%s must be f32, f64, f16 or bf16 for the flash backend, got %s", dev_n[i],
                            al_tensor_describe(dev_t[i], b1, sizeof b1));
    if (lse->dtype != AL_DTYPE_F32 && lse->dtype != AL_DTYPE_F64)
        return al_error(AL_ERR_ARG, "lse must be f32 or f64, got %s", al_tensor_describe(lse, b1, sizeof b1));

    const al_flash_spec spec = spec_of(pl, AL_FLASH_BWD);
    const al_flash_tiles tl = al_flash_spec_tiles(&spec);
    CUfunction fns[4];
    int nf = 0;

    /* dout's tiles are read with cp.async like q's: a contiguous copy in q's dtype when they cannot be */
    const al_tensor *g = dout;
    char why[256];
    if (dout->dtype != pl->in.q->dtype || !tile_ok("dout", dout, fmt, why, sizeof why)) {
        AL_TRY(al_tensor_empty(&c->dout_copy, dout->ndim, dout->size, pl->in.q->dtype, AL_DEVICE_CUDA, c->dev));
        AL_TRY(al_cu_copy(&c->dout_copy, dout));
        g = &c->dout_copy;
    }

    al_flash_params prm;
    AL_TRY(fl_params(c, pl, &prm));
    prm.o = op_of(out, fmt);
    prm.dout = op_of(g, fmt);
    prm.dq = op_of(dq, fmt);
    prm.dk = op_of(dk, fmt);
    prm.dv = op_of(dv, fmt);
    prm.lse_in = al_tensor_data_ptr(lse);
    prm.lse_dtype = flash_dt(lse->dtype);
    prm.lse_sb = lse->stride[0];
    prm.lse_sh = lse->stride[1];
    prm.lse_si = lse->stride[2];
    if (fmt == AL_ATTN_FORMAT_THD) {   /* gaps between (padded) sequences: zeros */
        AL_TRY(al_cu_fill(dq, 0.0));
        AL_TRY(al_cu_fill(dk, 0.0));
        AL_TRY(al_cu_fill(dv, 0.0));
    }
    const int64_t B = p->b, H = p->h, HG = p->hg, SQ = p->sq, SKV = p->skv, D = p->d_qk;
    if (B == 0 || (SQ == 0 && SKV == 0)) return AL_OK;
    const int64_t rows = B * H * SQ;
    const int64_t n_blocks = (SKV + tl.bn - 1) / tl.bn;
    int64_t nsplit = 1;
    if (p->deterministic && n_blocks > 1) {
        /* enough CTAs to fill the device twice, at most 8 dQ copies and 4 GiB of them */
        const int64_t sms = al_cu_sm_count[c->dev];
        nsplit = (2 * sms + B * HG - 1) / (B * HG);
        if (nsplit > n_blocks) nsplit = n_blocks;
        if (nsplit > 8) nsplit = 8;
        while (nsplit > 1 && nsplit * rows * D * 4 > ((int64_t)4 << 30)) nsplit--;
        if (nsplit < 1) nsplit = 1;
    }
    prm.deterministic = p->deterministic ? 1 : 0;
    void *lse2 = NULL, *dsum = NULL, *acc = NULL;
    AL_TRY(fl_alloc(c, 4 * rows, &lse2));
    AL_TRY(fl_alloc(c, 4 * rows, &dsum));
    prm.lse2 = (float *)lse2;
    prm.dsum = (float *)dsum;
    const unsigned pre_blocks = (unsigned)((rows * (D / 8) + 255) / 256);   /* al_flash_bwd_pre: d/8 lanes a row */

    /* the Hopper backward where it applies (default; ATTNLAB_FLASH_SM90_BWD=0 turns it off): it writes dq directly,
     * so the pre pass runs with no dQ accumulators to zero (nsplit = 0) */
    if (rows > 0 && SKV > 0 && al_flash_sm90_bwd_applies(pl, NULL, 0)) {
        /* the five-GEMM kernel (opt-in) adds dQ into an f32 accumulator instead: the pre pass zeroes it
         * (nsplit = 1) and al_flash_bwd_dq scales and converts it after */
        const int fused = al_flash_sm90_bwd_fused(pl);
        prm.nsplit = fused ? 1 : 0;
        prm.dq_acc = NULL;
        void *ctr = NULL;                            /* the persistent kernels' work counters (zeroed there) */
        AL_TRY(fl_alloc(c, 2 * sizeof(int), &ctr));
        prm.sched_ctr = (int *)ctr;
        if (fused) {
            AL_TRY(fl_alloc(c, 4 * rows * D, &acc));
            prm.dq_acc = (float *)acc;
        }
        /* the pre pass reads no hook: a variant takes it from the default specialisation's module (on disk
         * after one compile per machine), so its first backward compiles only the two Hopper kernels */
        al_flash_spec plain = spec;
        plain.variant = 0;
        plain.block_mask = 0;
        plain.vhash[0] = plain.vhash[1] = 0;
        AL_TRY(nvrtc_functions(c->dev, &plain, 0, NULL, fns, &nf));
        AL_TRY(launch(fns[0], "al_flash_bwd_pre", pre_blocks, 1, 1, 256, 0, c->s, &prm));
        int done = 0;
        AL_TRY(al_flash_sm90_backward(c->dev, pl, &prm, c->s, &done));
        if (done && fused) {
            int64_t blocks = (rows * (D / 8) + 255) / 256;   /* al_flash_bwd_dq: a lane per 8 columns */
            const int64_t cap = (int64_t)al_cu_sm_count[c->dev] * 16;
            if (blocks > cap) blocks = cap;
            AL_TRY(launch(fns[2], "al_flash_bwd_dq", (unsigned)blocks, 1, 1, 256, 0, c->s, &prm));
        }
        if (done) return AL_OK;
        /* strides TMA cannot describe: the stage-1 kernels below, whose pre pass zeroes the accumulators */
    }
    AL_TRY(get_functions(c->dev, pl, &spec, fns, &nf));
    prm.nsplit = (int)nsplit;
    AL_TRY(fl_alloc(c, 4 * nsplit * rows * D, &acc));
    prm.dq_acc = (float *)acc;
    if (rows > 0) AL_TRY(launch(fns[0], "al_flash_bwd_pre", pre_blocks, 1, 1, 256, 0, c->s, &prm));
    if (SKV > 0) {
        const unsigned gx = (unsigned)(p->deterministic ? nsplit : n_blocks);
        AL_TRY(launch(fns[1], "al_flash_bwd", gx, (unsigned)HG, (unsigned)B, (unsigned)tl.threads, (unsigned)tl.smem,
                      c->s, &prm));
    }
    if (rows > 0) {
        int64_t blocks = (rows * (D / 8) + 255) / 256;
        const int64_t cap = (int64_t)al_cu_sm_count[c->dev] * 16;
        if (blocks > cap) blocks = cap;
        AL_TRY(launch(fns[2], "al_flash_bwd_dq", (unsigned)blocks, 1, 1, 256, 0, c->s, &prm));
    }
    return AL_OK;
}

static al_status fl_backward(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout, const al_tensor *lse,
                             al_tensor *dq, al_tensor *dk, al_tensor *dv, al_tensor *dbias, al_tensor *d_softmax_offset) {
    fl_ctx c;
    memset(&c, 0, sizeof c);
    c.dev = pl->in.q->device_index;
    al_status st = al_cu_begin("attention (flash)", c.dev, &c.s);
    if (pl->in.variant) pthread_mutex_lock(&g_vc_lock);     /* see the variant LRU above */
    if (st == AL_OK) st = fl_backward_inner(&c, pl, out, dout, lse, dq, dk, dv);
    if (pl->in.variant) pthread_mutex_unlock(&g_vc_lock);
    fl_release(&c);
    if (st != AL_OK) {
        st = al_error_prefix(st, "attention_backward (flash)");
        if (dbias) al_tensor_release(dbias);
        if (d_softmax_offset) al_tensor_release(d_softmax_offset);
    }
    return st;
}

/* ---- registration and info --------------------------------------------------------------------------------- */
static const al_attn_backend g_flash = {"flash", fl_supports, fl_forward, fl_backward, 0};

al_status al_cu_attn_flash_register(void) { return al_attn_register_backend(&g_flash); }

/* NVRTC and cache statistics as text (see nvrtc_cache.h); returns the number of NVRTC compiles. */
extern "C" __attribute__((visibility("default"))) int64_t al_flash_info(char *buf, int64_t n) {
    const int64_t compiles = al_nvrtc_info(buf, n);
    if (buf && n > 0) al_hprof_format(&g_fwd_prof, buf, strlen(buf), (size_t)n);   /* ATTNLAB_HOST_PROFILE=1 */
    return compiles;
}
