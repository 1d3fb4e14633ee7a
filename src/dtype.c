/*
 * dtype.c — dtype names, sizes and parsing; device-name parsing.
 */
#include "internal.h"
#include <stdlib.h>

static const struct { const char *name; int64_t size; int32_t is_float; } k_dtypes[AL_DTYPE_COUNT] = {
    [AL_DTYPE_F32] = {"f32", 4, 1},           [AL_DTYPE_F64] = {"f64", 8, 1},
    [AL_DTYPE_F16] = {"f16", 2, 1},           [AL_DTYPE_BF16] = {"bf16", 2, 1},
    [AL_DTYPE_FP8_E4M3] = {"fp8_e4m3", 1, 1}, [AL_DTYPE_FP8_E5M2] = {"fp8_e5m2", 1, 1},
    [AL_DTYPE_I32] = {"i32", 4, 0},           [AL_DTYPE_I64] = {"i64", 8, 0},
    [AL_DTYPE_U8] = {"u8", 1, 0},             [AL_DTYPE_BOOL] = {"bool", 1, 0},
};

/* Other spellings users type (PyTorch / NumPy / Torch7). */
static const struct { const char *alias; int32_t dtype; } k_aliases[] = {
    {"float32", AL_DTYPE_F32}, {"float", AL_DTYPE_F32},     {"float64", AL_DTYPE_F64},
    {"double", AL_DTYPE_F64},  {"float16", AL_DTYPE_F16},   {"half", AL_DTYPE_F16},
    {"bfloat16", AL_DTYPE_BF16}, {"e4m3", AL_DTYPE_FP8_E4M3}, {"e5m2", AL_DTYPE_FP8_E5M2},
    {"float8_e4m3fn", AL_DTYPE_FP8_E4M3}, {"float8_e5m2", AL_DTYPE_FP8_E5M2},
    {"int32", AL_DTYPE_I32},   {"int", AL_DTYPE_I32},       {"int64", AL_DTYPE_I64},
    {"long", AL_DTYPE_I64},    {"uint8", AL_DTYPE_U8},      {"byte", AL_DTYPE_U8},
};

const char *al_dtype_name(int32_t dtype) {
    return (dtype >= 0 && dtype < AL_DTYPE_COUNT) ? k_dtypes[dtype].name : NULL;
}

int64_t al_dtype_size(int32_t dtype) {
    return (dtype >= 0 && dtype < AL_DTYPE_COUNT) ? k_dtypes[dtype].size : 0;
}

int32_t al_dtype_is_float(int32_t dtype) {
    return (dtype >= 0 && dtype < AL_DTYPE_COUNT) ? k_dtypes[dtype].is_float : 0;
}

al_status al_dtype_parse(const char *name, int32_t *dtype) {
    if (!name) return al_error(AL_ERR_ARG, "dtype: expected a dtype name, got nothing");
    for (int32_t i = 0; i < AL_DTYPE_COUNT; i++)
        if (strcmp(name, k_dtypes[i].name) == 0) { *dtype = i; return AL_OK; }
    for (size_t i = 0; i < sizeof k_aliases / sizeof k_aliases[0]; i++)
        if (strcmp(name, k_aliases[i].alias) == 0) { *dtype = k_aliases[i].dtype; return AL_OK; }
    return al_error(AL_ERR_ARG,
                    "dtype: expected one of f32 f64 f16 bf16 fp8_e4m3 fp8_e5m2 i32 i64 u8 bool, got '%s'", name);
}

al_status al_device_parse(const char *name, int32_t *device_type, int32_t *device_index) {
    if (!name) return al_error(AL_ERR_ARG, "device: expected 'cpu', 'cuda' or 'cuda:N', got nothing");
    if (strcmp(name, "cpu") == 0) { *device_type = AL_DEVICE_CPU; *device_index = 0; return AL_OK; }
    if (strcmp(name, "cuda") == 0) { *device_type = AL_DEVICE_CUDA; *device_index = 0; return AL_OK; }
    if (strncmp(name, "cuda:", 5) == 0 && name[5] >= '0' && name[5] <= '9') {
        char *end = NULL;
        long idx = strtol(name + 5, &end, 10);
        if (*end == '\0' && idx >= 0 && idx < 1024) {
            *device_type = AL_DEVICE_CUDA;
            *device_index = (int32_t)idx;
            return AL_OK;
        }
    }
    return al_error(AL_ERR_ARG, "device: expected 'cpu', 'cuda' or 'cuda:N', got '%s'", name);
}
