"""Units and the parsers for what people type.

Inside gpupool every share is an integer:

- **milli-GPU**: 1000 is one whole device. ``0.5``, ``50%`` and ``500m`` all parse to 500;
  ``2`` parses to 2000 (two whole devices). A request above one device must be a whole number
  of devices: a job cannot take 1.5 GPUs.
- **MiB** for GPU and host memory. ``10GiB``, ``10240MiB``, ``10G`` and ``1.5TiB`` parse;
  decimal suffixes (``GB``) are read as their binary cousins, because that is what people mean
  when they talk about GPU memory (an "80GB" A100 has 81920 MiB). A bare number other than 0
  is refused: ``--gpu-mem 10`` silently meant 10 MiB where 10 GiB was meant.
- **milli-CPU** for host CPUs, as Kubernetes counts them: ``2`` is 2000, ``500m`` is 500.
- **seconds** (float) for durations: Slurm's ``-t`` forms (``90`` minutes, ``1:30:00``,
  ``2-12``, ``2-12:30:00``) and the friendlier ``1h30m``, ``45s``, ``2d``.

Each parser raises :class:`~gpupool.domain.errors.InvalidValue` with a hint for anything else,
and each formatter is the parser's inverse: ``parse_x(format_x(v)) == v``. Every parser first
applies :mod:`gpupool.domain.bounds`: at most ``MAX_NUMBER_CHARS`` characters and a finite
value (ranges per quantity are the callers', from the same module).
"""

from __future__ import annotations

import math
import re

from gpupool.domain.bounds import (
    ANY_DURATION_S,
    MAX_NUMBER_CHARS,
    finite,
    short_number,
)
from gpupool.domain.errors import InvalidValue

MILLI_PER_GPU = 1000
MIB_PER_GIB = 1024
MIB_PER_TIB = 1024 * 1024

_NUMBER = r"(?P<num>\d+(?:\.\d*)?|\.\d+)"


def _strip(text: object, *, field: str = "number", hint: str = "give a shorter number") -> str:
    """The text of a number, at most ``MAX_NUMBER_CHARS`` long (a 400-digit one is refused
    here, before ``float()`` turns it into infinity)."""
    if isinstance(text, bool):
        raise InvalidValue(f"{text!r} is not a number", field=field)
    if isinstance(text, float) and not math.isfinite(text):
        raise InvalidValue(f"{field} must be a finite number: {hint}", field=field)
    if isinstance(text, int) and text.bit_length() > 80:  # str() of a huge int is slow itself
        raise InvalidValue(
            f"{field} has more than the {MAX_NUMBER_CHARS} digits a number may have: {hint}",
            field=field,
        )
    return short_number(str(text).strip(), field=field, hint=hint)


# --------------------------------------------------------------------------- GPUs

_GPU_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>%|m)?$", re.IGNORECASE)


def parse_gpus(text: object) -> int:
    """Parse a GPU request into milli-GPU.

    ``0.5`` / ``50%`` / ``500m`` -> 500; ``1`` -> 1000; ``2`` -> 2000. Zero is allowed (a CPU
    job). Fractions must be at least 1m; above one device the request must be whole devices.
    """
    hint = "use a fraction like 0.5, a percentage like 50%, milli like 500m, or whole GPUs like 2"
    raw = _strip(text, field="gpus", hint=hint)
    match = _GPU_RE.match(raw)
    if match is None:
        raise InvalidValue(f"{raw!r} is not a GPU amount: {hint}", field="gpus")
    num = finite(float(match.group("num")), field="gpus", hint=hint)
    unit = (match.group("unit") or "").lower()
    if unit == "%":
        milli_f = num * 10.0
    elif unit == "m":
        milli_f = num
    else:
        milli_f = num * MILLI_PER_GPU
    milli = round(milli_f)
    if not math.isclose(milli, milli_f, abs_tol=1e-6):
        raise InvalidValue(
            f"{raw!r} is finer than 1/1000 of a GPU: round it, e.g. {milli}m", field="gpus"
        )
    return validate_gpu_milli(milli, raw)


def validate_gpu_milli(milli: int, shown: object | None = None) -> int:
    """Check an integer milli-GPU amount: >= 0, and a whole number of devices above 1000."""
    shown = milli if shown is None else shown
    if milli < 0:
        raise InvalidValue(f"{shown!r} is negative: ask for 0 or more GPUs", field="gpus")
    if milli > MILLI_PER_GPU and milli % MILLI_PER_GPU != 0:
        raise InvalidValue(
            f"{shown!r} is more than one GPU but not a whole number of GPUs: "
            "ask for a fraction of one GPU (like 0.5) or whole GPUs (like 2)",
            field="gpus",
        )
    return milli


def format_gpus(milli: int) -> str:
    """Format milli-GPU for people: 1000 -> ``1``, 500 -> ``0.5``, 333 -> ``0.333``."""
    if milli % MILLI_PER_GPU == 0:
        return str(milli // MILLI_PER_GPU)
    whole, frac = divmod(milli, MILLI_PER_GPU)
    return f"{whole}.{frac:03d}".rstrip("0")


# --------------------------------------------------------------------------- memory

_MEM_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>[A-Za-z]*)$")
_MEM_UNITS: dict[str, float] = {
    "m": 1,
    "mi": 1,
    "mb": 1,
    "mib": 1,
    "g": MIB_PER_GIB,
    "gi": MIB_PER_GIB,
    "gb": MIB_PER_GIB,
    "gib": MIB_PER_GIB,
    "t": MIB_PER_TIB,
    "ti": MIB_PER_TIB,
    "tb": MIB_PER_TIB,
    "tib": MIB_PER_TIB,
    "k": 1 / 1024,
    "ki": 1 / 1024,
    "kb": 1 / 1024,
    "kib": 1 / 1024,
}


def parse_memory(text: object, *, field: str = "memory") -> int:
    """Parse a memory size into MiB: ``10GiB`` -> 10240, ``10240MiB`` -> 10240, ``1.5TiB``.

    The unit is required (a bare ``0`` excepted): a bare ``10`` is refused with
    ``use 10GiB or 10240MiB``. The result must be a whole number of MiB.
    """
    hint = "use 10GiB or 10240MiB"
    raw = _strip(text, field=field, hint=hint)
    match = _MEM_RE.match(raw)
    if match is None:
        raise InvalidValue(f"{field} {raw!r} is not a memory size: {hint}", field=field)
    unit = match.group("unit").lower()
    if unit not in ("", *_MEM_UNITS):
        raise InvalidValue(
            f"{field} {raw!r} has an unknown unit {match.group('unit')!r}: {hint}", field=field
        )
    num = finite(float(match.group("num")), field=field, hint=hint)
    if not unit and num != 0:
        shown = match.group("num")
        gib = f"{shown}GiB"
        mib_of_gib = num * MIB_PER_GIB
        as_mib = f"{round(mib_of_gib)}MiB" if mib_of_gib == round(mib_of_gib) else "MiB"
        raise InvalidValue(
            f"{field} {raw!r} has no unit: use {gib} or {as_mib} (a bare number is ambiguous)",
            field=field,
        )
    mib_f = finite(num * (_MEM_UNITS[unit] if unit else 1), field=field, hint=hint)
    mib = round(mib_f)
    if not math.isclose(mib, mib_f, abs_tol=1e-6):
        raise InvalidValue(
            f"{field} {raw!r} is not a whole number of MiB: use {mib}MiB", field=field
        )
    if mib < 0:  # pragma: no cover - the regex has no sign
        raise InvalidValue(f"{field} {raw!r} is negative: {hint}", field=field)
    return mib


def format_memory(mib: int) -> str:
    """Format MiB exactly and compactly: 10240 -> ``10GiB``, 1536 -> ``1.5GiB``."""
    if mib == 0:
        return "0MiB"
    for size, unit in ((MIB_PER_TIB, "TiB"), (MIB_PER_GIB, "GiB")):
        # Use the larger unit only when its decimal form is exact with at most 3 digits.
        if mib >= size and (mib * 1000) % size == 0:
            thousandths = mib * 1000 // size
            whole, frac = divmod(thousandths, 1000)
            text = f"{whole}.{frac:03d}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
    return f"{mib}MiB"


def bytes_to_mib(n_bytes: int) -> int:
    """Bytes from NVML to whole MiB, rounding down: never promise memory that is not there."""
    return n_bytes // (1024 * 1024)


def mib_to_bytes(mib: int) -> int:
    """Convert MiB to bytes, for NVML limits and Prometheus metrics."""
    return mib * 1024 * 1024


# --------------------------------------------------------------------------- CPUs

_CPU_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>m)?$", re.IGNORECASE)


def parse_cpus(text: object) -> int:
    """Parse a CPU count into milli-CPU: ``2`` -> 2000, ``0.5`` -> 500, ``500m`` -> 500."""
    hint = "use a number like 4 or 0.5, or milli like 500m"
    raw = _strip(text, field="cpus", hint=hint)
    match = _CPU_RE.match(raw)
    if match is None:
        raise InvalidValue(f"{raw!r} is not a CPU count: {hint}", field="cpus")
    num = finite(float(match.group("num")), field="cpus", hint=hint)
    milli_f = num if match.group("unit") else num * 1000
    milli = round(milli_f)
    if not math.isclose(milli, milli_f, abs_tol=1e-6):
        raise InvalidValue(f"{raw!r} is finer than 1m of a CPU: use {milli}m", field="cpus")
    return milli


def format_cpus(milli: int) -> str:
    """Format milli-CPU: 2000 -> ``2``, 500 -> ``500m``."""
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


# --------------------------------------------------------------------------- durations

_FRIENDLY_RE = re.compile(
    r"^(?:(?P<d>\d+(?:\.\d+)?)d)?\s*(?:(?P<h>\d+(?:\.\d+)?)h)?\s*"
    r"(?:(?P<m>\d+(?:\.\d+)?)m(?:in)?)?\s*(?:(?P<s>\d+(?:\.\d+)?)s)?$",
    re.IGNORECASE,
)
_SLURM_RE = re.compile(r"^(?:(?P<days>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def parse_duration(text: object, *, field: str = "duration") -> float:
    """Parse a duration into seconds.

    Slurm's forms: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` (a bare
    number is minutes, as with ``sbatch -t``); and ``1h30m``, ``90s``, ``2d``, ``1d12h``.
    """
    hint = "use minutes like 90, HH:MM:SS like 1:30:00, D-HH:MM like 2-12:00, or 1h30m"
    raw = _strip(text, field=field, hint=hint)
    if not raw:
        raise InvalidValue(f"{field} is empty: {hint}", field=field)
    slurm = _SLURM_RE.match(raw)
    if slurm is not None:
        parts = [int(p) for p in slurm.group("rest").split(":")]
        days = int(slurm.group("days") or 0)
        if slurm.group("days") is not None:
            # D-HH, D-HH:MM, D-HH:MM:SS
            hours, minutes, seconds = ([*parts, 0, 0])[:3]
        elif len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
        return ANY_DURATION_S.check(float(min(total, 10**18)), field=field)
    friendly = _FRIENDLY_RE.match(raw)
    if friendly is not None and any(friendly.group(k) for k in "dhms"):
        d, h, m, s = (float(friendly.group(k) or 0) for k in "dhms")
        return ANY_DURATION_S.check(((d * 24 + h) * 60 + m) * 60 + s, field=field)
    raise InvalidValue(f"{field} {raw!r} is not a duration: {hint}", field=field)


def format_duration(seconds: float) -> str:
    """Format seconds like Slurm shows times: ``D-HH:MM:SS`` or ``HH:MM:SS``.

    Fractions of a second are rounded to whole seconds, so ``parse(format(x)) == round(x)``.
    """
    total = round(seconds)
    if total < 0:
        return "-" + format_duration(-total)
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"
