"""A job's container: the image it runs in and what the user adds to it (pure values).

A job with a :class:`ContainerSpec` runs its command inside ``image`` through a container
engine on its node (podman, docker; see :mod:`gpupool.containers`) instead of as a bare
process. The options mirror Slurm's pyxis where its users would look for them:

- ``image``: an OCI image reference, ``[REGISTRY/]PATH[:TAG][@DIGEST]``
  (``--image``, pyxis ``--container-image``);
- ``mounts``: ``SRC:DST[:ro]`` bind mounts of node folders (``--container-mounts``);
- ``workdir``: the folder the command starts in inside the container (``--container-workdir``;
  default: the job's working folder, mounted at the same path);
- ``env``: variables set inside the container after everything else (``--container-env``);
- ``engine``: an engine by name (``None``: the pool's default engine).

Words: the **registry** of an image is the host part of its reference (the first path
component when it has a ``.`` or ``:`` or is ``localhost``), else ``docker.io``; a pool's
*registry allowlist* (:func:`registry_allowed`) is checked against it at submit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gpupool.domain.errors import InvalidValue

#: Engines a job may name; the agent's registry (gpupool.containers.engines) has the same names.
ENGINE_NAMES = ("podman", "docker")
DEFAULT_REGISTRY = "docker.io"
MAX_MOUNTS = 64

_IMAGE_RE = re.compile(
    r"^(?:(?P<host>[a-zA-Z0-9.-]+(?::[0-9]+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*:[0-9a-fA-F]{32,}))?$"
)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Mount:
    """A bind mount: the node's ``source`` folder or file at ``target`` in the container."""

    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class ContainerSpec:
    """See the module docstring."""

    image: str
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    engine: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def registry(self) -> str:
        return image_registry(self.image)

    def to_json(self) -> dict[str, object]:
        return {
            "image": self.image,
            "mounts": [str(m) for m in self.mounts],
            "workdir": self.workdir,
            "env": dict(self.env),
            "engine": self.engine,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ContainerSpec:
        mounts = data.get("mounts") or []
        env = data.get("env") or {}
        assert isinstance(mounts, list)
        assert isinstance(env, dict)
        workdir, engine = data.get("workdir"), data.get("engine")
        return cls(
            image=str(data["image"]),
            mounts=tuple(parse_mount(str(m)) for m in mounts),
            workdir=str(workdir) if workdir is not None else None,
            env={str(k): str(v) for k, v in env.items()},
            engine=str(engine) if engine is not None else None,
        )


def parse_image(text: str) -> str:
    """An image reference as given, or InvalidValue saying what a good one looks like."""
    ref = text.strip()
    if not ref or len(ref) > 512 or _IMAGE_RE.match(ref) is None:
        raise InvalidValue(
            f"image {text!r} is not an image reference: write [REGISTRY/]NAME[:TAG], e.g. "
            "nvcr.io/nvidia/pytorch:24.05-py3 or localhost/myimage:1",
            field="container.image",
        )
    return ref


def image_registry(image: str) -> str:
    """The registry host of ``image`` (``docker.io`` when it names none)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first.lower()
    return DEFAULT_REGISTRY


def registry_allowed(image: str, allowlist: Sequence[str]) -> bool:
    """Whether ``image``'s registry is on ``allowlist`` (an empty list allows every registry).
    An entry ``*.example.com`` allows the subdomains of example.com."""
    if not allowlist:
        return True
    host = image_registry(image)
    for entry in allowlist:
        e = entry.lower()
        if host == e or (e.startswith("*.") and host.endswith(e[1:])):
            return True
    return False


def parse_mount(text: str) -> Mount:
    """``SRC:DST[:ro|:rw]`` with absolute paths, or InvalidValue."""
    parts = text.split(":")
    mode = ""
    if len(parts) == 3:
        mode = parts.pop()
    if len(parts) != 2 or mode not in ("", "ro", "rw"):
        raise InvalidValue(
            f"mount {text!r} is not SRC:DST[:ro]: e.g. /data/imagenet:/data:ro",
            field="container.mounts",
        )
    src, dst = parts
    for what, path in (("source", src), ("target", dst)):
        if not path.startswith("/") or "\x00" in path or ",/" in path:
            raise InvalidValue(
                f"mount {text!r}: its {what} {path!r} must be an absolute path",
                field="container.mounts",
            )
        if ".." in path.split("/"):
            raise InvalidValue(
                f"mount {text!r}: its {what} may not contain '..'", field="container.mounts"
            )
    return Mount(src, dst, mode == "ro")


def parse_mounts(raw: object) -> tuple[Mount, ...]:
    """A list of mount strings, or one string of them separated by commas (pyxis style)."""
    items: list[str] = []
    for item in [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, list) else [None]:
        if not isinstance(item, str):
            raise InvalidValue(
                "mounts must be SRC:DST[:ro] strings, comma-separated or a list",
                field="container.mounts",
            )
        items += [p for p in item.split(",") if p.strip()]
    if len(items) > MAX_MOUNTS:
        raise InvalidValue(f"at most {MAX_MOUNTS} mounts", field="container.mounts")
    return tuple(parse_mount(p.strip()) for p in items)


def parse_container_env(raw: object) -> dict[str, str]:
    """A mapping NAME: value, or a list of ``NAME=VALUE`` strings."""
    pairs: dict[str, str] = {}
    if isinstance(raw, Mapping):
        items = [(str(k), v) for k, v in raw.items()]
    elif isinstance(raw, list) and all(isinstance(x, str) and "=" in x for x in raw):
        items = [tuple(x.split("=", 1)) for x in raw]
    else:
        raise InvalidValue(
            "container env must be NAME: value pairs (or NAME=VALUE strings)",
            field="container.env",
        )
    for name, value in items:
        if not _ENV_NAME_RE.match(name):
            raise InvalidValue(
                f"environment name {name!r} is not valid: use letters, digits and '_'",
                field="container.env",
            )
        if isinstance(value, (dict, list)) or value is None or "\x00" in str(value):
            raise InvalidValue(f"container env {name}: must be text", field="container.env")
        pairs[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return pairs


def parse_engine(raw: object) -> str:
    name = str(raw).strip().lower()
    if name not in ENGINE_NAMES:
        raise InvalidValue(
            f"container engine {raw!r} is not known: use one of {', '.join(ENGINE_NAMES)}",
            field="container.engine",
        )
    return name


def parse_workdir(raw: object) -> str:
    text = str(raw)
    if not text.startswith("/") or "\x00" in text:
        raise InvalidValue(
            f"container workdir {text!r} must be an absolute path inside the image",
            field="container.workdir",
        )
    return text


#: The keys of a job file's ``container:`` mapping and their parsers.
_FIELDS = {
    "image": parse_image,
    "mounts": parse_mounts,
    "workdir": parse_workdir,
    "env": parse_container_env,
    "engine": parse_engine,
}
KNOWN_KEYS = tuple(f"container.{k}" for k in _FIELDS)


def build_container(raw: object) -> tuple[ContainerSpec | None, list[tuple[str, str]]]:
    """A job file's ``container:`` mapping as a spec, with its problems as (key, message)."""
    if not isinstance(raw, Mapping):
        return None, [("container", "must be a mapping with 'image' and optional mounts, ...")]
    problems: list[tuple[str, str]] = []
    values: dict[str, object] = {}
    for key, value in raw.items():
        parser = _FIELDS.get(str(key))
        if parser is None:
            problems.append((f"container.{key}", f"unknown key: use {', '.join(KNOWN_KEYS)}"))
        elif value is not None:
            try:
                values[str(key)] = parser(value)
            except InvalidValue as exc:
                problems.append((f"container.{key}", exc.message))
    if "image" not in raw:
        problems.append(("container.image", "missing: give the image the job runs in"))
    if problems:
        return None, problems
    return ContainerSpec(**values), []  # type: ignore[arg-type]
