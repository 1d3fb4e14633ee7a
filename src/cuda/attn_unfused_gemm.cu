/*
 * cuda/attn_unfused_gemm.cu — the unfused attention backend's matrix multiply: a row-major, strided,
 * batched GEMM D = alpha X Y + beta D on cuBLASLt, with f32 accumulation (CUBLAS_COMPUTE_32F: true
 * f32 for f32 inputs, never TF32), X and Y in f32, f16 or bf16, D in f32.
 *
 * Row-major to column-major: D^T (N x M, ld_d) = Y^T (N x K) X^T (K x M). A logical row-major
 * matrix with column stride 1 is a column-major matrix of the transposed shape with ld = row
 * stride (op N); one with row stride 1 is a column-major matrix of its own shape with ld = column
 * stride (op T). Anything else (both strides > 1, overlapping rows, negative strides) is not
 * expressible and is reported as AL_ERR_UNSUPPORTED so the caller can fall back to contiguous
 * copies. This is what lets q/k/v be read straight out of a packed buffer (select views with any
 * outer strides): the head and batch strides become pointer offsets and batch strides.
 *
 * Alignment: cuBLASLt assumes 256-byte aligned pointers unless told otherwise, so the real alignment
 * of every operand (its base address, its batch stride and its leading dimension in bytes) is passed
 * as the MIN_ALIGNMENT preferences; views into packed buffers are often only 2-16 byte aligned.
 *
 * One cuBLASLt handle per device, created on first use (guarded by a mutex). The workspace is the
 * caller's (one per attention call).
 */
#include "cuda/attn_unfused.h"
#include <pthread.h>

static pthread_mutex_t g_lt_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t g_lt[AL_CU_MAX_DEVICES];

static al_status lt_handle(int32_t dev, cublasLtHandle_t *h) {
    pthread_mutex_lock(&g_lt_lock);
    al_status st = AL_OK;
    if (!g_lt[dev]) st = AL_CUBLAS_ST(cublasLtCreate(&g_lt[dev]));
    *h = g_lt[dev];
    pthread_mutex_unlock(&g_lt_lock);
    return st;
}

static int cuda_type(int32_t dtype, cudaDataType_t *t) {
    switch (dtype) {
    case AL_DTYPE_F32: *t = CUDA_R_32F; return 1;
    case AL_DTYPE_F16: *t = CUDA_R_16F; return 1;
    case AL_DTYPE_BF16: *t = CUDA_R_16BF; return 1;
    default: return 0;
    }
}

/* Largest power of two (<= 256) dividing every nonzero value. */
static uint32_t alignment_of(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = a | b | c | 256u;
    return (uint32_t)(x & (~x + 1u));
}

/* One BLAS operand: column-major rows x cols with ld, op, batch stride (elements). */
typedef struct {
    uint64_t rows, cols;
    int64_t ld, bs;
    cublasOperation_t op;
} blas_operand;

/* The column-major form of the TRANSPOSE of the logical row-major matrix m (rows x cols): that is
 * what enters cuBLAS (D^T = Y^T X^T). Returns 0 when not expressible. */
static int transposed_operand(const al_ua_mat *m, blas_operand *o) {
    int64_t rs = m->rs, cs = m->cs;
    if (m->cols == 1) cs = 1;
    if (m->rows == 1) rs = cs == 1 ? m->cols : 1;
    if (m->rows == 1 && m->cols == 1) { rs = 1; cs = 1; }
    if (cs == 1 && rs >= m->cols && rs > 0) {
        /* row-major storage = column-major (cols x rows), ld = rs: already the transpose */
        o->rows = (uint64_t)m->cols; o->cols = (uint64_t)m->rows; o->ld = rs; o->op = CUBLAS_OP_N;
    } else if (rs == 1 && cs >= m->rows && cs > 0) {
        /* column-major storage (rows x cols), ld = cs: transpose it in the op */
        o->rows = (uint64_t)m->rows; o->cols = (uint64_t)m->cols; o->ld = cs; o->op = CUBLAS_OP_T;
    } else {
        return 0;
    }
    o->bs = m->bs;
    return 1;
}

static al_status make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                             int64_t batch, int64_t bs) {
    AL_CUBLAS_TRY(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        AL_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        AL_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bs, sizeof bs));
    }
    return AL_OK;
}

al_status al_ua_gemm(int32_t dev, cudaStream_t s, const al_ua_mat *X, const al_ua_mat *Y, float *D, int64_t ld_d,
                     int64_t bs_d, int64_t batch, float alpha, float beta, void *ws, size_t ws_bytes) {
    const int64_t M = X->rows, K = X->cols, N = Y->cols;
    if (Y->rows != K)
        return al_error(AL_ERR_INTERNAL, "attention (unfused): GEMM inner extents differ (%lld vs %lld)", (long long)K,
                        (long long)Y->rows);
    if (M == 0 || N == 0 || K == 0 || batch == 0) return AL_OK;
    if (batch > INT32_MAX)
        return al_error(AL_ERR_UNSUPPORTED, "attention (unfused): GEMM batch %lld exceeds cuBLASLt's limit", (long long)batch);
    cudaDataType_t tx, ty;
    if (!cuda_type(X->dtype, &tx) || !cuda_type(Y->dtype, &ty) || X->dtype != Y->dtype)
        return al_error(AL_ERR_UNSUPPORTED, "attention (unfused): GEMM operands %s x %s are not one of f32, f16, bf16 "
                        "(same dtype)", al_dtype_name(X->dtype), al_dtype_name(Y->dtype));
    if (X->rs < 0 || X->cs < 0 || Y->rs < 0 || Y->cs < 0 || X->bs < 0 || Y->bs < 0)
        return al_error(AL_ERR_UNSUPPORTED, "attention (unfused): negative strides are not expressible to cuBLASLt");
    /* cuBLAS A = Y^T (N x K), B = X^T (K x M), C = D = D^T (N x M, ld_d) */
    blas_operand a, b;
    if (!transposed_operand(Y, &a) || !transposed_operand(X, &b))
        return al_error(AL_ERR_UNSUPPORTED, "attention (unfused): operand strides (%lld,%lld) / (%lld,%lld) are not a "
                        "BLAS layout", (long long)X->rs, (long long)X->cs, (long long)Y->rs, (long long)Y->cs);
    if (ld_d < N) return al_error(AL_ERR_INTERNAL, "attention (unfused): GEMM output ld %lld < %lld", (long long)ld_d, (long long)N);
    /* a: Y^T wanted as N x K. transposed_operand gives either (N x K, op N) or (K x N, op T). */
    const int64_t es = al_dtype_size(X->dtype);
    cublasLtHandle_t h;
    AL_TRY(lt_handle(dev, &h));

    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    al_status st = AL_OK;
#define UA_TRY(expr) do { if (st == AL_OK) st = (expr); } while (0)
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)));
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &a.op, sizeof a.op)));
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &b.op, sizeof b.op)));
    UA_TRY(make_layout(&la, ty, a.rows, a.cols, a.ld, batch, a.bs));
    UA_TRY(make_layout(&lb, tx, b.rows, b.cols, b.ld, batch, b.bs));
    UA_TRY(make_layout(&lc, CUDA_R_32F, (uint64_t)N, (uint64_t)M, ld_d, batch, bs_d));
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulPreferenceCreate(&pref)));
    uint64_t wsb = (uint64_t)ws_bytes;
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb)));
    uint32_t al_a = alignment_of((uint64_t)(uintptr_t)Y->ptr, batch > 1 ? (uint64_t)(a.bs * es) : 0, (uint64_t)(a.ld * es));
    uint32_t al_b = alignment_of((uint64_t)(uintptr_t)X->ptr, batch > 1 ? (uint64_t)(b.bs * es) : 0, (uint64_t)(b.ld * es));
    uint32_t al_c = alignment_of((uint64_t)(uintptr_t)D, batch > 1 ? (uint64_t)(bs_d * 4) : 0, (uint64_t)(ld_d * 4));
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a)));
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b)));
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c)));
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c)));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (st == AL_OK) {
        memset(&res, 0, sizeof res);
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found);
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0))
            st = al_error(AL_ERR_UNSUPPORTED, "attention (unfused): cuBLASLt has no algorithm for this GEMM "
                          "(M=%lld N=%lld K=%lld batch=%lld, alignments %u/%u/%u bytes)", (long long)M, (long long)N,
                          (long long)K, (long long)batch, al_a, al_b, al_c);
        else st = AL_CUBLAS_ST(hs);
    }
    al_cu_note_launch("cublasLtMatmul");
    UA_TRY(AL_CUBLAS_ST(cublasLtMatmul(h, op, &alpha, Y->ptr, la, X->ptr, lb, &beta, D, lc, D, lc, &res.algo, ws,
                                       ws_bytes, s)));
#undef UA_TRY
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}
