"""What a ResourceClaim's allocation gives this node's gpupool devices (pure).

The kube-scheduler writes ``status.allocation.devices.results``: per request, the driver, pool
(our node), device (``gpu-<index>``), a ``shareID`` (one per claim on a shared device) and the
``consumedCapacity`` it charged the device. :func:`claim_devices` keeps this driver's results on
this node and turns the capacities into gpupool's integers (bytes and milli-GPU, STYLE 5):
exactly what the kubelet plugin writes into the claim's shim region.

Quantities are Kubernetes' (``10Gi``, ``500m``, ``1``, ``1.5``, ``2e3``, ``100M``):
:func:`quantity` parses them exactly (``Fraction``), never through a float.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpupool.domain.errors import GpupoolError

_SUFFIXES = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(1 << 10),
    "Mi": Fraction(1 << 20),
    "Gi": Fraction(1 << 30),
    "Ti": Fraction(1 << 40),
    "Pi": Fraction(1 << 50),
    "Ei": Fraction(1 << 60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]+)(?:([eE][+-]?[0-9]+)|([a-zA-Z]*))$")


class ClaimError(GpupoolError):
    """A claim the plugin cannot prepare; the message goes back to the kubelet and the pod."""


def quantity(text: str) -> Fraction:
    """A Kubernetes quantity as an exact number (``10Gi`` -> 10737418240, ``500m`` -> 1/2)."""
    match = _QUANTITY.match(text.strip())
    if match is None or (match.group(3) or "") not in _SUFFIXES:
        raise ClaimError(f"{text!r} is not a Kubernetes quantity (e.g. 10Gi, 500m, 1)")
    number = Fraction(match.group(1))
    if match.group(2):
        return number * Fraction(10) ** int(match.group(2)[1:])
    return number * _SUFFIXES[match.group(3) or ""]


@dataclass(frozen=True)
class ClaimDevice:
    """One device a claim holds on this node: what the region gives its processes.

    ``memory_bytes`` / ``compute_milli`` are the consumed capacity (the whole device when the
    allocation consumed no capacity, i.e. the device is not shared); ``share_id`` ``None`` for
    an unshared allocation.
    """

    request: str
    pool: str
    device: str
    share_id: str | None
    memory_bytes: int | None
    compute_milli: int

    def as_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "pool": self.pool,
            "device": self.device,
            "share_id": self.share_id,
            "memory_bytes": self.memory_bytes,
            "compute_milli": self.compute_milli,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClaimDevice:
        return cls(
            request=str(data["request"]),
            pool=str(data["pool"]),
            device=str(data["device"]),
            share_id=data.get("share_id"),
            memory_bytes=data.get("memory_bytes"),
            compute_milli=int(data["compute_milli"]),
        )


def claim_devices(claim: Mapping[str, Any], *, driver: str, node: str) -> tuple[ClaimDevice, ...]:
    """This driver's devices of ``claim`` on ``node``; raises :class:`ClaimError` when the
    claim is not allocated or holds none of them."""
    meta = claim.get("metadata") or {}
    where = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{where} is not allocated yet: the scheduler allocates it first")
    out = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != driver or result.get("pool") != node:
            continue
        consumed = result.get("consumedCapacity") or {}
        memory = consumed.get("memory")
        compute = consumed.get("compute")
        milli = 1000 if compute is None else int(quantity(str(compute)))  # milli-GPU
        out.append(
            ClaimDevice(
                request=str(result.get("request")),
                pool=node,
                device=str(result.get("device")),
                share_id=result.get("shareID"),
                memory_bytes=None if memory is None else int(quantity(str(memory))),
                compute_milli=max(1, min(1000, milli)),
            )
        )
    if not out:
        raise ClaimError(f"{where} holds no {driver} device on node {node}")
    return tuple(out)
