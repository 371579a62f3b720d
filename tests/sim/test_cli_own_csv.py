"""``gpupool simulate replay`` on a CSV of the user's own through ``--columns``, and the refusal
of a file read as the wrong format, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.simulate import simulate_app

OWN = """jid,ts,num_gpu,runtime_s,project,tier
a,2024-03-01T10:00:00,1,3600,ml_team,high
b,2024-03-01T10:01:00,0.5,600,vision,
c,2024-03-01T10:02:00,16,7200,vision,low
d,2024-03-01T10:03:00,1,,vision,
e,soon,1,100,vision,
f,2024-03-01T10:04:00,0,100,vision,
"""
MAPPING = "job=jid,submit=ts,gpus=num_gpu,duration=runtime_s,team=project,priority=tier"
SACCT = (
    "JobID|Account|User|QOS|Submit|Start|End|State|AllocTRES\n"
    "1|a|u|normal|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|X|gres/gpu=1\n"
)
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\n"


def simulate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        simulate_app, ["replay", "--no-progress", "--cluster", "16xA100", *args]
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("as_yaml", [False, True])
def test_own_csv_replays_through_a_column_mapping(tmp_path: Path, as_yaml: bool) -> None:
    trace = tmp_path / "own.csv"
    trace.write_text(OWN)
    columns = MAPPING
    if as_yaml:
        columns = str(tmp_path / "columns.yaml")
        Path(columns).write_text(
            "".join(f"{pair.split('=')[0]}: {pair.split('=')[1]}\n" for pair in MAPPING.split(","))
        )
    out = tmp_path / "jobs.json"
    code, output = simulate(
        "--trace", str(trace), "--columns", columns, "--scenario", "pooled",
        "--jobs-out", str(out),
    )  # fmt: skip
    assert code == 0, output
    assert "3 jobs on 16 GPUs (1 no run time, 1 without a GPU, 1 unparseable left out)" in output
    assert f"the first: {trace}:6: column 'ts': 'soon' is neither seconds nor a time" in output
    rows = {r["job"]: r for r in json.loads(out.read_text())}
    assert sorted(rows) == ["a", "b", "c"]
    assert (rows["a"]["team"], rows["b"]["team"]) == ("ml-team", "vision")
    assert (rows["a"]["submit"], rows["b"]["submit"], rows["c"]["submit"]) == (0.0, 60.0, 120.0)
    assert (rows["b"]["gpus"], rows["c"]["gpus"]) == (0.5, 16.0)
    assert all(r["outcome"] == "completed" for r in rows.values())
    assert rows["a"]["end"] - rows["a"]["start"] == 3600.0
    assert len(rows["c"]["nodes"]) == 2  # 16 GPUs: a gang over two 8-GPU machines


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        # a CSV lacking a mapped column: which one, what the header has, what to pass
        (OWN, ["--columns", "submit=ts,gpus=gpus,duration=runtime_s"],
         "column 'gpus': the header has no column 'gpus' (mapped to gpus by --columns): its "
         "columns are jid, ts, num_gpu, runtime_s, project, tier; pass --columns gpus=<one of "
         "them>"),
        # a mapping without the run time
        (OWN, ["--columns", "submit=ts,gpus=num_gpu"],
         "--columns does not map duration (or start and end)"),
        # a CSV of one's own taken for an Alibaba pod list (the .csv default)
        (OWN, [], "is not an Alibaba pod list (its header is not one): if it is a CSV of your "
         "own, map its columns: --columns submit=COL"),
        # an Alibaba pod list read as a Slurm export
        (PODS, ["--trace-kind", "slurm"],
         "was read as a Slurm export (sacct --parsable2) but looks like an Alibaba pod list: "
         "pass --trace alibaba:"),
        # a Slurm export read through --columns
        (SACCT, ["--columns", "submit=Submit,gpus=AllocTRES,duration=End"],
         "was read as a CSV of your own but looks like a Slurm export (sacct --parsable2): "
         "pass --trace slurm:"),
    ],
)  # fmt: skip
def test_a_file_taken_for_the_wrong_format_is_refused_saying_what_to_pass(
    tmp_path: Path, content: str, args: list[str], message: str
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(content)
    target = str(trace)
    if args[:1] == ["--trace-kind"]:
        target, args = f"{args[1]}:{trace}", args[2:]
    code, output = simulate("--trace", target, *args)
    assert code == 2, output
    assert message in " ".join(output.split())
