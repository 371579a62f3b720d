"""The executor: launches replicas through supervisors, stops them, and re-adopts them.

It owns ``<state>/jobs/``. Each replica has a job folder (:mod:`gpupool.agent.jobdir`) keyed by
its assignment id and one supervisor process (:mod:`gpupool.agent.supervisor`) started in a
session of its own, so replicas outlive the agent. After an agent restart :meth:`Executor.adopt`
finds every job folder again; a replica whose supervisor still runs is followed as before, one
whose supervisor ended has its recorded result, and none is ever started twice.

Words: **key** is the assignment id; a replica is **live** while its supervisor runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.jobdir import (
    BOOT_FAILED,
    EXITED,
    RUNNING,
    STARTING,
    JobDir,
    LaunchSpec,
    ProcessState,
    StopRequest,
    write_json,
)
from gpupool.agent.jobfiles import PREPARE_LOG, read_json
from gpupool.runtime.cgroups import JobCgroups, open_cgroups
from gpupool.runtime.procs import is_alive, marked

#: The variable every job process inherits, set to its replica's folder (unique on this
#: machine, also with several agents on it): finds a job's processes after they left its
#: session.
MARKER = "GPUPOOL_REPLICA_DIR"

#: Finished replica folders kept under ``done/`` for their logs.
KEEP_DONE = 500
#: Starts the supervisor from inside the replica's cgroup: the wrapper moves itself there, then
#: becomes the supervisor (same pid), so the job is born in the cgroup.
_IN_CGROUP = (
    "import os, sys\n"
    "try:\n"
    "    open(sys.argv[1], 'w').write(str(os.getpid()) + '\\n')\n"
    "except OSError as exc:\n"
    "    print(f'gpupool: not in its cgroup: {exc}', file=sys.stderr)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'gpupool.agent.supervisor', sys.argv[2]])\n"
)


def _ended(key: str, state: ProcessState) -> Observed:
    """What an ended replica's recorded state says."""
    return Observed(
        key,
        state.status,
        state.pid,
        state.exit_code,
        state.signal,
        state.stop_reason,
        state.reason,
        state.started_at,
        bool(state.final),
    )


_SUPERVISOR_GONE = (
    "its supervisor process ended without recording a result (killed, or the node rebooted)"
)


@dataclass(frozen=True)
class Observed:
    """What the executor knows about one replica now."""

    key: str
    status: str  # STARTING, RUNNING, BOOT_FAILED or EXITED (jobdir constants)
    pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    stop_reason: str | None = None
    reason: str | None = None
    started_at: float | None = None
    final: bool = False  # a boot failure no new attempt would escape (ProcessState.final)


def _last_line(path: Path) -> str | None:
    """The last line of a starting replica's ``prepare.log`` (a container's pull progress),
    reported as its progress; ``None`` when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1][:500] if lines else None


class Executor:
    """Starts and follows supervisors for the replicas of this node."""

    def __init__(
        self,
        state_dir: Path,
        *,
        python: str | None = None,
        cgroups: JobCgroups | bool | None = True,
    ) -> None:
        self.jobs_dir = state_dir / "jobs"
        self.done_dir = state_dir / "done"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.done_dir.mkdir(parents=True, exist_ok=True)
        self._python = python or sys.executable
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # supervisors we started
        self._stopping: set[str] = set()
        #: A cgroup per replica where the node allows it (``True``: find out; ``False``: none).
        self.cgroups: JobCgroups | None = open_cgroups() if cgroups is True else (cgroups or None)

    def jobdir(self, key: str) -> JobDir:
        return JobDir(self.jobs_dir / key)

    def known(self) -> list[str]:
        """Keys of every job folder, launched by this agent or an earlier one."""
        return sorted(p.name for p in self.jobs_dir.iterdir() if (p / "launch.json").exists())

    def launch(self, key: str, spec: LaunchSpec, assignment: dict[str, object]) -> None:
        """Create the job folder and start its supervisor. A known key is never relaunched."""
        jd = self.jobdir(key)
        if jd.launch.exists():
            return
        jd.path.mkdir(parents=True, exist_ok=True)
        write_json(jd.assignment, assignment)
        write_json(jd.launch, spec.to_json())
        argv = [self._python, "-m", "gpupool.agent.supervisor", str(jd.path)]
        if self.cgroups is not None:
            procs = self.cgroups.path(key) / "cgroup.procs"
            with contextlib.suppress(OSError):
                procs.parent.mkdir(parents=True, exist_ok=True)
            argv = [self._python, "-c", _IN_CGROUP, str(procs), str(jd.path)]
        self._children[key] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(jd.path / "supervisor.log", "ab"),  # noqa: SIM115 - the child owns it
            start_new_session=True,
            close_fds=True,
        )

    def record_boot_failure(
        self, key: str, reason: str, assignment: dict[str, object], *, final: bool = False
    ) -> None:
        """Record a replica the agent refused to start (bad workdir, isolation unavailable);
        ``final``: no new attempt would escape it (see ProcessState.final)."""
        jd = self.jobdir(key)
        if jd.launch.exists():
            return
        jd.path.mkdir(parents=True, exist_ok=True)
        write_json(jd.assignment, assignment)
        jd.write_state(ProcessState(status=BOOT_FAILED, reason=reason, final=final or None))
        write_json(jd.launch, {"refused": True})

    def stop(self, key: str, *, reason: str, signal_name: str, grace_s: float) -> bool:
        """Ask the replica's supervisor to stop it; False when there is nothing to stop."""
        jd = self.jobdir(key)
        state = jd.read_state()
        if state is not None and state.finished:
            return False
        if key in self._stopping or jd.stop.exists():
            return True  # already stopping: a repeated order changes nothing
        jd.write_stop(StopRequest(reason, signal_name, grace_s))
        self._stopping.add(key)
        if state is not None and state.supervisor_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.supervisor_pid, signal.SIGUSR1)
        return True

    def signal(self, key: str, signal_name: str) -> None:
        """Send a signal to the replica's process group without stopping it (watchdog)."""

        state = self.jobdir(key).read_state()
        if state is None or state.pid is None or state.finished:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(state.pid, getattr(signal, signal_name, signal.SIGTERM))

    def kill_leftovers(self, key: str) -> list[int]:
        """SIGKILL what is left of the replica: its cgroup's members (where the node has
        cgroup v2, sparing the supervisor), and every process carrying its :data:`MARKER`;
        returns their pids.

        The supervisor kills the job's process group when the job ends; a child that called
        ``setsid()`` is not in it, and would keep the GPU (and its memory) busy.
        """
        killed = []
        if self.cgroups is not None:
            state = self.jobdir(key).read_state()
            supervisor = state.supervisor_pid if state is not None else None
            ticks = state.supervisor_ticks if state is not None else None
            alive = supervisor is not None and is_alive(supervisor, ticks)
            killed += self.cgroups.kill(key, spare=supervisor if alive else None)
            if not alive:
                self.cgroups.remove(key)
        for pid in marked(MARKER, str(self.jobdir(key).path)):
            if pid in killed:
                continue
            if pid == os.getpid():
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def is_stopping(self, key: str) -> bool:
        return key in self._stopping or self.jobdir(key).stop.exists()

    def observe(self, key: str) -> Observed:
        """The replica's status from its state file and its supervisor's liveness."""
        child = self._children.get(key)
        if child is not None and child.poll() is not None:
            del self._children[key]  # reaped; the state file has the result
        jd = self.jobdir(key)
        state = jd.read_state()
        if state is None:
            if child is not None and child.returncode is None:
                return Observed(key, STARTING)
            return Observed(key, EXITED, reason=_SUPERVISOR_GONE)
        if state.finished:
            return _ended(key, state)
        alive = (child is not None and child.returncode is None) or (
            state.supervisor_pid is not None
            and is_alive(state.supervisor_pid, state.supervisor_ticks)
        )
        if alive:
            status = RUNNING if state.status == RUNNING else STARTING
            progress = _last_line(jd.path / PREPARE_LOG) if status == STARTING else None
            return Observed(key, status, state.pid, reason=progress, started_at=state.started_at)
        # The supervisor may have recorded its result and exited between the read above and
        # the liveness check: it writes the result before it exits, so read once more.
        again = jd.read_state()
        if again is not None and again.finished:
            return _ended(key, again)
        # The supervisor died without a result: make sure nothing of the job is left.
        if state.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state.pid, signal.SIGKILL)
        self._run_cleanup(jd)  # a container's: remove it, as its supervisor would have
        lost = ProcessState(
            status=EXITED, pid=state.pid, started_at=state.started_at, reason=_SUPERVISOR_GONE
        )
        jd.write_state(lost)
        return Observed(
            key, EXITED, state.pid, reason=_SUPERVISOR_GONE, started_at=state.started_at
        )

    def _run_cleanup(self, jd: JobDir) -> None:
        """Run the launch record's ``cleanup`` steps (a container job's engine commands) for a
        replica whose supervisor died before it could; each at most a minute, best effort."""
        record = read_json(jd.launch) or {}
        steps = record.get("cleanup") or []
        env = record.get("env") if isinstance(record.get("env"), dict) else None
        for argv in steps if isinstance(steps, list) else []:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired, TypeError, ValueError):
                subprocess.run(
                    [str(a) for a in argv],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=60,
                    check=False,
                )

    def forget(self, key: str) -> None:
        """Move a finished replica's folder to ``done/`` (the server acknowledged its end).

        Its logs stay readable there; only the newest ``KEEP_DONE`` folders are kept.
        """
        self._stopping.discard(key)
        self._children.pop(key, None)
        if self.cgroups is not None:
            self.cgroups.remove(key)
        src = self.jobdir(key).path
        if not src.exists():
            return
        dst = self.done_dir / key
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(src, dst)
        done = sorted(self.done_dir.iterdir(), key=lambda p: p.stat().st_mtime)
        for old in done[: max(0, len(done) - KEEP_DONE)]:
            shutil.rmtree(old, ignore_errors=True)

    def log_path(self, key: str, stream: str = "stdout") -> Path | None:
        """Where a replica's log is, live or done; ``None`` when it is unknown."""
        for base in (self.jobs_dir, self.done_dir):
            path = base / key / f"{stream}.log"
            if path.exists():
                return path
        return None

    def live_supervisors(self) -> int:
        return sum(1 for c in self._children.values() if c.poll() is None)


__all__ = ["EXITED", "RUNNING", "STARTING", "Executor", "Observed"]
