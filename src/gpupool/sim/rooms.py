"""The ``static`` scenario's private rooms: each team owns its own GPUs, nobody shares.

This is what the seeds start from ("every team buys its own machines"), so that the claim
"pooling raises utilisation" can be measured against it on the same trace and cluster.

Words:

- **room**: the GPUs one team owns. Every room is a pool of its own (``room-1``, ``room-2``,
  ...), so the real scheduler keeps a team's jobs on its room's devices, and one team's queue
  (strict FIFO in ``static``) never blocks another's.
- **shares**: a team's room is its guaranteed share when the workload (or ``--quota``) gives
  guarantees, else an equal part of the cluster. GPUs are counted out by largest remainder
  (shares that do not divide evenly still add up to the cluster), then handed out in two
  passes: first every room takes as many whole machines as its size holds (so a gang that
  fits the room's size fits its machines: a 32-GPU job in a 33-GPU room of 8-GPU machines),
  then the GPUs left (of the machines not taken whole) fill each room's remainder, in device
  order. A team whose share rounds to no GPU has an empty room: its jobs are rejected as
  fitting nowhere, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpupool.domain.nodes import Device
from gpupool.domain.pools import Pool
from gpupool.sim.workload import SimCluster, Workload


@dataclass(frozen=True)
class Rooms:
    """Who owns which GPUs: ``pool_of`` tenant -> pool name, ``devices`` with their pools
    rewritten, ``pools`` every room's pool, ``gpus`` tenant -> GPUs owned."""

    pool_of: dict[str, str]
    devices: tuple[Device, ...]
    pools: tuple[Pool, ...]
    gpus: dict[str, int]


def room_sizes(weights: dict[str, float], gpus: int) -> dict[str, int]:
    """Whole GPUs per tenant in proportion to ``weights``, adding up to ``gpus``.

    Largest remainder: each gets the floor of its exact share, the GPUs left over go to the
    largest fractional parts (ties by name)."""
    total = sum(weights.values())
    if total <= 0:
        weights = dict.fromkeys(weights, 1.0)
        total = float(len(weights))
    exact = {t: gpus * w / total for t, w in weights.items()}
    sizes = {t: int(v) for t, v in exact.items()}
    left = gpus - sum(sizes.values())
    for tenant in sorted(exact, key=lambda t: (-(exact[t] - sizes[t]), t))[:left]:
        sizes[tenant] += 1
    return sizes


def static_rooms(workload: Workload, cluster: SimCluster) -> Rooms:
    """Split ``cluster`` into one room per tenant of ``workload`` (see the module docstring)."""
    tenants = workload.tenant_names
    guaranteed = {q.tenant: float(q.guaranteed_milli) for q in workload.quotas}
    if any(guaranteed.get(t, 0.0) > 0 for t in tenants):
        weights = {t: guaranteed.get(t, 0.0) for t in tenants}
    else:
        weights = dict.fromkeys(tenants, 1.0)
    sizes = room_sizes(weights, cluster.gpu_count)
    pool_of = {t: f"room-{i}" for i, t in enumerate(tenants, start=1)}
    machines: dict[str, list[Device]] = {}
    for device in sorted(cluster.devices, key=lambda d: (d.node, d.index, d.uuid)):
        machines.setdefault(device.node, []).append(device)
    owner: dict[str, str] = {}  # device uuid -> tenant
    left = dict(sizes)
    free = list(machines.values())
    for tenant in tenants:  # pass 1: whole machines
        keep: list[list[Device]] = []
        for machine in free:
            if len(machine) <= left[tenant]:
                owner.update((d.uuid, tenant) for d in machine)
                left[tenant] -= len(machine)
            else:
                keep.append(machine)
        free = keep
    rest = [d for machine in free for d in machine]  # pass 2: the remainders, in order
    at = 0
    for tenant in tenants:
        owner.update((d.uuid, tenant) for d in rest[at : at + left[tenant]])
        at += left[tenant]
    devices = [replace(d, pool=pool_of[owner[d.uuid]]) for d in cluster.devices if d.uuid in owner]
    return Rooms(
        pool_of=pool_of,
        devices=tuple(devices),
        pools=tuple(Pool(name) for name in pool_of.values()),
        gpus=sizes,
    )
