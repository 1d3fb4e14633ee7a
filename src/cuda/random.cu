/*
 * cuda/random.cu — random fills with the shared Philox4x32-10 mapping of src/numeric/philox.h.
 *
 * Element i (row-major over the view's shape, whatever its strides) of a fill at (seed, offset) is
 * al_random_store(..., seed, offset, i): the same function the CPU runs, so every device writes the
 * same bits. The core passes (seed, offset) and advances its generator; this file never touches
 * generator state. One thread per element, grid-stride; the view's dims are coalesced first
 * (which keeps the row-major numbering).
 */
#include "cuda/cuda_internal.h"
#include "numeric/philox.h"

__global__ void __launch_bounds__(AL_CU_THREADS) al_random_kernel(al_td d, int32_t kind, uint64_t seed,
                                                                 uint64_t offset, int64_t n, int64_t es) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        al_random_store(d.data + al_td_off1(i, d) * es, d.dtype, kind, seed, offset, (uint64_t)i);
}

al_status al_cu_random(al_tensor *dst, int32_t kind, uint64_t seed, uint64_t offset) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("random_", dst->device_index, &s));
    if (!al_dtype_is_float(dst->dtype))
        return al_error(AL_ERR_ARG, "random_ (cuda): expected a float dtype, got %s",
                        al_dtype_name(dst->dtype) ? al_dtype_name(dst->dtype) : "an unknown dtype");
    if (kind != AL_RANDOM_UNIFORM && kind != AL_RANDOM_NORMAL)
        return al_error(AL_ERR_ARG, "random_ (cuda): kind must be uniform (0) or normal (1), got %d", kind);
    al_td d = al_td_from(dst);
    int64_t n = al_td_numel(&d);
    if (n == 0) return AL_OK;
    al_td_coalesce(1, &d);
    al_random_kernel<<<al_cu_grid(dst->device_index, n), AL_CU_THREADS, 0, s>>>(d, kind, seed, offset, n,
                                                                                 al_dtype_size(dst->dtype));
    AL_CUDA_LAUNCHED_K("al_random_kernel");
    return AL_OK;
}
