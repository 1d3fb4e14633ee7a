/*
 * cuda/attn_flash_sm90.cu — host side of the Hopper forward (kernels/flash_fwd_sm90.cu): which plans it
 * serves, its specialisation (flash_sm90_specs.h), NVRTC through nvrtc_cache (sm_90a), the TMA tensor
 * maps (flash_sm90_tma.h) and the launch. The contract is in attn_flash_sm90.h; attn_flash.cu's forward
 * calls al_flash_sm90_forward before its stage-1 launch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attn_flash_sm90.h"
#include "cuda/nvrtc_cache.h"
#include "cuda/flash_sm90_specs.h"
#include "cuda/flash_sm90_tma.h"
#include "cuda/host_profile.h"

/* On by default on sm_90 (checked on an H200: tests/cuda/flash_sm90_check.cu and the flash specs);
 * ATTNLAB_FLASH_SM90=0 falls back to the stage-1 kernel, to compare the two or to rule this one out. */
static int sm90_env_off(void) {
    const char *e = getenv("ATTNLAB_FLASH_SM90");
    return e && strcmp(e, "0") == 0;
}

/* Variants on the sm90 forward: on by default (test_flash_variant and variants_spec passed on an H200,
 * session 4); ATTNLAB_FLASH_SM90_VARIANTS=0 sends them to the stage-1 kernel, to compare the two. */
static int sm90_variants_off(void) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_VARIANTS");
    return e && strcmp(e, "0") == 0;
}

static void why_set(char *why, size_t n, const char *msg) {
    if (why && n) snprintf(why, n, "%s", msg);
}

/* the plan's specialisation (flash_specs.h's rule, without ALiBi) */
static al_flash_spec sm90_spec(const al_attn_plan *pl) {
    const al_attn_params *p = &pl->p;
    al_flash_spec s;
    memset(&s, 0, sizeof s);
    s.kind = AL_FLASH_FWD;
    s.d = (int)p->d_qk;
    s.bf16 = pl->in.q->dtype == AL_DTYPE_BF16;
    if (p->window_left < 0 && p->window_right < 0) s.mask = AL_FLASH_MASK_NONE;
    else if (p->window_left < 0 && p->window_right == 0) s.mask = AL_FLASH_MASK_CAUSAL;
    else s.mask = AL_FLASH_MASK_WINDOW;
    s.bottom_right = s.mask != AL_FLASH_MASK_NONE ? pl->bottom_right : 0;
    const al_attn_variant *v = pl->in.variant;
    if (v) {
        const al_flash_hooks hk = al_flash_hooks_of(v);
        al_flash_spec_set_variant(&s, &hk, v->block_mask != NULL);
    }
    return s;
}

/* the forward's: three consumers (flash_sm90_specs.h) where ATTNLAB_FLASH_SM90_CONSUMERS=3 asks, or, without it set,
 * for a score_mod that uses the MUFU (al_attn_variant.score_mufu) where the grid's waves favour them
 * (al_flash_sm90_c3_pays) and the grid is what was measured: no built-in mask, no block mask (the plain causal
 * kernel lost 12% with three consumers, a causal soft-capped one is untimed); and only where their 64-key tiles
 * fit, i.e. d <= 128, and a block mask's blocks are whole tiles wide and its rows list in the kernel's shared memory
 * (any block_m: the 192-row tiles combine the block rows they span). Elsewhere the default two serve the call. */
static al_flash_spec sm90_fwd_spec(const al_attn_plan *pl) {
    al_flash_spec s = sm90_spec(pl);
    const al_attn_variant *v = pl->in.variant;
    const al_attn_params *p = &pl->p;
    const int env = al_flash_sm90_consumers_env();
    const int want = env ? env
                   : v && v->score_mufu && !v->block_mask && s.mask == AL_FLASH_MASK_NONE &&
                             al_flash_sm90_c3_pays(p->sq, p->h * p->b, al_cu_sm_count[pl->in.q->device_index])
                   ? 3 : 2;
    const int bn = al_flash_sm90_c3_bn(s.d);
    if (want == 3 && bn > 0 &&
        (!v || !v->block_mask || (v->block_n % bn == 0 && (p->skv + bn - 1) / bn <= AL_FLASH_SM90_BM_LIST)))
        s.fwd_consumers = 3;
    return s;
}

/* The split grid's first r3 rows per (batch, head) pair for three consumers (al_flash_sm90_c3_rows), or 0 for one
 * launch of spec: for a score_mod that uses the MUFU, no mask, no block mask, not thd (whose sequences differ in
 * length), d <= 128 (three consumers' tiles fit). The default where three consumers throughout do not pay
 * (al_flash_sm90_c3_pays) but the split does by the wave model: on the H200 soft-capping's forward at 16 x 4096
 * went from 1.20-1.22x the plain kernel (two consumers) to 1.13x at b = 1 and 2 (session 23). Where three
 * throughout pay (b = 4 there) one launch of them stays: the split measured 1.13x against their 1.10-1.12x.
 * ATTNLAB_FLASH_SM90_CONSUMERS=split splits wherever the model finds a split row; =2 / =3 never split. */
static long long sm90_fwd_split_rows(const al_attn_plan *pl, const al_flash_spec *spec) {
    const al_attn_variant *v = pl->in.variant;
    const al_attn_params *p = &pl->p;
    if (al_flash_sm90_consumers_env() || !v || !v->score_mufu || v->block_mask ||
        spec->mask != AL_FLASH_MASK_NONE || p->qkv_format == AL_ATTN_FORMAT_THD || al_flash_sm90_c3_bn(spec->d) == 0)
        return 0;
    return (long long)al_flash_sm90_split_rows(p->sq, p->h * p->b, al_cu_sm_count[pl->in.q->device_index],
                                               al_flash_sm90_split_env());
}

/* What the Hopper forward and backward both need: the path not switched off, an sm_90 device, f16/bf16,
 * d_qk == d_v in {64, 128, up to max_d}, no ALiBi (the stage-1 kernels serve it), softmax_scale > 0 (the
 * row max is taken on raw scores). */
static int sm90_basics(const al_attn_plan *pl, int max_d, char *why, size_t n) {
    const al_attn_params *p = &pl->p;
    if (sm90_env_off()) { why_set(why, n, "the sm_90 (wgmma/TMA) kernels are switched off by ATTNLAB_FLASH_SM90=0"); return 0; }
    int cc = 0;
    if (al_nvrtc_arch(pl->in.q->device_index, NULL, 0, &cc) != AL_OK) {
        al_clear_error();
        why_set(why, n, "compute capability unknown");
        return 0;
    }
    if (cc != 90) { why_set(why, n, "not an sm_90 device (wgmma/TMA kernels are sm_90a)"); return 0; }
    if (pl->in.q->dtype != AL_DTYPE_BF16 && pl->in.q->dtype != AL_DTYPE_F16) { why_set(why, n, "dtype"); return 0; }
    if (p->d_qk != p->d_v || (p->d_qk != 64 && p->d_qk != 128 && p->d_qk != 256) || p->d_qk > max_d) {
        if (why && n) snprintf(why, n, "head dim (d_qk == d_v in 64, 128%s)", max_d >= 256 ? ", 256" : "");
        return 0;
    }
    if (p->bias_type == AL_ATTN_BIAS_ALIBI || pl->alibi) { why_set(why, n, "ALiBi (stage-1 kernel)"); return 0; }
    if (!(p->softmax_scale > 0.0)) { why_set(why, n, "softmax_scale <= 0 (the row max is taken on raw scores)"); return 0; }
    return 1;
}

int al_flash_sm90_applies(const al_attn_plan *pl, char *why, size_t n) {
    const al_attn_params *p = &pl->p;
    if (!sm90_basics(pl, 256, why, n)) return 0;
    const al_attn_variant *var = pl->in.variant;
    if (var && sm90_variants_off()) {
        why_set(why, n, "variants on the sm_90 forward are switched off by ATTNLAB_FLASH_SM90_VARIANTS=0");
        return 0;
    }
    if (var && var->block_mask) {
        const al_flash_spec spec = sm90_fwd_spec(pl);
        const al_flash_sm90_tiles tl = al_flash_sm90_spec_tiles(&spec);
        if ((p->skv + tl.bn - 1) / tl.bn > AL_FLASH_SM90_BM_LIST) {
            if (why && n)
                snprintf(why, n, "block_mask with s_kv = %lld: the sm_90 forward lists at most %d key tiles of %d (stage-1 kernel)",
                         (long long)p->skv, (int)AL_FLASH_SM90_BM_LIST, tl.bn);
            return 0;
        }
        if ((tl.consumers != 3 && var->block_m % tl.bm != 0) || var->block_n % tl.bn != 0) {   /* c3: BM_SPAN */
            if (why && n)
                snprintf(why, n, "block_mask blocks of %lld x %lld: the sm_90 forward's tiles are %d x %d (stage-1 kernel)",
                         (long long)var->block_m, (long long)var->block_n, tl.bm, tl.bn);
            return 0;
        }
    }
    return 1;
}

/* The launch order of a Hopper kernel (p.sched_hb, kernels/flash_common.cuh's al_fl_cta_coords). Causal
 * blocks differ in length (a forward query block sees as many key tiles as blocks precede it; the backward's
 * dK/dV blocks shrink with the index, its dQ blocks grow), and in the grid's order the last head's longest
 * block started near the end and ran on an emptying GPU. So causal launches go longest block first across
 * heads, in sections of four (head, batch) pairs, times `share` pairs that read the same tiles (a GQA group's
 * q heads read one K/V), when the four pairs' streamed tiles (bytes_per_pair each) fit in the device's L2;
 * else, and for other masks (alike blocks), the grid's order (one head's blocks side by side share its
 * tiles in L2). Measured on the H200 (docs/PERFORMANCE.md, session 13; 11 interleaved rounds, causal bf16):
 * four pairs against the grid's order, forward / backward, 4x16x4096x128 +4.9% / +3.0% (bs3hd +4.9% / +3.5%),
 * 2x16x8192 +4.4% / +2.8%, 1x16x16384 -0.5% / +0.8%, 4x32x4096x64 +1.0% / +0.5%; sections sized to fill
 * 16-32 MiB were no better in the forward and lost 4-7% in the backward at 32-64 pairs, and without a mask
 * every section size was slower (up to 11%). ATTNLAB_FLASH_SCHED, to compare: 0 = the grid's order always,
 * "all" = the four-pair sections for every mask and kernel, N > 0 = sections of N pairs for every mask and
 * kernel that reads it (F90_SCHED, B90_SCHED). */
static int sched_heads(int32_t dev, int longest_first, double bytes_per_pair, int share) {
    const char *e = getenv("ATTNLAB_FLASH_SCHED");
    int all = 0;
    if (e && *e) {
        if (strcmp(e, "all") == 0) all = 1;
        else {
            const int n = atoi(e);
            return n > 0 ? n : 0;
        }
    }
    if (!longest_first && !all) return 0;
    const double l2 = (double)al_cu_l2_bytes[dev];
    if (!all && !(4.0 * bytes_per_pair <= l2)) return 0;
    return 4 * (share > 0 ? share : 1);
}

/* Default (non-variant) forward functions this thread has already resolved, with their shared-memory
 * attribute set: the NVRTC lookup builds ten option strings, a label and a key and compares it under
 * nvrtc_cache's lock (~1-2 us of a call whose whole host budget is 5 us, issue 5). Default modules are
 * never unloaded (only variant modules are: attn_flash.cu's LRU), so a resolved function stays valid for the
 * life of the process; per thread, so no lock. Keyed by (device, spec): the spec decides options and smem. */
#define SM90_MEMO 8
typedef struct sm90_memo {
    int used;
    int32_t dev;
    al_flash_spec spec;
    CUfunction fn;
} sm90_memo;
static __thread sm90_memo t_memo[SM90_MEMO];
static __thread int t_memo_next;

static al_status default_function(int32_t dev, const al_flash_spec *spec, int smem, CUfunction *fn) {
    for (int i = 0; i < SM90_MEMO; i++)
        if (t_memo[i].used && t_memo[i].dev == dev && memcmp(&t_memo[i].spec, spec, sizeof *spec) == 0) {
            *fn = t_memo[i].fn;
            return AL_OK;
        }
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
    const int nopts = al_flash_sm90_spec_options(spec, opts);
    const char *optp[AL_FLASH_MAX_OPTS];
    for (int i = 0; i < nopts; i++) optp[i] = opts[i];
    const char *name = al_flash_sm90_function();
    char label[96];
    al_flash_sm90_spec_name(spec, label, sizeof label);
    AL_TRY(al_nvrtc_get(dev, al_flash_sm90_spec_file(), NULL, optp, nopts, &name, 1, label, fn));
    CUresult r = cuFuncSetAttribute(*fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem);
    if (r != CUDA_SUCCESS) {
        const char *msg = NULL;
        cuGetErrorString(r, &msg);
        return al_error(AL_ERR_CUDA, "al_flash_fwd_sm90 (%s): setting %d bytes of dynamic shared memory failed: %s", label,
                        smem, msg ? msg : "?");
    }
    sm90_memo *m = &t_memo[t_memo_next];
    t_memo_next = (t_memo_next + 1) % SM90_MEMO;
    m->used = 1;
    m->dev = dev;
    m->spec = *spec;
    m->fn = *fn;
    return AL_OK;
}

/* cuLaunchKernelEx of fn over grid x block threads (1-D blocks) with smem bytes of dynamic shared memory on stream s;
 * pdl: with programmatic stream serialisation, so that the grid may start beside the previous one's end (the
 * kernel's griddepcontrol.wait orders what it reads: the split forward's second launch, the backward's dQ kernel) */
static CUresult sm90_launch(CUfunction fn, const unsigned grid[3], int threads, int smem, cudaStream_t s, int pdl,
                            void **args) {
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid[0];
    cfg.gridDimY = grid[1];
    cfg.gridDimZ = grid[2];
    cfg.blockDimX = (unsigned)threads;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = (unsigned)smem;
    cfg.hStream = (CUstream)s;
    CUlaunchAttribute at;
    memset(&at, 0, sizeof at);
    at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    at.value.programmaticStreamSerializationAllowed = 1;
    if (pdl) {
        cfg.attrs = &at;
        cfg.numAttrs = 1;
    }
    return cuLaunchKernelEx(&cfg, fn, args, NULL);
}

/* One launch of the Hopper forward: spec's kernel over gx row blocks per (head, batch) pair from query row m_row0
 * (0, or the second launch of a split grid: spec.fwd_row0). 0 with *launched = 0: TMA cannot describe the strides
 * (the caller's stage-1 fallback; only a first launch can get it, both build their maps from the same tensors). */
static al_status sm90_fwd_launch(int32_t dev, const al_attn_plan *pl, const al_flash_params *prm, cudaStream_t s,
                                 const al_flash_spec *spec, long long gx, int m_row0, int pdl, int *launched,
                                 double *prof) {
    *launched = 0;
    const al_attn_params *p = &pl->p;
    const al_flash_sm90_tiles tl = al_flash_sm90_spec_tiles(spec);
    const int thd = p->qkv_format == AL_ATTN_FORMAT_THD;
    const long long rows_q = thd ? (long long)pl->in.q->size[0] : (long long)p->sq;
    const long long rows_kv = thd ? (long long)pl->in.k->size[0] : (long long)p->skv;
    al_flash_sm90_tmaps tm;
    memset(&tm, 0, sizeof tm);
    if (al_flash_sm90_tmaps_make(&tm, prm, spec->bf16, spec->d, rows_q, rows_kv, tl.bm, tl.bn) != CUDA_SUCCESS)
        return AL_OK;                                           /* strides TMA cannot describe: stage 1 */
    if (prof) prof[0] = al_hprof_now();

    CUfunction fn;
    CUresult r = CUDA_SUCCESS;
    if (pl->in.variant) {
        AL_TRY(al_flash_variant_function(dev, spec, pl->in.variant, 1, &fn));
        r = cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, tl.smem);
    } else {
        AL_TRY(default_function(dev, spec, tl.smem, &fn));
    }
    if (prof) prof[1] = al_hprof_now();
    al_flash_params prm_copy = *prm;
    prm_copy.m_row0 = m_row0;
    /* longest rows first: causal, and block masks launched last block first (the kernel's heavy_high); a
     * CTA streams its kv head's K and V */
    const int group = (int)(p->h / (p->hg > 0 ? p->hg : 1));
    prm_copy.sched_hb = sched_heads(dev, spec->mask == AL_FLASH_MASK_CAUSAL || (pl->in.variant && prm->m_reverse),
                                    (double)rows_kv / (thd ? p->b : 1) * (double)(p->d_qk + p->d_v) * 2.0, group);
    void *args[] = {&prm_copy, &tm};
    const unsigned grid[3] = {(unsigned)gx, (unsigned)p->h, (unsigned)p->b};
    /* pdl: a split grid's second launch beside the first's end (al_flash_sm90_fwd_pdl) */
    if (r == CUDA_SUCCESS) r = sm90_launch(fn, grid, tl.threads, tl.smem, s, pdl, args);
    if (r != CUDA_SUCCESS) {
        const char *msg = NULL, *nm = NULL;
        cuGetErrorString(r, &msg);
        cuGetErrorName(r, &nm);
        char label[96];
        al_flash_sm90_spec_name(spec, label, sizeof label);
        return al_error(AL_ERR_CUDA, "launching al_flash_fwd_sm90 (%s; grid %lld x %lld x %lld, %d threads, %d bytes of "
                        "shared memory) failed: %s (%s)", label, gx, (long long)p->h, (long long)p->b, tl.threads,
                        tl.smem, msg ? msg : "?", nm ? nm : "?");
    }
    al_cu_note_launch("al_flash_fwd_sm90");   /* named in a later asynchronous-fault report */
    *launched = 1;
    return AL_OK;
}

al_status al_flash_sm90_forward(int32_t dev, const al_attn_plan *pl, const al_flash_params *prm, cudaStream_t s,
                                int *done, double *prof) {
    *done = 0;
    if (!al_flash_sm90_applies(pl, NULL, 0)) return AL_OK;
    const al_attn_params *p = &pl->p;
    const int thd = p->qkv_format == AL_ATTN_FORMAT_THD;
    const long long rows_q = thd ? (long long)pl->in.q->size[0] : (long long)p->sq;
    const long long rows_kv = thd ? (long long)pl->in.k->size[0] : (long long)p->skv;
    if (rows_q < 1 || rows_kv < 1 || p->b < 1) return AL_OK;   /* nothing to read: stage 1 handles the edge */
    const al_flash_spec spec = sm90_fwd_spec(pl);
    const long long r3 = sm90_fwd_split_rows(pl, &spec);
    if (r3 > 0) {
        /* a split grid: three consumers over each pair's first r3 rows, then two over the rest from row r3 */
        al_flash_spec s3 = spec, s2 = spec;
        s3.fwd_consumers = 3;
        s2.fwd_consumers = 0;
        s2.fwd_row0 = 1;
        const int pdl = al_flash_sm90_fwd_pdl();   /* (opt-in: flash_sm90_specs.h) */
        s3.fwd_pdl = s2.fwd_pdl = pdl;
        int64_t gx[2];
        al_flash_sm90_split_grid(p->sq, r3, gx);
        int launched = 0;
        AL_TRY(sm90_fwd_launch(dev, pl, prm, s, &s3, gx[0], 0, 0, &launched, prof));
        if (!launched) return AL_OK;
        AL_TRY(sm90_fwd_launch(dev, pl, prm, s, &s2, gx[1], (int)r3, pdl, &launched, NULL));
        if (!launched)   /* cannot happen: both maps describe the same tensors */
            return al_error(AL_ERR_CUDA, "the split Hopper forward's second launch found strides TMA cannot describe");
        *done = 1;
        return AL_OK;
    }
    const al_flash_sm90_tiles tl = al_flash_sm90_spec_tiles(&spec);
    return sm90_fwd_launch(dev, pl, prm, s, &spec, (p->sq + tl.bm - 1) / tl.bm, 0, 0, done, prof);
}

/* ---- the Hopper backward (kernels/flash_bwd_sm90.cu) ------------------------------------------------------
 * On by default since it passed bench/flash_bench.lua's checks and the flash specs on an H200 (session 4);
 * ATTNLAB_FLASH_SM90_BWD=0 sends the backward to the stage-1 kernels, to compare the two. */
static int sm90_bwd_on(void) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_BWD");
    return !(e && strcmp(e, "0") == 0);
}

/* A block mask on the sm90 backward: every tile of each kernel must lie inside one block (the dK/dV kernel's
 * tiles are bn queries x bm keys: it walks a key block's column; the dQ kernel's bm queries x bn keys: a
 * query block's row), and each CTA's stream must fit its shared-memory list of non-empty tiles. */
static int sm90_bwd_blocks_ok(const al_attn_plan *pl, const al_attn_variant *var, char *why, size_t n) {
    const al_attn_params *p = &pl->p;
    al_flash_spec spec = sm90_spec(pl);
    spec.kind = AL_FLASH_BWD;
    const al_flash_sm90_tiles tl = al_flash_sm90_bwd_tiles(&spec);
    static const char *kernel[2] = {"dK/dV", "dQ"};
    const long long stream[2] = {(p->sq + tl.bn - 1) / tl.bn * (p->h / (p->hg > 0 ? p->hg : 1)), (p->skv + tl.bn - 1) / tl.bn};
    for (int role = 0; role < 2; role++) {
        if (stream[role] > AL_FLASH_SM90_BWD_BM_LIST) {
            if (why && n)
                snprintf(why, n, "block_mask with %lld stream tiles per CTA (%s): the sm_90 backward's %s kernel lists at "
                         "most %d (stage-1 kernels)", stream[role],
                         role ? "ceil(s_kv / 64)" : "ceil(sq / 64) x the GQA group", kernel[role],
                         (int)AL_FLASH_SM90_BWD_BM_LIST);
            return 0;
        }
        const int tm = role ? tl.bm : tl.bn, tn = role ? tl.bn : tl.bm;   /* query rows x key columns */
        if (var->block_m % tm != 0 || var->block_n % tn != 0) {
            if (why && n)
                snprintf(why, n, "block_mask blocks of %lld x %lld: the sm_90 backward's %s kernel needs multiples of "
                         "%d x %d (stage-1 kernels)", (long long)var->block_m, (long long)var->block_n, kernel[role], tm,
                         tn);
            return 0;
        }
    }
    return 1;
}

int al_flash_sm90_bwd_applies(const al_attn_plan *pl, char *why, size_t n) {
    if (!sm90_bwd_on()) { why_set(why, n, "the sm_90 backward is switched off by ATTNLAB_FLASH_SM90_BWD=0"); return 0; }
    if (!sm90_basics(pl, 128, why, n)) return 0;
    const al_attn_variant *var = pl->in.variant;
    if (var && var->block_mask && !sm90_bwd_blocks_ok(pl, var, why, n)) return 0;
    return 1;
}

/* The five-GEMM backward (kernels/flash_bwd_sm90.cu's AL_SM90_DQ_ATOMIC, role 2): opt-in with
 * ATTNLAB_FLASH_SM90_BWD_FUSED=1 until it has been measured against the two-kernel backward; d = 128, no
 * variant, not `deterministic` (its dQ adds up with f32 atomics). */
int al_flash_sm90_bwd_fused(const al_attn_plan *pl) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_BWD_FUSED");
    if (!(e && strcmp(e, "1") == 0)) return 0;
    return !pl->in.variant && pl->p.d_qk == 128 && !pl->p.deterministic && al_flash_sm90_bwd_applies(pl, NULL, 0);
}

al_status al_flash_sm90_backward(int32_t dev, const al_attn_plan *pl, const al_flash_params *prm, cudaStream_t s,
                                 int *done) {
    *done = 0;
    if (!al_flash_sm90_bwd_applies(pl, NULL, 0)) return AL_OK;
    /* roles: 0 dK/dV and 1 dQ, or 2 alone (dK/dV/dQ, into prm->dq_acc: the caller converts it) */
    const int fused = al_flash_sm90_bwd_fused(pl);
    if (fused && !prm->dq_acc) return al_error(AL_ERR_INTERNAL, "al_flash_sm90_backward: the fused backward needs dq_acc");
    const al_attn_params *p = &pl->p;
    al_flash_spec spec = sm90_spec(pl);
    spec.kind = AL_FLASH_BWD;
    const al_flash_sm90_tiles tl = al_flash_sm90_bwd_tiles(&spec);
    const int thd = p->qkv_format == AL_ATTN_FORMAT_THD;
    const long long rows_q = thd ? (long long)pl->in.q->size[0] : (long long)p->sq;
    const long long rows_kv = thd ? (long long)pl->in.k->size[0] : (long long)p->skv;
    if (rows_q < 1 || rows_kv < 1 || p->b < 1) return AL_OK;
    al_flash_sm90_bwd_tmaps tm[2];
    memset(tm, 0, sizeof tm);
    for (int role = 0; role < 2; role++)
        if (al_flash_sm90_bwd_tmaps_make(&tm[role], prm, role, spec.bf16, spec.d, rows_q, rows_kv, tl.bm, tl.bn) !=
            CUDA_SUCCESS)
            return AL_OK;                                       /* strides TMA cannot describe: stage 1 */
    CUfunction fn[2];
    /* a new variant's two kernels compile at once. Variants only: for the default specialisations (on disk
     * after their first use on a machine) the check would add microseconds of key building to every call */
    static const int families[2] = {2, 3};
    if (pl->in.variant) al_flash_prefetch(dev, &spec, pl->in.variant, families, 2);
    for (int role = 0; role < 2; role++) {
        if (fused && role == 1) break;
        const int kr = fused ? 2 : role;             /* the kernel's role (the TMA maps are role 0's for 2) */
        char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
        const int nopts = al_flash_sm90_bwd_options(&spec, kr, opts);
        const char *optp[AL_FLASH_MAX_OPTS];
        for (int i = 0; i < nopts; i++) optp[i] = opts[i];
        const char *name = al_flash_sm90_bwd_function(kr);
        char label[128];
        al_flash_sm90_bwd_name(&spec, kr, label, sizeof label);
        /* variants: attn_flash.cu's LRU of variant modules, family 2 + role (fl_backward holds its lock) */
        if (pl->in.variant) AL_TRY(al_flash_variant_function(dev, &spec, pl->in.variant, 2 + role, &fn[role]));
        else AL_TRY(al_nvrtc_get(dev, al_flash_sm90_bwd_file(), NULL, optp, nopts, &name, 1, label, &fn[role]));
    }
    /* role 0: (key blocks, kv heads, batch); role 1: (query blocks, heads, batch); persistent: a CTA per SM
     * over those work items, from counters zeroed here (prm->sched_ctr, the caller's scratch) */
    unsigned grid[2][3];
    long long items[2];
    int persist = 0;
    for (int role = 0; role < 2; role++) {
        const int kr = fused ? 2 : role;
        items[role] = al_flash_sm90_bwd_grid(&spec, kr, p->b, p->h, p->hg, p->sq, p->skv, al_cu_sm_count[dev],
                                             grid[role]);
        persist |= al_flash_sm90_bwd_persist(&spec, kr);
    }
    if (persist) {
        if (!prm->sched_ctr)
            return al_error(AL_ERR_INTERNAL, "al_flash_sm90_backward: the persistent kernels need sched_ctr");
        const CUresult r = cuMemsetD32Async((CUdeviceptr)prm->sched_ctr, 0, 2, (CUstream)s);
        if (r != CUDA_SUCCESS)
            return al_error(AL_ERR_CUDA, "zeroing the backward's work counters failed (CUresult %d)", (int)r);
    }
    for (int role = 0; role < 2; role++) {
        if (fused && role == 1) break;
        if (items[role] == 0) continue;
        const int smem = al_flash_sm90_bwd_smem(&spec, fused ? 2 : role);
        CUresult r = cuFuncSetAttribute(fn[role], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem);
        al_flash_params prm_copy = *prm;
        /* longest blocks first: causal, and block masks the forward launches last block first (p.m_reverse:
         * causal-like, so the dQ kernel's last query blocks and the dK/dV kernel's first key blocks are the
         * longest); variant kernels of one CTA per item ignore it (B90_SCHED). A dK/dV CTA streams its kv head's
         * group of q heads (q and dout, and two f32 per row), a dQ CTA its kv head's K and V (shared by the
         * group's q heads) */
        const int group = (int)(p->h / (p->hg > 0 ? p->hg : 1));
        const double per_row = role ? (double)(p->d_qk + p->d_v) * 2.0 : (double)(p->d_qk + p->d_v) * 2.0 + 8.0;
        const double rows = role ? (double)rows_kv / (thd ? p->b : 1) : (double)group * rows_q / (thd ? p->b : 1);
        prm_copy.sched_hb = sched_heads(dev, spec.mask == AL_FLASH_MASK_CAUSAL || (pl->in.variant && prm->m_reverse),
                                        rows * per_row, role ? group : 1);
        void *args[] = {&prm_copy, &tm[role]};
        /* the dQ kernel beside the dK/dV kernel's end (al_flash_sm90_bwd_pdl) */
        if (r == CUDA_SUCCESS)
            r = sm90_launch(fn[role], grid[role], tl.threads, smem, s, role == 1 && al_flash_sm90_bwd_pdl(), args);
        if (r != CUDA_SUCCESS) {
            const char *msg = NULL, *nm = NULL;
            cuGetErrorString(r, &msg);
            cuGetErrorName(r, &nm);
            return al_error(AL_ERR_CUDA, "launching %s%s (grid %u x %u x %u, %d threads, %d bytes of shared memory) "
                            "failed: %s (%s)", al_flash_sm90_bwd_function(role), fused ? " (dK/dV/dQ)" : "",
                            grid[role][0], grid[role][1], grid[role][2], tl.threads, smem, msg ? msg : "?",
                            nm ? nm : "?");
        }
        al_cu_note_launch(al_flash_sm90_bwd_function(role));
    }
    *done = 1;
    return AL_OK;
}
