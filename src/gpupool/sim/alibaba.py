"""Readers for the Alibaba GPU cluster trace v2023 (``alibaba/clusterdata``, ``*-gpu-v2023``).

Two kinds of file, both CSV with a header line:

- **node list** (``openb_node_list_*.csv``): ``sn, cpu_milli, memory_mib, gpu, model``. One row per
  machine; ``gpu`` is the number of GPUs and ``model`` their model (empty for a CPU-only node).
- **pod list** (``openb_pod_list_*.csv``): ``name, cpu_milli, memory_mib, num_gpu, gpu_milli``
  are needed; ``gpu_spec, qos, pod_phase, creation_time, deletion_time, scheduled_time`` are
  optional and read as ``None`` where the column is missing or the cell is empty. ``gpu_milli``
  is the share of *each* GPU (1..1000); it is below 1000 only when ``num_gpu`` is 1.
  ``gpu_spec`` lists the GPU models the pod accepts, separated by ``|``; empty means any model.

Words:

- **record**: one row as a typed frozen dataclass (:class:`NodeRecord`, :class:`PodRecord`).
- **needed column**: a column the reader cannot do without; a file that lacks one, or has a bad
  value in any column it reads, is refused with :class:`TraceFormatError`, which names the file,
  the 1-based line and the column, and says what was expected.

Columns the reader does not know are ignored, so later trace versions with more columns still read.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpupool.domain.errors import GpupoolError
from gpupool.domain.units import MILLI_PER_GPU

T = TypeVar("T")

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL_COLUMNS = (
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


class TraceFormatError(GpupoolError, ValueError):
    """A trace file cannot be used as it is.

    ``path`` is the file, ``line`` the 1-based line (1 is the header; ``None`` when the problem is
    the whole file) and ``column`` the column name (``None`` when no single column is at fault).
    """

    def __init__(self, path: Path, message: str, *, line: int | None, column: str | None) -> None:
        where = str(path)
        if line is not None:
            where += f":{line}"
        if column is not None:
            where += f": column {column!r}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.column = column
        self.message = message


@dataclass(frozen=True)
class NodeRecord:
    """One machine of a node list. ``model`` is ``None`` for a node without GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str | None


@dataclass(frozen=True)
class PodRecord:
    """One pod of a pod list.

    ``gpu_milli`` is per GPU (0 when ``num_gpu`` is 0). ``gpu_spec`` is the tuple of accepted GPU
    models, or ``None`` for any model. Times are integer seconds from the trace start, ``None``
    where the trace has none (a pod that never got scheduled has no ``scheduled_time``).
    ``line`` is the record's 1-based line in its file (for errors found later; not compared).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] | None = None
    qos: str | None = None
    pod_phase: str | None = None
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None
    line: int | None = field(default=None, compare=False)  # 1-based line in its file

    @property
    def total_gpu_milli(self) -> int:
        """GPU milli over all its GPUs (``num_gpu * gpu_milli``)."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_sharing(self) -> bool:
        """True for a pod that takes a fraction of one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU


class _Rows:
    """Iterates a CSV file's rows as dicts, remembering the line number for errors."""

    def __init__(self, path: Path, needed: tuple[str, ...]) -> None:
        self.path = path
        self.needed = needed

    def __iter__(self) -> Iterator[tuple[int, Mapping[str, str]]]:
        try:
            handle = self.path.open(newline="", encoding="utf-8-sig")
        except OSError as exc:
            raise TraceFormatError(
                self.path,
                f"cannot be read ({exc.strerror}): check the path",
                line=None,
                column=None,
            ) from None
        with handle:
            reader = csv.reader(handle)
            try:
                header = next(reader)
            except StopIteration:
                raise TraceFormatError(
                    self.path,
                    f"is empty: expected a header line with {', '.join(self.needed)}",
                    line=1,
                    column=None,
                ) from None
            header = [h.strip() for h in header]
            for name in self.needed:
                if name not in header:
                    raise TraceFormatError(
                        self.path,
                        f"the header lacks this needed column (it has: {', '.join(header)})",
                        line=1,
                        column=name,
                    )
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise TraceFormatError(
                        self.path,
                        f"has {len(row)} fields where the header has {len(header)}",
                        line=line,
                        column=None,
                    )
                yield line, dict(zip(header, (cell.strip() for cell in row), strict=True))


def _field(
    path: Path, line: int, row: Mapping[str, str], column: str, parse: Callable[[str], T]
) -> T:
    try:
        return parse(row[column])
    except ValueError as exc:
        raise TraceFormatError(
            path, f"{row[column]!r} is not valid: {exc}", line=line, column=column
        ) from None


def _optional(
    path: Path, line: int, row: Mapping[str, str], column: str, parse: Callable[[str], T]
) -> T | None:
    """An optional column: ``None`` when the file has no such column."""
    if column not in row:
        return None
    return _field(path, line, row, column, parse)


def _count(text: str) -> int:
    """A non-negative integer (``"12000"``; ``"12000.0"`` is accepted as integral)."""
    if text == "":
        raise ValueError("expected a non-negative integer, found an empty cell")
    try:
        value = int(text)
    except ValueError:
        number = float(text)  # raises ValueError for non-numbers
        if not number.is_integer():
            raise ValueError("expected a whole number") from None
        value = int(number)
    if value < 0:
        raise ValueError("expected a non-negative integer")
    return value


def _optional_count(text: str) -> int | None:
    return None if text == "" else _count(text)


def _optional_text(text: str) -> str | None:
    return text or None


def _models(text: str) -> tuple[str, ...] | None:
    models = tuple(m.strip() for m in text.split("|") if m.strip())
    return models or None


def read_nodes(path: Path | str) -> tuple[NodeRecord, ...]:
    """Read a node list; raises :class:`TraceFormatError` naming file, line and column."""
    path = Path(path)
    nodes: list[NodeRecord] = []
    seen: set[str] = set()
    for line, row in _Rows(path, NODE_COLUMNS):
        name = row["sn"]
        if not name:
            raise TraceFormatError(path, "a node needs a name", line=line, column="sn")
        if name in seen:
            raise TraceFormatError(path, f"node {name!r} is listed twice", line=line, column="sn")
        seen.add(name)
        gpus = _field(path, line, row, "gpu", _count)
        model = row["model"] or None
        if gpus > 0 and model is None:
            raise TraceFormatError(
                path, f"node {name!r} has {gpus} GPUs but no model", line=line, column="model"
            )
        nodes.append(
            NodeRecord(
                name=name,
                cpu_milli=_field(path, line, row, "cpu_milli", _count),
                memory_mib=_field(path, line, row, "memory_mib", _count),
                gpu_count=gpus,
                model=model if gpus > 0 else None,
            )
        )
    return tuple(nodes)


def read_pods(path: Path | str) -> tuple[PodRecord, ...]:
    """Read a pod list; raises :class:`TraceFormatError` naming file, line and column."""
    path = Path(path)
    pods: list[PodRecord] = []
    for line, row in _Rows(path, POD_COLUMNS):
        num_gpu = _field(path, line, row, "num_gpu", _count)
        gpu_milli = _field(path, line, row, "gpu_milli", _count)
        if gpu_milli > MILLI_PER_GPU:
            raise TraceFormatError(
                path,
                f"{gpu_milli} is more than one GPU: gpu_milli is per GPU, at most {MILLI_PER_GPU}",
                line=line,
                column="gpu_milli",
            )
        if num_gpu == 0 and gpu_milli != 0:
            raise TraceFormatError(
                path,
                f"{gpu_milli} milli-GPU on a pod with num_gpu 0",
                line=line,
                column="gpu_milli",
            )
        if num_gpu > 0 and gpu_milli == 0:
            raise TraceFormatError(
                path,
                f"a pod with {num_gpu} GPUs needs gpu_milli > 0",
                line=line,
                column="gpu_milli",
            )
        if num_gpu > 1 and gpu_milli != MILLI_PER_GPU:
            raise TraceFormatError(
                path,
                f"a pod with {num_gpu} GPUs must take whole GPUs (1000), not {gpu_milli}",
                line=line,
                column="gpu_milli",
            )

        pods.append(
            PodRecord(
                name=row["name"] or f"pod-{line}",
                cpu_milli=_field(path, line, row, "cpu_milli", _count),
                memory_mib=_field(path, line, row, "memory_mib", _count),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=_optional(path, line, row, "gpu_spec", _models),
                qos=_optional(path, line, row, "qos", _optional_text),
                pod_phase=_optional(path, line, row, "pod_phase", _optional_text),
                creation_time=_optional(path, line, row, "creation_time", _optional_count),
                deletion_time=_optional(path, line, row, "deletion_time", _optional_count),
                scheduled_time=_optional(path, line, row, "scheduled_time", _optional_count),
                line=line,
            )
        )
    return tuple(pods)
