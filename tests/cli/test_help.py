"""Every client command's ``--help`` shows examples (the issue asks for them)."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from gpupool.cli.main import app, root_command

CLIENT_COMMANDS = [
    "submit",
    "run",
    "queue",
    "show",
    "logs",
    "cancel",
    "hold",
    "release",
    "requeue",
    "update",
    "priority",
    "history",
    "nodes",
    "gpus",
    "drain",
    "resume",
    "top",
    "report",
    "precheck",
    "login",
    "logout",
    "pools",
    "tenants",
    "quota",
    "priority-classes",
    "users",
    "tokens",
]


def _commands() -> dict[str, Any]:
    root = root_command()
    found: dict[str, Any] = {}
    for name in CLIENT_COMMANDS:
        command = root.commands[name]  # type: ignore[attr-defined]
        found[name] = command
        for sub, child in getattr(command, "commands", {}).items():
            found[f"{name} {sub}"] = child
    return found


def test_every_client_command_help_has_an_example() -> None:
    commands = _commands()
    assert len(commands) > len(CLIENT_COMMANDS)  # the admin groups' sub-commands are in
    missing = [path for path, c in commands.items() if "Example" not in (c.help or "")]
    assert missing == []
    wrong = [p for p, c in commands.items() if f"gpupool {p.split()[0]}" not in (c.help or "")]
    assert wrong == []


def test_submit_help_renders_its_examples_and_options() -> None:
    result = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    assert "gpupool submit -J train -g 0.5 --gpu-mem 10GiB -- python train.py" in result.output
    for option in ("--gpu-mem", "--gpu-type", "--checkpoint-signal", "--parsable", "--wrap"):
        assert option in result.output
