"""The kubelet plugin's work: prepare a claim (its shim region and CDI device), unprepare it.

The kubelet calls ``NodePrepareResources`` before it starts a pod that uses a claim allocated
to this node, and ``NodeUnprepareResources`` after the pod is gone (:mod:`gpupool.kube.grpcapi`
serves both). :class:`ClaimPreparer` does the work:

- **prepare**: read the claim from the API server (the kubelet sends only namespace, name and
  UID; a UID that does not match means the claim was replaced: refused), keep this driver's
  results on this node (:func:`gpupool.kube.claims.claim_devices`), create one shim region for
  the claim with each device's consumed memory as its limit and its consumed compute as its SM
  share, write a CDI spec whose device carries the edits (the region, the shim's façade first
  on the library path, the real driver, the GPU device nodes, ``CUDA_VISIBLE_DEVICES``) and
  answer the CDI device ID. Preparing a claim already prepared answers the same again (the
  kubelet retries and re-prepares after its own restart).
- **unprepare**: delete the region and the CDI spec, forget the claim. Unknown claims are fine.

Prepared claims are kept in ``<state>/prepared.json``, written atomically after each change, so
a restarted plugin answers the kubelet's retries and unprepares claims it prepared before.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.gpu.base import DeviceInfo
from gpupool.kube.cdi import cdi_device_id, claim_edits, write_spec
from gpupool.kube.claims import ClaimDevice, ClaimError, claim_devices
from gpupool.kube.client import KubeClient, KubeError
from gpupool.kube.slices import DRIVER, device_name
from gpupool.runtime.shim import MIB, DeviceSlice, Region, RegionError

log = logging.getLogger(__name__)

STATE_FILE = "prepared.json"

#: ``runtime.shim.job_env`` bound to the node's shim build and real driver: region -> env.
ShimEnv = Callable[[Path], dict[str, str]]


@dataclass(frozen=True)
class PreparedClaim:
    """A claim this node prepared: its devices, region and CDI device."""

    uid: str
    namespace: str
    name: str
    devices: tuple[ClaimDevice, ...]
    region: str
    cdi_spec: str
    cdi_id: str

    def as_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "devices": [d.as_json() for d in self.devices],
            "region": self.region,
            "cdi_spec": self.cdi_spec,
            "cdi_id": self.cdi_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        return cls(
            uid=str(data["uid"]),
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            devices=tuple(ClaimDevice.from_json(d) for d in data["devices"]),
            region=str(data["region"]),
            cdi_spec=str(data["cdi_spec"]),
            cdi_id=str(data["cdi_id"]),
        )


class ClaimPreparer:
    """Prepares and unprepares claims on one node; thread-safe (gRPC calls run in a pool)."""

    def __init__(
        self,
        client: KubeClient,
        node: str,
        inventory: Sequence[DeviceInfo],
        *,
        state_dir: Path,
        cdi_dir: Path,
        shim_env: ShimEnv,
        context_reserves: Mapping[str, int] | None = None,
        driver: str = DRIVER,
    ) -> None:
        self.client = client
        self.node = node
        self.driver = driver
        self.devices = {device_name(d.index): d for d in inventory}
        self.state_dir = state_dir
        self.cdi_dir = cdi_dir
        self.shim_env = shim_env
        # GPU UUID -> bytes a process's first CUDA context takes there (runtime/shimreserve.py):
        # charged inside the claim's memory, as the agent does for its own slices.
        self.context_reserves = dict(context_reserves or {})
        self._lock = threading.Lock()
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "regions").mkdir(exist_ok=True)
        self.prepared: dict[str, PreparedClaim] = self._load()

    # -- state ---------------------------------------------------------------------------------

    def _load(self) -> dict[str, PreparedClaim]:
        path = self.state_dir / STATE_FILE
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
            claims = [PreparedClaim.from_json(c) for c in data["claims"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Refuse to start on a state we cannot read: forgetting claims would leak regions
            # and answer the kubelet's retries wrongly.
            raise ClaimError(
                f"cannot read the prepared claims in {path}: {exc}; fix or move the file "
                "(claims prepared before are then unknown to this plugin)"
            ) from exc
        log.info("kept %d prepared claim(s) from %s", len(claims), path)
        return {c.uid: c for c in claims}

    def _save(self) -> None:
        path = self.state_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        body = {"version": 1, "claims": [c.as_json() for c in self.prepared.values()]}
        with tmp.open("w") as f:
            json.dump(body, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # -- the two calls ---------------------------------------------------------------------------

    def prepare(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        """Prepares the claim (or answers its earlier preparation); :class:`ClaimError` says
        why not, in words the pod's events show."""
        with self._lock:
            done = self.prepared.get(uid)
            if done is not None:
                return done
        try:
            claim = self.client.get(
                f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
            )
        except KubeError as exc:
            raise ClaimError(f"cannot read ResourceClaim {namespace}/{name}: {exc}") from exc
        if claim.get("metadata", {}).get("uid") != uid:
            raise ClaimError(
                f"ResourceClaim {namespace}/{name} has another UID than {uid}: it was replaced"
            )
        devices = claim_devices(claim, driver=self.driver, node=self.node)
        infos = []
        for d in devices:
            info = self.devices.get(d.device)
            if info is None:
                raise ClaimError(
                    f"device {d.device} of claim {namespace}/{name} is not on {self.node}"
                )
            infos.append(info)
        with self._lock:
            done = self.prepared.get(uid)
            if done is not None:
                return done
            prepared = self._make(namespace, name, uid, devices, infos)
            self.prepared[uid] = prepared
            self._save()
        log.info("prepared claim %s/%s (%s): %s", namespace, name, uid, prepared.cdi_id)
        return prepared

    def _make(
        self,
        namespace: str,
        name: str,
        uid: str,
        devices: Sequence[ClaimDevice],
        infos: Sequence[DeviceInfo],
    ) -> PreparedClaim:
        region_path = self.state_dir / "regions" / f"{uid}.region"
        slices = [
            DeviceSlice(
                uuid=info.uuid,
                mem_limit_bytes=d.memory_bytes
                if d.memory_bytes is not None
                else info.memory_mib * MIB,
                sm_share_permille=d.compute_milli,
                context_reserve_bytes=self.context_reserves.get(info.uuid, 0),
            )
            for d, info in zip(devices, infos, strict=True)
        ]
        label = f"claim {namespace}/{name}"
        try:
            Region.create(region_path, label, slices).close()
            edits = claim_edits(
                self.shim_env(region_path),
                visible_devices=[info.uuid for info in infos],
                # /dev/nvidiaN is the driver's minor number, not NVML's index.
                minors=[info.device_node_minor for info in infos],
            )
        except RegionError as exc:
            region_path.unlink(missing_ok=True)
            raise ClaimError(f"cannot prepare claim {namespace}/{name}: {exc}") from exc
        spec = write_spec(self.cdi_dir, uid, edits)
        return PreparedClaim(
            uid=uid,
            namespace=namespace,
            name=name,
            devices=tuple(devices),
            region=str(region_path),
            cdi_spec=str(spec),
            cdi_id=cdi_device_id(uid),
        )

    def unprepare(self, uid: str) -> None:
        with self._lock:
            prepared = self.prepared.pop(uid, None)
            if prepared is None:
                return
            Path(prepared.cdi_spec).unlink(missing_ok=True)
            Path(prepared.region).unlink(missing_ok=True)
            self._save()
        log.info("unprepared claim %s/%s (%s)", prepared.namespace, prepared.name, uid)
