"""Issue 27 on the user's path: a real server, a real agent and the ``gpupool`` CLI.

- a job its team's quota can never admit is refused at submit with the limit and what to
  change, and queued with ``--queue-anyway`` it says so as its pending reason;
- a team's guaranteed share held by another team's borrowed job, still exempt from reclaim,
  says which job, why and when it reclaims it;
- ``--dependency``: a 50-job ``afterok`` chain runs in order, one link after the other, and a
  failed link ends the rest with ``DependencyNeverSatisfied`` (none of them runs); a job waiting
  on another says ``Dependency`` in ``queue``; ``--begin`` says ``BeginTime``;
- ``cancel``/``hold``/``release`` by filter (``-u``, ``-n``, ``-t``, an array id), each one
  request to ``POST /v1/jobs/bulk``;
- first contact: ``--price A100-80GB=2.5`` charges ``NVIDIA A100-SXM4-80GB`` GPU-hours, and a
  key that matches no model is warned about; the array id ``submit -a`` prints works in
  ``show`` and ``logs`` (and ``ID_INDEX`` for one task); ``logs`` of a failed job that wrote
  nothing says so and exits 1; the README's token command leaves the token file 0600; a
  duplicate node's refusal is printed as a sentence, not raw JSON; ``gpupool up`` says on
  SIGTERM that it stopped and that its running job keeps running (and it does);
  ``gpupool.allocate()`` on a pool with other nodes gets its slice on this machine's node;
  ``--nodelist``/``--exclude`` place a job where they say; a drained node's job says
  ``ReqNodeNotAvail``; one card promised 150 % of its memory shows in
  ``gpupool_gpu_mem_share_ratio`` (the shipped alert's metric); an array throttle ``%N`` runs
  at most N tasks at once, the others waiting with ``JobArrayTaskLimit``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import gpupool
from gpupool.client import Client
from tests.e2e.pool import PY, REPO, Pool, wait_for
from tests.ports import free_port
from tests.readiness import answers_ready, wait_ready


@pytest.fixture(scope="module")
def wpool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A server and one agent, n1, with 4 simulated A100s."""
    p = Pool(tmp_path_factory.mktemp("workflow"))
    try:
        p.start_server()
        p.start_agent("n1")
        yield p
    finally:
        p.close()


def cli(pool: Pool, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``gpupool ARGS`` as the pool's admin, from a folder of the test's own."""
    token = (pool.home / "admin-token").read_text().strip()
    env = {
        **os.environ,
        "GPUPOOL_HOME": str(pool.root / "cli-home"),
        "GPUPOOL_SERVER": pool.url,
        "GPUPOOL_TOKEN": token,
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p),
    }
    return subprocess.run(
        [PY, "-m", "gpupool.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=pool.root,
        check=False,
    )


def test_a_job_its_quota_never_admits_is_refused_at_submit_with_what_to_change(
    wpool: Pool,
) -> None:
    assert cli(wpool, "tenants", "set", "course").returncode == 0
    done = cli(wpool, "quota", "set", "course", "default", "--guaranteed", "0.5")
    assert done.returncode == 0, done.stderr
    refused = cli(wpool, "submit", "-A", "course", "-g", "1", "--", "true")
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())
    assert "more than tenant course's guaranteed 0.5 GPUs in pool default" in said
    assert "mark the job preemptible (--preemptible)" in said
    assert "gpupool quota set course default" in said
    assert wpool.get("/v1/jobs?tenant=course")["jobs"] == []
    # Queued anyway, it waits with the same sentence, not "wait for other jobs".
    queued = cli(
        wpool, "submit", "-A", "course", "-g", "1", "--queue-anyway", "--parsable", "--", "true"
    )
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()

    def reason() -> str | None:
        found = wpool.job(job_id).get("pending_reason")
        return str(found) if found else None

    wait_for(reason, 60, "a pending reason")
    shown = cli(wpool, "show", job_id)
    assert "can never start" in " ".join(shown.stdout.split())
    # Piped, queue prints the reason whole, though the line is longer than 400 columns.
    reason = wpool.job(job_id)["pending_reason"]
    line = next(x for x in cli(wpool, "queue").stdout.splitlines() if x.startswith(job_id))
    assert len(line) > 400
    assert f"({reason})" in line
    # Preemptible, the same job borrows the idle pool and runs.
    ok = cli(
        wpool, "submit", "-A", "course", "-g", "1", "--preemptible", "--parsable", "--", "true"
    )
    assert ok.returncode == 0, ok.stderr
    wpool.wait_state(ok.stdout.strip(), "COMPLETED", timeout=120)
    cli(wpool, "cancel", job_id)


def _client(pool: Pool) -> Client:
    return Client(pool.url, (pool.home / "admin-token").read_text().strip())


def _link(order: Path, code: int = 0) -> list[str]:
    """A fast job: it appends its name to ``order`` and exits with ``code``."""
    return ["sh", "-c", f'echo "$GPUPOOL_JOB_NAME" >> {order}; exit {code}']


def test_a_50_job_afterok_chain_runs_in_order(wpool: Pool) -> None:
    order = wpool.out / "chain.txt"
    with _client(wpool) as gp:
        ids: list[str] = []
        for i in range(50):
            dep = {"dependency": f"afterok:{ids[-1]}"} if ids else {}
            # A tenth of a GPU each: without the chain, all 50 would run at once.
            job = gp.submit(name=f"link{i:02d}", command=_link(order), gpus=0.1, **dep)
            ids.append(job.id)
        last = wpool.wait_state(ids[-1], "COMPLETED", "FAILED", "CANCELLED", timeout=900)
        assert last["state"] == "COMPLETED"
        jobs = [gp.get(i) for i in ids]
    assert order.read_text().split() == [f"link{i:02d}" for i in range(50)]
    assert all(j.state == "COMPLETED" for j in jobs)
    for before, after in itertools.pairwise(jobs):
        assert before.end_time is not None
        assert after.start_time is not None
        assert after.start_time >= before.end_time, (before.id, after.id)


def test_a_failed_link_ends_the_rest_with_dependency_never_satisfied(wpool: Pool) -> None:
    order = wpool.out / "broken.txt"
    with _client(wpool) as gp:
        first = gp.submit(name="gate", command=_link(order, code=3), gpus=0.1, hold=True)
        rest: list[str] = []
        for i in range(5):
            dep = f"afterok:{rest[-1] if rest else first.id}"
            rest.append(
                gp.submit(name=f"after{i}", command=_link(order), gpus=0.1, dependency=dep).id
            )
        # While the gate is held, the chain waits with the reason Dependency (queue, piped).
        wait_for(
            lambda: "Dependency" in (gp.get(rest[0]).pending_reason or "") or None,
            60,
            "the Dependency reason",
        )
        listed = cli(wpool, "queue", "-t", "PENDING")
        line = next(x for x in listed.stdout.splitlines() if x.startswith(rest[0]))
        assert f"Dependency: afterok: waits for job {first.id} to complete" in line
        gp.release(first.id)
        assert wpool.wait_state(first.id, "FAILED", timeout=120)["exit_code"] == 3
        for job_id in rest:
            ended = wpool.wait_state(job_id, "CANCELLED", timeout=120)
            assert ended["reason"].startswith("DependencyNeverSatisfied: afterok: job ")
            assert ended["start_time"] is None
    assert order.read_text().split() == ["gate"]
    shown = cli(wpool, "show", rest[-1])
    assert "DependencyNeverSatisfied" in shown.stdout
    assert f"afterok:{rest[-2]}" in shown.stdout


def test_cli_dependency_begin_and_their_refusals(wpool: Pool) -> None:
    unknown = cli(wpool, "submit", "-d", "afterok:0123456789ab", "--", "true")
    assert unknown.returncode != 0
    assert "names 0123456789ab, which is not a job or job array you can see" in unknown.stderr
    bad = cli(wpool, "submit", "-d", "afterwards:1", "--", "true")
    assert bad.returncode != 0
    assert "'afterwards' is not a dependency kind" in bad.stderr
    later = cli(wpool, "submit", "--begin", "now+1hour", "-g", "0.1", "--parsable", "--", "true")
    assert later.returncode == 0, later.stderr
    job_id = later.stdout.strip()
    wait_for(lambda: wpool.job(job_id).get("pending_reason"), 60, "a pending reason")
    assert wpool.job(job_id)["pending_reason"].startswith("BeginTime: it was submitted to begin")
    # afterany on it: waits while it waits, and a cancel of it lets the dependent run.
    after = cli(
        wpool, "submit", "-d", f"afterany:{job_id}", "-g", "0.1", "--parsable", "--", "true"
    )
    assert after.returncode == 0, after.stderr
    assert cli(wpool, "cancel", job_id).returncode == 0
    wpool.wait_state(after.stdout.strip(), "COMPLETED", timeout=120)


def test_cancel_hold_and_release_by_filter(wpool: Pool) -> None:
    with _client(wpool) as gp:
        sweep = gp.submit_array(name="sweep", command=["true"], gpus=0.1, array="0-19", hold=True)
        keep = gp.submit(name="keep", command=["true"], gpus=0.1, hold=True)
        array_id = sweep[0].array_id
        assert array_id is not None
        released = cli(wpool, "release", "-n", "sweep[3]")
        assert released.returncode == 0, released.stderr
        assert released.stdout.strip() == f"job {sweep[3].id} (sweep[3]): PENDING"
        wpool.wait_state(sweep[3].id, "COMPLETED", timeout=120)
        later = gp.submit(name="later", command=["true"], gpus=0.1, begin=time.time() + 3600)
        held = cli(wpool, "hold", "-n", "later")
        assert held.returncode == 0, held.stderr
        assert held.stdout.strip() == f"job {later.id} (later): PENDING, held"
        gone = cli(wpool, "cancel", "-u", "admin", "-t", "PD", "-a", array_id)
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout.count(": CANCELLED") == 19
        assert [gp.get(j.id).state for j in sweep].count("CANCELLED") == 19
        assert gp.get(keep.id).state == "PENDING"
        assert cli(wpool, "cancel", later.id).returncode == 0
        # One task by ARRAY_INDEX (scancel 123_4): the one job.
        one = cli(wpool, "cancel", f"{array_id}_5")
        assert one.returncode == 6  # already cancelled above: said, exit 6
        assert f"job {sweep[5].id} is CANCELLED: already ended" in one.stderr
        # Named again by the array's id: all ended, exit 6 with each one said.
        again = cli(wpool, "cancel", array_id)
        assert again.returncode == 6
        assert f"job {sweep[0].id} is CANCELLED: already ended" in again.stderr
        assert f"job {sweep[3].id} is COMPLETED: already ended" in again.stderr
        assert cli(wpool, "cancel", keep.id).returncode == 0


def test_a_price_named_like_the_help_charges_the_device_and_a_stray_key_is_warned(
    wpool: Pool,
) -> None:
    assert cli(wpool, "tenants", "set", "pricing").returncode == 0
    done = cli(wpool, "pools", "set", "default", "--price", "A100-80GB=2.5", "--price", "H100=9")
    assert done.returncode == 0, done.stderr
    warning = " ".join(done.stderr.split())
    assert "warning: --price H100=9" not in warning  # the key alone, not its value
    assert "warning: --price H100 matches no GPU model of pool default" in warning
    assert "NVIDIA A100-SXM4-80GB" in warning
    assert "A100-80GB" not in warning.split("(")[0]
    ran = cli(wpool, "submit", "-A", "pricing", "-g", "1", "--parsable", "--", "sleep", "1")
    assert ran.returncode == 0, ran.stderr
    wpool.wait_state(ran.stdout.strip(), "COMPLETED", timeout=120)
    with _client(wpool) as gp:
        lines = gp.usage(start=0, group_by=["gpu_model"], tenant="pricing").lines
    assert [line.key["gpu_model"] for line in lines] == ["NVIDIA A100-SXM4-80GB"]
    assert lines[0].gpu_hours > 0
    assert abs(lines[0].cost - lines[0].gpu_hours * 2.5) < 1e-6


def test_the_array_id_submit_prints_works_in_show_and_logs(wpool: Pool) -> None:
    said = cli(wpool, "submit", "-J", "tasks", "-a", "0-2", "-g", "0.1", "--wrap",
               "echo task $GPUPOOL_ARRAY_TASK_ID")  # fmt: skip
    assert said.returncode == 0, said.stderr
    array_id = said.stdout.split()[2]  # "Submitted array ID of 3 jobs ..."
    with _client(wpool) as gp:
        for task in gp.list(array=array_id):
            wpool.wait_state(task.id, "COMPLETED", timeout=120)
    shown = cli(wpool, "show", array_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"job array {array_id}: 3 tasks")
    assert all(f"tasks[{i}]" in shown.stdout for i in range(3))
    one = cli(wpool, "show", f"{array_id}_1")
    assert one.returncode == 0, one.stderr
    assert "tasks[1]" in one.stdout
    assert cli(wpool, "logs", f"{array_id}_1").stdout == "task 1\n"
    assert cli(wpool, "logs", f"{array_id}[2]").stdout == "task 2\n"
    every = cli(wpool, "logs", array_id)
    assert every.returncode == 0, every.stderr
    assert [x for x in every.stdout.splitlines() if x.startswith("task")] == [
        "task 0", "task 1", "task 2"
    ]  # fmt: skip
    listed = cli(wpool, "history", "-j", f"{array_id}_0,{array_id}_2", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(j["name"] for j in json.loads(listed.stdout)) == ["tasks[0]", "tasks[2]"]
    missing = cli(wpool, "logs", f"{array_id}_7")
    assert missing.returncode == 3
    assert f"job array {array_id} has no task 7 (its tasks: 0, 1, 2)" in missing.stderr


def test_logs_of_a_failed_job_that_wrote_nothing_says_so(wpool: Pool) -> None:
    said = cli(wpool, "submit", "-g", "0.1", "--parsable", "--wrap", "echo oops >&2; exit 3")
    job_id = said.stdout.strip()
    wpool.wait_state(job_id, "FAILED", timeout=120)
    out = cli(wpool, "logs", job_id)
    assert out.returncode == 1
    assert out.stdout == ""
    assert f"job {job_id} ended FAILED with exit code 3 and wrote nothing to stdout" in out.stderr
    assert f"gpupool logs --stderr {job_id}" in out.stderr
    err = cli(wpool, "logs", "--stderr", job_id)
    assert (err.returncode, err.stdout) == (0, "oops\n")


def test_the_readme_token_command_leaves_the_token_file_private(
    wpool: Pool, tmp_path: Path
) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    lines = [x for x in readme if "tokens create --user node-agent" in x]
    assert len(lines) == 1
    command = lines[0].split("#")[0].strip()  # the line as a user pastes it
    assert cli(wpool, "users", "create", "node-agent", "--role", "agent").returncode == 0
    token = (wpool.home / "admin-token").read_text().strip()
    bindir = tmp_path / "bin"  # `gpupool` as installed: this tree's CLI
    bindir.mkdir()
    (bindir / "gpupool").write_text(f'#!/bin/sh\nexec {PY} -m gpupool.cli "$@"\n')
    (bindir / "gpupool").chmod(0o755)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "GPUPOOL_SERVER": wpool.url,
        "GPUPOOL_TOKEN": token,
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p),
    }
    done = subprocess.run(  # the user's shell, with its usual umask
        ["sh", "-c", f"umask 022; {command}"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    made = tmp_path / ".agent-token"
    assert made.read_text().strip().startswith("gp_")
    assert made.stat().st_mode & 0o777 == 0o600


def test_a_duplicate_nodes_refusal_is_a_sentence_not_json(wpool: Pool, tmp_path: Path) -> None:
    log = tmp_path / "second.log"
    with log.open("wb") as out:
        second = subprocess.run(
            [PY, "-m", "gpupool.cli", "agent", "--server", wpool.url,
             "--token-file", str(wpool.agent_token), "--simulate", "1xT4", "--node", "n1",
             "--state-dir", str(tmp_path / "other"), "--address", "127.0.0.2"],
            env=wpool._env(), stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False,
        )  # fmt: skip
    said = log.read_text()
    assert second.returncode != 0
    error = next(x for x in said.splitlines() if x.startswith("error:"))
    assert error.startswith("error: node n1 is already served by a live agent")
    assert "give this agent its own name with --node NAME" in error
    assert error.endswith("(the server refused /v1/agent/register: 409)")
    assert "{" not in error


def test_up_says_on_sigterm_that_it_stopped_and_its_job_keeps_running(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    home = tmp_path / "home"
    env = {**os.environ, "GPUPOOL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [PY, "-m", "gpupool.cli", "up", "--port", str(port), "--simulate", "1xT4"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    pid_file = tmp_path / "job.pid"
    job_pid = 0
    try:
        wait_ready(lambda: answers_ready(url), what="gpupool up", proc=proc, log=log)
        token = (home / "admin-token").read_text().strip()
        with Client(url, token) as gp:
            wait_for(lambda: gp.nodes() or None, 60, "the local agent")
            job = gp.submit(name="keeps", script=f"echo $$ > {pid_file}; sleep 600", gpus=0.5)
            wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the job")
            job_pid = int(pid_file.read_text())
            wait_for(lambda: gp.get(job.id).state == "RUNNING" or None, 60, "RUNNING")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        said = " ".join(log.read_text().split())
        assert "gpupool stopped (SIGTERM)" in said, said[-2000:]
        assert "1 job keeps running on this machine; `gpupool up` re-adopts them" in said
        os.kill(job_pid, 0)  # it does keep running
    finally:
        if proc.poll() is None:
            proc.kill()
        if job_pid:
            with contextlib.suppress(OSError):
                os.killpg(job_pid, signal.SIGKILL)


def _host_label() -> str:
    return socket.gethostname().split(".")[0].lower().replace("_", "-")


def test_allocate_on_a_pool_of_several_nodes_gets_this_machines_gpus(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    here = _host_label()
    try:
        pool.start_server()
        for name in ("far-a", "far-b"):  # eight GPUs elsewhere, two here
            pool.start_agent(name, "4xA100-80GB")
        pool.start_agent(here, "2xA100-80GB")
        mine = {d["uuid"] for d in pool.get("/v1/devices") if d["node"] == here}
        token = (pool.home / "admin-token").read_text().strip()
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        with Client(pool.url, token) as gp:
            for _ in range(3):  # each time on this machine, wherever the pool has room
                with gpupool.allocate(gpus=1, client=gp, hold="10m") as held:
                    assert held.status().nodes == [here]
                    visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
                    assert set(visible) <= mine
            assert os.environ.get("CUDA_VISIBLE_DEVICES") == before
            # -w / -x on the CLI: where they say.
            far = cli(pool, "submit", "-w", "far-b", "-g", "0.1", "--parsable", "--", "sleep", "60")
            assert far.returncode == 0, far.stderr
            assert pool.wait_state(far.stdout.strip(), "RUNNING", timeout=120)["nodes"] == ["far-b"]
            away = cli(pool, "submit", "-x", f"far-a,far-b,{here}", "-g", "0.1", "--", "true")
            assert away.returncode != 0  # every node excluded
            assert cli(pool, "cancel", far.stdout.strip()).returncode == 0
            nowhere = cli(pool, "submit", "-w", "nosuch", "-g", "0.1", "--", "true")
            assert nowhere.returncode != 0
            assert "no node of pool default is left by --nodelist/--exclude" in nowhere.stderr
            # A node drained: a job only it could hold says so.
            assert cli(pool, "drain", "far-a").returncode == 0
            stuck = cli(pool, "submit", "-w", "far-a", "-g", "1", "--parsable", "--", "true")
            assert stuck.returncode == 0, stuck.stderr
            reason = wait_for(
                lambda: gp.get(stuck.stdout.strip()).pending_reason, 60, "a pending reason"
            )
            assert reason.startswith("ReqNodeNotAvail: ")
            assert "far-a (dra" in reason
            assert "gpupool resume NODE" in reason
            assert cli(pool, "cancel", stuck.stdout.strip()).returncode == 0
    finally:
        pool.close()


def test_one_card_oversubscribed_shows_in_the_per_gpu_share_the_alert_reads(
    tmp_path: Path,
) -> None:
    pool = Pool(tmp_path)
    try:
        pool.start_server()
        pool.start_agent("n1", "1xA100-80GB")
        done = cli(pool, "pools", "set", "default", "--overcommit", "2")
        assert done.returncode == 0, done.stderr
        with _client(pool) as gp:
            ids = [
                gp.submit(name=f"half{i}", command=["sleep", "60"], gpus=0.5, gpu_memory="60GiB").id
                for i in range(2)
            ]
            for job_id in ids:
                pool.wait_state(job_id, "RUNNING", timeout=120)
            cards = {sl.device_uuid for job_id in ids for sl in gp.get(job_id).slices}
        text = httpx.get(f"{pool.url}/metrics").text
        share = re.compile(
            r'^gpupool_gpu_mem_share_ratio\{[^}]*device="([^"]+)"[^}]*\} (\S+)$', re.M
        )
        shares = {m.group(1): float(m.group(2)) for m in share.finditer(text)}
        rule = (REPO / "deploy" / "prometheus" / "gpupool-alerts.yml").read_text()
        assert "max by (pool, node, device) (gpupool_gpu_mem_share_ratio) > 1.5" in rule
        (card,) = cards  # both on the one card: 120 GiB promised of its 80
        assert shares == {card: 1.5}
        for job_id in ids:
            assert cli(pool, "cancel", job_id).returncode == 0
    finally:
        pool.close()


def test_an_array_throttle_runs_at_most_n_tasks_at_once(wpool: Pool) -> None:
    spans = wpool.out / "throttle"
    spans.mkdir()
    said = cli(wpool, "submit", "-J", "thr", "-a", "0-5%2", "-g", "0.1", "--parsable", "--wrap",
               f"date +%s.%N > {spans}/$GPUPOOL_ARRAY_TASK_ID.start; sleep 2; "
               f"date +%s.%N > {spans}/$GPUPOOL_ARRAY_TASK_ID.end")  # fmt: skip
    assert said.returncode == 0, said.stderr
    ids = said.stdout.split()
    assert len(ids) == 6
    reason = wait_for(
        lambda: next(
            (r for i in ids if (r := wpool.job(i).get("pending_reason") or "").startswith("JobA")),
            None,
        ),
        60,
        "a JobArrayTaskLimit reason",
    )
    assert "at most 2 tasks of array" in reason
    for job_id in ids:
        assert wpool.wait_state(job_id, "COMPLETED", timeout=300)["exit_code"] == 0
    times = [
        (float((spans / f"{i}.start").read_text()), float((spans / f"{i}.end").read_text()))
        for i in range(6)
    ]
    overlap = max(sum(1 for s, e in times if s <= t < e) for t, _ in times)
    assert overlap <= 2


def test_a_guarantee_held_by_an_exempt_borrower_says_when_it_reclaims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPOOL_TEST_PREEMPT_EXEMPT_S", "300")  # the server's default
    pool = Pool(tmp_path)
    try:
        pool.start_server()
        pool.start_agent("n1", "1xA100-80GB")
        for team, quota in (("course", ["--guaranteed", "1"]), ("research", ["--limit", "1"])):
            assert cli(pool, "tenants", "set", team).returncode == 0
            assert cli(pool, "quota", "set", team, "default", *quota).returncode == 0
        borrowed = cli(pool, "submit", "-A", "research", "-g", "1", "--preemptible",
                       "--parsable", "--", "sleep", "600")  # fmt: skip
        assert borrowed.returncode == 0, borrowed.stderr
        pool.wait_state(borrowed.stdout.strip(), "RUNNING", timeout=120)
        lesson = cli(pool, "submit", "-A", "course", "-g", "1", "--parsable", "--", "true")
        assert lesson.returncode == 0, lesson.stderr
        job_id = lesson.stdout.strip()
        reason = wait_for(lambda: pool.job(job_id).get("pending_reason"), 60, "a reason")
        assert f"borrowed job(s) {borrowed.stdout.strip()} of research" in reason
        assert "exempt from reclaim for their first 300 s: it reclaims them in" in reason
        start = pool.job(borrowed.stdout.strip())["start_time"]
        assert pool.job(job_id)["estimated_start"] == pytest.approx(start + 300, abs=1)
        shown = cli(pool, "show", job_id)
        assert "Est. start" in shown.stdout
        assert "unknown" not in shown.stdout.split("Est. start")[1].splitlines()[0]
        for done in (job_id, borrowed.stdout.strip()):
            cli(pool, "cancel", done)
    finally:
        pool.close()
