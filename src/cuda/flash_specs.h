/*
 * cuda/flash_specs.h — the specialisations of the flash kernels (kernels/flash_fwd.cu,
 * kernels/flash_bwd.cu): their -D options, tile sizes, launch shapes and names. Plain C (static
 * inline, no CUDA types), shared by the backend (src/cuda/attn_flash.cu) and by the CPU-side test
 * that compiles every shipped specialisation with NVRTC (tests/c/test_nvrtc_kernels.c), so both
 * build exactly the same option lists.
 *
 * A specialisation: kernel (fwd | bwd) x head dim (64, 128, 256) x dtype (bf16, f16) x mask kind
 * (none, causal, window) x diagonal (top-left, bottom-right; "none" has one, unless ALiBi needs the
 * diagonal) x ALiBi (off, on): 132 shipped (al_flash_spec_at), all compiled by the test; a process
 * compiles only the ones it uses, once, then loads them from the disk cache.
 * The host passes the tile sizes as -D defines too, so this file is their one source of truth.
 * A variant specialisation (score_mod / mask_mod, issue 9) is a shipped one plus a variant source
 * (al_flash_variant_source, prepended to the kernel file) identified by its hash, and a block-mask
 * flag (-DAL_BLOCK_MASK); any number exist, compiled on first use.
 */
#ifndef ATTNLAB_CUDA_FLASH_SPECS_H
#define ATTNLAB_CUDA_FLASH_SPECS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { AL_FLASH_FWD = 0, AL_FLASH_BWD = 1 };
enum { AL_FLASH_MASK_NONE = 0, AL_FLASH_MASK_CAUSAL = 1, AL_FLASH_MASK_WINDOW = 2 };

typedef struct al_flash_spec {
    int kind;           /* AL_FLASH_FWD / AL_FLASH_BWD */
    int d;              /* 64, 128, 256 */
    int bf16;           /* 1 bf16, 0 f16 */
    int mask;           /* AL_FLASH_MASK_* */
    int bottom_right;   /* diagonal alignment (causal, window, and ALiBi's distance) */
    int alibi;
    /* a variant (score_mod / mask_mod): its source (al_flash_variant_source) is prepended to the kernel
     * file; vhash identifies that source (FNV-1a 64 of it, two seeds), 0/0 = no variant */
    int variant;
    int block_mask;     /* AL_BLOCK_MASK (variants only) */
    unsigned long long vhash[2];
    /* the Hopper forward's consumer warpgroups: 0 = its default (2), 3 = three (an experiment,
     * ATTNLAB_FLASH_SM90_CONSUMERS=3; flash_sm90_specs.h). Part of the spec so that every cache keyed by it
     * (the host's function memo, the variant LRU) tells the two builds apart. */
    int fwd_consumers;
    /* 1 = the Hopper forward's row blocks start at al_flash_params.m_row0 (-DAL_SM90_ROW0=1): the two-consumer
     * launch of a split grid, whose first rows three consumers take (flash_sm90_specs.h, al_flash_sm90_c3_rows) */
    int fwd_row0;
    /* 1 = the Hopper forward is one of a split grid's two launches under programmatic dependent launch
     * (-DAL_SM90_FWD_PDL=1, ATTNLAB_FLASH_SM90_FWD_PDL=1; flash_sm90_specs.h, al_flash_sm90_fwd_pdl) */
    int fwd_pdl;
} al_flash_spec;

/* Tile sizes and launch shape of a specialisation. */
typedef struct al_flash_tiles {
    int bm, bn;          /* query rows, key rows per tile */
    int threads;
    int smem;            /* dynamic shared memory, bytes */
} al_flash_tiles;

static inline al_flash_tiles al_flash_spec_tiles(const al_flash_spec *s) {
    al_flash_tiles t;
    if (s->kind == AL_FLASH_FWD) {
        /* 4 warps x 16 query rows; BN = 32 at d = 256 keeps 2 CTAs per SM (smem) and no spills */
        t.bm = 64;
        t.bn = s->d == 256 ? 32 : 64;
        t.threads = 128;
        t.smem = t.bm * s->d * 2 + 4 * t.bn * s->d * 2;
    } else {
        /* 16 kv rows per warp (two warps per 16 rows at d = 256); BM = 32 (64 spills at d = 128) */
        int ws = s->d > 128 ? 2 : 1;
        t.bm = 32;
        t.bn = 64;
        t.threads = (t.bn / 16) * ws * 32;
        t.smem = 2 * t.bn * s->d * 2 + 2 * t.bm * s->d * 2 + t.bn * t.bm * 2 + 2 * t.bm * 4;
    }
    return t;
}

static inline const char *al_flash_spec_file(const al_flash_spec *s) {
    return s->kind == AL_FLASH_FWD ? "flash_fwd.cu" : "flash_bwd.cu";
}

/* Function names in a specialisation's module, in launch order. */
static inline int al_flash_spec_functions(const al_flash_spec *s, const char **names) {
    if (s->kind == AL_FLASH_FWD) {
        names[0] = "al_flash_fwd";
        return 1;
    }
    names[0] = "al_flash_bwd_pre";
    names[1] = "al_flash_bwd";
    names[2] = "al_flash_bwd_dq";
    return 3;
}

#define AL_FLASH_MAX_OPTS 12
#define AL_FLASH_OPT_LEN 48

/* The -D options (no architecture: nvrtc_cache adds that). Returns the count. */
static inline int al_flash_spec_options(const al_flash_spec *s, char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN]) {
    al_flash_tiles t = al_flash_spec_tiles(s);
    int n = 0;
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_HEAD_DIM=%d", s->d);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BF16=%d", s->bf16 ? 1 : 0);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_MASK_KIND=%d", s->mask);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BOTTOM_RIGHT=%d", s->bottom_right ? 1 : 0);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_ALIBI=%d", s->alibi ? 1 : 0);
    if (s->variant) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BLOCK_MASK=%d", s->block_mask ? 1 : 0);
    if (s->kind == AL_FLASH_FWD) {
        snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BLOCK_M=%d", t.bm);
        snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BLOCK_N=%d", t.bn);
        snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_WARPS=%d", t.threads / 32);
    } else {
        snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BWD_BLOCK_M=%d", t.bm);
        snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BWD_BLOCK_N=%d", t.bn);
    }
    return n;
}

/* "fwd d128 bf16 causal-br alibi" */
static inline void al_flash_spec_name(const al_flash_spec *s, char *buf, size_t n) {
    static const char *masks[] = {"nomask", "causal", "window"};
    int u = snprintf(buf, n, "%s d%d %s %s%s%s", s->kind == AL_FLASH_FWD ? "fwd" : "bwd", s->d, s->bf16 ? "bf16" : "f16",
                     masks[s->mask], s->mask == AL_FLASH_MASK_NONE && !s->alibi ? "" : s->bottom_right ? "-br" : "-tl",
                     s->alibi ? " alibi" : "");
    if (s->variant && u > 0 && (size_t)u < n)
        snprintf(buf + u, n - (size_t)u, " variant %016llx%s", s->vhash[0], s->block_mask ? " blockmask" : "");
}

/* ---- variants ----------------------------------------------------------------------------------- */
/* FNV-1a 64 over a string and its NUL (NULL hashes as one 0xff byte, unlike ""). */
static inline unsigned long long al_flash_fnv64(unsigned long long h, const char *str) {
    if (!str) return (h ^ 0xffu) * 0x100000001b3ULL;
    for (const unsigned char *c = (const unsigned char *)str;; c++) {
        h = (h ^ *c) * 0x100000001b3ULL;
        if (!*c) break;
    }
    return h;
}

/* A variant's hook snippets, as al_attn_variant holds them (NULL = the hook's default; contract in
 * kernels/flash_common.cuh). score_pre / score_post: the optional folded form of score_mod (new logit =
 * score_pre(acc, scale, ...) * score_post, score_post a constant > 0; 0 when score_pre is NULL).
 * fixed_max = 1: score_max (the new logit's upper bound) becomes AL_SCORE_MOD_MAX, the Hopper forward's fixed
 * softmax max (al_flash_hooks_of sets it where the variant's bounds are at most AL_FLASH_FIXED_MAX_RANGE apart).
 * score_grad_pre: the optional folded form of score_grad (AL_SCORE_GRAD_PRE; with score_pre and score_grad only). */
typedef struct al_flash_hooks {
    const char *score_mod, *score_grad, *mask_mod, *capture_grad, *prelude, *score_pre;
    double score_post;
    int fixed_max;
    double score_max;
    const char *score_grad_pre;
} al_flash_hooks;
/* The widest logit range [lo, hi] for which a fixed max of hi is used: exponentials down to e^-64 (2^-92.3) are
 * normal f32 and bf16 numbers with headroom for the products with V (kernels/flash_fwd_sm90.cu, AL_FL_FIXED_MAX) */
#define AL_FLASH_FIXED_MAX_RANGE 64.0
/* hk's fixed max from a score_mod's bounds (al_attn_variant.score_bounded, score_lo, score_hi): on where they are
 * given and at most AL_FLASH_FIXED_MAX_RANGE apart, unless ATTNLAB_FLASH_SM90_FIXED_MAX=0 (A/B comparisons) */
static inline void al_flash_hooks_set_bounds(al_flash_hooks *hk, int bounded, double lo, double hi) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_FIXED_MAX");
    hk->fixed_max = hk->score_mod && bounded && hi - lo <= AL_FLASH_FIXED_MAX_RANGE && !(e && strcmp(e, "0") == 0);
    hk->score_max = hk->fixed_max ? hi : 0.0;
}

/* The source text that a variant prepends to flash_fwd.cu / flash_bwd.cu (malloc'd; NULL when out of
 * memory): the prelude, then one #define per given hook (contract in kernels/flash_common.cuh), then
 * a #line that restores the kernel file's own line numbers in NVRTC messages. Snippets are one-line
 * macro bodies: newlines become spaces (attention_plan.c rejects // comments, which would swallow the
 * rest). NULL snippets leave the hook at its default. */
static inline char *al_flash_variant_source(const al_flash_hooks *hk, const char *file) {
    const char *parts[6] = {hk->score_mod, hk->score_grad, hk->mask_mod, hk->capture_grad, hk->score_pre,
                            hk->score_grad_pre};
    static const char *heads[6] = {
        "#define AL_SCORE_MOD(score, b, h, q_idx, kv_idx) (",
        "#define AL_SCORE_MOD_GRAD(grad, score, b, h, q_idx, kv_idx) (",
        "#define AL_MASK_MOD(b, h, q_idx, kv_idx) (",
        "#define AL_CAPTURE_GRAD(grad, score, b, h, q_idx, kv_idx) do { ",
        "#define AL_SCORE_PRE(acc, scale, b, h, q_idx, kv_idx) (",
        "#define AL_SCORE_GRAD_PRE(grad, acc, scale, b, h, q_idx, kv_idx) ("};
    static const char *tails[6] = {")\n", ")\n", ")\n", "; } while (0)\n", ")\n", ")\n"};
    size_t n = 384 + (hk->prelude ? strlen(hk->prelude) : 0) + strlen(file);
    for (int i = 0; i < 6; i++) n += strlen(heads[i]) + strlen(tails[i]) + (parts[i] ? strlen(parts[i]) : 0);
    char *out = (char *)malloc(n);
    if (!out) return NULL;
    size_t u = (size_t)snprintf(out, n, "/* attnlab variant (generated by al_flash_variant_source) */\n"
                                        "#define AL_VARIANT 1\n#line 1 \"variant prelude\"\n%s\n"
                                        "#line 1 \"variant hooks\"\n", hk->prelude ? hk->prelude : "");
    for (int i = 0; i < 6; i++) {
        if (!parts[i]) continue;
        u += (size_t)snprintf(out + u, n - u, "%s", heads[i]);
        for (const char *c = parts[i]; *c; c++) out[u++] = (*c == '\n' || *c == '\r') ? ' ' : *c;
        u += (size_t)snprintf(out + u, n - u, "%s", tails[i]);
    }
    /* %.9e round-trips an f32 constant (and is a valid literal with the f); the kernels multiply it by
     * log2(e) at compile time */
    if (hk->score_pre)
        u += (size_t)snprintf(out + u, n - u, "#define AL_SCORE_POST %.9ef\n", (double)(float)hk->score_post);
    if (hk->fixed_max)
        u += (size_t)snprintf(out + u, n - u, "#define AL_SCORE_MOD_MAX %.9ef\n", (double)(float)hk->score_max);
    snprintf(out + u, n - u, "#line 1 \"%s\"\n", file);
    return out;
}

/* The variant identity of spec s from its snippets: vhash = two FNV-1a 64 chains over the six strings
 * and the bits of score_post and the fixed max (with different seeds: 128 bits, collisions out of reach), then
 * score_grad_pre where given (so that the identities without it stay those of session 22 and before), variant = 1. */
static inline void al_flash_spec_set_variant(al_flash_spec *s, const al_flash_hooks *hk, int block_mask) {
    const char *parts[6] = {hk->score_mod, hk->score_grad, hk->mask_mod, hk->capture_grad, hk->prelude, hk->score_pre};
    char post[80];
    if (hk->fixed_max) snprintf(post, sizeof post, "%a max %a", hk->score_post, hk->score_max);
    else snprintf(post, sizeof post, "%a", hk->score_post);   /* (the identities of session 16 and before) */
    unsigned long long h0 = 0xcbf29ce484222325ULL, h1 = 0x84222325cbf29ce4ULL;
    for (int i = 0; i < 6; i++) {
        h0 = al_flash_fnv64(h0, parts[i]);
        h1 = al_flash_fnv64(h1 ^ (unsigned long long)(i + 1), parts[i]);
    }
    h0 = al_flash_fnv64(h0, post);
    h1 = al_flash_fnv64(h1 ^ 7ULL, post);
    if (hk->score_grad_pre) {
        h0 = al_flash_fnv64(h0 ^ 11ULL, hk->score_grad_pre);
        h1 = al_flash_fnv64(h1 ^ 13ULL, hk->score_grad_pre);
    }
    s->variant = 1;
    s->block_mask = block_mask ? 1 : 0;
    s->vhash[0] = h0;
    s->vhash[1] = h1;
}

/* Every shipped specialisation, i in [0, al_flash_spec_count()): kernel x d x dtype x (ALiBi off:
 * none, causal-tl, causal-br, window-tl, window-br; ALiBi on: the same plus none-br, since ALiBi's
 * distance |j - i - diag| depends on the diagonal even without a mask) = 2 * 3 * 2 * 11 = 132. */
static inline int al_flash_spec_count(void) { return 2 * 3 * 2 * 11; }
static inline void al_flash_spec_at(int i, al_flash_spec *s) {
    static const int dims[3] = {64, 128, 256};
    /* (mask, bottom_right, alibi) for the 11 mask variants */
    static const int mk[11] = {0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2};
    static const int br[11] = {0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
    static const int al[11] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
    memset(s, 0, sizeof *s);
    s->mask = mk[i % 11];
    s->bottom_right = br[i % 11];
    s->alibi = al[i % 11];
    i /= 11;
    s->bf16 = i % 2 == 0;
    i /= 2;
    s->d = dims[i % 3];
    i /= 3;
    s->kind = i % 2;
}

#endif /* ATTNLAB_CUDA_FLASH_SPECS_H */
