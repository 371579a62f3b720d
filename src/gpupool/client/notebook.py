"""Slices for notebooks: ``gpupool.allocate(gpus=0.5, gpu_memory="10GiB")``.

An **interactive allocation** is an ordinary job that holds a slice while the notebook uses it:
the server has no separate notion of one, so :func:`allocate` submits a job named
``interactive-<user>`` whose command is ``sleep`` for the hold time (``hold="8h"`` by default,
also its time limit), waits until the scheduler placed it and the agent started it, and then
sets ``CUDA_VISIBLE_DEVICES`` in *this* process to the slice's device UUIDs. CUDA reads that
variable once, when it initialises, so the allocation must come before the first CUDA call
(importing torch is fine; ``torch.cuda.init()`` or a tensor on the GPU is not):
:func:`allocate` refuses when it can tell CUDA already started. Leaving the ``with`` block (or
:meth:`Allocation.release`) cancels the job, which frees the slice, and restores the variable.

The device UUIDs come from the server (the job's ``slices``), and they must be this machine's:
on a pool of several nodes the holder job is submitted with ``nodelist`` set to **this
machine's node** (found by name, as an agent names its node by default, else by address), so the
slice is always on the GPUs this process can see. A machine that is not a node of the pool is
refused, saying so (pass ``node=`` when its agent runs under another name). Usage is accounted
to the tenant like any job.

Also sets ``GPUPOOL_ALLOCATION`` (the job id) and, for frameworks that honour it, nothing else:
memory caps are enforced by the node's isolation mode on the holder job, not in the notebook.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpupool.client.errors import ClientError
from gpupool.client.logs import PendingNotice
from gpupool.client.sdk import Client
from gpupool.domain.states import JobState
from gpupool.domain.units import parse_duration
from gpupool.schemas.jobs import JobView

_STARTED = frozenset({JobState.RUNNING})
_GONE = frozenset(s for s in JobState if s.is_terminal)


def cuda_started() -> bool:
    """True when this process visibly initialised CUDA already (torch or cupy loaded and live)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and bool(torch.cuda.is_initialized()):
            return True
    except Exception:  # a half-imported torch must not break allocate()
        return False
    return False


@dataclass
class Allocation:
    """A held slice. ``devices`` are the device UUIDs now in ``CUDA_VISIBLE_DEVICES``."""

    client: Client
    job: JobView
    devices: tuple[str, ...]
    previous_env: dict[str, str | None] = field(default_factory=dict)
    released: bool = False

    @property
    def job_id(self) -> str:
        return self.job.id

    def status(self) -> JobView:
        """The holder job as the server sees it now."""
        self.job = self.client.get(self.job.id)
        return self.job

    def release(self) -> None:
        """Cancel the holder job (freeing the slice) and restore the environment. Idempotent."""
        if self.released:
            return
        self.released = True
        for key, value in self.previous_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not JobState(self.client.get(self.job.id).state).is_terminal:
            self.client.cancel(self.job.id, reason="interactive allocation released")

    def __enter__(self) -> Allocation:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def this_node(client: Client, node: str | None = None) -> str | None:
    """The pool's node that is this machine (``node`` when given, checked), or ``None`` for a
    pool of one node (nothing to choose). Raises ``ClientError`` when it is not a node."""
    nodes = client.nodes()
    names = [n.name for n in nodes]
    if node is not None:
        if node not in names:
            raise ClientError(f"node {node!r} is not in the pool (its nodes: {', '.join(names)})")
        return node
    if len(nodes) <= 1:
        return None
    # The agent's default node name: the host name as a lowercase DNS label (agent/node.py).
    host = socket.gethostname().split(".")[0].lower()
    label = re.sub(r"[^a-z0-9-]+", "-", host).strip("-")[:63] or "node"
    if label in names:
        return label
    try:
        mine = set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        mine = set()
    found = [n.name for n in nodes if n.address and n.address in mine]
    if len(found) == 1:
        return found[0]
    raise ClientError(
        f"this machine ({label}) is not a node of the pool (its nodes: {', '.join(names)}): an "
        "allocation sets CUDA_VISIBLE_DEVICES for this process, so it must run where the slice "
        "is; run it on a node, pass node='NAME' if this machine's agent uses another name, or "
        "use gpupool run / submit for work on other nodes (gpupool run --pty bash: a shell on "
        "one)"
    )


def start_allocation(
    client: Client,
    gpus: float | str = 1,
    gpu_memory: str | None = None,
    *,
    hold: str = "8h",
    timeout_s: float = 300.0,
    **options: Any,
) -> Allocation:
    """Submit the holder job, wait for it to run, and point CUDA at its devices."""
    if cuda_started():
        raise ClientError(
            "CUDA is already initialised in this process, so CUDA_VISIBLE_DEVICES cannot change: "
            "restart the kernel and call gpupool.allocate() before the first CUDA call"
        )
    hold_s = parse_duration(hold, field="hold")
    who = client.whoami().user
    local = this_node(client, options.pop("node", None))
    if local is not None:
        options["nodelist"] = [local]
    job = client.submit(
        name=options.pop("name", f"interactive-{who}"),
        command=["sleep", str(round(hold_s))],
        gpus=str(gpus),
        gpu_memory=gpu_memory,
        time_limit=hold,
        **options,
    )
    try:
        job = client.wait(
            job.id, timeout_s=timeout_s, until=_STARTED | _GONE, on_poll=PendingNotice()
        )
        if JobState(job.state) not in _STARTED:
            raise ClientError(
                f"the allocation job {job.id} ended as {job.state} before starting "
                f"({job.reason or 'no reason given'}): see gpupool show {job.id}"
            )
        devices = _devices_of(client, job)
    except BaseException:
        if not JobState(client.get(job.id).state).is_terminal:
            client.cancel(job.id, reason="interactive allocation abandoned")
        raise
    names = ("CUDA_VISIBLE_DEVICES", "GPUPOOL_ALLOCATION")
    previous = {k: os.environ.get(k) for k in names}
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    os.environ["GPUPOOL_ALLOCATION"] = job.id
    return Allocation(client, job, devices, previous)


def _devices_of(client: Client, job: JobView) -> tuple[str, ...]:
    """The device UUIDs of the job's slices, as the server lists them (``JobView.slices``)."""
    for _ in range(20):
        if job.slices:
            return tuple(sl.device_uuid for sl in sorted(job.slices, key=lambda x: x.replica))
        client.clock.sleep(0.25)
        job = client.get(job.id)
    raise ClientError(
        f"job {job.id} is {job.state} but the server lists no device for it: "
        f"see gpupool show {job.id}"
    )


@contextmanager
def allocate(
    gpus: float | str = 1,
    gpu_memory: str | None = None,
    *,
    client: Client | None = None,
    hold: str = "8h",
    timeout_s: float = 300.0,
    **options: Any,
) -> Iterator[Allocation]:
    """Hold a slice for the ``with`` block; see the module docstring.

    Example::

        import gpupool
        with gpupool.allocate(gpus=0.5, gpu_memory="10GiB") as slice_:
            import torch
            x = torch.ones(1, device="cuda")   # runs on the slice's device
    """
    own = client is None
    gp = client or Client()
    try:
        alloc = start_allocation(gp, gpus, gpu_memory, hold=hold, timeout_s=timeout_s, **options)
        try:
            yield alloc
        finally:
            alloc.release()
    finally:
        if own:
            gp.close()
