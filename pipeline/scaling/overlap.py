"""The seeds' automatic-parallelism experiments as a stage: do two devices compute at once, and does
communication hide behind computation?

    python -m pipeline overlap            # DVC stage `overlap`; writes results/overlap/{overlap.json, overlap.md}

1. Concurrent devices: the same chain of matrix products on device A, on device B, and on both without
   synchronising in between (d2l: `run(x_gpu1); run(x_gpu2)`). Ratio both / (A + B): 0.5 = fully parallel.
2. Computation with communication: compute a list of results and ship each one, first sequentially, then
   overlapped. GPU: each result is copied into pinned host memory with non_blocking=True in both arms, so the arms
   differ only in overlap: sequential queues each copy on the compute stream (the next product waits for it),
   overlapped on a side stream that waits for the product (the copy engine runs beside the next product; a copy on
   the compute stream cannot, and one into pageable memory is synchronous). CPU-only host: the two devices are two
   1-thread worker processes started by PyTorch's elastic launcher (listening on 127.0.0.1 only), and "shipping"
   is a Gloo all-reduce of each finished item in the background (async_op=True) while the next one is computed.
Every measurement is repeated (`overlap.reps`) after `overlap.warmup` unrecorded runs; the report gives the
median and the spread, so a reader can tell a real difference from noise.
Other processes on the host slow these timings as they slow a trial's, so the measurements run inside the trial's
interference monitor (measure/interference.py, handed in by the CLI as `watch`: scaling/ does not import measure/):
overlap.json records `foreign_cores` and `under_load` (flagged as a trial would be, beyond
`train.interference_threshold`), and overlap.md says whether the figures were measured under load.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _stats(xs: list[float]) -> dict:
    return {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "runs_s": xs}


def _chain(x: torch.Tensor, n: int) -> list[torch.Tensor]:
    return [x.mm(x) for _ in range(n)]


def _sync(*devices):
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


# ----------------------------------------------------------------------------- GPU (one process)


def _timed(fn, sync, reps, warmup) -> list[float]:
    out = []
    for i in range(warmup + reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        if i >= warmup:
            out.append(time.perf_counter() - t)
    return out


def _comm_arms(x: torch.Tensor, items: int):
    """Sequential and overlapped: `items` products of x, each copied into its own pinned host buffer."""
    compute, side = torch.cuda.current_stream(x.device), torch.cuda.Stream(x.device)
    host = {arm: [torch.empty(x.shape, dtype=x.dtype, pin_memory=True) for _ in range(items)] for arm in (0, 1)}

    def sequential():
        for dst in host[0]:
            dst.copy_(x.mm(x), non_blocking=True)  # on the compute stream: the next product waits for this copy

    def overlapped():
        for dst in host[1]:
            y = x.mm(x)
            side.wait_stream(compute)  # the copy starts after its product, not before
            with torch.cuda.stream(side):
                dst.copy_(y, non_blocking=True)
            y.record_stream(side)  # y's memory is not reused by the next product before its copy ends

    return sequential, overlapped


def measure_cuda(cfg) -> dict:
    o = cfg.overlap
    n = torch.cuda.device_count()
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", min(1, n - 1))
    x0 = torch.randn(o.size, o.size, device=d0)
    x1 = torch.randn(o.size, o.size, device=d1)
    sync = lambda: _sync(d0, d1)  # noqa: E731
    a = _timed(lambda: _chain(x0, o.chain), sync, o.reps, o.warmup)
    b = _timed(lambda: _chain(x1, o.chain), sync, o.reps, o.warmup)
    both = _timed(lambda: (_chain(x0, o.chain), _chain(x1, o.chain)), sync, o.reps, o.warmup)

    seq, overlapped = _comm_arms(x0, o.items)
    s = _timed(seq, sync, o.reps, o.warmup)
    ov = _timed(overlapped, sync, o.reps, o.warmup)
    return {
        "devices": [str(d0), str(d1)],
        "same_device": d0 == d1,
        "concurrent": {"A": _stats(a), "B": _stats(b), "both": _stats(both)},
        "communication": {
            "mode": "device-to-host copies into pinned memory (non_blocking); overlapped: on a side stream",
            "sequential": _stats(s),
            "overlapped": _stats(ov),
        },
    }


# ----------------------------------------------------------------------------- CPU (two worker processes)


def _cpu_worker(size: int, chain: int, items: int, reps: int, warmup: int) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.randn(size, size)

    def phase(active: set) -> list[float]:
        out = []
        for i in range(warmup + reps):
            dist.barrier()
            t = time.perf_counter()
            if rank in active:
                _chain(x, chain)
            dist.barrier()  # both phases end when the slowest active device is done
            if i >= warmup:
                out.append(time.perf_counter() - t)
        return out

    a, b, both = phase({0}), phase({1}), phase({0, 1})

    def comm(overlap: bool) -> list[float]:
        out = []
        for i in range(warmup + reps):
            dist.barrier()
            t = time.perf_counter()
            pending = []
            for _ in range(items):
                y = x.mm(x)
                work = dist.all_reduce(y, async_op=overlap)
                if overlap:
                    pending.append(work)
            for w in pending:
                w.wait()
            dist.barrier()
            if i >= warmup:
                out.append(time.perf_counter() - t)
        return out

    seq, ov = comm(False), comm(True)
    dist.destroy_process_group()
    return {"A": a, "B": b, "both": both, "sequential": seq, "overlapped": ov}


def measure_cpu(cfg) -> dict:
    from pipeline.trial import stage_ranks

    o = cfg.overlap
    r = stage_ranks.launch(2, "overlap", "fork", _cpu_worker, o.size, o.chain, o.items, o.reps, o.warmup)[0]
    return {
        "devices": ["cpu worker process 0 (1 thread)", "cpu worker process 1 (1 thread)"],
        "same_device": False,
        "concurrent": {k: _stats(r[k]) for k in ("A", "B", "both")},
        "communication": {
            "mode": "Gloo all-reduce of each finished item (async_op=True in the background)",
            "sequential": _stats(r["sequential"]),
            "overlapped": _stats(r["overlapped"]),
        },
    }


# ----------------------------------------------------------------------------- the stage


class Unwatched:
    """No interference monitor: the host's load is not measured, and overlap.md says so."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def result(self) -> dict:
        return {"foreign_cores": None, "interfered": False, "interference_reason": ""}


def run(cfg, out_dir: Path, watch=Unwatched) -> dict:
    """Measure, then write overlap.json and overlap.md. `watch(devices_used, device_kind, gpu_indices, threshold=)`:
    a context manager over the measurements whose result() is interference.Monitor's (what else used the host)."""
    from pipeline.host.devices import probe

    host = probe()
    if host.kind == "cpu" and host.n < 2:
        raise RuntimeError("the overlap stage needs two devices (two CPU cores or two GPUs); this host has one")
    threshold = cfg.train.interference_threshold
    with watch(2, host.kind, sorted({0, min(1, host.n - 1)}), threshold=threshold) as load:
        res = measure_cuda(cfg) if host.kind == "cuda" else measure_cpu(cfg)
    interference = load.result()
    res["foreign_cores"] = interference["foreign_cores"]
    res["under_load"] = bool(interference["interfered"])
    res["interference_threshold"] = threshold
    res["interference"] = interference
    c, m = res["concurrent"], res["communication"]
    res["ratio_both_to_sum"] = c["both"]["median_s"] / (c["A"]["median_s"] + c["B"]["median_s"])
    res["comm_saving"] = 1 - m["overlapped"]["median_s"] / m["sequential"]["median_s"]
    res["host"] = {"kind": host.kind, "n": host.n, "name": host.name, "hostname": host.hostname}
    res["settings"] = {
        "size": cfg.overlap.size,
        "chain": cfg.overlap.chain,
        "items": cfg.overlap.items,
        "reps": cfg.overlap.reps,
        "warmup": cfg.overlap.warmup,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "overlap.json").write_text(json.dumps(res, indent=2))
    (out_dir / "overlap.md").write_text(markdown(res))
    return res


def _row(name, s):
    return (
        f"| {name} | {s['median_s'] * 1e3:,.1f} | {s['min_s'] * 1e3:,.1f} – {s['max_s'] * 1e3:,.1f} | "
        f"{len(s['runs_s'])} |"
    )


def markdown(res: dict) -> str:
    c, m = res["concurrent"], res["communication"]
    ratio, saving = res["ratio_both_to_sum"], res["comm_saving"]
    spread_overlaps = m["overlapped"]["max_s"] >= m["sequential"]["min_s"]
    lines = [
        "## Automatic parallelism and communication overlap",
        "",
        f"Devices: {', '.join(res['devices'])} on {res['host']['hostname']} ({res['host']['kind']}). "
        f"Matrices {res['settings']['size']}², chains of {res['settings']['chain']} products, "
        f"{res['settings']['items']} items; {res['settings']['reps']} timed runs after "
        f"{res['settings']['warmup']} warm-up runs.",
        "",
        load_line(res),
        "",
        "| measurement | median ms | range ms | runs |",
        "|---|---:|---:|---:|",
        _row("chain on device A", c["A"]),
        _row("chain on device B", c["B"]),
        _row("both, no synchronisation between", c["both"]),
        _row("compute, then communicate each item", m["sequential"]),
        _row("compute with communication overlapped", m["overlapped"]),
        "",
        f"- Both devices together took **{ratio:.2f}×** the sum of the two alone "
        f"({'they ran concurrently' if ratio < 0.75 else 'little concurrency'}; 0.5 is perfect).",
        f"- Communication mode: {m['mode']}. Overlapping saved **{saving:.0%}** of the sequential time"
        + (
            " — but the runs' ranges overlap, so the difference is within the noise."
            if spread_overlaps
            else " (the ranges do not overlap: the difference is real)."
        ),
    ]
    return "\n".join(lines) + "\n"


def load_line(res: dict) -> str:
    """Whether other processes competed with the measurements, as a trial's figures say it (an overlap.json written
    before the monitor has no `under_load`: said as not measured)."""
    cores, threshold = res.get("foreign_cores"), res.get("interference_threshold")
    if res.get("under_load"):
        if cores is not None and threshold is not None and cores > threshold:
            why = f"{cores:.2f} cores busy in other processes on average (above {threshold:.2f})"
        else:
            why = res.get("interference", {}).get("interference_reason") or "flagged by the interference monitor"
        return (
            f"**Measured under load**: {why}. These timings are what this host gave while busy, not its speed on a "
            "quiet one."
        )
    if cores is None:
        return "Host load not measured: whether other processes competed with these timings is unknown."
    return f"Measured on a quiet host ({cores:.2f} cores busy elsewhere on average)."
