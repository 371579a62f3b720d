"""``gpupool simulate replay`` on a user's own trace, through the CLI: the ``static`` scenario,
per-job output, quotas from the command line, what the Slurm reader leaves out."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.simulate import simulate_app

TRACE = "synthetic:jobs=120,gpus=16,tenants=3,load=1.0,median_work_s=1800"


def simulate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(simulate_app, ["replay", "--no-progress", *args])
    return result.exit_code, result.output


def test_static_keeps_every_team_on_its_own_gpus_and_pooled_shares_them(tmp_path: Path) -> None:
    out = tmp_path / "jobs.json"
    code, output = simulate(
        "--trace", TRACE, "--scenario", "static", "--scenario", "pooled",
        "--jobs-out", str(out), "--json",
    )  # fmt: skip
    assert code == 0, output
    report = json.loads(output[output.index("{") :])
    assert [s["scenario"] for s in report["scenarios"]] == ["static", "pooled"]
    rows = json.loads(out.read_text())
    assert {r["scenario"] for r in rows} == {"static", "pooled"}
    assert len(rows) == 2 * 120

    def owners(scenario: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for row in rows:
            if row["scenario"] == scenario:
                for device in row["devices"]:
                    found.setdefault(device, set()).add(row["team"])
        return found

    static, pooled = owners("static"), owners("pooled")
    assert static
    assert all(len(teams) == 1 for teams in static.values())
    assert any(len(teams) > 1 for teams in pooled.values())  # pooled: teams share devices
    ran = [r for r in rows if r["scenario"] == "static" and r["start"] is not None]
    assert ran
    assert all(r["wait"] == r["start"] - r["submit"] and r["nodes"] for r in ran)


def test_jobs_out_as_csv_has_one_row_per_job_with_times_and_nodes(tmp_path: Path) -> None:
    out = tmp_path / "jobs.csv"
    code, output = simulate("--trace", TRACE, "--scenario", "pooled", "--jobs-out", str(out))
    assert code == 0, output
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 120
    assert list(rows[0]) == [
        "scenario", "job", "team", "gpus", "submit", "start", "end", "wait", "outcome",
        "attempts", "preemptions", "nodes", "devices",
    ]  # fmt: skip
    done = [r for r in rows if r["outcome"] == "completed"]
    assert done
    assert all(r["nodes"].startswith("node-") and float(r["end"]) >= 0 for r in done)
    code, output = simulate("--trace", TRACE, "--jobs-out", str(tmp_path / "jobs.txt"))
    assert code == 2
    assert "name a .csv or .json file" in output


def test_quotas_from_the_command_line_size_the_rooms_and_reach_the_report(
    tmp_path: Path,
) -> None:
    out = tmp_path / "jobs.json"
    code, output = simulate(
        "--trace", TRACE, "--scenario", "static", "--quota", "team-00=12", "--quota",
        "team-01=2:4", "--quota", "team-02=2", "--jobs-out", str(out), "--json",
    )  # fmt: skip
    assert code == 0, output
    report = json.loads(output[output.index("{") :])
    assert report["quotas"] == {
        "team-00": {"guaranteed_milli": 12000, "limit_milli": None},
        "team-01": {"guaranteed_milli": 2000, "limit_milli": 4000},
        "team-02": {"guaranteed_milli": 2000, "limit_milli": None},
    }
    used: dict[str, set[str]] = {}
    for row in json.loads(out.read_text()):
        used.setdefault(row["team"], set()).update(row["devices"])
    assert len(used["team-00"]) > 2  # its room is 12 GPUs
    assert len(used["team-01"]) <= 2
    assert len(used["team-02"]) <= 2


@pytest.mark.parametrize(
    ("quota", "message"),
    [
        ("team-00", "is not TEAM=GUARANTEED[:LIMIT]"),
        ("team-00=two", "'two' is not a number"),
        ("team-00=4:2", "the limit is below the guarantee"),
        ("nobody=1", "not a team of this trace: its teams are team-00, team-01, team-02"),
        ("team-00=40", "the guarantees add up to"),
    ],
)
def test_a_bad_quota_is_refused_with_what_to_pass(quota: str, message: str) -> None:
    code, output = simulate("--trace", TRACE, "--quota", quota)
    assert code == 2
    assert message in output


SACCT = "JobID|Account|User|QOS|Submit|Start|End|State|AllocTRES"


def test_slurm_export_counts_what_it_leaves_out_and_takes_underscored_accounts(
    tmp_path: Path,
) -> None:
    day = "2024-03-01T"
    lines = [
        SACCT,
        f"1|ml_team|ann|normal|{day}10:00:00|{day}10:00:00|{day}11:00:00|COMPLETED|gres/gpu=1",
        f"2|Vision|bob|normal|{day}10:01:00|{day}10:01:00|{day}10:30:00|COMPLETED|gres/gpu=2",
        f"3|ml_team|ann|normal|{day}10:02:00|{day}10:02:00|Unknown|RUNNING|gres/gpu=1",
        f"4|ml_team|ann|normal|{day}10:03:00|None|Unknown|PENDING|gres/gpu=1",
        f"5|ml_team|ann|normal|yesterday|{day}10:00:00|{day}11:00:00|COMPLETED|gres/gpu=1",
        "6|ml_team|ann",
        f"7|ml_team|ann|normal|{day}10:04:00|{day}10:04:00|{day}10:05:00|COMPLETED|cpu=4",
    ]
    export = tmp_path / "march.txt"
    export.write_text("\n".join(lines) + "\n")
    out = tmp_path / "jobs.json"
    code, output = simulate(
        "--trace", str(export), "--cluster", "8xA100", "--jobs-out", str(out)
    )  # fmt: skip
    assert code == 0, output
    assert "2 jobs on 8 GPUs" in output
    for counted in ("1 never started", "1 unfinished", "1 without a GPU", "2 unparseable"):
        assert counted in output
    assert f"the first: {export}:6: column 'Submit': 'yesterday' is not a time" in output
    assert "ml_team -> ml-team" in output
    assert "Vision -> vision" in output
    teams = {r["job"]: r["team"] for r in json.loads(out.read_text())}
    assert teams == {"1": "ml-team", "2": "vision"}
