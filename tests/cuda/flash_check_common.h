/*
 * flash_check_common.h — what the Hopper kernels' stand-alone GPU checks share (tests/cuda/flash_sm90_check.cu,
 * the forward; tests/cuda/flash_sm90_bwd_check.cu, the backward): the driver API through the runtime's
 * entry-point query, NVRTC compiles with exactly the backend's options (src/cuda/flash_*specs.h), random
 * 16-bit problems in bshd or thd (with gaps) and their al_flash_params, and the naive f32 reference forward.
 * Header-only, for one translation unit per program.
 */
#ifndef ATTNLAB_TESTS_FLASH_CHECK_COMMON_H
#define ATTNLAB_TESTS_FLASH_CHECK_COMMON_H
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvrtc.h>
#include <cuda_fp16.h>

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <string>

/* The driver API through the runtime's entry-point query (no link against libcuda, so the program
 * starts, and says "no GPU", on a machine without a driver). Declared after cuda.h, then the names
 * below refer to these pointers, in this file and in flash_sm90_tma.h. */
#define DRV(name) static decltype(&::name) p_##name;
DRV(cuModuleLoadData) DRV(cuModuleGetFunction) DRV(cuFuncSetAttribute) DRV(cuLaunchKernel)
DRV(cuTensorMapEncodeTiled) DRV(cuGetErrorName) DRV(cuLaunchKernelEx)
#define cuModuleLoadData p_cuModuleLoadData
#define cuModuleGetFunction p_cuModuleGetFunction
#define cuFuncSetAttribute p_cuFuncSetAttribute
#define cuLaunchKernel p_cuLaunchKernel
#define cuTensorMapEncodeTiled p_cuTensorMapEncodeTiled
#define cuGetErrorName p_cuGetErrorName
#define cuLaunchKernelEx p_cuLaunchKernelEx

static int load_driver(void) {
    struct { const char *name; void **fn; } t[] = {
        {"cuModuleLoadData", (void **)&p_cuModuleLoadData}, {"cuModuleGetFunction", (void **)&p_cuModuleGetFunction},
        {"cuFuncSetAttribute", (void **)&p_cuFuncSetAttribute}, {"cuLaunchKernel", (void **)&p_cuLaunchKernel},
        {"cuTensorMapEncodeTiled", (void **)&p_cuTensorMapEncodeTiled}, {"cuGetErrorName", (void **)&p_cuGetErrorName},
        {"cuLaunchKernelEx", (void **)&p_cuLaunchKernelEx}};
    for (auto &e : t) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion(e.name, e.fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*e.fn) {
            fprintf(stderr, "driver entry point %s not found\n", e.name);
            return 0;
        }
    }
    return 1;
}

#include "cuda/flash_specs.h"
#include "cuda/flash_sm90_specs.h"
#include "cuda/flash_sm90_tma.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(2); } } while (0)
#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = "?"; cuGetErrorName(r_, &s_); \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); exit(2); } } while (0)

static std::string g_kdir = "kernels";

/* ---- NVRTC, as src/cuda/nvrtc_cache.cu compiles ------------------------------------------------------- */
struct Mod { std::string key; CUmodule mod; CUfunction fn; };
static std::vector<Mod> g_mods;

static std::string slurp(const std::string &path) {
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", path.c_str()); exit(2); }
    std::string s;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}

/* NVRTC -> cubin; prints ptxas's register / spill lines when verbose; returns the spill bytes seen */
static int compile(const char *file, char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN], int nopts, const char *label,
                   int verbose, std::string *cubin) {
    std::string src = slurp(g_kdir + "/" + file);
    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, src.c_str(), file, 0, NULL, NULL) != NVRTC_SUCCESS) exit(2);
    std::string inc = "-I" + g_kdir;
    const char *all[40];
    int n = 0;
    all[n++] = "--gpu-architecture=sm_90a";
    all[n++] = "-default-device";
    all[n++] = "-std=c++17";
    all[n++] = inc.c_str();
    all[n++] = "--ptxas-options=-v";
    for (int i = 0; i < nopts; i++) all[n++] = opts[i];
    nvrtcResult r = nvrtcCompileProgram(prog, n, all);
    size_t ll = 0;
    nvrtcGetProgramLogSize(prog, &ll);
    std::string log(ll + 1, '\0');
    nvrtcGetProgramLog(prog, &log[0]);
    if (r != NVRTC_SUCCESS) {
        fprintf(stderr, "NVRTC failed for %s (%s): %s\n%s\n", label, file, nvrtcGetErrorString(r), log.c_str());
        exit(2);
    }
    int spills = 0;
    const char *l = log.c_str();
    while (l && *l) {   /* the "Used N registers" and spill lines */
        const char *e = strchr(l, '\n');
        std::string line(l, e ? (size_t)(e - l) : strlen(l));
        const size_t at = line.find("bytes spill stores");
        if (at != std::string::npos) {
            size_t k = at;
            while (k > 0 && line[k - 1] == ' ') k--;
            while (k > 0 && isdigit((unsigned char)line[k - 1])) k--;
            spills += atoi(line.c_str() + k);
        }
        if (verbose && (line.find("registers") != std::string::npos || line.find("spill") != std::string::npos ||
                        line.find("arning") != std::string::npos))
            printf("  ptxas %-28s %s\n", label, line.c_str());
        l = e ? e + 1 : NULL;
    }
    if (cubin) {
        size_t cl = 0;
        nvrtcGetCUBINSize(prog, &cl);
        cubin->assign(cl, '\0');
        nvrtcGetCUBIN(prog, &(*cubin)[0]);
    }
    nvrtcDestroyProgram(&prog);
    return spills;
}

static CUfunction get_fn(const char *file, const char *fname, char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN], int nopts,
                         const char *label, int verbose) {
    std::string key = std::string(file);
    for (int i = 0; i < nopts; i++) key += std::string(" ") + opts[i];
    for (auto &m : g_mods)
        if (m.key == key) return m.fn;
    std::string cub;
    compile(file, opts, nopts, label, verbose, &cub);
    Mod m;
    m.key = key;
    CU(cuModuleLoadData(&m.mod, cub.data()));
    CU(cuModuleGetFunction(&m.fn, m.mod, fname));
    g_mods.push_back(m);
    return m.fn;
}


/* ---- the naive reference: one thread per (b, h, row), f32, two passes over the keys ------------------ */
__device__ float ld16(const uint16_t *p, int bf16) {
    if (bf16) return __uint_as_float(((unsigned)*p) << 16);
    return __half2float(*(const __half *)p);
}
__global__ void ref_fwd(al_flash_params p, int bf16, int D, int mask, int br, float *o_ref) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    if (i >= p.SQ) return;
    const int ql = p.q_len ? (int)p.q_len[b] : p.SQ, kl = p.kv_len ? (int)p.kv_len[b] : p.SKV;
    float *lse = p.lse + ((long long)b * p.H + h) * p.SQ + i;   /* p.lse = the reference's lse here */
    float *orow = o_ref + (((long long)b * p.H + h) * p.SQ + i) * D;
    for (int c = 0; c < D; c++) orow[c] = 0.0f;
    if (i >= ql) { *lse = -INFINITY; return; }
    const int hk = h / (p.H / p.HG);
    const long long qs = p.q_start ? p.q_start[b] : 0, ks = p.kv_start ? p.kv_start[b] : 0;
    const uint16_t *q = (const uint16_t *)p.q.ptr + b * p.q.sb + (qs + i) * p.q.st + (long long)h * p.q.sh;
    const uint16_t *k = (const uint16_t *)p.k.ptr + b * p.k.sb + ks * p.k.st + (long long)hk * p.k.sh;
    const uint16_t *v = (const uint16_t *)p.v.ptr + b * p.v.sb + ks * p.v.st + (long long)hk * p.v.sh;
    const int diag = br ? kl - ql : 0;
    float mx = -INFINITY;
    for (int j = 0; j < kl; j++) {
        if (mask == 1 && j > i + diag) continue;
        if (mask == 2 && (j > i + diag + p.wr || j < i + diag - p.wl)) continue;
        float sdot = 0.0f;
        for (int c = 0; c < D; c++) sdot += ld16(q + c, bf16) * ld16(k + j * p.k.st + c, bf16);
        mx = fmaxf(mx, sdot * p.scale);
    }
    if (mx == -INFINITY) { *lse = -INFINITY; return; }
    float l = 0.0f;
    for (int j = 0; j < kl; j++) {
        if (mask == 1 && j > i + diag) continue;
        if (mask == 2 && (j > i + diag + p.wr || j < i + diag - p.wl)) continue;
        float sdot = 0.0f;
        for (int c = 0; c < D; c++) sdot += ld16(q + c, bf16) * ld16(k + j * p.k.st + c, bf16);
        const float e = expf(sdot * p.scale - mx);
        l += e;
        for (int c = 0; c < D; c++) orow[c] += e * ld16(v + j * p.v.st + c, bf16);
    }
    for (int c = 0; c < D; c++) orow[c] /= l;
    *lse = mx + logf(l);
}

/* ---- host helpers --------------------------------------------------------------------------------------- */
static uint16_t f2h(float x, int bf16) {
    if (bf16) {
        uint32_t u;
        memcpy(&u, &x, 4);
        u += 0x7FFFu + ((u >> 16) & 1u);
        return (uint16_t)(u >> 16);
    }
    __half h = __float2half(x);
    uint16_t r;
    memcpy(&r, &h, 2);
    return r;
}
static float h2f(uint16_t v, int bf16) {
    if (bf16) {
        uint32_t u = (uint32_t)v << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    __half h;
    memcpy(&h, &v, 2);
    return __half2float(h);
}
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {   /* [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

struct Case {
    int B, H, HG, SQ, SKV, D, mask, br, thd, bf16;
    int wl, wr;
};

struct Problem {
    Case c;
    al_flash_params prm;
    void *q, *k, *v, *o1, *o2;
    float *lse1, *lse2, *lse_ref, *o_ref;
    long long *d_lens;                     /* q_start, kv_start, q_len, kv_len (thd) */
    long long rows_q, rows_kv, o_elems;
    std::vector<long long> qs, ks, ql, kl;
};

static void problem_make(Problem &P, const Case &c) {
    P.c = c;
    const int B = c.B, H = c.H, HG = c.HG, D = c.D;
    memset(&P.prm, 0, sizeof P.prm);
    P.qs.assign(B, 0); P.ks.assign(B, 0); P.ql.assign(B, c.SQ); P.kl.assign(B, c.SKV);
    if (c.thd) {   /* lengths: the max for b = 0, random below it for the others; 7-row gaps between sequences */
        long long tq = 0, tk = 0;
        for (int b = 0; b < B; b++) {
            if (b > 0) {
                P.ql[b] = 1 + (long long)((frand() + 1.0f) * 0.5f * (c.SQ - 1));
                P.kl[b] = 1 + (long long)((frand() + 1.0f) * 0.5f * (c.SKV - 1));
            }
            P.qs[b] = tq; P.ks[b] = tk;
            tq += P.ql[b] + 7; tk += P.kl[b] + 7;
        }
        P.rows_q = tq; P.rows_kv = tk;
    } else {
        P.rows_q = c.SQ; P.rows_kv = c.SKV;
    }
    const long long nq = (c.thd ? 1 : B) * P.rows_q * H * D, nk = (c.thd ? 1 : B) * P.rows_kv * HG * D;
    std::vector<uint16_t> hq(nq), hk(nk), hv(nk);
    for (auto &x : hq) x = f2h(frand(), c.bf16);
    for (auto &x : hk) x = f2h(frand(), c.bf16);
    for (auto &x : hv) x = f2h(frand(), c.bf16);
    CK(cudaMalloc(&P.q, nq * 2)); CK(cudaMalloc(&P.k, nk * 2)); CK(cudaMalloc(&P.v, nk * 2));
    CK(cudaMemcpy(P.q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    P.o_elems = nq;
    CK(cudaMalloc(&P.o1, nq * 2)); CK(cudaMalloc(&P.o2, nq * 2));
    const long long nl = (long long)B * H * c.SQ;
    CK(cudaMalloc(&P.lse1, nl * 4)); CK(cudaMalloc(&P.lse2, nl * 4)); CK(cudaMalloc(&P.lse_ref, nl * 4));
    CK(cudaMalloc(&P.o_ref, nl * D * 4));
    P.d_lens = NULL;
    al_flash_params &p = P.prm;
    /* bshd: element (b, row, head, col); thd: (token, head, col) with sb = 0 */
    auto op = [&](void *ptr, long long rows, int heads) {
        al_flash_op o;
        memset(&o, 0, sizeof o);
        o.ptr = ptr; o.sc = 1; o.sh = D; o.st = (long long)heads * D; o.sb = c.thd ? 0 : rows * heads * D;
        o.dtype = c.bf16 ? AL_FLASH_DT_BF16 : AL_FLASH_DT_F16;
        return o;
    };
    p.q = op(P.q, P.rows_q, H); p.k = op(P.k, P.rows_kv, HG); p.v = op(P.v, P.rows_kv, HG);
    p.B = B; p.H = H; p.HG = HG; p.SQ = c.SQ; p.SKV = c.SKV;
    p.wl = c.mask == 2 ? c.wl : -1;
    p.wr = c.mask == 2 ? c.wr : (c.mask == 1 ? 0 : -1);
    p.scale = 1.0f / sqrtf((float)D);
    p.scale_log2 = p.scale * 1.4426950408889634f;
    if (c.thd) {
        std::vector<long long> h(4 * B);
        for (int b = 0; b < B; b++) { h[b] = P.qs[b]; h[B + b] = P.ks[b]; h[2 * B + b] = P.ql[b]; h[3 * B + b] = P.kl[b]; }
        CK(cudaMalloc(&P.d_lens, 4 * B * 8));
        CK(cudaMemcpy(P.d_lens, h.data(), 4 * B * 8, cudaMemcpyHostToDevice));
        p.q_start = P.d_lens; p.kv_start = P.d_lens + B; p.q_len = P.d_lens + 2 * B; p.kv_len = P.d_lens + 3 * B;
    }
}

static void problem_free(Problem &P) {
    cudaFree(P.q); cudaFree(P.k); cudaFree(P.v); cudaFree(P.o1); cudaFree(P.o2);
    cudaFree(P.lse1); cudaFree(P.lse2); cudaFree(P.lse_ref); cudaFree(P.o_ref);
    if (P.d_lens) cudaFree(P.d_lens);
}

static double now_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* Runs check on every case and reports them in scripts/tally.sh's format; returns the number that failed. */
static int run_cases(const char *name, const Case *cases, int n, int (*check)(const Case &)) {
    int fails = 0;
    for (int i = 0; i < n; i++) fails += !check(cases[i]);
    printf("correctness: %d of %d cases passed\n", n - fails, n);
    printf("c-test %s: %d passed, %d failed\n", name, n - fails, fails);
    return fails;
}

/* 0 when device 0 is an sm_90 GPU with the driver entry points loaded (its primary context current); else
 * prints why as a skipped test in scripts/tally.sh's format ("c-test NAME: 0 passed, 0 failed, 1 skipped (no
 * GPU)") and returns -1 (nothing to check: exit 0), or 2 when the driver's entry points are missing */
static int gpu_ready(const char *name) {
    const char *kd = getenv("ATTNLAB_KERNEL_DIR");
    if (kd && *kd) g_kdir = kd;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("c-test %s: 0 passed, 0 failed, 1 skipped (no GPU)\n", name);
        return -1;
    }
    int major = 0, minor = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    if (major != 9 || minor != 0) {
        printf("c-test %s: 0 passed, 0 failed, 1 skipped (device 0 is sm_%d%d, not sm_90)\n", name, major, minor);
        return -1;
    }
    CK(cudaFree(0));   /* the primary context, current for the driver API */
    return load_driver() ? 0 : 2;
}

#endif /* ATTNLAB_TESTS_FLASH_CHECK_COMMON_H */
