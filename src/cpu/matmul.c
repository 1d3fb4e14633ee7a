/*
 * matmul.c — CPU batched matmul with CBLAS (OpenBLAS) over real strides.
 *
 * Input: a [B..., m, k], b [B..., k, n], out [B..., m, n] contiguous, same ndim >= 2, same batch
 * extents (stride 0 where a batch is broadcast); float dtypes. The front door (src/math.c) has
 * handled 1-d operands and batch broadcasting.
 *
 * Compute type: f64 (dgemm) when out is f64, else f32 (sgemm). Per batch, each operand matrix is
 * handed to CBLAS in place when its dtype is the compute type and one of its last two dims has unit
 * stride with a usable leading dimension (row-major NoTrans, or CblasTrans for a transposed
 * matrix); otherwise it is packed into a contiguous temporary (converting f16/bf16/... to f32). A
 * packed matrix is reused while consecutive batches point at the same elements (a broadcast batch).
 * When out is not the compute type (f16/bf16 out), each batch goes through an f32 temporary.
 * Batches run one after the other: OpenBLAS threads each gemm itself.
 */
#include "cpu/cpu_math.h"

#include <cblas.h>
#include <stdlib.h>

/* How one operand matrix [r, c] with strides (sr, sc) can be passed to row-major CBLAS. */
typedef struct {
    int direct;               /* usable in place */
    CBLAS_TRANSPOSE trans;    /* CblasNoTrans or CblasTrans when direct */
    int64_t ld;               /* leading dimension when direct */
} mat_plan;

static mat_plan plan_matrix(int32_t dtype, int32_t ct, int64_t r, int64_t c, int64_t sr, int64_t sc) {
    mat_plan p = {0, CblasNoTrans, 0};
    if (dtype != ct) return p;
    /* the stride of an extent-1 dim never matters, so it is ignored in both tests */
    if ((c <= 1 || sc == 1) && (r <= 1 || sr >= (c > 1 ? c : 1))) {
        p.direct = 1;
        p.trans = CblasNoTrans;
        p.ld = r <= 1 ? (c > 1 ? c : 1) : sr;
    } else if ((r <= 1 || sr == 1) && (c <= 1 || sc >= (r > 1 ? r : 1))) {
        p.direct = 1;
        p.trans = CblasTrans;
        p.ld = c <= 1 ? (r > 1 ? r : 1) : sc;
    }
    return p;
}

/* Copy matrix [r, c] at element offset off (strides sr, sc) of t into dense row-major buf of ct. */
static void pack_matrix(const al_tensor *t, int64_t off, int64_t r, int64_t c, int64_t sr, int64_t sc,
                        int32_t ct, void *buf) {
    for (int64_t i = 0; i < r; i++) {
        for (int64_t j = 0; j < c; j++) {
            int64_t src = off + i * sr + j * sc;
            double v;
            if (t->dtype == AL_DTYPE_F32) v = ((const float *)t->data)[src];
            else if (t->dtype == AL_DTYPE_F64) v = ((const double *)t->data)[src];
            else v = al_load_f64(t->data, t->dtype, src);
            if (ct == AL_DTYPE_F64) ((double *)buf)[i * c + j] = v;
            else ((float *)buf)[i * c + j] = (float)v;
        }
    }
}

/* Element offset of batch number bi (row-major over the batch dims) in t. */
static int64_t batch_offset(const al_tensor *t, int32_t nb, int64_t bi) {
    int64_t off = t->offset;
    for (int32_t d = nb - 1; d >= 0; d--) {
        int64_t e = t->size[d];
        off += (bi % e) * t->stride[d];
        bi /= e;
    }
    return off;
}

/* The operand's matrix for one batch, as a pointer CBLAS can read, packing (with reuse) when needed. */
typedef struct {
    const al_tensor *t;
    int64_t r, c, sr, sc;
    mat_plan plan;
    void *buf;           /* packing buffer (NULL when direct) */
    int64_t packed_off;  /* offset of the matrix in buf, -1 if none */
} operand;

static const void *operand_matrix(operand *op, int64_t off, int32_t ct, size_t esz, CBLAS_TRANSPOSE *trans,
                                  int64_t *ld) {
    if (op->plan.direct) {
        *trans = op->plan.trans;
        *ld = op->plan.ld;
        return (const char *)op->t->data + off * (int64_t)esz;
    }
    if (op->packed_off != off) {
        pack_matrix(op->t, off, op->r, op->c, op->sr, op->sc, ct, op->buf);
        op->packed_off = off;
    }
    *trans = CblasNoTrans;
    *ld = op->c > 1 ? op->c : 1;
    return op->buf;
}

al_status al_cpu_matmul(al_tensor *out, const al_tensor *a, const al_tensor *b) {
    int32_t nd = out->ndim, nb = nd - 2;
    int64_t m = a->size[nd - 2], k = a->size[nd - 1], n = b->size[nd - 1];
    int64_t batches = 1;
    for (int32_t d = 0; d < nb; d++) batches *= out->size[d];
    if (batches == 0 || m == 0 || n == 0) return AL_OK;
    if (k == 0) return al_tensor_fill_(out, 0.0);
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return al_error(AL_ERR_UNSUPPORTED, "matmul: matrix extents above 2^31 are not supported by CBLAS");

    int32_t ct = out->dtype == AL_DTYPE_F64 ? AL_DTYPE_F64 : AL_DTYPE_F32;
    size_t esz = ct == AL_DTYPE_F64 ? sizeof(double) : sizeof(float);
    operand A = {a, m, k, a->stride[nd - 2], a->stride[nd - 1], {0, CblasNoTrans, 0}, NULL, -1};
    operand B = {b, k, n, b->stride[nd - 2], b->stride[nd - 1], {0, CblasNoTrans, 0}, NULL, -1};
    A.plan = plan_matrix(a->dtype, ct, m, k, A.sr, A.sc);
    B.plan = plan_matrix(b->dtype, ct, k, n, B.sr, B.sc);
    int out_direct = out->dtype == ct;
    void *cbuf = NULL;
    al_status st = AL_OK;
    if (!A.plan.direct && !(A.buf = malloc((size_t)(m * k) * esz))) st = AL_ERR_OOM;
    if (!B.plan.direct && !(B.buf = malloc((size_t)(k * n) * esz))) st = AL_ERR_OOM;
    if (!out_direct && !(cbuf = malloc((size_t)(m * n) * esz))) st = AL_ERR_OOM;
    if (st != AL_OK) {
        free(A.buf); free(B.buf); free(cbuf);
        return al_error(AL_ERR_OOM, "matmul: cannot allocate packing buffers for [%lld,%lld] x [%lld,%lld]",
                        (long long)m, (long long)k, (long long)k, (long long)n);
    }

    for (int64_t bi = 0; bi < batches; bi++) {
        CBLAS_TRANSPOSE ta, tb;
        int64_t lda, ldb;
        const void *pa = operand_matrix(&A, batch_offset(a, nb, bi), ct, esz, &ta, &lda);
        const void *pb = operand_matrix(&B, batch_offset(b, nb, bi), ct, esz, &tb, &ldb);
        int64_t ooff = batch_offset(out, nb, bi);
        void *pc = out_direct ? (char *)out->data + ooff * (int64_t)esz : cbuf;
        if (ct == AL_DTYPE_F64)
            cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1.0, (const double *)pa, (int)lda,
                        (const double *)pb, (int)ldb, 0.0, (double *)pc, (int)n);
        else
            cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1.0f, (const float *)pa, (int)lda,
                        (const float *)pb, (int)ldb, 0.0f, (float *)pc, (int)n);
        if (!out_direct) {
            /* out is contiguous: batch bi occupies m*n consecutive elements from ooff */
            for (int64_t i = 0; i < m * n; i++) al_store_f64(out->data, out->dtype, ooff + i, ((float *)cbuf)[i]);
        }
    }
    free(A.buf);
    free(B.buf);
    free(cbuf);
    return AL_OK;
}
