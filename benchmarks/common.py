"""Shared helpers for the benchmark scripts: data on disk, one trial, the host line, medians."""

from __future__ import annotations

import argparse
import datetime
import statistics
from pathlib import Path

from pipeline.cli.types import count
from pipeline.config import loader
from pipeline.data import store
from pipeline.host.devices import probe

REPO = Path(__file__).resolve().parents[1]


def ensure_data(root: Path, source: str) -> Path:
    """The data the benchmark trains on: the prepared dir if present, else synthetic (labelled as such)."""
    try:
        store.load(root, source, 1, 1)
    except store.DataError:
        if source != "synthetic":
            raise
        store.prepare(root, "synthetic", progress=False)
    return root


def base_cfg(data_dir: Path, source: str, *sets):
    # d2l init, as the reference uses (it does not change throughput, only what is learned)
    # params.yaml at REPO if there is one (a GPU bundle ships none): optional, as without --params
    return loader.load(
        None, ["profile=", f"data.dir={data_dir}", f"data.source={source}", "train.init=d2l", *sets], root=REPO
    )


def trial(cfg, out: Path, **train):
    from pipeline.trial.launch import run_trial

    return run_trial(loader.replace_train(cfg, **train), out, progress=False)


def med(xs) -> float | None:
    """The median of the figures in `xs` (None, a run that timed nothing, is dropped), or None where none is left:
    "no figure" is None, never NaN, which is truthy and so would pass a caller's `if x` as a figure."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is no figure (None, or a zero divisor)."""
    return a / b if (a is not None and b) else None


def show(x: float | None, spec: str) -> str:
    """`x` formatted by `spec`, or "n/a" where it is no figure."""
    return "n/a" if x is None else format(x, spec)


def spread(xs):
    xs = [x for x in xs if x is not None]
    return f"median {med(xs):,.0f} (min {min(xs):,.0f}, max {max(xs):,.0f}, n={len(xs)})" if xs else "n/a"


def host_line() -> str:
    h = probe()
    return (
        f"host {h.hostname}: {h.kind} x{h.n} ({h.name}), torch {h.torch}, "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
    )


def data_args(p):
    p.add_argument(
        "--data",
        type=Path,
        default=REPO / "data" / "fashion-mnist",
        help="prepared data dir (default: data/fashion-mnist)",
    )
    p.add_argument(
        "--source",
        default=None,
        choices=["fashion-mnist", "synthetic"],
        help="data source (default: whatever --data holds; synthetic is generated if nothing is there)",
    )


def resolve_source(args) -> str:
    import json

    if args.source:
        return args.source
    manifest = args.data / "manifest.json"
    return json.loads(manifest.read_text())["source"] if manifest.exists() else "synthetic"


def parser(doc: str, data: bool = True) -> argparse.ArgumentParser:
    """The preamble every benchmark shares: its docstring's first paragraph as the description (a first line alone
    can stop mid-sentence), and the data flags."""
    p = argparse.ArgumentParser(description=" ".join(doc.split("\n\n")[0].split()))
    if data:
        data_args(p)
    return p


def variants_in_fresh_processes(doc: str, child):
    """The start of a benchmark that runs each variant in a fresh process of itself (`--child VARIANT`): --rounds and
    the data flags parsed; in a child, `child(data, source, variant)` runs and None is returned; in the parent the
    data is made ready, the host line printed, and (args, source) returned."""
    p = parser(doc)
    p.add_argument("--rounds", type=count("rounds"), default=3)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    source = resolve_source(args)
    if args.child is not None:
        child(args.data, source, args.child)
        return None
    ensure_data(args.data, source)
    print(host_line(), f"| data: {source}", flush=True)
    return args, source
