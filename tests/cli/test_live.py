"""The CLI against a live pool (a real server process and agent, simulated GPUs).

Each command is run in-process with typer's runner; the server and token are found the way a
user's would be (``$GPUPOOL_SERVER`` and the standalone ``$GPUPOOL_HOME/admin-token``).
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import pty
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.client import Client
from gpupool.domain.states import JobState
from tests.cli.conftest import LocalPool, Result
from tests.readiness import FAILSAFE_S, wait_ready

pytestmark = pytest.mark.slow

Cli = Callable[..., Result]


def client(pool: LocalPool, token: str | None = None) -> Client:
    return Client(pool.url, token or pool.admin_token, home=pool.home)


def one_line_error(r: Result) -> str:
    assert "Traceback" not in r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_submit_fractional_job_then_logs_show_history(pool_env: LocalPool, cli: Cli) -> None:
    r = cli(
        "submit",
        "-J",
        "hello",
        "-g",
        "0.5",
        "--gpu-mem",
        "10GiB",
        "-e",
        "GREETING=hi",
        "--parsable",
        "--",
        "sh",
        "-c",
        "echo $GREETING; echo dev=$CUDA_VISIBLE_DEVICES",
    )
    assert r.exit_code == 0, r.stderr
    job_id = r.stdout.strip()
    with client(pool_env) as gp:
        done = gp.wait(job_id, timeout_s=60, poll_s=0.2)
    assert done.state == "COMPLETED"
    assert done.gpu_milli == 500
    assert done.gpu_memory_mib == 10240
    out = cli("logs", job_id)
    assert out.exit_code == 0
    assert "hi\n" in out.stdout
    assert "dev=GPU-" in out.stdout
    shown = cli("show", job_id)
    assert "COMPLETED (CD)" in shown.stdout
    assert "0.5 10GiB" in shown.stdout
    assert "Events" in shown.stdout
    hist = cli("history", "-S", "1h")
    row = next(x for x in hist.stdout.splitlines() if x.startswith(job_id))
    assert "COMPLETED" in row
    assert "0:0" in row


def test_run_streams_output_and_exits_with_the_job_code(pool_env: LocalPool, cli: Cli) -> None:
    r = cli("run", "-g", "0.1", "--wrap", "echo streamed; exit 3")
    assert r.exit_code == 3
    assert "streamed" in r.stdout
    assert "FAILED" in r.stderr


def test_submit_from_job_file_with_option_override(
    pool_env: LocalPool, cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: fromfile\ncommand: [sleep, '30']\nresources:\n  gpus: 0.25\n")
    r = cli("submit", "-f", str(path), "-q", "high", "--preemptible", "--json")
    assert r.exit_code == 0, r.stderr
    view = json.loads(r.stdout)
    assert view["name"] == "fromfile"
    assert view["priority_class"] == "high"
    assert view["preemptible"] is True
    assert view["gpu_milli"] == 250
    assert cli("cancel", view["id"]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncommand: [true]\nresources:\n  gpuz: 1\n")
    r = cli("submit", "-f", str(bad))
    assert r.exit_code == 2
    assert f"{bad}:4: resources.gpuz: unknown key" in one_line_error(r)


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["submit", "-g", "1.5", "--", "true"], 2, "-g/--gpus: '1.5' is more than one GPU"),
        (["submit", "-g", "0.5", "--gpu-mem", "10gigs", "--", "true"], 2, "use 10GiB"),
        (["submit", "-t", "soon", "--", "true"], 2, "-t/--time"),
        (
            ["submit", "-e", "CUDA_VISIBLE_DEVICES=1", "--", "true"],
            2,
            "-e CUDA_VISIBLE_DEVICES: environment name",
        ),
        (["submit", "-e", "NOVALUE", "--", "true"], 2, "is not KEY=VALUE"),
        (["submit", "-g", "0.5"], 2, "nothing to run"),
        (["submit", "-A", "nosuch", "--", "true"], 2, "tenant 'nosuch' does not exist"),
        (["show", "000000000000"], 3, "not found"),
        (["cancel", "000000000000"], 3, "not found"),
        (["hold", "000000000000"], 3, "not found"),
        (["requeue", "000000000000"], 3, "not found"),
        (["drain", "no-such-node"], 3, "no-such-node"),
        (["report", "--by", "colour"], 2, "--by 'colour' is not a grouping"),
        (["quota", "set", "default", "default", "--guaranteed", "1.5"], 2, "whole number"),
        (["users", "create", "zed", "--role", "wizard"], 2, "role 'wizard' is not valid"),
    ],
)
def test_bad_input_gives_one_line_error_and_exit_code(
    pool_env: LocalPool, cli: Cli, args: list[str], code: int, fragment: str
) -> None:
    r = cli(*args)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert fragment in one_line_error(r)


def test_unreachable_server_and_bad_token(pool_env: LocalPool, cli: Cli) -> None:
    r = cli("queue", "--server", "http://127.0.0.1:9")
    assert r.exit_code == 5
    assert "cannot reach http://127.0.0.1:9" in one_line_error(r)
    r = cli("queue", "--token", "gp_nope")
    assert r.exit_code == 4
    assert "token is not valid" in one_line_error(r)


def test_someone_elses_job_is_not_found(pool_env: LocalPool, cli: Cli) -> None:
    assert cli("tenants", "set", "vision").exit_code == 0
    assert cli("users", "create", "bob", "--role", "member", "--tenant", "vision").exit_code == 0
    issued = json.loads(cli("tokens", "create", "--user", "bob", "--json").stdout)
    theirs = cli("submit", "--parsable", "-g", "0.1", "--", "sleep", "30").stdout.strip()
    bob = {"GPUPOOL_TOKEN": issued["secret"]}
    for command in ("show", "cancel"):
        r = cli(command, theirs, env=bob)
        assert r.exit_code == 3, r.stderr
        assert "not found" in one_line_error(r)
    assert theirs not in cli("queue", env=bob).stdout
    mine = cli("submit", "--parsable", "-g", "0.1", "--", "true", env=bob)
    assert mine.exit_code == 0, mine.stderr
    assert (
        json.loads(cli("show", mine.stdout.strip(), "--json", env=bob).stdout)["job"]["tenant"]
        == "vision"
    )
    assert cli("cancel", theirs).exit_code == 0


def test_queue_shows_reason_start_and_slice_then_cancel(pool_env: LocalPool, cli: Cli) -> None:
    stuck = cli(
        "submit",
        "--parsable",
        "--queue-anyway",
        "-J",
        "two-t4",
        "-g",
        "2",
        "--gpu-type",
        "T4",
        "--",
        "true",
    ).stdout.strip()
    runs = cli(
        "submit",
        "--parsable",
        "-J",
        "sleeper",
        "-g",
        "0.5",
        "--gpu-mem",
        "8GiB",
        "--",
        "sleep",
        "60",
    ).stdout.strip()
    with client(pool_env) as gp:
        gp.wait(runs, until=frozenset({JobState.RUNNING}), timeout_s=60, poll_s=0.2)
        for _ in range(50):
            if gp.get(stuck).pending_reason:
                break
            gp.clock.sleep(0.2)
    q = cli("queue")
    assert q.exit_code == 0
    header = q.stdout.splitlines()[0].split()
    assert header[:6] == ["JOBID", "NAME", "USER", "TENANT", "POOL", "ST"]
    assert "START" in header
    assert "NODELIST(REASON)" in header
    assert "SLICE" in header
    pending = next(x for x in q.stdout.splitlines() if x.startswith(stuck))
    assert " PD " in pending
    assert "(TooLarge" in pending  # one T4 only: queued anyway, for nodes yet to join
    assert "2 T4" in pending
    running = next(x for x in q.stdout.splitlines() if x.startswith(runs))
    assert " R " in running
    assert "0.5 8GiB" in running
    rows = json.loads(cli("queue", "--json", "-t", "PD").stdout)
    assert [j["id"] for j in rows if j["id"] == stuck] == [stuck]
    assert all(j["state"] == "PENDING" for j in rows)
    r = cli("cancel", stuck, runs)
    assert r.exit_code == 0
    with client(pool_env) as gp:
        assert gp.wait(runs, timeout_s=60, poll_s=0.2).state == "CANCELLED"
        assert gp.get(stuck).state == "CANCELLED"


def test_hold_release_and_requeue_like_scontrol(pool_env: LocalPool, cli: Cli) -> None:
    stuck = cli(
        "submit",
        "--parsable",
        "--queue-anyway",
        "-J",
        "held-one",
        "-g",
        "2",
        "--gpu-type",
        "T4",
        "--",
        "true",
    ).stdout.strip()
    failing = cli("submit", "--parsable", "-g", "0.1", "--", "false").stdout.strip()
    r = cli("hold", stuck)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == f"job {stuck} (held-one): PENDING, held"
    with client(pool_env) as gp:
        for _ in range(100):
            if (gp.get(stuck).pending_reason or "").startswith("Held"):
                break
            gp.clock.sleep(0.1)
        reason = gp.get(stuck).pending_reason
        assert reason == f"Held: held until released (gpupool release {stuck})"
        assert gp.wait(failing, timeout_s=60, poll_s=0.2).state == "FAILED"
    pending = next(x for x in cli("queue").stdout.splitlines() if x.startswith(stuck))
    assert "(JobHeld)" in pending
    released = json.loads(cli("release", stuck, "--json").stdout)
    assert [(j["id"], j["held"]) for j in released] == [(stuck, False)]
    with client(pool_env) as gp:
        for _ in range(100):
            if not (gp.get(stuck).pending_reason or "Held").startswith("Held"):
                break
            gp.clock.sleep(0.1)
        assert (gp.get(stuck).pending_reason or "").startswith("TooLarge")
    # scontrol update: a pending job's limits and class change; a bad value is exit 2.
    r = cli("update", stuck, "-t", "4h", "-q", "low")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == f"job {stuck} (held-one): PENDING, priority low, time limit 04:00:00"
    r = cli("update", stuck, "-t", "soon")
    assert r.exit_code == 2
    assert "time_limit" in one_line_error(r)
    r = cli("update", failing, "-t", "1h")
    assert r.exit_code == 6
    assert "only pending jobs can be updated" in one_line_error(r)
    # Only pending jobs can be held, only ended-unfinished ones requeued: exit 6, nothing changes.
    r = cli("hold", failing)
    assert r.exit_code == 6
    assert "only pending jobs can be held" in one_line_error(r)
    r = cli("requeue", stuck)
    assert r.exit_code == 6
    assert "only failed, preempted" in one_line_error(r)
    r = cli("requeue", failing)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith(f"job {failing} (")
    assert ": PENDING" in r.stdout
    with client(pool_env) as gp:
        states = [e.target for e in gp.events(failing)]
        assert states.index("FAILED") < states.index("REQUEUED") < len(states) - 1
        assert gp.wait(failing, timeout_s=60, poll_s=0.2).state == "FAILED"  # ran again
    # sbatch --hold: a job that could run at once waits for its release.
    later = cli("submit", "--parsable", "-H", "-g", "0.1", "--", "true").stdout.strip()
    with client(pool_env) as gp:
        for _ in range(100):
            if (gp.get(later).pending_reason or "").startswith("Held"):
                break
            gp.clock.sleep(0.1)
        assert gp.get(later).state == "PENDING"
        assert gp.get(later).held is True
        assert cli("release", later).exit_code == 0
        assert gp.wait(later, timeout_s=60, poll_s=0.2).state == "COMPLETED"
    audit = json.loads(cli("audit", "--json", "-S", "1h").stdout)
    actions = {(a["action"], a["target"]) for a in audit}
    assert {
        ("job.hold", stuck),
        ("job.release", stuck),
        ("job.update", stuck),
        ("job.requeue", failing),
    } <= actions
    assert cli("cancel", stuck).exit_code == 0


def test_an_array_runs_one_job_per_index_with_its_task_id(pool_env: LocalPool, cli: Cli) -> None:
    r = cli(
        "submit", "--parsable", "-J", "sweep", "-a", "1-3", "-g", "0.1",
        "--wrap", "echo task $GPUPOOL_ARRAY_TASK_ID of $GPUPOOL_ARRAY_TASK_COUNT",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    ids = r.stdout.split()
    assert len(ids) == 3
    with client(pool_env) as gp:
        for index, job_id in enumerate(ids, start=1):
            job = gp.wait(job_id, timeout_s=60, poll_s=0.2)
            assert (job.name, job.state) == (f"sweep[{index}]", "COMPLETED")
            assert "".join(gp.logs(job_id)).strip() == f"task {index} of 3"
    with client(pool_env) as gp:
        array_id = gp.get(ids[0]).array_id
        assert array_id is not None
        assert [gp.get(i).array_index for i in ids] == [1, 2, 3]
    listed = json.loads(cli("queue", "--array", array_id, "-t", "CD", "--json").stdout)
    assert sorted(j["id"] for j in listed) == sorted(ids)
    # scancel ARRAYID: every unfinished task; ended ones are left alone.
    r = cli("submit", "--parsable", "-J", "long", "-a", "0-1", "-g", "0.1", "--", "sleep", "60")
    long_ids = r.stdout.split()
    with client(pool_env) as gp:
        long_array = gp.get(long_ids[0]).array_id
    assert long_array is not None
    assert long_array != array_id
    r = cli("cancel", "--array", long_array)
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2
    with client(pool_env) as gp:
        assert {gp.wait(i, timeout_s=60, poll_s=0.2).state for i in long_ids} == {"CANCELLED"}
    assert cli("cancel").exit_code == 2
    r = cli("submit", "-a", "0-9%0", "-g", "0.1", "--", "true")  # %N: tests/e2e/test_workflow.py
    assert r.exit_code == 2
    assert "the limit after % must be a whole number" in one_line_error(r)
    r = cli("run", "-a", "0-1", "-g", "0.1", "--", "true")
    assert r.exit_code == 2
    assert "use gpupool submit --array" in one_line_error(r)


def test_top_renders_a_frame_from_the_live_pool(pool_env: LocalPool, cli: Cli) -> None:
    job_id = cli(
        "submit",
        "--parsable",
        "-J",
        "watched",
        "-g",
        "0.5",
        "--gpu-mem",
        "10GiB",
        "--",
        "sleep",
        "60",
    ).stdout.strip()
    with client(pool_env) as gp:
        gp.wait(job_id, until=frozenset({JobState.RUNNING}), timeout_s=60, poll_s=0.2)
    r = cli("top", "--once", "--sort", "alloc")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("gpupool top")
    assert lines[1].startswith("devices 3 ")
    assert any("pool default: mem_share_ratio" in x for x in lines)
    first = next(x for x in lines if x.startswith("sim-1"))  # sorted by allocation
    assert f"{job_id} 0.5" in first
    assert "A100" in first
    assert any(x.startswith(job_id) and "watched" in x for x in lines)
    cli("cancel", job_id)


def test_nodes_gpus_drain_and_resume(pool_env: LocalPool, cli: Cli) -> None:
    nodes = cli("nodes")
    assert nodes.exit_code == 0
    assert any(x.startswith("sim-1") and " up " in x for x in nodes.stdout.splitlines())
    gpus = cli("gpus")
    rows = [x for x in gpus.stdout.splitlines() if x.startswith("sim-1")]
    assert len(rows) == 3
    assert sum("Tesla T4" in x for x in rows) == 1
    assert all("GPU-" in x for x in rows)
    assert cli("drain", "sim-1").stdout.strip() == "node sim-1: draining"
    assert cli("resume", "sim-1").stdout.strip() == "node sim-1: up"
    assert len(json.loads(cli("gpus", "--json").stdout)) == 3


def test_admin_commands_round_trip(pool_env: LocalPool, cli: Cli) -> None:
    r = cli("pools", "set", "research", "--overcommit", "1.5", "--price", "A100=2.5")
    assert r.exit_code == 0
    assert "research" in r.stdout
    assert "A100=2.5" in r.stdout
    assert cli("pools", "set", "research", "--price", "A100").exit_code == 2
    assert cli("tenants", "set", "nlp", "--fair-share", "2").exit_code == 0
    q = cli("quota", "set", "nlp", "research", "--guaranteed", "1", "--limit", "2")
    assert q.stdout.strip() == "quota of nlp in research: guaranteed 1 GPU, limit 2"
    tenants = cli("tenants")
    assert any(x.startswith("nlp") and "research" in x for x in tenants.stdout.splitlines())
    assert cli("priority-classes", "set", "urgent", "950").exit_code == 0
    assert "urgent" in cli("priority-classes").stdout
    assert cli("users", "create", "carol", "--role", "viewer", "--tenant", "nlp").exit_code == 0
    created = cli("tokens", "create", "--user", "carol", "--name", "laptop")
    secret = created.stdout.splitlines()[1]
    assert secret.startswith("gp_")
    listing = cli("tokens", "--user", "carol")
    assert "laptop" in listing.stdout
    assert secret not in listing.stdout
    token_id = created.stdout.split()[1]
    assert cli("tokens", "revoke", token_id).exit_code == 0
    assert "revoked" in cli("tokens", "--user", "carol").stdout
    assert cli("queue", env={"GPUPOOL_TOKEN": secret}).exit_code == 4
    assert cli("quota", "delete", "nlp", "research").exit_code == 0
    assert cli("users", "delete", "carol").exit_code == 0


def test_audit_shows_who_changed_what_and_refuses_members(pool_env: LocalPool, cli: Cli) -> None:
    assert cli("tenants", "set", "audited", "--fair-share", "1").exit_code == 0
    shown = cli("audit", "-S", "1h", "--target", "audited")
    assert shown.exit_code == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if "audited" in line]
    assert len(rows) == 1
    assert "admin" in rows[0]
    assert "PUT" in rows[0]
    as_json = json.loads(cli("audit", "-a", "tenant", "--target", "audited", "--json").stdout)
    assert [(r["target"], r["status"]) for r in as_json] == [("audited", 200)]
    assert (
        cli("audit", "--target", "audited", "-u", "someone-else", "--json").stdout.strip() == "[]"
    )
    bad = cli("audit", "--limit", "0")
    assert (bad.exit_code, bad.stderr.strip()) == (
        2,
        "error: --limit 0: give a number from 1 to 1000",
    )
    assert cli("audit", "-S", "soon").exit_code == 2
    assert cli("users", "create", "dave", "--role", "member", "--tenant", "audited").exit_code == 0
    secret = cli("tokens", "create", "--user", "dave", "-q").stdout.strip()
    refused = cli("audit", env={"GPUPOOL_TOKEN": secret})
    assert refused.exit_code == 4
    assert len(refused.stderr.strip().splitlines()) == 1
    assert cli("users", "delete", "dave").exit_code == 0


def test_report_formats(pool_env: LocalPool, cli: Cli, tmp_path: Path) -> None:
    cli("run", "-g", "0.5", "--", "sleep", "1")
    table = cli("report", "--since", "1h")
    assert table.exit_code == 0
    assert table.stdout.splitlines()[1].split()[:3] == ["TENANT", "JOBS", "GPU-HOURS"]
    rows = list(
        csv.DictReader(
            io.StringIO(cli("report", "-b", "tenant", "-b", "gpu-type", "-F", "csv").stdout)
        )
    )
    assert rows
    assert {"tenant", "gpu_model", "gpu_hours", "idle_gpu_hours", "cost"} <= set(rows[0])
    assert float(next(r for r in rows if r["tenant"] == "default")["gpu_hours"]) > 0
    data = json.loads(cli("report", "-F", "json", "-b", "pool").stdout)
    assert data["group_by"] == ["pool"]
    assert data["lines"]
    page = tmp_path / "usage.html"
    r = cli("report", "-F", "html", "-o", str(page), "--buckets", "4")
    assert r.exit_code == 0
    assert page.read_text().count('class="chart"') == 3


def test_precheck_reports_server_and_token(pool_env: LocalPool, cli: Cli) -> None:
    r = cli("precheck", "--only", "server", "--only", "token", "--only", "disk")
    assert r.exit_code == 0, r.stdout
    lines = r.stdout.splitlines()
    assert [x.split()[:2] for x in lines] == [
        ["PASS", "disk"],
        ["PASS", "server"],
        ["PASS", "token"],
    ]
    full = cli("precheck", "--json")
    names = [c["name"] for c in json.loads(full.stdout)]
    assert names == [
        "driver",
        "cuda-visible",
        "mps",
        "mig",
        "containers",
        "disk",
        "server",
        "token",
    ]
    bad = cli("precheck", "--only", "token", "--token", "gp_bad")
    assert bad.exit_code == 1
    assert bad.stdout.startswith("FAIL  token")


def test_login_saves_a_private_config_that_later_commands_use(
    pool_env: LocalPool, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = cli("login", "--server", pool_env.url, "--token", pool_env.admin_token)
    assert r.exit_code == 0, r.stderr
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "gpupool" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.delenv("GPUPOOL_SERVER")
    monkeypatch.setenv("GPUPOOL_HOME", str(tmp_path / "empty-home"))
    assert cli("queue").exit_code == 0
    assert cli("login", "--server", pool_env.url, "--token", "gp_wrong").exit_code == 4
    assert cli("logout").exit_code == 0
    assert not path.exists()


def _pool_env(pool: LocalPool) -> dict[str, str]:
    return {
        **os.environ,
        "GPUPOOL_HOME": str(pool.home),
        "GPUPOOL_SERVER": pool.url,
        "TERM": "xterm-256color",
        # the caller's PYTHONPATH first: a run against a tree (PYTHONPATH=$PWD/src) starts
        # its CLI processes from that tree too
        "PYTHONPATH": os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH"), str(Path(__file__).resolve().parents[2])) if p
        ),
    }


def _read_until(fd: int, needle: bytes, timeout: float = FAILSAFE_S) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} never appeared; got {seen[-400:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
    return seen


def test_top_is_interactive_in_a_terminal_s_sorts_and_q_quits(pool_env: LocalPool) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 180, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", "top", "-d", "0.5"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=_pool_env(pool_env),
        start_new_session=True,
    )
    os.close(slave)
    try:
        _read_until(master, b"sort: node")
        os.write(master, b"s")
        _read_until(master, b"sort: util")
        os.write(master, b"q")
        assert proc.wait(timeout=FAILSAFE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_on_run_cancels_the_job(
    pool_env: LocalPool, sig: signal.Signals, code: int
) -> None:
    name = f"interrupted-{sig.name.lower()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool.cli",
            "run",
            "-J",
            name,
            "-g",
            "0.1",
            "--",
            "sleep",
            "60",
        ],
        env=_pool_env(pool_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with client(pool_env) as gp:
        jobs = wait_ready(
            lambda: gp.list(name=name, state=["RUNNING"]), what="the job to start", proc=proc
        )
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=FAILSAFE_S)
        assert proc.returncode == code
        assert f"cancelled job {jobs[0].id}" in err.decode()
        assert gp.wait(jobs[0].id, timeout_s=60, poll_s=0.2).state == "CANCELLED"


#: A ``sitecustomize`` that makes ``gpupool run``'s import of its stream (gpupool.cli.jobs,
#: imported after the submit) take 5 s, as a loaded machine's imports may.
SLOW_STREAM_IMPORT = """
import sys, time
class _SlowStream:
    def find_spec(self, name, path=None, target=None):
        if name == "gpupool.cli.jobs":
            time.sleep(5)
        return None
sys.meta_path.insert(0, _SlowStream())
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_right_after_the_submit_cancels_the_job(
    pool_env: LocalPool, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """The signal lands between the submit ("Submitted job") and the stream: the job is
    cancelled all the same, not left running behind a ``run`` that is gone."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_STREAM_IMPORT)
    env = _pool_env(pool_env)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    name = f"early-{sig.name.lower()}"
    cmd = [sys.executable, "-m", "gpupool.cli", "run", "-J", name, "-g", "0.1", "--", "sleep", "60"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = _read_until(proc.stderr.fileno(), b"to pool")
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=FAILSAFE_S)
    err += rest
    job_id = err.split(b"Submitted job ", 1)[1].split()[0].decode()
    assert proc.returncode == code, err
    assert f"cancelled job {job_id}" in err.decode()
    with client(pool_env) as gp:
        assert gp.wait(job_id, timeout_s=60, poll_s=0.2).state == "CANCELLED"
