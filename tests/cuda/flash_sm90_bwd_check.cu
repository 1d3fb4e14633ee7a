/*
 * flash_sm90_bwd_check.cu — GPU check and bench of the Hopper backward (kernels/flash_bwd_sm90.cu: the dK/dV
 * kernel, role 0, and the dQ kernel, role 1) with the pre pass it needs (kernels/flash_bwd.cu's
 * al_flash_bwd_pre), all compiled with NVRTC for sm_90a with exactly the backend's options
 * (src/cuda/flash_sm90_specs.h, src/cuda/flash_specs.h) and launched as src/cuda/attn_flash_sm90.cu does
 * (grids, shared memory, tensor maps, the causal launch order). Not part of `make test`.
 *
 *   make build/tests/flash_sm90_bwd_check && build/tests/flash_sm90_bwd_check
 *
 * 1. correctness: random bf16 (and f16) q, k, v, dO in [-1, 1) at d 64 / 128, lengths that are not multiples
 *    of the tiles, no mask / causal top-left / bottom-right / window, GQA and MQA, sq != skv, bshd and thd
 *    (ragged lengths, 7-row gaps). O and LSE come from the naive f32 forward (flash_check_common.h's
 *    ref_fwd), O rounded to the kernel's dtype; the reference gradients are naive f32 loops, one thread per
 *    query row (dQ, and D = rowsum(dO O) from the rounded O, as the pre pass reads it) and one per key row
 *    (dK, dV over the GQA group's query heads). Pass: max |grad - ref| <= tol * max(1, max |ref|) per
 *    gradient (tol 2e-2 bf16, 4e-3 f16), and thd's gap rows untouched.
 * 2. speed: TFLOP/s of the whole backward (pre + dK/dV + dQ; 2.5 x 4 b h s^2 d, causal halved) and the time of
 *    each kernel, at the flash_bench shapes, bf16 (3 warm-ups, mean of 10, CUDA events; FLASH_SM90_BENCH_WARMUP
 *    and FLASH_SM90_BENCH_ITERS change those).
 * Without a GPU it reports itself skipped (scripts/tally.sh's format) and exits 0; exits 1 on any failure.
 * Env: ATTNLAB_KERNEL_DIR (default ./kernels), FLASH_SM90_ONLY=check|bench (`make test` runs the check).
 */
#include "flash_check_common.h"

/* D_i = sum_c dO O (O as the kernel dtype), then dQ_i = scale sum_j P_ij (dP_ij - D_i) K_j; one thread per
 * (b, h, i). dq_ref [B, H, SQ, D] compact; dsum [B, H, SQ] for ref_bwd_kv. */
__global__ void ref_bwd_q(al_flash_params p, int bf16, int D, int mask, int br, const float *lse, float *dq_ref,
                          float *dsum) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    if (i >= p.SQ) return;
    const long long li = ((long long)b * p.H + h) * p.SQ + i;
    float *dq = dq_ref + li * D;
    for (int c = 0; c < D; c++) dq[c] = 0.0f;
    dsum[li] = 0.0f;
    const int ql = p.q_len ? (int)p.q_len[b] : p.SQ, kl = p.kv_len ? (int)p.kv_len[b] : p.SKV;
    if (i >= ql || lse[li] == -INFINITY) return;
    const int hk = h / (p.H / p.HG);
    const long long qs = p.q_start ? p.q_start[b] : 0, ks = p.kv_start ? p.kv_start[b] : 0;
    const long long qo = b * p.q.sb + (qs + i) * p.q.st + (long long)h * p.q.sh;
    const uint16_t *q = (const uint16_t *)p.q.ptr + qo, *o = (const uint16_t *)p.o.ptr + qo;
    const uint16_t *g = (const uint16_t *)p.dout.ptr + qo;
    const uint16_t *k = (const uint16_t *)p.k.ptr + b * p.k.sb + ks * p.k.st + (long long)hk * p.k.sh;
    const uint16_t *v = (const uint16_t *)p.v.ptr + b * p.v.sb + ks * p.v.st + (long long)hk * p.v.sh;
    float dd = 0.0f;
    for (int c = 0; c < D; c++) dd += ld16(g + c, bf16) * ld16(o + c, bf16);
    dsum[li] = dd;
    const int diag = br ? kl - ql : 0;
    for (int j = 0; j < kl; j++) {
        if (mask == 1 && j > i + diag) continue;
        if (mask == 2 && (j > i + diag + p.wr || j < i + diag - p.wl)) continue;
        float sdot = 0.0f, dp = 0.0f;
        for (int c = 0; c < D; c++) {
            sdot += ld16(q + c, bf16) * ld16(k + j * p.k.st + c, bf16);
            dp += ld16(g + c, bf16) * ld16(v + j * p.v.st + c, bf16);
        }
        const float ds = expf(sdot * p.scale - lse[li]) * (dp - dd);
        for (int c = 0; c < D; c++) dq[c] += ds * p.scale * ld16(k + j * p.k.st + c, bf16);
    }
}

/* dK_j = scale sum P_ij (dP_ij - D_i) Q_i and dV_j = sum P_ij dO_i over the group's query heads and rows; one
 * thread per (b, kv head, j). dk_ref / dv_ref [B, HG, SKV, D] compact. */
__global__ void ref_bwd_kv(al_flash_params p, int bf16, int D, int mask, int br, const float *lse, const float *dsum,
                           float *dk_ref, float *dv_ref) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int hk = blockIdx.y, b = blockIdx.z;
    if (j >= p.SKV) return;
    const long long lj = ((long long)b * p.HG + hk) * p.SKV + j;
    float *dk = dk_ref + lj * D, *dv = dv_ref + lj * D;
    for (int c = 0; c < D; c++) dk[c] = dv[c] = 0.0f;
    const int ql = p.q_len ? (int)p.q_len[b] : p.SQ, kl = p.kv_len ? (int)p.kv_len[b] : p.SKV;
    if (j >= kl) return;
    const long long qs = p.q_start ? p.q_start[b] : 0, ks = p.kv_start ? p.kv_start[b] : 0;
    const uint16_t *k = (const uint16_t *)p.k.ptr + b * p.k.sb + (ks + j) * p.k.st + (long long)hk * p.k.sh;
    const uint16_t *v = (const uint16_t *)p.v.ptr + b * p.v.sb + (ks + j) * p.v.st + (long long)hk * p.v.sh;
    const int diag = br ? kl - ql : 0, group = p.H / p.HG;
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int i = 0; i < ql; i++) {
            if (mask == 1 && j > i + diag) continue;
            if (mask == 2 && (j > i + diag + p.wr || j < i + diag - p.wl)) continue;
            const long long li = ((long long)b * p.H + h) * p.SQ + i;
            if (lse[li] == -INFINITY) continue;
            const long long qo = b * p.q.sb + (qs + i) * p.q.st + (long long)h * p.q.sh;
            const uint16_t *q = (const uint16_t *)p.q.ptr + qo, *g = (const uint16_t *)p.dout.ptr + qo;
            float sdot = 0.0f, dp = 0.0f;
            for (int c = 0; c < D; c++) {
                sdot += ld16(q + c, bf16) * ld16(k + c, bf16);
                dp += ld16(g + c, bf16) * ld16(v + c, bf16);
            }
            const float pe = expf(sdot * p.scale - lse[li]), ds = pe * (dp - dsum[li]);
            for (int c = 0; c < D; c++) {
                dk[c] += ds * p.scale * ld16(q + c, bf16);
                dv[c] += pe * ld16(g + c, bf16);
            }
        }
}

/* the f32 reference O [B, H, SQ, D] into the q-layout 16-bit buffer p.o (rows past q_len: zero) */
__global__ void o_to16(al_flash_params p, int bf16, int D, const float *o_ref) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    if (i >= p.SQ) return;
    const int ql = p.q_len ? (int)p.q_len[b] : p.SQ;
    if (i >= ql) return;
    const long long qs = p.q_start ? p.q_start[b] : 0;
    uint16_t *o = (uint16_t *)p.o.ptr + b * p.o.sb + (qs + i) * p.o.st + (long long)h * p.o.sh;
    const float *r = o_ref + (((long long)b * p.H + h) * p.SQ + i) * D;
    for (int c = 0; c < D; c++) {
        if (bf16) {
            unsigned u = __float_as_uint(r[c]);
            u += 0x7FFFu + ((u >> 16) & 1u);
            o[c] = (uint16_t)(u >> 16);
        } else {
            __half hv = __float2half_rn(r[c]);
            o[c] = *(uint16_t *)&hv;
        }
    }
}

/* the backward's buffers beside a Problem (flash_check_common.h): dO, O, and the gradients in q's / k's layouts */
struct Bwd {
    void *dout, *o, *dq, *dk, *dv;
    float *lse2, *dsum, *dsum_ref, *dq_ref, *dk_ref, *dv_ref;
    int *ctr;                                          /* the persistent kernels' work counters */
    long long nk;
};

static void bwd_make(Problem &P, Bwd &W) {
    const Case &c = P.c;
    const long long nq = P.o_elems, nk = (c.thd ? 1 : c.B) * P.rows_kv * c.HG * c.D;
    const long long nl = (long long)c.B * c.H * c.SQ;
    W.nk = nk;
    std::vector<uint16_t> hd(nq);
    for (auto &x : hd) x = f2h(frand(), c.bf16);
    CK(cudaMalloc(&W.dout, nq * 2));
    CK(cudaMemcpy(W.dout, hd.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&W.o, nq * 2)); CK(cudaMalloc(&W.dq, nq * 2));
    CK(cudaMalloc(&W.dk, nk * 2)); CK(cudaMalloc(&W.dv, nk * 2));
    CK(cudaMemset(W.o, 0, nq * 2)); CK(cudaMemset(W.dq, 0, nq * 2));
    CK(cudaMemset(W.dk, 0, nk * 2)); CK(cudaMemset(W.dv, 0, nk * 2));
    CK(cudaMalloc(&W.lse2, nl * 4)); CK(cudaMalloc(&W.dsum, nl * 4)); CK(cudaMalloc(&W.dsum_ref, nl * 4));
    CK(cudaMalloc(&W.dq_ref, nl * c.D * 4));
    CK(cudaMalloc(&W.ctr, 2 * sizeof(int)));
    const long long nkl = (long long)c.B * c.HG * c.SKV * c.D;
    CK(cudaMalloc(&W.dk_ref, nkl * 4)); CK(cudaMalloc(&W.dv_ref, nkl * 4));
    al_flash_params &p = P.prm;
    p.o = p.q; p.o.ptr = W.o;
    p.dout = p.q; p.dout.ptr = W.dout;
    p.dq = p.q; p.dq.ptr = W.dq;
    p.dk = p.k; p.dk.ptr = W.dk;
    p.dv = p.v; p.dv.ptr = W.dv;
    p.lse_in = P.lse_ref;                              /* [B, H, SQ] f32 */
    p.lse_dtype = AL_FLASH_DT_F32;
    p.lse_sb = (long long)c.H * c.SQ; p.lse_sh = c.SQ; p.lse_si = 1;
    p.lse2 = W.lse2; p.dsum = W.dsum;
    p.sched_ctr = W.ctr;
    p.dq_acc = NULL; p.nsplit = 0;                     /* the Hopper dQ kernel writes dq itself */
}

static void bwd_free(Bwd &W) {
    cudaFree(W.dout); cudaFree(W.o); cudaFree(W.dq); cudaFree(W.dk); cudaFree(W.dv);
    cudaFree(W.lse2); cudaFree(W.dsum); cudaFree(W.dsum_ref); cudaFree(W.dq_ref); cudaFree(W.dk_ref); cudaFree(W.dv_ref);
    cudaFree(W.ctr);
}

static int g_sms = 132;   /* the device's SMs: the persistent kernels' grid (main reads it) */

/* the three kernels of one backward, as the backend launches them; which: 1 pre, 2 dK/dV, 4 dQ (a mask) */
static void run_bwd(Problem &P, int which, int verbose) {
    const Case &c = P.c;
    al_flash_spec s;
    memset(&s, 0, sizeof s);
    s.kind = AL_FLASH_BWD; s.d = c.D; s.bf16 = c.bf16; s.mask = c.mask; s.bottom_right = c.mask ? c.br : 0;
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN], label[128];
    al_flash_params prm = P.prm;
    if (which & 1) {
        const int n = al_flash_spec_options(&s, opts);
        al_flash_spec_name(&s, label, sizeof label);
        CUfunction f = get_fn(al_flash_spec_file(&s), "al_flash_bwd_pre", opts, n, label, 0);
        const long long rows = (long long)c.B * c.H * c.SQ;
        void *args[] = {&prm};
        CU(cuLaunchKernel(f, (unsigned)((rows * (c.D / 8) + 255) / 256), 1, 1, 256, 1, 1, 0, 0, args, NULL));
    }
    const al_flash_sm90_tiles t = al_flash_sm90_bwd_tiles(&s);
    /* the persistent kernels' work counters, zeroed once before both launches (as the backend: a memset between
     * them would also keep the dQ kernel from starting beside the dK/dV kernel's end) */
    if ((which & 6) && (al_flash_sm90_bwd_persist(&s, 0) || al_flash_sm90_bwd_persist(&s, 1)))
        CK(cudaMemsetAsync(prm.sched_ctr, 0, 2 * sizeof(int), 0));
    for (int role = 0; role < 2; role++) {
        if (!(which & (2 << role))) continue;
        const int n = al_flash_sm90_bwd_options(&s, role, opts);
        al_flash_sm90_bwd_name(&s, role, label, sizeof label);
        CUfunction f = get_fn(al_flash_sm90_bwd_file(), al_flash_sm90_bwd_function(role), opts, n, label, verbose);
        al_flash_sm90_bwd_tmaps tm;
        CU(al_flash_sm90_bwd_tmaps_make(&tm, &prm, role, s.bf16, s.d, P.rows_q, P.rows_kv, t.bm, t.bn));
        const int smem = al_flash_sm90_bwd_smem(&s, role);
        CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
        /* causal: sections of four (head, batch) pairs, longest blocks first (the backend's rule when four
         * pairs' tiles fit in L2, as at every shape here), times the GQA group in the dQ kernel */
        al_flash_params pr = prm;
        pr.sched_hb = c.mask == 1 ? 4 * (role ? c.H / c.HG : 1) : 0;
        unsigned grid[3];
        const long long items = al_flash_sm90_bwd_grid(&s, role, c.B, c.H, c.HG, c.SQ, c.SKV, g_sms, grid);
        void *args[] = {&pr, &tm};
        if (!items) continue;
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = grid[0]; cfg.gridDimY = grid[1]; cfg.gridDimZ = grid[2];
        cfg.blockDimX = t.threads; cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.sharedMemBytes = smem;
        CUlaunchAttribute at;
        memset(&at, 0, sizeof at);
        at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at.value.programmaticStreamSerializationAllowed = 1;
        if (role == 1 && al_flash_sm90_bwd_pdl()) { cfg.attrs = &at; cfg.numAttrs = 1; }   /* as the backend */
        CU(cuLaunchKernelEx(&cfg, f, args, NULL));
    }
}

/* max |x - ref| and max |ref| of one gradient over the valid rows: x in the 16-bit layout (rows: token
 * index for thd, (b, row) otherwise; heads nh), ref compact [B, nh, S, D] */
struct Err { double err, ref; };
static Err grad_err(const Problem &P, const std::vector<uint16_t> &x, const std::vector<float> &ref, int nh, int S,
                    const std::vector<long long> &starts, const std::vector<long long> &lens, long long rows) {
    const Case &c = P.c;
    Err e = {0, 0};
    for (int b = 0; b < c.B; b++)
        for (int h = 0; h < nh; h++)
            for (long long i = 0; i < lens[b]; i++) {
                const long long xr = c.thd ? (starts[b] + i) * nh + h : ((long long)b * rows + i) * nh + h;
                const float *r = &ref[(((long long)b * nh + h) * S + i) * c.D];
                for (int col = 0; col < c.D; col++) {
                    const float v = h2f(x[xr * c.D + col], c.bf16);
                    e.err = fmax(e.err, isnan(v) ? 1e30 : fabs(v - r[col]));
                    e.ref = fmax(e.ref, fabs(r[col]));
                }
            }
    return e;
}

/* thd: the gap rows after each sequence must still hold the zeros written before the launch */
static long long gap_writes(const Problem &P, const std::vector<uint16_t> &x, int nh, const std::vector<long long> &starts,
                            const std::vector<long long> &lens) {
    long long n = 0;
    for (int b = 0; b < P.c.B; b++)
        for (long long t = starts[b] + lens[b]; t < starts[b] + lens[b] + 7; t++)
            for (int k = 0; k < nh * P.c.D; k++) n += x[t * nh * P.c.D + k] != 0;
    return n;
}

static int check_case(const Case &c) {
    Problem P;
    problem_make(P, c);
    Bwd W;
    bwd_make(P, W);
    const int D = c.D;
    al_flash_params rp = P.prm;
    rp.lse = P.lse_ref;
    const dim3 gq((c.SQ + 127) / 128, c.H, c.B), gk((c.SKV + 127) / 128, c.HG, c.B);
    ref_fwd<<<gq, 128>>>(rp, c.bf16, D, c.mask, c.br, P.o_ref);
    o_to16<<<gq, 128>>>(rp, c.bf16, D, P.o_ref);
    CK(cudaGetLastError());
    run_bwd(P, 7, 1);
    ref_bwd_q<<<gq, 128>>>(rp, c.bf16, D, c.mask, c.br, P.lse_ref, W.dq_ref, W.dsum_ref);
    ref_bwd_kv<<<gk, 128>>>(rp, c.bf16, D, c.mask, c.br, P.lse_ref, W.dsum_ref, W.dk_ref, W.dv_ref);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const long long nl = (long long)c.B * c.H * c.SQ, nkl = (long long)c.B * c.HG * c.SKV * D;
    std::vector<uint16_t> dq(P.o_elems), dk(W.nk), dv(W.nk);
    std::vector<float> dqr(nl * D), dkr(nkl), dvr(nkl), ds(nl), dsr(nl);
    CK(cudaMemcpy(dq.data(), W.dq, P.o_elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dk.data(), W.dk, W.nk * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dv.data(), W.dv, W.nk * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dqr.data(), W.dq_ref, nl * D * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dkr.data(), W.dk_ref, nkl * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dvr.data(), W.dv_ref, nkl * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ds.data(), W.dsum, nl * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dsr.data(), W.dsum_ref, nl * 4, cudaMemcpyDeviceToHost));
    const Err eq = grad_err(P, dq, dqr, c.H, c.SQ, P.qs, P.ql, P.rows_q);
    const Err ek = grad_err(P, dk, dkr, c.HG, c.SKV, P.ks, P.kl, P.rows_kv);
    const Err ev = grad_err(P, dv, dvr, c.HG, c.SKV, P.ks, P.kl, P.rows_kv);
    double eds = 0, rds = 0;                           /* the pre pass's D against the reference's */
    for (int b = 0; b < c.B; b++)
        for (int h = 0; h < c.H; h++)
            for (long long i = 0; i < P.ql[b]; i++) {
                const long long li = ((long long)b * c.H + h) * c.SQ + i;
                eds = fmax(eds, fabs(ds[li] - dsr[li]));
                rds = fmax(rds, fabs(dsr[li]));
            }
    long long gaps = 0;
    if (c.thd) gaps = gap_writes(P, dq, c.H, P.qs, P.ql) + gap_writes(P, dk, c.HG, P.ks, P.kl) + gap_writes(P, dv, c.HG, P.ks, P.kl);
    const double tol = c.bf16 ? 2e-2 : 4e-3;
    const auto fine = [&](Err e) { return e.err <= tol * fmax(1.0, e.ref); };
    const int ok = fine(eq) && fine(ek) && fine(ev) && eds <= 1e-3 * fmax(1.0, rds) && gaps == 0;
    static const char *mk[] = {"none", "causal", "window"};
    printf("%s  b=%d h=%d hg=%d sq=%d skv=%d d=%d %s%s %s %s  | max|err| (max|ref|): dQ %.3g (%.3g) dK %.3g (%.3g) "
           "dV %.3g (%.3g) D %.2g%s\n",
           ok ? "PASS" : "FAIL", c.B, c.H, c.HG, c.SQ, c.SKV, D, mk[c.mask], c.mask ? (c.br ? "-br" : "-tl") : "",
           c.thd ? "thd" : "bshd", c.bf16 ? "bf16" : "f16", eq.err, eq.ref, ek.err, ek.ref, ev.err, ev.ref, eds,
           gaps ? " GAP ROWS WRITTEN" : "");
    bwd_free(W);
    problem_free(P);
    return ok;
}

static int env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && atoi(e) > 0 ? atoi(e) : dflt;
}

static void bench_case(int B, int H, int S, int D, int causal) {
    Case c;
    memset(&c, 0, sizeof c);
    c.B = B; c.H = H; c.HG = H; c.SQ = S; c.SKV = S; c.D = D; c.mask = causal; c.bf16 = 1;
    Problem P;
    problem_make(P, c);
    Bwd W;
    bwd_make(P, W);
    /* a real LSE and O (the naive forward is slow at these sizes: the Hopper forward's would do, but the
     * kernels' speed does not depend on the values, only on them being finite and the rows non-empty) */
    const long long nl = (long long)B * H * S;
    std::vector<float> lse(nl);
    for (auto &x : lse) x = logf((float)S) + 0.5f * frand();
    CK(cudaMemcpy(P.lse_ref, lse.data(), nl * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(W.o, W.dout, P.o_elems * 2, cudaMemcpyDeviceToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    double ms[8] = {0};
    const int warm = env_int("FLASH_SM90_BENCH_WARMUP", 3), iters = env_int("FLASH_SM90_BENCH_ITERS", 10);
    for (int which : {7, 1, 2, 4}) {
        for (int i = 0; i < warm; i++) run_bwd(P, which, 0);
        CK(cudaEventRecord(e0));
        for (int i = 0; i < iters; i++) run_bwd(P, which, 0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        ms[which] = now_ms(e0, e1) / iters;
    }
    const double flops = 2.5 * 4.0 * B * H * (double)S * S * D / (causal ? 2 : 1);
    const double pre_bytes = 2.0 * 2.0 * nl * D + 3.0 * 4.0 * nl;   /* O, dO read; lse read; lse2, D written */
    printf("bench b=%d h=%d s=%d d=%d %-7s backward %7.3f ms %6.1f TFLOP/s | pre %6.1f us (%.2f TB/s) dK/dV %.3f ms dQ "
           "%.3f ms\n", B, H, S, D, causal ? "causal" : "nomask", ms[7], flops / (ms[7] * 1e-3) / 1e12, ms[1] * 1e3,
           pre_bytes / (ms[1] * 1e-3) / 1e12, ms[2], ms[4]);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    bwd_free(W);
    problem_free(P);
}

int main(void) {
    const char *only = getenv("FLASH_SM90_ONLY");
    const int ready = gpu_ready("flash_sm90_bwd_check");
    if (ready) return ready < 0 ? 0 : ready;
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    int fails = 0;
    if (!only || strcmp(only, "bench") != 0) {
        /* B H HG SQ SKV D mask br thd bf16 wl wr */
        const Case cases[] = {
            {1, 1, 1, 64, 128, 128, 0, 0, 0, 1, 0, 0},     /* one stream tile each way */
            {1, 2, 2, 128, 128, 64, 0, 0, 0, 1, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 0, 0, 0, 1, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 1, 0, 0, 1, 0, 0},
            {2, 4, 2, 777, 1333, 128, 1, 1, 0, 1, 0, 0},   /* GQA, bottom-right, sq != skv */
            {2, 4, 2, 1333, 777, 128, 1, 0, 0, 1, 0, 0},   /* top-left, sq > skv */
            {2, 4, 2, 1333, 777, 128, 1, 1, 0, 1, 0, 0},   /* bottom-right, sq > skv: empty rows, keys nobody sees */
            {1, 8, 1, 1024, 1024, 128, 0, 0, 0, 1, 0, 0},  /* MQA */
            {2, 4, 4, 300, 513, 64, 0, 0, 0, 1, 0, 0},
            {2, 4, 4, 1025, 1025, 64, 1, 0, 0, 1, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 0, 0, 0, 0, 0, 0},  /* f16 */
            {2, 4, 4, 1000, 1000, 64, 1, 1, 0, 0, 0, 0},
            {2, 4, 4, 1000, 1000, 128, 2, 0, 0, 1, 200, 50},   /* sliding window */
            {4, 4, 2, 1000, 1200, 128, 0, 0, 1, 1, 0, 0},  /* thd, ragged, gaps */
            {4, 4, 2, 1000, 1200, 128, 1, 1, 1, 1, 0, 0},
            {4, 4, 4, 600, 600, 64, 1, 0, 1, 1, 0, 0},
            {3, 2, 2, 1, 1, 128, 0, 0, 0, 1, 0, 0},        /* s = 1 */
        };
        fails = run_cases("flash_sm90_bwd_check", cases, (int)(sizeof cases / sizeof cases[0]), check_case);
    }
    if (!only || strcmp(only, "check") != 0) {
        bench_case(2, 16, 4096, 128, 0);                /* scripts/flash_ab.lua's shape */
        bench_case(2, 16, 4096, 128, 1);
        bench_case(4, 16, 4096, 128, 0);
        bench_case(4, 16, 4096, 128, 1);
        bench_case(2, 16, 8192, 128, 0);
        bench_case(2, 16, 8192, 128, 1);
        bench_case(1, 16, 16384, 128, 0);
        bench_case(1, 16, 16384, 128, 1);
        bench_case(4, 32, 4096, 64, 0);
        bench_case(4, 32, 4096, 64, 1);
    }
    return fails ? 1 : 0;
}
