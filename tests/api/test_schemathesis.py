"""Schemathesis against a live server: its OpenAPI must tell the truth.

Bounded (``MAX_EXAMPLES`` generated requests per operation, valid and invalid), with the admin
token, against a real ``gpupool server`` process on SQLite. Checked on every answer: no server
error (5xx other than a declared 503), the status code is declared for the operation, and
the content type is the declared one. The long poll and the event stream are left out: they
hold a request open by design.
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
        case.call_and_validate(base_url=url, headers=headers, timeout=60, checks=CHECKS)

    run()


def test_every_operation_answers_only_what_its_openapi_declares(live: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json", timeout=60)
    headers = {"Authorization": f"Bearer {live.admin_token()}"}
    operations = [r.ok() for r in schema.get_all_operations()]
    operations = [op for op in operations if op.path not in HELD_OPEN]
    sent: dict[str, int] = {}
    failures: list[str] = []
    for op in operations:
        label = f"{op.method.upper()} {op.path}"
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(op, mode, live.url, headers, sent, label)
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to get wrong: no parameters
            except BaseException as exc:  # a failure group too: one must not hide the others
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                failures.append(f"{label} ({mode.value}): {str(exc)[:800]}")
    total = sum(sent.values())
    print(f"schemathesis: {len(operations)} operations, {total} requests, {len(failures)} failed")
    assert len(operations) >= 35
    assert not failures, "\n\n".join(failures)
