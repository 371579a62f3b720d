"""Packing a working directory: relative paths, skipped folders left out, the local limit
refused before anything is sent."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpupool.client.errors import ConfigError
from gpupool.client.pack import pack_folder


def test_a_folder_packs_relative_paths_without_git_caches_or_venvs(tmp_path: Path) -> None:
    for skipped in (".git", "__pycache__", ".venv", "src/__pycache__"):
        (tmp_path / skipped).mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped / "junk").write_text("x")
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "train.py").write_text("print(1)\n")
    (tmp_path / "README").write_text("hi")
    with tarfile.open(fileobj=io.BytesIO(pack_folder(tmp_path)), mode="r:gz") as tar:
        names = sorted(tar.getnames())
    assert names == ["README", "src", "src/train.py"]


def test_a_folder_over_the_limit_is_refused_locally(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(50_000))
    with pytest.raises(ConfigError, match="upload limit"):
        pack_folder(tmp_path, limit=10_000)


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a folder"):
        pack_folder(tmp_path / "nope")
