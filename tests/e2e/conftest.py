"""Fixtures for end-to-end tests: real server and agent processes (see ``pool.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.pool import Pool


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A server and two agents, n1 and n2, with 4 simulated A100s each."""
    p = Pool(tmp_path_factory.mktemp("pool"))
    try:
        p.start_server()
        p.start_agent("n1")
        p.start_agent("n2")
        yield p
    finally:
        p.close()


@pytest.fixture
def fresh_pool(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pool]:
    """A pool of its own for tests that kill agents; the node timeout (seconds) may be set
    with ``@pytest.mark.parametrize("fresh_pool", [T], indirect=True)``."""
    timeout = float(getattr(request, "param", 20.0))
    p = Pool(tmp_path, node_timeout_s=timeout)
    try:
        p.start_server()
        p.start_agent("n1")
        p.start_agent("n2")
        yield p
    finally:
        p.close()
