/*
 * cuda/attn_flash_sm90.h — the Hopper forward path of the flash backend (src/cuda/attn_flash_sm90.cu,
 * kernels/flash_fwd_sm90.cu): called by attn_flash.cu's forward in place of the stage-1 kernel.
 */
#ifndef ATTNLAB_CUDA_ATTN_FLASH_SM90_H
#define ATTNLAB_CUDA_ATTN_FLASH_SM90_H

extern "C" {
#include "attention_internal.h"
}
#include <cuda.h>
#include "cuda/cuda_internal.h"
#include "../../kernels/flash_params.h"
#include "cuda/flash_specs.h"

/* A variant's snippets as flash_specs.h takes them (attn_flash.cu and attn_flash_sm90.cu build sources and
 * identities from them) */
static inline al_flash_hooks al_flash_hooks_of(const al_attn_variant *v) {
    al_flash_hooks h;
    h.score_mod = v->score_mod;
    h.score_grad = v->score_grad;
    h.mask_mod = v->mask_mod;
    h.capture_grad = v->capture_grad;
    h.prelude = v->prelude;
    h.score_pre = v->score_pre;
    h.score_post = v->score_pre ? v->score_post : 0.0;
    h.score_grad_pre = v->score_grad_pre;
    al_flash_hooks_set_bounds(&h, v->score_bounded, v->score_lo, v->score_hi);   /* the forward's fixed max */
    return h;
}

/* 1 when the sm90 kernel serves this plan; otherwise 0 and why not in why (may be NULL).
 * Serves: an sm_90 device, f16/bf16, d_qk == d_v in {64, 128, 256}, no mask / causal / sliding window
 * (top-left or bottom-right), every format (sbhd, bshd, thd with cu_seqlens(_padded)), GQA/MQA,
 * softmax_scale > 0, strides the TMA encoder takes (16-byte multiples, no broadcast head dim).
 * Variants (score_mod / mask_mod, captures) too, with a block mask whose blocks are multiples of the
 * kernel's tiles (BM = 128 rows, BN = 128 keys, 64 at d = 256). Declines ALiBi (the stage-1 kernel
 * serves it). ATTNLAB_FLASH_SM90=0 turns the path off (A/B comparisons); unset or 1: on where it
 * applies. ATTNLAB_FLASH_SM90_VARIANTS=0 sends variants to the stage-1 kernel instead. */
AL_CU_HIDDEN int al_flash_sm90_applies(const al_attn_plan *pl, char *why, size_t n);

/* A variant specialisation's function through attn_flash.cu's LRU of variant modules (sm90 = 1: the
 * Hopper forward's file and options; 2 / 3: the Hopper backward's dK/dV / dQ kernel). The caller holds
 * that LRU's lock (attn_flash.cu's forward and backward do). */
/* attn_flash.cu: compile a call's new kernel families in parallel (variants: g_vc_lock held by the caller) */
AL_CU_HIDDEN void al_flash_prefetch(int32_t dev, const struct al_flash_spec *s, const al_attn_variant *v,
                                    const int *families, int n);
AL_CU_HIDDEN al_status al_flash_variant_function(int32_t dev, const struct al_flash_spec *s, const al_attn_variant *v,
                                                 int sm90, CUfunction *fn);

/* Runs the forward with the sm90 kernel when it applies: *done = 1 after the launch; *done = 0 (and
 * nothing done) when it does not apply. prm: filled as for al_flash_fwd (fl_params, o, lse), the output
 * already zero-filled where the stage-1 path would. Errors (compile, launch) are returned. prof: NULL, or
 * (ATTNLAB_HOST_PROFILE) two clock readings: TMA maps made, kernel function found. */
AL_CU_HIDDEN al_status al_flash_sm90_forward(int32_t dev, const al_attn_plan *pl, const al_flash_params *prm,
                                             cudaStream_t s, int *done, double *prof);

/* The Hopper backward (kernels/flash_bwd_sm90.cu), on by default (ATTNLAB_FLASH_SM90_BWD=0 turns it off):
 * serves sm_90, f16/bf16, d_qk == d_v in {64, 128}, no ALiBi, softmax_scale > 0, strides TMA takes;
 * variants too (capture gradients added by its dK/dV kernel only), with block masks whose blocks are
 * multiples of 128 x 128 and at most AL_FLASH_SM90_BWD_BM_LIST stream tiles per CTA.
 * al_flash_sm90_backward runs after the stage-1 pre kernel (prm.lse2 / prm.dsum ready) and writes dq, dk,
 * dv (dq directly: no accumulator pass); *done = 0 when it does not apply. */
AL_CU_HIDDEN int al_flash_sm90_bwd_applies(const al_attn_plan *pl, char *why, size_t n);
/* 1 when al_flash_sm90_backward runs the five-GEMM kernel (dK/dV/dQ, opt-in ATTNLAB_FLASH_SM90_BWD_FUSED=1,
 * d = 128, no variant, not deterministic): then prm.dq_acc must be a zeroed f32 [B, H, SQ, D] accumulator
 * (prm.nsplit = 1: the pre pass zeroes it), which the caller converts into dq (al_flash_bwd_dq) after. */
AL_CU_HIDDEN int al_flash_sm90_bwd_fused(const al_attn_plan *pl);
AL_CU_HIDDEN al_status al_flash_sm90_backward(int32_t dev, const al_attn_plan *pl, const al_flash_params *prm,
                                              cudaStream_t s, int *done);

#endif /* ATTNLAB_CUDA_ATTN_FLASH_SM90_H */
