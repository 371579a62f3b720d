"""Unpacking a job's uploaded working directory, safely.

Words:

- **archive**: a gzip'd tar a user uploaded (see :mod:`gpupool.control.uploads`).
- **target**: the job's folder on this node; every member must land inside it.
- **refused archive**: one with a member that is absolute, climbs out with ``..``, is a
  symlink or hardlink pointing outside the target, a device file or a fifo, or whose members
  add up to more than the size cap. Nothing of a refused archive is left in the target; the
  replica is then a BOOT_FAIL whose reason is the :class:`UnsafeArchive` message.
"""

from __future__ import annotations

import posixpath
import shutil
import tarfile
from pathlib import Path
from typing import Protocol, runtime_checkable

#: The most bytes the members of one archive may add up to once unpacked.
DEFAULT_MAX_UNPACKED_BYTES = 1024 * 1024 * 1024


class UnsafeArchive(Exception):
    """The archive was refused; the message says which member and why."""


def _inside(name: str) -> bool:
    """Whether the relative POSIX path ``name`` stays inside the folder it is relative to."""
    norm = posixpath.normpath(name)
    return not (norm == ".." or norm.startswith("../") or posixpath.isabs(norm))


def check_member(member: tarfile.TarInfo) -> None:
    """Raise :class:`UnsafeArchive` when ``member`` could write outside the target."""
    name = member.name
    if posixpath.isabs(name) or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"archive member {name!r} has an absolute path")
    if not _inside(name):
        raise UnsafeArchive(f"archive member {name!r} points outside the working directory")
    if member.issym():
        link = member.linkname
        where = posixpath.join(posixpath.dirname(name), link)
        if posixpath.isabs(link) or not _inside(where):
            raise UnsafeArchive(
                f"symlink {name!r} -> {link!r} points outside the working directory"
            )
    elif member.islnk():
        if posixpath.isabs(member.linkname) or not _inside(member.linkname):
            raise UnsafeArchive(
                f"hardlink {name!r} -> {member.linkname!r} points outside the working directory"
            )
    elif member.ischr() or member.isblk():
        raise UnsafeArchive(f"archive member {name!r} is a device file")
    elif member.isfifo():
        raise UnsafeArchive(f"archive member {name!r} is a fifo")
    elif not (member.isfile() or member.isdir()):
        raise UnsafeArchive(f"archive member {name!r} is not a file, folder or link")


def unpack(archive: Path, target: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_BYTES) -> int:
    """Unpack ``archive`` into ``target`` (created); returns the bytes written.

    Every member is checked before anything is written, so a refused archive leaves nothing.
    """
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            total = 0
            for m in members:
                check_member(m)
                total += max(0, m.size) if m.isfile() else 0
                if total > max_bytes:
                    raise UnsafeArchive(
                        f"the archive unpacks to more than {max_bytes} bytes: upload a smaller "
                        "folder"
                    )
            target.mkdir(parents=True, exist_ok=True)
            try:
                # The "data" filter re-checks links and modes (also for links made earlier in
                # the same archive); it raises FilterError for anything unsafe.
                tar.extractall(target, members=members, filter="data")
            except tarfile.FilterError as exc:
                shutil.rmtree(target, ignore_errors=True)
                raise UnsafeArchive(f"unsafe archive member: {exc}") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UnsafeArchive(f"the working directory archive cannot be unpacked: {exc}") from None
    return total


@runtime_checkable
class UploadFetcher(Protocol):
    """A transport that can download an upload (``GET /v1/agent/uploads/{id}``) to a file."""

    def download_upload(self, upload_id: str, dest: Path) -> None: ...


def fetch_and_unpack(
    fetcher: object, upload_id: str, target: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_BYTES
) -> None:
    """Download upload ``upload_id`` and unpack it into ``target``.

    Raises :class:`UnsafeArchive` for a refused archive, a failed download, or a transport
    that cannot download (the replica is then a BOOT_FAIL with that reason)."""
    if not isinstance(fetcher, UploadFetcher):
        raise UnsafeArchive(
            f"this agent cannot download upload {upload_id}: its transport has no upload download"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    archive = target.parent / f".{target.name}.upload.tar.gz"
    try:
        try:
            fetcher.download_upload(upload_id, archive)
        except Exception as exc:
            raise UnsafeArchive(
                f"cannot download working directory upload {upload_id}: {exc}"
            ) from None
        unpack(archive, target, max_bytes)
    finally:
        archive.unlink(missing_ok=True)
