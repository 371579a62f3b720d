"""A pool whose jobs run as accounts of their own (``--run-as auto`` as root), as in
production, in a folder other accounts may pass (pytest's own are ``0700``)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.e2e.pool import Pool


class AutoPool(Pool):
    """Jobs run as their submitters' or transient accounts, never root."""

    agent_args = ("--run-as", "auto")

    def start_server(self) -> None:
        super().start_server()
        self.agent_token.chmod(0o600)  # the agent refuses a token other accounts may read


@contextlib.contextmanager
def auto_pool(prefix: str, agents: dict[str, str]) -> Iterator[Pool]:
    """A started :class:`AutoPool` with ``agents`` in a fresh ``0711`` folder under /tmp."""
    root = Path(tempfile.mkdtemp(prefix=f"gpupool-{prefix}-", dir="/tmp"))
    root.chmod(0o711)
    try:
        with AutoPool.running(root, agents) as p:
            yield p
    finally:
        shutil.rmtree(root, ignore_errors=True)
