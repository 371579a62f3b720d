"""Alibaba v2023 trace readers: good files, optional columns, refusals that point at the cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.alibaba import PodRecord, TraceFormatError, read_nodes, read_pods

FULL_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_full_pod_list_reads_every_column(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        FULL_HEADER
        + "p0,12000,16384,1,460,,LS,Running,0,100,0\n"
        + "p1,8000,1024,2,1000,V100M16|V100M32,BE,Pending,5,9,\n",
    )
    pods = read_pods(path)
    assert pods[0] == PodRecord("p0", 12000, 16384, 1, 460, None, "LS", "Running", 0, 100, 0)
    assert pods[0].is_sharing
    assert pods[1].gpu_spec == ("V100M16", "V100M32")
    assert pods[1].scheduled_time is None
    assert pods[1].total_gpu_milli == 2000


def test_minimal_pod_list_leaves_optional_fields_none(tmp_path: Path) -> None:
    path = write(
        tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,100,10,0,0\n"
    )
    (pod,) = read_pods(path)
    assert (pod.gpu_spec, pod.qos, pod.pod_phase, pod.creation_time) == (None, None, None, None)
    assert pod.num_gpu == 0
    assert not pod.is_sharing


def test_missing_needed_column_names_it(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n")
    with pytest.raises(TraceFormatError) as err:
        read_pods(path)
    assert (err.value.column, err.value.line) == ("gpu_milli", 1)
    assert str(path) in str(err.value)


def test_bad_value_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\nq,lots,1,0,0\n",
    )
    with pytest.raises(TraceFormatError) as err:
        read_pods(path)
    assert (err.value.line, err.value.column) == (3, "cpu_milli")
    assert f"{path}:3: column 'cpu_milli'" in str(err.value)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("p,1,1,2,500", "gpu_milli"),  # a share on a multi-GPU pod
        ("p,1,1,1,1500", "gpu_milli"),  # more than one GPU per GPU
        ("p,1,1,0,300", "gpu_milli"),  # GPU share without GPUs
        ("p,1,1,-1,0", "num_gpu"),
        ("p,1,1,1,0.5", "gpu_milli"),
    ],
)
def test_inconsistent_gpu_request_is_refused(tmp_path: Path, row: str, column: str) -> None:
    path = write(tmp_path, "pods.csv", f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n{row}\n")
    with pytest.raises(TraceFormatError) as err:
        read_pods(path)
    assert (err.value.line, err.value.column) == (2, column)


def test_node_list_reads_and_refuses_gpus_without_model(tmp_path: Path) -> None:
    good = write(
        tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\na,64000,262144,2,P100\nb,1,1,0,\n"
    )
    nodes = read_nodes(good)
    assert [(n.name, n.gpu_count, n.model) for n in nodes] == [("a", 2, "P100"), ("b", 0, None)]
    bad = write(tmp_path, "m.csv", "sn,cpu_milli,memory_mib,gpu,model\na,64000,262144,2,\n")
    with pytest.raises(TraceFormatError) as err:
        read_nodes(bad)
    assert (err.value.line, err.value.column) == (2, "model")


def test_missing_file_is_refused_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot be read"):
        read_nodes(tmp_path / "absent.csv")


def test_real_trace_files_read(alibaba_csv: Path) -> None:
    nodes = read_nodes(alibaba_csv / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    pods = read_pods(alibaba_csv / "openb_pod_list_gpuspec33.csv")
    assert len(pods) == 8152
    assert any(p.gpu_spec is not None and len(p.gpu_spec) > 1 for p in pods)
