/* The CUDA shim's graph-memory hooks: alloc nodes added, graphs instantiated, uploaded,
 * destroyed and trimmed, charged by the device's graph memory pool reserve. */
#include "gp_hooks.h"

/* -- graph memory: memory-allocation nodes (cuGraphAddMemAllocNode, cuGraphAddNode with a
 * mem-alloc node, cuMemAllocAsync under stream capture) take their memory from the device's
 * graph memory pool when the driver maps it (at instantiate, upload or launch); the pool keeps
 * it until cuDeviceGraphMemTrim. So, like a memory pool's, what counts is the pool's reserve:
 * this process's slot is charged the device's CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, settled
 * after every call that can change it and before any allocation is refused. Before such a call
 * the graph's own alloc-node bytes (as the shim saw them added) are checked against the slice,
 * so a graph that cannot fit is refused with CUDA_ERROR_OUT_OF_MEMORY before anything maps. A
 * node is refused when it could not fit the slice at the time it is added. */

static int graph_attr(int di, int attr, uint64_t *out) {
    int dev = atomic_load(&g_di_dev[di]) - 1;
    cuuint64_t v = 0;
    if (dev < 0 || !R.cuDeviceGetGraphMemAttribute ||
        R.cuDeviceGetGraphMemAttribute(dev, attr, &v) != CUDA_SUCCESS)
        return 0;
    *out = v;
    return 1;
}

/* Moves device di's graph-memory charge to the pool's reserve; returns 1 when it fell. */
static int graph_settle_locked(int di) {
    uint64_t r;
    if (!graph_attr(di, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &r) || r == g_graph_charged[di])
        return 0;
    int fell = r < g_graph_charged[di];
    if (fell)
        uncharge(di, g_graph_charged[di] - r, 0);
    else
        charge_force(di, r - g_graph_charged[di]);
    g_graph_charged[di] = r;
    return fell;
}

int graphs_resettle(void) {
    if (!g_region || !atomic_load(&g_graph_seen)) return 0;
    if (pthread_mutex_trylock(&g_graph_lock) != 0) return 0;
    int fell = 0;
    for (uint32_t di = 0; di < g_region->ndev; di++) fell |= graph_settle_locked((int)di);
    pthread_mutex_unlock(&g_graph_lock);
    return fell;
}

/* Around a call that may map graph memory: est[di] is what the graph's alloc nodes take. What the
 * pool cannot serve from its reserve is charged for the call's duration (refused if it does not
 * fit), then the truth is settled. Returns with g_graph_lock held unless refused. */

CUresult graph_begin(const uint64_t *est, struct graph_hold *h) {
    memset(h, 0, sizeof *h);
    pthread_mutex_lock(&g_graph_lock);
    for (uint32_t di = 0; di < g_region->ndev; di++) {
        graph_settle_locked((int)di);
        if (!est[di]) continue;
        uint64_t r = 0, u = 0;
        if (graph_attr((int)di, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &r) &&
            graph_attr((int)di, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &u) && r - u >= est[di])
            continue; /* served from what the pool keeps */
        if (charge_once((int)di, est[di], 0, 1) != CUDA_SUCCESS) {
            for (uint32_t j = 0; j < di; j++) uncharge((int)j, h->need[j], 0);
            pthread_mutex_unlock(&g_graph_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        h->need[di] = est[di];
    }
    return CUDA_SUCCESS;
}

void graph_end(struct graph_hold *h) {
    for (uint32_t di = 0; di < g_region->ndev; di++) {
        uncharge((int)di, h->need[di], 0);
        graph_settle_locked((int)di);
    }
    pthread_mutex_unlock(&g_graph_lock);
}

void graph_estimate(uint64_t key, int base, uint64_t *est) {
    memset(est, 0, sizeof(uint64_t) * GP_MAX_DEVICES);
    for (uint32_t di = 0; di < g_region->ndev; di++) est[di] = table_get(key, base + (int)di);
}

/* A new alloc node of bytes on location->id: refused when it cannot fit the slice now. */
static CUresult alloc_node_check(CUgraph g, const CUDA_MEM_ALLOC_NODE_PARAMS *p, int *di) {
    *di = -1;
    if (!g_region && !g_region_error) return CUDA_SUCCESS;
    if (!p || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_SUCCESS;
    *di = dev_index(p->poolProps.location.id);
    (void)g;
    return fits_now(*di, p->bytesize);
}

static void alloc_node_added(CUgraph g, const CUDA_MEM_ALLOC_NODE_PARAMS *p, int di) {
    if (g_region && di >= 0) {
        table_add((uint64_t)(uintptr_t)g, K_GRAPH + di, p->bytesize, di);
        atomic_store(&g_graph_seen, 1);
    }
}

GP_API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                       size_t n, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    NEED(cuGraphAddMemAllocNode);
    int di;
    CUresult rc = alloc_node_check(g, p, &di);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuGraphAddMemAllocNode)(node, g, deps, n, p);
    if (rc == CUDA_SUCCESS) alloc_node_added(g, p, di);
    return rc;
}

GP_API CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                               CUgraphNodeParams *p) {
    NEED(cuGraphAddNode);
    int alloc = p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC, di = -1;
    CUresult rc = alloc ? alloc_node_check(g, &p->u.alloc, &di) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuGraphAddNode)(node, g, deps, n, p);
    if (rc == CUDA_SUCCESS && alloc) alloc_node_added(g, &p->u.alloc, di);
    return rc;
}

GP_API CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                  const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *p) {
    NEED(cuGraphAddNode_v2);
    int alloc = p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC, di = -1;
    CUresult rc = alloc ? alloc_node_check(g, &p->u.alloc, &di) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuGraphAddNode_v2)(node, g, deps, edges, n, p);
    if (rc == CUDA_SUCCESS && alloc) alloc_node_added(g, &p->u.alloc, di);
    return rc;
}

GP_API CUresult cuGraphAddNode_v3(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                  const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *p) {
    NEED(cuGraphAddNode_v3);
    int alloc = p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC, di = -1;
    CUresult rc = alloc ? alloc_node_check(g, &p->u.alloc, &di) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuGraphAddNode_v3)(node, g, deps, edges, n, p);
    if (rc == CUDA_SUCCESS && alloc) alloc_node_added(g, &p->u.alloc, di);
    return rc;
}

/* Instantiation may map the graph's memory; the exec inherits the graph's estimate. */
#define GRAPH_INSTANTIATE(call, pexec, graph)                                            \
    do {                                                                                 \
        if (!g_region) return call;                                                      \
        uint64_t est_[GP_MAX_DEVICES];                                                   \
        struct graph_hold h_;                                                            \
        graph_estimate((uint64_t)(uintptr_t)(graph), K_GRAPH, est_);                     \
        if (graph_begin(est_, &h_) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;     \
        CUresult rc_ = call;                                                             \
        graph_end(&h_);                                                                  \
        if (rc_ == CUDA_SUCCESS && (pexec) && *(pexec))                                  \
            for (uint32_t di_ = 0; di_ < g_region->ndev; di_++)                          \
                if (est_[di_])                                                           \
                    table_add((uint64_t)(uintptr_t)*(pexec), K_GEXEC + (int)di_, est_[di_], \
                              (int)di_);                                                 \
        return rc_;                                                                      \
    } while (0)

GP_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long f) {
    NEED(cuGraphInstantiateWithFlags);
    GRAPH_INSTANTIATE(REAL(cuGraphInstantiateWithFlags)(e, g, f), e, g);
}
GP_API CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    NEED(cuGraphInstantiateWithParams);
    GRAPH_INSTANTIATE(REAL(cuGraphInstantiateWithParams)(e, g, p), e, g);
}
GP_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    NEED(cuGraphInstantiateWithParams_ptsz);
    GRAPH_INSTANTIATE(REAL(cuGraphInstantiateWithParams_ptsz)(e, g, p), e, g);
}

/* Upload and launch may map an instantiated graph's memory (after a trim, say). */
#define GRAPH_MAPS(call, exec)                                                           \
    do {                                                                                 \
        uint64_t est_[GP_MAX_DEVICES];                                                   \
        struct graph_hold h_;                                                            \
        graph_estimate((uint64_t)(uintptr_t)(exec), K_GEXEC, est_);                      \
        if (graph_begin(est_, &h_) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;     \
        CUresult rc_ = call;                                                             \
        graph_end(&h_);                                                                  \
        return rc_;                                                                      \
    } while (0)

GP_API CUresult cuGraphUpload(CUgraphExec e, CUstream s) {
    NEED(cuGraphUpload);
    if (!g_region) return REAL(cuGraphUpload)(e, s);
    GRAPH_MAPS(REAL(cuGraphUpload)(e, s), e);
}
GP_API CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) {
    NEED(cuGraphUpload_ptsz);
    if (!g_region) return REAL(cuGraphUpload_ptsz)(e, s);
    GRAPH_MAPS(REAL(cuGraphUpload_ptsz)(e, s), e);
}

GP_API CUresult cuGraphExecDestroy(CUgraphExec e) {
    NEED(cuGraphExecDestroy);
    CUresult rc = REAL(cuGraphExecDestroy)(e);
    if (rc == CUDA_SUCCESS && g_region) {
        for (uint32_t di = 0; di < g_region->ndev; di++)
            free(table_take((uint64_t)(uintptr_t)e, K_GEXEC + (int)di));
        graphs_resettle();
    }
    return rc;
}

GP_API CUresult cuGraphDestroy(CUgraph g) {
    NEED(cuGraphDestroy);
    CUresult rc = REAL(cuGraphDestroy)(g);
    if (rc == CUDA_SUCCESS && g_region)
        for (uint32_t di = 0; di < g_region->ndev; di++)
            free(table_take((uint64_t)(uintptr_t)g, K_GRAPH + (int)di));
    return rc;
}

GP_API CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    NEED(cuDeviceGraphMemTrim);
    CUresult rc = REAL(cuDeviceGraphMemTrim)(dev);
    if (rc == CUDA_SUCCESS && g_region) {
        dev_index(dev); /* knows the ordinal from now on */
        atomic_store(&g_graph_seen, 1);
        graphs_resettle();
    }
    return rc;
}

