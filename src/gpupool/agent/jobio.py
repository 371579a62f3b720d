"""A job's output on its node, for the supervisor: the capped log files the agent ships to
the server (:class:`Log`, :func:`pump`), and the job's own ``-o``/``--error`` files
(:func:`open_output_files`), which get every byte.

Imported by the supervisor at every job start: ``os`` only (see
:mod:`gpupool.agent.supervisor` on start-up cost).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # ``typing`` costs start-up time: only mypy reads this
if TYPE_CHECKING:
    from typing import IO, Any


class Log:
    """A stream's log file ``path``, keeping at most ``cap`` bytes, and a copy of every byte
    to the job's own ``-o``/``-e`` file (``also``, a descriptor; ``None``: none), uncapped.

    Past the cap the rest is discarded (the job never blocks on a full pipe), and at the end
    one line says exactly how many bytes were discarded after which byte."""

    def __init__(self, path: str, cap: int, also: int | None) -> None:
        self.path, self.cap, self.also = path, cap, also
        self.out = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        self.written = 0
        self.discarded = 0

    def write(self, chunk: bytes) -> None:
        room = max(0, self.cap - self.written)
        if room:
            self.out.write(chunk[:room])
            self.written += min(len(chunk), room)
        self.discarded += max(0, len(chunk) - room)
        if self.also is not None:
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self.also, view) :]
            except OSError:
                self.also = None  # a full disk in the user's folder: the log goes on

    def close(self) -> None:
        if self.discarded:
            stream = os.path.splitext(os.path.basename(self.path))[0]  # stdout or stderr
            self.out.write(
                f"\n[gpupool: {stream} reached its cap of {self.cap} bytes (the agent's "
                f"--log-cap); the {self.discarded} bytes written after byte {self.cap} were "
                "discarded]\n".encode()
            )
        self.out.close()


def pump(source: IO[bytes], log: Log) -> None:
    """Copy ``source`` into ``log`` until EOF."""
    try:
        while True:
            chunk = source.read1(65536) if hasattr(source, "read1") else source.read(65536)
            if not chunk:
                break
            log.write(chunk)
    finally:
        log.close()


def open_output_files(spec: dict[str, Any]) -> tuple[int | None, int | None] | str:
    """The job's ``-o``/``--error`` files (descriptors; ``None``: none), opened as the job's
    account (never as root in a user's folder), or why they cannot be: a boot failure
    that another attempt would meet again."""
    paths = (spec["stdout_file"], spec["stderr_file"])
    if not any(paths):
        return None, None
    fds: list[int | None] = []
    uid, gid = spec["uid"], spec["gid"]
    switch = uid is not None and os.geteuid() == 0
    groups = os.getgroups()
    try:
        if switch:  # the job's account with its groups, for the opens only
            os.setgroups(spec["groups"] or [])
            os.setegid(gid if gid is not None else os.getegid())
            os.seteuid(uid)
        for i, path in enumerate(paths):
            if path is None or (i == 1 and path == paths[0]):
                fds.append(fds[0] if path is not None else None)
                continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
            fds.append(os.open(path, flags, 0o644))
    except OSError as exc:
        for fd in set(fds) - {None}:
            os.close(fd)  # type: ignore[arg-type]
        which = "-o" if len(fds) == 0 else "--error"
        return (
            f"cannot open the {which} file {exc.filename or paths[len(fds)]}: "
            f"{exc.strerror or exc} (give a path the job's account may write, e.g. in its "
            "start folder)"
        )
    finally:
        if switch:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups(groups)
    return fds[0], fds[1]
