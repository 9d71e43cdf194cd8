#!/usr/bin/env bash
# What the multi-user tests need (run as root; idempotent):
# - two test users, gpujobs-u1 and gpujobs-u2 (useradd -m; homes 0750 so neither reads the other's),
#   and gpujobs-admin1 in group gpujobs-test-admins (the shared engine's admins in its tests);
# - with --venv (the default when run without arguments): a venv made from Debian's
#   /usr/bin/python3 in /opt/gpujobs-test (which every user can traverse) with this package
#   installed, for processes that run as those users (a Python under root's home is not theirs to run).
#   GPUJOBS_TEST_VENV names another place.
# `--users` makes the users only.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "install-multiuser.sh: needs root (it adds Unix users); skipped" >&2
    exit 0
fi
getent group gpujobs-test-admins >/dev/null || groupadd gpujobs-test-admins
for user in gpujobs-u1 gpujobs-u2 gpujobs-admin1; do
    if ! id "$user" >/dev/null 2>&1; then
        useradd -m -s /bin/bash "$user"
    fi
    chmod 0750 "$(getent passwd "$user" | cut -d: -f6)"
done
usermod -a -G gpujobs-test-admins gpujobs-admin1  # an admin of the shared engine (c.GPUJobs.admin_group)
[ "${1:-}" = "--users" ] && exit 0

VENV=${GPUJOBS_TEST_VENV:-/opt/gpujobs-test}
if [ ! -x /usr/bin/python3 ]; then
    apt-get install -y -q python3 python3-venv >/dev/null
fi
if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    /usr/bin/python3 -m venv "$VENV" || { apt-get install -y -q python3-venv >/dev/null && /usr/bin/python3 -m venv "$VENV"; }
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q .   # a copy, not a link into this (maybe private) checkout
chmod -R a+rX "$VENV"
