"""Unpacking uploaded working directories: good archives land inside the target; absolute
paths, ``..``, links out, device files, fifos and oversized archives are refused, leaving
nothing behind; a refused archive makes the replica a BOOT_FAIL with the reason."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.agent.unpack import UnsafeArchive, fetch_and_unpack, unpack


def _archive(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None


def test_a_plain_archive_unpacks_inside_the_target(tmp_path: Path) -> None:
    sub = tarfile.TarInfo("pkg")
    sub.type = tarfile.DIRTYPE
    path = _archive(
        tmp_path,
        (sub, None),
        _file("pkg/data.txt", b"hello"),
        _special("pkg/alias", tarfile.SYMTYPE, "data.txt"),
    )
    target = tmp_path / "work"
    assert unpack(path, target) == 5
    assert (target / "pkg" / "data.txt").read_bytes() == b"hello"
    assert (target / "pkg" / "alias").read_bytes() == b"hello"


BAD: dict[str, Callable[[], tuple[tarfile.TarInfo, bytes | None]]] = {
    "absolute": lambda: _file("/etc/evil"),
    "dotdot": lambda: _file("../evil"),
    "nested-dotdot": lambda: _file("a/../../evil"),
    "symlink-absolute": lambda: _special("ln", tarfile.SYMTYPE, "/etc"),
    "symlink-up": lambda: _special("a/ln", tarfile.SYMTYPE, "../../outside"),
    "hardlink-out": lambda: _special("hl", tarfile.LNKTYPE, "../outside"),
    "char-device": lambda: _special("dev", tarfile.CHRTYPE),
    "block-device": lambda: _special("blk", tarfile.BLKTYPE),
    "fifo": lambda: _special("pipe", tarfile.FIFOTYPE),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_unsafe_members_are_refused_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    path = _archive(tmp_path, _file("fine.txt"), BAD[case]())
    target = tmp_path / "work"
    with pytest.raises(UnsafeArchive):
        unpack(path, target)
    assert not target.exists()
    assert not (tmp_path / "evil").exists()


def test_writing_through_a_symlink_to_outside_is_refused(tmp_path: Path) -> None:
    # "ln" -> ".." passes as a link out; a later "ln/evil" would write next to the target.
    path = _archive(tmp_path, _special("ln", tarfile.SYMTYPE, ".."), _file("ln/evil"))
    with pytest.raises(UnsafeArchive, match="outside"):
        unpack(path, tmp_path / "work")
    assert not (tmp_path / "evil").exists()


def test_an_archive_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    path = _archive(tmp_path, _file("a", b"x" * 600), _file("b", b"y" * 600))
    with pytest.raises(UnsafeArchive, match="more than 1000 bytes"):
        unpack(path, tmp_path / "work", max_bytes=1000)
    assert unpack(path, tmp_path / "work2", max_bytes=1200) == 1200


def test_a_corrupt_archive_is_refused_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.tar.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(UnsafeArchive, match="cannot be unpacked"):
        unpack(path, tmp_path / "work")


class _Fetcher:
    def __init__(self, source: Path) -> None:
        self.source = source

    def download_upload(self, upload_id: str, dest: Path) -> None:
        dest.write_bytes(self.source.read_bytes())


def test_fetch_and_unpack_downloads_then_unpacks_and_removes_the_archive(tmp_path: Path) -> None:
    src = _archive(tmp_path, _file("hello.txt", b"hi"))
    target = tmp_path / "jobs" / "a1"
    fetch_and_unpack(_Fetcher(src), "u1", target)
    assert (target / "hello.txt").read_bytes() == b"hi"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a1"]


def test_a_transport_without_downloads_is_a_clear_refusal(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArchive, match="cannot download upload u1"):
        fetch_and_unpack(object(), "u1", tmp_path / "w")
