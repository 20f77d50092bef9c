"""The programs and files a throwaway SLURM cluster needs: which programs must be present, the slurm.conf and
cgroup.conf it writes, and the small process, port and network-namespace helpers slurm_cluster.py starts and stops it
with.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = (
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "srun",
    "sbatch",
    "squeue",
    "scontrol",
    "scancel",
    "sinfo",
    "munged",
    "ip",
    "unshare",
)


NODES = ("node1", "node2")


START_TIMEOUT_S = 45  # both nodes idle within this, or the start fails with the daemons' log tails


SLURM_CONF = """\
# Throwaway cluster for tests (tests/sweep/slurm_cluster.py): root everywhere, no cgroups, no accounting.
ClusterName=parallax
SlurmctldHost={ctl_name}({ctl_addr})
SlurmctldPort={ctl_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=600
TCPTimeout=5
MailProg=/bin/true
{nodes}
PartitionName=main Nodes={node_list} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


# Read by slurmd from slurm.conf's folder. slurmd 22.05 initialises its cgroup plugin even with proctrack/linuxproc
# and task/none; on a cgroup v2 host it would otherwise ask the host's systemd (dbus) for a scope.
CGROUP_CONF = """\
CgroupPlugin=autodetect
IgnoreSystemd=yes
"""


NODE_LINE = "NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={cpus} RealMemory=256 State=UNKNOWN"


def required() -> bool:
    return os.environ.get("PARALLAX_REQUIRE_SLURM", "") not in ("", "0")


def unavailable() -> str | None:
    """Why a cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "not root (the cluster needs network namespaces and runs its daemons as root)"
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return f"missing program(s) {missing}; .ci/run installs Debian's `slurm-wlm munge`"
    name = f"plxprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if p.returncode:
        return f"`ip netns add` fails here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _prog(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _sh(*argv, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=30)
    if check and p.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed (rc {p.returncode}): {p.stdout}{p.stderr}")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _free_subnet() -> int:
    used = _sh("ip", "-4", "-o", "addr").stdout + _sh("ip", "-4", "route").stdout
    for _ in range(200):
        x = random.randint(1, 254)
        if f"10.228.{x}." not in used:
            return x
    raise RuntimeError("no free 10.228.X.0/24 subnet")


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError as e:
        return f"({e})"


def _kill_group(proc: subprocess.Popen, wait: float = 5) -> None:
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_netns(ns: str) -> None:
    """Every process in the namespace (slurmd, slurmstepd, tasks): ours alone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(x) for x in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and _sh("ip", "netns", "pids", ns, check=False).stdout.split():
            time.sleep(0.1)
