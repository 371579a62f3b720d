"""The work a job's files cost, done by its supervisor, as the job's account, on a budget.

Unpacking a job's upload before it starts and packing its results after it ends read what a
user or a job wrote: 20,000 empty files, a ``truncate -s 3G`` file that gzips for minutes. Done
by the agent, that work held its heartbeat loop (issue 24 item 4: nodes marked down, other
tenants' jobs fenced). So the agent names these steps in the launch record (``unpack``,
``pack``) and downloads the archive in a thread of its own (:func:`gpupool.agent.unpack.
download_later`: renamed into place when whole, or ``<archive>.failed`` with the reason); the
replica's supervisor waits for it, then does the steps, in a child process of its own that:

- runs as the job's account (the one the job runs as: a hostile archive or folder can do no
  more than the job itself could), with the supervisor's file descriptors closed and no
  environment of the agent's;
- is killed when its **wall-time budget** (``max_s``) is spent, and the replica then fails
  (``boot_failed`` before the start; a results *problem* after the end) with a message that
  says which budget and what to do;
- has an **input-byte budget**: the archive's unpacked bytes (:mod:`gpupool.agent.unpack`), or
  the bytes of the files to pack, each counted at its full apparent size, sparse files too
  (:func:`gpupool.agent.results.pack_budgeted`).

Meanwhile the agent keeps its rhythm: it sees the replica ``starting`` (unpacking) or
``running`` (packing), like a program that is slow to start or to end.

The step's code is imported in the child, after the fork and before the account switch, so the
supervisor's own start-up stays light (see :mod:`gpupool.agent.jobfiles`).
"""

from __future__ import annotations

import os
import select
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Seconds an upload's unpacking, and a job's results' packing, may take.
DEFAULT_MAX_S = 300.0
#: Exit code of a step that refused its input (the message is its output).
REFUSED = 3
#: Keys of a step record in the launch record.
UNPACK = "unpack"
PACK = "pack"
#: Beside the archive: the agent could not download it (the file says why).
FAILED_SUFFIX = ".failed"


def _child(kind: str, args: dict[str, Any], account: dict[str, Any], out: int) -> int:
    """In the forked child: import the step, become the job's account, run, report on ``out``."""
    # Everything the step imports is imported here, as the supervisor's account: the job's
    # may not read the interpreter's library (tarfile imports gzip only when it opens one).
    import gzip  # noqa: F401

    if kind == UNPACK:
        from gpupool.agent.unpack import unpack_step as step
    else:
        from gpupool.agent.results import pack_step as step
    if account.get("user") is not None:
        os.setgroups(list(account.get("extra_groups") or []))
        os.setgid(int(account["group"]))
        os.setuid(int(account["user"]))
    code, data = step(args)
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]
    return code


def run_step(
    kind: str, args: dict[str, Any], account: dict[str, Any], max_s: float, cap: int
) -> tuple[bool, bytes]:
    """Run step ``kind`` (:data:`UNPACK` or :data:`PACK`) with ``args`` in a child as
    ``account`` (``{}``: this process's); returns (done, its output: the archive for a pack,
    the reason for a refusal). At most ``cap`` bytes of output are kept."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            os.environ.clear()
            code = _child(kind, args, account, write_end)
        except BaseException as exc:  # anything at all: said, never raised into the supervisor
            message = f"{type(exc).__name__}: {exc}".encode(errors="replace")[:2000]
            try:
                os.write(write_end, message)
            finally:
                os._exit(1)
        os._exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    kept = 0
    deadline = time.monotonic() + max_s
    spent = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                spent = True
                break
            ready, _, _ = select.select([read_end], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            if kept < cap:
                chunks.append(chunk[: cap - kept])
                kept += len(chunks[-1])
    finally:
        os.close(read_end)
    if spent:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    output = b"".join(chunks)
    if spent:
        what = "unpacking the upload" if kind == UNPACK else "packing the results"
        hint = (
            "upload fewer or smaller files (pack data sets apart, or read them from shared storage)"
            if kind == UNPACK
            else "leave large or many output files in shared storage, not in the job's folder"
        )
        return False, f"{what} took longer than its budget of {max_s:.0f} s: {hint}".encode()
    code = os.waitstatus_to_exitcode(status)
    return code == 0, output


def step_account(step: dict[str, Any]) -> dict[str, Any]:
    """The account a step runs as, as ``subprocess`` takes it (``{}``: the supervisor's)."""
    if step.get("uid") is None:
        return {}
    return {"user": step["uid"], "group": step["gid"], "extra_groups": step.get("groups") or []}


def upload_steps(archive: object, folder: str, account: object) -> dict[str, Any]:
    """The launch record's steps for a replica whose upload comes to ``archive`` (a path;
    ``None``: no upload, no steps), unpacked into and packed from ``folder`` as ``account``
    (an :class:`~gpupool.agent.runas.Account`; ``None``: the agent's). The steps carry their
    folder and account themselves: a container's launch record runs its program from ``/``
    as the supervisor's account (the engine switches), never where or as whom the files are."""
    if archive is None:
        return {}
    from gpupool.agent.results import MAX_INPUT_BYTES
    from gpupool.agent.runas import Account
    from gpupool.agent.unpack import DEFAULT_MAX_UNPACKED_BYTES
    from gpupool.client.pack import DEFAULT_LIMIT_BYTES

    who: dict[str, Any] = {"uid": None, "gid": None, "groups": []}
    if isinstance(account, Account):
        who = {"uid": account.uid, "gid": account.gid, "groups": list(account.groups)}
    return {
        UNPACK: {
            "archive": str(archive),
            "target": folder,
            "max_bytes": DEFAULT_MAX_UNPACKED_BYTES,
            "max_s": DEFAULT_MAX_S,
            **who,
        },
        PACK: {
            "folder": folder,
            "limit": DEFAULT_LIMIT_BYTES,
            "max_input_bytes": MAX_INPUT_BYTES,
            "max_s": DEFAULT_MAX_S,
            **who,
        },
    }
