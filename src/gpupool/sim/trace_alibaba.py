"""The Alibaba GPU trace v2023 as a timed workload, and its node list as a cluster.

The raw readers are :mod:`gpupool.sim.alibaba`; this module adds what a replay needs.

- **arrival** is the pod's ``creation_time``; **work** is ``deletion_time - scheduled_time``
  for pods that ran. Pods with no ``scheduled_time`` never ran in the real cluster and are left
  out (counted in ``Workload.skipped["never ran"]``). Pods still running at the end of the
  trace carry the trace's end as their deletion time, so their work is cut there.
- **qos** maps to a priority class (:data:`QOS_PRIORITY`): latency-sensitive and guaranteed
  pods are ``high`` and not preemptible; ``Burstable`` is ``normal``; best-effort (``BE``) is
  ``low`` and preemptible. A pod with no qos is ``normal``.
- **tenant**: the trace has none, so each pod gets one of ``tenants`` teams from a hash of the
  seed and its name: the same seed always gives the same teams.
- **time scale**: submit times are divided by ``time_scale`` (work is kept), which raises the
  load by that factor without changing the mix; 1 replays the trace as it was.

The replay needs the three time columns: a pod list without them is refused with the file,
line 1 and the column, and a pod whose deletion comes before its scheduling with its line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpupool.domain.nodes import Device, Node
from gpupool.sim.alibaba import TraceFormatError, read_nodes, read_pods
from gpupool.sim.workload import SimCluster, TraceJob, Workload, trace_name

TIME_COLUMNS = ("creation_time", "scheduled_time", "deletion_time")

#: qos -> (priority class, preemptible)
QOS_PRIORITY: dict[str, tuple[str, bool]] = {
    "LS": ("high", False),
    "Guaranteed": ("high", False),
    "Burstable": ("normal", False),
    "BE": ("low", True),
}

#: GPU memory of the trace's models, in MiB. G1-G3 are undisclosed internal types; they are
#: given 32 GiB. The pods ask for shares, not memory, so this only matters for reports.
MODEL_MEMORY_MIB: dict[str, int] = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
}
UNKNOWN_MODEL_MEMORY_MIB = 32768


def alibaba_cluster(path: Path | str) -> SimCluster:
    """The machines of a node list, as domain nodes and devices (``<node>/gpu<i>``)."""
    path = Path(path)
    nodes: list[Node] = []
    devices: list[Device] = []
    for rec in read_nodes(path):
        nodes.append(Node(rec.name, cpu_milli=rec.cpu_milli, memory_mib=rec.memory_mib))
        model = rec.model or ""
        memory = MODEL_MEMORY_MIB.get(model, UNKNOWN_MODEL_MEMORY_MIB)
        devices.extend(
            Device(
                uuid=f"{rec.name}/gpu{i}", node=rec.name, index=i, model=model, memory_mib=memory
            )
            for i in range(rec.gpu_count)
        )
    return SimCluster(path.name, tuple(nodes), tuple(devices))


def tenant_of(name: str, tenants: int, seed: int) -> str:
    """The team a pod is assigned to: stable across runs and Python versions."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return f"team-{int.from_bytes(digest, 'big') % tenants:02d}"


def alibaba_workload(
    path: Path | str, *, tenants: int = 4, seed: int = 0, time_scale: float = 1.0
) -> Workload:
    """Read a pod list with times into a workload (see the module docstring)."""
    path = Path(path)
    if tenants < 1:
        raise ValueError("tenants must be at least 1")
    if time_scale <= 0:
        raise ValueError("time_scale must be above 0 (1 replays the trace as it was)")
    pods = read_pods(path)
    header = _header(path)
    for column in TIME_COLUMNS:
        if column not in header:
            raise TraceFormatError(
                path,
                "a replay needs the pods' times: add creation_time, scheduled_time and "
                "deletion_time (seconds from the trace start)",
                line=1,
                column=column,
            )
    jobs: list[TraceJob] = []
    never_ran = 0
    for pod in pods:
        if pod.scheduled_time is None:
            never_ran += 1
            continue
        if pod.creation_time is None or pod.deletion_time is None:
            column = "creation_time" if pod.creation_time is None else "deletion_time"
            raise TraceFormatError(
                path, "a pod that ran needs this time too", line=pod.line, column=column
            )
        if pod.deletion_time < pod.scheduled_time:
            raise TraceFormatError(
                path,
                f"deletion {pod.deletion_time} is before scheduling {pod.scheduled_time}",
                line=pod.line,
                column="deletion_time",
            )
        priority, preemptible = QOS_PRIORITY.get(pod.qos or "", ("normal", False))
        jobs.append(
            TraceJob(
                id=pod.name,
                tenant=tenant_of(pod.name, tenants, seed),
                submit_time=pod.creation_time / time_scale,
                work_s=float(pod.deletion_time - pod.scheduled_time),
                gpu_milli=pod.gpu_milli * pod.num_gpu if pod.num_gpu > 1 else pod.gpu_milli,
                cpu_milli=pod.cpu_milli,
                host_memory_mib=pod.memory_mib,
                gpu_types=pod.gpu_spec or (),
                priority_class=priority,
                preemptible=preemptible,
            )
        )
    name = trace_name(path.name, shares=False, time_scale=time_scale)
    return Workload(name, tuple(jobs), skipped={"never ran": never_ran})


def _header(path: Path) -> set[str]:
    with path.open(encoding="utf-8-sig") as handle:
        first = handle.readline()
    return {h.strip() for h in first.split(",")}
