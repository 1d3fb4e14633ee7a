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
 * Also prints ptxas's register / spill line of every sm90 specialisation it compiles. The backward's check is
 * tests/cuda/flash_sm90_bwd_check.cu; what both share, tests/cuda/flash_check_common.h.
 * Without a GPU it reports itself skipped (scripts/tally.sh's format) and exits 0; exits 1 on any failure
 * (`make test` runs the check, FLASH_SM90_ONLY=check).
 * Env: ATTNLAB_KERNEL_DIR (default ./kernels), FLASH_SM90_ONLY=check|bench|compile (compile: every shipped
 * sm90 specialisation with NVRTC, ptxas lines printed, exit 1 on spills; needs no GPU);
 * ATTNLAB_FLASH_SM90_CONSUMERS=3 checks / times the three-consumer forward at d 64 / 128 (flash_sm90_specs.h).
 */
#include "flash_check_common.h"

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


static al_flash_spec spec_of(const Case &c) {
    al_flash_spec s;
    memset(&s, 0, sizeof s);
    s.kind = AL_FLASH_FWD; s.d = c.D; s.bf16 = c.bf16; s.mask = c.mask; s.bottom_right = c.mask ? c.br : 0;
    /* ATTNLAB_FLASH_SM90_CONSUMERS=3: the three-consumer forward where it applies (d <= 128), as the backend */
    if (al_flash_sm90_consumers_env() == 3 && al_flash_sm90_c3_bn(c.D) > 0) s.fwd_consumers = 3;
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
    const int ready = gpu_ready("flash_sm90_check");
    if (ready) return ready < 0 ? 0 : ready;
    int fails = 0;
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
        fails = run_cases("flash_sm90_check", cases, (int)(sizeof cases / sizeof cases[0]), check_case);
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
