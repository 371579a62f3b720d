"""Job-spec values of Slurm's interactive and file options (issue 27): ``srun --pty``'s
terminal, ``sbatch -o/-e``'s output files, ``--constraint``'s node features.

Words:

- **pty request** (:class:`PtyRequest`): the job's program gets a pseudo-terminal on its node,
  and the node's supervisor connects to ``address`` (``host:port``, where ``gpupool run
  --pty`` listens) and says ``key`` first; the bytes of the terminal then flow both ways (see
  ``docs/architecture.md``, "interactive jobs"). Job files do not carry one: only ``run --pty``
  makes it, for the one connection it waits for.
- **output pattern** (``-o``/``-e``): a file path on the job's node with Slurm's replacement
  symbols: ``%j`` job id, ``%x`` job name, ``%A`` array id, ``%a`` array index, ``%u`` user,
  ``%N`` node name, ``%%`` a ``%``. Any other ``%`` is refused at submit. A relative path is
  taken from the job's start folder. :func:`expand_output` is the one substitution (the agent's).
- **constraint** (``--constraint "ib&a100x8|h100"``): node features joined by ``&`` (and) and
  ``|`` (or), ``&`` binding tighter, as Slurm writes them; kept as its text and its disjunction
  of conjunctions (:class:`Constraint`). A node satisfies it when one of its conjunctions is a
  subset of the node's features (``gpupool agent --feature``).

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupool.domain.errors import InvalidValue

#: A node feature: what ``gpupool agent --feature`` and ``--constraint`` name.
FEATURE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
MAX_FEATURES = 64
MAX_PATH = 4096
_ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]{1,253}):([0-9]{1,5})$")
_KEY_RE = re.compile(r"^[0-9a-f]{32,128}$")
#: ``-o``/``-e`` replacement symbols and what each stands for.
OUTPUT_SYMBOLS: Mapping[str, str] = {
    "j": "job id",
    "x": "job name",
    "A": "array id, else the job id",
    "a": "array index, else 4294967294 as Slurm",
    "u": "user",
    "N": "node name",
    "%": "a %",
}
_SYMBOL_RE = re.compile(r"%(\d*)(.?)", re.DOTALL)


@dataclass(frozen=True)
class PtyRequest:
    """``run --pty``'s terminal: the node connects to ``address`` and says ``key`` first."""

    address: str
    key: str

    def to_json(self) -> dict[str, str]:
        return {"address": self.address, "key": self.key}


def parse_pty(raw: object) -> PtyRequest:
    """``{"address": "host:port", "key": hex}`` -> :class:`PtyRequest` (``InvalidValue``)."""
    if not isinstance(raw, Mapping) or set(raw) != {"address", "key"}:
        raise InvalidValue("pty must be a mapping of address and key (made by gpupool run --pty)")
    address, key = str(raw["address"]), str(raw["key"])
    match = _ADDRESS_RE.match(address)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise InvalidValue(f"pty address {address!r} is not host:port")
    if not _KEY_RE.match(key):
        raise InvalidValue("pty key must be 32 to 128 lowercase hex digits")
    return PtyRequest(address, key)


def parse_output(raw: object, key: str) -> str:
    """An ``-o``/``-e`` pattern, checked: text, no NUL, known ``%`` symbols only."""
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidValue(f"{key} must be a file path like out-%j.log")
    if "\x00" in raw or len(raw) > MAX_PATH:
        raise InvalidValue(f"{key} must be a file path of at most {MAX_PATH} characters, no NUL")
    for match in _SYMBOL_RE.finditer(raw):
        symbol = match.group(2)
        if symbol not in OUTPUT_SYMBOLS:
            known = ", ".join(f"%{s} ({what})" for s, what in OUTPUT_SYMBOLS.items())
            shown = f"%{match.group(1)}{symbol}" if symbol else "a % at the end"
            raise InvalidValue(f"{key} {raw!r}: {shown} is not a replacement symbol; use {known}")
    if raw.endswith("/"):
        raise InvalidValue(f"{key} {raw!r} names a folder: give a file name, e.g. {raw}%j.out")
    return raw


def expand_output(pattern: str, values: Mapping[str, str]) -> str:
    """``pattern`` with each ``%X`` replaced by ``values[X]`` (``%5j``: zero-padded to 5, as
    Slurm), ``%%`` by ``%``. ``values`` holds every symbol of :data:`OUTPUT_SYMBOLS` but ``%``."""

    def one(match: re.Match[str]) -> str:
        width, symbol = match.group(1), match.group(2)
        if symbol == "%":
            return "%"
        value = values[symbol]
        return value.zfill(int(width)) if width else value

    return _SYMBOL_RE.sub(one, pattern)


@dataclass(frozen=True)
class Constraint:
    """A ``--constraint``: its text and its terms, a disjunction of conjunctions of
    features (``a&b|c`` is ``((a, b), (c,))``)."""

    text: str
    terms: tuple[frozenset[str], ...]

    def allows(self, features: Iterable[str]) -> bool:
        have = set(features)
        return any(term <= have for term in self.terms)


def parse_constraint(raw: object) -> Constraint:
    """``"a&b|c"`` -> :class:`Constraint`; ``InvalidValue`` naming the bad part."""
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidValue('constraint must be node features like "ib&a100x8" or "a100|h100"')
    text = raw.replace(" ", "")
    if len(text) > 1000:
        raise InvalidValue("constraint is longer than 1000 characters")
    terms: list[frozenset[str]] = []
    for alternative in text.split("|"):
        names = alternative.split("&")
        for name in names:
            if not FEATURE_RE.match(name):
                shown = f"{name!r}" if name else "an empty feature"
                raise InvalidValue(
                    f"constraint {raw!r}: {shown} is not a node feature: write features "
                    "(letters, digits, _ . : -) joined by & (and) and | (or), e.g. ib&a100x8|h100"
                )
        terms.append(frozenset(names))
    return Constraint(text, tuple(terms))


def parse_features(raw: object) -> tuple[str, ...]:
    """A node's features: ``"ib,a100x8"`` or a list -> sorted unique names."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise InvalidValue("features must be names like ib,a100x8")
    out = sorted({str(i).strip() for i in items if str(i).strip()})
    for name in out:
        if not FEATURE_RE.match(name):
            raise InvalidValue(
                f"feature {name!r} is not a feature name: use letters, digits and _ . : - "
                "(at most 63), e.g. --feature ib,a100x8"
            )
    if len(out) > MAX_FEATURES:
        raise InvalidValue(f"{len(out)} features: at most {MAX_FEATURES}")
    return tuple(out)
