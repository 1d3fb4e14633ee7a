/*
 * kernels/flash_params.h — the one argument of every flash kernel (kernels/flash_fwd.cu,
 * kernels/flash_bwd.cu), shared by the NVRTC-compiled kernels and the host code that fills it
 * (src/cuda/attn_flash.cu). Plain C: no includes, fixed-size fields, no CUDA types, so the struct
 * has one layout on both sides (NVRTC and nvcc/gcc on x86-64 and aarch64: LP64).
 *
 * An operand (q, k, v, out, dout, dq, dk, dv): element (b, head, row, col) — row sequence-local —
 * lives at element offset   b*sb + (start[b] + row)*st + head*sh + col*sc   from ptr, where ptr
 * already includes the tensor's storage offset and start[] is q_start (q, out, dout, dq) or
 * kv_start (k, v, dk, dv), NULL meaning 0. thd tensors have sb = 0 and start = cu_seqlens(_padded).
 * Tiles of q, k, v and dout are read with 16-byte cp.async: their sc is 1, and ptr, sb, st, sh are
 * multiples of 16 bytes (attn_flash.cu checks; dout is copied when it is not).
 */
#ifndef ATTNLAB_FLASH_PARAMS_H
#define ATTNLAB_FLASH_PARAMS_H

typedef struct al_flash_op {
    void *ptr;
    long long sb, st, sh, sc;   /* elements */
    int dtype;                  /* AL_FLASH_DT_* (only read for the generic loads/stores) */
} al_flash_op;

/* dtype codes (the core's al_dtype numbers, repeated so the kernels need no header) */
#define AL_FLASH_DT_F32 0
#define AL_FLASH_DT_F64 1
#define AL_FLASH_DT_F16 2
#define AL_FLASH_DT_BF16 3

typedef struct al_flash_params {
    al_flash_op q, k, v, o;              /* forward: o is written (bf16/f16 like q) */
    al_flash_op dout, dq, dk, dv;        /* backward */
    const long long *q_start, *kv_start; /* [B] device arrays, NULL = 0 (dense formats) */
    const long long *q_len, *kv_len;     /* [B] device arrays, NULL = SQ / SKV */
    const float *alibi;                  /* [B*H] ALiBi slopes (natural units), NULL = none */
    float *lse;                          /* forward: [B,H,SQ] f32, natural log, -inf for empty rows */
    const void *lse_in;                  /* backward: the forward's lse, f32 or f64, any strides */
    long long lse_sb, lse_sh, lse_si;
    int lse_dtype;                       /* AL_FLASH_DT_F32 / F64 */
    int deterministic;                   /* backward: dQ partials per CTA, reduced in order */
    float *lse2;                         /* backward scratch [B,H,SQ]: lse*log2(e), +inf for empty rows */
    float *dsum;                         /* backward scratch [B,H,SQ]: rowsum(dO * O) */
    float *dq_acc;                       /* backward scratch [nsplit][B,H,SQ,D] f32 */
    int nsplit;                          /* dq_acc buffers (1, or the grid's x extent when deterministic) */
    int B, H, HG, SQ, SKV;
    int wl, wr;                          /* window (window mask kind only), -1 = unbounded */
    int m_reverse;                       /* block-mask variants: 1 = launch query blocks last first
                                            (al_attn_variant.block_order); the default kernels ignore it */
    int sched_hb;                        /* Hopper kernels' launch order (flash_common.cuh's al_fl_cta_coords):
                                            0 = the grid's, N = longest blocks first in sections of N heads */
    float scale;                         /* softmax scale */
    float scale_log2;                    /* scale * log2(e) */
    /* variants (score_mod / mask_mod, flash_common.cuh's hooks; only variant specialisations read
     * these, the default kernels never touch them) */
    const void *cap[8];                  /* AL_CAP(k): capture k's data pointer (storage offset applied) */
    float *cap_grad[8];                  /* AL_CAP_GRAD(k): f32 gradient accumulator of capture k, or NULL */
    const unsigned char *bmask;          /* block mask u8 [bb, hb, MB, NB] (AL_BLOCK_MASK specialisations):
                                            0 skip the tile, 1 evaluate mask_mod, 2 every element kept */
    long long bm_sb, bm_sh, bm_sm, bm_sn;   /* its strides in elements (0 on a broadcast b / h dim) */
    int bm_block_m, bm_block_n;          /* rows / columns of one block (multiples of the kernel tiles) */
    /* last, so the other fields keep their offsets in the kernels' parameter bank */
    int *sched_ctr;                      /* persistent Hopper backward (AL_SM90_PERSIST): [2] work counters of the
                                            dK/dV and dQ kernels, zeroed before their launches */
    int m_row0;                          /* the Hopper forward's second launch of a split grid (AL_SM90_ROW0): the
                                            query row its first block starts at; read by no other kernel */
} al_flash_params;

#endif /* ATTNLAB_FLASH_PARAMS_H */
