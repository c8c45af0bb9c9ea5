#!/bin/sh
# Install Debian's Chromium for tests/server/test_browser.py, only when it is missing. Playwright drives this browser
# (executable_path=/usr/bin/chromium); never run `playwright install`, which downloads its own browsers.
set -eu
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
/usr/bin/chromium --version
