/*
 * attnlab.h — the whole public C API of attnlab, a LuaJIT-scriptable research sandbox for attention.
 *
 * Conventions (see ARCHITECTURE.md in the shared notes):
 *   - Every fallible call returns al_status (0 = AL_OK, negative = error) and fills a thread-local
 *     message readable with al_last_error(). Library code never exits, aborts or longjmps.
 *   - Tensors are descriptors (al_tensor) over refcounted storage. Shapes, strides and the storage
 *     offset are counted in ELEMENTS, outermost dimension first (PyTorch convention).
 *   - An al_tensor descriptor holds exactly one reference to its storage. The caller owns the
 *     descriptor's memory (a stack struct in C, an ffi.new'd struct in Lua); functions that produce a
 *     tensor write it into an `al_tensor *out` the caller provides (it need not be initialised: it is
 *     overwritten, never released). al_tensor_release(t) drops the reference and zeroes t; releasing
 *     a zeroed descriptor is a no-op. Never copy an al_tensor struct by value and release both: use
 *     al_tensor_alias() to make a second reference.
 *   - Dimensions and indices in C are 0-based and non-negative (the Lua front end converts its
 *     1-based, negative-from-the-end convention before calling C).
 *   - On failure, `out` is left zeroed (storage == NULL): never a half-made tensor.
 *
 * The block between AL_FFI_BEGIN and AL_FFI_END is read by LuaJIT's ffi.cdef (the build generates
 * lua/attnlab/cdef_generated.lua from it): it must stay free of preprocessor directives, macros,
 * inline functions, bitfields, varargs and structs passed by value.
 */
#ifndef ATTNLAB_H
#define ATTNLAB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* AL_FFI_BEGIN */

/* ---------------------------------------------------------------------------------------------
 * Status codes, errors, version
 * ------------------------------------------------------------------------------------------- */
typedef enum al_status {
    AL_OK = 0,
    AL_ERR_ARG = -1,          /* a bad argument: wrong shape, dtype, device, range, ... */
    AL_ERR_OOM = -2,          /* host or device allocation failed */
    AL_ERR_DEVICE = -3,       /* no such device, or the CUDA plugin is not available */
    AL_ERR_UNSUPPORTED = -4,  /* a valid request this build or backend cannot serve */
    AL_ERR_CUDA = -5,         /* CUDA / cuBLAS / cuDNN / NVRTC reported a failure */
    AL_ERR_INTERNAL = -6      /* an invariant broke: a bug in attnlab */
} al_status;

/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
const char *al_last_error(void);
void al_clear_error(void);
/* Library version string, e.g. "0.1.0". */
const char *al_version(void);
/* sizeof() of a public struct by name ("al_tensor", ...), or -1: lets Lua check its cdef. */
int64_t al_sizeof(const char *type_name);

/* ---------------------------------------------------------------------------------------------
 * Dtypes and devices
 * ------------------------------------------------------------------------------------------- */
typedef enum al_dtype {
    AL_DTYPE_F32 = 0,
    AL_DTYPE_F64 = 1,
    AL_DTYPE_F16 = 2,
    AL_DTYPE_BF16 = 3,
    AL_DTYPE_FP8_E4M3 = 4,
    AL_DTYPE_FP8_E5M2 = 5,
    AL_DTYPE_I32 = 6,
    AL_DTYPE_I64 = 7,
    AL_DTYPE_U8 = 8,
    AL_DTYPE_BOOL = 9,
    AL_DTYPE_COUNT = 10
} al_dtype;

typedef enum al_device_type {
    AL_DEVICE_CPU = 0,
    AL_DEVICE_CUDA = 1
} al_device_type;

/* "f32", "bf16", ... ; NULL for an unknown code. */
const char *al_dtype_name(int32_t dtype);
/* Parse a dtype name (also accepts "float32", "float", "half", "bfloat16", "int32", ...). */
al_status al_dtype_parse(const char *name, int32_t *dtype);
/* Bytes per element; 0 for an unknown code. */
int64_t al_dtype_size(int32_t dtype);
/* 1 for f32 f64 f16 bf16 fp8_e4m3 fp8_e5m2, else 0. */
int32_t al_dtype_is_float(int32_t dtype);
/* Parse "cpu", "cuda", "cuda:N" into (type, index). "cuda" means cuda:0. */
al_status al_device_parse(const char *name, int32_t *device_type, int32_t *device_index);

/* ---------------------------------------------------------------------------------------------
 * Tensors: descriptor over refcounted storage
 * ------------------------------------------------------------------------------------------- */
typedef struct al_storage al_storage;   /* opaque, refcounted */

typedef struct al_tensor {
    void       *data;          /* base address of the storage's bytes (a device address on cuda) */
    al_storage *storage;       /* the owner; NULL for an empty (released) descriptor */
    int64_t     offset;        /* storage offset in elements */
    int64_t     size[8];       /* extents, outermost first; entries >= ndim are 0 */
    int64_t     stride[8];     /* strides in elements; entries >= ndim are 0 */
    int32_t     ndim;          /* 0..8 (0 = a scalar holding one element) */
    int32_t     dtype;         /* al_dtype */
    int32_t     device_type;   /* al_device_type */
    int32_t     device_index;
    int64_t     storage_id;    /* unique id of the storage, for printing "view of #id" and alias tests */
    int64_t     storage_numel; /* capacity of the storage in elements of this dtype */
} al_tensor;

/* Allocate a contiguous tensor of the given shape (uninitialised memory). ndim 0..8; every extent >= 0;
 * the element count must not overflow. device_index is ignored on the CPU. */
al_status al_tensor_empty(al_tensor *out, int32_t ndim, const int64_t *size, int32_t dtype,
                          int32_t device_type, int32_t device_index);
/* Drop t's storage reference and zero t. Safe on a zeroed descriptor and on NULL. */
void al_tensor_release(al_tensor *t);
/* out = a second reference to the same view (same descriptor, storage retained). */
al_status al_tensor_alias(al_tensor *out, const al_tensor *t);

int64_t al_tensor_numel(const al_tensor *t);
int32_t al_tensor_is_contiguous(const al_tensor *t);
/* Address of the first element (data + offset * element size). */
void *al_tensor_data_ptr(const al_tensor *t);
/* Storage refcount (for tests of ownership). */
int64_t al_tensor_storage_refcount(const al_tensor *t);
/* 1 when a and b share one storage. */
int32_t al_tensor_same_storage(const al_tensor *a, const al_tensor *b);

/* Views: descriptor rewrites only, never a copy. out receives a new reference to t's storage. */
al_status al_tensor_select(al_tensor *out, const al_tensor *t, int32_t dim, int64_t index);
al_status al_tensor_narrow(al_tensor *out, const al_tensor *t, int32_t dim, int64_t start, int64_t length);
al_status al_tensor_transpose(al_tensor *out, const al_tensor *t, int32_t dim0, int32_t dim1);
/* perm is a permutation of 0..ndim-1: out dim i is t's dim perm[i]. */
al_status al_tensor_permute(al_tensor *out, const al_tensor *t, int32_t ndim, const int32_t *perm);
/* A view with a new shape (one extent may be -1). Fails, saying why, when the strides make a view
 * impossible (then use al_tensor_reshape, which copies). */
al_status al_tensor_view(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size);
/* A view when possible, else a contiguous copy; *copied tells which. */
al_status al_tensor_reshape(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size,
                            int32_t *copied);
/* Broadcast to a larger shape (extents of 1 become stride 0; -1 keeps the extent). */
al_status al_tensor_expand(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size);
al_status al_tensor_unsqueeze(al_tensor *out, const al_tensor *t, int32_t dim);
/* Remove dim if its extent is 1 (dim = -1: remove every extent-1 dim). */
al_status al_tensor_squeeze(al_tensor *out, const al_tensor *t, int32_t dim);
/* Arbitrary view over t's storage; bounds are checked against the storage's capacity. */
al_status al_tensor_as_strided(al_tensor *out, const al_tensor *t, int32_t ndim, const int64_t *size,
                               const int64_t *stride, int64_t offset);

/* Copies. copy_ accepts any dtype and device pair; src is broadcast to dst's shape. dst must not
 * overlap src unless they are the same view. */
al_status al_tensor_copy_(al_tensor *dst, const al_tensor *src);
/* A contiguous copy (always a copy; the Lua front end returns self for an already-contiguous tensor). */
al_status al_tensor_clone(al_tensor *out, const al_tensor *t);
/* A contiguous copy converted to dtype on the given device. */
al_status al_tensor_to(al_tensor *out, const al_tensor *t, int32_t dtype, int32_t device_type,
                       int32_t device_index);
/* Fill every element of the view with v (converted to the dtype). */
al_status al_tensor_fill_(al_tensor *t, double v);
/* t[i] = start + i * step over the elements in row-major order. */
al_status al_tensor_arange_(al_tensor *t, double start, double step);

/* Read / write elements through f64 (host side; a cuda tensor is staged through the host).
 * buf holds numel values in row-major order of t's shape. read_f64 returns NaNs without payload
 * (the default quiet NaN, sign kept), so the values are safe to hand to LuaJIT. */
al_status al_tensor_read_f64(const al_tensor *t, double *buf, int64_t n);
al_status al_tensor_write_f64(al_tensor *t, const double *buf, int64_t n);

/* ---------------------------------------------------------------------------------------------
 * Conversions (scalar; bit-exact, shared with the CUDA kernels through src/numeric/). The decoders
 * return NaN codes as the default quiet NaN with the code's sign (LuaJIT cannot hold NaN payloads);
 * tensor conversions keep every bit.
 * ------------------------------------------------------------------------------------------- */
uint16_t al_f32_to_f16_bits(float x);     /* round to nearest even; overflow -> inf */
float    al_f16_bits_to_f32(uint16_t h);
uint16_t al_f32_to_bf16_bits(float x);    /* round to nearest even; NaN stays NaN */
float    al_bf16_bits_to_f32(uint16_t h);
uint8_t  al_f32_to_e4m3_bits(float x);    /* OCP FP8: RNE, saturating to +-448, NaN -> 0x7F/0xFF */
float    al_e4m3_bits_to_f32(uint8_t v);
uint8_t  al_f32_to_e5m2_bits(float x);    /* OCP FP8: RNE, saturating to +-57344, NaN -> 0x7E/0xFE */
float    al_e5m2_bits_to_f32(uint8_t v);

/* ---------------------------------------------------------------------------------------------
 * Random numbers: one Philox4x32-10 stream shared by CPU and CUDA
 * ------------------------------------------------------------------------------------------- */
/* Reset the default generator: seed, and a counter offset of 0. */
void al_manual_seed(uint64_t seed);
/* Current (seed, offset) of the default generator. */
void al_rng_get_state(uint64_t *seed, uint64_t *offset);
void al_rng_set_state(uint64_t seed, uint64_t offset);
/* Reserve `count` Philox counters from the default generator; returns the first. */
uint64_t al_rng_reserve(uint64_t count);

typedef enum al_random_kind {
    AL_RANDOM_UNIFORM = 0,   /* [0, 1) */
    AL_RANDOM_NORMAL = 1     /* mean 0, std 1 (Box-Muller) */
} al_random_kind;
/* Fill t with random numbers from the default generator (same numbers on every device). */
al_status al_tensor_random_(al_tensor *t, int32_t kind);
/* Same, from an explicit (seed, offset): element i (row-major) depends only on seed, offset, i. */
al_status al_tensor_random_at_(al_tensor *t, int32_t kind, uint64_t seed, uint64_t offset);

/* ---------------------------------------------------------------------------------------------
 * Math on CPU and CUDA, any strides. Outputs are new contiguous tensors unless stated.
 * Binary ops broadcast (NumPy rules) and promote float dtypes (f64 > f32 > f16/bf16; f16 with bf16
 * gives f32). Integer tensors are promoted to f32 when combined with floats.
 * ------------------------------------------------------------------------------------------- */
typedef enum al_unary_op {
    AL_UNARY_NEG = 0, AL_UNARY_ABS = 1, AL_UNARY_EXP = 2, AL_UNARY_LOG = 3,
    AL_UNARY_SQRT = 4, AL_UNARY_TANH = 5
} al_unary_op;
typedef enum al_binary_op {
    AL_BINARY_ADD = 0, AL_BINARY_SUB = 1, AL_BINARY_MUL = 2, AL_BINARY_DIV = 3,
    AL_BINARY_MAXIMUM = 4, AL_BINARY_MINIMUM = 5, AL_BINARY_POW = 6,
    AL_BINARY_EQ = 7, AL_BINARY_NE = 8, AL_BINARY_LT = 9, AL_BINARY_LE = 10,
    AL_BINARY_GT = 11, AL_BINARY_GE = 12      /* comparisons produce bool tensors */
} al_binary_op;
typedef enum al_reduce_op {
    AL_REDUCE_SUM = 0, AL_REDUCE_MEAN = 1, AL_REDUCE_AMAX = 2, AL_REDUCE_AMIN = 3
} al_reduce_op;

al_status al_unary(al_tensor *out, int32_t op, const al_tensor *a);
al_status al_binary(al_tensor *out, int32_t op, const al_tensor *a, const al_tensor *b);
/* a op s, or s op a when scalar_first != 0. */
al_status al_binary_scalar(al_tensor *out, int32_t op, const al_tensor *a, double s, int32_t scalar_first);
/* out = cond ? a : b (cond: bool or u8, broadcast). */
al_status al_where(al_tensor *out, const al_tensor *cond, const al_tensor *a, const al_tensor *b);
/* Reduce over the dims listed (ndims = 0: over all dims, giving a 0-d tensor unless keepdim).
 * Accumulates in f64 on the CPU and f32 (f64 for f64) on CUDA. */
al_status al_reduce(al_tensor *out, int32_t op, const al_tensor *a, int32_t ndims, const int32_t *dims,
                    int32_t keepdim);
/* Max along one dim: values and i64 indices (0-based in C). */
al_status al_max_dim(al_tensor *values, al_tensor *indices, const al_tensor *a, int32_t dim, int32_t keepdim);
/* Softmax (log_softmax when log != 0) along dim, computed in f32 (f64 for f64 input). */
al_status al_softmax(al_tensor *out, const al_tensor *a, int32_t dim, int32_t log);
/* Batched matmul: a [..., m, k] x b [..., k, n] -> [..., m, n]; 1-d operands as in NumPy;
 * batch dims broadcast. CBLAS on the CPU, cuBLASLt on CUDA, over real strides. */
al_status al_matmul(al_tensor *out, const al_tensor *a, const al_tensor *b);
/* Comparison helpers (any devices/dtypes, same shape after broadcasting). */
al_status al_max_abs_diff(const al_tensor *a, const al_tensor *b, double *result);
al_status al_rmse(const al_tensor *a, const al_tensor *b, double *result);
/* |a - b| <= atol + rtol * |b| everywhere (NaNs equal when both NaN). */
al_status al_allclose(const al_tensor *a, const al_tensor *b, double atol, double rtol, int32_t *result);

/* ---------------------------------------------------------------------------------------------
 * Memory accounting
 * ------------------------------------------------------------------------------------------- */
/* Bytes of live tensor storage on a device (device_type, device_index). */
int64_t al_memory_in_use(int32_t device_type, int32_t device_index);
/* Peak bytes in use since start or the last reset. */
int64_t al_memory_peak(int32_t device_type, int32_t device_index);
void al_memory_reset_peak(int32_t device_type, int32_t device_index);
/* Number of live storages (all devices), for leak tests. */
int64_t al_storage_live_count(void);

/* ---------------------------------------------------------------------------------------------
 * CUDA (through the plugin lib/libattnlab_cuda.so, loaded with dlopen on first use)
 * ------------------------------------------------------------------------------------------- */
/* 1 if a usable GPU and the plugin are present; else 0 and *reason (static string) says why. */
int32_t al_cuda_available(const char **reason);
int32_t al_cuda_device_count(void);
/* Name, compute capability and memory of a device. */
al_status al_cuda_device_info(int32_t device_index, char *name, int32_t name_len, int32_t *cc_major,
                              int32_t *cc_minor, int64_t *total_mem);
/* What a kernel's launch shape meets on a device: streaming multiprocessors (one wave of a one-CTA-per-SM grid),
 * L2 bytes, and the shared memory a block may opt in to. Any pointer may be NULL. */
al_status al_cuda_device_attrs(int32_t device_index, int32_t *sm_count, int64_t *l2_bytes, int32_t *smem_per_block_optin);
al_status al_cuda_synchronize(int32_t device_index);
/* Bytes held by the caching allocator (in use + cached free blocks), and a way to return the cache. */
int64_t al_cuda_memory_reserved(int32_t device_index);
al_status al_cuda_empty_cache(int32_t device_index);
/* A GPU attention backend's counters and log as text into buf (truncated to n; buf may be NULL):
 * "fused" (cuDNN version, plans cached and built) or "flash" (NVRTC compiles and cache loads, every
 * specialisation compiled or loaded, with its time). Returns plans built (fused) or kernels compiled
 * (flash), or -1 with the error set (an unknown backend, or no CUDA). */
int64_t al_cuda_backend_info(const char *backend, char *buf, int64_t n);

/* Streams. Every thread has a current stream per device (initially the device's default stream);
 * all work that thread queues on the device goes there. The caching allocator pools blocks per
 * stream, so a tensor used on a stream other than the one current at its allocation must stay alive
 * until that stream is done with it (synchronise it, or order it with an event). */
typedef struct al_cuda_stream al_cuda_stream; /* opaque */
al_status al_cuda_stream_new(al_cuda_stream **out, int32_t device_index);
/* Synchronises the stream, then destroys it; if it was current on this thread, the default returns. */
void al_cuda_stream_free(al_cuda_stream *s);
/* Make s current for this thread on its device; NULL (with device_index) restores the default. */
al_status al_cuda_set_stream(int32_t device_index, al_cuda_stream *s);
/* This thread's current stream on a device; NULL for the default stream. */
al_cuda_stream *al_cuda_get_stream(int32_t device_index);
/* *stream = the cudaStream_t that this thread's work on a device goes to (the current stream, or the
 * plugin's own default stream, which is not CUDA's stream 0), for handing to other CUDA libraries
 * (NCCL in lua/attnlab/cp/nccl.lua). Also makes device_index the thread's current CUDA device. */
al_status al_cuda_raw_stream(int32_t device_index, void **stream);
al_status al_cuda_stream_synchronize(al_cuda_stream *s);
/* *done = 1 when all work queued on s has finished. */
al_status al_cuda_stream_query(al_cuda_stream *s, int32_t *done);

typedef struct al_cuda_event al_cuda_event;   /* opaque */
al_status al_cuda_event_new(al_cuda_event **out, int32_t device_index);
void al_cuda_event_free(al_cuda_event *e);
/* Record on this thread's current stream, or on s (NULL: the current one). */
al_status al_cuda_event_record(al_cuda_event *e);
al_status al_cuda_event_record_on(al_cuda_event *e, al_cuda_stream *s);
/* Work queued on s after this call waits until e has completed (cross-stream ordering, no host wait). */
al_status al_cuda_stream_wait_event(al_cuda_stream *s, al_cuda_event *e);
al_status al_cuda_event_synchronize(al_cuda_event *e);
/* Milliseconds between two recorded events. */
al_status al_cuda_event_elapsed(const al_cuda_event *start, const al_cuda_event *end, float *ms);

/* ---- layouts (src/layout.c): declared in the section below ---------------------------------- */
/* AL_LAYOUT_API */
/* QKV memory layouts, TransformerEngine's vocabulary (NVTE_QKV_Layout, same numbers 0..24, in the
 * order of TE's enum: rows sbhd, bshd, thd x groups 3hd, h3d, hd_2hd, hd_h2d, hd_hd_hd; then the
 * 4 mixed q/kv formats; then the 6 paged layouts). The digit is the packing count (3 = QKV,
 * 2 = KV); its place gives the interleave dim (...3hd/...2hd: -3, ...h3d/...h2d: -2). */
typedef enum al_qkv_layout {
    AL_QKV_LAYOUT_SB3HD = 0,
    AL_QKV_LAYOUT_SBH3D = 1,
    AL_QKV_LAYOUT_SBHD_SB2HD = 2,
    AL_QKV_LAYOUT_SBHD_SBH2D = 3,
    AL_QKV_LAYOUT_SBHD_SBHD_SBHD = 4,
    AL_QKV_LAYOUT_BS3HD = 5,
    AL_QKV_LAYOUT_BSH3D = 6,
    AL_QKV_LAYOUT_BSHD_BS2HD = 7,
    AL_QKV_LAYOUT_BSHD_BSH2D = 8,
    AL_QKV_LAYOUT_BSHD_BSHD_BSHD = 9,
    AL_QKV_LAYOUT_T3HD = 10,
    AL_QKV_LAYOUT_TH3D = 11,
    AL_QKV_LAYOUT_THD_T2HD = 12,
    AL_QKV_LAYOUT_THD_TH2D = 13,
    AL_QKV_LAYOUT_THD_THD_THD = 14,
    AL_QKV_LAYOUT_SBHD_BSHD_BSHD = 15,
    AL_QKV_LAYOUT_BSHD_SBHD_SBHD = 16,
    AL_QKV_LAYOUT_THD_BSHD_BSHD = 17,
    AL_QKV_LAYOUT_THD_SBHD_SBHD = 18,
    AL_QKV_LAYOUT_PAGED_KV_BSHD_BSHD_BSHD = 19,
    AL_QKV_LAYOUT_PAGED_KV_BSHD_SBHD_SBHD = 20,
    AL_QKV_LAYOUT_PAGED_KV_SBHD_BSHD_BSHD = 21,
    AL_QKV_LAYOUT_PAGED_KV_SBHD_SBHD_SBHD = 22,
    AL_QKV_LAYOUT_PAGED_KV_THD_BSHD_BSHD = 23,
    AL_QKV_LAYOUT_PAGED_KV_THD_SBHD_SBHD = 24,
    AL_QKV_LAYOUT_COUNT = 25,
    AL_QKV_LAYOUT_NONE = -1          /* "not declared": separate inputs, detect later */
} al_qkv_layout;

/* NVTE_QKV_Format: X_2Y means q in X, k/v in Y. */
typedef enum al_qkv_format {
    AL_QKV_FORMAT_SBHD = 0,
    AL_QKV_FORMAT_BSHD = 1,
    AL_QKV_FORMAT_THD = 2,
    AL_QKV_FORMAT_BSHD_2SBHD = 3,
    AL_QKV_FORMAT_SBHD_2BSHD = 4,
    AL_QKV_FORMAT_THD_2BSHD = 5,
    AL_QKV_FORMAT_THD_2SBHD = 6,
    AL_QKV_FORMAT_COUNT = 7
} al_qkv_format;

/* NVTE_QKV_Layout_Group. */
typedef enum al_qkv_group {
    AL_QKV_GROUP_3HD = 0,
    AL_QKV_GROUP_H3D = 1,
    AL_QKV_GROUP_HD_2HD = 2,
    AL_QKV_GROUP_HD_H2D = 3,
    AL_QKV_GROUP_HD_HD_HD = 4,
    AL_QKV_GROUP_PAGED_KV_HD_HD_HD = 5,
    AL_QKV_GROUP_COUNT = 6
} al_qkv_group;

/* Names and parsing ("bs3hd", "sbhd_2bshd", "hd_h2d", ...; lower case as TE spells them; parsing
 * ignores case). Name functions return NULL for an unknown code. */
const char *al_qkv_layout_name(int32_t layout);
al_status al_qkv_layout_parse(const char *name, int32_t *layout);
const char *al_qkv_format_name(int32_t format);
al_status al_qkv_format_parse(const char *name, int32_t *format);
const char *al_qkv_group_name(int32_t group);
/* Split a format into its q and kv parts (SBHD, BSHD or THD each); a plain format gives itself twice. */
al_status al_qkv_format_split(int32_t format, int32_t *q_format, int32_t *kv_format);
/* Queries on a layout code; -1 (or 0 for the predicates) for an unknown code. */
int32_t al_qkv_layout_format(int32_t layout);       /* al_qkv_format, TE's nvte_get_qkv_format */
int32_t al_qkv_layout_q_format(int32_t layout);     /* SBHD, BSHD or THD */
int32_t al_qkv_layout_kv_format(int32_t layout);    /* SBHD, BSHD or THD */
int32_t al_qkv_layout_group(int32_t layout);        /* al_qkv_group */
int32_t al_qkv_layout_is_paged(int32_t layout);
int32_t al_qkv_layout_is_packed(int32_t layout);    /* 1 for the 3hd, h3d, hd_2hd, hd_h2d groups */
int32_t al_qkv_layout_packing(int32_t layout);      /* 3 (QKV packed), 2 (KV packed), 1 (separate) */
int32_t al_qkv_layout_interleave_dim(int32_t layout); /* -3, -2, or 0 when nothing is packed */
/* The paged_kv_ form of a separate (hd_hd_hd) layout, as TE prefixes it for a paged KV cache.
 * thd_thd_thd and packed layouts have none (an error). */
al_status al_qkv_layout_paged(int32_t layout, int32_t *paged);

/* The declarative path (TE's _unpack_packed_qkv): resolve a declared packed buffer into zero-copy
 * select views and the layout built from the declaration. Every pointer may be NULL (= not given).
 * qkv_interleave_dim counts from the end as in TE (-3 or -2). */
typedef struct al_qkv_unpack_args {
    const al_tensor *qkv_layer;     /* [b,s,3,h,d] / [s,b,3,h,d] / [t,3,h,d] (-3), or h and 3 swapped (-2) */
    const al_tensor *kv_layer;      /* [b,s,2,hg,d] ... together with query_layer */
    const al_tensor *query_layer;
    const al_tensor *key_layer;
    const al_tensor *value_layer;
    int32_t qkv_interleave_dim;     /* -3 or -2 */
    int32_t qkv_format;             /* al_qkv_format; SBHD, BSHD or THD with packed inputs */
    int32_t has_kv_cache;           /* nonzero when inference_params (a KV cache) is given */
    int32_t reserved;               /* 0 */
} al_qkv_unpack_args;
/* Validates in TE's order, with TE's messages (plus attnlab's extra checks: rank vs qkv_format, kv
 * heads dividing query heads, q/k head dims, batch, dtype and device), then writes new references
 * into q, k, v (select views of the packed buffer; aliases of the separate inputs) and the layout
 * (AL_QKV_LAYOUT_NONE when nothing is packed: the caller detects later). Never runs detection. */
al_status al_qkv_unpack(const al_qkv_unpack_args *args, al_tensor *q, al_tensor *k, al_tensor *v,
                        int32_t *layout);

/* The legacy path (TE's get_qkv_layout): reverse-engineer the layout from storages, shapes,
 * strides and offsets, in TE's decision order (packed QKV 3hd, h3d; packed KV 2hd, h2d; separate).
 * qkv_format is an al_qkv_format (X_2Y allowed: then only separate layouts apply). Unlike TE:
 * offsets count from q's (k's for KV) offset, so a packed buffer that starts anywhere is found;
 * a packed match also requires a non-overlapping packing; separate tensors at any offsets are
 * *_hd_hd_hd with their real strides (no copies, no error); errors name the tensor. *packed = 1
 * when the result is a packed layout (the caller warns: packed detection is deprecated). */
al_status al_qkv_detect(const al_tensor *q, const al_tensor *k, const al_tensor *v, int32_t qkv_format,
                        int32_t *layout, int32_t *packed);
/* How many times al_qkv_detect has run in this process (tests prove the declared path skips it). */
int64_t al_layout_detect_calls(void);

/* ---- attention (src/attention*.c): declared in the section below ---------------------------- */
/* AL_ATTENTION_API */
/* DotProductAttention (TransformerEngine semantics, see te_dpa_semantics.md §3).
 * One call = one attention over q [.., h, d_qk], k [.., hg, d_qk], v [.., hg, d_v] in the format
 * qkv_format: sbhd = 4-d [s,b,h,d], bshd = 4-d [b,s,h,d], thd = 3-d [t,h,d] with cu_seqlens.
 * Every tensor is read (and every gradient written) through its real strides and offset. */
typedef enum al_attn_format {
    AL_ATTN_FORMAT_SBHD = 0,
    AL_ATTN_FORMAT_BSHD = 1,
    AL_ATTN_FORMAT_THD = 2
} al_attn_format;

typedef enum al_attn_mask {
    AL_ATTN_MASK_NO_MASK = 0,
    AL_ATTN_MASK_PADDING = 1,
    AL_ATTN_MASK_CAUSAL = 2,
    AL_ATTN_MASK_PADDING_CAUSAL = 3,
    AL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 4,
    AL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT = 5,
    AL_ATTN_MASK_ARBITRARY = 6
} al_attn_mask;

typedef enum al_attn_bias {
    AL_ATTN_BIAS_NO_BIAS = 0,
    AL_ATTN_BIAS_PRE_SCALE = 1,     /* s = scale * (q.k + B) */
    AL_ATTN_BIAS_POST_SCALE = 2,    /* s = scale * q.k + B   */
    AL_ATTN_BIAS_ALIBI = 3          /* s = scale * q.k - slope_h * |j - i - diag| */
} al_attn_bias;

typedef enum al_attn_softmax {
    AL_ATTN_SOFTMAX_VANILLA = 0,
    AL_ATTN_SOFTMAX_OFF_BY_ONE = 1, /* denominator 1 + sum exp */
    AL_ATTN_SOFTMAX_LEARNABLE = 2   /* denominator exp(offset_h) + sum exp */
} al_attn_softmax;

/* Scalar settings of one call. Start from al_attn_params_init() (TE's defaults), then set fields.
 * b, h, hg, sq, skv, d_qk, d_v are derived from the tensors by al_attn_forward/backward (any
 * nonzero value given is checked against them). For thd, b = numel(cu_seqlens_q) - 1 and sq/skv are
 * max_seqlen_q/kv (0 = derive from cu_seqlens). */
typedef struct al_attn_params {
    int64_t b, h, hg, sq, skv, d_qk, d_v;
    int32_t qkv_format;             /* al_attn_format */
    int32_t mask_type;              /* al_attn_mask */
    int64_t window_left;            /* -1 = unbounded; the window [i+diag-left, i+diag+right] is inclusive */
    int64_t window_right;           /* -1 = unbounded */
    int32_t bottom_right_diagonal;  /* -1 = TE's default (forced by causal masks, else true) */
    int32_t bias_type;              /* al_attn_bias */
    int32_t softmax_type;           /* al_attn_softmax */
    double  softmax_scale;          /* 0 = 1/sqrt(d_qk) */
    double  dropout_p;              /* in [0, 1) */
    uint64_t dropout_seed;          /* Philox key; the keep decision of (b,h,i,j) depends only on   */
    uint64_t dropout_offset;        /* seed, offset and ((b*h + head)*sq + i)*skv + j                */
    int32_t deterministic;          /* 1: reductions in a fixed order (the CPU backend always is) */
    int32_t compute_dtype;          /* AL_DTYPE_F32 (default) or AL_DTYPE_F64 */
    int32_t return_max_logit;
    char    backend[16];            /* "" = automatic; else "cpu", "unfused", "flash", "fused" */
} al_attn_params;

/* FP8 settings of one call (defined in the FP8 section below). */
typedef struct al_attn_fp8 al_attn_fp8;

/* A variant scripted in Lua (lua/attnlab/variants.lua traces score_mod / mask_mod and writes this):
 * CUDA C source for the flash kernels' hook points (kernels/flash_common.cuh), compiled with NVRTC
 * at run time and cached on disk. Only the flash backend serves a call with a variant; the CPU
 * oracle for variants is the Lua front end's (variants.lua), so the C cpu backend declines it.
 * In every snippet b, h, q_idx, kv_idx are 0-based ints (b the batch entry, h the query head,
 * q_idx/kv_idx sequence-local), score is the scaled logit (float), grad is dL/d(new logit);
 * AL_CAP(k) is capture k's data pointer (const void *, storage offset applied) and AL_CAP_GRAD(k)
 * its gradient accumulator (float *, or NULL). */
enum { AL_ATTN_VARIANT_MAX_CAPTURES = 8 };
typedef struct al_attn_variant {
    const char *score_mod;      /* expression: the new logit; NULL = unchanged                    */
    const char *score_grad;     /* expression: d(new)/d(score) * grad; NULL = grad (additive mod)   */
    const char *mask_mod;       /* expression: nonzero = keep; NULL = keep all                      */
    const char *capture_grad;   /* statement(s) run in the backward for every kept element, adding
                                   to AL_CAP_GRAD(k) (atomicAdd); NULL = no capture needs a gradient */
    const char *prelude;        /* optional device helpers placed before the hooks; may be NULL     */
    int32_t ncaptures;
    const al_tensor *captures[AL_ATTN_VARIANT_MAX_CAPTURES];      /* on q's device, any dtype     */
    al_tensor *capture_grads[AL_ATTN_VARIANT_MAX_CAPTURES];       /* f32 contiguous, zeroed by the
                                                                     caller, or NULL             */
    /* Block mask (al.attention.block_mask): u8 [bb, hb, ceil(sq/block_m), ceil(skv/block_n)],
     * bb in {1, b}, hb in {1, h}, any strides; 0 = every element masked (the tile is skipped),
     * 1 = partial (mask_mod evaluated), 2 = every element kept (mask_mod not evaluated). NULL = all
     * partial. block_m / block_n must be multiples of the kernel's tiles (the flash backend says
     * which it needs when they are not). */
    const al_tensor *block_mask;
    int64_t block_m, block_n;
    /* 1 = the block mask holds more non-empty tiles in later query blocks (causal-like masks): the flash
     * forward then launches its query blocks last first, so the longest rows start first and the grid's
     * tail is short (what it does for built-in causal). 0 = in order. Set by al.attention.block_mask. */
    int32_t block_order;
    /* Optional folded form of score_mod (the Lua front end writes it; NULL = not given): new logit =
     * score_pre * score_post, score_pre an expression of acc (the raw q.k product, float) and scale
     * (softmax_scale, float) with b, h, q_idx, kv_idx as above, score_post a finite constant > 0.
     * It lets the kernels fold constant factors into scale (soft-capping's tanh(score / c) becomes
     * tanh(acc * (scale / c))) and score_post into the softmax's exponent, instead of multiplying every
     * score by them. Given with score_mod (the same function; the backward's score_grad still takes
     * score). */
    const char *score_pre;
    double score_post;
    /* Optional bounds of the new logit over every input, score_lo <= score_mod(...) <= score_hi (the Lua front end
     * proves them by interval arithmetic over the traced expression: soft-capping c tanh(score / c) lies in
     * [-c, c]); score_bounded = 0: none given. Where score_hi - score_lo <= 64, the flash backend's Hopper forward
     * (bf16) takes score_hi as every row's softmax max instead of a running one: no max reduction and no rescaling
     * of the output, and the exponentials, at least e^-64, stay normal numbers. The caller vouches for them: a
     * logit above score_hi would overflow the exponentials. */
    int32_t score_bounded;
    double score_lo, score_hi;
    /* 1 = score_mod evaluates a multi-function-unit op per element (tanh, exp, log, sqrt: the Lua front end says
     * so), 0 = not, or not known. A hint for speed only, results do not depend on it: on sm_90 the flash backend's
     * forward then runs three consumer warpgroups (192-row tiles, each softmax under two others' products) where
     * the grid's waves favour them, without a mask or block mask (docs/FLASH.md; ATTNLAB_FLASH_SM90_CONSUMERS=2 /
     * 3 / split overrides). */
    int32_t score_mufu;
    /* Optional folded form of score_grad (the Lua front end writes it beside score_pre; NULL = not given):
     * score_grad with score replaced by acc * scale and constant factors on it folded into scale, as score_pre
     * folds score_mod, an expression of grad, acc, scale, b, h, q_idx, kv_idx. Only with score_pre and
     * score_grad (the same functions). The flash backend's backward then evaluates the logit and its gradient
     * both folded, so they share their terms (soft-capping's tanh(acc * (scale / c))) and take as few
     * instructions per score as the forward; without it the backward evaluates both unfolded. */
    const char *score_grad_pre;
} al_attn_variant;

/* Tensor arguments (NULL = absent). */
typedef struct al_attn_inputs {
    const al_tensor *q, *k, *v;
    const al_tensor *cu_seqlens_q, *cu_seqlens_kv;                /* i32 [b+1], actual lengths */
    const al_tensor *cu_seqlens_q_padded, *cu_seqlens_kv_padded;  /* i32 [b+1], memory offsets (thd) */
    const al_tensor *attention_mask;      /* u8/bool, True = masked out: padding [b,1,1,sq] (q side, and kv
                                             side too in self-attention) or arbitrary, broadcastable to
                                             [b,h,sq,skv] */
    const al_tensor *attention_mask_kv;   /* padding, cross-attention: [b,1,1,skv] */
    const al_tensor *bias;                /* [b|1, h|1, sq|1, skv] (bhss 1hss b1ss 11ss 111s) */
    const al_tensor *alibi_slopes;        /* f32 [h] or [b,h]; NULL = TE's default slopes */
    const al_tensor *softmax_offset;      /* [h]: learnable sink logits (off-by-one ignores it) */
    al_attn_fp8 *fp8;                     /* FP8 attention (emulated; see the FP8 section below), or NULL */
    const al_attn_variant *variant;       /* score_mod / mask_mod / block mask, or NULL */
} al_attn_inputs;

/* TE's defaults: sbhd, causal, window (-1,-1), no bias, vanilla, scale 0 (auto), f32 compute. */
void al_attn_params_init(al_attn_params *p);
/* Forward. Allocates (contiguous, zero in padded/gap rows):
 *   out       [sq,b,h,d_v] | [b,sq,h,d_v] | [t,h,d_v] in q's dtype and format
 *   lse       [b,h,sq] f32 (f64 under f64 compute): log-sum-exp of each row's scores (sink
 *             included), -inf for an empty or padded row
 *   max_logit f32 [h] when return_max_logit (else left zeroed); may be NULL when not requested. */
al_status al_attn_forward(const al_attn_params *p, const al_attn_inputs *in, al_tensor *out,
                          al_tensor *lse, al_tensor *max_logit);
/* Backward. dq, dk, dv are caller-provided tensors shaped like q, k, v (any strides, e.g. the select
 * views of one packed gradient buffer); every element is written (zeros in padding and gaps).
 * dbias (allocated, bias's shape and dtype) when post/pre_scale bias is present, d_softmax_offset
 * (allocated, f32 [h]) when softmax_type is learnable; either may be NULL when not wanted. */
al_status al_attn_backward(const al_attn_params *p, const al_attn_inputs *in, const al_tensor *out,
                           const al_tensor *dout, const al_tensor *lse, al_tensor *dq, al_tensor *dk,
                           al_tensor *dv, al_tensor *dbias, al_tensor *d_softmax_offset);
/* Validate without computing (AL_OK or the first error). */
al_status al_attn_check(const al_attn_params *p, const al_attn_inputs *in);
/* Which backend would serve this call and why every other was skipped, as text into buf
 * (truncated to n). Returns the index-free name of the chosen backend, or NULL (message set). */
const char *al_attn_explain(const al_attn_params *p, const al_attn_inputs *in, char *buf, int64_t n);
/* Registered backends, in order of preference; NULL past the end. */
const char *al_attn_backend_name(int32_t i);
/* TE's default ALiBi slopes for h heads into slopes[0..h). */
void al_attn_default_alibi_slopes(int64_t h, float *slopes);
/* Uniform [0,1) draw (numeric/philox.h stream) for dropout element idx (linear index as above);
 * the element is kept iff the draw < 1 - p, and kept values are scaled by 1/(1-p). */
float al_attn_dropout_uniform(uint64_t seed, uint64_t offset, uint64_t idx);

/* ---------------------------------------------------------------------------------------------
 * FP8 (src/fp8.c; CUDA through the plugin, bit-identical to the CPU). Formats are the dtype codes
 * AL_DTYPE_FP8_E4M3 (max 448) and AL_DTYPE_FP8_E5M2 (max 57344); encoding is OCP, saturating, RNE
 * (src/numeric/convert.h), computed from the double x * scale (one rounding).
 * ------------------------------------------------------------------------------------------- */
/* max |x| over every element of any view (f64 result; NaN if any element is NaN; 0 for no elements). */
al_status al_amax(const al_tensor *x, double *amax);
/* out (new, f64 [1], on x's device) = the same amax, left on the device: on a GPU the call only queues
 * the kernels (no stream sync), so a recipe can read it later (delayed scaling). */
al_status al_amax_tensor(al_tensor *out, const al_tensor *x);
/* out (new, contiguous, x's shape and device, dtype = format) = fp8(x * scale). */
al_status al_fp8_quantize(al_tensor *out, const al_tensor *x, int32_t format, double scale);
/* al_fp8_quantize and al_amax_tensor in one pass over x (delayed scaling quantises with the scale chosen
 * before and only records this amax): out as al_fp8_quantize's, amax (new, f64 [1], on x's device) as
 * al_amax_tensor's, left on the device (no stream sync). The same codes and the same amax as the two
 * calls. */
al_status al_fp8_quantize_amax(al_tensor *out, al_tensor *amax, const al_tensor *x, int32_t format, double scale);
/* out (new, contiguous, dtype a float type) = decode(q) * scale_inv, rounded once to dtype. */
al_status al_fp8_dequantize(al_tensor *out, const al_tensor *q, double scale_inv, int32_t dtype);
/* Per-row current scaling: the rows are the leading x.ndim - row_dims dims (row_dims >= 1 trailing
 * dims form one row; e.g. 3 on a packed [b,s,3,h,d] buffer = one scale per token shared by q, k, v).
 * scale_r = fp8_max / amax_r / 2^margin (1 when amax_r is 0, inf or NaN); out = fp8(x * scale_r) and
 * scale_inv (new, f32, shape x.shape[:ndim-row_dims]) = 1 / scale_r. */
al_status al_fp8_quantize_rows(al_tensor *out, al_tensor *scale_inv, const al_tensor *x, int32_t format,
                               int32_t row_dims, double margin);
/* MXFP8 (OCP microscaling, emulated): blocks of 32 consecutive elements along dim (the last block may
 * be shorter), one E8M0 scale per block stored as u8 (2^(code-127); 255 = NaN block), chosen as TE
 * does: the smallest power of two X with amax <= fp8_max * X (no element saturates; clamped to
 * 2^-127..2^127). out = fp8(x / X); scales: new u8 tensor of x's shape with extent ceil(n/32) at dim. */
al_status al_mxfp8_quantize(al_tensor *out, al_tensor *scales, const al_tensor *x, int32_t format, int32_t dim);
/* out (new, contiguous, dtype) = decode(q) * 2^(scale-127) blockwise along dim. */
al_status al_mxfp8_dequantize(al_tensor *out, const al_tensor *q, const al_tensor *scales, int32_t dim,
                              int32_t dtype);
/* Largest finite value of an FP8 format (448 or 57344); 0 for another dtype. */
double al_fp8_max(int32_t format);

/* FP8 attention slots, TransformerEngine's roles: forward QKV (q, k, v), S (softmax output, the P of
 * P.V), O; backward dO, dP (the score gradient feeding dQ/dK), dQKV (dq, dk, dv). */
typedef enum al_fp8_slot {
    AL_FP8_SLOT_QKV = 0, AL_FP8_SLOT_S = 1, AL_FP8_SLOT_O = 2,
    AL_FP8_SLOT_DO = 3, AL_FP8_SLOT_DP = 4, AL_FP8_SLOT_DQKV = 5,
    AL_FP8_SLOT_COUNT = 6
} al_fp8_slot;

/* FP8 attention, emulated exactly (quantise -> dequantise at every slot, compute in the compute
 * dtype) by the cpu backend: in al_attn_inputs.fp8. Start from al_attn_fp8_init().
 * q, k, v: FP8 tensors (fwd_format), read as decode(x) * qkv_scale_inv (or the per-token descales),
 * or float tensors already (fake-)quantised upstream, read as they are (MXFP8 recipes).
 * scale[slot]: > 0 a given scale (delayed scaling); 0 = current scaling, from this tensor's amax:
 * fp8_max / amax / 2^margin (O, dO, dQKV only; S and dP are produced inside the kernel, so they are
 * always delayed, as in TE); < 0 = this slot is not quantised (a recipe quantises it outside).
 * The kernel reports amax[slot] (before quantisation) and the scale it used, so recipes can update. */
struct al_attn_fp8 {
    int32_t fwd_format;          /* AL_DTYPE_FP8_E4M3 (default) or E5M2: QKV, S, O */
    int32_t bwd_format;          /* dO, dP, dQKV (HYBRID: E5M2; default E4M3) */
    int32_t out_dtype;           /* dtype of the (dequantised) output O: f32 (default), f64, f16, bf16; or
                                    fwd_format (TE's fp8_output): out holds O's FP8 codes, read as
                                    code / scale_used[O] (O scaled per tensor; the backward takes them) */
    int32_t o_per_token;         /* 1: O is current-scaled per token (one scale per (b, token) over h, d) */
    double  margin;              /* for current scaling */
    double  qkv_scale_inv;       /* descale of FP8 q, k, v (when no per-token descales are given) */
    double  scale[6];            /* per slot, as above; scale[QKV] is informational (the inputs carry it) */
    const al_tensor *q_descale;  /* per-token descales of FP8 q: f32, shape q.shape[:-2], or NULL */
    const al_tensor *k_descale;  /* per-token descales of FP8 k: f32, shape k.shape[:-2], or NULL */
    const al_tensor *v_descale;  /* per-token descales of FP8 v: f32, shape v.shape[:-2], or NULL */
    double  amax[6];             /* out: amax per slot of this call (forward fills S, O; backward dO, dP, dQKV) */
    double  scale_used[6];       /* out: the scale each quantised slot used (O: 0 when per token) */
    int32_t amax_deferred;       /* in: 1 = the call may return before its amaxes are known (the fused GPU
                                    forward / backward with every scale given: no stream sync); the amax[]
                                    it fills then hold NaN until al_attn_fp8_settle(f). A later call of the
                                    same direction on f supersedes them; one of the other direction settles
                                    them first. 0 (default): amax[] is filled on return */
    void   *pending;             /* out: non-NULL while deferred amaxes are outstanding (opaque; owned by this
                                    struct: a byte copy of it does not settle them, and reads NaN) */
    struct al_fp8_ds *ds;        /* in: delayed scaling kept on the device (al_fp8_ds below), or NULL. When set,
                                    every slot is delayed and its scale is read from ds on the device: scale[],
                                    qkv_scale_inv, amax[] and scale_used[] are not used (q, k, v must have been
                                    quantised with ds's QKV scale: al_fp8_ds_quantize); each call adds its amaxes
                                    to ds's accumulators (no host wait) for the caller's al_fp8_ds_update */
    al_tensor *ds_used;          /* with ds: f64 [6] on ds's device, owned by the caller; the forward writes the
                                    scales it used for QKV, S, O (the backward reads them there: they may have
                                    moved on in ds since) and the backward those of dO, dP, dQKV */
};
void al_attn_fp8_init(al_attn_fp8 *f);

/* Delayed scaling kept on the device (TransformerEngine's DelayedScaling): per slot an amax history, the scale
 * the next call uses and an accumulator for the amaxes the current call reports, in one f64 tensor on the
 * device of the data, so a training step never waits for the GPU to choose its scales. Attention calls with
 * al_attn_fp8.ds set read their scales there and add their amaxes to the accumulators (max; NaN wins);
 * al_fp8_ds_update then appends each chosen slot's accumulated amax to its history, clears the accumulator and
 * recomputes the scale, queued on the device's stream, exactly as al.fp8's recipes do on the host: scale =
 * fp8_max / algo(history) / 2^margin, kept when that amax is 0, inf or NaN (algo "max" propagates a NaN in the
 * history). On the CPU the same state lives in host memory and the same steps run at once. */
typedef enum al_fp8_algo { AL_FP8_ALGO_MAX = 0, AL_FP8_ALGO_MOST_RECENT = 1 } al_fp8_algo;
typedef struct al_fp8_ds {
    al_tensor state;             /* f64 [6 * history_len + 18]: history [6][history_len] (a ring per slot),
                                    scale [6], accumulator [6], last_used [6] (the scale before the last update) */
    int32_t history_len;         /* >= 1 */
    int32_t algo;                /* al_fp8_algo */
    double  pow2_margin;         /* 2^margin, as the host computes it */
    double  fmax[6];             /* per slot: the largest finite value of its format */
    int64_t count[6];            /* amaxes recorded per slot so far (host bookkeeping: updates are queued in order) */
} al_fp8_ds;                     /* (one owner: a byte copy shares state without a reference; release once) */
/* ds (zeroed first) with its state on (device_type, device_index), seeded from a host recipe's state: per slot
 * s, count[s] amaxes recorded so far of which the last min(count[s], history_len) are history[s*history_len ..]
 * (oldest first), and scale[s] (> 0). history may be NULL when every count is 0. */
al_status al_fp8_ds_init(al_fp8_ds *ds, int32_t device_type, int32_t device_index, int32_t history_len, int32_t algo,
                         double pow2_margin, const double fmax[6], const double *history, const int64_t count[6],
                         const double scale[6]);
void al_fp8_ds_release(al_fp8_ds *ds);
/* For every slot s with bit s of slot_mask set: history gets the accumulated amax, the accumulator is
 * cleared, last_used[s] = scale[s] and scale[s] is recomputed (queued on a GPU; done at once on the CPU). */
al_status al_fp8_ds_update(al_fp8_ds *ds, uint32_t slot_mask);
/* out (new, contiguous, x's shape, dtype = format) = fp8(x * scale[slot]) with the scale read on the device,
 * and accumulator[slot] = max(accumulator[slot], amax(x)) in the same pass: al_fp8_quantize_amax's codes. x
 * must be on ds's device. */
al_status al_fp8_ds_quantize(al_tensor *out, const al_tensor *x, int32_t format, al_fp8_ds *ds, int32_t slot);
/* The state on the host (waits for the device): per slot the min(count, history_len) most recent amaxes,
 * oldest first, at history[s*history_len ..] (the rest 0), scale [6], last_used [6]; any may be NULL. */
al_status al_fp8_ds_read(const al_fp8_ds *ds, double *history, double *scale, double *last_used);
/* Waits for the deferred amaxes of the last call made with f (if any), writes them into f->amax and
 * clears f->pending. A no-op when nothing is pending. Safe as a finaliser (releases what it holds). */
void al_attn_fp8_settle(al_attn_fp8 *f);

/* AL_FFI_END */

#ifdef __cplusplus
}
#endif

#endif /* ATTNLAB_H */
