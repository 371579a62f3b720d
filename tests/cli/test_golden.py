"""Golden files pin the table layouts: ``tests/cli/golden/<name>.txt``.

Views are built by hand (no server), times are fixed and shown in UTC. After an intended
layout change, regenerate with ``GPUPOOL_UPDATE_GOLDEN=1 pytest tests/cli/test_golden.py``
and review the diff.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from gpupool.cli import render
from gpupool.cli.session import render_text
from gpupool.cli.top import Frame, frame_view
from gpupool.client.telemetry import ClusterTelemetry, DeviceSample, PoolSample
from gpupool.schemas.admin import PoolView, PriorityClassView, QuotaView, TenantView, UserView
from gpupool.schemas.jobs import FactorView, JobEventView, JobView
from gpupool.schemas.nodes import (
    DeviceSliceView,
    DeviceView,
    NodeView,
    UsageLineView,
    UsageReport,
)

GOLDEN = Path(__file__).parent / "golden"
T0 = 1_796_000_000.0  # 2026-11-30T00:53:20Z


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def job(**over: Any) -> JobView:
    base: dict[str, Any] = {
        "id": "a1b2c3d4e5f6",
        "name": "train-resnet",
        "tenant": "vision",
        "user": "alice",
        "pool": "default",
        "state": "RUNNING",
        "state_code": "R",
        "priority_class": "normal",
        "priority": 500,
        "version": 3,
        "replicas": 1,
        "gpu_milli": 500,
        "gpu_memory_mib": 10240,
        "gpu_types": [],
        "command": ["python", "train.py"],
        "script": None,
        "preemptible": False,
        "held": False,
        "submit_time": T0,
        "eligible_time": T0,
        "start_time": T0 + 30,
        "end_time": None,
        "restart_count": 0,
        "exit_code": None,
        "signal": None,
        "reason": None,
        "isolation": "soft",
        "time_limit_s": 7200.0,
        "nodes": ["gpu-01"],
    }
    base.update(over)
    return JobView(**base)


JOBS = [
    job(),
    job(
        id="0f9e8d7c6b5a",
        name="gang",
        user="bob",
        tenant="nlp",
        replicas=2,
        gpu_milli=1000,
        gpu_memory_mib=None,
        gpu_types=["A100", "H100"],
        state="PENDING",
        state_code="PD",
        start_time=None,
        nodes=[],
        priority_class="high",
        priority=900,
        pending_reason="Resources",
        estimated_start=T0 + 3600,
    ),
    job(
        id="ffeeddccbbaa",
        name="held",
        state="PENDING",
        state_code="PD",
        start_time=None,
        nodes=[],
        held=True,
    ),
]

DONE = [
    job(state="COMPLETED", state_code="CD", end_time=T0 + 930, exit_code=0),
    job(
        id="0f9e8d7c6b5a",
        name="oom",
        state="OUT_OF_MEMORY",
        state_code="OOM",
        end_time=T0 + 90,
        exit_code=137,
        signal="SIGKILL",
        restart_count=1,
    ),
]

DEVICES = [
    DeviceView(
        uuid="GPU-0",
        node="gpu-01",
        index=0,
        model="A100-80GB",
        memory_mib=81920,
        pool="default",
        health="healthy",
    ),
    DeviceView(
        uuid="GPU-1",
        node="gpu-01",
        index=1,
        model="A100-80GB",
        memory_mib=81920,
        pool="default",
        health="unhealthy",
    ),
]

SAMPLES = {
    "GPU-0": DeviceSample(
        uuid="GPU-0",
        node="gpu-01",
        model="A100-80GB",
        pool="default",
        memory_mib=81920,
        allocated_milli=750,
        allocated_memory_mib=30720,
        healthy=True,
        utilization_ratio=0.62,
        memory_used_mib=20480,
        temperature_c=61.0,
        power_w=250.0,
    ),
    "GPU-1": DeviceSample(
        uuid="GPU-1",
        node="gpu-01",
        model="A100-80GB",
        pool="default",
        memory_mib=81920,
        allocated_milli=0,
        allocated_memory_mib=0,
        healthy=False,
    ),
}


def line(key: dict[str, str], hours: float, util: float, cost: float, jobs: int) -> UsageLineView:
    return UsageLineView(
        key=key,
        gpu_hours=hours,
        milli_seconds=hours * 3600 * 1000,
        mib_seconds=hours * 3600 * 10240,
        busy_milli_seconds=hours * util * 3600 * 1000,
        utilization_ratio=util,
        idle_ratio=1 - util,
        cost=cost,
        jobs=jobs,
    )


REPORT = UsageReport(
    start=T0 - 7 * 86400,
    end=T0,
    group_by=["tenant", "gpu_model"],
    lines=[
        line({"tenant": "vision", "gpu_model": "A100-80GB"}, 120.5, 0.71, 301.25, 42),
        line({"tenant": "nlp", "gpu_model": "T4"}, 10.0, 0.2, 3.5, 3),
    ],
)


def check(name: str, renderable: RenderableType, width: int = 200) -> str:
    text = render_text(renderable, width=width)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("GPUPOOL_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}: run with GPUPOOL_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} layout changed (see {path})"
    return text


def test_queue_table_layout() -> None:
    check("queue", render.queue_table(JOBS, T0 + 600))


def test_history_table_layout() -> None:
    check("history", render.history_table(DONE, T0 + 1000))


def test_show_layout_with_factors_and_events() -> None:
    pending = JOBS[1].model_copy(
        update={
            "priority_factors": [
                FactorView(
                    name="priority", weight=0.3, value=1.0, contribution=0.3, meaning="class"
                ),
                FactorView(name="age", weight=0.2, value=0.25, contribution=0.05, meaning="waited"),
            ]
        }
    )
    events = [
        JobEventView(time=T0, source="PENDING", target="PENDING", version=1, reason="submitted")
    ]
    check("show", render.job_detail(pending, events, T0 + 600))


def test_show_layout_with_every_field_a_job_may_have() -> None:
    """``show`` of a job using the options lately added (sbatch's --array, --requeue,
    --constraint, -w/-x, --image, --pty, -o/--error, --time-min, --begin, --dependency,
    --mail-type/--mail-user): rich's page, and the hot path's plain text the same."""
    from gpupool.cli.jobtable import detail_text
    from gpupool.schemas.containers import ContainerWire

    full = JOBS[1].model_copy(
        update={
            "array_id": "0f9e8d7c6b00",
            "array_index": 3,
            "requeue": "on-failure",
            "max_restarts": 2,
            "constraint": "ib&a100x8",
            "nodelist": ["gpu-01", "gpu-02"],
            "exclude": ["gpu-09"],
            "container": ContainerWire(image="docker.io/library/python:3.12", workdir="/w"),
            "pty": True,
            "output": "out-%j.txt",
            "time_min_s": 1800.0,
            "eligible_time": T0 + 3600,
            "dependency": "afterok:a1b2c3d4e5f6",
            "mail_type": ["END", "FAIL"],
            "mail_user": "https://hooks.example.org/...",
        }
    )
    text = check("show-fields", render.job_detail(full, [], T0 + 600))
    assert detail_text(full, [], T0 + 600, 100) == text


def test_nodes_and_gpus_layout() -> None:
    node = NodeView(
        name="gpu-01",
        state="draining",
        address="10.0.0.1",
        cpu_milli=64000,
        memory_mib=524288,
        agent_version="0.1.0",
        isolation_modes=["exclusive", "soft"],
        last_heartbeat=T0 - 3,
        devices=DEVICES,
    )
    check("nodes", render.nodes_table([node], T0))
    check("gpus", render.gpus_table(DEVICES, SAMPLES))


def test_report_table_layout() -> None:
    check("report", render.usage_table(REPORT))


def test_admin_tables_layout() -> None:
    tenants = [
        TenantView(
            name="vision",
            fair_share=2.0,
            display_name="Vision lab",
            quotas=[
                QuotaView(tenant="vision", pool="default", guaranteed_milli=2000, limit_milli=4000)
            ],
            decayed_usage_milli_s=2000 * 3600 * 12.5,  # 2 GPUs for 12.5 h, decayed
            fair_share_factor=0.629961,
        ),
        TenantView(name="nlp", fair_share=1.0, display_name=""),
    ]
    check("tenants", render.tenants_table(tenants))
    check("pools", render.pools_table([PoolView(name="default", price_per_gpu_hour={"A100": 2.5})]))
    check("classes", render.priority_classes_table([PriorityClassView(name="high", value=900)]))
    check("users", render.users_table([UserView(name="alice", role="member", tenant="vision")]))


LONG = job(
    id="9a8b7c6d5e4f",
    name="finetune-llama-70b-with-a-very-long-name",
    user="maximilian",
    tenant="speech-recognition",
    state="PENDING",
    state_code="PD",
    start_time=None,
    nodes=[],
    gpu_milli=2000,
    gpu_memory_mib=81920,
    gpu_types=["A100-80GB"],
    pending_reason="QuotaExceeded: tenant speech-recognition is at its limit of 4 GPUs in default",
    estimated_start=T0 + 7200,
)


def _whole(text: str, jobs: list[JobView], now: float) -> None:
    """Every job's id, state, time and slice are on its line, whole; no line is too wide."""
    for j in jobs:
        line = next(x for x in text.splitlines() if x.startswith(j.id))
        for value in (j.state_code, render.elapsed(j, now), render.gpu_slice(j)):
            assert f" {value} " in f" {line} ", (value, line)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_queue_fits_a_terminal_without_cutting_id_state_time_or_slice(width: int) -> None:
    jobs = [*JOBS, LONG]
    text = check(f"queue-{width}", render.queue_table(jobs, T0 + 600), width)
    assert max(len(x) for x in text.splitlines()) <= width
    _whole(text, jobs, T0 + 600)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_gpus_fit_a_terminal_keeping_node_and_index(width: int) -> None:
    text = check(f"gpus-{width}", render.gpus_table(DEVICES, SAMPLES), width)
    assert max(len(x) for x in text.splitlines()) <= width
    rows = [x.split() for x in text.splitlines()[2:]]
    assert [r[:2] for r in rows] == [["gpu-01", "0"], ["gpu-01", "1"]]


def _top_frame() -> Frame:
    held = DEVICES[0].model_copy(
        update={
            "slices": [
                DeviceSliceView(
                    job_id="a1b2c3d4e5f6", tenant="vision", milli=500, memory_mib=10240
                ),
                DeviceSliceView(job_id=None, tenant=None, milli=250, memory_mib=20480),
            ]
        }
    )
    return Frame(
        devices=[held, DEVICES[1]],
        telemetry=ClusterTelemetry(
            devices=list(SAMPLES.values()),
            pools=[PoolSample("default", 0.1875, {"nlp": 1, "speech-recognition": 1})],
            jobs_by_state={},
        ),
        running=[JOBS[0]],
        now=T0 + 600,
        pending=[JOBS[1], JOBS[2], LONG],
    )


@pytest.mark.parametrize("width", [80, 100, 120])
def test_top_fits_a_terminal_and_lists_the_queue(width: int) -> None:
    frame = _top_frame()
    text = check(f"top-{width}", frame_view(frame, "util"), width)
    assert max(len(x) for x in text.splitlines()) <= width
    _whole(text, [JOBS[0]], T0 + 600)
    for j in frame.pending:  # the queue is listed, id and slice whole
        line = next(x for x in text.splitlines() if x.startswith(j.id))
        assert f" {render.gpu_slice(j)} " in line


def test_top_colours_load_and_temperature() -> None:
    hot = dataclasses.replace(SAMPLES["GPU-0"], temperature_c=90.0)
    frame = _top_frame()
    frame = Frame(
        frame.devices,
        ClusterTelemetry(devices=[hot, SAMPLES["GPU-1"]], pools=[], jobs_by_state={}),
        frame.running,
        frame.now,
        frame.pending,
    )
    con = Console(width=120, color_system="standard", force_terminal=True, highlight=False)
    with con.capture() as cap:
        con.print(frame_view(frame))
    out = cap.get()
    assert re.search(r"\x1b\[31m *90C", out)  # red: 90 C is hot
    assert "\x1b[33m[||||||    ]  62%" in out  # yellow: 62 % is a moderate load
    assert "\x1b[1;31munhealthy" in out


def test_top_frame_shows_a_disconnected_server_over_the_last_frame() -> None:
    text = render_text(
        frame_view(_top_frame(), "node", "disconnected from http://x:8470, retrying every 2s"),
        width=100,
    )
    assert text.splitlines()[1] == "disconnected from http://x:8470, retrying every 2s"
    assert "a1b2c3d4e5f6" in text


def test_top_frame_layout() -> None:
    held = DEVICES[0].model_copy(
        update={
            "slices": [
                DeviceSliceView(
                    job_id="a1b2c3d4e5f6", tenant="vision", milli=500, memory_mib=10240
                ),
                DeviceSliceView(job_id=None, tenant=None, milli=250, memory_mib=20480),
            ]
        }
    )
    frame = Frame(
        devices=[held, DEVICES[1]],
        telemetry=ClusterTelemetry(
            devices=list(SAMPLES.values()),
            pools=[PoolSample("default", 0.1875, {"nlp": 1})],
            jobs_by_state={},
        ),
        running=[JOBS[0]],
        now=T0 + 600,
    )
    check("top", frame_view(frame, "util"))
