#!/usr/bin/env bash
# A real SGLang server on a CPU machine, the migration's target engine, for the tests and
# plans/rehearsal_sglang.yaml: SGLang's Python package and its CPU kernels (sgl_kernel), both
# from one commit, into DIR/sglang/venv; three tiny models into DIR/sglang/models.
# Usage: scripts/sglang_cpu/setup.sh [DIR]   (default .servers; 4.5 min and 2.7 GB the first
# time on 2 cores, 5 s when it is there). Never part of orch's own dependencies.
#
# The source: SGLang's main repository is too large to be fetched on these machines, so a fork
# of it pinned by commit (SGLANG_GIT: a git URL or a local repository holding that commit): its
# main as stored in August 2026. Kernels and package come from that one commit because their
# signatures move together (the registry's sglang 0.5.23 calls extend_attention_cpu with 22
# arguments, these kernels take 19), and the registry has no CPU kernel at all (sgl-kernel and
# sglang-kernel are CUDA builds).
#
# One patch (intel-amx-seq-lens.patch), two lines: since sgl-project/sglang#24013 (2026-07-18)
# the intel_amx attention backend replaces the sequence lengths it computed for a speculative
# verify (prefix + draft tokens) and for a draft decode with the batch's own, keeping only the
# int64 cast the PR wanted; every EAGLE-3 or STANDALONE verify then fails in the kernel
# ("prefix len < 0!"). The patch keeps the cast on the lengths computed. Without it SGLang's
# speculative decoding cannot run on a CPU at this commit; nothing else is changed.
#
# torch==2.13.0+cpu comes from pip's find-links on these machines, as for scripts/vllm_cpu/.
# torchvision is the registry's CUDA build, installed without its deps: SGLang imports it, and
# torchvision_ops.py, installed into the venv, lets it import with its ops absent (the reason
# is written there).
# Building the kernels needs a C++ compiler, cmake and libnuma-dev (apt-get, as root).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-$HERE/../../.servers}
mkdir -p "$DIR/sglang"
S=$(cd "$DIR/sglang" && pwd)
COMMIT=44806dc507835746b67abebad041726c422030ea
SOURCE=${SGLANG_GIT:-https://github.com/xinguozhu-2026/sglang.git}
# No release tag at a fork's commit: a dev version naming it, and the patch.
VERSION=0.0.0.dev0+g${COMMIT:0:9}.patched
# Importing SGLang makes torch's inductor cache in the temp folder: a private one, removed after.
TMPDIR=$(mktemp -d)
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
ready() {
    "$S/venv/bin/python" - "$VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
assert m.version("sglang-cpu") == sys.argv[1]
import sgl_kernel, sglang, torch, torchvision  # noqa: F401, E401  (torchvision_ops.pth)
assert hasattr(torch.ops.sgl_kernel, "extend_attention_cpu")
EOF
}
# What the source folder holds: the commit and the patch applied to it.
STAMP="$COMMIT $(sha256sum "$HERE/intel-amx-seq-lens.patch" | cut -c1-16)"
started=$(date +%s)
if ! ready; then
    if [ ! -e /usr/include/numa.h ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                libnuma-dev > /dev/null
        else
            echo "sglang setup: the CPU kernels need libnuma-dev (apt-get install libnuma-dev)" >&2
            exit 2
        fi
    fi
    if [ "$(cat "$S/src/.stamp" 2>/dev/null)" != "$STAMP" ]; then
        echo "sglang setup: source at ${COMMIT:0:9} from $SOURCE"
        rm -rf "$S/src" "$S/wheels"
        git init -q "$TMPDIR/git"
        git -C "$TMPDIR/git" fetch -q --depth 1 "$SOURCE" "$COMMIT"
        mkdir -p "$S/src"
        git -C "$TMPDIR/git" archive FETCH_HEAD python | tar -x -C "$S/src"
        patch -s -d "$S/src" -p1 < "$HERE/intel-amx-seq-lens.patch"
        echo "$STAMP" > "$S/src/.stamp"
    fi
    rm -rf "$S/venv"
    python3 -m venv "$S/venv"
    echo "sglang setup: Python dependencies"
    "$S/venv/bin/pip" install -q --no-deps -r "$HERE/requirements.lock" torch==2.13.0+cpu \
        torchvision==0.28.0 2>&1 | grep -v "^WARNING: Location" || true
    if ! ls "$S/wheels"/sglang_kernel_cpu-*.whl > /dev/null 2>&1; then
        echo "sglang setup: building the CPU kernels (minutes)"
        kernels="$S/src/python/sglang/kernels/aot"
        cp "$kernels/pyproject_cpu.toml" "$kernels/pyproject.toml"
        "$S/venv/bin/pip" wheel -q --no-build-isolation --no-deps -w "$S/wheels" "$kernels" \
            2>&1 | grep -v "^WARNING: Location" || true
    fi
    site=$("$S/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    cp "$HERE/torchvision_ops.py" "$site/"
    echo "import torchvision_ops; torchvision_ops.install()" > "$site/torchvision_ops.pth"
    "$S/venv/bin/pip" install -q --no-deps "$S/wheels"/sglang_kernel_cpu-*.whl 2>&1 \
        | grep -v "^WARNING: Location" || true
    cp "$S/src/python/pyproject_cpu.toml" "$S/src/python/pyproject.toml"
    SETUPTOOLS_SCM_PRETEND_VERSION=$VERSION "$S/venv/bin/pip" install -q --no-deps \
        --no-build-isolation "$S/src/python" 2>&1 | grep -v "^WARNING: Location" || true
    ready || { echo "sglang setup: the installed SGLang does not import" >&2; exit 1; }
fi
if [ ! -f "$S/models/.done" ]; then
    HF_HUB_OFFLINE=1 "$S/venv/bin/python" "$HERE/make_tiny_models.py" "$S/models"
    touch "$S/models/.done"
fi
echo "sglang ${VERSION} ready in $(($(date +%s) - started)) s: $S/venv, models in $S/models"
