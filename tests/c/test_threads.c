/*
 * test_threads.c — pthread stress test: the C runtime used from several OS threads at once.
 *
 * NTHREADS threads each run ITERS rounds on their own tensors: create, fill with thread-specific
 * values, view (select/narrow/transpose/permute/view/expand), copy and clone, math (binary, reduce,
 * softmax, matmul) and a CPU attention forward, checking every result against a value computed in
 * the thread; they release everything. Meanwhile each thread provokes its own errors and checks that
 * al_last_error() shows its own message, never another thread's (the message is thread-local). A
 * shared tensor is aliased and released by every thread (atomic refcounts). At the end the live
 * storage count and the bytes in use are back to the baseline.
 */
#include "test_main.h"
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#define NTHREADS 8
#define ITERS 60

static al_tensor g_shared;
static int g_errors[NTHREADS];

#define TCHECK(cond, id)            \
    do {                            \
        if (!(cond)) {              \
            g_errors[id]++;         \
            fprintf(stderr, "thread %d: %s failed (line %d): %s\n", id, #cond, __LINE__, al_last_error()); \
        }                           \
    } while (0)

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    for (int it = 0; it < ITERS; it++) {
        /* 1. create + fill with values unique to (thread, iteration) */
        int64_t rows = 3 + id % 3, cols = 4 + it % 5;
        int64_t shape[2] = {rows, cols};
        al_tensor a, b, v, c, s, m, alias;
        TCHECK(al_tensor_empty(&a, 2, shape, AL_DTYPE_F64, AL_DEVICE_CPU, 0) == AL_OK, id);
        double base = id * 1000.0 + it;
        TCHECK(al_tensor_arange_(&a, base, 1.0) == AL_OK, id);

        /* 2. views: element (r, c) of a is base + r*cols + c */
        TCHECK(al_tensor_transpose(&v, &a, 0, 1) == AL_OK, id);
        TCHECK(al_tensor_select(&b, &v, 0, 1) == AL_OK, id); /* column 1 */
        double col[8];
        TCHECK(al_tensor_read_f64(&b, col, rows) == AL_OK, id);
        for (int64_t r = 0; r < rows; r++) TCHECK(col[r] == base + r * cols + 1, id);
        al_tensor_release(&b);

        /* 3. copy and clone */
        TCHECK(al_tensor_clone(&c, &v) == AL_OK, id);
        TCHECK(al_tensor_is_contiguous(&c) && !al_tensor_same_storage(&c, &a), id);
        double diff = -1;
        TCHECK(al_max_abs_diff(&c, &v, &diff) == AL_OK && diff == 0, id);

        /* 4. math: sum of a = numel*base + numel*(numel-1)/2 */
        TCHECK(al_reduce(&s, AL_REDUCE_SUM, &a, 0, NULL, 0) == AL_OK, id);
        double sum = 0, n = (double)(rows * cols);
        TCHECK(al_tensor_read_f64(&s, &sum, 1) == AL_OK, id);
        TCHECK(sum == n * base + n * (n - 1) / 2, id);
        al_tensor_release(&s);
        /* a @ a^T diagonal: sum of squares of each row */
        TCHECK(al_matmul(&m, &a, &v) == AL_OK, id);
        double mm[64];
        TCHECK(m.ndim == 2 && m.size[0] == rows && al_tensor_read_f64(&m, mm, rows * rows) == AL_OK, id);
        for (int64_t r = 0; r < rows; r++) {
            double want = 0;
            for (int64_t k = 0; k < cols; k++) want += (base + r * cols + k) * (base + r * cols + k);
            TCHECK(fabs(mm[r * rows + r] - want) <= 1e-9 * want, id);
        }
        al_tensor_release(&m);
        /* softmax rows sum to one */
        TCHECK(al_softmax(&m, &a, 1, 0) == AL_OK, id);
        TCHECK(al_reduce(&s, AL_REDUCE_SUM, &m, 1, (int32_t[]){1}, 0) == AL_OK, id);
        double rs[8];
        TCHECK(al_tensor_read_f64(&s, rs, rows) == AL_OK, id);
        for (int64_t r = 0; r < rows; r++) TCHECK(fabs(rs[r] - 1.0) < 1e-12, id);
        al_tensor_release(&s);
        al_tensor_release(&m);

        /* 5. attention on the CPU: with one key the output is that key's value */
        {
            int64_t qs[4] = {1, 2, 2, 4}, ks[4] = {1, 1, 2, 4};
            al_tensor q, k, vv, out, lse;
            TCHECK(al_tensor_empty(&q, 4, qs, AL_DTYPE_F32, 0, 0) == AL_OK, id);
            TCHECK(al_tensor_empty(&k, 4, ks, AL_DTYPE_F32, 0, 0) == AL_OK, id);
            TCHECK(al_tensor_empty(&vv, 4, ks, AL_DTYPE_F32, 0, 0) == AL_OK, id);
            al_tensor_random_at_(&q, AL_RANDOM_NORMAL, (uint64_t)id, (uint64_t)it);
            al_tensor_random_at_(&k, AL_RANDOM_NORMAL, (uint64_t)id + 100, (uint64_t)it);
            al_tensor_arange_(&vv, base, 0.5);
            al_attn_params p;
            al_attn_params_init(&p);
            p.qkv_format = AL_ATTN_FORMAT_BSHD;
            p.mask_type = AL_ATTN_MASK_NO_MASK;
            al_attn_inputs in;
            memset(&in, 0, sizeof in);
            in.q = &q; in.k = &k; in.v = &vv;
            TCHECK(al_attn_forward(&p, &in, &out, &lse, NULL) == AL_OK, id);
            double o[16];
            TCHECK(al_tensor_read_f64(&out, o, 16) == AL_OK, id);
            /* out[0, i, h, d] = v[0, 0, h, d] = base + 0.5 * (h*4 + d) for both query rows i */
            for (int i = 0; i < 2; i++)
                for (int h = 0; h < 2; h++)
                    for (int d = 0; d < 4; d++)
                        TCHECK(fabs(o[(i * 2 + h) * 4 + d] - (float)(base + 0.5 * (h * 4 + d))) <= 1e-5 * (1 + fabs(base)), id);
            al_tensor_release(&out);
            al_tensor_release(&lse);
            al_tensor_release(&q);
            al_tensor_release(&k);
            al_tensor_release(&vv);
        }

        /* 6. thread-local errors: provoke an error naming this thread's values, yield, check it */
        al_tensor bad;
        int64_t want_dim = 100 + id;
        TCHECK(al_tensor_select(&bad, &a, (int32_t)want_dim, 0) == AL_ERR_ARG, id);
        char expect[64];
        snprintf(expect, sizeof expect, "dim %lld out of range", (long long)want_dim + 1);
        sched_yield();
        TCHECK(strstr(al_last_error(), expect) != NULL, id);
        al_clear_error();
        TCHECK(al_last_error()[0] == '\0', id);

        /* 7. the shared tensor: alias and release from every thread at once */
        TCHECK(al_tensor_alias(&alias, &g_shared) == AL_OK, id);
        TCHECK(al_tensor_storage_refcount(&alias) >= 2, id);
        al_tensor_release(&alias);

        al_tensor_release(&c);
        al_tensor_release(&v);
        al_tensor_release(&a);
    }
    return NULL;
}

static void test_threads_stress(void) {
    int64_t live0 = al_storage_live_count(), bytes0 = al_memory_in_use(AL_DEVICE_CPU, 0);
    int64_t sz = 64;
    CHECK_OK(al_tensor_empty(&g_shared, 1, &sz, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i) == 0, "pthread_create %d", i);
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++) CHECK(g_errors[i] == 0, "thread %d: %d failed checks", i, g_errors[i]);
    CHECK(al_tensor_storage_refcount(&g_shared) == 1, "shared refcount %lld after the threads",
          (long long)al_tensor_storage_refcount(&g_shared));
    al_tensor_release(&g_shared);
    CHECK(al_storage_live_count() == live0, "live storages %lld, baseline %lld", (long long)al_storage_live_count(),
          (long long)live0);
    CHECK(al_memory_in_use(AL_DEVICE_CPU, 0) == bytes0, "bytes in use %lld, baseline %lld",
          (long long)al_memory_in_use(AL_DEVICE_CPU, 0), (long long)bytes0);
}

/* The main thread's error message is untouched by the workers' errors. */
static void test_main_thread_error_survives(void) {
    al_tensor t, out;
    int64_t sz = 2;
    CHECK_OK(al_tensor_empty(&t, 1, &sz, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    CHECK(al_tensor_narrow(&out, &t, 0, 1, 5) == AL_ERR_ARG, "narrow should fail");
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", al_last_error());
    memset(g_errors, 0, sizeof g_errors);
    CHECK_OK(al_tensor_empty(&g_shared, 1, &sz, AL_DTYPE_F32, AL_DEVICE_CPU, 0));
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    al_tensor_release(&g_shared);
    CHECK(strcmp(al_last_error(), mine) == 0, "main thread's message changed to '%s'", al_last_error());
    CHECK(strstr(mine, "narrow") != NULL, "'%s'", mine);
    al_tensor_release(&t);
}

int main(void) {
    RUN(test_threads_stress);
    RUN(test_main_thread_error_survives);
    return SUMMARY("threads");
}
