#!/usr/bin/env bash
# Install Debian's chromium for the browser tests (tests/ui/) when /usr/bin/chromium is missing.
# Playwright drives this system browser; never run `playwright install` (it downloads browsers).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version || true
