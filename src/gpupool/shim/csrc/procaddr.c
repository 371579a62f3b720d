/* The CUDA shim's hook table and how a program finds the hooks: cuInit, cuGetProcAddress and
 * _v2 (flags first, then the variant the driver confirms, or the driver's own pointer,
 * unhooked and logged once, for a name or version the shim does not know) and, in the
 * LD_PRELOAD build, dlsym. */
#include "gp_hooks.h"

struct gp_hook g_hooks[H_COUNT] = {
#define X(n, b, v, p) {#n, b, v, p, (void *)n, NULL},
    GP_HOOKS(X)
#undef X
};

/* ---------------------------------------------------------------- entry points */

GP_API CUresult cuInit(unsigned int flags) {
    NEED(cuInit);
    if (g_region_error) return CUDA_ERROR_NOT_INITIALIZED;
    return REAL(cuInit)(flags);
}

/* A capture begun through a function the shim did not hook is not counted: from then on every
 * paced launch asks the driver whether its stream captures (and another thread's GLOBAL-mode
 * capture may go unseen: said once). */
atomic_int g_cap_blind;
static void note_unhooked(const char *symbol) {
    if (symbol && strncmp(symbol, "cuStreamBeginCapture", 20) == 0 && !atomic_exchange(&g_cap_blind, 1))
        gp_log("gpupool: %s went out unhooked: stream captures are checked per launch from now on",
               symbol);
}

/* The driver's pointer for symbol at version (flags as asked), or NULL. */
static void *driver_proc(const char *symbol, int version, cuuint64_t flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (REAL(cuGetProcAddress_v2)) {
        if (REAL(cuGetProcAddress_v2)(symbol, &p, version, flags, &st) != CUDA_SUCCESS) return NULL;
    } else if (!REAL(cuGetProcAddress) ||
               REAL(cuGetProcAddress)(symbol, &p, version, flags) != CUDA_SUCCESS) {
        return NULL;
    }
    return p;
}

static atomic_int g_unknown_logged[H_COUNT];

/* The hook to hand out for the driver's answer pfn to (symbol, version, flags), or NULL (the
 * driver's own pointer goes out unhooked).
 *
 * 1. The flags first: a per-thread-default-stream request only gets a _ptsz hook where the API
 *    has one, a legacy request never does.
 * 2. pfn is one of the real functions the shim resolved by name: its hook, surely.
 * 3. Else (a driver may answer with internal pointers) the hook whose variant the name and
 *    version select, newest first, but only once the driver confirms it: asked again with
 *    that variant's own first version it must give the same pointer, and with the next older
 *    known variant's version another one (so the driver switches variants where the shim
 *    thinks). A variant the shim does not know (say a CUDA 13.4 _v3 where the shim knew only
 *    _v2) fails that: it goes out unhooked, logged once, never as a hook of another
 *    signature. */
static void *lookup_hook(const char *symbol, int version, cuuint64_t flags, void *pfn) {
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int has_pt = 0;
    for (int i = 0; i < H_COUNT; i++)
        if (strcmp(g_hooks[i].base, symbol) == 0 && g_hooks[i].per_thread) has_pt = 1;
    int flavour = want_pt && has_pt;
    for (int i = 0; i < H_COUNT; i++)
        if (g_hooks[i].real && g_hooks[i].real == pfn && g_hooks[i].per_thread == flavour)
            return g_hooks[i].hook;
    int best = -1;
    for (int i = 0; i < H_COUNT; i++) {
        struct gp_hook *h = &g_hooks[i];
        if (strcmp(h->name, symbol) == 0 && strcmp(h->name, h->base) != 0)
            return h->hook; /* asked by its versioned name ("cuMemAlloc_v2") */
        if (strcmp(h->base, symbol) != 0 || h->version > version || h->per_thread != flavour)
            continue;
        if (best < 0 || h->version > g_hooks[best].version) best = i;
    }
    if (best < 0) return NULL;
    struct gp_hook *h = &g_hooks[best];
    int prev = -1; /* the next older variant the shim knows, of the same flavour */
    for (int i = 0; i < H_COUNT; i++)
        if (strcmp(g_hooks[i].base, symbol) == 0 && g_hooks[i].per_thread == flavour &&
            g_hooks[i].version < h->version && (prev < 0 || g_hooks[i].version > g_hooks[prev].version))
            prev = i;
    int confirmed = (h->version == version || driver_proc(symbol, h->version, flags) == pfn) &&
                    (prev < 0 || driver_proc(symbol, g_hooks[prev].version, flags) != pfn);
    if (!confirmed) {
        if (!atomic_exchange(&g_unknown_logged[best], 1))
            gp_log("gpupool: the driver gives %s (CUDA version %d%s) a variant other than %s, "
                   "which this shim does not know: passed through unhooked, so what it "
                   "allocates or launches is not held to the slice; update gpupool",
                   symbol, version, want_pt ? ", per-thread stream" : "", h->name);
        return NULL;
    }
    /* Never a hook as its own real function (a preload's dlsym can hand hooks back). */
    if (!h->real && pfn != h->hook) h->real = pfn;
    return h->hook;
}

GP_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    INIT();
    CUresult rc;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    void *got = NULL;
    if (REAL(cuGetProcAddress_v2)) {
        rc = REAL(cuGetProcAddress_v2)(symbol, &got, version, flags, &st);
    } else if (REAL(cuGetProcAddress)) {
        rc = REAL(cuGetProcAddress)(symbol, &got, version, flags);
        st = rc == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    } else {
        return CUDA_ERROR_NOT_FOUND;
    }
    if (status) *status = st;
    if (pfn) *pfn = got;
    if (rc != CUDA_SUCCESS || !got || !symbol || !pfn) return rc;
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        *pfn = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
        return rc;
    }
    void *h = lookup_hook(symbol, version, flags, got);
    if (h) *pfn = h;
    else note_unhooked(symbol);
    return rc;
}

GP_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    INIT();
    if (!REAL(cuGetProcAddress) && !REAL(cuGetProcAddress_v2)) return CUDA_ERROR_NOT_FOUND;
    if (!REAL(cuGetProcAddress)) return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
    void *got = NULL;
    CUresult rc = REAL(cuGetProcAddress)(symbol, &got, version, flags);
    if (pfn) *pfn = got;
    if (rc != CUDA_SUCCESS || !got || !symbol || !pfn) return rc;
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        *pfn = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
        return rc;
    }
    void *h = lookup_hook(symbol, version, flags, got);
    if (h) *pfn = h;
    else note_unhooked(symbol);
    return rc;
}


#ifdef GP_PRELOAD
/* A runtime that dlopens libcuda.so.1 and asks dlsym for a hooked name gets the hook. Other
 * names, and every lookup by the shim itself, go to the real dlsym. (A lookup through RTLD_NEXT
 * is then relative to the shim, not to its caller: one reason the façade is preferred.) */
GP_API void *dlsym(void *handle, const char *name) {
    if (!g_dlsym) resolve_dlsym();
    if (name[0] == 'c' && name[1] == 'u') {
        for (int i = 0; i < H_COUNT; i++)
            if (strcmp(g_hooks[i].name, name) == 0) {
                INIT();
                return g_hooks[i].hook;
            }
    }
    return g_dlsym ? g_dlsym(handle, name) : NULL;
}
#endif
