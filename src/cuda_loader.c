/*
 * cuda_loader.c — finds and loads the CUDA plugin (lib/libattnlab_cuda.so) with dlopen on first use,
 * and forwards the public al_cuda_* calls to it.
 *
 * The core library has no CUDA dependency: on a machine without a driver, a GPU or the plugin,
 * al_cuda_available() says which is missing and every cuda request fails with that reason.
 * ATTNLAB_CUDA_PLUGIN=/path/to/libattnlab_cuda.so overrides the location;
 * ATTNLAB_DISABLE_CUDA=1 pretends no GPU exists (for testing the CPU-only paths).
 */
#define _GNU_SOURCE
#include "internal.h"
#include "cuda_plugin.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static al_cuda_api g_api;
static int g_loaded;
static char g_reason[512];

static void load_plugin(void) {
    const char *disable = getenv("ATTNLAB_DISABLE_CUDA");
    if (disable && *disable && strcmp(disable, "0") != 0) {
        snprintf(g_reason, sizeof g_reason, "CUDA disabled by ATTNLAB_DISABLE_CUDA");
        return;
    }
    char path[4096];
    const char *env = getenv("ATTNLAB_CUDA_PLUGIN");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        Dl_info info;
        if (!dladdr((void *)&load_plugin, &info) || !info.dli_fname) {
            snprintf(g_reason, sizeof g_reason, "cannot locate libattnlab.so to find the CUDA plugin beside it");
            return;
        }
        snprintf(path, sizeof path, "%s", info.dli_fname);
        char *slash = strrchr(path, '/');
        if (slash) slash[1] = '\0'; else path[0] = '\0';
        strncat(path, "libattnlab_cuda.so", sizeof path - strlen(path) - 1);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_reason, sizeof g_reason, "CUDA plugin not loaded (%s): %s", path, dlerror());
        return;
    }
    al_cuda_plugin_init_fn init = (al_cuda_plugin_init_fn)dlsym(h, "al_cuda_plugin_init");
    if (!init) {
        snprintf(g_reason, sizeof g_reason, "CUDA plugin %s has no al_cuda_plugin_init", path);
        dlclose(h);
        return;
    }
    memset(&g_api, 0, sizeof g_api);
    if (init(&g_api, AL_CUDA_ABI_VERSION) != AL_OK) {
        snprintf(g_reason, sizeof g_reason, "%s", al_last_error());
        /* keep the library loaded: CUDA runtimes do not like being unloaded */
        return;
    }
    g_loaded = 1;
}

const al_cuda_api *al_cuda_api_get(void) {
    pthread_once(&g_once, load_plugin);
    if (g_loaded) return &g_api;
    al_error(AL_ERR_DEVICE, "CUDA is not available: %s", g_reason);
    return NULL;
}

int32_t al_cuda_available(const char **reason) {
    pthread_once(&g_once, load_plugin);
    if (reason) *reason = g_loaded ? "" : g_reason;
    return g_loaded;
}

int32_t al_cuda_device_count(void) {
    const al_cuda_api *api = al_cuda_api_get();
    return api ? api->device_count() : 0;
}

al_status al_cuda_check_device(const char *op, int32_t device_index) {
    const al_cuda_api *api = al_cuda_api_get();
    if (!api) return al_error_prefix(AL_ERR_DEVICE, op);
    int32_t n = api->device_count();
    if (device_index < 0 || device_index >= n)
        return al_error(AL_ERR_DEVICE, "%s: device cuda:%d does not exist (%d CUDA device%s)", op, device_index, n,
                        n == 1 ? "" : "s");
    return AL_OK;
}

al_status al_cuda_device_info(int32_t device_index, char *name, int32_t name_len, int32_t *cc_major,
                              int32_t *cc_minor, int64_t *total_mem) {
    AL_TRY(al_cuda_check_device("cuda.device_info", device_index));
    return al_cuda_api_get()->device_info(device_index, name, name_len, cc_major, cc_minor, total_mem);
}

al_status al_cuda_device_attrs(int32_t device_index, int32_t *sm_count, int64_t *l2_bytes, int32_t *smem_per_block_optin) {
    AL_TRY(al_cuda_check_device("cuda.device_attrs", device_index));
    return al_cuda_api_get()->device_attrs(device_index, sm_count, l2_bytes, smem_per_block_optin);
}

int64_t al_cuda_backend_info(const char *backend, char *buf, int64_t n) {
    if (buf && n > 0) buf[0] = 0;
    int32_t which = backend && strcmp(backend, "fused") == 0 ? 0 : backend && strcmp(backend, "flash") == 0 ? 1 : -1;
    if (which < 0) {
        al_error(AL_ERR_ARG, "cuda_backend_info: backend: expected 'fused' or 'flash', got %s%s%s", backend ? "'" : "",
                 backend ? backend : "NULL", backend ? "'" : "");
        return -1;
    }
    const al_cuda_api *api = al_cuda_api_get();
    if (!api) {
        al_error_prefix(AL_ERR_DEVICE, "cuda_backend_info");
        return -1;
    }
    return api->backend_info(which, buf, n);
}

al_status al_cuda_synchronize(int32_t device_index) {
    AL_TRY(al_cuda_check_device("cuda.synchronize", device_index));
    return al_cuda_api_get()->synchronize(device_index);
}

int64_t al_cuda_memory_reserved(int32_t device_index) {
    if (al_cuda_check_device("cuda.memory_reserved", device_index) != AL_OK) return 0;
    return al_cuda_api_get()->memory_reserved(device_index);
}

al_status al_cuda_empty_cache(int32_t device_index) {
    AL_TRY(al_cuda_check_device("cuda.empty_cache", device_index));
    return al_cuda_api_get()->empty_cache(device_index);
}

/* Streams and events wrap the plugin's handles; the structs live on the host. */
struct al_cuda_stream {
    void *handle;
    int32_t dev;
};

struct al_cuda_event {
    void *ev;
    int32_t dev;
};

/* This thread's current stream wrapper per device (NULL: default), mirroring the plugin's. */
static _Thread_local al_cuda_stream *t_current[64];

al_status al_cuda_stream_new(al_cuda_stream **out, int32_t device_index) {
    *out = NULL;
    AL_TRY(al_cuda_check_device("cuda.Stream", device_index));
    al_cuda_stream *s = calloc(1, sizeof *s);
    if (!s) return al_error(AL_ERR_OOM, "cuda.Stream: out of host memory");
    al_status st = al_cuda_api_get()->stream_new(&s->handle, device_index);
    if (st != AL_OK) { free(s); return st; }
    s->dev = device_index;
    *out = s;
    return AL_OK;
}

void al_cuda_stream_free(al_cuda_stream *s) {
    if (!s) return;
    const al_cuda_api *api = al_cuda_api_get();
    if (s->dev >= 0 && s->dev < 64 && t_current[s->dev] == s) t_current[s->dev] = NULL;
    if (api) api->stream_free(s->dev, s->handle);
    free(s);
}

al_status al_cuda_set_stream(int32_t device_index, al_cuda_stream *s) {
    if (s && s->dev != device_index)
        return al_error(AL_ERR_ARG, "cuda.set_stream: the stream belongs to cuda:%d, not cuda:%d", s->dev, device_index);
    AL_TRY(al_cuda_check_device("cuda.set_stream", device_index));
    if (device_index >= 64) return al_error(AL_ERR_ARG, "cuda.set_stream: device index %d too large", device_index);
    AL_TRY(al_cuda_api_get()->stream_set(device_index, s ? s->handle : NULL));
    t_current[device_index] = s;
    return AL_OK;
}

al_cuda_stream *al_cuda_get_stream(int32_t device_index) {
    return device_index >= 0 && device_index < 64 ? t_current[device_index] : NULL;
}

al_status al_cuda_raw_stream(int32_t device_index, void **stream) {
    if (!stream) return al_error(AL_ERR_ARG, "cuda.raw_stream: stream: expected a pointer, got NULL");
    *stream = NULL;
    AL_TRY(al_cuda_check_device("cuda.raw_stream", device_index));
    void *s = al_cuda_api_get()->current_stream(device_index);
    if (!s) return al_error_prefix(AL_ERR_DEVICE, "cuda.raw_stream"); /* the plugin set the message */
    *stream = s;
    return AL_OK;
}

al_status al_cuda_stream_synchronize(al_cuda_stream *s) {
    if (!s) return al_error(AL_ERR_ARG, "cuda.Stream:synchronize: stream is NULL");
    return al_cuda_api_get()->stream_synchronize(s->dev, s->handle);
}

al_status al_cuda_stream_query(al_cuda_stream *s, int32_t *done) {
    if (!s) return al_error(AL_ERR_ARG, "cuda.Stream:query: stream is NULL");
    return al_cuda_api_get()->stream_query(s->dev, s->handle, done);
}

al_status al_cuda_stream_wait_event(al_cuda_stream *s, al_cuda_event *e) {
    if (!s || !e) return al_error(AL_ERR_ARG, "cuda.Stream:wait_event: stream or event is NULL");
    if (s->dev != e->dev)
        return al_error(AL_ERR_ARG, "cuda.Stream:wait_event: stream on cuda:%d, event on cuda:%d", s->dev, e->dev);
    return al_cuda_api_get()->stream_wait_event(s->dev, s->handle, e->ev);
}

al_status al_cuda_event_new(al_cuda_event **out, int32_t device_index) {
    *out = NULL;
    AL_TRY(al_cuda_check_device("cuda.Event", device_index));
    al_cuda_event *e = calloc(1, sizeof *e);
    if (!e) return al_error(AL_ERR_OOM, "cuda.Event: out of host memory");
    al_status st = al_cuda_api_get()->event_new(&e->ev, device_index);
    if (st != AL_OK) { free(e); return st; }
    e->dev = device_index;
    *out = e;
    return AL_OK;
}

void al_cuda_event_free(al_cuda_event *e) {
    if (!e) return;
    const al_cuda_api *api = al_cuda_api_get();
    if (api && e->ev) api->event_free(e->ev);
    free(e);
}

al_status al_cuda_event_record(al_cuda_event *e) {
    if (!e) return al_error(AL_ERR_ARG, "cuda.Event:record: event is NULL");
    return al_cuda_api_get()->event_record(e->ev);
}

al_status al_cuda_event_record_on(al_cuda_event *e, al_cuda_stream *s) {
    if (!e) return al_error(AL_ERR_ARG, "cuda.Event:record: event is NULL");
    if (s && s->dev != e->dev)
        return al_error(AL_ERR_ARG, "cuda.Event:record: event on cuda:%d, stream on cuda:%d", e->dev, s->dev);
    return al_cuda_api_get()->event_record_on(e->ev, s ? s->handle : NULL);
}

al_status al_cuda_event_synchronize(al_cuda_event *e) {
    if (!e) return al_error(AL_ERR_ARG, "cuda.Event:synchronize: event is NULL");
    return al_cuda_api_get()->event_synchronize(e->ev);
}

al_status al_cuda_event_elapsed(const al_cuda_event *start, const al_cuda_event *end, float *ms) {
    if (!start || !end) return al_error(AL_ERR_ARG, "cuda.Event:elapsed: event is NULL");
    return al_cuda_api_get()->event_elapsed(start->ev, end->ev, ms);
}
