"""Issue 27: the docs told users to ``pip install gpupool``, which no package index has; they
say where to install it from instead (a checkout, a git URL, a wheel)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BARE = re.compile(r"pip install gpupool(?![\w./-])")


def test_no_doc_installs_gpupool_from_an_index() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if BARE.search(line)
    ]
    assert found == [], f"'pip install gpupool' finds nothing on any index: {found}"
