"""Unpacking a job's results (``GET /v1/jobs/{id}/results``) into a folder, safely.

The archive comes from the job's node (see :mod:`gpupool.agent.results`), so it is treated
like any archive from elsewhere, and the whole archive is judged before anything is written.
It is refused when a member:

- is absolute, or has a ``..`` anywhere in its name (a packed folder never has one);
- lies below a link of the same archive (``x1`` a link, then ``x1/NAME``): the operating
  system would follow the link, so where the member lands is not what its name says;
- is a symlink whose target, taken from the link's own folder, leaves the folder, or passes
  through a link of the archive on its way (``d/up -> ..`` then ``x1 -> d/up/..``: lexically
  inside, really one folder up). Links are judged against every link in the archive, in any
  order, not one at a time;
- is a hardlink to anything but a plain file of the archive, or is a device or a fifo.

The extraction then runs with :mod:`tarfile`'s ``data`` filter, which resolves each member
against what is already on disk, as a second line. The destination must be new or empty:
nothing of the user's is overwritten.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from pathlib import Path

from gpupool.client.errors import ClientError, ConfigError


def _prefixes(path: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b"]``: the folders a path passes through, unnormalised."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _refuse(what: str) -> ClientError:
    return ClientError(
        f"the results archive {what}: nothing was written; the job's node sent an unsafe "
        "archive (ask an admin to check that node)"
    )


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Raise :class:`ClientError` when any member could write outside the destination (see
    the module docstring)."""
    names = {posixpath.normpath(m.name): m for m in members}
    links = {name for name, m in names.items() if m.issym() or m.islnk()}
    for member in members:
        name = member.name
        parts = name.split("/")
        if posixpath.isabs(name) or ".." in parts or name.startswith("\\"):
            raise _refuse(f"has a member outside its folder: {name!r}")
        through = [p for p in _prefixes(posixpath.normpath(name)) if p in links]
        if through:
            raise _refuse(f"puts {name!r} below the link {through[0]!r}")
        if member.issym():
            link = member.linkname
            raw = posixpath.join(posixpath.dirname(posixpath.normpath(name)), link)
            norm = posixpath.normpath(raw)
            if posixpath.isabs(link) or norm == ".." or norm.startswith("../"):
                raise _refuse(f"links {name!r} -> {link!r} outside its folder")
            hops = [p for p in [*_prefixes(raw), norm] if posixpath.normpath(p) in links]
            if hops:
                raise _refuse(f"links {name!r} -> {link!r} through the link {hops[0]!r}")
        elif member.islnk():
            target = names.get(posixpath.normpath(member.linkname))
            if target is None or not target.isfile():
                raise _refuse(f"hardlinks {name!r} to {member.linkname!r}, not a file of its own")
        elif not (member.isfile() or member.isdir()):
            raise _refuse(f"has a special file {name!r}")


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
            check_members(members)
            dest.mkdir(parents=True, exist_ok=True)
            tar.extractall(dest, members=members, filter="data")
    except tarfile.FilterError as exc:
        raise _refuse(f"has an unsafe member ({exc})") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ClientError(f"cannot unpack the results into {dest}: {exc}") from None
    return sum(1 for m in members if m.isfile())
