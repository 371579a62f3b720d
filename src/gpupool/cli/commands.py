"""Wires the client command groups into the ``gpupool`` app (one call from ``main.py``).

Groups: :mod:`~gpupool.cli.jobs` (submit, run, queue, show, logs, history),
:mod:`~gpupool.cli.jobctl` (cancel, hold, release, requeue, update),
:mod:`~gpupool.cli.infra` (nodes, gpus, drain, resume), :mod:`~gpupool.cli.admin` (pools,
tenants, quota, priority-classes, users, tokens), :mod:`~gpupool.cli.top`,
:mod:`~gpupool.cli.report`, :mod:`~gpupool.cli.precheck` and :mod:`~gpupool.cli.login`.
"""

from __future__ import annotations

import typer

from gpupool.cli import admin, infra, jobctl, jobs, login, precheck, report, top


def install(app: typer.Typer) -> None:
    """Add every client command to ``app``."""
    jobs.install(app)
    jobctl.install(app)
    infra.install(app)
    admin.install(app)
    report.install(app)
    top.install(app)
    precheck.install(app)
    login.install(app)
