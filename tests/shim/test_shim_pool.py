"""Jobs under the CUDA shim in a real pool: a ``gpupool server`` process and a ``gpupool agent``
process with simulated GPUs, whose node has the fake driver of these tests as its "real"
``libcuda.so.1`` (``GPUPOOL_REAL_LIBCUDA``). The jobs run the probe (a CUDA program that finds
the driver as a CUDA 12 runtime does), fed commands by a shell line.

A job submitted with isolation ``shim`` (or ``auto`` for a fraction, on such a node) is held to
its slice, is reported as shimmed once its process attached, and its region is gone when it
ends; one that bypasses the shim is reported as running without it, with the reason.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.runtime.shim import Region, limits_path
from gpupool.shim.build import ensure_built
from tests.e2e.pool import PY, REPO, Pool, wait_for
from tests.shim.helpers import Natives, build_natives

GIB = 1 << 30
DEADLINE_S = float(os.environ.get("GPUPOOL_TEST_DEADLINE_S", "180"))


class ShimPool(Pool):
    """A pool whose agents find the fake driver as the node's real one."""

    def __init__(self, root: Path, natives: Natives) -> None:
        super().__init__(root)
        self.natives = natives
        self.regions = root / "regions"

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env["GPUPOOL_REAL_LIBCUDA"] = str(self.natives.fake)
        env["GPUPOOL_REAL_LIBNVML"] = str(self.natives.fake_nvml)
        env["GPUPOOL_SHIM_DIR"] = str(self.natives.shim.root.parent)
        env["GPUPOOL_SHIM_REGIONS"] = str(self.regions)
        env["LD_LIBRARY_PATH"] = "/opt/node-libs"
        return env

    def probe_job(
        self,
        name: str,
        commands: list[str],
        *,
        bypass: bool = False,
        later: tuple[str, ...] = (),
        **spec: Any,
    ) -> str:
        """A job that runs the probe with ``commands``, then waits for ``<out>/<name>.go``.

        ``later`` are sent once ``<out>/<name>.next`` exists. ``bypass`` runs it with the fake
        driver first on its own library path, as a program whose RPATH names a driver copy
        would: the shim never loads."""
        out = self.out / f"{name}.txt"
        feed = "; ".join(f"echo {shlex.quote(c)}" for c in commands)
        go = self.out / f"{name}.go"
        prefix = f"LD_LIBRARY_PATH={self.natives.fake.parent} " if bypass else ""
        # A file the test makes, polled by the job's own shell line (not by the test).
        nxt = self.out / f"{name}.next"
        feed_later = "; ".join(f"echo {shlex.quote(c)}" for c in later)
        script = (
            f'echo "$LD_LIBRARY_PATH" > {self.out / name}.ldpath; '
            f"({feed}; "
            + (f"while [ ! -e {nxt} ]; do sleep 0.1; done; {feed_later}; " if later else "")
            + f"while [ ! -e {go} ]; do sleep 0.1; done; echo exit) | "
            f"{prefix}{self.natives.probe} > {out} 2> {self.out / name}.err"
        )
        body = {"name": name, "script": script, **spec}
        return str(self.post("/v1/jobs", {"spec": body})["job"]["id"])

    def answers(self, name: str, count: int) -> list[list[str]]:
        path = self.out / f"{name}.txt"

        def done() -> list[list[str]] | None:
            lines = path.read_text().splitlines() if path.exists() else []
            return [line.split() for line in lines] if len(lines) >= count else None

        try:
            return wait_for(done, DEADLINE_S, f"{count} answers from {name}'s probe")
        except AssertionError as exc:
            err = self.out / f"{name}.err"
            said = path.read_text() if path.exists() else "(nothing)"
            raise AssertionError(
                f"{exc}: it said {said!r}, stderr {err.read_text() if err.exists() else ''!r}; "
                f"agent log: {(self.root / 'agent-n1.log').read_text()[-3000:]}"
            ) from None

    def regions_now(self) -> list[Path]:
        return sorted(self.regions.glob("*.region")) if self.regions.exists() else []


@pytest.fixture(scope="module")
def shim_pool(natives: Natives, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShimPool]:
    p = ShimPool(tmp_path_factory.mktemp("shimpool"), natives)
    try:
        p.start_server()
        p.start_agent("n1", "2xA100-80GB")
        yield p
    finally:
        p.close()


def test_the_node_offers_shim_when_it_has_a_driver_and_the_shim_builds(shim_pool):
    node = shim_pool.node("n1")
    assert node is not None
    assert "shim" in node["isolation_modes"]


def test_a_job_submitted_with_isolation_shim_is_held_to_its_slice_and_its_region_goes_at_end(
    shim_pool,
):
    name = "held"
    job_id = shim_pool.probe_job(
        name,
        ["init", "info", f"alloc {8 * GIB}", "alloc 1"],
        isolation="shim",
        resources={"gpus": "0.5", "gpu_memory": "8GiB"},
    )
    answers = shim_pool.answers(name, 4)
    assert answers[0] == ["ok"], answers
    assert answers[1][2] == str(8 * GIB)  # cuMemGetInfo's total is the slice
    assert answers[2][0] == "ok"
    assert answers[3] == ["err", "2"]  # CUDA_ERROR_OUT_OF_MEMORY at the slice's limit
    assert "slice" in (shim_pool.out / f"{name}.err").read_text()
    job = wait_for(
        lambda: (j := shim_pool.job(job_id))["isolation"] == "shim" and j,
        DEADLINE_S,
        "the job reported as shimmed",
    )
    assert job["state"] == "RUNNING"
    (region_path,) = shim_pool.regions_now()
    with Region.open(region_path, build=shim_pool.natives.shim) as region:
        snap = region.read()
        assert len(snap.attached_pids) == 1
        (dev,) = snap.devices
        assert (dev.used_bytes, dev.mem_limit_bytes, dev.sm_share_permille) == (
            8 * GIB,
            8 * GIB,
            500,
        )
        assert dev.uuid == job_slices(shim_pool, job_id)[0]
    assert os.stat(region_path).st_mode & 0o077 == 0  # no other account may read or write it
    (shim_pool.out / f"{name}.go").touch()
    shim_pool.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)
    wait_for(lambda: not shim_pool.regions_now(), DEADLINE_S, "the region deleted")
    ldpath = (shim_pool.out / f"{name}.ldpath").read_text().strip().split(":")
    assert ldpath == [str(shim_pool.natives.shim.facade_dir), "/opt/node-libs"]


def show(pool: ShimPool, job_id: str) -> str:
    """What `gpupool show JOB` prints, wide enough that no line is cut."""
    token = (pool.home / "admin-token").read_text().strip()
    env = {**os.environ, "GPUPOOL_HOME": str(pool.home), "PYTHONPATH": str(REPO),
           "COLUMNS": "400"}  # fmt: skip
    done = subprocess.run(
        [PY, "-m", "gpupool.cli", "show", job_id, "--server", pool.url, "--token", token],
        env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def job_slices(pool: Pool, job_id: str) -> list[str]:
    return [s["device_uuid"] for s in pool.job(job_id)["slices"]]


def test_a_fractional_job_with_isolation_auto_gets_the_shim_on_such_a_node(shim_pool):
    name = "auto"
    job_id = shim_pool.probe_job(
        name, ["init", "info"], resources={"gpus": "0.25", "gpu_memory": "2GiB"}
    )
    answers = shim_pool.answers(name, 2)
    assert answers[1][2] == str(2 * GIB)
    wait_for(lambda: shim_pool.job(job_id)["isolation"] == "shim", DEADLINE_S, "auto picked shim")
    (shim_pool.out / f"{name}.go").touch()
    shim_pool.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)


def test_a_job_that_bypasses_the_shim_is_reported_as_running_without_it(shim_pool):
    name = "escaped"
    job_id = shim_pool.probe_job(
        name,
        ["init", f"alloc {9 * GIB}"],
        bypass=True,
        isolation="shim",
        resources={"gpus": "0.5", "gpu_memory": "8GiB"},
    )
    answers = shim_pool.answers(name, 2)
    assert answers[1][0] == "ok"  # more than its slice: the shim is not there
    job = wait_for(
        lambda: (j := shim_pool.job(job_id))["isolation"] is not None and j,
        DEADLINE_S,
        "the job's isolation reported",
    )
    assert job["isolation"] == "soft"  # never shown as shimmed
    # While it runs, the job's view and `gpupool show` say why, not only at its end.
    job = wait_for(
        lambda: (
            "running without the CUDA shim" in ((j := shim_pool.job(job_id))["reason"] or "") and j
        ),
        DEADLINE_S,
        "the escape's reason in the job's view while it runs",
    )
    assert job["state"] == "RUNNING", job
    shown = show(shim_pool, job_id)
    assert re.search(r"Isolation\s+soft", shown), shown
    assert "running without the CUDA shim" in " ".join(shown.split()), shown
    (shim_pool.out / f"{name}.go").touch()
    job = shim_pool.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)
    assert "running without the CUDA shim" in (job["reason"] or ""), job
    wait_for(lambda: not shim_pool.regions_now(), DEADLINE_S, "the region deleted")


def test_a_pool_that_spills_shows_each_jobs_spilled_bytes_in_show_and_metrics(shim_pool):
    """``gpupool pools set default --oversubscription spill``: a shim job's allocation that fits
    its slice but not the (fake) GPU's 1 GiB is served from host memory, and its bytes reach
    the job's view, ``gpupool show`` and ``gpupool_slice_spilled_bytes``."""
    token = (shim_pool.home / "admin-token").read_text().strip()
    env = {**os.environ, "GPUPOOL_HOME": str(shim_pool.home), "PYTHONPATH": str(REPO)}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [PY, "-m", "gpupool.cli", *args[:2], "--server", shim_pool.url, "--token", token,
             *args[2:]],
            env=env, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    cli("pools", "set", "default", "--oversubscription", "spill")
    try:
        name = "spilled"
        job_id = shim_pool.probe_job(
            name,
            ["init", f"alloc {2 * GIB}"],
            isolation="shim",
            env={"FAKE_CUDA_MEM": str(GIB)},  # the GPU itself is full past 1 GiB
            resources={"gpus": "0.5", "gpu_memory": "4GiB"},
        )
        answers = shim_pool.answers(name, 2)
        assert answers[1][0] == "ok", answers  # spilled, not refused
        job = wait_for(
            lambda: (j := shim_pool.job(job_id))["spilled_bytes"] == 2 * GIB and j,
            DEADLINE_S,
            "the spilled bytes reported",
        )
        assert job["memory_oversubscription"] == "spill"
        assert [sl["spilled_bytes"] for sl in job["slices"]] == [2 * GIB]
        assert "spill; spilled: 2" in cli("show", job_id)
        device = job["slices"][0]["device_uuid"]
        metrics = shim_pool.http.get("/metrics").text if shim_pool.http else ""
        (line,) = [
            x
            for x in metrics.splitlines()
            if x.startswith("gpupool_slice_spilled_bytes{") and device in x
        ]
        assert float(line.rsplit(" ", 1)[1]) == 2 * GIB
        (shim_pool.out / f"{name}.go").touch()
        shim_pool.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)
    finally:
        cli("pools", "set", "default", "--oversubscription", "fail")


def test_gpupool_resize_grows_a_running_shim_job_in_place_and_refuses_what_does_not_fit(
    shim_pool,
):
    token = (shim_pool.home / "admin-token").read_text().strip()
    env = {**os.environ, "GPUPOOL_HOME": str(shim_pool.home), "PYTHONPATH": str(REPO)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "gpupool.cli", args[0], "--server", shim_pool.url, "--token", token,
             *args[1:]],
            env=env, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip

    name = "resized"
    job_id = shim_pool.probe_job(
        name,
        ["init", f"alloc {4 * GIB}", "alloc 1"],
        later=("alloc 1", "info"),
        isolation="shim",
        resources={"gpus": "0.25", "gpu_memory": "4GiB"},
    )
    answers = shim_pool.answers(name, 3)
    assert answers[2] == ["err", "2"]  # the slice is full
    wait_for(lambda: shim_pool.job(job_id)["isolation"] == "shim", DEADLINE_S, "shimmed")
    too_big = cli("resize", job_id, "--gpu-mem", "500GiB")
    assert too_big.returncode != 0
    assert "free beside its other slices" in too_big.stderr + too_big.stdout
    tenant = shim_pool.job(job_id)["tenant"]
    assert shim_pool.http is not None
    quota = f"/v1/tenants/{tenant}/quotas/default"
    shim_pool.http.put(quota, json={"limit_milli": 400}).raise_for_status()
    try:
        over_quota = cli("resize", job_id, "-g", "0.5")
    finally:
        shim_pool.http.delete(quota).raise_for_status()
    assert over_quota.returncode != 0
    assert "over its quota of 0.4" in over_quota.stderr + over_quota.stdout
    assert shim_pool.job(job_id)["slices"][0]["milli"] == 250  # refused: nothing changed
    done = cli("resize", job_id, "--gpu-mem", "6GiB", "-g", "0.5")
    assert done.returncode == 0, done.stderr
    assert "now 0.5 GPU" in done.stdout
    (region_path,) = shim_pool.regions_now()
    with Region.open(region_path, build=shim_pool.natives.shim) as region:
        wait_for(
            lambda: (
                (d := region.read().devices[0]).mem_limit_bytes == 6 * GIB
                and d.sm_share_permille == 500
            ),
            DEADLINE_S,
            "the agent resizing the region",
        )
    (shim_pool.out / f"{name}.next").touch()
    answers = shim_pool.answers(name, 5)
    assert answers[3][0] == "ok", answers  # the running process may allocate again
    assert answers[4][2] == str(6 * GIB)  # and sees the new slice
    job = shim_pool.job(job_id)
    assert [(sl["milli"], sl["memory_mib"]) for sl in job["slices"]] == [(500, 6144)]
    events = shim_pool.get("/v1/events")
    assert any(e["kind"] == "job.resize" and e["subject"] == job_id for e in events), events
    audit = shim_pool.get("/v1/audit")
    assert any(a["action"] == "job.resize" and a.get("target") == job_id for a in audit)
    (shim_pool.out / f"{name}.go").touch()
    shim_pool.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)


class RunAsShimPool(ShimPool):
    """Its agent runs jobs as the Unix account ``nobody`` and builds the shim where it likes."""

    agent_args = ("--run-as", "nobody")

    def _env(self) -> dict[str, str]:
        env = super()._env()
        del env["GPUPOOL_SHIM_DIR"]  # the agent's own choice: its jobs' account must read it
        env["HOME"] = str(self.root / "agent-home")  # a private home, as root's is
        return env

    def start_server(self) -> None:
        super().start_server()
        self.agent_token.chmod(0o600)
        self.out.chmod(0o777)  # the jobs write their answers there


@pytest.fixture(scope="module")
def open_root() -> Iterator[Path]:
    """A folder others may read (pytest's own are 0700: no job of another account could run
    the probe or load the fake driver below them)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-shim-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as another account only under root")
def test_a_shim_job_run_as_another_account_opens_its_region_and_is_held(open_root):
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no 'nobody' account")
    natives = build_natives(open_root / "natives", ensure_built(cache=open_root / "cache"))
    root = open_root / "pool"
    root.mkdir(mode=0o711)
    (root / "agent-home").mkdir(mode=0o700)
    p = RunAsShimPool(root, natives)
    try:
        p.start_server()
        p.start_agent("n1", "1xA100-80GB")
        name = "runas"
        job_id = p.probe_job(
            name,
            ["init", f"alloc {4 * GIB}", "alloc 1"],
            isolation="shim",
            resources={"gpus": "0.5", "gpu_memory": "4GiB"},
        )
        answers = p.answers(name, 3)
        assert answers[0] == ["ok"], (answers, (p.out / f"{name}.err").read_text())
        assert answers[1][0] == "ok"
        assert answers[2] == ["err", "2"]
        (region_path,) = p.regions_now()
        st = os.stat(region_path)
        assert (st.st_uid, st.st_mode & 0o777) == (nobody.pw_uid, 0o600)
        wait_for(lambda: p.job(job_id)["isolation"] == "shim", DEADLINE_S, "shim reported")
        (p.out / f"{name}.go").touch()
        p.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)
        wait_for(lambda: not p.regions_now(), DEADLINE_S, "the region deleted")
    finally:
        p.close()


OLD_MEM_LIMIT_OFFSET = 184  # dev[0].mem_limit in the one-file region of versions 1 and 2


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as another account only under root")
def test_a_job_cannot_raise_its_own_limit_by_writing_its_region(open_root):
    """Issue 25, finding 9: the five-line poke (mmap $GPUPOOL_CUDA_REGION, write
    dev[0].mem_limit) let a 4 GiB job allocate past its slice. Along the agent path, with the
    job run as another account: the limits live in a part the job can only read."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no 'nobody' account")
    natives = build_natives(open_root / "poke-natives", ensure_built(cache=open_root / "cache"))
    root = open_root / "poke-pool"
    root.mkdir(mode=0o711)
    (root / "agent-home").mkdir(mode=0o700)
    p = RunAsShimPool(root, natives)
    try:
        p.start_server()
        p.start_agent("n1", "1xA100-80GB")
        name = "poke"
        fifty = 50_000 * (1 << 20)
        job_id = p.probe_job(
            name,
            ["init", f"alloc {4 * GIB}", f"poke {OLD_MEM_LIMIT_OFFSET} {fifty}", "alloc 1"],
            isolation="shim",
            resources={"gpus": "0.5", "gpu_memory": "4GiB"},
        )
        answers = p.answers(name, 4)
        assert answers[:2] == [["ok"], ["ok", answers[1][1]]], answers
        poked = answers[2]
        assert poked[0] == "ok"
        assert poked[2] == str(errno.EACCES), poked  # the limits part: not writable by the job
        assert answers[3] == ["err", "2"], answers  # still held to its 4 GiB
        (region_path,) = p.regions_now()
        with Region.open(region_path, build=natives.shim) as region:
            assert region.read().devices[0].mem_limit_bytes == 4 * GIB
        limits = os.stat(limits_path(region_path))
        assert (limits.st_uid, limits.st_mode & 0o777) == (os.geteuid(), 0o644)
        assert os.stat(region_path).st_uid == nobody.pw_uid
        (p.out / f"{name}.go").touch()
        p.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)
        wait_for(lambda: not p.regions_now(), DEADLINE_S, "the region deleted")
        assert not list(p.regions.glob("*.limits"))
    finally:
        p.close()
