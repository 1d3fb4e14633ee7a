/*
 * cuda/flash_sm90_tma.h — the TMA tensor maps of the Hopper forward (kernels/flash_fwd_sm90.cu), built on
 * the host with the driver's cuTensorMapEncodeTiled. Header-only (static inline), shared by the backend
 * (src/cuda/attn_flash_sm90.cu) and the GPU check program (tests/cuda/flash_sm90_check.cu).
 *
 * One operand (al_flash_op: element (b, head, row, col) at b*sb + row*st + head*sh + col) becomes a
 * 4-D map {col: d, row: rows, head: heads, batch: batches} with byte strides {st, sh, sb} * 2, boxes
 * of {64 columns, box_rows rows, 1, 1} and the 128-byte swizzle (the layout the kernel's wgmma
 * descriptors describe). thd operands (sb == 0, rows = total tokens, start offsets added by the
 * kernel) get one batch entry; the kernel then passes batch coordinate 0. Rows outside [0, rows)
 * are read as zeros.
 */
#ifndef ATTNLAB_CUDA_FLASH_SM90_TMA_H
#define ATTNLAB_CUDA_FLASH_SM90_TMA_H

#include <cuda.h>
#include "../../kernels/flash_params.h"

/* The kernel's second argument (kernels/sm90_common.cuh: al_sm90_tmaps) */
typedef struct al_flash_sm90_tmaps {
    CUtensorMap q, k, v;
} al_flash_sm90_tmaps;

/* CUDA_SUCCESS, or the driver's error (CUDA_ERROR_INVALID_VALUE for a broadcast dim: stride 0, extent > 1) */
static inline CUresult al_flash_sm90_tmap(CUtensorMap *m, const al_flash_op *op, int bf16, int d, long long rows,
                                          int heads, int batches, int box_rows) {
    const long long es = 2;
    if (op->sc != 1 || rows < 1 || heads < 1 || batches < 1) return CUDA_ERROR_INVALID_VALUE;
    if (op->sb == 0) batches = 1;
    long long st = op->st * es, sh = op->sh * es, sb = op->sb * es;
    if ((st == 0 && rows > 1) || (sh == 0 && heads > 1)) return CUDA_ERROR_INVALID_VALUE;
    /* an extent-1 dim may have any stride: give the encoder a legal non-zero one */
    if (st == 0) st = (long long)d * es;
    if (sh == 0) sh = st * rows;
    if (sb == 0) sb = sh * heads;
    if (st < 0 || sh < 0 || sb < 0) return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)batches};
    cuuint64_t strides[3] = {(cuuint64_t)st, (cuuint64_t)sh, (cuuint64_t)sb};
    cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    cuuint32_t estr[4] = {1, 1, 1, 1};
    return cuTensorMapEncodeTiled(m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                                  op->ptr, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* All three maps. rows_q / rows_kv: SQ / SKV for dense formats, the token count of q / k,v for thd. */
static inline CUresult al_flash_sm90_tmaps_make(al_flash_sm90_tmaps *t, const al_flash_params *p, int bf16, int d,
                                                long long rows_q, long long rows_kv, int bm, int bn) {
    CUresult r = al_flash_sm90_tmap(&t->q, &p->q, bf16, d, rows_q, p->H, p->B, bm);
    if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->k, &p->k, bf16, d, rows_kv, p->HG, p->B, bn);
    if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->v, &p->v, bf16, d, rows_kv, p->HG, p->B, bn);
    return r;
}

/* The backward's maps (kernels/flash_bwd_sm90.cu: al_sm90_bwd_tmaps): role 0 owns K, V (boxes of bm rows)
 * and streams Q, dO (boxes of bn rows); role 1 owns Q, dO and streams K, V. */
typedef struct al_flash_sm90_bwd_tmaps {
    CUtensorMap own0, own1, st0, st1;
} al_flash_sm90_bwd_tmaps;

static inline CUresult al_flash_sm90_bwd_tmaps_make(al_flash_sm90_bwd_tmaps *t, const al_flash_params *p, int role,
                                                    int bf16, int d, long long rows_q, long long rows_kv, int bm,
                                                    int bn) {
    CUresult r;
    if (role == 0) {
        r = al_flash_sm90_tmap(&t->own0, &p->k, bf16, d, rows_kv, p->HG, p->B, bm);
        if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->own1, &p->v, bf16, d, rows_kv, p->HG, p->B, bm);
        if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->st0, &p->q, bf16, d, rows_q, p->H, p->B, bn);
        if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->st1, &p->dout, bf16, d, rows_q, p->H, p->B, bn);
    } else {
        r = al_flash_sm90_tmap(&t->own0, &p->q, bf16, d, rows_q, p->H, p->B, bm);
        if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->own1, &p->dout, bf16, d, rows_q, p->H, p->B, bm);
        if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->st0, &p->k, bf16, d, rows_kv, p->HG, p->B, bn);
        if (r == CUDA_SUCCESS) r = al_flash_sm90_tmap(&t->st1, &p->v, bf16, d, rows_kv, p->HG, p->B, bn);
    }
    return r;
}

#endif /* ATTNLAB_CUDA_FLASH_SM90_TMA_H */
