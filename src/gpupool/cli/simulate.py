"""``gpupool simulate``: run simulator scenarios from the command line.

``gpupool simulate packing`` runs the FGD paper's packing experiment (:mod:`gpupool.sim.packing`)
for every pod list x policy x seed asked for, on several processes, and prints a table next to
the authors' means (or JSON with ``--json``); ``--out DIR`` also writes the curves as CSV, a PNG
plot per pod list and the JSON.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpupool.cli.simulate_replay import replay_command
from gpupool.domain.errors import GpupoolError
from gpupool.scheduling.placement.registry import make_policy
from gpupool.sim.packing import RunSpec, run_many
from gpupool.sim.packing_report import (
    load_expected,
    plot,
    render_table,
    summarize,
    to_json,
    write_curves_csv,
)

simulate_app = typer.Typer(
    name="simulate",
    help="Run simulator scenarios (the packing experiment, trace replays).",
    no_args_is_help=True,
)


def parse_seeds(text: str) -> list[int]:
    """``"42-51"`` -> 42..51; ``"42,45"`` -> [42, 45]; ``"7"`` -> [7]."""
    seeds: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        try:
            if "-" in part:
                low, high = (int(p) for p in part.split("-", 1))
                if high < low:
                    raise ValueError
                seeds.extend(range(low, high + 1))
            elif part:
                seeds.append(int(part))
        except ValueError:
            raise typer.BadParameter(
                f"{text!r} is not a seed list: use 42-51, 42,43 or 42"
            ) from None
    if not seeds:
        raise typer.BadParameter("no seeds given: use 42-51, 42,43 or 42")
    return seeds


@simulate_app.command("packing")
def packing(
    *,
    pods: list[Path] = typer.Option(..., "--pods", help="pod list CSV (repeat for several)"),  # noqa: B008
    nodes: Path = typer.Option(..., "--nodes", help="node list CSV"),  # noqa: B008
    policy: list[str] = typer.Option(["fgd"], "--policy", help="placement policy (repeat)"),  # noqa: B008
    seeds: str = typer.Option("42-51", "--seeds", help="seeds: 42-51, 42,43 or 42"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of the table"),
    out: Path | None = typer.Option(None, "--out", help="write curves CSV, plots, JSON here"),  # noqa: B008
    jobs: int = typer.Option(0, "--jobs", help="worker processes (0: every core)"),
    expected: Path | None = typer.Option(  # noqa: B008
        None,
        "--expected",
        help="authors' results folder (default: fgd-expected-results beside the pod list's folder)",
    ),
    ratio: float = typer.Option(1.3, "--ratio", help="inflate the pod list to this x capacity"),
) -> None:
    """Run the FGD packing experiment: place every pod once, record allocation and fragmentation.

    Example: ``gpupool simulate packing --pods openb_pod_list_default.csv
    --nodes openb_node_list_gpu_node.csv --policy fgd --policy fragaware --seeds 42-51``
    """
    seed_list = parse_seeds(seeds)
    try:
        for name in policy:
            make_policy(name)
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for path in [*pods, nodes]:
        if not path.is_file():
            typer.echo(f"error: {path} is not a file: check the path", err=True)
            raise typer.Exit(2)
    specs = [
        RunSpec(pods=str(p), nodes=str(nodes), policy=name, seed=seed, ratio=ratio)
        for p in pods
        for name in policy
        for seed in seed_list
    ]
    try:
        results = run_many(specs, jobs or None)
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    folder = (
        expected
        if expected is not None
        else pods[0].resolve().parent.parent / "fgd-expected-results"
    )
    authors = load_expected(folder)
    summaries = summarize(results)
    text = to_json(summaries, authors)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_curves_csv(results, out / "curves.csv")
        (out / "results.json").write_text(text + "\n", encoding="utf-8")
        for pod_list in dict.fromkeys(s.pod_list for s in summaries):
            plot(results, out / f"packing_{pod_list}.png", pod_list)
    if as_json:
        typer.echo(text)
    else:
        typer.echo(render_table(summaries, authors))
        if out is not None:
            typer.echo(f"curves, plots and JSON written to {out}")


# Trace replays live in their own module (gpupool.cli.simulate_replay).
simulate_app.command("replay")(replay_command)


def install(app: typer.Typer) -> None:
    app.add_typer(simulate_app, name="simulate")
