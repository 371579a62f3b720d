"""Simulated GPUs: devices from a spec, telemetry derived from the jobs placed on them.

Used by ``gpupool up`` on machines without an NVIDIA driver, by tests and benchmarks, and by
anyone who wants to try gpupool on a laptop. Nothing else in gpupool knows whether a device is
simulated: the agent, scheduler and server see the same ``DeviceInfo`` and ``Telemetry``.

**Spec** (``--simulate``): comma-separated ``COUNTxMODEL`` items, e.g. ``4xA100-80GB,2xT4``
(``A100`` alone means one). Models come from :mod:`gpupool.gpu.models`. A YAML file (a path
ending in ``.yaml``/``.yml``) may list devices and invent models::

    seed: 7
    devices:
      - {model: A100-80GB, count: 4}
      - {name: "Lab GPU", memory: 24GiB, sm_count: 48, tdp_w: 200, count: 2}
      - {model: H200, count: 1, context_reserve: 600MiB}

``context_reserve`` is what one process holds on the device beyond its slice (a real agent
measures it, :mod:`gpupool.gpu.context`); the agent reports it to the server, which keeps that
much headroom per replica whose isolation leaves the context outside its slice. Unset, the
agent reports none and the server assumes its default.

**Telemetry**: each placed job contributes its declared :class:`SyntheticLoad` or, by default,
``DEFAULT_UTILIZATION`` of its compute share and ``DEFAULT_MEMORY_FILL`` of its memory slice.
Temperature and power rise linearly with utilisation from the model's idle figures towards its
slowdown temperature and TDP. A little noise makes charts look alive; it is drawn from a
generator seeded by ``(seed, device, sample number)``, so the same seed and the same workloads
give the same samples. A job declares a load with the environment variable ``SIMGPU_LOAD``
(``util=0.7,mem=4GiB``), parsed by :func:`parse_synthetic_load`.
"""

from __future__ import annotations

import random
import re
import threading
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.domain.errors import InvalidValue
from gpupool.domain.units import MILLI_PER_GPU, parse_memory
from gpupool.gpu.base import (
    DeviceInfo,
    DeviceSample,
    ProcessUsage,
    SyntheticLoad,
    Telemetry,
    Workload,
    XidEvent,
)
from gpupool.gpu.models import GpuModel, lookup_model

#: Share of a job's compute slice a job without a declared load keeps busy.
DEFAULT_UTILIZATION = 0.9
#: Share of a job's memory slice a job without a declared load fills.
DEFAULT_MEMORY_FILL = 0.8
#: Environment variable through which a job declares its synthetic load.
LOAD_ENV = "SIMGPU_LOAD"
_NOISE = 0.02
_NAMESPACE = uuidlib.UUID("6f1c7a8e-3b1d-4c55-9e3a-6a0b9d2f4e11")
_SXM_FAMILIES = ("a100", "h100", "h200", "v100")
_ITEM_RE = re.compile(
    r"^\s*(?:(?P<count>\d+)\s*[xX*]\s*)?(?P<model>[A-Za-z0-9][A-Za-z0-9._-]*)\s*$"
)


@dataclass(frozen=True)
class SimDeviceSpec:
    """One simulated device: its model and whether it joins its group's NVLink mesh."""

    model: GpuModel
    nvlink_group: int | None = None
    context_reserve_mib: int | None = None  # what one process holds beyond its slice, if said


def parse_simulate_spec(text: str) -> tuple[SimDeviceSpec, ...]:
    """``4xA100-80GB,2xT4`` -> six device specs. SXM cards of one item share an NVLink group."""
    specs: list[SimDeviceSpec] = []
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise InvalidValue(
            "simulate spec is empty: give devices like 4xA100-80GB,2xT4", field="simulate"
        )
    for group, item in enumerate(items):
        match = _ITEM_RE.match(item)
        if match is None:
            raise InvalidValue(
                f"{item.strip()!r} is not a device item: write COUNTxMODEL, like 4xA100-80GB",
                field="simulate",
            )
        count = int(match.group("count") or 1)
        if not 1 <= count <= 64:
            raise InvalidValue(
                f"{item.strip()!r}: a simulated node takes 1 to 64 devices per item",
                field="simulate",
            )
        model = lookup_model(match.group("model"))
        nvlink = group if model.name.lower().startswith(_SXM_FAMILIES) and count > 1 else None
        specs.extend(SimDeviceSpec(model, nvlink) for _ in range(count))
    return tuple(specs)


def _model_from_yaml(entry: dict[str, Any], where: str) -> GpuModel:
    if "model" in entry:
        return lookup_model(str(entry["model"]))
    try:
        name = str(entry["name"])
        memory = parse_memory(entry["memory"], field=f"{where}.memory")
    except KeyError as exc:
        raise InvalidValue(
            f"{where}: give either 'model' (a known model) or 'name' and 'memory'",
            field="simulate",
        ) from exc
    cc = entry.get("compute_capability", (8, 0))
    return GpuModel(
        name=name,
        full_name=name,
        memory_mib=memory,
        sm_count=int(entry.get("sm_count", 80)),
        tdp_w=float(entry.get("tdp_w", 250.0)),
        compute_capability=(int(cc[0]), int(cc[1])),
        slowdown_temp_c=float(entry.get("slowdown_temp_c", 87.0)),
    )


def load_simulate_yaml(path: Path) -> tuple[tuple[SimDeviceSpec, ...], int | None]:
    """Device specs and the seed (``None`` when the file has none) from a YAML file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidValue(f"cannot read {path}: {exc.strerror}", field="simulate") from None
    except yaml.YAMLError as exc:
        raise InvalidValue(f"{path} is not valid YAML: {exc}", field="simulate") from None
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        raise InvalidValue(f"{path}: expected a mapping with a 'devices' list", field="simulate")
    specs: list[SimDeviceSpec] = []
    for i, entry in enumerate(data["devices"]):
        where = f"{path}: devices[{i}]"
        if not isinstance(entry, dict):
            raise InvalidValue(f"{where} is not a mapping", field="simulate")
        model = _model_from_yaml(entry, where)
        count = int(entry.get("count", 1))
        nvlink = (
            i
            if entry.get("nvlink", count > 1 and model.name.lower().startswith(_SXM_FAMILIES))
            else None
        )
        reserve = (
            parse_memory(entry["context_reserve"], field=f"{where}.context_reserve")
            if "context_reserve" in entry
            else None
        )
        specs.extend(SimDeviceSpec(model, nvlink, reserve) for _ in range(count))
    seed = data.get("seed")
    return tuple(specs), None if seed is None else int(seed)


def parse_synthetic_load(text: str) -> SyntheticLoad:
    """``util=0.7,mem=4GiB`` -> ``SyntheticLoad(0.7, 4096)``. Either key may be left out."""
    util: float | None = None
    mem: int | None = None
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, _, value = part.partition("=")
        key = key.strip().lower()
        if key in ("util", "utilization"):
            try:
                util = float(value)
            except ValueError:
                util = -1.0
            if not 0.0 <= util <= 1.0:
                raise InvalidValue(
                    f"{LOAD_ENV}: util {value!r} is not a ratio: use 0..1, like util=0.7",
                    field=LOAD_ENV,
                )
        elif key in ("mem", "memory"):
            mem = parse_memory(value, field=f"{LOAD_ENV} mem")
        else:
            raise InvalidValue(
                f"{LOAD_ENV}: unknown key {key!r}: use util=RATIO and mem=SIZE", field=LOAD_ENV
            )
    return SyntheticLoad(util, mem)


class SimulatedBackend:
    """Simulated devices of one node. Thread-safe: the agent samples while it places jobs."""

    name = "simulated"

    def __init__(self, specs: Sequence[SimDeviceSpec], *, node: str, seed: int = 0) -> None:
        if not specs:
            raise InvalidValue("a simulated node needs at least one device", field="simulate")
        self._seed = seed
        self._lock = threading.Lock()
        self._workloads: tuple[Workload, ...] = ()
        self._samples = 0
        self._lost: set[str] = set()
        self._pending_xids: list[XidEvent] = []
        infos: list[DeviceInfo] = []
        for index, spec in enumerate(specs):
            uid = uuidlib.uuid5(_NAMESPACE, f"{node}/{seed}/{index}/{spec.model.name}")
            infos.append(
                DeviceInfo(
                    uuid=f"GPU-{uid}",
                    index=index,
                    name=spec.model.full_name,
                    memory_mib=spec.model.memory_mib,
                    compute_capability=spec.model.compute_capability,
                    pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
                    context_reserve_mib=spec.context_reserve_mib,
                    sm_count=spec.model.sm_count,
                    power_limit_w=spec.model.tdp_w,
                    slowdown_temp_c=spec.model.slowdown_temp_c,
                    mig_enabled=False if spec.model.mig_capable else None,
                )
            )
        groups: dict[int, list[str]] = {}
        for info, spec in zip(infos, specs, strict=True):
            if spec.nvlink_group is not None:
                groups.setdefault(spec.nvlink_group, []).append(info.uuid)
        self._models = {info.uuid: spec.model for info, spec in zip(infos, specs, strict=True)}
        self._inventory = tuple(
            _with_peers(
                info, groups.get(spec.nvlink_group, []) if spec.nvlink_group is not None else []
            )
            for info, spec in zip(infos, specs, strict=True)
        )

    @classmethod
    def from_spec(cls, text: str, *, node: str, seed: int = 0) -> SimulatedBackend:
        """From ``--simulate`` text: a device spec or the path of a YAML file."""
        if text.strip().lower().endswith((".yaml", ".yml")):
            specs, file_seed = load_simulate_yaml(Path(text.strip()))
            return cls(specs, node=node, seed=seed if file_seed is None else file_seed)
        return cls(parse_simulate_spec(text), node=node, seed=seed)

    # -- GpuBackend

    def inventory(self) -> tuple[DeviceInfo, ...]:
        return self._inventory

    def set_workload(self, workloads: Sequence[Workload]) -> None:
        with self._lock:
            self._workloads = tuple(workloads)

    def sample(self) -> Telemetry:
        with self._lock:
            self._samples += 1
            n = self._samples
            workloads = self._workloads
            lost = set(self._lost)
            xids = tuple(self._pending_xids)
            self._pending_xids.clear()
        samples = tuple(
            self._sample_one(info, workloads, n, info.uuid in lost) for info in self._inventory
        )
        return Telemetry(samples, xids)

    def close(self) -> None:
        return None

    # -- fault injection, for tests and demos

    def lose(self, uuid: str) -> None:
        """Make ``uuid`` behave like a GPU that fell off the bus (XID 79)."""
        with self._lock:
            self._lost.add(uuid)
            self._pending_xids.append(XidEvent(uuid, 79))

    def inject_xid(self, uuid: str, xid: int) -> None:
        """Report XID ``xid`` on ``uuid`` at the next sample."""
        with self._lock:
            self._pending_xids.append(XidEvent(uuid, xid))

    # -- internals

    def _sample_one(
        self, info: DeviceInfo, workloads: tuple[Workload, ...], n: int, lost: bool
    ) -> DeviceSample:
        if lost:
            return DeviceSample(uuid=info.uuid, memory_total_mib=info.memory_mib, lost=True)
        model = self._models[info.uuid]
        rng = random.Random(f"{self._seed}/{info.uuid}/{n}")
        util = 0.0
        mem = 0
        processes: list[ProcessUsage] = []
        for w in workloads:
            if info.uuid not in w.device_uuids:
                continue
            load = w.load or SyntheticLoad()
            share = w.milli / MILLI_PER_GPU
            job_util = (
                load.utilization_ratio
                if load.utilization_ratio is not None
                else DEFAULT_UTILIZATION * share
            )
            job_mem = (
                load.memory_mib
                if load.memory_mib is not None
                else int(w.memory_mib * DEFAULT_MEMORY_FILL)
            )
            util += job_util
            mem += job_mem
            if w.pids:
                processes.append(ProcessUsage(w.pids[0], job_mem))
        if util > 0:
            util += rng.uniform(-_NOISE, _NOISE)
        util = min(1.0, max(0.0, util))
        mem = min(info.memory_mib, mem)
        hot = model.slowdown_temp_c - 12.0
        temp = model.idle_temp_c + (hot - model.idle_temp_c) * util + rng.uniform(-0.5, 0.5)
        power = model.idle_power_w + (model.tdp_w - model.idle_power_w) * util
        return DeviceSample(
            uuid=info.uuid,
            memory_total_mib=info.memory_mib,
            utilization_ratio=round(util, 4),
            memory_used_mib=mem,
            temperature_c=round(temp, 1),
            power_w=round(power * (1.0 + rng.uniform(-_NOISE, _NOISE)), 1),
            sm_clock_mhz=model.sm_clock_mhz if util > 0 else 210,
            memory_clock_mhz=model.memory_clock_mhz,
            processes=tuple(processes),
        )


def _with_peers(info: DeviceInfo, group: list[str]) -> DeviceInfo:
    peers = tuple(u for u in group if u != info.uuid)
    if not peers:
        return info
    return replace(info, nvlink_peers=peers)
