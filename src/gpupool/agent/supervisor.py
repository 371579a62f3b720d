"""The per-replica supervisor: ``python -m gpupool.agent.supervisor JOBDIR``.

The agent starts one supervisor per replica in a session of its own, so it survives the agent
being restarted or killed. The supervisor:

1. reads ``launch.json`` and starts the job's program (argv, no shell unless the argv is one)
   in a *new session and process group* whose id is the job's pid, with stdin from
   ``/dev/null`` and stdout/stderr piped into capped log files;
2. records the job's pid in ``state.json`` (``running``), or ``boot_failed`` with the reason;
3. waits for the job to end, acting meanwhile on the time limit and on stop requests
   (``stop.json``, announced with ``SIGUSR1``): send the stop signal to the group, wait the
   grace, then ``SIGKILL`` the group;
4. kills whatever is left of the group, and records the exit code or the signal that ended the
   job and the stop reason (``exited``).

A container job (see :mod:`gpupool.containers.engines`) adds three things to the launch record,
all engine commands the agent made: ``prepare`` steps run before the program (pull the image
when the node lacks it, create the container; their stderr goes to ``prepare.log``, a failure
is a boot failure with the engine's message, a stop request ends them), ``cleanup`` steps run
after it however it ended (remove the container, so a ``SIGKILL`` of the attached engine client
never leaves the container running), and ``boot_failure``: the exit codes and first words of
stderr that mean the engine could not start the container's command (a missing entrypoint),
recorded as a boot failure with the end of its stderr.

The job is never relaunched: a supervisor runs its program once. ``SIGTERM`` to the supervisor
itself stops the job like a ``cancel`` (so a supervisor is never orphaned from its job).
About once a second it also reads its agent's last contact with the server (``contact.json``
in the state folder) and stops the job with the reason ``node`` when the server has been silent
for half its node timeout: the agent's fence, kept when the agent itself is gone (see
:mod:`gpupool.agent.fence`).

Every job start pays for this interpreter's start-up, so the module imports only what it
uses: the file format through :mod:`gpupool.agent.jobfiles` (dicts and ``str`` paths, no
``pathlib``, ``dataclasses`` or ``typing``) and the real clock from
:mod:`gpupool.domain.clocks`. ``tests/agent/test_supervisor_startup.py`` checks the list.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

from gpupool.agent import jobfiles, jobio, jobsteps
from gpupool.agent.jobfiles import BOOT_FAILED, EXITED, RUNNING, STARTING, read_json
from gpupool.domain.clocks import SystemClock
from gpupool.runtime.procs import start_ticks

TYPE_CHECKING = False  # ``typing`` costs start-up time: only mypy reads this
if TYPE_CHECKING:
    from typing import Any


#: Seconds between two reads of the agent's contact record.
FENCE_POLL_S = 1.0


def _tail(path: str, size: int = 1500) -> str:
    """The last ``size`` bytes of ``path`` as text, its last lines whole ("" when none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


def _never_ran(rule: dict[str, Any], code: int | None, stderr: str) -> str | None:
    """The boot failure's reason when the program's end matches ``rule`` (a launch record's
    ``boot_failure``: its program never started), else ``None``."""
    if not rule or code is None or code == 0:
        return None
    tail = _tail(stderr)
    starts = rule.get("stderr_starts", [])
    if code in rule.get("exit_codes", []) or any(tail.startswith(s) for s in starts):
        return f"{rule.get('what', 'the program did not start')}: {tail or f'exit {code}'}"
    return None


def _no_op(signum: int, frame: object) -> None:
    """The supervisor's SIGINT: nothing (see :meth:`Supervisor.run`)."""


def _signal_number(name: str) -> int:
    try:
        return int(getattr(signal, name))
    except (AttributeError, TypeError):
        return int(signal.SIGTERM)


def _killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class Supervisor:
    """Runs the program of the job folder ``path`` once (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.clock = SystemClock()
        self.wake = threading.Event()
        self.terminate_requested = False

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _write(self, **fields: object) -> None:
        """Record the state. Only a result (exited, boot failed) is made durable: after a node
        crash the supervisor is gone and a ``starting`` or ``running`` record means the same
        as none (the agent reports the replica lost), so those skip the ``fsync``."""
        base = {
            "supervisor_pid": os.getpid(),
            "supervisor_ticks": start_ticks(os.getpid()),
        }
        record = jobfiles.state_record({**base, **fields})
        durable = record["status"] in (EXITED, BOOT_FAILED)
        jobfiles.write_json(self._file(jobfiles.STATE), record, durable=durable)

    def _fence(self, spec: dict[str, Any]) -> tuple[str, str, float] | None:
        """A ``node`` stop when the agent's record says the server went silent (see above)."""
        state_dir = os.path.dirname(os.path.dirname(os.path.abspath(self.path)))
        contact = read_json(os.path.join(state_dir, jobfiles.CONTACT))
        grace = jobfiles.fence_stop(contact, self.clock.monotonic(), spec["grace_s"])
        return None if grace is None else ("node", spec["stop_signal"], grace)

    def _read_stop(self) -> tuple[str, str, float] | None:
        """The agent's stop request (reason, signal name, grace in s), or ``None``."""
        data = read_json(self._file(jobfiles.STOP))
        return jobfiles.stop_record(data) if data is not None else None

    def run(self) -> int:
        data = read_json(self._file(jobfiles.LAUNCH))
        if data is None:
            self._write(status=BOOT_FAILED, reason="launch.json is missing or unreadable")
            return 1
        try:
            spec = jobfiles.launch_record(data)
        except ValueError as exc:
            self._write(status=BOOT_FAILED, reason=str(exc), ended_at=self.clock.now())
            return 1
        signal.signal(signal.SIGUSR1, lambda *_: self.wake.set())
        signal.signal(signal.SIGTERM, self._on_term)
        # A Ctrl-C meant for the agent's terminal must not end the supervisor; a handler that
        # does nothing, not SIG_IGN: an ignored signal stays ignored across exec, and the job
        # (Python's KeyboardInterrupt, a --checkpoint-signal SIGINT) would never see one.
        signal.signal(signal.SIGINT, _no_op)
        self._write(status=STARTING)
        account: dict[str, Any] = {}
        if spec["uid"] is not None:  # the job's own account; groups first, then gid, uid
            account = {"user": spec["uid"], "group": spec["gid"], "extra_groups": spec["groups"]}
        refused = self._unpack(spec)  # at once without an upload
        early = self._read_stop() or (("cancel", "", 0.0) if self.terminate_requested else None)
        if early is not None:  # stopped before it started (while its upload came): never start
            self._write(
                status=EXITED,
                stop_reason=early[0],
                ended_at=self.clock.now(),
                reason="stopped before its program started",
            )
            return 0
        if refused is not None:
            self._write(status=BOOT_FAILED, reason=refused, ended_at=self.clock.now())
            return 1
        failed = self._prepare(spec)
        if failed is not None:
            stop_reason, reason = failed
            self._cleanup(spec)
            self._write(
                status=EXITED if stop_reason else BOOT_FAILED,
                stop_reason=stop_reason,
                reason=reason,
                ended_at=self.clock.now(),
            )
            return 0
        files = jobio.open_output_files(spec)
        if isinstance(files, str):
            self._cleanup(spec)
            self._write(status=BOOT_FAILED, reason=files, ended_at=self.clock.now(), final=True)
            return 1
        terminal = self._terminal(spec, files)
        started_at = self.clock.now()
        stdio: dict[str, Any] = (
            {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            if terminal is None
            else terminal.stdio()
        )
        try:
            proc = subprocess.Popen(
                spec["argv"],
                cwd=spec["cwd"],
                env=spec["env"],
                start_new_session=True,
                close_fds=True,
                **stdio,
                **account,
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in argv or env
            what = spec["argv"][0] if spec["argv"] else "(empty command)"
            hint = "check the program name and PATH" if isinstance(exc, FileNotFoundError) else ""
            why = exc.strerror if isinstance(exc, OSError) else None
            self._cleanup(spec)
            self._write(
                status=BOOT_FAILED,
                reason=f"cannot start {what!r} in {spec['cwd']}: {why or exc}"
                + (f" ({hint})" if hint else ""),
                ended_at=self.clock.now(),
            )
            return 1
        finally:
            if terminal is not None:
                terminal.started()
        self._write(status=RUNNING, pid=proc.pid, started_at=started_at)
        pumps: list[threading.Thread] = []
        if terminal is None:
            assert proc.stdout is not None
            assert proc.stderr is not None
            cap = spec["log_cap_bytes"]
            pumps = [
                threading.Thread(
                    target=jobio.pump, args=(s, jobio.Log(self._file(p), cap, also)), daemon=True
                )
                for s, p, also in (
                    (proc.stdout, jobfiles.STDOUT, files[0]),
                    (proc.stderr, jobfiles.STDERR, files[1]),
                )
            ]
            for t in pumps:
                t.start()
        else:
            terminal.relay.start(proc.pid)
        waiter = threading.Thread(target=self._wait_for, args=(proc,), daemon=True)
        waiter.start()
        stop_reason, kill_at = self._supervise(proc, spec)
        _killpg(proc.pid, signal.SIGKILL)  # leftovers of the group: free the GPU
        self._cleanup(spec)
        for t in pumps:
            t.join(timeout=5.0)
        if terminal is not None:
            terminal.close()
        for fd in set(files) - {None}:
            with contextlib.suppress(OSError):
                os.close(fd)  # type: ignore[arg-type]
        self._pack(spec)
        code = proc.returncode
        never_ran = _never_ran(spec["boot_failure"], code, self._file(jobfiles.STDERR))
        if stop_reason is None and never_ran is not None:
            self._write(
                status=BOOT_FAILED, pid=proc.pid, ended_at=self.clock.now(), reason=never_ran,
                final=True,  # the image lacks the program: another attempt would fail the same
            )  # fmt: skip
            return 0
        self._write(
            status=EXITED,
            pid=proc.pid,
            started_at=started_at,
            ended_at=self.clock.now(),
            exit_code=code if code is not None and code >= 0 else None,
            signal=signal.Signals(-code).name if code is not None and code < 0 else None,
            stop_reason=stop_reason,
            reason="killed after its grace period" if kill_at == "killed" else None,
        )
        return 0

    def _terminal(self, spec: dict[str, Any], files: tuple[int | None, int | None]) -> Any:
        """``run --pty``'s terminal and its relay (:mod:`gpupool.agent.ptyrelay`), connected
        before the program starts; ``None`` for a job without one."""
        if not spec["pty"]:
            return None
        from gpupool.agent.ptyrelay import Terminal  # only jobs with a terminal pay for it

        log = jobio.Log(self._file(jobfiles.STDOUT), spec["log_cap_bytes"], files[0])
        return Terminal.open(spec, log, self._file(jobfiles.STDERR))

    def _unpack(self, spec: dict[str, Any]) -> str | None:
        """Unpack the job's upload into its folder first (see :mod:`gpupool.agent.jobsteps`:
        the step names its folder and account, which a container's launch record does not);
        the reason when that failed, else ``None``."""
        step = spec["unpack"]
        if not step:
            return None
        missing = self._wait_for_upload(step["archive"], step["max_s"])
        if missing is not None:
            return missing
        args = {k: step[k] for k in ("archive", "target", "max_bytes")}
        try:
            done, said = jobsteps.run_step(
                jobsteps.UNPACK, args, jobsteps.step_account(step), step["max_s"], 4000
            )
        finally:
            with contextlib.suppress(OSError):
                os.unlink(step["archive"])
        if done:
            return None
        return said.decode(errors="replace").strip() or "the upload could not be unpacked"

    def _wait_for_upload(self, archive: str, max_s: float) -> str | None:
        """Wait for the agent to finish downloading the upload (it renames the archive into
        place, or writes ``<archive>.failed`` with the reason); the reason it did not come, or
        ``None``. A stop request ends the wait (the caller sees it)."""
        failed = archive + jobsteps.FAILED_SUFFIX
        deadline = self.clock.monotonic() + max_s
        while not os.path.exists(archive):
            if os.path.exists(failed):
                with open(failed, encoding="utf-8", errors="replace") as f:
                    why = f.read(2000).strip()
                with contextlib.suppress(OSError):
                    os.unlink(failed)
                return why or "the upload could not be downloaded"
            if self.clock.monotonic() > deadline:
                return (
                    f"the upload did not reach the node within {max_s:.0f} s: check the "
                    "network between the node and the server, and submit again"
                )
            if self.terminate_requested or os.path.exists(self._file(jobfiles.STOP)):
                return "stopped"
            self.wake.wait(0.1)
        return None

    def _pack(self, spec: dict[str, Any]) -> None:
        """Pack the job's folder as its results (see :mod:`gpupool.agent.jobsteps`) into the
        job folder, or write why not, for the agent to send."""
        step = spec["pack"]
        if not step:
            return
        args = {
            "folder": step["folder"],
            "limit": step["limit"],
            "max_input_bytes": step["max_input_bytes"],
        }
        account = jobsteps.step_account(step)
        cap = int(step["limit"]) + 1
        done, data = jobsteps.run_step(jobsteps.PACK, args, account, step["max_s"], cap)
        if done and len(data) < cap:
            name, durable = jobfiles.RESULTS, data
        else:
            why = data.decode(errors="replace").strip() if not done else "over the limit"
            name, durable = jobfiles.RESULTS_PROBLEM, (why or "could not be packed").encode()
        tmp = self._file(f".{name}.tmp")
        with open(tmp, "wb") as f:
            f.write(durable)
        os.replace(tmp, self._file(name))

    def _prepare(self, spec: dict[str, Any]) -> tuple[str | None, str] | None:
        """Run the ``prepare`` steps; ``None`` when all succeeded, else (stop reason or
        ``None``, why) for a stop request or a failed step."""
        log = self._file(jobfiles.PREPARE_LOG)
        for argv in spec["prepare"]:
            try:
                with open(log, "ab") as out:
                    step = subprocess.Popen(
                        argv,
                        env=spec["env"],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,  # results (ids); messages are on stderr
                        stderr=out,
                        start_new_session=True,
                        close_fds=True,
                    )
            except OSError as exc:
                return (
                    None,
                    f"cannot run {argv[0]!r}: {exc.strerror or exc} (install it on the node)",
                )
            while step.poll() is None:
                self.wake.wait(0.2)
                self.wake.clear()
                request = self._read_stop()
                if request is None and self.terminate_requested:
                    request = ("cancel", "SIGKILL", 0.0)
                if request is not None:
                    _killpg(step.pid, signal.SIGKILL)
                    step.wait()
                    return request[0], "stopped before its program started"
            if step.returncode != 0:
                why = _tail(log) or f"{argv[0]} ended with {step.returncode}"
                return None, f"preparing the job failed: {why}"
        return None

    def _cleanup(self, spec: dict[str, Any]) -> None:
        """Run the ``cleanup`` steps, each at most a minute, whatever they answer."""
        for argv in spec["cleanup"]:
            with (
                contextlib.suppress(OSError, subprocess.TimeoutExpired),
                open(self._file(jobfiles.PREPARE_LOG), "ab") as out,
            ):
                subprocess.run(
                    argv,
                    env=spec["env"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=out,
                    timeout=60,
                    check=False,
                )

    def _wait_for(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self.wake.set()

    def _on_term(self, *_: object) -> None:
        self.terminate_requested = True
        self.wake.set()

    def _supervise(
        self, proc: subprocess.Popen[bytes], spec: dict[str, Any]
    ) -> tuple[str | None, str]:
        """Wait for the job; returns (stop reason, "killed" if SIGKILL was needed else "")."""
        mono = self.clock.monotonic
        limit = spec["time_limit_s"]
        limit_at = mono() + limit if limit is not None else None
        stop_reason: str | None = None
        kill_deadline: float | None = None
        killed = ""
        while proc.poll() is None:
            deadlines = [d for d in (limit_at, kill_deadline) if d is not None]
            timeout = max(0.0, min(deadlines) - mono()) if deadlines else FENCE_POLL_S
            timeout = min(timeout, FENCE_POLL_S)
            self.wake.wait(timeout)
            self.wake.clear()
            if proc.poll() is not None:
                break
            if stop_reason is None:
                request = self._read_stop()
                if request is None and self.terminate_requested:
                    request = ("cancel", spec["stop_signal"], spec["grace_s"])
                if request is None and limit_at is not None and mono() >= limit_at:
                    request = ("timeout", spec["stop_signal"], spec["grace_s"])
                if request is None:
                    request = self._fence(spec)
                if request is not None:
                    stop_reason, signal_name, grace_s = request
                    _killpg(proc.pid, _signal_number(signal_name))
                    kill_deadline = mono() + max(0.0, grace_s)
                    limit_at = None
                    continue
            if kill_deadline is not None and mono() >= kill_deadline:
                _killpg(proc.pid, signal.SIGKILL)
                killed = "killed"
                kill_deadline = None
        return stop_reason, killed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpupool.agent.supervisor JOBDIR", file=sys.stderr)
        return 2
    return Supervisor(args[0]).run()


if __name__ == "__main__":
    sys.exit(main())
