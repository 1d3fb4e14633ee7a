/*
 * cuda/nvrtc_cache.cu — NVRTC compilation of the kernels/ sources at run time, the on-disk cubin cache and the
 * in-memory function table (the contract is in nvrtc_cache.h).
 */
#include "cuda/nvrtc_cache.h"
#include <nvrtc.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* paths and log lines are bounded buffers: truncation is the intended behaviour */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define NV_MAX_FNS 4
#define NV_LOG_LINES 256   /* a whole flash spec run compiles ~80: keep them all for al.cuda.backend_info */

typedef struct nv_entry {
    int32_t dev;
    char *key;                 /* file \n opt \n opt ... \n names */
    CUmodule mod;
    CUfunction fns[NV_MAX_FNS];
    int nfns;
} nv_entry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nv_entry *g_tab;
static int g_ntab, g_cap;
static char g_kdir[1024];
static int g_kdir_state;                  /* 0 unknown, 1 found, -1 not found */
static char g_kdir_err[2048];
static unsigned __int128 g_hdr_hash;      /* hash of the headers beside the kernels */
static int g_hdr_ready;
static char g_arch[AL_CU_MAX_DEVICES][16];
static int g_cc[AL_CU_MAX_DEVICES];
/* statistics */
static int64_t g_compiles, g_disk_loads, g_mem_hits, g_disk_writes_failed, g_unloads;
static double g_compile_ms, g_disk_ms;
static char g_log[NV_LOG_LINES][256];   /* a variant label, the time and the cache path: up to ~200 chars */
static int g_nlog;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void log_line(const char *fmt, const char *label, double ms, const char *what) {
    if (g_nlog >= NV_LOG_LINES) {     /* keep the latest lines */
        memmove(g_log[0], g_log[1], sizeof g_log[0] * (NV_LOG_LINES - 1));
        g_nlog = NV_LOG_LINES - 1;
    }
    snprintf(g_log[g_nlog++], sizeof g_log[0], fmt, label, ms, what);
}

/* ---- hashing: FNV-1a, 128 bits ------------------------------------------------------------------ */
static const unsigned __int128 FNV128_PRIME = ((unsigned __int128)0x0000000001000000ULL << 64) | 0x000000000000013BULL;
static unsigned __int128 fnv128_init(void) {
    return ((unsigned __int128)0x6c62272e07bb0142ULL << 64) | 0x62b821756295c58dULL;
}
static unsigned __int128 fnv128(unsigned __int128 h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * FNV128_PRIME;
    return h;
}
static unsigned __int128 fnv128_str(unsigned __int128 h, const char *s) { return fnv128(h, s, strlen(s) + 1); }

/* ---- files ----------------------------------------------------------------------------------------- */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    char *buf = (char *)malloc((size_t)n + 1);
    if (!buf) { fclose(f); return NULL; }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) { free(buf); return NULL; }
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

static int mkdir_p(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

static int is_dir_with(const char *dir, const char *file) {
    char p[2100];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Finds the kernel folder once (g_lock held). */
static al_status find_kernel_dir(void) {
    if (g_kdir_state == 1) return AL_OK;
    if (g_kdir_state == -1) return al_error(AL_ERR_UNSUPPORTED, "%s", g_kdir_err);
    char cand[6][1024];
    int nc = 0;
    const char *env = getenv("ATTNLAB_KERNEL_DIR");
    if (env && *env) snprintf(cand[nc++], sizeof cand[0], "%s", env);
    Dl_info info;
    if (dladdr((void *)&find_kernel_dir, &info) && info.dli_fname) {
        char lib[900];
        snprintf(lib, sizeof lib, "%s", info.dli_fname);
        char *slash = strrchr(lib, '/');
        if (slash) *slash = 0;
        else snprintf(lib, sizeof lib, ".");
        snprintf(cand[nc++], sizeof cand[0], "%s/../kernels", lib);
        snprintf(cand[nc++], sizeof cand[0], "%s/../share/attnlab/kernels", lib);
    }
#ifdef AL_KERNEL_SRC_DIR
    snprintf(cand[nc++], sizeof cand[0], "%s", AL_KERNEL_SRC_DIR);
#endif
    snprintf(cand[nc++], sizeof cand[0], "kernels");
    for (int i = 0; i < nc; i++)
        if (is_dir_with(cand[i], "flash_common.cuh")) {
            char *r = realpath(cand[i], NULL);
            snprintf(g_kdir, sizeof g_kdir, "%s", r ? r : cand[i]);
            free(r);
            g_kdir_state = 1;
            return AL_OK;
        }
    size_t u = (size_t)snprintf(g_kdir_err, sizeof g_kdir_err,
                                "the kernel sources (flash_common.cuh and the other kernels/ files) were not found; searched:");
    for (int i = 0; i < nc && u < sizeof g_kdir_err; i++)
        u += (size_t)snprintf(g_kdir_err + u, sizeof g_kdir_err - u, " %s%s", cand[i], i + 1 < nc ? "," : "");
    if (u < sizeof g_kdir_err)
        snprintf(g_kdir_err + u, sizeof g_kdir_err - u, " (set ATTNLAB_KERNEL_DIR to the repository's kernels/ folder)");
    g_kdir_state = -1;
    return al_error(AL_ERR_UNSUPPORTED, "%s", g_kdir_err);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Hash of every *.h / *.cuh in the kernel folder, in name order (g_lock held): an edit to a shared
 * header invalidates every cached cubin. */
static al_status header_hash(void) {
    if (g_hdr_ready) return AL_OK;
    DIR *d = opendir(g_kdir);
    if (!d) return al_error(AL_ERR_DEVICE, "nvrtc: cannot list %s: %s", g_kdir, strerror(errno));
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 256) {
        size_t l = strlen(e->d_name);
        if ((l > 2 && strcmp(e->d_name + l - 2, ".h") == 0) || (l > 4 && strcmp(e->d_name + l - 4, ".cuh") == 0))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    unsigned __int128 h = fnv128_init();
    al_status st = AL_OK;
    for (int i = 0; i < n; i++) {
        char path[1300];
        snprintf(path, sizeof path, "%s/%s", g_kdir, names[i]);
        size_t len = 0;
        char *txt = read_file(path, &len);
        if (!txt && st == AL_OK) st = al_error(AL_ERR_DEVICE, "nvrtc: cannot read %s: %s", path, strerror(errno));
        h = fnv128_str(h, names[i]);
        if (txt) h = fnv128(h, txt, len);
        free(txt);
        free(names[i]);
    }
    if (st != AL_OK) return st;
    g_hdr_hash = h;
    g_hdr_ready = 1;
    return AL_OK;
}

static void cache_dir(char *buf, size_t n) {
    const char *e = getenv("ATTNLAB_CACHE_DIR");
    if (e && *e) { snprintf(buf, n, "%s", e); return; }
    e = getenv("XDG_CACHE_HOME");
    if (e && *e) { snprintf(buf, n, "%s/attnlab", e); return; }
    e = getenv("HOME");
    snprintf(buf, n, "%s/.cache/attnlab", e && *e ? e : "/tmp");
}

static int env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

/* ---- driver and NVRTC errors ------------------------------------------------------------------------ */
static al_status cu_err(CUresult r, const char *what, const char *label) {
    const char *s = NULL, *nm = NULL;
    cuGetErrorString(r, &s);
    cuGetErrorName(r, &nm);
    return al_error(AL_ERR_CUDA, "nvrtc: %s failed for %s: %s (%s)", what, label, s ? s : "?", nm ? nm : "?");
}

al_status al_nvrtc_arch(int32_t dev, char *buf, size_t n, int *cc) {
    AL_TRY(al_cu_check_dev("nvrtc", dev));
    if (!g_arch[dev][0]) {
        int major = 0, minor = 0;
        AL_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        AL_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        /* sm_90a: Hopper's arch-specific features (wgmma, setmaxnreg) for the stage-2 kernels; the
         * cubin runs on cc 9.0 parts only, which is what this device is */
        snprintf(g_arch[dev], sizeof g_arch[dev], major == 9 && minor == 0 ? "sm_90a" : "sm_%d%d", major, minor);
        g_cc[dev] = major * 10 + minor;
    }
    if (buf) snprintf(buf, n, "%s", g_arch[dev]);
    if (cc) *cc = g_cc[dev];
    return AL_OK;
}

al_status al_nvrtc_kernel_dir(char *buf, size_t n) {
    pthread_mutex_lock(&g_lock);
    al_status st = find_kernel_dir();
    if (st == AL_OK && buf) snprintf(buf, n, "%s", g_kdir);
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* NVRTC: source -> cubin (malloc'd). */
static al_status compile(const char *file, const char *src, const char *arch, const char *const *opts, int nopts,
                         const char *label, char **cubin, size_t *cubin_len) {
    *cubin = NULL;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, file, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return al_error(AL_ERR_CUDA, "nvrtc: nvrtcCreateProgram failed for %s: %s", label, nvrtcGetErrorString(r));
    char o_arch[48], o_inc[1100];
    snprintf(o_arch, sizeof o_arch, "--gpu-architecture=%s", arch);
    snprintf(o_inc, sizeof o_inc, "-I%s", g_kdir);
    const char *all[40];
    int n = 0;
    all[n++] = o_arch;
    all[n++] = "-default-device";
    all[n++] = "-std=c++17";
    all[n++] = o_inc;
    for (int i = 0; i < nopts && n < 40; i++) all[n++] = opts[i];
    r = nvrtcCompileProgram(prog, n, all);
    if (r != NVRTC_SUCCESS) {
        size_t ll = 0;
        nvrtcGetProgramLogSize(prog, &ll);
        char *log = (char *)malloc(ll + 1);
        if (log) {
            log[0] = 0;
            nvrtcGetProgramLog(prog, log);
            log[ll] = 0;
        }
        char optstr[512];
        size_t u = 0;
        optstr[0] = 0;
        for (int i = 0; i < n && u < sizeof optstr; i++) u += (size_t)snprintf(optstr + u, sizeof optstr - u, " %s", all[i]);
        al_status st = al_error(AL_ERR_CUDA, "nvrtc: compiling %s/%s (%s) for %s failed: %s; options:%s; log:\n%.3000s",
                                g_kdir, file, label, arch, nvrtcGetErrorString(r), optstr, log ? log : "(no log)");
        free(log);
        nvrtcDestroyProgram(&prog);
        return st;
    }
    size_t len = 0;
    r = nvrtcGetCUBINSize(prog, &len);
    char *buf = r == NVRTC_SUCCESS ? (char *)malloc(len) : NULL;
    if (buf) r = nvrtcGetCUBIN(prog, buf);
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS || !buf) {
        free(buf);
        return al_error(AL_ERR_CUDA, "nvrtc: no cubin for %s (%s): %s", label, arch,
                        r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "out of memory");
    }
    *cubin = buf;
    *cubin_len = len;
    return AL_OK;
}

/* Write the cubin atomically: a private temp file renamed into place. Failures only cost a recompile
 * in the next process, so they are counted, not returned. */
static void write_cache(const char *dir, const char *path, const char *data, size_t len) {
    static int64_t counter;   /* atomics: al_nvrtc_prefetch writes from several threads */
    if (mkdir_p(dir) != 0) { __atomic_add_fetch(&g_disk_writes_failed, 1, __ATOMIC_RELAXED); return; }
    char tmp[1400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%lld", path, (int)getpid(),
             (long long)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) { __atomic_add_fetch(&g_disk_writes_failed, 1, __ATOMIC_RELAXED); return; }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    int ok = off == len && close(fd) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        __atomic_add_fetch(&g_disk_writes_failed, 1, __ATOMIC_RELAXED);
    }
}

static al_status load_module(const char *image, const char *const *names, int nnames, const char *label, nv_entry *e) {
    CUresult r = cuModuleLoadData(&e->mod, image);
    if (r != CUDA_SUCCESS) return cu_err(r, "cuModuleLoadData", label);
    for (int i = 0; i < nnames; i++) {
        r = cuModuleGetFunction(&e->fns[i], e->mod, names[i]);
        if (r != CUDA_SUCCESS) {
            cuModuleUnload(e->mod);
            e->mod = NULL;
            char what[96];
            snprintf(what, sizeof what, "cuModuleGetFunction(%s)", names[i]);
            return cu_err(r, what, label);
        }
    }
    e->nfns = nnames;
    return AL_OK;
}

/* The in-memory key (malloc'd): file, options, names, and the prefix's hash (the prefix itself may
 * be long; 128 bits of FNV-1a identify it). */
static char *make_key(const char *file, const char *prefix, const char *const *opts, int nopts,
                      const char *const *names, int nnames) {
    size_t klen = strlen(file) + 2 + 48;
    for (int i = 0; i < nopts; i++) klen += strlen(opts[i]) + 1;
    for (int i = 0; i < nnames; i++) klen += strlen(names[i]) + 1;
    char *key = (char *)malloc(klen);
    if (!key) return NULL;
    size_t u = (size_t)sprintf(key, "%s\n", file);
    for (int i = 0; i < nopts; i++) u += (size_t)sprintf(key + u, "%s\n", opts[i]);
    for (int i = 0; i < nnames; i++) u += (size_t)sprintf(key + u, "%s\n", names[i]);
    if (prefix) {
        unsigned __int128 ph = fnv128_str(fnv128_init(), prefix);
        sprintf(key + u, "prefix %016llx%016llx\n", (unsigned long long)(ph >> 64), (unsigned long long)ph);
    }
    return key;
}

/* g_lock held, kernel folder and header hash known: the text NVRTC compiles (prefix + kernels/<file>,
 * malloc'd into *src) and its disk-cache file (cpath, in folder adir). */
static al_status source_and_path(const char *file, const char *prefix, const char *const *opts, int nopts,
                                 const char *arch, char **src_out, size_t *slen_out, char *adir, char *cpath) {
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", g_kdir, file);
    size_t slen = 0;
    char *src = read_file(path, &slen);
    if (!src) return al_error(AL_ERR_DEVICE, "nvrtc: cannot read the kernel source %s: %s", path, strerror(errno));
    if (prefix) {   /* the compiled text is prefix + file: the cache key below hashes exactly that */
        size_t pl = strlen(prefix);
        char *both = (char *)malloc(pl + slen + 2);
        if (!both) {
            free(src);
            return al_error(AL_ERR_OOM, "nvrtc: out of memory");
        }
        memcpy(both, prefix, pl);
        both[pl] = '\n';
        memcpy(both + pl + 1, src, slen + 1);
        free(src);
        src = both;
        slen += pl + 1;
    }
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    unsigned __int128 h = fnv128_str(fnv128_init(), "attnlab-nvrtc-cubin-v1");
    h = fnv128_str(h, file);
    h = fnv128(h, src, slen);
    h = fnv128(h, &g_hdr_hash, sizeof g_hdr_hash);
    for (int i = 0; i < nopts; i++) h = fnv128_str(h, opts[i]);
    char ver[64];
    snprintf(ver, sizeof ver, "nvrtc %d.%d arch %s", major, minor, arch);
    h = fnv128_str(h, ver);
    char cdir[1024];
    cache_dir(cdir, sizeof cdir);
    snprintf(adir, 1100, "%s/%s", cdir, arch);
    snprintf(cpath, 1300, "%s/%016llx%016llx.cubin", adir, (unsigned long long)(h >> 64), (unsigned long long)h);
    *src_out = src;
    *slen_out = slen;
    return AL_OK;
}

static al_status get_locked(int32_t dev, const char *file, const char *prefix, const char *const *opts, int nopts,
                            const char *const *names, int nnames, const char *label, CUfunction *fns) {
    if (nnames < 1 || nnames > NV_MAX_FNS)
        return al_error(AL_ERR_INTERNAL, "nvrtc: %d function names for %s (1..%d)", nnames, label, NV_MAX_FNS);
    char *key = make_key(file, prefix, opts, nopts, names, nnames);
    if (!key) return al_error(AL_ERR_OOM, "nvrtc: out of memory");
    for (int i = 0; i < g_ntab; i++)
        if (g_tab[i].dev == dev && strcmp(g_tab[i].key, key) == 0) {
            free(key);
            memcpy(fns, g_tab[i].fns, sizeof(CUfunction) * (size_t)nnames);
            g_mem_hits++;
            return AL_OK;
        }

    al_status st = find_kernel_dir();
    if (st == AL_OK) st = header_hash();
    char arch[16];
    if (st == AL_OK) st = al_nvrtc_arch(dev, arch, sizeof arch, NULL);
    if (st != AL_OK) { free(key); return st; }
    /* a context must be current for the driver API: the runtime's primary context of dev */
    CUcontext ctx = NULL;
    if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) {
        cudaFree(0);
        (void)cudaGetLastError();
    }

    char *src = NULL, adir[1100], cpath[1300];
    size_t slen = 0;
    st = source_and_path(file, prefix, opts, nopts, arch, &src, &slen, adir, cpath);
    if (st != AL_OK) {
        free(key);
        return st;
    }
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);

    nv_entry e;
    memset(&e, 0, sizeof e);
    e.dev = dev;
    e.key = key;
    const int use_disk = !env_on("ATTNLAB_NVRTC_NO_DISK_CACHE");
    int loaded = 0;
    if (use_disk) {
        double t0 = now_ms();
        size_t clen = 0;
        char *cub = read_file(cpath, &clen);
        if (cub && clen > 0 && load_module(cub, names, nnames, label, &e) == AL_OK) {
            double ms = now_ms() - t0;
            g_disk_loads++;
            g_disk_ms += ms;
            log_line("%s: loaded from the disk cache in %.1f ms (%s)", label, ms, cpath);
            loaded = 1;
        } else {
            al_clear_error();   /* a stale or damaged file: recompile and replace it */
        }
        free(cub);
    }
    if (!loaded) {
        double t0 = now_ms();
        char *cub = NULL;
        size_t clen = 0;
        st = compile(file, src, arch, opts, nopts, label, &cub, &clen);
        double ms = now_ms() - t0;
        if (st == AL_OK) {
            if (use_disk) write_cache(adir, cpath, cub, clen);
            st = load_module(cub, names, nnames, label, &e);
        }
        free(cub);
        if (st != AL_OK) {
            free(src);
            free(key);
            return st;
        }
        g_compiles++;
        g_compile_ms += ms;
        log_line("%s: compiled by NVRTC in %.0f ms (%s)", label, ms, use_disk ? cpath : "disk cache off");
        if (!env_on("ATTNLAB_NVRTC_QUIET"))
            fprintf(stderr, "attnlab: nvrtc: compiled %s (%s) for %s in %.0f ms (NVRTC %d.%d), cached in %s\n", label,
                    file, arch, ms, major, minor, use_disk ? cpath : "memory only");
    }
    free(src);
    if (g_ntab == g_cap) {
        int nc = g_cap ? 2 * g_cap : 32;
        nv_entry *nt = (nv_entry *)realloc(g_tab, sizeof(nv_entry) * (size_t)nc);
        if (!nt) {
            cuModuleUnload(e.mod);
            free(key);
            return al_error(AL_ERR_OOM, "nvrtc: out of memory for the function table");
        }
        g_tab = nt;
        g_cap = nc;
    }
    g_tab[g_ntab++] = e;
    memcpy(fns, e.fns, sizeof(CUfunction) * (size_t)nnames);
    return AL_OK;
}

/* ---- al_nvrtc_prefetch: several missing programs compiled at once ----------------------------------- */
typedef struct nv_job {
    const al_nvrtc_prog *pg;
    char *src;
    char arch[16], adir[1100], cpath[1300];
    al_status st;
    double ms;
} nv_job;

static void *nv_job_run(void *arg) {
    nv_job *j = (nv_job *)arg;
    double t0 = now_ms();
    char *cub = NULL;
    size_t clen = 0;
    j->st = compile(j->pg->file, j->src, j->arch, j->pg->opts, j->pg->nopts, j->pg->label, &cub, &clen);
    j->ms = now_ms() - t0;
    if (j->st == AL_OK) write_cache(j->adir, j->cpath, cub, clen);
    else al_clear_error();   /* this thread's error; al_nvrtc_get compiles again and reports it */
    free(cub);
    return NULL;
}

void al_nvrtc_prefetch(int32_t dev, const al_nvrtc_prog *progs, int n) {
    if (n < 2 || n > 8 || env_on("ATTNLAB_NVRTC_NO_DISK_CACHE") || env_on("ATTNLAB_NVRTC_SERIAL")) return;
    if (al_cu_check_dev("nvrtc", dev) != AL_OK) { al_clear_error(); return; }
    nv_job jobs[8];
    int nj = 0;
    pthread_mutex_lock(&g_lock);
    al_status st = find_kernel_dir();
    if (st == AL_OK) st = header_hash();
    char arch[16];
    if (st == AL_OK) st = al_nvrtc_arch(dev, arch, sizeof arch, NULL);
    for (int i = 0; st == AL_OK && i < n; i++) {
        const al_nvrtc_prog *pg = &progs[i];
        char *key = make_key(pg->file, pg->prefix, pg->opts, pg->nopts, pg->names, pg->nnames);
        int loaded = !key;
        for (int t = 0; key && t < g_ntab && !loaded; t++) loaded = g_tab[t].dev == dev && strcmp(g_tab[t].key, key) == 0;
        free(key);
        if (loaded) continue;
        nv_job *j = &jobs[nj];
        memset(j, 0, sizeof *j);
        j->pg = pg;
        snprintf(j->arch, sizeof j->arch, "%s", arch);
        size_t slen = 0;
        if (source_and_path(pg->file, pg->prefix, pg->opts, pg->nopts, arch, &j->src, &slen, j->adir, j->cpath) != AL_OK) {
            al_clear_error();
            continue;
        }
        if (access(j->cpath, R_OK) == 0) { free(j->src); continue; }   /* on disk: a load, no compile */
        nj++;
    }
    pthread_mutex_unlock(&g_lock);
    if (st != AL_OK) al_clear_error();
    if (nj >= 2) {
        /* every job but the first on its own thread (NVRTC is thread-safe); a thread that cannot start
         * leaves its job to the caller's al_nvrtc_get */
        pthread_t th[8];
        int started[8] = {0};
        for (int i = 1; i < nj; i++) started[i] = pthread_create(&th[i], NULL, nv_job_run, &jobs[i]) == 0;
        nv_job_run(&jobs[0]);
        for (int i = 1; i < nj; i++)
            if (started[i]) pthread_join(th[i], NULL);
        int major = 0, minor = 0;
        nvrtcVersion(&major, &minor);
        pthread_mutex_lock(&g_lock);
        for (int i = 0; i < nj; i++) {
            if ((i > 0 && !started[i]) || jobs[i].st != AL_OK) continue;
            g_compiles++;
            g_compile_ms += jobs[i].ms;
            log_line("%s: compiled by NVRTC in %.0f ms in parallel (%s)",
                     jobs[i].pg->label, jobs[i].ms, jobs[i].cpath);
            if (!env_on("ATTNLAB_NVRTC_QUIET"))
                fprintf(stderr, "attnlab: nvrtc: compiled %s (%s) for %s in %.0f ms (NVRTC %d.%d, %d in parallel), "
                        "cached in %s\n", jobs[i].pg->label, jobs[i].pg->file, arch, jobs[i].ms, major, minor, nj,
                        jobs[i].cpath);
        }
        pthread_mutex_unlock(&g_lock);
    }
    for (int i = 0; i < nj; i++) free(jobs[i].src);
}

al_status al_nvrtc_get(int32_t dev, const char *file, const char *prefix, const char *const *opts, int nopts,
                       const char *const *names, int nnames, const char *label, CUfunction *fns) {
    AL_TRY(al_cu_check_dev("nvrtc", dev));
    pthread_mutex_lock(&g_lock);
    al_status st = get_locked(dev, file, prefix, opts, nopts, names, nnames, label, fns);
    pthread_mutex_unlock(&g_lock);
    return st;
}

void al_nvrtc_unload(int32_t dev, const char *file, const char *prefix, const char *const *opts, int nopts,
                     const char *const *names, int nnames) {
    char *key = make_key(file, prefix, opts, nopts, names, nnames);
    if (!key) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_ntab; i++)
        if (g_tab[i].dev == dev && strcmp(g_tab[i].key, key) == 0) {
            int cur = -1;
            cudaGetDevice(&cur);
            if (cur != dev) cudaSetDevice(dev);
            /* kernels of this module may still be queued on some stream: wait for them */
            cudaDeviceSynchronize();
            cuModuleUnload(g_tab[i].mod);
            (void)cudaGetLastError();
            if (cur >= 0 && cur != dev) cudaSetDevice(cur);
            free(g_tab[i].key);
            g_tab[i] = g_tab[--g_ntab];
            g_unloads++;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    free(key);
}

int64_t al_nvrtc_info(char *buf, int64_t n) {
    pthread_mutex_lock(&g_lock);
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    char cdir[1024];
    cache_dir(cdir, sizeof cdir);
    int64_t compiles = g_compiles;
    if (buf && n > 0) {
        size_t u = (size_t)snprintf(buf, (size_t)n,
                                    "nvrtc=%d.%d kernel_dir=%s cache_dir=%s compiled=%lld (%.0f ms) disk_loads=%lld (%.1f ms) "
                                    "memory_hits=%lld cache_write_failures=%lld unloaded=%lld",
                                    major, minor, g_kdir_state == 1 ? g_kdir : "(not found yet)", cdir,
                                    (long long)g_compiles, g_compile_ms, (long long)g_disk_loads, g_disk_ms,
                                    (long long)g_mem_hits, (long long)g_disk_writes_failed, (long long)g_unloads);
        for (int i = 0; i < g_nlog && u < (size_t)n; i++) u += (size_t)snprintf(buf + u, (size_t)n - u, "\n%s", g_log[i]);
    }
    pthread_mutex_unlock(&g_lock);
    return compiles;
}
