"""The per-device memory model (pipeline/scaling/memory.py) against measured peaks: real one-step trials of every
strategy this host runs, the model's figure beside each, the error per point, its mean and max.

    .venv/bin/python -m benchmarks.memory.model_check [--model lenet] [--optimizer adamw] [--ks 1,2]
        [--batches 128,256] [--data DIR] [--source synthetic]

Each trial is `train.max_steps=3` (the CPU figure is the probe step: MemTracker, optimizer state included; the GPU
figure the steps after the one warm-up step;
docs/metrics.md), with the project's defaults otherwise (DDP's gradients as bucket views). The figure compared is
each point's largest per-device peak, against the model's figure of the same kind: the basis the record's
`mem_basis` names (CPU: the probe step, parameters included; GPU: the step's peak above resident, parameters left
out); error = (modelled - measured) / measured. Memory does not depend on the load
beside it, so the script needs no quiet host; it times nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import base_cfg, ensure_data, host_line, parser, probe, resolve_source, trial
from pipeline import catalog
from pipeline.cli.types import counts
from pipeline.config.schema import DEVICES_MAX
from pipeline.scaling import memory
from pipeline.strategies import STRATEGIES

MIB = 2**20


def main():
    p = parser(__doc__)
    p.add_argument("--model", default="lenet", choices=["lenet", "resnet18"])
    p.add_argument("--optimizer", default="adamw", choices=["sgd", "sgd_momentum", "adamw"])
    p.add_argument(
        "--ks", type=counts("device counts", hi=DEVICES_MAX), default=[1, 2], help="comma-separated device counts"
    )
    p.add_argument(
        "--batches", type=counts("global batches"), default=[128, 256], help="comma-separated global batches"
    )
    args = p.parse_args()
    source = resolve_source(args)
    ensure_data(args.data, source)
    ks, batches = args.ks, args.batches
    host = probe()
    cfg = base_cfg(
        args.data,
        source,
        f"data.train_limit={2 * max(batches)}",
        "data.test_limit=64",
        "train.max_steps=3",
        "train.warmup_steps=1",
        "train.interference_threshold=1e6",
        "train.oversubscribe=true",
        "train.init=default",
    )
    print(host_line(), f"| data: {source}", flush=True)
    print("| strategy | k | B | measured MiB | modelled MiB | error % |\n|---|---|---|---|---|---|", flush=True)
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in catalog.NAMES:
            if STRATEGIES[s].unavailable_reason(host):
                continue
            for k in ks:
                if catalog.spec(s).one_device_only and k != 1:
                    continue
                for b in batches:
                    m = trial(
                        cfg,
                        Path(tmp) / f"{s}-{k}-{b}",
                        strategy=s,
                        devices=k,
                        batch_size=b,
                        model=args.model,
                        optimizer=args.optimizer,
                    )
                    measured = max(m["peak_mem_bytes"])
                    modelled = modelled_peak(m, s, args.model, k, b, args.optimizer)
                    err = memory.error_pct(measured, modelled)
                    errors.append(abs(err))
                    print(f"| {s} | {k} | {b} | {measured / MIB:.3f} | {modelled / MIB:.3f} | {err:+.2f} |", flush=True)
    print(
        f"{args.model}, {args.optimizer}: {len(errors)} points, mean |error| {sum(errors) / len(errors):.2f}%, "
        f"max {max(errors):.2f}% (modelled against measured)",
        flush=True,
    )


def modelled_peak(record: dict, strategy: str, model: str, k: int, batch: int, optimizer: str) -> int:
    """The model's peak of the kind the record measured (memory.basis_of_record); ranks sharing a GPU run Gloo."""
    basis = memory.basis_of_record(record)
    if basis is None:
        raise ValueError(f"the memory model predicts no figure of kind {record.get('mem_basis')!r}")
    backend = record.get("backend") or None
    return memory.predict(strategy, model, k, batch, optimizer, basis=basis, backend=backend).peak


if __name__ == "__main__":
    main()
