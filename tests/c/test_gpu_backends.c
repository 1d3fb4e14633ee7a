/*
 * test_gpu_backends.c — the GPU backends (unfused: cuBLASLt + our softmax kernels; fused: cuDNN SDPA;
 * flash: our kernels) against the cpu backend, from C: forward (out, lse) and backward (dq, dk, dv, and
 * dbias where there is a bias) on a handful of configurations that touch each backend's main paths.
 *
 * It exists so that NVIDIA's compute-sanitizer can check every backend on a GPU
 * (scripts/gpu_sanitize.sh runs it, with test_flash_variant and flash_sm90_check): LuaJIT processes
 * die under the sanitizer (docs/RELIABILITY.md), so the busted specs cannot carry that check. The
 * specs remain the wide oracle tests; this is the sanitizer's workload, and an oracle test of its own.
 *
 * Inputs: random normal values rounded to the compute dtype, drawn on the CPU, so the cpu backend and
 * the GPU backend see identical numbers. Tolerance (TE's): atol = rtol = 1.5e-2 (bf16), 1e-3 outputs /
 * 2.5e-3 gradients (f16). Without a GPU the harness checks itself: every case runs with the cpu backend
 * on both sides (the plumbing: shapes, thd offsets, bias, gradients), and the GPU part reports skipped.
 */
#include "test_main.h"
#include "excess.h"
#include <math.h>
#include <stdlib.h>

typedef struct cfg {
    const char *name;
    int32_t fmt;            /* AL_ATTN_FORMAT_BSHD / SBHD / THD */
    int32_t mask;           /* AL_ATTN_MASK_* */
    int32_t dtype;          /* AL_DTYPE_BF16 / F16 */
    int b, h, hg, sq, skv, d;
    int bias;               /* post_scale_bias [1, h, sq, skv] */
    const int *cu;          /* thd: cu_seqlens [b + 1] (q and kv alike) */
    int32_t grad_dtype;     /* dq / dk / dv's dtype (0: the inputs'): f32 sends the flash backward's gradient
                             * stores down their element-wise path (the row-block and pair paths need the
                             * kernel's 16-bit dtype) */
    const char *only;       /* NULL, or the one GPU backend the case runs on */
    int grad_pad;           /* > 0: the device's dq / dk / dv are views of rows d + grad_pad long (2: rows 4- but
                             * not 16-byte aligned, the flash backward's column-pair stores) */
} cfg;

static int32_t g_dev = AL_DEVICE_CUDA;   /* the second side's device (AL_DEVICE_CPU: harness self-check) */

/* a CPU tensor of random normal values in dtype, and its copy on g_dev */
static void pair_random(al_tensor *cpu, al_tensor *gpu, int32_t ndim, const int64_t *size, int32_t dtype) {
    al_tensor f;
    memset(&f, 0, sizeof f);
    CHECK_OK(al_tensor_empty(&f, ndim, size, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_random_(&f, AL_RANDOM_NORMAL));
    CHECK_OK(al_tensor_to(cpu, &f, dtype, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_to(gpu, cpu, dtype, g_dev, 0));
    al_tensor_release(&f);
}

static void shape_of(const cfg *c, int rows, int heads, int64_t *size, int32_t *ndim) {
    if (c->fmt == AL_ATTN_FORMAT_THD) {
        size[0] = c->cu[c->b];
        size[1] = heads;
        size[2] = c->d;
        *ndim = 3;
    } else if (c->fmt == AL_ATTN_FORMAT_SBHD) {
        size[0] = rows; size[1] = c->b; size[2] = heads; size[3] = c->d;
        *ndim = 4;
    } else {
        size[0] = c->b; size[1] = rows; size[2] = heads; size[3] = c->d;
        *ndim = 4;
    }
}

static void run_case(const cfg *c, const char *backend) {
    al_manual_seed(1234);
    const int32_t dt = c->dtype;
    int64_t qs[4], ks[4];
    int32_t nd = 0;
    shape_of(c, c->sq, c->h, qs, &nd);
    shape_of(c, c->skv, c->hg, ks, &nd);
    al_tensor qc, kc, vc, qg, kg, vg, doc, dog, bc, bg, cuc, cug;
    memset(&bc, 0, sizeof bc);
    memset(&bg, 0, sizeof bg);
    memset(&cuc, 0, sizeof cuc);
    memset(&cug, 0, sizeof cug);
    pair_random(&qc, &qg, nd, qs, dt);
    pair_random(&kc, &kg, nd, ks, dt);
    pair_random(&vc, &vg, nd, ks, dt);
    int64_t os[4];
    memcpy(os, qs, sizeof os);
    pair_random(&doc, &dog, nd, os, dt);
    if (c->bias) {
        const int64_t bs[4] = {1, c->h, c->sq, c->skv};
        pair_random(&bc, &bg, 4, bs, dt);
    }
    if (c->cu) {
        const int64_t cs[1] = {c->b + 1};
        CHECK_OK(al_tensor_empty(&cuc, 1, cs, AL_DTYPE_I32, AL_DEVICE_CPU, 0));
        double v[16];
        for (int i = 0; i <= c->b; i++) v[i] = c->cu[i];
        CHECK_OK(al_tensor_write_f64(&cuc, v, c->b + 1));
        CHECK_OK(al_tensor_to(&cug, &cuc, AL_DTYPE_I32, g_dev, 0));
    }

    al_attn_params p;
    al_attn_params_init(&p);
    p.qkv_format = c->fmt;
    p.mask_type = c->mask;
    if (c->bias) p.bias_type = AL_ATTN_BIAS_POST_SCALE;
    al_attn_inputs ic, ig;
    memset(&ic, 0, sizeof ic);
    memset(&ig, 0, sizeof ig);
    ic.q = &qc; ic.k = &kc; ic.v = &vc;
    ig.q = &qg; ig.k = &kg; ig.v = &vg;
    if (c->bias) { ic.bias = &bc; ig.bias = &bg; }
    if (c->cu) {
        ic.cu_seqlens_q = ic.cu_seqlens_kv = &cuc;
        ig.cu_seqlens_q = ig.cu_seqlens_kv = &cug;
    }

    char label[160];
    snprintf(label, sizeof label, "%s [%s]", c->name, backend);
    t_current = label;
    al_tensor oc, lc, og, lg;
    memset(&og, 0, sizeof og);
    memset(&lg, 0, sizeof lg);
    snprintf(p.backend, sizeof p.backend, "cpu");
    CHECK_OK(al_attn_forward(&p, &ic, &oc, &lc, NULL));
    snprintf(p.backend, sizeof p.backend, "%s", backend);
    char why[4096];
    const char *chosen = al_attn_explain(&p, &ig, why, sizeof why);
    if (!chosen) {   /* fused / flash may decline a configuration (say so); unfused serves every one */
        CHECK(strcmp(backend, "unfused") != 0, "%s: the unfused backend must serve every configuration:\n%s", label, why);
        al_clear_error();
        printf("  %s: not served here: %s\n", label, strstr(why, "error:") ? strstr(why, "error:") : why);
    } else {
        CHECK_OK(al_attn_forward(&p, &ig, &og, &lg, NULL));
        const int f16 = dt == AL_DTYPE_F16;
        const double tol = f16 ? 1e-3 : 1.5e-2, gtol = f16 ? 2.5e-3 : 1.5e-2;
        if (og.storage) {
            double e = test_excess(&og, &oc, tol);
            CHECK(e <= tol, "%s: out beyond tolerance (%g)", label, e);
            e = test_excess(&lg, &lc, 1e-4);
            CHECK(e <= 1e-4, "%s: lse beyond tolerance (%g)", label, e);
            al_tensor g[3][2], dbc, dbg;
            memset(g, 0, sizeof g);
            memset(&dbc, 0, sizeof dbc);
            memset(&dbg, 0, sizeof dbg);
            const al_tensor *like[3] = {&qc, &kc, &vc};
            const int32_t gdt = c->grad_dtype ? c->grad_dtype : dt;
            for (int i = 0; i < 3; i++) {
                CHECK_OK(al_tensor_empty(&g[i][0], like[i]->ndim, like[i]->size, gdt, AL_DEVICE_CPU, 0));
                if (c->grad_pad > 0) {
                    int64_t wide[4];
                    memcpy(wide, like[i]->size, sizeof wide);
                    wide[like[i]->ndim - 1] += c->grad_pad;
                    al_tensor big;
                    CHECK_OK(al_tensor_empty(&big, like[i]->ndim, wide, gdt, g_dev, 0));
                    CHECK_OK(al_tensor_narrow(&g[i][1], &big, like[i]->ndim - 1, 0, like[i]->size[like[i]->ndim - 1]));
                    al_tensor_release(&big);   /* the view keeps the storage */
                } else {
                    CHECK_OK(al_tensor_empty(&g[i][1], like[i]->ndim, like[i]->size, gdt, g_dev, 0));
                }
            }
            snprintf(p.backend, sizeof p.backend, "cpu");
            CHECK_OK(al_attn_backward(&p, &ic, &oc, &doc, &lc, &g[0][0], &g[1][0], &g[2][0], c->bias ? &dbc : NULL, NULL));
            snprintf(p.backend, sizeof p.backend, "%s", backend);
            CHECK_OK(al_attn_backward(&p, &ig, &og, &dog, &lg, &g[0][1], &g[1][1], &g[2][1], c->bias ? &dbg : NULL, NULL));
            static const char *gn[3] = {"dq", "dk", "dv"};
            for (int i = 0; i < 3; i++) {
                e = test_excess(&g[i][1], &g[i][0], gtol);
                CHECK(e <= gtol, "%s: %s beyond tolerance (%g)", label, gn[i], e);
            }
            if (c->bias && dbg.storage) {
                e = test_excess(&dbg, &dbc, gtol);
                CHECK(e <= gtol, "%s: dbias beyond tolerance (%g)", label, e);
            }
            for (int i = 0; i < 3; i++) {
                al_tensor_release(&g[i][0]);
                al_tensor_release(&g[i][1]);
            }
            al_tensor_release(&dbc);
            al_tensor_release(&dbg);
        }
    }
    al_tensor *all[] = {&qc, &kc, &vc, &qg, &kg, &vg, &doc, &dog, &bc, &bg, &cuc, &cug, &oc, &lc, &og, &lg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) al_tensor_release(all[i]);
}

static const int CU3[4] = {0, 40, 41, 140};   /* thd: lengths 40, 1, 99 */

static const cfg CASES[] = {
    {"bshd causal GQA d64 bf16", AL_ATTN_FORMAT_BSHD, AL_ATTN_MASK_CAUSAL, AL_DTYPE_BF16, 2, 4, 2, 77, 77, 64, 0, NULL, 0, NULL, 0},
    {"sbhd no_mask d128 f16", AL_ATTN_FORMAT_SBHD, AL_ATTN_MASK_NO_MASK, AL_DTYPE_F16, 2, 2, 2, 130, 130, 128, 0, NULL, 0, NULL, 0},
    {"bshd cross causal_bottom_right d128 bf16", AL_ATTN_FORMAT_BSHD, AL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, AL_DTYPE_BF16,
     1, 4, 1, 50, 190, 128, 0, NULL, 0, NULL, 0},
    {"bshd post_scale_bias no_mask d64 bf16", AL_ATTN_FORMAT_BSHD, AL_ATTN_MASK_NO_MASK, AL_DTYPE_BF16, 2, 2, 2, 64, 96, 64,
     1, NULL, 0, NULL, 0},
    {"thd padding_causal d64 bf16", AL_ATTN_FORMAT_THD, AL_ATTN_MASK_PADDING_CAUSAL, AL_DTYPE_BF16, 3, 4, 2, 99, 99, 64, 0,
     CU3, 0, NULL, 0},
    {"bshd causal GQA d128 bf16, f32 gradients", AL_ATTN_FORMAT_BSHD, AL_ATTN_MASK_CAUSAL, AL_DTYPE_BF16, 2, 4, 2, 200, 200,
     128, 0, NULL, AL_DTYPE_F32, "flash", 0},
    {"thd padding_causal d64 f16, f32 gradients", AL_ATTN_FORMAT_THD, AL_ATTN_MASK_PADDING_CAUSAL, AL_DTYPE_F16, 3, 4, 2, 99,
     99, 64, 0, CU3, AL_DTYPE_F32, "flash", 0},
    {"sbhd no_mask d128 bf16, gradient rows 4-byte aligned", AL_ATTN_FORMAT_SBHD, AL_ATTN_MASK_NO_MASK, AL_DTYPE_BF16, 2, 4,
     4, 150, 150, 128, 0, NULL, 0, "flash", 2},
};

int main(void) {
    const size_t ncases = sizeof CASES / sizeof CASES[0];
    if (al_cuda_device_count() <= 0) {
        al_clear_error();
        g_dev = AL_DEVICE_CPU;
        for (size_t c = 0; c < ncases; c++) {
            t_current_failed = 0;
            run_case(&CASES[c], "cpu");
            if (t_current_failed) t_failed++;
            else t_passed++;
        }
        int gpu_runs = 0;
        for (size_t c = 0; c < ncases; c++) gpu_runs += CASES[c].only ? 1 : 3;
        printf("c-test gpu_backends: %d passed, %d failed, %d skipped (no GPU: the harness ran cpu against cpu)\n",
               t_passed, t_failed, gpu_runs);
        return t_failed ? 1 : 0;
    }
    static const char *backends[] = {"unfused", "fused", "flash"};
    for (size_t c = 0; c < ncases; c++)
        for (int b = 0; b < 3; b++) {
            if (CASES[c].only && strcmp(CASES[c].only, backends[b]) != 0) continue;
            t_current_failed = 0;
            run_case(&CASES[c], backends[b]);
            if (t_current_failed) t_failed++;
            else t_passed++;
        }
    /* Every tensor of every case was freed: no device bytes in use. Then the caching allocator hands its
     * blocks back to CUDA, so that under compute-sanitizer's leak check (scripts/gpu_sanitize.sh) what
     * remains is only what the libraries keep for the process's lifetime (cuBLASLt / cuDNN handles,
     * the plugin's workspaces), not tensors or cached blocks. */
    t_current = "no device memory in use after the cases; the cache empties";
    t_current_failed = 0;
    const int64_t in_use = al_memory_in_use(AL_DEVICE_CUDA, 0);
    CHECK(in_use == 0, "%lld bytes of tensor storage still in use on cuda:0 after every case freed its tensors",
          (long long)in_use);
    CHECK_OK(al_cuda_empty_cache(0));
    printf("  after empty_cache: the allocator holds %lld bytes (workspaces kept for the process)\n",
           (long long)al_cuda_memory_reserved(0));
    if (t_current_failed) t_failed++;
    else t_passed++;
    return SUMMARY("gpu_backends");
}
