/* The budget region (see gp_region.h): creation and mapping, the robust lock, slots and reaping,
 * and the agent's reads and in-place limit changes. */
#define _GNU_SOURCE
#include "gp_region.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(pthread_mutex_t) <= 64, "pthread_mutex_t does not fit the lock field");
_Static_assert(offsetof(struct gp_region, usage_magic) == GP_SPLIT, "the limits part is not GP_SPLIT");

#define GP_USAGE_MAGIC 0x45474153555047ULL /* "GPUSAGE" */
#define GP_USAGE_SIZE (sizeof(struct gp_region) - GP_SPLIT)

uint32_t gp_region_abi_size(void) { return (uint32_t)sizeof(struct gp_region); }

/* A process's start time (clock ticks since boot) and state letter, from /proc/PID/stat; 0 when
 * it cannot be read. */
static uint64_t proc_stat(pid_t pid, char *state) {
    char path[64], buf[1024];
    *state = '?';
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    /* The command name may hold spaces and parentheses: count fields after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 0;
    *state = p[2];
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

uint64_t gp_proc_start_ticks(pid_t pid) {
    char state;
    return proc_stat(pid, &state);
}

/* Writes bytes to path through a temporary name (mode as given, umask aside). 0 or -errno. */
static int write_whole(const char *path, const char *p, size_t left, mode_t mode) {
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, mode);
    if (fd < 0) return -errno;
    while (left) {
        ssize_t n = write(fd, p, left);
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return -e;
        }
        p += n;
        left -= (size_t)n;
    }
    if (fchmod(fd, mode) != 0 || fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return -e;
    }
    return 0;
}

int gp_region_create(const char *path, const char *label, uint32_t ndev, const uint8_t *uuids,
                     const uint64_t *mem_limits, const uint32_t *sm_shares,
                     const uint64_t *context_reserves, uint32_t dev_flags, uint32_t region_flags) {
    if (ndev == 0 || ndev > GP_MAX_DEVICES) return -EINVAL;
    struct gp_region *r = calloc(1, sizeof *r);
    if (!r) return -ENOMEM;
    r->magic = GP_REGION_MAGIC;
    r->version = GP_REGION_VERSION;
    r->size = (uint32_t)sizeof *r;
    r->ndev = ndev;
    r->nslots = GP_MAX_SLOTS;
    atomic_store(&r->flags, region_flags);
    if (label) snprintf(r->label, sizeof r->label, "%s", label);
    for (uint32_t i = 0; i < ndev; i++) {
        memcpy(r->dev[i].uuid, uuids + 16 * i, 16);
        atomic_store(&r->dev[i].mem_limit, mem_limits[i]);
        atomic_store(&r->dev[i].context_reserve, context_reserves[i]);
        atomic_store(&r->dev[i].sm_share, sm_shares[i]);
        atomic_store(&r->dev[i].flags, dev_flags);
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&r->lock.mutex, &a);
    pthread_mutexattr_destroy(&a);

    r->usage_magic = GP_USAGE_MAGIC;
    r->usage_size = (uint32_t)GP_USAGE_SIZE;
    /* The limits first (the agent's, 0644: jobs read them), then the usage part (0600, handed
     * to the job's account); each written to a temporary name and renamed, so a process never
     * maps a half-written one. */
    char limits[4096];
    if (snprintf(limits, sizeof limits, "%s.limits", path) >= (int)sizeof limits) {
        free(r);
        return -ENAMETOOLONG;
    }
    int rc = write_whole(limits, (const char *)r, GP_SPLIT, 0644);
    if (rc == 0) rc = write_whole(path, (const char *)r + GP_SPLIT, GP_USAGE_SIZE, 0600);
    if (rc != 0) unlink(limits);
    free(r);
    return rc;
}

/* Maps fd's first bytes at addr (MAP_FIXED inside a reservation); 0 or -errno. */
static int map_at(void *addr, size_t bytes, int prot, const char *path, int flags) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < bytes) {
        close(fd);
        return -EPROTO;
    }
    void *m = mmap(addr, bytes, prot, MAP_SHARED | MAP_FIXED, fd, 0);
    int e = errno;
    close(fd);
    return m == MAP_FAILED ? -e : 0;
}

/* Both parts, next to each other: the limits writable only when `agent`. */
static struct gp_region *map_region(const char *path, int agent, int *err) {
    char limits[4096];
    if (snprintf(limits, sizeof limits, "%s.limits", path) >= (int)sizeof limits) {
        *err = -ENAMETOOLONG;
        return NULL;
    }
    void *base = mmap(NULL, sizeof(struct gp_region), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        *err = -errno;
        return NULL;
    }
    int rc = map_at(base, GP_SPLIT, agent ? PROT_READ | PROT_WRITE : PROT_READ, limits,
                    agent ? O_RDWR : O_RDONLY);
    if (rc == -ENOENT && access(path, F_OK) == 0) rc = -EPROTO; /* one file: an older region */
    if (rc == 0)
        rc = map_at((char *)base + GP_SPLIT, GP_USAGE_SIZE, PROT_READ | PROT_WRITE, path, O_RDWR);
    struct gp_region *r = base;
    if (rc == 0 && (r->magic != GP_REGION_MAGIC || r->version != GP_REGION_VERSION ||
                    r->size != sizeof(struct gp_region) || r->ndev > GP_MAX_DEVICES ||
                    r->usage_magic != GP_USAGE_MAGIC || r->usage_size != GP_USAGE_SIZE))
        rc = -EPROTO;
    if (rc != 0) {
        munmap(base, sizeof(struct gp_region));
        *err = rc;
        return NULL;
    }
    *err = 0;
    return r;
}

struct gp_region *gp_region_map(const char *path, int *err) { return map_region(path, 1, err); }

struct gp_region *gp_region_map_job(const char *path, int *err) { return map_region(path, 0, err); }

void gp_region_unmap(struct gp_region *r) {
    if (r) munmap(r, sizeof *r);
}

int gp_region_lock(struct gp_region *r) {
    int rc = pthread_mutex_lock(&r->lock.mutex);
    if (rc == EOWNERDEAD) {
        /* The holder died inside a critical section: its own slot is the only state it could
         * have left half-changed, and a dead process's slot is reaped, so mark consistent. */
        pthread_mutex_consistent(&r->lock.mutex);
        gp_region_reap_locked(r);
        rc = 0;
    }
    return rc;
}

void gp_region_unlock(struct gp_region *r) { pthread_mutex_unlock(&r->lock.mutex); }

int gp_slot_alive(struct gp_slot *s) {
    int32_t pid = atomic_load(&s->pid);
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char state;
    uint64_t st = proc_stat(pid, &state);
    if (state == 'Z' || state == 'X') return 0; /* dead, not yet waited for by its parent */
    /* 0: /proc unreadable (another user's process): trust kill(). */
    return st == 0 || st == atomic_load(&s->start_ticks);
}

static void slot_clear(struct gp_slot *s) {
    for (int d = 0; d < GP_MAX_DEVICES; d++) {
        atomic_store(&s->used[d], 0);
        atomic_store(&s->spilled[d], 0);
        atomic_store(&s->busy_ns[d], 0);
        atomic_store(&s->launches[d], 0);
    }
    atomic_store(&s->start_ticks, 0);
    atomic_store(&s->pid, 0);
}

int gp_region_reap_locked(struct gp_region *r) {
    int n = 0;
    for (uint32_t i = 0; i < GP_MAX_SLOTS; i++) {
        struct gp_slot *s = &r->slot[i];
        if (atomic_load(&s->pid) != 0 && !gp_slot_alive(s)) {
            slot_clear(s);
            n++;
        }
    }
    return n;
}

int gp_region_reap(struct gp_region *r) {
    if (gp_region_lock(r) != 0) return -EDEADLK;
    int n = gp_region_reap_locked(r);
    gp_region_unlock(r);
    return n;
}

int gp_region_claim(struct gp_region *r, pid_t pid) {
    if (gp_region_lock(r) != 0) return -1;
    int found = -1;
    for (int pass = 0; pass < 2 && found < 0; pass++) {
        if (pass == 1) gp_region_reap_locked(r);
        for (uint32_t i = 0; i < GP_MAX_SLOTS; i++) {
            if (atomic_load(&r->slot[i].pid) == 0) {
                slot_clear(&r->slot[i]);
                atomic_store(&r->slot[i].start_ticks, gp_proc_start_ticks(pid));
                atomic_store(&r->slot[i].pid, (int32_t)pid);
                if (atomic_load(&r->slot_hwm) < i + 1) atomic_store(&r->slot_hwm, i + 1);
                found = (int)i;
                break;
            }
        }
    }
    gp_region_unlock(r);
    return found;
}

void gp_region_release(struct gp_region *r, int slot) {
    if (slot < 0 || slot >= GP_MAX_SLOTS) return;
    if (gp_region_lock(r) != 0) return;
    slot_clear(&r->slot[slot]);
    gp_region_unlock(r);
}

uint64_t gp_region_used_locked(struct gp_region *r, uint32_t dev) {
    uint64_t sum = 0;
    uint32_t n = atomic_load(&r->slot_hwm);
    for (uint32_t i = 0; i < n && i < GP_MAX_SLOTS; i++)
        if (atomic_load(&r->slot[i].pid) != 0) sum += atomic_load(&r->slot[i].used[dev]);
    return sum;
}

static int bump(struct gp_region *r) {
    atomic_fetch_add(&r->generation, 1);
    return 0;
}

int gp_region_set_limit(struct gp_region *r, uint32_t dev, uint64_t bytes) {
    if (dev >= r->ndev) return -EINVAL;
    atomic_store(&r->dev[dev].mem_limit, bytes);
    return bump(r);
}

int gp_region_set_share(struct gp_region *r, uint32_t dev, uint32_t permille) {
    if (dev >= r->ndev || permille == 0) return -EINVAL;
    atomic_store(&r->dev[dev].sm_share, permille);
    return bump(r);
}

int gp_region_set_spare(struct gp_region *r, uint32_t dev, uint32_t permille) {
    if (dev >= r->ndev) return -EINVAL;
    atomic_store(&r->dev[dev].sm_spare, permille);
    return bump(r);
}

int gp_region_set_dev_flags(struct gp_region *r, uint32_t dev, uint32_t flags) {
    if (dev >= r->ndev) return -EINVAL;
    atomic_store(&r->dev[dev].flags, flags);
    return bump(r);
}

int gp_region_usage(struct gp_region *r, struct gp_device_usage *out, uint32_t n) {
    uint32_t nd = r->ndev < n ? r->ndev : n;
    for (uint32_t d = 0; d < nd; d++) {
        struct gp_device_usage *u = &out[d];
        memset(u, 0, sizeof *u);
        memcpy(u->uuid, r->dev[d].uuid, 16);
        u->mem_limit = atomic_load(&r->dev[d].mem_limit);
        u->context_reserve = atomic_load(&r->dev[d].context_reserve);
        u->sm_share = atomic_load(&r->dev[d].sm_share);
        u->sm_spare = atomic_load(&r->dev[d].sm_spare);
        u->flags = atomic_load(&r->dev[d].flags);
        for (uint32_t i = 0; i < GP_MAX_SLOTS; i++) {
            struct gp_slot *s = &r->slot[i];
            if (atomic_load(&s->pid) == 0) continue;
            u->used += atomic_load(&s->used[d]);
            u->spilled += atomic_load(&s->spilled[d]);
            u->busy_ns += atomic_load(&s->busy_ns[d]);
            u->launches += atomic_load(&s->launches[d]);
        }
    }
    return (int)nd;
}

int gp_region_attached(struct gp_region *r, int32_t *pids, uint32_t n) {
    int k = 0;
    for (uint32_t i = 0; i < GP_MAX_SLOTS && (uint32_t)k < n; i++) {
        struct gp_slot *s = &r->slot[i];
        if (atomic_load(&s->pid) != 0 && gp_slot_alive(s)) pids[k++] = atomic_load(&s->pid);
    }
    return k;
}
