/*
 * cuda/launch_log.cu — the names of the kernels launched most recently, for error messages.
 *
 * A kernel that faults (an illegal address, a device-side assert) does not fail its launch: the fault
 * is reported by the next CUDA call that waits on the device, typically a synchronisation, a copy to
 * the host or a later launch. al_cu_status (check.h) recognises those asynchronous faults and quotes
 * this log, newest first, so the message names the kernel that most likely faulted.
 *
 * The log is a ring of static name pointers (string literals or names that live as long as their
 * module) shared by all threads: a slot is claimed with an atomic increment, so concurrent launches
 * never block each other; a name read while another thread overwrites its slot is still a valid
 * string (every slot only ever holds pointers to live static names).
 */
#include "cuda/cuda_internal.h"
#include <stdio.h>
#include <string.h>

#define AL_LAUNCH_LOG 16

static const char *volatile g_names[AL_LAUNCH_LOG];
static unsigned long long g_count;   /* launches noted so far; slot = count % AL_LAUNCH_LOG */

void al_cu_note_launch(const char *kernel) {
    unsigned long long i = __atomic_fetch_add(&g_count, 1ULL, __ATOMIC_RELAXED);
    g_names[i % AL_LAUNCH_LOG] = kernel ? kernel : "?";
}

int al_cu_is_async_fault(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
        return 1;
    default:
        return 0;
    }
}

const char *al_cu_recent_launches(char *buf, size_t n, int n_max) {
    if (!buf || n == 0) return "";
    buf[0] = '\0';
    unsigned long long count = __atomic_load_n(&g_count, __ATOMIC_RELAXED);
    if (count == 0) {
        snprintf(buf, n, "(no kernel launched by attnlab yet)");
        return buf;
    }
    size_t used = 0;
    for (int k = 0; k < n_max && (unsigned long long)k < count && k < AL_LAUNCH_LOG; k++) {
        const char *name = g_names[(count - 1 - (unsigned long long)k) % AL_LAUNCH_LOG];
        int w = snprintf(buf + used, n - used, "%s%s", k ? ", " : "", name ? name : "?");
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    return buf;
}

/* ---- the test hook: a kernel that faults ---------------------------------------------------------- */
/* Reads through a pointer into the never-mapped first page of the address space (the compiler cannot
 * prove it, since the address comes in as an argument) and writes the value back, so the read is not
 * optimised away. */
__global__ void al_debug_fault_kernel(const int *bad, int *sink) { *sink = *bad; }

al_status al_cu_debug_fault(int32_t dev) {
    AL_CUDA_TRY(cudaSetDevice(dev));
    cudaStream_t s = (cudaStream_t)al_cu_current_stream(dev);
    al_debug_fault_kernel<<<1, 1, 0, s>>>((const int *)(uintptr_t)16, (int *)(uintptr_t)32);
    AL_CUDA_LAUNCHED_K("al_debug_fault_kernel");
    return AL_OK;
}
