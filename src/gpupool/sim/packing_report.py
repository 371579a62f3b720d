"""Reports of the packing experiment: summary table, authors' means, CSV curves, PNG plot, JSON.

Words:

- **summary**: one (pod list, policy) over its seeds: allocation % at 100 % and 130 % arrived and
  fragmentation (% of GPU capacity) at 90 % arrived, per seed and as the mean.
- **authors' means**: the same numbers from the FGD authors' cached results
  (``fgd-expected-results/analysis_{allo,frag}_discrete.csv``, 10 seeds per row group), keyed by
  gpupool's policy names.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.sim.packing import CURVE_POINTS, RunResult

#: The authors' policy labels, by gpupool policy name.
AUTHORS_POLICIES = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "gpuclustering",
    "04-GpuPacking": "gpupacking",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}


@dataclass(frozen=True)
class Summary:
    """One (pod list, policy) over its seeds."""

    pod_list: str
    policy: str
    seeds: tuple[int, ...]
    alloc100: tuple[float, ...]
    alloc130: tuple[float, ...]
    frag90: tuple[float, ...]
    seconds: tuple[float, ...]

    @property
    def mean100(self) -> float:
        return statistics.fmean(self.alloc100)

    @property
    def mean130(self) -> float:
        return statistics.fmean(self.alloc130)

    @property
    def mean_frag90(self) -> float:
        return statistics.fmean(self.frag90)


@dataclass(frozen=True)
class Expected:
    """The authors' 10-seed means for one (pod list, policy)."""

    alloc100: float
    alloc130: float
    frag90: float | None


def summarize(results: Sequence[RunResult]) -> list[Summary]:
    """Group ``results`` by (pod list, policy), in first-seen order."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for result in results:
        groups.setdefault((result.spec.pod_list, result.spec.policy), []).append(result)
    return [
        Summary(
            pod_list=pod_list,
            policy=policy,
            seeds=tuple(r.spec.seed for r in runs),
            alloc100=tuple(r.allocation_at(100) for r in runs),
            alloc130=tuple(r.allocation_at(130) for r in runs),
            frag90=tuple(r.fragmentation_at(90) for r in runs),
            seconds=tuple(r.seconds for r in runs),
        )
        for (pod_list, policy), runs in groups.items()
    ]


def _column_means(path: Path, column: str) -> dict[tuple[str, str], float]:
    values: dict[tuple[str, str], list[float]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            policy = AUTHORS_POLICIES.get(row["sc_policy"])
            if policy is None or not row.get(column):
                continue
            pod_list = row["workload"].removeprefix("openb_pod_list_")
            values.setdefault((pod_list, policy), []).append(float(row[column]))
    return {key: statistics.fmean(v) for key, v in values.items()}


def load_expected(folder: Path) -> dict[tuple[str, str], Expected]:
    """The authors' means from ``folder`` (``fgd-expected-results``); empty if it is absent."""
    allo = folder / "analysis_allo_discrete.csv"
    if not allo.is_file():
        return {}
    a100 = _column_means(allo, "100")
    a130 = _column_means(allo, "130")
    frag_path = folder / "analysis_frag_discrete.csv"
    f90 = _column_means(frag_path, "90") if frag_path.is_file() else {}
    return {
        key: Expected(alloc100=a100[key], alloc130=a130[key], frag90=f90.get(key))
        for key in a100
        if key in a130
    }


def _fmt(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.2f}"


def render_table(summaries: Sequence[Summary], expected: dict[tuple[str, str], Expected]) -> str:
    """A Markdown table: ours (10-seed mean) next to the authors' mean, per pod list and policy."""
    lines = [
        "| pod list | policy | seeds | alloc @100 % | authors | alloc @130 % | authors "
        "| frag @90 % | authors | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        ref = expected.get((s.pod_list, s.policy))
        lines.append(
            f"| {s.pod_list} | {s.policy} | {len(s.seeds)} | {_fmt(s.mean100)} | "
            f"{_fmt(ref.alloc100 if ref else None)} | {_fmt(s.mean130)} | "
            f"{_fmt(ref.alloc130 if ref else None)} | {_fmt(s.mean_frag90)} | "
            f"{_fmt(ref.frag90 if ref else None)} | {statistics.fmean(s.seconds):.1f} |"
        )
    return "\n".join(lines)


def to_json(summaries: Sequence[Summary], expected: dict[tuple[str, str], Expected]) -> str:
    """Per policy and pod list: means and per-seed values at 100 % and 130 %, run times."""
    items: list[dict[str, Any]] = []
    for s in summaries:
        ref = expected.get((s.pod_list, s.policy))
        items.append(
            {
                "pod_list": s.pod_list,
                "policy": s.policy,
                "seeds": list(s.seeds),
                "allocation_100_mean": round(s.mean100, 4),
                "allocation_130_mean": round(s.mean130, 4),
                "allocation_100": [round(v, 4) for v in s.alloc100],
                "allocation_130": [round(v, 4) for v in s.alloc130],
                "fragmentation_90_mean": round(s.mean_frag90, 4),
                "seconds": [round(v, 3) for v in s.seconds],
                "authors": None
                if ref is None
                else {
                    "allocation_100_mean": round(ref.alloc100, 4),
                    "allocation_130_mean": round(ref.alloc130, 4),
                    "fragmentation_90_mean": None if ref.frag90 is None else round(ref.frag90, 4),
                },
            }
        )
    return json.dumps({"results": items}, indent=2)


def write_curves_csv(results: Sequence[RunResult], path: Path) -> None:
    """One row per run and metric (``allocation``, ``fragmentation``), columns 0..130 % arrived."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["pod_list", "policy", "seed", "metric", *range(CURVE_POINTS)])
        for r in results:
            for metric, curve in (
                ("allocation", r.allocation_curve),
                ("fragmentation", r.fragmentation_curve),
            ):
                writer.writerow(
                    [r.spec.pod_list, r.spec.policy, r.spec.seed, metric]
                    + ["" if math.isnan(v) else f"{v:.4f}" for v in curve]
                )


def plot(results: Sequence[RunResult], path: Path, pod_list: str) -> None:
    """PNG of the mean allocation and fragmentation curves of every policy on ``pod_list``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results if r.spec.pod_list == pod_list]
    policies = list(dict.fromkeys(r.spec.policy for r in runs))
    x = np.arange(CURVE_POINTS)
    fig, (ax_alloc, ax_frag) = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy in policies:
        mine = [r for r in runs if r.spec.policy == policy]
        with warnings.catch_warnings():  # columns no run reached are NaN, and stay NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            alloc = np.nanmean(np.vstack([r.allocation_curve for r in mine]), axis=0)
            frag = np.nanmean(np.vstack([r.fragmentation_curve for r in mine]), axis=0)
        ax_alloc.plot(x, alloc, label=policy)
        ax_frag.plot(x, frag, label=policy)
    ax_alloc.plot(x, np.minimum(x, 100), color="grey", linestyle=":", label="arrived")
    ax_alloc.set(
        xlabel="arrived GPU demand (% of capacity)",
        ylabel="allocated GPUs (%)",
        title=f"GPU allocation — {pod_list}",
        xlim=(60, 130),
        ylim=(60, 100),
    )
    ax_frag.set(
        xlabel="arrived GPU demand (% of capacity)",
        ylabel="fragmented GPUs (% of capacity)",
        title=f"Fragmentation — {pod_list}",
        xlim=(0, 130),
    )
    for axis in (ax_alloc, ax_frag):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
