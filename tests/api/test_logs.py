"""Job logs through the server: agents ship chunks by node offset, clients read text by tail
or log offset; resent chunks are stored once, old bytes are dropped beyond the cap, and other
tenants' logs are not found."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from sqlalchemy import select

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.auth import Actor, Principal
from gpupool.control.services.logs import LogService
from gpupool.domain.users import Role
from gpupool.schemas.agent import LogChunkRequest, LogStream
from gpupool.store.models import AssignmentModel
from tests.api.helpers import Api, make_api
from tests.control.builders import register

AGENT = Actor(Principal("agent", Role.AGENT, None, "t"), "POST", "/test", "127.0.0.1")


@pytest.fixture
def api(cp: ControlPlane) -> Api:
    return make_api(cp)


def _running(api: Api, cp: ControlPlane) -> tuple[str, str]:
    """A red job placed on n1, and its assignment id."""
    register(cp, "n1", gpus=1)
    job_id = api.submit(api.tokens["member"], "talker")
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().started == (job_id,)
    with cp.read() as s:
        aid = s.scalars(select(AssignmentModel.id).where(AssignmentModel.job_id == job_id)).one()
    return job_id, aid


def _chunk(aid: str, offset: int, data: bytes, stream: str = "stdout") -> dict[str, object]:
    return {
        "assignment_id": aid,
        "stream": stream,
        "offset": offset,
        "data": base64.b64encode(data).decode(),
    }


def test_shipped_chunks_read_back_whole_by_tail_and_by_offset(api: Api, cp: ControlPlane) -> None:
    job_id, aid = _running(api, cp)
    agent = api.tokens["agent"]
    sends = ((0, b"hello\nwor", 9), (9, b"ld\n", 12), (0, b"hello\nwor", 12))  # one resent
    for offset, data, wanted_next in sends:
        answer = api.call(agent, "POST", "/v1/agent/logs", _chunk(aid, offset, data))
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"next_offset": wanted_next, "kept": True}
    api.call(agent, "POST", "/v1/agent/logs", _chunk(aid, 0, b"oops\n", "stderr"))
    member = api.tokens["member"]
    whole = api.call(member, "GET", f"/v1/jobs/{job_id}/logs")
    assert whole.text == "hello\nworld\n"
    assert whole.headers["content-type"].startswith("text/plain")
    assert api.call(member, "GET", f"/v1/jobs/{job_id}/logs?tail=1").text == "world\n"
    later = api.call(member, "GET", f"/v1/jobs/{job_id}/logs?offset=6")
    assert (later.text, later.headers["X-Log-Start"], later.headers["X-Log-Next"]) == (
        "world\n",
        "6",
        "12",
    )
    assert api.call(member, "GET", f"/v1/jobs/{job_id}/logs?offset=12").text == ""
    errors = api.call(member, "GET", f"/v1/jobs/{job_id}/logs?stream=stderr")
    assert errors.text == "oops\n"


def test_another_tenants_logs_are_not_found(api: Api, cp: ControlPlane) -> None:
    job_id, aid = _running(api, cp)
    api.call(api.tokens["agent"], "POST", "/v1/agent/logs", _chunk(aid, 0, b"secret\n"))
    hidden = api.call(api.blue_member, "GET", f"/v1/jobs/{job_id}/logs")
    assert hidden.status_code == 404
    assert "secret" not in hidden.text
    assert api.call(api.tokens["viewer"], "GET", f"/v1/jobs/{job_id}/logs").text == "secret\n"


def test_a_chunk_of_an_unknown_assignment_is_not_kept(cp: ControlPlane) -> None:
    ack = LogService(cp).append(
        AGENT, LogChunkRequest(assignment_id="gone", stream=LogStream.STDOUT, offset=5, data="")
    )
    assert not ack.kept


def test_beyond_the_cap_the_oldest_bytes_are_dropped_and_offsets_keep_counting(
    api: Api, cp: ControlPlane
) -> None:
    job_id, aid = _running(api, cp)
    logs = LogService(cp)
    logs.keep = 1024
    lines = b"".join(b"line %04d\n" % i for i in range(300))  # 3000 bytes
    for start in range(0, len(lines), 500):
        piece = lines[start : start + 500]
        logs.append(
            AGENT,
            LogChunkRequest(
                assignment_id=aid,
                stream=LogStream.STDOUT,
                offset=start,
                data=base64.b64encode(piece).decode(),
            ),
        )
    member = Principal("member-red", Role.MEMBER, "red", "t")
    kept = logs.read(member, job_id)
    assert kept.next_offset == len(lines)
    assert 1024 <= len(kept.text) <= 1024 + 128
    assert kept.text.endswith("line 0299\n")
    assert lines.decode().endswith(kept.text)
    assert kept.start == len(lines) - len(kept.text)
    assert logs.read(member, job_id, offset=0).start == kept.start


def _sdk(api: Api, token: str) -> Any:
    from gpupool.client.sdk import Client

    return Client("http://testserver", token, transport=api.client._transport)


def test_the_sdk_reads_exact_bytes_across_pages_cut_inside_characters(
    api: Api, cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpupool.control.services.logs as logs_module

    job_id, aid = _running(api, cp)
    text = "caf\u00e9 \u65e5\u672c\n\U0001f680 end"
    raw = text.encode() + b"\xff not utf-8\n"
    api.call(api.tokens["agent"], "POST", "/v1/agent/logs", _chunk(aid, 0, raw))
    monkeypatch.setattr(logs_module, "READ_MAX_BYTES", 3)  # pages cut inside characters
    with _sdk(api, api.tokens["member"]) as gp:
        assert b"".join(p.data for p in gp.output(job_id)) == raw
        lines = list(gp.logs(job_id))
    assert lines == ["caf\u00e9 \u65e5\u672c\n", "\U0001f680 end\ufffd not utf-8\n"]
    page = api.call(api.tokens["member"], "GET", f"/v1/jobs/{job_id}/logs?offset=3")
    assert page.content == raw[3:6]
    assert (page.headers["X-Log-End"], page.headers["X-Log-Complete"]) == (str(len(raw)), "false")


def test_logs_of_a_trimmed_log_say_how_many_bytes_the_server_dropped(
    api: Api, cp: ControlPlane
) -> None:
    job_id, aid = _running(api, cp)
    api.client.app.state.services.logs.keep = 1024  # type: ignore[attr-defined]
    lines = b"".join(b"line %04d\n" % i for i in range(300))  # 3000 bytes
    for start in range(0, len(lines), 500):
        api.call(
            api.tokens["agent"],
            "POST",
            "/v1/agent/logs",
            _chunk(aid, start, lines[start : start + 500]),
        )
    with _sdk(api, api.tokens["member"]) as gp:
        pieces = list(gp.output(job_id))
        text = list(gp.logs(job_id))
    dropped = pieces[0].dropped
    assert dropped > 0
    assert b"".join(p.data for p in pieces) == lines[dropped:]
    assert text[0] == (
        f"[gpupool: {dropped} bytes of stdout are missing here: the server keeps only the "
        "newest log_keep_bytes of each log]\n"
    )
    assert "".join(text[1:]) == lines[dropped:].decode()


def test_the_log_of_a_job_that_ended_before_it_was_seen_running_is_complete_only_with_its_end(
    api: Api, cp: ControlPlane
) -> None:
    job_id, aid = _running(api, cp)
    agent, member = api.tokens["agent"], api.tokens["member"]
    api.call(agent, "POST", "/v1/agent/heartbeat", {"node": "n1", "epoch": 0})  # delivered
    exited = {"assignment_id": aid, "state": "exited", "exit_code": 0}  # too quick to be seen
    beat = api.call(
        agent, "POST", "/v1/agent/heartbeat", {"node": "n1", "epoch": 0, "replicas": [exited]}
    )
    assert beat.status_code == 200, beat.text
    assert api.call(member, "GET", f"/v1/jobs/{job_id}").json()["state"] == "COMPLETED"
    page = api.call(member, "GET", f"/v1/jobs/{job_id}/logs?offset=0")
    assert page.headers["X-Log-Complete"] == "false"  # its output may still be on the way
    end = _chunk(aid, 0, b"quick\n") | {"final": True}
    api.call(agent, "POST", "/v1/agent/logs", end)
    page = api.call(member, "GET", f"/v1/jobs/{job_id}/logs?offset=0")
    assert (page.content, page.headers["X-Log-Complete"]) == (b"quick\n", "true")
    errors = api.call(member, "GET", f"/v1/jobs/{job_id}/logs?stream=stderr")
    assert errors.headers["X-Log-Complete"] == "false"  # stderr's end has not come yet


def test_the_log_of_a_job_cancelled_before_it_started_is_complete_and_empty(
    api: Api, cp: ControlPlane
) -> None:
    job_id = api.submit(api.tokens["member"], "never")
    api.call(api.tokens["member"], "POST", f"/v1/jobs/{job_id}/cancel", {})
    page = api.call(api.tokens["member"], "GET", f"/v1/jobs/{job_id}/logs")
    assert (page.content, page.headers["X-Log-Complete"]) == (b"", "true")
