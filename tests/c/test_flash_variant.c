/*
 * test_flash_variant.c — attention variants (al_attn_inputs.variant: score_mod / mask_mod CUDA snippets,
 * captured tensors and their gradients, block masks) on the C/CUDA side (issue 9).
 *
 * Always (no GPU needed):
 *   - validation: every al_attn_variant field the front door checks, each error naming the field;
 *   - backend choice: cpu, unfused and fused decline a variant with the reason al_attn_explain shows;
 *     a forced cpu backend is an error that says why; an automatic choice names flash;
 *   - the generated source (cuda/flash_specs.h): hook macros, identity hash, spec name;
 *   - NVRTC compiles flash_fwd.cu and flash_bwd.cu (d = 64, 128, bf16, sm_90a) with a soft-capping
 *     score_mod + score_grad, a relative-position bias read from a capture, a mask_mod reading a
 *     captured i32 tensor, a capture_grad statement and a block mask, the Hopper forward and both Hopper
 *     backward kernels (flash_bwd_sm90.cu) with the same hooks, and the Hopper backward of every variant
 *     the GPU cases below run (0 spills required of the Hopper kernels; NVRTC needs no GPU; skipped with
 *     the reason when libnvrtc is absent). Kernel folder: $ATTNLAB_KERNEL_DIR, else ./kernels.
 *     ATTNLAB_TEST_NVRTC=0 (make test-asan) builds every job's source and options but compiles none:
 *     NVRTC is an uninstrumented library, and once in CI LeakSanitizer's exit-time scan crashed ("Tracer
 *     caught signal 11" at 0x200000ca0, in ASan's shadow gap) after its compiles, with every check passed;
 *     `make test` runs the compiles.
 * With a GPU (else reported skipped: "no GPU"):
 *   forward and backward through the flash backend against a naive oracle in double written here
 *   (independent of the cpu backend), bf16, random inputs, TE's bf16 tolerance (atol = rtol = 1.5e-2):
 *   soft-capping (+ built-in causal), a document mask from a captured i32 tensor, a learnable
 *   relative-position bias with its gradient (GQA, d = 128), a sliding window via block mask + mask_mod
 *   composed with built-in causal, including fully skipped rows (O = 0, LSE = -inf); and block-mask
 *   skipping giving bit-identical results to the same variant without the block mask (deterministic
 *   backward). On sm_90 the default backward of d = 64 / 128 variants is the Hopper one
 *   (kernels/flash_bwd_sm90.cu): al_cuda_backend_info("flash") must name its two variant kernels, and
 *   every gradient (capture gradients included) is checked again with ATTNLAB_FLASH_SM90_BWD=0 (stage 1).
 */
#include "test_main.h"
#include "cuda/flash_specs.h"
#include "cuda/flash_sm90_specs.h"

#include "nvrtc_test.h"
#include <math.h>
#include <stdlib.h>
#include <time.h>

/* ---- CPU tensors for the validation tests ------------------------------------------------------- */
static al_tensor make_cpu(int32_t ndim, const int64_t *size, int32_t dtype) {
    al_tensor t;
    memset(&t, 0, sizeof t);
    al_status st = al_tensor_empty(&t, ndim, size, dtype, AL_DEVICE_CPU, 0);
    if (st == AL_OK && al_dtype_is_float(dtype)) al_tensor_random_(&t, AL_RANDOM_NORMAL);
    else if (st == AL_OK) al_tensor_fill_(&t, 1.0);
    return t;
}

/* q, k, v bshd f32 [2, 128, 2, 64] on the CPU and a variant with one capture */
typedef struct vfix {
    al_tensor q, k, v, cap, capg, bm;
    al_attn_params p;
    al_attn_inputs in;
    al_attn_variant var;
} vfix;

static void vfix_init(vfix *f) {
    memset(f, 0, sizeof *f);
    const int64_t qs[4] = {2, 128, 2, 64}, cs[1] = {256}, bs[4] = {1, 2, 2, 2};
    f->q = make_cpu(4, qs, AL_DTYPE_F32);
    f->k = make_cpu(4, qs, AL_DTYPE_F32);
    f->v = make_cpu(4, qs, AL_DTYPE_F32);
    f->cap = make_cpu(1, cs, AL_DTYPE_I32);
    f->capg = make_cpu(1, cs, AL_DTYPE_F32);
    f->bm = make_cpu(4, bs, AL_DTYPE_U8);
    al_attn_params_init(&f->p);
    f->p.qkv_format = AL_ATTN_FORMAT_BSHD;
    f->p.mask_type = AL_ATTN_MASK_NO_MASK;
    f->in.q = &f->q;
    f->in.k = &f->k;
    f->in.v = &f->v;
    f->var.score_mod = "score * 0.5f";
    f->var.score_grad = "grad * 0.5f";
    f->var.mask_mod = "((const int *)AL_CAP(0))[q_idx] == ((const int *)AL_CAP(0))[kv_idx]";
    f->var.ncaptures = 1;
    f->var.captures[0] = &f->cap;
    f->var.capture_grads[0] = &f->capg;
    f->var.block_mask = &f->bm;
    f->var.block_m = 64;
    f->var.block_n = 64;
    f->in.variant = &f->var;
}

static void vfix_free(vfix *f) {
    al_tensor *ts[] = {&f->q, &f->k, &f->v, &f->cap, &f->capg, &f->bm};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) al_tensor_release(ts[i]);
}

static void test_validation(void) {
    vfix f;
    vfix_init(&f);
    /* the valid fixture passes validation (the backend choice is tested below) */
    CHECK_OK(al_attn_check(&f.p, &f.in));

    f.var.ncaptures = 9;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.ncaptures: expected 0..8, given 9");
    f.var.ncaptures = -1;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.ncaptures");
    f.var.ncaptures = 2;   /* captures[1] is NULL */
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.captures[1]: expected a tensor, got nothing");
    f.var.ncaptures = 1;

    /* capture gradients: f32, contiguous, the capture's numel */
    const int64_t s1[1] = {256}, s2[1] = {255}, s3[2] = {16, 32};
    al_tensor g_i32 = make_cpu(1, s1, AL_DTYPE_I32), g_short = make_cpu(1, s2, AL_DTYPE_F32);
    al_tensor g_big = make_cpu(2, s3, AL_DTYPE_F32), g_strided;
    memset(&g_strided, 0, sizeof g_strided);
    CHECK_OK(al_tensor_transpose(&g_strided, &g_big, 0, 1));
    al_tensor g_view;
    memset(&g_view, 0, sizeof g_view);
    CHECK_OK(al_tensor_narrow(&g_view, &g_strided, 0, 0, 16));   /* [16, 16] of a transposed [32, 16]: 256, strided */
    f.var.capture_grads[0] = &g_i32;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.capture_grads[0]: expected a contiguous f32 tensor of 256");
    f.var.capture_grads[0] = &g_short;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "given f32 [255]");
    f.var.capture_grads[0] = &g_view;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.capture_grads[0]");
    f.var.capture_grads[0] = NULL;   /* NULL: no gradient wanted, valid */
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.capture_grads[0] = &f.capg;
    al_tensor_release(&g_i32);
    al_tensor_release(&g_short);
    al_tensor_release(&g_big);
    al_tensor_release(&g_strided);
    al_tensor_release(&g_view);

    /* block mask: u8 [1|b, 1|h, ceil(sq/bm), ceil(skv/bn)], block sizes > 0 */
    f.var.block_m = 0;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.block_m / block_n: expected > 0 with a block_mask, given 0 and 64");
    f.var.block_m = 64;
    f.var.block_n = 128;   /* wants [.., 2, 1] */
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.block_mask: expected u8 [1|2, 1|2, 2, 1]");
    f.var.block_n = 50;    /* ceil(128/50) = 3 */
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "ceil(skv=128 / block_n=50)");
    f.var.block_n = 64;
    const int64_t b3[4] = {3, 2, 2, 2}, b2[4] = {2, 2, 2, 2}, b1[3] = {2, 2, 2};
    al_tensor m_b3 = make_cpu(4, b3, AL_DTYPE_U8), m_f32 = make_cpu(4, b2, AL_DTYPE_F32), m_3d = make_cpu(3, b1, AL_DTYPE_U8);
    al_tensor m_ok = make_cpu(4, b2, AL_DTYPE_U8);
    f.var.block_mask = &m_b3;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "given u8 [3,2,2,2]");
    f.var.block_mask = &m_f32;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.block_mask: expected u8");
    f.var.block_mask = &m_3d;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.block_mask");
    f.var.block_mask = &m_ok;   /* the full [b, h, ..] form */
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.block_mask = &f.bm;
    al_tensor_release(&m_b3);
    al_tensor_release(&m_f32);
    al_tensor_release(&m_3d);
    al_tensor_release(&m_ok);

    /* snippets: no // comments in hooks (they become one-line macros), bounded length */
    f.var.mask_mod = "q_idx >= kv_idx // causal";
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.mask_mod: expected no // comment");
    f.var.mask_mod = "q_idx >= kv_idx /* causal */";
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.prelude = "// a comment is fine in the prelude\n";
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.prelude = NULL;

    /* the folded form: beside score_mod, score_post a finite f32 constant > 0, no // comment */
    f.var.score_pre = "acc * (scale * 0.5f)";
    f.var.score_post = 1.0;
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.score_post = 0.0;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_post: expected a finite constant > 0 (an f32 number), given 0");
    f.var.score_post = -2.0;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "given -2");
    f.var.score_post = NAN;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_post");
    f.var.score_post = 1e300;   /* not an f32 number */
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_post");
    f.var.score_post = 2.0;
    f.var.score_mod = NULL;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_pre: expected score_mod beside it");
    f.var.score_mod = "score * 0.5f";
    f.var.score_pre = "acc * scale // folded";
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_pre: expected no // comment");
    /* the folded gradient: beside score_pre and score_grad, no // comment */
    f.var.score_pre = "acc * (scale * 0.5f)";
    f.var.score_grad_pre = "grad * 0.5f";
    f.var.score_grad = NULL;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG,
              "variant.score_grad_pre: expected score_pre and score_grad beside it (the folded form of score_grad), "
              "given no score_grad");
    f.var.score_grad = "grad * 0.5f";
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.score_grad_pre = "grad // folded";
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_grad_pre: expected no // comment");
    f.var.score_grad_pre = "grad * 0.5f";
    f.var.score_pre = NULL;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_grad_pre: expected score_pre and score_grad beside "
              "it (the folded form of score_grad), given no score_pre");
    f.var.score_grad_pre = NULL;
    f.var.score_post = -1.0;   /* ignored without score_pre */
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.score_post = 0.0;
    /* the logit's bounds: finite, lo <= hi, beside score_mod */
    f.var.score_bounded = 1;
    f.var.score_lo = -30.0;
    f.var.score_hi = 30.0;
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.score_hi = -31.0;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG,
              "variant.score_lo / score_hi: expected finite bounds with score_lo <= score_hi, given [-30, -31]");
    f.var.score_hi = INFINITY;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "given [-30, inf]");
    f.var.score_hi = 30.0;
    f.var.score_lo = NAN;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_lo / score_hi");
    f.var.score_lo = -30.0;
    f.var.score_mod = NULL;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_bounded: expected score_mod beside it");
    f.var.score_mod = "score * 0.5f";
    f.var.score_bounded = 0;
    /* the MUFU hint: 0 or 1, beside score_mod */
    f.var.score_mufu = 1;
    CHECK_OK(al_attn_check(&f.p, &f.in));
    f.var.score_mufu = 2;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_mufu: expected 0 or 1, given 2");
    f.var.score_mufu = -1;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_mufu: expected 0 or 1, given -1");
    f.var.score_mufu = 1;
    f.var.score_mod = NULL;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_mufu: expected score_mod beside it");
    f.var.score_mod = "score * 0.5f";
    f.var.score_mufu = 0;
    char *big = malloc(70000);
    memset(big, '1', 69999);
    big[69999] = 0;
    f.var.score_mod = big;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.score_mod: expected at most 65536 bytes");
    f.var.score_mod = NULL;
    f.var.capture_grad = big;
    CHECK_ERR(al_attn_check(&f.p, &f.in), AL_ERR_ARG, "variant.capture_grad");
    free(big);
    vfix_free(&f);
}

static void test_backend_choice(void) {
    vfix f;
    vfix_init(&f);
    char buf[4096];
    const char *be = al_attn_explain(&f.p, &f.in, buf, sizeof buf);
    CHECK(be == NULL, "a CPU call with a variant must have no backend, got %s", be ? be : "");
    CHECK(strstr(buf, "cpu      no: variants (score_mod/mask_mod) run on the flash backend; on the CPU the Lua front end") != NULL,
          "explain lacks the cpu backend's reason:\n%s", buf);
    CHECK(strstr(buf, "unfused  no: variants (score_mod/mask_mod) run on the flash backend only") != NULL,
          "explain lacks the unfused backend's reason:\n%s", buf);
    CHECK(strstr(buf, "fused    no: variants (score_mod/mask_mod) run on the flash backend only") != NULL,
          "explain lacks the fused backend's reason:\n%s", buf);
    CHECK(strstr(buf, "flash    no: ") != NULL, "explain lacks the flash line:\n%s", buf);
    CHECK(strstr(buf, "error: attention: a variant (score_mod/mask_mod) runs on the flash backend only") != NULL,
          "explain lacks the verdict:\n%s", buf);

    al_tensor out, lse;
    CHECK_ERR(al_attn_forward(&f.p, &f.in, &out, &lse, NULL), AL_ERR_UNSUPPORTED,
              "a variant (score_mod/mask_mod) runs on the flash backend only, which cannot serve this call");
    CHECK(out.storage == NULL && lse.storage == NULL, "outputs must stay empty on failure");
    snprintf(f.p.backend, sizeof f.p.backend, "cpu");
    CHECK_ERR(al_attn_forward(&f.p, &f.in, &out, &lse, NULL), AL_ERR_UNSUPPORTED,
              "forced backend 'cpu' cannot serve this call: variants (score_mod/mask_mod) run on the flash backend; on the CPU");
    /* without the variant the same call runs on the cpu backend (the decline is the variant's) */
    f.in.variant = NULL;
    CHECK_OK(al_attn_forward(&f.p, &f.in, &out, &lse, NULL));
    al_tensor_release(&out);
    al_tensor_release(&lse);
    vfix_free(&f);
}

/* ---- generated source and identity ------------------------------------------------------------------- */
static void test_variant_source(void) {
    const al_flash_hooks hk = {"score * 2.0f", NULL, "q_idx >= kv_idx\n&& 1", "atomicAdd(AL_CAP_GRAD(0), grad)",
                               "static __device__ int f(int x) { return x; }", NULL, 0.0, 0, 0.0, NULL};
    char *src = al_flash_variant_source(&hk, "flash_fwd.cu");
    CHECK(src != NULL, "no source");
    if (!src) return;
    CHECK(strstr(src, "#define AL_VARIANT 1\n") != NULL, "%s", src);
    CHECK(strstr(src, "#define AL_SCORE_MOD(score, b, h, q_idx, kv_idx) (score * 2.0f)\n") != NULL, "%s", src);
    CHECK(strstr(src, "AL_SCORE_MOD_GRAD") == NULL, "a NULL score_grad must leave the default:\n%s", src);
    CHECK(strstr(src, "#define AL_MASK_MOD(b, h, q_idx, kv_idx) (q_idx >= kv_idx && 1)\n") != NULL,
          "newlines in a snippet become spaces:\n%s", src);
    CHECK(strstr(src, "#define AL_CAPTURE_GRAD(grad, score, b, h, q_idx, kv_idx) do { atomicAdd(AL_CAP_GRAD(0), grad); } while (0)\n") != NULL,
          "%s", src);
    CHECK(strstr(src, "static __device__ int f(int x)") < strstr(src, "#define AL_SCORE_MOD"), "the prelude precedes the hooks");
    CHECK(strstr(src, "#line 1 \"flash_fwd.cu\"\n") != NULL, "%s", src);
    CHECK(strstr(src, "AL_SCORE_PRE") == NULL && strstr(src, "AL_SCORE_POST") == NULL, "no folded form given:\n%s", src);
    free(src);
    /* the folded form: AL_SCORE_PRE's macro and AL_SCORE_POST as an f32 literal */
    const al_flash_hooks hf = {"30.0f * tanhf(score * 0.0333f)", NULL, NULL, NULL, NULL, "tanhf(acc * (scale * 0.0333f))",
                               30.0, 0, 0.0, NULL};
    src = al_flash_variant_source(&hf, "flash_fwd.cu");
    CHECK(src != NULL, "no source");
    if (!src) return;
    CHECK(strstr(src, "#define AL_SCORE_PRE(acc, scale, b, h, q_idx, kv_idx) (tanhf(acc * (scale * 0.0333f)))\n") != NULL,
          "%s", src);
    CHECK(strstr(src, "#define AL_SCORE_POST 3.000000000e+01f\n") != NULL, "%s", src);
    CHECK(strstr(src, "AL_SCORE_MOD_MAX") == NULL, "no bounds given, no fixed max:\n%s", src);
    CHECK(strstr(src, "AL_SCORE_GRAD_PRE") == NULL, "no folded gradient given:\n%s", src);
    free(src);
    /* the folded gradient: AL_SCORE_GRAD_PRE's macro */
    al_flash_hooks hg = hf;
    hg.score_grad = "grad * (1.0f - tanhf(score * 0.0333f) * tanhf(score * 0.0333f))";
    hg.score_grad_pre = "grad * (1.0f - tanhf(acc * (scale * 0.0333f)) * tanhf(acc * (scale * 0.0333f)))";
    src = al_flash_variant_source(&hg, "flash_bwd_sm90.cu");
    CHECK(src && strstr(src, "#define AL_SCORE_GRAD_PRE(grad, acc, scale, b, h, q_idx, kv_idx) (grad * (1.0f - "
                             "tanhf(acc * (scale * 0.0333f)) * tanhf(acc * (scale * 0.0333f))))\n") != NULL,
          "%s", src ? src : "(null)");
    free(src);
    /* the fixed max (al_flash_hooks_set_bounds): soft-capping's [-30, 30] gives AL_SCORE_MOD_MAX 30; bounds more than
     * 64 apart, none given, or ATTNLAB_FLASH_SM90_FIXED_MAX=0 give none */
    al_flash_hooks hb = hf;
    al_flash_hooks_set_bounds(&hb, 1, -30.0, 30.0);
    CHECK(hb.fixed_max == 1 && hb.score_max == 30.0, "[-30, 30]: fixed max %d at %g", hb.fixed_max, hb.score_max);
    src = al_flash_variant_source(&hb, "flash_fwd_sm90.cu");
    CHECK(src && strstr(src, "#define AL_SCORE_MOD_MAX 3.000000000e+01f\n") != NULL, "%s", src ? src : "(null)");
    free(src);
    al_flash_hooks_set_bounds(&hb, 1, -50.0, 50.0);
    CHECK(hb.fixed_max == 0, "[-50, 50] is 100 wide: no fixed max");
    al_flash_hooks_set_bounds(&hb, 0, -1.0, 1.0);
    CHECK(hb.fixed_max == 0, "no bounds given: no fixed max");
    setenv("ATTNLAB_FLASH_SM90_FIXED_MAX", "0", 1);
    al_flash_hooks_set_bounds(&hb, 1, -30.0, 30.0);
    unsetenv("ATTNLAB_FLASH_SM90_FIXED_MAX");
    CHECK(hb.fixed_max == 0, "ATTNLAB_FLASH_SM90_FIXED_MAX=0: no fixed max");
    hb.score_mod = NULL;
    al_flash_hooks_set_bounds(&hb, 1, -30.0, 30.0);
    CHECK(hb.fixed_max == 0, "bounds without score_mod: no fixed max");

    al_flash_spec a, b, c, d, e, f, g, pr;
    memset(&a, 0, sizeof a);
    a.kind = AL_FLASH_FWD;
    a.d = 64;
    a.bf16 = 1;
    b = c = d = e = f = g = pr = a;
    const al_flash_hooks h_score = {"score", NULL, NULL, NULL, NULL, NULL, 0.0, 0, 0.0, NULL},
                         h_grad = {NULL, "score", NULL, NULL, NULL, NULL, 0.0, 0, 0.0, NULL},   /* same text, another hook */
                         h_empty = {"score", "", NULL, NULL, NULL, NULL, 0.0, 0, 0.0, NULL},    /* "" differs from NULL */
                         h_pre2 = {"score", NULL, NULL, NULL, NULL, "acc * scale", 2.0, 0, 0.0, NULL},
                         h_pre3 = {"score", NULL, NULL, NULL, NULL, "acc * scale", 3.0, 0, 0.0, NULL},
                         h_max = {"score", NULL, NULL, NULL, NULL, "acc * scale", 3.0, 1, 30.0, NULL},
                         h_max2 = {"score", NULL, NULL, NULL, NULL, "acc * scale", 3.0, 1, 20.0, NULL},
                         h_pre4 = {"score", NULL, NULL, NULL, NULL, "acc * scale * 1.0f", 3.0, 0, 0.0, NULL};
    al_flash_spec_set_variant(&a, &h_score, 0);
    al_flash_spec_set_variant(&b, &h_score, 1);
    al_flash_spec_set_variant(&c, &h_grad, 0);
    al_flash_spec_set_variant(&d, &h_score, 0);
    al_flash_spec_set_variant(&e, &h_empty, 0);
    al_flash_spec_set_variant(&f, &h_pre2, 0);
    al_flash_spec_set_variant(&g, &h_pre3, 0);
    al_flash_spec_set_variant(&pr, &h_pre4, 0);
    al_flash_spec mx = a, mx2 = a, gp = a, gp2 = a;
    al_flash_spec_set_variant(&mx, &h_max, 0);
    al_flash_spec_set_variant(&mx2, &h_max2, 0);
    al_flash_hooks h_gp = h_pre3;
    h_gp.score_grad = "grad";
    al_flash_spec g0 = a;
    al_flash_spec_set_variant(&g0, &h_gp, 0);
    h_gp.score_grad_pre = "grad";
    al_flash_spec_set_variant(&gp, &h_gp, 0);
    h_gp.score_grad_pre = "grad * 1.0f";
    al_flash_spec_set_variant(&gp2, &h_gp, 0);
    CHECK(a.variant == 1 && b.block_mask == 1 && a.block_mask == 0, "flags");
    CHECK(memcmp(&a, &d, sizeof a) == 0, "one variant, one identity");
    CHECK(memcmp(&a, &b, sizeof a) != 0, "the block-mask flag is part of the identity");
    CHECK(a.vhash[0] != c.vhash[0] && a.vhash[1] != c.vhash[1], "hook position is part of the hash");
    CHECK(a.vhash[0] != e.vhash[0], "NULL and \"\" differ");
    CHECK(a.vhash[0] != f.vhash[0] && f.vhash[0] != g.vhash[0] && f.vhash[1] != g.vhash[1],
          "score_pre and score_post are part of the hash");
    CHECK(pr.vhash[0] != g.vhash[0] && pr.vhash[1] != g.vhash[1], "score_pre's text is part of the hash");
    CHECK(mx.vhash[0] != g.vhash[0] && mx.vhash[1] != g.vhash[1] && mx.vhash[0] != mx2.vhash[0],
          "the fixed max and its value are part of the hash");
    CHECK(gp.vhash[0] != g0.vhash[0] && gp.vhash[1] != g0.vhash[1] && gp.vhash[0] != gp2.vhash[0] &&
              gp.vhash[1] != gp2.vhash[1], "score_grad_pre and its text are part of the hash");
    char nm[128];
    al_flash_spec_name(&b, nm, sizeof nm);
    CHECK(strstr(nm, "fwd d64 bf16 nomask variant ") == nm && strstr(nm, " blockmask") != NULL, "name '%s'", nm);
    char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
    int n = al_flash_spec_options(&b, opts), found = 0;
    for (int i = 0; i < n; i++) found |= strcmp(opts[i], "-DAL_BLOCK_MASK=1") == 0;
    CHECK(found, "options lack -DAL_BLOCK_MASK=1");
}

/* ---- NVRTC (no GPU) ----------------------------------------------------------------------------------- */
static nvrtc_api nv;

/* The hand-written variant the NVRTC test compiles: soft-capping at 15 plus a relative-position bias
 * (capture 1, f32 [h, 1023]) with its gradient, and a document mask (capture 0, i32 [b, 512]). */
#define NV_SCORE "15.0f * tanhf(score * (1.0f / 15.0f)) + ((const float *)AL_CAP(1))[h * 1023 + (kv_idx - q_idx + 511)]"
#define NV_GRAD "grad * (1.0f - tanhf(score * (1.0f / 15.0f)) * tanhf(score * (1.0f / 15.0f)))"
#define NV_MASK "((const int *)AL_CAP(0))[b * 512 + q_idx] == ((const int *)AL_CAP(0))[b * 512 + kv_idx]"
#define NV_CAPG "atomicAdd(AL_CAP_GRAD(1) + h * 1023 + (kv_idx - q_idx + 511), grad)"
#define NV_PRELUDE "static __device__ __forceinline__ float al_test_unused(float x) { return x; }"

typedef struct nv_job {
    al_flash_spec spec;
    int sm90;              /* 0 stage 1; 1 the Hopper forward; 2 / 3 the Hopper backward's dK/dV / dQ kernel */
    /* the hooks (NULL: the NV_* ones) */
    const char *score, *grad, *mask, *capg, *prelude;
    int built;             /* the source and options were made (ATTNLAB_TEST_NVRTC=0 stops there) */
    nvrtc_result r;
} nv_job;

static const char *nv_file(const nv_job *j) {
    return j->sm90 >= 2 ? al_flash_sm90_bwd_file() : j->sm90 ? al_flash_sm90_spec_file() : al_flash_spec_file(&j->spec);
}
static void nv_name(const nv_job *j, char *nm, size_t n) {
    if (j->sm90 >= 2) al_flash_sm90_bwd_name(&j->spec, j->sm90 - 2, nm, n);
    else if (j->sm90) al_flash_sm90_spec_name(&j->spec, nm, n);
    else al_flash_spec_name(&j->spec, nm, n);
}
/* a job with the NV_* hooks (capture_grad in backward kinds) */
static void nv_std(nv_job *j, int kind, int sm90, int d, int mask, int block_mask) {
    memset(j, 0, sizeof *j);
    j->sm90 = sm90;
    j->spec.kind = kind;
    j->spec.d = d;
    j->spec.bf16 = 1;
    j->spec.mask = mask;
    j->score = NV_SCORE;
    j->grad = NV_GRAD;
    j->mask = NV_MASK;
    j->capg = kind == AL_FLASH_BWD ? NV_CAPG : NULL;
    j->prelude = NV_PRELUDE;
    const al_flash_hooks hk = {j->score, j->grad, j->mask, j->capg, j->prelude, NULL, 0.0, 0, 0.0, NULL};
    al_flash_spec_set_variant(&j->spec, &hk, block_mask);
}

static void nv_compile_job(nv_job *j, const char *kdir, int compile) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", kdir, nv_file(j));
    char *file = test_slurp(path);
    const al_flash_hooks hk = {j->score, j->grad, j->mask, j->capg, j->prelude, NULL, 0.0, 0, 0.0, NULL};
    char *pre = al_flash_variant_source(&hk, nv_file(j));
    char *src = file && pre ? malloc(strlen(pre) + strlen(file) + 2) : NULL;
    if (!src) {
        memset(&j->r, 0, sizeof j->r);
        snprintf(j->r.msg, sizeof j->r.msg, "cannot read %s", path);
    } else {
        /* exactly what nvrtc_cache.cu compiles: prefix, a newline, the file */
        sprintf(src, "%s\n%s", pre, file);
        char opts[AL_FLASH_MAX_OPTS][AL_FLASH_OPT_LEN];
        const char *o[AL_FLASH_MAX_OPTS], *names[4];
        int n = j->sm90 >= 2 ? al_flash_sm90_bwd_options(&j->spec, j->sm90 - 2, opts)
              : j->sm90     ? al_flash_sm90_spec_options(&j->spec, opts)
                            : al_flash_spec_options(&j->spec, opts);
        for (int i = 0; i < n; i++) o[i] = opts[i];
        int nf = 1;
        if (j->sm90 >= 2) names[0] = al_flash_sm90_bwd_function(j->sm90 - 2);
        else if (j->sm90) names[0] = al_flash_sm90_function();
        else nf = al_flash_spec_functions(&j->spec, names);
        j->built = n > 0 && nf > 0 && strstr(src, "#define AL_VARIANT") != NULL;
        if (compile) nvrtc_compile_source(&nv, src, nv_file(j), "sm_90a", kdir, o, n, names, nf, &j->r);
    }
    free(src);
    free(pre);
    free(file);
}

/* ---- the GPU cases (declared here: the NVRTC test compiles their Hopper backward too) ------------------- */
enum { V_SOFTCAP, V_DOC, V_RELPOS, V_WINDOW, V_COUNT };

typedef struct gcase {
    int kind;
    int B, H, HG, S, D;      /* sq = skv = S, bshd */
    int causal;
    double scale;
    double cap;              /* soft-capping */
    int *doc;                /* [B*S] document ids */
    double *rel;             /* [H*(2S-1)] relative-position bias */
    int window;              /* kv in (q - window, q], and rows [64, 128) fully masked */
} gcase;

/* case `kind` with its random data (case_free releases it) */
static void case_init(int kind, gcase *c) {
    static const gcase cases[V_COUNT] = {
        {V_SOFTCAP, 2, 4, 2, 200, 64, 1, 0.125, 1.5, NULL, NULL, 0},
        {V_DOC, 2, 4, 4, 200, 64, 0, 0.125, 0, NULL, NULL, 0},
        {V_RELPOS, 2, 4, 2, 200, 128, 0, 0.08838834764831845, 0, NULL, NULL, 0},   /* 1 / sqrt(128) */
        {V_WINDOW, 2, 2, 2, 300, 64, 1, 0.125, 0, NULL, NULL, 100},
    };
    *c = cases[kind];
    if (kind == V_DOC) {
        c->doc = malloc(sizeof(int) * c->B * c->S);
        srand(7);
        for (int b = 0; b < c->B; b++) {
            int id = 0;
            for (int i = 0; i < c->S; i++) {
                if (i > 0 && rand() % 37 == 0) id++;
                c->doc[b * c->S + i] = id + 10 * b;
            }
        }
    } else if (kind == V_RELPOS) {
        c->rel = malloc(sizeof(double) * c->H * (2 * c->S - 1));
        srand(11);
        for (int i = 0; i < c->H * (2 * c->S - 1); i++) c->rel[i] = (double)(float)((rand() % 2001 - 1000) / 1000.0);
    }
}
static void case_free(gcase *c) {
    free(c->doc);
    free(c->rel);
    c->doc = NULL;
    c->rel = NULL;
}

/* The hook snippets of a case (what variants.lua would generate for it), pointed to by var. */
typedef struct ghooks { char score[256], sgrad[256], mask[256], capg[256]; } ghooks;
static void case_hooks(const gcase *c, ghooks *k, al_attn_variant *var) {
    const int S = c->S;
    if (c->kind == V_SOFTCAP) {
        snprintf(k->score, sizeof k->score, "%.3ff * tanhf(score * (1.0f / %.3ff))", c->cap, c->cap);
        snprintf(k->sgrad, sizeof k->sgrad, "grad * (1.0f - tanhf(score * (1.0f / %.3ff)) * tanhf(score * (1.0f / %.3ff)))",
                 c->cap, c->cap);
        var->score_mod = k->score;
        var->score_grad = k->sgrad;
    } else if (c->kind == V_DOC) {
        snprintf(k->mask, sizeof k->mask, "((const int *)AL_CAP(0))[b * %d + q_idx] == ((const int *)AL_CAP(0))[b * %d + kv_idx]",
                 S, S);
        var->mask_mod = k->mask;
    } else if (c->kind == V_RELPOS) {
        snprintf(k->score, sizeof k->score, "score + ((const float *)AL_CAP(0))[h * %d + (kv_idx - q_idx + %d)]", 2 * S - 1,
                 S - 1);
        snprintf(k->capg, sizeof k->capg, "atomicAdd(AL_CAP_GRAD(0) + h * %d + (kv_idx - q_idx + %d), grad)", 2 * S - 1,
                 S - 1);
        var->score_mod = k->score;
        var->capture_grad = k->capg;
    } else {
        snprintf(k->mask, sizeof k->mask, "q_idx - kv_idx < %d && (q_idx < 64 || q_idx >= 128)", c->window);
        var->mask_mod = k->mask;
    }
}

/* The Hopper backward's specialisation of a case (attn_flash_sm90.cu's sm90_spec, kind = backward) */
static void case_bwd_spec(const gcase *c, const al_attn_variant *var, int block_mask, al_flash_spec *s) {
    memset(s, 0, sizeof *s);
    s->kind = AL_FLASH_BWD;
    s->d = c->D;
    s->bf16 = 1;
    s->mask = c->causal ? AL_FLASH_MASK_CAUSAL : AL_FLASH_MASK_NONE;
    al_flash_hooks hk = {var->score_mod, var->score_grad, var->mask_mod, var->capture_grad, var->prelude,
                         var->score_pre, var->score_pre ? var->score_post : 0.0, 0, 0.0, var->score_grad_pre};
    al_flash_hooks_set_bounds(&hk, var->score_bounded, var->score_lo, var->score_hi);
    al_flash_spec_set_variant(s, &hk, block_mask);
}

static void test_nvrtc_variant_kernels(void) {
    char why[512];
    const char *tn = getenv("ATTNLAB_TEST_NVRTC");
    const int compile = !(tn && strcmp(tn, "0") == 0);   /* (libnvrtc is not even loaded without) */
    if (compile && !nvrtc_load(&nv, why, sizeof why)) {
        CHECK(strstr(why, "lacks") == NULL, "%s", why);   /* a broken library fails; a missing one skips */
        printf("  nvrtc: %s: NVRTC compiles skipped\n", why);
        return;
    }
    const char *kd = getenv("ATTNLAB_KERNEL_DIR");
    const char *kdir = kd && *kd ? kd : "kernels";
    /* fwd and bwd at d = 64 and 128 (bf16): causal + block mask; and one without a block mask; the Hopper
     * forward with the same hooks at d = 64 / 128 / 256 (block mask at 128); both Hopper backward kernels
     * with the same hooks at d = 64 / 128 (causal + block mask); and the Hopper backward of every GPU case
     * below (the window case also with its block mask) */
    nv_job jobs[32];
    memset(jobs, 0, sizeof jobs);
    int nj = 0;
    for (int kind = 0; kind < 2; kind++)
        for (int d = 64; d <= 128; d *= 2) nv_std(&jobs[nj++], kind, 0, d, AL_FLASH_MASK_CAUSAL, 1);
    nv_std(&jobs[nj++], AL_FLASH_FWD, 0, 64, AL_FLASH_MASK_NONE, 0);
    for (int d = 64; d <= 256; d *= 2)
        nv_std(&jobs[nj++], AL_FLASH_FWD, 1, d, d == 128 ? AL_FLASH_MASK_CAUSAL : AL_FLASH_MASK_NONE, d != 64);
    for (int d = 64; d <= 128; d *= 2)
        for (int role = 0; role < 2; role++) nv_std(&jobs[nj++], AL_FLASH_BWD, 2 + role, d, AL_FLASH_MASK_CAUSAL, 1);
    ghooks hk[V_COUNT];
    for (int k = 0; k < V_COUNT; k++) {
        gcase c;
        case_init(k, &c);
        al_attn_variant var;
        memset(&var, 0, sizeof var);
        case_hooks(&c, &hk[k], &var);
        for (int bm = 0; bm <= (k == V_WINDOW); bm++)
            for (int role = 0; role < 2; role++) {
                nv_job *j = &jobs[nj++];
                memset(j, 0, sizeof *j);
                j->sm90 = 2 + role;
                case_bwd_spec(&c, &var, bm, &j->spec);
                j->score = var.score_mod;
                j->grad = var.score_grad;
                j->mask = var.mask_mod;
                j->capg = var.capture_grad;
            }
        case_free(&c);
    }
    if (!compile) {
        for (int i = 0; i < nj; i++) {
            char nm[128];
            nv_name(&jobs[i], nm, sizeof nm);
            nv_compile_job(&jobs[i], kdir, 0);
            CHECK(jobs[i].built, "%s: no source or options (%s)", nm, jobs[i].r.msg);
        }
        printf("  nvrtc: %d variant sources built; compiles skipped (ATTNLAB_TEST_NVRTC=0)\n", nj);
        return;
    }
    double t0 = test_now_ms();
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
    for (int i = 0; i < nj; i++) nv_compile_job(&jobs[i], kdir, 1);
    double total = test_now_ms() - t0;
    for (int i = 0; i < nj; i++) {
        char nm[128];
        nv_name(&jobs[i], nm, sizeof nm);
        CHECK(jobs[i].r.ok, "%s: %s", nm, jobs[i].r.msg);
        CHECK(!jobs[i].r.ok || jobs[i].r.names_found, "%s: the cubin lacks a kernel name", nm);
        /* the Hopper kernels must not spill with the hooks in (consumers at 216 / 224 registers) */
        if (jobs[i].sm90 && jobs[i].r.ok && jobs[i].r.spill[0] >= 0)
            CHECK(jobs[i].r.spill[0] == 0, "%s: spills %d bytes", nm, jobs[i].r.spill[0]);
        if (jobs[i].sm90 && jobs[i].r.ok)
            CHECK(!jobs[i].r.serialized, "%s: ptxas serialised its wgmma (a C75xx \"instructions are serialized\" warning)", nm);
        if (jobs[i].r.ok)
            printf("  nvrtc: %-66s %6.0f ms  %d regs, %d B spill\n", nm, jobs[i].r.ms, jobs[i].r.regs[0], jobs[i].r.spill[0]);
    }
    printf("  nvrtc: %d variant compiles in %.1f s wall\n", nj, total / 1e3);
}

/* ---- GPU: flash backend against a naive oracle in double ----------------------------------------------- */

static int g_keep(const gcase *c, int b, int h, int i, int j) {
    if (c->causal && j > i) return 0;
    if (c->kind == V_DOC) return c->doc[b * c->S + i] == c->doc[b * c->S + j];
    if (c->kind == V_WINDOW) return i - j < c->window && (i < 64 || i >= 128);
    return 1;
}
static double g_score(const gcase *c, int b, int h, int i, int j, double s) {
    if (c->kind == V_SOFTCAP) return c->cap * tanh(s / c->cap);
    if (c->kind == V_RELPOS) return s + c->rel[h * (2 * c->S - 1) + (j - i + c->S - 1)];
    return s;
}
static double g_dscore(const gcase *c, double s) {   /* d(new)/d(score) */
    if (c->kind == V_SOFTCAP) { double t = tanh(s / c->cap); return 1.0 - t * t; }
    return 1.0;
}

/* q/k/v/dout in bshd, double; out, lse, dq, dk, dv, drel computed */
static void oracle(const gcase *c, const double *q, const double *k, const double *v, const double *dout, double *out,
                   double *lse, double *dq, double *dk, double *dv, double *drel) {
    const int B = c->B, H = c->H, HG = c->HG, S = c->S, D = c->D, G = H / HG;
    double *p = malloc(sizeof(double) * (size_t)S), *sc = malloc(sizeof(double) * (size_t)S);
    memset(dq, 0, sizeof(double) * (size_t)B * S * H * D);
    memset(dk, 0, sizeof(double) * (size_t)B * S * HG * D);
    memset(dv, 0, sizeof(double) * (size_t)B * S * HG * D);
    if (drel) memset(drel, 0, sizeof(double) * (size_t)H * (2 * S - 1));
#define QI(b, i, h, d) ((((size_t)(b) * S + (i)) * H + (h)) * D + (d))
#define KI(b, j, h, d) ((((size_t)(b) * S + (j)) * HG + (h)) * D + (d))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const int hk = h / G;
                double m = -INFINITY;
                for (int j = 0; j < S; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++) s += q[QI(b, i, h, d)] * k[KI(b, j, hk, d)];
                    s *= c->scale;
                    sc[j] = s;
                    p[j] = g_keep(c, b, h, i, j) ? g_score(c, b, h, i, j, s) : -INFINITY;
                    if (p[j] > m) m = p[j];
                }
                double l = 0;
                for (int j = 0; j < S; j++) { p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - m); l += p[j]; }
                lse[((size_t)b * H + h) * S + i] = l > 0 ? m + log(l) : -INFINITY;
                for (int j = 0; j < S; j++) p[j] = l > 0 ? p[j] / l : 0.0;
                double dsum = 0;
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int j = 0; j < S; j++) o += p[j] * v[KI(b, j, hk, d)];
                    out[QI(b, i, h, d)] = o;
                    dsum += o * dout[QI(b, i, h, d)];
                }
                for (int j = 0; j < S; j++) {
                    if (p[j] == 0.0) continue;
                    double dp = 0;
                    for (int d = 0; d < D; d++) dp += dout[QI(b, i, h, d)] * v[KI(b, j, hk, d)];
                    const double ds_new = p[j] * (dp - dsum);
                    if (drel) drel[h * (2 * S - 1) + (j - i + S - 1)] += ds_new;
                    const double ds = ds_new * g_dscore(c, sc[j]) * c->scale;
                    for (int d = 0; d < D; d++) {
                        dq[QI(b, i, h, d)] += ds * k[KI(b, j, hk, d)];
                        dk[KI(b, j, hk, d)] += ds * q[QI(b, i, h, d)];
                        dv[KI(b, j, hk, d)] += p[j] * dout[QI(b, i, h, d)];
                    }
                }
            }
#undef QI
#undef KI
    free(p);
    free(sc);
}

/* A bf16 CUDA tensor of random normal values; vals receives them exactly (after bf16 rounding). */
static void dev_random(al_tensor *t, int32_t ndim, const int64_t *size, double *vals, int64_t n) {
    al_tensor f, h;
    memset(&f, 0, sizeof f);
    memset(&h, 0, sizeof h);
    CHECK_OK(al_tensor_empty(&f, ndim, size, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_(&f, AL_RANDOM_NORMAL));
    CHECK_OK(al_tensor_to(&h, &f, AL_DTYPE_BF16, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_read_f64(&h, vals, n));
    CHECK_OK(al_tensor_to(t, &h, AL_DTYPE_BF16, AL_DEVICE_CUDA, 0));
    al_tensor_release(&f);
    al_tensor_release(&h);
}

/* A CUDA tensor of dtype holding vals. */
static void dev_from(al_tensor *t, int32_t ndim, const int64_t *size, int32_t dtype, const double *vals, int64_t n) {
    al_tensor h;
    memset(&h, 0, sizeof h);
    CHECK_OK(al_tensor_empty(&h, ndim, size, dtype, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_write_f64(&h, vals, n));
    CHECK_OK(al_tensor_to(t, &h, dtype, AL_DEVICE_CUDA, 0));
    al_tensor_release(&h);
}

/* |got - want| <= tol + tol * |want| everywhere (TE's atol = rtol); -inf exactly where want has it. */
static void close_to(const char *what, const al_tensor *t, const double *want, int64_t n, double tol) {
    double *got = malloc(sizeof(double) * (size_t)n);
    CHECK_OK(al_tensor_read_f64(t, got, n));
    double worst = -1;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(want[i])) {
            CHECK(got[i] == want[i], "%s[%lld]: %g where the oracle has %g", what, (long long)i, got[i], want[i]);
            continue;
        }
        const double e = fabs(got[i] - want[i]) - tol * fabs(want[i]);
        if (!(e <= worst) || isnan(got[i])) { worst = isnan(got[i]) ? INFINITY : e; at = i; }
    }
    CHECK(worst <= tol, "%s: element %lld: gpu %.6g, oracle %.6g (beyond atol = rtol = %g)", what, (long long)at,
          at >= 0 ? got[at] : 0.0, at >= 0 ? want[at] : 0.0, tol);
    free(got);
}

/* max |a - b| between two tensors of one shape */
static double diff_of(const al_tensor *a, const al_tensor *b) {
    double r = -1;
    CHECK_OK(al_max_abs_diff(a, b, &r));
    return r;
}

typedef struct gres { al_tensor out, lse, dq, dk, dv, drel; } gres;
static void gres_free(gres *r) {
    al_tensor_release(&r->out);
    al_tensor_release(&r->lse);
    al_tensor_release(&r->dq);
    al_tensor_release(&r->dk);
    al_tensor_release(&r->dv);
    al_tensor_release(&r->drel);
}

/* Forward + backward of one case through the flash backend (forced, so a decline is an error). */
static void run_flash(const gcase *c, const al_attn_variant *var, const al_tensor *q, const al_tensor *k,
                      const al_tensor *v, const al_tensor *dout, int deterministic, gres *r) {
    memset(r, 0, sizeof *r);
    al_attn_params p;
    al_attn_params_init(&p);
    p.qkv_format = AL_ATTN_FORMAT_BSHD;
    p.mask_type = c->causal ? AL_ATTN_MASK_CAUSAL : AL_ATTN_MASK_NO_MASK;
    p.softmax_scale = c->scale;
    p.deterministic = deterministic;
    snprintf(p.backend, sizeof p.backend, "flash");
    al_attn_inputs in;
    memset(&in, 0, sizeof in);
    in.q = q;
    in.k = k;
    in.v = v;
    in.variant = var;
    char buf[4096];
    p.backend[0] = 0;
    const char *be = al_attn_explain(&p, &in, buf, sizeof buf);
    CHECK(be && strcmp(be, "flash") == 0, "flash must serve the variant:\n%s", buf);
    snprintf(p.backend, sizeof p.backend, "flash");
    CHECK_OK(al_attn_forward(&p, &in, &r->out, &r->lse, NULL));
    if (!r->out.storage) return;
    CHECK_OK(al_tensor_empty(&r->dq, 4, q->size, AL_DTYPE_BF16, AL_DEVICE_CUDA, 0));
    CHECK_OK(al_tensor_empty(&r->dk, 4, k->size, AL_DTYPE_BF16, AL_DEVICE_CUDA, 0));
    CHECK_OK(al_tensor_empty(&r->dv, 4, v->size, AL_DTYPE_BF16, AL_DEVICE_CUDA, 0));
    CHECK_OK(al_attn_backward(&p, &in, &r->out, dout, &r->lse, &r->dq, &r->dk, &r->dv, NULL, NULL));
}

/* dq, dk, dv (and the relative-bias gradient, when the case has one) against the oracle */
static void check_grads(const char *name, const gres *r, const al_tensor *tcapg, const double *dq, const double *dk,
                        const double *dv, const double *drel, int64_t nq, int64_t nk, int64_t nrel) {
    const double tol = 1.5e-2;
    char what[200];
    snprintf(what, sizeof what, "%s dq", name);
    close_to(what, &r->dq, dq, nq, tol);
    snprintf(what, sizeof what, "%s dk", name);
    close_to(what, &r->dk, dk, nk, tol);
    snprintf(what, sizeof what, "%s dv", name);
    close_to(what, &r->dv, dv, nk, tol);
    if (drel) {   /* sums over many elements: atol 3e-2 * the largest entry */
        double mx = 0;
        for (int64_t i = 0; i < nrel; i++) mx = fmax(mx, fabs(drel[i]));
        CHECK(mx > 1e-3, "the relative-position gradient is ~0 (%g): the test would prove nothing", mx);
        snprintf(what, sizeof what, "%s d(rel bias)", name);
        close_to(what, tcapg, drel, nrel, 3e-2 * (mx > 1 ? mx : 1));
    }
}

static int32_t g_cc_major;   /* device 0's compute capability (major) */

/* The flash log (al_cuda_backend_info) must name both Hopper backward kernels of this variant, with the
 * labels attn_flash_sm90.cu gives them ("bwd-sm90-dkdv d64 bf16 causal-tl variant <hash>[ blockmask]"):
 * the log lists each specialisation when the process compiles or loads it, i.e. at its first launch. */
static void expect_hopper_bwd(const gcase *c, const al_attn_variant *var, int block_mask, const char *name) {
    al_flash_spec spec;
    case_bwd_spec(c, var, block_mask, &spec);
    static char info[65536];
    CHECK(al_cuda_backend_info("flash", info, sizeof info) >= 0, "al_cuda_backend_info: %s", al_last_error());
    for (int role = 0; role < 2; role++) {
        char label[128];
        al_flash_sm90_bwd_name(&spec, role, label, sizeof label);
        CHECK(strstr(info, label) != NULL, "%s: the flash log lacks '%s' (the Hopper backward did not run):\n%s", name,
              label, info);
    }
}

static void gpu_case(gcase *c, const char *name) {
    const int B = c->B, H = c->H, HG = c->HG, S = c->S, D = c->D;
    const int64_t nq = (int64_t)B * S * H * D, nk = (int64_t)B * S * HG * D, nl = (int64_t)B * H * S;
    const int64_t qs[4] = {B, S, H, D}, ks[4] = {B, S, HG, D};
    double *q = malloc(sizeof(double) * nq), *k = malloc(sizeof(double) * nk), *v = malloc(sizeof(double) * nk);
    double *dout = malloc(sizeof(double) * nq), *out = malloc(sizeof(double) * nq), *lse = malloc(sizeof(double) * nl);
    double *dq = malloc(sizeof(double) * nq), *dk = malloc(sizeof(double) * nk), *dv = malloc(sizeof(double) * nk);
    const int64_t nrel = (int64_t)H * (2 * S - 1);
    double *drel = c->kind == V_RELPOS ? malloc(sizeof(double) * nrel) : NULL;
    al_tensor tq, tk, tv, tdo, tcap, tcapg, tbm;
    memset(&tcap, 0, sizeof tcap);
    memset(&tcapg, 0, sizeof tcapg);
    memset(&tbm, 0, sizeof tbm);
    dev_random(&tq, 4, qs, q, nq);
    dev_random(&tk, 4, ks, k, nk);
    dev_random(&tv, 4, ks, v, nk);
    dev_random(&tdo, 4, qs, dout, nq);

    al_attn_variant var;
    memset(&var, 0, sizeof var);
    ghooks hk;
    case_hooks(c, &hk, &var);
    if (c->kind == V_DOC) {
        double *ids = malloc(sizeof(double) * B * S);
        for (int i = 0; i < B * S; i++) ids[i] = c->doc[i];
        const int64_t ds[2] = {B, S};
        dev_from(&tcap, 2, ds, AL_DTYPE_I32, ids, (int64_t)B * S);
        free(ids);
        var.ncaptures = 1;
        var.captures[0] = &tcap;
    } else if (c->kind == V_RELPOS) {
        const int64_t rs[2] = {H, 2 * S - 1};
        dev_from(&tcap, 2, rs, AL_DTYPE_F32, c->rel, nrel);
        CHECK_OK(al_tensor_empty(&tcapg, 2, rs, AL_DTYPE_F32, AL_DEVICE_CUDA, 0));
        CHECK_OK(al_tensor_fill_(&tcapg, 0.0));
        var.ncaptures = 1;
        var.captures[0] = &tcap;
        var.capture_grads[0] = &tcapg;
    }
    oracle(c, q, k, v, dout, out, lse, dq, dk, dv, drel);

    char what[160];
    gres r;
    run_flash(c, &var, &tq, &tk, &tv, &tdo, 0, &r);
    const double tol = 1.5e-2;
    if (r.out.storage) {
        snprintf(what, sizeof what, "%s out", name);
        close_to(what, &r.out, out, nq, tol);
        snprintf(what, sizeof what, "%s lse", name);
        close_to(what, &r.lse, lse, nl, 1e-3);
        check_grads(name, &r, &tcapg, dq, dk, dv, drel, nq, nk, nrel);
    }
    /* which backward ran: on sm_90 the Hopper one (d = 64 / 128), whose two variant kernels the flash log
     * names when this process first compiles or loads them (this variant's first backward is the one above) */
    const int hopper = g_cc_major == 9 && (D == 64 || D == 128);
    if (hopper && r.out.storage) expect_hopper_bwd(c, &var, 0, name);

    /* the same backward on the stage-1 kernels (ATTNLAB_FLASH_SM90_BWD=0): the same oracle, every gradient,
     * capture gradients included (their accumulator zeroed again: the kernels only add) */
    {
        if (var.capture_grads[0]) CHECK_OK(al_tensor_fill_(&tcapg, 0.0));
        setenv("ATTNLAB_FLASH_SM90_BWD", "0", 1);
        gres r0;
        run_flash(c, &var, &tq, &tk, &tv, &tdo, 0, &r0);
        unsetenv("ATTNLAB_FLASH_SM90_BWD");
        if (r0.out.storage) {
            snprintf(what, sizeof what, "%s [ATTNLAB_FLASH_SM90_BWD=0]", name);
            check_grads(what, &r0, &tcapg, dq, dk, dv, drel, nq, nk, nrel);
        }
        gres_free(&r0);
    }

    /* the same variant with the Hopper forward switched off (ATTNLAB_FLASH_SM90_VARIANTS=0: the stage-1
     * kernel serves it; on sm_90 the run above used the Hopper forward, elsewhere both are stage 1) */
    {
        if (var.capture_grads[0]) CHECK_OK(al_tensor_fill_(&tcapg, 0.0));
        setenv("ATTNLAB_FLASH_SM90_VARIANTS", "0", 1);
        gres r1;
        run_flash(c, &var, &tq, &tk, &tv, &tdo, 0, &r1);
        unsetenv("ATTNLAB_FLASH_SM90_VARIANTS");
        if (r1.out.storage) {
            snprintf(what, sizeof what, "%s stage-1 out", name);
            close_to(what, &r1.out, out, nq, tol);
            snprintf(what, sizeof what, "%s stage-1 lse", name);
            close_to(what, &r1.lse, lse, nl, 1e-3);
        }
        gres_free(&r1);
    }

    /* the block mask of mask_mod at 64 x 64 (the stage-1 forward and backward: the sm90 tiles are 128 rows)
     * and at 128 x 128 (the sm90 forward and backward on sm_90), 0 empty, 1 partial, 2 full, b and h
     * broadcast */
    for (int bsz = 64; c->kind == V_WINDOW && bsz <= 128; bsz *= 2) {
        const int NB = (S + bsz - 1) / bsz;
        double *bmv = malloc(sizeof(double) * NB * NB);
        int counts[3] = {0, 0, 0};
        for (int mb = 0; mb < NB; mb++)
            for (int nb = 0; nb < NB; nb++) {
                int kept = 0, total = 0;
                for (int i = mb * bsz; i < S && i < mb * bsz + bsz; i++)
                    for (int j = nb * bsz; j < S && j < nb * bsz + bsz; j++) {
                        kept += i - j < c->window && (i < 64 || i >= 128);
                        total++;
                    }
                int val = kept == 0 ? 0 : kept == total ? 2 : 1;
                bmv[mb * NB + nb] = val;
                counts[val]++;
            }
        CHECK(counts[0] > 0 && counts[1] > 0 && counts[2] > 0, "the block mask should have every kind of block: %d %d %d",
              counts[0], counts[1], counts[2]);
        const int64_t bs[4] = {1, 1, NB, NB};
        dev_from(&tbm, 4, bs, AL_DTYPE_U8, bmv, (int64_t)NB * NB);
        free(bmv);
        al_attn_variant vb = var;
        vb.block_mask = &tbm;
        vb.block_m = bsz;
        vb.block_n = bsz;
        gres rb, rd;
        /* both runs on one forward and one backward kernel, so they must agree bit for bit: at 64 x 64 the
         * block mask sends the call to the stage-1 forward and backward, so the run without one must go
         * there too */
        if (bsz == 64) {
            setenv("ATTNLAB_FLASH_SM90_VARIANTS", "0", 1);
            setenv("ATTNLAB_FLASH_SM90_BWD", "0", 1);
        }
        run_flash(c, &vb, &tq, &tk, &tv, &tdo, 1, &rb);
        run_flash(c, &var, &tq, &tk, &tv, &tdo, 1, &rd);
        unsetenv("ATTNLAB_FLASH_SM90_VARIANTS");
        unsetenv("ATTNLAB_FLASH_SM90_BWD");
        if (bsz == 128 && hopper && rb.out.storage) expect_hopper_bwd(c, &vb, 1, name);   /* its block-mask kernels ran */
        if (rb.out.storage && rd.out.storage && rb.dq.storage && rd.dq.storage) {
            snprintf(what, sizeof what, "%s+blockmask%d out", name, bsz);
            close_to(what, &rb.out, out, nq, tol);
            snprintf(what, sizeof what, "%s+blockmask%d lse", name, bsz);
            close_to(what, &rb.lse, lse, nl, 1e-3);
            snprintf(what, sizeof what, "%s+blockmask%d dq", name, bsz);
            close_to(what, &rb.dq, dq, nq, tol);
            snprintf(what, sizeof what, "%s+blockmask%d dk", name, bsz);
            close_to(what, &rb.dk, dk, nk, tol);
            snprintf(what, sizeof what, "%s+blockmask%d dv", name, bsz);
            close_to(what, &rb.dv, dv, nk, tol);
            /* skipped tiles contribute exact zeros and full blocks keep what mask_mod keeps: bit-identical
             * (deterministic backward: dQ sums in a fixed order) */
            CHECK(diff_of(&rb.out, &rd.out) == 0.0, "block mask %d changes out by %g", bsz, diff_of(&rb.out, &rd.out));
            CHECK(diff_of(&rb.dq, &rd.dq) == 0.0, "block mask %d changes dq by %g", bsz, diff_of(&rb.dq, &rd.dq));
            CHECK(diff_of(&rb.dk, &rd.dk) == 0.0, "block mask %d changes dk by %g", bsz, diff_of(&rb.dk, &rd.dk));
            CHECK(diff_of(&rb.dv, &rd.dv) == 0.0, "block mask %d changes dv by %g", bsz, diff_of(&rb.dv, &rd.dv));
            /* the skipped rows [64, 128): O = 0 and LSE = -inf */
            double *o = malloc(sizeof(double) * nq), *l = malloc(sizeof(double) * nl);
            CHECK_OK(al_tensor_read_f64(&rb.out, o, nq));
            CHECK_OK(al_tensor_read_f64(&rb.lse, l, nl));
            int bad = 0;
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++)
                    for (int i = 64; i < 128; i++) {
                        bad += l[((size_t)b * H + h) * S + i] != -INFINITY;
                        for (int d = 0; d < D; d++) bad += o[(((size_t)b * S + i) * H + h) * D + d] != 0.0;
                    }
            CHECK(bad == 0, "%d values of the fully skipped rows are not O = 0 / LSE = -inf", bad);
            free(o);
            free(l);
        }
        gres_free(&rb);
        gres_free(&rd);
        al_tensor_release(&tbm);
    }
    gres_free(&r);
    al_tensor *ts[] = {&tq, &tk, &tv, &tdo, &tcap, &tcapg, &tbm};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) al_tensor_release(ts[i]);
    free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv); free(drel);
}

static void run_case(int kind, const char *name) {
    gcase c;
    case_init(kind, &c);
    gpu_case(&c, name);
    case_free(&c);
}
static void test_gpu_softcap(void) { run_case(V_SOFTCAP, "softcap+causal d64"); }
static void test_gpu_document_mask(void) { run_case(V_DOC, "document mask d64"); }
static void test_gpu_relpos_bias(void) { run_case(V_RELPOS, "relpos bias d128 gqa"); }
static void test_gpu_sliding_window_block_mask(void) { run_case(V_WINDOW, "sliding window d64"); }

int main(void) {
    RUN(test_validation);
    RUN(test_backend_choice);
    RUN(test_variant_source);
    RUN(test_nvrtc_variant_kernels);
    if (al_cuda_device_count() <= 0) {
        al_clear_error();
        printf("c-test flash_variant: GPU checks skipped: no GPU\n");
        printf("c-test flash_variant: %d passed, %d failed, 4 skipped (no GPU)\n", t_passed, t_failed);
        return t_failed ? 1 : 0;
    }
    int32_t minor = 0;
    if (al_cuda_device_info(0, NULL, 0, &g_cc_major, &minor, NULL) != AL_OK) {
        al_clear_error();
        g_cc_major = 0;
    }
    RUN(test_gpu_softcap);
    RUN(test_gpu_document_mask);
    RUN(test_gpu_relpos_bias);
    RUN(test_gpu_sliding_window_block_mask);
    return SUMMARY("flash_variant");
}
