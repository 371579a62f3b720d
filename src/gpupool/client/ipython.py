"""The IPython extension: ``%load_ext gpupool`` and the ``%gpupool`` line magic.

Commands (one allocation per kernel at a time)::

    %gpupool alloc 0.5 10GiB      # hold half a GPU with 10 GiB; sets CUDA_VISIBLE_DEVICES
    %gpupool status               # the allocation's job, state and devices
    %gpupool release              # free it (also done when the kernel exits)

The magic's work is in :class:`Magic` (plain methods returning the text to show), so it is
usable and testable without IPython; :func:`load_ipython_extension` only registers it.
"""

from __future__ import annotations

import atexit
import contextlib
import shlex
from typing import Any

from gpupool.client.errors import ClientError
from gpupool.client.notebook import Allocation, start_allocation
from gpupool.client.sdk import Client
from gpupool.domain.errors import GpupoolError
from gpupool.domain.units import format_gpus, format_memory

USAGE = "usage: %gpupool alloc GPUS [GPU_MEMORY] [hold=8h] | %gpupool status | %gpupool release"


class Magic:
    """State of the ``%gpupool`` magic in one kernel."""

    def __init__(self, client_factory: Any = Client) -> None:
        self._factory = client_factory
        self._client: Client | None = None
        self.allocation: Allocation | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def run(self, line: str) -> str:
        """Run one ``%gpupool`` line; errors come back as one ``error: ...`` line."""
        words = shlex.split(line)
        if not words:
            return USAGE
        command, args = words[0], words[1:]
        handler = {"alloc": self.alloc, "status": self.status, "release": self.release}.get(command)
        if handler is None:
            return f"error: unknown command {command!r}; {USAGE}"
        try:
            return handler(args)
        except GpupoolError as exc:
            return f"error: {exc}"

    def alloc(self, args: list[str]) -> str:
        if self.allocation is not None and not self.allocation.released:
            raise ClientError(
                f"already holding job {self.allocation.job_id}: %gpupool release it first"
            )
        positional = [a for a in args if "=" not in a]
        options: dict[str, Any] = dict(a.split("=", 1) for a in args if "=" in a)
        if not positional or len(positional) > 2:
            raise ClientError(USAGE)
        hold = options.pop("hold", "8h")
        self.allocation = start_allocation(
            self.client,
            positional[0],
            positional[1] if len(positional) > 1 else None,
            hold=hold,
            **options,
        )
        return self._describe(self.allocation)

    def status(self, _args: list[str]) -> str:
        if self.allocation is None or self.allocation.released:
            return "no allocation: %gpupool alloc 0.5 10GiB"
        self.allocation.status()
        return self._describe(self.allocation)

    def release(self, _args: list[str]) -> str:
        if self.allocation is None or self.allocation.released:
            return "no allocation to release"
        job_id = self.allocation.job_id
        self.allocation.release()
        return f"released job {job_id}; CUDA_VISIBLE_DEVICES restored"

    def close(self) -> None:
        if self.allocation is not None:
            with contextlib.suppress(GpupoolError):
                self.allocation.release()
        if self._client is not None:
            self._client.close()

    @staticmethod
    def _describe(a: Allocation) -> str:
        j = a.job
        mem = format_memory(j.gpu_memory_mib) if j.gpu_memory_mib is not None else "share"
        return (
            f"job {j.id} {j.state}: {format_gpus(j.gpu_milli)} GPU, {mem}, on "
            f"{', '.join(j.nodes) or '?'}; CUDA_VISIBLE_DEVICES={','.join(a.devices)}"
        )


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%gpupool`` in an IPython shell (called by ``%load_ext gpupool``)."""
    magic = Magic()
    atexit.register(magic.close)

    def gpupool_magic(line: str) -> None:
        print(magic.run(line))

    ipython.register_magic_function(gpupool_magic, magic_kind="line", magic_name="gpupool")
    ipython.user_ns.setdefault("_gpupool_magic", magic)


def unload_ipython_extension(ipython: Any) -> None:
    magic = ipython.user_ns.pop("_gpupool_magic", None)
    if isinstance(magic, Magic):
        magic.close()
