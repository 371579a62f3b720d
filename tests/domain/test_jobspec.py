"""Job files and CLI-style options build the same validated JobSpec."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.domain.errors import InvalidValue, SpecError
from gpupool.domain.jobs import (
    RESERVED_ENV,
    IsolationMode,
    RequeuePolicy,
    reserved_env_rule,
    validate_env_name,
)
from gpupool.domain.jobspec import build_spec, nest_options, parse_job_yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def problems_of(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job_yaml(text, source="job.yaml")
    return [str(p) for p in info.value.problems]


def test_example_job_file_loads() -> None:
    spec = parse_job_yaml((EXAMPLES / "train.yaml").read_text(), source="train.yaml")
    assert spec.name == "train-resnet"
    assert spec.command == ("python", "train.py", "--epochs", "10")
    assert spec.resources.gpu_milli == 500
    assert spec.resources.gpu_memory_mib == 20 * 1024
    assert spec.resources.gpu_types == ("A100", "H100")
    assert spec.resources.cpu_milli == 4000
    assert spec.resources.host_memory_mib == 32 * 1024
    assert spec.tenant == "vision"
    assert spec.preemptible is True
    assert spec.requeue is RequeuePolicy.ON_PREEMPTION
    assert spec.time_limit_s == 4 * 3600
    assert spec.expected_duration_s == 2 * 3600
    assert spec.checkpoint_signal == "SIGUSR1"
    assert spec.grace_period_s == 60
    assert spec.env == {"WANDB_MODE": "offline"}


def test_gang_example_loads_as_a_gang_with_a_script() -> None:
    spec = parse_job_yaml((EXAMPLES / "gang.yaml").read_text(), source="gang.yaml")
    assert spec.is_gang
    assert spec.replicas == 2
    assert spec.uses_shell
    assert spec.command == ()
    assert spec.total_gpu_milli == 4000
    assert spec.isolation is IsolationMode.EXCLUSIVE
    assert spec.time_limit_s == 86400


def test_broken_example_names_each_line_and_the_fix() -> None:
    text = (EXAMPLES / "broken.yaml").read_text()
    found = problems_of(text)
    assert "job.yaml:6: resources.gpu_mem: unknown key: did you mean 'resources.gpu_memory'?" in (
        found
    )
    assert any(
        p.startswith("job.yaml:8: env.CUDA_VISIBLE_DEVICES:") and "reserved" in p for p in found
    )
    assert len(found) == 2


def test_unknown_top_level_key_suggests_the_nested_one() -> None:
    found = problems_of("name: a\ncommand: [x]\ngpus: 1\n")
    assert found == ["job.yaml:3: gpus: unknown key: did you mean 'resources.gpus'?"]


def test_duplicate_key_is_an_error_with_its_line() -> None:
    found = problems_of("name: a\ncommand: [x]\nname: b\n")
    assert found == ["job.yaml:3: name: appears twice: keep one of them"]


def test_invalid_yaml_names_the_line() -> None:
    found = problems_of("name: a\ncommand: [x\nresources: {}\n")
    assert found[0].startswith("job.yaml:")
    assert "not valid YAML" in found[0]


def test_non_mapping_file_is_refused() -> None:
    assert "must be a mapping" in problems_of("- a\n- b\n")[0]


def test_missing_name_and_command() -> None:
    found = problems_of("resources:\n  gpus: 1\n")
    assert any("name: missing" in p for p in found)
    assert any("command: missing" in p for p in found)


def test_command_must_be_a_list_and_script_is_the_shell_form() -> None:
    found = problems_of("name: a\ncommand: python train.py\n")
    assert "use 'script' instead" in found[0]
    assert "job.yaml:2" in found[0]


def test_command_and_script_together_are_refused() -> None:
    found = problems_of("name: a\ncommand: [x]\nscript: echo hi\n")
    assert any("not both" in p for p in found)


def test_all_problems_are_reported_together() -> None:
    text = (
        "name: a\ncommand: [x]\nreplicas: 0\nresources:\n  gpus: 1.5\n  gpu_memory: 10 gigs\n"
        "isolation: vm\ntime_limit: soon\n"
    )
    found = problems_of(text)
    keys = sorted(p.split(": ")[1] for p in found)
    assert keys == [
        "isolation",
        "replicas",
        "resources.gpu_memory",
        "resources.gpus",
        "time_limit",
    ]
    assert any("job.yaml:6: resources.gpu_memory:" in p and "10GiB" in p for p in found)


def test_exclusive_isolation_needs_whole_gpus() -> None:
    found = problems_of("name: a\ncommand: [x]\nresources: {gpus: 0.5}\nisolation: exclusive\n")
    assert "exclusive needs whole GPUs" in found[0]


def test_gpu_memory_without_gpus_is_refused() -> None:
    found = problems_of("name: a\ncommand: [x]\nresources: {gpu_memory: 4GiB}\n")
    assert "resources.gpus is 0" in found[0]


def test_expected_longer_than_limit_is_refused() -> None:
    found = problems_of("name: a\ncommand: [x]\ntime_limit: 1h\nexpected_duration: 2h\n")
    assert "longer than time_limit" in found[0]


def test_bad_names_for_tenant_pool_priority() -> None:
    found = problems_of("name: a\ncommand: [x]\ntenant: Vision Team\npool: _x\npriority: HIGH!\n")
    assert len(found) == 3
    assert all("lowercase" in p for p in found)


def test_requeue_accepts_booleans_and_names() -> None:
    base = {"name": "a", "command": ["x"]}
    assert build_spec({**base, "requeue": False}).requeue is RequeuePolicy.NEVER
    assert build_spec({**base, "requeue": True}).requeue is RequeuePolicy.ON_PREEMPTION
    assert build_spec({**base, "requeue": "on_failure"}).requeue is RequeuePolicy.ON_FAILURE
    with pytest.raises(SpecError, match="not a requeue policy"):
        build_spec({**base, "requeue": "sometimes"})


def test_signal_names_are_normalised() -> None:
    spec = build_spec({"name": "a", "command": ["x"], "checkpoint": {"signal": "usr2"}})
    assert spec.checkpoint_signal == "SIGUSR2"
    with pytest.raises(SpecError, match="not a checkpoint signal"):
        build_spec({"name": "a", "command": ["x"], "checkpoint": {"signal": "SIGSEGV"}})


def test_cli_options_use_the_same_validation() -> None:
    options = {
        "name": "sweep",
        "command": ["python", "sweep.py"],
        "resources.gpus": "50%",
        "resources.gpu_memory": "10G",
        "resources.gpu_types": "A100|H100",
        "time_limit": "90",
        "preemptible": "yes",
        "pool": None,
    }
    spec = build_spec(nest_options(options), source="command line")
    assert spec.resources.gpu_milli == 500
    assert spec.resources.gpu_memory_mib == 10240
    assert spec.resources.gpu_types == ("A100", "H100")
    assert spec.time_limit_s == 5400
    assert spec.preemptible
    assert spec.pool == "default"
    with pytest.raises(SpecError) as info:
        build_spec(nest_options({**options, "resources.gpus": "lots"}), source="command line")
    assert str(info.value.problems[0]).startswith("command line: resources.gpus:")


def test_spec_env_is_read_only() -> None:
    spec = build_spec({"name": "a", "command": ["x"], "env": {"A": "1"}})
    with pytest.raises(TypeError):
        spec.env["B"] = "2"  # type: ignore[index]


# -- reserved environment names


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "cuda_visible_devices",
        "Cuda_Mps_Pipe_Directory",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "GPUPOOL_JOB_ID",
        "gpupool_anything",
        "LD_PRELOAD",
        "ld_library_path",
        "MASTER_ADDR",
        "rank",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
    ],
)
def test_reserved_env_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidValue, match="reserved"):
        validate_env_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_HOME",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_MODULE_LOADING",
        "NVIDIA_TF32_OVERRIDE",
        "PYTORCH_CUDA_ALLOC_CONF",
    ],
)
def test_cuda_and_framework_settings_are_ordinary_job_env(name: str) -> None:
    assert validate_env_name(name) == name


def _case_variants(word: str) -> st.SearchStrategy[str]:
    def apply(flips: list[bool]) -> str:
        return "".join(c.upper() if f else c.lower() for c, f in zip(word, flips, strict=True))

    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(apply)


_RESERVED_SAMPLES = st.sampled_from(RESERVED_ENV).flatmap(
    lambda rule: (
        st.text("ABCXYZ_019", max_size=8).map(lambda suffix: rule[:-1] + suffix)
        if rule.endswith("*")
        else st.just(rule)
    )
)


@given(_RESERVED_SAMPLES.flatmap(_case_variants))
def test_every_reserved_name_is_rejected_whatever_its_case(name: str) -> None:
    assert reserved_env_rule(name) is not None
    with pytest.raises(InvalidValue):
        validate_env_name(name)


@pytest.mark.parametrize("name", ["WANDB_MODE", "OMP_NUM_THREADS", "MY_CUDA", "LD_DEBUG", "_X"])
def test_ordinary_env_names_are_accepted(name: str) -> None:
    assert validate_env_name(name) == name


@pytest.mark.parametrize("name", ["1ABC", "A-B", "", "A B"])
def test_malformed_env_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidValue, match="not valid"):
        validate_env_name(name)
