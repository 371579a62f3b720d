"""Schemathesis against a live server: its OpenAPI must tell the truth.

Bounded (``MAX_EXAMPLES`` generated requests per operation, valid and invalid), with the admin
token, against a real ``gpupool server`` process on SQLite, one test per operation (see
:data:`OPERATIONS`). Checked on every answer: no server
error (5xx other than a declared 503), the status code is declared for the operation, and
the content type is the declared one. The long poll and the event stream are left out: they
hold a request open by design.

A generated request that is not HTTP at all (an empty ``Content-Length`` header among the
invalid headers the negative mode makes up, seen in a ``make test`` run) is refused by the
HTTP parser with ``400 Invalid HTTP request received.`` before any operation sees it: that
answer is the protocol's, not the operation's, and is not checked against the operation's
declared answers (:data:`NOT_HTTP`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    status_code_conformance,
)

from tests.api.server_proc import ServerProcess  # noqa: E402

#: Generated requests per operation and generation mode (valid, then invalid data).
MAX_EXAMPLES = 12
HELD_OPEN = {"/v1/agent/nodes/{name}/orders", "/v1/events/stream"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]
#: The HTTP parser's answer to bytes that are not an HTTP request (uvicorn's).
NOT_HTTP = (400, b"Invalid HTTP request received.")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("schemathesis") / "home")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _fuzz(
    op: Any, mode: Any, url: str, headers: dict[str, str], sent: dict[str, int], label: str
) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case: Any) -> None:
        sent[label] = sent.get(label, 0) + 1
        response = case.call(base_url=url, headers=headers, timeout=60)
        if (response.status_code, response.content) == NOT_HTTP:
            return  # not HTTP: refused by the parser, no operation reached
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()


#: Every operation fuzzed, each its own test. One test for all of them ran for minutes on a
#: loaded machine and met pytest's per-test timeout (pyproject: 300 s) part-way: the timeout's
#: exception, raised inside a Hypothesis case, made Hypothesis replay that case and report
#: "Inconsistent results from replaying a test case" on whichever operation was running (GET
#: /v1/agent/uploads/{upload_id}, near the end, on a loaded ``make test``). One operation takes
#: about a second alone. :func:`test_the_list_covers_every_operation` keeps the list whole.
OPERATIONS = (
    "POST /v1/jobs",
    "POST /v1/jobs/bulk",
    "GET /v1/jobs",
    "GET /v1/jobs/{job_id}",
    "PATCH /v1/jobs/{job_id}",
    "GET /v1/jobs/{job_id}/events",
    "GET /v1/jobs/{job_id}/logs",
    "POST /v1/jobs/{job_id}/cancel",
    "POST /v1/jobs/{job_id}/resize",
    "POST /v1/jobs/{job_id}/hold",
    "POST /v1/jobs/{job_id}/release",
    "POST /v1/jobs/{job_id}/requeue",
    "POST /v1/agent/register",
    "POST /v1/agent/heartbeat",
    "POST /v1/agent/logs",
    "GET /v1/nodes",
    "GET /v1/nodes/{name}",
    "DELETE /v1/nodes/{name}",
    "POST /v1/nodes/{name}/state",
    "GET /v1/devices",
    "POST /v1/devices/{uuid}/pool",
    "GET /v1/pools",
    "GET /v1/pools/{name}",
    "PUT /v1/pools/{name}",
    "DELETE /v1/pools/{name}",
    "GET /v1/tenants",
    "GET /v1/tenants/{name}",
    "PUT /v1/tenants/{name}",
    "DELETE /v1/tenants/{name}",
    "PUT /v1/tenants/{name}/quotas/{pool}",
    "DELETE /v1/tenants/{name}/quotas/{pool}",
    "GET /v1/priority-classes",
    "PUT /v1/priority-classes/{name}",
    "GET /v1/whoami",
    "GET /v1/users",
    "POST /v1/users",
    "DELETE /v1/users/{name}",
    "GET /v1/tokens",
    "POST /v1/tokens",
    "DELETE /v1/tokens/{token_id}",
    "GET /v1/audit",
    "GET /v1/usage",
    "GET /v1/priorities",
    "GET /v1/events",
    "POST /v1/uploads",
    "GET /v1/agent/uploads/{upload_id}",
    "POST /v1/agent/results/{assignment_id}",
    "GET /v1/jobs/{job_id}/results",
    "GET /healthz",
    "GET /readyz",
    "GET /v1/version",
    "GET /metrics",
)


@pytest.fixture(scope="module")
def schema(live: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(f"{live.url}/openapi.json", timeout=60)


def _operations(schema: Any) -> dict[str, Any]:
    found = {}
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path not in HELD_OPEN:
            found[f"{op.method.upper()} {op.path}"] = op
    return found


def test_the_list_covers_every_operation(schema: Any) -> None:
    live = set(_operations(schema))
    assert live - set(OPERATIONS) == set(), "add these operations to OPERATIONS"
    assert set(OPERATIONS) - live == set(), "these operations are gone: remove them"


@pytest.mark.parametrize("label", OPERATIONS)
def test_the_operation_answers_only_what_its_openapi_declares(
    live: ServerProcess, schema: Any, label: str
) -> None:
    op = _operations(schema).get(label)
    assert op is not None, f"{label} is not in the live schema"
    headers = {"Authorization": f"Bearer {live.admin_token()}"}
    sent: dict[str, int] = {}
    failures: list[str] = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        try:
            _fuzz(op, mode, live.url, headers, sent, label)
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # nothing to get wrong: no parameters
        except Exception as exc:  # a failure group too: one mode must not hide the other
            failures.append(f"{label} ({mode.value}): {str(exc)[:800]}")
    assert sent.get(label, 0) > 0
    assert not failures, "\n\n".join(failures)
