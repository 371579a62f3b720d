"""The node agent: turns the server's assignments into supervised processes, and reports.

One :class:`Agent` per node. Its loop (:meth:`Agent.run`) does, every ``local_tick_s`` while
the node has replicas (with none, it sleeps until the next heartbeat, the long poll's wake-up or
a stop):

1. **observe** every replica through the executor (cheap: one small file read each);
2. **heartbeat** when the interval has passed (on an idle node, a third of the node timeout:
   :meth:`Agent.spacing`) or a replica changed state: sample the GPUs once,
   fold health, run the memory watchdog and the pressure rule, send telemetry and the full list of
   replica states, then act on the answer.

Acting on an answer follows the protocol's rules (:mod:`gpupool.schemas.agent`): an answer or
order from an epoch older than the highest seen is ignored; a start whose assignment id is
already known (running, finished, or acknowledged) does nothing; a stop for an unknown or
finished replica does nothing; ``finished_ack`` lets the agent file a replica away. While the
server is unreachable, replicas keep running and heartbeats retry with backoff, until the fence
(:mod:`gpupool.agent.fence`): after half the server's node timeout with no answer at all, the
agent stops its replicas, because the server is about to start them elsewhere.

The loop's timing (when to beat, how to sleep), the fence's watch and the long poll are the
mixin :class:`~gpupool.agent.pacing.Pacing`; the agent's settings are
:class:`~gpupool.agent.config.AgentConfig`.

At start the agent **adopts** every replica it finds in its state folder: their supervisors kept
running while the agent was away, and they are reported, never started again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping

from gpupool import __version__
from gpupool.agent.config import AgentConfig
from gpupool.agent.dynuid import UidLeases, release_orphans, release_replica
from gpupool.agent.executor import Executor
from gpupool.agent.fence import Fence
from gpupool.agent.gpurules import Replica, shim_spilled
from gpupool.agent.jobdir import (
    BOOT_FAILED,
    EXITED,
    RUNNING,
    read_json,
    write_json,
)
from gpupool.agent.launch import Launcher
from gpupool.agent.logship import LogShipper, LogSink
from gpupool.agent.node import (
    agent_identity,
    default_address,
    host_cpu_milli,
    host_memory_mib,
    wire_devices,
)
from gpupool.agent.pacing import OrderWaiter, Pacing
from gpupool.agent.reporter import device_telemetry, replica_status
from gpupool.agent.results import ResultShipper, ResultSink
from gpupool.agent.runas import AUTO, resolve_mode, switches_account
from gpupool.agent.transport import (
    AgentRejected,
    Backoff,
    ServerSilent,
    ServerUnavailable,
    Transport,
)
from gpupool.agent.unpack import remove_copy
from gpupool.agent.usage import newest_mtime
from gpupool.control.machinery.clock import Clock
from gpupool.gpu.base import GpuBackend, SyntheticLoad, Telemetry, Workload
from gpupool.gpu.context import ContextReserves
from gpupool.gpu.health import HealthTracker
from gpupool.gpu.simulated import LOAD_ENV, parse_synthetic_load
from gpupool.runtime.isolation import (
    offered_modes,
)
from gpupool.runtime.mps import MpsDaemon
from gpupool.runtime.shim import Region, ShimIsolation, real_driver
from gpupool.runtime.shimreserve import CACHE_NAME, ShimReserves
from gpupool.runtime.watchdog import MemoryWatchdog
from gpupool.schemas.agent import (
    AssignmentSpec,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
)
from gpupool.shim.build import SHIM_DIR_ENV

log = logging.getLogger("gpupool.agent")


class Agent(Launcher, Pacing):
    """See the module docstring; its timing is :class:`~gpupool.agent.pacing.Pacing`'s."""

    def __init__(
        self,
        config: AgentConfig,
        backend: GpuBackend,
        transport: Transport,
        clock: Clock,
        *,
        executor: Executor | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.transport = transport
        self.clock = clock
        self.executor = executor or Executor(config.state_dir)
        self.health = HealthTracker(())
        self._take_inventory()
        self.watchdog = MemoryWatchdog(grace_s=config.watchdog_grace_s)
        self.replicas: dict[str, Replica] = {}
        self.interval_s = config.heartbeat_interval_s
        self.registered = False
        self.backoff = Backoff()
        self.backoff.cap_at(self.interval_s)
        self.last_error: str | None = None
        self.fence = Fence(last_contact=clock.monotonic())
        # The fence is checked by its own thread, since a heartbeat to a silent server blocks
        # the loop for a whole request timeout; this lock orders its checks with contacts.
        self._fence_lock = threading.Lock()
        self._fence_nudge = threading.Event()  # the node timeout changed: the watch looks again
        self._meta_path = config.state_dir / "agent.json"
        self.agent_id = agent_identity(config.state_dir)
        meta = read_json(self._meta_path) or {}
        self.epoch = int(meta.get("epoch", 0))
        self.checkpoint_root = config.checkpoint_root or config.state_dir / "checkpoints"
        self.mps: MpsDaemon | None = None
        if config.use_mps and backend.name == "nvml":
            daemon = MpsDaemon(config.state_dir / "mps")
            if daemon.available and daemon.start():
                self.mps = daemon
        self.heartbeats = 0
        self._stuck: dict[str, set[int]] = {}  # device -> pids of ended jobs NVML still lists
        self._said_pid_namespace = False
        self._reserve: dict[str, int] = {}  # device -> CUDA context reserve (MiB)
        if backend.name == "nvml":
            reserves = ContextReserves(
                config.state_dir / "context.json", str(getattr(backend, "driver_version", "?"))
            )
            if config.measure_context:
                reserves.measure(backend, self.inventory)
            parents = {d.uuid: d for d in self.inventory}
            for d in self.devices:
                self._reserve[d.uuid] = reserves.reserve_mib(parents[d.mig_parent or d.uuid])
        else:  # simulated GPUs whose spec says what a process holds beyond its slice
            said = {d.uuid: d.context_reserve_mib for d in self.inventory}
            for d in self.devices:
                mib = said.get(d.mig_parent or d.uuid)
                if mib is not None:
                    self._reserve[d.uuid] = mib
        self._regions: dict[str, Region] = {}  # shim region path -> the mapped region
        if switches_account(config.run_as) and not os.environ.get(SHIM_DIR_ENV):
            # The build cache defaults to the agent's home (root's is private): its jobs' accounts
            # must load the façade, so it goes below the state folder, which they may pass.
            os.environ[SHIM_DIR_ENV] = str(config.state_dir / "shim")
        # Whether this node can run the CUDA shim (a real driver, a build): asked once.
        self.shim_refused: str | None = (
            ShimIsolation.unavailable()
            if any(d.mig_parent is None for d in self.devices)
            else "the node has no GPU the shim could slice"
        )
        if self.shim_refused is not None and self.devices:
            log.info("isolation shim not offered: %s", self.shim_refused)
        self._shim_reserve: dict[str, int] = {}  # device -> context reserve (bytes) for regions
        driver = real_driver()
        if self.shim_refused is None and driver is not None:
            self._shim_reserve = ShimReserves(config.state_dir / CACHE_NAME, driver).for_devices(
                d.uuid for d in self.devices if d.mig_parent is None
            )
        self.uid_leases = (
            UidLeases(config.state_dir) if resolve_mode(config.run_as) == AUTO else None
        )
        self._beat_now = threading.Event()  # set by the long poll: orders are waiting
        self.shipper = (
            LogShipper(transport, self.executor.log_path)
            if isinstance(transport, LogSink)
            else None
        )
        self.results = (
            ResultShipper(transport, self.executor.jobs_dir, agent_id=self.agent_id)
            if isinstance(transport, ResultSink)
            else None
        )

    # ------------------------------------------------------------------ start-up

    def _take_inventory(self) -> None:
        """Read the backend's devices (at start, and after a MIG re-partition)."""
        self.inventory = self.backend.inventory()
        self.devices = wire_devices(self.inventory)
        self._device_memory = {d.uuid: d.memory_mib for d in self.devices}
        self._mig = {d.uuid for d in self.devices if d.mig_parent is not None}
        self.health.set_inventory(self.inventory)

    def adopt(self) -> list[str]:
        """Pick up every replica left in the state folder by an earlier agent."""
        adopted = []
        for key in self.executor.known():
            data = read_json(self.executor.jobdir(key).assignment)
            if data is None or "assignment" not in data:
                continue
            assignment = AssignmentSpec.model_validate(data["assignment"])
            self.replicas[key] = Replica(
                assignment,
                data.get("isolation"),
                checkpoint_dir=data.get("checkpoint_dir"),
                local_reason=data.get("local_reason"),
                isolation_reason=data.get("isolation_reason"),
                local_stop=data.get("local_stop"),
                uid=data.get("uid"),
                shim_region=data.get("shim_region"),
                shim_attached=bool(data.get("shim_attached", False)),
            )
            adopted.append(key)
            if self.shipper is not None:
                self.shipper.track(key)
        if self.uid_leases is not None:  # an earlier agent ended before releasing these
            release_orphans(self.uid_leases, adopted, self.executor.done_dir)
        return adopted

    def register_request(self) -> RegisterRequest:
        return RegisterRequest(
            node=self.config.node,
            address=self.config.address or default_address(),
            cpu_milli=host_cpu_milli(),
            memory_mib=host_memory_mib(),
            devices=[  # with the reserve the scheduler keeps as headroom (scheduling.layout)
                d.model_copy(update={"context_reserve_mib": self._reserve.get(d.uuid)})
                for d in self.devices
            ],
            agent_version=__version__,
            isolation_modes=offered_modes(
                mps=self.mps is not None, mig=bool(self._mig), shim=self.shim_refused is None
            ),
            labels=self.config.labels,
            features=list(self.config.features),
            container_engines=self.containers.available(),
            pool=self.config.pool,
            agent_id=self.agent_id,
        )

    def register(self) -> None:
        answer = self.transport.register(self.register_request())
        self.contact()
        self._see_epoch(answer.epoch)
        self.interval_s = answer.heartbeat_interval_s
        self.backoff.cap_at(self.interval_s)
        self._set_node_timeout(answer.node_timeout_s)
        self.contact()  # recorded with the node timeout: the supervisors may fence now
        self.registered = True

    # ------------------------------------------------------------------ observing

    def observe(self) -> bool:
        """Refresh every replica's observation; True when any changed state."""
        changed = False
        for key, replica in self.replicas.items():
            seen = self.executor.observe(key)
            if replica.observed is None or seen.status != replica.observed.status:
                changed = True
                if seen.status in (EXITED, BOOT_FAILED):
                    # The group is gone; children that called setsid() are not: stop them too.
                    replica.gpu_pids.update(self.executor.kill_leftovers(key))
                    self._end_shim(replica)  # its processes are gone: so goes its region
            replica.observed = seen
        return changed

    def _telemetry(self) -> Telemetry:
        workloads = []
        for key, r in self.replicas.items():
            seen = r.observed
            if seen is None or seen.status != RUNNING or not r.assignment.device_uuids:
                continue
            load: SyntheticLoad | None = None
            if LOAD_ENV in r.assignment.env:
                try:
                    load = parse_synthetic_load(r.assignment.env[LOAD_ENV])
                except ValueError:
                    load = None
            workloads.append(
                Workload(
                    job_id=key,
                    device_uuids=tuple(r.assignment.device_uuids),
                    milli=r.assignment.milli_per_device,
                    memory_mib=r.assignment.memory_mib_per_device,
                    pids=(seen.pid,) if seen.pid is not None else (),
                    load=load,
                )
            )
        self.backend.set_workload(workloads)
        return self.backend.sample()

    # ------------------------------------------------------------------ heartbeat

    def heartbeat_request(self) -> HeartbeatRequest:
        telemetry = self._telemetry()
        listed = self._track_gpu_processes(telemetry)
        self._check_mps_attached(listed)
        self._read_shim_regions(listed)
        self._enforce_memory(telemetry)
        replicas = []
        for key, r in sorted(self.replicas.items()):
            seen = r.observed or self.executor.observe(key)
            if seen.status == EXITED and self._release(key, r, listed):
                seen = dataclasses.replace(seen, status=RUNNING)  # its slices stay taken
            replicas.append(
                replica_status(
                    seen,
                    isolation=self._reported_isolation(r),
                    local_reason=r.local_reason,
                    local_stop=r.local_stop,
                    checkpoint_time=newest_mtime(r.checkpoint_dir),
                    spilled_bytes=shim_spilled(r),
                ).model_copy(update={"isolation_reason": (r.isolation_reason or "")[:2000] or None})
            )
        verdicts = self._stuck_verdicts(self.health.update(telemetry), listed)
        return HeartbeatRequest(
            node=self.config.node,
            epoch=self.epoch,
            telemetry=device_telemetry(
                self.inventory, telemetry, verdicts, [d.uuid for d in self.devices]
            ),
            replicas=replicas,
            agent_id=self.agent_id,
        )

    def heartbeat(self) -> HeartbeatResponse:
        if self.backend.inventory() != self.inventory:
            self._take_inventory()  # MIG re-partitioned: register the devices as they are now
            self.register()
        answer = self.transport.heartbeat(self.heartbeat_request())
        self.contact()
        self.heartbeats += 1
        self.handle(answer)
        return answer

    def handle(self, answer: HeartbeatResponse) -> None:
        """Act on a heartbeat answer (idempotent; see the module docstring)."""
        if answer.epoch < self.epoch:
            return  # a deposed leader's late answer
        self._see_epoch(answer.epoch)
        self.interval_s = answer.heartbeat_interval_s
        self.backoff.cap_at(self.interval_s)
        self._set_node_timeout(answer.node_timeout_s)
        if not answer.registered:
            self.registered = False
            return
        for key in answer.finished_ack:
            replica = self.replicas.get(key)
            if (
                replica is not None
                and replica.observed is not None
                and (replica.observed.status in (EXITED, BOOT_FAILED))
            ):
                self.executor.forget(key)
                self._end_shim(replica)
                del self.replicas[key]
                job_id = replica.assignment.job_id
                if self.uid_leases is not None:
                    release_replica(self.uid_leases, key, job_id, replica.checkpoint_dir)
                else:
                    remove_copy(self.config.state_dir / "work", job_id, key)
        for order in answer.stop:
            self.apply_stop(order)
        for resize in answer.resize:
            self.apply_resize(resize)
        for assignment in answer.start:
            self.apply_start(assignment)

    # ------------------------------------------------------------------ loop

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set. Replicas keep running after it returns."""
        self.adopt()
        if isinstance(self.transport, OrderWaiter):
            threading.Thread(
                target=self._long_poll,
                args=(self.transport, stop),
                name="gpupool-agent-orders",
                daemon=True,
            ).start()
        threading.Thread(
            target=self._watch_fence, args=(stop,), name="gpupool-agent-fence", daemon=True
        ).start()
        threading.Thread(
            target=self._wake_on_stop, args=(stop,), name="gpupool-agent-stop", daemon=True
        ).start()
        mono = self.clock.monotonic
        next_beat = mono()
        next_mps_check = mono() + 60.0
        next_ship = mono()
        while not stop.is_set():
            changed = self.observe()
            now = mono()
            healthy_link = self.backoff.failures == 0
            woken = self._beat_now.is_set()
            if now >= next_beat or ((changed or woken) and healthy_link and self.registered):
                self._beat_now.clear()
                try:
                    if not self.registered:
                        self.register()
                    self.ship_logs()  # output first, so a reported exit has its last lines
                    self.heartbeat()
                    if self.observe():
                        # a replica changed during the round (it started, or ended while
                        # the server answered): report it now, not one interval later
                        self._beat_now.set()
                    if self.last_error is not None:
                        log.info("server reachable again; state reconciled")
                    self.backoff.reset()
                    self.last_error = None
                    next_beat = mono() + self.spacing()
                except ServerUnavailable as exc:
                    if not isinstance(exc, ServerSilent):
                        self.contact()  # an answer, even an error: not cut off
                    delay = self._retry_wait(exc.retry_after_s)
                    if self.last_error is None:
                        log.warning("server unreachable (%s); jobs keep running, retrying", exc)
                    self.last_error = str(exc)
                    next_beat = mono() + delay
                except AgentRejected:
                    raise  # refused (a live agent has this name, a bad token): say so and stop
                except Exception as exc:  # a bug or an odd input must not end the node
                    log.exception("heartbeat round failed; jobs keep running, retrying")
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    next_beat = mono() + self.backoff.next_delay()
            if self.shipper is not None and self.registered and mono() >= next_ship:
                self.ship_logs()
                next_ship = mono() + self.config.log_ship_interval_s
            if self.mps is not None and now >= next_mps_check:
                self.mps.ensure()
                next_mps_check = now + 60.0
            wake_at = min(next_beat, next_mps_check) if self.mps is not None else next_beat
            self._sleep(stop, max(0.0, wake_at - mono()))

    def ship_logs(self) -> int:
        """Send new log bytes to the server (best effort); returns the bytes sent."""
        if self.shipper is None:
            return 0
        try:
            if self.results is not None:  # results first: a log's end then means they are in
                self.results.ship(
                    (key, r.assignment)
                    for key, r in self.replicas.items()
                    if r.observed is not None and r.observed.status == EXITED
                )
            return self.shipper.ship(list(self.replicas))
        except (ServerUnavailable, AgentRejected) as exc:
            log.debug("log shipping postponed: %s", exc)
            return 0

    def close(self) -> None:
        self.transport.close()
        self.backend.close()

    # ------------------------------------------------------------------ helpers

    def _see_epoch(self, epoch: int) -> None:
        if epoch > self.epoch:
            self.epoch = epoch
            write_json(self._meta_path, {"epoch": epoch, "node": self.config.node})

    def summary(self) -> Mapping[str, int]:
        counts: dict[str, int] = {}
        for r in self.replicas.values():
            status = r.observed.status if r.observed else "unknown"
            counts[status] = counts.get(status, 0) + 1
        return counts
