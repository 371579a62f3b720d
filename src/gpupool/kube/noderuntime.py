"""What a Kubernetes node's container runtime makes of gpupool's CDI devices, read from its files.

gpupool's kubelet plugin answers each prepared claim with a CDI device ID
(``gpu.gpupool.io/claim=<uid>``) whose spec it writes into ``/var/run/cdi``; the kubelet hands
the ID to the container runtime, which must have CDI on and read that folder, or the container
starts without its GPU, its driver libraries and the shim. NVIDIA's Container Toolkit is not
needed for that (the spec carries the device nodes and libraries itself), but where it is
installed its runtime can hand every GPU to a container whose image sets
``NVIDIA_VISIBLE_DEVICES=all``, outside any claim.

Two checks for ``gpupool precheck --kubernetes`` (:mod:`gpupool.kube.precheck` adds them):

- :func:`cdi_runtime`: containerd (``/etc/containerd/config.toml`` and the files it imports;
  config ``version = 3`` is containerd 2.x, CDI on by default; ``version = 2`` is 1.x, CDI only
  with ``enable_cdi = true``) or CRI-O (``/etc/crio/crio.conf`` and ``crio.conf.d``; CDI always
  on since 1.23) with ``/var/run/cdi`` among its CDI spec folders.
- :func:`nvidia_toolkit`: ``nvidia-ctk``, an NVIDIA runtime in the runtime's config, an
  ``nvidia.com/gpu`` CDI spec: which are present (PASS, or WARN when none: only pods using
  NVIDIA's own devices need them), and a WARN when the NVIDIA runtime is the default one while it
  accepts ``NVIDIA_VISIBLE_DEVICES`` from unprivileged containers.

Files are read under a root (``GPUPOOL_HOST_ROOT``, default ``/``): in a pod, the node's ``/``
mounted at ``/host``. Nothing is run and nothing is written.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the runtime's TOML is not read
    tomllib = None

#: Where gpupool's plugin writes its CDI specs (``python -m gpupool.kube --cdi-dir``).
PLUGIN_CDI_DIR = "/var/run/cdi"
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CONTAINERD_CONFIG = "etc/containerd/config.toml"
CRIO_CONFIGS = ("etc/crio/crio.conf", "etc/crio/crio.conf.d")
NVIDIA_RUNTIME_CONFIG = "etc/nvidia-container-runtime/config.toml"
NVIDIA_ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
BIN_DIRS = ("usr/bin", "usr/local/bin", "usr/sbin")
#: containerd's CRI runtime section by config version: CDI settings and ``containerd.runtimes``.
CONTAINERD_CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


@dataclass(frozen=True)
class Finding:
    """One check's answer: ``status`` PASS, WARN, FAIL or SKIP, what was seen, what to do."""

    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class RuntimeConfig:
    """What a runtime's files say: its name, CDI on, its spec folders, its runtimes."""

    name: str
    source: str
    cdi_enabled: bool
    cdi_dirs: tuple[str, ...]
    runtimes: Mapping[str, str]  # runtime name -> its binary (may be empty)
    default_runtime: str
    version_note: str = ""


class ConfigError(ValueError):
    """A runtime config file that cannot be read or parsed; the message names it."""


def _load_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise ConfigError(f"{path}: reading TOML needs Python 3.11 or newer")
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _dig(doc: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping) or key not in doc:
            return None
        doc = doc[key]
    return doc


def _under(root: Path, absolute: str) -> Path:
    return root / absolute.lstrip("/")


def _runtimes(section: Any, binary_key: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, spec in (section or {}).items():
        if isinstance(spec, Mapping):
            binary = _dig(spec, "options", binary_key) or spec.get("runtime_path") or ""
            out[str(name)] = str(binary)
    return out


def read_containerd(root: Path) -> RuntimeConfig | None:
    """containerd's config as the CRI plugin sees it, or ``None`` when there is no config."""
    path = root / CONTAINERD_CONFIG
    if not path.is_file():
        return None
    doc = _load_toml(path)
    for pattern in doc.get("imports") or []:
        rel = str(pattern).lstrip("/")
        for extra in sorted(root.glob(rel)) if any(c in rel for c in "*?[") else [root / rel]:
            if extra.is_file():
                _merge(doc, _load_toml(extra))
    version = int(doc.get("version") or 1)
    if version not in CONTAINERD_CRI:
        raise ConfigError(
            f"{path}: config version {version} (containerd 1.6 or older, or unknown): gpupool "
            "needs containerd 1.7 (version = 2, enable_cdi) or 2.x (version = 3)"
        )
    cri = _dig(doc, "plugins", CONTAINERD_CRI[version]) or {}
    if version == 2:
        enabled = bool(cri.get("enable_cdi", False))
        note = "version = 2 (containerd 1.7: CDI off unless enable_cdi = true)"
    else:
        enabled = bool(cri.get("enable_cdi", True))
        note = "version = 3 (containerd 2.x: CDI on by default)"
    dirs = tuple(str(d) for d in cri.get("cdi_spec_dirs") or DEFAULT_CDI_DIRS)
    plane = cri.get("containerd") or {}
    return RuntimeConfig(
        name="containerd",
        source=str(path),
        cdi_enabled=enabled,
        cdi_dirs=dirs,
        runtimes=_runtimes(plane.get("runtimes"), "BinaryName"),
        default_runtime=str(plane.get("default_runtime_name") or "runc"),
        version_note=note,
    )


def read_crio(root: Path) -> RuntimeConfig | None:
    """CRI-O's config (the main file, then ``crio.conf.d`` in order), or ``None``."""
    main, drop_ins = (root / p for p in CRIO_CONFIGS)
    files = [main] if main.is_file() else []
    if drop_ins.is_dir():
        files += sorted(p for p in drop_ins.iterdir() if p.suffix == ".conf" and p.is_file())
    if not files:
        return None
    doc: dict[str, Any] = {}
    for f in files:
        _merge(doc, _load_toml(f))
    runtime = _dig(doc, "crio", "runtime") or {}
    return RuntimeConfig(
        name="CRI-O",
        source=", ".join(str(f) for f in files),
        cdi_enabled=True,
        cdi_dirs=tuple(str(d) for d in runtime.get("cdi_spec_dirs") or DEFAULT_CDI_DIRS),
        runtimes=_runtimes(runtime.get("runtimes"), "runtime_path"),
        default_runtime=str(runtime.get("default_runtime") or "crun"),
        version_note="CRI-O 1.23+: CDI always on",
    )


def _reads_plugin_dir(dirs: Iterable[str]) -> bool:
    wanted = {PLUGIN_CDI_DIR, "/run/cdi"}  # /var/run is /run on every current distribution
    return any(d.rstrip("/") in wanted for d in dirs)


def _installed(root: Path, program: str) -> Path | None:
    for folder in BIN_DIRS:
        candidate = root / folder / program
        if candidate.is_file():
            return candidate
    return None


def _enable_cdi_fix(config: RuntimeConfig) -> str:
    if config.name == "containerd":
        return (
            f'in {config.source}, under [plugins."io.containerd.grpc.v1.cri"], set '
            'enable_cdi = true and cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"] (or upgrade '
            "to containerd 2.x, where CDI is on), then restart containerd"
        )
    return f"enable CDI in {config.source}, then restart {config.name}"


def cdi_runtime(root: Path) -> Finding:
    """Does the node's container runtime apply the CDI specs gpupool's plugin writes?"""
    try:
        configs = [c for c in (read_containerd(root), read_crio(root)) if c is not None]
    except ConfigError as exc:
        return Finding("FAIL", str(exc), "fix the runtime's configuration file named above")
    if not configs:
        binary = _installed(root, "containerd") or _installed(root, "crio")
        if binary is not None:
            return Finding(
                "WARN",
                f"{binary} with its built-in defaults (no config file): containerd 2.x and "
                "CRI-O have CDI on, containerd 1.7 has it off",
                "run `containerd --version`; on 1.7 write /etc/containerd/config.toml with "
                'enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"]',
            )
        return Finding(
            "FAIL",
            f"no containerd ({root / CONTAINERD_CONFIG}) or CRI-O ({root / CRIO_CONFIGS[0]}) "
            "configuration on this machine: this is not a Kubernetes node's container runtime",
            "run the check on a GPU node (or set GPUPOOL_HOST_ROOT to the node's root mounted "
            "in this pod, e.g. /host); the node needs containerd 2.x, containerd 1.7 with "
            "enable_cdi = true, or CRI-O 1.23+",
        )
    problems, good = [], []
    for config in configs:
        if not config.cdi_enabled:
            problems.append((f"{config.name} ({config.version_note}): CDI is off",
                             _enable_cdi_fix(config)))  # fmt: skip
        elif not _reads_plugin_dir(config.cdi_dirs):
            problems.append((
                f"{config.name} reads CDI specs only from {', '.join(config.cdi_dirs)}, not "
                f"{PLUGIN_CDI_DIR} where gpupool's plugin writes them",
                f"add \"{PLUGIN_CDI_DIR}\" to cdi_spec_dirs in {config.source} and restart "
                f"{config.name}",
            ))  # fmt: skip
        else:
            good.append(f"{config.name}: CDI on, specs from {', '.join(config.cdi_dirs)}")
    if problems:
        return Finding("FAIL", "; ".join(p for p, _ in problems), "; ".join(f for _, f in problems))
    return Finding("PASS", "; ".join(good))


def _nvidia_specs(root: Path) -> list[Path]:
    found = []
    for folder in DEFAULT_CDI_DIRS:
        where = _under(root, folder)
        if not where.is_dir():
            continue
        for spec in sorted(where.iterdir()):
            if spec.suffix not in (".json", ".yaml", ".yml") or not spec.is_file():
                continue
            try:
                text = spec.read_text(errors="replace")
            except OSError:
                continue
            if "nvidia.com/gpu" in text:
                found.append(spec)
    return found


def _accepts_envvar(root: Path) -> bool:
    """NVIDIA's runtime hands GPUs to unprivileged containers by ``NVIDIA_VISIBLE_DEVICES``
    (its default) unless its config says false."""
    path = root / NVIDIA_RUNTIME_CONFIG
    if not path.is_file():
        return True
    try:
        doc = _load_toml(path)
    except ConfigError:
        return True
    return bool(doc.get(NVIDIA_ENVVAR_KEY, True))


def nvidia_toolkit(root: Path) -> Finding:
    """Which parts of NVIDIA's Container Toolkit the node has, and whether its runtime would
    hand out GPUs outside claims."""
    try:
        configs = [c for c in (read_containerd(root), read_crio(root)) if c is not None]
    except ConfigError as exc:
        return Finding("SKIP", f"the runtime's configuration cannot be read: {exc}")
    seen = []
    ctk = _installed(root, "nvidia-ctk")
    if ctk is not None:
        seen.append(f"nvidia-ctk at {ctk}")
    nvidia_default = []
    for config in configs:
        for name, binary in config.runtimes.items():
            if "nvidia" in name or "nvidia-container-runtime" in binary:
                seen.append(f"{config.name} runtime {name!r}")
                if name == config.default_runtime:
                    nvidia_default.append(config.name)
    seen += [f"CDI spec {spec}" for spec in _nvidia_specs(root)]
    if nvidia_default and _accepts_envvar(root):
        return Finding(
            "WARN",
            f"NVIDIA's runtime is {' and '.join(nvidia_default)}'s default and accepts "
            "NVIDIA_VISIBLE_DEVICES from unprivileged containers: a pod whose image sets "
            "NVIDIA_VISIBLE_DEVICES=all (every CUDA base image does) gets every GPU of the node "
            "without a claim, outside gpupool's shares",
            f"set {NVIDIA_ENVVAR_KEY} = false in /{NVIDIA_RUNTIME_CONFIG} (or make runc the "
            "default runtime and use a RuntimeClass for nvidia)",
        )
    if not seen:
        return Finding(
            "WARN",
            "no NVIDIA Container Toolkit (nvidia-ctk, an nvidia runtime, an nvidia.com/gpu CDI "
            "spec): gpupool's claims do not need it (the plugin's CDI specs carry the device "
            "nodes and driver libraries); pods using NVIDIA's own device plugin or DRA driver do",
            "only for those pods: install nvidia-container-toolkit and run "
            "`nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml`",
        )
    return Finding("PASS", "; ".join(seen))
