/*
 * cuda/cudnn_plan_cache.cu — the fused backend's plan cache (see cudnn_plan_cache.h): lookup by hash and key,
 * least-recently-used eviction, and building a missing entry's plan form by form.
 */
#include "cuda/cudnn_plan_cache.h"
#include <stdio.h>
#include <stdlib.h>

/* FNV-1a over a key of whole int64 words */
static uint64_t hash_words(const void *key, size_t nbytes) {
    const int64_t *p = (const int64_t *)key;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < nbytes / sizeof(int64_t); i++) h = (h ^ (uint64_t)p[i]) * 1099511628211ULL;
    return h;
}

/* Build the plan of slot e's key: form 0, then each later form while cuDNN refuses. */
static void build_entry(al_dnn_plan_cache *c, al_dnn_cached_plan *e, const void *key, cudnnHandle_t handle) {
    al_dnn_graph *g = (al_dnn_graph *)malloc(sizeof *g);   /* (~10 KB: not on the caller's stack) */
    if (!g) {
        snprintf(e->reason, sizeof e->reason, "out of host memory building the cuDNN graph");
        return;
    }
    for (int attempt = 0;; attempt++) {
        al_dnn_graph_init(g);
        if (!c->build(g, key, attempt, &e->flags)) break;
        al_status s = al_dnn_build_plan(g, handle, &e->plan, &e->ws);
        if (s == AL_OK) {
            e->reason[0] = 0;
            memcpy(e->uids, g->uids, sizeof(int64_t) * (size_t)g->nuids);
            e->nuids = g->nuids;
            c->builds++;
            break;
        }
        e->plan = NULL;
        if (attempt == 0) snprintf(e->reason, sizeof e->reason, "%s", al_last_error());   /* the refusal quoted */
        al_dnn_graph_free(g);
    }
    al_dnn_graph_free(g);
    free(g);
}

const al_dnn_cached_plan *al_dnn_cache_get(al_dnn_plan_cache *c, const void *key, cudnnHandle_t handle) {
    uint64_t h = hash_words(key, c->key_bytes);
    int victim = -1;
    for (int i = 0; i < c->cap; i++) {
        al_dnn_cache_slot *s = &c->slots[i];
        if (s->used && s->hash == h && memcmp((const char *)c->keys + (size_t)i * c->key_bytes, key, c->key_bytes) == 0) {
            s->last_used = ++c->tick;
            return &s->entry;
        }
        /* victim: the first free slot, else the least recently used */
        const al_dnn_cache_slot *v = victim < 0 ? NULL : &c->slots[victim];
        if (!v || (v->used && (!s->used || s->last_used < v->last_used))) victim = i;
    }
    al_dnn_cache_slot *s = &c->slots[victim];
    if (s->used && s->entry.plan) cudnnBackendDestroyDescriptor(s->entry.plan);
    memset(s, 0, sizeof *s);
    memcpy((char *)c->keys + (size_t)victim * c->key_bytes, key, c->key_bytes);
    s->hash = h;
    s->used = 1;
    s->last_used = ++c->tick;
    build_entry(c, &s->entry, key, handle);
    return &s->entry;
}

int al_dnn_cache_plans(const al_dnn_plan_cache *c) {
    int n = 0;
    for (int i = 0; i < c->cap; i++) n += c->slots[i].used && c->slots[i].entry.plan;
    return n;
}
