/* What the shim's hook units (gp_hooks.h) and its launch pacing (pace.c) share inside one
 * library (never exported: the build hides every symbol not marked GP_API). */
#ifndef GP_SHIM_H
#define GP_SHIM_H

#include <stdint.h>

#include "gp_cuda.h"
#include "gp_region.h"

typedef void *(*gp_sym_fn)(const char *name); /* a real driver function by name, or NULL */

/* shim.c, launch.c (the capture state) */
extern struct gp_region *g_region; /* NULL: no slice, pass through */
extern int g_slot;                 /* this process's slot in the region, -1: none yet */
void gp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t gp_mono_ns(void);
int gp_current_dev(CUdevice *dev);                  /* the region index of the current device */
CUstream gp_real_stream(CUstream s, int per_thread); /* NULL via a _ptsz call: per-thread stream */
const void *gp_stream_key(CUstream s, int per_thread);
int gp_capture_forbids_pacing(CUstream s, int per_thread);

/* pace.c */
struct gp_track;
struct gp_ticket { /* a paced launch's track, valid while the track follows the same stream */
    struct gp_track *t; /* NULL: not paced */
    uint64_t gen;
};
void gp_pace_resolve(gp_sym_fn sym);
struct gp_ticket gp_pace_before(CUstream s, int per_thread);
void gp_pace_after(struct gp_ticket k, CUresult rc);
void gp_pace_reset_child(void);

#endif
