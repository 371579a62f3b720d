"""``gpupool simulate replay``: replay a trace through the real scheduler, compare scenarios.

Registered on the ``simulate`` sub-app (``gpupool.cli.simulate``) with
``simulate_app.command("replay")(replay_command)``. The work is in :mod:`gpupool.sim`; this
module parses options, shows a progress bar and renders the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from gpupool.domain.errors import InvalidValue
from gpupool.domain.units import parse_duration
from gpupool.sim.alibaba import TraceFormatError
from gpupool.sim.compare import run_scenarios
from gpupool.sim.failures import random_failures
from gpupool.sim.jobsout import check_path, write_jobs
from gpupool.sim.metrics import summarise
from gpupool.sim.quotas import apply_quotas, parse_quotas
from gpupool.sim.replay import NodeFailure, ReplayOptions
from gpupool.sim.report import (
    comparison_table,
    report_dict,
    tenant_table,
    write_html,
    write_json,
    write_plots,
)
from gpupool.sim.scenarios import get_scenario
from gpupool.sim.trace_csv import parse_columns
from gpupool.sim.traces import TraceOptions, load_cluster, load_trace


def _seconds(text: str | None, what: str) -> float | None:
    if text is None or text.strip().lower() in ("", "none", "off", "never"):
        return None
    return parse_duration(text, field=what)


def replay_command(  # noqa: PLR0917 - one parameter per command-line option
    trace: str = typer.Option(
        ...,
        help="pod list (.csv), Philly-derived *.trace or folder, a Slurm export "
        "(sacct --parsable2), synthetic:jobs=N,gpus=G, or your own CSV with --columns",
    ),
    columns: str | None = typer.Option(
        None,
        help="read --trace as your own CSV: submit=COL,gpus=COL,duration=COL (or start=COL,"
        "end=COL), optionally job=, team=, priority=, gpu_type=; or a YAML file of those pairs",
    ),
    cluster: str | None = typer.Option(
        None, help="node list (.csv), Gavel cluster spec (.json) or a size like 500xV100"
    ),
    scenario: list[str] = typer.Option(  # noqa: B008
        ["exclusive", "pooled"], help="scenario to run (repeat to compare; NAME+POLICY too)"
    ),
    seed: int = typer.Option(0, help="seed for sampling, tenant assignment and failures"),
    tenants: int = typer.Option(4, help="teams to assign pods to when the trace has none"),
    time_scale: float = typer.Option(1.0, help="divide submit times by this (raises the load)"),
    max_jobs: int | None = typer.Option(None, help="replay only the first N jobs by arrival"),
    gpus_per_node: int = typer.Option(8, help="GPUs per machine for sized/Gavel clusters"),
    runtimes: Path | None = typer.Option(None, help="Philly run-time CSV (philly_runtime.csv)"),  # noqa: B008
    share_mix: Path | None = typer.Option(  # noqa: B008
        None, help="Alibaba pod list whose 1-GPU shares fractionalise Philly and Slurm jobs"
    ),
    checkpoint: str = typer.Option("1h", help="checkpoint interval (e.g. 30m), or 'none'"),
    grace: str = typer.Option("0s", help="how long a preempted job keeps its slices"),
    tick: str = typer.Option("5m", help="control loop tick while jobs wait, or 'none'"),
    min_cycle_interval: str = typer.Option(
        "none",
        help="coalesce cycles onto multiples of this (30s, 5m; a bare number is minutes, "
        "as with sbatch -t); none = a cycle at every event instant",
    ),
    workers: int = typer.Option(1, help="run scenarios in this many processes"),
    node_mtbf: str | None = typer.Option(None, help="inject node failures: mean time between"),
    repair: str = typer.Option("2h", help="how long a failed node stays down"),
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
    json_file: Path | None = typer.Option(None, help="also write the JSON report here"),  # noqa: B008
    html: Path | None = typer.Option(None, help="write a self-contained HTML report here"),  # noqa: B008
    plots: Path | None = typer.Option(None, help="write PNG plots into this folder"),  # noqa: B008
    progress: bool = typer.Option(True, help="show a progress bar"),
    quota: list[str] = typer.Option(  # noqa: B008
        [],
        "--quota",
        help="a team's quota for this replay, in GPUs: TEAM=GUARANTEED[:LIMIT] (repeat)",
    ),
    jobs_out: Path | None = typer.Option(  # noqa: B008
        None,
        help="write every job (team, submit, start, end, wait, nodes) here: .csv or .json",
    ),
) -> None:
    """Replay a trace with arrivals and run times through the real scheduler.

    Example: ``gpupool simulate replay --trace openb_pod_list_default.csv
    --cluster openb_node_list_gpu_node.csv --scenario exclusive --scenario pooled --html r.html``
    """
    err = Console(stderr=True)
    try:
        scenarios = [get_scenario(name) for name in scenario]
        checkpoint_s = _seconds(checkpoint, "checkpoint")
        grace_s = _seconds(grace, "grace") or 0.0
        tick_s = _seconds(tick, "tick")
        interval_s = _seconds(min_cycle_interval, "min_cycle_interval")
        mtbf_s = _seconds(node_mtbf, "node_mtbf")
        repair_s = _seconds(repair, "repair") or 0.0
        options = TraceOptions(
            seed=seed,
            tenants=tenants,
            time_scale=time_scale,
            gpus_per_node=gpus_per_node,
            runtimes=runtimes,
            share_mix=share_mix,
            columns=parse_columns(columns) if columns is not None else None,
        )
        quotas = parse_quotas(quota)
        if jobs_out is not None:
            check_path(jobs_out)
        workload, own_cluster = load_trace(trace, options)
        if max_jobs is not None:
            if max_jobs < 1:
                raise InvalidValue("--max-jobs must be at least 1", field="max_jobs")
            workload = replace(
                workload,
                name=f"{workload.name}, first {max_jobs} jobs",
                jobs=workload.jobs[:max_jobs],
            )
        if cluster is not None:
            sim_cluster = load_cluster(cluster, gpus_per_node=gpus_per_node)
        elif own_cluster is not None:
            sim_cluster = own_cluster
        else:
            raise InvalidValue(
                "this trace brings no machines: pass --cluster (a node list, a Gavel cluster "
                "spec or a size like 500xV100)",
                field="cluster",
            )
        workload = apply_quotas(workload, sim_cluster, quotas)
        failures: tuple[NodeFailure, ...] = ()
        if mtbf_s is not None:
            horizon = max((j.submit_time + j.work_s for j in workload.jobs), default=0.0)
            failures = random_failures(
                sim_cluster, mtbf_s=mtbf_s, repair_s=repair_s, horizon_s=horizon, seed=seed
            )
        replay_options = ReplayOptions(
            checkpoint_interval_s=checkpoint_s,
            grace_period_s=grace_s,
            tick_s=tick_s,
            failures=failures,
            min_cycle_interval_s=interval_s,
        )
    except (InvalidValue, TraceFormatError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not progress or workers > 1,
    )

    def tracker(name: str) -> Callable[[int, int], None]:
        task = bar.add_task(f"{name}: jobs done", total=len(workload.jobs))

        def report(done: int, total: int, task: TaskID = task) -> None:
            bar.update(task, completed=done, total=total)

        return report

    with bar:
        timed = run_scenarios(
            workload, sim_cluster, scenarios, replay_options, workers=workers, progress=tracker
        )
    results = [t.result for t in timed]
    timings = {t.result.scenario: round(t.wall_s, 3) for t in timed}

    summaries = [summarise(r) for r in results]
    extra = {
        "trace": trace,
        "workload": workload.name,
        "cluster": sim_cluster.name,
        "gpus": sim_cluster.gpu_count,
        "jobs": len(workload.jobs),
        "skipped": dict(workload.skipped),
        "notes": list(workload.notes),
        "quotas": {
            q.tenant: {"guaranteed_milli": q.guaranteed_milli, "limit_milli": q.limit_milli}
            for q in workload.quotas
        },
        "seed": seed,
        "checkpoint_interval_s": checkpoint_s,
        "grace_period_s": grace_s,
        "tick_s": tick_s,
        "min_cycle_interval_s": interval_s,
        "cycles": {r.scenario: r.cycles for r in results},
        "node_failures_injected": len(failures),
        "wall_s": timings,
    }
    data = report_dict(summaries, results, extra)
    if json_file is not None:
        write_json(json_file, data)
    if html is not None:
        write_html(html, summaries, results, extra)
    if plots is not None:
        write_plots(plots, results)
    if jobs_out is not None:
        rows = write_jobs(jobs_out, results)
        typer.echo(f"{rows} job rows written to {jobs_out}", err=True)
    for note in workload.notes:  # plain text: a quoted row is never wrapped or marked up
        typer.echo(f"note: {note}", err=True)
    if json_out:
        import json

        typer.echo(json.dumps(data, indent=2))
        return
    out = Console()
    out.print(comparison_table(summaries))
    out.print(tenant_table(summaries))
    skipped = ", ".join(f"{n} {why}" for why, n in workload.skipped.items() if n)
    out.print(
        f"{len(workload.jobs)} jobs on {sim_cluster.gpu_count} GPUs"
        + (f" ({skipped} left out)" if skipped else "")
        + "; wall time "
        + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()),
        highlight=False,
    )
