/*
 * test_nvrtc_kernels.c — compiles EVERY shipped specialisation of the flash kernels (kernels/flash_fwd.cu,
 * kernels/flash_bwd.cu; the list and the -D options come from src/cuda/flash_specs.h, exactly what the
 * backend compiles at run time) to a cubin with NVRTC, on a machine without a GPU: NVRTC needs none.
 * So CI catches a kernel that no longer compiles.
 *
 *   - every specialisation for sm_90a (Hopper), and the causal ones for sm_80 (the plugin's floor);
 *   - NVRTC's ptxas report (--ptxas-options=-v) is parsed: the d <= 128 forward kernels must not
 *     spill (checked); every kernel's registers and spill bytes are printed;
 *   - each cubin must contain the kernel names the backend looks up;
 *   - compile times are printed per specialisation (what a first call costs).
 * libnvrtc is loaded with dlopen ($ATTNLAB_NVRTC_LIB, libnvrtc.so.13, libnvrtc.so, $CUDA_HOME/lib64,
 * /usr/local/cuda/lib64); without it the suite reports itself skipped, with the reason.
 * The Hopper forward (kernels/flash_fwd_sm90.cu, its 30 specialisations from src/cuda/flash_sm90_specs.h)
 * and the Hopper backward (kernels/flash_bwd_sm90.cu: 20 specialisations x its two kernels, the default
 * backward on sm_90) are compiled for sm_90a too, and must not spill at all.
 * Representative variant specialisations of the Hopper backward (score_mod + score_grad soft-capping,
 * mask_mod + block mask, a capture-read score_mod with its capture gradient, all hooks at once; both
 * kernels each, the hooks written as variants.lua writes them) are compiled too, and must not spill.
 * Kernel folder: $ATTNLAB_KERNEL_DIR, else ./kernels (make test runs from the repository root).
 * Specialisations compile in parallel (OpenMP threads; OMP_NUM_THREADS caps them);
 * ATTNLAB_NVRTC_TEST_ONLY="fwd d128" keeps the specialisations whose name contains the text;
 * ATTNLAB_NVRTC_DUMP=DIR writes each cubin to DIR/<job name>.cubin (spaces as _), for reading the SASS
 * without a GPU (scripts/sass.sh does that and disassembles them; docs/FLASH.md, "Reading the SASS").
 */
#include "test_main.h"
#include "cuda/flash_specs.h"
#include "cuda/flash_sm90_specs.h"

#include "nvrtc_test.h"

static nvrtc_api nv;
static char g_kdir[1024];
static char *g_src[4];      /* flash_fwd.cu, flash_bwd.cu, flash_fwd_sm90.cu, flash_bwd_sm90.cu */

/* a job's kernel family: stage 1, the Hopper forward, the Hopper backward's dK/dV or dQ kernel */
enum { FAM_STAGE1 = 0, FAM_SM90_FWD = 1, FAM_SM90_BWD_DKDV = 2, FAM_SM90_BWD_DQ = 3 };

typedef nvrtc_result result;

/* Variant specialisations of the Hopper backward compiled here: (what, score_mod, score_grad, mask_mod,
 * capture_grad, d, mask kind, block mask), each for both kernels. Captures: 0 = i32 document ids
 * [2, 4096], 1 = f32 relative bias [16, 8191]. (The folded forms and the prelude's helpers come from
 * variants.lua itself: the generated snippets below.) */
typedef struct bwd_variant {
    const char *what, *score, *grad, *mask, *capg;
    int d, mask_kind, block_mask;
} bwd_variant;
#define BV_SOFTCAP "30.0f * tanhf(score * (1.0f / 30.0f))"
#define BV_SOFTCAP_GRAD "grad * (1.0f - tanhf(score * (1.0f / 30.0f)) * tanhf(score * (1.0f / 30.0f)))"
#define BV_DOC "((const int *)AL_CAP(0))[b * 4096 + q_idx] == ((const int *)AL_CAP(0))[b * 4096 + kv_idx]"
#define BV_REL "score + ((const float *)AL_CAP(1))[h * 8191 + (kv_idx - q_idx + 4095)]"
#define BV_REL_CAPG "atomicAdd(AL_CAP_GRAD(1) + h * 8191 + (kv_idx - q_idx + 4095), grad)"
static const bwd_variant g_bwd_variants[] = {
    {"softcap score_mod + score_grad", BV_SOFTCAP, BV_SOFTCAP_GRAD, NULL, NULL, 128, AL_FLASH_MASK_CAUSAL, 0},
    {"softcap score_mod + score_grad", BV_SOFTCAP, BV_SOFTCAP_GRAD, NULL, NULL, 64, AL_FLASH_MASK_NONE, 0},
    {"document mask_mod + block mask", NULL, NULL, BV_DOC, NULL, 128, AL_FLASH_MASK_NONE, 1},
    {"relative bias + capture grad", BV_REL, NULL, NULL, BV_REL_CAPG, 128, AL_FLASH_MASK_NONE, 0},
    {"every hook + block mask", BV_SOFTCAP " + ((const float *)AL_CAP(1))[h * 8191 + (kv_idx - q_idx + 4095)]",
     BV_SOFTCAP_GRAD, BV_DOC, BV_REL_CAPG, 128, AL_FLASH_MASK_CAUSAL, 1},
};
#define N_BWD_VARIANTS ((int)(sizeof g_bwd_variants / sizeof g_bwd_variants[0]))

/* ---- the generated snippets of the example variants (tests/c/variant_snippets.lua) ---------------- */
/* One variant as lua/attnlab/variants.lua writes it; the strings point into the file's text. */
typedef struct gen_variant {
    char name[64];
    int block_mask;
    al_flash_hooks hk;
    int bounded;                 /* bits: score_lo, score_hi given (the logit's bounds: the forward's fixed max) */
    double score_lo, score_hi;
} gen_variant;

/* Parses the file tests/c/variant_snippets.lua writes ("variant NAME BM", "KEY LEN" + LEN bytes + "\n", "end");
 * returns the number of variants (at most max), or -1 with why set when the text is malformed. text is
 * modified in place (each snippet NUL-terminated). */
static int parse_gen_variants(char *text, gen_variant *out, int max, char *why, size_t nwhy) {
    int n = 0;
    char *c = text;
    while (*c) {
        char name[64];
        int bm = 0;
        if (sscanf(c, "variant %63s %d", name, &bm) != 2 || n >= max) {
            snprintf(why, nwhy, "expected \"variant NAME BLOCK_MASK\" (at most %d), found \"%.40s\"", max, c);
            return -1;
        }
        gen_variant *v = &out[n++];
        memset(v, 0, sizeof *v);
        snprintf(v->name, sizeof v->name, "%s", name);
        v->block_mask = bm;
        c = strchr(c, '\n');
        if (!c) break;
        c++;
        while (strncmp(c, "end\n", 4) != 0) {
            char key[32];
            long len = -1;
            if (sscanf(c, "%31s %ld", key, &len) != 2 || len < 0) {
                snprintf(why, nwhy, "variant %s: expected \"KEY LENGTH\", found \"%.40s\"", name, c);
                return -1;
            }
            c = strchr(c, '\n');
            if (!c || (long)strlen(c + 1) < len + 1) {
                snprintf(why, nwhy, "variant %s: %s is cut short", name, key);
                return -1;
            }
            char *val = c + 1;
            val[len] = 0;
            c = val + len + 1;
            if (!strcmp(key, "score_mod")) v->hk.score_mod = val;
            else if (!strcmp(key, "score_grad")) v->hk.score_grad = val;
            else if (!strcmp(key, "mask_mod")) v->hk.mask_mod = val;
            else if (!strcmp(key, "capture_grad")) v->hk.capture_grad = val;
            else if (!strcmp(key, "prelude")) v->hk.prelude = val;
            else if (!strcmp(key, "score_pre")) v->hk.score_pre = val;
            else if (!strcmp(key, "score_post")) v->hk.score_post = atof(val);
            else if (!strcmp(key, "score_grad_pre")) v->hk.score_grad_pre = val;
            else if (!strcmp(key, "score_lo")) v->score_lo = atof(val), v->bounded |= 1;
            else if (!strcmp(key, "score_hi")) v->score_hi = atof(val), v->bounded |= 2;
            else {
                snprintf(why, nwhy, "variant %s: unknown key %s", name, key);
                return -1;
            }
        }
        al_flash_hooks_set_bounds(&v->hk, v->bounded == 3, v->score_lo, v->score_hi);
        c += 4;
    }
    return n;
}

/* the kernel names a specialisation's module must hold */
static int job_functions(const al_flash_spec *s, int fam, const char **names) {
    if (fam == FAM_SM90_FWD) {
        names[0] = al_flash_sm90_function();
        return 1;
    }
    if (fam >= FAM_SM90_BWD_DKDV) {
        names[0] = al_flash_sm90_bwd_function(fam - FAM_SM90_BWD_DKDV);
        return 1;
    }
    return al_flash_spec_functions(s, names);
}

static void job_name(const al_flash_spec *s, int fam, char *buf, size_t n) {
    if (fam == FAM_SM90_FWD) al_flash_sm90_spec_name(s, buf, n);
    else if (fam >= FAM_SM90_BWD_DKDV) al_flash_sm90_bwd_name(s, fam - FAM_SM90_BWD_DKDV, buf, n);
    else al_flash_spec_name(s, buf, n);
}

/* $ATTNLAB_NVRTC_DUMP/<name>_<arch>.cubin, the name's spaces and slashes as '_'; a write that fails is a
 * failure of the job */
static void dump_cubin(const char *name, const char *arch, const char *cub, size_t n) {
    char path[1400];
    int k = snprintf(path, sizeof path, "%s/", getenv("ATTNLAB_NVRTC_DUMP"));
    for (const char *c = name; *c && k < (int)sizeof path - 40; c++) path[k++] = (*c == ' ' || *c == '/') ? '_' : *c;
    snprintf(path + k, sizeof path - k, "_%s.cubin", arch);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(cub, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    CHECK(ok, "ATTNLAB_NVRTC_DUMP: could not write %s", path);
}

/* prefix: a variant's generated source (compiled as nvrtc_cache.cu does: prefix, a newline, the file), or NULL */
static void compile_one(const al_flash_spec *s, const char *arch, int fam, const char *prefix, result *r) {
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
    const char *o[AL_FLASH_MAX_OPTS];
    int n = fam == FAM_SM90_FWD ? al_flash_sm90_spec_options(s, opts)
          : fam >= FAM_SM90_BWD_DKDV ? al_flash_sm90_bwd_options(s, fam - FAM_SM90_BWD_DKDV, opts)
                                     : al_flash_spec_options(s, opts);
    for (int i = 0; i < n; i++) o[i] = opts[i];
    const char *names[4];
    int nf = job_functions(s, fam, names);
    const char *src = fam == FAM_SM90_FWD ? g_src[2] : fam >= FAM_SM90_BWD_DKDV ? g_src[3] : g_src[s->kind];
    const char *file = fam == FAM_SM90_FWD ? al_flash_sm90_spec_file()
                     : fam >= FAM_SM90_BWD_DKDV ? al_flash_sm90_bwd_file() : al_flash_spec_file(s);
    char *full = NULL;
    if (prefix) {
        full = malloc(strlen(prefix) + strlen(src) + 2);
        if (!full) {
            memset(r, 0, sizeof *r);
            snprintf(r->msg, sizeof r->msg, "out of host memory");
            return;
        }
        sprintf(full, "%s\n%s", prefix, src);
    }
    nvrtc_compile_source(&nv, full ? full : src, file, arch, g_kdir, o, n, names, nf, r);
    free(full);
}

/* 1 when the option list holds opt */
static int has_opt(char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN], int n, const char *opt) {
    for (int i = 0; i < n; i++)
        if (strcmp(opts[i], opt) == 0) return 1;
    return 0;
}

/* The Hopper backward's launch shapes (src/cuda/flash_sm90_specs.h; host arithmetic, no NVRTC): by default the
 * dK/dV and dQ kernels of every shipped specialisation are persistent (-DAL_SM90_PERSIST=1) and their shared
 * memory, the owned rows double-buffered, still fits sm_90's 227 KB opt-in limit; their grid is min(work items,
 * SMs); variants are too (a block mask's tile list doubled); the dK/dV/dQ kernel (role 2) never is; ATTNLAB_FLASH_SM90_PERSIST=0 / dq / dkdv choose;
 * ATTNLAB_FLASH_SM90_PDL=0 launches the dQ kernel without programmatic stream serialisation. */
static void test_bwd_launch_shapes(void) {
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
    unsetenv("ATTNLAB_FLASH_SM90_PERSIST");
    for (int i = 0; i < al_flash_sm90_bwd_count(); i++) {
        al_flash_spec s;
        int role;
        al_flash_sm90_bwd_at(i, &s, &role);
        const int n = al_flash_sm90_bwd_options(&s, role, opts), persist = al_flash_sm90_bwd_persist(&s, role);
        const int smem = al_flash_sm90_bwd_smem(&s, role);
        CHECK(persist == (role != 2), "spec %d role %d: persistent %d", i, role, persist);
        CHECK(has_opt(opts, n, "-DAL_SM90_PERSIST=1") == persist, "spec %d role %d: the option list and the schedule "
              "disagree", i, role);
        CHECK(smem <= 227 * 1024, "spec %d role %d (d %d): %d bytes of shared memory, over sm_90's 232448", i, role,
              s.d, smem);
        if (persist) {
            setenv("ATTNLAB_FLASH_SM90_PERSIST", "0", 1);
            const int plain = al_flash_sm90_bwd_smem(&s, role);
            unsetenv("ATTNLAB_FLASH_SM90_PERSIST");
            CHECK(smem - plain == 2 * 128 * s.d * 2, "spec %d role %d: the second set of owned rows takes %d bytes, "
                  "expected %d", i, role, smem - plain, 2 * 128 * s.d * 2);
        }
        al_flash_spec v = s;   /* a variant of it: persistent as the plain kernel, with a block mask a second list */
        v.variant = 1;
        CHECK(al_flash_sm90_bwd_persist(&v, role) == persist && al_flash_sm90_bwd_smem(&v, role) == smem,
              "spec %d role %d: a variant persistent %d, %d bytes (the plain kernel: %d, %d)", i, role,
              al_flash_sm90_bwd_persist(&v, role), al_flash_sm90_bwd_smem(&v, role), persist, smem);
        v.block_mask = 1;
        const int vs = al_flash_sm90_bwd_smem(&v, role), list = 2 * AL_FLASH_SM90_BWD_BM_LIST + 16;
        CHECK(al_flash_sm90_bwd_persist(&v, role) == persist && vs == smem + (persist ? 2 : 1) * list &&
                  vs <= 227 * 1024,
              "spec %d role %d: a block-mask variant persistent %d, %d bytes (expected the plain kernel's %d + %d "
              "lists of %d, within 232448)", i, role, al_flash_sm90_bwd_persist(&v, role), vs, smem, persist ? 2 : 1,
              list);
    }
    al_flash_spec s;
    int role;
    al_flash_sm90_bwd_at(0, &s, &role);
    unsigned g[3];
    /* dK/dV: batch 4 x 16 kv heads x 4096 keys / 128 = 2048 work items on 132 SMs */
    long long items = al_flash_sm90_bwd_grid(&s, 0, 4, 16, 16, 4096, 4096, 132, g);
    CHECK(items == 2048 && g[0] == 132 && g[1] == 1 && g[2] == 1, "persistent dK/dV: %lld items, grid %u %u %u", items,
          g[0], g[1], g[2]);
    items = al_flash_sm90_bwd_grid(&s, 1, 1, 2, 1, 200, 77, 132, g);   /* dQ: 2 heads x 2 query blocks */
    CHECK(items == 4 && g[0] == 4 && g[1] == 1 && g[2] == 1, "persistent dQ, few items: %lld, grid %u %u %u", items,
          g[0], g[1], g[2]);
    setenv("ATTNLAB_FLASH_SM90_PERSIST", "0", 1);
    items = al_flash_sm90_bwd_grid(&s, 0, 4, 16, 8, 1000, 4096, 132, g);   /* the work grid: (32, 8, 4) */
    CHECK(items == 1024 && g[0] == 32 && g[1] == 8 && g[2] == 4, "ATTNLAB_FLASH_SM90_PERSIST=0 dK/dV: %lld items, grid "
          "%u %u %u", items, g[0], g[1], g[2]);
    int n = al_flash_sm90_bwd_options(&s, 0, opts);
    CHECK(!has_opt(opts, n, "-DAL_SM90_PERSIST=1"), "ATTNLAB_FLASH_SM90_PERSIST=0 still compiles the persistent kernel");
    setenv("ATTNLAB_FLASH_SM90_PERSIST", "dq", 1);
    CHECK(!al_flash_sm90_bwd_persist(&s, 0) && al_flash_sm90_bwd_persist(&s, 1), "ATTNLAB_FLASH_SM90_PERSIST=dq");
    setenv("ATTNLAB_FLASH_SM90_PERSIST", "dkdv", 1);
    CHECK(al_flash_sm90_bwd_persist(&s, 0) && !al_flash_sm90_bwd_persist(&s, 1), "ATTNLAB_FLASH_SM90_PERSIST=dkdv");
    unsetenv("ATTNLAB_FLASH_SM90_PERSIST");
    /* the dQ kernel beside the dK/dV kernel's end: on by default, ATTNLAB_FLASH_SM90_PDL=0 turns it off */
    unsetenv("ATTNLAB_FLASH_SM90_PDL");
    CHECK(al_flash_sm90_bwd_pdl(), "programmatic dependent launch off by default");
    setenv("ATTNLAB_FLASH_SM90_PDL", "0", 1);
    CHECK(!al_flash_sm90_bwd_pdl(), "ATTNLAB_FLASH_SM90_PDL=0 ignored");
    unsetenv("ATTNLAB_FLASH_SM90_PDL");
}

/* The three-consumer forward's launch shape (ATTNLAB_FLASH_SM90_CONSUMERS=3, flash_sm90_specs.h; host arithmetic): at
 * d = 64 / 128 three consumers (512 threads), 192 x 64 tiles, four stages within sm_90's shared memory (with a block
 * mask's list too), its options (a block mask's block-row span with three consumers only) and name; at d = 256 the
 * default tiles whatever the field says; the switch reads "2" and "3" only; and when three consumers pay
 * (al_flash_sm90_c3_pays, the waves of the two grids worked out here by hand). */
static void test_fwd_c3_shapes(void) {
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN], nm[128];
    for (int i = 0; i < al_flash_sm90_spec_count(); i++) {
        al_flash_spec s;
        al_flash_sm90_spec_at(i, &s);
        const al_flash_sm90_tiles def = al_flash_sm90_spec_tiles(&s);
        CHECK(def.consumers == 2 && def.threads == 384 && def.bm == 128, "spec %d: default tiles %d consumers", i,
              def.consumers);
        s.fwd_consumers = 3;
        const al_flash_sm90_tiles t = al_flash_sm90_spec_tiles(&s);
        if (s.d > 128) {
            CHECK(memcmp(&t, &def, sizeof t) == 0, "spec %d (d %d): three consumers asked where they do not apply "
                  "changed the tiles", i, s.d);
            continue;
        }
        CHECK(t.consumers == 3 && t.threads == 512 && t.bm == 192 && t.bn == 64 && t.stages == 4,
              "spec %d: c3 tiles %d consumers, %d threads, %d x %d, %d stages", i, t.consumers, t.threads, t.bm, t.bn,
              t.stages);
        CHECK(t.smem == 192 * s.d * 2 + 2 * 4 * 64 * s.d * 2 + 2048 && t.smem <= 227 * 1024, "spec %d: c3 smem %d", i,
              t.smem);
        const int n = al_flash_sm90_spec_options(&s, opts);
        CHECK(has_opt(opts, n, "-DAL_SM90_CONSUMERS=3") && has_opt(opts, n, "-DAL_SM90_BN=64") &&
                  has_opt(opts, n, "-DAL_SM90_STAGES=4"),
              "spec %d: c3 options lack the consumers, tile width or stages", i);
        al_flash_sm90_spec_name(&s, nm, sizeof nm);
        CHECK(strstr(nm, " c3") != NULL, "spec %d: c3 name '%s'", i, nm);
        CHECK(!has_opt(opts, n, "-DAL_SM90_BM_SPAN=1"), "spec %d: c3 without a block mask compiles the span", i);
        s.variant = s.block_mask = 1;
        int nb = al_flash_sm90_spec_options(&s, opts);
        CHECK(has_opt(opts, nb, "-DAL_SM90_BM_SPAN=1"), "spec %d: a c3 block mask without the block-row span", i);
        s.fwd_consumers = 0;
        nb = al_flash_sm90_spec_options(&s, opts);
        CHECK(!has_opt(opts, nb, "-DAL_SM90_BM_SPAN=1"), "spec %d: the two-consumer block mask compiles the span", i);
        s.fwd_consumers = 3;
        const al_flash_sm90_tiles tb = al_flash_sm90_spec_tiles(&s);
        CHECK(tb.smem == t.smem + 2 * AL_FLASH_SM90_BM_LIST + 16 && tb.smem <= 227 * 1024, "spec %d: c3 block-mask smem %d",
              i, tb.smem);
    }
    CHECK(al_flash_sm90_c3_bn(128) == 64 && al_flash_sm90_c3_bn(64) == 64 && al_flash_sm90_c3_bn(256) == 0,
          "al_flash_sm90_c3_bn");
    const char *vals[] = {NULL, "", "2", "03", "x", "3", "4", "22"};
    const int want[] = {0, 0, 2, 0, 0, 3, 0, 0};
    for (int k = 0; k < 8; k++) {
        if (vals[k]) setenv("ATTNLAB_FLASH_SM90_CONSUMERS", vals[k], 1);
        else unsetenv("ATTNLAB_FLASH_SM90_CONSUMERS");
        CHECK(al_flash_sm90_consumers_env() == want[k], "ATTNLAB_FLASH_SM90_CONSUMERS=%s read as %d, expected %d",
              vals[k] ? vals[k] : "(unset)", al_flash_sm90_consumers_env(), want[k]);
    }
    unsetenv("ATTNLAB_FLASH_SM90_CONSUMERS");
    /* {sq, b x h, SMs, pays}: 16 heads x 4096 on 132 SMs: two consumers' 32 row blocks per pair fill 4 / 8 / 16 waves
     * at b = 1 / 2 / 4, three's 22 fill 2.7 / 5.3 / 10.7, so 3 / 6 / 11 waves: 3 x 192 x 0.94 = 541 > 512, 6 x 180.5 =
     * 1083 > 1024, 11 x 180.5 = 1985 < 2048; at 8192 b = 2 (16 / 11 waves) and at 16384 b = 1 (16 / 11) they pay; a
     * grid inside one wave never does (192 x 0.94 > 128); on 114 SMs (an H100 PCIe) 4 x 16 x 4096 takes 18 / 13
     * waves: 2346 > 2304; 10 x 16 x 3072 (the GPU spec's shape) pays on 132 and 114; nothing to run pays nothing */
    const struct { int64_t sq, hb; int sms, pays; } C3[] = {
        {4096, 16, 132, 0}, {4096, 32, 132, 0}, {4096, 64, 132, 1}, {8192, 32, 132, 1}, {8192, 16, 132, 0},
        {16384, 16, 132, 1}, {384, 2, 132, 0}, {4096, 64, 114, 0}, {3072, 160, 132, 1}, {3072, 160, 114, 1},
        {0, 16, 132, 0}, {4096, 0, 132, 0}, {4096, 64, 0, 0},
    };
    for (size_t k = 0; k < sizeof C3 / sizeof C3[0]; k++)
        CHECK(al_flash_sm90_c3_pays(C3[k].sq, C3[k].hb, C3[k].sms) == C3[k].pays,
              "al_flash_sm90_c3_pays(sq %lld, b x h %lld, %d SMs) = %d, expected %d", (long long)C3[k].sq,
              (long long)C3[k].hb, C3[k].sms, al_flash_sm90_c3_pays(C3[k].sq, C3[k].hb, C3[k].sms), C3[k].pays);
    /* the split grid (ATTNLAB_FLASH_SM90_CONSUMERS=split): {sq, b x h, SMs, rows for three consumers}, by hand in
     * units of a 128-row wave, three consumers' 192-row wave costing 180.48. 16 x 4096 on 132 SMs, b = 1: 16 blocks
     * of 192 (256 CTAs, 2 waves) + 8 of 128 (128 CTAs, 1 wave) = 489 < 512 (two) and 541 (three); b = 2: 4 + 2 waves
     * = 978 < 1024, 1083; b = 4: 20 blocks (1280 CTAs, 10 waves) + 2 of 128 (128 CTAs) = 1933 < 2048, 1985. On 114
     * SMs b = 1: 12 blocks (192 CTAs, 2 waves) + 14 of 128 (224, 2 waves) = 617 < 640, 722. One wave of two
     * consumers (1024 rows x 16 heads): nothing to gain, 0. Three consumers throughout where no split beats them:
     * 16128 = 84 x 192 rows x 16 heads on 1 SM (every CTA its own wave, a row of three costing 0.94 of two's): sq. */
    const struct { int64_t sq, hb; int sms; int64_t r3; } R3[] = {
        {4096, 16, 132, 3072}, {4096, 32, 132, 3072}, {4096, 64, 132, 3840}, {4096, 16, 114, 2304},
        {1024, 16, 132, 0}, {384, 2, 132, 0}, {16128, 16, 1, 16128}, {0, 16, 132, 0}, {4096, 16, 0, 0},
    };
    for (size_t k = 0; k < sizeof R3 / sizeof R3[0]; k++) {
        const int64_t got = al_flash_sm90_c3_rows(R3[k].sq, R3[k].hb, R3[k].sms);
        CHECK(got == R3[k].r3, "al_flash_sm90_c3_rows(sq %lld, b x h %lld, %d SMs) = %lld, expected %lld",
              (long long)R3[k].sq, (long long)R3[k].hb, R3[k].sms, (long long)got, (long long)R3[k].r3);
        CHECK(got % 192 == 0 || got == R3[k].sq, "al_flash_sm90_c3_rows: %lld rows is no whole number of 192-row blocks",
              (long long)got);
    }
    /* the two launches cover every row once: [0, r3) in 192-row blocks, [r3, sq) in 128-row blocks from r3, for
     * every split the model picks over a range of shapes and SM counts */
    int covered_ok = 1, nsplit = 0;
    for (int64_t sq = 192; sq <= 9000 && covered_ok; sq += 193)
        for (int sms = 60; sms <= 144 && covered_ok; sms += 12)
            for (int64_t hb = 1; hb <= 64 && covered_ok; hb *= 4) {
                const int64_t r3 = al_flash_sm90_c3_rows(sq, hb, sms);
                if (r3 <= 0 || r3 >= sq) continue;
                nsplit++;
                int64_t gx[2];
                al_flash_sm90_split_grid(sq, r3, gx);
                /* launch 1: block m covers [192 m, 192 m + 192); launch 2: [r3 + 128 m, min(sq, r3 + 128 m + 128)) */
                const int64_t end1 = 192 * gx[0], start2 = r3, last2 = r3 + 128 * (gx[1] - 1);
                covered_ok = r3 % 192 == 0 && end1 == start2 && last2 < sq && last2 + 128 >= sq && gx[0] > 0 && gx[1] > 0;
                CHECK(covered_ok, "split grid sq %lld, b x h %lld, %d SMs: r3 %lld, %lld + %lld blocks do not tile the rows",
                      (long long)sq, (long long)hb, sms, (long long)r3, (long long)gx[0], (long long)gx[1]);
            }
    CHECK(nsplit > 20, "only %d shapes split: the coverage check saw too few", nsplit);
    /* the host's policy (al_flash_sm90_split_rows): {sq, b x h, SMs, forced, r3}. 16 x 4096 on 132 SMs splits at
     * b = 1 and 2 by default; at b = 4 three consumers throughout pay, so only a forced split (3840); a shape with no
     * split row gives 0 forced or not; 16128 x 16 on 1 SM (three throughout best: r3 = sq) is one launch */
    const struct { int64_t sq, hb; int sms, forced; int64_t r3; } SP[] = {
        {4096, 16, 132, 0, 3072}, {4096, 32, 132, 0, 3072}, {4096, 64, 132, 0, 0}, {4096, 64, 132, 1, 3840},
        {4096, 16, 114, 0, 2304}, {1024, 16, 132, 0, 0}, {1024, 16, 132, 1, 0}, {16128, 16, 1, 1, 0},
        {3072, 160, 132, 0, 0}, {0, 16, 132, 1, 0},
    };
    for (size_t k = 0; k < sizeof SP / sizeof SP[0]; k++) {
        const int64_t got = al_flash_sm90_split_rows(SP[k].sq, SP[k].hb, SP[k].sms, SP[k].forced);
        CHECK(got == SP[k].r3, "al_flash_sm90_split_rows(sq %lld, b x h %lld, %d SMs, forced %d) = %lld, expected %lld",
              (long long)SP[k].sq, (long long)SP[k].hb, SP[k].sms, SP[k].forced, (long long)got, (long long)SP[k].r3);
    }
    setenv("ATTNLAB_FLASH_SM90_CONSUMERS", "split", 1);
    CHECK(al_flash_sm90_split_env() == 1 && al_flash_sm90_consumers_env() == 0, "ATTNLAB_FLASH_SM90_CONSUMERS=split");
    setenv("ATTNLAB_FLASH_SM90_CONSUMERS", "3", 1);
    CHECK(al_flash_sm90_split_env() == 0, "ATTNLAB_FLASH_SM90_CONSUMERS=3 read as split");
    unsetenv("ATTNLAB_FLASH_SM90_CONSUMERS");
    /* the split grid's second launch: the default tiles, -DAL_SM90_ROW0=1, " row0" in its name */
    al_flash_spec r0;
    al_flash_sm90_spec_at(0, &r0);
    const al_flash_sm90_tiles t0 = al_flash_sm90_spec_tiles(&r0);
    int n0 = al_flash_sm90_spec_options(&r0, opts);
    CHECK(!has_opt(opts, n0, "-DAL_SM90_ROW0=1"), "ROW0 without fwd_row0");
    r0.fwd_row0 = 1;
    const al_flash_sm90_tiles t1 = al_flash_sm90_spec_tiles(&r0);
    n0 = al_flash_sm90_spec_options(&r0, opts);
    al_flash_sm90_spec_name(&r0, nm, sizeof nm);
    CHECK(memcmp(&t0, &t1, sizeof t0) == 0 && has_opt(opts, n0, "-DAL_SM90_ROW0=1") && strstr(nm, " row0") != NULL,
          "fwd_row0: tiles changed, or no ROW0 option, or name '%s'", nm);
    /* the split grid's launches under programmatic dependent launch: -DAL_SM90_FWD_PDL=1, " pdl"; opt-in, and off
     * whenever ATTNLAB_FLASH_SM90_PDL=0 */
    CHECK(!has_opt(opts, n0, "-DAL_SM90_FWD_PDL=1"), "FWD_PDL without fwd_pdl");
    r0.fwd_pdl = 1;
    const al_flash_sm90_tiles t2 = al_flash_sm90_spec_tiles(&r0);
    n0 = al_flash_sm90_spec_options(&r0, opts);
    al_flash_sm90_spec_name(&r0, nm, sizeof nm);
    CHECK(memcmp(&t0, &t2, sizeof t0) == 0 && has_opt(opts, n0, "-DAL_SM90_FWD_PDL=1") && strstr(nm, " row0 pdl") != NULL,
          "fwd_pdl: tiles changed, or no FWD_PDL option, or name '%s'", nm);
    unsetenv("ATTNLAB_FLASH_SM90_FWD_PDL");
    unsetenv("ATTNLAB_FLASH_SM90_PDL");
    CHECK(al_flash_sm90_fwd_pdl() == 0, "ATTNLAB_FLASH_SM90_FWD_PDL unset read as on");
    setenv("ATTNLAB_FLASH_SM90_FWD_PDL", "1", 1);
    CHECK(al_flash_sm90_fwd_pdl() == 1, "ATTNLAB_FLASH_SM90_FWD_PDL=1 read as off");
    setenv("ATTNLAB_FLASH_SM90_PDL", "0", 1);
    CHECK(al_flash_sm90_fwd_pdl() == 0, "ATTNLAB_FLASH_SM90_PDL=0 did not switch the forward's PDL off");
    setenv("ATTNLAB_FLASH_SM90_FWD_PDL", "yes", 1);
    unsetenv("ATTNLAB_FLASH_SM90_PDL");
    CHECK(al_flash_sm90_fwd_pdl() == 0, "ATTNLAB_FLASH_SM90_FWD_PDL=yes read as on");
    unsetenv("ATTNLAB_FLASH_SM90_FWD_PDL");
}

int main(void) {
    RUN(test_bwd_launch_shapes);
    RUN(test_fwd_c3_shapes);
    char why[512];
    if (!nvrtc_load(&nv, why, sizeof why)) {
        /* missing library: skipped; a library without an entry point: a failure */
        int broken = strstr(why, "lacks") != NULL;
        printf("c-test nvrtc_kernels: %d passed, %d failed, %d skipped (%s)\n", t_passed, t_failed + broken, !broken,
               why);
        return broken || t_failed;
    }
    int major = 0, minor = 0;
    nv.version(&major, &minor);
    const char *kd = getenv("ATTNLAB_KERNEL_DIR");
    snprintf(g_kdir, sizeof g_kdir, "%s", kd && *kd ? kd : "kernels");
    char p0[1200], p1[1200], p2[1200], p3[1200];
    snprintf(p0, sizeof p0, "%s/flash_fwd.cu", g_kdir);
    snprintf(p1, sizeof p1, "%s/flash_bwd.cu", g_kdir);
    snprintf(p2, sizeof p2, "%s/%s", g_kdir, al_flash_sm90_spec_file());
    snprintf(p3, sizeof p3, "%s/%s", g_kdir, al_flash_sm90_bwd_file());
    g_src[0] = test_slurp(p0);
    g_src[1] = test_slurp(p1);
    g_src[2] = test_slurp(p2);
    g_src[3] = test_slurp(p3);
    t_current = "kernel sources";
    t_current_failed = 0;
    CHECK(g_src[0] && g_src[1] && g_src[2] && g_src[3], "cannot read %s, %s, %s and %s (run from the repository root "
          "or set ATTNLAB_KERNEL_DIR)", p0, p1, p2, p3);
    if (t_current_failed) { t_failed++; return SUMMARY("nvrtc_kernels"); }
    t_passed++;

    /* the example variants' generated snippets (make test writes the file; ATTNLAB_VARIANT_SNIPPETS names
     * another): each compiled for the Hopper forward (bf16 d128 no mask, f16 d64 causal; three consumers: bf16 d128 no mask,
     * bf16 d64 causal), the Hopper
     * backward's two kernels (bf16 d128 causal) and the stage-1 forward and backward (bf16 d64, sm_90a) */
    enum { MAX_GEN = 24, JOBS_PER_GEN = 11 };
    static gen_variant gen[MAX_GEN];
    int ngen = 0;
    const char *gpath = getenv("ATTNLAB_VARIANT_SNIPPETS");
    if (!gpath || !*gpath) gpath = "build/variant_snippets.txt";
    char *gtext = test_slurp(gpath);
    t_current = "generated variant snippets";
    t_current_failed = 0;
    if (!gtext) {
        printf("nvrtc_kernels: %s not found (make test writes it with tests/c/variant_snippets.lua): the generated "
               "variants are not compiled\n", gpath);
    } else {
        char gwhy[200];
        ngen = parse_gen_variants(gtext, gen, MAX_GEN, gwhy, sizeof gwhy);
        CHECK(ngen > 0, "%s: %s", gpath, ngen < 0 ? gwhy : "no variant in it");
        if (ngen < 0) ngen = 0;
        /* soft-capping's logit is bounded ([-c, c] at the example's cap c): its forward compiles with the fixed max
         * (AL_SCORE_MOD_MAX, kernels/flash_fwd_sm90.cu's AL_FL_FIXED_MAX); the relative bias reads a capture: not */
        const char *fm = getenv("ATTNLAB_FLASH_SM90_FIXED_MAX");
        const int fixed_on = !(fm && !strcmp(fm, "0"));
        for (int i = 0; i < ngen; i++) {
            if (!strcmp(gen[i].name, "softcap") && fixed_on)
                CHECK(gen[i].hk.fixed_max && gen[i].score_hi > 0 && gen[i].score_lo == -gen[i].score_hi &&
                          gen[i].hk.score_max == gen[i].score_hi,
                      "softcap: fixed max %d at %g (bounds %g %g), expected 1 at the cap", gen[i].hk.fixed_max,
                      gen[i].hk.score_max, gen[i].score_lo, gen[i].score_hi);
            if (!strcmp(gen[i].name, "relative_bias"))
                CHECK(!gen[i].hk.fixed_max && !gen[i].bounded, "relative_bias: bounded %d", gen[i].bounded);
        }
        if (t_current_failed) t_failed++;
        else t_passed++;
    }

    /* the jobs: every spec for sm_90a, the causal top-left ones for sm_80 */
    const int nspec = al_flash_spec_count(),
              n_sm90 = 2 * al_flash_sm90_spec_count() + al_flash_sm90_bwd_count() + 2 * N_BWD_VARIANTS +
                       JOBS_PER_GEN * ngen;
    int njobs = 0;
    al_flash_spec *specs = calloc((size_t)(nspec * 2 + n_sm90), sizeof *specs);
    const char **archs = calloc((size_t)(nspec * 2 + n_sm90), sizeof *archs);
    int *sm90 = calloc((size_t)(nspec * 2 + n_sm90), sizeof *sm90);
    char **prefix = calloc((size_t)(nspec * 2 + n_sm90), sizeof *prefix);   /* variant sources, NULL = none */
    const char **what = calloc((size_t)(nspec * 2 + n_sm90), sizeof *what);
    char *generated = calloc((size_t)(nspec * 2 + n_sm90), 1);   /* 1: a job of the snippets file */
    const char *only = getenv("ATTNLAB_NVRTC_TEST_ONLY");   /* a name substring, e.g. "fwd d128 bf16" */
    char nm[96];
    for (int i = 0; i < nspec; i++) {
        al_flash_spec_at(i, &specs[njobs]);
        al_flash_spec_name(&specs[njobs], nm, sizeof nm);
        if (only && *only && !strstr(nm, only)) continue;
        archs[njobs++] = "sm_90a";
    }
    for (int i = 0; i < nspec; i++) {
        al_flash_spec s;
        al_flash_spec_at(i, &s);
        al_flash_spec_name(&s, nm, sizeof nm);
        if (only && *only && !strstr(nm, only)) continue;
        if (s.mask == AL_FLASH_MASK_CAUSAL && !s.bottom_right && !s.alibi) {
            specs[njobs] = s;
            archs[njobs++] = "sm_80";
        }
    }
    for (int i = 0; i < al_flash_sm90_spec_count(); i++) {
        al_flash_sm90_spec_at(i, &specs[njobs]);
        al_flash_sm90_spec_name(&specs[njobs], nm, sizeof nm);
        if (only && *only && !strstr(nm, only)) continue;
        sm90[njobs] = FAM_SM90_FWD;
        archs[njobs++] = "sm_90a";
    }
    /* the three-consumer forward (ATTNLAB_FLASH_SM90_CONSUMERS=3, an experiment): d 64 / 128, both dtypes, no mask
     * and causal (the other masks only change the tile range) */
    for (int i = 0; i < al_flash_sm90_spec_count(); i++) {
        al_flash_spec c3;
        al_flash_sm90_spec_at(i, &c3);
        if (c3.d > 128 || c3.bottom_right || c3.mask == AL_FLASH_MASK_WINDOW) continue;
        c3.fwd_consumers = 3;
        al_flash_sm90_spec_name(&c3, nm, sizeof nm);
        if (only && *only && !strstr(nm, only)) continue;
        specs[njobs] = c3;
        sm90[njobs] = FAM_SM90_FWD;
        archs[njobs++] = "sm_90a";
    }
    for (int i = 0; i < al_flash_sm90_bwd_count(); i++) {
        int role = 0;
        al_flash_sm90_bwd_at(i, &specs[njobs], &role);
        al_flash_sm90_bwd_name(&specs[njobs], role, nm, sizeof nm);
        if (only && *only && !strstr(nm, only)) continue;
        sm90[njobs] = FAM_SM90_BWD_DKDV + role;
        archs[njobs++] = "sm_90a";
    }
    for (int i = 0; i < N_BWD_VARIANTS; i++)
        for (int role = 0; role < 2; role++) {
            const bwd_variant *v = &g_bwd_variants[i];
            const al_flash_hooks hk = {v->score, v->grad, v->mask, v->capg, NULL, NULL, 0.0, 0, 0.0};
            al_flash_spec *sp = &specs[njobs];
            memset(sp, 0, sizeof *sp);
            sp->kind = AL_FLASH_BWD;
            sp->d = v->d;
            sp->bf16 = 1;
            sp->mask = v->mask_kind;
            al_flash_spec_set_variant(sp, &hk, v->block_mask);
            al_flash_sm90_bwd_name(sp, role, nm, sizeof nm);
            if (only && *only && !strstr(nm, only)) continue;
            prefix[njobs] = al_flash_variant_source(&hk, al_flash_sm90_bwd_file());
            what[njobs] = v->what;
            sm90[njobs] = FAM_SM90_BWD_DKDV + role;
            archs[njobs++] = "sm_90a";
        }
    for (int i = 0; i < ngen; i++) {
        /* (c3: the three-consumer forward; row0: the two-consumer launch of a split grid, ATTNLAB_FLASH_SM90_CONSUMERS=
         * split, which the host runs without a block mask only; pdl: both launches of a split grid under
         * ATTNLAB_FLASH_SM90_FWD_PDL=1, compiled for soft-capping alone) */
        static const struct { int fam, kind, d, bf16, mask, c3, row0, pdl; } J[JOBS_PER_GEN] = {
            {FAM_SM90_FWD, AL_FLASH_FWD, 128, 1, AL_FLASH_MASK_NONE, 0, 0, 0},
            {FAM_SM90_FWD, AL_FLASH_FWD, 64, 0, AL_FLASH_MASK_CAUSAL, 0, 0, 0},
            {FAM_SM90_FWD, AL_FLASH_FWD, 128, 1, AL_FLASH_MASK_NONE, 1, 0, 0},
            {FAM_SM90_FWD, AL_FLASH_FWD, 64, 1, AL_FLASH_MASK_CAUSAL, 1, 0, 0},
            {FAM_SM90_FWD, AL_FLASH_FWD, 128, 1, AL_FLASH_MASK_NONE, 0, 1, 0},
            {FAM_SM90_FWD, AL_FLASH_FWD, 128, 1, AL_FLASH_MASK_NONE, 1, 0, 1},
            {FAM_SM90_FWD, AL_FLASH_FWD, 128, 1, AL_FLASH_MASK_NONE, 0, 1, 1},
            {FAM_SM90_BWD_DKDV, AL_FLASH_BWD, 128, 1, AL_FLASH_MASK_CAUSAL, 0, 0, 0},
            {FAM_SM90_BWD_DQ, AL_FLASH_BWD, 128, 1, AL_FLASH_MASK_CAUSAL, 0, 0, 0},
            {FAM_STAGE1, AL_FLASH_FWD, 64, 1, AL_FLASH_MASK_NONE, 0, 0, 0},
            {FAM_STAGE1, AL_FLASH_BWD, 64, 1, AL_FLASH_MASK_NONE, 0, 0, 0}};
        for (int k = 0; k < JOBS_PER_GEN; k++) {
            if (J[k].row0 && gen[i].block_mask) continue;
            if (J[k].pdl && strcmp(gen[i].name, "softcap") != 0) continue;
            al_flash_spec *sp = &specs[njobs];
            memset(sp, 0, sizeof *sp);
            sp->kind = J[k].kind;
            sp->d = J[k].d;
            sp->bf16 = J[k].bf16;
            sp->mask = J[k].mask;
            sp->fwd_consumers = J[k].c3 ? 3 : 0;
            sp->fwd_row0 = J[k].row0;
            sp->fwd_pdl = J[k].pdl;
            al_flash_spec_set_variant(sp, &gen[i].hk, gen[i].block_mask);
            job_name(sp, J[k].fam, nm, sizeof nm);
            if (only && *only && !strstr(nm, only)) continue;
            prefix[njobs] = al_flash_variant_source(&gen[i].hk, J[k].fam == FAM_SM90_FWD ? al_flash_sm90_spec_file()
                                                              : J[k].fam >= FAM_SM90_BWD_DKDV ? al_flash_sm90_bwd_file()
                                                                                             : al_flash_spec_file(sp));
            what[njobs] = gen[i].name;
            generated[njobs] = 1;
            sm90[njobs] = J[k].fam;
            archs[njobs++] = "sm_90a";
        }
    }
    result *res = calloc((size_t)njobs, sizeof *res);
    int n90 = 0, nh = 0;
    for (int j = 0; j < njobs; j++) n90 += strcmp(archs[j], "sm_90a") == 0 && !sm90[j], nh += sm90[j] != 0;
    printf("nvrtc_kernels: NVRTC %d.%d, %d compiles (%d specialisations for sm_90a, %d for sm_80, %d of the Hopper "
           "forward and backward), kernels in %s\n", major, minor, njobs, n90, njobs - n90 - nh, nh, g_kdir);
    fflush(stdout);
    double t0 = test_now_ms();
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < njobs; j++) compile_one(&specs[j], archs[j], sm90[j], prefix[j], &res[j]);
    double total = test_now_ms() - t0;

    for (int j = 0; j < njobs; j++) {
        char name[96], tname[160];
        job_name(&specs[j], sm90[j], name, sizeof name);
        snprintf(tname, sizeof tname, "%s %s", name, archs[j]);
        t_current = tname;
        t_current_failed = 0;
        const result *r = &res[j];
        CHECK(r->ok, "%s", r->msg);
        if (r->ok) {
            CHECK(r->names_found, "the cubin lacks one of the kernel names the backend looks up");
            const char *names[4];
            int nf = job_functions(&specs[j], sm90[j], names);
            printf("  %-32s %-6s %6.0f ms", name, archs[j], r->ms);
            for (int i = 0; i < nf; i++) printf("  %s: %d regs, %d B spill", names[i], r->regs[i], r->spill[i]);
            if (what[j]) printf("  (%s)", what[j]);
            printf("\n");
            /* d <= 128 forward: no spills (checked); d = 256 (O alone is 128 registers a thread) spills up to
             * ~20 bytes in the window variants, and the backward spills tens of bytes: printed above */
            if (sm90[j]) {
                /* the generated example variants (what = a name from the snippets file) may spill a little:
                 * their f16 forward with every hook at once (exact f16 tanh, two captures, mask_mod) spills 8 */
                /* the dK/dV/dQ kernel (role 2) spills 12-16 bytes: three of the S product's loop-invariant
                 * descriptors, stored before the loop and reloaded once per tile (3 LDL per 64-query tile) */
                /* the three-consumer experiment (152 registers a consumer): relative bias at d = 64 spills 32 */
                const int allowed = generated[j] && specs[j].fwd_consumers == 3 && specs[j].d == 64 ? 32
                                  : (generated[j] && !specs[j].bf16) || sm90[j] == FAM_SM90_BWD_DKDV + 2 ? 16 : 0;
                CHECK(r->spill[0] <= allowed, "the Hopper kernel spills %d bytes (registers: %d; allowed %d)", r->spill[0],
                      r->regs[0], allowed);
                /* C7518: a wgmma under a branch made ptxas serialise all of them (30% of the forward, session 5) */
                if (r->serialized) fprintf(stderr, "  ptxas: %s\n", r->msg);
                CHECK(!r->serialized, "ptxas serialised the Hopper kernel's wgmma (its C75xx \"wgmma.mma_async instructions are serialized\" warning)");
            }
            else if (specs[j].kind == AL_FLASH_FWD && specs[j].d <= 128)
                CHECK(r->spill[0] == 0, "the forward kernel spills %d bytes (registers: %d)", r->spill[0], r->regs[0]);
        }
        if (r->cubin) dump_cubin(name, archs[j], r->cubin, r->cubin_n);
        if (t_current_failed) t_failed++;
        else t_passed++;
    }
    printf("nvrtc_kernels: %d compiles in %.1f s wall\n", njobs, total / 1e3);
    for (int k = 0; k < 4; k++) free(g_src[k]);
    free(gtext);
    for (int j = 0; j < njobs; j++) free(prefix[j]);
    free(prefix);
    free(what);
    free(generated);
    free(sm90);
    free(specs);
    free(archs);
    for (int j = 0; j < njobs; j++) free(res[j].cubin);
    free(res);
    return SUMMARY("nvrtc_kernels");
}
