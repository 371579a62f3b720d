/* Launch pacing: a replica's kernels get about its share of each device's SM time.
 *
 * Words. A *track* follows one stream of this process (a created stream, the legacy default
 * stream, or one thread's per-thread default stream) with the timing events the shim recorded
 * on it. A *span* is the device time between two consecutive events of a track: the stream was
 * busy then. The *bucket* is the region's per-device budget of SM time in ns, shared by the
 * replica's processes, filled at share x wall time (plus lent spare, where the region lends),
 * up to GP_BURST_NS.
 *
 * A launch (paced when the device's share is under 1000 permille):
 *  1. settles what finished: completed events become times on the device's clock (elapsed
 *     time from the device's *anchor* event), and each span adds to the device's busy
 *     *union*: only the time no other stream of this process already covered is taken from
 *     the bucket. Concurrent streams are charged once, not once each (a sum would charge two
 *     busy streams 200 %). Processes are time-sliced by the GPU, so a union per process is
 *     the device's own;
 *  2. bounds the work in flight: about GP_INFLIGHT_NS of measured spans per stream; past that
 *     the launch waits for the oldest event;
 *  3. waits while the bucket is in debt (sleeps of at most GP_MAX_SLEEP_NS).
 *
 * Sampling, to bound the cost of a paced launch: an event is recorded behind a launch only
 * when about GP_SAMPLE_NS of host time or of estimated device work passed since the stream's
 * last event, so consecutive kernels mostly have no event between them (which would also
 * block programmatic dependent launch). Launches after the last event (the *tail*) are
 * measured by the next event; a host pause longer than the tail could take to run (twice the
 * measured time per launch, at least GP_GAP_MIN_NS) ends the tail instead: it is charged at
 * the measured time per launch and the next launch starts a new span from a fresh event, so
 * an idle gap is never charged as busy. Until a stream has measurements every launch gets its
 * event.
 *
 * Tracks: GP_TRACKS per process, least recently used evicted; an evicted track is settled
 * first (its last event waited for, its tail charged), so its work is never lost.
 *
 * Never during stream capture (see launch.c): while events may not be touched, a launch is not
 * paced at all; a captured graph is paced when launched, as one span. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "gp_shim.h"

#define GP_TRACKS 32
#define GP_RING 128                /* events in flight per track */
#define GP_INFLIGHT_NS 16000000ll  /* measured work in flight per stream */
#define GP_INFLIGHT_MIN 2
#define GP_SAMPLE_NS 1000000ll     /* host time or estimated work between a stream's events */
#define GP_GAP_MIN_NS 20000ll
#define GP_BURST_NS 30000000ll
#define GP_MAX_SLEEP_NS 2000000ll
#define GP_UNION 64                /* busy intervals kept per device */
#define GP_REANCHOR_NS 4000000000ll /* float ms keep ~0.25 us steps up to here */

static struct {
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuEventCreate)(CUevent *, unsigned int);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuEventDestroy)(CUevent);
} P;

struct gp_ev {
    CUevent e;
    uint32_t launches; /* launches between the previous event and this one (0: a start) */
};

struct gp_track {
    int used;
    uint64_t gen; /* which stream it follows now: a ticket for an evicted one is void */
    int di;
    CUcontext ctx;
    const void *key;
    CUstream stream; /* what events are recorded on */
    uint64_t last_use;
    int head, n;
    struct gp_ev ring[GP_RING];
    CUevent prev;       /* the last settled event: where the next span starts; NULL: none */
    int64_t prev_t;     /* its time on the device clock (ns) */
    uint32_t tail;      /* launches since the last recorded event */
    uint64_t last_record_ns, last_launch_ns;
    int64_t span_ns;    /* moving average of a measured span (one event) */
    int64_t launch_ns;  /* moving average of device time per launch, 0 until measured */
};

/* A device's clock (the anchor event, in one context) and busy union. */
struct gp_clock {
    CUcontext ctx;
    CUevent anchor;
    int n;
    int64_t lo[GP_UNION], hi[GP_UNION]; /* disjoint, sorted by lo */
};

static struct gp_track g_tracks[GP_TRACKS];
static struct gp_clock g_clock[GP_MAX_DEVICES];
static CUevent g_spare[2 * GP_RING];
static int g_nspare;
static uint64_t g_lru, g_gen;
static pthread_mutex_t g_pace_lock = PTHREAD_MUTEX_INITIALIZER;

void gp_pace_resolve(gp_sym_fn sym) {
    P.cuCtxGetCurrent = sym("cuCtxGetCurrent");
    P.cuEventCreate = sym("cuEventCreate");
    P.cuEventRecord = sym("cuEventRecord");
    P.cuEventQuery = sym("cuEventQuery");
    P.cuEventSynchronize = sym("cuEventSynchronize");
    P.cuEventElapsedTime = sym("cuEventElapsedTime");
    P.cuEventDestroy = sym("cuEventDestroy_v2");
}

void gp_pace_reset_child(void) { /* the parent's events mean nothing in a child */
    pthread_mutex_init(&g_pace_lock, NULL);
    memset(g_tracks, 0, sizeof g_tracks);
    memset(g_clock, 0, sizeof g_clock);
    g_nspare = 0;
}

static int is_anchor(CUevent e) {
    for (int d = 0; d < GP_MAX_DEVICES; d++)
        if (g_clock[d].anchor == e) return 1;
    return 0;
}

static CUevent ev_get(void) {
    if (g_nspare) return g_spare[--g_nspare];
    CUevent e = NULL;
    if (P.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    return e;
}

static void ev_put(CUevent e) {
    if (!e || is_anchor(e)) return;
    if (g_nspare < (int)(sizeof g_spare / sizeof g_spare[0]))
        g_spare[g_nspare++] = e;
    else
        P.cuEventDestroy(e);
}

/* ---------------------------------------------------------------- the device's busy union */

static void charge_busy(int di, int64_t ns) {
    if (ns <= 0) return;
    atomic_fetch_sub(&g_region->bucket[di].tokens_ns, ns);
    if (g_slot >= 0) atomic_fetch_add(&g_region->slot[g_slot].busy_ns[di], (uint64_t)ns);
}

/* Adds [a, b) to the union; returns the part no interval covered yet. */
static int64_t union_add(struct gp_clock *c, int64_t a, int64_t b) {
    if (b <= a) return 0;
    int64_t fresh = b - a;
    int64_t lo = a, hi = b;
    int k = 0;
    int64_t nlo[GP_UNION + 1], nhi[GP_UNION + 1];
    int placed = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->hi[i] < a || c->lo[i] > b) { /* apart */
            if (!placed && c->lo[i] > b) {
                nlo[k] = lo, nhi[k++] = hi;
                placed = 1;
            }
            nlo[k] = c->lo[i], nhi[k++] = c->hi[i];
            continue;
        }
        int64_t ol = c->lo[i] > a ? c->lo[i] : a, oh = c->hi[i] < b ? c->hi[i] : b;
        if (oh > ol) fresh -= oh - ol;
        if (c->lo[i] < lo) lo = c->lo[i];
        if (c->hi[i] > hi) hi = c->hi[i];
    }
    if (!placed) nlo[k] = lo, nhi[k++] = hi;
    int drop = k > GP_UNION ? k - GP_UNION : 0; /* the oldest go */
    c->n = k - drop;
    memcpy(c->lo, nlo + drop, sizeof(int64_t) * (size_t)c->n);
    memcpy(c->hi, nhi + drop, sizeof(int64_t) * (size_t)c->n);
    return fresh;
}

/* The event's time on its device's clock, 0 on success. */
static int ev_time(struct gp_track *t, CUevent e, int64_t *out) {
    struct gp_clock *c = &g_clock[t->di];
    if (!c->anchor || c->ctx != t->ctx) return -1;
    float ms = 0;
    if (P.cuEventElapsedTime(&ms, c->anchor, e) != CUDA_SUCCESS) return -1;
    *out = (int64_t)((double)ms * 1e6);
    return 0;
}

/* Moves device di's clock to start at event e (time now_t on the old clock). */
static void reanchor(int di, CUevent e, int64_t now_t) {
    struct gp_clock *c = &g_clock[di];
    CUevent old = c->anchor;
    c->anchor = e;
    for (int i = 0; i < c->n; i++) c->lo[i] -= now_t, c->hi[i] -= now_t;
    for (int i = 0; i < GP_TRACKS; i++)
        if (g_tracks[i].used && g_tracks[i].di == di) g_tracks[i].prev_t -= now_t;
    int held = 0; /* still some track's start point: it is recycled from there later */
    for (int i = 0; i < GP_TRACKS; i++)
        if (g_tracks[i].used && g_tracks[i].prev == old) held = 1;
    if (old && !held) ev_put(old);
}

/* ---------------------------------------------------------------- tracks */

/* Takes the completed events at the head of t's ring (waiting for the first when wait). */
static void settle(struct gp_track *t, int wait) {
    while (t->n) {
        struct gp_ev *ev = &t->ring[t->head];
        if (wait) {
            P.cuEventSynchronize(ev->e);
            wait = 0;
        } else if (P.cuEventQuery(ev->e) != CUDA_SUCCESS) {
            break;
        }
        struct gp_clock *c = &g_clock[t->di];
        if (!c->anchor) { /* the device's first settled event starts its clock */
            c->anchor = ev->e;
            c->ctx = t->ctx;
        }
        int64_t at = 0;
        int timed = ev_time(t, ev->e, &at) == 0;
        if (ev->launches && t->prev) {
            int64_t span = 0;
            if (timed) {
                span = at - t->prev_t;
                charge_busy(t->di, union_add(c, t->prev_t, at));
            } else { /* another context than the clock's: its own span, no union */
                float ms = 0;
                if (P.cuEventElapsedTime(&ms, t->prev, ev->e) == CUDA_SUCCESS) span = (int64_t)((double)ms * 1e6);
                charge_busy(t->di, span);
            }
            if (span > 0) {
                t->span_ns = t->span_ns ? (7 * t->span_ns + span) / 8 : span;
                int64_t per = span / ev->launches;
                t->launch_ns = t->launch_ns ? (7 * t->launch_ns + per) / 8 : (per ? per : 1);
            }
        }
        ev_put(t->prev);
        t->prev = ev->e;
        t->prev_t = at;
        t->head = (t->head + 1) % GP_RING;
        t->n--;
        if (timed && at > GP_REANCHOR_NS && c->ctx == t->ctx) reanchor(t->di, ev->e, at);
    }
}

/* Ends the tail without an event: charged at the measured time per launch. */
static void close_tail(struct gp_track *t) {
    if (t->tail && t->launch_ns) charge_busy(t->di, t->launch_ns * (int64_t)t->tail);
    t->tail = 0;
}

static int pending_ends(struct gp_track *t) {
    int k = 0;
    for (int j = 0; j < t->n; j++) k += t->ring[(t->head + j) % GP_RING].launches != 0;
    return k;
}

static void evict(struct gp_track *t) {
    if (t->n) { /* settled first: what it still had in flight is measured, not lost */
        while (t->n > 1) settle(t, 1);
        settle(t, 1);
    }
    close_tail(t);
    if (t->prev) ev_put(t->prev);
    memset(t, 0, sizeof *t);
}

static struct gp_track *track_for(CUcontext ctx, const void *key, CUstream rec, int di) {
    struct gp_track *lru = &g_tracks[0];
    for (int i = 0; i < GP_TRACKS; i++) {
        struct gp_track *t = &g_tracks[i];
        if (t->used && t->ctx == ctx && t->key == key) {
            t->last_use = ++g_lru;
            return t;
        }
        if (!t->used || (lru->used && t->last_use < lru->last_use)) lru = t;
    }
    if (lru->used) evict(lru);
    lru->used = 1;
    lru->gen = ++g_gen;
    lru->ctx = ctx;
    lru->key = key;
    lru->stream = rec;
    lru->di = di;
    lru->last_use = ++g_lru;
    return lru;
}

static void push(struct gp_track *t, uint32_t launches, uint64_t now) {
    if (t->n == GP_RING) settle(t, 1);
    CUevent e = ev_get();
    if (!e || P.cuEventRecord(e, t->stream) != CUDA_SUCCESS) {
        ev_put(e);
        return;
    }
    t->ring[(t->head + t->n) % GP_RING] = (struct gp_ev){e, launches};
    t->n++;
    t->last_record_ns = now;
}

/* ---------------------------------------------------------------- the bucket */

static uint32_t effective_share(struct gp_device *d) {
    uint32_t eff = atomic_load(&d->sm_share);
    if (atomic_load(&g_region->flags) & GP_REGION_LEND_IDLE) eff += atomic_load(&d->sm_spare);
    return eff;
}

#define GP_REFILL_NS 50000 /* refill at most this often: a shared cache line, written by all */

static void bucket_refill(struct gp_bucket *d, uint32_t eff, uint64_t now) {
    uint64_t last = atomic_load(&d->refill_ns);
    if (last && now < last + GP_REFILL_NS) return;
    if (!atomic_compare_exchange_strong(&d->refill_ns, &last, now)) return;
    if (last == 0) return; /* the first launch starts the clock: no burst up front */
    uint64_t dt = now - last;
    if (dt > (uint64_t)GP_BURST_NS * 1000) dt = (uint64_t)GP_BURST_NS * 1000;
    int64_t add = (int64_t)(dt * eff / 1000);
    int64_t cur = atomic_fetch_add(&d->tokens_ns, add) + add;
    while (cur > GP_BURST_NS && !atomic_compare_exchange_weak(&d->tokens_ns, &cur, GP_BURST_NS)) {
    }
}

/* ---------------------------------------------------------------- a launch */

struct gp_ticket gp_pace_before(CUstream s, int per_thread) {
    struct gp_ticket none = {NULL, 0};
    if (!g_region || !P.cuEventCreate || !P.cuCtxGetCurrent) return none;
    CUdevice dev;
    int di = gp_current_dev(&dev);
    if (di < 0) return none;
    if (g_slot >= 0) atomic_fetch_add(&g_region->slot[g_slot].launches[di], 1);
    struct gp_device *lim = &g_region->dev[di];
    struct gp_bucket *d = &g_region->bucket[di];
    uint32_t eff = effective_share(lim);
    if (eff >= 1000 || gp_capture_forbids_pacing(s, per_thread)) return none;
    CUcontext ctx = NULL;
    P.cuCtxGetCurrent(&ctx);
    uint64_t now = gp_mono_ns();
    pthread_mutex_lock(&g_pace_lock);
    struct gp_track *t = track_for(ctx, gp_stream_key(s, per_thread), gp_real_stream(s, per_thread), di);
    settle(t, 0);
    int64_t gap = 2 * t->launch_ns > GP_GAP_MIN_NS ? 2 * t->launch_ns : GP_GAP_MIN_NS;
    if (t->tail && t->n == 0 && t->launch_ns && (int64_t)(now - t->last_launch_ns) > gap)
        close_tail(t); /* the host paused: the tail ran, the stream went idle */
    int64_t cap = t->span_ns > 0 ? GP_INFLIGHT_NS / t->span_ns : GP_INFLIGHT_MIN;
    if (cap < GP_INFLIGHT_MIN) cap = GP_INFLIGHT_MIN;
    if (cap > GP_RING / 2) cap = GP_RING / 2;
    uint64_t gen = t->gen;
    while (t->gen == gen && pending_ends(t) >= cap) { /* waited for without the lock */
        CUevent oldest = t->ring[t->head].e;
        pthread_mutex_unlock(&g_pace_lock);
        P.cuEventSynchronize(oldest);
        pthread_mutex_lock(&g_pace_lock);
        if (t->gen == gen) settle(t, 0);
    }
    pthread_mutex_unlock(&g_pace_lock);
    bucket_refill(d, eff, now);
    for (;;) {
        int64_t tok = atomic_load(&d->tokens_ns);
        if (tok >= 0) break;
        int64_t wait = -tok * 1000 / (int64_t)eff;
        if (wait > GP_MAX_SLEEP_NS) wait = GP_MAX_SLEEP_NS;
        if (wait < 50000) wait = 50000;
        struct timespec ts = {wait / 1000000000ll, wait % 1000000000ll};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_pace_lock);
        if (t->gen == gen) settle(t, 0);
        pthread_mutex_unlock(&g_pace_lock);
        eff = effective_share(lim);
        if (eff >= 1000) break;
        now = gp_mono_ns();
        bucket_refill(d, eff, now);
    }
    pthread_mutex_lock(&g_pace_lock);
    if (t->gen == gen && t->n == 0 && t->tail == 0) push(t, 0, now); /* idle: a span starts */
    pthread_mutex_unlock(&g_pace_lock);
    return (struct gp_ticket){t, gen};
}

void gp_pace_after(struct gp_ticket k, CUresult rc) {
    struct gp_track *t = k.t;
    if (!t || rc != CUDA_SUCCESS) return;
    uint64_t now = gp_mono_ns();
    pthread_mutex_lock(&g_pace_lock);
    if (t->used && t->gen == k.gen) {
        t->tail++;
        t->last_launch_ns = now;
        /* Sampled: an event once the tail is worth about GP_SAMPLE_NS (host or device time). */
        if (!t->launch_ns || (int64_t)(now - t->last_record_ns) >= GP_SAMPLE_NS ||
            t->launch_ns * (int64_t)t->tail >= GP_SAMPLE_NS) {
            push(t, t->tail, now);
            t->tail = 0;
        }
    }
    pthread_mutex_unlock(&g_pace_lock);
}
