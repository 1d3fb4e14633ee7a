/*
 * cuda/fp8_delayed.cu — delayed scaling kept on the device (al_fp8_ds, src/fp8_delayed.c): the update that
 * appends each chosen slot's accumulated amax to its history and recomputes its scale, queued on the current
 * stream so that no training step waits for the GPU to choose its scales (TransformerEngine's way).
 *
 *   al_fp8_ds_update_kernel  one block, one warp per slot: lane 0 moves the accumulator into the ring, the
 *                            warp reduces the recorded history (NaN wins; the max does not depend on the
 *                            order, so the CPU's sequential loop gives the same value), lane 0 sets last_used
 *                            and the new scale with numeric/fp8_delayed.h's arithmetic (the host recipe's bits)
 *
 * The quantise that reads its scale on the device and adds its amax to an accumulator is fp8.cu's
 * (fp8_quantize_dev); the fused FP8 attention reads and accumulates the same state (attn_fused_fp8.cu).
 */
#include "cuda/cuda_internal.h"
#include "numeric/fp8_delayed.h"

__global__ void __launch_bounds__(192) al_fp8_ds_update_kernel(double *st, al_fp8_ds_step p) {
    const int s = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
    if (s >= 6 || !(p.mask & (1u << s))) return;   /* (whole warps leave together) */
    const int64_t H = p.history_len, c = p.count[s];
    double *h = st + s * H, *acc = st + AL_FP8_DS_ACC(H) + s;
    double a = 0.0;
    if (lane == 0) {
        a = *acc;
        *acc = 0.0;
        h[c % H] = a;
    }
    a = __shfl_sync(0xffffffffu, a, 0);
    __syncwarp();   /* (orders lane 0's store to the ring before the other lanes read it) */
    double m = a;
    if (p.algo == 0) {
        const int64_t n = c + 1 < H ? c + 1 : H;
        m = 0.0;
        for (int64_t i = lane; i < n; i += 32) m = al_fp8_ds_max(m, h[i]);
        for (int o = 16; o > 0; o >>= 1) m = al_fp8_ds_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    if (lane == 0) {
        double *scale = st + AL_FP8_DS_SCALE(H) + s;
        st[AL_FP8_DS_USED(H) + s] = *scale;
        *scale = al_fp8_ds_scale(*scale, m, p.fmax[s], p.pow2_margin);
    }
}

static al_status cu_ds_update(int32_t dev, double *state, const al_fp8_ds_step *step) {
    cudaStream_t s;
    AL_TRY(al_cu_begin("fp8_ds_update", dev, &s));
    al_fp8_ds_update_kernel<<<1, 192, 0, s>>>(state, *step);
    AL_CUDA_LAUNCHED_K("al_fp8_ds_update_kernel");
    return AL_OK;
}

void al_cu_fp8_ds_fill_api(al_cuda_api *api) { api->fp8_ds_update = cu_ds_update; }
