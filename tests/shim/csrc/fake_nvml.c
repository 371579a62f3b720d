/* A fake NVML (libnvidia-ml.so.1) for the shim's tests: FAKE_CUDA_DEVICES devices with the fake
 * driver's UUIDs, FAKE_CUDA_MEM bytes each, of which FAKE_NVML_USED are in use (by others).
 * Its compute-process list has the calling process alone, with what the fake driver loaded in
 * it holds on the device (fake_cuda_process_bytes), when one is loaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef struct nvmlDevice_st {
    int index;
} *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

static struct nvmlDevice_st g_dev[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

static unsigned long long env_u64(const char *name, unsigned long long dflt) {
    const char *e = getenv(name);
    return e ? strtoull(e, NULL, 10) : dflt;
}
static int count(void) {
    int n = (int)env_u64("FAKE_CUDA_DEVICES", 1);
    return n < 1 ? 1 : n > 8 ? 8 : n;
}

API int nvmlInit_v2(void) { return 0; }
API int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return 0;
}
API int nvmlShutdown(void) { return 0; }
API int nvmlDeviceGetCount_v2(unsigned int *n) {
    *n = (unsigned)count();
    return 0;
}
API int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if ((int)i >= count()) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *d = &g_dev[i];
    return 0;
}
API int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    snprintf(name, len, "Fake GPU %d", d->index);
    return 0;
}
API int nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    /* "gpupoolfakegpu" + {0, index}, as the fake driver's cuDeviceGetUuid gives it. */
    const unsigned char raw[16] = {'g', 'p', 'u', 'p', 'o', 'o', 'l', 'f',
                                   'a', 'k', 'e', 'g', 'p', 'u', 0, (unsigned char)d->index};
    snprintf(uuid, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8], raw[9], raw[10],
             raw[11], raw[12], raw[13], raw[14], raw[15]);
    return 0;
}
API int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    (void)d;
    m->total = env_u64("FAKE_CUDA_MEM", 80ull << 30);
    m->used = env_u64("FAKE_NVML_USED", 0);
    m->free = m->total - m->used;
    return 0;
}
API int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(d, &v1);
    m->total = v1.total;
    m->used = v1.used;
    m->free = v1.free;
    m->reserved = 1 << 20;
    return 0;
}

API int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    char mine[96];
    for (int i = 0; i < count(); i++) {
        nvmlDeviceGetUUID(&g_dev[i], mine, sizeof mine);
        if (strcmp(mine, uuid) == 0) {
            *d = &g_dev[i];
            return 0;
        }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
API int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *out) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    unsigned long long (*bytes)(int) = cuda ? (unsigned long long (*)(int))dlsym(cuda, "fake_cuda_process_bytes") : NULL;
    if (!bytes || bytes(d->index) == 0) {
        *n = 0;
        return 0;
    }
    if (*n < 1 || !out) {
        *n = 1;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    out[0].pid = (unsigned)getpid();
    out[0].usedGpuMemory = bytes(d->index);
    out[0].gpuInstanceId = out[0].computeInstanceId = 0xffffffffu;
    *n = 1;
    return 0;
}
