/*
 * test_cuda_threads.c — the CUDA plugin used from several OS threads at once (issue 11, "threads"; the CPU
 * runtime's own stress test is test_threads.c).
 *
 * NTHREADS threads each make a stream of their own current (al_cuda_set_stream) and run ITERS rounds. A
 * round uploads the thread's inputs, runs attention forward and backward on one GPU backend (unfused,
 * fused, flash in turn: cuBLASLt handles, cuDNN's handle and plan cache, NVRTC's module table and the
 * flash workspaces, all shared between threads behind their locks), copies the results back and checks
 * them against the cpu backend's results for the same inputs, computed once before the threads start,
 * with TE's bf16 tolerance (1.5e-2); it also allocates and frees a few device tensors of odd sizes (the
 * caching allocator's per-stream pools under one mutex) and provokes an error of its own to check that
 * al_last_error() shows this thread's message. Each thread has its own shapes (sequence length 64 + 13 t),
 * so a result crossing threads would have the wrong shape or values. Afterwards no device bytes are in
 * use and the cache empties.
 * Without a GPU the harness checks itself: the same threads run the cpu backend on CPU tensors (no
 * streams), and the GPU test reports skipped. Run on the GPU machine: build/tests/test_cuda_threads (also
 * under compute-sanitizer: scripts/gpu_sanitize.sh with C_PROGS=test_cuda_threads).
 */
#include "test_main.h"
#include "excess.h"
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#define NTHREADS 6
#define ITERS 6
#define NB 3

static const char *g_gpu_backends[NB] = {"unfused", "fused", "flash"};
static const char *g_cpu_backends[NB] = {"cpu", "cpu", "cpu"};
static const char **g_backends = g_gpu_backends;
static int32_t g_dev = AL_DEVICE_CUDA;   /* AL_DEVICE_CPU: the harness's self-check without a GPU */
static int g_errors[NTHREADS];

#define TCHECK(cond, id, ...)                                                           \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            g_errors[id]++;                                                             \
            fprintf(stderr, "thread %d: %s failed (line %d): ", id, #cond, __LINE__);   \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, " [%s]\n", al_last_error());                                \
        }                                                                               \
    } while (0)

/* One thread's problem: bshd bf16, b 1, h 4, hg 2 (GQA), d 64, causal; s = 64 + 13 id (not a tile multiple). */
typedef struct work {
    int id;
    int64_t qs[4], ks[4];
    al_tensor q, k, v, dout;          /* CPU, bf16 */
    al_tensor out, dq, dk, dv;        /* the cpu backend's results */
} work;

static work g_work[NTHREADS];

static void params(al_attn_params *p, const char *backend) {
    al_attn_params_init(p);
    p->qkv_format = AL_ATTN_FORMAT_BSHD;
    p->mask_type = AL_ATTN_MASK_CAUSAL;
    p->deterministic = 0;   /* the oracle comparison needs no fixed order; every backend serves both */
    snprintf(p->backend, sizeof p->backend, "%s", backend);
}

/* the oracle comparison (excess.h) after a shape check: a result of another thread's shape is +inf */
static double excess(const al_tensor *a, const al_tensor *b, double tol, int *shape_ok) {
    *shape_ok = a->ndim == b->ndim;
    for (int i = 0; *shape_ok && i < a->ndim; i++) *shape_ok = a->size[i] == b->size[i];
    return *shape_ok ? test_excess(a, b, tol) : INFINITY;
}

static void setup(work *w, int id) {
    const int64_t s = 64 + 13 * id;
    const int64_t qs[4] = {1, s, 4, 64}, ks[4] = {1, s, 2, 64};
    memcpy(w->qs, qs, sizeof qs);
    memcpy(w->ks, ks, sizeof ks);
    w->id = id;
    al_tensor f;
    const int64_t *shape[4] = {qs, ks, ks, qs};
    al_tensor *dst[4] = {&w->q, &w->k, &w->v, &w->dout};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(al_tensor_empty(&f, 4, shape[i], AL_DTYPE_F32, AL_DEVICE_CPU, 0));
        CHECK_OK(al_tensor_random_at_(&f, AL_RANDOM_NORMAL, 1000 + (uint64_t)id, (uint64_t)i));
        CHECK_OK(al_tensor_to(dst[i], &f, AL_DTYPE_BF16, AL_DEVICE_CPU, 0));
        al_tensor_release(&f);
    }
    al_attn_params p;
    params(&p, "cpu");
    al_attn_inputs in;
    memset(&in, 0, sizeof in);
    in.q = &w->q; in.k = &w->k; in.v = &w->v;
    al_tensor lse;
    CHECK_OK(al_attn_forward(&p, &in, &w->out, &lse, NULL));
    CHECK_OK(al_tensor_empty(&w->dq, 4, qs, AL_DTYPE_BF16, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_empty(&w->dk, 4, ks, AL_DTYPE_BF16, AL_DEVICE_CPU, 0));
    CHECK_OK(al_tensor_empty(&w->dv, 4, ks, AL_DTYPE_BF16, AL_DEVICE_CPU, 0));
    CHECK_OK(al_attn_backward(&p, &in, &w->out, &w->dout, &lse, &w->dq, &w->dk, &w->dv, NULL, NULL));
    al_tensor_release(&lse);
}

static void teardown(work *w) {
    al_tensor *all[] = {&w->q, &w->k, &w->v, &w->dout, &w->out, &w->dq, &w->dk, &w->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) al_tensor_release(all[i]);
}

/* one round on backend b: upload, forward, backward, download, compare */
static void round_on(work *w, const char *backend) {
    const int id = w->id;
    al_tensor g[4], out, lse, grad[3];
    memset(g, 0, sizeof g);
    memset(&out, 0, sizeof out);
    memset(&lse, 0, sizeof lse);
    memset(grad, 0, sizeof grad);
    const al_tensor *src[4] = {&w->q, &w->k, &w->v, &w->dout};
    int ok = 1;
    for (int i = 0; i < 4 && ok; i++) {
        ok = al_tensor_to(&g[i], src[i], AL_DTYPE_BF16, g_dev, 0) == AL_OK;
        TCHECK(ok, id, "upload %d", i);
    }
    al_attn_params p;
    params(&p, backend);
    al_attn_inputs in;
    memset(&in, 0, sizeof in);
    in.q = &g[0]; in.k = &g[1]; in.v = &g[2];
    if (ok) {
        ok = al_attn_forward(&p, &in, &out, &lse, NULL) == AL_OK;
        TCHECK(ok, id, "%s forward", backend);
    }
    const int64_t *shape[3] = {w->qs, w->ks, w->ks};
    for (int i = 0; i < 3 && ok; i++) {
        ok = al_tensor_empty(&grad[i], 4, shape[i], AL_DTYPE_BF16, g_dev, 0) == AL_OK;
        TCHECK(ok, id, "grad %d", i);
    }
    if (ok) {
        ok = al_attn_backward(&p, &in, &out, &g[3], &lse, &grad[0], &grad[1], &grad[2], NULL, NULL) == AL_OK;
        TCHECK(ok, id, "%s backward", backend);
    }
    if (ok) {
        /* out is [b, s, h*d] (flattened like DotProductAttention's) or [b, s, h, d]: compare as the same
         * elements, so view the reference with out's shape */
        al_tensor ref;
        int shape_ok = 0;
        if (al_tensor_view(&ref, &w->out, out.ndim, out.size) == AL_OK) {
            const double e = excess(&out, &ref, 1.5e-2, &shape_ok);
            TCHECK(shape_ok && e <= 1.5e-2, id, "%s out: excess %g (shape ok %d)", backend, e, shape_ok);
            al_tensor_release(&ref);
        } else {
            TCHECK(0, id, "%s out has %d dims, not a view of the reference's", backend, out.ndim);
        }
        const al_tensor *want[3] = {&w->dq, &w->dk, &w->dv};
        static const char *gn[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; i++) {
            const double e = excess(&grad[i], want[i], 1.5e-2, &shape_ok);
            TCHECK(shape_ok && e <= 1.5e-2, id, "%s %s: excess %g", backend, gn[i], e);
        }
    }
    al_clear_error();
    for (int i = 0; i < 4; i++) al_tensor_release(&g[i]);
    for (int i = 0; i < 3; i++) al_tensor_release(&grad[i]);
    al_tensor_release(&out);
    al_tensor_release(&lse);
}

static void *worker(void *arg) {
    work *w = (work *)arg;
    const int id = w->id;
    al_cuda_stream *st = NULL;
    if (g_dev == AL_DEVICE_CUDA) {
        TCHECK(al_cuda_stream_new(&st, 0) == AL_OK, id, "stream");
        TCHECK(al_cuda_set_stream(0, st) == AL_OK, id, "set stream");
    }
    for (int it = 0; it < ITERS; it++) {
        round_on(w, g_backends[(id + it) % NB]);

        /* the caching allocator: odd sizes, freed in a different order than allocated */
        al_tensor blk[3];
        for (int i = 0; i < 3; i++) {
            const int64_t n = 1 + (int64_t)((id * 7919 + it * 104729 + i * 15485863) % 300000);
            TCHECK(al_tensor_empty(&blk[i], 1, &n, AL_DTYPE_F32, g_dev, 0) == AL_OK, id, "alloc %lld",
                   (long long)n);
            TCHECK(al_tensor_fill_(&blk[i], (double)(id + i)) == AL_OK, id, "fill");
        }
        double s = 0;
        al_tensor sum;
        if (al_reduce(&sum, AL_REDUCE_SUM, &blk[1], 0, NULL, 0) == AL_OK) {
            TCHECK(al_tensor_read_f64(&sum, &s, 1) == AL_OK, id, "read sum");
            TCHECK(s == (double)(id + 1) * (double)blk[1].size[0], id, "sum %g of a block filled with %d", s, id + 1);
            al_tensor_release(&sum);
        } else {
            TCHECK(0, id, "reduce");
        }
        al_tensor_release(&blk[2]);
        al_tensor_release(&blk[0]);
        al_tensor_release(&blk[1]);

        /* thread-local errors: a narrow out of range naming this thread's length */
        al_tensor bad, t;
        const int64_t len = 10 + id;
        if (al_tensor_empty(&t, 1, &len, AL_DTYPE_F32, g_dev, 0) == AL_OK) {
            TCHECK(al_tensor_narrow(&bad, &t, 0, 1, len + 5) != AL_OK, id, "narrow past the end");
            char expect[96];   /* narrow's message names this thread's length and size */
            snprintf(expect, sizeof expect, "length %lld out of range for dim 1 of size %lld", (long long)len + 5,
                     (long long)len);
            sched_yield();
            TCHECK(strstr(al_last_error(), expect) != NULL, id, "own message");
            al_clear_error();
            al_tensor_release(&t);
        }
    }
    if (st) {
        TCHECK(al_cuda_stream_synchronize(st) == AL_OK, id, "stream sync");
        TCHECK(al_cuda_set_stream(0, NULL) == AL_OK, id, "default stream");
        al_cuda_stream_free(st);
    }
    return NULL;
}

static void test_cuda_threads(void) {
    for (int i = 0; i < NTHREADS; i++) setup(&g_work[i], i);
    memset(g_errors, 0, sizeof g_errors);
    const int64_t base = al_memory_in_use(g_dev, 0);
    pthread_t th[NTHREADS];
    int started[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        started[i] = pthread_create(&th[i], NULL, worker, &g_work[i]) == 0;
        CHECK(started[i], "pthread_create %d", i);
    }
    for (int i = 0; i < NTHREADS; i++)
        if (started[i]) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++) CHECK(g_errors[i] == 0, "thread %d: %d failed checks", i, g_errors[i]);
    if (g_dev == AL_DEVICE_CUDA) CHECK_OK(al_cuda_synchronize(0));
    CHECK(al_memory_in_use(g_dev, 0) == base, "bytes in use %lld after the threads, %lld before",
          (long long)al_memory_in_use(g_dev, 0), (long long)base);
    if (g_dev == AL_DEVICE_CUDA) CHECK_OK(al_cuda_empty_cache(0));
    for (int i = 0; i < NTHREADS; i++) teardown(&g_work[i]);
}

int main(void) {
    if (al_cuda_device_count() <= 0) {
        al_clear_error();
        g_dev = AL_DEVICE_CPU;
        g_backends = g_cpu_backends;
        RUN(test_cuda_threads);
        printf("c-test cuda_threads: %d passed, %d failed, 1 skipped (no GPU: the harness ran the cpu backend on "
               "CPU tensors)\n", t_passed, t_failed);
        return t_failed ? 1 : 0;
    }
    RUN(test_cuda_threads);
    return SUMMARY("cuda_threads");
}
