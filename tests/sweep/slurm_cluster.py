"""A throwaway SLURM cluster on this machine, for tests: one `slurmctld` and two `slurmd` nodes, started as root in
a temporary folder and torn down without a trace. Not a test file: tests take the `slurm` fixture from here.

    from tests.sweep import slurm_cluster
    slurm = slurm_cluster.slurm  # the module-scoped fixture (an assignment: ruff's F811 flags a re-used import)

    def test_something(slurm):
        p = slurm.run(["srun", "-N2", "-n2", "hostname"])       # SLURM_CONF set: the throwaway cluster
        assert sorted(p.stdout.split()) == ["node1", "node2"]

or, outside pytest, `with cluster() as c: ...` (the same Cluster object).

The layout (the daemons are Debian's `slurm-wlm` and `munge`, which .ci/run installs; no system service is used):

  * munged with its own key, socket, pid, seed and log files in the folder; slurm.conf points every daemon and
    client at that socket (AuthInfo=socket=...);
  * a Linux bridge in the root network namespace holding 10.228.X.1/24 (X picked free at start), where slurmctld
    listens on a free port;
  * per node a network namespace `plx<tag>n1` / `plx<tag>n2` joined to the bridge by a veth pair (`plx<tag>v1`,
    `plx<tag>v2`); inside it the node's own address 10.228.X.11 / .12 on `eth0` (they exist only there and on the
    bridge) and loopback;
  * slurmd -D -N nodeN entered into that namespace with `nsenter --net` (not `ip netns exec`, which remounts /sys
    and so hides /sys/fs/cgroup, without which slurmd 22.05 refuses to start), then `unshare --mount --uts`: its
    own hostname, the node name (so `hostname` in a task says node1 / node2), and a private bind of the folder's
    `hosts` over /etc/hosts naming node1, node2 and the controller, so a task resolves the names
    `scontrol show hostnames` gives (a c10d / gloo rendezvous by node name works); its spool, pid and log files are
    named after the node (%n);
  * clients (srun, sbatch, squeue, scontrol, scancel, sinfo) run in the root namespace with SLURM_CONF pointing at
    the folder's slurm.conf; slurmd reaches srun back over the bridge.

No cgroups (proctrack/linuxproc, task/none) and no accounting (no slurmdbd: `sacct` does not work; use
`scontrol show job`, kept MinJobAge seconds after the end). Teardown kills every process in the node namespaces
(`ip netns pids`: slurmd, slurmstepd, tasks), the daemons' process groups and munged, and deletes the namespaces,
veths, bridge and folder. A test process killed with SIGKILL leaves them behind (`ip netns list | grep ^plx`).

Without root, the programs or `ip netns`, `unavailable()` says why; the fixture skips with that reason, or fails
when PARALLAX_REQUIRE_SLURM=1 (set by .ci/run once it has installed SLURM).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.sweep.slurm_programs import (  # noqa: F401 (NODES, required, unavailable: this module's face too)
    CGROUP_CONF,
    NODE_LINE,
    NODES,
    SLURM_CONF,
    START_TIMEOUT_S,
    _free_port,
    _free_subnet,
    _kill_group,
    _kill_netns,
    _prog,
    _sh,
    _tail,
    required,
    unavailable,
)


@dataclass
class Cluster:
    base: Path
    conf: Path
    env: dict  # os.environ + SLURM_CONF: for every client command
    nodes: dict  # node name -> address (inside its namespace and on the bridge)
    netns: dict  # node name -> network namespace name
    controller: tuple  # (name, address, port)
    daemons: dict = field(default_factory=dict)  # munged, slurmctld, node1, node2 -> pid
    links: list = field(default_factory=list)  # the bridge and the root-side veths
    timings: dict = field(default_factory=dict)

    def run(self, argv, timeout: float = 60, check: bool = False, **kw) -> subprocess.CompletedProcess:
        """A client command against this cluster (SLURM_CONF set), text output captured."""
        p = subprocess.run(
            [str(a) for a in argv],
            env={**self.env, **kw.pop("env", {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )
        if check and p.returncode:
            raise AssertionError(f"{argv} failed (rc {p.returncode}):\n{p.stdout}{p.stderr}\n{self.logs()}")
        return p

    def job(self, job_id) -> dict:
        """`scontrol show job -o ID` as a dict (JobState, NodeList, ExitCode, ...); {} once it is forgotten."""
        p = self.run(["scontrol", "show", "job", "-o", str(job_id)])
        if p.returncode:
            return {}
        return dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)

    def wait_state(self, job_id, states, timeout: float = 60) -> dict:
        states = {states} if isinstance(states, str) else set(states)
        deadline, info = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {info}\n{self.logs()}")

    def node_states(self) -> dict:
        p = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
        return dict(line.split(None, 1) for line in p.stdout.splitlines() if line.strip())

    def logs(self, n: int = 2500) -> str:
        parts = [f"--- {f.name} (tail)\n{_tail(f, n)}" for f in sorted((self.base / "log").glob("*.log"))]
        return "\n".join(parts)


class _Teardown:
    """Undo list, run in reverse order; every step best effort."""

    def __init__(self):
        self.steps = []

    def add(self, fn, *args):
        self.steps.append((fn, args))

    def run(self):
        while self.steps:
            fn, args = self.steps.pop()
            with contextlib.suppress(Exception):
                fn(*args)


@contextlib.contextmanager
def cluster(cpus_per_node: int = 2):
    """Start the throwaway cluster; yields a Cluster; tears everything down on exit."""
    reason = unavailable()
    if reason:
        raise RuntimeError(f"cannot start a SLURM cluster: {reason}")
    t0 = time.monotonic()
    tag = f"{os.getpid() % 10000:04d}{random.randint(0, 99):02d}"  # short: interface names have 15 characters
    base = Path(tempfile.mkdtemp(prefix="parallax-slurm-", dir="/tmp"))
    os.chmod(base, 0o755)
    undo = _Teardown()
    undo.add(shutil.rmtree, base, True)
    try:
        for d in ("state", "spool", "log", "munge", "munge-run"):
            (base / d).mkdir()
        os.chmod(base / "munge", 0o700)  # the key's folder; the socket's (munge-run) stays 0755

        # --- munge
        key = base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = base / "munge-run" / "munge.socket"
        munged = subprocess.Popen(
            [
                _prog("munged"),
                "-F",
                "-f",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={base / 'munge-run' / 'munged.pid'}",
                f"--seed-file={base / 'munge' / 'munged.seed'}",
                f"--log-file={base / 'log' / 'munged.log'}",
                "--num-threads=2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(base / "log" / "munged.stderr.log", "w"),
            start_new_session=True,
        )
        undo.add(_kill_group, munged)

        # --- network: a bridge in the root namespace, one namespace per node on a veth pair
        x = _free_subnet()
        ctl_addr = f"10.228.{x}.1"
        nodes = {n: f"10.228.{x}.{11 + i}" for i, n in enumerate(NODES)}
        bridge = f"plx{tag}b"
        links = [bridge]
        _sh("ip", "link", "add", bridge, "type", "bridge")
        undo.add(_sh, "ip", "link", "del", bridge)
        _sh("ip", "addr", "add", f"{ctl_addr}/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        ctl_name = socket.gethostname().split(".")[0]
        hosts = f"127.0.0.1 localhost\n{ctl_addr} {ctl_name}\n" + "".join(f"{a} {n}\n" for n, a in nodes.items())
        (base / "hosts").write_text(hosts)
        netns = {}
        for i, (name, addr) in enumerate(nodes.items(), 1):
            ns, veth = f"plx{tag}n{i}", f"plx{tag}v{i}"
            _sh("ip", "netns", "add", ns)
            undo.add(_sh, "ip", "netns", "del", ns)
            undo.add(_kill_netns, ns)
            netns[name] = ns
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            undo.add(_sh, "ip", "link", "del", veth)
            links.append(veth)
            _sh("ip", "link", "set", veth, "master", bridge, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")

        # --- munged up?
        deadline = time.monotonic() + 10
        while not sock.exists():
            if munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"munged did not start (rc {munged.poll()}):\n{_tail(base / 'log' / 'munged.log')}"
                    f"{_tail(base / 'log' / 'munged.stderr.log')}"
                )
            time.sleep(0.05)

        # --- slurm.conf, slurmctld, slurmd x2
        ctl_port = _free_port()
        conf = base / "slurm.conf"
        conf.write_text(
            SLURM_CONF.format(
                ctl_name=ctl_name,
                ctl_addr=ctl_addr,
                ctl_port=ctl_port,
                munge_socket=sock,
                base=base,
                nodes="\n".join(NODE_LINE.format(name=n, addr=a, cpus=cpus_per_node) for n, a in nodes.items()),
                node_list=",".join(nodes),
            )
        )
        (base / "cgroup.conf").write_text(CGROUP_CONF)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        for var in [v for v in env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_"))]:
            if var != "SLURM_CONF":
                del env[var]
        ctld = subprocess.Popen(
            [_prog("slurmctld"), "-D", "-i", "-f", str(conf)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(base / "log" / "slurmctld.stderr.log", "w"),
            start_new_session=True,
        )
        undo.add(_kill_group, ctld)
        slurmds = {}
        for name, ns in netns.items():
            (base / "spool" / name).mkdir()
            # not `ip netns exec`: it remounts /sys, hiding /sys/fs/cgroup, and slurmd's start needs that; our own
            # mount namespace instead, for the node's /etc/hosts (a private bind) and UTS namespace (hostname)
            argv = [
                "nsenter",
                f"--net=/run/netns/{ns}",
                "unshare",
                "--mount",
                "--uts",
                "sh",
                "-c",
                f"mount --bind {base / 'hosts'} /etc/hosts && hostname {name} && "
                f"exec {_prog('slurmd')} -D -N {name} -f {conf}",
            ]
            slurmds[name] = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(base / "log" / f"slurmd-{name}.stderr.log", "w"),
                start_new_session=True,
            )
            undo.add(_kill_group, slurmds[name])
        c = Cluster(
            base=base,
            conf=conf,
            env=env,
            nodes=nodes,
            netns=netns,
            controller=(ctl_name, ctl_addr, ctl_port),
            daemons={"munged": munged.pid, "slurmctld": ctld.pid, **{n: p.pid for n, p in slurmds.items()}},
            links=links,
        )

        # --- wait until both nodes are idle
        deadline, states = time.monotonic() + START_TIMEOUT_S, {}
        while True:
            dead = {n: p.returncode for n, p in {"slurmctld": ctld, **slurmds}.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"SLURM daemon(s) exited: {dead}\n{c.logs()}")
            states = c.node_states()
            if len(states) == len(NODES) and all(s.startswith("idle") for s in states.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not idle after {START_TIMEOUT_S} s: {states}\n{c.logs()}")
            time.sleep(0.2)
        c.timings["start_s"] = round(time.monotonic() - t0, 2)
        yield c
    finally:
        t1 = time.monotonic()
        undo.run()
        with contextlib.suppress(NameError):
            c.timings["teardown_s"] = round(time.monotonic() - t1, 2)


@pytest.fixture(scope="module")
def slurm():
    """The throwaway cluster for a test module; skipped with the reason where it cannot start, failed instead
    when PARALLAX_REQUIRE_SLURM=1."""
    reason = unavailable()
    if reason:
        if required():
            pytest.fail(f"SLURM is required here (PARALLAX_REQUIRE_SLURM=1) but {reason}")
        pytest.skip(f"SLURM cluster test skipped: {reason}")
    with cluster() as c:
        print(f"FIGURE slurm_cluster_start_s={c.timings['start_s']}")
        yield c
