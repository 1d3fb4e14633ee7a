/*
 * cuda/flash_sm90_specs.h — the specialisations of the Hopper forward kernel (kernels/flash_fwd_sm90.cu):
 * their -D options, tile sizes, launch shape and shared-memory size. Plain C (static inline, no CUDA
 * types), shared by the host side (src/cuda/attn_flash_sm90.cu) and by the GPU check program
 * (tests/cuda/flash_sm90_check.cu), so both compile exactly the same option lists. Reuses
 * al_flash_spec (flash_specs.h) with kind = AL_FLASH_FWD and alibi = 0.
 *
 * A specialisation: head dim (64, 128, 256) x dtype (bf16, f16) x mask (none; causal and window,
 * top-left or bottom-right) = 30 shipped (al_flash_sm90_spec_at); a variant (score_mod / mask_mod,
 * al_flash_spec_set_variant) is one of those plus its generated source and -DAL_BLOCK_MASK.
 * Launch: grid (ceil(SQ / BM), H, B), 128 * (1 + CONSUMERS) threads: warpgroup 0 is the producer
 * (one warp issues the TMA loads), warpgroups 1..CONSUMERS each own 64 query rows.
 */
#ifndef ATTNLAB_CUDA_FLASH_SM90_SPECS_H
#define ATTNLAB_CUDA_FLASH_SM90_SPECS_H

#include "cuda/flash_specs.h"

/* With a block mask the forward lists a Q block's non-empty key tiles in shared memory: at most this
 * many (s_kv <= 131072 at 128-key tiles, 65536 at d = 256); longer rows go to the stage-1 kernel. */
enum { AL_FLASH_SM90_BM_LIST = 1024 };

typedef struct al_flash_sm90_tiles {
    int bm, bn;          /* query rows per CTA (64 per consumer warpgroup), key rows per K/V tile */
    int stages;          /* K/V shared-memory stages */
    int consumers;       /* consumer warpgroups */
    int threads;
    int smem;            /* dynamic shared memory, bytes (tiles + barriers + 1024 alignment slack) */
} al_flash_sm90_tiles;

/* Three consumers (session 19; measured and chosen per call since session 21): the forward with three consumer
 * warpgroups (BM = 192) taking turns on the tensor cores, so that each warpgroup's softmax runs under two other
 * warpgroups' products instead of one. For score_mods whose softmax phase is as long as the products (soft-capping:
 * a tanh and an exponential per score on the MUFU, docs/FLASH.md). d = 64 and 128: the consumers get 152 registers
 * (setmaxnreg), O takes 64 of them at d = 128, so the key tiles are 64 wide (no spills; d = 64 with 128-key tiles
 * spilled 48 bytes, d = 256's O alone is 128). Block masks: block_n a multiple of 64; block_m anything (the usual
 * 128 x 128 too: -DAL_SM90_BM_SPAN=1, a 192-row tile's kind combines the block rows it spans); at most
 * AL_FLASH_SM90_BM_LIST key tiles of 64 (s_kv <= 65536). The host's forward spec (attn_flash_sm90.cu,
 * sm90_fwd_spec) decides, into al_flash_spec.fwd_consumers: ATTNLAB_FLASH_SM90_CONSUMERS=2 or 3 when set (this reads
 * it: 0 when unset or anything else), else three for a score_mod that uses the MUFU (al_attn_variant.score_mufu),
 * without a mask or block mask, where al_flash_sm90_c3_pays, and a split grid (below) where it does not. */
static inline int al_flash_sm90_consumers_env(void) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_CONSUMERS");
    if (!e) return 0;
    return strcmp(e, "3") == 0 ? 3 : strcmp(e, "2") == 0 ? 2 : 0;
}
/* What a 192-row tile costs against a 128-row one of the two-consumer kernel, per row, for a MUFU-bound score_mod:
 * soft-capping on the H200 (16 heads x 4096, bf16, d = 128) ran 1.09-1.10x the plain kernel at b = 4 with three
 * consumers against 1.18-1.19x with two, where both grids fill their waves about as well: 0.94 with margin. */
#define AL_FLASH_SM90_C3_ROW_COST 0.94
/* 1 when three consumers should finish a forward of sq query rows per (batch, head) pair, over hb pairs on sms
 * SMs, sooner than two: a grid runs in waves of one CTA per SM (neither kernel fits two), a wave costs its tile's
 * rows (x AL_FLASH_SM90_C3_ROW_COST for 192), and a partly filled last wave costs a whole one. At 16 heads x 4096
 * on 132 SMs two consumers fill 4 / 8 / 16 waves at b = 1 / 2 / 4 and three 3 / 6 / 11, so three pay from b = 4
 * (at 8192 from b = 2, at 16384 from b = 1); at b = 1 and 2 (2.7 and 5.3 waves of 192) a third of the last wave
 * idles, and there two consumers measured as fast or faster. */
/* the model's cost of rows query rows per pair, over hb pairs on sms SMs, in tiles of bm = 128 or 192 rows */
static inline double al_flash_sm90_wave_cost(int64_t rows, int64_t hb, int sms, int bm) {
    const int64_t waves = ((rows + bm - 1) / bm * hb + sms - 1) / sms;
    return (double)waves * bm * (bm == 192 ? AL_FLASH_SM90_C3_ROW_COST : 1.0);
}
static inline int al_flash_sm90_c3_pays(int64_t sq, int64_t hb, int sms) {
    if (sq <= 0 || hb <= 0 || sms <= 0) return 0;
    return al_flash_sm90_wave_cost(sq, hb, sms, 192) < al_flash_sm90_wave_cost(sq, hb, sms, 128);
}

/* A split grid (the forward's default since session 23 where al_flash_sm90_c3_pays does not hold; attn_flash_sm90.cu,
 * sm90_fwd_split_rows): three consumers take each (batch, head) pair's first r3 rows, two consumers the other
 * sq - r3, in two launches, so that the three-consumer part fills whole waves and the two-consumer part's 128-row
 * tiles fill the last wave better than 192-row ones. Returns r3 by the same wave model as al_flash_sm90_c3_pays: 0
 * (two consumers take everything), >= sq (three do), or a multiple of 192 in between where that costs less than
 * both. At 16 heads x 4096 on 132 SMs: b = 1 gives 3072 (2 waves of three consumers + 0.97 of two: 361 + 128 = 489
 * against 512 and 541), b = 2 3072 (4 + 2 waves: 978 against 1024 and 1083), b = 4 3840 (10 + 1 waves: 1933
 * against 2048 and 1985). On the H200 soft-capping then ran 1.13x the plain kernel at b = 1 and 2 (1.20-1.22x with
 * two consumers), as the model predicted to within 3%; at b = 4 the split ran 1.13x, three consumers throughout
 * 1.10-1.12x, against the model's 3% for the split: there the second launch's start and the first's tail cost more
 * than the model counts, so the host splits only where three consumers throughout do not pay. */
static inline int64_t al_flash_sm90_c3_rows(int64_t sq, int64_t hb, int sms) {
    if (sq <= 0 || hb <= 0 || sms <= 0) return 0;
    double best = al_flash_sm90_wave_cost(sq, hb, sms, 128);   /* two consumers throughout */
    int64_t r3 = 0;
    const double all3 = al_flash_sm90_wave_cost(sq, hb, sms, 192);
    if (all3 < best) best = all3, r3 = sq;
    for (int64_t k = 1; 192 * k < sq; k++) {   /* k blocks of three consumers, the rest in 128-row blocks */
        const double cost = al_flash_sm90_wave_cost(192 * k, hb, sms, 192) + al_flash_sm90_wave_cost(sq - 192 * k, hb, sms, 128);
        if (cost < best) best = cost, r3 = 192 * k;
    }
    return r3;
}
/* The host's split row for sq query rows per pair, over hb pairs on sms SMs (the default policy; forced: as
 * ATTNLAB_FLASH_SM90_CONSUMERS=split asks): al_flash_sm90_c3_rows where it lies strictly inside (0, sq), but not
 * where three consumers throughout pay unless forced; else 0, one launch */
static inline int64_t al_flash_sm90_split_rows(int64_t sq, int64_t hb, int sms, int forced) {
    if (!forced && al_flash_sm90_c3_pays(sq, hb, sms)) return 0;
    const int64_t r3 = al_flash_sm90_c3_rows(sq, hb, sms);
    return r3 > 0 && r3 < sq ? r3 : 0;
}
/* The split grid's two launches for r3 (0 < r3 < sq, a multiple of 192): gx[0] blocks of 192 rows from row 0, then
 * gx[1] blocks of 128 from row r3 (the last one cut at sq) */
static inline void al_flash_sm90_split_grid(int64_t sq, int64_t r3, int64_t gx[2]) {
    gx[0] = r3 / 192;
    gx[1] = (sq - r3 + 127) / 128;
}
/* ATTNLAB_FLASH_SM90_CONSUMERS=split: 1 (the split grid above wherever the model finds a split row, also where
 * three consumers throughout pay: for measurements), else 0 */
static inline int al_flash_sm90_split_env(void) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_CONSUMERS");
    return e && strcmp(e, "split") == 0;
}
/* key rows per tile of the three-consumer forward at head dim d (0: not served) */
static inline int al_flash_sm90_c3_bn(int d) { return d <= 128 ? 64 : 0; }

static inline al_flash_sm90_tiles al_flash_sm90_spec_tiles(const al_flash_spec *s) {
    al_flash_sm90_tiles t;
    const int c3 = s->fwd_consumers == 3 && al_flash_sm90_c3_bn(s->d) > 0;
    t.consumers = c3 ? 3 : 2;
    t.bm = 64 * t.consumers;
    /* d=256: 64-key tiles keep O (128 f32 per thread) + S + P under the consumers' 216 registers */
    t.bn = c3 ? al_flash_sm90_c3_bn(s->d) : s->d == 256 ? 64 : 128;
    /* stages: the three consumers' 64-key tiles (half the default's at d 64 / 128) get four, about the same bytes
     * in flight */
    t.stages = c3 && t.bn == 64 ? 4 : s->d == 64 ? 3 : 2;
    t.threads = 128 * (1 + t.consumers);
    t.smem = t.bm * s->d * 2 + 2 * t.stages * t.bn * s->d * 2 + 1024 + 1024;
    if (s->variant && s->block_mask) t.smem += 2 * AL_FLASH_SM90_BM_LIST + 16;   /* the non-empty tile list */
    return t;
}

static inline const char *al_flash_sm90_spec_file(void) { return "flash_fwd_sm90.cu"; }
static inline const char *al_flash_sm90_function(void) { return "al_flash_fwd_sm90"; }

/* The -D options (no architecture: nvrtc_cache adds sm_90a). Returns the count. */
static inline int al_flash_sm90_spec_options(const al_flash_spec *s, char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN]) {
    al_flash_sm90_tiles t = al_flash_sm90_spec_tiles(s);
    int n = 0;
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_HEAD_DIM=%d", s->d);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BF16=%d", s->bf16 ? 1 : 0);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_MASK_KIND=%d", s->mask);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BOTTOM_RIGHT=%d", s->bottom_right ? 1 : 0);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_BN=%d", t.bn);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_STAGES=%d", t.stages);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_CONSUMERS=%d", t.consumers);
    if (s->variant) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BLOCK_MASK=%d", s->block_mask ? 1 : 0);
    if (s->variant && s->block_mask) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_BM_LIST=%d", AL_FLASH_SM90_BM_LIST);
    /* three consumers: 192-row tiles under any block_m (a tile's kind combines the block rows it spans) */
    if (s->variant && s->block_mask && t.consumers == 3) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_BM_SPAN=1");
    if (s->fwd_row0) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_ROW0=1");
    if (s->fwd_pdl) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_FWD_PDL=1");
    return n;
}

/* "fwd-sm90 d128 bf16 causal-br", "... variant 0123456789abcdef blockmask" */
static inline void al_flash_sm90_spec_name(const al_flash_spec *s, char *buf, size_t n) {
    static const char *masks[] = {"nomask", "causal", "window"};
    int u = snprintf(buf, n, "fwd-sm90 d%d %s %s%s", s->d, s->bf16 ? "bf16" : "f16", masks[s->mask],
                     s->mask == AL_FLASH_MASK_NONE ? "" : s->bottom_right ? "-br" : "-tl");
    if (s->fwd_consumers == 3 && u > 0 && (size_t)u < n) u += snprintf(buf + u, n - (size_t)u, " c3");
    if (s->fwd_row0 && u > 0 && (size_t)u < n) u += snprintf(buf + u, n - (size_t)u, " row0");
    if (s->fwd_pdl && u > 0 && (size_t)u < n) u += snprintf(buf + u, n - (size_t)u, " pdl");
    if (s->variant && u > 0 && (size_t)u < n)
        snprintf(buf + u, n - (size_t)u, " variant %016llx%s", s->vhash[0], s->block_mask ? " blockmask" : "");
}

/* Every shipped specialisation, i in [0, al_flash_sm90_spec_count()). */
static inline int al_flash_sm90_spec_count(void) { return 3 * 2 * 5; }
static inline void al_flash_sm90_spec_at(int i, al_flash_spec *s) {
    static const int dims[3] = {64, 128, 256};
    static const int mk[5] = {0, 1, 1, 2, 2};
    static const int br[5] = {0, 0, 1, 0, 1};
    memset(s, 0, sizeof *s);
    s->kind = AL_FLASH_FWD;
    s->mask = mk[i % 5];
    s->bottom_right = br[i % 5];
    i /= 5;
    s->bf16 = i % 2 == 0;
    i /= 2;
    s->d = dims[i % 3];
}

/* ---- the Hopper backward (kernels/flash_bwd_sm90.cu): two kernels, role 0 = dK/dV (a CTA owns bm key
 * rows and streams query tiles), role 1 = dQ (a CTA owns bm query rows and streams key tiles); or role 2 =
 * dK/dV/dQ, the dK/dV kernel adding dQ into an f32 accumulator (-DAL_SM90_DQ_ATOMIC=1: d = 128, no
 * variant, not deterministic; opt-in, attn_flash_sm90.cu's al_flash_sm90_bwd_fused). d 64 / 128,
 * no ALiBi; variants (al_flash_spec_set_variant) with their source and -DAL_BLOCK_MASK, block masks in
 * multiples of bm x bm (role 0's tiles are bn queries x bm keys, role 1's bm queries x bn keys). On by
 * default; ATTNLAB_FLASH_SM90_BWD=0 turns it off. */
/* With a block mask each CTA lists its non-empty stream tiles in shared memory: at most this many (role 0:
 * ceil(sq / 64) query tiles x the GQA group; role 1: ceil(s_kv / 64) key tiles); more go to stage 1. */
enum { AL_FLASH_SM90_BWD_BM_LIST = 4096 };

static inline al_flash_sm90_tiles al_flash_sm90_bwd_tiles(const al_flash_spec *s) {
    al_flash_sm90_tiles t;
    t.consumers = 2;
    t.bm = 64 * t.consumers;   /* owned rows */
    t.bn = 64;                 /* streamed rows per tile */
    t.stages = s->d == 64 ? 3 : 2;
    t.threads = 128 * (1 + t.consumers);
    t.smem = 2 * t.bm * s->d * 2 + 2 * t.stages * t.bn * s->d * 2 + 1024 + 1024;
    t.smem += t.stages * 2 * t.bn * 4;   /* each stage's lse2 and D columns (f32; the dK/dV kernel's plain path) */
    if (s->variant && s->block_mask) t.smem += 2 * AL_FLASH_SM90_BWD_BM_LIST + 16;   /* the non-empty tile list */
    return t;
}
/* The persistent schedule (-DAL_SM90_PERSIST=1, kernels/flash_bwd_sm90.cu): one CTA per SM walks the grid's
 * work items, taking the next from a counter (al_flash_params.sched_ctr[role], zeroed before the launch), with
 * the owned rows double-buffered so one item's loads and the previous one's gradient stores overlap. Kernels of
 * roles 0 and 1, variants (and their block masks' tile lists, one per own buffer) included since session 17;
 * not role 2. ATTNLAB_FLASH_SM90_PERSIST=0 launches the grid of work items instead (to compare). */
static inline int al_flash_sm90_bwd_persist(const al_flash_spec *s, int role) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_PERSIST");
    if (role == 2) return 0;
    if (e && strcmp(e, "0") == 0) return 0;
    if (e && strcmp(e, "dq") == 0) return role == 1;
    if (e && strcmp(e, "dkdv") == 0) return role == 0;
    return 1;
}
/* The dQ kernel (role 1) is launched with programmatic stream serialisation after the dK/dV kernel: its CTAs may
 * start on the SMs the dK/dV kernel frees at its end (the two read the same inputs and write disjoint
 * gradients; the dQ kernel's grid completes only after the dK/dV one's). ATTNLAB_FLASH_SM90_PDL=0: a plain
 * launch (to compare). */
static inline int al_flash_sm90_bwd_pdl(void) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_PDL");
    return !(e && strcmp(e, "0") == 0);
}
/* ATTNLAB_FLASH_SM90_FWD_PDL=1 (opt-in, session 27: written without a GPU, not yet timed or checked on one): a split
 * grid's second launch goes out with programmatic stream serialisation, so that its CTAs start on the SMs the first
 * launch leaves idle in its last wave (and without the gap between two launches), instead of after the whole first
 * grid; the first launch signals its dependents at its start, the second waits for the first before it exits (so
 * work queued after the forward still sees all of O and the LSE). Their own specialisations (fwd_pdl,
 * -DAL_SM90_FWD_PDL=1): the default kernels are unchanged. ATTNLAB_FLASH_SM90_PDL=0 switches it off as it does the
 * backward's. At 16 heads x 4096 on 132 SMs the split's first launch fills 1.94 waves at b = 1: 8 SMs idle for a
 * 192-row tile's time, plus the launch gap, in a forward of ~250 us where soft-capping measured 1.17-1.20x the plain
 * kernel on an H100 (session 26). */
static inline int al_flash_sm90_fwd_pdl(void) {
    const char *e = getenv("ATTNLAB_FLASH_SM90_FWD_PDL");
    return e && strcmp(e, "1") == 0 && al_flash_sm90_bwd_pdl();
}
/* role 2 (dK/dV/dQ) adds two dS^T buffers of bm x bn 16-bit elements; the persistent kernels a second set of
 * owned rows (and with a block mask a second tile list) */
static inline int al_flash_sm90_bwd_smem(const al_flash_spec *s, int role) {
    const al_flash_sm90_tiles t = al_flash_sm90_bwd_tiles(s);
    const int list = s->variant && s->block_mask ? 2 * AL_FLASH_SM90_BWD_BM_LIST + 16 : 0;
    return t.smem + (role == 2 ? 2 * t.bm * t.bn * 2 : 0) +
           (al_flash_sm90_bwd_persist(s, role) ? 2 * t.bm * s->d * 2 + list : 0);
}
/* the launch grid of role's kernel for B x H (HG kv heads) x SQ x SKV (thd: the longest sequence): (row blocks,
 * heads, batch) = the work items, or persistent min(items, sms) CTAs (one per SM: the shared memory allows
 * no second). Returns the number of work items. */
static inline long long al_flash_sm90_bwd_grid(const al_flash_spec *s, int role, long long B, long long H, long long HG,
                                               long long SQ, long long SKV, int sms, unsigned grid[3]) {
    const al_flash_sm90_tiles t = al_flash_sm90_bwd_tiles(s);
    const long long nx = ((role == 1 ? SQ : SKV) + t.bm - 1) / t.bm, ny = role == 1 ? H : HG;
    const long long items = nx * ny * B;
    if (al_flash_sm90_bwd_persist(s, role)) {
        grid[0] = (unsigned)(items < sms ? items : sms);
        grid[1] = grid[2] = 1;
    } else {
        grid[0] = (unsigned)nx;
        grid[1] = (unsigned)ny;
        grid[2] = (unsigned)B;
    }
    return items;
}
static inline const char *al_flash_sm90_bwd_file(void) { return "flash_bwd_sm90.cu"; }
static inline const char *al_flash_sm90_bwd_function(int role) {
    return role == 1 ? "al_flash_bwd_sm90_dq" : "al_flash_bwd_sm90_dkdv";
}
static inline int al_flash_sm90_bwd_options(const al_flash_spec *s, int role,
                                            char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN]) {
    al_flash_sm90_tiles t = al_flash_sm90_bwd_tiles(s);
    int n = 0;
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_HEAD_DIM=%d", s->d);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BF16=%d", s->bf16 ? 1 : 0);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_MASK_KIND=%d", s->mask);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BOTTOM_RIGHT=%d", s->bottom_right ? 1 : 0);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_ROLE=%d", role == 1 ? 1 : 0);
    if (role == 2) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_DQ_ATOMIC=1");
    if (al_flash_sm90_bwd_persist(s, role)) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_PERSIST=1");
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_BN=%d", t.bn);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_STAGES=%d", t.stages);
    snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_CONSUMERS=%d", t.consumers);
    if (s->variant) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_BLOCK_MASK=%d", s->block_mask ? 1 : 0);
    if (s->variant && s->block_mask) snprintf(opts[n++], AL_FLASH_OPT_LEN, "-DAL_SM90_BM_LIST=%d", AL_FLASH_SM90_BWD_BM_LIST);
    return n;
}
/* "bwd-sm90-dkdv d128 bf16 causal-br", "bwd-sm90-dkdvq d128 bf16 nomask",
 * "bwd-sm90-dq d128 bf16 nomask variant 0123456789abcdef blockmask" */
static inline void al_flash_sm90_bwd_name(const al_flash_spec *s, int role, char *buf, size_t n) {
    static const char *masks[] = {"nomask", "causal", "window"};
    static const char *roles[] = {"dkdv", "dq", "dkdvq"};
    int u = snprintf(buf, n, "bwd-sm90-%s d%d %s %s%s", roles[role], s->d, s->bf16 ? "bf16" : "f16",
                     masks[s->mask], s->mask == AL_FLASH_MASK_NONE ? "" : s->bottom_right ? "-br" : "-tl");
    if (s->variant && u > 0 && (size_t)u < n)
        snprintf(buf + u, n - (size_t)u, " variant %016llx%s", s->vhash[0], s->block_mask ? " blockmask" : "");
}
/* Every shipped (specialisation, role), i in [0, al_flash_sm90_bwd_count()): d 64/128 x bf16/f16 x 5 masks x
 * roles 0 and 1, then role 2 at d = 128 x bf16/f16 x 5 masks */
static inline int al_flash_sm90_bwd_count(void) { return 2 * 2 * 5 * 2 + 2 * 5; }
static inline void al_flash_sm90_bwd_at(int i, al_flash_spec *s, int *role) {
    static const int mk[5] = {0, 1, 1, 2, 2};
    static const int br[5] = {0, 0, 1, 0, 1};
    memset(s, 0, sizeof *s);
    s->kind = AL_FLASH_BWD;
    if (i >= 2 * 2 * 5 * 2) {
        i -= 2 * 2 * 5 * 2;
        *role = 2;
        s->mask = mk[i % 5];
        s->bottom_right = br[i % 5];
        s->bf16 = (i / 5) % 2 == 0;
        s->d = 128;
        return;
    }
    *role = i % 2;
    i /= 2;
    s->mask = mk[i % 5];
    s->bottom_right = br[i % 5];
    i /= 5;
    s->bf16 = i % 2 == 0;
    i /= 2;
    s->d = i % 2 ? 128 : 64;
}

#endif /* ATTNLAB_CUDA_FLASH_SM90_SPECS_H */
