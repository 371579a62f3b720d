/* The CUDA shim's context hooks (a process's first context on a device is charged the context
 * reserve) and what the job is told about memory: the slice, not the GPU. */
#include "gp_hooks.h"

/* -- contexts: the first context of a process on a device takes the context reserve, held until
 * the process ends (its slot is released or reaped). Returns 1 when this call charged it. */
static int ctx_reserve(CUdevice dev, CUresult *rc) {
    *rc = CUDA_SUCCESS;
    if (!g_region && !g_region_error) return 0;
    int di = dev_index(dev);
    if (di < 0) return 0; /* allocations on it are refused with the reason */
    CLAIM(); /* a context is the first CUDA use, with or without a reserve to charge */
    uint64_t reserve = atomic_load(&g_region->dev[di].context_reserve);
    if (reserve == 0 || atomic_exchange(&g_ctx_charged[di], 1)) return 0;
    *rc = charge(di, reserve, 0);
    if (*rc != CUDA_SUCCESS) {
        atomic_store(&g_ctx_charged[di], 0);
        return 0;
    }
    return 1;
}

static void ctx_unreserve(CUdevice dev) {
    int di = dev_index(dev);
    if (di < 0) return;
    uncharge(di, atomic_load(&g_region->dev[di].context_reserve), 0);
    atomic_store(&g_ctx_charged[di], 0);
}

#define CTX_CALL(call, dev)                          \
    do {                                             \
        CUresult rc_;                                \
        int took_ = ctx_reserve(dev, &rc_);          \
        if (rc_ != CUDA_SUCCESS) return rc_;         \
        rc_ = call;                                  \
        if (rc_ != CUDA_SUCCESS && took_) ctx_unreserve(dev); \
        return rc_;                                  \
    } while (0)

GP_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    NEED(cuCtxCreate_v2);
    CTX_CALL(REAL(cuCtxCreate_v2)(pctx, flags, dev), dev);
}
GP_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags,
                               CUdevice dev) {
    NEED(cuCtxCreate_v3);
    CTX_CALL(REAL(cuCtxCreate_v3)(pctx, p, n, flags, dev), dev);
}
GP_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags,
                               CUdevice dev) {
    NEED(cuCtxCreate_v4);
    CTX_CALL(REAL(cuCtxCreate_v4)(pctx, p, flags, dev), dev);
}
GP_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    NEED(cuDevicePrimaryCtxRetain);
    CTX_CALL(REAL(cuDevicePrimaryCtxRetain)(pctx, dev), dev);
}

/* -- what the job is told: the slice, not the GPU */

GP_API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    NEED(cuMemGetInfo_v2);
    size_t f = 0, t = 0;
    CUresult rc = REAL(cuMemGetInfo_v2)(&f, &t);
    if (rc != CUDA_SUCCESS || !g_region) {
        if (free_b) *free_b = f;
        if (total_b) *total_b = t;
        return rc;
    }
    int di = gp_current_dev(NULL);
    if (di >= 0) {
        uint64_t limit = atomic_load(&g_region->dev[di].mem_limit);
        uint64_t used = gp_region_used_locked(g_region, (uint32_t)di); /* lock-free sum of atomics */
        int spill = (atomic_load(&g_region->dev[di].flags) & GP_DEV_SPILL) != 0;
        uint64_t total = (!spill && t < limit) ? t : limit;
        uint64_t fr = limit > used ? limit - used : 0;
        if (!spill && f < fr) fr = f;
        if (fr > total) fr = total;
        f = (size_t)fr;
        t = (size_t)total;
    } else {
        f = 0;
    }
    if (free_b) *free_b = f;
    if (total_b) *total_b = t;
    return rc;
}

GP_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    NEED(cuDeviceTotalMem_v2);
    CUresult rc = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (rc != CUDA_SUCCESS || !g_region || !bytes) return rc;
    int di = dev_index(dev);
    if (di < 0) return rc;
    uint64_t limit = atomic_load(&g_region->dev[di].mem_limit);
    int spill = (atomic_load(&g_region->dev[di].flags) & GP_DEV_SPILL) != 0;
    if (spill || limit < *bytes) *bytes = (size_t)limit;
    return rc;
}

