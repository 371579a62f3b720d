"""The MLflow run context provider: tags from a job's environment, and MLflow finding it."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from gpupool.client.mlflow_hook import GpupoolRunContext, job_tags

JOB_ENV = {
    "GPUPOOL_JOB_ID": "4f2a9c1e0b7d",
    "GPUPOOL_JOB_NAME": "train",
    "GPUPOOL_NODE": "gpu-07",
    "GPUPOOL_RESTART_COUNT": "1",
    "GPUPOOL_GPU_COUNT": "1",
    "GPUPOOL_GPU_MILLI": "500",
    "GPUPOOL_GPU_MEMORY_MIB": "10240",
    "GPUPOOL_ISOLATION": "mps",
    "CUDA_VISIBLE_DEVICES": "GPU-1111",
    "HOME": "/home/ada",
}


def test_a_job_environment_gives_one_tag_per_variable_and_the_slice() -> None:
    assert job_tags(JOB_ENV) == {
        "gpupool.job_id": "4f2a9c1e0b7d",
        "gpupool.job_name": "train",
        "gpupool.node": "gpu-07",
        "gpupool.restart_count": "1",
        "gpupool.gpu_count": "1",
        "gpupool.gpu_milli": "500",
        "gpupool.gpu_memory_mib": "10240",
        "gpupool.isolation": "mps",
        "gpupool.devices": "GPU-1111",
        "gpupool.slice": "0.5",
    }


def test_the_slice_tag_reads_like_the_gpu_slice_column() -> None:
    whole = {**JOB_ENV, "GPUPOOL_GPU_COUNT": "2", "GPUPOOL_GPU_MILLI": "1000"}
    shared = {**JOB_ENV, "GPUPOOL_GPU_COUNT": "2", "GPUPOOL_GPU_MILLI": "250"}
    none = {**JOB_ENV, "GPUPOOL_GPU_COUNT": "0", "GPUPOOL_GPU_MILLI": "0"}
    assert job_tags(whole)["gpupool.slice"] == "2"
    assert job_tags(shared)["gpupool.slice"] == "2x0.25"
    assert "gpupool.slice" not in job_tags(none)


def test_outside_a_job_there_are_no_tags() -> None:
    assert job_tags({"HOME": "/home/ada", "CUDA_VISIBLE_DEVICES": "0"}) == {}
    assert job_tags({"GPUPOOL_JOB_ID": ""}) == {}


def test_the_provider_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPOOL_JOB_ID", raising=False)
    assert GpupoolRunContext().in_context() is False
    monkeypatch.setenv("GPUPOOL_JOB_ID", "abc")
    assert GpupoolRunContext().in_context() is True
    assert GpupoolRunContext().tags()["gpupool.job_id"] == "abc"


def test_mlflow_finds_the_provider_through_its_entry_point() -> None:
    found = entry_points(group="mlflow.run_context_provider")
    assert [e.load() for e in found if e.name == "gpupool"] == [GpupoolRunContext]
