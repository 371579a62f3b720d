"""Fixtures for the network-namespace fault tests (see ``hosts.py`` and ``pool.py``).

They need root, iproute2 and network namespaces, and a PostgreSQL install: where the machine
cannot, the tests are skipped with the reason, except in CI (``CI=true``), where they fail
with it: CI runs as root on a machine that can, so a skip there would hide a broken setup.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.netns.hosts import Network, unavailable
from tests.netns.pool import Postgres, pg_unavailable
from tests.store.fixtures import IN_CI


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/netns/" in str(item.fspath):
            item.add_marker(pytest.mark.slow)


def _cannot(reason: str) -> None:
    message = f"network-namespace fault tests cannot run here: {reason}"
    if IN_CI:
        pytest.fail(message + " (CI=true: these tests are mandatory in CI)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def network() -> Iterator[Network]:
    """The test's own /24 and bridge; every host on it is torn down afterwards."""
    reason = unavailable()
    if reason is not None:
        _cannot(reason)
    net = Network()
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def postgres(network: Network) -> Iterator[Postgres]:
    """A PostgreSQL of the test's own on host ``db`` (its own data folder, killable)."""
    reason = pg_unavailable()
    if reason is not None:
        _cannot(reason)
    pg = Postgres(network.add("db"))
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()
