"""Job wire models: submit, views, events, priority factors.

A submit carries the job in the same form as a job file (``spec``: the mapping a YAML job file
parses to, e.g. ``{"name": "train", "command": ["python", "train.py"], "resources":
{"gpus": "0.5"}}``), so the CLI, the SDK and the API validate it with one set of rules.
Amounts in views are integers: ``gpu_milli`` per replica, ``gpu_memory_mib`` per device.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from gpupool.schemas.base import WireModel
from gpupool.schemas.containers import ContainerWire


class SubmitJobRequest(WireModel):
    spec: dict[str, Any] = Field(description="the job, as in a job file")
    idempotency_key: str | None = Field(
        default=None,
        max_length=200,
        description="retry-safe submits: the same key returns the same job (also a header)",
    )
    workdir_upload: str | None = Field(
        default=None,
        max_length=64,
        description="an upload id from POST /v1/uploads: the job runs in that folder, unpacked",
    )
    hold: bool = Field(
        default=False,
        description="submit it held (like sbatch --hold): it waits until POST .../release",
    )
    array: str | None = Field(
        default=None,
        max_length=1000,
        description="a job array (like sbatch --array): 0-9, 0-20:5 or 1,3,8-10; one job a task",
    )
    queue_anyway: bool = Field(
        default=False,
        description=(
            "store the job even when no node of its pool could hold it (more GPU memory than "
            "any card, more GPUs or CPUs than any node, a GPU type no node has): it pends for "
            "nodes yet to join. Without it such a submit is refused (422) with the limit"
        ),
    )
    # sbatch --begin (issue 27)
    begin: float | None = Field(
        default=None,
        ge=0,
        le=253402300799,
        description="not eligible to start before this time (epoch seconds), like sbatch --begin",
    )


class UpdateJobRequest(WireModel):
    """Changes to a pending job (like scontrol update); fields left out stay as they are.
    Values as in a job file: durations like ``2h``, ``1:30:00`` or minutes.

    Other keys are let through (unlike other wire messages) so that the server can answer
    ``gpus cannot be changed on a queued job ...`` instead of a bare "extra field"."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str | None = Field(default=None, max_length=200)
    priority: str | None = Field(default=None, max_length=100, description="priority class")
    time_limit: str | float | None = None
    expected_duration: str | float | None = None
    preemptible: bool | None = None
    resources: dict[str, Any] | None = Field(
        default=None,
        description="new resources as in a job file (gpus, gpu_memory, gpu_types, cpus, "
        "memory), laid over the job's own; checked as a submit is",
    )

    def changes(self) -> dict[str, Any]:
        """The keys given, known or not (job-file keys), without those set to null."""
        return self.model_dump(exclude_none=True)


class UploadView(WireModel):
    """A stored working-directory archive (``size`` in bytes, ``sha256`` hex)."""

    upload_id: str
    size: int
    sha256: str


class FactorView(WireModel):
    name: str
    weight: float
    value: float
    contribution: float
    meaning: str


class JobSliceView(WireModel):
    """A share of one device held by one replica: ``milli`` milli-GPU, ``memory_mib`` MiB."""

    replica: int
    node: str
    device_uuid: str
    milli: int
    memory_mib: int
    spilled_bytes: int = Field(
        default=0, description="bytes held in host memory because the GPU was full (shim spill)"
    )


class JobView(WireModel):
    id: str
    name: str
    tenant: str
    user: str
    pool: str
    state: str
    state_code: str
    priority_class: str
    priority: int
    version: int
    replicas: int
    gpu_milli: int
    gpu_memory_mib: int | None
    gpu_types: list[str]
    command: list[str]
    script: str | None
    preemptible: bool
    held: bool
    submit_time: float
    eligible_time: float
    start_time: float | None
    end_time: float | None
    restart_count: int
    exit_code: int | None
    signal: str | None
    reason: str | None
    isolation: str | None
    time_limit_s: float | None
    array_id: str | None = None  # the job array it is a task of (sbatch --array)
    array_index: int | None = None
    pending_reason: str | None = None
    estimated_start: float | None = None
    nodes: list[str] = Field(default_factory=list)
    slices: list[JobSliceView] = Field(default_factory=list)
    memory_oversubscription: str = Field(
        default="fail",
        description="its pool's choice under isolation shim: an allocation that fits the slice "
        "but not the GPU fails (fail) or is served from host memory (spill)",
    )
    spilled_bytes: int = Field(default=0, description="the sum over its slices' spilled_bytes")
    priority_factors: list[FactorView] | None = None
    # issue 27: what it waits for (sbatch --dependency), as submitted
    dependency: str | None = None
    # issue 27: where it may run (sbatch --nodelist / --exclude); empty: anywhere
    nodelist: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    container: ContainerWire | None = Field(
        default=None, description="the image it runs in (submit --image); None: bare process"
    )
    # issue 27 (domain/interactive.py): -o/--error patterns, --time-min, --constraint, and
    # whether it has run --pty's terminal (its endpoint and key are never shown)
    output: str | None = None
    error: str | None = None
    time_min_s: float | None = None
    constraint: str | None = None
    pty: bool = False
    # sbatch --requeue / --max-restarts: when it goes back to the queue (never, on-preemption,
    # on-failure; None: an older server's answer), and how many restarts at most
    requeue: str | None = None
    max_restarts: int | None = None
    # sbatch --mail-type / --mail-user: the moments told, and to whom (an address, or a webhook
    # cut to its scheme and host: its path is often its secret; None: the server's webhook)
    mail_type: list[str] = Field(default_factory=list)
    mail_user: str | None = None


class SubmitJobResponse(WireModel):
    job: JobView  # an array's first task
    created: bool = Field(description="False when an earlier submit with this key made it")
    array: list[JobView] = Field(
        default_factory=list, description="every task of an array submit, in index order"
    )


class JobList(WireModel):
    jobs: list[JobView]
    next_cursor: str | None = None


class JobEventView(WireModel):
    time: float
    source: str
    target: str
    version: int
    reason: str | None


class ResizeJobRequest(WireModel):
    """A running shim job's new slice per device: ``gpus`` like ``0.5``, ``gpu_memory`` like
    ``30GiB`` (either or both)."""

    gpus: str | None = Field(default=None, max_length=32)
    gpu_memory: str | None = Field(default=None, max_length=32)


class CancelJobRequest(WireModel):
    reason: str | None = Field(default=None, max_length=500)


# ----------------------------------------------------------------- bulk (issue 27)


class BulkJobsRequest(WireModel):
    """Cancel, hold or release every job a selection names, in one transaction (like
    ``scancel -u alice -t PENDING``): ids (job or array ids) and filters, each narrowing."""

    action: Literal["cancel", "hold", "release"]
    ids: list[str] = Field(default_factory=list, max_length=10_000)
    user: str | None = Field(default=None, max_length=200)
    name: str | None = Field(default=None, max_length=200)
    states: list[str] = Field(default_factory=list, max_length=20, description="names or codes")
    array: str | None = Field(default=None, max_length=64, description="a job array's id")
    tenant: str | None = Field(default=None, max_length=64)
    pool: str | None = Field(default=None, max_length=64)
    reason: str | None = Field(default=None, max_length=500)


class BulkJobChange(WireModel):
    id: str
    name: str
    state: str
    held: bool


class BulkJobsResponse(WireModel):
    action: str
    changed: list[BulkJobChange] = Field(description="the jobs changed, with their new state")
    not_found: list[str] = Field(description="ids named that match no job you can see")
    skipped: list[BulkJobChange] = Field(
        description="jobs named by id that the action does not apply to, with their state"
    )
    refused: int = Field(description="jobs selected that you may not change")
