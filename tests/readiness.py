"""Waiting for a process a test started to be ready: on its readiness, never on a clock.

Every test that starts a server, an agent or ``gpupool up`` waits with :func:`wait_ready`: it
polls ``probe`` (``/readyz`` answering 200, the agent's node up, ...) for as long as the process
is alive, and fails at once, with the process's log, when the process exits first. The only
deadline is a failsafe (:data:`FAILSAFE_S`) against a process that hangs without exiting; it is
generous because a loaded machine (load average 14-28, a fresh clone's ``make test``) takes
tens of seconds to import and start a server, and reaching it means a real hang, reported with
the log.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")

#: Seconds after which a process that is alive but never ready counts as hung.
FAILSAFE_S = 180.0

#: Seconds between two probes.
POLL_S = 0.1


def log_tail(log: Path | None, lines: int = 40) -> str:
    """The last ``lines`` of a process's log, or a note saying there is none."""
    if log is None:
        return "(no log)"
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {log}: {exc.strerror})"
    return f"{log}:\n" + "\n".join(text.splitlines()[-lines:])


def wait_ready(
    probe: Callable[[], T | None],
    *,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    failsafe_s: float = FAILSAFE_S,
) -> T:
    """Poll ``probe`` until it returns a true value, while ``proc`` (when given) is alive.

    Raises ``AssertionError`` with the log's tail when the process exits before it is ready,
    or, as a last resort, when it is still not ready after ``failsafe_s`` seconds.
    """
    started = time.monotonic()
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"{what}: the process exited with {proc.returncode} before it was ready\n"
                + log_tail(log)
            )
        value = probe()
        if value:
            return value
        if time.monotonic() - started > failsafe_s:
            alive = " although its process is alive" if proc is not None else ""
            raise AssertionError(
                f"{what}: still not ready after {failsafe_s:.0f}s{alive} (the failsafe "
                "against a hang)\n" + log_tail(log)
            )
        time.sleep(POLL_S)


def answers_ready(url: str) -> bool:
    """Whether the server at ``url`` answers ``/readyz`` with 200."""
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
