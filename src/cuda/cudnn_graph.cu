/*
 * cuda/cudnn_graph.cu — thin helpers over cuDNN's backend API (see cudnn_graph.h): descriptor
 * creation, attribute setting and finalization with every failure turned into
 * al_error(AL_ERR_CUDA, "cuDNN <what>: <cudnnGetErrorString>"), plan building from an operation
 * graph, and execution through a variant pack.
 */
#include "cuda/cudnn_graph.h"
#include "cuda/host_profile.h"
#include <pthread.h>
#include <stdlib.h>

al_status al_dnn_status(cudnnStatus_t s, const char *what) {
    if (s == CUDNN_STATUS_SUCCESS) return AL_OK;
    return al_error(AL_ERR_CUDA, "cuDNN %s: %s", what, cudnnGetErrorString(s));
}

void al_dnn_graph_init(al_dnn_graph *g) {
    memset(g, 0, sizeof *g);
    g->next_vuid = AL_DNN_VIRTUAL_UID0;
    g->st = AL_OK;
}

void al_dnn_graph_free(al_dnn_graph *g) {
    for (int i = g->ndesc - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->desc[i]);
    g->ndesc = 0;
    g->nops = 0;
}

/* ---- sticky-error primitives ------------------------------------------------------------------- */
static int ok(al_dnn_graph *g) { return g->st == AL_OK; }

static void check(al_dnn_graph *g, cudnnStatus_t s, const char *what) {
    if (ok(g) && s != CUDNN_STATUS_SUCCESS) g->st = al_dnn_status(s, what);
}

static al_dnn mk(al_dnn_graph *g, cudnnBackendDescriptorType_t t, const char *what) {
    if (!ok(g)) return NULL;
    if (g->ndesc >= AL_DNN_MAX_DESC) {
        g->st = al_error(AL_ERR_INTERNAL, "cuDNN graph: more than %d descriptors", AL_DNN_MAX_DESC);
        return NULL;
    }
    al_dnn d = NULL;
    check(g, cudnnBackendCreateDescriptor(t, &d), what);
    if (!ok(g)) return NULL;
    g->desc[g->ndesc++] = d;
    return d;
}

static void set(al_dnn_graph *g, al_dnn d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                int64_t n, const void *v, const char *what) {
    if (!ok(g) || !d) return;
    check(g, cudnnBackendSetAttribute(d, a, t, n, v), what);
}

static void setd(al_dnn_graph *g, al_dnn d, cudnnBackendAttributeName_t a, al_dnn v, const char *what) {
    set(g, d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

static void fin(al_dnn_graph *g, al_dnn d, const char *what) {
    if (!ok(g) || !d) return;
    check(g, cudnnBackendFinalize(d), what);
}

static void add_op(al_dnn_graph *g, al_dnn op) {
    if (!ok(g)) return;
    if (g->nops >= AL_DNN_MAX_OPS) {
        g->st = al_error(AL_ERR_INTERNAL, "cuDNN graph: more than %d operations", AL_DNN_MAX_OPS);
        return;
    }
    g->ops[g->nops++] = op;
}

static void note_uid(al_dnn_graph *g, int64_t uid) {
    for (int i = 0; i < g->nuids; i++)
        if (g->uids[i] == uid) return;
    if (g->nuids >= AL_DNN_MAX_UIDS) {
        g->st = al_error(AL_ERR_INTERNAL, "cuDNN graph: more than %d tensors", AL_DNN_MAX_UIDS);
        return;
    }
    g->uids[g->nuids++] = uid;
}

/* ---- tensors ----------------------------------------------------------------------------------- */
al_dnn al_dnn_tensor(al_dnn_graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4],
                     int virt, int by_value, al_dnn ragged) {
    al_dnn t = mk(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "create tensor descriptor");
    int64_t align = 16;
    bool v = virt != 0, bv = by_value != 0;
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor unique id");
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dimensions");
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, "tensor strides");
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    if (v) set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor is_virtual");
    if (bv) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor is_by_value");
    if (ragged) setd(g, t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, ragged, "tensor ragged offset");
    fin(g, t, "finalize tensor descriptor");
    if (!virt && ok(g)) note_uid(g, uid);
    return ok(g) ? t : NULL;
}

al_dnn al_dnn_virtual(al_dnn_graph *g, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4]) {
    return al_dnn_tensor(g, g->next_vuid++, dt, dim, str, 1, 0, NULL);
}

al_dnn al_dnn_scalar(al_dnn_graph *g, int64_t uid, cudnnDataType_t dt) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return al_dnn_tensor(g, uid, dt, one, one, 0, 1, NULL);
}

al_dnn al_dnn_scalar_dev(al_dnn_graph *g, int64_t uid, cudnnDataType_t dt) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return al_dnn_tensor(g, uid, dt, one, one, 0, 0, NULL);
}

cudnnDataType_t al_dnn_fp8_type(int32_t dtype) {
    if (dtype == AL_DTYPE_FP8_E4M3) return CUDNN_DATA_FP8_E4M3;
    if (dtype == AL_DTYPE_FP8_E5M2) return CUDNN_DATA_FP8_E5M2;
    return CUDNN_DATA_FLOAT;
}

/* ---- operations -------------------------------------------------------------------------------- */
void al_dnn_pointwise(al_dnn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, al_dnn x, al_dnn b, al_dnn t,
                      al_dnn y, int64_t axis) {
    al_dnn p = mk(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "create pointwise descriptor");
    float one = 1.0f;
    set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise math precision");
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
        set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    fin(g, p, "finalize pointwise descriptor");
    al_dnn o = mk(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "create pointwise operation");
    setd(g, o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p, "pointwise operation descriptor");
    setd(g, o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b) setd(g, o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t) setd(g, o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    setd(g, o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    set(g, o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
    set(g, o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
    fin(g, o, "finalize pointwise operation");
    add_op(g, o);
}

void al_dnn_matmul(al_dnn_graph *g, al_dnn a, al_dnn b, al_dnn c, al_dnn m_override, al_dnn n_override,
                   al_dnn k_override) {
    al_dnn m = mk(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "create matmul descriptor");
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul compute type");
    fin(g, m, "finalize matmul descriptor");
    al_dnn o = mk(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "create matmul operation");
    setd(g, o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    setd(g, o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    setd(g, o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    setd(g, o, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, "matmul descriptor");
    if (m_override) setd(g, o, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override, "matmul m override");
    if (n_override) setd(g, o, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override, "matmul n override");
    if (k_override) setd(g, o, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override, "matmul k override");
    fin(g, o, "finalize matmul operation");
    add_op(g, o);
}

void al_dnn_reduction(al_dnn_graph *g, cudnnReduceTensorOp_t op, al_dnn x, al_dnn y) {
    al_dnn r = mk(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "create reduction descriptor");
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op, "reduction operator");
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction compute type");
    fin(g, r, "finalize reduction descriptor");
    al_dnn o = mk(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "create reduction operation");
    setd(g, o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    setd(g, o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    setd(g, o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, "reduction descriptor");
    fin(g, o, "finalize reduction operation");
    add_op(g, o);
}

al_dnn al_dnn_amax(al_dnn_graph *g, al_dnn x, int64_t uid) {
    al_dnn y = al_dnn_scalar_dev(g, uid, CUDNN_DATA_FLOAT);
    al_dnn_reduction(g, CUDNN_REDUCE_TENSOR_AMAX, x, y);
    return y;
}

void al_dnn_reshape(al_dnn_graph *g, al_dnn x, al_dnn y) {
    al_dnn o = mk(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "create reshape operation");
    setd(g, o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    setd(g, o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    fin(g, o, "finalize reshape operation");
    add_op(g, o);
}

void al_dnn_rng(al_dnn_graph *g, al_dnn seed, al_dnn offset, al_dnn y, double prob) {
    al_dnn r = mk(g, CUDNN_BACKEND_RNG_DESCRIPTOR, "create rng descriptor");
    cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    set(g, r, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &dist, "rng distribution");
    set(g, r, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &prob, "rng bernoulli probability");
    fin(g, r, "finalize rng descriptor");
    al_dnn o = mk(g, CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR, "create rng operation");
    setd(g, o, CUDNN_ATTR_OPERATION_RNG_YDESC, y, "rng y");
    setd(g, o, CUDNN_ATTR_OPERATION_RNG_SEED, seed, "rng seed");
    setd(g, o, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset, "rng offset");
    setd(g, o, CUDNN_ATTR_OPERATION_RNG_DESC, r, "rng descriptor");
    fin(g, o, "finalize rng operation");
    add_op(g, o);
}

/* ---- plan -------------------------------------------------------------------------------------- */
al_status al_dnn_build_plan(al_dnn_graph *g, cudnnHandle_t handle, al_dnn *plan, int64_t *ws) {
    *plan = NULL;
    *ws = 0;
    AL_TRY(g->st);
    al_dnn og = mk(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "create operation graph");
    set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph handle");
    set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "operation graph ops");
    fin(g, og, "finalize operation graph");
    AL_TRY(g->st);

    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    /* diagnostics, to compare cuDNN's engines on the GPU: ATTNLAB_DNN_PLAN_SKIP=k passes over the first k
     * configs that finalise (the heuristics' best first); ATTNLAB_DNN_PLAN_LOG=1 prints the chosen one */
    const char *skip_env = getenv("ATTNLAB_DNN_PLAN_SKIP"), *log_env = getenv("ATTNLAB_DNN_PLAN_LOG");
    int skip = skip_env ? atoi(skip_env) : 0;
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    const char *last_what = "heuristics found no engine config";
    int64_t tried = 0;
    for (int mi = 0; mi < 2 && !*plan; mi++) {
        al_dnn heur = mk(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "create engine heuristics");
        AL_TRY(g->st);
        setd(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og, "heuristics graph");
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi], "heuristics mode");
        AL_TRY(g->st);
        cudnnStatus_t s = cudnnBackendFinalize(heur);
        if (s != CUDNN_STATUS_SUCCESS) { last = s; last_what = "finalize engine heuristics"; continue; }
        int64_t cnt = 0;
        s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &cnt, NULL);
        if (s != CUDNN_STATUS_SUCCESS) { last = s; last_what = "count engine configs"; continue; }
        if (cnt <= 0) continue;
        if (cnt > 16) cnt = 16;
        al_dnn cfg[16];
        for (int64_t i = 0; i < cnt; i++) {
            cfg[i] = mk(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "create engine config");
            AL_TRY(g->st);
        }
        int64_t got = 0;
        s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, cnt, &got, cfg);
        if (s != CUDNN_STATUS_SUCCESS) { last = s; last_what = "read engine configs"; continue; }
        for (int64_t i = 0; i < got && !*plan; i++) {
            al_dnn p = NULL;
            AL_DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p), "create execution plan");
            s = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
            if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(p);
            tried++;
            if (s == CUDNN_STATUS_SUCCESS && skip > 0) {
                skip--;
                cudnnBackendDestroyDescriptor(p);
                continue;
            }
            if (s == CUDNN_STATUS_SUCCESS) {
                *plan = p;
                if (log_env && *log_env && strcmp(log_env, "0") != 0) {
                    al_dnn eng = NULL;
                    int64_t gi = -1, n1 = 0;
                    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
                        if (cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n1,
                                                     &eng) == CUDNN_STATUS_SUCCESS)
                            cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n1, &gi);
                        cudnnBackendDestroyDescriptor(eng);
                    }
                    fprintf(stderr, "attnlab: cudnn plan: config %lld of %lld (heuristics mode %s), engine global index %lld\n",
                            (long long)i + 1, (long long)got, mi ? "fallback" : "A", (long long)gi);
                }
            } else { last = s; last_what = "finalize execution plan"; cudnnBackendDestroyDescriptor(p); }
        }
    }
    if (!*plan)
        return al_error(AL_ERR_UNSUPPORTED, "cuDNN has no engine for this graph (%lld engine configs tried; last: %s: %s)",
                        (long long)tried, last_what, cudnnGetErrorString(last));
    cudnnStatus_t s = cudnnBackendGetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, NULL, ws);
    if (s != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(*plan);
        *plan = NULL;
        return al_dnn_status(s, "read plan workspace size");
    }
    return AL_OK;
}

/* ATTNLAB_HOST_PROFILE=1 (attn_fused.cu's host profile): the variant pack's build and the execute, timed,
 * per thread (the caller takes the difference around its own call) */
__thread double al_dnn_prof_ns[2];

al_status al_dnn_execute(cudnnHandle_t handle, al_dnn plan, int n, const int64_t *uids, void *const *ptrs,
                         void *workspace) {
    const int prof = al_hprof_on();
    const double t0 = prof ? al_hprof_now() : 0.0;
    double t1 = 0.0;
    al_dnn vp = NULL;
    AL_DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), "create variant pack");
    cudnnStatus_t s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    const char *what = "variant pack unique ids";
    if (s == CUDNN_STATUS_SUCCESS) {
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
        what = "variant pack data pointers";
    }
    if (s == CUDNN_STATUS_SUCCESS) {
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
        what = "variant pack workspace";
    }
    if (s == CUDNN_STATUS_SUCCESS) { s = cudnnBackendFinalize(vp); what = "finalize variant pack"; }
    if (prof) t1 = al_hprof_now();
    if (s == CUDNN_STATUS_SUCCESS) { s = cudnnBackendExecute(handle, plan, vp); what = "execute"; }
    cudnnBackendDestroyDescriptor(vp);
    if (prof) {
        const double t2 = al_hprof_now();
        al_dnn_prof_ns[0] += t1 - t0;
        al_dnn_prof_ns[1] += t2 - t1;
    }
    return al_dnn_status(s, what);
}

/* ---- shared by the fused backend's paths ------------------------------------------------------- */
static char g_version_text[32];
static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;
static void version_text_init(void) {
    size_t v = cudnnGetVersion();
    snprintf(g_version_text, sizeof g_version_text, "%zu.%zu.%zu", v / 10000, (v % 10000) / 100, v % 100);
}
const char *al_dnn_version_text(void) {
    pthread_once(&g_version_once, version_text_init);
    return g_version_text;
}

static int g_cc_major[AL_CU_MAX_DEVICES];
int al_dnn_cc_major(int32_t dev) {
    if (dev < 0 || dev >= AL_CU_MAX_DEVICES) return 0;
    if (!g_cc_major[dev]) {
        int v = 0;
        if (cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            v = 0;
        }
        g_cc_major[dev] = v;   /* a benign race: every writer stores the same value */
    }
    return g_cc_major[dev];
}

al_status al_dnn_handle(cudnnHandle_t handles[AL_CU_MAX_DEVICES], int32_t dev, const char *what, cudnnHandle_t *out,
                        cudaStream_t *stream) {
    AL_TRY(al_cu_begin(what, dev, stream));
    if (!handles[dev]) {
        cudnnHandle_t h;
        AL_DNN_TRY(cudnnCreate(&h), "create handle");
        handles[dev] = h;
    }
    AL_DNN_TRY(cudnnSetStream(handles[dev], *stream), "set stream");
    *out = handles[dev];
    return AL_OK;
}

void al_dnn_bhsd_strides(int32_t fmt, const al_tensor *t, int64_t s_ext, int64_t out[4]) {
    if (fmt == AL_ATTN_FORMAT_SBHD) {
        out[0] = t->stride[1]; out[1] = t->stride[2]; out[2] = t->stride[0]; out[3] = t->stride[3];
    } else if (fmt == AL_ATTN_FORMAT_BSHD) {
        out[0] = t->stride[0]; out[1] = t->stride[2]; out[2] = t->stride[1]; out[3] = t->stride[3];
    } else {
        out[0] = s_ext * t->stride[0]; out[1] = t->stride[1]; out[2] = t->stride[0]; out[3] = t->stride[2];
    }
}

const char *al_dnn_layout_problem(const al_tensor *t, char *buf, size_t n) {
    int64_t es = al_dtype_size(t->dtype);
    int nd = t->ndim;
    if (t->size[nd - 1] > 1 && t->stride[nd - 1] != 1) {
        snprintf(buf, n, "head-dim stride is %lld, cuDNN needs 1", (long long)t->stride[nd - 1]);
        return buf;
    }
    for (int d = 0; d < nd - 1; d++) {
        if (t->size[d] > 1 && t->stride[d] == 0) {
            snprintf(buf, n, "dim %d is broadcast (stride 0), which cuDNN rejects", d + 1);
            return buf;
        }
        if (t->size[d] > 1 && (t->stride[d] * es) % 16 != 0) {
            snprintf(buf, n, "stride %lld of dim %d is not a multiple of 16 bytes", (long long)t->stride[d], d + 1);
            return buf;
        }
    }
    if (((uintptr_t)al_tensor_data_ptr(t)) % 16 != 0) {
        snprintf(buf, n, "its first element is not 16-byte aligned (offset %lld elements)", (long long)t->offset);
        return buf;
    }
    return NULL;
}
