"""Acting on the server's orders for one replica: start it, stop it, resize its slice.

Part of :class:`~gpupool.agent.agent.Agent` (a mixin, as :mod:`gpupool.agent.gpurules` is):
``apply_start`` prepares a replica (its isolation chosen and set up, its account, its folders,
an uploaded working directory unpacked) and hands it to the executor; anything the job's input
or the node makes impossible is the replica's boot failure, never the agent's end.
``apply_stop`` and ``apply_resize`` follow the protocol's epoch rule (an order older than the
highest epoch seen is ignored). The replica's record (``assignment.json``) is written here.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.agent import mpsplan
from gpupool.agent.containerize import ContainerRoom, JobInputRefused
from gpupool.agent.dynuid import UidLeases
from gpupool.agent.env import job_env, start_folder
from gpupool.agent.executor import MARKER
from gpupool.agent.gpurules import GpuRules, Replica
from gpupool.agent.jobdir import BOOT_FAILED, LaunchSpec, ProcessState, write_json
from gpupool.agent.jobsteps import upload_steps
from gpupool.agent.logship import LogShipper
from gpupool.agent.outfiles import output_files
from gpupool.agent.runas import Account, NoAccount, hand_over, job_account
from gpupool.agent.transport import Transport
from gpupool.agent.unpack import UnsafeArchive, copy_path, download_later
from gpupool.gpu.base import DeviceInfo as GpuInfo
from gpupool.runtime.isolation import (
    MPS_MODES,
    SHIM_MODES,
    IsolationUnavailable,
    SliceContext,
    SliceDevice,
    isolation_env,
    resolve,
)
from gpupool.runtime.shim import MIB, RegionError, ShimIsolation
from gpupool.schemas.agent import AssignmentSpec, DeviceInfo, ResizeOrder, StopOrder

log = logging.getLogger("gpupool.agent")

SOFT_HOOK_DIR = str(Path(__file__).resolve().parent.parent / "runtime" / "softhook")


class Launcher(GpuRules):
    """See the module docstring. The agent provides the attributes declared here."""

    transport: Transport
    shipper: LogShipper | None
    epoch: int
    checkpoint_root: Path
    _device_memory: dict[str, int]  # device -> physical MiB
    _mig: set[str]  # devices that are MIG instances
    _shim_reserve: dict[str, int]  # device -> context reserve (bytes) for regions
    uid_leases: UidLeases | None  # transient accounts (run_as auto as root), else None
    devices: list[DeviceInfo]
    inventory: tuple[GpuInfo, ...]  # the physical GPUs as the backend reads them

    def _device_node_minors(self, uuids: Sequence[str]) -> list[int]:
        """The ``N`` of ``/dev/nvidiaN`` of each GPU behind ``uuids`` (a MIG instance's is its
        parent's): the driver's minor number, not NVML's index."""
        parents = {d.uuid: d.mig_parent or d.uuid for d in self.devices}
        by_uuid = {g.uuid: g for g in self.inventory}
        wanted = {parents.get(u, u) for u in uuids}
        return sorted(by_uuid[u].device_node_minor for u in wanted if u in by_uuid)

    @functools.cached_property
    def containers(self) -> ContainerRoom:
        """The node's container engines and CDI folder (checked on the first container job)."""
        return ContainerRoom(self.config.state_dir)

    def apply_stop(self, order: StopOrder) -> bool:
        """Stop a replica; False when the order is stale or names nothing running."""
        if order.epoch < self.epoch or order.assignment_id not in self.replicas:
            return False
        return self.executor.stop(
            order.assignment_id,
            reason=order.reason.value,
            signal_name=order.signal,
            grace_s=order.grace_period_s,
        )

    def apply_resize(self, order: ResizeOrder) -> bool:
        """Give a running shim replica its new slice in place; False when nothing changed."""
        r = self.replicas.get(order.assignment_id)
        if order.epoch < self.epoch or r is None or r.shim_region is None:
            return False
        a = r.assignment
        if (a.milli_per_device, a.memory_mib_per_device) == (
            order.milli_per_device,
            order.memory_mib_per_device,
        ):
            return False
        region = self._region(r.shim_region)
        if region is None:
            return False
        for uuid in a.device_uuids:
            region.set_limit(uuid, order.memory_mib_per_device * MIB)
            region.set_share(uuid, order.milli_per_device)
        r.assignment = a.model_copy(
            update={
                "milli_per_device": order.milli_per_device,
                "memory_mib_per_device": order.memory_mib_per_device,
            }
        )
        self._save_assignment(order.assignment_id, r)
        log.info(
            "%s resized to %dm and %d MiB per device",
            order.assignment_id,
            order.milli_per_device,
            order.memory_mib_per_device,
        )
        return True

    def apply_start(self, a: AssignmentSpec) -> bool:
        """Launch a replica; False for a stale or already known assignment."""
        if a.epoch < self.epoch or a.assignment_id in self.replicas:
            return False
        if (
            self.executor.jobdir(a.assignment_id).path.exists()
            or (self.executor.done_dir / a.assignment_id).exists()
        ):
            return False
        ctx = SliceContext(
            devices=tuple(
                SliceDevice(u, self._device_memory.get(u, 0), u in self._mig)
                for u in a.device_uuids
            ),
            milli=a.milli_per_device,
            memory_mib=a.memory_mib_per_device,
            mps_pipe_dir=str(self.mps.pipe_dir) if self.mps is not None else None,
            mps_log_dir=str(self.mps.log_dir) if self.mps is not None else None,
            soft_hook_dir=SOFT_HOOK_DIR,
            reserve_mib=max((self._reserve.get(u, 0) for u in a.device_uuids), default=0),
            spill=a.memory_oversubscription == "spill",
            shim_reserve_bytes=self._shim_reserve,
        )
        checkpoint_dir = a.checkpoint_dir or str(self.checkpoint_root / a.job_id)
        replica = Replica(a, None, checkpoint_dir=checkpoint_dir)
        unknown = [u for u in a.device_uuids if u not in self._device_memory]
        account: Account | None = None
        try:
            if unknown:
                raise IsolationUnavailable(
                    f"devices {', '.join(unknown)} are not on node {self.config.node}"
                )
            account = self.account_of(a)
            replica.uid = account.uid if account is not None else os.getuid()
            ctx = replace(
                ctx, mps_refused=mpsplan.conflict(self._mps_tenants(), replica.uid, a.device_uuids)
            )
            replica.isolation = resolve(a.isolation, ctx)
            if replica.isolation in MPS_MODES:
                problem = self._limit_mps_server(replica)
                if problem is not None:  # auto falls back; an explicit mps is refused
                    replica.isolation = resolve(a.isolation, replace(ctx, mps_refused=problem))
            try:
                ienv = isolation_env(replica.isolation, ctx)  # the shim's region is made here
            except (RegionError, OSError) as exc:  # auto falls back; an explicit shim is refused
                why = f"the node could not create the CUDA shim's slice region ({exc})"
                if replica.isolation not in SHIM_MODES or a.isolation != "auto":
                    raise IsolationUnavailable(
                        f"isolation {replica.isolation} was requested but {why}: fix the "
                        "node's GPUPOOL_SHIM_REGIONS folder or submit with isolation auto"
                    ) from None
                # The next in auto's order without the shim: mps (from mps+shim), else soft.
                fallback = "mps" if replica.isolation == "mps+shim" else "soft"
                replica.local_reason = f"isolation {fallback} instead of {replica.isolation}: {why}"
                replica.isolation_reason = replica.local_reason
                replica.isolation = fallback
                ienv = isolation_env(replica.isolation, ctx)
            replica.shim_region = self._shim_region_of(ienv)
            own = self.config.state_dir / "work" / a.job_id
            workdir, made_workdir, moved = start_folder(a, own)
            Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
            archive: Path | None = None
            if a.workdir_upload is not None:
                # Each replica gets its own copy of the uploaded folder, unpacked by its
                # supervisor as its account (agent/jobsteps.py): not on the heartbeat path.
                workdir = str(copy_path(self.config.state_dir / "work", a.job_id, a.assignment_id))
                owner = (account.uid, account.gid) if account is not None else None
                archive = download_later(self.transport, a.workdir_upload, Path(workdir), owner)
                Path(workdir).mkdir(parents=True, exist_ok=True)
                made_workdir = True
            elif made_workdir:
                Path(workdir).mkdir(parents=True, exist_ok=True)
            if account is not None and account.transient:
                account = replace(account, home=workdir)  # no home of its own
            if not Path(workdir).is_dir():
                raise IsolationUnavailable(
                    f"workdir {workdir} does not exist on node {self.config.node}: create it "
                    "there or submit without workdir"
                )
            if account is not None:
                # Folders the agent made are the job's own; a workdir the job named is not
                # touched (its account must already be allowed in).
                hand_over(Path(checkpoint_dir), account)
                if made_workdir:
                    hand_over(Path(workdir), account)
                if replica.shim_region is not None:  # its processes map it to claim slots
                    ShimIsolation.hand_over(ienv, account.uid, account.gid)
        except (IsolationUnavailable, UnsafeArchive, NoAccount, OSError) as exc:
            self.replicas[a.assignment_id] = replica
            self._end_shim(replica)
            self.executor.record_boot_failure(a.assignment_id, str(exc), self._record(replica))
            return True
        except Exception as exc:  # a job's input must never end the agent
            log.exception("preparing %s failed", a.assignment_id)
            reason = f"the node could not prepare the job: {type(exc).__name__}: {exc}"
            self.replicas[a.assignment_id] = replica
            self._end_shim(replica)
            self.executor.record_boot_failure(a.assignment_id, reason[:500], self._record(replica))
            return True
        env, dropped = job_env(
            a,
            node=self.config.node,
            checkpoint_dir=checkpoint_dir,
            isolation=replica.isolation,
            isolation_env=ienv,
            base_env=os.environ,
        )
        argv = list(a.command) if a.script is None else ["/bin/sh", "-c", a.script]
        if account is not None:
            env.update(account.env())
        env["PWD"] = workdir
        env[MARKER] = str(self.executor.jobdir(a.assignment_id).path)  # finds strays later
        spec = LaunchSpec(
            argv=argv,
            env=env,
            cwd=workdir,
            time_limit_s=a.time_limit_s,
            stop_signal=a.checkpoint_signal,
            grace_s=a.grace_period_s,
            log_cap_bytes=self.config.log_cap_bytes,
            uid=account.uid if account is not None else None,
            gid=account.gid if account is not None else None,
            groups=list(account.groups) if account is not None else [],
            **upload_steps(archive, workdir, account),
            **output_files(a, self.config.node, workdir),
        )
        if a.container is not None:  # the one seam: the same replica, in its image
            try:
                minors = self._device_node_minors(a.device_uuids)
                spec = self.containers.launch_spec(
                    a, spec, isolation_env=ienv, device_minors=minors,
                    checkpoint_dir=checkpoint_dir, account=account,
                )  # fmt: skip
            except (IsolationUnavailable, OSError) as exc:
                self.replicas[a.assignment_id] = replica
                self._end_shim(replica)
                final = isinstance(exc, JobInputRefused)
                self.executor.record_boot_failure(
                    a.assignment_id, str(exc), self._record(replica), final=final
                )
                return True
        if dropped:
            replica.local_reason = f"reserved environment names ignored: {', '.join(dropped)}"
        if moved:
            replica.local_reason = "; ".join(filter(None, (replica.local_reason, moved)))
        self.replicas[a.assignment_id] = replica
        try:
            self.executor.launch(a.assignment_id, spec, self._record(replica))
        except Exception as exc:  # e.g. a full disk: that job fails, not the node
            log.exception("launching %s failed", a.assignment_id)
            reason = f"the node could not launch the job: {type(exc).__name__}: {exc}"
            self._end_shim(replica)
            jd = self.executor.jobdir(a.assignment_id)
            jd.path.mkdir(parents=True, exist_ok=True)  # launch.json may be there already
            jd.write_state(ProcessState(status=BOOT_FAILED, reason=reason[:500]))
            return True
        if self.shipper is not None:
            self.shipper.track(a.assignment_id)
        return True

    def account_of(self, a: AssignmentSpec) -> Account | None:
        """Whose account replica ``a`` runs as (``None``: the agent's own); the one decision
        every launch path follows (see :func:`~gpupool.agent.runas.job_account`)."""
        return job_account(
            self.config.run_as,
            a.user,
            self.config.node,
            key=a.assignment_id,
            leases=self.uid_leases,
        )

    def _record(self, replica: Replica) -> dict[str, Any]:
        return {
            "assignment": replica.assignment.model_dump(mode="json"),
            "isolation": replica.isolation,
            "checkpoint_dir": replica.checkpoint_dir,
            "local_reason": replica.local_reason,
            "isolation_reason": replica.isolation_reason,
            "local_stop": replica.local_stop,
            "uid": replica.uid,
            "shim_region": replica.shim_region,
            "shim_attached": replica.shim_attached,
        }

    def _save_assignment(self, key: str, replica: Replica) -> None:
        jd = self.executor.jobdir(key)
        if jd.path.exists():
            write_json(jd.assignment, self._record(replica))
