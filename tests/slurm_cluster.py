"""A real single-node Slurm cluster on loopback for tests and benchmarks: munged, slurmctld and
slurmd started from a folder of their own, with 4 fake GPUs as gres.

The fake GPUs are character devices made with mknod in that folder (Slurm rejects plain files
as gres devices), so jobs get a real CUDA_VISIBLE_DEVICES. Everything (config, munge key and
socket, state, spool, logs) lives under the folder; ports are free ones, and the cluster name
is unique, so several clusters can run on one machine at once. Needs root (mknod, daemons)
and Debian's Slurm and munge (scripts/install-slurm.sh).

    cluster = SlurmCluster(tmp_dir).start()
    env = cluster.env()          # SLURM_CONF for sbatch, squeue, ... and the engine
    ...
    cluster.stop()
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from servers import free_port

GPUS = 4
CPUS = 16


def slurm_installed() -> bool:
    return all(shutil.which(n) for n in ("slurmctld", "slurmd", "sbatch", "munged"))


class SlurmCluster:
    def __init__(self, root: Path, gpus: int = GPUS, gpu_type: str = "a100", fast: bool = True):
        self.root = Path(root)
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.fast = fast  # schedule at once after a submission (SchedulerParameters)
        self.name = "t" + uuid.uuid4().hex[:8]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self._procs: list[subprocess.Popen[bytes]] = []

    # ------------------------------------------------------------------ config

    def _write_config(self) -> None:
        r = self.root
        for sub in ("munge", "state", "spool", "log", "dev"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)
        devices = []
        for i in range(self.gpus):
            dev = r / "dev" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))  # S_IFCHR
            devices.append(str(dev))
        sched = "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1\n" if self.fast else ""
        self.conf.write_text(
            f"ClusterName={self.name}\n"
            "SlurmctldHost=localhost(127.0.0.1)\n"
            f"SlurmctldPort={free_port()}\nSlurmdPort={free_port()}\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={r / 'spool'}\n"
            f"SlurmctldPidFile={r / 'slurmctld.pid'}\nSlurmdPidFile={r / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}\nSlurmdLogFile={r / 'log' / 'slurmd.log'}\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nGresTypes=gpu\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "SchedulerType=sched/backfill\n" + sched +
            "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
            "JobCompType=jobcomp/none\nSlurmdParameters=config_overrides\n"
            "ReturnToService=2\nKillWait=2\nMinJobAge=300\nInactiveLimit=0\nWaitTime=0\n"
            "SlurmctldTimeout=30\nSlurmdTimeout=30\nMaxArraySize=10001\n"
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=4000 "
            f"Gres=gpu:{self.gpu_type}:{self.gpus} State=UNKNOWN\n"
            "PartitionName=gpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n"
            "PartitionName=urgent Nodes=localhost MaxTime=INFINITE State=UP PriorityTier=10\n"
        )
        (r / "gres.conf").write_text(
            "".join(f"NodeName=localhost Name=gpu Type={self.gpu_type} File={d}\n" for d in devices))

    def env(self) -> dict[str, str]:
        """Environment additions for Slurm's commands (and the engine that runs them)."""
        return {"SLURM_CONF": str(self.conf)}

    #: the nodes, each its own slurmd on loopback (a subclass may name several)
    node_names: tuple[str, ...] = ("localhost",)

    # ------------------------------------------------------------------ daemons

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        if not slurm_installed():
            raise RuntimeError("Slurm and munge are not installed: run scripts/install-slurm.sh")
        self._write_config()
        env = {**os.environ, **self.env()}
        log = self.root / "log"
        self._spawn(["munged", "-F", "--force", f"--socket={self.munge_socket}",
                     f"--key-file={self.root / 'munge' / 'munge.key'}", f"--pid-file={self.root / 'munged.pid'}",
                     f"--log-file={log / 'munged.log'}", f"--seed-file={self.root / 'munge' / 'seed'}"], env)
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged")
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], env)
        for node in self.node_names:
            self._spawn(["slurmd", "-D", "-N", node, "-f", str(self.conf)], env)
        self._wait(self._ready, timeout, "slurmd (nodes idle)")
        return self

    def _ready(self) -> bool:
        return self._node_idle()

    def _spawn(self, cmd: list[str], env: dict[str, str]) -> None:
        out = open(self.root / "log" / f"{cmd[0]}.out", "ab")
        self._procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True))

    def _node_idle(self) -> bool:
        for p in self._procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited ({p.returncode}): {self.logs()[-3000:]}")
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                           env={**os.environ, **self.env()})
        states = set(r.stdout.split())
        return r.returncode == 0 and bool(states) and states <= {"idle", "mixed", "allocated"}

    def _wait(self, cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not come up within {timeout}s:\n{self.logs()[-3000:]}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted((self.root / "log").glob("*")) if p.is_file())

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged (in that order)."""
        subprocess.run(["scancel", "--full", "-u", "root"], env={**os.environ, **self.env()},
                       capture_output=True, timeout=10)
        for p in reversed(self._procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self._procs = []
