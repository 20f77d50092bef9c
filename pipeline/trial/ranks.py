"""A trial's ranks, started by PyTorch's elastic launcher, which also returns each rank's result or names the failed
rank: one process per device (ddp, ddp_amp, fsdp), or one process for a strategy that drives all its devices from
one (single, scratch, dp, dp_criterion).

Never the caller's process, so every trial has its time budget: a call that never returns (DataParallel's NCCL
broadcast on a host with broken P2P) can only be stopped from outside; a stopped rank leaves its Python stacks in
stacks-rank<r>.txt. A long-lived caller (sweep, doctor) keeps none of a trial's device state (CUDA contexts, the
caching allocator's reserve). Cost: the launcher's start and stop and the ranks' start (start.py: fork on CPU shares
the loaded data; on GPUs each rank is a fork of a server with torch loaded, which maps the data files).

The main rank reports each epoch through files in the trial directory (progress.jsonl, answered by ack-<epoch>),
so the caller's callback (MLflow logging, Optuna pruning) runs in the caller's process, also across nodes.

A rank that cannot write the trial directory (a full disk, a quota, a read-only or failing file system) fails the
trial with kind `unwritable`, naming the directory: the host's fault, which a sweep runs again, not the trial's.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import gc
import importlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch

from pipeline import paths
from pipeline.data import store
from pipeline.errors import Interrupted, TrialFailed
from pipeline.host import loopback
from pipeline.host.capabilities import fp32_pinned, tf32_flags, tf32_text
from pipeline.host.devices import Host, probe
from pipeline.rank_env import RankEnv
from pipeline.records import files
from pipeline.strategies import STRATEGIES
from pipeline.trial import node_addr, start
from pipeline.trial.loop import train
from pipeline.trial.outcome import unwritable
from pipeline.trial.rank_watch import failure_reason, stacks_kept, watch_epochs
from pipeline.trial.rdzv_watch import RendezvousWatch

# in the trial directory: each rank's first sampled step as a Chrome trace (measure/chrome_trace.py)
TRACE_DIR = "trace"


class FolderUnwritable(OSError):
    """A rank could not write the trial directory; its name in a failed rank's message marks the trial
    UNWRITABLE."""


@contextlib.contextmanager
def _writing(path: Path):
    """A rank's write of `path`, in the trial directory: a write the host refuses is raised as FolderUnwritable."""
    try:
        yield
    except Exception as e:
        if not files.is_write_fault(e):
            raise
        if isinstance(e, OSError):
            raise FolderUnwritable(e.errno, e.strerror or str(e), str(path)) from None
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise FolderUnwritable(errno.EIO, f"torch could not write the whole file ({first})", str(path)) from None


class _NoUnwritableTraceback(logging.Filter):
    """The launcher logs a failed rank's traceback (some 70 lines); a rank that could not write the trial directory
    is said once, by the trial's failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or FolderUnwritable.__name__ not in str(exc)


logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_NoUnwritableTraceback())


def load_data(cfg, verify: bool = False) -> store.Dataset:
    root = paths.repo_root() / cfg.data.dir if not os.path.isabs(cfg.data.dir) else Path(cfg.data.dir)
    return store.load(root, cfg.data.source, cfg.data.train_limit, cfg.data.test_limit, verify=verify)


# ----------------------------------------------------------------------------- one process

_DATA: store.Dataset | None = None  # set before forking, so forked ranks share it instead of re-reading
_WAKE: tuple[int, int] | None = None  # (read, write) pipe, set before forking: rank 0 wakes the epoch watcher


def _progress_bar(enabled: bool, label: str):
    if not enabled:
        return None
    from tqdm import tqdm

    bars = {}

    def update(epoch, i, steps):
        bar = bars.get(epoch)
        if bar is None:
            for b in bars.values():
                b.close()
            bar = bars[epoch] = tqdm(
                total=steps,
                desc=f"{label} epoch {epoch + 1}",
                unit="step",
                leave=False,
                dynamic_ncols=True,
                mininterval=0.5,
            )
        bar.update(1)
        if i == steps:
            bar.close()

    return update


def _run_process(cfg, rank_env: RankEnv, data, on_epoch, progress: bool, marks: dict | None = None) -> dict:
    """This rank's training: the trial's strategy built and set up, `train` run under the trial's fp32 precision, the
    strategy torn down."""
    strategy = STRATEGIES[cfg.train.strategy](cfg.train, probe())
    device = strategy.setup(rank_env=rank_env)
    try:
        label = f"{cfg.train.strategy} k={cfg.train.devices}"
        # pinned in each process: a spawned rank starts with torch's TF32 defaults, whatever its parent set
        with fp32_pinned(cfg.train.fp32_precision != "default", tf32=cfg.train.fp32_precision == "tf32"):
            return {
                **train(
                    cfg,
                    strategy,
                    data,
                    on_epoch=on_epoch,
                    progress=_progress_bar(progress and strategy.is_main(), label),
                    marks=marks,
                ),
                # the switches it trained under, where CUDA runs (on a CPU they change no arithmetic: None)
                "tf32": tf32_text(tf32_flags()) if device.type == "cuda" else None,
            }
    finally:
        strategy.teardown()


def _file_reporter(out_dir: Path, wait_for_ack: bool, timeout_s: float):
    """on_epoch for the main rank of a multi-process trial: append the record, wait for the caller's answer. The
    other ranks wait for this rank's verdict inside a collective that times out after train.timeout_s, so the answer
    is awaited for half that: an answer that comes later (a tracking server stalled) is taken at the next epoch."""

    def report(record: dict) -> bool:
        with _writing(out_dir / "progress.jsonl"), open(out_dir / "progress.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if _WAKE is not None:
            os.write(_WAKE[1], b"!")  # the file is the record; the byte only saves the watcher's polling delay
        if not wait_for_ack:
            return False
        ack = out_dir / f"ack-{record['epoch']}"
        deadline = time.monotonic() + timeout_s / 2
        while not ack.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return any(_said_stop(out_dir / f"ack-{e}") for e in range(1, record["epoch"] + 1))

    return report


def _said_stop(ack: Path) -> bool:
    try:
        return ack.read_text().strip() == "stop"
    except OSError:  # not answered yet
        return False


def _exit_with_agent() -> None:
    """Die with the agent: a worker blocked in a collective when its agent is SIGKILLed would otherwise linger
    until the collective times out (the kernel's parent-death signal only reaches the Python handler later)."""
    agent = os.getppid()

    def watch():
        while os.getppid() == agent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parallax-agent-watch").start()


_STACKS = None  # the open file a stopped rank writes its Python stacks to


def _stacks_on_stop(path: Path) -> None:
    """On the launcher's SIGTERM (a trial over its budget, an interrupt, a lost node), write every thread's Python
    stack to `path`, then end as SIGTERM does: its default action, passed on by faulthandler's chain. A forked rank
    would otherwise pass it on to the agent's Python handler it inherits, which raises SignalException wherever the
    main thread is (inside a weakref callback Python prints it as "Exception ignored" and the rank goes on); a
    spawned or forkserver rank has the default already. faulthandler writes from the C signal handler, so it also
    answers while the main thread is blocked in C (a collective that never returns)."""
    global _STACKS
    with _writing(path):
        _STACKS = open(path, "w")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    faulthandler.register(signal.SIGTERM, file=_STACKS, all_threads=True, chain=True)


def rank_entry(cfg, out_dir: str, wait_for_ack: bool, progress: bool, env: dict | None = None) -> dict:
    """Entry point of each worker process started by the elastic launcher. `cfg`: the trial's Config as its caller
    built it (shared by fork, pickled otherwise), used as it is: never rebuilt or validated again here. `env`: the
    caller's environment changes a forkserver's rank takes (start.env_delta)."""
    # forked from the trial's parent: its Python objects (torch, MLflow, Optuna: hundreds of thousands) are never
    # garbage here, so keep the collector off them (a full collection at teardown walked them all and copied the
    # shared pages it touched)
    gc.freeze()
    start.apply_env(env or {})
    marks = {"entered": time.time()}  # the trial's timeline (timeline.json): where its fixed cost goes
    _exit_with_agent()
    rank_env = RankEnv.read()  # the launcher's environment, read here only and passed down
    rank = rank_env.rank
    _stacks_on_stop(Path(out_dir) / f"stacks-rank{rank}.txt")
    for module in (*start.IMPORTS, *STRATEGIES[cfg.train.strategy].HEAVY_MODULES):  # loaded already unless spawned
        importlib.import_module(module)
    marks["imported"] = time.time()
    data = _DATA if _DATA is not None else load_data(cfg)
    marks["data"] = time.time()
    on_epoch = _file_reporter(Path(out_dir), wait_for_ack, cfg.train.timeout_s)
    result = _run_process(cfg, rank_env, data, on_epoch, progress, marks)
    if result["state_dict"] is not None:  # whole or not at all: a full disk leaves no final_state.pt cut short
        path = Path(out_dir) / "final_state.pt"
        with _writing(path), files.replacing(path, "wb") as f:
            torch.save(result.pop("state_dict"), f)
    result.pop("state_dict", None)
    trace = result.pop("trace", None)
    if trace is not None:  # this rank's first sampled step, where the tools that read Chrome traces look
        path = Path(out_dir) / TRACE_DIR / f"rank{rank}.pt.trace.json"
        with _writing(path):
            path.parent.mkdir(exist_ok=True)
            files.write_text(path, json.dumps(trace))
    result["node"] = rank_env.node
    result["local_rank"] = rank_env.local_rank
    marks["returned"] = time.time()
    result["timeline"] = marks
    return result


# ----------------------------------------------------------------------------- many processes

_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _remove_orphaned_scratch() -> None:
    """The trial folders of sweeps that were SIGKILLed (their pid no longer runs): a killed process removes nothing."""
    for d in Path(tempfile.gettempdir()).glob("parallax-trial-*-*"):
        try:
            os.kill(int(d.name.split("-")[2]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, OSError):  # not ours, or another user's live process
            pass


@contextlib.contextmanager
def _tempdir(path: str):
    """tempfile's default folder, for this process and the ranks it forks, while the trial runs."""
    previous = tempfile.tempdir
    tempfile.tempdir = path
    try:
        yield
    finally:
        tempfile.tempdir = previous


def _watch(out_dir: Path, on_epoch, stop, wake_fd, failed: list) -> None:
    """watch_epochs, whose own error (its answer to an epoch refused by a full disk) goes to `failed` like the caller's,
    for the caller to raise once the ranks end, rather than ending the thread with a traceback."""
    try:
        watch_epochs(out_dir, on_epoch, stop, wake_fd, failed)
    except Exception as e:
        failed.append(e)


def _raise_unwritable(e: BaseException, out_dir: Path) -> None:
    """`e` as the trial's UNWRITABLE failure where it is this process's write of the trial directory refused."""
    name = getattr(e, "filename", None)
    if files.is_write_fault(e) and name and Path(name).parent == out_dir:
        raise unwritable(out_dir, e) from None


def rendezvous_args(t) -> dict:
    """LaunchConfig's rendezvous arguments for train config `t`."""
    if t.nnodes == 1 and not t.rdzv_endpoint:
        # one node: a static rendezvous (the dynamic one costs ~0.4 s a trial), listening on 127.0.0.1
        return {
            "rdzv_backend": loopback.register(),
            "rdzv_endpoint": "",
            "rdzv_configs": {},
            "run_id": f"parallax-{uuid.uuid4().hex[:8]}",
        }
    # torchrun's c10d rendezvous: node 0 hosts the store at rdzv_endpoint, the others connect to it; this node is
    # known to them by train.local_addr, or by its host name (torch's default)
    return {
        "rdzv_backend": "c10d",
        "rdzv_endpoint": t.rdzv_endpoint,
        "run_id": t.rdzv_id,
        "rdzv_configs": {"is_host": t.node_rank == 0},
        "local_addr": t.local_addr or None,
    }


class _Budget:
    """A trial's time budget: once `timeout_s` is spent (None: never), this process sends itself SIGTERM, which the
    agent turns into an orderly shutdown of every worker; `over` says it happened."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s, self.over = timeout_s, threading.Event()
        self.timer = threading.Timer(timeout_s, self._spent) if timeout_s else None

    def _spent(self) -> None:
        self.over.set()
        os.kill(os.getpid(), signal.SIGTERM)

    def start(self) -> None:
        if self.timer:
            self.timer.start()

    def cancel(self) -> None:
        if self.timer:
            self.timer.cancel()


def _launch_config(t, start_method: str, log_dir: str):
    """The elastic launcher's LaunchConfig for train config `t`: one process per device of this node where the
    strategy runs one per device, else one; no restarts; the agent's logs in `log_dir`."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=t.nnodes,
        max_nodes=t.nnodes,
        nproc_per_node=t.devices // t.nnodes if STRATEGIES[t.strategy].multiprocess else 1,
        **rendezvous_args(t),
        max_restarts=0,
        monitor_interval=0.05,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )


def _raise_trial_failure(e: Exception, t, out_dir: Path, watch: RendezvousWatch | None, budget: _Budget) -> None:
    """The launcher's error `e` raised as the trial's failure: the rendezvous host lost, a failed rank (its reason;
    UNWRITABLE where it could not write the trial directory), the budget spent, an interrupt. Returns where `e` is
    none of these, for the caller to raise as it is."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if watch and watch.lost:
        raise TrialFailed(
            f"lost the rendezvous host {t.rdzv_endpoint} (node 0): it did not answer for "
            f"{t.timeout_s:.0f} s (train.timeout_s): node 0 never started, stopped or died, or "
            f"the network between the nodes is down; this node's ranks were stopped. Check node "
            f"0's output and the link between the nodes, then run the trial again on every node.",
            "worker_died",
        ) from None
    if isinstance(e, ChildFailedError):
        reason = failure_reason(e)
        if FolderUnwritable.__name__ in str(reason):
            why = str(reason).replace(f"{FolderUnwritable.__name__}: ", "")
            raise unwritable(out_dir, why) from None
        raise reason from None
    if not isinstance(e, SignalException):
        return
    if budget.over.is_set():
        raise TrialFailed(
            f"trial exceeded its time budget of {budget.timeout_s:.0f} s (sweep.trial_timeout_s); "
            f"every worker was stopped{stacks_kept(out_dir)}",
            "timeout",
        ) from None
    raise Interrupted(e.sigval) from None  # exit 128 + the signal: 130 for SIGINT, 143 for SIGTERM


def _remove_unnamed_stacks(out_dir: Path, timed_out: bool) -> None:
    """The ranks' stack files removed, but for the non-empty ones of a trial stopped at its budget: its failure names
    them."""
    for f in out_dir.glob("stacks-rank*.txt"):
        if not timed_out or not f.stat().st_size:
            f.unlink(missing_ok=True)


def _remove_answers(out_dir: Path) -> None:
    """The watcher's answers to the main rank (ack-<epoch>) removed once the ranks have ended: they are the trial's
    scratch, read by no one after it, and a finished trial's folder holds its record and its ranks' files only. A
    folder that refuses the removal keeps them (launch.run_trial's _STALE removes them before the next trial)."""
    for f in out_dir.glob("ack-*"):
        with contextlib.suppress(OSError):
            f.unlink(missing_ok=True)


def _close_wake() -> None:
    """The pipe through which rank 0 wakes the epoch watcher, closed once the ranks end."""
    global _WAKE
    if _WAKE is not None:
        for fd in _WAKE:
            os.close(fd)
        _WAKE = None


def _restore_signals(handlers: dict) -> None:
    """The signal handlers the agent replaced, set back; only the main thread sets handlers (the agent too)."""
    if threading.current_thread() is threading.main_thread():
        for s, h in handlers.items():
            signal.signal(s, h)


def _launch(cfg, host: Host, out_dir: Path, on_epoch, progress: bool, timeout_s: float | None) -> list[dict]:
    """Every rank's result, in rank order, from the elastic launcher; its errors raised as the trial's failures."""
    from torch.distributed.launcher.api import elastic_launch

    t = cfg.train
    standalone = t.nnodes == 1 and not t.rdzv_endpoint
    start_method = start.resolve(t.start_method, host.kind)
    stop, budget = threading.Event(), _Budget(timeout_s)
    # the agent installs handlers that raise SignalException and never removes them: restored below, so a Ctrl-C
    # between trials is a KeyboardInterrupt again (and a late SIGTERM ends the process as it would have)
    handlers = {s: signal.getsignal(s) for s in _AGENT_SIGNALS}
    global _DATA, _WAKE
    _DATA = load_data(cfg) if start_method == "fork" else None
    _WAKE = os.pipe() if start_method == "fork" and standalone else None
    failed: list[BaseException] = []  # the error of the caller's on_epoch, if any
    watcher = threading.Thread(
        target=_watch, args=(out_dir, on_epoch, stop, _WAKE[0] if _WAKE else None, failed), daemon=True
    )
    start.prepare(start_method, STRATEGIES[t.strategy].HEAVY_MODULES)
    # the agent's logs (/tmp/torchelastic_*) and torch.multiprocessing's error files (/tmp/pytorch-errorfile-*,
    # named in the system temp dir before forking, never removed) go to a folder of this trial's, removed below
    _remove_orphaned_scratch()
    scratch = tempfile.mkdtemp(prefix=f"parallax-trial-{os.getpid()}-")
    lc = _launch_config(t, start_method, scratch)
    watcher.start()
    budget.start()
    # a node that does not host the rendezvous ends its trial once node 0's store stops answering (rdzv_watch.py)
    watch = RendezvousWatch(t.rdzv_endpoint, t.timeout_s) if t.nnodes > 1 and t.node_rank else None
    try:
        with (
            loopback.collectives_on_loopback() if standalone else node_addr.collectives_on(t.local_addr),
            _tempdir(scratch),
            watch or contextlib.nullcontext(),
        ):
            results = elastic_launch(lc, rank_entry)(
                cfg, str(out_dir), on_epoch is not None, progress, start.env_delta(start_method)
            )
    except Exception as e:
        _raise_trial_failure(e, t, out_dir, watch, budget)
        raise
    finally:
        _remove_unnamed_stacks(out_dir, budget.over.is_set())
        budget.cancel()
        stop.set()
        watcher.join()
        _remove_answers(out_dir)
        _DATA = None
        shutil.rmtree(scratch, ignore_errors=True)
        _close_wake()
        _restore_signals(handlers)
    if failed:
        _raise_unwritable(failed[0], out_dir)
        raise failed[0]
    return [results[r] for r in sorted(results)]


def run_ranks(cfg, host, out_dir: Path, on_epoch, progress, timeout_s) -> list[dict]:
    """Every rank's result: one process per device (ddp, ddp_amp, fsdp), or one process for a strategy that drives
    its devices from one (single, scratch, dp, dp_criterion); never this process."""
    return _launch(cfg, host, out_dir, on_epoch, progress, timeout_s)
