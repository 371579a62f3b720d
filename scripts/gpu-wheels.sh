#!/usr/bin/env bash
# Fetch the wheels scripts/gpu-check.sh needs on a GPU machine that cannot reach PyPI (the
# lent H200 has Python 3.12 with numpy, nvidia-ml-py, PyTorch, pytest, typer, rich, httpx,
# PyYAML, but not pydantic or SQLAlchemy). Run it here, where pip works; the wheels land in
# .whl/ (git-ignored, about 8 MB), which the device call carries:
#
#   scripts/gpu-wheels.sh
#   device run: command "scripts/gpu-check.sh", carry [".whl"]
#
# Versions are this checkout's .venv's (pydantic and pydantic-core must match each other).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
pins=$("$PY" - <<'PY'
from importlib.metadata import version
names = ["pydantic", "pydantic_core", "annotated-types", "typing-inspection", "SQLAlchemy", "greenlet"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
)
rm -rf .whl && mkdir -p .whl
# shellcheck disable=SC2086 # one word per pin
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
ls -la .whl
