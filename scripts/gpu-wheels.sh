#!/usr/bin/env bash
# Download here the wheels that scripts/gpu-tests.sh installs on a GPU machine that reaches no
# package registry: orch's dependencies that a CUDA image with torch lacks (and click and
# nvidia-ml-py, used only if the machine's are too old), and setuptools to build orch with.
# Into .wheels/, which git ignores.
#
#   scripts/gpu-wheels.sh [PYTHON_VERSION]      default 3.12, the GPU machine's python3
#
# Versions are those installed for $PYTHON (default python3) here, so the GPU machine runs what
# the tests here ran with.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
py=${PYTHON:-python3}
names=(pydantic pydantic-core annotated-types typing-inspection typing-extensions
       structlog sqlite-utils sqlite-fts4 click-default-group click nvidia-ml-py packaging
       aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna
       prometheus-client
       mcp mcp-types anyio h11 httpcore2 httpx2 truststore jsonschema jsonschema-specifications
       referencing rpds-py opentelemetry-api pyjwt python-multipart sse-starlette starlette
       uvicorn cryptography cffi pycparser py-spy)
read -r -a pins < <("$py" -c '
import importlib.metadata as md, sys
print(" ".join(f"{n}=={md.version(n)}" for n in sys.argv[1:]))' "${names[@]}")
rm -rf .wheels
mkdir .wheels
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .wheels "${pins[@]}" 'setuptools>=68'
ls -s .wheels
