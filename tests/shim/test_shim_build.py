"""The shim's build: on first use, by several processes at once, into one cache folder; the
façade forwards every name the real driver exports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpupool.shim.build import (
    CSRC,
    HOOK_TABLE,
    elf_dynamic_names,
    forwarded_names,
    hooked_names,
)


def test_processes_building_at_once_share_one_build(tmp_path):
    code = (
        "import sys; from pathlib import Path; from gpupool.shim.build import ensure_built; "
        "print(ensure_built(cache=Path(sys.argv[1])).root)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    roots = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(roots) == 1
    root = Path(roots.pop())
    assert (root / "facade" / "libcuda.so.1").is_file()
    assert (root / "facade" / "libcuda.so").resolve() == (
        root / "facade" / "libcuda.so.1"
    ).resolve()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".build-")] == []


def test_the_facade_forwards_what_the_real_driver_exports(natives):
    # The driver's functions (the fake's own test helpers, not "cu" names, stay out).
    exported = {n for n in elf_dynamic_names(natives.fake) if n.startswith("cu")}
    assert "cuDeviceGetDefaultMemPool" in exported
    forwarded = set(forwarded_names(natives.fake))
    hooked = hooked_names((CSRC / HOOK_TABLE).read_text())
    assert exported - hooked <= forwarded
    assert not forwarded & hooked
    facade = set(elf_dynamic_names(natives.shim.facade))
    assert forwarded | hooked <= facade
