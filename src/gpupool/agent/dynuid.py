"""Transient accounts: one Unix UID per replica, from a reserved range, as systemd's
``DynamicUser=`` does.

A job whose submitter has no Unix account on the node (``--run-as auto``, the default of an
agent started as root) still must not run as root, nor share an account with another
tenant's job: it gets a UID of its own for as long as its replica lives.

Words:

- **range**: :data:`FIRST_UID`-:data:`LAST_UID` (61184-65519, the range systemd reserves for
  dynamic users, so no distribution hands it out). A UID is never one ``/etc/passwd`` (or
  NSS) knows.
- **lease**: the file ``<registry>/<uid>`` (made with ``O_EXCL``, so two agents of one host
  never take the same UID), holding the agent's state folder, the replica's assignment id and
  the agent process (pid and start time). The registry is host-wide (:data:`DEFAULT_REGISTRY`,
  or ``$GPUPOOL_UID_REGISTRY``), root's and ``0700``. A lease is **stale** (an agent that
  died before releasing it) when its agent process is gone, its replica's folder is gone from
  the agent's state folder, and its UID runs no process; a stale lease is taken over. A live
  agent's leases are never taken, even before its replica's folder exists.
- **release** (:meth:`UidLeases.release`, when the server has acknowledged the replica's
  end): every process still running as the UID is killed, the files it owns in the replica's
  folders go back to the agent's account, those it left in ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` are deleted, and the lease is removed. Only then may another replica get the UID,
  so nothing of one tenant is ever owned by the next tenant's job.

The account has no name, no home and no supplementary group: its group is the UID's number,
its ``HOME`` the job's working folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import threading
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("gpupool.agent")

FIRST_UID = 61184
LAST_UID = 65519
DEFAULT_REGISTRY = Path("/run/gpupool/uids")
REGISTRY_ENV = "GPUPOOL_UID_REGISTRY"
#: Where a job may leave files outside its folders (cleaned at release).
SHARED_TEMP = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


class NoFreeUid(Exception):
    """Every UID of the range is leased; the message says what to do."""


def registry_path() -> Path:
    return Path(os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY)


def processes_of(uid: int) -> list[int]:
    """The pids whose real or effective UID is ``uid`` (from ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    ids = [int(x) for x in line.split()[1:3]]
                    if uid in ids:
                        found.append(int(entry.name))
                    break
        except (OSError, ValueError):
            continue
    return found


def _started(pid: int) -> str:
    """Process ``pid``'s start time (clock ticks since boot), ``""`` when it is gone: with the
    pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def _known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


class UidLeases:
    """The leases of one agent (see the module docstring)."""

    def __init__(self, state_dir: Path, registry: Path | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.registry = registry or registry_path()

    def _open_registry(self) -> None:
        self.registry.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.registry.chmod(0o700)

    def _stale(self, lease: Path, uid: int) -> bool:
        try:
            held = json.loads(lease.read_text())
            replica = Path(held["state_dir"]) / "jobs" / held["key"]
            holder = (int(held["pid"]), str(held["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            return not processes_of(uid)
        if _started(holder[0]) == holder[1]:
            return False  # its agent lives and releases it
        return not replica.exists() and not processes_of(uid)

    def allocate(self, key: str) -> int:
        """A UID of the range for replica ``key``, leased until :meth:`release`."""
        self._open_registry()
        size = LAST_UID - FIRST_UID + 1
        start = zlib.crc32(key.encode()) % size  # spread agents over the range
        me = os.getpid()
        record = json.dumps(
            {"state_dir": str(self.state_dir), "key": key, "pid": me, "started": _started(me)}
        )
        for step in range(size):
            uid = FIRST_UID + (start + step) % size
            lease = self.registry / str(uid)
            if _known(uid):
                continue
            if lease.exists():
                if not self._stale(lease, uid):
                    continue
                lease.unlink(missing_ok=True)
            try:
                fd = os.open(lease, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # another agent took it just now
            with os.fdopen(fd, "w") as f:
                f.write(record)
            if processes_of(uid):  # a process nobody leased (another tool): leave the UID
                lease.unlink(missing_ok=True)
                continue
            return uid
        raise NoFreeUid(
            f"all {size} transient UIDs ({FIRST_UID}-{LAST_UID}) are leased on this host: "
            f"wait for jobs to end, or remove stale leases in {self.registry}"
        )

    def leased(self, key: str) -> int | None:
        """The UID leased to replica ``key`` by this agent, if any."""
        if not self.registry.is_dir():
            return None
        for lease in self.registry.iterdir():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                held = json.loads(lease.read_text())
                if held["key"] == key and held["state_dir"] == str(self.state_dir):
                    return int(lease.name)
        return None

    def keys(self) -> list[str]:
        """The replicas this agent (its state folder) holds leases for."""
        found = []
        if self.registry.is_dir():
            for lease in self.registry.iterdir():
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    held = json.loads(lease.read_text())
                    if held["state_dir"] == str(self.state_dir):
                        found.append(str(held["key"]))
        return sorted(found)

    def release(self, key: str, folders: Iterable[Path]) -> int | None:
        """End replica ``key``'s lease (see **release**); returns the UID, or ``None`` when it
        had none. ``folders``: the replica's folders, given back to the agent's account."""
        uid = self.leased(key)
        if uid is None:
            return None
        for _ in range(20):  # processes may fork while being killed: until none is left
            pids = processes_of(uid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        me, group = os.geteuid(), os.getegid()
        for folder in folders:
            _give_back(folder, uid, me, group)
        for temp in SHARED_TEMP:
            _remove_owned(temp, uid)
        (self.registry / str(uid)).unlink(missing_ok=True)
        return uid


def release_replica(leases: UidLeases, key: str, job_id: str, checkpoint_dir: str | None) -> None:
    """Delete replica ``key``'s copy of its upload and end its lease, in the background; its
    folders (``work/<job id>``, the checkpoint folder) go back to the agent."""
    from gpupool.agent.unpack import remove_copy

    work = leases.state_dir / "work"
    folders = [work / job_id] if job_id else []
    folders += [Path(checkpoint_dir)] if checkpoint_dir else []
    first = (lambda: remove_copy(work, job_id, key)) if job_id else None
    release_later(leases, key, folders, first)


def release_orphans(leases: UidLeases, adopted: Iterable[str], done_dir: Path) -> None:
    """At an agent's start: end the leases an earlier agent held for replicas it did not adopt
    (they ended, and that agent stopped before releasing them)."""
    for key in sorted(set(leases.keys()) - set(adopted)):
        try:
            record = json.loads((done_dir / key / "assignment.json").read_text())
        except (OSError, ValueError):
            record = {}
        assignment = record.get("assignment") or {}
        release_replica(
            leases, key, str(assignment.get("job_id") or ""), record.get("checkpoint_dir")
        )


def release_later(
    leases: UidLeases, key: str, folders: list[Path], first: Callable[[], None] | None = None
) -> threading.Thread:
    """:meth:`UidLeases.release` in a thread of its own (it walks folders and ``/proc``: not
    on the agent's heartbeat path), after ``first`` (deleting the replica's copy)."""

    def run() -> None:
        try:
            if first is not None:
                first()
            uid = leases.release(key, folders)
            if uid is not None:
                log.info("%s: transient account %d released", key, uid)
        except Exception:  # the lease stays, and is taken over once stale
            log.exception("releasing the account of %s failed", key)

    thread = threading.Thread(target=run, name=f"gpupool-release-{key}", daemon=True)
    thread.start()
    return thread


def _give_back(folder: Path, uid: int, owner: int, group: int) -> None:
    """Files of ``uid`` below ``folder`` (not following links) go to ``owner``, private."""
    try:
        was_its = folder.lstat().st_uid == uid
    except OSError:
        return
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files, ""]:
            path = os.path.join(root, name) if name else root
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if info.st_uid == uid:
                    os.lchown(path, owner, group)
    if was_its:  # a folder it was given (not a parent other replicas pass through)
        with contextlib.suppress(OSError):
            folder.chmod(0o700)


def _remove_owned(temp: Path, uid: int) -> None:
    """Delete what ``uid`` left at the top of a shared temporary folder."""
    with contextlib.suppress(OSError):
        for entry in temp.iterdir():
            with contextlib.suppress(OSError):
                if entry.lstat().st_uid != uid:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()
