"""``gpupool simulate replay`` from the user's side: table, JSON, HTML, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from gpupool.cli.simulate_replay import replay_command


def app() -> typer.Typer:
    # The command as the simulate sub-app registers it; built here so the test does not
    # depend on the rest of the CLI.
    sub = typer.Typer()
    sub.command("replay")(replay_command)
    sub.command("other")(lambda: None)
    return sub


TRACE = "synthetic:jobs=40,gpus=8,load=1.2,median_work_s=600"


def test_replay_prints_a_comparison_and_writes_json_and_html(tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app(),
        ["replay", "--trace", TRACE, "--no-progress", "--html", str(html), "--json-file", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "GPU allocation" in result.output
    assert "exclusive" in result.output
    assert "pooled" in result.output
    page = html.read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 3
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing to fetch
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [s["scenario"] for s in data["scenarios"]] == ["exclusive", "pooled"]
    assert set(data["scenarios"][1]["queueing_delay"]) == {"count", "mean", "p50", "p95", "p99"}


def test_replay_json_to_stdout_for_one_named_scenario() -> None:
    result = CliRunner().invoke(
        app(),
        ["replay", "--trace", TRACE, "--scenario", "pooled+spread", "--json", "--no-progress"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["scenarios"][0]["scenario"] == "pooled+spread"
    assert data["jobs"] == 40


def test_replay_refuses_a_bad_trace_with_file_line_and_column(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,scheduled_time,deletion_time\n"
        "p0,1000,1024,1,half,0,0,10\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        app(), ["replay", "--trace", str(pods), "--cluster", "8xT4", "--no-progress"]
    )
    assert result.exit_code == 2
    assert f"{pods}:2: column 'gpu_milli'" in result.output


def test_replay_refuses_an_unknown_scenario_with_the_known_ones() -> None:
    result = CliRunner().invoke(
        app(), ["replay", "--trace", TRACE, "--scenario", "magic", "--no-progress"]
    )
    assert result.exit_code == 2
    assert "exclusive" in result.output


def test_replay_of_a_slurm_export_compares_the_scenarios(tmp_path: Path) -> None:
    path = tmp_path / "jobs.txt"
    rows = ["JobID|Account|Submit|Start|End|AllocTRES"]
    for i in range(12):
        submit = f"2024-03-01T10:{i:02d}:00"
        rows.append(f"{i}|team-{i % 2}|{submit}|{submit}|2024-03-01T11:{i:02d}:00|gres/gpu=1")
    path.write_text("\n".join(rows) + "\n")
    result = CliRunner().invoke(
        app(), ["replay", "--trace", str(path), "--cluster", "4xT4", "--no-progress", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["workload"] == "jobs.txt"
    outcomes = {s["scenario"]: s["outcomes"] for s in data["scenarios"]}
    assert outcomes == {"exclusive": {"completed": 12}, "pooled": {"completed": 12}}
    result = CliRunner().invoke(app(), ["replay", "--trace", str(path), "--no-progress"])
    assert result.exit_code != 0
    assert "pass --cluster" in result.output
