#!/usr/bin/env bash
# The GPU tests (tests/test_gpu.py and tests/test_stalls.py, marker `gpu`), on a machine with an
# NVIDIA GPU and driver.
#
#   scripts/gpu-tests.sh [PYTEST ARGS...]         e.g. scripts/gpu-tests.sh -k latency
#
# $PYTHON (default python3) must have torch with CUDA: the tests' GPU holder is a torch process.
# orch goes into an overlay venv ($ORCH_GPU_VENV, default /tmp/orch-gpu-venv) that also sees
# $PYTHON's packages, so nothing of $PYTHON's environment changes. Its missing dependencies come
# from the registry, or, on a machine that reaches none, from .wheels/ (made elsewhere by
# scripts/gpu-wheels.sh). ORCH_GPU_TRIALS=N sets the latency trials (5); ORCH_GPU_REPORT=FILE
# appends the latency figures to FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
venv=${ORCH_GPU_VENV:-/tmp/orch-gpu-venv}

"$py" -c 'import torch' || { echo "gpu-tests: $py has no torch; set PYTHON" >&2; exit 2; }
"$py" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__},",
                                   f"CUDA available: {torch.cuda.is_available()}")'
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv \
    || echo "gpu-tests: nvidia-smi failed (the tests will say why NVML is unavailable)"

if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv --without-pip "$venv"
fi
# $PYTHON's packages through a .pth file: `venv --system-site-packages` would show those of the
# base interpreter only, not those of a venv $PYTHON may itself live in (torch images do that).
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$py" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' \
    > "$site/_orch_gpu_base.pth"
offline=()
if compgen -G ".wheels/*.whl" > /dev/null; then
    offline=(--no-index --find-links .wheels)
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${offline[@]}" -e .

export PYTHONUNBUFFERED=1
exec "$venv/bin/python" -m pytest tests/test_gpu.py tests/test_stalls.py -ra "$@"
