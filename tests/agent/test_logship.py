"""The log shipper: new bytes only, in bounded chunks, resumed where the server says, and a
forgotten replica shipped to its end before it is dropped."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

from gpupool.agent.logship import LogShipper
from gpupool.schemas.agent import LogAck, LogChunkRequest


class Sink:
    """A server in memory: bytes per (assignment, stream), de-duplicated by offset."""

    def __init__(self, known: set[str]) -> None:
        self.known = known
        self.kept: dict[tuple[str, str], bytes] = {}
        self.chunks: list[LogChunkRequest] = []

    def ship_logs(self, chunk: LogChunkRequest) -> LogAck:
        self.chunks.append(chunk)
        if chunk.assignment_id not in self.known:
            return LogAck(next_offset=0, kept=False)
        key = (chunk.assignment_id, chunk.stream.value)
        have = self.kept.get(key, b"")
        data = base64.b64decode(chunk.data)
        end = chunk.offset + len(data)
        if end > len(have):
            self.kept[key] = have + data[len(have) - chunk.offset :]
        return LogAck(next_offset=len(self.kept.get(key, b"")))


def _folder(root: Path, key: str) -> Path:
    path = root / key
    path.mkdir(parents=True, exist_ok=True)
    return path


def _path_of(root: Path) -> Callable[[str, str], Path | None]:
    def find(key: str, stream: str) -> Path | None:
        p = root / key / f"{stream}.log"
        return p if p.exists() else None

    return find


def test_only_new_bytes_are_sent_in_bounded_chunks(tmp_path: Path) -> None:
    out = _folder(tmp_path, "a1") / "stdout.log"
    out.write_bytes(b"x" * 10)
    sink = Sink({"a1"})
    shipper = LogShipper(sink, _path_of(tmp_path), chunk_bytes=4)
    shipper.track("a1")
    assert shipper.ship(["a1"]) == 10
    assert [len(base64.b64decode(c.data)) for c in sink.chunks] == [4, 4, 2]
    with open(out, "ab") as f:
        f.write(b"yz")
    assert shipper.ship(["a1"]) == 2
    assert sink.chunks[-1].offset == 10
    assert shipper.ship(["a1"]) == 0
    assert sink.kept[("a1", "stdout")] == b"x" * 10 + b"yz"


def test_a_restarted_agent_resumes_where_the_server_is(tmp_path: Path) -> None:
    (_folder(tmp_path, "a1") / "stdout.log").write_bytes(b"0123456789")
    sink = Sink({"a1"})
    sink.kept[("a1", "stdout")] = b"012345"
    shipper = LogShipper(sink, _path_of(tmp_path), chunk_bytes=4)  # offsets start at 0
    shipper.track("a1")
    shipper.ship(["a1"])
    assert sink.kept[("a1", "stdout")] == b"0123456789"
    assert [c.offset for c in sink.chunks] == [0, 6]


def test_a_forgotten_replica_is_shipped_to_its_end_then_dropped(tmp_path: Path) -> None:
    (_folder(tmp_path, "a1") / "stderr.log").write_bytes(b"last words\n")
    sink = Sink({"a1"})
    shipper = LogShipper(sink, _path_of(tmp_path))
    shipper.track("a1")
    shipper.ship([])  # no longer live: drained
    assert sink.kept[("a1", "stderr")] == b"last words\n"
    assert shipper.offsets == {}
    assert shipper.ship([]) == 0


def test_an_assignment_the_server_does_not_know_is_not_retried(tmp_path: Path) -> None:
    (_folder(tmp_path, "gone") / "stdout.log").write_bytes(b"abc")
    sink = Sink(set())
    shipper = LogShipper(sink, _path_of(tmp_path))
    shipper.track("gone")
    shipper.ship(["gone"])
    shipper.ship(["gone"])
    assert len(sink.chunks) == 1


def test_the_end_of_an_ended_replica_is_marked_final_once(tmp_path: Path) -> None:
    from gpupool.agent.jobdir import EXITED, RUNNING, JobDir, ProcessState

    folder = _folder(tmp_path, "a1")
    (folder / "stdout.log").write_bytes(b"x" * 8)
    (folder / "stderr.log").write_bytes(b"")
    JobDir(folder).write_state(ProcessState(status=RUNNING))
    sink = Sink({"a1"})
    shipper = LogShipper(sink, _path_of(tmp_path), chunk_bytes=4)
    shipper.track("a1")
    shipper.ship(["a1"])
    assert not any(c.final for c in sink.chunks)  # still running: more may come
    with open(folder / "stdout.log", "ab") as f:
        f.write(b"yz")
    JobDir(folder).write_state(ProcessState(status=EXITED, exit_code=0))
    shipper.ship(["a1"])
    finals = [(c.stream.value, c.offset, base64.b64decode(c.data)) for c in sink.chunks if c.final]
    assert finals == [("stdout", 8, b"yz"), ("stderr", 0, b"")]
    sent = len(sink.chunks)
    shipper.ship(["a1"])
    assert len(sink.chunks) == sent  # nothing more once the ends were sent
