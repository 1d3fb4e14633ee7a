/*
 * cuda/plugin.cu — the CUDA plugin's entry point: al_cuda_plugin_init checks the ABI version, finds
 * the devices (no driver or no device -> AL_ERR_DEVICE with CUDA's message) and fills the
 * al_cuda_api table of src/cuda_plugin.h with the functions of the other src/cuda/ files.
 * It is the only symbol the plugin exports.
 */
#include "cuda/cuda_internal.h"

AL_CU_HIDDEN int32_t al_cu_ndev = 0;
AL_CU_HIDDEN int32_t al_cu_sm_count[AL_CU_MAX_DEVICES];
AL_CU_HIDDEN int64_t al_cu_l2_bytes[AL_CU_MAX_DEVICES];

al_status al_cu_check_dev(const char *op, int32_t dev) {
    if (dev < 0 || dev >= al_cu_ndev)
        return al_error(AL_ERR_DEVICE, "%s: device cuda:%d does not exist (%d CUDA device%s)", op, dev, al_cu_ndev,
                        al_cu_ndev == 1 ? "" : "s");
    return AL_OK;
}

static int32_t device_count(void) { return al_cu_ndev; }

static al_status device_info(int32_t dev, char *name, int32_t name_len, int32_t *cc_major, int32_t *cc_minor,
                             int64_t *total_mem) {
    AL_TRY(al_cu_check_dev("cuda.device_info", dev));
    cudaDeviceProp prop;
    AL_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
    if (name && name_len > 0) {
        size_t n = strlen(prop.name);
        if (n >= (size_t)name_len) n = (size_t)name_len - 1;
        memcpy(name, prop.name, n);
        name[n] = '\0';
    }
    if (cc_major) *cc_major = prop.major;
    if (cc_minor) *cc_minor = prop.minor;
    if (total_mem) *total_mem = (int64_t)prop.totalGlobalMem;
    return AL_OK;
}

/* SM count and L2 as read at init (the launch code's table); the opt-in shared memory per block from CUDA */
static al_status device_attrs(int32_t dev, int32_t *sm_count, int64_t *l2_bytes, int32_t *smem_per_block_optin) {
    AL_TRY(al_cu_check_dev("cuda.device_attrs", dev));
    if (sm_count) *sm_count = al_cu_sm_count[dev];
    if (l2_bytes) *l2_bytes = al_cu_l2_bytes[dev];
    if (smem_per_block_optin) {
        int v = 0;
        AL_CUDA_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        *smem_per_block_optin = v;
    }
    return AL_OK;
}

/* the backends' info functions (attn_fused.cu, attn_flash.cu), for al_cuda_backend_info */
extern "C" int64_t al_fused_info(char *buf, int64_t n);
extern "C" int64_t al_flash_info(char *buf, int64_t n);
static int64_t plugin_backend_info(int32_t backend, char *buf, int64_t n) {
    return backend == 0 ? al_fused_info(buf, n) : al_flash_info(buf, n);
}

extern "C" __attribute__((visibility("default"))) al_status al_cuda_plugin_init(al_cuda_api *api,
                                                                                int32_t core_abi) {
    if (!api) return al_error(AL_ERR_ARG, "al_cuda_plugin_init: api table is NULL");
    if (core_abi != AL_CUDA_ABI_VERSION)
        return al_error(AL_ERR_DEVICE, "CUDA plugin ABI version %d does not match the core library's %d (rebuild both)",
                        AL_CUDA_ABI_VERSION, core_abi);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return al_error(AL_ERR_DEVICE, "no usable CUDA driver or device: cudaGetDeviceCount failed: %s (%s)",
                        cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (n <= 0) return al_error(AL_ERR_DEVICE, "no CUDA device found (cudaGetDeviceCount returned 0)");
    if (n > AL_CU_MAX_DEVICES) n = AL_CU_MAX_DEVICES;
    for (int d = 0; d < n; d++) {
        int sms = 0;
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return al_error(AL_ERR_DEVICE, "CUDA device %d unusable: cudaDeviceGetAttribute failed: %s", d,
                            cudaGetErrorString(e));
        }
        al_cu_sm_count[d] = sms > 0 ? sms : 1;
        int l2 = 0;   /* 0 when unknown (the attribute failing is not fatal: only launch orders read it) */
        if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, d) != cudaSuccess) (void)cudaGetLastError();
        al_cu_l2_bytes[d] = l2 > 0 ? l2 : 0;
    }
    al_cu_ndev = n;

    memset(api, 0, sizeof *api);
    api->abi_version = AL_CUDA_ABI_VERSION;
    api->device_count = device_count;
    api->device_info = device_info;
    api->device_attrs = device_attrs;
    api->synchronize = al_cu_synchronize;
    api->malloc = al_cu_malloc;
    api->free = al_cu_free_on;
    api->memory_reserved = al_cu_memory_reserved;
    api->empty_cache = al_cu_empty_cache;
    api->memcpy_h2d = al_cu_memcpy_h2d;
    api->memcpy_d2h = al_cu_memcpy_d2h;
    api->memcpy_d2d = al_cu_memcpy_d2d;
    api->copy = al_cu_copy;
    api->fill = al_cu_fill;
    api->arange = al_cu_arange;
    api->random = al_cu_random;
    api->unary = al_cu_unary;
    api->binary = al_cu_binary;
    api->binary_scalar = al_cu_binary_scalar;
    api->where = al_cu_where;
    api->reduce = al_cu_reduce;
    api->max_dim = al_cu_max_dim;
    api->softmax = al_cu_softmax;
    api->matmul = al_cu_matmul;
    api->diff_stats = al_cu_diff_stats;
    api->event_new = al_cu_event_new;
    api->event_free = al_cu_event_free;
    api->event_record = al_cu_event_record;
    api->event_synchronize = al_cu_event_synchronize;
    api->event_elapsed = al_cu_event_elapsed;
    api->current_stream = al_cu_current_stream;
    api->stream_new = al_cu_stream_new;
    api->stream_free = al_cu_stream_free;
    api->stream_set = al_cu_stream_set;
    api->stream_synchronize = al_cu_stream_synchronize;
    api->stream_query = al_cu_stream_query;
    api->stream_wait_event = al_cu_stream_wait_event;
    api->event_record_on = al_cu_event_record_on;
    al_cu_fp8_fill_api(api);
    al_cu_fp8_ds_fill_api(api);
    api->debug_fault = al_cu_debug_fault;
    api->backend_info = plugin_backend_info;
    /* attention backends: a registration failure leaves that backend out (explain says so), it does
     * not make the plugin unusable */
    (void)al_cu_attn_fused_register();
    (void)al_cu_attn_unfused_register();
    (void)al_cu_attn_flash_register();
    return AL_OK;
}
