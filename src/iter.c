/*
 * iter.c — set-up of al_iter, the row-major strided walk used by CPU element-wise code.
 * (al_iter_next is inline in internal.h: it is the hot path.)
 */
#include "internal.h"

void al_iter_init(al_iter *it, int32_t ndim, const int64_t *size, int32_t nops,
                  const int64_t *const *strides, const int64_t *offsets) {
    memset(it, 0, sizeof *it);
    it->ndim = ndim;
    it->nops = nops;
    it->numel = 1;
    for (int32_t d = 0; d < ndim; d++) {
        it->size[d] = size[d];
        it->numel *= size[d];
        for (int32_t k = 0; k < nops; k++) it->stride[k][d] = strides[k][d];
    }
    for (int32_t k = 0; k < nops; k++) it->off[k] = offsets[k];
}
