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
 * The Hopper forward (kernels/flash_fwd_sm90.cu, its 30 specialisations from src/cuda/flash_sm90_specs.h;
 * opt-in at run time) is compiled for sm_90a too, and must not spill at all.
 * Kernel folder: $ATTNLAB_KERNEL_DIR, else ./kernels (make test runs from the repository root).
 * Specialisations compile in parallel (OpenMP threads; OMP_NUM_THREADS caps them);
 * ATTNLAB_NVRTC_TEST_ONLY="fwd d128" keeps the specialisations whose name contains the text.
 */
#include "test_main.h"
#include "cuda/flash_specs.h"
#include "cuda/flash_sm90_specs.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

/* the NVRTC entry points used (nvrtc.h types reduced to what the ABI needs) */
typedef int (*nvrtc_create_fn)(void **prog, const char *src, const char *name, int nh, const char *const *hs,
                               const char *const *hn);
typedef int (*nvrtc_compile_fn)(void *prog, int nopts, const char *const *opts);
typedef int (*nvrtc_size_fn)(void *prog, size_t *n);
typedef int (*nvrtc_get_fn)(void *prog, char *buf);
typedef int (*nvrtc_destroy_fn)(void **prog);
typedef int (*nvrtc_version_fn)(int *major, int *minor);
typedef const char *(*nvrtc_errstr_fn)(int r);

static struct {
    nvrtc_create_fn create;
    nvrtc_compile_fn compile;
    nvrtc_size_fn log_size, cubin_size;
    nvrtc_get_fn log, cubin;
    nvrtc_destroy_fn destroy;
    nvrtc_version_fn version;
    nvrtc_errstr_fn errstr;
} nv;

static char g_kdir[1024];
static char *g_src[3];      /* flash_fwd.cu, flash_bwd.cu, flash_fwd_sm90.cu */

static void *open_nvrtc(char *why, size_t n) {
    const char *cands[6];
    char c1[1100];
    int nc = 0;
    const char *e = getenv("ATTNLAB_NVRTC_LIB");
    if (e && *e) cands[nc++] = e;
    cands[nc++] = "libnvrtc.so.13";
    cands[nc++] = "libnvrtc.so";
    const char *ch = getenv("CUDA_HOME");
    if (ch && *ch) {
        snprintf(c1, sizeof c1, "%s/lib64/libnvrtc.so", ch);
        cands[nc++] = c1;
    }
    cands[nc++] = "/usr/local/cuda/lib64/libnvrtc.so";
    size_t u = (size_t)snprintf(why, n, "libnvrtc not found (tried");
    for (int i = 0; i < nc; i++) {
        void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        if (u < n) u += (size_t)snprintf(why + u, n - u, " %s", cands[i]);
    }
    if (u < n) snprintf(why + u, n - u, "; set ATTNLAB_NVRTC_LIB)");
    return NULL;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

typedef struct result {
    int ok;
    double ms;
    int regs[3], spill[3];       /* per function, in al_flash_spec_functions order (-1 = not reported) */
    int names_found;
    char msg[2048];
} result;

/* The ptxas report of one function: "Compiling entry function 'NAME'" ... "N bytes spill stores" ...
 * "Used R registers". */
static void parse_ptxas(const char *log, const char *name, int *regs, int *spill) {
    char key[128];
    snprintf(key, sizeof key, "entry function '%s'", name);
    *regs = -1;
    *spill = -1;
    const char *p = strstr(log, key);
    if (!p) return;
    const char *next = strstr(p + 1, "entry function '");
    const char *s = strstr(p, "bytes spill stores");
    if (s && (!next || s < next)) {
        const char *q = s;
        while (q > p && q[-1] == ' ') q--;
        while (q > p && q[-1] >= '0' && q[-1] <= '9') q--;
        *spill = atoi(q);
    }
    const char *r = strstr(p, "Used ");
    if (r && (!next || r < next)) *regs = atoi(r + 5);
}

static int memfind(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return 1;
    return 0;
}

/* the kernel names a specialisation's module must hold (sm90: the Hopper forward's one) */
static int job_functions(const al_flash_spec *s, int sm90, const char **names) {
    if (sm90) {
        names[0] = al_flash_sm90_function();
        return 1;
    }
    return al_flash_spec_functions(s, names);
}

static void compile_one(const al_flash_spec *s, const char *arch, int sm90, result *r) {
    memset(r, 0, sizeof *r);
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
    int n = sm90 ? al_flash_sm90_spec_options(s, opts) : al_flash_spec_options(s, opts);
    char o_arch[48], o_inc[1100];
    snprintf(o_arch, sizeof o_arch, "--gpu-architecture=%s", arch);
    snprintf(o_inc, sizeof o_inc, "-I%s", g_kdir);
    const char *all[24];
    int na = 0;
    all[na++] = o_arch;
    all[na++] = "-default-device";
    all[na++] = "-std=c++17";
    all[na++] = o_inc;
    for (int i = 0; i < n; i++) all[na++] = opts[i];
    all[na++] = "--ptxas-options=-v";
    void *prog = NULL;
    double t0 = now_ms();
    int rc = sm90 ? nv.create(&prog, g_src[2], al_flash_sm90_spec_file(), 0, NULL, NULL)
                  : nv.create(&prog, g_src[s->kind], al_flash_spec_file(s), 0, NULL, NULL);
    if (rc != 0) {
        snprintf(r->msg, sizeof r->msg, "nvrtcCreateProgram: %s", nv.errstr(rc));
        return;
    }
    rc = nv.compile(prog, na, all);
    r->ms = now_ms() - t0;
    size_t ll = 0;
    nv.log_size(prog, &ll);
    char *log = malloc(ll + 1);
    if (log) { log[0] = 0; nv.log(prog, log); log[ll] = 0; }
    if (rc != 0) {
        snprintf(r->msg, sizeof r->msg, "%s: %.1900s", nv.errstr(rc), log ? log : "");
    } else {
        const char *names[4];
        int nf = job_functions(s, sm90, names);
        for (int i = 0; i < nf; i++) parse_ptxas(log ? log : "", names[i], &r->regs[i], &r->spill[i]);
        size_t cn = 0;
        nv.cubin_size(prog, &cn);
        char *cub = malloc(cn ? cn : 1);
        if (cub && nv.cubin(prog, cub) == 0 && cn > 0) {
            r->names_found = 1;
            for (int i = 0; i < nf; i++) r->names_found &= memfind(cub, cn, names[i]);
            r->ok = 1;
        } else {
            snprintf(r->msg, sizeof r->msg, "no cubin");
        }
        free(cub);
    }
    free(log);
    nv.destroy(&prog);
}

int main(void) {
    char why[512];
    void *h = open_nvrtc(why, sizeof why);
    if (!h) {
        printf("c-test nvrtc_kernels: 0 passed, 0 failed, 1 skipped (%s)\n", why);
        return 0;
    }
    nv.create = (nvrtc_create_fn)dlsym(h, "nvrtcCreateProgram");
    nv.compile = (nvrtc_compile_fn)dlsym(h, "nvrtcCompileProgram");
    nv.log_size = (nvrtc_size_fn)dlsym(h, "nvrtcGetProgramLogSize");
    nv.log = (nvrtc_get_fn)dlsym(h, "nvrtcGetProgramLog");
    nv.cubin_size = (nvrtc_size_fn)dlsym(h, "nvrtcGetCUBINSize");
    nv.cubin = (nvrtc_get_fn)dlsym(h, "nvrtcGetCUBIN");
    nv.destroy = (nvrtc_destroy_fn)dlsym(h, "nvrtcDestroyProgram");
    nv.version = (nvrtc_version_fn)dlsym(h, "nvrtcVersion");
    nv.errstr = (nvrtc_errstr_fn)dlsym(h, "nvrtcGetErrorString");
    if (!nv.create || !nv.compile || !nv.log_size || !nv.log || !nv.cubin_size || !nv.cubin || !nv.destroy ||
        !nv.version || !nv.errstr) {
        printf("c-test nvrtc_kernels: 0 passed, 1 failed (libnvrtc lacks an entry point: %s)\n", dlerror());
        return 1;
    }
    int major = 0, minor = 0;
    nv.version(&major, &minor);
    const char *kd = getenv("ATTNLAB_KERNEL_DIR");
    snprintf(g_kdir, sizeof g_kdir, "%s", kd && *kd ? kd : "kernels");
    char p0[1200], p1[1200], p2[1200];
    snprintf(p0, sizeof p0, "%s/flash_fwd.cu", g_kdir);
    snprintf(p1, sizeof p1, "%s/flash_bwd.cu", g_kdir);
    snprintf(p2, sizeof p2, "%s/%s", g_kdir, al_flash_sm90_spec_file());
    g_src[0] = slurp(p0);
    g_src[1] = slurp(p1);
    g_src[2] = slurp(p2);
    t_current = "kernel sources";
    t_current_failed = 0;
    CHECK(g_src[0] && g_src[1] && g_src[2], "cannot read %s, %s and %s (run from the repository root or set "
          "ATTNLAB_KERNEL_DIR)", p0, p1, p2);
    if (t_current_failed) { t_failed++; return SUMMARY("nvrtc_kernels"); }
    t_passed++;

    /* the jobs: every spec for sm_90a, the causal top-left ones for sm_80 */
    const int nspec = al_flash_spec_count(), n_sm90 = al_flash_sm90_spec_count();
    int njobs = 0;
    al_flash_spec *specs = calloc((size_t)(nspec * 2 + n_sm90), sizeof *specs);
    const char **archs = calloc((size_t)(nspec * 2 + n_sm90), sizeof *archs);
    int *sm90 = calloc((size_t)(nspec * 2 + n_sm90), sizeof *sm90);
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
    for (int i = 0; i < n_sm90; i++) {
        al_flash_sm90_spec_at(i, &specs[njobs]);
        al_flash_sm90_spec_name(&specs[njobs], nm, sizeof nm);
        if (only && *only && !strstr(nm, only)) continue;
        sm90[njobs] = 1;
        archs[njobs++] = "sm_90a";
    }
    result *res = calloc((size_t)njobs, sizeof *res);
    int n90 = 0, nh = 0;
    for (int j = 0; j < njobs; j++) n90 += strcmp(archs[j], "sm_90a") == 0 && !sm90[j], nh += sm90[j];
    printf("nvrtc_kernels: NVRTC %d.%d, %d compiles (%d specialisations for sm_90a, %d for sm_80, %d of the Hopper "
           "forward), kernels in %s\n", major, minor, njobs, n90, njobs - n90 - nh, nh, g_kdir);
    fflush(stdout);
    double t0 = now_ms();
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < njobs; j++) compile_one(&specs[j], archs[j], sm90[j], &res[j]);
    double total = now_ms() - t0;

    for (int j = 0; j < njobs; j++) {
        char name[96], tname[160];
        if (sm90[j]) al_flash_sm90_spec_name(&specs[j], name, sizeof name);
        else al_flash_spec_name(&specs[j], name, sizeof name);
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
            printf("\n");
            /* d <= 128 forward: no spills (checked); d = 256 (O alone is 128 registers a thread) spills up to
             * ~20 bytes in the window variants, and the backward spills tens of bytes: printed above */
            if (sm90[j])
                CHECK(r->spill[0] == 0, "the Hopper forward spills %d bytes (registers: %d)", r->spill[0], r->regs[0]);
            else if (specs[j].kind == AL_FLASH_FWD && specs[j].d <= 128)
                CHECK(r->spill[0] == 0, "the forward kernel spills %d bytes (registers: %d)", r->spill[0], r->regs[0]);
        }
        if (t_current_failed) t_failed++;
        else t_passed++;
    }
    printf("nvrtc_kernels: %d compiles in %.1f s wall\n", njobs, total / 1e3);
    for (int k = 0; k < 3; k++) free(g_src[k]);
    free(sm90);
    free(specs);
    free(archs);
    free(res);
    return SUMMARY("nvrtc_kernels");
}
