/* A program linked against libcuda.so.1 itself (no dlopen): under the façade its hooked calls
 * reach the shim and every other call goes through a trampoline to the real driver.
 * argv[1]: bytes to allocate. Prints "name NAME", "version N", then "alloc RC". */
#include <stdio.h>
#include <stdlib.h>

#include "gp_cuda.h"

CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

int main(int argc, char **argv) {
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    char name[64];
    int v = 0;
    if (argc < 2 || cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) ||
        cuCtxSetCurrent(c))
        return 2;
    cuDeviceGetName(name, sizeof name, d);
    cuDriverGetVersion(&v);
    printf("name %s\nversion %d\n", name, v);
    printf("alloc %d\n", cuMemAlloc_v2(&p, strtoull(argv[1], NULL, 10)));
    return 0;
}
