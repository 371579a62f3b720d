"""``gpupool version``, ``queue`` and ``submit`` start without the server, store or simulator.

Every CLI command used to import the whole server (FastAPI, SQLAlchemy, the store), the
simulator and the IPython hooks before doing anything (about 2.4 s of CPU on the reporter's
machine). Commands are now loaded lazily (:mod:`gpupool.cli.commands`); these tests run real
commands in a fresh interpreter and look at what it imported. The CPU figures are in
``benchmarks/bench_cli_startup.py`` (not timed here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def _imports_of(args: list[str], env: dict[str, str]) -> tuple[int, str, list[str]]:
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
    heavy = [m for m in found["modules"] if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    return int(found["code"] or 0), done.stdout + err, heavy


@pytest.fixture
def user_env(pool_env: LocalPool) -> dict[str, str]:
    env = {**os.environ, "GPUPOOL_TOKEN": pool_env.admin_token}
    env.pop("PYTHONPATH", None)
    return env


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
