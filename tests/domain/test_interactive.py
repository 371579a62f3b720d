"""The job-spec values of issue 27's interactive part: pty endpoints, ``-o``/``-e`` patterns,
``--constraint`` and node features (``gpupool.domain.interactive``), and their job-file keys."""

from __future__ import annotations

import pytest

from gpupool.domain.errors import InvalidValue, SpecError
from gpupool.domain.interactive import (
    expand_output,
    parse_constraint,
    parse_features,
    parse_output,
    parse_pty,
)
from gpupool.domain.jobspec import build_spec
from gpupool.store.mapping import spec_from_json, spec_to_json

VALUES = {"j": "42", "x": "train", "A": "40", "a": "2", "u": "ann", "N": "n1"}


def test_output_patterns_expand_as_slurm() -> None:
    assert expand_output("out/%x-%j.log", VALUES) == "out/train-42.log"
    assert expand_output("%A_%a.%u.%N", VALUES) == "40_2.ann.n1"
    assert expand_output("%5j 100%%", VALUES) == "00042 100%"


@pytest.mark.parametrize("bad", ["%q.out", "x%", "a%3z"])
def test_unknown_symbols_are_refused_with_the_list(bad: str) -> None:
    with pytest.raises(InvalidValue, match=r"is not a replacement symbol; use %j \(job id\)"):
        parse_output(bad, "output")


@pytest.mark.parametrize("bad", ["", "dir/", "a\x00b"])
def test_paths_that_name_no_file_are_refused(bad: str) -> None:
    with pytest.raises(InvalidValue):
        parse_output(bad, "output")


def test_constraint_and_binds_tighter_than_or() -> None:
    c = parse_constraint("nvlink&ib|a100x8")
    assert c.allows({"a100x8"})
    assert c.allows({"nvlink", "ib"})
    assert not c.allows({"ib"})
    assert not c.allows(())


@pytest.mark.parametrize("bad", ["a&&b", "|a", "a|", "a b&", "a(b)", ""])
def test_malformed_constraints_are_refused(bad: str) -> None:
    with pytest.raises(InvalidValue):
        parse_constraint(bad)


def test_features_are_sorted_unique_and_checked() -> None:
    assert parse_features("ib, a100x8,ib") == ("a100x8", "ib")
    with pytest.raises(InvalidValue, match="not a feature name"):
        parse_features("ib,has space")


def test_pty_endpoint_is_checked() -> None:
    key = "ab" * 16
    assert parse_pty({"address": "10.0.0.1:4000", "key": key}).address == "10.0.0.1:4000"
    for bad in ({"address": "host", "key": key}, {"address": "h:1", "key": "short"}, "x"):
        with pytest.raises(InvalidValue):
            parse_pty(bad)


def test_job_file_keys_round_trip_through_the_store() -> None:
    spec = build_spec(
        {
            "name": "t",
            "command": ["true"],
            "output": "o-%j",
            "error": "e-%j",
            "time_limit": "1h",
            "time_min": "10m",
            "constraint": "ib&a100x8",
            "pty": {"address": "127.0.0.1:5000", "key": "cd" * 16},
        }
    )
    assert (spec.stdout_path, spec.stderr_path, spec.time_min_s) == ("o-%j", "e-%j", 600.0)
    assert spec_from_json(spec_to_json(spec)) == spec


def test_time_min_needs_a_limit_at_least_as_long() -> None:
    with pytest.raises(SpecError, match="needs a time_limit"):
        build_spec({"name": "t", "command": ["true"], "time_min": "10m"})
    with pytest.raises(SpecError, match="longer than time_limit"):
        build_spec({"name": "t", "command": ["true"], "time_min": "2h", "time_limit": "1h"})


def test_a_terminal_is_for_one_bare_process() -> None:
    pty = {"address": "127.0.0.1:5000", "key": "cd" * 16}
    with pytest.raises(SpecError, match="replicas 1"):
        build_spec({"name": "t", "command": ["bash"], "pty": pty, "replicas": 2})
