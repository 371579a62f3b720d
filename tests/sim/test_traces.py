"""Trace adapters: what they read, what they leave out, and refusals that point at the cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.domain.errors import InvalidValue
from gpupool.sim.alibaba import TraceFormatError
from gpupool.sim.trace_alibaba import alibaba_cluster, alibaba_workload, tenant_of
from gpupool.sim.trace_philly import philly_cluster, philly_workload, read_runtimes
from gpupool.sim.trace_synthetic import SyntheticSpec, synthetic_workload
from gpupool.sim.traces import TraceOptions, load_cluster, load_trace, parse_synthetic

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_alibaba_pods_become_jobs_with_arrival_work_priority_and_a_stable_tenant(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        HEADER
        + "p0,12000,16384,1,460,,LS,Running,100,700,150\n"
        + "p1,8000,1024,2,1000,V100M16|V100M32,BE,Succeeded,200,260,210\n"
        + "p2,8000,1024,1,1000,,LS,Pending,300,400,\n",
    )
    wl = alibaba_workload(path, tenants=3, seed=7, time_scale=2)
    assert [j.id for j in wl.jobs] == ["p0", "p1"]
    p0, p1 = wl.jobs
    assert (p0.submit_time, p0.work_s, p0.gpu_milli) == (50, 550, 460)
    assert (p0.priority_class, p0.preemptible) == ("high", False)
    assert (p1.gpu_milli, p1.gpu_types, p1.priority_class, p1.preemptible) == (
        2000,
        ("V100M16", "V100M32"),
        "low",
        True,
    )
    assert wl.skipped["never ran"] == 1
    assert (
        p0.tenant
        == tenant_of("p0", 3, 7)
        == alibaba_workload(path, tenants=3, seed=7).jobs[0].tenant
    )


def test_alibaba_pod_list_without_times_is_refused_at_the_header(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,500\n")
    with pytest.raises(TraceFormatError) as info:
        alibaba_workload(path)
    assert (info.value.path, info.value.line, info.value.column) == (path, 1, "creation_time")
    assert str(path) in str(info.value)


def test_alibaba_deletion_before_scheduling_is_refused_with_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        HEADER + "p0,1,1,1,500,,LS,Running,0,10,5\n\np1,1,1,1,500,,LS,Running,0,3,5\n",
    )
    with pytest.raises(TraceFormatError) as info:
        alibaba_workload(path)
    assert (info.value.line, info.value.column) == (4, "deletion_time")


def test_alibaba_bad_time_value_is_refused_with_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", HEADER + "p0,1,1,1,500,,LS,Running,soon,10,5\n")
    with pytest.raises(TraceFormatError) as info:
        alibaba_workload(path)
    assert (info.value.line, info.value.column) == (2, "creation_time")


def test_alibaba_node_list_becomes_devices_per_gpu(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n")
    cluster = alibaba_cluster(path)
    assert [d.uuid for d in cluster.devices] == ["n0/gpu0", "n0/gpu1"]
    assert cluster.nodes[0].cpu_milli == 64000
    assert cluster.capacity_milli == 2000


PHILLY_LINE = (
    "ResNet-18 (batch size 64)\tcd %s && python3 main.py\t--num_steps\t1\t{steps}\t{at}\t{gpus}\n"
)


def philly_files(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "vc1.trace").write_text(
        PHILLY_LINE.format(steps=10, at="0.0", gpus=1)
        + PHILLY_LINE.format(steps=10, at="5.5", gpus=16),
        encoding="utf-8",
    )
    (folder / "vc2.trace").write_text(
        PHILLY_LINE.format(steps=10, at="3", gpus=4), encoding="utf-8"
    )
    runtimes = write(tmp_path, "runtime.csv", "runtime\n10.0\n20.0\n30.0\n")
    return folder, runtimes


def test_philly_files_are_tenants_with_sampled_run_times_and_gangs(tmp_path: Path) -> None:
    folder, runtimes = philly_files(tmp_path)
    wl = philly_workload(folder, runtimes, seed=3)
    assert [(j.id, j.tenant, j.submit_time) for j in wl.jobs] == [
        ("vc1-00001", "vc1", 0.0),
        ("vc2-00001", "vc2", 3.0),
        ("vc1-00002", "vc1", 5.5),
    ]
    big = wl.jobs[2]
    assert (big.replicas, big.gpu_milli) == (2, 8000)
    assert {j.work_s for j in wl.jobs} <= {10.0, 20.0, 30.0}
    assert philly_workload(folder, runtimes, seed=3) == wl


def test_philly_share_mix_fractionalises_only_one_gpu_jobs(tmp_path: Path) -> None:
    folder, runtimes = philly_files(tmp_path)
    wl = philly_workload(folder, runtimes, seed=0, share_mix=[250])
    assert [j.gpu_milli for j in wl.jobs] == [250, 4000, 8000]


def test_philly_bad_field_is_refused_with_file_line_and_column(tmp_path: Path) -> None:
    folder, runtimes = philly_files(tmp_path)
    bad = folder / "vc3.trace"
    bad.write_text(
        PHILLY_LINE.format(steps=1, at=0, gpus=1) + PHILLY_LINE.format(steps=1, at=1, gpus="x"),
        encoding="utf-8",
    )
    with pytest.raises(TraceFormatError) as info:
        philly_workload(folder, runtimes)
    assert (info.value.path, info.value.line, info.value.column) == (bad, 2, "scale_factor")


def test_philly_line_with_missing_fields_is_refused(tmp_path: Path) -> None:
    folder, runtimes = philly_files(tmp_path)
    bad = folder / "vc3.trace"
    bad.write_text("ResNet\tcmd\t1\n", encoding="utf-8")
    with pytest.raises(TraceFormatError) as info:
        philly_workload(folder, runtimes)
    assert info.value.line == 1
    assert "expected 7" in str(info.value)


def test_runtime_file_with_a_bad_value_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "runtime.csv", "runtime\n10\n-3\n")
    with pytest.raises(TraceFormatError) as info:
        read_runtimes(path)
    assert (info.value.line, info.value.column) == (3, "runtime")


def test_gavel_cluster_spec_becomes_machines_of_eight(tmp_path: Path) -> None:
    spec = write(tmp_path, "spec.json", '{"philly": ["20:0:0"]}')
    cluster = philly_cluster(spec)
    assert [len([d for d in cluster.devices if d.node == n.name]) for n in cluster.nodes] == [
        8,
        8,
        4,
    ]
    assert {d.model for d in cluster.devices} == {"V100"}


def test_synthetic_workload_is_reproducible_and_gives_every_tenant_a_quota() -> None:
    spec = SyntheticSpec(jobs=200, gpus=32, tenants=3, seed=5)
    wl = synthetic_workload(spec)
    assert wl == synthetic_workload(spec)
    assert wl != synthetic_workload(SyntheticSpec(jobs=200, gpus=32, tenants=3, seed=6))
    assert len(wl.jobs) == 200
    assert {q.tenant for q in wl.quotas} == {"team-00", "team-01", "team-02"}
    assert sum(q.guaranteed_milli for q in wl.quotas) <= 32000
    guaranteed = {q.tenant: q.guaranteed_milli for q in wl.quotas}
    # A job that only fits by borrowing must be preemptible, or it could never start.
    assert all(j.preemptible for j in wl.jobs if j.total_gpu_milli > guaranteed[j.tenant])


def test_trace_and_cluster_texts_are_recognised_or_refused_with_a_hint(tmp_path: Path) -> None:
    wl, cluster = load_trace("synthetic:jobs=20,gpus=16", TraceOptions(seed=1))
    assert len(wl.jobs) == 20
    assert cluster is not None
    assert cluster.gpu_count == 16
    assert load_cluster("12xV100", gpus_per_node=8).gpu_count == 12
    with pytest.raises(InvalidValue, match="cannot tell what trace"):
        load_trace("trace.parquet", TraceOptions())
    with pytest.raises(InvalidValue, match="not known"):
        parse_synthetic("jobz=3")
    with pytest.raises(InvalidValue, match="is not a whole number"):
        parse_synthetic("jobs=many")
    with pytest.raises(InvalidValue, match="--runtimes"):
        load_trace(str(tmp_path), TraceOptions())


def test_real_philly_and_alibaba_traces_read(shared_data: Path, alibaba_csv: Path) -> None:
    wl = philly_workload(
        shared_data / "gavel-philly-derived" / "seed=0",
        shared_data / "philly" / "philly_runtime.csv",
    )
    assert len(wl.jobs) == 15264
    assert len(wl.tenants) == 15
    pods = alibaba_workload(alibaba_csv / "openb_pod_list_default.csv")
    assert len(pods.jobs) + pods.skipped["never ran"] == 8152


def test_philly_share_mix_changes_shares_only_not_run_times(tmp_path: Path) -> None:
    folder, runtimes = philly_files(tmp_path)
    plain = philly_workload(folder, runtimes, seed=4)
    shared = philly_workload(folder, runtimes, seed=4, share_mix=[100, 300])
    assert [j.work_s for j in plain.jobs] == [j.work_s for j in shared.jobs]
