"""Packing a working directory into a gzip'd tar for ``POST /v1/uploads``.

Words:

- **skipped names**: folders and files never packed, wherever they are in the tree
  (:data:`SKIP`: version control, caches, virtual environments).
- **limit**: the most bytes the archive may have; :func:`pack_folder` refuses a folder whose
  archive would pass it, before anything is sent (the server applies its own limit too).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from gpupool.client.errors import ConfigError

#: Names left out of an upload wherever they appear.
SKIP = frozenset({".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})

#: The server's default upload limit (``upload_max_bytes``), 100 MiB.
DEFAULT_LIMIT_BYTES = 100 * 1024 * 1024


class _Capped(io.BytesIO):
    """An in-memory file that refuses to grow past ``limit`` bytes."""

    def __init__(self, limit: int, folder: Path) -> None:
        super().__init__()
        self.limit = limit
        self.folder = folder

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.tell() + len(data) > self.limit:
            raise ConfigError(
                f"{self.folder} packs to more than {self.limit} bytes "
                f"({self.limit / 2**20:.0f} MiB), the upload limit: leave out data sets, "
                "checkpoints and build outputs (read them from shared storage) and try again"
            )
        return super().write(data)


def pack_folder(folder: Path, limit: int = DEFAULT_LIMIT_BYTES) -> bytes:
    """The gzip'd tar of ``folder``'s contents (paths relative to it; :data:`SKIP` left out;
    symlinks kept as links). Raises :class:`ConfigError` past ``limit`` or for no folder."""
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder: give an existing folder to upload")
    out = _Capped(limit, folder)
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in SKIP)
            here = Path(root)
            for name in dirs + sorted(f for f in files if f not in SKIP):
                path = here / name
                arcname = path.relative_to(folder).as_posix()
                tar.add(path, arcname=arcname, recursive=False)
    return out.getvalue()
