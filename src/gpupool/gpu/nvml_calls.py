"""Guarded NVML calls: one failing call never stops the agent.

Every NVML call the backend makes goes through :meth:`Calls.call`, which sorts the outcome:

- **ok**: the value.
- **unsupported**: ``NVML_ERROR_NOT_SUPPORTED``, ``NO_PERMISSION``, ``FUNCTION_NOT_FOUND``,
  ``NOT_FOUND``, ``ARGUMENT_VERSION_MISMATCH``, and nvidia-ml-py 13's
  ``NVMLLibraryMismatchError`` (raised for a call the installed driver lacks; it is *not* an
  ``NVMLError``): the reading is ``None``, as for a feature the device does not have.
- **lost**: ``NVML_ERROR_GPU_IS_LOST``: raises :class:`Lost`; the caller marks the GPU lost.
- **failed**: any other error (``NVML_ERROR_UNKNOWN``, a binding bug, ...): the reading is
  ``None`` for this sample and the failure is recorded, so a device whose essential readings
  fail is reported unhealthy.

Outcomes other than ok are logged once per (device, call, outcome), not on every sample, and
the latest outcome of each call is kept in :attr:`Calls.outcomes` for the GPU probe's table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpupool.gpu.nvml")

_UNSUPPORTED_CODES = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
)


class Lost(Exception):
    """The GPU is gone (``NVML_ERROR_GPU_IS_LOST``)."""


def call_name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", repr(fn)))


def describe(exc: BaseException) -> str:
    """``NVMLError_Unknown (Unknown Error)``: the class, and the message when it says more."""
    text = str(exc)
    name = type(exc).__name__
    return f"{name} ({text})" if text and text != name else name


class Calls:
    """Makes NVML calls for one backend and remembers how they went."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self._unsupported = {getattr(nv, n) for n in _UNSUPPORTED_CODES if hasattr(nv, n)}
        self._lost_code = getattr(nv, "NVML_ERROR_GPU_IS_LOST", object())
        mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[BaseException], ...] = (
            (mismatch,) if isinstance(mismatch, type) else ()
        )
        self._said: set[tuple[str, str, str]] = set()
        #: call name -> latest outcome: ``ok``, ``unsupported: ...``, ``failed: ...``, ``lost``.
        self.outcomes: dict[str, str] = {}

    def is_unsupported(self, exc: BaseException) -> bool:
        if self._mismatch and isinstance(exc, self._mismatch):
            return True
        return getattr(exc, "value", None) in self._unsupported

    def call(
        self,
        where: str,
        fn: Callable[..., Any],
        *args: Any,
        failures: list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """``fn(*args)``; ``None`` when unsupported or failed (see the module docstring).

        ``where`` names the device for the log; a failure is appended to ``failures``.
        """
        name = call_name(fn)
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # every error, NVMLError or not: the agent must live on
            if getattr(exc, "value", None) == self._lost_code:
                self._note(where, name, "lost", "the GPU is lost")
                raise Lost from None
            if self.is_unsupported(exc):
                self._note(where, name, "unsupported", describe(exc))
                return None
            self._note(where, name, "failed", describe(exc))
            if failures is not None:
                failures.append(f"{name}: {describe(exc)}")
            return None
        self.outcomes[name] = "ok"
        return value

    def _note(self, where: str, name: str, kind: str, text: str) -> None:
        self.outcomes[name] = kind if kind == "lost" else f"{kind}: {text}"
        key = (where, name, kind)
        if key in self._said:
            return
        self._said.add(key)
        if kind == "unsupported":
            log.info("%s: %s is not available (%s): that reading is left out", where, name, text)
        else:
            log.warning("%s: %s %s: %s; the agent carries on", where, name, kind, text)
