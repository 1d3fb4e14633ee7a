/*
 * flash_sm90_check.cu — GPU check and bench of the Hopper forward (kernels/flash_fwd_sm90.cu) beside the
 * stage-1 kernel (kernels/flash_fwd.cu), both compiled with NVRTC for sm_90a with exactly the backend's
 * options (src/cuda/flash_sm90_specs.h, src/cuda/flash_specs.h) and launched with the backend's
 * tensor maps (src/cuda/flash_sm90_tma.h). Not part of `make test`.
 *
 *   make build/tests/flash_sm90_check && build/tests/flash_sm90_check
 *
 * 1. correctness: random bf16 (and f16) q, k, v in [-1, 1) over d 64/128/256, s 1..4096 with lengths that
 *    are not multiples of the tiles, no mask / causal top-left / bottom-right / window, GQA and MQA, bshd
 *    and thd (padded cu_seqlens with gaps, per-sequence lengths). Both kernels are compared with a
 *    naive f32 reference kernel (O over valid rows, LSE over all rows incl. -inf ones); prints the max
 *    errors, and for a failure the first mismatching (b, h, row, col) with the three values
 *    (FLASH_SM90_DEBUG=1: the first 8). Pass: |O - ref| <= 2e-2 and |LSE - ref| <= 1e-2.
 * 2. speed: TFLOP/s (4 b h s^2 d, causal halved) of both kernels at (4,16,4096,128), (1,16,16384,128),
 *    (4,32,4096,64), (4,8,4096,256), causal off/on, bf16 (3 warm-ups, mean of 10, CUDA events).
 * Also prints ptxas's register / spill line of every sm90 specialisation it compiles.
 * Without a GPU it prints "no GPU" and exits 0; exits 1 on any failure.
 * Env: ATTNLAB_KERNEL_DIR (default ./kernels), FLASH_SM90_ONLY=check|bench|compile (compile: every shipped
 * sm90 specialisation with NVRTC, ptxas lines printed, exit 1 on spills; needs no GPU).
 */
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
DRV(cuTensorMapEncodeTiled) DRV(cuGetErrorName)
#define cuModuleLoadData p_cuModuleLoadData
#define cuModuleGetFunction p_cuModuleGetFunction
#define cuFuncSetAttribute p_cuFuncSetAttribute
#define cuLaunchKernel p_cuLaunchKernel
#define cuTensorMapEncodeTiled p_cuTensorMapEncodeTiled
#define cuGetErrorName p_cuGetErrorName

static int load_driver(void) {
    struct { const char *name; void **fn; } t[] = {
        {"cuModuleLoadData", (void **)&p_cuModuleLoadData}, {"cuModuleGetFunction", (void **)&p_cuModuleGetFunction},
        {"cuFuncSetAttribute", (void **)&p_cuFuncSetAttribute}, {"cuLaunchKernel", (void **)&p_cuLaunchKernel},
        {"cuTensorMapEncodeTiled", (void **)&p_cuTensorMapEncodeTiled}, {"cuGetErrorName", (void **)&p_cuGetErrorName}};
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

/* FLASH_SM90_ONLY=compile: every shipped sm90 specialisation (no GPU needed); fails on spills */
static int compile_all(void) {
    int bad = 0;
    for (int i = 0; i < al_flash_sm90_spec_count(); i++) {
        al_flash_spec s;
        al_flash_sm90_spec_at(i, &s);
        char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN], label[96];
        const int n = al_flash_sm90_spec_options(&s, opts);
        al_flash_sm90_spec_name(&s, label, sizeof label);
        const int sp = compile(al_flash_sm90_spec_file(), opts, n, label, 1, NULL);
        if (sp) bad++;
    }
    printf("compiled %d sm90 specialisations, %d with spills\n", al_flash_sm90_spec_count(), bad);
    return bad ? 1 : 0;
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

static al_flash_spec spec_of(const Case &c) {
    al_flash_spec s;
    memset(&s, 0, sizeof s);
    s.kind = AL_FLASH_FWD; s.d = c.D; s.bf16 = c.bf16; s.mask = c.mask; s.bottom_right = c.mask ? c.br : 0;
    return s;
}

/* which = 1: stage 1 into o1/lse1; which = 2: sm90 into o2/lse2 */
static void run_kernel(Problem &P, int which, int verbose) {
    al_flash_spec s = spec_of(P.c);
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
    char label[96];
    al_flash_params prm = P.prm;
    prm.o = prm.q;
    prm.o.ptr = which == 1 ? P.o1 : P.o2;
    prm.lse = which == 1 ? P.lse1 : P.lse2;
    if (which == 1) {
        const int n = al_flash_spec_options(&s, opts);
        al_flash_spec_name(&s, label, sizeof label);
        const char *names[4];
        al_flash_spec_functions(&s, names);
        CUfunction f = get_fn(al_flash_spec_file(&s), names[0], opts, n, label, 0);
        al_flash_tiles t = al_flash_spec_tiles(&s);
        if (t.smem > 48 * 1024) CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, t.smem));
        void *args[] = {&prm};
        CU(cuLaunchKernel(f, (P.c.SQ + t.bm - 1) / t.bm, P.c.H, P.c.B, t.threads, 1, 1, t.smem, 0, args, NULL));
    } else {
        const int n = al_flash_sm90_spec_options(&s, opts);
        al_flash_sm90_spec_name(&s, label, sizeof label);
        CUfunction f = get_fn(al_flash_sm90_spec_file(), al_flash_sm90_function(), opts, n, label, verbose);
        al_flash_sm90_tiles t = al_flash_sm90_spec_tiles(&s);
        al_flash_sm90_tmaps tm;
        CU(al_flash_sm90_tmaps_make(&tm, &prm, s.bf16, s.d, P.rows_q, P.rows_kv, t.bm, t.bn));
        CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, t.smem));
        void *args[] = {&prm, &tm};
        CU(cuLaunchKernel(f, (P.c.SQ + t.bm - 1) / t.bm, P.c.H, P.c.B, t.threads, 1, 1, t.smem, 0, args, NULL));
    }
}

static double now_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

static int check_case(const Case &c) {
    Problem P;
    problem_make(P, c);
    const int D = c.D;
    CK(cudaMemset(P.o1, 0, P.o_elems * 2));
    CK(cudaMemset(P.o2, 0, P.o_elems * 2));
    run_kernel(P, 1, 0);
    run_kernel(P, 2, 1);
    al_flash_params rp = P.prm;
    rp.lse = P.lse_ref;
    ref_fwd<<<dim3((c.SQ + 127) / 128, c.H, c.B), 128>>>(rp, c.bf16, D, c.mask, c.br, P.o_ref);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const long long nl = (long long)c.B * c.H * c.SQ;
    std::vector<uint16_t> o1(P.o_elems), o2(P.o_elems);
    std::vector<float> l1(nl), l2(nl), lr(nl), orf(nl * D);
    CK(cudaMemcpy(o1.data(), P.o1, P.o_elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(o2.data(), P.o2, P.o_elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(l1.data(), P.lse1, nl * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(l2.data(), P.lse2, nl * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lr.data(), P.lse_ref, nl * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(orf.data(), P.o_ref, nl * D * 4, cudaMemcpyDeviceToHost));
    double e1 = 0, e2 = 0, le1 = 0, le2 = 0;
    long long bad = 0;
    const int dbg = getenv("FLASH_SM90_DEBUG") && atoi(getenv("FLASH_SM90_DEBUG")) > 0;
    char first[256] = "";
    for (int b = 0; b < c.B; b++)
        for (int h = 0; h < c.H; h++)
            for (int i = 0; i < c.SQ; i++) {
                const long long li = ((long long)b * c.H + h) * c.SQ + i;
                auto lerr = [&](float x, float r) {
                    if (isinf(r) && isinf(x) && (x < 0) == (r < 0)) return 0.0;
                    if (isinf(r) || isinf(x) || isnan(x)) return 1e30;
                    return (double)fabsf(x - r);
                };
                const double a1 = lerr(l1[li], lr[li]), a2 = lerr(l2[li], lr[li]);
                le1 = fmax(le1, a1); le2 = fmax(le2, a2);
                if (a2 > 1e-2 && bad < (dbg ? 8 : 1)) {
                    snprintf(first, sizeof first, "lse (b=%d h=%d i=%d): sm90 %g stage1 %g ref %g", b, h, i, l2[li], l1[li], lr[li]);
                    printf("    mismatch %s\n", first);
                    bad++;
                }
                if (i >= P.ql[b]) continue;
                const long long row = c.thd ? (P.qs[b] + i) * c.H + h : (((long long)b * P.rows_q + i) * c.H + h);
                for (int col = 0; col < D; col++) {
                    const float r = orf[li * D + col];
                    const float x1 = h2f(o1[row * D + col], c.bf16), x2 = h2f(o2[row * D + col], c.bf16);
                    const double d1 = isnan(x1) ? 1e30 : fabs(x1 - r), d2 = isnan(x2) ? 1e30 : fabs(x2 - r);
                    e1 = fmax(e1, d1); e2 = fmax(e2, d2);
                    if (d2 > 2e-2 && bad < (dbg ? 8 : 1)) {
                        snprintf(first, sizeof first, "O (b=%d h=%d i=%d col=%d): sm90 %g stage1 %g ref %g", b, h, i, col, x2, x1, r);
                        printf("    mismatch %s\n", first);
                        bad++;
                    }
                }
            }
    /* thd: the gap rows must stay zero (the kernel writes only rows < q_len) */
    if (c.thd)
        for (int b = 0; b < c.B; b++)
            for (long long t = P.qs[b] + P.ql[b]; t < P.qs[b] + P.ql[b] + 7; t++)
                for (int h = 0; h < c.H; h++)
                    for (int col = 0; col < D; col++)
                        if (o2[(t * c.H + h) * D + col] != 0 && bad < 8) {
                            printf("    mismatch: gap token %lld h=%d col=%d written by sm90\n", t, h, col);
                            bad++;
                            e2 = 1e30;
                        }
    const int ok = e2 <= 2e-2 && le2 <= 1e-2;
    static const char *mk[] = {"none", "causal", "window"};
    printf("%s  b=%d h=%d hg=%d sq=%d skv=%d d=%d %s%s %s %s  | sm90: max|dO| %.3g max|dLSE| %.3g | stage1: %.3g %.3g\n",
           ok ? "PASS" : "FAIL", c.B, c.H, c.HG, c.SQ, c.SKV, D, mk[c.mask], c.mask ? (c.br ? "-br" : "-tl") : "",
           c.thd ? "thd" : "bshd", c.bf16 ? "bf16" : "f16", e2, le2, e1, le1);
    problem_free(P);
    return ok;
}

static void bench_case(int B, int H, int S, int D, int causal) {
    Case c;
    memset(&c, 0, sizeof c);
    c.B = B; c.H = H; c.HG = H; c.SQ = S; c.SKV = S; c.D = D; c.mask = causal; c.bf16 = 1;
    Problem P;
    problem_make(P, c);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    double tf[3] = {0, 0, 0};
    for (int which = 1; which <= 2; which++) {
        for (int i = 0; i < 3; i++) run_kernel(P, which, 0);
        CK(cudaEventRecord(e0));
        for (int i = 0; i < 10; i++) run_kernel(P, which, 0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        const double ms = now_ms(e0, e1) / 10;
        const double flops = 4.0 * B * H * (double)S * S * D / (causal ? 2 : 1);
        tf[which] = flops / (ms * 1e-3) / 1e12;
    }
    printf("bench b=%d h=%d s=%d d=%d %-7s stage1 %6.1f TFLOP/s   sm90 %6.1f TFLOP/s   (x%.2f)\n", B, H, S, D,
           causal ? "causal" : "nomask", tf[1], tf[2], tf[2] / tf[1]);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    problem_free(P);
}

int main(void) {
    const char *kd = getenv("ATTNLAB_KERNEL_DIR");
    if (kd && *kd) g_kdir = kd;
    const char *only = getenv("FLASH_SM90_ONLY");
    if (only && strcmp(only, "compile") == 0) return compile_all();
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU\n");
        return 0;
    }
    int major = 0, minor = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    if (major != 9 || minor != 0) {
        printf("device 0 is sm_%d%d, not sm_90: nothing to check\n", major, minor);
        return 0;
    }
    CK(cudaFree(0));   /* the primary context, current for the driver API */
    if (!load_driver()) return 2;
    int fails = 0, n = 0;
    if (!only || strcmp(only, "bench") != 0) {
        /* B H HG SQ SKV D mask br thd bf16 wl wr */
        const Case cases[] = {
            {1, 1, 1, 64, 128, 128, 0, 0, 0, 1, 0, 0},     /* one tile: the first thing to look at when all fail */
            {1, 2, 2, 128, 128, 64, 0, 0, 0, 1, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 0, 0, 0, 1, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 1, 0, 0, 1, 0, 0},
            {2, 4, 2, 777, 1333, 128, 1, 1, 0, 1, 0, 0},   /* GQA, bottom-right, sq != skv */
            {2, 4, 2, 1333, 777, 128, 1, 0, 0, 1, 0, 0},   /* top-left, sq > skv (rows with no key) */
            {2, 4, 2, 1333, 777, 128, 1, 1, 0, 1, 0, 0},   /* bottom-right, sq > skv: empty rows, lse -inf */
            {1, 8, 1, 2048, 2048, 128, 0, 0, 0, 1, 0, 0},  /* MQA */
            {1, 4, 4, 4096, 4096, 128, 1, 0, 0, 1, 0, 0},
            {2, 4, 4, 300, 513, 64, 0, 0, 0, 1, 0, 0},
            {2, 4, 4, 1025, 1025, 64, 1, 0, 0, 1, 0, 0},
            {1, 2, 2, 700, 900, 256, 0, 0, 0, 1, 0, 0},
            {1, 2, 2, 700, 900, 256, 1, 1, 0, 1, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 0, 0, 0, 0, 0, 0},  /* f16 */
            {2, 4, 4, 1000, 1000, 64, 1, 1, 0, 0, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 2, 0, 0, 1, 200, 50},   /* sliding window */
            {4, 4, 2, 1000, 1200, 128, 0, 0, 1, 1, 0, 0},  /* thd, ragged, gaps */
            {4, 4, 2, 1000, 1200, 128, 1, 1, 1, 1, 0, 0},
            {4, 4, 4, 600, 600, 64, 1, 0, 1, 1, 0, 0},
            {3, 2, 2, 1, 1, 128, 0, 0, 0, 1, 0, 0},        /* s = 1 */
        };
        for (const Case &c : cases) {
            fails += !check_case(c);
            n++;
        }
        printf("correctness: %d of %d cases passed\n", n - fails, n);
    }
    if (!only || strcmp(only, "check") != 0) {
        bench_case(4, 16, 4096, 128, 0);
        bench_case(4, 16, 4096, 128, 1);
        bench_case(1, 16, 16384, 128, 0);
        bench_case(1, 16, 16384, 128, 1);
        bench_case(4, 32, 4096, 64, 0);
        bench_case(4, 32, 4096, 64, 1);
        bench_case(4, 8, 4096, 256, 0);
        bench_case(4, 8, 4096, 256, 1);
    }
    return fails ? 1 : 0;
}
