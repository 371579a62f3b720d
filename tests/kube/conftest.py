"""The session's Kubernetes control plane (see ``cluster.py``) and per-test namespaces.

Binaries missing: under ``CI=true`` the tests fail (``.ci/run`` builds them before ``make
test``), elsewhere they skip and say how to build them. Binaries present but a component that
does not start: the tests fail with its log, everywhere (that is a defect, not a missing tool).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.kube.cluster import ControlPlane, find_binaries
from tests.kube.nodes import Node
from tests.shim.conftest import natives  # noqa: F401  (the fake driver and shim build)
from tests.shim.helpers import Natives


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bins = find_binaries()
    if not isinstance(bins, Path):
        if IN_CI:
            pytest.fail(f"CI=true and no Kubernetes control plane: {bins}", pytrace=False)
        pytest.skip(bins)
    # A short folder: the kubelet plugin's unix sockets live under it too (108-byte limit).
    folder = Path(tmp_path_factory.mktemp("k8s", numbered=True))
    plane = ControlPlane(bins, folder)
    try:
        plane.start()
    except BaseException:
        plane.stop()
        raise
    yield plane
    plane.stop()
    if os.environ.get("GPUPOOL_KEEP_K8S"):
        print(f"control plane logs kept in {plane.logs}")


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace for one test, deleted after it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    control_plane.client.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    control_plane.client.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def node(control_plane: ControlPlane, natives: Natives, tmp_path: Path) -> Iterator[Node]:  # noqa: F811
    """A kwok node with two simulated A10s, its slice published and its kubelet plugin up."""
    n = Node(control_plane, natives, tmp_path, "2xA10")
    n.start_plugin()
    yield n
    n.stop_plugin()
