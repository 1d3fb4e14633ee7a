/*
 * sizeof.c — al_sizeof(name): C's sizeof for each public struct, so a spec can check that the
 * LuaJIT cdef (generated from include/attnlab.h) lays the structs out exactly as the compiler did.
 * Add a row here for every struct added to the public header.
 */
#include "internal.h"

int64_t al_sizeof(const char *type_name) {
    static const struct { const char *name; int64_t size; } rows[] = {
        {"al_tensor", (int64_t)sizeof(al_tensor)},
        {"al_attn_params", (int64_t)sizeof(al_attn_params)},
        {"al_attn_inputs", (int64_t)sizeof(al_attn_inputs)},
        {"al_attn_fp8", (int64_t)sizeof(al_attn_fp8)},
        {"al_attn_variant", (int64_t)sizeof(al_attn_variant)},
    };
    if (!type_name) return -1;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (strcmp(rows[i].name, type_name) == 0) return rows[i].size;
    return -1;
}
