"""Refused calls in the audit log: the first rows of each window, then one row that counts
the rest (see ``control/services/audit.py``), on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import select

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.services.audit import MORE_ACTION, RefusedCalls
from gpupool.store.models import AuditModel


def _refuse(cp: ControlPlane, calls: RefusedCalls, n: int, remote: str = "10.0.0.9") -> None:
    for _ in range(n):
        with cp.tx() as s:
            calls.record(
                s, None, cp.now(), status=401, method="POST", path="/v1/jobs", remote=remote
            )


def _rows(cp: ControlPlane) -> list[AuditModel]:
    with cp.read() as s:
        return list(
            s.scalars(
                select(AuditModel).where(AuditModel.actor == "anonymous").order_by(AuditModel.id)
            )
        )


def test_the_first_refusals_get_rows_and_the_rest_one_exact_count(
    cp: ControlPlane, clock: ManualClock
) -> None:
    calls = RefusedCalls(keep=3, window_s=60.0)
    _refuse(cp, calls, 50)
    rows = _rows(cp)
    assert [r.action for r in rows] == ["refused"] * 3 + [MORE_ACTION]
    assert rows[-1].target is not None
    assert rows[-1].target.startswith("47 more")

    clock.advance(61.0)  # a new window: rows of its own again
    _refuse(cp, calls, 5)
    rows = _rows(cp)
    assert [r.action for r in rows].count("refused") == 6
    assert [(r.target or "").split()[0] for r in rows if r.action == MORE_ACTION] == ["47", "2"]


def test_each_caller_address_has_its_own_window(cp: ControlPlane) -> None:
    calls = RefusedCalls(keep=2, window_s=60.0)
    _refuse(cp, calls, 5, remote="10.0.0.1")
    _refuse(cp, calls, 1, remote="10.0.0.2")
    rows = _rows(cp)
    by_remote = {(r.remote, r.action) for r in rows}
    assert ("10.0.0.2", "refused") in by_remote
    assert ("10.0.0.2", MORE_ACTION) not in by_remote
    assert sum(1 for r in rows if r.remote == "10.0.0.1") == 3
