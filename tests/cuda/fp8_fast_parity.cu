/*
 * fp8_fast_parity.cu — checks src/cuda/fp8_fast.h (the hardware FP8 encoders of the dense convert
 * kernel) against numeric/convert.h's software encoders ON THE DEVICE, for every f32 input (2^32,
 * e4m3 and e5m2) and every f16 input widened with al_f16_widen_hw (65,536). The software encoders
 * give the host's bits on the device (tests/cuda/numeric_parity.cu), so equality here is CPU/GPU
 * bit-identity of the fast path. Needs an sm_89+ GPU; not part of `make test`.
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Iinclude -Isrc tests/cuda/fp8_fast_parity.cu -o /tmp/fp8p && /tmp/fp8p
 * Prints the counts and exits non-zero on any mismatch (or when the hardware path never ran).
 */
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "cuda/fp8_fast.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(2); } } while (0)

/* out: [0] e4m3 mismatches, [1] e5m2 mismatches, [2] groups taken by the hardware, [3] first bad input */
template <int E4M3>
static __device__ void check4(const uint32_t u[4], const float f[4], unsigned long long *out, unsigned long long *hw) {
    uint32_t c;
    if (!al_fp8x4_hw<E4M3>(f[0], f[1], f[2], f[3], &c)) return;   /* NaN groups: software by construction */
    ++*hw;
    for (int j = 0; j < 4; j++) {
        float x = __uint_as_float(u[j]);
        uint32_t want = E4M3 ? al_f32_to_e4m3(x) : al_f32_to_e5m2(x);
        if (((c >> (8 * j)) & 0xFFu) != want) {
            atomicAdd(&out[E4M3 ? 0 : 1], 1ull);
            atomicCAS(&out[3], 0ull, 0x100000000ull | u[j]);
        }
    }
}

__global__ void f32_kernel(unsigned long long *out) {
    unsigned long long hw = 0;
    /* group g holds inputs 4g..4g+3, so every pattern is checked once, in every lane position over
     * the run (neighbours differ in the low bits only, so NaN groups are NaN-only: all skipped) */
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < (1ull << 30);
         g += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t u[4];
        float f[4];
        for (int j = 0; j < 4; j++) {
            u[j] = (uint32_t)(4 * g + (uint64_t)j);
            f[j] = __uint_as_float(u[j]);
        }
        check4<1>(u, f, out, &hw);
        check4<0>(u, f, out, &hw);
    }
    atomicAdd(&out[2], hw);
}

__global__ void f16_kernel(unsigned long long *out) {
    uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= 65536 / 4) return;
    uint32_t u[4];
    float f[4];
    for (int j = 0; j < 4; j++) {
        uint16_t h = (uint16_t)(4 * g + j);
        f[j] = al_f16_widen_hw(h);
        u[j] = __float_as_uint(al_f16_to_f32(h));   /* the software widening: the reference input */
        if (f[j] == f[j] && __float_as_uint(f[j]) != u[j]) {
            atomicAdd(&out[0], 1ull);               /* the hardware widening must be exact */
            atomicCAS(&out[3], 0ull, 0x200000000ull | h);
        }
    }
    unsigned long long hw = 0;
    check4<1>(u, f, out, &hw);
    check4<0>(u, f, out, &hw);
    atomicAdd(&out[2], hw);
}

int main() {
    unsigned long long *d, h[4];
    CK(cudaMalloc(&d, sizeof h));
    CK(cudaMemset(d, 0, sizeof h));
    f32_kernel<<<132 * 16, 256>>>(d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    printf("fp8_fast f32: e4m3 mismatches %llu, e5m2 mismatches %llu, hardware groups %llu of %llu, first bad %llx\n",
           h[0], h[1], h[2], 2ull << 30, h[3]);
    int bad = h[0] || h[1] || h[2] == 0;
    CK(cudaMemset(d, 0, sizeof h));
    f16_kernel<<<64, 256>>>(d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    printf("fp8_fast f16: mismatches e4m3 %llu e5m2 %llu, hardware groups %llu, first bad %llx\n", h[0], h[1], h[2], h[3]);
    bad |= h[0] || h[1] || h[2] == 0;
    printf("fp8_fast parity: %s\n", bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
}
