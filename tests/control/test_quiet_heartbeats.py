"""Quiet heartbeats (issue 26): a heartbeat that reports nothing new is answered from memory,
with no transaction, and everything it leaves to write is written once a second in batches;
anything new (an order for the node, here or in another process, a changed replica, a device
near an alert) takes the full way at once."""

from __future__ import annotations

from unittest import mock

from sqlalchemy import func, select, update

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.services.liveness import Liveness
from gpupool.schemas.agent import DeviceTelemetry
from gpupool.store.models import DeviceModel, EventModel, NodeModel, UsageModel
from tests.control.builders import heartbeat, leading_cycle, register, running, submit


def _samples(temp: float = 50.0, util: float = 0.5) -> list[DeviceTelemetry]:
    return [
        DeviceTelemetry(uuid=f"n1-gpu{i}", utilization_ratio=util, temperature_c=temp)
        for i in range(2)
    ]


def _transactions(cp: ControlPlane) -> mock.MagicMock:
    return mock.patch.object(cp, "tx", wraps=cp.tx)  # type: ignore[return-value]


def test_a_quiet_heartbeat_opens_no_transaction_and_its_liveness_is_written_in_a_batch(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp, "n1")
    first = heartbeat(cp, "n1", telemetry=_samples())  # applied in full: the node settles
    clock.advance(5)
    with _transactions(cp) as tx:
        again = heartbeat(cp, "n1", telemetry=_samples(util=0.9))
    assert tx.call_count == 0
    assert again == first
    with cp.read() as s:
        assert s.get(NodeModel, "n1").last_heartbeat == clock.now() - 5  # not yet written
    Liveness(cp).flush()
    with cp.read() as s:
        assert s.get(NodeModel, "n1").last_heartbeat == clock.now()


def test_quiet_telemetry_is_sampled_and_written_in_the_batch(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp, "n1")
    heartbeat(cp, "n1", telemetry=_samples(util=0.1))
    cp.settled.telemetry_every_s = 0.0  # keep every sample (the default: one per 15 s)
    heartbeat(cp, "n1", telemetry=_samples(util=0.7))
    assert Liveness(cp).flush()[1] == 2
    with cp.read() as s:
        utils = {d.uuid: d.utilization_ratio for d in s.scalars(select(DeviceModel))}
    assert utils == {"n1-gpu0": 0.7, "n1-gpu1": 0.7}


def test_a_start_for_the_node_ends_the_quiet_at_once(cp: ControlPlane) -> None:
    register(cp, "n1")
    heartbeat(cp, "n1")
    submit(cp)
    leading_cycle(cp)
    answer = heartbeat(cp, "n1")  # the order sequence moved: the full way, with the start
    assert len(answer.start) == 1
    aid = answer.start[0].assignment_id
    heartbeat(cp, "n1", replicas=[running(aid)])  # a changed report: the full way too
    with _transactions(cp) as tx:
        heartbeat(cp, "n1", replicas=[running(aid)])
    assert tx.call_count == 0  # the same report again: quiet


def test_orders_given_by_another_process_end_the_quiet_within_a_flush(cp: ControlPlane) -> None:
    register(cp, "n1")
    heartbeat(cp, "n1")
    heartbeat(cp, "n1")  # quiet
    with cp.tx() as s:  # another server process gave the node an order
        s.execute(update(NodeModel).values(orders_version=NodeModel.orders_version + 1))
    Liveness(cp).flush()
    with _transactions(cp) as tx:
        heartbeat(cp, "n1")
    assert tx.call_count == 1


def test_a_device_reaching_the_alert_takes_the_full_way_and_raises_the_alert(
    cp: ControlPlane,
) -> None:
    register(cp, "n1")
    heartbeat(cp, "n1", telemetry=_samples())
    heartbeat(cp, "n1", telemetry=_samples(temp=cp.settings.temperature_alert_c + 5))
    with cp.read() as s:
        kinds = [e.kind for e in s.scalars(select(EventModel))]
    assert "alert.temperature" in kinds


def test_a_node_marked_down_is_not_kept_up_by_quiet_answers(
    cp: ControlPlane, clock: ManualClock
) -> None:
    from gpupool.control.services.nodes import NodeService

    register(cp, "n1")
    heartbeat(cp, "n1")
    clock.advance(cp.settings.node_timeout_s + 1)
    assert NodeService(cp).mark_silent_nodes_down(watching_since=0.0) == ["n1"]
    heartbeat(cp, "n1")  # the full way: the node is up again, as before
    with cp.read() as s:
        assert s.get(NodeModel, "n1").state == "up"


def test_an_empty_node_goes_the_full_way_every_ten_minutes_a_busy_one_every_two(
    cp: ControlPlane, clock: ManualClock
) -> None:
    """The age limit of a kept answer: a node running nothing has no usage to accrue, so
    its quiet heartbeats stay quiet for ten minutes; a node running a replica is applied in
    full every two minutes, and its usage reaches the store that often."""
    register(cp, "n1")
    register(cp, "n2")
    job = submit(cp, gpus="1", nodelist="n2")
    leading_cycle(cp)
    [start] = heartbeat(cp, "n2").start
    busy = [running(start.assignment_id)]
    heartbeat(cp, "n2", busy)  # running: applied in full, settled
    heartbeat(cp, "n1")  # settled, empty
    full: dict[str, int] = {"n1": 0, "n2": 0}
    for _ in range(int(590 / 5)):
        clock.advance(5)
        for node, replicas in (("n1", None), ("n2", busy)):
            with _transactions(cp) as tx:
                heartbeat(cp, node, replicas)
            full[node] += tx.call_count
    assert full["n1"] == 0  # 590 s: quiet throughout
    assert 4 <= full["n2"] <= 5  # every 120 s
    clock.advance(15)
    with _transactions(cp) as tx:
        heartbeat(cp, "n1")
    assert tx.call_count == 1  # past ten minutes: the full way
    with cp.read() as s:
        used = s.scalar(
            select(func.sum(UsageModel.milli_seconds)).where(UsageModel.job_id == job.id)
        )
    assert used is not None
    assert used >= 1000 * (590 - 120)  # accrued at most two minutes behind
