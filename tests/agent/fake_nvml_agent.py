"""``python -m tests.agent.fake_nvml_agent STATE.json AGENT-ARGS...``: a real ``gpupool agent``
process whose ``pynvml`` is the fake NVML of ``fake_nvml.py``, driven by the state file STATE.

Everything else is the production path: ``open_backend`` opens the NVML backend (no
``--simulate``), the agent registers with the real server and runs jobs under supervisors.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.agent.fake_nvml import FakeNvml


def main() -> None:
    state = Path(sys.argv[1])
    sys.modules["pynvml"] = FakeNvml.from_file(state)  # type: ignore[assignment]
    from gpupool.cli.main import main as gpupool_main

    sys.argv = ["gpupool", "agent", *sys.argv[2:]]
    gpupool_main()


if __name__ == "__main__":
    main()
