/*
 * rng.c — the default random generator (a Philox4x32-10 (seed, counter offset) pair) and the random
 * fills al_tensor_random_ / al_tensor_random_at_.
 *
 * The element mapping is defined once in src/numeric/philox.h and used verbatim here and by the CUDA
 * plugin, so a fill at (seed, offset) is bit-identical on every device. Element i is the i-th element
 * of the view in row-major order of its shape, whatever its strides.
 *
 * The generator state is guarded by a mutex: al_rng_reserve hands out disjoint counter ranges to
 * concurrent callers. At load the state is (AL_RNG_DEFAULT_SEED, 0), so runs are reproducible until
 * someone seeds.
 */
#include "internal.h"
#include "cuda_plugin.h"
#include "numeric/philox.h"

#include <pthread.h>

#define AL_RNG_DEFAULT_SEED 0x5eedull

static pthread_mutex_t g_rng_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_rng_seed = AL_RNG_DEFAULT_SEED;
static uint64_t g_rng_offset = 0;

AL_EXPORT void al_manual_seed(uint64_t seed) {
    pthread_mutex_lock(&g_rng_lock);
    g_rng_seed = seed;
    g_rng_offset = 0;
    pthread_mutex_unlock(&g_rng_lock);
}

AL_EXPORT void al_rng_get_state(uint64_t *seed, uint64_t *offset) {
    pthread_mutex_lock(&g_rng_lock);
    if (seed) *seed = g_rng_seed;
    if (offset) *offset = g_rng_offset;
    pthread_mutex_unlock(&g_rng_lock);
}

AL_EXPORT void al_rng_set_state(uint64_t seed, uint64_t offset) {
    pthread_mutex_lock(&g_rng_lock);
    g_rng_seed = seed;
    g_rng_offset = offset;
    pthread_mutex_unlock(&g_rng_lock);
}

/* Reserve count counters; returns the first (the offset before the call). */
static uint64_t al__rng_take(uint64_t count, uint64_t *seed) {
    pthread_mutex_lock(&g_rng_lock);
    uint64_t first = g_rng_offset;
    g_rng_offset += count;
    if (seed) *seed = g_rng_seed;
    pthread_mutex_unlock(&g_rng_lock);
    return first;
}

AL_EXPORT uint64_t al_rng_reserve(uint64_t count) { return al__rng_take(count, NULL); }

/* Everything a fill checks before it consumes counters or touches memory. */
static al_status al__random_check(const al_tensor *t, int32_t kind) {
    AL_TRY(al_check_tensor("random_", "self", t));
    if (!al_dtype_is_float(t->dtype)) {
        const char *name = al_dtype_name(t->dtype);
        if (name)
            return al_error(AL_ERR_ARG,
                            "random_: self must have a float dtype (f32 f64 f16 bf16 fp8_e4m3 fp8_e5m2), got %s",
                            name);
        return al_error(AL_ERR_ARG, "random_: self has an unknown dtype code %d", t->dtype);
    }
    if (kind != AL_RANDOM_UNIFORM && kind != AL_RANDOM_NORMAL)
        return al_error(AL_ERR_ARG, "random_: kind must be %d (uniform) or %d (normal), got %d",
                        AL_RANDOM_UNIFORM, AL_RANDOM_NORMAL, kind);
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->stride[d] == 0 && t->size[d] > 1)
            return al_error(AL_ERR_ARG,
                            "random_: self has stride 0 in dim %d (extent %lld): several elements share one "
                            "memory location (an expanded view); fill a contiguous tensor instead",
                            d, (long long)t->size[d]);
    }
    if (t->device_type != AL_DEVICE_CPU && t->device_type != AL_DEVICE_CUDA)
        return al_error(AL_ERR_ARG, "random_: self has an unknown device type %d", t->device_type);
    return AL_OK;
}

static al_status al__random_fill(al_tensor *t, int32_t kind, uint64_t seed, uint64_t offset) {
    int64_t n = al_tensor_numel(t);
    if (n == 0) return AL_OK;
    if (t->device_type == AL_DEVICE_CUDA) {
        AL_TRY(al_cuda_check_device("random_", t->device_index));
        const al_cuda_api *api = al_cuda_api_get();
        if (!api) return AL_ERR_DEVICE;
        return api->random(t, kind, seed, offset);
    }
    int64_t esize = al_dtype_size(t->dtype);
    char *base = (char *)t->data;
    int32_t dtype = t->dtype;
    if (al_tensor_is_contiguous(t)) {
        char *p = base + t->offset * esize;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++)
            al_random_store(p + i * esize, dtype, kind, seed, offset, (uint64_t)i);
        return AL_OK;
    }
    al_iter it;
    const int64_t *strides[1] = {t->stride};
    int64_t offs[1] = {t->offset};
    al_iter_init(&it, t->ndim, t->size, 1, strides, offs);
    for (int64_t i = 0; i < it.numel; i++, al_iter_next(&it))
        al_random_store(base + it.off[0] * esize, dtype, kind, seed, offset, (uint64_t)i);
    return AL_OK;
}

AL_EXPORT al_status al_tensor_random_at_(al_tensor *t, int32_t kind, uint64_t seed, uint64_t offset) {
    AL_TRY(al__random_check(t, kind));
    return al__random_fill(t, kind, seed, offset);
}

AL_EXPORT al_status al_tensor_random_(al_tensor *t, int32_t kind) {
    AL_TRY(al__random_check(t, kind));
    uint64_t n = (uint64_t)al_tensor_numel(t);
    uint64_t seed;
    uint64_t offset = al__rng_take(al_philox_counters(t->dtype, kind, n), &seed);
    return al__random_fill(t, kind, seed, offset);
}
