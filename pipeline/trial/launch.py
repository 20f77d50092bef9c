"""Run one trial: check that it can run here, run its ranks (ranks.py: through PyTorch's elastic launcher, one process
per device or one for a one-process strategy, never this process), and build its record (records/trial.py), written as
out_dir/metrics.json. A directory the host cannot write (a full disk, a quota, a read-only or failing file system)
fails the trial with kind `unwritable` (outcome.UNWRITABLE), naming it.

    python -m pipeline train --strategy ddp --devices 2 --epochs 1 --out runs/ddp2
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import socket
import time
from pathlib import Path

from pipeline import paths
from pipeline.config import loader
from pipeline.errors import Infeasible, TrialFailed  # defined torch-free, for the CLI's error handler
from pipeline.host.capabilities import host_capabilities
from pipeline.host.devices import Host, probe
from pipeline.measure.interference import Monitor
from pipeline.records import files
from pipeline.records.trial import TrialRecord, capability_fields, summarize
from pipeline.strategies import STRATEGIES
from pipeline.trial import graphs, loop, start
from pipeline.trial.loop import DivergenceError
from pipeline.trial.outcome import unwritable
from pipeline.trial.rank_watch import is_out_of_memory
from pipeline.trial.ranks import run_ranks


def total_devices(cfg, host: Host) -> int:
    return host.n * cfg.train.nnodes


def check_feasible(cfg, host: Host) -> None:
    """Raise Infeasible with the reason if this (strategy, k, B) cannot run here."""
    t = cfg.train
    cls = STRATEGIES[t.strategy]
    reason = cls.unavailable_reason(host)
    if reason:
        raise Infeasible(f"strategy `{t.strategy}` is {reason}.")
    n = total_devices(cfg, host)
    if t.devices > n and not t.oversubscribe:
        raise Infeasible(
            f"train.devices={t.devices} exceeds the {n} {host.kind.upper()} device(s) this host offers "
            f"({'GPUs' if host.kind == 'cuda' else 'cores, one 1-thread process each'}); use at most "
            f"{n}. (train.oversubscribe=true allows it for functional tests; such runs are excluded "
            f"from scaling and memory analysis.)"
        )
    if why := loader.knob_refusal(t):
        raise Infeasible(why)
    if why := mode_refusal(t, host, oversubscribed=t.devices > n, n_train=cfg.data.train_limit or None):
        raise Infeasible(why)
    if t.devices % t.nnodes:
        raise Infeasible(
            f"train.devices={t.devices} does not split evenly over train.nnodes={t.nnodes} nodes: "
            f"each node runs devices/nnodes processes; pick a multiple of {t.nnodes}."
        )
    if t.nnodes > 1 and not (cls.multiprocess and t.rdzv_endpoint):
        multi = ", ".join(name for name, c in STRATEGIES.items() if c.multiprocess)
        raise Infeasible(
            f"a trial over train.nnodes={t.nnodes} nodes needs a multi-process strategy ({multi}) "
            f"and train.rdzv_endpoint=HOST:PORT of node 0's rendezvous."
        )
    _check_rendezvous(t)
    if t.nnodes > 1:
        _check_advertised_address(t)
    if host.kind == "cuda" and t.start_method == "fork":
        raise Infeasible(
            "train.start_method=fork cannot run on a CUDA host: this process initialises CUDA when it "
            'probes the GPUs, and a forked process cannot initialise it again (PyTorch: "Cannot '
            're-initialize CUDA in forked subprocess"). Use train.start_method=forkserver or spawn, or auto '
            "(forkserver on GPUs, fork on CPU)."
        )
    if t.batch_size % t.devices:
        raise Infeasible(
            f"train.batch_size={t.batch_size} is not divisible by train.devices={t.devices}: every "
            f"device must get the same share of the global batch; pick a multiple of {t.devices}."
        )
    try:
        cls(t, host).check_devices()
    except ValueError as e:
        raise Infeasible(str(e)) from None


def host_mode_refusal(t, host: Host) -> str:
    """Why a mode set in train config `t` runs with no strategy on `host`'s kind of device, or "": what `doctor`
    refuses before its first row, and mode_refusal's first check."""
    if t.cuda_graphs and host.kind != "cuda":
        return (
            "train.cuda_graphs captures the step as a CUDA graph and needs a GPU; this host is a CPU (on a CPU, "
            "train.compile is the mode that removes per-operator overhead)."
        )
    return ""


def mode_refusal(t, host: Host, oversubscribed: bool, n_train: int | None = None) -> str:
    """Why the execution modes set in train config `t` cannot run together or on `host`, or "": a mode that would
    silently not apply, or a setting of one (catalog.APPLIES_WITH: amp_dtype without autocast), is refused, never
    recorded as run. `n_train`: the training images at most (data.train_limit),
    if known, for a graph the trial would end before capturing."""
    if why := loader.unapplied_refusal(t):  # compile_mode without compile, amp_dtype without autocast, ...
        return why
    if not t.cuda_graphs:
        return ""
    if why := host_mode_refusal(t, host):
        return why
    why = ""
    if oversubscribed:
        why = "ranks sharing a GPU talk over Gloo, whose collectives run on the host and cannot be captured"
    elif t.compile:
        why = "train.compile is on: use compile_mode=reduce-overhead for torch.compile's own CUDA graphs instead"
    elif t.breakdown_every:
        why = "a sampled step times each phase apart, which a replayed graph cannot; set train.breakdown_every=0"
    elif t.accum_steps > 1:
        why = "a graph replays one whole optimizer step; with train.accum_steps > 1 the steps differ"
    elif t.comm_hook != "none":
        why = f"the comm hook {t.comm_hook!r} is not checked under capture; use comm_hook=none"
    elif STRATEGIES[t.strategy].autocast_dtype(t, host.kind) == "fp16":
        why = "fp16 needs GradScaler, whose step reads the host when it skips; use train.amp_dtype=bf16"
    elif t.warmup_steps < graphs.min_warmup(t.strategy):
        at = graphs.capture_step(t.strategy)
        settle = ", past DDP's synchronised iterations (config/settle.py)" if graphs.settles(t.strategy) else ""
        why = (
            f"`{t.strategy}`'s graph is captured after {at} eager steps{settle}, and the capture belongs inside the "
            f"warm-up so that every timed step is a replay; set train.warmup_steps >= {graphs.min_warmup(t.strategy)}"
        )
    else:
        why = _before_capture(t, n_train)
    return f"train.cuda_graphs cannot run here: {why}." if why else ""


def _before_capture(t, n_train: int | None) -> str:
    """Why a graph trial of train config `t` on `n_train` images (None: not known) ends before its capture, or ""."""
    at = graphs.capture_step(t.strategy)
    steps = loop.trial_steps(t, n_train)
    if steps is None or steps > at:
        return ""
    return (
        f"the graph is captured at step {at + 1} of `{t.strategy}` ({at} eager steps first), and this trial runs "
        f"at most {steps} step(s) (train.epochs={t.epochs} x whole batches of train.batch_size={t.batch_size}"
        + (f" in {n_train} images" if n_train is not None else "")
        + (f", train.max_steps={t.max_steps}" if t.max_steps else "")
        + f"): it would end before the capture and record cuda_graphs=true with no graph run; give it at least "
        f"{at + 1} steps"
    )


def _check_rendezvous(t) -> None:
    """Raise Infeasible for multi-node settings with which the nodes can never meet: each node would wait on the
    rendezvous until its timeout, or torch would refuse them with a message that names none of the keys."""
    if t.node_rank >= t.nnodes:
        raise Infeasible(
            f"train.node_rank={t.node_rank} is not a node of train.nnodes={t.nnodes}: the nodes are "
            f"numbered 0..{t.nnodes - 1}, node 0 hosting the rendezvous. Give each node its own rank."
        )
    if not t.rdzv_endpoint:
        return
    host, colon, port = t.rdzv_endpoint.rpartition(":")
    if colon and not host.strip("[]"):
        raise Infeasible(
            f"train.rdzv_endpoint={t.rdzv_endpoint!r} names no host: write HOST:PORT of node 0, e.g. "
            f"10.0.0.1:29500, the same on every node."
        )
    if not (colon and port.isdigit() and 1 <= int(port) <= 65535):
        raise Infeasible(
            f"train.rdzv_endpoint={t.rdzv_endpoint!r} has no valid port (1-65535): write HOST:PORT of "
            f"node 0, e.g. {host or port}:29500, the same on every node."
        )
    if not t.rdzv_id:
        raise Infeasible(
            "train.rdzv_id is empty: torch would give each node a random id, and nodes with different "
            "ids never meet. Give the same id on every node (default: parallax)."
        )


def _addresses(name: str) -> set[str]:
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()


def _loopback_only(addresses: set[str]) -> bool:
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def _check_advertised_address(t) -> None:
    """Without train.local_addr, torch's agent advertises this host's name (socket.getfqdn()) to the other nodes, which
    connect to it for the trial's store; a name that resolves to a loopback address only (Debian's `127.0.1.1 myhost`
    line) is unreachable from another machine, and the trial would fail after a minute without saying why. Nodes that
    all run on this machine (a loopback rendezvous) need no other address."""
    rdzv_host = t.rdzv_endpoint.rsplit(":", 1)[0].strip("[]")
    if t.local_addr or _loopback_only(_addresses(rdzv_host)):
        return
    name = socket.getfqdn()
    addresses = _addresses(name)
    if _loopback_only(addresses):
        raise Infeasible(
            f"this host's name `{name}` resolves only to the loopback address "
            f"{', '.join(sorted(addresses))} (/etc/hosts), so the other nodes of this "
            f"train.nnodes={t.nnodes} trial could not reach it. Set train.local_addr to the address the "
            f"other nodes reach this node at (for example --set train.local_addr=10.0.0.12), or make the "
            f"host name resolve to it."
        )


def check_batch_fits(cfg, n_train: int) -> None:
    """Raise Infeasible if the global batch is larger than the training set (not one full step), or if a CUDA graph
    trial on these `n_train` images ends before its capture (mode_refusal's check, on the data's own count)."""
    b = cfg.train.batch_size
    if b > n_train:
        limit = f", data.train_limit={cfg.data.train_limit}" if cfg.data.train_limit else ""
        raise Infeasible(
            f"train.batch_size={b} is larger than the training set ({n_train} images{limit}): not one "
            f"full step fits. Use a batch of at most {n_train}, or more training data."
        )
    if cfg.train.cuda_graphs and (why := _before_capture(cfg.train, n_train)):
        raise Infeasible(f"train.cuda_graphs cannot run here: {why}.")


_USER_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
# what an earlier trial left in a reused directory: gone before this one starts, so none of it reads as this trial's
_STALE = (
    "ack-*",
    "stacks-rank*.txt",
    "progress.jsonl",
    "final_state.pt",
    "metrics.json",
    "timeline.json",
    "trace/rank*.pt.trace.json",
)


@contextlib.contextmanager
def writing_folder(out_dir: Path):
    """This process's writes of the trial directory: one the host refuses fails the trial as UNWRITABLE."""
    try:
        yield
    except Exception as e:
        if not files.is_write_fault(e):
            raise
        why = f"{type(e).__name__}: {e}"
        raise unwritable(out_dir, why) from None


def run_trial(cfg, out_dir, on_epoch=None, progress: bool = True, timeout_s: float | None = None) -> TrialRecord:
    """Run one trial, write out_dir/metrics.json (the record's JSON view) and out_dir/final_state.pt."""
    entered = time.time()
    out_dir = Path(out_dir)
    with writing_folder(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in [f for pattern in _STALE for f in out_dir.glob(pattern)]:
            stale.unlink(missing_ok=True)
    if not _USER_INDUCTOR_CACHE:  # importing torch._dynamo makes /tmp/torchinductor_<user>: kept in the repo instead
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(paths.repo_root() / "runs" / ".torchinductor")
    host = probe()
    check_feasible(cfg, host)
    strategy = STRATEGIES[cfg.train.strategy](cfg.train, host)
    t0 = time.perf_counter()
    # what else used the host meanwhile (interference.py): recorded with the trial, flagged beyond the threshold
    monitor = Monitor(
        cfg.train.devices,
        host.kind,
        range(min(cfg.train.devices, host.n)),
        threshold=cfg.train.interference_threshold,
        helpers=start.server_pids,
    )
    timeline = {"start_method": start.resolve(cfg.train.start_method, host.kind), "entered": entered}
    try:
        with monitor:
            timeline["launched"] = time.time()
            results = run_ranks(cfg, host, out_dir, on_epoch, progress, timeout_s)
            timeline["returned"] = time.time()
    except DivergenceError as e:
        raise TrialFailed(str(e), "diverged") from None
    except (RuntimeError, MemoryError) as e:  # this process's share (the data it loads before forking the ranks)
        text = f"{type(e).__name__}: {e}"
        if not is_out_of_memory(text):
            raise
        raise TrialFailed(f"ran out of memory preparing the trial: {text.splitlines()[0]}", "oom") from None
    facts = host_fields(host, cfg.train.devices)
    record = summarize(cfg, host, strategy, results, time.perf_counter() - t0, facts, interference=monitor.result())
    timeline["rank0"] = results[0].get("timeline")
    with writing_folder(out_dir):  # each whole or not at all
        files.write_text(out_dir / "metrics.json", json.dumps(record.to_json(), indent=2))
        timeline["written"] = time.time()
        files.write_text(out_dir / "timeline.json", json.dumps(timeline, indent=2))
    return record


@functools.cache
def host_fields(host: Host, devices: int | None = None) -> dict:
    """The host's capabilities as the trial record's host_* fields, read once per process and device count: on a
    GPU host the interconnect is that of the trial's GPUs (CUDA ordinals 0..devices-1, devices.device_for), not of
    every GPU the host has."""
    ordinals = None if devices is None or host.kind != "cuda" else range(min(devices, host.n))
    return capability_fields(host_capabilities(host, ordinals))
