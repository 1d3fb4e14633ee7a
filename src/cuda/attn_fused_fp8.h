/*
 * cuda/attn_fused_fp8.h — the fused backend's FP8 path (attn_fused_fp8.cu): cuDNN's FP8 SDPA
 * forward and backward graphs. attn_fused.cu routes every plan with inputs.fp8 set here.
 */
#ifndef ATTNLAB_CUDA_ATTN_FUSED_FP8_H
#define ATTNLAB_CUDA_ATTN_FUSED_FP8_H

#include "cuda/cuda_internal.h"
extern "C" {
#include "attention_internal.h"
}

/* The fused backend's verdict on an FP8 plan (reason on 0; on 1 reason may hold "note: ..." for
 * explain, e.g. that the backward of this configuration is not available). */
AL_CU_HIDDEN int32_t al_fz8_supports(const al_attn_plan *pl, char *reason, size_t n);
AL_CU_HIDDEN al_status al_fz8_forward(const al_attn_plan *pl, al_tensor *out, al_tensor *lse, al_tensor *max_logit);
AL_CU_HIDDEN al_status al_fz8_backward(const al_attn_plan *pl, const al_tensor *out, const al_tensor *dout,
                                       const al_tensor *lse, al_tensor *dq, al_tensor *dk, al_tensor *dv);
/* FP8 plans built so far (al_fused_info reports it). */
AL_CU_HIDDEN int64_t al_fz8_builds(void);
/* append the FP8 forward's host profile (ATTNLAB_HOST_PROFILE=1) to buf (u characters of n used); the new length */
AL_CU_HIDDEN size_t al_fz8_profile_format(char *buf, size_t u, size_t n);

#endif /* ATTNLAB_CUDA_ATTN_FUSED_FP8_H */
