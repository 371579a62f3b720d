/* A CUDA program for the shim's tests, driven one command per stdin line, one answer per line.
 *
 * It finds the driver the way a CUDA 12 runtime does: dlopen("libcuda.so.1"), dlsym for
 * "cuGetProcAddress_v2", then every entry point through it with cudaVersion 12000 and the flags
 * of argv[1] ("default" or "ptsz"). With argv[1] "dlsym" it asks dlsym for versioned names, as
 * an old-style program does. Answers: "ok ..." or "err CODE". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gp_cuda.h"
#include "gp_region.h"

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_t gpa;
static void *lib;
static int mode_dlsym;
static cuuint64_t flags;

static void *get_v(const char *name, const char *versioned, int version) {
    void *p = NULL;
    if (mode_dlsym) return dlsym(lib, versioned);
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, version, flags, &st) != CUDA_SUCCESS) return NULL;
    return p;
}
static void *get(const char *name, const char *versioned) { return get_v(name, versioned, 12000); }


static CUresult (*p_init)(unsigned);
static CUresult (*p_devget)(CUdevice *, int);
static CUresult (*p_retain)(CUcontext *, CUdevice);
static CUresult (*p_setcur)(CUcontext);
static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_free)(CUdeviceptr);
static CUresult (*p_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
static CUresult (*p_managed)(CUdeviceptr *, size_t, unsigned);
static CUresult (*p_async)(CUdeviceptr *, size_t, CUstream);
static CUresult (*p_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult (*p_defpool)(CUmemoryPool *, CUdevice);
static CUresult (*p_freeasync)(CUdeviceptr, CUstream);
static CUresult (*p_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                            unsigned long long);
static CUresult (*p_release)(CUmemGenericAllocationHandle);
static CUresult (*p_arr)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
static CUresult (*p_arr3)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
static CUresult (*p_arrdel)(CUarray);
static CUresult (*p_info)(size_t *, size_t *);
static CUresult (*p_total)(size_t *, CUdevice);
static CUresult (*p_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void **, void **);
static CUresult (*p_launchex)(const CUlaunchConfig *, CUfunction, void **, void **);
static CUresult (*p_coop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, CUstream, void **);
static CUresult (*p_graph)(CUgraphExec, CUstream);
static CUresult (*p_sync)(void);
static CUresult (*p_ctxcreate)(CUcontext *, unsigned, CUdevice);
static CUresult (*p_name)(char *, int, CUdevice);
static CUresult (*p_gcreate)(CUgraph *, unsigned);
static CUresult (*p_gallocnode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                CUDA_MEM_ALLOC_NODE_PARAMS *);
static CUresult (*p_gaddnode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
static CUresult (*p_capbegin)(CUstream, int);
static CUresult (*p_capend)(CUstream, CUgraph *);
static CUresult (*p_ginst)(CUgraphExec *, CUgraph, unsigned long long);
static CUresult (*p_gupload)(CUgraphExec, CUstream);
static CUresult (*p_gexecdel)(CUgraphExec);
static CUresult (*p_gtrim)(CUdevice);
static CUresult (*p_mipmap)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
static CUresult (*p_mipdel)(CUmipmappedArray);
static CUresult (*p_gaddnode3)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                               size_t, CUgraphNodeParams *);
static CUresult (*p_screate)(CUstream *, unsigned);
static CUresult (*p_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
static CUresult (*p_unmap)(CUdeviceptr, size_t);
static CUresult (*p_poolcreate)(CUmemoryPool *, const CUmemPoolProps *);

static void resolve(void) {
    p_init = get("cuInit", "cuInit");
    p_devget = get("cuDeviceGet", "cuDeviceGet");
    p_retain = get("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    p_setcur = get("cuCtxSetCurrent", "cuCtxSetCurrent");
    p_alloc = get("cuMemAlloc", "cuMemAlloc_v2");
    p_free = get("cuMemFree", "cuMemFree_v2");
    p_pitch = get("cuMemAllocPitch", "cuMemAllocPitch_v2");
    p_managed = get("cuMemAllocManaged", "cuMemAllocManaged");
    p_async = get("cuMemAllocAsync", "cuMemAllocAsync");
    p_pool = get("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync");
    p_defpool = get("cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool");
    p_freeasync = get("cuMemFreeAsync", "cuMemFreeAsync");
    p_create = get("cuMemCreate", "cuMemCreate");
    p_release = get("cuMemRelease", "cuMemRelease");
    p_arr = get("cuArrayCreate", "cuArrayCreate_v2");
    p_arr3 = get("cuArray3DCreate", "cuArray3DCreate_v2");
    p_arrdel = get("cuArrayDestroy", "cuArrayDestroy");
    p_info = get("cuMemGetInfo", "cuMemGetInfo_v2");
    p_total = get("cuDeviceTotalMem", "cuDeviceTotalMem_v2");
    p_launch = get("cuLaunchKernel", "cuLaunchKernel");
    p_launchex = get("cuLaunchKernelEx", "cuLaunchKernelEx");
    p_coop = get("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel");
    p_graph = get("cuGraphLaunch", "cuGraphLaunch");
    p_sync = get("cuCtxSynchronize", "cuCtxSynchronize");
    p_ctxcreate = get("cuCtxCreate", "cuCtxCreate_v2");
    p_name = get("cuDeviceGetName", "cuDeviceGetName");
    p_gcreate = get("cuGraphCreate", "cuGraphCreate");
    p_gallocnode = get("cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode");
    p_gaddnode = get("cuGraphAddNode", "cuGraphAddNode");
    p_capbegin = get("cuStreamBeginCapture", "cuStreamBeginCapture_v2");
    p_capend = get("cuStreamEndCapture", "cuStreamEndCapture");
    p_ginst = get("cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags");
    p_gupload = get("cuGraphUpload", "cuGraphUpload");
    p_gexecdel = get("cuGraphExecDestroy", "cuGraphExecDestroy");
    p_gtrim = get("cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim");
    p_mipmap = get("cuMipmappedArrayCreate", "cuMipmappedArrayCreate");
    p_mipdel = get("cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy");
    /* As a CUDA 13.5 runtime asks: the driver maps the name to its _v3. */
    p_gaddnode3 = get_v("cuGraphAddNode", "cuGraphAddNode_v3", 13050);
    p_screate = get("cuStreamCreate", "cuStreamCreate");
    p_map = get("cuMemMap", "cuMemMap");
    p_unmap = get("cuMemUnmap", "cuMemUnmap");
    p_poolcreate = get("cuMemPoolCreate", "cuMemPoolCreate");
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUresult launch_one(const char *kind, uint64_t *dur, CUstream s) {
    void *params[1] = {dur};
    if (strcmp(kind, "ex") == 0) {
        CUlaunchConfig c;
        memset(&c, 0, sizeof c);
        c.gridDimX = c.gridDimY = c.gridDimZ = c.blockDimX = c.blockDimY = c.blockDimZ = 1;
        c.hStream = s;
        return p_launchex(&c, NULL, params, NULL);
    }
    if (strcmp(kind, "coop") == 0) return p_coop(NULL, 1, 1, 1, 1, 1, 1, 0, s, params);
    if (strcmp(kind, "graph") == 0) return p_graph((CUgraphExec)(void *)dur, s);
    return p_launch(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

/* n created streams (at most 64), made once and kept: NULL-terminated use of the first n. */
static CUstream g_streams[64];
static int g_nstreams;
static int streams(int n) {
    if (n > 64) n = 64;
    while (g_nstreams < n)
        if (p_screate(&g_streams[g_nstreams++], 0)) return -1;
    return n;
}

struct thr {
    size_t bytes;
    int ok;
};
static void *thr_alloc(void *a) {
    struct thr *t = a;
    CUcontext c;
    CUdevice d;
    p_devget(&d, 0);
    p_retain(&c, d);
    p_setcur(c);
    CUdeviceptr p;
    t->ok = p_alloc(&p, t->bytes) == CUDA_SUCCESS;
    return NULL;
}

/* capturethread: another thread captures its own stream in GLOBAL mode meanwhile. */
struct capt {
    pthread_mutex_t m;
    pthread_cond_t c;
    int began, go_end;
    CUresult rc;
    CUcontext ctx;
};
static void *capture_thread(void *arg) {
    struct capt *k = arg;
    CUstream s = NULL;
    CUgraph g = NULL;
    p_setcur(k->ctx);
    CUresult rc = p_screate(&s, 0);
    if (!rc) rc = p_capbegin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    pthread_mutex_lock(&k->m);
    k->began = 1;
    k->rc = rc;
    pthread_cond_broadcast(&k->c);
    while (!k->go_end) pthread_cond_wait(&k->c, &k->m);
    pthread_mutex_unlock(&k->m);
    if (!rc) rc = p_capend(s, &g);
    k->rc = rc;
    return NULL;
}

static void use_device(int n) {
    CUdevice d;
    CUcontext c;
    if (p_devget(&d, n) || p_retain(&c, d) || p_setcur(c)) {
        printf("err device %d\n", n);
        return;
    }
    printf("ok\n");
}

int main(int argc, char **argv) {
    /* stdin unbuffered: stdio reads it a byte at a time, so no command past the current line is
     * taken from the pipe. A buffered read could take the line after "exec" too, and exec would
     * throw it away with the buffer: the new image would wait for it for ever. */
    setvbuf(stdin, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "default";
    mode_dlsym = strcmp(mode, "dlsym") == 0;
    flags = strcmp(mode, "ptsz") == 0 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                      : CU_GET_PROC_ADDRESS_DEFAULT;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("err dlopen %s\n", dlerror());
        return 1;
    }
    gpa = (gpa_t)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) {
        printf("err no cuGetProcAddress_v2\n");
        return 1;
    }
    resolve();
    setvbuf(stdout, NULL, _IOLBF, 0);
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[64] = "", a[64] = "", b[64] = "", c[64] = "", dd[64] = "";
        sscanf(line, "%63s %63s %63s %63s %63s", cmd, a, b, c, dd);
        unsigned long long x = strtoull(a, NULL, 0), y = strtoull(b, NULL, 0), z = strtoull(c, NULL, 0);
        CUresult rc = 0;
        if (!strcmp(cmd, "init")) {
            rc = p_init(0);
            if (rc) {
                printf("err %d\n", rc);
                continue;
            }
            use_device(0);
        } else if (!strcmp(cmd, "device")) {
            use_device((int)x);
        } else if (!strcmp(cmd, "pid")) {
            printf("ok %d\n", (int)getpid());
        } else if (!strcmp(cmd, "whois")) {
            void *p = get(a, b[0] ? b : a);
            Dl_info i;
            if (p && dladdr(p, &i))
                printf("ok %s %s\n", i.dli_fname, i.dli_sname ? i.dli_sname : "?");
            else
                printf("err none\n");
        } else if (!strcmp(cmd, "whoisv")) { /* whoisv NAME VERSION: as a runtime of VERSION asks */
            void *p = get_v(a, a, (int)y);
            Dl_info i;
            if (p && dladdr(p, &i))
                printf("ok %s %s\n", i.dli_fname, i.dli_sname ? i.dli_sname : "?");
            else
                printf("err none\n");
        } else if (!strcmp(cmd, "name")) {
            char n[64];
            rc = p_name(n, sizeof n, 0);
            if (rc) printf("err %d\n", rc); else printf("ok %s\n", n);
        } else if (!strcmp(cmd, "alloc") || !strcmp(cmd, "managed") || !strcmp(cmd, "async") ||
                   !strcmp(cmd, "pool")) {
            CUdeviceptr p = 0;
            if (!strcmp(cmd, "alloc")) rc = p_alloc(&p, x);
            else if (!strcmp(cmd, "managed")) rc = p_managed(&p, x, CU_MEM_ATTACH_GLOBAL);
            else if (!strcmp(cmd, "async")) rc = p_async(&p, x, NULL);
            else {
                CUmemoryPool pool;
                CUdevice d;
                p_devget(&d, 0);
                p_defpool(&pool, d);
                rc = p_pool(&p, x, pool, NULL);
            }
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)p);
        } else if (!strcmp(cmd, "free")) {
            rc = p_free(x);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "freeasync")) {
            rc = p_freeasync(x, NULL);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "pitch")) {
            CUdeviceptr p;
            size_t pitch;
            rc = p_pitch(&p, &pitch, x, y, 4);
            if (rc) printf("err %d\n", rc); else printf("ok %llu %zu\n", (unsigned long long)p, pitch);
        } else if (!strcmp(cmd, "vmm")) {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = 1;
            prop.location.type = c[0] ? (int)z : CU_MEM_LOCATION_TYPE_DEVICE; /* vmm BYTES DEV [TYPE] */
            prop.location.id = (int)y;
            CUmemGenericAllocationHandle h;
            rc = p_create(&h, x, &prop, 0);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)h);
        } else if (!strcmp(cmd, "map")) { /* map VA BYTES HANDLE */
            rc = p_map(x, y, 0, z, 0);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "unmap")) { /* unmap VA BYTES */
            rc = p_unmap(x, y);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "poolcreate")) { /* poolcreate LOCATION_TYPE ID: ok POOL */
            CUmemPoolProps pp;
            memset(&pp, 0, sizeof pp);
            pp.allocType = 1;
            pp.location.type = (int)x;
            pp.location.id = (int)y;
            CUmemoryPool pool;
            rc = p_poolcreate(&pool, &pp);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)pool);
        } else if (!strcmp(cmd, "poolalloc")) { /* poolalloc POOL BYTES: ok PTR */
            CUdeviceptr p = 0;
            rc = p_pool(&p, y, (CUmemoryPool)(uintptr_t)x, NULL);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)p);
        } else if (!strcmp(cmd, "release")) {
            rc = p_release(x);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "array")) {
            CUDA_ARRAY_DESCRIPTOR d = {x, y, CU_AD_FORMAT_FLOAT, 1};
            CUarray arr;
            rc = p_arr(&arr, &d);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)arr);
        } else if (!strcmp(cmd, "array3d")) {
            CUDA_ARRAY3D_DESCRIPTOR d = {x, y, z, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
            CUarray arr;
            rc = p_arr3(&arr, &d);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)arr);
        } else if (!strcmp(cmd, "destroyarray")) {
            rc = p_arrdel((CUarray)(uintptr_t)x);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "info")) {
            size_t f, t;
            rc = p_info(&f, &t);
            if (rc) printf("err %d\n", rc); else printf("ok %zu %zu\n", f, t);
        } else if (!strcmp(cmd, "total")) {
            size_t t;
            rc = p_total(&t, (CUdevice)x);
            if (rc) printf("err %d\n", rc); else printf("ok %zu\n", t);
        } else if (!strcmp(cmd, "ctxcreate")) {
            CUcontext ctx;
            rc = p_ctxcreate(&ctx, 0, (CUdevice)x);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "launch")) { /* launch NS COUNT KIND */
            uint64_t dur = x;
            for (unsigned long long i = 0; i < y && !rc; i++) rc = launch_one(c[0] ? c : "kernel", &dur, NULL);
            if (!rc) rc = p_sync();
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "launchfor")) {
            /* launchfor NS MILLISECONDS KIND [STREAMS]: round robin over STREAMS new streams */
            uint64_t dur = x, end = now_ns() + y * 1000000ull, n = 0;
            int ns = dd[0] ? streams(atoi(dd)) : 0;
            if (ns < 0) { printf("err streams\n"); continue; }
            while (now_ns() < end && !rc) {
                rc = launch_one(c[0] ? c : "kernel", &dur, ns ? g_streams[n % (uint64_t)ns] : NULL);
                n++;
            }
            if (!rc) rc = p_sync();
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)n);
        } else if (!strcmp(cmd, "fork")) { /* fork BYTES: a child allocates, reports, exits */
            int fd[2];
            if (pipe(fd)) { printf("err pipe\n"); continue; }
            pid_t pid = fork();
            if (pid == 0) {
                close(fd[0]);
                CUdeviceptr p;
                CUresult r = p_alloc(&p, x);
                char msg[64];
                int n = snprintf(msg, sizeof msg, "%d %d", r, (int)getpid());
                if (write(fd[1], msg, (size_t)n) < 0) _exit(3);
                close(fd[1]);
                if (y) pause(); /* held, so the test can look at the region (and kill it) */
                _exit(0);
            }
            close(fd[1]);
            char msg[64] = "";
            ssize_t n = read(fd[0], msg, sizeof msg - 1);
            close(fd[0]);
            if (n > 0) msg[n] = 0;
            if (!y) waitpid(pid, NULL, 0);
            printf("ok %s\n", msg);
        } else if (!strcmp(cmd, "threads")) { /* threads N BYTES: ok = how many allocations fit */
            int n = (int)x;
            pthread_t t[64];
            struct thr a2[64];
            if (n > 64) n = 64;
            for (int i = 0; i < n; i++) {
                a2[i].bytes = y;
                a2[i].ok = 0;
                pthread_create(&t[i], NULL, thr_alloc, &a2[i]);
            }
            int ok = 0;
            for (int i = 0; i < n; i++) {
                pthread_join(t[i], NULL);
                ok += a2[i].ok;
            }
            printf("ok %d\n", ok);
        } else if (!strcmp(cmd, "sync")) {
            rc = p_sync();
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "exec")) { /* the same program anew, same pid and pipes; what
                                             * was sent after "exec" is still in the pipe */
            fflush(stdout);
            execv("/proc/self/exe", argv);
            printf("err exec\n");
        } else if (!strcmp(cmd, "graphnode") || !strcmp(cmd, "graphaddnode")) {
            /* graphnode BYTES [GRAPH]: a mem-alloc node of BYTES on device 0, in a new graph or
             * GRAPH; ok = the graph */
            CUgraph g = (CUgraph)(uintptr_t)y;
            if (!g && (rc = p_gcreate(&g, 0))) { printf("err %d\n", rc); continue; }
            CUgraphNodeParams np;
            memset(&np, 0, sizeof np);
            np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
            np.u.alloc.poolProps.allocType = 1;
            np.u.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            np.u.alloc.poolProps.location.id = 0;
            np.u.alloc.bytesize = x;
            CUgraphNode node;
            rc = !strcmp(cmd, "graphnode") ? p_gallocnode(&node, g, NULL, 0, &np.u.alloc)
                                           : p_gaddnode(&node, g, NULL, 0, &np);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)g);
        } else if (!strcmp(cmd, "capture")) { /* capture BYTES: cuMemAllocAsync + free captured */
            CUgraph g = NULL;
            CUdeviceptr p = 0;
            rc = p_capbegin(NULL, 0);
            CUresult arc = rc ? rc : p_async(&p, x, NULL);
            if (!arc) p_freeasync(p, NULL);
            if (!rc) rc = p_capend(NULL, &g);
            if (!rc) rc = arc;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)g);
        } else if (!strcmp(cmd, "capturekernels")) {
            /* capturekernels N NS MODE: N kernels of NS captured on a new stream (on the
             * per-thread default stream in ptsz mode) in capture MODE, instantiated: ok EXEC */
            CUstream s = NULL;
            CUgraph g = NULL;
            uint64_t dur = y;
            void *params[1] = {&dur};
            if (flags == CU_GET_PROC_ADDRESS_DEFAULT && (rc = p_screate(&s, 0))) {
                printf("err %d\n", rc);
                continue;
            }
            rc = p_capbegin(s, (int)z);
            for (unsigned long long i = 0; i < x && !rc; i++)
                rc = p_launch(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
            CUresult erc = p_capend(s, &g);
            if (!rc) rc = erc;
            CUgraphExec e = NULL;
            if (!rc) rc = p_ginst(&e, g, 0);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)e);
        } else if (!strcmp(cmd, "capturethread")) {
            /* capturethread N NS: while another thread holds a GLOBAL-mode capture of its own
             * stream, this one launches N kernels of NS on a stream of its own; ok = the
             * capture's end result (0: the capture survived) */
            struct capt k = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, NULL};
            CUcontext cur = NULL;
            CUresult (*getcur)(CUcontext *) = get("cuCtxGetCurrent", "cuCtxGetCurrent");
            getcur(&cur);
            k.ctx = cur;
            int ns = streams(1);
            pthread_t t;
            pthread_create(&t, NULL, capture_thread, &k);
            pthread_mutex_lock(&k.m);
            while (!k.began) pthread_cond_wait(&k.c, &k.m);
            pthread_mutex_unlock(&k.m);
            uint64_t dur = y;
            for (unsigned long long i = 0; i < x && !rc && ns > 0; i++) rc = launch_one("kernel", &dur, g_streams[0]);
            pthread_mutex_lock(&k.m);
            k.go_end = 1;
            pthread_cond_broadcast(&k.c);
            pthread_mutex_unlock(&k.m);
            pthread_join(t, NULL);
            if (rc) printf("err %d\n", rc); else printf("ok %d\n", k.rc);
        } else if (!strcmp(cmd, "glaunchfor")) { /* glaunchfor EXEC MILLISECONDS */
            uint64_t end = now_ns() + y * 1000000ull, n = 0;
            while (now_ns() < end && !rc) {
                rc = p_graph((CUgraphExec)(uintptr_t)x, NULL);
                n++;
            }
            if (!rc) rc = p_sync();
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)n);
        } else if (!strcmp(cmd, "graphaddnode3")) { /* graphaddnode3 BYTES: through the _v3 */
            CUgraph g = NULL;
            if ((rc = p_gcreate(&g, 0))) { printf("err %d\n", rc); continue; }
            CUgraphNodeParams np;
            memset(&np, 0, sizeof np);
            np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
            np.u.alloc.poolProps.allocType = 1;
            np.u.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            np.u.alloc.bytesize = x;
            CUgraphNode node;
            rc = p_gaddnode3 ? p_gaddnode3(&node, g, NULL, NULL, 0, &np) : CUDA_ERROR_NOT_FOUND;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)g);
        } else if (!strcmp(cmd, "instantiate")) {
            CUgraphExec e;
            rc = p_ginst(&e, (CUgraph)(uintptr_t)x, 0);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)e);
        } else if (!strcmp(cmd, "upload")) {
            rc = p_gupload((CUgraphExec)(uintptr_t)x, NULL);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "glaunch")) {
            rc = p_graph((CUgraphExec)(uintptr_t)x, NULL);
            if (!rc) rc = p_sync();
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "gexecdestroy")) {
            rc = p_gexecdel((CUgraphExec)(uintptr_t)x);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "trim")) {
            CUdevice d;
            p_devget(&d, 0);
            rc = p_gtrim(d);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "mipmap")) { /* mipmap W H LEVELS: float, one channel */
            CUDA_ARRAY3D_DESCRIPTOR d = {x, y, 0, CU_AD_FORMAT_FLOAT, 1, 0};
            CUmipmappedArray m;
            rc = p_mipmap(&m, &d, (unsigned)z);
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", (unsigned long long)(uintptr_t)m);
        } else if (!strcmp(cmd, "destroymipmap")) {
            rc = p_mipdel((CUmipmappedArray)(uintptr_t)x);
            if (rc) printf("err %d\n", rc); else printf("ok\n");
        } else if (!strcmp(cmd, "callsym")) { /* callsym NAME: dlsym it and call it bare */
            int (*f)(void) = (int (*)(void))dlsym(lib, a);
            if (!f) printf("err nosym\n"); else printf("ok %d\n", f());
        } else if (!strcmp(cmd, "poke")) {
            /* poke OFFSET VALUE: what a job might do to raise its own limit: write VALUE at
             * OFFSET of $GPUPOOL_CUDA_REGION, and at dev[0].mem_limit of its limits part.
             * ok R L: 1 where the write happened, else the errno of the refusal. */
            const char *rp = getenv("GPUPOOL_CUDA_REGION");
            char lp[4200];
            snprintf(lp, sizeof lp, "%s.limits", rp ? rp : "");
            int res[2] = {0, 0};
            const char *paths[2] = {rp ? rp : "", lp};
            size_t offs[2] = {(size_t)x, offsetof(struct gp_region, dev[0].mem_limit)};
            for (int k = 0; k < 2; k++) {
                int fd = open(paths[k], O_RDWR);
                if (fd < 0) { res[k] = errno; continue; }
                void *m = mmap(NULL, offs[k] + 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                close(fd);
                if (m == MAP_FAILED) { res[k] = errno; continue; }
                *(volatile uint64_t *)((char *)m + offs[k]) = y;
                munmap(m, offs[k] + 8);
                res[k] = 1;
            }
            printf("ok %d %d\n", res[0], res[1]);
        } else if (!strcmp(cmd, "exit")) {
            printf("ok\n");
            return 0;
        } else {
            printf("err unknown command %s\n", cmd);
        }
    }
    return 0;
}
