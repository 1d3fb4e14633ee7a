/*
 * cuda/allocator.cu — the per-device caching allocator and the per-device stream.
 *
 * Allocator: a request is rounded up (to 512 B below 1 MiB, to 2 MiB above) and served from the
 * free list of exactly that rounded size when it has a block; cudaMalloc runs only on a miss.
 * free() pushes the block back on its list (never cudaFree on the hot path). Blocks are pooled per
 * stream, as PyTorch's allocator does: a freed block carries the stream it was allocated on and is
 * handed out again only to an allocation on that same stream, so it is only touched by work queued
 * after everything that used it before — no events needed. (A tensor used on a second stream must
 * stay alive until that stream has finished with it: the usual CUDA caching-allocator contract.)
 * On cudaMalloc OOM the cache of that device is released (after a device sync) and the allocation
 * retried once; a second failure is AL_ERR_OOM naming the bytes requested and the bytes reserved.
 * empty_cache releases every cached block. One mutex guards all lists.
 *
 * Streams: each device has a default non-blocking stream, created lazily; a thread may make a
 * user stream current (al_cu_stream_set) and every launch, memcpy and event of that thread then
 * goes there. al_cu_begin(op, dev, &stream) validates dev, makes it current on this thread and
 * returns the thread's current stream: every entry point starts with it.
 */
#include "cuda/cuda_internal.h"
#include <pthread.h>
#include <stdlib.h>

#define AL_CU_BUCKETS 1024

typedef struct al_cu_block {
    void *ptr;
    int64_t size;                 /* rounded size */
    cudaStream_t stream;          /* the pool it belongs to; NULL = any stream (after a sync) */
    struct al_cu_block *next;
} al_cu_block;

typedef struct {
    al_cu_block *bucket[AL_CU_BUCKETS];   /* free blocks, chained by hash of the rounded size */
    int64_t reserved;                     /* bytes obtained from cudaMalloc and not yet released */
    int64_t cached;                       /* bytes of those sitting in the free lists */
    cudaStream_t stream;
    int stream_ready;
} al_cu_device_state;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static al_cu_device_state g_dev[AL_CU_MAX_DEVICES];
/* The calling thread's current stream per device (NULL: the device's default stream). */
static __thread cudaStream_t t_current[AL_CU_MAX_DEVICES];

static int64_t round_size(int64_t n) {
    const int64_t small = 512, big = 2 << 20;
    if (n < (1 << 20)) return (n + small - 1) / small * small;
    return (n + big - 1) / big * big;
}

static unsigned bucket_of(int64_t rounded) { return (unsigned)((uint64_t)(rounded >> 9) % AL_CU_BUCKETS); }

al_status al_cu_begin(const char *op, int32_t dev, cudaStream_t *stream) {
    AL_TRY(al_cu_check_dev(op, dev));
    AL_CUDA_TRY(cudaSetDevice(dev));
    al_cu_device_state *d = &g_dev[dev];
    if (!__atomic_load_n(&d->stream_ready, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&g_lock);
        al_status st = AL_OK;
        if (!d->stream_ready) {
            st = AL_CUDA_ST(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
            if (st == AL_OK) __atomic_store_n(&d->stream_ready, 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&g_lock);
        AL_TRY(st);
    }
    if (stream) *stream = t_current[dev] ? t_current[dev] : d->stream;
    return AL_OK;
}

void *al_cu_current_stream(int32_t dev) {
    cudaStream_t s = NULL;
    if (al_cu_begin("cuda stream", dev, &s) != AL_OK) return NULL;
    return (void *)s;
}

/* Release every cached block of dev; called with g_lock held. The device is synchronised first (all
 * streams) so that no queued work still uses a block being returned to the driver. */
static al_status release_cache_locked(int32_t dev) {
    al_cu_device_state *d = &g_dev[dev];
    al_status st = AL_CUDA_ST(cudaDeviceSynchronize());
    for (int b = 0; b < AL_CU_BUCKETS; b++) {
        while (d->bucket[b]) {
            al_cu_block *blk = d->bucket[b];
            d->bucket[b] = blk->next;
            al_status fs = AL_CUDA_ST(cudaFree(blk->ptr));
            if (fs != AL_OK && st == AL_OK) st = fs;
            d->reserved -= blk->size;
            d->cached -= blk->size;
            free(blk);
        }
    }
    return st;
}

al_status al_cu_malloc(int32_t dev, int64_t nbytes, void **ptr) {
    *ptr = NULL;
    AL_TRY(al_cu_begin("cuda malloc", dev, NULL));
    if (nbytes < 0) return al_error(AL_ERR_ARG, "cuda malloc: negative size %lld", (long long)nbytes);
    if (nbytes > ((int64_t)1 << 62)) return al_error(AL_ERR_OOM, "cuda malloc: %lld bytes is too large", (long long)nbytes);
    int64_t rounded = round_size(nbytes > 0 ? nbytes : 1);
    al_cu_device_state *d = &g_dev[dev];
    cudaStream_t cur = t_current[dev] ? t_current[dev] : d->stream;
    pthread_mutex_lock(&g_lock);
    unsigned b = bucket_of(rounded);
    for (al_cu_block **pp = &d->bucket[b]; *pp; pp = &(*pp)->next) {
        if ((*pp)->size == rounded && ((*pp)->stream == cur || (*pp)->stream == NULL)) {
            al_cu_block *blk = *pp;
            *pp = blk->next;
            d->cached -= rounded;
            pthread_mutex_unlock(&g_lock);
            *ptr = blk->ptr;
            free(blk);
            return AL_OK;
        }
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (size_t)rounded);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();   /* clear it, so the next launch check does not report it */
        al_status rs = release_cache_locked(dev);
        if (rs != AL_OK) {
            pthread_mutex_unlock(&g_lock);
            return rs;
        }
        e = cudaMalloc(&p, (size_t)rounded);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            int64_t reserved = d->reserved;
            pthread_mutex_unlock(&g_lock);
            size_t free_b = 0, total_b = 0;
            if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
            return al_error(AL_ERR_OOM,
                            "cuda:%d out of memory: cannot allocate %lld bytes (%lld rounded); attnlab holds %lld "
                            "bytes in use (cache emptied), the device has %lld of %lld bytes free",
                            dev, (long long)nbytes, (long long)rounded, (long long)reserved, (long long)free_b,
                            (long long)total_b);
        }
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        pthread_mutex_unlock(&g_lock);
        return al_error(AL_ERR_CUDA, "cuda malloc: cudaMalloc(%lld bytes) on cuda:%d failed: %s", (long long)rounded,
                        dev, cudaGetErrorString(e));
    }
    d->reserved += rounded;
    pthread_mutex_unlock(&g_lock);
    *ptr = p;
    return AL_OK;
}

void al_cu_free(int32_t dev, void *ptr, int64_t nbytes) {
    if (!ptr || dev < 0 || dev >= al_cu_ndev) return;
    al_cu_free_on(dev, ptr, nbytes, t_current[dev] ? (void *)t_current[dev] : (void *)g_dev[dev].stream);
}

void al_cu_free_on(int32_t dev, void *ptr, int64_t nbytes, void *stream) {
    if (!ptr || dev < 0 || dev >= al_cu_ndev) return;
    int64_t rounded = round_size(nbytes > 0 ? nbytes : 1);
    al_cu_device_state *d = &g_dev[dev];
    al_cu_block *blk = (al_cu_block *)malloc(sizeof *blk);
    pthread_mutex_lock(&g_lock);
    if (!blk) {
        /* no host memory for a list node: give the block back to the driver instead of leaking it */
        if (cudaSetDevice(dev) == cudaSuccess) (void)cudaDeviceSynchronize();
        if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
        d->reserved -= rounded;
        pthread_mutex_unlock(&g_lock);
        return;
    }
    blk->ptr = ptr;
    blk->size = rounded;
    blk->stream = stream ? (cudaStream_t)stream : d->stream;
    unsigned b = bucket_of(rounded);
    blk->next = d->bucket[b];
    d->bucket[b] = blk;
    d->cached += rounded;
    pthread_mutex_unlock(&g_lock);
}

int64_t al_cu_memory_reserved(int32_t dev) {
    if (dev < 0 || dev >= al_cu_ndev) return 0;
    pthread_mutex_lock(&g_lock);
    int64_t r = g_dev[dev].reserved;
    pthread_mutex_unlock(&g_lock);
    return r;
}

al_status al_cu_empty_cache(int32_t dev) {
    AL_TRY(al_cu_begin("cuda.empty_cache", dev, NULL));
    pthread_mutex_lock(&g_lock);
    al_status st = release_cache_locked(dev);
    pthread_mutex_unlock(&g_lock);
    return st;
}

al_status al_cu_synchronize(int32_t dev) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("cuda.synchronize", dev, &s));
    AL_CUDA_TRY(cudaStreamSynchronize(s));
    return AL_OK;
}

al_status al_cu_memcpy_h2d(int32_t dev, void *dst, const void *src, int64_t nbytes) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("cuda memcpy_h2d", dev, &s));
    if (nbytes <= 0) return AL_OK;
    /* from pageable memory this returns once src has been staged, so the caller may free src */
    AL_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyHostToDevice, s));
    return AL_OK;
}

al_status al_cu_memcpy_d2h(int32_t dev, void *dst, const void *src, int64_t nbytes) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("cuda memcpy_d2h", dev, &s));
    if (nbytes <= 0) return AL_OK;
    AL_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyDeviceToHost, s));
    AL_CUDA_TRY(cudaStreamSynchronize(s));
    return AL_OK;
}

al_status al_cu_memcpy_d2d(int32_t dev, void *dst, const void *src, int64_t nbytes) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("cuda memcpy_d2d", dev, &s));
    if (nbytes <= 0) return AL_OK;
    AL_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyDeviceToDevice, s));
    return AL_OK;
}

/* ---- user streams ------------------------------------------------------------------------------- */

al_status al_cu_stream_new(void **stream, int32_t dev) {
    *stream = NULL;
    AL_TRY(al_cu_begin("cuda.Stream", dev, NULL));
    cudaStream_t s;
    AL_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = (void *)s;
    return AL_OK;
}

/* Synchronise the stream, hand its cached blocks to every stream (its work is done), destroy it. */
void al_cu_stream_free(int32_t dev, void *stream) {
    if (!stream || dev < 0 || dev >= al_cu_ndev) return;
    if (cudaSetDevice(dev) != cudaSuccess) { (void)cudaGetLastError(); return; }
    cudaStream_t s = (cudaStream_t)stream;
    if (cudaStreamSynchronize(s) != cudaSuccess) (void)cudaGetLastError();
    pthread_mutex_lock(&g_lock);
    for (int b = 0; b < AL_CU_BUCKETS; b++)
        for (al_cu_block *blk = g_dev[dev].bucket[b]; blk; blk = blk->next)
            if (blk->stream == s) blk->stream = NULL;
    pthread_mutex_unlock(&g_lock);
    if (t_current[dev] == s) t_current[dev] = NULL;
    if (cudaStreamDestroy(s) != cudaSuccess) (void)cudaGetLastError();
}

al_status al_cu_stream_set(int32_t dev, void *stream) {
    AL_TRY(al_cu_begin("cuda.set_stream", dev, NULL));
    t_current[dev] = (cudaStream_t)stream;
    return AL_OK;
}

static cudaStream_t resolve(int32_t dev, void *stream) {
    return stream ? (cudaStream_t)stream : g_dev[dev].stream;
}

al_status al_cu_stream_synchronize(int32_t dev, void *stream) {
    AL_TRY(al_cu_begin("cuda.Stream:synchronize", dev, NULL));
    AL_CUDA_TRY(cudaStreamSynchronize(resolve(dev, stream)));
    return AL_OK;
}

al_status al_cu_stream_query(int32_t dev, void *stream, int32_t *done) {
    *done = 0;
    AL_TRY(al_cu_begin("cuda.Stream:query", dev, NULL));
    cudaError_t e = cudaStreamQuery(resolve(dev, stream));
    if (e == cudaErrorNotReady) { (void)cudaGetLastError(); return AL_OK; }
    AL_CUDA_TRY(e);
    *done = 1;
    return AL_OK;
}
