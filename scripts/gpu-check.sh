#!/usr/bin/env bash
# The GPU check for gpupool: one command, under 5 minutes on one GPU, that settles on real
# hardware what the CPU suite cannot (issue 14). It runs
#
#   1. the project's probe (python -m gpupool.agent.probe): one table with the driver and
#      binding versions, every NVML call the agent makes and its outcome, v1 vs v2 memory,
#      NVLink groups, the CUDA context size, MPS (attached / SM share / memory limit /
#      override refused / fallback detected), SIGKILL -> memory released, XID events;
#   2. tests/gpu (pytest);
#   3. the shim engineer's scorecard, scripts/shim-scorecard.sh, when it exists (see HOOK):
#      memory-limit accuracy, the context reserve measured on this card and a slice reaching
#      limit - reserve, graph memory capped, mps+shim (where MPS is installed), PyTorch, JAX
#      and CuPy at the slice, compute caps, sharing, noisy neighbour, overhead, graphs paced;
#      and issue 25's rows: cuGetProcAddress pointer identity for every hook, the real
#      libcuda.so.1's names against the façade's, NVML per-process memory against the charged
#      bytes, capture under a cap, PyTorch expandable segments and cudaMallocAsync at the slice,
#      PyTorch's usable memory under mps+shim, small-kernel overhead capped and uncapped, 10:90
#      absolute throughputs, a replica with three streams.
#
#   scripts/gpu-check.sh            # uses .venv/bin/python if present, else python3
#   PYTHON=/opt/venv/bin/python scripts/gpu-check.sh
#
# It installs nothing from the network: on a machine without PyPI, run scripts/gpu-wheels.sh
# where pip works and carry the .whl/ folder; those wheels are installed offline into a
# private folder. Exit code: 0 when every part passed; 1 when a part failed (the summary
# says which); 2 when there is no GPU at all; 3 when gpupool cannot be imported.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${GPU_CHECK_BUDGET_S:-290}
started=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - started))); }

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi

echo "== gpupool GPU check: $(date -u +%FT%TZ) on $(hostname)"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
  echo "no NVIDIA GPU or driver found (nvidia-smi -L failed): nothing to check" >&2
  exit 2
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version,mig.mode.current,compute_mode \
  --format=csv || true

# src layout: make the package importable even without an editable install.
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Offline: the wheels scripts/gpu-wheels.sh fetched (carried in .whl/), only when missing.
if [[ -d .whl ]] && ! "$PY" -c "import pydantic, sqlalchemy" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpupool-site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/gpupool-site"
fi
"$PY" -c "import gpupool.agent.agent, gpupool.agent.probe, gpupool.gpu.nvml" || {
  echo "gpupool does not import with $PY: run scripts/gpu-wheels.sh where pip works and carry .whl" >&2
  exit 3
}
"$PY" - <<'PY' || true
import importlib.util, shutil
print("torch:", "yes" if importlib.util.find_spec("torch") else "no (PyTorch tests will skip)")
print("nvidia-cuda-mps-control:", shutil.which("nvidia-cuda-mps-control") or "no (MPS checks skip)")
PY

declare -A result
echo
echo "== 1. probe"
timeout "$(left)" "$PY" -m gpupool.agent.probe
result[probe]=$?

echo
echo "== 2. tests/gpu"
if (( $(left) > 20 )); then
  per_test=()
  if "$PY" -c "import pytest_timeout" 2>/dev/null; then per_test=(--timeout 150); fi
  timeout "$(left)" "$PY" -m pytest tests/gpu -v -rs -p no:cacheprovider "${per_test[@]}" "$@"
  result[tests/gpu]=$?
else
  echo "no time left for tests/gpu" >&2
  result[tests/gpu]=124
fi

# ---- HOOK: the shim engineer's scorecard -------------------------------------------------
# scripts/shim-scorecard.sh (owned by the shim work) is run here when present, with the same
# Python and PYTHONPATH and the time that is left; its exit code counts like the others.
if [[ -x scripts/shim-scorecard.sh ]]; then
  echo
  echo "== 3. shim scorecard"
  PYTHON="$PY" GPU_CHECK_LEFT_S="$(left)" timeout "$(left)" scripts/shim-scorecard.sh
  result[shim-scorecard]=$?
fi
# ---- end of HOOK -------------------------------------------------------------------------

echo
echo "== summary ($(( $(date +%s) - started ))s of ${BUDGET_S}s)"
rc=0
for part in "${!result[@]}"; do
  code=${result[$part]}
  if [[ $code -eq 0 ]]; then echo "  $part: passed"
  elif [[ $code -eq 124 || $code -eq 137 ]]; then echo "  $part: ran out of time"; rc=1
  else echo "  $part: FAILED (exit $code)"; rc=1
  fi
done
exit $rc
