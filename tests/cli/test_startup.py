"""``gpupool version``, ``queue`` and ``submit`` start without the server, store or simulator;
the hot verbs (``submit``, ``queue``, ``cancel``, ``show``, ``version``) without typer, click,
httpx, pydantic, rich or yaml either.

Every CLI command used to import the whole server (FastAPI, SQLAlchemy, the store), the
simulator and the IPython hooks before doing anything (about 2.4 s of CPU on the reporter's
machine). Commands are now loaded lazily (:mod:`gpupool.cli.commands`), and the hot verbs run
on the fast path (:mod:`gpupool.cli.hot`); these tests run real commands in a fresh
interpreter and look at what it imported. The CPU figures are in
``benchmarks/bench_cli_startup.py`` (not timed here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from gpupool.cli.commands import COMMANDS, click
from gpupool.cli.main import root_command
from gpupool.client import Client
from tests.cli.conftest import LocalPool

#: What a client command must not import: the server, the store, the control plane, the
#: simulator, the agent, notebooks.
HEAVY = (
    "sqlalchemy",
    "fastapi",
    "starlette",
    "uvicorn",
    "alembic",
    "IPython",
    "gpupool.api",
    "gpupool.store",
    "gpupool.control",
    "gpupool.sim",
    "gpupool.agent",
    "gpupool.scheduling",
)

#: What a hot verb must not import either: the argument parser, the SDK's HTTP and models, the
#: tables, the job-file reader (issue 27: a submit as cheap as sbatch).
HOT_HEAVY = ("typer", "click", "httpx", "pydantic", "pydantic_core", "rich", "yaml", "anyio")

SRC = Path(__file__).resolve().parents[2] / "src"

RUN_AND_LIST_MODULES = """
import json, sys
sys.argv = ["gpupool", *json.loads(sys.argv[1])]
from gpupool.cli.main import main
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
sys.stdout.flush()
sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _imports_of(
    args: list[str], env: dict[str, str], heavy_names: tuple[str, ...] = HEAVY
) -> tuple[int, str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MODULES, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    err, _, tail = done.stderr.rpartition("\nMODULES ")
    assert tail, done.stderr
    found = json.loads(tail)
    heavy = [
        m
        for m in found["modules"]
        if m.split(".")[0] in heavy_names or m.startswith(tuple(f"{h}." for h in heavy_names))
    ]
    return int(found["code"] or 0), done.stdout + err, heavy


@pytest.fixture
def user_env(pool_env: LocalPool) -> dict[str, str]:
    # this tree's code, not whatever gpupool is installed
    return {**os.environ, "GPUPOOL_TOKEN": pool_env.admin_token, "PYTHONPATH": str(SRC)}


@pytest.mark.parametrize(
    "args",
    [
        ["version"],
        ["queue"],
        ["submit", "-J", "startup-probe", "-g", "0.1", "--hold", "--", "true"],
        ["queue", "--help"],
    ],
    ids=["version", "queue", "submit", "queue-help"],
)
def test_gpupool_version_queue_and_submit_import_no_server_store_or_simulator(
    user_env: dict[str, str], args: list[str]
) -> None:
    code, output, heavy = _imports_of(args, user_env)
    assert code == 0, output
    assert heavy == [], f"gpupool {' '.join(args)} imported {heavy}"
    if args[0] == "submit":  # leave the session's pool as it was
        with Client(user_env["GPUPOOL_SERVER"], user_env["GPUPOOL_TOKEN"]) as gp:
            for job in gp.list(name="startup-probe", state=["PENDING"]):
                gp.cancel(job.id)


def test_the_command_table_names_every_command_of_every_module() -> None:
    by_module: dict[str, set[str]] = {}
    for module in dict.fromkeys(COMMANDS.values()):
        app = typer.Typer()
        __import__(module, fromlist=["install"]).install(app)
        by_module[module] = set(typer.main.get_group(app).commands)
    table = {m: {n for n, mod in COMMANDS.items() if mod == m} for m in by_module}
    assert by_module == table


def test_gpupool_help_lists_every_command_in_the_table() -> None:
    root = root_command()
    listed = root.list_commands(click.Context(root))
    assert set(COMMANDS) | {"version"} == set(listed)


def _held_job(env: dict[str, str], name: str) -> str:
    with Client(env["GPUPOOL_SERVER"], env["GPUPOOL_TOKEN"]) as gp:
        return gp.submit(name=name, command=["true"], gpus=0.1, hold=True).id


@pytest.mark.parametrize("verb", ["version", "submit", "queue", "cancel", "show"])
def test_hot_verbs_import_no_parser_sdk_models_or_tables(
    user_env: dict[str, str], verb: str
) -> None:
    job = _held_job(user_env, "hot-probe")
    args = {
        "version": ["version"],
        "submit": ["submit", "-J", "hot-probe", "-g", "0.1", "--hold", "--", "true"],
        "queue": ["queue", "-t", "PD"],
        "cancel": ["cancel", job],
        "show": ["show", job],
    }[verb]
    code, output, heavy = _imports_of(args, user_env, HEAVY + HOT_HEAVY)
    assert code == 0, output
    assert heavy == [], f"gpupool {' '.join(args)} imported {heavy}"
    if verb == "show":
        assert f"JobId          {job}" in output
    if verb == "cancel":
        assert f"job {job} (hot-probe): CANCELLED" in output
    with Client(user_env["GPUPOOL_SERVER"], user_env["GPUPOOL_TOKEN"]) as gp:
        gp.bulk("cancel", name="hot-probe")


def test_a_hot_verb_s_help_and_errors_still_come_from_typer(user_env: dict[str, str]) -> None:
    code, output, _ = _imports_of(["queue", "--bogus"], user_env)
    assert code == 2
    assert "No such option: --bogus" in output
    code, output, _ = _imports_of(["submit", "--help"], user_env)
    assert code == 0
    assert "--gpu-mem" in output


def _run(launch: str, args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-c", launch, *args],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


FAST = "import sys; from gpupool.cli.main import main; sys.argv[0] = 'gpupool'; main()"
TYPER = "import sys; from gpupool.cli.app import app; sys.argv[0] = 'gpupool'; app()"


def test_the_fast_path_and_typer_print_the_same(user_env: dict[str, str]) -> None:
    job = _held_job(user_env, "same-probe")
    cases = [
        ["queue", "-t", "PD", "-u", "admin"],
        ["show", job],
        ["show", job, "--json"],
        ["cancel", "no-such-job"],
        ["cancel"],
        ["submit", "-g", "0.5x", "--", "true"],
        ["submit", "--wrap", "x", "--", "true"],
        ["show", "no-such-job"],
    ]
    try:
        for args in cases:
            fast = _run(FAST, args, user_env)
            slow = _run(TYPER, args, user_env)
            if args[0] == "show" and "--json" not in args:  # "(00:00:01 ago)" may tick over
                fast = (fast[0], fast[1].split("Submitted")[0], fast[2])
                slow = (slow[0], slow[1].split("Submitted")[0], slow[2])
            if "--json" in args:  # the age factor grows between the two calls
                fast_json, slow_json = json.loads(fast[1]), json.loads(slow[1])
                for answer in (fast_json, slow_json):
                    answer["job"].pop("priority_factors")
                    answer["job"].pop("pending_reason")
                assert fast_json == slow_json
                fast, slow = fast[::2], slow[::2]
            assert fast == slow, args
    finally:
        with Client(user_env["GPUPOOL_SERVER"], user_env["GPUPOOL_TOKEN"]) as gp:
            gp.bulk("cancel", name="same-probe")
