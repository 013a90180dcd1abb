#!/usr/bin/env bash
# llama.cpp's server on a CPU machine, for the tests and plans/rehearsal_llamacpp.yaml: llama-server
# built from the llama.cpp that llama-cpp-python vendors (its sdist from the registry: CMake and a
# C++ compiler, no network beyond pip), and scripts/vllm_cpu/setup.sh's three tiny models as GGUF
# (llama.cpp's converter in that venv: to_gguf.py).
# Usage: scripts/llamacpp/setup.sh [DIR]   (default .servers; ~20 min on 2 cores the first time,
# nothing when all is there). Never part of orch's own dependencies.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-$HERE/../../.servers}
VERSION=0.3.36   # llama-cpp-python's, whose vendor/llama.cpp is built
"$HERE/../vllm_cpu/setup.sh" "$DIR" > /dev/null   # the models, and the venv that converts them
DIR=$(cd "$DIR" && pwd)
# The converter imports torch, which makes its inductor cache in the temp folder: a private one.
TMPDIR=$(mktemp -d)
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
OUT=$DIR/llamacpp
SRC=$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp
mkdir -p "$OUT/bin" "$OUT/models"
if [ ! -d "$SRC" ]; then
    "$DIR/venv/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" \
        -d "$OUT" 2>&1 | grep -v "^WARNING: Location" || true
    tar xzf "$OUT/llama_cpp_python-$VERSION.tar.gz" -C "$OUT"
fi
if [ ! -x "$OUT/bin/llama-server" ]; then
    cmake -S "$SRC" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DBUILD_SHARED_LIBS=OFF > "$OUT/cmake.log"
    cmake --build "$OUT/build" --target llama-server -j "$(nproc)" > "$OUT/build.log"
    cp "$OUT/build/bin/llama-server" "$OUT/bin/llama-server"
fi
for model in target noisy other; do
    if [ ! -f "$OUT/models/$model.gguf" ]; then
        "$DIR/venv/bin/python" "$HERE/to_gguf.py" "$SRC" "$DIR/models/$model" \
            --outfile "$OUT/models/$model.gguf" --outtype f32 > /dev/null 2>&1
    fi
done
echo "llama.cpp ready: $OUT/bin/llama-server, models in $OUT/models"
