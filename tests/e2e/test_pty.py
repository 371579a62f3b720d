"""``gpupool run --pty bash`` in tmux against a real server and agent, as ``srun --pty``.

A real terminal (a tmux pane) runs ``gpupool run --pty bash``; keys are typed with
``tmux send-keys`` and the screen read with ``tmux capture-pane``. It shows: a command typed is
run by the job's bash and its output comes back (``echo $((6*7))`` -> 42); the job's terminal
follows the window (``tput cols`` before and after ``tmux resize-window``); Ctrl-C interrupts
``sleep 100`` inside the job's bash and not the session (bash answers the next command, the
job still runs); ``exit 3`` ends the job FAILED with exit code 3 and ``run`` exits 3.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.autopool import auto_pool
from tests.e2e.clirun import cli_env
from tests.e2e.pool import PY, Pool, wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


@pytest.fixture(scope="module")
def ppool() -> Iterator[Pool]:
    """Jobs run as accounts of their own: the terminal is handed to the job's account."""
    with auto_pool("pty", {"n1": "2xA100-80GB"}) as p:
        yield p


class Pane:
    """A detached tmux session of its own (its own server socket) running one command."""

    def __init__(self, root: Path, command: str, cols: int = 100, rows: int = 30) -> None:
        self.socket = str(root / "tmux.sock")
        self.tmux("new-session", "-d", "-s", "t", "-x", str(cols), "-y", str(rows), command)

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t", "-S", "-200")

    def type(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_line(self, text: str, timeout: float = 60.0) -> str:
        """Wait until a line of the screen is ``text`` (trailing blanks aside)."""

        def seen() -> str | None:
            screen = self.screen()
            return screen if text in (line.rstrip() for line in screen.splitlines()) else None

        try:
            return wait_for(seen, timeout, f"{text!r} on the screen")
        except AssertionError:
            raise AssertionError(f"{text!r} not on the screen:\n{self.screen()}") from None

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], check=False, timeout=30)


def sleep_100() -> int | None:
    """The pid of a ``sleep 100`` on this machine (the job's: the node is this machine)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == b"sleep\x00100\x00":
                return int(entry.name)
        except OSError:
            continue
    return None


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _groups(pid: int) -> str:
    """The process's group and its terminal's foreground group: a Ctrl-C reaches the second."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "gone"
    return f"state {fields[0]}, process group {fields[2]}, terminal's foreground group {fields[5]}"


def test_run_pty_bash_in_tmux_behaves_as_srun_pty(ppool: Pool, tmp_path: Path) -> None:
    given = cli_env(ppool)
    env = {k: given[k] for k in ("GPUPOOL_HOME", "GPUPOOL_SERVER", "GPUPOOL_TOKEN", "PYTHONPATH")}
    env["PS1"] = "pty$ "  # the job's bash takes its prompt from the exported environment
    script = tmp_path / "start.sh"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    script.write_text(
        f"{exports}cd {shlex.quote(str(tmp_path))}\n"
        f"{shlex.quote(PY)} -m gpupool.cli run --pty -g 0.5 -- bash --norc --noprofile\n"
        'echo "RUN-EXIT=$?"\nsleep 600\n'
    )
    pane = Pane(tmp_path, f"sh {shlex.quote(str(script))}")
    try:
        pane.wait_line("pty$", timeout=120)
        pane.type("echo $((6*7))", "Enter")
        pane.wait_line("42")

        pane.type("tput cols", "Enter")
        pane.wait_line("100")
        pane.tmux("resize-window", "-t", "t", "-x", "120", "-y", "30")
        pane.type("tput cols", "Enter")
        pane.wait_line("120")

        pane.type("sleep 100", "Enter")
        jobs = ppool.get("/v1/jobs")["jobs"]
        matching = [j for j in jobs if j["name"] == "bash"]
        assert len(matching) == 1, jobs
        job = matching[0]
        assert job["pty"] is True
        assert not any(isinstance(v, dict) and "key" in v for v in job.values())  # never shown
        ppool.wait_state(job["id"], "RUNNING")  # the heartbeat may come after the first keys
        sleeper = wait_for(sleep_100, 30, "the job's sleep 100")
        pane.type("C-c")
        try:
            wait_for(lambda: not pid_alive(sleeper), 30, "sleep 100 to end on Ctrl-C")
        except AssertionError:  # say where the interrupt went (failed once in a loaded run)
            raise AssertionError(
                f"sleep 100 (pid {sleeper}) still runs 30 s after Ctrl-C: {_groups(sleeper)}"
                f"\n{pane.screen()}"
            ) from None
        pane.type("echo after-$((1+1))", "Enter")
        pane.wait_line("after-2", timeout=30)  # bash answered: only sleep was interrupted
        assert ppool.job(job["id"])["state"] == "RUNNING"

        pane.type("exit 3", "Enter")
        pane.wait_line("RUN-EXIT=3")
        final = ppool.wait_state(job["id"], "FAILED")
        assert final["exit_code"] == 3
    finally:
        pane.close()
