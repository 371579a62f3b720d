#!/usr/bin/env bash
# GPU checks for gpupool: runs tests/gpu (NVML inventory and samples, MPS limits, the soft
# memory cap with PyTorch) on a machine with an NVIDIA GPU, in under 5 minutes.
#
#   scripts/gpu-check.sh            # uses .venv/bin/python if present, else python3
#   PYTHON=/opt/venv/bin/python scripts/gpu-check.sh
#
# Tests needing PyTorch or nvidia-cuda-mps-control skip with a reason when those are missing;
# the summary at the end lists what ran and what skipped. Exit code: pytest's (0 = all passed
# or skipped), 2 when there is no GPU at all, 3 when gpupool cannot be imported.
#
# On the lent H200 (no PyPI there): run scripts/gpu-wheels.sh here first, then the device call
# with command "scripts/gpu-check.sh" and carry [".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi

echo "== gpupool GPU check: $(date -u +%FT%TZ) on $(hostname)"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
  echo "no NVIDIA GPU or driver found (nvidia-smi -L failed): nothing to check" >&2
  exit 2
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version,mig.mode.current --format=csv || true
"$PY" - <<'PY' || true
import importlib.util, shutil
print("torch:", "yes" if importlib.util.find_spec("torch") else "no (PyTorch tests will skip)")
print("nvidia-cuda-mps-control:", shutil.which("nvidia-cuda-mps-control") or "no (MPS test will skip)")
PY

# src layout: make the package importable even without an editable install.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# A machine without PyPI: install the wheels scripts/gpu-wheels.sh fetched (carried in .whl/)
# into a private folder, only when this Python lacks them.
if [[ -d .whl ]] && ! "$PY" -c "import pydantic, sqlalchemy" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpupool-site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/gpupool-site"
fi
"$PY" -c "import gpupool.agent.agent, gpupool.gpu.nvml" || {
  echo "gpupool does not import with $PY: run scripts/gpu-wheels.sh here and carry .whl" >&2
  exit 3
}
set +e
timeout 290 "$PY" -m pytest tests/gpu -v -rs -p no:cacheprovider --timeout 150 "$@"
rc=$?
set -e
if [[ $rc -eq 124 ]]; then echo "GPU check ran past its 290 s budget" >&2; fi
exit $rc
