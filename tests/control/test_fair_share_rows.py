"""Tenant rows stored with absurd fair shares before the range was enforced (issue 18 item 5),
on SQLite and PostgreSQL (PostgreSQL can store NaN; SQLite turns it into NULL)."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import update

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.tenants import TenantService
from gpupool.domain.errors import InvalidValue
from gpupool.domain.tenants import Tenant, check_fair_share, stored_fair_share
from gpupool.store.models import TenantModel
from tests.control.builders import ADMIN, heartbeat, register, running, submit


@pytest.mark.parametrize("value", [1e308, 5e-324, math.inf, -math.inf, math.nan, -1.0, 0.0])
def test_a_fair_share_out_of_range_is_refused_with_the_range(value: float) -> None:
    with pytest.raises(InvalidValue, match=r"from 0\.001 to 1000000"):
        check_fair_share(value)
    with pytest.raises(InvalidValue, match="tenant ml: fair_share"):
        Tenant("ml", value)


@pytest.mark.parametrize(
    ("stored", "read"),
    [(1e308, 1e6), (5e-324, 0.001), (math.inf, 1e6), (-1.0, 0.001), (math.nan, 1.0), (2.5, 2.5)],
)
def test_a_stored_fair_share_reads_as_the_nearest_accepted_value(
    stored: float, read: float
) -> None:
    assert stored_fair_share(stored) == read


def test_tenants_stored_with_absurd_shares_neither_break_the_cycle_nor_the_listing(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp, "n1", gpus=4)
    tenants = TenantService(cp)
    shares = {"huge": 1e308, "tiny": 5e-324, "infinite": math.inf, "nan": math.nan}
    for name in shares:
        tenants.put(ADMIN, Tenant(name))
    with cp.tx() as s:
        for name, share in shares.items():
            if math.isnan(share) and cp.sqlite:
                continue  # SQLite stores NaN as NULL, which the column refuses
            s.execute(update(TenantModel).where(TenantModel.name == name).values(fair_share=share))
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    try:
        first = submit(cp, "a", tenant="huge")
        loop.cycle()
        aid = heartbeat(cp, "n1").start[0].assignment_id
        heartbeat(cp, "n1", replicas=[running(aid)])
        clock.advance(600)  # usage accrues, so the factor divides by the shares
        heartbeat(cp, "n1", replicas=[running(aid)])
        later = [submit(cp, f"j-{name}", tenant=name) for name in shares]
        result = loop.cycle()
        assert set(result.started) == {j.id for j in later}, result
        standing = tenants.standings(ADMIN.principal)
        assert all(0.0 <= standing[name].factor <= 1.0 for name in shares), standing
        listed = {t.name: t.fair_share for t in tenants.list_tenants(ADMIN.principal)}
        assert all(0.001 <= listed[name] <= 1e6 for name in shares), listed
        assert first.id
    finally:
        loop.leadership.release()
