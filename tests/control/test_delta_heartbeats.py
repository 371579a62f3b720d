"""Delta heartbeats (issue 26): an agent that numbers its heartbeats sends what changed since
the last acknowledged one; the server expands it to the full state before anything else, asks
for the full state when it cannot, and older agents see no new field."""

from __future__ import annotations

from gpupool.control.context import ControlPlane
from gpupool.control.services.heartbeat import HeartbeatService
from gpupool.control.services.jobs import JobService
from gpupool.domain.states import JobState
from gpupool.schemas.agent import HeartbeatRequest, HeartbeatResponse
from tests.api.helpers import make_api
from tests.control.builders import ADMIN, AGENT, leading_cycle, register, running, submit


def _beat(cp: ControlPlane, **fields: object) -> HeartbeatResponse:
    return HeartbeatService(cp).heartbeat(AGENT, HeartbeatRequest(node="n1", epoch=1, **fields))


def _placed(cp: ControlPlane) -> str:
    register(cp, "n1")
    job = submit(cp)
    leading_cycle(cp)
    return job.id


def test_a_delta_is_the_full_state_it_stands_for(cp: ControlPlane) -> None:
    job_id = _placed(cp)
    start = _beat(cp, seq=1).start
    assert len(start) == 1
    aid = start[0].assignment_id
    answer = _beat(cp, seq=2, replicas=[running(aid)])  # full state: the replica runs
    assert answer.ack_seq == 2
    for seq in (3, 4):  # deltas with nothing new: the replica is still reported, as running
        answer = _beat(cp, seq=seq, base=seq - 1)
        assert (answer.ack_seq, answer.want_full, answer.start, answer.stop) == (seq, False, [], [])
    assert JobService(cp).get(ADMIN.principal, job_id).job.state is JobState.RUNNING


def test_a_delta_against_a_report_the_server_does_not_hold_asks_for_the_full_state(
    cp: ControlPlane,
) -> None:
    register(cp, "n1")
    answer = _beat(cp, seq=7, base=6)  # e.g. the server restarted since report 6
    assert answer.want_full
    assert answer.ack_seq == 7
    assert _beat(cp, seq=8).want_full is False  # the full state: applied
    assert _beat(cp, seq=9, base=7).want_full  # 7 was never acknowledged


def test_agents_that_send_no_seq_get_no_field_they_do_not_know(cp: ControlPlane) -> None:
    api = make_api(cp)
    register(cp, "n1")
    agent = api.tokens["agent"]
    for _ in range(2):  # applied, then answered from memory
        old = api.call(agent, "POST", "/v1/agent/heartbeat", {"node": "n1", "epoch": 0})
        assert old.status_code == 200
        assert not {"ack_seq", "want_full"} & set(old.json())
    new = api.call(agent, "POST", "/v1/agent/heartbeat", {"node": "n1", "epoch": 0, "seq": 1})
    assert new.json()["ack_seq"] == 1
