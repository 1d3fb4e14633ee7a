/*
 * cuda/cudnn_plan_cache.h — the fused backend's cache of cuDNN execution plans, one per path (attn_fused.cu:
 * f16/bf16, attn_fused_fp8.cu: FP8). A fixed table of CAP slots, the least recently used evicted, keyed by the
 * path's key struct (whole int64 words, memset to 0 before it is filled: compared with an FNV-1a hash, then
 * memcmp). A graph cuDNN refused is cached too, with its reason, so a shape that cannot run is judged once
 * (supports() asks on every call). The storage is the path's own static arrays: nothing is allocated but the
 * graph under construction. Not thread-safe: the path holds its lock around every call, and while it uses
 * the entry it got back (an eviction would destroy that plan).
 */
#ifndef ATTNLAB_CUDA_CUDNN_PLAN_CACHE_H
#define ATTNLAB_CUDA_CUDNN_PLAN_CACHE_H

#include "cuda/cudnn_graph.h"

/* One cached graph: its plan (or why there is none) and what running it needs. */
typedef struct al_dnn_cached_plan {
    al_dnn plan;                    /* NULL: cuDNN refused the graph (reason says why) */
    int64_t ws;                     /* workspace bytes */
    int64_t uids[AL_DNN_MAX_UIDS];  /* the variant pack's UIDs (the graph's non-virtual tensors) */
    int nuids;
    int64_t flags;                  /* what the path's builder noted about the graph (attn_fused.cu: U_LEFT_BOUND's type) */
    char reason[240];
} al_dnn_cached_plan;

typedef struct al_dnn_cache_slot {
    uint64_t hash, last_used;
    int used;
    al_dnn_cached_plan entry;
} al_dnn_cache_slot;

/* Builds form `attempt` (0, 1, ...) of key's graph into g (freshly initialised) and returns 1, or returns 0 when
 * there is no such form. Form 0 always exists; a later form is tried only when cuDNN refused the ones before, and
 * the refusal quoted is form 0's. *flags is the entry's flags (0 before form 0). */
typedef int (*al_dnn_build_fn)(al_dnn_graph *g, const void *key, int attempt, int64_t *flags);

typedef struct al_dnn_plan_cache {
    al_dnn_cache_slot *slots;       /* cap slots */
    void *keys;                     /* cap keys of key_bytes each */
    int cap;
    size_t key_bytes;               /* a multiple of 8 */
    al_dnn_build_fn build;
    uint64_t tick;
    int64_t builds;                 /* plans built so far (tests read it) */
} al_dnn_plan_cache;

/* A cache over the path's static storage: slots[cap], keys[cap] of key_type. */
#define AL_DNN_PLAN_CACHE(slots, keys, build) \
    { (slots), (keys), (int)(sizeof(slots) / sizeof((slots)[0])), sizeof((keys)[0]), (build), 0, 0 }

/* The entry for key: found (marked most recently used), or built now into a free or the least recently used
 * slot. Never NULL: a refused graph is an entry with plan == NULL and the reason. */
AL_CU_HIDDEN const al_dnn_cached_plan *al_dnn_cache_get(al_dnn_plan_cache *c, const void *key, cudnnHandle_t handle);
/* How many slots hold a plan (refusals not counted). */
AL_CU_HIDDEN int al_dnn_cache_plans(const al_dnn_plan_cache *c);

#endif /* ATTNLAB_CUDA_CUDNN_PLAN_CACHE_H */
