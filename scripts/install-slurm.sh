#!/usr/bin/env bash
# Install Debian's Slurm (slurmctld, slurmd, client tools) and munge when they are missing, for
# the Slurm runner's tests and benchmark. Nothing here starts a daemon or writes a Slurm
# config: the tests write a single-node loopback cluster of their own (tests/slurm_cluster.py)
# and start and stop munged, slurmctld and slurmd themselves. Safe to run again.
set -euo pipefail
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "Slurm is not installed and this user cannot apt-get it; the Slurm tests will fail." >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
