"""The throwaway SLURM cluster (tests/sweep/slurm_cluster.py) works as a sweep will need it: a real slurmctld and two
slurmd nodes, each in its own network namespace. Skipped visibly without root or the programs; a failure instead
when PARALLAX_REQUIRE_SLURM=1 (.ci/run sets it once it has installed Debian's slurm-wlm and munge).

    .venv/bin/python -m pytest tests/sweep/test_slurm_cluster.py -rP      # timings in the PASSES section
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.sweep import slurm_cluster
from tests.sweep.slurm_cluster import NODES, cluster

slurm = slurm_cluster.slurm  # the module-scoped fixture


def _figure(**kw) -> None:
    print("FIGURE " + " ".join(f"{k}={v}" for k, v in kw.items()))


def test_srun_runs_one_task_on_each_node(slurm):
    t0 = time.monotonic()
    p = slurm.run(["srun", "-N2", "-n2", "--ntasks-per-node=1", "hostname"], check=True)
    assert sorted(p.stdout.split()) == sorted(NODES), p.stdout + p.stderr
    p = slurm.run(["srun", "-N2", "-n2", "sh", "-c", 'echo "$SLURM_PROCID $SLURMD_NODENAME"'], check=True)
    ranks = dict(line.split() for line in p.stdout.splitlines())
    assert sorted(ranks.values()) == sorted(NODES) and sorted(ranks) == ["0", "1"], p.stdout
    _figure(srun_2x_s=round(time.monotonic() - t0, 2))


def test_sbatch_job_completes_and_scontrol_reports_it(slurm):
    out = slurm.base / "wrap-%j.out"
    p = slurm.run(
        ["sbatch", "--parsable", "-N1", "-n1", "-o", out, "--wrap", 'echo "done on $(hostname) as job $SLURM_JOB_ID"'],
        check=True,
    )
    job = p.stdout.strip().split(";")[0]
    info = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, timeout=30)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    text = (slurm.base / f"wrap-{job}.out").read_text()
    assert text.strip() == f"done on {info['NodeList']} as job {job}", text
    assert info["NodeList"] in NODES


def test_scancel_ends_a_running_job(slurm):
    p = slurm.run(["sbatch", "--parsable", "-N2", "-n2", "-o", "/dev/null", "--wrap", "srun sleep 300"], check=True)
    job = p.stdout.strip().split(";")[0]
    slurm.wait_state(job, "RUNNING", timeout=30)
    deadline = time.monotonic() + 15  # the step's sleeps are running on both nodes
    while not all(_has_sleep(ns) for ns in slurm.netns.values()):
        assert time.monotonic() < deadline, f"no `sleep 300` on both nodes\n{slurm.logs()}"
        time.sleep(0.2)
    t0 = time.monotonic()
    slurm.run(["scancel", job], check=True)
    info = slurm.wait_state(job, "CANCELLED", timeout=30)
    assert job not in slurm.run(["squeue", "-h", "-o", "%i"]).stdout
    deadline = time.monotonic() + 15
    while any(_has_sleep(ns) for ns in slurm.netns.values()):
        assert time.monotonic() < deadline, f"the cancelled job's processes live on\n{slurm.logs()}"
        time.sleep(0.2)
    _figure(scancel_to_gone_s=round(time.monotonic() - t0, 2), state=info["JobState"])


def _has_sleep(ns: str) -> bool:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if argv[0].rsplit(b"/", 1)[-1] == b"sleep" and argv[1:2] == [b"300"]:
                return True
        except OSError:
            pass
    return False


# Each task: torch from this interpreter; task 0 hosts a c10d TCPStore on its node and task 1 reaches it by the
# node name `scontrol show hostnames` gives (as a multi-node trial's rendezvous will), then both join a gloo group
# through that store and all-reduce.
RENDEZVOUS = textwrap.dedent("""
    import datetime, os, socket, subprocess, sys, torch, torch.distributed as dist
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    hosts = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()
    master, port = hosts[0], 29511
    store = dist.TCPStore(master, port, world, is_master=(rank == 0), timeout=datetime.timedelta(seconds=30))
    store.set(f"from{rank}", socket.gethostname())
    peer = store.get(f"from{1 - rank}").decode()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(rank, socket.gethostname(), socket.gethostbyname(socket.gethostname()), master, peer, t.item(),
          torch.__version__, sys.executable, flush=True)
    dist.destroy_process_group()
""")


def test_torch_tasks_on_two_nodes_rendezvous_over_tcp(slurm):
    script = slurm.base / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    t0 = time.monotonic()
    p = slurm.run(
        ["srun", "-N2", "-n2", "--ntasks-per-node=1", "--time=2", sys.executable, script], timeout=120, check=True
    )
    rows = sorted(line.split() for line in p.stdout.splitlines() if line[:1].isdigit())
    assert [r[0] for r in rows] == ["0", "1"], p.stdout + p.stderr
    (r0, h0, a0, m0, peer0, s0, v0, py0), (r1, h1, a1, m1, peer1, s1, v1, py1) = rows
    assert {h0, h1} == set(NODES) and peer0 == h1 and peer1 == h0
    assert a0 == slurm.nodes[h0] and a1 == slurm.nodes[h1]  # each node's own namespace address
    assert m0 == m1 == h0  # the rendezvous host is task 0's node, reached by name from the other node
    assert float(s0) == float(s1) == 3.0
    import torch

    assert v0 == v1 == torch.__version__ and py0 == py1 == sys.executable
    _figure(torch_rendezvous_s=round(time.monotonic() - t0, 2))


def test_teardown_leaves_nothing_behind(slurm):
    """A second cluster beside the module's (its own subnet, ports, namespaces) starts, and once closed leaves no
    process, namespace, link or folder."""
    with cluster() as c:
        pids = dict(c.daemons)
        assert c.run(["srun", "-N2", "hostname"], check=True).stdout.split()
    # how long the start took is a figure, not a bound: cluster() fails a start whose nodes are not idle within
    # START_TIMEOUT_S (a loaded CI host takes longer than a quiet one)
    deadline = time.monotonic() + 10
    while True:
        alive = {n: pid for n, pid in pids.items() if _alive(pid)}
        netns = [
            ns
            for ns in c.netns.values()
            if ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        ]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        links = [name for name in c.links if f" {name}:" in links or f" {name}@" in links]
        if not (alive or netns or links or c.base.exists()):
            break
        assert time.monotonic() < deadline, (
            f"left behind: processes {alive}, netns {netns}, links {links}, "
            f"folder {c.base if c.base.exists() else None}"
        )
        time.sleep(0.2)
    assert slurm.node_states() == {n: "idle" for n in NODES}  # the module's cluster is untouched
    _figure(second_cluster_start_s=c.timings["start_s"], teardown_s=c.timings["teardown_s"])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False
