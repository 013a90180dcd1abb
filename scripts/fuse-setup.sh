#!/usr/bin/env bash
# FUSE for the crash-state harness (tests/crashfs.py): Debian's fuse3 (fusermount3, and
# libfuse3.so.3, which mfusepy loads). Nothing when it is there; else apt-get (root) installs
# it. Never one of orch's dependencies.
set -euo pipefail
if command -v fusermount3 > /dev/null && ldconfig -p | grep -q 'libfuse3\.so\.3 '; then
    echo "fuse ready: $(command -v fusermount3)"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "fuse-setup: install Debian's fuse3 (apt-get install fuse3) as root" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends fuse3 > /dev/null
echo "fuse ready: $(command -v fusermount3)"
