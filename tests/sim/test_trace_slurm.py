"""The Slurm ``sacct --parsable2`` adapter: which lines become jobs, with what, and the errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.alibaba import TraceFormatError
from gpupool.sim.replay import replay
from gpupool.sim.scenarios import get_scenario
from gpupool.sim.trace_slurm import slurm_workload
from gpupool.sim.traces import TraceOptions, load_cluster, load_trace

HEADER = "JobID|Account|User|QOS|Submit|Start|End|State|AllocTRES"
LINES = [
    # a 1-GPU job and its steps (left out)
    "100|vision|ann|normal|2024-03-01T10:00:00|2024-03-01T10:00:30|2024-03-01T11:00:30|COMPLETED|"
    "billing=4,cpu=4,gres/gpu=1,mem=16G,node=1",
    "100.batch|vision|||2024-03-01T10:00:30|2024-03-01T10:00:30|2024-03-01T11:00:30|COMPLETED|"
    "cpu=4,gres/gpu=1,mem=16G,node=1",
    "100.extern|vision|||2024-03-01T10:00:30|2024-03-01T10:00:30|2024-03-01T11:00:30|COMPLETED|",
    # a typed 16-GPU job of a high QOS: a gang of 2 x 8 A100s, not preemptible
    "101|nlp|bob|high|2024-03-01T10:05:00|2024-03-01T12:00:00|2024-03-01T14:00:00|COMPLETED|"
    "cpu=64,gres/gpu=16,gres/gpu:a100=16,node=2",
    # an array task, no account: the user is the tenant; unknown QOS -> normal
    "102_3||cat|scavenger|2024-03-01T10:10:00|2024-03-01T10:10:00|2024-03-01T10:40:00|FAILED|"
    "cpu=2,gres/gpu=2,node=1",
    # no GPU: left out
    "103|vision|ann|normal|2024-03-01T10:11:00|2024-03-01T10:11:00|2024-03-01T10:12:00|COMPLETED|"
    "cpu=2,mem=4G,node=1",
    # never started, still running: left out
    "104|nlp|bob|normal|2024-03-01T10:12:00|Unknown|Unknown|CANCELLED by 1000|",
    "105|nlp|bob|normal|2024-03-01T10:13:00|2024-03-01T10:13:00|Unknown|RUNNING|gres/gpu=1",
]


def _export(tmp_path: Path, lines: list[str], header: str = HEADER, name: str = "jobs.txt") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def test_jobs_times_shapes_tenants_and_classes_come_from_the_export(tmp_path: Path) -> None:
    workload = slurm_workload(_export(tmp_path, LINES))
    jobs = {j.id: j for j in workload.jobs}
    assert sorted(jobs) == ["100", "101", "102_3"]
    one, big, task = jobs["100"], jobs["101"], jobs["102_3"]
    assert (one.submit_time, one.work_s, one.gpu_milli, one.replicas) == (0.0, 3600.0, 1000, 1)
    assert (one.tenant, one.priority_class, one.preemptible, one.gpu_types) == (
        "vision",
        "normal",
        True,
        (),
    )
    assert (big.submit_time, big.work_s, big.gpu_milli, big.replicas) == (300.0, 7200.0, 8000, 2)
    assert (big.gpu_types, big.priority_class, big.preemptible) == (("A100",), "high", False)
    assert (task.tenant, task.priority_class, task.submit_time, task.work_s) == (
        "cat",
        "normal",
        600.0,
        1800.0,
    )
    assert task.gpu_milli == 2000


def test_the_export_is_recognised_by_its_header_and_replays_on_a_sized_cluster(
    tmp_path: Path,
) -> None:
    path = _export(tmp_path, LINES, name="march.sacct")
    workload, cluster = load_trace(str(path), TraceOptions())
    assert cluster is None  # Slurm exports bring no machines: --cluster names them
    assert len(workload.jobs) == 3
    result = replay(workload, load_cluster("16xA100"), get_scenario("exclusive"))
    outcomes = {j.id: j.outcome for j in result.jobs}
    assert outcomes == {"100": "completed", "101": "completed", "102_3": "completed"}


@pytest.mark.parametrize(
    ("tres", "gpus", "model"),
    [
        ("cpu=8,gres/gpu=2,gres/gpu:a100=2,node=1", 2, "A100"),
        ("gres/gpu:h100=4,cpu=8", 4, "H100"),
        ("gres/gpu:a100=1,gres/gpu:v100=1", 2, None),  # two models: any
        ("gres/gpu=3", 3, None),
        ("cpu=8,mem=4G", 0, None),
    ],
)
def test_gpus_and_model_are_read_from_tres(
    tmp_path: Path, tres: str, gpus: int, model: str | None
) -> None:
    line = f"1|a|u|normal|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|X|{tres}"
    keep = "2|a|u|normal|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|X|gres/gpu=1"
    jobs = {j.id: j for j in slurm_workload(_export(tmp_path, [line, keep])).jobs}
    if gpus == 0:
        assert "1" not in jobs
        return
    assert jobs["1"].gpu_milli * jobs["1"].replicas == gpus * 1000
    assert jobs["1"].gpu_types == ((model,) if model else ())


def test_one_gpu_jobs_take_shares_from_a_mix(tmp_path: Path) -> None:
    path = _export(tmp_path, LINES)
    plain = slurm_workload(path)
    mixed = slurm_workload(path, share_mix=[250, 500])
    assert next(j.gpu_milli for j in mixed.jobs if j.id == "100") in (250, 500)
    assert [j.gpu_milli for j in mixed.jobs if j.id != "100"] == [
        j.gpu_milli for j in plain.jobs if j.id != "100"
    ]
    assert mixed.name.endswith("+ Alibaba shares")


@pytest.mark.parametrize(
    ("header", "line", "where"),
    [
        ("JobID|Submit|Start|End", None, "jobs.txt:1: column 'alloctres'"),
        ("JobID|Start|End|AllocTRES", None, "jobs.txt:1: column 'submit'"),
        (HEADER, "106|a|u|normal|yesterday|2024-03-01T10:00:00|2024-03-01T11:00:00|X|gres/gpu=1",
         "jobs.txt:2: column 'Submit': 'yesterday' is not a time"),
        (HEADER, "107|a|u|normal|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|X|"
         "gres/gpu=two", "jobs.txt:2: column 'AllocTRES': 'gres/gpu=two' is not a GPU count"),
        (HEADER, "108|a|u|normal|2024-03-01T10:00:00|2024-03-01T12:00:00|2024-03-01T11:00:00|X|"
         "gres/gpu=1", "jobs.txt:2: column 'End': times are out of order"),
        (HEADER, "109|a|u", "jobs.txt:2: has 3 |-separated fields, the header has 9"),
        (HEADER, "110|a|u|normal|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|X|"
         "cpu=1", "jobs.txt: holds no GPU job that started and ended"),
    ],
)  # fmt: skip
def test_a_bad_export_is_refused_with_file_line_and_column(
    tmp_path: Path, header: str, line: str | None, where: str
) -> None:
    path = _export(tmp_path, [line] if line else [], header=header)
    with pytest.raises(TraceFormatError) as caught:
        slurm_workload(path)
    assert str(caught.value).startswith(f"{tmp_path}/{where}")
