/* The CUDA shim's bookkeeping of this process's allocations (a hash table keyed by pointer,
 * handle or array and kind) and its charging: an allocation is charged to this process's slot
 * in the region only while the replica's sum stays within its limit on that device. */
#include "gp_hooks.h"

/* ---------------------------------------------------------------- allocations of this process */

struct gp_entry *g_table[GP_BUCKETS];
pthread_mutex_t g_table_lock = PTHREAD_MUTEX_INITIALIZER;

unsigned bucket(uint64_t key, int kind) {
    uint64_t h = (key ^ ((uint64_t)kind << 60)) * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 52) & (GP_BUCKETS - 1);
}

void table_put(uint64_t key, int kind, uint64_t bytes, int di, int spilled) {
    struct gp_entry *e = malloc(sizeof *e);
    if (!e) return; /* the charge stays: it is released with the slot when the process ends */
    e->key = key;
    e->kind = kind;
    e->bytes = bytes;
    e->di = di;
    e->spilled = spilled;
    e->maps = e->released = 0;
    pthread_mutex_lock(&g_table_lock);
    unsigned b = bucket(key, kind);
    e->next = g_table[b];
    g_table[b] = e;
    pthread_mutex_unlock(&g_table_lock);
}

/* Removes and returns the entry (the caller frees it), or NULL. */
struct gp_entry *table_take(uint64_t key, int kind) {
    pthread_mutex_lock(&g_table_lock);
    struct gp_entry **p = &g_table[bucket(key, kind)];
    while (*p && !((*p)->key == key && (*p)->kind == kind)) p = &(*p)->next;
    struct gp_entry *e = *p;
    if (e) *p = e->next;
    pthread_mutex_unlock(&g_table_lock);
    return e;
}

/* Adds bytes to the entry (creating it): the graph-memory estimates, never charged themselves. */
void table_add(uint64_t key, int kind, uint64_t bytes, int di) {
    pthread_mutex_lock(&g_table_lock);
    struct gp_entry *e = g_table[bucket(key, kind)];
    while (e && !(e->key == key && e->kind == kind)) e = e->next;
    if (e) e->bytes += bytes;
    pthread_mutex_unlock(&g_table_lock);
    if (!e) table_put(key, kind, bytes, di, 0);
}

uint64_t table_get(uint64_t key, int kind) {
    pthread_mutex_lock(&g_table_lock);
    struct gp_entry *e = g_table[bucket(key, kind)];
    while (e && !(e->key == key && e->kind == kind)) e = e->next;
    uint64_t bytes = e ? e->bytes : 0;
    pthread_mutex_unlock(&g_table_lock);
    return bytes;
}

/* ---------------------------------------------------------------- charging */

void report_oom(int di, uint64_t used, uint64_t limit, uint64_t bytes, const char *why) {
    char u[48] = "an unknown GPU";
    if (di >= 0) uuid_text(g_region->dev[di].uuid, u);
    gp_log("gpupool: CUDA out of memory on %s: slice \"%s\" allows %llu bytes (%.1f MiB), %llu in "
           "use by its processes, %llu more asked%s",
           u, g_region->label, (unsigned long long)limit, (double)limit / 1048576.0,
           (unsigned long long)used, (unsigned long long)bytes, why);
}


/* Adds bytes to this process's slot if the replica stays within its limit on device di. */
CUresult charge_once(int di, uint64_t bytes, int spilled, int no_retry) {
    if (!g_region) return g_region_error ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (di < 0) {
        gp_log("gpupool: CUDA allocation refused: the device is not part of slice \"%s\"",
               g_region->label);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ensure_slot();
    if (g_slot < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (gp_region_lock(g_region) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t limit = atomic_load(&g_region->dev[di].mem_limit);
    uint64_t used = gp_region_used_locked(g_region, (uint32_t)di);
    if (used + bytes > limit || used + bytes < used) {
        if (gp_region_reap_locked(g_region) > 0) used = gp_region_used_locked(g_region, (uint32_t)di);
    }
    if (used + bytes > limit || used + bytes < used) {
        gp_region_unlock(g_region);
        /* Pools may have given memory back since they were last looked at: count again. */
        if (!no_retry && (pools_resettle() | graphs_resettle()))
            return charge_once(di, bytes, spilled, 1);
        report_oom(di, used, limit, bytes, "");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct gp_slot *s = &g_region->slot[g_slot];
    atomic_fetch_add(&s->used[di], bytes);
    if (spilled) atomic_fetch_add(&s->spilled[di], bytes);
    gp_region_unlock(g_region);
    return CUDA_SUCCESS;
}

CUresult charge(int di, uint64_t bytes, int spilled) {
    return charge_once(di, bytes, spilled, 0);
}

/* Adds bytes the driver already holds, limit or not (a pool that grew more than asked). */
void charge_force(int di, uint64_t bytes) {
    if (g_region && di >= 0 && g_slot >= 0) atomic_fetch_add(&g_region->slot[g_slot].used[di], bytes);
}

void uncharge(int di, uint64_t bytes, int spilled) {
    if (!g_region || di < 0 || g_slot < 0 || g_slot_pid != g_pid) return;
    struct gp_slot *s = &g_region->slot[g_slot];
    atomic_fetch_sub(&s->used[di], bytes);
    if (spilled) atomic_fetch_sub(&s->spilled[di], bytes);
}

void mark_spilled(int di, uint64_t bytes) {
    if (g_region && di >= 0 && g_slot >= 0)
        atomic_fetch_add(&g_region->slot[g_slot].spilled[di], bytes);
}

void release_entry(struct gp_entry *e) {
    if (!e) return;
    uncharge(e->di, e->bytes, e->spilled);
    free(e);
}

