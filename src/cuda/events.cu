/*
 * cuda/events.cu — events on a device's streams: recorded on the calling thread's current stream
 * (or a given one), so an event pair brackets exactly the work queued there between the two records;
 * a stream can wait on an event recorded on another (cross-stream ordering).
 * An event handle is a small host struct { cudaEvent_t, device }.
 */
#include "cuda/cuda_internal.h"
#include <stdlib.h>

typedef struct {
    cudaEvent_t ev;
    int32_t dev;
    int recorded;
} al_cu_event;

al_status al_cu_event_new(void **out, int32_t dev) {
    *out = NULL;
    AL_TRY(al_cu_begin("cuda.Event", dev, NULL));
    al_cu_event *e = (al_cu_event *)calloc(1, sizeof *e);
    if (!e) return al_error(AL_ERR_OOM, "cuda.Event: out of host memory");
    al_status st = AL_CUDA_ST(cudaEventCreate(&e->ev));
    if (st != AL_OK) {
        free(e);
        return st;
    }
    e->dev = dev;
    *out = e;
    return AL_OK;
}

void al_cu_event_free(void *p) {
    al_cu_event *e = (al_cu_event *)p;
    if (!e) return;
    if (cudaSetDevice(e->dev) != cudaSuccess || cudaEventDestroy(e->ev) != cudaSuccess) (void)cudaGetLastError();
    free(e);
}

al_status al_cu_event_record(void *p) { return al_cu_event_record_on(p, NULL); }

/* Record on the given stream (NULL: the calling thread's current stream). */
al_status al_cu_event_record_on(void *p, void *stream) {
    al_cu_event *e = (al_cu_event *)p;
    if (!e) return al_error(AL_ERR_ARG, "cuda.Event:record: event is NULL");
    cudaStream_t s;
    AL_TRY(al_cu_begin("cuda.Event:record", e->dev, &s));
    AL_CUDA_TRY(cudaEventRecord(e->ev, stream ? (cudaStream_t)stream : s));
    e->recorded = 1;
    return AL_OK;
}

al_status al_cu_stream_wait_event(int32_t dev, void *stream, void *p) {
    al_cu_event *e = (al_cu_event *)p;
    if (!e) return al_error(AL_ERR_ARG, "cuda.Stream:wait_event: event is NULL");
    if (!e->recorded) return al_error(AL_ERR_ARG, "cuda.Stream:wait_event: the event was never recorded");
    cudaStream_t s;
    AL_TRY(al_cu_begin("cuda.Stream:wait_event", dev, &s));
    AL_CUDA_TRY(cudaStreamWaitEvent(stream ? (cudaStream_t)stream : s, e->ev, 0));
    return AL_OK;
}

al_status al_cu_event_synchronize(void *p) {
    al_cu_event *e = (al_cu_event *)p;
    if (!e) return al_error(AL_ERR_ARG, "cuda.Event:synchronize: event is NULL");
    if (!e->recorded) return al_error(AL_ERR_ARG, "cuda.Event:synchronize: the event was never recorded");
    AL_TRY(al_cu_begin("cuda.Event:synchronize", e->dev, NULL));
    AL_CUDA_TRY(cudaEventSynchronize(e->ev));
    return AL_OK;
}

al_status al_cu_event_elapsed(void *start, void *end, float *ms) {
    al_cu_event *a = (al_cu_event *)start, *b = (al_cu_event *)end;
    *ms = 0.0f;
    if (!a || !b) return al_error(AL_ERR_ARG, "cuda.Event:elapsed: event is NULL");
    if (!a->recorded || !b->recorded) return al_error(AL_ERR_ARG, "cuda.Event:elapsed: both events must be recorded first");
    if (a->dev != b->dev)
        return al_error(AL_ERR_ARG, "cuda.Event:elapsed: events on different devices (cuda:%d, cuda:%d)", a->dev, b->dev);
    AL_TRY(al_cu_begin("cuda.Event:elapsed", a->dev, NULL));
    /* waits for the end event, so the caller need not synchronise first */
    AL_CUDA_TRY(cudaEventSynchronize(b->ev));
    AL_CUDA_TRY(cudaEventElapsedTime(ms, a->ev, b->ev));
    return AL_OK;
}
