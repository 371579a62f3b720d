"""Unpacking a job's results (``GET /v1/jobs/{id}/results``) into a folder, safely.

The archive comes from the job's node (see :mod:`gpupool.agent.results`), so it is treated
like any archive from elsewhere: a member that is absolute, climbs out with ``..``, is a link
pointing outside the folder, or is a device or a fifo refuses the whole archive before
anything is written. The destination must be new or empty: nothing of the user's is
overwritten.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from pathlib import Path

from gpupool.client.errors import ClientError, ConfigError


def _inside(name: str) -> bool:
    norm = posixpath.normpath(name)
    return not (norm == ".." or norm.startswith("../") or posixpath.isabs(norm))


def _check(member: tarfile.TarInfo) -> None:
    name = member.name
    if posixpath.isabs(name) or not _inside(name):
        raise ClientError(f"the results archive has a member outside its folder: {name!r}")
    if member.issym():
        target = posixpath.join(posixpath.dirname(name), member.linkname)
        if posixpath.isabs(member.linkname) or not _inside(target):
            raise ClientError(f"the results archive links {name!r} outside its folder")
    elif member.islnk():
        if not _inside(member.linkname):
            raise ClientError(f"the results archive links {name!r} outside its folder")
    elif not (member.isfile() or member.isdir()):
        raise ClientError(f"the results archive has a special file {name!r}")


def unpack_results(data: bytes, dest: Path) -> int:
    """Unpack the gzip'd tar ``data`` into ``dest`` (made if missing); returns the number of
    files. Raises :class:`ConfigError` for a ``dest`` that is a file or not empty, and
    :class:`ClientError` for an unsafe or unreadable archive (nothing written then)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(
            f"{dest} is not an empty folder: give a new or empty folder to fetch into"
        )
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                _check(member)
            dest.mkdir(parents=True, exist_ok=True)
            for member in members:
                tar.extract(member, dest, set_attrs=member.isfile())
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ClientError(f"cannot unpack the results into {dest}: {exc}") from None
    return sum(1 for m in members if m.isfile())
