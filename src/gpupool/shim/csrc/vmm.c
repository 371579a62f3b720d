/* The CUDA shim's hooks for memory that is not a plain allocation: where memory lives (a
 * location's device), VMM handles and their mappings, arrays and mipmapped arrays. */
#include "gp_hooks.h"

/* -- where memory lives: a VMM allocation's or a pool's location. Host locations (HOST,
 * HOST_NUMA, HOST_NUMA_CURRENT) and managed pools take no device memory; a device location is
 * its device; any other type (CUDA 13.5's type 6, say) is counted as device memory, on its id
 * where that is a device of the slice, else on the current device: never left uncounted. */
int location_di(const CUmemLocation *loc, int alloc_type) {
    if (alloc_type == CU_MEM_ALLOCATION_TYPE_MANAGED) return GP_NOT_DEVICE;
    switch (loc->type) {
    case 0: /* none: a managed pool's "no preferred location" */
    case 2:
    case 3:
    case 4:
        return GP_NOT_DEVICE;
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return dev_index(loc->id);
    default: {
        int di = dev_index(loc->id);
        return di >= 0 ? di : gp_current_dev(NULL);
    }
    }
}

/* -- VMM: a physical allocation is charged at cuMemCreate and uncharged only once it is both
 * released (cuMemRelease) and unmapped (cuMemUnmap of its last mapping): the driver frees it
 * only then (PyTorch's expandable segments and NCCL release handles while still mapped). */
GP_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    NEED(cuMemCreate);
    if ((!g_region && !g_region_error) || !prop) return REAL(cuMemCreate)(handle, bytes, prop, flags);
    int di = location_di(&prop->location, 0);
    if (di == GP_NOT_DEVICE) return REAL(cuMemCreate)(handle, bytes, prop, flags);
    CUresult rc = charge(di, bytes, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuMemCreate)(handle, bytes, prop, flags);
    if (rc != CUDA_SUCCESS) {
        uncharge(di, bytes, 0);
        return rc;
    }
    table_put(*handle, K_VMM, bytes, di, 0);
    return rc;
}

/* Under g_table_lock: the handle's entry, or NULL. */
static struct gp_entry *vmm_entry_locked(uint64_t handle) {
    struct gp_entry *e = g_table[bucket(handle, K_VMM)];
    while (e && !(e->key == handle && e->kind == K_VMM)) e = e->next;
    return e;
}

GP_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    NEED(cuMemRelease);
    CUresult rc = REAL(cuMemRelease)(handle);
    if (rc != CUDA_SUCCESS || !g_region) return rc;
    pthread_mutex_lock(&g_table_lock);
    struct gp_entry *e = vmm_entry_locked(handle);
    int now = e && e->maps == 0;
    if (e) e->released = 1;
    pthread_mutex_unlock(&g_table_lock);
    if (now) release_entry(table_take(handle, K_VMM)); /* else at its last unmap */
    return rc;
}

GP_API CUresult cuMemMap(CUdeviceptr va, size_t bytes, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    NEED(cuMemMap);
    CUresult rc = REAL(cuMemMap)(va, bytes, offset, handle, flags);
    if (rc != CUDA_SUCCESS || !g_region) return rc;
    pthread_mutex_lock(&g_table_lock);
    struct gp_entry *e = vmm_entry_locked(handle);
    if (e) e->maps++;
    pthread_mutex_unlock(&g_table_lock);
    if (e) table_put(va, K_VMAP, handle, -1, 0);
    return rc;
}

GP_API CUresult cuMemUnmap(CUdeviceptr va, size_t bytes) {
    NEED(cuMemUnmap);
    CUresult rc = REAL(cuMemUnmap)(va, bytes);
    if (rc != CUDA_SUCCESS || !g_region) return rc;
    /* The mappings that started in [va, va + bytes): rare calls, so a scan of the table. */
    uint64_t freed[64];
    int n = 0;
    pthread_mutex_lock(&g_table_lock);
    for (int b = 0; b < GP_BUCKETS; b++) {
        for (struct gp_entry **p = &g_table[b]; *p;) {
            struct gp_entry *m = *p;
            if (m->kind != K_VMAP || m->key < va || m->key >= va + bytes) {
                p = &m->next;
                continue;
            }
            *p = m->next;
            struct gp_entry *h = vmm_entry_locked(m->bytes);
            if (h && --h->maps == 0 && h->released && n < 64) freed[n++] = h->key;
            free(m);
        }
    }
    pthread_mutex_unlock(&g_table_lock);
    for (int i = 0; i < n; i++) release_entry(table_take(freed[i], K_VMM));
    return rc;
}

static uint64_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4;
    }
}

static CUresult array_settle(CUarray arr, int di, CUdevice dev, uint64_t estimate) {
    uint64_t exact = estimate;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    if (R.cuArrayGetMemoryRequirements &&
        R.cuArrayGetMemoryRequirements(&req, arr, dev) == CUDA_SUCCESS && req.size > 0)
        exact = req.size;
    if (settle(di, estimate, exact) != CUDA_SUCCESS) {
        REAL(cuArrayDestroy)(arr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    table_put((uint64_t)(uintptr_t)arr, K_ARRAY, exact, di, 0);
    return CUDA_SUCCESS;
}

GP_API CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *d) {
    NEED(cuArrayCreate_v2);
    if ((!g_region && !g_region_error) || !d || !REAL(cuArrayDestroy)) return REAL(cuArrayCreate_v2)(arr, d);
    CUdevice dev = 0;
    int di = gp_current_dev(&dev);
    uint64_t est = (uint64_t)d->Width * (d->Height ? d->Height : 1) * d->NumChannels *
                   format_bytes(d->Format);
    CUresult rc = charge(di, est, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuArrayCreate_v2)(arr, d);
    if (rc != CUDA_SUCCESS) {
        uncharge(di, est, 0);
        return rc;
    }
    return array_settle(*arr, di, dev, est);
}

GP_API CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    NEED(cuArray3DCreate_v2);
    if ((!g_region && !g_region_error) || !d || !REAL(cuArrayDestroy)) return REAL(cuArray3DCreate_v2)(arr, d);
    CUdevice dev = 0;
    int di = gp_current_dev(&dev);
    uint64_t est = (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                   d->NumChannels * format_bytes(d->Format);
    CUresult rc = charge(di, est, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuArray3DCreate_v2)(arr, d);
    if (rc != CUDA_SUCCESS) {
        uncharge(di, est, 0);
        return rc;
    }
    return array_settle(*arr, di, dev, est);
}

GP_API CUresult cuArrayDestroy(CUarray arr) {
    NEED(cuArrayDestroy);
    CUresult rc = REAL(cuArrayDestroy)(arr);
    if (rc == CUDA_SUCCESS && g_region) release_entry(table_take((uint64_t)(uintptr_t)arr, K_ARRAY));
    return rc;
}

/* -- mipmapped arrays: the driver's own size (cuMipmappedArrayGetMemoryRequirements), else the
 * sum of the levels' bytes. */
GP_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels) {
    NEED(cuMipmappedArrayCreate);
    if ((!g_region && !g_region_error) || !d || !REAL(cuMipmappedArrayDestroy))
        return REAL(cuMipmappedArrayCreate)(m, d, levels);
    CUdevice dev = 0;
    int di = gp_current_dev(&dev);
    uint64_t est = 0, w = d->Width, h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        est += w * h * z * d->NumChannels * format_bytes(d->Format);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    CUresult rc = charge(di, est, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuMipmappedArrayCreate)(m, d, levels);
    if (rc != CUDA_SUCCESS) {
        uncharge(di, est, 0);
        return rc;
    }
    uint64_t exact = est;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    if (R.cuMipmappedArrayGetMemoryRequirements &&
        R.cuMipmappedArrayGetMemoryRequirements(&req, *m, dev) == CUDA_SUCCESS && req.size > 0)
        exact = req.size;
    if (settle(di, est, exact) != CUDA_SUCCESS) {
        REAL(cuMipmappedArrayDestroy)(*m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    table_put((uint64_t)(uintptr_t)*m, K_MIPMAP, exact, di, 0);
    return CUDA_SUCCESS;
}

GP_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    NEED(cuMipmappedArrayDestroy);
    CUresult rc = REAL(cuMipmappedArrayDestroy)(m);
    if (rc == CUDA_SUCCESS && g_region) release_entry(table_take((uint64_t)(uintptr_t)m, K_MIPMAP));
    return rc;
}

