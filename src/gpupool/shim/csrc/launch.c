/* The CUDA shim's stream-capture tracking and its launch hooks: kernels, cooperative kernels
 * and graphs, paced by pace.c outside captures. */
#include "gp_hooks.h"

/* ---------------------------------------------------------------- stream capture
 *
 * While a stream captures, its launches become graph nodes (nothing runs), and the driver
 * forbids "potentially unsafe" calls: under a GLOBAL-mode capture no thread of the process,
 * under a THREAD_LOCAL one not the capturing thread, may query or synchronise an event; doing
 * so fails and invalidates the capture (PyTorch's and vLLM's CUDA graphs would then fail). An
 * event recorded in a capturing stream is a node, not a time. So pacing keeps out: it skips a
 * launch while this thread may not touch events (counted from the capture hooks below) or
 * while the launch's own stream captures (asked of the driver: RELAXED captures, and any the
 * hooks missed; asked only while the hooks saw some capture begin, so an uncaptured launch
 * costs two atomic loads). A captured graph is paced when it is launched, as one span. */

static atomic_int g_cap_any;            /* captures of any mode running in this process */
static atomic_int g_cap_global;         /* GLOBAL-mode captures running in this process */
static __thread atomic_int t_cap_local; /* THREAD_LOCAL ones begun by this thread */
static __thread char t_pt_stream;       /* identifies this thread's per-thread default stream */
struct gp_capture {
    const void *key; /* NULL: a free entry */
    int mode;
    atomic_int *local; /* the beginning thread's t_cap_local, for a THREAD_LOCAL capture */
};
#define GP_MAX_CAPTURES 64
static struct gp_capture g_captures[GP_MAX_CAPTURES];
static pthread_mutex_t g_capture_lock = PTHREAD_MUTEX_INITIALIZER;

/* The stream a call means: NULL through a _ptsz function is this thread's per-thread stream. */
CUstream gp_real_stream(CUstream s, int per_thread) {
    return (per_thread && s == NULL) ? CU_STREAM_PER_THREAD : s;
}
const void *gp_stream_key(CUstream s, int per_thread) {
    s = gp_real_stream(s, per_thread);
    return s == CU_STREAM_PER_THREAD ? (const void *)&t_pt_stream : (const void *)s;
}

static void capture_begun(CUstream s, int per_thread, int mode) {
    pthread_mutex_lock(&g_capture_lock);
    for (int i = 0; i < GP_MAX_CAPTURES; i++) {
        if (g_captures[i].key) continue;
        g_captures[i] = (struct gp_capture){gp_stream_key(s, per_thread), mode, &t_cap_local};
        atomic_fetch_add(&g_cap_any, 1);
        if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) atomic_fetch_add(&g_cap_global, 1);
        if (mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) atomic_fetch_add(&t_cap_local, 1);
        break;
    }
    pthread_mutex_unlock(&g_capture_lock);
}

/* Whether stream s captures now (asked of the driver; 0 when it cannot say). */
static int stream_capturing(CUstream s, int per_thread) {
    int st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (R.cuStreamIsCapturing && R.cuStreamIsCapturing(gp_real_stream(s, per_thread), &st) == CUDA_SUCCESS)
        return st != CU_STREAM_CAPTURE_STATUS_NONE;
    return 0;
}

static void capture_ended(CUstream s, int per_thread) {
    if (stream_capturing(s, per_thread)) return; /* refused (the wrong thread, say): still on */
    const void *key = gp_stream_key(s, per_thread);
    pthread_mutex_lock(&g_capture_lock);
    for (int i = 0; i < GP_MAX_CAPTURES; i++) {
        struct gp_capture *c = &g_captures[i];
        if (c->key != key) continue;
        if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) atomic_fetch_sub(&g_cap_global, 1);
        if (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) atomic_fetch_sub(c->local, 1);
        atomic_fetch_sub(&g_cap_any, 1);
        memset(c, 0, sizeof *c);
        break;
    }
    pthread_mutex_unlock(&g_capture_lock);
}

void capture_reset_child(void) {
    pthread_mutex_init(&g_capture_lock, NULL);
    memset(g_captures, 0, sizeof g_captures);
    atomic_store(&g_cap_any, 0);
    atomic_store(&g_cap_global, 0);
    atomic_store(&t_cap_local, 0);
}

/* Whether pacing must keep away from this launch: events may not be touched now. */
int gp_capture_forbids_pacing(CUstream s, int per_thread) {
    if (atomic_load_explicit(&g_cap_any, memory_order_relaxed) == 0 &&
        !atomic_load_explicit(&g_cap_blind, memory_order_relaxed))
        return 0; /* the common case */
    return atomic_load_explicit(&g_cap_global, memory_order_relaxed) > 0 ||
           atomic_load_explicit(&t_cap_local, memory_order_relaxed) > 0 ||
           stream_capturing(s, per_thread);
}

#define BEGIN_CAPTURE(n, s, per_thread, mode, call)                    \
    do {                                                               \
        NEED(n);                                                       \
        CUresult rc_ = call;                                           \
        if (rc_ == CUDA_SUCCESS) capture_begun(s, per_thread, mode);   \
        return rc_;                                                    \
    } while (0)

GP_API CUresult cuStreamBeginCapture(CUstream s) {
    BEGIN_CAPTURE(cuStreamBeginCapture, s, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, REAL(cuStreamBeginCapture)(s));
}
GP_API CUresult cuStreamBeginCapture_ptsz(CUstream s) {
    BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, s, 1, CU_STREAM_CAPTURE_MODE_GLOBAL,
                  REAL(cuStreamBeginCapture_ptsz)(s));
}
GP_API CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    BEGIN_CAPTURE(cuStreamBeginCapture_v2, s, 0, mode, REAL(cuStreamBeginCapture_v2)(s, mode));
}
GP_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) {
    BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, s, 1, mode, REAL(cuStreamBeginCapture_v2_ptsz)(s, mode));
}
GP_API CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                            const CUgraphEdgeData *edges, size_t n, int mode) {
    BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, s, 0, mode,
                  REAL(cuStreamBeginCaptureToGraph)(s, g, deps, edges, n, mode));
}
GP_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n, int mode) {
    BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, s, 1, mode,
                  REAL(cuStreamBeginCaptureToGraph_ptsz)(s, g, deps, edges, n, mode));
}
GP_API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    NEED(cuStreamEndCapture);
    CUresult rc = REAL(cuStreamEndCapture)(s, g);
    capture_ended(s, 0);
    return rc;
}
GP_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    NEED(cuStreamEndCapture_ptsz);
    CUresult rc = REAL(cuStreamEndCapture_ptsz)(s, g);
    capture_ended(s, 1);
    return rc;
}

/* ---------------------------------------------------------------- launch pacing (pace.c) */

#define PACED(n, stream, per_thread, call)                            \
    do {                                                              \
        NEED(n);                                                      \
        CLAIM();                                                      \
        struct gp_ticket k_ = gp_pace_before(stream, per_thread);     \
        CUresult rc_ = call;                                          \
        gp_pace_after(k_, rc_);                                       \
        return rc_;                                                   \
    } while (0)

GP_API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                               void **extra) {
    PACED(cuLaunchKernel, s, 0,
          REAL(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra));
}
GP_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                    CUstream s, void **params, void **extra) {
    PACED(cuLaunchKernel_ptsz, s, 1,
          REAL(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra));
}
GP_API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                                 void **extra) {
    PACED(cuLaunchKernelEx, c ? c->hStream : NULL, 0, REAL(cuLaunchKernelEx)(c, f, params, extra));
}
GP_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params,
                                      void **extra) {
    PACED(cuLaunchKernelEx_ptsz, c ? c->hStream : NULL, 1,
          REAL(cuLaunchKernelEx_ptsz)(c, f, params, extra));
}
GP_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                          CUstream s, void **params) {
    PACED(cuLaunchCooperativeKernel, s, 0,
          REAL(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params));
}
GP_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                               CUstream s, void **params) {
    PACED(cuLaunchCooperativeKernel_ptsz, s, 1,
          REAL(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params));
}
/* A graph launch may map graph memory too: checked and settled around the paced launch. */
static CUresult graph_launch(void *real, CUgraphExec g, CUstream s, int per_thread) {
    uint64_t est[GP_MAX_DEVICES];
    struct graph_hold h;
    CLAIM();
    struct gp_ticket t = gp_pace_before(s, per_thread);
    int mem = g_region && atomic_load(&g_graph_seen); /* a process without graph memory skips it */
    if (mem) {
        graph_estimate((uint64_t)(uintptr_t)g, K_GEXEC, est);
        if (graph_begin(est, &h) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = ((cuGraphLaunch_t *)real)(g, s);
    if (mem) graph_end(&h);
    gp_pace_after(t, rc);
    return rc;
}
GP_API CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    NEED(cuGraphLaunch);
    return graph_launch(g_hooks[H_cuGraphLaunch].real, g, s, 0);
}
GP_API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    NEED(cuGraphLaunch_ptsz);
    return graph_launch(g_hooks[H_cuGraphLaunch_ptsz].real, g, s, 1);
}

/* ---------------------------------------------------------------- the preload's dlsym */
