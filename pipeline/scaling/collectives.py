"""Communication measured on the host: the collectives each strategy issues, timed at the sizes its trials use and at
several more, for k = 2..N of this host's devices, with each collective's latency alpha (s) and bus bandwidth beta
(bytes/s) fitted by least squares.

    python -c "import json, pipeline.scaling.collectives as c; print(json.dumps(c.measure(), indent=1))"
    python -m benchmarks.scaling.model_check      # measures these, then checks the scaling model against trials

What is timed (float32 buffers; the same ranks, devices and transports as the trials):
  allreduce          dist.all_reduce: DDP's gradient buckets (Gloo on CPU with comm_hook=none, NCCL on GPUs)
  allreduce_shm      pipeline/strategies/shm_allreduce.py: DDP's buckets with comm_hook=shm on one CPU host
  allgather          dist.all_gather_single: FSDP2's parameter all-gather (per unit, before forward/backward)
  reduce_scatter     dist.reduce_scatter_single: FSDP2's gradient reduce-scatter (per unit)
  scratch_allreduce  strategies/scratch.py's allreduce over k in-process replicas (on CPU: memory copies, one core)
  dp_copy, dp_scatter  torch.nn.parallel.comm broadcast / scatter (dp, dp_criterion): CUDA only, else unavailable
Ranks are started by PyTorch's elastic launcher (stage_ranks.py: rendezvous and Gloo on 127.0.0.1 only), one per
device, pinned one per core on CPU, one thread each. Each repeat is timed after a barrier, in two modes: back to
back, and after `gap_s` of compute (how a training step issues them: Gloo's threads have gone idle by then). On GPUs
a back-to-back repeat is `ops_per_sync` ops between one synchronise before and one after, reported per op, as
nccl-tests times them: one host sync and Python's overhead per op are as long as a small NCCL op and would inflate
alpha. A repeat's time is the collective's cost to the rank that arrived last (the fastest rank's duration: the
others also waited for it, which a step breakdown counts as waiting for the slowest rank, not as communication); the
slowest rank's is kept beside it.
Rank 0 times the in-process ops alone, the other ranks waiting on a store key (host-side): a barrier there would be an
NCCL kernel spinning on the GPUs the copies use, time-sliced against them (other processes' contexts, no MPS).
beta follows nccl-tests: all-reduce moves 2(k-1)/k * S per device, all-gather / reduce-scatter (k-1)/k * S (S the
whole tensor), scratch 2(k-1) * S, dp copies (k-1) * S and dp scatter (k-1)/k * S; the fit weights each size by
1 / time^2, so small messages (latency) and large ones (bandwidth) count alike.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import time

import torch
import torch.distributed as dist

from pipeline import catalog
from pipeline.config.schema import CollectivesConfig
from pipeline.rank_env import RankEnv
from pipeline.scaling.model import BUS_FACTOR, collectives_of, model_layout, step_collectives

MODES = ("back_to_back", "after_compute")


def fit_bytes(n: int) -> tuple[int, ...]:
    """The message sizes the alpha-beta fit spans besides the trials' own: 4 KiB x 4^i, i < n."""
    return tuple(4096 * 4**i for i in range(n))


DEFAULTS = CollectivesConfig()  # params.yaml's `collectives` section, unset
FIT_BYTES = fit_bytes(DEFAULTS.fit_sizes)  # 4 KiB .. 4 MiB
DIST = ("allreduce", "allreduce_shm", "allgather", "reduce_scatter")
LOCAL = ("scratch_allreduce", "dp_copy", "dp_scatter")
# the strategies whose step issues each measured collective, from their catalog rows (a broadcast is priced with the
# all-gather's figures: scaling/interconnect.py's STAND_IN)
ISSUED_BY = {c: [s for s in catalog.NAMES if c in collectives_of(s)] for c in DIST + LOCAL}
FACTOR_TEXT = {
    "allreduce": "2(k-1)/k",
    "allreduce_shm": "2(k-1)/k",
    "allgather": "(k-1)/k",
    "reduce_scatter": "(k-1)/k",
    "scratch_allreduce": "2(k-1)",
    "dp_copy": "k-1",
    "dp_scatter": "(k-1)/k",
}


# ----------------------------------------------------------------------------- the fit


def fit(points: list[dict], collective: str, k: int) -> dict:
    """Least squares t = alpha + f(k) * S / beta over the sizes' medians, weighted by 1 / t^2."""
    f = BUS_FACTOR[collective](k)
    xs = [f * p["bytes"] for p in points]
    ts = [p["median_s"] for p in points]
    ws = [1 / t**2 for t in ts]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    mt = sum(w * t for w, t in zip(ws, ts)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (t - mt) for w, x, t in zip(ws, xs, ts)) / sxx if sxx > 0 else 0.0
    alpha = mt - slope * mx
    method = "weighted least squares"
    if alpha < 0:  # a negative latency is no latency: refit through the origin
        alpha, slope = 0.0, sum(w * x * t for w, x, t in zip(ws, xs, ts)) / sum(w * x * x for w, x in zip(ws, xs))
        method += ", alpha clamped to 0"
    if slope <= 0:  # time does not grow with size over these sizes: latency-bound, bandwidth not resolved
        slope, alpha = 0.0, mt
        method += ", no bandwidth term (time flat in size)"
    pred = [alpha + slope * x for x in xs]
    rel = [(p - t) / t for p, t in zip(pred, ts)]
    return {
        "alpha_s": alpha,
        "beta_Bps": 1 / slope if slope > 0 else None,
        "bus_factor": f,
        "rel_rms": math.sqrt(sum(r * r for r in rel) / len(rel)),
        "max_rel_residual": max(abs(r) for r in rel),
        "n_sizes": len(points),
        "method": method,
    }


def _points(times_by_size: dict, collective: str, k: int, trial_sizes: set) -> list[dict]:
    out = []
    for nbytes in sorted(times_by_size):
        ts = sorted(times_by_size[nbytes])
        med = statistics.median(ts)
        out.append(
            {
                "bytes": nbytes,
                "in_trial": nbytes in trial_sizes,
                "median_s": med,
                "min_s": ts[0],
                "max_s": ts[-1],
                "p90_s": ts[min(len(ts) - 1, int(0.9 * len(ts)))],
                "n": len(ts),
                "busbw_Bps": BUS_FACTOR[collective](k) * nbytes / med,
            }
        )
    return out


# ----------------------------------------------------------------------------- one rank


def _busy(seconds: float, a: torch.Tensor, sync) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a
        sync()


def _timed(fn, plan, mode, a, sync, barrier, ops: int = 1) -> list[float]:
    """Per repeat: barrier, the compute gap (after_compute), sync, `ops` calls back to back, sync; time per op."""
    out = []
    for i in range(plan["warmup"] + plan["reps"]):
        barrier()
        if mode == "after_compute":
            _busy(plan["gap_s"], a, sync)
        sync()
        t = time.perf_counter()
        for _ in range(ops):
            fn()
        sync()
        if i >= plan["warmup"]:
            out.append((time.perf_counter() - t) / ops)
    return out


def _ops_per_sync(plan: dict, mode: str) -> int:
    """N ops per sync pair on GPUs back to back; one after compute (the first op after idle compute is the point),
    and one on CPU (Gloo's calls return when done: there is no queue for a sync to drain)."""
    return plan["ops_per_sync"] if plan["device_kind"] == "cuda" and mode == "back_to_back" else 1


def _dist_op(name: str, nbytes: int, k: int, dev, shm):
    n = math.ceil(nbytes / 4 / k) * k
    if name == "allreduce":
        buf = torch.zeros(n, device=dev)
        return lambda: dist.all_reduce(buf)
    if name == "allreduce_shm":
        buf = torch.zeros(n, device=dev)
        return lambda: shm(buf)
    big, part = torch.zeros(n, device=dev), torch.zeros(n // k, device=dev)
    # the calls FSDP2 makes (all_gather_single / reduce_scatter_single; older PyTorch: the *_tensor names)
    if name == "allgather":
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return lambda: gather(big, part)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    return lambda: scatter(part, big)


def _local_op(name: str, nbytes: int, k: int, devices):
    from torch.nn.parallel import comm

    from pipeline.strategies.scratch import allreduce

    n = math.ceil(nbytes / 4 / k) * k
    if name == "scratch_allreduce":
        ts = [torch.zeros(n, device=d) for d in devices]  # sums of zeros: N repeats never overflow
        return lambda: allreduce(ts)
    t = torch.zeros(n, device=devices[0])
    ids = [d.index for d in devices]
    return (lambda: comm.broadcast(t, ids)) if name == "dp_copy" else (lambda: comm.scatter(t, ids))


def _rank(plan: dict) -> dict:
    """One worker process: time every planned collective; rank 0 also times the in-process ones."""
    from pipeline.strategies import shm_allreduce

    torch.set_num_threads(1)
    rank_env = RankEnv.read()  # this worker's place, read once here from the launcher's environment
    rank, k, local = rank_env.rank, rank_env.world_size, rank_env.local_rank
    cuda = plan["device_kind"] == "cuda"
    if cuda:
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[local % len(os.sched_getaffinity(0))]})
    timeout = datetime.timedelta(seconds=plan["timeout_s"])
    store, _, _ = next(dist.rendezvous("env://", rank, k, timeout=timeout))  # kept for the host-side wait below
    dist.init_process_group(
        plan["backend"], store=store, rank=rank, world_size=k, timeout=timeout, device_id=dev if cuda else None
    )
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    a = torch.randn(128, 128, device=dev)
    out = {"times": {}, "skipped": {}}
    for name in DIST:
        sizes = plan["sizes"].get(name)
        if not sizes:
            continue
        shm = None
        if name == "allreduce_shm":
            why = shm_allreduce.available(max(sizes) * k)
            if why:
                out["skipped"][name] = why
                continue
            shm = shm_allreduce.ShmAllreduce(math.ceil(max(sizes) / 4 / k) * k * 4, plan["timeout_s"])
        for mode in plan["modes"]:
            for nbytes in sizes:
                fn = _dist_op(name, nbytes, k, dev, shm)
                out["times"].setdefault(name, {}).setdefault(mode, {})[nbytes] = _timed(
                    fn, plan, mode, a, sync, dist.barrier, _ops_per_sync(plan, mode)
                )
        del shm
    # single-process strategies: rank 0 drives every device alone, once the others are in a host-side wait
    idle, done = [f"parallax/collectives/idle/{r}" for r in range(k)], "parallax/collectives/local_done"
    if rank:
        store.set(idle[rank], "1")
        store.wait([done], timeout)
    else:
        store.wait(idle[1:], timeout)
        devices = [torch.device("cuda", i) for i in range(k)] if cuda else [dev] * k
        sync_all = (lambda: [torch.cuda.synchronize(d) for d in devices]) if cuda else (lambda: None)
        for name in LOCAL:
            for mode in plan["modes"]:
                for nbytes in plan["sizes"].get(name, ()):
                    fn = _local_op(name, nbytes, k, devices)
                    out["times"].setdefault(name, {}).setdefault(mode, {})[nbytes] = _timed(
                        fn, plan, mode, a, sync_all, lambda: None, _ops_per_sync(plan, mode)
                    )
        store.set(done, "1")
    dist.barrier()
    dist.destroy_process_group()
    return out


# ----------------------------------------------------------------------------- the host


def trial_sizes(model: str, k: int, bucket_cap_mb: float, layout: dict | None = None) -> dict[str, list[int]]:
    """Message sizes (bytes) the trials of `model` issue at k, per collective."""
    layout = layout or model_layout(model)
    out: dict[str, set] = {}
    for strategy in catalog.NAMES:
        for c in step_collectives(strategy, k, layout, bucket_cap_mb=bucket_cap_mb):
            out.setdefault(c["collective"], set()).add(c["bytes"])
    out["allreduce_shm"] = out["allreduce"]
    return {name: sorted(v) for name, v in out.items() if name in ISSUED_BY}


def _launch(k: int, plan: dict, start_method: str) -> dict[int, dict]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from pipeline.trial import stage_ranks

    try:
        return stage_ranks.launch(k, "collectives", start_method, _rank, plan)
    except ChildFailedError as e:
        raise RuntimeError(f"measuring collectives at k={k} failed: {e}") from None


def measure(
    ks: list[int] | None = None,
    model: str = "lenet",
    bucket_cap_mb: float = 25.0,
    reps: int = DEFAULTS.reps,
    warmup: int = DEFAULTS.warmup,
    gap_s: float = DEFAULTS.gap_s,
    modes: tuple[str, ...] = MODES,
    fit_bytes=FIT_BYTES,
    timeout_s: float = 120.0,
    ops_per_sync: int = 20,
) -> dict:
    """Time every strategy's collectives at k in `ks` (default 2..N) and fit (alpha, beta) per collective, k, mode.

    Returns a JSON-able dict: host, backend, ks, model, settings, and collectives[name] = {available, reason,
    issued_by, bus_factor, by_k: {"k": {mode: {points: [{bytes, in_trial, median_s, min_s, max_s, p90_s, n,
    busbw_Bps}], fit: {alpha_s, beta_Bps, bus_factor, rel_rms, max_rel_residual, n_sizes, method}}}}}."""
    from pipeline.host.devices import probe

    host = probe()
    ks = list(ks) if ks else list(range(2, host.n + 1))
    if not ks or min(ks) < 2 or max(ks) > host.n:
        raise ValueError(f"collectives need 2 <= k <= {host.n} (this host's {host.kind} devices); asked for {ks}")
    cuda = host.kind == "cuda"
    backend = "nccl" if cuda else "gloo"
    layout = model_layout(model)
    t0 = time.perf_counter()
    result = {
        "measured": True,
        "kind": "collectives",
        "backend": backend,
        "ks": ks,
        "model": model,
        "bucket_cap_mb": bucket_cap_mb,
        "param_bytes": layout["param_bytes"],
        "measured_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": {"hostname": host.hostname, "kind": host.kind, "n": host.n, "name": host.name, "torch": host.torch},
        "settings": {
            "reps": reps,
            "warmup": warmup,
            "gap_s": gap_s,
            "modes": list(modes),
            "fit_bytes": list(fit_bytes),
            "ops_per_sync": ops_per_sync if cuda else 1,
            "timed": "per repeat: the last-arriving rank's duration (min over ranks), after a barrier, "
            "per op (GPUs, back to back: ops_per_sync ops between one sync pair); in-process ops: "
            "rank 0 alone, the other ranks in a host-side store wait",
        },
        "collectives": {},
    }
    for name in ISSUED_BY:
        entry = {
            "available": True,
            "reason": None,
            "issued_by": ISSUED_BY[name],
            "bus_factor": FACTOR_TEXT[name],
            "by_k": {},
        }
        if name.startswith("dp_") and not cuda:
            entry.update(
                available=False,
                reason="dp and dp_criterion need CUDA GPUs (torch.nn.parallel.comm "
                "copies between GPUs); this host has none",
            )
        if name == "allreduce_shm" and cuda:
            entry.update(available=False, reason="the shared-memory transport is for ranks on one CPU host")
        result["collectives"][name] = entry
    for k in ks:
        in_trial = trial_sizes(model, k, bucket_cap_mb, layout)
        sizes = {
            name: sorted(set(fit_bytes) | set(in_trial.get(name, ())))
            for name, e in result["collectives"].items()
            if e["available"]
        }
        plan = {
            "backend": backend,
            "device_kind": host.kind,
            "sizes": sizes,
            "reps": reps,
            "warmup": warmup,
            "gap_s": gap_s,
            "modes": list(modes),
            "timeout_s": timeout_s,
            "ops_per_sync": ops_per_sync,
        }
        ranks = _launch(k, plan, "spawn" if cuda else "fork")
        for name, why in ranks[0]["skipped"].items():
            result["collectives"][name].update(available=False, reason=why)
        for name, by_mode in ranks[0]["times"].items():
            per_k = result["collectives"][name]["by_k"].setdefault(str(k), {})
            for mode, by_size in by_mode.items():
                # the last rank to arrive waits for no one: its duration is the collective's cost (in-process
                # collectives: rank 0 only)
                timed = [r["times"][name][mode] for r in ranks.values() if name in r["times"]]
                cost = {s: [min(t[s][i] for t in timed) for i in range(len(ts))] for s, ts in by_size.items()}
                slowest = {
                    s: statistics.median(max(t[s][i] for t in timed) for i in range(len(ts)))
                    for s, ts in by_size.items()
                }
                points = _points(cost, name, k, set(in_trial.get(name, ())))
                for p in points:
                    p["slowest_rank_median_s"] = slowest[p["bytes"]]
                per_k[mode] = {"points": points, "fit": fit(points, name, k)}
    result["wall_s"] = time.perf_counter() - t0
    return result
