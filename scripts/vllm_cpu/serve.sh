#!/usr/bin/env bash
# A "production" vLLM for the CPU rehearsal: the tiny target model on PORT, in the foreground.
# Start it in the background the way a hand-run server lives:
#   setsid scripts/vllm_cpu/serve.sh 8100 > vllm-8100.log 2>&1 &
# or under systemd: systemd-run --unit=vllm-rehearsal "$PWD/scripts/vllm_cpu/serve.sh" 8100
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${VLLM_CPU_DIR:-$HERE/../../.servers}
PORT=${1:?usage: serve.sh PORT}
export VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
# vLLM's IPC sockets and torch's caches go beside the models, not into the host's /tmp.
TMPDIR="$DIR/tmp/$PORT"
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR" && export TMPDIR
exec "$DIR/venv/bin/python" "$HERE/vllm_cli.py" serve "$DIR/models/target" \
    --host 127.0.0.1 --port "$PORT" --served-model-name production --dtype float32 \
    --max-model-len 512 --enforce-eager --max-num-seqs 8
