"""Property tests: invariants of ``schedule()`` over random clusters, tenants and queues.

Each example builds a small random cluster (nodes in one of two pools, one with memory
overcommit), random running jobs that fit it, random quotas that the running jobs respect, and a
random queue (fractions, whole GPUs, gangs, GPU types, priorities, durations), then checks what
the decision may never do.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.scheduling.admission import QuotaLedger
from gpupool.scheduling.capacity import build_capacity
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision, PendingReason, PreemptionReason
from gpupool.scheduling.fit import place_job
from gpupool.scheduling.placement.base import Choice, Shape
from gpupool.scheduling.placement.registry import make_policy
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica
from tests.scheduling.builders import SnapshotBuilder, uuid

NOW = 10_000.0
TENANTS = ("ta", "tb", "tc")
SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@st.composite
def snapshots(draw: st.DrawFn, *, fill: bool | None = None) -> ClusterSnapshot:
    """A random snapshot; ``fill`` (drawn when ``None``) fills every free device with a job."""
    b = SnapshotBuilder(now=NOW)
    b.pool("default", overcommit=1.0)
    b.pool("p2", overcommit=draw(st.sampled_from([1.0, 1.5, 2.0])), placement="spread")
    n_nodes = draw(st.integers(1, 4))
    free: dict[tuple[str, int], list[int]] = {}  # device -> [milli, memory]
    node_pool: dict[str, str] = {}
    node_cpu: dict[str, int] = {}
    for i in range(n_nodes):
        name = f"n{i}"
        gpus = draw(st.integers(1, 4))
        model, mem = draw(st.sampled_from([("A100", 40960), ("T4", 16384)]))
        pool = draw(st.sampled_from(["default", "p2"]))
        cpus = draw(st.integers(2, 16))
        nvlink = [draw(st.sampled_from([None, 0, 1])) for _ in range(gpus)]
        b.node(name, gpus=gpus, model=model, memory_mib=mem, cpus=cpus, pool=pool, nvlink=nvlink)
        ratio = b.pools[pool].memory_overcommit
        node_pool[name] = pool
        node_cpu[name] = cpus
        for g in range(gpus):
            free[(name, g)] = [1000, int(mem * ratio)]
    use: dict[tuple[str, str], int] = defaultdict(int)
    for r in range(draw(st.integers(0, 12))):
        name = f"n{draw(st.integers(0, n_nodes - 1))}"
        gpus = [g for (n, g) in free if n == name]
        count = draw(st.integers(1, len(gpus)))
        devs = sorted(draw(st.permutations(gpus))[:count])
        milli = 1000 if count > 1 else draw(st.sampled_from([250, 500, 1000]))
        memory = draw(st.sampled_from([2048, 4096, 8192]))
        if node_cpu[name] < 1 or any(
            free[(name, g)][0] < milli or free[(name, g)][1] < memory for g in devs
        ):
            continue
        node_cpu[name] -= 1
        for g in devs:
            free[(name, g)][0] -= milli
            free[(name, g)][1] -= memory
        tenant = draw(st.sampled_from(TENANTS))
        pool = node_pool[name]
        use[(tenant, pool)] += milli * count
        b.run(
            f"r{r}",
            node=name,
            devices=devs,
            milli=milli,
            memory=memory,
            tenant=tenant,
            pool=pool,
            priority=draw(st.sampled_from([100, 500, 900])),
            preemptible=draw(st.booleans()),
            start=draw(st.sampled_from([0.0, NOW - 100, NOW - 1000])),
            expected_end=draw(st.sampled_from([None, NOW + 500, NOW + 2000, NOW + 8000])),
            checkpoint=draw(st.sampled_from([None, NOW - 50])),
        )
    if fill is None:
        fill = draw(st.booleans())
    if fill:
        for (name, g), (milli, memory) in sorted(free.items()):
            if milli == 0 or memory == 0 or node_cpu[name] < 1:
                continue
            node_cpu[name] -= 1
            tenant = draw(st.sampled_from(TENANTS))
            use[(tenant, node_pool[name])] += milli
            b.run(
                f"f-{name}-{g}",
                node=name,
                devices=[g],
                milli=milli,
                memory=memory,
                tenant=tenant,
                pool=node_pool[name],
                priority=draw(st.sampled_from([100, 500, 900])),
                preemptible=draw(st.booleans()),
                start=draw(st.sampled_from([0.0, NOW - 100, NOW - 1000])),
                expected_end=draw(st.sampled_from([None, NOW + 500, NOW + 2000])),
            )
    for tenant in TENANTS:
        if draw(st.booleans()):
            held = use[(tenant, "default")]
            guaranteed = draw(st.sampled_from([0, 500, 1000, 2000]))
            limit = draw(st.sampled_from([None, 0, 1000, 3000]))
            if limit is not None:
                limit = max(limit, guaranteed, held)
            b.quota(tenant, guaranteed=guaranteed, limit=limit)
    for j in range(draw(st.integers(1, 8))):
        gpus = draw(st.sampled_from([0, 250, 500, 1000, 2000]))
        b.job(
            f"j{j}",
            milli=gpus,
            memory=draw(st.sampled_from([None, 4096, 12288])) if gpus else None,
            gpu_types=draw(st.sampled_from([(), ("T4",), ("A100", "T4")])) if gpus else (),
            cpus=draw(st.integers(1, 3)),
            tenant=draw(st.sampled_from(TENANTS)),
            pool=draw(st.sampled_from(["default", "default", "p2", "nowhere"])),
            priority=draw(st.sampled_from([100, 500, 900])),
            replicas=draw(st.integers(1, 3)),
            preemptible=draw(st.booleans()),
            submit=float(draw(st.integers(0, 9000))),
            expected=draw(st.sampled_from([None, 300.0, 1500.0, 9000.0])),
        )
    return b.build()


def configs() -> st.SearchStrategy[SchedulerConfig]:
    return st.builds(
        SchedulerConfig,
        backfill=st.sampled_from(["easy", "strict", "greedy"]),
        preempt_exempt_s=st.sampled_from([0.0, 300.0]),
        preemption_enabled=st.booleans(),
    )


def _device_use(snap: ClusterSnapshot, d: Decision) -> dict[str, list[int]]:
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in snap.running:
        for dev in r.devices:
            used[dev][0] += r.milli_per_device
            used[dev][1] += r.memory_per_device_mib
    for s in d.starts:
        for rep in s.replicas:
            for dev in rep.devices:
                used[dev][0] += rep.milli_per_device
                used[dev][1] += rep.memory_per_device_mib
    return used


@SETTINGS
@given(snapshots(), configs())
def test_no_device_or_node_is_ever_over_capacity(snap: ClusterSnapshot, config: SchedulerConfig):
    d = schedule(snap, config)
    pools = snap.pool_by_name
    used = _device_use(snap, d)
    for dev in snap.devices:
        milli, mem = used.get(dev.uuid, [0, 0])
        assert milli <= 1000, dev.uuid
        assert mem <= int(dev.memory_mib * pools[dev.pool].memory_overcommit), dev.uuid
    cpu: dict[str, int] = defaultdict(int)
    for r in snap.running:
        cpu[r.node] += r.cpu_milli
    for s in d.starts:
        for rep in s.replicas:
            cpu[rep.node] += rep.cpu_milli
            for dev in rep.devices:
                assert snap.pool_by_name[s.pool].name == next(
                    x.pool for x in snap.devices if x.uuid == dev
                )
    for node in snap.nodes:
        assert cpu[node.name] <= node.cpu_milli


@SETTINGS
@given(snapshots(), configs())
def test_every_pending_job_is_started_or_has_a_reason(snap, config):  # type: ignore[no-untyped-def]
    d = schedule(snap, config)
    started = d.started_ids
    for job in snap.pending:
        assert (job.id in started) != (job.id in d.pending), job.id
        assert job.id in d.priorities
        for f in d.priorities[job.id].factors:
            assert 0.0 <= f.value <= 1.0


@SETTINGS
@given(snapshots(), configs())
def test_limits_hold(snap: ClusterSnapshot, config: SchedulerConfig):
    d = schedule(snap, config)
    victims = d.victim_ids
    use: dict[tuple[str, str], int] = defaultdict(int)
    for r in snap.running:
        if r.job_id not in victims:
            use[(r.tenant, r.pool)] += r.gpu_milli
    for s in d.starts:
        use[(s.tenant, s.pool)] += s.gpu_milli
    jobs = {j.id: j for j in snap.pending}
    for preemptor in {p.for_job for p in d.preemptions}:
        job = jobs[preemptor]
        use[(job.tenant, job.spec.pool)] += job.spec.total_gpu_milli
    for q in snap.quotas:
        if q.limit_milli is not None:
            assert use[(q.tenant, q.pool)] <= q.limit_milli, q


@SETTINGS
@given(snapshots(), configs())
def test_gangs_start_whole_or_not_at_all(snap: ClusterSnapshot, config: SchedulerConfig):
    d = schedule(snap, config)
    jobs = {j.id: j for j in snap.pending}
    for s in d.starts:
        spec = jobs[s.job_id].spec
        assert len(s.replicas) == spec.replicas
        assert [r.rank for r in s.replicas] == list(range(spec.replicas))
        for rep in s.replicas:
            assert len(rep.devices) == spec.resources.device_count
            if rep.devices:
                assert rep.milli_per_device == spec.resources.milli_per_device
        if not spec.resources.is_fractional:
            devices = [dev for rep in s.replicas for dev in rep.devices]
            assert len(devices) == len(set(devices))


@SETTINGS
@given(snapshots(fill=True), configs())
def test_every_victim_is_preemptible_and_outranked_or_borrowing(snap, config):  # type: ignore[no-untyped-def]
    d = schedule(snap, config)
    if not d.preemptions:
        return
    borrowing = QuotaLedger(snap)
    jobs = {j.id: j for j in snap.pending}
    for p in d.preemptions:
        replicas = snap.running_by_job[p.victim]
        preemptor = jobs[p.for_job]
        assert all(r.preemptible for r in replicas)
        assert not any(r.stopping for r in replicas)
        assert NOW - replicas[0].start_time >= config.preempt_exempt_s
        victim_priority = max(r.priority for r in replicas)
        if p.reason is PreemptionReason.PRIORITY:
            assert victim_priority < preemptor.priority
        else:
            assert borrowing.is_borrowing(p.victim)
            assert replicas[0].tenant != preemptor.tenant
            assert snap.quota(preemptor.tenant, preemptor.spec.pool) is not None
        assert p.for_job not in d.started_ids
        assert d.pending[p.for_job].reason is PendingReason.WAITING_FOR_PREEMPTION
    assert not (d.victim_ids & {p.for_job for p in d.preemptions})


def _capacity_after(snap: ClusterSnapshot, d: Decision, gone: set[str], ended_starts: set[str]):  # type: ignore[no-untyped-def]
    """Capacity with ``gone`` running jobs removed and the decision's other starts applied."""
    kept = tuple(r for r in snap.running if r.job_id not in gone)
    cap = build_capacity(
        ClusterSnapshot(
            now=snap.now,
            nodes=snap.nodes,
            devices=snap.devices,
            running=kept,
            pools=snap.pools,
        )
    )
    for s in d.starts:
        if s.job_id in ended_starts:
            continue
        for rep in s.replicas:
            slots = tuple(cap.uuid_slot[u][1] for u in rep.devices)
            shape = Shape(
                rep.milli_per_device or 1,
                len(slots),
                rep.memory_per_device_mib,
                rep.cpu_milli,
                rep.host_memory_mib,
            )
            if not slots:
                shape = Shape(1, 0, 0, rep.cpu_milli, rep.host_memory_mib)
            cap.arrays.allocate(shape, Choice(cap.node_row[rep.node], slots))
    return cap


def _places(snap: ClusterSnapshot, cap, job_id: str) -> bool:  # type: ignore[no-untyped-def]
    job = next(j for j in snap.pending if j.id == job_id)
    pool = snap.pool_by_name[job.spec.pool]
    policy = make_policy("bestfit" if pool.placement == "default" else pool.placement)
    view = cap.view(pool.name)
    placed = place_job(
        view, policy, cap.shape_of(job.spec.resources), job.spec.replicas, cap.nodes_of(pool.name)
    )
    return placed is not None


@SETTINGS
@given(snapshots(fill=True), configs())
def test_a_preemption_always_lets_its_job_place(snap: ClusterSnapshot, config: SchedulerConfig):
    d = schedule(snap, config)
    for preemptor in {p.for_job for p in d.preemptions}:
        victims = {p.victim for p in d.preemptions if p.for_job == preemptor}
        assert _places(snap, _capacity_after(snap, d, victims, set()), preemptor)


@SETTINGS
@given(snapshots())
def test_backfill_never_delays_the_reserved_job(snap: ClusterSnapshot):
    config = SchedulerConfig(preemption_enabled=False)
    d = schedule(snap, config)
    jobs = {j.id: j for j in snap.pending}
    for res in d.reservations:
        if res.start_time is None:
            continue
        t = res.start_time
        ended_running = {
            r.job_id for r in snap.running if r.expected_end is not None and r.expected_end <= t
        }
        ended_starts = set()
        for s in d.starts:
            spec = jobs[s.job_id].spec
            duration = spec.expected_duration_s or spec.time_limit_s
            if duration is not None and NOW + duration <= t:
                ended_starts.add(s.job_id)
        cap = _capacity_after(snap, d, ended_running, ended_starts)
        assert _places(snap, cap, res.job_id), res


@SETTINGS
@given(snapshots(), configs())
def test_the_same_snapshot_always_gives_the_same_decision(snap, config):  # type: ignore[no-untyped-def]
    first = schedule(snap, config)
    assert schedule(snap, config) == first
    shuffled = ClusterSnapshot(
        now=snap.now,
        nodes=tuple(reversed(snap.nodes)),
        devices=tuple(reversed(snap.devices)),
        running=tuple(reversed(snap.running)),
        pending=tuple(reversed(snap.pending)),
        pools=snap.pools,
        tenants=snap.tenants,
        quotas=tuple(reversed(snap.quotas)),
        usage=snap.usage,
    )
    assert schedule(shuffled, config) == first


def test_builders_name_devices_by_node_and_index():
    assert uuid("n1", 2) == "n1-gpu2"
    snap = SnapshotBuilder().node("n1", gpus=2).run("r", node="n1", devices=[1]).build()
    (r,) = snap.running
    assert isinstance(r, RunningReplica)
    assert r.devices == ("n1-gpu1",)


@SETTINGS
@given(snapshots(), configs())
def test_unfit_lists_exactly_the_jobs_whose_reason_says_they_fit_nowhere(
    snap: ClusterSnapshot, config: SchedulerConfig
) -> None:
    d = schedule(snap, config)
    never = (PendingReason.TOO_LARGE, PendingReason.NO_DEVICE_OF_TYPE)
    assert d.unfit == tuple(i for i, info in d.pending.items() if info.reason in never)
