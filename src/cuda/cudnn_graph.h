/*
 * cuda/cudnn_graph.h — thin helpers over cuDNN's plain-C backend API (cudnn_graph.h, cudnnBackend*):
 * tensor and operation descriptors, graph -> execution plan, variant pack -> execute.
 *
 * A graph is built into an al_dnn_graph, which owns every descriptor it creates (destroyed by
 * al_dnn_graph_free once the plan is finalized: a finalized plan does not need them) and records the
 * UIDs of its non-virtual tensors, because a variant pack must list exactly those (cuDNN rejects an
 * extra UID). Errors are sticky: the first failing call stores al_error(AL_ERR_CUDA, "cuDNN <what>:
 * <cudnnGetErrorString>") in g->st, later calls return NULL, and the caller checks g->st once.
 */
#ifndef ATTNLAB_CUDA_CUDNN_GRAPH_H
#define ATTNLAB_CUDA_CUDNN_GRAPH_H

#include "cuda/cuda_internal.h"
#include <cudnn.h>

typedef cudnnBackendDescriptor_t al_dnn;

#define AL_DNN_MAX_DESC 320
#define AL_DNN_MAX_OPS 96
#define AL_DNN_MAX_UIDS 48
#define AL_DNN_VIRTUAL_UID0 1000

typedef struct al_dnn_graph {
    al_dnn desc[AL_DNN_MAX_DESC];   /* every descriptor created (destroyed by al_dnn_graph_free) */
    int ndesc;
    al_dnn ops[AL_DNN_MAX_OPS];     /* the operations, in emission order */
    int nops;
    int64_t uids[AL_DNN_MAX_UIDS];  /* non-virtual tensor UIDs (each once) */
    int nuids;
    int64_t next_vuid;
    al_status st;                   /* first error, AL_OK while none */
} al_dnn_graph;

/* cuDNN status -> attnlab status ("cuDNN <what>: <message>"). */
AL_CU_HIDDEN al_status al_dnn_status(cudnnStatus_t s, const char *what);
#define AL_DNN_TRY(expr, what) AL_TRY(al_dnn_status((expr), (what)))

AL_CU_HIDDEN void al_dnn_graph_init(al_dnn_graph *g);
AL_CU_HIDDEN void al_dnn_graph_free(al_dnn_graph *g);

/* A 4-d tensor. virt: intermediate (no memory); by_value: a host scalar passed in the variant pack;
 * ragged: an int64 offsets tensor (CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC) or NULL. */
AL_CU_HIDDEN al_dnn al_dnn_tensor(al_dnn_graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                                  const int64_t str[4], int virt, int by_value, al_dnn ragged);
/* A virtual tensor with the next free virtual UID. */
AL_CU_HIDDEN al_dnn al_dnn_virtual(al_dnn_graph *g, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4]);
/* A by-value [1,1,1,1] scalar (float or int32). */
AL_CU_HIDDEN al_dnn al_dnn_scalar(al_dnn_graph *g, int64_t uid, cudnnDataType_t dt);
/* A [1,1,1,1] tensor in device memory (FP8 scales, descales and amaxes: fp32, as TE passes them). */
AL_CU_HIDDEN al_dnn al_dnn_scalar_dev(al_dnn_graph *g, int64_t uid, cudnnDataType_t dt);
/* cuDNN's data type of an attnlab FP8 dtype (AL_DTYPE_FP8_E4M3 / E5M2); CUDNN_DATA_FLOAT otherwise. */
AL_CU_HIDDEN cudnnDataType_t al_dnn_fp8_type(int32_t dtype);

/* Operations (each appended to g->ops). Optional inputs are NULL. axis is used by GEN_INDEX only. */
AL_CU_HIDDEN void al_dnn_pointwise(al_dnn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, al_dnn x,
                                   al_dnn b, al_dnn t, al_dnn y, int64_t axis);
AL_CU_HIDDEN void al_dnn_matmul(al_dnn_graph *g, al_dnn a, al_dnn b, al_dnn c, al_dnn m_override,
                                al_dnn n_override, al_dnn k_override);
AL_CU_HIDDEN void al_dnn_reduction(al_dnn_graph *g, cudnnReduceTensorOp_t op, al_dnn x, al_dnn y);
/* max |x| over the whole tensor into a new fp32 [1,1,1,1] device tensor with the given uid (FP8 amax). */
AL_CU_HIDDEN al_dnn al_dnn_amax(al_dnn_graph *g, al_dnn x, int64_t uid);
AL_CU_HIDDEN void al_dnn_reshape(al_dnn_graph *g, al_dnn x, al_dnn y);
/* Bernoulli(prob) RNG into y, seeded by the int64 [1,1,1,1] tensors seed and offset. */
AL_CU_HIDDEN void al_dnn_rng(al_dnn_graph *g, al_dnn seed, al_dnn offset, al_dnn y, double prob);

/* Operation graph -> heuristics (mode A, then fallback) -> the first engine config whose plan
 * finalizes. On success *plan is a finalized plan the caller owns (cudnnBackendDestroyDescriptor)
 * and *ws its workspace bytes. On failure the status says which step and why. */
AL_CU_HIDDEN al_status al_dnn_build_plan(al_dnn_graph *g, cudnnHandle_t handle, al_dnn *plan, int64_t *ws);

/* Run a plan: a variant pack of n (uid, pointer) pairs plus the workspace, then execute. */
AL_CU_HIDDEN al_status al_dnn_execute(cudnnHandle_t handle, al_dnn plan, int n, const int64_t *uids,
                                      void *const *ptrs, void *workspace);

/* ---- host profile (ATTNLAB_HOST_PROFILE=1, host_profile.h): where a cached fused call's host time goes ----- */
/* al_dnn_execute's share, summed per thread: [0] building and finalising the variant pack, [1]
 * cudnnBackendExecute and the pack's destruction */
extern __thread double al_dnn_prof_ns[2];

/* ---- shared by the fused backend's paths (attn_fused.cu: f16/bf16, attn_fused_fp8.cu: FP8) ---------- */
/* "9.19.1": the loaded cuDNN's version, formatted once (reasons quote it on every supports() call). */
AL_CU_HIDDEN const char *al_dnn_version_text(void);
/* A device's compute capability major (cached; 0 when unknown). */
AL_CU_HIDDEN int al_dnn_cc_major(int32_t dev);
/* *out = handles[dev], created on first use, bound to the calling thread's current stream (given back
 * in *stream). Each path keeps its own handle array and calls this with its own lock held: a handle's
 * stream binding must not change between cudnnSetStream and the execute. */
AL_CU_HIDDEN al_status al_dnn_handle(cudnnHandle_t handles[AL_CU_MAX_DEVICES], int32_t dev, const char *what,
                                     cudnnHandle_t *out, cudaStream_t *stream);
/* Logical [b,h,s,d] strides of a q/k/v/o-shaped tensor in format fmt (AL_ATTN_FORMAT_*); s_ext is the
 * padded sequence extent (sq or skv), which thd's synthetic batch stride needs. */
AL_CU_HIDDEN void al_dnn_bhsd_strides(int32_t fmt, const al_tensor *t, int64_t s_ext, int64_t out[4]);
/* Why cuDNN cannot take this tensor as it is (NULL when it can): unit head-dim stride, no stride-0
 * broadcast, 16-byte aligned address and strides. The text goes into buf. */
AL_CU_HIDDEN const char *al_dnn_layout_problem(const al_tensor *t, char *buf, size_t n);

#endif /* ATTNLAB_CUDA_CUDNN_GRAPH_H */
