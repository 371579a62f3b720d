"""The packing experiment's harness: inflation and pruning, curves, determinism, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.sim.packing import RunSpec, discrete_curve, run_once, tune


def test_tune_inflates_to_the_ratio_and_keeps_every_pod() -> None:
    milli = np.array([1000, 500, 2000, 300], dtype=np.int64)  # 3800 of a 4000 capacity
    picked = tune(milli, seed=3, capacity_milli=4000, ratio=1.3)
    assert sorted(picked[:4].tolist()) == [0, 1, 2, 3]
    total = int(milli[picked].sum())
    assert total <= 5200
    # Stops at the first draw that would overshoot: at most one more pod of the list would not fit.
    assert total > 5200 - int(milli.max())


def test_tune_prunes_random_pods_above_the_ratio() -> None:
    milli = np.full(100, 1000, dtype=np.int64)  # 100 GPUs on a 50-GPU cluster
    picked = tune(milli, seed=1, capacity_milli=50_000, ratio=1.3)
    assert len(set(picked.tolist())) == len(picked) == 65


def test_tune_depends_on_the_seed_only() -> None:
    milli = np.arange(1, 50, dtype=np.int64) * 10
    assert tune(milli, 5, 1000).tolist() == tune(milli, 5, 1000).tolist()
    assert tune(milli, 5, 1000).tolist() != tune(milli, 6, 1000).tolist()


def test_curve_column_is_the_mean_over_pods_that_round_to_it() -> None:
    arrived = np.array(
        [10, 40, 60, 100], dtype=np.int64
    )  # of 100 milli capacity: 10, 40, 60, 100 %
    allocated = np.array([10, 40, 50, 70], dtype=np.int64)
    curve = discrete_curve(arrived, allocated, 100)
    assert curve[10] == pytest.approx(10)
    assert curve[100] == pytest.approx(70)
    assert np.isnan(curve[20])


def small_trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "openb_node_list_small.csv"
    lines = ["sn,cpu_milli,memory_mib,gpu,model"]
    lines += [f"n{i},32000,65536,{2 if i % 2 else 4},{'T4' if i % 2 else 'V100'}" for i in range(6)]
    nodes.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pods = tmp_path / "openb_pod_list_small.csv"
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    shapes = [(4000, 1, 500, ""), (8000, 1, 1000, ""), (2000, 1, 250, "T4"), (6000, 2, 1000, "")]
    shapes += [(1000, 0, 0, "")]
    for i in range(40):
        cpu, num, milli, spec = shapes[i % len(shapes)]
        rows.append(f"p{i},{cpu},1024,{num},{milli},{spec}")
    pods.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return pods, nodes


@pytest.mark.parametrize("policy", ["fgd", "fragaware", "random"])
def test_a_run_is_deterministic_under_its_seed(tmp_path: Path, policy: str) -> None:
    pods, nodes = small_trace(tmp_path)
    spec = RunSpec(pods=str(pods), nodes=str(nodes), policy=policy, seed=42)
    first, second = run_once(spec), run_once(spec)
    assert np.array_equal(first.allocated_milli, second.allocated_milli)
    assert np.array_equal(first.frag_milli, second.frag_milli)
    assert first.allocated_milli[-1] <= first.capacity_milli
    assert first.arrived_milli[-1] <= 1.3 * first.capacity_milli
    assert first.placed + first.dropped == len(first.arrived_milli)


def test_cli_runs_the_experiment_and_writes_json_csv_and_plots(tmp_path: Path) -> None:
    pods, nodes = small_trace(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate", "packing", "--pods", str(pods), "--nodes", str(nodes),
            "--policy", "fgd", "--policy", "bestfit", "--seeds", "42-43",
            "--jobs", "1", "--json", "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rows = {(r["pod_list"], r["policy"]): r for r in data["results"]}
    assert set(rows) == {("small", "fgd"), ("small", "bestfit")}
    assert len(rows[("small", "fgd")]["allocation_100"]) == 2
    assert (out / "curves.csv").is_file()
    assert (out / "packing_small.png").stat().st_size > 0
    assert json.loads((out / "results.json").read_text())["results"]


def test_cli_refuses_an_unknown_policy_and_bad_seeds(tmp_path: Path) -> None:
    pods, nodes = small_trace(tmp_path)
    base = ["simulate", "packing", "--pods", str(pods), "--nodes", str(nodes)]
    unknown = CliRunner().invoke(app, [*base, "--policy", "nope"])
    assert unknown.exit_code == 2
    assert "not known" in unknown.output
    bad = CliRunner().invoke(app, [*base, "--seeds", "x-y"])
    assert bad.exit_code != 0
    assert "not a seed list" in bad.output
