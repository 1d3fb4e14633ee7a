/*
 * nvrtc_test.h — what the C tests that compile kernels with NVRTC share (test_nvrtc_kernels.c,
 * test_flash_variant.c): loading libnvrtc with dlopen (no link-time dependency, so the tests build
 * where it is missing and say so), reading a kernel file, and one compile of a source to a cubin
 * with the ptxas report parsed and the kernel names looked up in the cubin.
 *
 * libnvrtc: $ATTNLAB_NVRTC_LIB, libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so, $CUDA_HOME/lib64,
 * /usr/local/cuda/lib64.
 */
#ifndef ATTNLAB_TEST_NVRTC_H
#define ATTNLAB_TEST_NVRTC_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* the NVRTC entry points used (nvrtc.h types reduced to what the ABI needs) */
typedef struct nvrtc_api {
    int (*create)(void **prog, const char *src, const char *name, int nh, const char *const *hs,
                  const char *const *hn);
    int (*compile)(void *prog, int nopts, const char *const *opts);
    int (*log_size)(void *prog, size_t *n);
    int (*log)(void *prog, char *buf);
    int (*cubin_size)(void *prog, size_t *n);
    int (*cubin)(void *prog, char *buf);
    int (*destroy)(void **prog);
    int (*version)(int *major, int *minor);
    const char *(*errstr)(int r);
} nvrtc_api;

/* 1 when libnvrtc was found and has every entry point; else 0 and why says what was tried. */
static int nvrtc_load(nvrtc_api *nv, char *why, size_t n) {
    const char *cands[7];
    char c1[1100];
    int nc = 0;
    const char *e = getenv("ATTNLAB_NVRTC_LIB");
    if (e && *e) cands[nc++] = e;
    cands[nc++] = "libnvrtc.so.13";
    cands[nc++] = "libnvrtc.so.12";
    cands[nc++] = "libnvrtc.so";
    const char *ch = getenv("CUDA_HOME");
    if (ch && *ch) {
        snprintf(c1, sizeof c1, "%s/lib64/libnvrtc.so", ch);
        cands[nc++] = c1;
    }
    cands[nc++] = "/usr/local/cuda/lib64/libnvrtc.so";
    void *h = NULL;
    size_t u = (size_t)snprintf(why, n, "libnvrtc not found (tried");
    for (int i = 0; i < nc && !h; i++) {
        h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && u < n) u += (size_t)snprintf(why + u, n - u, " %s", cands[i]);
    }
    if (!h) {
        if (u < n) snprintf(why + u, n - u, "; set ATTNLAB_NVRTC_LIB)");
        return 0;
    }
    *(void **)&nv->create = dlsym(h, "nvrtcCreateProgram");
    *(void **)&nv->compile = dlsym(h, "nvrtcCompileProgram");
    *(void **)&nv->log_size = dlsym(h, "nvrtcGetProgramLogSize");
    *(void **)&nv->log = dlsym(h, "nvrtcGetProgramLog");
    *(void **)&nv->cubin_size = dlsym(h, "nvrtcGetCUBINSize");
    *(void **)&nv->cubin = dlsym(h, "nvrtcGetCUBIN");
    *(void **)&nv->destroy = dlsym(h, "nvrtcDestroyProgram");
    *(void **)&nv->version = dlsym(h, "nvrtcVersion");
    *(void **)&nv->errstr = dlsym(h, "nvrtcGetErrorString");
    if (!nv->create || !nv->compile || !nv->log_size || !nv->log || !nv->cubin_size || !nv->cubin || !nv->destroy ||
        !nv->version || !nv->errstr) {
        snprintf(why, n, "libnvrtc lacks an entry point: %s", dlerror());
        return 0;
    }
    return 1;
}

/* A whole file as a NUL-terminated string (malloc'd), or NULL. */
static char *test_slurp(const char *path) {
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

static double test_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* One compile's outcome. regs/spill per kernel name (-1 = not in the ptxas report). */
typedef struct nvrtc_result {
    int ok, names_found;
    double ms;
    int regs[4], spill[4];
    int serialized;   /* ptxas C7515/C7518...: "wgmma.mma_async instructions are serialized" (e.g. a wgmma under a branch) */
    char msg[2048];
    char *cubin;      /* kept (malloc'd, the caller frees) only when $ATTNLAB_NVRTC_DUMP names a folder */
    size_t cubin_n;
} nvrtc_result;

/* The ptxas report of one function: "Compiling entry function 'NAME'" ... "N bytes spill stores" ...
 * "Used R registers". */
static void nvrtc_parse_ptxas(const char *log, const char *name, int *regs, int *spill) {
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

static int nvrtc_memfind(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return 1;
    return 0;
}

/* Compiles src (named name) for arch with -I kdir, the extra options, and --ptxas-options=-v; fills r:
 * ok, compile time, the ptxas registers/spills of names[0..nf) and whether the cubin holds them all. */
static void nvrtc_compile_source(const nvrtc_api *nv, const char *src, const char *name, const char *arch,
                                 const char *kdir, const char *const *opts, int nopts, const char **names, int nf,
                                 nvrtc_result *r);

/* NVRTC 12.9+ keeps its own cache of compiled programs (shared between processes on the machine): a hit
 * returns the cubin without running ptxas, so the log has no "-v" lines to parse (seen on the H200 host
 * when another process had just compiled the same kernel). A retry with a never-seen-before line in the
 * source misses that cache; the unused static is dropped by the compiler. */
static void nvrtc_compile_uncached(const nvrtc_api *nv, const char *src, const char *name, const char *arch,
                                   const char *kdir, const char *const *opts, int nopts, const char **names, int nf,
                                   nvrtc_result *r) {
    static unsigned long long serial;
    const size_t n = strlen(src) + 128;
    char *u = malloc(n);
    if (!u) return;   /* keep the first result */
    snprintf(u, n, "static __device__ int al_nvrtc_test_nonce_%ld_%lld_%llu;\n%s", (long)getpid(), (long long)time(NULL),
             __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED), src);
    nvrtc_compile_source(nv, u, name, arch, kdir, opts, nopts, names, nf, r);
    free(u);
}

static void nvrtc_compile_source(const nvrtc_api *nv, const char *src, const char *name, const char *arch,
                                 const char *kdir, const char *const *opts, int nopts, const char **names, int nf,
                                 nvrtc_result *r) {
    memset(r, 0, sizeof *r);
    char o_arch[48], o_inc[1100];
    snprintf(o_arch, sizeof o_arch, "--gpu-architecture=%s", arch);
    snprintf(o_inc, sizeof o_inc, "-I%s", kdir);
    const char *all[32];
    int na = 0;
    all[na++] = o_arch;
    all[na++] = "-default-device";
    all[na++] = "-std=c++17";
    all[na++] = o_inc;
    for (int i = 0; i < nopts && na < 31; i++) all[na++] = opts[i];
    all[na++] = "--ptxas-options=-v";
    void *prog = NULL;
    double t0 = test_now_ms();
    int rc = nv->create(&prog, src, name, 0, NULL, NULL);
    if (rc != 0) {
        snprintf(r->msg, sizeof r->msg, "nvrtcCreateProgram: %s", nv->errstr(rc));
        return;
    }
    rc = nv->compile(prog, na, all);
    r->ms = test_now_ms() - t0;
    size_t ll = 0;
    nv->log_size(prog, &ll);
    char *log = malloc(ll + 1);
    if (log) { log[0] = 0; nv->log(prog, log); log[ll] = 0; }
    if (rc != 0) {
        snprintf(r->msg, sizeof r->msg, "%s: %.1900s", nv->errstr(rc), log ? log : "");
    } else {
        int unreported = 0;
        const char *ser = log ? strstr(log, "instructions are serialized") : NULL;
        r->serialized = ser != NULL;
        if (ser) {   /* the warning's line, so a failure says which wgmma and why */
            const char *b = ser;
            while (b > log && b[-1] != '\n') b--;
            snprintf(r->msg, sizeof r->msg, "%.400s", b);
        }
        for (int i = 0; i < nf && i < 4; i++) {
            nvrtc_parse_ptxas(log ? log : "", names[i], &r->regs[i], &r->spill[i]);
            unreported |= r->regs[i] < 0;
        }
        if (unreported && strncmp(src, "static __device__ int al_nvrtc_test_nonce_", 42) != 0) {
            free(log);
            nv->destroy(&prog);
            nvrtc_compile_uncached(nv, src, name, arch, kdir, opts, nopts, names, nf, r);
            return;
        }
        size_t cn = 0;
        nv->cubin_size(prog, &cn);
        char *cub = malloc(cn ? cn : 1);
        if (cub && cn > 0 && nv->cubin(prog, cub) == 0) {
            r->ok = 1;
            r->names_found = 1;
            for (int i = 0; i < nf; i++) r->names_found &= nvrtc_memfind(cub, cn, names[i]);
        } else {
            snprintf(r->msg, sizeof r->msg, "no cubin");
        }
        const char *dump = getenv("ATTNLAB_NVRTC_DUMP");
        if (r->ok && dump && *dump) {
            r->cubin = cub;
            r->cubin_n = cn;
            cub = NULL;
        }
        free(cub);
    }
    free(log);
    nv->destroy(&prog);
}

#endif /* ATTNLAB_TEST_NVRTC_H */
