#!/usr/bin/env bash
# Install Debian's PostgreSQL server when it is missing, for the store's PostgreSQL tests.
# The tests start their own throwaway cluster on loopback; nothing here starts a service.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "PostgreSQL is not installed and this user cannot apt-get it; its tests will fail." >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends postgresql >/dev/null
