/*
 * storage.c — refcounted storage and the per-device byte accounting behind al.memory().
 *
 * CPU storage is 64-byte aligned host memory; CUDA storage comes from the plugin's caching allocator.
 * Refcounts and counters are updated atomically, so tensors may be released from any thread.
 */
#include "internal.h"
#include "cuda_plugin.h"
#include <stdlib.h>

#define AL_MAX_TRACKED_DEVICES 17   /* slot 0: cpu, slots 1..16: cuda:0..15 */

static int64_t g_in_use[AL_MAX_TRACKED_DEVICES];
static int64_t g_peak[AL_MAX_TRACKED_DEVICES];
static int64_t g_live_storages;
static int64_t g_next_id = 1;

static int slot_of(int32_t device_type, int32_t device_index) {
    if (device_type == AL_DEVICE_CPU) return 0;
    if (device_type == AL_DEVICE_CUDA && device_index >= 0 && device_index < AL_MAX_TRACKED_DEVICES - 1)
        return 1 + device_index;
    return -1;
}

static void account(int32_t device_type, int32_t device_index, int64_t delta) {
    int s = slot_of(device_type, device_index);
    if (s < 0) return;
    int64_t now = __atomic_add_fetch(&g_in_use[s], delta, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&g_peak[s], __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&g_peak[s], &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

al_status al_storage_new(al_storage **out, int64_t nbytes, int32_t device_type, int32_t device_index) {
    *out = NULL;
    if (nbytes < 0) return al_error(AL_ERR_ARG, "storage: negative size %lld", (long long)nbytes);
    al_storage *s = calloc(1, sizeof *s);
    if (!s) return al_error(AL_ERR_OOM, "storage: out of host memory for a storage header");
    /* Allocate at least one byte so that data is never NULL for a valid storage. */
    int64_t alloc = nbytes > 0 ? nbytes : 1;
    if (device_type == AL_DEVICE_CPU) {
        void *p = NULL;
        /* unsigned: alloc may be near INT64_MAX, where alloc + 63 overflowed int64 (UBSan, fuzz_views) */
        size_t rounded = (size_t)(((uint64_t)alloc + 63u) & ~(uint64_t)63u);
        if ((uint64_t)alloc > (uint64_t)SIZE_MAX - 64 || posix_memalign(&p, 64, rounded) != 0) {
            free(s);
            return al_error(AL_ERR_OOM, "storage: out of host memory allocating %lld bytes", (long long)nbytes);
        }
        s->data = p;
    } else if (device_type == AL_DEVICE_CUDA) {
        al_status st = al_cuda_check_device("storage", device_index);
        if (st != AL_OK) { free(s); return st; }
        const al_cuda_api *api = al_cuda_api_get();
        st = api->malloc(device_index, alloc, &s->data);
        if (st != AL_OK) { free(s); return st; }
        s->stream = api->current_stream(device_index);
    } else {
        free(s);
        return al_error(AL_ERR_ARG, "storage: unknown device type %d", device_type);
    }
    s->nbytes = nbytes;
    s->device_type = device_type;
    s->device_index = device_type == AL_DEVICE_CPU ? 0 : device_index;
    s->refcount = 1;
    s->id = __atomic_fetch_add(&g_next_id, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_live_storages, 1, __ATOMIC_RELAXED);
    account(s->device_type, s->device_index, nbytes);
    *out = s;
    return AL_OK;
}

void al_storage_retain(al_storage *s) {
    if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void al_storage_release(al_storage *s) {
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (s->device_type == AL_DEVICE_CPU) {
        free(s->data);
    } else {
        const al_cuda_api *api = al_cuda_api_get();
        if (api) api->free(s->device_index, s->data, s->nbytes > 0 ? s->nbytes : 1, s->stream);
    }
    account(s->device_type, s->device_index, -s->nbytes);
    __atomic_sub_fetch(&g_live_storages, 1, __ATOMIC_RELAXED);
    free(s);
}

int64_t al_memory_in_use(int32_t device_type, int32_t device_index) {
    int s = slot_of(device_type, device_index);
    return s < 0 ? 0 : __atomic_load_n(&g_in_use[s], __ATOMIC_RELAXED);
}

int64_t al_memory_peak(int32_t device_type, int32_t device_index) {
    int s = slot_of(device_type, device_index);
    return s < 0 ? 0 : __atomic_load_n(&g_peak[s], __ATOMIC_RELAXED);
}

void al_memory_reset_peak(int32_t device_type, int32_t device_index) {
    int s = slot_of(device_type, device_index);
    if (s >= 0) __atomic_store_n(&g_peak[s], __atomic_load_n(&g_in_use[s], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

int64_t al_storage_live_count(void) { return __atomic_load_n(&g_live_storages, __ATOMIC_RELAXED); }
