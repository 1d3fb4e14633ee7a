/* host_profile.h — an optional wall-clock split of a backend call's host path into named stages.
 *
 * Issue 5 asks for <= 5 us of host time per cached call; to know where the time goes, a backend notes the
 * clock at its stage boundaries when ATTNLAB_HOST_PROFILE=1 (ATTNLAB_FUSED_PROFILE=1, the older name, works
 * too; read once per process) and adds one call's stage times into an al_hprof. The backend's info text
 * (al.cuda.backend_info) then ends with the means per call. Off: one predictable branch per stage. */
#ifndef ATTNLAB_CUDA_HOST_PROFILE_H
#define ATTNLAB_CUDA_HOST_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_internal.h"

#define AL_HPROF_MAX 8

typedef struct al_hprof {
    const char *what;                      /* "flash forward" */
    int n;                                 /* stages */
    const char *names[AL_HPROF_MAX];
    double ns[AL_HPROF_MAX];               /* summed over calls */
    int64_t calls;
} al_hprof;

/* 1 when ATTNLAB_HOST_PROFILE (or ATTNLAB_FUSED_PROFILE) is set to something other than 0 */
AL_CU_HIDDEN int al_hprof_on(void);
/* CLOCK_MONOTONIC in nanoseconds */
AL_CU_HIDDEN double al_hprof_now(void);
/* add one call: t[0..p->n] are its stage boundaries (thread-safe) */
AL_CU_HIDDEN void al_hprof_add(al_hprof *p, const double *t);
/* append "\nhost profile (ATTNLAB_HOST_PROFILE=1), <what>: N calls, us per call: a 1.00 b 2.00" to buf (which
 * holds u characters of n) when p has calls; returns the new length */
AL_CU_HIDDEN size_t al_hprof_format(al_hprof *p, char *buf, size_t u, size_t n);

#endif
