/* The budget region of one replica: two files the agent creates before launch, mapped
 * (MAP_SHARED) next to each other as one struct gp_region by every process of the replica:
 *
 *  - the *limits* part (the first GP_SPLIT bytes: the slice per device UUID, the label, the
 *    flags), file "<region>.limits", owned by the agent and mode 0644: a job maps it read-only
 *    from a descriptor opened O_RDONLY, so it can neither write it nor mprotect it writable,
 *    and only the agent changes it (live resize);
 *  - the *usage* part (the rest: the lock, the pacing buckets, one usage slot per attached
 *    process), the file GPUPOOL_CUDA_REGION names, handed to the job's account (0600): its
 *    processes write their own usage there. What a job writes there can only hide usage, never
 *    raise a limit; the agent cross-checks it with NVML's per-process memory.
 *
 * The sum over live slots is the replica's usage.
 *
 * Words: a *slot* is one attached process's row (pid, start time, bytes used per device); a
 * *dead* slot is one whose process is gone (or whose pid was reused: the start time differs);
 * *reaping* a slot releases its usage. Limits are read on every allocation and launch, so a
 * change written by the agent is seen at once by running processes (live resize).
 *
 * Concurrency: allocations check and add under one robust process-shared mutex (a holder that
 * dies leaves it recoverable: EOWNERDEAD); frees subtract with an atomic. Readers (the agent)
 * read atomics without the lock. */
#ifndef GP_REGION_H
#define GP_REGION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define GP_REGION_MAGIC 0x4e4f494745525047ULL /* "GPREGION" little-endian */
#define GP_REGION_VERSION 3u
#define GP_SPLIT 65536u /* bytes of the limits part: a page on every Linux (4, 16 or 64 KiB) */
#define GP_MAX_DEVICES 16
#define GP_MAX_SLOTS 1024 /* processes of one replica using CUDA at once (claimed at first use) */
#define GP_LABEL_LEN 64

/* Region flags (header). */
#define GP_REGION_LEND_IDLE 0x1u /* a launch may use the spare share the agent lends */

/* Device flags. */
#define GP_DEV_SPILL 0x1u /* an allocation over physical free memory is served from managed memory */

/* A device's limits (the limits part: the agent writes them, jobs only read). */
struct gp_device {
    uint8_t uuid[16];
    _Atomic uint64_t mem_limit;       /* bytes the replica may hold on this device */
    _Atomic uint64_t context_reserve; /* bytes charged per process that creates a context */
    _Atomic uint32_t sm_share;        /* permille of the device's SM time; >= 1000: no cap */
    _Atomic uint32_t sm_spare;        /* permille lent on top while the device is otherwise idle */
    _Atomic uint32_t flags;           /* GP_DEV_* */
    uint32_t pad0;
    uint8_t reserved[64];
};

/* A device's pacing bucket (the usage part: every process of the replica writes it). */
struct gp_bucket {
    _Atomic int64_t tokens_ns;  /* SM time (ns) the replica may still use */
    _Atomic uint64_t refill_ns; /* CLOCK_MONOTONIC of the bucket's last refill */
};

struct gp_slot {
    _Atomic int32_t pid; /* 0: free */
    uint32_t pad0;
    _Atomic uint64_t start_ticks; /* /proc/PID/stat field 22, to tell a reused pid */
    _Atomic uint64_t used[GP_MAX_DEVICES];     /* bytes, including spilled ones */
    _Atomic uint64_t spilled[GP_MAX_DEVICES];  /* bytes served from managed memory */
    _Atomic uint64_t busy_ns[GP_MAX_DEVICES];  /* measured SM time of paced launches */
    _Atomic uint64_t launches[GP_MAX_DEVICES]; /* intercepted launches */
};

struct gp_region {
    union { /* the limits part: file "<region>.limits", read-only in jobs */
        struct {
            uint64_t magic;
            uint32_t version;
            uint32_t size; /* bytes of this struct, a layout check */
            uint32_t ndev;
            uint32_t nslots;
            _Atomic uint32_t flags;
            uint32_t pad1;
            _Atomic uint64_t generation; /* bumped on every change of limits */
            char label[GP_LABEL_LEN];   /* the slice's name, for messages ("job 42 replica 0") */
            struct gp_device dev[GP_MAX_DEVICES];
        };
        uint8_t limits_part[GP_SPLIT];
    };
    /* the usage part: the file GPUPOOL_CUDA_REGION names, written by the job's processes */
    uint64_t usage_magic;
    uint32_t usage_size; /* bytes of the usage part, a layout check */
    _Atomic uint32_t slot_hwm; /* 1 + the highest slot index ever claimed: scans stop there */
    union {
        pthread_mutex_t mutex;
        uint8_t raw[64];
    } lock;
    struct gp_bucket bucket[GP_MAX_DEVICES];
    struct gp_slot slot[GP_MAX_SLOTS];
};

/* What the agent reads: one device's totals over live slots. */
struct gp_device_usage {
    uint8_t uuid[16];
    uint64_t mem_limit;
    uint64_t context_reserve;
    uint64_t used;
    uint64_t spilled;
    uint64_t busy_ns;
    uint64_t launches;
    uint32_t sm_share;
    uint32_t sm_spare;
    uint32_t flags;
    uint32_t pad0;
};

/* Exported only from libgpupool_region.so; inside the shim they stay private. */
#if defined(GP_FACADE) || defined(GP_PRELOAD)
#define GP_EXPORT
#else
#define GP_EXPORT __attribute__((visibility("default")))
#endif

/* The agent's side (also exported by libgpupool_region.so for Python). Return 0 or -errno. */
GP_EXPORT int gp_region_create(const char *path, const char *label, uint32_t ndev,
                               const uint8_t *uuids, const uint64_t *mem_limits,
                               const uint32_t *sm_shares, const uint64_t *context_reserves,
                               uint32_t dev_flags, uint32_t region_flags);
GP_EXPORT struct gp_region *gp_region_map(const char *path, int *err); /* the agent: both parts */
struct gp_region *gp_region_map_job(const char *path, int *err); /* a job: limits read-only */
GP_EXPORT void gp_region_unmap(struct gp_region *r);
GP_EXPORT int gp_region_set_limit(struct gp_region *r, uint32_t dev, uint64_t bytes);
GP_EXPORT int gp_region_set_share(struct gp_region *r, uint32_t dev, uint32_t permille);
GP_EXPORT int gp_region_set_spare(struct gp_region *r, uint32_t dev, uint32_t permille);
GP_EXPORT int gp_region_set_dev_flags(struct gp_region *r, uint32_t dev, uint32_t flags);
GP_EXPORT int gp_region_reap(struct gp_region *r);
GP_EXPORT int gp_region_usage(struct gp_region *r, struct gp_device_usage *out, uint32_t n);
GP_EXPORT int gp_region_attached(struct gp_region *r, int32_t *pids, uint32_t n);
GP_EXPORT uint32_t gp_region_abi_size(void);

/* The shim's side (internal to the shim). */
int gp_region_lock(struct gp_region *r);
void gp_region_unlock(struct gp_region *r);
int gp_region_claim(struct gp_region *r, pid_t pid);
void gp_region_release(struct gp_region *r, int slot);
int gp_slot_alive(struct gp_slot *s);
uint64_t gp_region_used_locked(struct gp_region *r, uint32_t dev);
int gp_region_reap_locked(struct gp_region *r);
uint64_t gp_proc_start_ticks(pid_t pid);

#endif
