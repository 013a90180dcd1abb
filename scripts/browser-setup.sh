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
"$(dirname "$0")/apt-install.sh" browser-setup chromium
echo "browser ready: $(command -v chromium)"
