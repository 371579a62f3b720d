"""The scheduling loop keeps the nodes and devices it made from their rows across cycles
(``ClusterCache``): an unchanged row gives the same object again, and any change to a row a
snapshot reads (a node drained or down, a device's model re-registered, a label) is seen by the
next cycle of the same loop."""

from __future__ import annotations

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.machinery.snapshot import ClusterCache, build_snapshot
from gpupool.control.services.jobs import JobService
from gpupool.control.services.nodes import NodeService
from gpupool.domain.nodes import DeviceHealth, NodeState
from gpupool.schemas.agent import DeviceInfo, RegisterRequest
from gpupool.store.models import AssignmentModel, NodeModel
from tests.control.builders import ADMIN, AGENT, register, submit


def _loop(cp: ControlPlane) -> SchedulingLoop:
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    return loop


def _placed_on(cp: ControlPlane, job_id: str) -> str | None:
    with cp.read() as s:
        a = s.query(AssignmentModel).filter(AssignmentModel.job_id == job_id).one_or_none()
        return a.node if a is not None else None


def test_unchanged_rows_give_the_same_objects_and_a_changed_row_a_new_one(
    cp: ControlPlane,
) -> None:
    register(cp, "n1", gpus=2)
    register(cp, "n2", gpus=2)
    cluster = ClusterCache()
    with cp.read() as s:
        first, _ = build_snapshot(s, cp.now(), cluster=cluster)
    made = cluster.made
    assert made == 2 + 4
    NodeService(cp).set_state(ADMIN, "n2", NodeState.DRAINING)
    with cp.read() as s:
        second, _ = build_snapshot(s, cp.now(), cluster=cluster)
    assert cluster.made == made + 1  # only n2's row changed
    n1, n2 = second.nodes
    assert n1 is first.nodes[0]
    assert n2.state is NodeState.DRAINING
    assert n2 is not first.nodes[1]
    assert all(a is b for a, b in zip(first.devices, second.devices, strict=True))


def test_a_warm_loop_places_nothing_on_a_node_drained_since_its_last_cycle(
    cp: ControlPlane,
) -> None:
    register(cp, "n1", gpus=1)
    register(cp, "n2", gpus=1)
    loop = _loop(cp)
    first = submit(cp, "first", gpus="1")
    loop.cycle()
    busy = _placed_on(cp, first.id)
    free = "n2" if busy == "n1" else "n1"
    NodeService(cp).set_state(ADMIN, free, NodeState.DRAINING)
    second = submit(cp, "second", gpus="1")
    loop.cycle()
    assert _placed_on(cp, second.id) is None  # the only free GPU is on the drained node
    NodeService(cp).set_state(ADMIN, free, NodeState.UP)
    loop.cycle()
    assert _placed_on(cp, second.id) == free


def test_a_warm_loop_sees_a_node_down_and_a_device_model_registered_again(
    cp: ControlPlane,
) -> None:
    register(cp, "n1", gpus=1, model="A100-80GB")
    loop = _loop(cp)
    spec = {"name": "wants-h100", "command": ["sleep", "1"]}
    spec["resources"] = {"gpus": "1", "gpu_types": ["H100"]}
    blocker, _ = JobService(cp).submit(ADMIN, spec, queue_anyway=True)
    loop.cycle()
    assert _placed_on(cp, blocker.id) is None
    with cp.tx() as s:
        node = s.get(NodeModel, "n1")
        assert node is not None
        node.state = NodeState.DOWN.value
    with cp.read() as s:
        snapshot, _ = build_snapshot(s, cp.now(), loop.specs, loop.cluster)
    assert [d.health for d in snapshot.devices] == [DeviceHealth.UNKNOWN]
    # The node comes back with another GPU model under the same device uuid.
    NodeService(cp).register(
        AGENT,
        RegisterRequest(
            node="n1",
            address="n1.local",
            cpu_milli=64000,
            memory_mib=512 * 1024,
            agent_version="test",
            devices=[DeviceInfo(uuid="n1-gpu0", index=0, model="H100-80GB", memory_mib=81920)],
        ),
    )
    loop.cycle()
    assert _placed_on(cp, blocker.id) == "n1"
