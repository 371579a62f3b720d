"""``--constraint`` (sbatch ``-C``) with node features, along the CLI and real agents.

Agents declare features (``gpupool agent --feature``), the server keeps them from the
registration, ``gpupool nodes`` shows them; a job with ``-C "a&b|c"`` runs only on nodes whose
features satisfy it (``&`` binds tighter than ``|``, as Slurm); a constraint no node of the pool
satisfies pends with ``BadConstraints`` naming it and the features there are; a malformed
constraint or feature is refused with what to write.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.clirun import gpupool
from tests.e2e.pool import PY, Pool


@pytest.fixture(scope="module")
def fpool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """n1 has ib and a100x8, n2 has ib, n3 none; two simulated GPUs each."""
    p = Pool(tmp_path_factory.mktemp("features"))
    try:
        p.start_server()
        for node, features in (("n1", ("--feature", "ib,a100x8")), ("n2", ("--feature", "ib"))):
            p.agent_args = features
            p.start_agent(node, "2xA100-80GB")
        p.agent_args = ()
        p.start_agent("n3", "2xA100-80GB")
        yield p
    finally:
        p.close()


def submit(pool: Pool, constraint: str) -> str:
    """A job of one GPU that says on which node it ran, and sleeps a little (to overlap)."""
    done = gpupool(
        pool, "submit", "--parsable", "-g", "1", "-C", constraint,
        "--wrap", "echo $GPUPOOL_NODE; sleep 0.5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_nodes_show_their_features(fpool: Pool) -> None:
    listed = gpupool(fpool, "nodes").stdout
    rows = {line.split()[0]: line for line in listed.splitlines()[2:]}
    assert "FEATURES" in listed.splitlines()[0]
    assert " a100x8,ib " in rows["n1"]
    assert " ib " in rows["n2"]
    assert fpool.node("n3")["features"] == []


@pytest.mark.parametrize(
    ("constraint", "allowed"),
    [
        ("a100x8", {"n1"}),
        ("ib&a100x8", {"n1"}),
        ("ib", {"n1", "n2"}),
        ("a100x8|ib", {"n1", "n2"}),
        ("nvlink&ib|a100x8", {"n1"}),  # (nvlink and ib) or a100x8
    ],
)
def test_jobs_run_only_where_the_constraint_holds(
    fpool: Pool, constraint: str, allowed: set[str]
) -> None:
    # more jobs than the allowed nodes' GPUs at once: they queue, and every one ends on one
    ids = [submit(fpool, constraint) for _ in range(2 * len(allowed) + 2)]
    ran = set()
    for job_id in ids:
        fpool.wait_state(job_id, "COMPLETED", timeout=120)
        ran.add(gpupool(fpool, "logs", job_id).stdout.strip())
    assert ran <= allowed, (constraint, ran)
    assert ran  # and they did run


def test_a_constraint_no_node_has_pends_saying_so(fpool: Pool) -> None:
    job_id = submit(fpool, "nvlink&ib")  # n1 and n2 have ib, none nvlink
    try:

        def reason() -> str | None:
            return fpool.job(job_id).get("pending_reason")

        for _ in range(300):
            if reason():
                break
            subprocess.run(["sleep", "0.2"], check=True)
        job = fpool.job(job_id)
        assert job["state"] == "PENDING"
        assert job["constraint"] == "nvlink&ib"
        said = job["pending_reason"]
        assert said.startswith("BadConstraints: no node of pool default has the features")
        assert "--constraint 'nvlink&ib'" in said
        assert "(features of the pool's nodes: a100x8, ib)" in said
        shown = gpupool(fpool, "show", job_id).stdout
        assert "BadConstraints" in shown
    finally:
        fpool.post(f"/v1/jobs/{job_id}/cancel", {})


def test_malformed_constraint_is_refused_at_submit(fpool: Pool) -> None:
    before = len(fpool.get("/v1/jobs")["jobs"])
    done = gpupool(fpool, "submit", "-C", "ib&&a100x8", "--", "true")
    assert done.returncode == 2
    assert "an empty feature is not a node feature" in done.stderr
    assert "joined by & (and) and | (or)" in done.stderr
    assert len(fpool.get("/v1/jobs")["jobs"]) == before


def test_agent_refuses_a_bad_feature_name(fpool: Pool, tmp_path: Path) -> None:
    argv = [PY, "-m", "gpupool.cli", "agent", "--server", fpool.url, "--node", "bad"]
    argv += ["--token-file", str(fpool.agent_token), "--simulate", "1xA100-80GB"]
    argv += ["--state-dir", str(tmp_path / "state"), "--feature", "ib,has space"]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=fpool._env(),
    )
    assert done.returncode != 0
    assert "'has space' is not a feature name" in done.stderr
    assert fpool.node("bad") is None
