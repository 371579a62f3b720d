"""The SDK without a server: error mapping, local validation, metrics parsing, local logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.client import ApiError, Client, ServerUnreachable
from gpupool.client.errors import EXIT_DENIED, EXIT_INVALID, EXIT_NOT_FOUND
from gpupool.client.sdk import options_to_spec
from gpupool.client.telemetry import parse_metrics
from gpupool.domain.errors import SpecError


def mock(handler: Any, tmp_path: Path) -> Client:
    return Client("http://pool.test", "gp_t", home=tmp_path, transport=httpx.MockTransport(handler))


def problem(status: int, detail: str) -> httpx.Response:
    return httpx.Response(
        status,
        json={"type": "about:blank", "title": "t", "status": status, "detail": detail},
        headers={"content-type": "application/problem+json"},
    )


@pytest.mark.parametrize(
    ("status", "code"), [(404, EXIT_NOT_FOUND), (403, EXIT_DENIED), (422, EXIT_INVALID)]
)
def test_problem_answers_become_api_errors_with_exit_codes(
    tmp_path: Path, status: int, code: int
) -> None:
    gp = mock(lambda _r: problem(status, "job 'x' not found: list your jobs"), tmp_path)
    with pytest.raises(ApiError) as info:
        gp.get("x")
    assert info.value.status == status
    assert info.value.exit_code == code
    assert str(info.value) == "job 'x' not found: list your jobs"


def test_a_refused_connection_is_server_unreachable(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ServerUnreachable, match=r"cannot reach http://pool\.test"):
        mock(refuse, tmp_path).whoami()


def test_submit_validates_before_sending_and_sends_the_job_file_form(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return problem(500, "stop here")

    gp = mock(handler, tmp_path)
    with pytest.raises(SpecError) as info:
        gp.submit(name="x", command=["true"], gpus="1.5", gpu_memory="10 gigs")
    assert {p.key for p in info.value.problems} == {"resources.gpus", "resources.gpu_memory"}
    assert sent == []
    with pytest.raises(ApiError):
        gp.submit({"name": "y", "resources": {"cpus": 2}}, command=["true"], gpus=0.5, grace="1m")
    assert sent[0]["spec"] == {
        "name": "y",
        "command": ["true"],
        "resources": {"cpus": 2, "gpus": 0.5},
        "checkpoint": {"grace": "1m"},
    }


def test_unknown_submit_option_names_the_known_ones() -> None:
    with pytest.raises(Exception, match="unknown submit option"):
        options_to_spec({"gpu": 1})


METRICS = """# HELP gpupool_gpu_utilization_ratio x
# TYPE gpupool_gpu_utilization_ratio gauge
gpupool_gpu_utilization_ratio{device="GPU-a",model="A100",node="n1",pool="default"} 0.5
# TYPE gpupool_gpu_memory_total_bytes gauge
gpupool_gpu_memory_total_bytes{device="GPU-a",model="A100",node="n1",pool="default"} 8.589934592e+10
gpupool_gpu_memory_total_bytes{device="GPU-b",model="T4",node="n2",pool="default"} 1.6106127360e+10
# TYPE gpupool_gpu_compute_allocated_ratio gauge
gpupool_gpu_compute_allocated_ratio{device="GPU-a",model="A100",node="n1",pool="default"} 0.75
# TYPE gpupool_gpu_memory_allocated_bytes gauge
gpupool_gpu_memory_allocated_bytes{device="GPU-a",model="A100",node="n1",pool="default"} 10737418240
# TYPE gpupool_gpu_healthy gauge
gpupool_gpu_healthy{device="GPU-b",model="T4",node="n2",pool="default"} 0.0
# TYPE gpupool_mem_share_ratio gauge
gpupool_mem_share_ratio{pool="default"} 0.125
# TYPE gpupool_scheduler_queue gauge
gpupool_scheduler_queue{pool="default",tenant="vision"} 3.0
"""


def test_metrics_page_parses_to_device_and_pool_samples() -> None:
    t = parse_metrics(METRICS)
    a, b = t.devices
    assert (a.uuid, a.node, a.memory_mib, a.allocated_milli, a.allocated_memory_mib) == (
        "GPU-a",
        "n1",
        81920,
        750,
        10240,
    )
    assert a.utilization_ratio == 0.5
    assert a.temperature_c is None  # no sample is None, not zero
    assert (b.uuid, b.healthy, b.utilization_ratio) == ("GPU-b", False, None)
    assert t.pools[0].mem_share_ratio == 0.125
    assert t.pools[0].queued == {"vision": 3}


def job_json(state: str) -> dict[str, Any]:
    return {
        "id": "j1",
        "name": "j",
        "tenant": "t",
        "user": "u",
        "pool": "default",
        "state": state,
        "state_code": "x",
        "priority_class": "normal",
        "priority": 500,
        "version": 1,
        "replicas": 1,
        "gpu_milli": 500,
        "gpu_memory_mib": None,
        "gpu_types": [],
        "command": [],
        "script": "x",
        "preemptible": False,
        "held": False,
        "submit_time": 0.0,
        "eligible_time": 0.0,
        "start_time": 1.0,
        "end_time": 2.0,
        "restart_count": 1,
        "exit_code": 0,
        "signal": None,
        "reason": None,
        "isolation": None,
        "time_limit_s": None,
    }


def test_wait_follows_a_requeue_and_times_out_on_a_manual_clock(tmp_path: Path) -> None:
    from gpupool.client.errors import WaitTimeout
    from gpupool.control.machinery.clock import ManualClock

    states = iter(["RUNNING", "PREEMPTED", "PREEMPTED", "REQUEUED", "PENDING", "COMPLETED"])
    gp = Client(
        "http://pool.test",
        "gp_t",
        home=tmp_path,
        clock=ManualClock(),
        transport=httpx.MockTransport(lambda _r: httpx.Response(200, json=job_json(next(states)))),
    )
    assert gp.wait("j1").state == "COMPLETED"
    stuck = Client(
        "http://pool.test",
        "gp_t",
        home=tmp_path,
        clock=ManualClock(),
        transport=httpx.MockTransport(lambda _r: httpx.Response(200, json=job_json("PENDING"))),
    )
    with pytest.raises(WaitTimeout, match="still PENDING after 30s"):
        stuck.wait("j1", timeout_s=30)
    failed = iter(["FAILED"] * 10)
    once = Client(
        "http://pool.test",
        "gp_t",
        home=tmp_path,
        clock=ManualClock(),
        transport=httpx.MockTransport(lambda _r: httpx.Response(200, json=job_json(next(failed)))),
    )
    assert once.wait("j1").state == "FAILED"  # a few looks, then it is final


def _log_server(job: dict[str, Any], log: bytes, states: list[str]) -> Any:
    """A mock server: the job (its state from ``states``, then the last one forever) and a
    log that grows by one line per read until it is whole."""
    shown = {"upto": 0}
    order = iter(states)
    last = {"state": states[-1]}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/logs"):
            offset = int(request.url.params.get("offset", "0"))
            cut = log.find(b"\n", shown["upto"]) + 1 or len(log)
            shown["upto"] = cut
            piece = log[offset:cut]
            headers = {"X-Log-Start": str(offset), "X-Log-Next": str(offset + len(piece))}
            return httpx.Response(200, content=piece, headers=headers)
        last["state"] = next(order, last["state"])
        return httpx.Response(200, json=job | {"state": last["state"]})

    return handle


def test_logs_follow_the_server_by_offset_until_the_job_ends(tmp_path: Path) -> None:
    from gpupool.control.machinery.clock import ManualClock

    server = _log_server(job_json("RUNNING"), b"one\ntwo\nthree", ["RUNNING"] * 3 + ["COMPLETED"])
    gp = Client(
        "http://pool.test",
        "gp_t",
        home=tmp_path,
        clock=ManualClock(),
        transport=httpx.MockTransport(server),
    )
    assert list(gp.logs("j1", follow=True)) == ["one\n", "two\n", "three"]


def test_logs_of_an_ended_job_are_read_to_the_end_at_once(tmp_path: Path) -> None:
    gp = mock(_log_server(job_json("COMPLETED"), b"a\nb\n", ["COMPLETED"]), tmp_path)
    assert "".join(gp.logs("j1")) == "a\nb\n"
    page = gp.log_text("j1", offset=2)
    assert (page.start, page.next_offset) == (2, 4)


def test_submit_retries_a_lost_connection_with_the_same_idempotency_key(tmp_path: Path) -> None:
    from gpupool.control.machinery.clock import ManualClock

    keys: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        keys.append(json.loads(request.content)["idempotency_key"])
        if len(keys) < 3:
            raise httpx.ReadTimeout("lost", request=request)
        return httpx.Response(201, json={"job": job_json("PENDING"), "created": False})

    gp = Client(
        "http://pool.test",
        "gp_t",
        home=tmp_path,
        clock=ManualClock(),
        transport=httpx.MockTransport(flaky),
    )
    job = gp.submit(name="x", command=["true"])
    assert job.id == "j1"
    assert len(keys) == 3
    assert len(set(keys)) == 1
    assert keys[0].startswith("sdk-")
    keys.clear()
    with pytest.raises(ServerUnreachable):
        gp.submit(name="x", command=["true"], retries=1, idempotency_key="mine")
    assert keys == ["mine", "mine"]
