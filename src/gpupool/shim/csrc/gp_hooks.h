/* What the CUDA shim's hook units share (never exported: the build hides every symbol not
 * marked GP_API, and everything declared here is hidden too). The shim is one library built
 * from these units (see each file's first comment):
 *
 *  - shim.c: the real driver, the process's state, init (INIT/CLAIM/NEED), slots and devices;
 *  - charge.c: this process's allocation table and charging against the region's limits;
 *  - procaddr.c: the hook table (g_hooks), cuInit, cuGetProcAddress(_v2), the preload's dlsym;
 *  - memory.c: allocations, pitched and managed memory, stream-ordered allocations and pools;
 *  - vmm.c: where memory lives (locations), VMM handles and mappings, arrays, mipmapped arrays;
 *  - context.c: the context reserve and what the job is told (cuMemGetInfo, cuDeviceTotalMem);
 *  - graph.c: graph memory (mem-alloc nodes, instantiation, upload, trim);
 *  - launch.c: stream capture tracking and the paced launches (pace.c does the pacing);
 *
 * beside pace.c (gp_shim.h), region.c (gp_region.h) and, in the façade, the generated
 * forward.c. Each unit includes this header first. */
#ifndef GP_HOOKS_H
#define GP_HOOKS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "gp_cuda.h"
#include "gp_region.h"
#include "gp_shim.h"

#define GP_API __attribute__((visibility("default")))

#pragma GCC visibility push(hidden)

/* ---------------------------------------------------------------- the real driver and the hooks */

typedef void *(*dlsym_fn)(void *, const char *);
extern dlsym_fn g_dlsym; /* the real dlsym */
extern void *g_real;     /* handle of the real driver */

/* Driver functions the shim calls itself without hooking them (shim.c fills it). */
struct gp_driver {
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*cuEventCreate)(CUevent *, unsigned int);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuMemAdvise)(CUdeviceptr, size_t, int, CUdevice);
    CUresult (*cuArrayGetMemoryRequirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray, CUdevice);
    CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, int, void *);
    CUresult (*cuDeviceGetGraphMemAttribute)(CUdevice, int, void *);
    CUresult (*cuStreamGetCaptureInfo_v2)(CUstream, int *, cuuint64_t *, CUgraph *,
                                          const CUgraphNode **, size_t *);
    CUresult (*cuStreamGetCaptureInfo_v3)(CUstream, int *, cuuint64_t *, CUgraph *,
                                          const CUgraphNode **, const CUgraphEdgeData **, size_t *);
    CUresult (*cuMipmappedArrayGetMemoryRequirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *,
                                                      CUmipmappedArray, CUdevice);
    CUresult (*cuStreamIsCapturing)(CUstream, int *);
};
extern struct gp_driver R;

/* The hooks: exported name, the API name a cuGetProcAddress caller asks for, the first CUDA
 * version that maps that name to this variant, and the stream flavour (1: per-thread default
 * stream). A variant picked by name and version is handed out only once the driver confirms it
 * (see lookup_hook): a wrong guess would call with the wrong arguments. */
#define GP_HOOKS(X)                                                  \
    X(cuInit, "cuInit", 2000, 0)                                  \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)             \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)          \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                       \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)             \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)            \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                         \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)               \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)          \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0) \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1) \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                 \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)            \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                       \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                     \
    X(cuMemMap, "cuMemMap", 10020, 0)                             \
    X(cuMemUnmap, "cuMemUnmap", 10020, 0)                         \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)               \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0) \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0)         \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                 \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)             \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                  \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                     \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                    \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                    \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0) \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                   \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)           \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                  \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)             \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)             \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)        \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0) \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1) \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                   \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)              \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, 0) \
    X(cuGraphAddNode, "cuGraphAddNode", 12020, 0)                 \
    X(cuGraphAddNode_v2, "cuGraphAddNode", 12030, 0)              \
    X(cuGraphAddNode_v3, "cuGraphAddNode", 13040, 0)                 \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, 0) \
    X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, 0) \
    X(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, 1) \
    X(cuGraphUpload, "cuGraphUpload", 11010, 0)                   \
    X(cuGraphUpload_ptsz, "cuGraphUpload", 11010, 1)              \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, 0)         \
    X(cuGraphDestroy, "cuGraphDestroy", 10000, 0)                 \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040, 0)     \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)  \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0) \
    X(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, 0)     \
    X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, 1) \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0)  \
    X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1) \
    X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, 0) \
    X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, 1) \
    X(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0)         \
    X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 1)

enum {
#define X(n, b, v, p) H_##n,
    GP_HOOKS(X)
#undef X
        H_COUNT
};

struct gp_hook {
    const char *name;
    const char *base;
    int version;
    int per_thread;
    void *hook;
    void *real;
};

#define X(n, b, v, p) GP_API CUresult n();
GP_HOOKS(X)
#undef X

extern struct gp_hook g_hooks[H_COUNT]; /* procaddr.c */

#define REAL(n) ((n##_t *)g_hooks[H_##n].real)

/* ---------------------------------------------------------------- function types */
/* ---------------------------------------------------------------- function types */

typedef CUresult cuInit_t(unsigned int);
typedef CUresult cuGetProcAddress_t(const char *, void **, int, cuuint64_t);
typedef CUresult cuGetProcAddress_v2_t(const char *, void **, int, cuuint64_t,
                                       CUdriverProcAddressQueryResult *);
typedef CUresult cuMemAlloc_v2_t(CUdeviceptr *, size_t);
typedef CUresult cuMemAllocPitch_v2_t(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult cuMemAllocManaged_t(CUdeviceptr *, size_t, unsigned int);
typedef CUresult cuMemFree_v2_t(CUdeviceptr);
typedef CUresult cuMemAllocAsync_t(CUdeviceptr *, size_t, CUstream);
typedef CUresult cuMemAllocAsync_ptsz_t(CUdeviceptr *, size_t, CUstream);
typedef CUresult cuMemAllocFromPoolAsync_t(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult cuMemAllocFromPoolAsync_ptsz_t(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult cuMemFreeAsync_t(CUdeviceptr, CUstream);
typedef CUresult cuMemFreeAsync_ptsz_t(CUdeviceptr, CUstream);
typedef CUresult cuMemCreate_t(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
typedef CUresult cuMemRelease_t(CUmemGenericAllocationHandle);
typedef CUresult cuMemMap_t(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                            unsigned long long);
typedef CUresult cuMemUnmap_t(CUdeviceptr, size_t);
typedef CUresult cuMemPoolCreate_t(CUmemoryPool *, const CUmemPoolProps *);
typedef CUresult cuDeviceGetDefaultMemPool_t(CUmemoryPool *, CUdevice);
typedef CUresult cuDeviceGetMemPool_t(CUmemoryPool *, CUdevice);
typedef CUresult cuArrayCreate_v2_t(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult cuArray3DCreate_v2_t(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult cuArrayDestroy_t(CUarray);
typedef CUresult cuCtxCreate_v2_t(CUcontext *, unsigned int, CUdevice);
typedef CUresult cuCtxCreate_v3_t(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
typedef CUresult cuCtxCreate_v4_t(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult cuDevicePrimaryCtxRetain_t(CUcontext *, CUdevice);
typedef CUresult cuMemGetInfo_v2_t(size_t *, size_t *);
typedef CUresult cuDeviceTotalMem_v2_t(size_t *, CUdevice);
typedef CUresult cuLaunchKernel_t(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
typedef cuLaunchKernel_t cuLaunchKernel_ptsz_t;
typedef CUresult cuLaunchKernelEx_t(const CUlaunchConfig *, CUfunction, void **, void **);
typedef cuLaunchKernelEx_t cuLaunchKernelEx_ptsz_t;
typedef CUresult cuLaunchCooperativeKernel_t(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                             unsigned, unsigned, unsigned, CUstream, void **);
typedef cuLaunchCooperativeKernel_t cuLaunchCooperativeKernel_ptsz_t;
typedef CUresult cuGraphLaunch_t(CUgraphExec, CUstream);
typedef cuGraphLaunch_t cuGraphLaunch_ptsz_t;
typedef CUresult cuGraphAddMemAllocNode_t(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                          CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult cuGraphAddNode_t(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                  CUgraphNodeParams *);
typedef CUresult cuGraphAddNode_v2_t(CUgraphNode *, CUgraph, const CUgraphNode *,
                                     const CUgraphEdgeData *, size_t, CUgraphNodeParams *);
typedef cuGraphAddNode_v2_t cuGraphAddNode_v3_t; /* CUDA 13.4: _v2's arguments */
typedef CUresult cuGraphInstantiateWithFlags_t(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult cuGraphInstantiateWithParams_t(CUgraphExec *, CUgraph,
                                                CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef cuGraphInstantiateWithParams_t cuGraphInstantiateWithParams_ptsz_t;
typedef CUresult cuGraphUpload_t(CUgraphExec, CUstream);
typedef cuGraphUpload_t cuGraphUpload_ptsz_t;
typedef CUresult cuGraphExecDestroy_t(CUgraphExec);
typedef CUresult cuGraphDestroy_t(CUgraph);
typedef CUresult cuDeviceGraphMemTrim_t(CUdevice);
typedef CUresult cuMipmappedArrayCreate_t(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
                                          unsigned int);
typedef CUresult cuMipmappedArrayDestroy_t(CUmipmappedArray);
typedef CUresult cuStreamBeginCapture_t(CUstream);
typedef cuStreamBeginCapture_t cuStreamBeginCapture_ptsz_t;
typedef CUresult cuStreamBeginCapture_v2_t(CUstream, int);
typedef cuStreamBeginCapture_v2_t cuStreamBeginCapture_v2_ptsz_t;
typedef CUresult cuStreamBeginCaptureToGraph_t(CUstream, CUgraph, const CUgraphNode *,
                                               const CUgraphEdgeData *, size_t, int);
typedef cuStreamBeginCaptureToGraph_t cuStreamBeginCaptureToGraph_ptsz_t;
typedef CUresult cuStreamEndCapture_t(CUstream, CUgraph *);
typedef cuStreamEndCapture_t cuStreamEndCapture_ptsz_t;


/* ---------------------------------------------------------------- state (shim.c) */

extern int g_region_error;   /* GPUPOOL_CUDA_REGION named a region that cannot be used */
extern pid_t g_slot_pid;     /* the pid g_slot was claimed for */
extern pid_t g_pid;          /* this process's pid, renewed after fork */
extern atomic_int g_ready;   /* init done */
extern atomic_int g_ctx_charged[GP_MAX_DEVICES]; /* the context reserve is charged on di */
extern atomic_int g_di_dev[GP_MAX_DEVICES]; /* a CUdevice ordinal + 1 of region device di, 0: unseen */
/* Graph memory (graph.c): the reserve charged per device, whether any graph memory was seen
 * (launches settle only then), and the lock of both. */
extern uint64_t g_graph_charged[GP_MAX_DEVICES];
extern atomic_int g_graph_seen;
extern pthread_mutex_t g_graph_lock;
extern atomic_int g_cap_blind; /* procaddr.c: a capture began through an unhooked function */

void gp_init(void);
int dev_index(CUdevice d);
void ensure_slot(void);
void resolve_dlsym(void);
void uuid_text(const uint8_t *u, char *out);

#define INIT()                                                          \
    do {                                                                \
        if (!atomic_load_explicit(&g_ready, memory_order_acquire)) gp_init(); \
    } while (0)

/* A process claims its slot at its first CUDA use (a context, an allocation, a launch), not when
 * the library loads: a process that only loads the façade (a tool, a framework's import, a
 * child that never touches the GPU) holds none and is not "attached". */
#define CLAIM()                                                         \
    do {                                                                \
        if (g_region && (g_slot < 0 || g_slot_pid != g_pid)) ensure_slot(); \
    } while (0)

#define NEED(n)                                                         \
    do {                                                                \
        INIT();                                                         \
        if (!g_hooks[H_##n].real) return CUDA_ERROR_NOT_FOUND;          \
    } while (0)

/* ---------------------------------------------------------------- allocations of this process (charge.c) */

enum {
    K_MEM = 1,
    K_VMM = 2,
    K_ARRAY = 3,
    K_POOL = 4,    /* counted through its pool */
    K_MIPMAP = 5,
    K_VMAP = 6,    /* a VMM mapping at a virtual address: bytes holds its handle */
    K_GRAPH = 16,  /* + di: a graph's alloc-node bytes on device di (an estimate, not charged) */
    K_GEXEC = 48,  /* + di: the same for an instantiated graph */
};
struct gp_entry {
    struct gp_entry *next;
    uint64_t key;
    uint64_t bytes;
    int di;
    int kind;
    int spilled;
    int maps;     /* K_VMM: mappings of the handle (cuMemMap) not yet unmapped */
    int released; /* K_VMM: cuMemRelease was called; freed once maps is 0 too */
};
#define GP_BUCKETS 4096
extern struct gp_entry *g_table[GP_BUCKETS];
extern pthread_mutex_t g_table_lock;

unsigned bucket(uint64_t key, int kind);
CUresult charge(int di, uint64_t bytes, int spilled);
void charge_force(int di, uint64_t bytes);
CUresult charge_once(int di, uint64_t bytes, int spilled, int no_retry);
void mark_spilled(int di, uint64_t bytes);
void release_entry(struct gp_entry *e);
void report_oom(int di, uint64_t used, uint64_t limit, uint64_t bytes, const char *why);
void table_add(uint64_t key, int kind, uint64_t bytes, int di);
uint64_t table_get(uint64_t key, int kind);
void table_put(uint64_t key, int kind, uint64_t bytes, int di, int spilled);
struct gp_entry *table_take(uint64_t key, int kind);
void uncharge(int di, uint64_t bytes, int spilled);

/* ---------------------------------------------------------------- memory.c, vmm.c */

#define GP_NOT_DEVICE (-2) /* a location that is no device's memory (host, managed) */
#define CU_MEM_ALLOCATION_TYPE_MANAGED 2
CUresult fits_now(int di, uint64_t bytes);
CUresult settle(int di, uint64_t estimate, uint64_t exact);
int pools_resettle(void);
void free_async_settle(CUdeviceptr dptr);
void pool_reset_child(void);
int location_di(const CUmemLocation *loc, int alloc_type);

/* ---------------------------------------------------------------- graph.c, launch.c */

/* Around a call that may map graph memory (graph_begin .. graph_end). */
struct graph_hold {
    uint64_t need[GP_MAX_DEVICES];
};
CUresult graph_begin(const uint64_t *est, struct graph_hold *h);
void graph_end(struct graph_hold *h);
void graph_estimate(uint64_t key, int base, uint64_t *est);
int graphs_resettle(void);
void capture_reset_child(void);

#pragma GCC visibility pop

#endif
