"""``--export`` as sbatch reads it: ALL, NONE, or names and NAME=value, after ALL or NONE."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.cli.jobs import export_env

SHELL = {
    "FOO": "bar",
    "PATH": "/venv/bin:/usr/bin",
    "VIRTUAL_ENV": "/venv",
    "CUDA_VISIBLE_DEVICES": "3",
    "GPUPOOL_TOKEN": "gp_secret",
    "BASH_FUNC_x%%": "() { :; }",
}


def test_all_takes_every_name_but_reserved_ones_and_gpupools_own_venv() -> None:
    got = export_env("ALL", SHELL, Path("/venv"))
    assert got == {"FOO": "bar", "PATH": "/usr/bin"}


def test_none_and_lists_take_only_what_is_named() -> None:
    assert export_env("NONE", SHELL) == {}
    assert export_env("FOO,EXTRA=a=b", SHELL) == {"FOO": "bar", "EXTRA": "a=b"}
    assert export_env("NONE,FOO", SHELL) == {"FOO": "bar"}
    assert export_env("ALL,FOO=override", SHELL, Path("/venv"))["FOO"] == "override"


@pytest.mark.parametrize(
    ("export", "fragment"),
    [
        ("GPUPOOL_TOKEN", "is reserved (GPUPOOL_* is set by gpupool for the job)"),
        ("ALL,CUDA_VISIBLE_DEVICES=0", "leave it out of --export"),
        ("MISSING", "it is not set in your environment: set it, or give --export MISSING=VALUE"),
        ("1BAD=x", "is not valid"),
        ("FOO,", "has an empty name"),
    ],
)
def test_a_reserved_unset_or_bad_name_is_refused_with_what_to_do(
    export: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:  # the hot path's exit (gpupool.cli.out.fail)
        export_env(export, SHELL)
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --export ")
    assert fragment in error
