"""What a trace file looks like from its first line, to refuse a file read as the wrong format.

A reader given another format's file would fail on some column deep inside with a message
about that column; the user's mistake is the format. :func:`check_format` is called before a
reader runs and names the format the file looks like and what to pass instead.

Looks (:func:`sniff`): ``slurm`` (a ``|``-separated header starting ``JobID``), ``alibaba`` (a
CSV header with the pod list's needed columns), ``philly`` (tab-separated lines of Gavel's
``*.trace`` files), ``csv`` (any other CSV header: a generic CSV, read with ``--columns``),
``None`` (unreadable or empty: the reader says why).
"""

from __future__ import annotations

import csv
from pathlib import Path

from gpupool.sim.alibaba import POD_COLUMNS, TraceFormatError
from gpupool.sim.trace_csv import COLUMNS_USAGE

NAMES = {
    "slurm": "a Slurm export (sacct --parsable2)",
    "alibaba": "an Alibaba pod list",
    "philly": "a Philly-derived Gavel trace",
    "csv": "a CSV of your own",
}


def first_line(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8-sig") as handle:
            return handle.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError):
        return None


def sniff(path: Path) -> str | None:
    """The format ``path`` looks like (see the module docstring)."""
    line = first_line(path)
    if not line:
        return None
    if "|" in line and line.split("|", 1)[0].strip().lower() in ("jobid", "jobidraw"):
        return "slurm"
    if "\t" in line and "," not in line.split("\t", 1)[0]:
        return "philly"
    header = {h.strip() for h in next(csv.reader([line]), [])}
    if set(POD_COLUMNS) <= header:
        return "alibaba"
    return "csv"


def _header(path: Path) -> str:
    line = first_line(path) or ""
    return line if len(line) <= 120 else line[:117] + "..."


def check_format(path: Path, kind: str) -> None:
    """Refuse ``path`` when it looks like another format than ``kind`` (the one it is read as)."""
    if not path.is_file():
        return  # a folder (Philly) or a missing file: the reader says which
    looks = sniff(path)
    if looks is None or looks == kind:
        return
    if kind == "csv" and looks == "alibaba":
        return  # an Alibaba pod list may be read through a mapping too
    if looks == "csv":
        advice = (
            f"if it is a CSV of your own, map its columns: {COLUMNS_USAGE} "
            f"(its header: {_header(path)})"
        )
    elif looks in ("slurm", "alibaba"):
        advice = f"pass --trace {looks}:{path}" + (" without --columns" if kind == "csv" else "")
    else:
        advice = f"pass --trace philly:{path.parent} with --runtimes"
    if looks == "csv":
        message = f"is not {NAMES[kind]} (its header is not one): {advice}"
    else:
        message = f"was read as {NAMES[kind]} but looks like {NAMES[looks]}: {advice}"
    raise TraceFormatError(path, message, line=1, column=None)
