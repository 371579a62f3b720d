"""Jobs: the spec a user writes (``JobSpec``) and the job the pool tracks (``Job``).

A ``JobSpec`` is the desired state, validated once at the edge (job file, CLI options, API).
A ``Job`` adds what the pool observed: id, state, version, times, restarts. Both are frozen;
a change is a new value, made by :func:`gpupool.domain.transitions.transition`.

Times are float seconds from the injected clock; ``None`` means "has not happened".
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpupool.domain.arrays import ArrayTask
from gpupool.domain.containers import ContainerSpec
from gpupool.domain.dependency import Dependency
from gpupool.domain.errors import InvalidValue
from gpupool.domain.interactive import Constraint, PtyRequest
from gpupool.domain.pools import DEFAULT_POOL
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.states import JobState
from gpupool.domain.tenants import DEFAULT_PRIORITY_CLASS


class IsolationMode(enum.Enum):
    """How the node enforces a slice; the job's record says which mode it got.

    - ``exclusive``: whole devices, nobody else on them.
    - ``mps``: NVIDIA MPS with a hard SM share and a pinned memory limit.
    - ``soft``: framework memory caps at interpreter start plus an NVML watchdog.
    - ``mig``: the job runs on a MIG instance.
    - ``shim``: gpupool's CUDA driver shim holds every process to the slice's memory and SM
      share (any CUDA program; see docs/shim.md).
    - ``mps+shim``: MPS for the SM share, the shim for each replica's memory limit.
    - ``auto``: the strongest mode the node offers for this slice.
    """

    AUTO = "auto"
    EXCLUSIVE = "exclusive"
    MPS = "mps"
    SOFT = "soft"
    MIG = "mig"
    SHIM = "shim"
    MPS_SHIM = "mps+shim"


class RequeuePolicy(enum.Enum):
    """When a job that stopped early goes back to the queue.

    - ``never``: it ends in the state it reached.
    - ``on-preemption`` (default): after preemption, node failure or a failed launch.
    - ``on-failure``: those, and also after a non-zero exit, up to ``max_restarts``.
    """

    NEVER = "never"
    ON_PREEMPTION = "on-preemption"
    ON_FAILURE = "on-failure"


#: Environment names that gpupool owns: it sets them itself, or they would break isolation.
#: Matched case-insensitively; an entry ending in ``*`` is a prefix. Everything else is an
#: ordinary job setting, including CUDA and framework tuning (``CUDA_HOME``,
#: ``CUDA_DEVICE_MAX_CONNECTIONS``, ``CUDA_LAUNCH_BLOCKING``, ``CUDA_MODULE_LOADING``,
#: ``NVIDIA_TF32_OVERRIDE``, ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``).
RESERVED_ENV: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES",  # the slice's devices
    "CUDA_MPS_*",  # MPS pipe, SM share and pinned memory limit
    "LD_PRELOAD",  # the preload an isolation mode may use
    "LD_LIBRARY_PATH",  # where that preload and the driver's libraries are found
    "GPUPOOL_*",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",  # the soft cap for JAX
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def reserved_env_rule(name: str) -> str | None:
    """The reserved pattern ``name`` falls under, or ``None`` when the user may set it."""
    upper = name.upper()
    for rule in RESERVED_ENV:
        if rule.endswith("*"):
            if upper.startswith(rule[:-1]):
                return rule
        elif upper == rule:
            return rule
    return None


def validate_env_name(name: str) -> str:
    if not _ENV_NAME_RE.match(name):
        raise InvalidValue(
            f"environment name {name!r} is not valid: use letters, digits and '_', "
            "not starting with a digit",
            field="env",
        )
    rule = reserved_env_rule(name)
    if rule is not None:
        raise InvalidValue(
            f"environment name {name!r} is reserved ({rule} is set by gpupool): "
            "choose another name",
            field="env",
        )
    return name


SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGKILL")


def parse_signal(text: str) -> str:
    """Normalise a checkpoint signal name: ``usr1``, ``SIGUSR1`` -> ``SIGUSR1``."""
    upper = text.strip().upper()
    name = upper if upper.startswith("SIG") else "SIG" + upper
    if name not in SIGNALS:
        raise InvalidValue(
            f"{text!r} is not a checkpoint signal: use one of {', '.join(SIGNALS)}",
            field="checkpoint_signal",
        )
    return name


def _frozen_env(env: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(env))


@dataclass(frozen=True)
class JobSpec:
    """What a user asks for. Validated by :func:`gpupool.domain.jobspec.build_spec`.

    Exactly one of ``command`` (an argv list, run without a shell) and ``script`` (shell text,
    run with ``/bin/sh -c``) is set. ``tenant`` ``None`` means the submitting user's tenant.
    ``time_limit_s`` ``None`` means the pool's limit; ``expected_duration_s`` ``None`` means
    unknown (the scheduler then uses the time limit for start-time estimates).
    """

    name: str
    command: tuple[str, ...] = ()
    script: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: _frozen_env({}))
    workdir: str | None = None
    tenant: str | None = None
    pool: str = DEFAULT_POOL
    priority_class: str = DEFAULT_PRIORITY_CLASS
    resources: ResourceRequest = field(default_factory=ResourceRequest)
    replicas: int = 1
    preemptible: bool = False
    requeue: RequeuePolicy = RequeuePolicy.ON_PREEMPTION
    max_restarts: int = 3
    time_limit_s: float | None = None
    expected_duration_s: float | None = None
    checkpoint_signal: str = "SIGTERM"
    grace_period_s: float = 30.0
    isolation: IsolationMode = IsolationMode.AUTO
    # When it may start, in terms of other jobs (sbatch --dependency; gpupool.domain.dependency).
    dependency: Dependency | None = None
    # Where it may run (sbatch --nodelist / --exclude): only these nodes (empty: any), and
    # never these. Node names as the agents registered them.
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    container: ContainerSpec | None = None  # None: a bare process on the node
    # sbatch --mail-type / --mail-user (gpupool.domain.mail): moments told, and to whom
    # (an e-mail address or a webhook URL; None: the server's webhook).
    mail_type: tuple[str, ...] = ()
    mail_user: str | None = None
    # issue 27 (gpupool.domain.interactive): srun --pty's terminal (None: output to the logs
    # only, stdin /dev/null); sbatch -o/-e: patterns of files on the node the job's stdout and
    # stderr are also written to (None: none; stderr_path None with stdout_path: both in one);
    # --time-min: backfill may start it with a time limit this short (None: only its full
    # time_limit_s); --constraint: the node features it needs (None: any node).
    pty: PtyRequest | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    time_min_s: float | None = None
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", _frozen_env(self.env))

    @property
    def is_gang(self) -> bool:
        return self.replicas > 1

    @property
    def total_gpu_milli(self) -> int:
        """milli-GPU over all replicas."""
        return self.resources.gpu_milli * self.replicas

    @property
    def uses_shell(self) -> bool:
        return self.script is not None


@dataclass(frozen=True)
class Job:
    """A submitted job as the pool tracks it.

    ``version`` increases by one on every change; the store writes only when the version it
    read is still current (optimistic concurrency). ``priority`` is the numeric value of the
    spec's priority class at submit time. ``user`` submitted it; ``tenant`` is resolved.
    ``exit_code`` / ``signal`` are ``None`` until the job's processes ended.
    """

    id: str
    spec: JobSpec
    tenant: str
    user: str
    priority: int
    state: JobState = JobState.PENDING
    version: int = 1
    submit_time: float = 0.0
    eligible_time: float = 0.0  # when it last entered the queue (submit or requeue)
    start_time: float | None = None
    end_time: float | None = None
    last_checkpoint_time: float | None = None
    restart_count: int = 0
    held: bool = False
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    isolation: IsolationMode | None = None  # what the node actually enforced
    array: ArrayTask | None = None  # the job array it is a task of, if any

    def with_changes(self, **changes: object) -> Job:
        """A copy with fields changed. State changes go through ``transition()`` instead."""
        if "state" in changes or "version" in changes:
            raise ValueError("change state only through gpupool.domain.transitions.transition")
        return replace(self, **changes)  # type: ignore[arg-type]
