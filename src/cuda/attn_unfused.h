/*
 * cuda/attn_unfused.h — declarations shared by the files of the `unfused` attention backend (the GPU
 * reference), all hidden inside the CUDA plugin:
 *
 *   attn_unfused.cu          the backend: supports / forward / backward orchestration, registration
 *   attn_unfused_gemm.cu     row-major batched GEMM on cuBLASLt over arbitrary (real) strides
 *   attn_unfused_kernels.cu  the kernels: masked softmax, gather/scatter, backward element-wise
 *                            dS, per-row D, dbias and d softmax_offset reductions
 *
 * The backend materialises the f32 score matrix [b, h, sq, skv] (O(s^2) memory: it is the
 * reference, not the fast path). al_ua_dev is the resolved plan (attention_internal.h) in device
 * memory, passed to kernels by value.
 *
 * Include order matters while src/internal.h has no extern "C" guard: attention_internal.h (and
 * with it internal.h) is included with C linkage here first, so al_error and
 * al_attn_register_backend resolve to the core library's unmangled symbols.
 */
#ifndef ATTNLAB_CUDA_ATTN_UNFUSED_H
#define ATTNLAB_CUDA_ATTN_UNFUSED_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "attention_internal.h"
}
#include "cuda/cuda_internal.h"

/* The plan on the device. Pointers are device addresses (NULL when absent). */
typedef struct al_ua_dev {
    int64_t B, H, HG, SQ, SKV, DQK, DV, group;
    const int64_t *q_start, *kv_start, *q_rows, *kv_rows, *diag;   /* [B] */
    const uint8_t *q_valid, *kv_valid;                             /* [B*SQ], [B*SKV] */
    const float *alibi;                                            /* [B*H] */
    const float *sink;                                             /* [H] (f32, as the CPU's f32 compute) */
    const double *sink_d;                                          /* [H] (for d softmax_offset) */
    const uint8_t *arb;                                            /* arbitrary mask bytes (storage base) */
    int64_t arb_off, arb_s[4];
    const char *bias;                                              /* bias storage base */
    int32_t bias_dtype, bias_type;                                 /* al_attn_bias */
    int64_t bias_off, bias_s[4];
    int64_t wl, wr;                                                /* window, -1 = unbounded */
    float scale, keep_prob, dscale;
    int32_t dropout;
    uint64_t seed, offset;
    /* FP8 emulation (attn_unfused.cu, ua_forward_fp8 / ua_backward_fp8; f8 = 0: off): the S slot in the forward softmax and in the backward's
     * dS kernel, the dP slot in the latter, as the CPU emulation (src/cpu/attention_*_tmpl.h) does them. Formats,
     * scales (< 0: the slot is not quantised) and device amax accumulators [2]: S, dP (max, NaN wins) */
    int32_t f8, f8_fwd, f8_bwd;
    double f8_sS, f8_sdP;
    double *f8_amax;
} al_ua_dev;

/* A q/k/v/out-like operand: element (b, head, row, col) lives at element offset
 *   b*s_b + head*s_h + start[b]*s_tok + row*s_r + col*s_c
 * from base (base already includes the tensor's storage offset). start is a host array (NULL = 0)
 * for the GEMM helpers, a device array for kernels. */
typedef struct al_ua_op {
    const char *base;
    int32_t dtype;
    int64_t s_b, s_h, s_tok, s_r, s_c;
    const int64_t *start;
} al_ua_op;

/* A logical row-major matrix [rows, cols] (element (r, c) at r*rs + c*cs), batch stride bs, all in
 * elements of dtype. */
typedef struct al_ua_mat {
    const void *ptr;
    int32_t dtype;
    int64_t rows, cols, rs, cs, bs;
} al_ua_mat;

/* attn_unfused_gemm.cu: D[M,N] (f32, row stride ld_d, batch stride bs_d) = alpha X[M,K] Y[K,N] + beta D,
 * batched. X and Y: f32, f16 or bf16 (the same dtype), any strides that a BLAS layout can express
 * (one of the two strides of each must be 1). Returns AL_ERR_UNSUPPORTED (message set) when a layout
 * is not expressible or cuBLASLt has no algorithm for the alignment; the caller then gathers the
 * operands into contiguous f32 copies. K == 0 leaves D untouched. */
AL_CU_HIDDEN al_status al_ua_gemm(int32_t dev, cudaStream_t s, const al_ua_mat *X, const al_ua_mat *Y, float *D,
                                  int64_t ld_d, int64_t bs_d, int64_t batch, float alpha, float beta, void *ws,
                                  size_t ws_bytes);
#define AL_UA_WORKSPACE_BYTES ((size_t)32 << 20)

/* attn_unfused_kernels.cu (launchers; every one checks its launch) */
/* S [B,H,SQ,SKV] raw q.k -> normalised (and dropped-out) probabilities in place; lse [B*H*SQ] f32;
 * max_logit [H] f32 (pre-filled with -inf) or NULL. */
AL_CU_HIDDEN al_status al_ua_softmax_fwd(int32_t dev, cudaStream_t s, const al_ua_dev *P, float *S, float *lse,
                                         float *max_logit);
/* dst [B, heads, rows_max, D] f32 (zero past rows[b]) <- op (any dtype; start/rows device arrays). */
AL_CU_HIDDEN al_status al_ua_gather(int32_t dev, cudaStream_t s, const al_ua_op *op, const int64_t *rows, int64_t B,
                                    int64_t heads, int64_t rows_max, int64_t D, float *dst);
/* op (any float dtype) <- src [B, heads, rows_max, D] f32, rows < rows[b] only. */
AL_CU_HIDDEN al_status al_ua_scatter(int32_t dev, cudaStream_t s, const float *src, const al_ua_op *op,
                                     const int64_t *rows, int64_t B, int64_t heads, int64_t rows_max, int64_t D);
/* Per query row: Drow = sum_d dO*O (f64 accumulation, as the CPU), lse as f32 (row not ok -> +inf),
 * and the learnable-sink term -exp(offset_h - lse) * Drow (rowc, NULL when not needed). out and dout
 * are q-like ops with start = q_start; lse element (b,h,i) at lse_base[lse_off + b*ls0 + h*ls1 + i*ls2]. */
AL_CU_HIDDEN al_status al_ua_rows_bwd(int32_t dev, cudaStream_t s, const al_ua_dev *P, const al_ua_op *out,
                                      const al_ua_op *dout, const char *lse_base, int32_t lse_dtype, int64_t lse_off,
                                      const int64_t ls[3], float *Drow, float *Lrow, double *rowc);
/* A = S (raw q.k) -> dS (unscaled), Bm = dO V^T -> P * dropout keep/(1-p). */
AL_CU_HIDDEN al_status al_ua_ds_bwd(int32_t dev, cudaStream_t s, const al_ua_dev *P, float *A, float *Bm,
                                    const float *Lrow, const float *Drow);
/* dbias (contiguous, shape bsize[4], dtype) = factor * dS summed over the broadcast dims. */
AL_CU_HIDDEN al_status al_ua_dbias(int32_t dev, cudaStream_t s, const al_ua_dev *P, const float *A,
                                   const int64_t bsize[4], double factor, char *dbias, int32_t dtype);
/* d_offset[h] (f32) = sum over b, i of rowc (fixed order). */
AL_CU_HIDDEN al_status al_ua_doffset(int32_t dev, cudaStream_t s, const al_ua_dev *P, const double *rowc,
                                     float *d_offset);

/* attn_unfused.cu also defines al_cu_attn_unfused_register (declared in cuda_internal.h, called by
 * plugin.cu's init). */

#endif /* ATTNLAB_CUDA_ATTN_UNFUSED_H */
