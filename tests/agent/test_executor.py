"""The executor and per-replica supervisor with real processes (no server, no GPU)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from gpupool.agent import executor
from gpupool.agent.executor import EXITED, RUNNING, Executor, Observed
from gpupool.agent.jobdir import BOOT_FAILED, LaunchSpec
from tests.agent.helpers import wait_for

PY = sys.executable


def spec(code: str, tmp: Path, **kw: object) -> LaunchSpec:
    env = {"PATH": os.environ["PATH"], "MARK": str(tmp / "mark")}
    return LaunchSpec(argv=[PY, "-c", code], env=env, cwd=str(tmp), **kw)  # type: ignore[arg-type]


def finished(ex: Executor, key: str) -> Observed | None:
    seen = ex.observe(key)
    return seen if seen.status in (EXITED, BOOT_FAILED) else None


def test_exit_code_and_output_are_recorded(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    ex.launch("a1", spec("import os,sys; print(os.getcwd()); sys.exit(3)", tmp_path), {})
    result = wait_for(lambda: finished(ex, "a1"), what="exit")
    assert result.exit_code == 3
    assert result.signal is None
    assert result.stop_reason is None
    assert (ex.jobdir("a1").stdout.read_text().strip()) == str(tmp_path)


def test_a_signal_that_ends_the_job_is_recorded(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    ex.launch("a1", spec("import os,signal; os.kill(os.getpid(), signal.SIGKILL)", tmp_path), {})
    result = wait_for(lambda: finished(ex, "a1"))
    assert result.exit_code is None
    assert result.signal == "SIGKILL"


def test_missing_program_is_a_boot_failure_with_a_reason(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    launch = LaunchSpec(argv=["no-such-program-xyz"], env={"PATH": "/usr/bin"}, cwd=str(tmp_path))
    ex.launch("a1", launch, {})
    result = wait_for(lambda: finished(ex, "a1"))
    assert result.status == BOOT_FAILED
    assert "no-such-program-xyz" in (result.reason or "")


def test_stop_sends_the_checkpoint_signal_and_the_job_may_exit_cleanly(tmp_path: Path) -> None:
    code = (
        "import os,signal,time,pathlib\n"
        "def h(*_):\n"
        "    pathlib.Path(os.environ['MARK']).write_text('got SIGUSR1')\n"
        "    raise SystemExit(0)\n"
        "signal.signal(signal.SIGUSR1, h)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    ex = Executor(tmp_path / "state")
    ex.launch("a1", spec(code, tmp_path), {})
    wait_for(
        lambda: (
            "ready" in ex.jobdir("a1").stdout.read_text(encoding="utf-8", errors="replace")
            if ex.jobdir("a1").stdout.exists()
            else None
        )
    )
    assert ex.stop("a1", reason="preempt", signal_name="SIGUSR1", grace_s=30)
    assert ex.stop("a1", reason="preempt", signal_name="SIGUSR1", grace_s=30)  # duplicate: no-op
    result = wait_for(lambda: finished(ex, "a1"))
    assert (tmp_path / "mark").read_text() == "got SIGUSR1"
    assert result.exit_code == 0
    assert result.stop_reason == "preempt"


def test_a_job_ignoring_the_signal_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    code = (
        "import os,signal,subprocess,sys,time,pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "pathlib.Path(os.environ['MARK']).write_text(str(child.pid))\n"
        "time.sleep(120)\n"
    )
    ex = Executor(tmp_path / "state")
    ex.launch("a1", spec(code, tmp_path), {})
    child_pid = int(
        wait_for(lambda: (tmp_path / "mark").exists() and (tmp_path / "mark").read_text())
    )
    ex.stop("a1", reason="cancel", signal_name="SIGTERM", grace_s=0.3)
    result = wait_for(lambda: finished(ex, "a1"))
    assert result.signal == "SIGKILL"
    assert result.stop_reason == "cancel"
    wait_for(
        lambda: (
            not Path(f"/proc/{child_pid}").exists()
            or "Z" in Path(f"/proc/{child_pid}/stat").read_text().split(") ")[1][:1]
        ),
        what="the job's child to be gone",
    )


def test_time_limit_stops_the_job(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    ex.launch(
        "a1", spec("import time; time.sleep(60)", tmp_path, time_limit_s=0.3, grace_s=0.2), {}
    )
    result = wait_for(lambda: finished(ex, "a1"))
    assert result.stop_reason == "timeout"
    assert result.signal == "SIGTERM"


def test_logs_are_capped(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    ex.launch(
        "a1", spec("import sys; sys.stdout.write('x' * 200_000)", tmp_path, log_cap_bytes=1000), {}
    )
    wait_for(lambda: finished(ex, "a1"))
    text = ex.jobdir("a1").stdout.read_text()
    assert text.startswith("x" * 1000)
    assert "the 199000 bytes written after byte 1000 were discarded" in text
    assert len(text) < 1200


#: A job that waits for its ``$MARK.go`` file, then exits 7.
EXIT_7_ON_GO = (
    "import os,time,pathlib\n"
    "while not pathlib.Path(os.environ['MARK'] + '.go').exists(): time.sleep(0.05)\n"
    "raise SystemExit(7)\n"
)


def test_a_new_executor_adopts_running_jobs_and_never_relaunches(tmp_path: Path) -> None:
    code = (
        "import os,pathlib\n"
        "p = pathlib.Path(os.environ['MARK'])\n"
        "p.write_text(p.read_text() + 'start\\n' if p.exists() else 'start\\n')\n"
    ) + EXIT_7_ON_GO
    first = Executor(tmp_path / "state")
    first.launch("a1", spec(code, tmp_path), {"job": "j"})
    wait_for(lambda: first.observe("a1").status == RUNNING)
    # The agent goes away (its Executor is never used again); the supervisor does not.
    second = Executor(tmp_path / "state")
    assert second.known() == ["a1"]
    second.launch("a1", spec(code, tmp_path), {"job": "j"})  # a resent assignment: no-op
    assert second.observe("a1").status == RUNNING
    (tmp_path / "mark.go").write_text("")
    result = wait_for(lambda: finished(second, "a1"))
    assert result.exit_code == 7
    assert (tmp_path / "mark").read_text() == "start\n"


def test_a_result_recorded_while_the_agent_looks_is_not_taken_for_a_lost_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent reads the replica's state (running), then finds its supervisor gone: in
    between, the job ended and the supervisor recorded exit code 7 and exited. That is an
    ordinary end, not a lost supervisor, and its result must not be overwritten (the suite
    under load saw the race: "its supervisor process ended without recording a result")."""
    code = EXIT_7_ON_GO
    ex = Executor(tmp_path / "state")
    ex.launch("a1", spec(code, tmp_path), {"job": "j"})
    wait_for(lambda: ex.observe("a1").status == RUNNING)
    state = ex.jobdir("a1").read_state()
    assert state is not None
    assert state.supervisor_pid is not None
    supervisor = state.supervisor_pid
    real_is_alive = executor.is_alive

    def ends_meanwhile(pid: int, ticks: int | None) -> bool:
        # The job ends and its supervisor records the result and exits right now, between
        # the agent's read of the state and this look at the supervisor.
        (tmp_path / "mark.go").write_text("")
        wait_for(lambda: not real_is_alive(supervisor, ticks), what="the supervisor to exit")
        return False

    monkeypatch.setattr(ex, "_children", {})  # a re-adopted replica: no child handle
    monkeypatch.setattr(executor, "is_alive", ends_meanwhile)
    seen = ex.observe("a1")
    assert seen.status == EXITED
    assert seen.exit_code == 7, seen
    recorded = ex.jobdir("a1").read_state()
    assert recorded is not None
    assert recorded.exit_code == 7  # not overwritten as lost


def test_a_lost_supervisor_ends_the_job_and_says_so(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    ex.launch("a1", spec("import time; time.sleep(60)", tmp_path), {})
    wait_for(lambda: ex.observe("a1").status == RUNNING)
    state = ex.jobdir("a1").read_state()
    assert state is not None
    assert state.supervisor_pid is not None
    assert state.pid is not None
    os.kill(state.supervisor_pid, signal.SIGKILL)
    result = wait_for(lambda: finished(ex, "a1"))
    assert "supervisor" in (result.reason or "")
    wait_for(lambda: not Path(f"/proc/{state.pid}").exists(), what="job killed")


def test_forget_keeps_the_logs_under_done(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    ex.launch("a1", spec("print('hello')", tmp_path), {})
    wait_for(lambda: finished(ex, "a1"))
    ex.forget("a1")
    assert ex.known() == []
    log = ex.log_path("a1")
    assert log is not None
    assert log.read_text().strip() == "hello"


def test_a_stop_before_start_means_never_started(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state")
    jd = ex.jobdir("a1")
    jd.path.mkdir(parents=True)
    from gpupool.agent.jobdir import StopRequest

    jd.write_stop(StopRequest("cancel"))
    ex.launch("a1", spec("open(__import__('os').environ['MARK'],'w')", tmp_path), {})
    result = wait_for(lambda: finished(ex, "a1"))
    assert result.stop_reason == "cancel"
    assert not (tmp_path / "mark").exists()
