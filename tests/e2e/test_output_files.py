"""``submit -o/--error`` (sbatch ``-o``/``-e``) through the CLI and a real agent.

The job's stdout and stderr are written, on its node, to the files its patterns name, with
``%j``, ``%x``, ``%A``/``%a``, ``%u`` and ``%N`` replaced, opened as the job's account (not
root); ``-o`` alone takes both streams; ``gpupool logs`` still has the output; a pattern with an
unknown ``%`` symbol is refused at submit with the list of symbols, and nothing is submitted.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.autopool import auto_pool
from tests.e2e.clirun import gpupool
from tests.e2e.pool import Pool, wait_for


@pytest.fixture(scope="module")
def opool() -> Iterator[Pool]:
    with auto_pool("outfiles", {"n1": "2xA100-80GB"}) as p:
        yield p


@pytest.fixture
def outdir(opool: Pool) -> Path:
    """A folder every account may write (the job runs as an account of its own)."""
    folder = Path(tempfile.mkdtemp(prefix="outs-", dir=opool.root))
    folder.chmod(0o1777)
    return folder


def test_output_and_error_files_with_patterns(opool: Pool, outdir: Path) -> None:
    script = "echo to-out; echo to-err >&2; exit 0"
    done = gpupool(
        opool, "run", "-J", "pat", "-g", "0.25",
        "-o", f"{outdir}/%x-%j-%u-%N.out", "--error", f"{outdir}/%x-%A_%a.err", "--wrap", script,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stderr.split("Submitted job ")[1].split()[0]
    out = outdir / f"pat-{job_id}-admin-n1.out"
    err = outdir / f"pat-{job_id}_4294967294.err"
    assert out.read_bytes() == b"to-out\n"
    assert err.read_bytes() == b"to-err\n"
    assert out.stat().st_uid != 0  # opened as the job's account, not the supervisor's root
    shown = opool.job(job_id)
    assert shown["output"] == f"{outdir}/%x-%j-%u-%N.out"
    assert shown["error"] == f"{outdir}/%x-%A_%a.err"
    assert gpupool(opool, "logs", job_id).stdout == "to-out\n"  # the server's log as before


def test_output_alone_takes_both_streams_and_array_symbols(opool: Pool, outdir: Path) -> None:
    done = gpupool(
        opool, "submit", "-J", "arr", "-g", "0.25", "-a", "0-1", "--parsable",
        "-o", f"{outdir}/job_%A_%a.log", "--wrap", "echo out-$GPUPOOL_ARRAY_TASK_ID; echo e >&2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.split()
    array_id = opool.job(first)["array_id"]
    for job_id in (first, second):
        opool.wait_state(job_id, "COMPLETED")
    for index in (0, 1):
        path = outdir / f"job_{array_id}_{index}.log"
        wait_for(path.exists, 30, str(path))
        assert sorted(path.read_text().split()) == sorted([f"out-{index}", "e"])


def test_unknown_pattern_is_refused_at_submit(opool: Pool, outdir: Path) -> None:
    before = len(opool.get("/v1/jobs")["jobs"])
    done = gpupool(opool, "submit", "-o", f"{outdir}/%q.out", "--wrap", "true")
    assert done.returncode == 2
    assert "%q is not a replacement symbol" in done.stderr
    assert "%j (job id)" in done.stderr
    assert len(opool.get("/v1/jobs")["jobs"]) == before


def test_unwritable_output_file_is_a_boot_failure_saying_why(opool: Pool) -> None:
    locked = Path(tempfile.mkdtemp(prefix="locked-", dir=opool.root))  # 0700, root's
    done = gpupool(opool, "run", "-g", "0.25", "-o", f"{locked}/x.out", "--wrap", "echo hi")
    assert done.returncode != 0
    job_id = done.stderr.split("Submitted job ")[1].split()[0]
    job = opool.wait_state(job_id, "BOOT_FAIL")
    assert "cannot open the -o file" in job["reason"]
    assert "Permission denied" in job["reason"]
    assert not (locked / "x.out").exists()
