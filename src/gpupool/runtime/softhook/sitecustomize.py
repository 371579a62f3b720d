"""gpupool's soft-isolation start hook, run by every Python interpreter of a soft-isolated job.

Python imports ``sitecustomize`` at start-up from the first folder on ``sys.path`` that has
one; the agent puts this folder first on the job's ``PYTHONPATH``. The hook:

- caps PyTorch: when ``torch`` is imported, it queues
  ``torch.cuda.set_per_process_memory_fraction(GPUPOOL_MEMORY_FRACTION, device)`` for every
  visible device through ``torch.cuda._lazy_call``, so the cap is applied when CUDA initialises
  (importing torch stays cheap and fork-safe, and no CUDA context is created early);
- leaves JAX to ``XLA_PYTHON_CLIENT_MEM_FRACTION``, which the agent sets in the environment;
- then runs the ``sitecustomize`` the job would have had without gpupool, if any.

It imports nothing outside the standard library and never raises: a broken hook must not
break a user's program (a failure is reported once on stderr).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))


def _fraction() -> float | None:
    try:
        value = float(os.environ["GPUPOOL_MEMORY_FRACTION"])
    except (KeyError, ValueError):
        return None
    return value if 0.0 < value <= 1.0 else None


def cap_torch(torch: ModuleType, fraction: float) -> None:
    """Apply ``fraction`` to every device torch sees, now or when CUDA initialises."""
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return

    def apply() -> None:
        for device in range(cuda.device_count()):
            cuda.set_per_process_memory_fraction(fraction, device)

    lazy = getattr(cuda, "_lazy_call", None)
    if lazy is not None:
        lazy(apply)
    elif cuda.is_available():
        apply()


class _CapAfterExec(importlib.abc.Loader):
    """Wraps torch's loader: run it, then apply the cap."""

    def __init__(self, inner: importlib.abc.Loader, fraction: float) -> None:
        self._inner = inner
        self._fraction = fraction

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            cap_torch(module, self._fraction)
        except Exception as exc:  # never break the user's program
            print(f"gpupool: could not cap torch memory: {exc}", file=sys.stderr)


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch`` with the other finders and wraps its loader (once)."""

    def __init__(self, fraction: float) -> None:
        self._fraction = fraction

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CapAfterExec(spec.loader, self._fraction)
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` that the job would have found without this folder."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _install() -> None:
    fraction = _fraction()
    if fraction is not None:
        if "torch" in sys.modules:
            cap_torch(sys.modules["torch"], fraction)
        else:
            sys.meta_path.insert(0, _TorchFinder(fraction))
    try:
        _chain_next_sitecustomize()
    except Exception as exc:
        print(f"gpupool: the job's own sitecustomize failed: {exc}", file=sys.stderr)


try:
    _install()
except Exception as _exc:  # pragma: no cover - defensive
    print(f"gpupool: soft isolation hook failed: {_exc}", file=sys.stderr)
