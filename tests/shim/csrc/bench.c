/* Cost per call through whatever libcuda.so.1 the library path gives (the fake driver alone, or
 * the shim's façade in front of it). Prints "NAME NS_PER_CALL" lines.
 * argv[1]: iterations. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gp_cuda.h"

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 2;
    gpa_t gpa = (gpa_t)dlsym(lib, "cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult st;
    CUresult (*init)(unsigned);
    CUresult (*devget)(CUdevice *, int);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*setcur)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*mfree)(CUdeviceptr);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*sync)(void);
    CUresult (*glaunch)(CUgraphExec, CUstream);
    CUresult (*gcreate)(CUgraph *, unsigned);
    CUresult (*gallocnode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                           CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*ginst)(CUgraphExec *, CUgraph, unsigned long long);
    gpa("cuInit", (void **)&init, 12000, 0, &st);
    gpa("cuDeviceGet", (void **)&devget, 12000, 0, &st);
    gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 12000, 0, &st);
    gpa("cuCtxSetCurrent", (void **)&setcur, 12000, 0, &st);
    gpa("cuMemAlloc", (void **)&alloc, 12000, 0, &st);
    gpa("cuMemFree", (void **)&mfree, 12000, 0, &st);
    gpa("cuMemGetInfo", (void **)&info, 12000, 0, &st);
    gpa("cuLaunchKernel", (void **)&launch, 12000, 0, &st);
    gpa("cuCtxSynchronize", (void **)&sync, 12000, 0, &st);
    gpa("cuGraphLaunch", (void **)&glaunch, 12000, 0, &st);
    gpa("cuGraphCreate", (void **)&gcreate, 12000, 0, &st);
    gpa("cuGraphAddMemAllocNode", (void **)&gallocnode, 12000, 0, &st);
    gpa("cuGraphInstantiateWithFlags", (void **)&ginst, 12000, 0, &st);
    CUresult (*version)(int *) = (CUresult(*)(int *))dlsym(lib, "cuDriverGetVersion");
    CUdevice d;
    CUcontext c;
    if (init(0) || devget(&d, 0) || retain(&c, d) || setcur(c)) return 3;

    int v;
    double t = now();
    for (long i = 0; i < n; i++) version(&v);
    printf("forwarded_call %.1f\n", (now() - t) / (double)n);

    size_t f, tot;
    t = now();
    for (long i = 0; i < n; i++) info(&f, &tot);
    printf("cuMemGetInfo %.1f\n", (now() - t) / (double)n);

    CUdeviceptr p;
    t = now();
    for (long i = 0; i < n; i++) {
        alloc(&p, 256);
        mfree(p);
    }
    printf("cuMemAlloc+cuMemFree %.1f\n", (now() - t) / (double)n);

    uint64_t dur = 0;
    void *params[1] = {&dur};
    long k = n / 4;
    t = now();
    for (long i = 0; i < k; i++) {
        launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        if (i % 64 == 63) sync();
    }
    sync();
    printf("cuLaunchKernel %.1f\n", (now() - t) / (double)k);

    /* A graph without memory nodes (the fake reads a 0 ns duration through the handle). */
    t = now();
    for (long i = 0; i < k; i++) {
        glaunch((CUgraphExec)(void *)&dur, NULL);
        if (i % 64 == 63) sync();
    }
    sync();
    printf("cuGraphLaunch %.1f\n", (now() - t) / (double)k);

    /* A graph with a 1 MiB mem-alloc node: its memory is checked and settled per launch. */
    CUgraph g;
    CUgraphNode node;
    CUgraphExec e;
    CUDA_MEM_ALLOC_NODE_PARAMS np = {0};
    np.poolProps.allocType = 1;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.bytesize = 1 << 20;
    if (gcreate(&g, 0) || gallocnode(&node, g, NULL, 0, &np) || ginst(&e, g, 0)) return 4;
    t = now();
    for (long i = 0; i < k; i++) {
        glaunch(e, NULL);
        if (i % 64 == 63) sync();
    }
    sync();
    printf("cuGraphLaunch_with_graph_memory %.1f\n", (now() - t) / (double)k);
    return 0;
}
