/*
 * attention_internal.h — what the attention front door (src/attention.c; its validation: src/attention_plan.c)
 * hands to a backend.
 *
 * The front door validates an al_attn_params + al_attn_inputs pair and resolves it into an
 * al_attn_plan: every derived extent filled in, the softmax scale, the window and the diagonal
 * alignment resolved exactly as TransformerEngine does (te_dpa_semantics.md §3.2), the per-sequence
 * lengths and memory offsets read off cu_seqlens / padding masks, the ALiBi slopes materialised.
 * Backends never re-validate: they receive consistent descriptors and only compute.
 *
 * Element (b, h, i, j) — i, j sequence-local indices — is masked out when any of:
 *   i >= q_len[b] or (q_valid && !q_valid[b*sq+i])          (the whole row: zero output)
 *   j >= kv_len[b] or (kv_valid && !kv_valid[b*skv+j])
 *   window_left  >= 0 and j < i + diag[b] - window_left
 *   window_right >= 0 and j > i + diag[b] + window_right    (causal masks have window_right = 0)
 *   the arbitrary mask is true at (b, h, i, j) (broadcast)
 * where diag[b] = bottom_right ? kv_len[b] - q_len[b] : 0 (actual lengths, per sequence).
 * A variant (in.variant: score_mod / mask_mod, validated here) is served by the flash backend only:
 * the front door declines it for every other backend with the reason (the CPU oracle of variants is
 * the Lua front end's).
 */
#ifndef ATTNLAB_ATTENTION_INTERNAL_H
#define ATTNLAB_ATTENTION_INTERNAL_H

#include "internal.h"

/* C linkage also for the CUDA plugin's C++ files (which register backends and read plans). */
#ifdef __cplusplus
extern "C" {
#endif

enum { AL_ATTN_PLAN_INLINE_B = 4 };

typedef struct al_attn_plan {
    al_attn_params p;           /* resolved: extents filled, softmax_scale > 0, window set */
    al_attn_inputs in;          /* the caller's tensors (pointers) */
    int32_t bottom_right;       /* resolved diagonal alignment */
    int32_t has_padding;        /* a padding-type mask */
    int32_t has_grad_bias;      /* pre/post-scale bias present */
    int32_t backward;           /* 1: the plan of al_attn_backward (a backend whose backward serves less than its
                                   forward declines it in supports(), so the next backend takes it) */
    /* per sequence, length b (host memory owned by the plan) */
    int64_t *q_start, *kv_start;   /* first row in the token dim (thd: padded offsets; dense: 0) */
    int64_t *q_len, *kv_len;       /* actual lengths */
    int64_t *q_rows, *kv_rows;     /* rows to visit: q_len/kv_len, or sq/skv when validity arrays exist */
    int64_t *diag;                 /* diagonal offset per sequence */
    uint8_t *q_valid, *kv_valid;   /* [b*sq], [b*skv] from padding attention masks, or NULL */
    float *alibi;                  /* [b*h] slopes when bias_type is alibi, else NULL */
    double *softmax_offset;        /* [h] sink logits (0 for off-by-one), NULL for vanilla */
    /* the arbitrary mask broadcast to 4-d [b,h,sq,skv] (stride 0 on broadcast dims) */
    int32_t has_arb;
    int64_t arb_stride[4], arb_offset;
    /* the bias broadcast to 4-d [b,h,sq,skv] */
    int64_t bias_stride[4];
    int64_t bias_offset;
    /* in.variant's block mask [bb, hb, MB, NB]: its strides, 0 on a broadcast (extent 1) b or h dim */
    int64_t bmask_stride[4];
    /* the per-sequence arrays above when b <= AL_ATTN_PLAN_INLINE_B (no allocation per call) */
    int64_t small_b[8 * AL_ATTN_PLAN_INLINE_B];
} al_attn_plan;

/* A backend. supports() fills reason (NUL-terminated, n bytes) when it returns 0. */
/* What al_attn_fp8.pending points at: a backend's record of amaxes still on their way (al_attn_fp8.
 * amax_deferred). settle() waits for them, writes them into f->amax, releases the record and clears
 * f->pending; drop() releases it without waiting (a later call of the same direction on the same f
 * supersedes it: the same amax slots). backward: which direction's slots it fills. owner: the struct it
 * was attached to; the front door acts on the record only through its owner (a byte copy of the struct
 * carries the pointer too: through the copy the field is only cleared, so a record is released once). */
typedef struct al_fp8_pending {
    void (*settle)(struct al_fp8_pending *self, al_attn_fp8 *f);
    void (*drop)(struct al_fp8_pending *self);
    int32_t backward;
    const al_attn_fp8 *owner;
} al_fp8_pending;

typedef struct al_attn_backend {
    const char *name;
    int32_t (*supports)(const al_attn_plan *plan, char *reason, size_t n);
    al_status (*forward)(const al_attn_plan *plan, al_tensor *out, al_tensor *lse, al_tensor *max_logit);
    al_status (*backward)(const al_attn_plan *plan, const al_tensor *out, const al_tensor *dout,
                          const al_tensor *lse, al_tensor *dq, al_tensor *dk, al_tensor *dv,
                          al_tensor *dbias, al_tensor *d_softmax_offset);
    /* 1 when supports() judges FP8 plans (in.fp8 != NULL) itself; 0 (the default of a positional
     * initialiser) makes the front door decline FP8 plans for this backend with a fixed reason */
    int32_t fp8;
    /* 1 when forward/backward read fp8.ds (delayed scaling on the device, al_fp8_ds) themselves; 0: the front
     * door hands them a copy of the settings with ds's scales on the host (al_fp8_ds_resolve / commit) */
    int32_t fp8_ds;
} al_attn_backend;

/* fp8_delayed.c: attention with al_attn_fp8.ds set. check_attn validates ds and ds_used against q; resolve
 * fills h (a copy of f without ds) with the scales a host-reading backend needs (forward: ds's; backward: the
 * forward's QKV, S, O from ds_used and ds's dO, dP, dQKV); commit hands h's amaxes to ds's accumulators and
 * the scales used to ds_used. On a GPU both read or write a few doubles (they wait for the stream). */
al_status al_fp8_ds_check_attn(const al_attn_fp8 *f, const al_tensor *q);
al_status al_fp8_ds_resolve(const al_attn_fp8 *f, int backward, al_attn_fp8 *h);
al_status al_fp8_ds_commit(const al_attn_fp8 *f, int backward, const al_attn_fp8 *h);

/* Register a backend at a preference slot: "fused", "flash", "unfused" (GPU plugins) — the name
 * fixes the slot; the cpu backend is built in. Replaces an earlier registration of the same name. */
AL_EXPORT al_status al_attn_register_backend(const al_attn_backend *backend);

/* The plan (src/attention_plan.c): p validated against in and resolved into *pl, whose arrays it owns until
 * al_attn_plan_free (after an error they are freed already). */
al_status al_attn_plan_build(al_attn_plan *pl, const al_attn_params *p, const al_attn_inputs *in);
void al_attn_plan_free(al_attn_plan *pl);
/* Names for messages: "sbhd" / "bshd" / "thd", the mask type's TE name ("?" out of range); 1 for the FP8 dtypes. */
const char *al_attn_format_name(int32_t f);
const char *al_attn_mask_name(int32_t m);
int al_attn_is_fp8_dtype(int32_t d);

/* The CPU backend (src/cpu/attention_fwd.c, attention_bwd.c). */
al_status al_cpu_attn_forward(const al_attn_plan *plan, al_tensor *out, al_tensor *lse, al_tensor *max_logit);
al_status al_cpu_attn_backward(const al_attn_plan *plan, const al_tensor *out, const al_tensor *dout,
                               const al_tensor *lse, al_tensor *dq, al_tensor *dk, al_tensor *dv,
                               al_tensor *dbias, al_tensor *d_softmax_offset);

#ifdef __cplusplus
}
#endif

#endif /* ATTNLAB_ATTENTION_INTERNAL_H */
