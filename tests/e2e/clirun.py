"""``gpupool`` commands run as a real user would, against a test pool (see ``pool.py``)."""

from __future__ import annotations

import os
import subprocess

from tests.e2e.pool import PY, REPO, Pool


def cli_env(pool: Pool) -> dict[str, str]:
    """The environment of a ``gpupool`` command as the pool's admin, with this tree's code."""
    token = (pool.home / "admin-token").read_text().strip()
    return {
        **os.environ,
        "GPUPOOL_HOME": str(pool.root / "cli-home"),
        "GPUPOOL_SERVER": pool.url,
        "GPUPOOL_TOKEN": token,
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p),
    }


def gpupool(pool: Pool, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``gpupool ARGS`` in the pool's folder; its status, stdout and stderr."""
    return subprocess.run(
        [PY, "-m", "gpupool.cli", *args],
        env=cli_env(pool),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=pool.root,
        check=False,
    )
