"""Submit-time admission: refuse what no node of the pool could ever hold.

Slurm refuses such a job at ``sbatch`` ("Requested node configuration is not available")
instead of letting it pend forever. gpupool does the same at submit: a job whose replica asks
for more than any node of its pool has, even with nothing running, is refused with the limit
that fails (the card's 80GiB, not the CPUs) and how to queue it anyway.

Words:

- **envelope** of a pool: what each of its nodes has when empty, up or down (a down node may
  come back): CPUs, host memory, and the model and promisable memory (physical memory times the
  pool's ``memory_overcommit``) of each of its devices in the pool, healthy or not. A node
  without any GPU counts for CPU-only jobs of the default pool, as in the scheduler.
- **queue anyway**: the submit's ``queue_anyway`` flag (``gpupool submit --queue-anyway``):
  the job is stored even though nothing can hold it now, for nodes yet to join; it pends with
  the scheduler's ``TooLarge`` or ``NoDeviceOfType`` reason until one does.

The rules follow the scheduler's: a replica's GPUs come from one node and are of one model,
and a replica of more than one GPU never counts MIG instances (CUDA gives a process one MIG
instance however many it is shown, so two would be one); the replicas of a gang may spread
over nodes, so a gang is refused only when the whole pool, empty, could not hold all its
replicas at once. A pool with no node yet takes any job: there is nothing to judge it by.

Envelopes are cached per control plane for ``catalog_cache_s`` (the same freshness as the
names submits are checked against) and dropped at once when a node registers or is deleted
in this process, so the hot submit path reads the store for them once per interval.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.domain.containers import registry_allowed
from gpupool.domain.jobs import JobSpec
from gpupool.domain.nodes import allowed_model, is_mig_model
from gpupool.domain.pools import DEFAULT_POOL
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.units import MILLI_PER_GPU, format_cpus, format_memory
from gpupool.store.models import DeviceModel, NodeModel, PoolModel

#: How to get past a refusal, appended to every one.
QUEUE_ANYWAY = (
    'ask for less, or submit it with --queue-anyway (API: "queue_anyway": true) to queue it '
    "for nodes yet to join"
)

_MANY = 1 << 62  # "no limit" for a resource a replica does not ask for


@dataclass(frozen=True)
class NodeRoom:
    """One node of a pool when empty: milli-CPU, host MiB, and its devices in the pool as
    ``(model, physical MiB, promisable MiB)``."""

    name: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[tuple[str, int, int], ...]
    engines: tuple[str, ...] = ()  # container engines it registered with


@dataclass(frozen=True)
class PoolEnvelope:
    """What the nodes of ``pool`` have when empty (see the module docstring)."""

    pool: str
    nodes: tuple[NodeRoom, ...]  # nodes with a device in the pool
    cpu_only: tuple[NodeRoom, ...] = ()  # GPU-less nodes (default pool only)
    default_engine: str | None = None  # the pool's container_engine
    registries: tuple[str, ...] = ()  # the pool's image_registries (empty: any)
    # (request, replicas) -> refusal: the tasks of an array share one answer.
    _memo: dict[tuple[ResourceRequest, int], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def refusal(self, spec: JobSpec) -> str | None:
        """Why no node of the pool could ever hold ``spec``; ``None`` when one could."""
        engine = self.engine_refusal(spec)
        if engine is not None:
            return engine
        key = (spec.resources, spec.replicas)
        if key not in self._memo:
            self._memo[key] = self._refusal(spec)
        return self._memo[key]

    def image_refusal(self, spec: JobSpec) -> str | None:
        """Why the pool refuses the job's image (its registry is not on the pool's
        allowlist); ``None`` when it takes it. Not waived by ``queue_anyway``."""
        c = spec.container
        if c is None or registry_allowed(c.image, self.registries):
            return None
        return (
            f"image {c.image} comes from registry {c.registry}, which pool {self.pool} does not "
            f"allow (its image_registries: {', '.join(self.registries)}): use an image from one "
            f"of them, or ask an admin to allow it (gpupool pools set {self.pool} "
            f"--image-registry {c.registry})"
        )

    def engine_refusal(self, spec: JobSpec) -> str | None:
        """Why no node of the pool could run the job's container engine; ``None`` when one
        could (or the job runs no container, or the pool has no node yet)."""
        c = spec.container
        nodes = self.nodes + self.cpu_only
        if c is None or not nodes:
            return None
        engine = c.engine or self.default_engine
        have = sorted({e for n in nodes for e in n.engines})
        if (engine in have) if engine is not None else bool(have):
            return None
        what = f"container engine {engine}" if engine else "a container engine"
        return (
            f"no node of pool {self.pool} has {what} for image {c.image} (its nodes have "
            f"{', '.join(have) or 'none'}; gpupool precheck on a node says what is missing): "
            + (
                f"choose another with --container-engine, or {QUEUE_ANYWAY}"
                if have
                else QUEUE_ANYWAY
            )
        )

    def _refusal(self, spec: JobSpec) -> str | None:
        r = spec.resources
        count = r.device_count
        nodes = self.nodes if count else self.nodes + self.cpu_only
        if not nodes:
            return None
        where = f"pool {self.pool}"
        if count:
            models = sorted({m for n in nodes for m, _, _ in n.devices})
            allowed = [m for m in models if allowed_model(m, r.gpu_types)]
            if not allowed:
                return (
                    f"no node of {where} has a GPU of type {'|'.join(r.gpu_types)} (it has "
                    f"{', '.join(models)}): allow another type, use another pool, or submit it "
                    'with --queue-anyway (API: "queue_anyway": true) to queue it for nodes yet '
                    "to join"
                )
            need = r.gpu_memory_mib
            if need is not None:
                cards = [(p, m, physical) for n in nodes for m, physical, p in n.devices]
                biggest = max((c for c in cards if c[1] in allowed), key=lambda c: c[0])
                if need > biggest[0]:
                    card = format_memory(biggest[2])
                    if biggest[0] != biggest[2]:
                        card += f", {format_memory(biggest[0])} with the pool's overcommit"
                    return (
                        f"{format_memory(need)} of GPU memory per GPU is more than any card of "
                        f"{where} has (the largest: {biggest[1]} with {card}): {QUEUE_ANYWAY}"
                    )
            most = max(_gpus_of_one_model(n, r.gpu_types, need, count) for n in nodes)
            if count > most:
                mig = any(is_mig_model(m) for m in allowed)
                return (
                    f"{count} GPUs per replica is more than any node of {where} has (at most "
                    f"{most} of one model{_types(r.gpu_types)}"
                    + (
                        "; MIG instances do not count: CUDA gives a process one MIG instance, "
                        "so a replica of several GPUs needs whole GPUs"
                        if mig
                        else ""
                    )
                    + f"): {QUEUE_ANYWAY}"
                )
        most_cpu = max(n.cpu_milli for n in nodes)
        if r.cpu_milli > most_cpu:
            return (
                f"{format_cpus(r.cpu_milli)} CPUs per replica is more than any node of {where} "
                f"has (at most {format_cpus(most_cpu)}): {QUEUE_ANYWAY}"
            )
        most_mem = max(n.memory_mib for n in nodes)
        if r.host_memory_mib > most_mem:
            return (
                f"{format_memory(r.host_memory_mib)} of host memory per replica is more than "
                f"any node of {where} has (at most {format_memory(most_mem)}): {QUEUE_ANYWAY}"
            )
        held = [_replicas_on(n, spec) for n in nodes]
        if max(held) == 0:
            return (
                f"no node of {where} has the GPUs, CPUs and host memory one replica asks for "
                f"together ({_ask(spec)}), though each alone fits some node: {QUEUE_ANYWAY}"
            )
        if spec.replicas > 1 and sum(held) < spec.replicas:
            return (
                f"the {spec.replicas} replicas of this gang ({_ask(spec)} each) start all at "
                f"once, but {where} holds at most {sum(held)} of them even when empty: "
                f"{QUEUE_ANYWAY}"
            )
        return None


def _types(gpu_types: tuple[str, ...]) -> str:
    return f" of type {'|'.join(gpu_types)}" if gpu_types else ""


def _ask(spec: JobSpec) -> str:
    r = spec.resources
    parts = []
    if r.device_count:
        parts.append(f"{r.device_count} GPU{'s' if r.device_count > 1 else ''}")
    parts.append(f"{format_cpus(r.cpu_milli)} CPUs")
    if r.host_memory_mib:
        parts.append(f"{format_memory(r.host_memory_mib)} host memory")
    return ", ".join(parts)


def _fitting(node: NodeRoom, gpu_types: tuple[str, ...], need: int | None, count: int) -> list[str]:
    """Models of the node's devices that could take one GPU of a request for ``count`` GPUs
    (MIG instances only when ``count`` is 1, as the scheduler's capacity mask has it)."""
    return [
        m
        for m, _, promisable in node.devices
        if allowed_model(m, gpu_types)
        and (need is None or need <= promisable)
        and (count <= 1 or not is_mig_model(m))
    ]


def _gpus_of_one_model(
    node: NodeRoom, gpu_types: tuple[str, ...], need: int | None, count: int
) -> int:
    counts = Counter(_fitting(node, gpu_types, need, count))
    return max(counts.values(), default=0)


def _replicas_on(node: NodeRoom, spec: JobSpec) -> int:
    """How many replicas of ``spec`` the empty ``node`` holds at once."""
    r = spec.resources
    by_cpu = node.cpu_milli // r.cpu_milli if r.cpu_milli > 0 else _MANY
    by_mem = node.memory_mib // r.host_memory_mib if r.host_memory_mib > 0 else _MANY
    count = r.device_count
    if count == 0:
        by_gpu = _MANY
    elif count == 1 and r.milli_per_device < MILLI_PER_GPU:
        by_gpu = 0
        share = MILLI_PER_GPU // r.milli_per_device
        for m, _, promisable in node.devices:
            if not allowed_model(m, r.gpu_types):
                continue
            need = r.gpu_memory_mib
            by_gpu += min(share, promisable // need) if need else share
    else:
        counts = Counter(_fitting(node, r.gpu_types, r.gpu_memory_mib, count))
        by_gpu = sum(c // count for c in counts.values())
    return int(min(by_cpu, by_mem, by_gpu))


def load_envelope(s: Session, pool: str) -> PoolEnvelope:
    """Read ``pool``'s envelope from the store."""
    row = s.get(PoolModel, pool)
    overcommit = row.memory_overcommit if row is not None else 1.0
    engine = row.container_engine if row is not None else None
    registries = tuple(row.image_registries or ()) if row is not None else ()
    devices: dict[str, list[tuple[str, int, int]]] = {}
    for node, model, mib in s.execute(
        select(DeviceModel.node, DeviceModel.model, DeviceModel.memory_mib).where(
            DeviceModel.pool == pool
        )
    ):
        devices.setdefault(node, []).append((model, mib, int(mib * overcommit)))
    with_gpus: list[NodeRoom] = []
    without: list[NodeRoom] = []
    gpu_nodes = set(s.scalars(select(DeviceModel.node).distinct()))
    for name, cpu, mem, engines in s.execute(
        select(
            NodeModel.name, NodeModel.cpu_milli, NodeModel.memory_mib, NodeModel.container_engines
        ).order_by(NodeModel.name)
    ):
        have = tuple(engines or ())
        if name in devices:
            with_gpus.append(NodeRoom(name, cpu, mem, tuple(devices[name]), have))
        elif pool == DEFAULT_POOL and name not in gpu_nodes:
            without.append(NodeRoom(name, cpu, mem, (), have))
    return PoolEnvelope(pool, tuple(with_gpus), tuple(without), engine, registries)


class EnvelopeCache:
    """Envelopes per pool for ``ttl_s`` seconds of the control plane's clock."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self._lock = threading.Lock()
        self._found: dict[str, tuple[float, PoolEnvelope]] = {}

    def get(self, s: Session, pool: str) -> PoolEnvelope:
        now = self.cp.clock.monotonic()
        with self._lock:
            hit = self._found.get(pool)
        if hit is not None and now - hit[0] < self.cp.settings.catalog_cache_s:
            return hit[1]
        envelope = load_envelope(s, pool)
        with self._lock:
            self._found[pool] = (now, envelope)
        return envelope

    def invalidate(self) -> None:
        with self._lock:
            self._found.clear()


_caches: weakref.WeakKeyDictionary[ControlPlane, EnvelopeCache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def envelopes(cp: ControlPlane) -> EnvelopeCache:
    """The envelope cache of ``cp`` (one per control plane)."""
    with _caches_lock:
        found = _caches.get(cp)
        if found is None:
            found = EnvelopeCache(cp)
            _caches[cp] = found
        return found
