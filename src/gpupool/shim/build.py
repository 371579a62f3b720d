"""Build the CUDA driver shim with the system C compiler, once per source and compiler.

The shim is C (``csrc/``) and is compiled on the machine that runs it, on first use, into a
cache folder: ``$GPUPOOL_SHIM_DIR`` or ``$XDG_CACHE_HOME/gpupool/shim`` (``~/.cache/gpupool/shim``).
Each build lives in a subfolder named by a key (a hash of the sources, the compiler, the
machine and the forwarded names), so a changed source or compiler builds anew and a finished
build is never rewritten. Concurrent callers (several agents, test workers) serialise on a lock
file; a build is made in a temporary folder and renamed into place, so a reader never sees half
of one. ``python -m gpupool.shim.build`` builds ahead of time and prints the folder.

Products, in the build folder:

- ``facade/libcuda.so.1`` (and the ``libcuda.so`` link): the driver façade, put first on a
  job's ``LD_LIBRARY_PATH``; it dlopens the real driver named by ``GPUPOOL_REAL_LIBCUDA``.
- ``facade/libnvidia-ml.so.1`` (and ``libnvidia-ml.so``): the NVML façade beside it (memory
  info reports the slice), opening the real NVML named by ``GPUPOOL_REAL_LIBNVML``.
- ``libgpupool_preload.so``: the ``LD_PRELOAD`` fallback.
- ``libgpupool_region.so``: the region functions alone, for the agent (:mod:`gpupool.runtime.shim`).

No CUDA toolkit is needed: ``csrc/gp_cuda.h`` declares the driver API the shim uses, and the
driver is never linked. Warnings are errors (``-Wall -Wextra -Werror``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.domain.errors import GpupoolError
from gpupool.shim.locate import real_driver, real_nvml

CSRC = Path(__file__).resolve().parent / "csrc"
#: The driver shim's C units, one library (``gp_hooks.h`` says what each holds).
SHIM_UNITS = (
    "shim.c",
    "charge.c",
    "procaddr.c",
    "memory.c",
    "vmm.c",
    "context.c",
    "graph.c",
    "launch.c",
    "pace.c",
)
#: The header whose ``GP_HOOKS`` table lists the hooks (see :func:`hooked_names`).
HOOK_TABLE = "gp_hooks.h"
SOURCES = (
    "gp_cuda.h",
    "gp_region.h",
    "gp_shim.h",
    HOOK_TABLE,
    "region.c",
    *SHIM_UNITS,
    "driver_symbols.txt",
    "nvml.c",
    "nvml_symbols.txt",
)
CFLAGS = (
    "-std=gnu11",
    "-O2",
    "-fPIC",
    "-shared",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fvisibility=hidden",
)
LIBS = ("-ldl", "-lpthread")


class ShimBuildError(GpupoolError):
    """The shim could not be built on this machine (no compiler, unsupported CPU, a C error)."""


@dataclass(frozen=True)
class ShimBuild:
    """The built shim: the façade folder (to put first on ``LD_LIBRARY_PATH``) and the libraries."""

    root: Path
    facade_dir: Path
    preload: Path
    region_lib: Path

    @property
    def facade(self) -> Path:
        return self.facade_dir / "libcuda.so.1"

    @property
    def nvml_facade(self) -> Path:
        return self.facade_dir / "libnvidia-ml.so.1"

    def complete(self) -> bool:
        files = (self.facade, self.nvml_facade, self.preload, self.region_lib)
        return all(f.is_file() for f in files)


#: Where the build cache goes when set (else the user's cache folder).
SHIM_DIR_ENV = "GPUPOOL_SHIM_DIR"


def cache_root() -> Path:
    explicit = os.environ.get(SHIM_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpupool" / "shim"


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise ShimBuildError(
            "no C compiler found to build the CUDA shim: install gcc (apt-get install gcc) "
            "or set CC to a C compiler"
        )
    return cc


def elf_dynamic_names(path: Path) -> list[str]:
    """The names of the functions an ELF64 shared library exports (its ``.dynsym``)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    names: list[str] = []
    for _name, stype, _f, _a, off, size, link, _i, _al, entsize in sections:
        if stype != 11 or entsize == 0:  # SHT_DYNSYM
            continue
        stroff = sections[link][4]
        for k in range(1, size // entsize):
            st_name, st_info, _o, st_shndx = struct.unpack_from("<IBBH", data, off + k * entsize)
            if st_shndx == 0 or (st_info & 0xF) != 2:  # defined functions only
                continue
            end = data.index(b"\0", stroff + st_name)
            names.append(data[stroff + st_name : end].decode())
    return names


def hooked_names(table: str) -> set[str]:
    """The names the shim defines itself (the ``GP_HOOKS`` table of ``gp_hooks.h``, given as
    text): left out of the trampolines."""
    names: set[str] = set()
    for raw in table.splitlines():
        line = raw.strip()
        if line.startswith("X(cu"):
            names.add(line[2:].split(",", 1)[0])
    return names


def nvml_hooked_names(nvml_c: str) -> set[str]:
    """The NVML functions nvml.c defines itself."""
    marker = "GP_API nvmlReturn_t "
    return {
        line[len(marker) :].split("(", 1)[0]
        for line in nvml_c.splitlines()
        if line.startswith(marker)
    }


def _listed(name: str) -> list[str]:
    return [
        n.strip()
        for n in (CSRC / name).read_text().splitlines()
        if n.strip() and not n.startswith("#")
    ]


def forwarded_names(driver: Path | None) -> list[str]:
    found = elf_dynamic_names(driver) if driver is not None else []
    hooked = hooked_names((CSRC / HOOK_TABLE).read_text())
    names = {n for n in [*_listed("driver_symbols.txt"), *found] if n.startswith("cu")}
    return sorted(names - hooked)


def forwarded_nvml_names(nvml: Path | None) -> list[str]:
    found = elf_dynamic_names(nvml) if nvml is not None else []
    hooked = nvml_hooked_names((CSRC / "nvml.c").read_text())
    names = {n for n in [*_listed("nvml_symbols.txt"), *found] if n.startswith("nvml")}
    return sorted(names - hooked)


@dataclass(frozen=True)
class Library:
    """What a façade forwards to: its name in messages, its variable, and the codes a call to
    a function it lacks returns (absent from the real library; no real library at all)."""

    label: str
    variable: str
    missing: int
    no_library: int


CUDA = Library("CUDA driver", "GPUPOOL_REAL_LIBCUDA", 500, 3)  # NOT_FOUND, NOT_INITIALIZED
NVML = Library("NVML", "GPUPOOL_REAL_LIBNVML", 13, 1)  # FUNCTION_NOT_FOUND, UNINITIALIZED


def forward_source(names: Sequence[str], machine: str, lib: Library = CUDA) -> str:
    """C for the façade's trampolines: each jumps through a table the shim fills at load. A
    name the real library lacks jumps to its own stub, which says so on stderr (once per name:
    which function, which library, what to do) and returns the library's error code, so a
    program never fails silently on a name the façade had to guess."""
    if machine in ("x86_64", "amd64"):
        jump = "\tjmp *gp_fwd_table+{off}(%rip)\n"
    elif machine in ("aarch64", "arm64"):
        jump = (
            "\tadrp x16, gp_fwd_table+{off}\n"
            "\tldr x16, [x16, #:lo12:gp_fwd_table+{off}]\n"
            "\tbr x16\n"
        )
    else:
        raise ShimBuildError(f"the CUDA shim's façade supports x86_64 and aarch64, not {machine}")
    out = [
        "/* Generated by gpupool.shim.build: one trampoline per forwarded driver symbol. */",
        "#include <stddef.h>",
        "typedef void *(*dlsym_fn)(void *, const char *);",
        f'__attribute__((visibility("hidden"))) void *gp_fwd_table[{len(names)}];',
        "static const char *const gp_fwd_names[] = {",
        *(f'    "{n}",' for n in names),
        "};",
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "#include <unistd.h>",
        f"static char gp_fwd_said[{len(names) or 1}];",
        "static int gp_fwd_have;",
        "static int gp_fwd_miss(size_t i) {",
        "    if (!__atomic_exchange_n(&gp_fwd_said[i], 1, __ATOMIC_RELAXED)) {",
        "        char m[512];",
        f'        const char *path = getenv("{lib.variable}");',
        "        int n = gp_fwd_have",
        f'            ? snprintf(m, sizeof m, "gpupool: %s is not in the real {lib.label} (%s): '
        f"the call returns {lib.missing}; the {lib.label} is older than the program expects, "
        f'or {lib.variable} names another library\\n", gp_fwd_names[i], '
        f'path && *path ? path : "found by the usual paths")',
        f'            : snprintf(m, sizeof m, "gpupool: %s was called but no real {lib.label} '
        f'was opened: the call returns {lib.no_library}; set {lib.variable} to its path\\n", '
        "gp_fwd_names[i]);",
        "        if (n > 0) {",
        "            ssize_t w = write(2, m, (size_t)n < sizeof m ? (size_t)n : sizeof m - 1);",
        "            (void)w;",
        "        }",
        "    }",
        f"    return gp_fwd_have ? {lib.missing} : {lib.no_library};",
        "}",
        *(
            f"static int gp_fwd_miss_{i}(void) {{ return gp_fwd_miss({i}); }}"
            for i in range(len(names))
        ),
        "static void *const gp_fwd_misses[] = {",
        *(f"    (void *)gp_fwd_miss_{i}," for i in range(len(names))),
        "    NULL,",
        "};",
        "void gp_forward_resolve(void *real, dlsym_fn sym) {",
        "    gp_fwd_have = real != NULL;",
        f"    for (size_t i = 0; i < {len(names)}; i++) {{",
        "        void *p = real ? sym(real, gp_fwd_names[i]) : NULL;",
        "        gp_fwd_table[i] = p ? p : gp_fwd_misses[i];",
        "    }",
        "}",
    ]
    for i, n in enumerate(names):
        asm = (
            f".pushsection .text\n.globl {n}\n.type {n}, @function\n.p2align 4\n{n}:\n"
            + jump.format(off=8 * i)
            + f".size {n}, .-{n}\n.popsection\n"
        )
        out.append("__asm__(" + " ".join(f'"{line}\\n"' for line in asm.splitlines()) + ");")
    return "\n".join(out) + "\n"


def _find_driver() -> Path | None:
    """The real driver whose names the façade forwards, found as the loader would."""
    return real_driver()


def _compile(cc: str, args: Iterable[str], cwd: Path) -> None:
    cmd = [cc, *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ShimBuildError(
            f"building the CUDA shim failed ({' '.join(cmd)}):\n{proc.stderr.strip()}"
        )


def _key(cc: str, names: Sequence[str], machine: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    h.update(cc.encode() + version.stdout.encode() + machine.encode())
    h.update("\n".join(names).encode())
    return h.hexdigest()[:16]


def _products(root: Path) -> ShimBuild:
    return ShimBuild(
        root=root,
        facade_dir=root / "facade",
        preload=root / "libgpupool_preload.so",
        region_lib=root / "libgpupool_region.so",
    )


def ensure_built(cache: Path | None = None) -> ShimBuild:
    """The shim built for this machine, building it first when needed (safe to call at once
    from several processes)."""
    cc = compiler()
    machine = platform.machine()
    names = forwarded_names(_find_driver())
    nvml_names = forwarded_nvml_names(real_nvml())
    top = cache or cache_root()
    root = top / _key(cc, [*names, *nvml_names], machine)
    built = _products(root)
    if built.complete():
        return built
    top.mkdir(parents=True, exist_ok=True)
    with open(top / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built.complete():
            return built
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=top))
        try:
            (tmp / "forward.c").write_text(forward_source(names, machine))
            (tmp / "facade").mkdir()
            inc = f"-I{CSRC}"
            region = str(CSRC / "region.c")
            shim = [str(CSRC / unit) for unit in SHIM_UNITS]
            _compile(
                cc,
                [
                    *CFLAGS,
                    inc,
                    "-DGP_FACADE",
                    *shim,
                    region,
                    "forward.c",
                    "-o",
                    "facade/libcuda.so.1",
                    "-Wl,-soname,libcuda.so.1",
                    *LIBS,
                ],
                tmp,
            )
            (tmp / "facade" / "libcuda.so").symlink_to("libcuda.so.1")
            (tmp / "nvml_forward.c").write_text(forward_source(nvml_names, machine, NVML))
            _compile(
                cc,
                [
                    *CFLAGS,
                    inc,
                    "-DGP_FACADE",
                    str(CSRC / "nvml.c"),
                    region,
                    "nvml_forward.c",
                    "-o",
                    "facade/libnvidia-ml.so.1",
                    "-Wl,-soname,libnvidia-ml.so.1",
                    *LIBS,
                ],
                tmp,
            )
            (tmp / "facade" / "libnvidia-ml.so").symlink_to("libnvidia-ml.so.1")
            _compile(
                cc,
                [
                    *CFLAGS,
                    inc,
                    "-DGP_PRELOAD",
                    *shim,
                    region,
                    "-o",
                    "libgpupool_preload.so",
                    *LIBS,
                ],
                tmp,
            )
            _compile(cc, [*CFLAGS, inc, region, "-o", "libgpupool_region.so", *LIBS], tmp)
            # Readable by every account: jobs that run as another user (--run-as) load it.
            tmp.chmod(0o755)
            if root.exists():
                shutil.rmtree(root)
            tmp.rename(root)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return built


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    try:
        built = ensure_built()
    except ShimBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(built.root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
