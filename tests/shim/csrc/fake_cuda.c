/* A fake CUDA driver (libcuda.so.1) for the shim's tests: host memory stands in for device
 * memory, and each process has one "GPU" thread that runs launches in order on an exact device
 * timeline (a kernel starts when it was queued or when the one before it ended, whichever is
 * later, and lasts its duration), waits out each kernel (a busy-wait with FAKE_CUDA_SPIN=1, else
 * a sleep to its end, kinder to a shared machine) and appends a record of it to FAKE_CUDA_LOG.
 *
 * Environment: FAKE_CUDA_DEVICES (count, default 1), FAKE_CUDA_MEM (physical bytes per device
 * and process, default 80 GiB), FAKE_CUDA_LOG (a file for kernel records), FAKE_CUDA_CTX_BYTES
 * (device memory a process's first context on a device takes, as a real context does: default 0).
 * A kernel's duration in ns is the uint64 its first kernel parameter points to; a graph's is
 * the uint64 its CUgraphExec handle points to. Device i's UUID is "gpupoolfakegpu" + {0, i},
 * unless CUDA_VISIBLE_DEVICES lists GPU UUIDs (as gpupool's agent sets it): then, like the real
 * driver, the devices are those, in that order, with those UUIDs.
 *
 * Graph memory: a graph's mem-alloc nodes (cuGraphAddMemAllocNode, cuGraphAddNode, cuMemAllocAsync
 * under stream capture) are mapped from the device's graph memory pool at cuGraphUpload or
 * cuGraphLaunch (the pool grows to the largest graph's need and keeps it until
 * cuDeviceGraphMemTrim); the graph frees them at its end. Mipmapped arrays take the sum of their
 * levels, each rounded up to 512 bytes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gp_cuda.h"

#define API __attribute__((visibility("default")))
#define MAXDEV 8

struct log_record {
    int32_t pid;
    int32_t dev;
    uint64_t start_ns;
    uint64_t end_ns;
};

struct CUctx_st {
    int dev;
};
struct CUevent_st {
    int done;
    int captured; /* last recorded in a capturing stream: a graph node, not a time */
    uint64_t t;
};
struct CUarray_st {
    size_t bytes;
};
/* A pool keeps what is freed from it (its reserve) until a synchronisation releases what is
 * above its release threshold (0 here, as by default) or cuMemPoolTrimTo trims it; it grows in
 * 2 MiB steps. */
struct CUmemPoolHandle_st {
    int dev; /* -1: a pool of host memory (cuMemPoolCreate with a host location): no device's */
    uint64_t reserved, used;
};
#define POOL_STEP (2ull << 20)

static struct CUctx_st g_primary[MAXDEV];
static int g_ctx_taken[MAXDEV]; /* this process's first context on the device took its memory */
static struct CUmemPoolHandle_st g_pools[MAXDEV];
static __thread CUcontext g_current;
static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_used[MAXDEV];

/* The i-th GPU UUID CUDA_VISIBLE_DEVICES lists, into out; 0 when it lists fewer. */
static int visible_uuid(int i, unsigned char out[16]) {
    const char *e = getenv("CUDA_VISIBLE_DEVICES");
    int k = 0;
    while (e && *e) {
        const char *end = strchr(e, ',');
        size_t len = end ? (size_t)(end - e) : strlen(e);
        if (len > 4 && strncmp(e, "GPU-", 4) == 0) {
            if (k == i) {
                int n = 0;
                for (size_t j = 4; j < len && n < 32; j++) {
                    char c = e[j];
                    int v = c >= '0' && c <= '9'   ? c - '0'
                            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                   : -1;
                    if (v < 0) continue; /* the dashes */
                    if (n % 2 == 0) out[n / 2] = (unsigned char)(v << 4);
                    else out[n / 2] |= (unsigned char)v;
                    n++;
                }
                return n == 32;
            }
            k++;
        }
        e = end ? end + 1 : NULL;
    }
    return 0;
}
static int ndev(void) {
    unsigned char u[16];
    int visible = 0;
    while (visible < MAXDEV && visible_uuid(visible, u)) visible++;
    if (visible > 0) return visible;
    const char *e = getenv("FAKE_CUDA_DEVICES");
    int n = e ? atoi(e) : 1;
    return n < 1 ? 1 : n > MAXDEV ? MAXDEV : n;
}
static uint64_t phys(void) {
    const char *e = getenv("FAKE_CUDA_MEM");
    return e ? strtoull(e, NULL, 10) : 80ull << 30;
}
/* FAKE_CUDA_OTHER_BYTES: what other processes hold on every device (total - free shows it). */
static uint64_t others(void) {
    const char *e = getenv("FAKE_CUDA_OTHER_BYTES");
    return e ? strtoull(e, NULL, 10) : 0;
}
/* What this process holds on device dev: the fake NVML's per-process figure. */
API uint64_t fake_cuda_process_bytes(int dev) {
    if (dev < 0 || dev >= MAXDEV) return 0;
    pthread_mutex_lock(&g_mem_lock);
    uint64_t v = g_used[dev] - others();
    pthread_mutex_unlock(&g_mem_lock);
    return v;
}
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static int cur_dev(void) { return g_current ? g_current->dev : -1; }

/* ------------------------------------------------------------- memory: header before the block */
struct block {
    uint64_t bytes;
    int dev; /* -1: managed or from a pool (not counted here) */
    int pad;
    struct CUmemPoolHandle_st *pool;
};

static CUresult take(CUdeviceptr *p, size_t bytes, int dev) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (dev >= 0) {
        pthread_mutex_lock(&g_mem_lock);
        if (g_used[dev] + bytes > phys()) {
            pthread_mutex_unlock(&g_mem_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_used[dev] += bytes;
        pthread_mutex_unlock(&g_mem_lock);
    }
    struct block *b = malloc(sizeof *b + 16);
    if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
    b->bytes = bytes;
    b->dev = dev;
    b->pool = NULL;
    *p = (CUdeviceptr)(uintptr_t)(b + 1);
    return CUDA_SUCCESS;
}

static CUresult pool_take(CUdeviceptr *p, size_t bytes, struct CUmemPoolHandle_st *pool) {
    pthread_mutex_lock(&g_mem_lock);
    if (pool->reserved - pool->used < bytes) {
        uint64_t grow = (bytes - (pool->reserved - pool->used) + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
        if (pool->dev >= 0 && g_used[pool->dev] + grow > phys()) {
            pthread_mutex_unlock(&g_mem_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (pool->dev >= 0) g_used[pool->dev] += grow;
        pool->reserved += grow;
    }
    pool->used += bytes;
    pthread_mutex_unlock(&g_mem_lock);
    CUresult rc = take(p, bytes, -1);
    if (rc == CUDA_SUCCESS) ((struct block *)(uintptr_t)*p - 1)->pool = pool;
    return rc;
}

static void pools_release(void);

static CUresult give(CUdeviceptr p) {
    if (!p) return CUDA_SUCCESS;
    struct block *b = (struct block *)(uintptr_t)p - 1;
    if (b->pool) {
        pthread_mutex_lock(&g_mem_lock);
        b->pool->used -= b->bytes; /* the pool keeps it */
        pthread_mutex_unlock(&g_mem_lock);
    }
    if (b->dev >= 0) {
        pthread_mutex_lock(&g_mem_lock);
        g_used[b->dev] -= b->bytes;
        pthread_mutex_unlock(&g_mem_lock);
    }
    free(b);
    return CUDA_SUCCESS;
}

struct CUgraph_st {
    uint64_t dur;           /* ns its kernel nodes (captured launches) take, run one after another */
    uint64_t alloc[MAXDEV]; /* bytes its mem-alloc nodes take per device */
};

/* ------------------------------------------------------------- streams and stream capture
 *
 * A stream is known by a key: a created stream by its handle, the legacy default stream (NULL
 * through the plain API, CU_STREAM_LEGACY) by one process-wide key, and the per-thread default
 * stream (NULL through a _ptsz function, CU_STREAM_PER_THREAD) by one key per thread. Work
 * still runs on one GPU thread in submission order.
 *
 * A capture records a stream's work into a graph instead of running it. Like the real driver,
 * while a GLOBAL-mode capture runs in any thread (a THREAD_LOCAL one in this thread), an event
 * query or synchronisation is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates
 * that capture (its cuStreamEndCapture then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
 * an event recorded in a capturing stream is a node of the graph, and querying, synchronising
 * or timing it fails with CUDA_ERROR_CAPTURED_EVENT. FAKE_CUDA_CAPTURE_LOG, when set, names a
 * file that gets one line per refused call, for the tests to read. */
struct CUstream_st {
    int id;
};
static char g_legacy_stream;
static __thread char g_pt_stream;
static void *stream_key(CUstream s, int ptsz) {
    if (s == NULL) return ptsz ? (void *)&g_pt_stream : (void *)&g_legacy_stream;
    if (s == CU_STREAM_LEGACY) return &g_legacy_stream;
    if (s == CU_STREAM_PER_THREAD) return &g_pt_stream;
    return s;
}
struct capture {
    void *key; /* NULL: a free entry */
    CUgraph g;
    int mode;
    int invalid;
    pthread_t thread;
};
#define MAXCAP 16
static struct capture g_caps[MAXCAP];
static pthread_mutex_t g_cap_lock = PTHREAD_MUTEX_INITIALIZER;

/* The capture recording key's stream (under g_cap_lock), or NULL. */
static struct capture *capture_of_locked(void *key) {
    for (int i = 0; i < MAXCAP; i++)
        if (g_caps[i].key == key) return &g_caps[i];
    return NULL;
}
/* The graph a stream records into now, or NULL (a stream that is not capturing). */
static CUgraph capturing(void *key) {
    pthread_mutex_lock(&g_cap_lock);
    struct capture *c = capture_of_locked(key);
    CUgraph g = c && !c->invalid ? c->g : NULL;
    pthread_mutex_unlock(&g_cap_lock);
    return g;
}
static void capture_log(const char *what) {
    const char *p = getenv("FAKE_CUDA_CAPTURE_LOG");
    if (!p) return;
    int fd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[128];
    int n = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), what);
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}
/* Whether a running capture forbids this thread an unsafe call now; if so it is invalidated. */
static int capture_forbids(const char *what) {
    int forbidden = 0;
    pthread_mutex_lock(&g_cap_lock);
    for (int i = 0; i < MAXCAP; i++) {
        struct capture *c = &g_caps[i];
        if (!c->key) continue;
        if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
            (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(c->thread, pthread_self()))) {
            c->invalid = 1;
            forbidden = 1;
        }
    }
    pthread_mutex_unlock(&g_cap_lock);
    if (forbidden) capture_log(what);
    return forbidden;
}
static CUresult begin_capture(CUstream s, int ptsz, int mode) {
    void *key = stream_key(s, ptsz);
    pthread_mutex_lock(&g_cap_lock);
    struct capture *c = capture_of_locked(key), *free_c = capture_of_locked(NULL);
    if (c || !free_c) {
        pthread_mutex_unlock(&g_cap_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *free_c = (struct capture){key, calloc(1, sizeof(struct CUgraph_st)), mode, 0, pthread_self()};
    pthread_mutex_unlock(&g_cap_lock);
    return CUDA_SUCCESS;
}
static CUresult end_capture(CUstream s, int ptsz, CUgraph *g) {
    pthread_mutex_lock(&g_cap_lock);
    struct capture *c = capture_of_locked(stream_key(s, ptsz));
    if (!c) {
        pthread_mutex_unlock(&g_cap_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int invalid = c->invalid;
    CUgraph graph = c->g;
    memset(c, 0, sizeof *c);
    pthread_mutex_unlock(&g_cap_lock);
    if (invalid) {
        free(graph);
        if (g) *g = NULL;
        capture_log("end-invalidated");
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = graph;
    return CUDA_SUCCESS;
}
static CUresult capture_info(CUstream s, int ptsz, int *status, cuuint64_t *id, CUgraph *g) {
    pthread_mutex_lock(&g_cap_lock);
    struct capture *c = capture_of_locked(stream_key(s, ptsz));
    int st = !c ? CU_STREAM_CAPTURE_STATUS_NONE
                : c->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (status) *status = st;
    if (id) *id = (cuuint64_t)(uintptr_t)(c ? c->g : NULL);
    if (g) *g = c && !c->invalid ? c->g : NULL;
    pthread_mutex_unlock(&g_cap_lock);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------- graphs and their memory */
/* An instantiated graph: the duration first, as cuGraphLaunch reads it (the probe also passes a
 * plain uint64 duration as a CUgraphExec: such a handle is not in g_execs). */
struct gexec {
    uint64_t dur;
    struct gexec *next;
    uint64_t alloc[MAXDEV];
};
static struct gexec *g_execs;
static uint64_t g_graph_reserved[MAXDEV];
static uint64_t g_graph_va = 0x7e0000000000ull; /* addresses handed to alloc nodes */

static struct gexec *as_exec(void *h) {
    for (struct gexec *e = g_execs; e; e = e->next)
        if ((void *)e == h) return e;
    return NULL;
}

/* Maps what the graph needs from the device's graph pool. */
static CUresult graph_map(struct gexec *e) {
    pthread_mutex_lock(&g_mem_lock);
    for (int d = 0; d < MAXDEV; d++) {
        if (e->alloc[d] <= g_graph_reserved[d]) continue;
        uint64_t grow = e->alloc[d] - g_graph_reserved[d];
        if (g_used[d] + grow > phys()) {
            pthread_mutex_unlock(&g_mem_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_used[d] += grow;
        g_graph_reserved[d] = e->alloc[d];
    }
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------- the GPU thread */
enum { OP_KERNEL, OP_EVENT };
struct op {
    int kind;
    int dev;
    uint64_t dur;
    CUevent ev;
    uint64_t submit; /* when the host queued it */
    const void *skey; /* its stream (stream_key) */
};
#define QCAP 4096
static struct op g_q[QCAP];
static int g_qh, g_qn, g_busy, g_worker_started;
static pthread_mutex_t g_qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_qcond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;
static int g_logfd = -2;
/* The device timeline: when the last queued op ends. An op starts at max(its submission, the
 * previous op's end), so a GPU thread that the host's scheduler delays leaves no false gaps. */
static uint64_t g_timeline;

static void log_kernel(int dev, uint64_t s, uint64_t e) {
    if (g_logfd == -2) {
        const char *p = getenv("FAKE_CUDA_LOG");
        g_logfd = p ? open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
    }
    if (g_logfd < 0) return;
    struct log_record r = {(int32_t)getpid(), dev, s, e};
    ssize_t w = write(g_logfd, &r, sizeof r);
    (void)w;
}

/* FAKE_CUDA_CONCURRENT=1: streams run concurrently, as kernels that leave the GPU room do on a
 * real one: an op starts when it was queued or when its own stream's previous op ended. Else
 * (the default) one timeline for all streams. Either way the times are exact. */
static int concurrent(void) {
    static int c = -1;
    if (c < 0) c = getenv("FAKE_CUDA_CONCURRENT") != NULL;
    return c;
}
static struct {
    const void *key;
    uint64_t end;
} g_stl[64];
static int g_nstl;
static uint64_t *stream_end(const void *key) { /* under g_qlock or from the GPU thread */
    for (int i = 0; i < g_nstl; i++)
        if (g_stl[i].key == key) return &g_stl[i].end;
    int i = g_nstl < 64 ? g_nstl++ : 63;
    g_stl[i].key = key;
    g_stl[i].end = 0;
    return &g_stl[i].end;
}

static void *worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_qlock);
    for (;;) {
        while (g_qn == 0) pthread_cond_wait(&g_qcond, &g_qlock);
        struct op o = g_q[g_qh];
        g_qh = (g_qh + 1) % QCAP;
        g_qn--;
        g_busy = 1;
        pthread_mutex_unlock(&g_qlock);
        uint64_t after = g_timeline;
        pthread_mutex_lock(&g_qlock);
        uint64_t *own = concurrent() ? stream_end(o.skey) : NULL;
        if (own) after = *own;
        pthread_mutex_unlock(&g_qlock);
        uint64_t start = o.submit > after ? o.submit : after;
        if (o.kind == OP_KERNEL) {
            uint64_t end = start + o.dur;
            if (getenv("FAKE_CUDA_SPIN")) {
                while (now_ns() < end) {
                }
            } else {
                struct timespec ts = {(time_t)(end / 1000000000ull), (long)(end % 1000000000ull)};
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
                }
            }
            pthread_mutex_lock(&g_qlock);
            if (own) *own = end;
            if (end > g_timeline) g_timeline = end;
            pthread_mutex_unlock(&g_qlock);
            log_kernel(o.dev, start, end);
        }
        pthread_mutex_lock(&g_qlock);
        if (o.kind == OP_EVENT) {
            o.ev->t = start;
            o.ev->done = 1;
        }
        g_busy = 0;
        pthread_cond_broadcast(&g_done);
    }
    return NULL;
}

static void atfork_child(void) {
    pthread_mutex_init(&g_qlock, NULL);
    pthread_cond_init(&g_qcond, NULL);
    pthread_cond_init(&g_done, NULL);
    g_qh = g_qn = g_busy = g_worker_started = 0;
    g_timeline = 0;
    g_nstl = 0;
    g_logfd = -2;
}

static void enqueue(struct op o) {
    pthread_mutex_lock(&g_qlock);
    if (!g_worker_started) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_create(&t, &a, worker, NULL);
        pthread_attr_destroy(&a);
        g_worker_started = 1;
    }
    while (g_qn == QCAP) pthread_cond_wait(&g_done, &g_qlock);
    o.submit = now_ns();
    g_q[(g_qh + g_qn) % QCAP] = o;
    g_qn++;
    pthread_cond_signal(&g_qcond);
    pthread_mutex_unlock(&g_qlock);
}

/* Calls counted for FAKE_CUDA_COUNTS: a file that gets "RECORDS LAUNCHES" at exit. */
static atomic_ulong g_nrecords, g_nlaunches;
__attribute__((destructor)) static void write_counts(void) {
    const char *p = getenv("FAKE_CUDA_COUNTS");
    if (!p) return;
    FILE *f = fopen(p, "w");
    if (!f) return;
    fprintf(f, "%lu %lu\n", (unsigned long)atomic_load(&g_nrecords), (unsigned long)atomic_load(&g_nlaunches));
    fclose(f);
}

static CUresult launch(void **params, uint64_t dur_from_graph, int graph, CUstream s, int ptsz) {
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t dur = graph ? dur_from_graph : (params && params[0] ? *(uint64_t *)params[0] : 0);
    CUgraph into = capturing(stream_key(s, ptsz));
    if (into) { /* captured: a kernel node of the graph, nothing runs now */
        pthread_mutex_lock(&g_cap_lock);
        into->dur += dur;
        pthread_mutex_unlock(&g_cap_lock);
        return CUDA_SUCCESS;
    }
    if (dur == 0) { /* an empty kernel on an idle GPU is done at once: no GPU thread round trip */
        pthread_mutex_lock(&g_qlock);
        int idle = g_qn == 0 && !g_busy;
        pthread_mutex_unlock(&g_qlock);
        if (idle) return CUDA_SUCCESS;
    }
    atomic_fetch_add(&g_nlaunches, 1);
    enqueue((struct op){OP_KERNEL, cur_dev(), dur, NULL, 0, stream_key(s, ptsz)});
    return CUDA_SUCCESS;
}

static CUresult sync_all(void) {
    pthread_mutex_lock(&g_qlock);
    while (g_qn || g_busy) pthread_cond_wait(&g_done, &g_qlock);
    pthread_mutex_unlock(&g_qlock);
    pools_release();
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------- API */
API CUresult cuInit(unsigned int f) {
    (void)f;
    static int once;
    if (!once) {
        once = 1;
        pthread_atfork(NULL, NULL, atfork_child);
        for (int i = 0; i < MAXDEV; i++) g_primary[i].dev = g_pools[i].dev = i;
        for (int i = 0; i < MAXDEV; i++) g_used[i] = others(); /* other processes' memory */
    }
    return CUDA_SUCCESS;
}
API CUresult cuDriverGetVersion(int *v) {
    *v = 12080;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetCount(int *n) {
    *n = ndev();
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    unsigned char visible[16];
    if (visible_uuid(d, visible)) {
        memcpy(u->bytes, visible, 16);
        return CUDA_SUCCESS;
    }
    memcpy(u->bytes, "gpupoolfakegpu", 14);
    u->bytes[14] = 0;
    u->bytes[15] = (char)d;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }
API CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
    (void)d;
    *b = (size_t)phys();
    return CUDA_SUCCESS;
}
/* A process's first context on a device takes FAKE_CUDA_CTX_BYTES of it, held until the end. */
static CUresult ctx_take(CUdevice d) {
    const char *e = getenv("FAKE_CUDA_CTX_BYTES");
    uint64_t cost = e ? strtoull(e, NULL, 10) : 0;
    pthread_mutex_lock(&g_mem_lock);
    if (!g_ctx_taken[d]) {
        if (g_used[d] + cost > phys()) {
            pthread_mutex_unlock(&g_mem_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_used[d] += cost;
        g_ctx_taken[d] = 1;
    }
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    if (ctx_take(d) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    g_primary[d].dev = d;
    *c = &g_primary[d];
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    (void)d;
    return CUDA_SUCCESS;
}
static CUresult ctx_new(CUcontext *c, CUdevice d) {
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    if (ctx_take(d) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    *c = malloc(sizeof **c);
    (*c)->dev = d;
    g_current = *c;
    return CUDA_SUCCESS;
}
API CUresult cuCtxCreate_v2(CUcontext *c, unsigned f, CUdevice d) {
    (void)f;
    return ctx_new(c, d);
}
API CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *p, int n, unsigned f, CUdevice d) {
    (void)p, (void)n, (void)f;
    return ctx_new(c, d);
}
API CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned f, CUdevice d) {
    (void)p, (void)f;
    return ctx_new(c, d);
}
API CUresult cuCtxDestroy_v2(CUcontext c) {
    if (g_current == c) g_current = NULL;
    if (c < &g_primary[0] || c > &g_primary[MAXDEV - 1]) free(c);
    return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(CUcontext c) {
    g_current = c;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetCurrent(CUcontext *c) {
    *c = g_current;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *d) {
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    *d = g_current->dev;
    return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize(void) { return sync_all(); }
API CUresult cuStreamSynchronize(CUstream s) {
    (void)s;
    return sync_all();
}

API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    int d = cur_dev();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_mem_lock);
    *f = (size_t)(phys() - g_used[d]);
    pthread_mutex_unlock(&g_mem_lock);
    *t = (size_t)phys();
    return CUDA_SUCCESS;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return take(p, bytes, cur_dev());
}
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e;
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *pitch = (w + 511) / 512 * 512;
    return take(p, *pitch * h, cur_dev());
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t bytes, unsigned f) {
    (void)f;
    return take(p, bytes, -1);
}
API CUresult cuMemFree_v2(CUdeviceptr p) { return give(p); }
static CUresult alloc_node(CUgraphNode *node, CUgraph g, CUDA_MEM_ALLOC_NODE_PARAMS *p);
static CUresult alloc_async(CUdeviceptr *p, size_t bytes, CUstream s, int ptsz) {
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUgraph into = capturing(stream_key(s, ptsz));
    if (into) { /* captured: a mem-alloc node of the graph, nothing allocated now */
        CUDA_MEM_ALLOC_NODE_PARAMS a;
        memset(&a, 0, sizeof a);
        a.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.poolProps.location.id = cur_dev();
        a.bytesize = bytes;
        CUresult rc = alloc_node(NULL, into, &a);
        if (rc == CUDA_SUCCESS) *p = a.dptr;
        return rc;
    }
    return pool_take(p, bytes, &g_pools[cur_dev()]);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t bytes, CUstream s) { return alloc_async(p, bytes, s, 0); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t bytes, CUstream s) {
    return alloc_async(p, bytes, s, 1);
}
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream s) {
    (void)s;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return pool_take(p, bytes, pool);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t bytes, CUmemoryPool pool,
                                          CUstream s) {
    return cuMemAllocFromPoolAsync(p, bytes, pool, s);
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    if (capturing(stream_key(s, 0))) return CUDA_SUCCESS; /* a mem-free node of the graph */
    return give(p);
}
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    if (capturing(stream_key(s, 1))) return CUDA_SUCCESS;
    return give(p);
}
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    g_pools[d].dev = d;
    *pool = &g_pools[d];
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d) { return cuDeviceGetDefaultMemPool(pool, d); }
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    pthread_mutex_lock(&g_mem_lock);
    uint64_t v = attr == 5 ? pool->reserved : attr == 7 ? pool->used : 0;
    pthread_mutex_unlock(&g_mem_lock);
    if (attr != 5 && attr != 7) return CUDA_ERROR_INVALID_VALUE;
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}
static void pool_trim(struct CUmemPoolHandle_st *pool, uint64_t keep) {
    uint64_t floor = pool->used > keep ? pool->used : keep;
    floor = (floor + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
    if (pool->reserved > floor) {
        if (pool->dev >= 0) g_used[pool->dev] -= pool->reserved - floor;
        pool->reserved = floor;
    }
}
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    pthread_mutex_lock(&g_mem_lock);
    pool_trim(pool, keep);
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}
static void pools_release(void) {
    pthread_mutex_lock(&g_mem_lock);
    for (int i = 0; i < MAXDEV; i++) pool_trim(&g_pools[i], 0);
    pthread_mutex_unlock(&g_mem_lock);
}
API CUresult cuMemAdvise(CUdeviceptr p, size_t n, int advice, CUdevice d) {
    (void)p, (void)n, (void)advice, (void)d;
    return CUDA_SUCCESS;
}
/* VMM: a physical allocation lives while its handle is unreleased or any mapping of it remains
 * (cuMemRelease with mappings left frees nothing yet; the last cuMemUnmap does). Device
 * memory on location.id for a device location, and for CUDA 13.5's location type 6 too;
 * host locations take no device memory. */
struct vmm {
    CUdeviceptr block;
    int maps, released;
};
struct vmap {
    CUdeviceptr va;
    size_t bytes;
    struct vmm *h;
    struct vmap *next;
};
static struct vmap *g_vmaps;
static int host_location(int type) { return type >= 2 && type <= 4; }
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes,
                         const CUmemAllocationProp *prop, unsigned long long f) {
    (void)f;
    if (!prop || !h) return CUDA_ERROR_INVALID_VALUE;
    int dev = host_location(prop->location.type) ? -1 : prop->location.id;
    if (dev >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    struct vmm *v = calloc(1, sizeof *v);
    CUresult rc = take(&v->block, bytes, dev);
    if (rc != CUDA_SUCCESS) {
        free(v);
        return rc;
    }
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return rc;
}
static void vmm_maybe_free(struct vmm *v) {
    if (v->released && v->maps == 0) {
        give(v->block);
        free(v);
    }
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    struct vmm *v = (struct vmm *)(uintptr_t)h;
    if (!v || v->released) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_cap_lock);
    v->released = 1;
    int keep = v->maps > 0;
    pthread_mutex_unlock(&g_cap_lock);
    if (!keep) vmm_maybe_free(v);
    return CUDA_SUCCESS;
}
API CUresult cuMemMap(CUdeviceptr va, size_t bytes, size_t offset, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
    (void)offset, (void)flags;
    struct vmm *v = (struct vmm *)(uintptr_t)h;
    if (!v || v->released) return CUDA_ERROR_INVALID_VALUE;
    struct vmap *m = malloc(sizeof *m);
    pthread_mutex_lock(&g_cap_lock);
    *m = (struct vmap){va, bytes, v, g_vmaps};
    g_vmaps = m;
    v->maps++;
    pthread_mutex_unlock(&g_cap_lock);
    return CUDA_SUCCESS;
}
API CUresult cuMemUnmap(CUdeviceptr va, size_t bytes) {
    struct vmm *gone[64];
    int n = 0;
    pthread_mutex_lock(&g_cap_lock);
    for (struct vmap **p = &g_vmaps; *p;) {
        struct vmap *m = *p;
        if (m->va >= va && m->va < va + bytes && n < 64) {
            *p = m->next;
            m->h->maps--;
            gone[n++] = m->h;
            free(m);
        } else {
            p = &m->next;
        }
    }
    pthread_mutex_unlock(&g_cap_lock);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < n; i++) vmm_maybe_free(gone[i]);
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    int dev = host_location(props->location.type) || props->location.type == 0 ? -1 : props->location.id;
    if (dev >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    *pool = calloc(1, sizeof **pool);
    (*pool)->dev = dev;
    return CUDA_SUCCESS;
}

static size_t fmt_bytes(CUarray_format f) {
    return f == CU_AD_FORMAT_FLOAT || f == CU_AD_FORMAT_UNSIGNED_INT32 ? 4 : f == CU_AD_FORMAT_HALF ? 2 : 1;
}
/* Charge an array's bytes to the current device, or refuse them when the device is full. */
static CUresult take_array_bytes(size_t bytes) {
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mem_lock);
    if (g_used[cur_dev()] + bytes > phys())
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else
        g_used[cur_dev()] += bytes;
    pthread_mutex_unlock(&g_mem_lock);
    return r;
}
static CUresult array_new(CUarray *a, size_t bytes) {
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    bytes = (bytes + 511) / 512 * 512; /* the fake's layout: rows of 512-byte granules */
    CUresult taken = take_array_bytes(bytes);
    if (taken != CUDA_SUCCESS) return taken;
    *a = malloc(sizeof **a);
    (*a)->bytes = bytes;
    return CUDA_SUCCESS;
}
API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    return array_new(a, d->Width * (d->Height ? d->Height : 1) * d->NumChannels * fmt_bytes(d->Format));
}
API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return array_new(a, d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                            d->NumChannels * fmt_bytes(d->Format));
}
/* What an array or a mipmapped array takes, as the driver reports it (512-byte alignment). */
static CUresult memory_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, size_t bytes) {
    memset(r, 0, sizeof *r);
    r->size = bytes;
    r->alignment = 512;
    return CUDA_SUCCESS;
}
/* Give an array's bytes back to the current device and free its record. */
static CUresult release_array(void *record, size_t bytes) {
    pthread_mutex_lock(&g_mem_lock);
    g_used[cur_dev() < 0 ? 0 : cur_dev()] -= bytes;
    pthread_mutex_unlock(&g_mem_lock);
    free(record);
    return CUDA_SUCCESS;
}
API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUarray a, CUdevice d) {
    (void)d;
    return memory_requirements(r, a->bytes);
}
API CUresult cuArrayDestroy(CUarray a) { return release_array(a, a->bytes); }

API CUresult cuEventCreate(CUevent *e, unsigned f) {
    (void)f;
    *e = calloc(1, sizeof **e);
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy_v2(CUevent e) {
    /* An event still queued stays valid until the GPU thread passes it: leak it then. */
    pthread_mutex_lock(&g_qlock);
    int done = e->done;
    pthread_mutex_unlock(&g_qlock);
    if (done) free(e);
    return CUDA_SUCCESS;
}
static CUresult event_record(CUevent e, CUstream s, int ptsz) {
    if (capturing(stream_key(s, ptsz))) { /* a node of the graph being captured */
        pthread_mutex_lock(&g_qlock);
        e->captured = 1;
        e->done = 0;
        pthread_mutex_unlock(&g_qlock);
        return CUDA_SUCCESS;
    }
    atomic_fetch_add(&g_nrecords, 1);
    pthread_mutex_lock(&g_qlock);
    e->captured = 0;
    if (g_qn == 0 && !g_busy) {
        uint64_t n = now_ns(), after = concurrent() ? *stream_end(stream_key(s, ptsz)) : g_timeline;
        e->t = n > after ? n : after;
        e->done = 1;
        pthread_mutex_unlock(&g_qlock);
        return CUDA_SUCCESS;
    }
    e->done = 0;
    pthread_mutex_unlock(&g_qlock);
    enqueue((struct op){OP_EVENT, 0, 0, e, 0, stream_key(s, ptsz)});
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
API CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }
API CUresult cuEventQuery(CUevent e) {
    if (capture_forbids("cuEventQuery")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&g_qlock);
    int d = e->done, captured = e->captured;
    pthread_mutex_unlock(&g_qlock);
    if (captured) {
        capture_log("cuEventQuery-captured");
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    return d ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuEventSynchronize(CUevent e) {
    if (capture_forbids("cuEventSynchronize")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&g_qlock);
    if (e->captured) {
        pthread_mutex_unlock(&g_qlock);
        capture_log("cuEventSynchronize-captured");
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    while (!e->done) pthread_cond_wait(&g_done, &g_qlock);
    pthread_mutex_unlock(&g_qlock);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    pthread_mutex_lock(&g_qlock);
    if (a->captured || b->captured) {
        pthread_mutex_unlock(&g_qlock);
        capture_log("cuEventElapsedTime-captured");
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    int ok = a->done && b->done;
    uint64_t ta = a->t, tb = b->t;
    pthread_mutex_unlock(&g_qlock);
    if (!ok) return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(tb - ta)) / 1e6);
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                            void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)extra;
    return launch(params, 0, 0, s, 0);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                 void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)extra;
    return launch(params, 0, 0, s, 1);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)f, (void)extra;
    return launch(params, 0, 0, c ? c->hStream : NULL, 0);
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params,
                                   void **extra) {
    (void)f, (void)extra;
    return launch(params, 0, 0, c ? c->hStream : NULL, 1);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                       unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                       CUstream s, void **params) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, NULL);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                            unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                            CUstream s, void **params) {
    return cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shm, s, params, NULL);
}
static CUresult graph_launch(CUgraphExec g, CUstream s, int ptsz) {
    struct gexec *e = as_exec(g);
    if (e && !capturing(stream_key(s, ptsz)) && graph_map(e) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return launch(NULL, g ? *(uint64_t *)g : 0, 1, s, ptsz);
}
API CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return graph_launch(g, s, 0); }
API CUresult cuGraphUpload(CUgraphExec g, CUstream s) {
    (void)s;
    struct gexec *e = as_exec(g);
    return e ? graph_map(e) : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuGraphUpload_ptsz(CUgraphExec g, CUstream s) { return cuGraphUpload(g, s); }
API CUresult cuGraphCreate(CUgraph *g, unsigned f) {
    (void)f;
    *g = calloc(1, sizeof **g);
    return CUDA_SUCCESS;
}
API CUresult cuGraphDestroy(CUgraph g) {
    free(g);
    return CUDA_SUCCESS;
}
static CUresult alloc_node(CUgraphNode *node, CUgraph g, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    if (!g || !p || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    int d = p->poolProps.location.id;
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mem_lock);
    g->alloc[d] += p->bytesize;
    p->dptr = g_graph_va;
    g_graph_va += (p->bytesize + 0xfffff) & ~0xfffffull;
    pthread_mutex_unlock(&g_mem_lock);
    if (node) *node = (CUgraphNode)(uintptr_t)p->dptr;
    return CUDA_SUCCESS;
}
API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                    CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    (void)deps, (void)n;
    return alloc_node(node, g, p);
}
API CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                   CUdeviceptr dptr) {
    (void)deps, (void)n, (void)dptr; /* the fake frees a graph's memory at its end anyway */
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    if (node) *node = (CUgraphNode)(uintptr_t)2;
    return CUDA_SUCCESS;
}
API CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                            CUgraphNodeParams *p) {
    (void)deps, (void)n;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) return alloc_node(node, g, &p->u.alloc);
    if (node) *node = (CUgraphNode)(uintptr_t)1;
    return CUDA_SUCCESS;
}
/* CUDA 12.3's _v2 and CUDA 13.4's _v3 take edge data beside the dependencies. */
API CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                               const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *p) {
    (void)edges;
    return cuGraphAddNode(node, g, deps, n, p);
}
API CUresult cuGraphAddNode_v3(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                               const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *p) {
    (void)edges;
    return cuGraphAddNode(node, g, deps, n, p);
}
/* A variant newer than any shim knows, for a future CUDA: reached only through
 * cuGetProcAddress (not exported, so the façade's forwarded names stay those of a real driver). */
static CUresult addnode_v4(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                           const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *p) {
    (void)edges;
    return cuGraphAddNode(node, g, deps, n, p);
}
static CUresult instantiate(CUgraphExec *out, CUgraph g) {
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    struct gexec *e = calloc(1, sizeof *e);
    memcpy(e->alloc, g->alloc, sizeof e->alloc);
    e->dur = g->dur;
    pthread_mutex_lock(&g_mem_lock);
    e->next = g_execs;
    g_execs = e;
    pthread_mutex_unlock(&g_mem_lock);
    *out = (CUgraphExec)(void *)e;
    return CUDA_SUCCESS;
}
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long f) {
    (void)f;
    return instantiate(e, g);
}
API CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, void *p) {
    (void)p;
    return instantiate(e, g);
}
API CUresult cuGraphExecDestroy(CUgraphExec g) {
    pthread_mutex_lock(&g_mem_lock);
    for (struct gexec **p = &g_execs; *p; p = &(*p)->next)
        if ((void *)*p == (void *)g) {
            struct gexec *e = *p;
            *p = e->next;
            free(e);
            break;
        }
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGraphMemTrim(CUdevice d) {
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    sync_all(); /* what graphs allocated they freed at their end: the whole reserve goes */
    pthread_mutex_lock(&g_mem_lock);
    g_used[d] -= g_graph_reserved[d];
    g_graph_reserved[d] = 0;
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *value) {
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mem_lock);
    uint64_t v = attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT || attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH
                     ? g_graph_reserved[d]
                     : 0;
    pthread_mutex_unlock(&g_mem_lock);
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}
API CUresult cuStreamBeginCapture_v2(CUstream s, int mode) { return begin_capture(s, 0, mode); }
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) { return begin_capture(s, 1, mode); }
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end_capture(s, 0, g); }
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end_capture(s, 1, g); }
API CUresult cuStreamGetCaptureInfo_v2(CUstream s, int *status, cuuint64_t *id, CUgraph *g,
                                       const CUgraphNode **deps, size_t *n) {
    if (deps) *deps = NULL;
    if (n) *n = 0;
    return capture_info(s, 0, status, id, g);
}
API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, int *status, cuuint64_t *id, CUgraph *g,
                                            const CUgraphNode **deps, size_t *n) {
    if (deps) *deps = NULL;
    if (n) *n = 0;
    return capture_info(s, 1, status, id, g);
}
API CUresult cuStreamIsCapturing(CUstream s, int *status) { return capture_info(s, 0, status, NULL, NULL); }
API CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) {
    return capture_info(s, 1, status, NULL, NULL);
}
API CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    static int next;
    (void)flags;
    *s = malloc(sizeof **s);
    (*s)->id = __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
API CUresult cuStreamDestroy_v2(CUstream s) {
    free(s);
    return CUDA_SUCCESS;
}

struct CUmipmappedArray_st {
    size_t bytes;
};
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    size_t w = d->Width, h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1, bytes = 0;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        bytes += (w * h * z * d->NumChannels * fmt_bytes(d->Format) + 511) / 512 * 512;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    CUresult taken = take_array_bytes(bytes);
    if (taken != CUDA_SUCCESS) return taken;
    *m = malloc(sizeof **m);
    (*m)->bytes = bytes;
    return CUDA_SUCCESS;
}
API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUmipmappedArray m,
                                                   CUdevice d) {
    (void)d;
    return memory_requirements(r, m->bytes);
}
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { return release_array(m, m->bytes); }
API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return graph_launch(g, s, 1); }

/* Like the real driver: the name plus the version and stream flavour pick an exported variant. */
static void *self_handle(void) {
    static void *h;
    if (!h) {
        Dl_info i;
        if (dladdr((void *)self_handle, &i)) h = dlopen(i.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    return h;
}
/* Variants a newer CUDA version maps a name to, newest first (beyond the _v2 rule below). */
static const struct {
    const char *name, *suffix;
    int version;
} g_variants[] = {
    {"cuGraphAddNode", "_v4", 14000}, /* addnode_v4 */
    {"cuGraphAddNode", "_v3", 13040},
    {"cuGraphAddNode", "_v2", 12030},
    {"cuGraphAddNode", "", 0}, /* (a real driver says VERSION_NOT_SUFFICIENT before 12.2) */
};
/* With FAKE_CUDA_INTERNAL_PTRS=1, cuGetProcAddress answers for these with pointers of its own,
 * not the exported symbols, as a real driver may: a caller cannot match them to dlsym's. */
static CUresult i_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **x) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, x);
}
static CUresult i_launch_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **x) {
    return cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shm, s, p, x);
}
static CUresult i_addnode(CUgraphNode *node, CUgraph g, const CUgraphNode *d, size_t n, CUgraphNodeParams *p) {
    return cuGraphAddNode(node, g, d, n, p);
}
static CUresult i_addnode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *d, const CUgraphEdgeData *e,
                             size_t n, CUgraphNodeParams *p) {
    return cuGraphAddNode_v2(node, g, d, e, n, p);
}
static CUresult i_addnode_v3(CUgraphNode *node, CUgraph g, const CUgraphNode *d, const CUgraphEdgeData *e,
                             size_t n, CUgraphNodeParams *p) {
    return cuGraphAddNode_v3(node, g, d, e, n, p);
}
static CUresult i_alloc(CUdeviceptr *p, size_t bytes) { return cuMemAlloc_v2(p, bytes); }
static const struct {
    const char *name;
    void *fn;
} g_internal[] = {
    {"cuLaunchKernel", (void *)i_launch},       {"cuLaunchKernel_ptsz", (void *)i_launch_ptsz},
    {"cuGraphAddNode", (void *)i_addnode},      {"cuGraphAddNode_v2", (void *)i_addnode_v2},
    {"cuGraphAddNode_v3", (void *)i_addnode_v3}, {"cuMemAlloc_v2", (void *)i_alloc},
};
static void *internal_ptr(const char *name, void *exported) {
    if (!exported || !getenv("FAKE_CUDA_INTERNAL_PTRS")) return exported;
    for (size_t i = 0; i < sizeof g_internal / sizeof g_internal[0]; i++)
        if (strcmp(g_internal[i].name, name) == 0) return g_internal[i].fn;
    return exported;
}
API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *st) {
    char name[256];
    void *h = self_handle(), *p = NULL;
    for (size_t i = 0; i < sizeof g_variants / sizeof g_variants[0]; i++) {
        if (strcmp(sym, g_variants[i].name) != 0 || ver < g_variants[i].version) continue;
        snprintf(name, sizeof name, "%s%s", sym, g_variants[i].suffix);
        p = strcmp(g_variants[i].suffix, "_v4") == 0 ? (void *)addnode_v4 : internal_ptr(name, dlsym(h, name));
        if (st) *st = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        *pfn = p;
        return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    }
    const char *suffixes[6];
    int n = 0;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        suffixes[n++] = "_ptsz";
        suffixes[n++] = "_v2_ptsz";
        suffixes[n++] = "_ptds";
        suffixes[n++] = "_v2_ptds";
    }
    if (ver >= 3020) suffixes[n++] = "_v2";
    suffixes[n++] = "";
    for (int i = 0; i < n && !p; i++) {
        if (strcmp(sym, "cuCtxCreate") == 0 && ver >= 12050 && i == 0) {
            p = dlsym(h, "cuCtxCreate_v4");
            continue;
        }
        snprintf(name, sizeof name, "%s%s", sym, suffixes[i]);
        if (strcmp(sym, "cuGetProcAddress") == 0 && ver < 12000 && strcmp(suffixes[i], "_v2") == 0)
            continue;
        p = internal_ptr(name, dlsym(h, name));
    }
    if (st) *st = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = p;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
