"""The node-agent protocol: register once, then heartbeat.

Endpoints (all ``POST``, bearer token of a user with role ``agent``):

- ``/v1/agent/register`` with :class:`RegisterRequest` -> :class:`RegisterResponse`
- ``/v1/agent/heartbeat`` with :class:`HeartbeatRequest` -> :class:`HeartbeatResponse`

Words:

- **assignment**: one replica of one job placed on one node, with its devices and slice. Its
  ``assignment_id`` is unique forever; the server never reuses one, even when the job restarts
  (a restart is a new assignment of the same job).
- **epoch** (server epoch): an integer that grows whenever a new leader takes over scheduling.
  Every response carries the current epoch; every stop order carries the epoch it was issued in.
- **replica state**: what the agent observes about an assignment (:class:`ReplicaState`).

Rules that make the protocol safe to retry:

1. Heartbeats are *full state*: every heartbeat lists every assignment the agent knows about
   that has not been acknowledged as finished (see ``finished_ack``), with its current state.
   A lost heartbeat loses nothing; a duplicate changes nothing. Agents that number their
   heartbeats send deltas against the last acknowledged one instead (see
   :class:`HeartbeatRequest`); the server expands them to the full state before anything else,
   and asks for the full state whenever it cannot, so the rule holds for what it applies.
2. The server answers every heartbeat with the assignments the node should be running but has
   not reported yet (``start``) and the stop orders still in force (``stop``). It resends both
   until the agent's reports show them done, so the agent must treat an ``assignment_id`` it
   already knows as a no-op (at-least-once delivery, de-duplicated by id).
3. Every start and stop carries the epoch of the server that sent it (the current epoch when the
   order is (re)sent). The agent ignores any order whose ``epoch`` is lower than the highest
   epoch it has seen, so a delayed answer from a deposed leader does nothing; the server
   ignores reports about assignment ids it does not know.
4. When the server is unreachable the agent keeps running its jobs and keeps heart-beating with
   backoff; on reconnect its full-state heartbeat reconciles the server.
5. An assignment the server has recorded as finished is listed in ``finished_ack``; the agent
   may then forget it. Until then it keeps reporting it.

Units: milli-GPU and MiB as integers, seconds as floats, utilisation as a ratio in [0, 1],
temperature in degrees Celsius, power in watts. ``None`` means "not known / not supported".
"""

from __future__ import annotations

import enum

from pydantic import Field

from gpupool.schemas.base import WireModel
from gpupool.schemas.containers import ContainerWire

#: What a slice does with an allocation that fits it but not the GPU's free memory (a pool's
#: ``memory_oversubscription``): ``fail`` (out of memory) or ``spill`` (host memory, counted).
OVERSUBSCRIPTION = ("fail", "spill")

#: Isolation modes an agent may offer (same names as ``gpupool.domain.jobs.IsolationMode``).
ISOLATION_MODES = ("exclusive", "mps", "soft", "mig", "shim", "mps+shim")


class DeviceInfo(WireModel):
    """One GPU (or MIG instance) as the agent discovered it."""

    uuid: str = Field(min_length=1, max_length=200)
    index: int = Field(ge=0)
    model: str = Field(min_length=1, max_length=200, description="e.g. 'NVIDIA A100-SXM4-80GB'")
    memory_mib: int = Field(ge=0)
    compute_capability: tuple[int, int] | None = None
    nvlink_group: int | None = Field(
        default=None, description="devices joined by NVLink share a group id; None = unknown"
    )
    mig_parent: str | None = Field(default=None, description="UUID of the physical GPU")
    mig_profile: str | None = Field(default=None, description="e.g. '1g.10gb'")
    context_reserve_mib: int | None = Field(
        default=None,
        ge=0,
        le=1 << 20,
        description=(
            "MiB one process holds on the device beyond its framework's allocations (CUDA "
            "context, modules, workspaces), as the agent measured it; the scheduler keeps that "
            "much headroom per replica whose isolation leaves the context outside its slice. "
            "None: not measured (the server assumes its default)"
        ),
    )


class RegisterRequest(WireModel):
    """Sent once at agent start (and again after the server forgot the node).

    ``node`` is the node's name (a lowercase DNS label, usually the host name); ``address`` is
    how other nodes reach this one (used as ``MASTER_ADDR`` for gangs). ``pool`` puts all the
    node's devices in that pool when the node is new; an operator may move them later.
    """

    node: str = Field(min_length=1, max_length=64)
    address: str | None = Field(default=None, max_length=255)
    cpu_milli: int = Field(ge=0)
    memory_mib: int = Field(ge=0, description="host memory")
    devices: list[DeviceInfo] = Field(default_factory=list, max_length=256)
    agent_version: str = Field(min_length=1, max_length=64)
    isolation_modes: list[str] = Field(
        default_factory=lambda: ["exclusive", "soft"],
        description=f"modes this node can enforce, among {', '.join(ISOLATION_MODES)}",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    container_engines: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="container engines this node can run jobs with (podman, docker)",
    )
    features: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="node features for --constraint (gpupool agent --feature ib,a100x8)",
    )
    pool: str | None = None
    agent_id: str | None = Field(
        default=None,
        min_length=16,
        max_length=64,
        pattern=r"^[0-9a-f]+$",
        description=(
            "the agent's own id, kept in its state folder: while the node's agent is alive, a "
            "registration with another id (a second agent claiming the name) is refused (409)"
        ),
    )


class RegisterResponse(WireModel):
    """The server's answer to a registration."""

    node_id: str
    epoch: int
    heartbeat_interval_s: float
    server_version: str
    node_timeout_s: float | None = Field(
        default=None,
        description="silence after which the server marks the node down and starts its jobs "
        "elsewhere; the agent stops its replicas after half of it without an answer "
        "(agent/fence.py). None from an older server: no fencing",
    )


class DeviceTelemetry(WireModel):
    """One device's latest sample. ``xid`` is the last XID error code seen, if any."""

    uuid: str
    utilization_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    memory_used_mib: int | None = Field(default=None, ge=0)
    temperature_c: float | None = None
    power_w: float | None = Field(default=None, ge=0.0)
    healthy: bool = True
    xid: int | None = None


class ReplicaState(str, enum.Enum):
    """What the agent observes about one assignment.

    - ``starting``: accepted; processes are being launched.
    - ``running``: the processes run.
    - ``exited``: every process is gone; ``exit_code`` / ``signal`` say how, ``stop_reason``
      says whether the agent stopped it and why.
    - ``boot_failed``: it could not be started (missing program, bad workdir); ``reason`` says why.
    """

    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    BOOT_FAILED = "boot_failed"


class StopReason(str, enum.Enum):
    """Why a replica is (to be) stopped.

    ``cancel``, ``preempt`` and ``timeout`` come from the server (or the time limit the agent
    enforces); ``memory`` is the watchdog stopping a job over its memory slice; ``pressure`` is
    the agent preempting an opportunistic job because the device ran short of memory; ``node``
    is the agent's fence stopping its jobs after half the node timeout without an answer from the
    server (agent/fence.py), which the server records as it records a lost node.
    """

    CANCEL = "cancel"
    PREEMPT = "preempt"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    PRESSURE = "pressure"
    NODE = "node"


class ReplicaStatus(WireModel):
    """The agent's report about one assignment."""

    assignment_id: str
    state: ReplicaState
    exit_code: int | None = None
    signal: str | None = Field(default=None, description="e.g. 'SIGKILL' when killed by one")
    stop_reason: StopReason | None = None
    isolation: str | None = Field(default=None, description="mode actually enforced")
    reason: str | None = Field(default=None, max_length=2000)
    final: bool = Field(
        default=False,
        description="boot_failed only: every new attempt would fail the same way (the image "
        "lacks the program, a mount the job's account may not read): the job is not requeued",
    )
    isolation_reason: str | None = Field(
        default=None,
        max_length=2000,
        description="while it runs: why the mode enforced is weaker than the one it was given "
        "(it escaped the CUDA shim, lost MPS, its shim region could not be made)",
    )
    checkpoint_time: float | None = Field(
        default=None, description="when the job last reported a checkpoint (epoch seconds)"
    )
    spilled_bytes: dict[str, int] | None = Field(
        default=None,
        description="per device UUID, bytes served from host memory because the GPU was full "
        "(isolation shim with the pool's memory_oversubscription spill)",
    )


class HeartbeatRequest(WireModel):
    """Sent every ``heartbeat_interval_s``: telemetry and the replica states.

    **Deltas** (agents since issue 26; see ``agent/transport.py``: ``Reports``): a heartbeat
    with ``seq`` and a ``base`` lists in ``replicas`` only the replicas whose report changed
    since the heartbeat numbered ``base``, which the server acknowledged (``ack_seq``); one
    without ``base`` is a full state. ``telemetry`` may be left out (sampled: sent when due or
    when a device's health changed). A server that does not hold the agent's state at ``base``
    (it restarted, another replica served the agent) answers ``want_full`` and nothing else;
    the agent then sends its full state at once. Without ``seq`` (older agents) every
    heartbeat is a full state, as rule 1 says."""

    node: str
    epoch: int = Field(description="the highest server epoch this agent has seen (0 = none)")
    telemetry: list[DeviceTelemetry] = Field(default_factory=list)
    replicas: list[ReplicaStatus] = Field(default_factory=list)
    seq: int | None = Field(
        default=None, ge=0, le=2**62, description="this report's number (deltas; see above)"
    )
    base: int | None = Field(
        default=None,
        ge=0,
        le=2**62,
        description="the acknowledged report this one is a delta against; None: full state",
    )
    agent_id: str | None = Field(
        default=None,
        min_length=16,
        max_length=64,
        pattern=r"^[0-9a-f]+$",
        description=(
            "as in RegisterRequest: a heartbeat from an agent other than the one that last "
            "registered the node changes nothing; it is told to kill the replicas it still "
            "runs, then answered registered=false"
        ),
    )


class GangInfo(WireModel):
    """Rendezvous variables for a multi-replica job (PyTorch distributed names)."""

    master_addr: str
    master_port: int
    world_size: int
    rank: int
    local_rank: int


class ArrayInfo(WireModel):
    """The array a job is a task of (``sbatch --array``): its id, this task's index, the count
    of tasks and the first and last index."""

    array_id: str
    index: int
    count: int
    first: int
    last: int


class PtyWire(WireModel):
    """Where ``gpupool run --pty`` listens for the node, and the key the node says first."""

    address: str = Field(max_length=300)
    key: str = Field(max_length=128)


class AssignmentSpec(WireModel):
    """One replica to start on this node.

    Exactly one of ``command`` (argv, no shell) and ``script`` (``/bin/sh -c``) is set.
    ``milli_per_device`` and ``memory_mib_per_device`` describe the slice on every device in
    ``device_uuids``; ``time_limit_s`` ``None`` means no limit.
    """

    assignment_id: str
    epoch: int
    job_id: str
    job_name: str
    replica_rank: int
    user: str = ""  # who submitted it: agents with --run-as submitter run it as that account
    command: list[str] = Field(default_factory=list)
    script: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    workdir_upload: str | None = None
    device_uuids: list[str] = Field(default_factory=list)
    milli_per_device: int
    memory_mib_per_device: int
    isolation: str = "auto"
    memory_oversubscription: str = Field(
        default="fail", pattern="^(fail|spill)$", description="the pool's, see OVERSUBSCRIPTION"
    )
    time_limit_s: float | None = None
    checkpoint_signal: str = "SIGTERM"
    grace_period_s: float = 30.0
    gang: GangInfo | None = None
    restart_count: int = 0
    checkpoint_dir: str | None = None
    priority: int = 0
    preemptible: bool = False
    array: ArrayInfo | None = None
    container: ContainerWire | None = Field(
        default=None, description="run the command in this image (None: a bare process)"
    )
    # issue 27 (gpupool.domain.interactive): run --pty's terminal, -o/-e file patterns
    pty: PtyWire | None = Field(
        default=None, description="give the program a terminal, relayed to this endpoint"
    )
    stdout_path: str | None = Field(
        default=None, description="also write stdout to this file (-o; %j, %x ... unexpanded)"
    )
    stderr_path: str | None = Field(
        default=None, description="also write stderr to this file (-e; None with -o: to it)"
    )


class StopOrder(WireModel):
    """Stop one replica: send ``signal``, wait ``grace_period_s``, then kill its group."""

    assignment_id: str
    epoch: int
    reason: StopReason
    signal: str = "SIGTERM"
    grace_period_s: float = 30.0


class ResizeOrder(WireModel):
    """A running shim replica's slice per device as the server holds it now (sent for every
    such replica: the agent changes its region's limits where they differ)."""

    assignment_id: str
    epoch: int
    milli_per_device: int = Field(ge=1, le=1000)
    memory_mib_per_device: int = Field(ge=1)


class HeartbeatResponse(WireModel):
    """What the node should do now."""

    epoch: int
    heartbeat_interval_s: float
    node_timeout_s: float | None = Field(
        default=None,
        description="silence after which the server marks the node down and starts its jobs "
        "elsewhere; the agent stops its replicas after half of it without an answer "
        "(agent/fence.py). None from an older server: no fencing",
    )
    start: list[AssignmentSpec] = Field(default_factory=list)
    stop: list[StopOrder] = Field(default_factory=list)
    resize: list[ResizeOrder] = Field(default_factory=list)
    finished_ack: list[str] = Field(
        default_factory=list, description="assignment ids the server recorded as finished"
    )
    registered: bool = Field(
        default=True, description="False when the server does not know the node: register again"
    )
    ack_seq: int | None = Field(
        default=None,
        description="the ``seq`` of the heartbeat answered (sent to agents that send one)",
    )
    want_full: bool = Field(
        default=False,
        description="the server does not hold the state this delta is against: send the full "
        "state now (nothing else in this answer is to be acted on)",
    )


#: Answer fields an agent that sends no ``seq`` does not know (it rejects unknown fields): not
#: sent to it.
DELTA_ANSWER_FIELDS = frozenset({"ack_seq", "want_full"})
#: Request fields an older server does not know: sent only when set.
DELTA_REQUEST_FIELDS = frozenset({"seq", "base"})


#: The most raw bytes one ``/v1/agent/logs`` chunk may carry (before base64).
LOG_CHUNK_MAX_BYTES = 256 * 1024


class LogStream(str, enum.Enum):
    STDOUT = "stdout"
    STDERR = "stderr"


class LogChunkRequest(WireModel):
    """New bytes of one replica's log: ``data`` (base64) starts at byte ``offset`` of the
    replica's ``stream`` file on the node. ``/v1/agent/logs`` answers :class:`LogAck`."""

    assignment_id: str
    stream: LogStream
    offset: int = Field(ge=0)
    data: str = Field(
        max_length=(LOG_CHUNK_MAX_BYTES + 2) // 3 * 4, description="base64 of the bytes"
    )
    final: bool = Field(
        default=False,
        description="the replica has ended and these bytes reach the end of its stream "
        "(nothing follows; data may be empty)",
    )


class LogAck(WireModel):
    """``next_offset``: the byte of this replica's stream the server wants next (the agent
    continues from there; after an agent restart it may be beyond what the agent sent).
    ``kept`` is False when the server does not know the assignment (the agent stops)."""

    next_offset: int
    kept: bool = True


class OrdersAnswer(WireModel):
    """``GET /v1/agent/nodes/{name}/orders?since=S&timeout=T`` (the long poll): answers when
    the node's order sequence ``seq`` exceeds ``since`` (then heartbeat at once to fetch the
    orders) or after ``timeout`` seconds with ``changed`` False."""

    seq: int
    changed: bool
