/*
 * numeric_parity.cu — checks that src/numeric/{convert,detmath,philox}.h give the same bits on the
 * GPU as on the host: every f32 input (2^32) through the four narrow encoders, 2^28 hashed f64
 * inputs through the f64 encoders, every code through the decoders, and 2^26 elements of each random
 * rule (uniform/normal, every float dtype, via al_random_store). Needs a GPU; not part of `make test`.
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Xcompiler -fopenmp,-ffp-contract=off -Iinclude -Isrc \
 *        tests/cuda/numeric_parity.cu -o /tmp/parity && /tmp/parity
 * Prints "parity: N checks, M mismatches" and exits non-zero on any mismatch.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#include "numeric/philox.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(2); } } while (0)

static __host__ __device__ uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* f64 test input k: half raw bit patterns, half values near the narrow formats' ranges */
static __host__ __device__ double input64(uint64_t k) {
    uint64_t r = mix64(k);
    if (k & 1) return al_u64_as_f64(r);
    uint64_t e = 1023 - 40 + (mix64(r) % 61);
    return al_u64_as_f64((r & 0x800FFFFFFFFFFFFFull) | (e << 52));
}

__global__ void enc32_kernel(uint64_t base, int64_t n, uint64_t *out) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        float x = al_u32_as_f32((uint32_t)(base + j));
        out[j] = (uint64_t)al_f32_to_f16(x) | ((uint64_t)al_f32_to_bf16(x) << 16) |
                 ((uint64_t)al_f32_to_e4m3(x) << 32) | ((uint64_t)al_f32_to_e5m2(x) << 40);
    }
}
__global__ void enc64_kernel(uint64_t base, int64_t n, uint64_t *out) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        double x = input64(base + j);
        out[j] = (uint64_t)al_f64_to_f16(x) | ((uint64_t)al_f64_to_bf16(x) << 16) |
                 ((uint64_t)al_f64_to_e4m3(x) << 32) | ((uint64_t)al_f64_to_e5m2(x) << 40) |
                 ((uint64_t)(al_f32_as_u32((float)x) & 0xFFFFu) << 48);
    }
}
__global__ void dec_kernel(uint32_t *out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= 65536) return;
    out[4 * c] = al_f32_as_u32(al_f16_to_f32((uint16_t)c));
    out[4 * c + 1] = al_f32_as_u32(al_bf16_to_f32((uint16_t)c));
    out[4 * c + 2] = al_f32_as_u32(al_e4m3_to_f32((uint8_t)c));
    out[4 * c + 3] = al_f32_as_u32(al_e5m2_to_f32((uint8_t)c));
}
__global__ void rand_kernel(int32_t dtype, int32_t kind, uint64_t seed, uint64_t off, int64_t n, uint64_t *out) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        uint64_t v = 0;
        al_random_store(&v, dtype, kind, seed, off, (uint64_t)j);
        out[j] = v;
    }
}

static long long g_checks, g_bad;
static void compare(const char *what, const std::vector<uint64_t> &dev, const std::vector<uint64_t> &host) {
    long long bad = 0, first = -1;
#pragma omp parallel for reduction(+ : bad)
    for (long long j = 0; j < (long long)dev.size(); j++)
        if (dev[j] != host[j]) bad++;
    if (bad) {
        for (long long j = 0; j < (long long)dev.size(); j++)
            if (dev[j] != host[j]) { first = j; break; }
        fprintf(stderr, "  %s: %lld mismatches; first at %lld: dev %016llx host %016llx\n", what, bad, first,
                (unsigned long long)dev[first], (unsigned long long)host[first]);
    }
    g_checks += dev.size();
    g_bad += bad;
}

int main() {
    const int64_t chunk = 1ll << 28;
    uint64_t *d;
    CK(cudaMalloc(&d, chunk * sizeof(uint64_t)));
    std::vector<uint64_t> dev(chunk), host(chunk);
    /* all f32 inputs */
    for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
        enc32_kernel<<<4096, 256>>>(base, chunk, d);
        CK(cudaMemcpy(dev.data(), d, chunk * 8, cudaMemcpyDeviceToHost));
#pragma omp parallel for
        for (int64_t j = 0; j < chunk; j++) {
            float x = al_u32_as_f32((uint32_t)(base + j));
            host[j] = (uint64_t)al_f32_to_f16(x) | ((uint64_t)al_f32_to_bf16(x) << 16) |
                      ((uint64_t)al_f32_to_e4m3(x) << 32) | ((uint64_t)al_f32_to_e5m2(x) << 40);
        }
        compare("f32 encoders", dev, host);
    }
    /* f64 inputs */
    enc64_kernel<<<4096, 256>>>(12345, chunk, d);
    CK(cudaMemcpy(dev.data(), d, chunk * 8, cudaMemcpyDeviceToHost));
#pragma omp parallel for
    for (int64_t j = 0; j < chunk; j++) {
        double x = input64(12345 + j);
        host[j] = (uint64_t)al_f64_to_f16(x) | ((uint64_t)al_f64_to_bf16(x) << 16) |
                  ((uint64_t)al_f64_to_e4m3(x) << 32) | ((uint64_t)al_f64_to_e5m2(x) << 40) |
                  ((uint64_t)(al_f32_as_u32((float)x) & 0xFFFFu) << 48);
    }
    compare("f64 encoders", dev, host);
    /* decoders */
    {
        uint32_t *dd;
        CK(cudaMalloc(&dd, 65536 * 16));
        dec_kernel<<<256, 256>>>(dd);
        std::vector<uint32_t> dv(65536 * 4);
        CK(cudaMemcpy(dv.data(), dd, 65536 * 16, cudaMemcpyDeviceToHost));
        std::vector<uint64_t> a(65536 * 4), b(65536 * 4);
        for (int c = 0; c < 65536; c++) {
            b[4 * c] = al_f32_as_u32(al_f16_to_f32((uint16_t)c));
            b[4 * c + 1] = al_f32_as_u32(al_bf16_to_f32((uint16_t)c));
            b[4 * c + 2] = al_f32_as_u32(al_e4m3_to_f32((uint8_t)c));
            b[4 * c + 3] = al_f32_as_u32(al_e5m2_to_f32((uint8_t)c));
        }
        for (int j = 0; j < 65536 * 4; j++) a[j] = dv[j];
        compare("decoders", a, b);
        cudaFree(dd);
    }
    /* random rules */
    const int64_t nr = 1ll << 26;
    const int32_t dts[6] = {AL_DTYPE_F32, AL_DTYPE_F64, AL_DTYPE_F16, AL_DTYPE_BF16, AL_DTYPE_FP8_E4M3, AL_DTYPE_FP8_E5M2};
    dev.resize(nr);
    host.resize(nr);
    for (int k = 0; k < 6; k++)
        for (int kind = 0; kind < 2; kind++) {
            uint64_t seed = 0x5eed0000ull + k * 2 + kind, off = 0xfffffffffff00000ull;
            rand_kernel<<<4096, 256>>>(dts[k], kind, seed, off, nr, d);
            CK(cudaGetLastError());
            CK(cudaMemcpy(dev.data(), d, nr * 8, cudaMemcpyDeviceToHost));
#pragma omp parallel for
            for (int64_t j = 0; j < nr; j++) {
                uint64_t v = 0;
                al_random_store(&v, dts[k], kind, seed, off, (uint64_t)j);
                host[j] = v;
            }
            char what[64];
            snprintf(what, sizeof what, "random dtype %d kind %d", dts[k], kind);
            compare(what, dev, host);
        }
    printf("parity: %lld checks, %lld mismatches\n", g_checks, g_bad);
    return g_bad ? 1 : 0;
}
