"""``gpupool show JOB`` prints what a job holds, as Slurm's ``scontrol show job`` does, on the
user's path: a real server, jobs submitted and shown through the ``gpupool`` CLI (processes).

A job submitted with ``--array``, ``--no-requeue``/``--max-restarts``, ``-C``, ``-w``/``-x``,
``-o``/``--error``, ``--time-min``, ``--begin``, ``-d`` and ``--mail-type``/``--mail-user`` shows
each of them; a webhook URL shows its scheme and host only (its path is often its secret).
No agent: the jobs stay pending, which is all ``show`` needs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.e2e.pool import PY, Pool
from tests.e2e.test_notify import MailPool
from tests.e2e.test_workflow import cli
from tests.ports import free_port


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    class Mailed(MailPool):  # an SMTP host is set (never reached: nothing starts)
        smtp_port = free_port()

    with Mailed.running(tmp_path_factory.mktemp("show"), {}) as pool:  # no agent
        yield pool


def fields(pool: Pool, ref: str) -> dict[str, str]:
    """``gpupool show REF``'s page as key -> value (the key column, two spaces, the value)."""
    shown = cli(pool, "show", ref)
    assert shown.returncode == 0, shown.stderr
    page = shown.stdout.split("\n\n")[0]  # the fields, before the factor and event tables
    pairs = (re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in page.splitlines())
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def submitted(pool: Pool, *args: str) -> str:
    done = cli(pool, "submit", "-g", "0.5", "--parsable", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_show_prints_the_placement_io_mail_requeue_begin_and_dependency_of_a_job(
    spool: Pool,
) -> None:
    first = submitted(spool, "-H", "--", PY, "-c", "pass")
    job = submitted(
        spool, "-J", "fields", "--no-requeue", "--max-restarts", "2",
        "-C", "ib&a100x8", "-w", "n1,n2", "-x", "n3",
        "-o", "out-%j.txt", "--error", "err-%j.txt", "-t", "60", "--time-min", "30",
        "--begin", "now+2hours", "-d", f"afterany:{first}",
        "--mail-type", "END,FAIL", "--mail-user", "https://hooks.example.org/T0/B1/secret",
        "--", PY, "-c", "pass",
    )  # fmt: skip
    page = fields(spool, job)
    assert page["JobId"] == job
    assert page["Requeue"] == "never (at most 2 restarts)"
    assert page["Constraint"] == "ib&a100x8"
    assert (page["Node list"], page["Exclude"]) == ("n1,n2", "n3")
    assert (page["Output"], page["Error"]) == ("out-%j.txt", "err-%j.txt")
    assert (page["Time limit"], page["Time min"]) == ("01:00:00", "00:30:00")
    assert re.search(r"\(in (02:00:00|01:\d\d:\d\d)\)$", page["Begin"]), page["Begin"]
    assert page["Dependency"] == f"afterany:{first}"
    assert page["Mail"] == "END,FAIL to https://hooks.example.org/..."
    assert "secret" not in cli(spool, "show", job).stdout
    assert "secret" not in cli(spool, "show", job, "--json").stdout
    cli(spool, "cancel", job, first)


def test_show_prints_an_array_task_and_an_address_to_mail(spool: Pool) -> None:
    done = cli(
        spool, "submit", "-g", "0.5", "--array", "0-1", "--mail-type", "BEGIN",
        "--mail-user", "ann@example.org", "-o", "task-%a.txt", "--", PY, "-c", "pass",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    array_id = done.stdout.split()[2]  # "Submitted array ID of 2 jobs ..."
    page = fields(spool, f"{array_id}_1")
    assert page["Array task"] == f"{array_id}_1"
    assert page["Mail"] == "BEGIN to ann@example.org"
    assert page["Output"] == "task-%a.txt"
    assert page["Error"] == "task-%a.txt (with the output)"  # no --error: stderr goes there too
    assert page["Requeue"] == "on-preemption (at most 3 restarts)"  # the defaults
    assert "Begin" not in page
    assert "Constraint" not in page
    cli(spool, "cancel", array_id)
