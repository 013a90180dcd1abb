#!/usr/bin/env bash
# A real headless browser for the page tests (tests/browser.py): Debian's chromium.
# Nothing when one is there; else apt-get (root) installs it. Never one of orch's dependencies.
set -euo pipefail
for name in chromium chromium-browser google-chrome; do
    if command -v "$name" > /dev/null; then
        echo "browser ready: $(command -v "$name")"
        exit 0
    fi
done
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "browser-setup: install Debian's chromium (apt-get install chromium) as root" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium > /dev/null
echo "browser ready: $(command -v chromium)"
