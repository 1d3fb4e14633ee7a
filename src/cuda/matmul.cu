/*
 * cuda/matmul.cu — batched matmul with cuBLASLt over real strides.
 *
 *   out [B..., m, n] (contiguous) = a [B..., m, k] x b [B..., k, n], same ndim >= 2, same batch
 *   extents (stride 0 where broadcast).
 *
 * Row-major trick: out viewed column-major is out^T [n, m] (ld n) = b^T [n, k] x a^T [k, m], so
 * cuBLASLt's "A" is b and its "B" is a. A row-major operand X [r, c] with strides (sr, sc) is used in
 * place when one of its last two dims has unit stride and the other a valid leading dimension:
 *   sc == 1, sr >= c : column-major [c, r], ld sr, op N   (that is X^T)
 *   sr == 1, sc >= r : column-major [r, c], ld sc, op T   (X stored column-major, transposed)
 * (the stride of an extent-1 dim never matters). An operand with neither, or with a dtype cuBLASLt
 * cannot take here, becomes a contiguous temporary from the caching allocator, filled by al_cu_copy
 * (which also converts); dims it broadcasts (stride 0) stay broadcast in the temporary.
 *
 * Batches: the batch dims of out, a and b are coalesced jointly; the last coalesced batch dim runs
 * as one strided batch (stride 0 allowed for a broadcast operand), the others (only when their
 * strides do not merge, e.g. a broadcast in one dim only) are looped over on the host.
 *
 * Types: f64 -> CUBLAS_COMPUTE_64F; f32 -> CUBLAS_COMPUTE_32F (never TF32: this is the reference
 * path); f16/bf16 inputs -> f32 accumulation with f16/bf16 or f32 output. Other combinations (fp8,
 * mixed dtypes, f16 output from f32 inputs) compute in f32 from converted temporaries and convert
 * the result into out. Alignment preferences tell the heuristic the real pointer alignments, so
 * views at odd offsets get a kernel that can read them. One cuBLASLt handle per device and a 32 MiB workspace per call (from the caching allocator)
 * per device, created on first use and kept.
 */
#include "cuda/cuda_internal.h"
#include <pthread.h>

#define AL_CU_WORKSPACE_BYTES ((int64_t)32 << 20)

typedef struct {
    int ready;
    cublasLtHandle_t handle;
} al_mm_device;

static pthread_mutex_t g_mm_lock = PTHREAD_MUTEX_INITIALIZER;
static al_mm_device g_mm[AL_CU_MAX_DEVICES];

static al_status mm_device(int32_t dev, al_mm_device **out) {
    pthread_mutex_lock(&g_mm_lock);
    al_mm_device *d = &g_mm[dev];
    al_status st = AL_OK;
    if (!d->ready) {
        st = AL_CUBLAS_ST(cublasLtCreate(&d->handle));
        if (st == AL_OK) d->ready = 1;
    }
    pthread_mutex_unlock(&g_mm_lock);
    *out = d;
    return st;
}

/* An operand as cuBLASLt sees it. */
typedef struct {
    const char *data;             /* storage base (device) */
    int64_t offset;               /* elements */
    int32_t dtype;
    int64_t size[AL_MAX_DIMS], stride[AL_MAX_DIMS];
    int32_t ndim;
    /* plan for the last two dims */
    cublasOperation_t op;
    uint64_t rows, cols;          /* column-major layout */
    int64_t ld;
    /* temporary, when one was made */
    void *tmp;
    int64_t tmp_bytes;
} mm_operand;

static void operand_from(mm_operand *o, const al_tensor *t) {
    memset(o, 0, sizeof *o);
    o->data = (const char *)t->data;
    o->offset = t->offset;
    o->dtype = t->dtype;
    o->ndim = t->ndim;
    for (int32_t d = 0; d < t->ndim; d++) {
        o->size[d] = t->size[d];
        o->stride[d] = t->stride[d];
    }
}

/* Plan the last two dims [r, c]; 0 when they cannot be used in place. */
static int plan_matrix(mm_operand *o) {
    int64_t r = o->size[o->ndim - 2], c = o->size[o->ndim - 1];
    int64_t sr = o->stride[o->ndim - 2], sc = o->stride[o->ndim - 1];
    int64_t r1 = r > 1 ? r : 1, c1 = c > 1 ? c : 1;
    if ((c <= 1 || sc == 1) && (r <= 1 || sr >= c1)) {
        o->op = CUBLAS_OP_N;
        o->rows = (uint64_t)c1;
        o->cols = (uint64_t)r1;
        o->ld = r <= 1 ? c1 : sr;
        return 1;
    }
    if ((r <= 1 || sr == 1) && (c <= 1 || sc >= r1)) {
        o->op = CUBLAS_OP_T;
        o->rows = (uint64_t)r1;
        o->cols = (uint64_t)c1;
        o->ld = c <= 1 ? r1 : sc;
        return 1;
    }
    return 0;
}

/* Replace the operand by a contiguous temporary of dtype ct (broadcast batch dims kept broadcast). */
static al_status make_temporary(int32_t dev, mm_operand *o, int32_t ct) {
    al_tensor src, dst;
    memset(&src, 0, sizeof src);
    memset(&dst, 0, sizeof dst);
    src.data = (void *)o->data;
    src.offset = o->offset;
    src.ndim = dst.ndim = o->ndim;
    src.dtype = o->dtype;
    dst.dtype = ct;
    src.device_type = dst.device_type = AL_DEVICE_CUDA;
    src.device_index = dst.device_index = dev;
    int64_t numel = 1;
    for (int32_t d = 0; d < o->ndim; d++) {
        int bcast = d < o->ndim - 2 && o->stride[d] == 0;
        src.size[d] = dst.size[d] = bcast ? 1 : o->size[d];
        src.stride[d] = o->stride[d];
        numel *= src.size[d];
    }
    al_contiguous_strides(dst.ndim, dst.size, dst.stride);
    int64_t bytes = numel * al_dtype_size(ct);
    void *p = NULL;
    AL_TRY(al_cu_malloc(dev, bytes > 0 ? bytes : 1, &p));
    dst.data = p;
    al_status st = al_cu_copy(&dst, &src);
    if (st != AL_OK) {
        al_cu_free(dev, p, bytes > 0 ? bytes : 1);
        return st;
    }
    o->tmp = p;
    o->tmp_bytes = bytes > 0 ? bytes : 1;
    o->data = (const char *)p;
    o->offset = 0;
    o->dtype = ct;
    for (int32_t d = 0; d < o->ndim; d++) o->stride[d] = dst.size[d] == 1 && d < o->ndim - 2 ? 0 : dst.stride[d];
    return AL_OK;
}

static cudaDataType_t cuda_type(int32_t dtype) {
    switch (dtype) {
    case AL_DTYPE_F64: return CUDA_R_64F;
    case AL_DTYPE_F16: return CUDA_R_16F;
    case AL_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

/* Largest power of two (<= 256) dividing every nonzero value given. */
static uint32_t align_of(uint64_t x) {
    if (x == 0) return 256;
    uint32_t a = 1;
    while (a < 256 && (x & (uint64_t)(2 * a - 1)) == 0) a *= 2;
    return a;
}

typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
} mm_descs;

static void destroy_descs(mm_descs *d) {
    if (d->pref) cublasLtMatmulPreferenceDestroy(d->pref);
    if (d->ld) cublasLtMatrixLayoutDestroy(d->ld);
    if (d->lb) cublasLtMatrixLayoutDestroy(d->lb);
    if (d->la) cublasLtMatrixLayoutDestroy(d->la);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
}

static al_status set_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                            int32_t count, int64_t bstride) {
    AL_CUBLAS_TRY(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
    AL_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    AL_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bstride,
                                                   sizeof bstride));
    return AL_OK;
}

/* out (a real, contiguous, supported-dtype D) = a x b with both operands planned in place. */
static al_status run_gemm(int32_t dev, cudaStream_t s, char *outp, int32_t out_dtype, mm_operand *A, mm_operand *B,
                          int64_t m, int64_t n, int64_t k) {
    al_mm_device *md;
    AL_TRY(mm_device(dev, &md));
    void *workspace = NULL;   /* set before the gemm loop; declared here for the gotos */
    int32_t nd = A->ndim, nb = nd - 2;
    /* joint batch coalescing: out (contiguous), a, b */
    al_td bt[3];
    memset(bt, 0, sizeof bt);
    int64_t out_mat = m * n, ostr = out_mat;
    for (int32_t d = nb - 1; d >= 0; d--) {
        bt[0].stride[d] = ostr;
        ostr *= A->size[d];
    }
    for (int k3 = 0; k3 < 3; k3++) bt[k3].ndim = nb > 0 ? nb : 1;
    if (nb == 0) {
        for (int k3 = 0; k3 < 3; k3++) { bt[k3].size[0] = 1; bt[k3].stride[0] = 0; }
    } else {
        for (int32_t d = 0; d < nb; d++) {
            bt[0].size[d] = bt[1].size[d] = bt[2].size[d] = A->size[d];
            bt[1].stride[d] = A->stride[d];
            bt[2].stride[d] = B->stride[d];
        }
    }
    int64_t nbatch = al_td_numel(&bt[0]);
    if (nbatch == 0) return AL_OK;
    al_td_coalesce(3, bt);
    int32_t last = bt[0].ndim - 1;
    int64_t count = bt[0].size[last];
    int64_t outer = nbatch / count;
    if (count > INT32_MAX) return al_error(AL_ERR_UNSUPPORTED, "matmul (cuda): %lld batches in one strided batch", (long long)count);

    int64_t ea = al_dtype_size(A->dtype), eb = al_dtype_size(B->dtype), eo = al_dtype_size(out_dtype);
    /* alignment of every pointer any batch uses */
    uint32_t al_a = align_of((uint64_t)(uintptr_t)(A->data + A->offset * ea));
    uint32_t al_b = align_of((uint64_t)(uintptr_t)(B->data + B->offset * eb));
    uint32_t al_o = align_of((uint64_t)(uintptr_t)outp);
    for (int32_t d = 0; d <= last; d++) {
        uint32_t x;
        if ((x = align_of((uint64_t)(bt[1].stride[d] * ea))) < al_a) al_a = x;
        if ((x = align_of((uint64_t)(bt[2].stride[d] * eb))) < al_b) al_b = x;
        if ((x = align_of((uint64_t)(bt[0].stride[d] * eo))) < al_o) al_o = x;
    }

    int wide = out_dtype == AL_DTYPE_F64;
    cublasComputeType_t compute = wide ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    cudaDataType_t scale_t = wide ? CUDA_R_64F : CUDA_R_32F;
    double alpha_d = 1.0, beta_d = 0.0;
    float alpha_f = 1.0f, beta_f = 0.0f;
    const void *alpha = wide ? (const void *)&alpha_d : (const void *)&alpha_f;
    const void *beta = wide ? (const void *)&beta_d : (const void *)&beta_f;

    mm_descs ds;
    memset(&ds, 0, sizeof ds);
    al_status st = AL_OK;
    /* cuBLASLt A = b operand ([n, k] after its op), B = a operand ([k, m] after its op) */
    cublasOperation_t ta = B->op, tb = A->op;
    int32_t cnt = (int32_t)count;
    uint64_t wsize = (uint64_t)AL_CU_WORKSPACE_BYTES;
    cublasLtMatmulHeuristicResult_t heur;
    int nres = 0;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulDescCreate(&ds.op, compute, scale_t))) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta))) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))) != AL_OK) goto done;
    if ((st = set_layout(&ds.la, cuda_type(B->dtype), B->rows, B->cols, B->ld, cnt, bt[2].stride[last])) != AL_OK) goto done;
    if ((st = set_layout(&ds.lb, cuda_type(A->dtype), A->rows, A->cols, A->ld, cnt, bt[1].stride[last])) != AL_OK) goto done;
    if ((st = set_layout(&ds.ld, cuda_type(out_dtype), (uint64_t)n, (uint64_t)m, n, cnt, bt[0].stride[last])) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulPreferenceCreate(&ds.pref))) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsize,
                                                                sizeof wsize))) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b,
                                                                sizeof al_b))) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a,
                                                                sizeof al_a))) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_o,
                                                                sizeof al_o))) != AL_OK) goto done;
    if ((st = AL_CUBLAS_ST(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_o,
                                                                sizeof al_o))) != AL_OK) goto done;
    memset(&heur, 0, sizeof heur);
    if ((st = AL_CUBLAS_ST(cublasLtMatmulAlgoGetHeuristic(md->handle, ds.op, ds.la, ds.lb, ds.ld, ds.ld, ds.pref, 1,
                                                          &heur, &nres))) != AL_OK) goto done;
    if (nres < 1) {
        st = al_error(AL_ERR_CUDA,
                      "matmul (cuda): cuBLASLt found no algorithm for %s x %s -> %s, m=%lld n=%lld k=%lld, batch %lld, "
                      "alignments a=%u b=%u out=%u bytes",
                      al_dtype_name(A->dtype), al_dtype_name(B->dtype), al_dtype_name(out_dtype), (long long)m,
                      (long long)n, (long long)k, (long long)count, al_a, al_b, al_o);
        goto done;
    }
    /* The workspace comes from the caching allocator on this call's stream (a cache hit after the
     * first call), so gemms queued on different user streams never share one. */
    if ((st = al_cu_malloc(dev, AL_CU_WORKSPACE_BYTES, &workspace)) != AL_OK) goto done;
    for (int64_t ob = 0; ob < outer; ob++) {
        /* offsets of outer batch ob over the coalesced dims before `last` */
        int64_t oa = A->offset, obb = B->offset, oo = 0, rem = ob;
        for (int32_t d = last - 1; d >= 0; d--) {
            int64_t c = rem % bt[0].size[d];
            rem /= bt[0].size[d];
            oo += c * bt[0].stride[d];
            oa += c * bt[1].stride[d];
            obb += c * bt[2].stride[d];
        }
        al_cu_note_launch("cublasLtMatmul");
        st = AL_CUBLAS_ST(cublasLtMatmul(md->handle, ds.op, alpha, B->data + obb * eb, ds.la, A->data + oa * ea, ds.lb,
                                         beta, outp + oo * eo, ds.ld, outp + oo * eo, ds.ld, &heur.algo, workspace,
                                         (size_t)wsize, s));
        if (st != AL_OK) break;
    }
    al_cu_free(dev, workspace, AL_CU_WORKSPACE_BYTES);
done:
    destroy_descs(&ds);
    return st;
}

al_status al_cu_matmul(al_tensor *out, const al_tensor *a, const al_tensor *b) {
    cudaStream_t s;
    int32_t dev = out->device_index;
    AL_TRY(al_cu_begin("matmul", dev, &s));
    int32_t nd = out->ndim;
    if (nd < 2 || a->ndim != nd || b->ndim != nd)
        return al_error(AL_ERR_INTERNAL, "matmul (cuda): expected out, a, b with one ndim >= 2, got %d, %d, %d", nd, a->ndim,
                        b->ndim);
    if (a->device_index != dev || b->device_index != dev)
        return al_error(AL_ERR_INTERNAL, "matmul (cuda): operands on different devices");
    int64_t m = a->size[nd - 2], k = a->size[nd - 1], n = b->size[nd - 1];
    if (b->size[nd - 2] != k || out->size[nd - 2] != m || out->size[nd - 1] != n)
        return al_error(AL_ERR_INTERNAL, "matmul (cuda): inner or outer extents disagree");
    for (int32_t d = 0; d < nd - 2; d++)
        if (a->size[d] != out->size[d] || b->size[d] != out->size[d])
            return al_error(AL_ERR_INTERNAL, "matmul (cuda): batch extents disagree at dim %d", d);
    if (!al_dtype_is_float(a->dtype) || !al_dtype_is_float(b->dtype) || !al_dtype_is_float(out->dtype))
        return al_error(AL_ERR_ARG, "matmul (cuda): expected float dtypes, got %s x %s -> %s", al_dtype_name(a->dtype),
                        al_dtype_name(b->dtype), al_dtype_name(out->dtype));
    if (!al_td_dense(out)) return al_error(AL_ERR_INTERNAL, "matmul (cuda): out must be contiguous");
    int64_t numel = 1;
    for (int32_t d = 0; d < nd; d++) numel *= out->size[d];
    if (numel == 0) return AL_OK;
    if (k == 0) return al_cu_fill(out, 0.0);

    /* which dtypes cuBLASLt gets */
    int32_t od = out->dtype, in_t, d_t;
    if (od == AL_DTYPE_F64) {
        in_t = d_t = AL_DTYPE_F64;
    } else if (a->dtype == b->dtype && (a->dtype == AL_DTYPE_F16 || a->dtype == AL_DTYPE_BF16) &&
               (od == a->dtype || od == AL_DTYPE_F32)) {
        in_t = a->dtype;
        d_t = od;
    } else {
        in_t = AL_DTYPE_F32;
        d_t = AL_DTYPE_F32;
    }

    mm_operand A, B;
    operand_from(&A, a);
    operand_from(&B, b);
    al_status st = AL_OK;
    void *tmp_out = NULL;
    int64_t tmp_out_bytes = 0;
    if (A.dtype != in_t || !plan_matrix(&A)) {
        if ((st = make_temporary(dev, &A, in_t)) != AL_OK) goto done;
        if (!plan_matrix(&A)) { st = al_error(AL_ERR_INTERNAL, "matmul (cuda): contiguous temporary not usable"); goto done; }
    }
    if (B.dtype != in_t || !plan_matrix(&B)) {
        if ((st = make_temporary(dev, &B, in_t)) != AL_OK) goto done;
        if (!plan_matrix(&B)) { st = al_error(AL_ERR_INTERNAL, "matmul (cuda): contiguous temporary not usable"); goto done; }
    }
    if (d_t == od) {
        st = run_gemm(dev, s, (char *)al_tensor_data_ptr(out), od, &A, &B, m, n, k);
    } else {
        tmp_out_bytes = numel * al_dtype_size(d_t);
        if ((st = al_cu_malloc(dev, tmp_out_bytes, &tmp_out)) != AL_OK) goto done;
        if ((st = run_gemm(dev, s, (char *)tmp_out, d_t, &A, &B, m, n, k)) != AL_OK) goto done;
        al_tensor src = *out;   /* descriptor only: never released */
        src.data = tmp_out;
        src.offset = 0;
        src.dtype = d_t;
        src.storage = NULL;
        al_contiguous_strides(nd, src.size, src.stride);
        st = al_cu_copy(out, &src);
    }
done:
    /* stream-ordered: the blocks go back to the cache; later work on this stream runs after the gemm */
    if (tmp_out) al_cu_free(dev, tmp_out, tmp_out_bytes);
    if (A.tmp) al_cu_free(dev, A.tmp, A.tmp_bytes);
    if (B.tmp) al_cu_free(dev, B.tmp, B.tmp_bytes);
    return st;
}
