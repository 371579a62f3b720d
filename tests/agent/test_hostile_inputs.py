"""The agent never dies of a job's input: fuzzed archives and assignments.

The unpacker, driven with generated archives (odd names, links, special files, deep paths,
corrupt bytes), either unpacks inside its target or raises :class:`UnsafeArchive`; nothing
lands outside. The launcher (``Agent.apply_start`` then a heartbeat), driven with generated
assignments (odd argv and env text, NUL bytes, odd signals, limits, workdirs and uploads),
always records the replica, as started or as a BOOT_FAIL with a reason, and keeps answering.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpupool.agent.unpack as unpack_module
from gpupool.agent.unpack import MAX_DEPTH, UnsafeArchive, unpack
from gpupool.schemas.agent import AssignmentSpec, ReplicaState
from tests.agent.helpers import wait_for
from tests.agent.test_agent import FakeServer, make_agent

_SEGMENTS = st.sampled_from(["a", "b", "..", ".", "", "x" * 255, "é", "c:", "\\", "d"])
_NAMES = st.one_of(
    st.lists(_SEGMENTS, min_size=1, max_size=6).map("/".join),
    st.integers(min_value=1, max_value=400).map(lambda n: "/".join(["d"] * n) + "/f"),
    st.text(min_size=1, max_size=40),
)
_KINDS = st.sampled_from(
    [
        *(tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE),
        *(tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, b"7", b"x"),
    ]
)
_MEMBERS = st.lists(
    st.tuples(_NAMES, _KINDS, _NAMES, st.binary(max_size=64)), min_size=0, max_size=8
)


def _build(members: list[tuple[str, bytes, str, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, link, data in members:
            info = tarfile.TarInfo(name.replace("\x00", ""))
            info.type = kind
            info.linkname = link.replace("\x00", "")
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return raw.getvalue()


def _everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=_MEMBERS, cut=st.none() | st.integers(min_value=0, max_value=400))
def test_fuzzed_archives_unpack_inside_or_are_refused(
    members: list[tuple[str, bytes, str, bytes]], cut: int | None
) -> None:
    body = _build(members)
    if cut is not None:
        body = body[:cut]  # a truncated or corrupt upload
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        archive = root / "up.tar.gz"
        archive.write_bytes(body)
        target = root / "box" / "target"
        try:
            unpack(archive, target)
        except UnsafeArchive as exc:
            refusal = str(exc)
        else:
            refusal = ""
        if refusal:
            assert not target.exists()  # a refused archive leaves nothing
        outside = _everything_under(root) - {"up.tar.gz", "box"}
        assert all(p == "box/target" or p.startswith("box/target/") for p in outside), outside


def test_an_archive_deeper_than_the_limit_is_refused_with_its_depth(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_build([("/".join(["d"] * (MAX_DEPTH + 1)), tarfile.REGTYPE, "", b"")]))
    with pytest.raises(UnsafeArchive, match=f"{MAX_DEPTH + 1} folders deep"):
        unpack(archive, tmp_path / "t")


def test_an_archive_of_too_many_members_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_build([(f"f{i}", tarfile.REGTYPE, "", b"") for i in range(12)]))
    monkeypatch.setattr(unpack_module, "MAX_MEMBERS", 10)  # the real limit is 100,000
    with pytest.raises(UnsafeArchive, match="more than 10 members"):
        unpack(archive, tmp_path / "t")
    assert not (tmp_path / "t").exists()


# --------------------------------------------------------------------------- launcher

_TEXT = st.text(max_size=30) | st.sampled_from(["\x00", "a\x00b", "x" * 5000, "", "$HOME"])
_FLOATS = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.just(1e308)


class _RandomUploads(FakeServer):
    """A fake server whose upload download hands out the bytes the example chose."""

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body = body

    def download_upload(self, upload_id: str, dest: Path) -> None:
        dest.write_bytes(self.body)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    args=st.lists(_TEXT, max_size=4),
    env=st.dictionaries(_TEXT | st.just("SIMGPU_LOAD"), _TEXT, max_size=4),
    script=st.none() | _TEXT,
    workdir=st.none() | _TEXT,
    upload=st.none() | st.binary(max_size=200) | st.just(b"\x1f\x8b" + b"\x00" * 50),
    signal_name=st.sampled_from(["SIGTERM", "SIGUSR1", "SIGNOPE", "", "9", "\x00"]),
    grace=st.floats(allow_nan=True, allow_infinity=True),
    limit=_FLOATS,
    isolation=st.sampled_from(["auto", "soft", "mps", "exclusive", "mig", "nonsense", ""]),
    devices=st.lists(st.sampled_from(["GPU-sim-n1-0", "GPU-nope", ""]), max_size=2),
)
def test_fuzzed_assignments_never_end_the_agent(
    args: list[str],
    env: dict[str, str],
    script: str | None,
    workdir: str | None,
    upload: bytes | None,
    signal_name: str,
    grace: float,
    limit: float | None,
    isolation: str,
    devices: list[str],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = _RandomUploads(upload or b"")
        agent = make_agent(root, server)
        a = AssignmentSpec(
            assignment_id="fz",
            epoch=1,
            job_id="job-fz",
            job_name="fuzz",
            replica_rank=0,
            command=[] if script is not None else ["/bin/true", *args],
            script=script,
            env=env,
            workdir=None if workdir is None else os.path.join(tmp, workdir),
            workdir_upload=None if upload is None else "ab" * 16,
            device_uuids=devices,
            milli_per_device=500,
            memory_mib_per_device=1024,
            isolation=isolation,
            time_limit_s=limit,
            checkpoint_signal=signal_name,
            grace_period_s=grace,
        )
        try:
            assert agent.apply_start(a)
            agent.observe()
            agent.heartbeat()
            seen = server.last("fz")
            assert seen is not None
            assert seen.state in set(ReplicaState)
            if seen.state is ReplicaState.BOOT_FAILED:
                assert seen.reason
        finally:
            for key in list(agent.replicas):
                agent.executor.stop(key, reason="admin", signal_name="SIGKILL", grace_s=0.0)
            # The supervisor (which unpacks an upload itself) writes into the folder until it
            # has recorded the end: wait for that before the folder goes.
            wait_for(
                lambda: all(
                    agent.executor.observe(k).status in ("exited", "boot_failed", "lost")
                    for k in agent.replicas
                ),
                60,
                "the supervisors to record their ends",
            )
            agent.close()


def test_removing_a_replica_without_a_copy_leaves_its_jobs_shared_folder(tmp_path: Path) -> None:
    """A job without an upload runs in ``work/<job id>``, shared by its replicas on the node:
    the end of one replica must not remove the folder another runs in."""
    shared = tmp_path / "work" / "job-1"
    shared.mkdir(parents=True)
    unpack_module.remove_copy(tmp_path / "work", "job-1", "a1")
    assert shared.is_dir()
    copy = unpack_module.copy_path(tmp_path / "work", "job-2", "a2")
    (copy / "sub").mkdir(parents=True)
    unpack_module.remove_copy(tmp_path / "work", "job-2", "a2")
    assert not copy.parent.exists()


def test_a_replica_whose_supervisor_cannot_start_is_a_boot_failure_with_the_reason(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    agent.executor._python = str(tmp_path / "no-such-python")  # the launch itself fails
    a = AssignmentSpec(
        assignment_id="sv",
        epoch=1,
        job_id="job-sv",
        job_name="t",
        replica_rank=0,
        command=["/bin/true"],
        milli_per_device=500,
        memory_mib_per_device=1024,
    )
    assert agent.apply_start(a)
    agent.observe()
    agent.heartbeat()
    seen = server.last("sv")
    assert seen is not None
    assert seen.state is ReplicaState.BOOT_FAILED, seen
    assert "could not launch" in (seen.reason or "")
    agent.close()
