#!/usr/bin/env bash
# FUSE for the power-cut harness (tests/crashfs.py): Debian's fuse3 (fusermount3, and
# libfuse3.so.3, which mfusepy loads). Nothing when it is there; else apt-get (root) installs
# it. Never one of orch's dependencies.
set -euo pipefail
if ! command -v fusermount3 > /dev/null || ! ldconfig -p | grep -q 'libfuse3\.so\.3 '; then
    "$(dirname "$0")/apt-install.sh" fuse-setup fuse3
fi
echo "fuse ready: $(command -v fusermount3)"
