"""gpupool's own virtual environment, kept out of a job's environment.

The CLI (``--export ALL`` sends the submitter's environment) and the agent (the few basics a job
takes from the node) both drop it, so ``python3`` in a job is the user's, never gpupool's. Kept
in ``domain`` so the CLI needs no agent code to do it.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


def own_venv_text() -> str | None:
    """:func:`own_venv` as text (the CLI's submit does without ``pathlib``)."""
    return sys.prefix if sys.prefix != sys.base_prefix else None


def own_venv() -> Path | None:
    """The virtual environment gpupool runs from, or ``None`` when it runs from none."""
    from pathlib import Path

    text = own_venv_text()
    return None if text is None else Path(text)


def without_venv(env: dict[str, str], venv: Path | str | None) -> dict[str, str]:
    """``env`` without a trace of ``venv``: its ``bin`` out of PATH, its VIRTUAL_ENV dropped."""
    if venv is None:
        return env
    venv = str(venv).rstrip("/") or "/"
    venv_bin = os.path.join(venv, "bin")
    out = dict(env)
    if "PATH" in out:
        out["PATH"] = ":".join(p for p in out["PATH"].split(":") if p.rstrip("/") != venv_bin)
    if out.get("VIRTUAL_ENV", "").rstrip("/") == str(venv):
        del out["VIRTUAL_ENV"]
    return out
