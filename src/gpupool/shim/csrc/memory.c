/* The CUDA shim's memory hooks for plain allocations: cuMemAlloc, pitched and managed memory
 * (spill to host memory where the pool allows it), cuMemFree, and stream-ordered allocations
 * charged through their memory pools' reserves. */
#include "gp_hooks.h"

/* -- memory */

static CUresult spill_alloc(CUdeviceptr *dptr, size_t bytes, int di, CUdevice dev) {
    if (!REAL(cuMemAllocManaged)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = REAL(cuMemAllocManaged)(dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (rc != CUDA_SUCCESS) return rc;
    if (R.cuMemAdvise) R.cuMemAdvise(*dptr, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev);
    mark_spilled(di, bytes);
    return CUDA_SUCCESS;
}

GP_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    NEED(cuMemAlloc_v2);
    if (!g_region && !g_region_error) return REAL(cuMemAlloc_v2)(dptr, bytes);
    CUdevice dev = 0;
    int di = gp_current_dev(&dev);
    CUresult rc = charge(di, bytes, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuMemAlloc_v2)(dptr, bytes);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        if (atomic_load(&g_region->dev[di].flags) & GP_DEV_SPILL) {
            rc = spill_alloc(dptr, bytes, di, dev);
            if (rc == CUDA_SUCCESS) {
                table_put(*dptr, K_MEM, bytes, di, 1);
                return rc;
            }
        }
        uncharge(di, bytes, 0);
        report_oom(di, gp_region_used_locked(g_region, (uint32_t)di),
                   atomic_load(&g_region->dev[di].mem_limit), bytes,
                   ": the slice has room but the GPU itself is full (spill to host is off)");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc != CUDA_SUCCESS) {
        uncharge(di, bytes, 0);
        return rc;
    }
    table_put(*dptr, K_MEM, bytes, di, 0);
    return rc;
}

/* Moves a charge made from an estimate to the exact size; undoes the allocation if that no
 * longer fits. Returns CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY. */
CUresult settle(int di, uint64_t estimate, uint64_t exact) {
    if (exact > estimate) {
        CUresult rc = charge(di, exact - estimate, 0);
        if (rc != CUDA_SUCCESS) {
            uncharge(di, estimate, 0);
            return rc;
        }
    } else if (exact < estimate) {
        uncharge(di, estimate - exact, 0);
    }
    return CUDA_SUCCESS;
}

#define GP_SPILL_PITCH 512

GP_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem) {
    NEED(cuMemAllocPitch_v2);
    if (!g_region && !g_region_error) return REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, elem);
    CUdevice dev = 0;
    int di = gp_current_dev(&dev);
    uint64_t estimate = (uint64_t)width * height; /* the pitch is known only afterwards */
    CUresult rc = charge(di, estimate, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, elem);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && di >= 0 &&
        (atomic_load(&g_region->dev[di].flags) & GP_DEV_SPILL)) {
        /* Spilled: managed memory with rows padded to GP_SPILL_PITCH, a multiple of every
         * GPU's texture pitch alignment, so the pitch stays valid for 2-D copies and textures. */
        size_t sp = (width + GP_SPILL_PITCH - 1) / GP_SPILL_PITCH * GP_SPILL_PITCH;
        uint64_t exact = (uint64_t)sp * height;
        if (settle(di, estimate, exact) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
        rc = spill_alloc(dptr, exact, di, dev);
        if (rc == CUDA_SUCCESS) {
            *pitch = sp;
            table_put(*dptr, K_MEM, exact, di, 1);
            return rc;
        }
        uncharge(di, exact, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && di >= 0) {
        uncharge(di, estimate, 0);
        report_oom(di, gp_region_used_locked(g_region, (uint32_t)di),
                   atomic_load(&g_region->dev[di].mem_limit), estimate,
                   ": the slice has room but the GPU itself is full (spill to host is off)");
        return rc;
    }
    if (rc != CUDA_SUCCESS) {
        uncharge(di, estimate, 0);
        return rc;
    }
    uint64_t exact = (uint64_t)*pitch * height;
    if (settle(di, estimate, exact) != CUDA_SUCCESS) {
        if (REAL(cuMemFree_v2)) REAL(cuMemFree_v2)(*dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    table_put(*dptr, K_MEM, exact, di, 0);
    return CUDA_SUCCESS;
}

GP_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    NEED(cuMemAllocManaged);
    if (!g_region && !g_region_error) return REAL(cuMemAllocManaged)(dptr, bytes, flags);
    int di = gp_current_dev(NULL);
    CUresult rc = charge(di, bytes, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuMemAllocManaged)(dptr, bytes, flags);
    if (rc != CUDA_SUCCESS) {
        uncharge(di, bytes, 0);
        return rc;
    }
    table_put(*dptr, K_MEM, bytes, di, 0);
    return rc;
}

GP_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
    NEED(cuMemFree_v2);
    CUresult rc = REAL(cuMemFree_v2)(dptr);
    if (rc == CUDA_SUCCESS && g_region) free_async_settle(dptr);
    return rc;
}

/* Stream-ordered allocations come from memory pools, which keep freed memory (up to their
 * release threshold) until a synchronisation or a trim. So what a pool holds is what counts:
 * each pool this process allocates from is charged its CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
 * settled after every allocation and free from it, and before any allocation is refused.
 * Where the driver cannot tell (the attribute query fails), the bytes asked are counted. */
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define GP_MAX_POOLS 64
struct gp_pool {
    CUmemoryPool pool;
    int di;
    uint64_t charged; /* bytes of its reserve charged to this process's slot */
};
static struct gp_pool g_pools[GP_MAX_POOLS];
static int g_npools;
/* Where each pool the process made or looked up keeps its memory (di, or GP_NOT_DEVICE). */
static struct {
    CUmemoryPool pool;
    int di;
} g_pool_loc[4 * GP_MAX_POOLS];
static int g_npool_loc;
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;

static int pool_attr(CUmemoryPool pool, int attr, uint64_t *out) {
    cuuint64_t v = 0;
    if (!R.cuMemPoolGetAttribute || R.cuMemPoolGetAttribute(pool, attr, &v) != CUDA_SUCCESS) return 0;
    *out = v;
    return 1;
}

static struct gp_pool *pool_entry(CUmemoryPool pool, int di) {
    for (int i = 0; i < g_npools; i++)
        if (g_pools[i].pool == pool) return &g_pools[i];
    if (g_npools == GP_MAX_POOLS) return NULL;
    g_pools[g_npools] = (struct gp_pool){pool, di, 0};
    return &g_pools[g_npools++];
}

/* Moves a pool's charge to its current reserve; returns 1 when the charge fell. */
static int pool_settle_locked(struct gp_pool *p) {
    uint64_t r;
    if (!pool_attr(p->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &r) || r == p->charged) return 0;
    int fell = r < p->charged;
    if (fell)
        uncharge(p->di, p->charged - r, 0);
    else
        charge_force(p->di, r - p->charged);
    p->charged = r;
    return fell;
}

int pools_resettle(void) {
    if (pthread_mutex_trylock(&g_pool_lock) != 0) return 0; /* an allocation settles it */
    int fell = 0;
    for (int i = 0; i < g_npools; i++) fell |= pool_settle_locked(&g_pools[i]);
    pthread_mutex_unlock(&g_pool_lock);
    return fell;
}

/* The graph a stream is capturing into, or NULL. */
static CUgraph capture_graph(CUstream s) {
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph g = NULL;
    if (R.cuStreamGetCaptureInfo_v2) {
        if (R.cuStreamGetCaptureInfo_v2(s, &status, NULL, &g, NULL, NULL) != CUDA_SUCCESS) return NULL;
    } else if (R.cuStreamGetCaptureInfo_v3) {
        if (R.cuStreamGetCaptureInfo_v3(s, &status, NULL, &g, NULL, NULL, NULL) != CUDA_SUCCESS)
            return NULL;
    } else {
        return NULL;
    }
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? g : NULL;
}

/* Whether bytes would fit the slice now (the message and CUDA_ERROR_OUT_OF_MEMORY if not),
 * charging nothing: a graph's memory is charged when the driver maps it. */
CUresult fits_now(int di, uint64_t bytes) {
    CUresult rc = charge(di, bytes, 0);
    if (rc == CUDA_SUCCESS) uncharge(di, bytes, 0);
    return rc;
}

static int pool_loc_get(CUmemoryPool pool, int *di);
static CUresult alloc_async(void *real, int from_pool, CUdeviceptr *dptr, size_t bytes,
                            CUmemoryPool pool, CUstream stream, int per_thread) {
#define CALL_REAL()                                                                    \
    (from_pool ? ((cuMemAllocFromPoolAsync_t *)real)(dptr, bytes, pool, stream)        \
               : ((cuMemAllocAsync_t *)real)(dptr, bytes, stream))
    if (!g_region && !g_region_error) return CALL_REAL();
    CUdevice dev = 0;
    int di = gp_current_dev(&dev);
    CUgraph captured = capture_graph(gp_real_stream(stream, per_thread));
    if (captured) { /* a mem-alloc node of the graph being captured: counted when it maps */
        CUresult rc = fits_now(di, bytes);
        if (rc != CUDA_SUCCESS) return rc;
        rc = CALL_REAL();
        if (rc == CUDA_SUCCESS) {
            table_add((uint64_t)(uintptr_t)captured, K_GRAPH + di, bytes, di);
            atomic_store(&g_graph_seen, 1);
        }
        return rc;
    }
    int pdi;
    if (pool && pool_loc_get(pool, &pdi)) { /* the pool's own place, not the current device's */
        if (pdi == GP_NOT_DEVICE) return CALL_REAL(); /* host or managed memory: not counted */
        di = pdi;
    }
    CUmemoryPool use = pool;
    if (!use && R.cuDeviceGetMemPool && R.cuDeviceGetMemPool(&use, dev) != CUDA_SUCCESS) use = NULL;
    uint64_t r0 = 0, u0 = 0;
    if (di < 0 || !use || !pool_attr(use, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &r0) ||
        !pool_attr(use, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &u0)) {
        CUresult rc = charge(di, bytes, 0); /* no pool figures: count the bytes asked */
        if (rc != CUDA_SUCCESS) return rc;
        rc = CALL_REAL();
        if (rc != CUDA_SUCCESS)
            uncharge(di, bytes, 0);
        else
            table_put(*dptr, K_MEM, bytes, di, 0);
        return rc;
    }
    pthread_mutex_lock(&g_pool_lock);
    struct gp_pool *p = pool_entry(use, di);
    if (!p) {
        pthread_mutex_unlock(&g_pool_lock);
        gp_log("gpupool: CUDA allocation refused: more than %d memory pools in one process",
               GP_MAX_POOLS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pool_settle_locked(p);
    /* Served from what the pool keeps, nothing grows; else it grows by at least the request. */
    uint64_t need = r0 - u0 >= bytes ? 0 : bytes;
    CUresult rc = need ? charge_once(di, need, 0, 1) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_unlock(&g_pool_lock);
        return rc;
    }
    rc = CALL_REAL();
    uncharge(di, need, 0); /* the provisional charge; the settle below charges the truth */
    pool_settle_locked(p);
    pthread_mutex_unlock(&g_pool_lock);
    if (rc == CUDA_SUCCESS) table_put(*dptr, K_POOL, 0, di, 0);
    return rc;
#undef CALL_REAL
}

void pool_reset_child(void) {
    pthread_mutex_init(&g_pool_lock, NULL);
    g_npools = 0;
    g_npool_loc = 0;
}

static void pool_loc_put(CUmemoryPool pool, int di) {
    pthread_mutex_lock(&g_pool_lock);
    int i = 0;
    while (i < g_npool_loc && g_pool_loc[i].pool != pool) i++;
    if (i < (int)(sizeof g_pool_loc / sizeof g_pool_loc[0])) {
        g_pool_loc[i].pool = pool;
        g_pool_loc[i].di = di;
        if (i == g_npool_loc) g_npool_loc++;
    }
    pthread_mutex_unlock(&g_pool_lock);
}

/* 1 and *di when the pool's location is known. */
static int pool_loc_get(CUmemoryPool pool, int *di) {
    int found = 0;
    pthread_mutex_lock(&g_pool_lock);
    for (int i = 0; i < g_npool_loc && !found; i++)
        if (g_pool_loc[i].pool == pool) {
            *di = g_pool_loc[i].di;
            found = 1;
        }
    pthread_mutex_unlock(&g_pool_lock);
    return found;
}

GP_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    NEED(cuMemPoolCreate);
    CUresult rc = REAL(cuMemPoolCreate)(pool, props);
    if (rc == CUDA_SUCCESS && g_region && pool && props)
        pool_loc_put(*pool, location_di(&props->location, props->allocType));
    return rc;
}
GP_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    NEED(cuDeviceGetDefaultMemPool);
    CUresult rc = REAL(cuDeviceGetDefaultMemPool)(pool, dev);
    if (rc == CUDA_SUCCESS && g_region && pool) pool_loc_put(*pool, dev_index(dev));
    return rc;
}
GP_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    NEED(cuDeviceGetMemPool);
    CUresult rc = REAL(cuDeviceGetMemPool)(pool, dev);
    if (rc == CUDA_SUCCESS && g_region && pool) pool_loc_put(*pool, dev_index(dev));
    return rc;
}

void free_async_settle(CUdeviceptr dptr) {
    struct gp_entry *e = table_take(dptr, K_MEM);
    if (e) {
        release_entry(e);
        return;
    }
    e = table_take(dptr, K_POOL);
    if (!e) return;
    free(e);
    pools_resettle();
}

GP_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    NEED(cuMemAllocAsync);
    return alloc_async(g_hooks[H_cuMemAllocAsync].real, 0, dptr, bytes, NULL, s, 0);
}
GP_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    NEED(cuMemAllocAsync_ptsz);
    return alloc_async(g_hooks[H_cuMemAllocAsync_ptsz].real, 0, dptr, bytes, NULL, s, 1);
}
GP_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool p,
                                        CUstream s) {
    NEED(cuMemAllocFromPoolAsync);
    return alloc_async(g_hooks[H_cuMemAllocFromPoolAsync].real, 1, dptr, bytes, p, s, 0);
}
GP_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool p,
                                             CUstream s) {
    NEED(cuMemAllocFromPoolAsync_ptsz);
    return alloc_async(g_hooks[H_cuMemAllocFromPoolAsync_ptsz].real, 1, dptr, bytes, p, s, 1);
}
GP_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    NEED(cuMemFreeAsync);
    CUresult rc = REAL(cuMemFreeAsync)(dptr, s);
    if (rc == CUDA_SUCCESS && g_region) free_async_settle(dptr);
    return rc;
}
GP_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    NEED(cuMemFreeAsync_ptsz);
    CUresult rc = REAL(cuMemFreeAsync_ptsz)(dptr, s);
    if (rc == CUDA_SUCCESS && g_region) free_async_settle(dptr);
    return rc;
}

