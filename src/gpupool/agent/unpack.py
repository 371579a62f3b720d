"""Unpacking a job's uploaded working directory, safely.

Words:

- **archive**: a gzip'd tar a user uploaded (see :mod:`gpupool.control.services.uploads`).
- **target**: the job's folder on this node; every member must land inside it.
- **refused archive**: one with a member that is absolute, climbs out with ``..``, is a
  symlink or hardlink pointing outside the target, a device file or a fifo, or whose members
  add up to more than the size cap. Nothing of a refused archive is left in the target; the
  replica is then a BOOT_FAIL whose reason is the :class:`UnsafeArchive` message.
- **limits**: an archive is also refused when a member is more than ``MAX_DEPTH`` folders
  deep or its path longer than ``MAX_PATH_CHARS`` (a 140-byte archive 1,000 folders deep made
  ``os.makedirs`` raise ``RecursionError`` and killed the agent), when it has more than
  ``MAX_MEMBERS`` members, or when it expands to more than ``max_bytes`` or to more than
  ``MAX_RATIO`` times its own size past ``RATIO_FREE_BYTES`` (a gzip bomb: a 204 KB upload
  that unpacks to 200 MiB). The limits are checked on each header as it is read, so a bomb
  is refused after decompressing no more than the limit.
- **copy**: the unpacked folder of one replica, ``<state>/work/<job id>/<assignment id>``;
  :func:`remove_copy` deletes it when the replica has ended.

Nothing a job's archive holds may raise out of :func:`unpack` but :class:`UnsafeArchive`:
the agent turns that into the job's BOOT_FAIL and keeps the node up.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tarfile
import threading
import zlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

#: The most bytes the members of one archive may add up to once unpacked.
DEFAULT_MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
#: The most folders a member's path may go down (a real project tree is a few dozen deep).
MAX_DEPTH = 64
#: The longest member path, in characters (Linux's PATH_MAX is 4096 bytes).
MAX_PATH_CHARS = 1024
#: The most members (files, folders, links) one archive may hold.
MAX_MEMBERS = 100_000
#: How many times its own size an archive may expand to, past ``RATIO_FREE_BYTES``: source
#: trees compress 3-10x; gzip's worst case (zeros) is about 1,000x.
MAX_RATIO = 100
RATIO_FREE_BYTES = 64 * 1024 * 1024


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


def _check_shape(member: tarfile.TarInfo) -> None:
    """Raise :class:`UnsafeArchive` when ``member``'s path is too deep or too long."""
    name = member.name
    depth = len([part for part in posixpath.normpath(name).split("/") if part not in ("", ".")])
    if depth > MAX_DEPTH:
        raise UnsafeArchive(
            f"archive member {name[:60]!r}... is {depth} folders deep, more than {MAX_DEPTH}: "
            "upload a shallower folder"
        )
    if len(name) > MAX_PATH_CHARS:
        raise UnsafeArchive(
            f"archive member {name[:60]!r}... has a path of {len(name)} characters, more "
            f"than {MAX_PATH_CHARS}: shorten the paths in the folder you upload"
        )


def _checked_members(tar: tarfile.TarFile, limit: int) -> list[tarfile.TarInfo]:
    """Every member, each checked as its header is read, so that nothing past the first
    refused one is decompressed."""
    members: list[tarfile.TarInfo] = []
    total = 0
    while True:
        member = tar.next()
        if member is None:
            return members
        _check_shape(member)
        check_member(member)
        members.append(member)
        if len(members) > MAX_MEMBERS:
            raise UnsafeArchive(
                f"the archive has more than {MAX_MEMBERS} members: upload a folder with "
                "fewer files (pack data sets separately, or read them from shared storage)"
            )
        total += max(0, member.size) if member.isfile() else 0
        if total > limit:
            raise UnsafeArchive(
                f"the archive unpacks to more than {limit} bytes: upload a smaller folder, or "
                "read large data from shared storage"
            )


def unpack(archive: Path, target: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_BYTES) -> int:
    """Unpack ``archive`` into ``target`` (created); returns the bytes written.

    Every member is checked before anything is written, so a refused archive leaves nothing;
    a failure while writing (a full disk) removes what was written. Raises only
    :class:`UnsafeArchive`."""
    try:
        packed = archive.stat().st_size
        limit = min(max_bytes, max(RATIO_FREE_BYTES, MAX_RATIO * packed))
        with tarfile.open(archive, "r:gz") as tar:
            members = _checked_members(tar, limit)
            total = sum(max(0, m.size) for m in members if m.isfile())
            target.mkdir(parents=True, exist_ok=True)
            try:
                # The "data" filter re-checks links and modes (also for links made earlier in
                # the same archive); it raises FilterError for anything unsafe.
                tar.extractall(target, members=members, filter="data")
            except tarfile.FilterError as exc:
                raise UnsafeArchive(f"unsafe archive member: {exc}") from None
    except UnsafeArchive:
        shutil.rmtree(target, ignore_errors=True)
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise UnsafeArchive(f"the working directory archive cannot be unpacked: {exc}") from None
    except Exception as exc:  # a job's bytes must never end the agent
        shutil.rmtree(target, ignore_errors=True)
        raise UnsafeArchive(
            f"the working directory archive cannot be unpacked ({type(exc).__name__}: "
            f"{str(exc)[:200]}): upload a plain folder packed with `tar czf`"
        ) from None
    return total


def unpack_step(args: dict[str, Any]) -> tuple[int, bytes]:
    """The ``unpack`` step of :mod:`gpupool.agent.jobsteps`, run by the replica's supervisor as
    the job's account: ``args`` names the ``archive``, the ``target`` and ``max_bytes``.
    Returns ``(0, b"")``, or ``(REFUSED, the reason)``."""
    from gpupool.agent.jobsteps import REFUSED

    try:
        unpack(Path(args["archive"]), Path(args["target"]), int(args["max_bytes"]))
    except UnsafeArchive as exc:
        return REFUSED, str(exc).encode(errors="replace")
    return 0, b""


def copy_path(work_root: Path, job_id: str, assignment_id: str) -> Path:
    """Where the unpacked copy of one replica lives (see **copy** above)."""
    return work_root / job_id / assignment_id


def remove_copy(work_root: Path, job_id: str, assignment_id: str) -> None:
    """Delete a replica's unpacked copy, and its job's folder once no copy is left in it.

    Safe to call for a replica that had none; errors are ignored (a later call retries)."""
    copy = copy_path(work_root, job_id, assignment_id)
    if copy.parent.parent != work_root or not copy.is_dir():  # ids are server-made
        # No copy (a job without an upload): its folder ``work/<job id>`` may be another
        # replica's working directory right now, so it is left alone.
        return
    shutil.rmtree(copy, ignore_errors=True)
    archive = archive_path(copy)  # a download that ended after its replica did
    for leftover in (archive, archive.with_name(archive.name + ".partial")):
        leftover.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        copy.parent.rmdir()  # only when empty: another replica of the job may still run


@runtime_checkable
class UploadFetcher(Protocol):
    """A transport that can download an upload (``GET /v1/agent/uploads/{id}``) to a file."""

    def download_upload(self, upload_id: str, dest: Path) -> None: ...


def archive_path(target: Path) -> Path:
    """Where the downloaded archive of the copy ``target`` waits to be unpacked."""
    return target.parent / f".{target.name}.upload.tar.gz"


def download(fetcher: object, upload_id: str, target: Path) -> Path:
    """Download upload ``upload_id`` beside the copy ``target`` (see :func:`archive_path`),
    for the replica's supervisor to unpack (:func:`unpack_step`); returns the archive's path.

    Raises :class:`UnsafeArchive` for a failed download or a transport that cannot download
    (the replica is then a BOOT_FAIL with that reason)."""
    if not isinstance(fetcher, UploadFetcher):
        raise UnsafeArchive(
            f"this agent cannot download upload {upload_id}: its transport has no upload download"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    archive = archive_path(target)
    try:
        fetcher.download_upload(upload_id, archive)
    except Exception as exc:
        archive.unlink(missing_ok=True)
        raise UnsafeArchive(
            f"cannot download working directory upload {upload_id}: {exc}"
        ) from None
    return archive


def download_later(
    fetcher: object, upload_id: str, target: Path, owner: tuple[int, int] | None
) -> Path:
    """Start downloading upload ``upload_id`` beside the copy ``target`` in a thread (not on
    the agent's heartbeat path); returns where the archive will be. When whole it is given to
    ``owner`` (uid, gid: the job's account, which unpacks it) and renamed into place; a failed
    download leaves ``<archive>.failed`` with the reason instead (see
    :mod:`gpupool.agent.jobsteps`). Raises :class:`UnsafeArchive` at once for a transport that
    cannot download."""
    from gpupool.agent.jobsteps import FAILED_SUFFIX

    if not isinstance(fetcher, UploadFetcher):
        raise UnsafeArchive(
            f"this agent cannot download upload {upload_id}: its transport has no upload download"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    archive = archive_path(target)
    partial = archive.with_name(archive.name + ".partial")

    def run() -> None:
        try:
            fetcher.download_upload(upload_id, partial)
            if owner is not None:
                os.chown(partial, *owner)
            os.replace(partial, archive)
        except Exception as exc:  # said to the supervisor, which fails the replica with it
            partial.unlink(missing_ok=True)
            why = f"cannot download working directory upload {upload_id}: {exc}"
            archive.with_name(archive.name + FAILED_SUFFIX).write_text(why[:2000])

    threading.Thread(target=run, name=f"gpupool-download-{upload_id}", daemon=True).start()
    return archive


def fetch_and_unpack(
    fetcher: object, upload_id: str, target: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_BYTES
) -> None:
    """Download upload ``upload_id`` and unpack it into ``target``, in this process (tests and
    tools; the agent leaves the unpacking to the replica's supervisor, see
    :mod:`gpupool.agent.jobsteps`).

    Raises :class:`UnsafeArchive` for a refused archive, a failed download, or a transport
    that cannot download (the replica is then a BOOT_FAIL with that reason)."""
    archive = download(fetcher, upload_id, target)
    try:
        unpack(archive, target, max_bytes)
    finally:
        archive.unlink(missing_ok=True)
