"""The ladder: one model's epoch on the host's first device, rung by rung from the eager fp32 step to every
execution mode, beside the d2l recipe.

    .venv/bin/python -m benchmarks.gpu.gpu_epoch [--models resnet18,lenet] [--rounds 1] [--images 60000] [--batch 256]
        [--rungs single,single_bf16,...] [--peer PATH] [--data DIR] [--source synthetic] [--json out.json]
    .venv/bin/python -m benchmarks.gpu.gpu_epoch --models lenet --images 4096 --rungs single,ddp   # CPU smoke run

Rungs (LADDER; each adds one mode to the rung before it): `single` eager fp32 -> bf16 (train.autocast) -> +cuDNN
autotuner (train.cudnn_benchmark) -> +torch.compile -> compile's reduce-overhead mode (its own CUDA graphs), and
beside compile the autotuned bf16 step captured whole as a CUDA graph (train.cuda_graphs); the same for `ddp` at
k=1 (eager fp32, then `ddp_amp` bf16, +autotuner, +compile, and its graph). A rung this host cannot run (CUDA graphs
on a CPU, or a graph rung whose epoch ends before its capture) is printed with the reason instead of a figure, and
a rung that fails says why; the others still run. A rung that times no step (all inside its warm-up) says so.
Per model and round,
alternating: every rung trains two epochs over the first --images training images (whole batches of --batch) and
the seeds' recipe (d2l_reference.py: torchvision + ToTensor + DataLoader with 4 workers, fp32, 2 epochs) runs on the
same device and data files. Printed: the warm epoch (epoch 2, as the recipe's figure is its epoch 2) and the cold one
(lazy loading, autotuning, compilation), steady-state img/s (steps after warm-up), ratios to the recipe's warm epoch,
and MFU = FLOPs per training image (torch.utils.flop_counter) x img/s over (a) the GPU's datasheet dense bf16 peak
and (b) a bf16 GEMM 8192^3 measured in this run (CPU host: fp32 GEMM on one core, no datasheet peak), each MFU
named with its peak's dtype. A row whose label says more than the host runs says how it runs, on the console and in
--json (ran_as): compile's reduce-overhead mode on a CPU runs as compile's default mode (its CUDA graphs need a GPU),
and a bf16 row on a device without native bf16 (pipeline/host/capabilities.py) is emulated bf16. The bars of
the step at the GPU's speed are printed as met or not, never asserted: ResNet-18's best rung <= 0.6 s per warm
60k-image epoch and >= 5x the recipe's warm epoch, eager ddp k=1 within 10% of eager single; LeNet's best rung >=
500k img/s. A compile rung's cost is its cold epoch less its warm one: printed amortised over 1 and 10 epochs
beside its warm epoch. Trials run with
train.breakdown_every=0 (a sampled step synchronises every phase). A d2l recipe that fails (a node without
torchvision) is reported as "d2l peer failed: ..." and Parallax is measured alone; --no-peer REASON skips it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.common import REPO, base_cfg, ensure_data, host_line, med, parser, probe, resolve_source, show, trial
from benchmarks.speed.mfu import flops_per_image, matmul_peak
from pipeline.cli.types import count
from pipeline.config import loader
from pipeline.config.settle import DDP_SETTLE_STEPS
from pipeline.data import store
from pipeline.errors import Infeasible
from pipeline.host.capabilities import fp32_label, host_capabilities
from pipeline.host.devices import Host
from pipeline.trial import graphs
from pipeline.trial.launch import mode_refusal

PEERS = (
    REPO.parent / "shared" / "peers" / "d2l_reference.py",
    REPO / "shared" / "peers" / "d2l_reference.py",
    REPO / "peers" / "d2l_reference.py",
)
# dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s, matched against
# torch.cuda.get_device_name: first substring wins. Any other H100 (e.g. "NVIDIA H100 80GB HBM3") is an SXM part.
DATASHEET_BF16_TFLOPS = (("H200", 989), ("H100 PCIe", 756), ("H100 NVL", None), ("H100", 989), ("A100", 312))
LR = {"lenet": 0.2, "resnet18": 0.1}  # d2l's: multiple-gpus.md (LeNet), multiple-gpus-concise.md (ResNet-18)
BF16 = {"amp_dtype": "bf16"}
# (key, strategy, train settings, label): each rung adds one execution mode (catalog.MODES) to the one before it
# a graph rung: the step captured after the strategy's eager warm-up (trial/graphs.py), no sampled step; its timed
# window opens after the capture (rung_cfg)
GRAPHED = {"cuda_graphs": True}
SINGLE_BF16 = {"autocast": True, "cudnn_benchmark": True, **BF16}
DDP_BF16 = {"cudnn_benchmark": True, **BF16}
LADDER = (
    ("single", "single", {}, "single eager fp32"),
    ("single_bf16", "single", {"autocast": True, **BF16}, "single bf16 (autocast)"),
    ("single_bf16_bench", "single", SINGLE_BF16, "  + cudnn.benchmark"),
    ("single_bf16_bench_compile", "single", {**SINGLE_BF16, "compile": True}, "  + torch.compile"),
    (
        "single_bf16_bench_compile_ro",
        "single",
        {**SINGLE_BF16, "compile": True, "compile_mode": "reduce-overhead"},
        "  + compile mode reduce-overhead",
    ),
    ("single_bf16_bench_graphs", "single", {**SINGLE_BF16, **GRAPHED}, "  single bf16 + autotuner + CUDA graph"),
    ("ddp", "ddp", {}, "ddp k=1 eager fp32"),
    ("ddp_amp", "ddp_amp", BF16, "ddp_amp k=1 bf16"),
    ("ddp_amp_bench", "ddp_amp", DDP_BF16, "  + cudnn.benchmark"),
    ("ddp_amp_bench_compile", "ddp_amp", {**DDP_BF16, "compile": True}, "  + torch.compile"),
    ("ddp_amp_bench_graphs", "ddp_amp", {**DDP_BF16, **GRAPHED}, "  ddp_amp bf16 + autotuner + CUDA graph"),
)
ROWS = (*((key, label) for key, _, _, label in LADDER), ("d2l", "d2l recipe fp32"))
TARGET_EPOCH_S, TARGET_RATIO, TARGET_DDP_GAP = 0.6, 5.0, 0.10  # ResNet-18 on one GPU, per warm 60k-image epoch
TARGET_LENET_IMG_S = 500_000  # LeNet on one GPU, steady state


def datasheet_peak(name: str) -> float | None:
    tf = next((tf for key, tf in DATASHEET_BF16_TFLOPS if key.lower() in name.lower()), None)
    return tf * 1e12 if tf else None


class PeerFailed(Exception):
    """The d2l recipe did not run (e.g. no torchvision on the node): reported, and the benchmark goes on."""


def d2l(peer: Path, data: Path, model: str, batch: int, steps: int) -> dict:
    cmd = [sys.executable, str(peer), str(data), model, str(batch), str(LR[model]), "2", str(steps)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise PeerFailed(f"no result in 3600 s: {' '.join(cmd)}") from None
    epochs = re.findall(r"epoch (\d+): ([\d.]+) s, (\d+) img/s", run.stdout)
    if run.returncode or len(epochs) < 2:
        last = (run.stderr.strip() or run.stdout.strip() or "no output").splitlines()[-1]
        raise PeerFailed(f"exit {run.returncode}, {last} ({' '.join(cmd)})")
    return {"epoch1_s": float(epochs[0][1]), "epoch_s": float(epochs[1][1]), "img_s": float(epochs[1][2])}


def parallax(cfg, tmp: Path, model: str, rung: str, batch: int, host: Host) -> dict:
    """One rung's trial of two epochs on `host`: epoch 2 is the warm epoch (the recipe's figure), epoch 1 the cold
    one. A rung this host refuses, or one that fails, is {"failed": why}: said, and the ladder goes on."""
    try:
        m = trial(rung_cfg(cfg, model, rung, batch, host), tmp / rung)
    except Exception as e:  # Infeasible (a mode this host cannot run) or a failed trial: its reason is the result
        return {"failed": f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"}
    return {
        "epoch_s": m["epoch_s"][-1],
        "epoch1_s": m["epoch_s"][0],
        "img_s": m["throughput_img_s"],
        "amp_dtype": m["amp_dtype"],
    }


def lenet_target(rows: dict, kind: str, say) -> dict:
    """LeNet's bar: the best rung's steady images/s, printed met or not (never asserted)."""
    where = "" if kind == "cuda" else " (GPU bar; this host is a CPU)"
    ran = {k: r for k, r in rows.items() if k != "d2l" and r.get("img_s") is not None}  # None: no step timed
    if not ran:
        return {"img_s_min": TARGET_LENET_IMG_S, "best_rung": None, "met": None}
    best = max(ran, key=lambda k: ran[k]["img_s"])
    ips = ran[best]["img_s"]
    met = ips >= TARGET_LENET_IMG_S
    share = ips / TARGET_LENET_IMG_S
    verdict = "met" if met else f"NOT met ({share:.{0 if share >= 0.1 else 1}%} of it)"  # a CPU's 0.4%, not 0%
    say(f"  bar{where}: best rung ({best}) >= {TARGET_LENET_IMG_S:,} img/s: {ips:,.0f} -> {verdict}")
    return {"img_s_min": TARGET_LENET_IMG_S, "best_rung": best, "met": met}


def compile_cost(row: dict) -> dict | None:
    """A compile rung's cold epoch less its warm one, and its epoch amortised over 1 and 10 epochs."""
    if row.get("epoch1_s") is None or row.get("epoch_s") is None:
        return None
    cost = max(0.0, row["epoch1_s"] - row["epoch_s"])
    return {"cost_s": cost, "per_epoch_over_1": row["epoch_s"] + cost, "per_epoch_over_10": row["epoch_s"] + cost / 10}


def targets(rows: dict, kind: str, say) -> dict:
    """The bars of the step at the GPU's speed, printed met or not (never asserted); a rung not run is not judged."""
    where = "" if kind == "cuda" else " (GPU bars; this host is a CPU)"
    yes = {True: "met", False: "NOT met", None: "not measured"}
    ran = {k: r for k, r in rows.items() if k != "d2l" and r.get("epoch_s_per_60k")}
    best = min(ran, key=lambda k: ran[k]["epoch_s_per_60k"]) if ran else None
    met = {"best_epoch": None, "best_ratio": None, "ddp_gap": None}
    if best:
        b = ran[best]
        met["best_epoch"] = b["epoch_s_per_60k"] <= TARGET_EPOCH_S
        met["best_ratio"] = None if b["epoch_ratio_vs_d2l"] is None else b["epoch_ratio_vs_d2l"] >= TARGET_RATIO
        say(
            f"  bar{where}: best rung ({best}) warm epoch <= {TARGET_EPOCH_S} s/60k: {b['epoch_s_per_60k']:.2f} s -> "
            f"{yes[met['best_epoch']]}; >= {TARGET_RATIO:.0f}x the recipe's warm epoch: "
            f"{b['epoch_ratio_vs_d2l'] or 0:.2f}x -> {yes[met['best_ratio']]}"
        )
    if "single" in ran and "ddp" in ran:
        gap = ran["ddp"]["epoch_s"] / ran["single"]["epoch_s"] - 1
        met["ddp_gap"] = gap <= TARGET_DDP_GAP
        say(
            f"  bar{where}: eager ddp k=1 within {TARGET_DDP_GAP:.0%} of eager single: {gap:+.1%} -> "
            f"{yes[met['ddp_gap']]}"
        )
    return {
        "epoch_s_per_60k_max": TARGET_EPOCH_S,
        "ratio_vs_d2l_min": TARGET_RATIO,
        "ddp_gap_max": TARGET_DDP_GAP,
        "best_rung": best,
        "met": met,
    }


def ladder_cfg(data: Path, source: str, images: int, steps: int):
    """Every rung's configuration: two epochs over `images`, the timed steps after DDP's synchronised ones."""
    # warm-up: DDP's reducer synchronises on its iterations 1-10 (config/settle.py), so every rung's timed window
    # opens after them, as doctor's does; at least one step is timed in a short epoch.
    # breakdown_every=0: a sampled step syncs every phase (and may open a profiler session), and epoch_s counts it
    return base_cfg(
        data,
        source,
        f"data.train_limit={images}",
        "data.test_limit=1000",
        "train.epochs=2",
        f"train.warmup_steps={min(DDP_SETTLE_STEPS, steps - 1)}",
        "train.breakdown_every=0",
    )


def rung_cfg(cfg, model: str, rung: str, batch: int, host: Host):
    """A rung's trial on `host`: the ladder's configuration (ladder_cfg) with the rung's strategy and modes on one
    device. A mode `host` refuses (launch.mode_refusal: CUDA graphs on a CPU) raises Infeasible with the trial's own
    reason, before any advice on the epoch's length, which could not help. A CUDA graph rung captures in its cold
    epoch and opens its timed window after the capture, so its warm epoch is replays only and timed whole; an epoch
    too short for that raises Infeasible with the numbers (the rung is said not to run), as the trial would
    otherwise run eager steps under the graph's label."""
    _, strategy, sets, _ = next(r for r in LADDER if r[0] == rung)
    train = {"model": model, "strategy": strategy, "devices": 1, "batch_size": batch, "lr": LR[model], **sets}
    if sets.get("cuda_graphs"):
        train["warmup_steps"] = max(cfg.train.warmup_steps, graphs.min_warmup(strategy))  # at most `steps`
    # the epoch's length is the ladder's own check below (n_train unknown here): only the modes and the host
    if why := mode_refusal(loader.replace_train(cfg, **train).train, host, oversubscribed=False):
        raise Infeasible(why)
    if sets.get("cuda_graphs"):
        at = graphs.capture_step(strategy)  # 0-based: `at` eager steps, then the capture
        steps = cfg.data.train_limit // batch  # whole batches: an epoch's steps (trial/loop.py steps_per_epoch)
        if steps <= at:
            raise Infeasible(
                f"{rung} captures its CUDA graph at step {at + 1} ({at} eager steps of {strategy} first), and an "
                f"epoch of {cfg.data.train_limit:,} images is {steps} steps of {batch}: the warm epoch would hold "
                f"eager steps and the capture, not replays only; give --images {(at + 1) * batch} or more"
            )
    return loader.replace_train(cfg, **train)


def ran_as(key: str, kind: str, caps: dict) -> list[str]:
    """How row `key` runs on a `kind` host of capabilities `caps` (host_capabilities) where its label says more than
    that: compile's reduce-overhead mode adds CUDA graphs on GPUs only (torch's inductor skips its graphs for CPU
    tensors, so a CPU runs the step as compile's default mode: schema.COMPILE_MODES), and a bf16 row on a device
    without native bf16 converts through fp32 (capabilities.py)."""
    sets = next((s for k, _, s, _ in LADDER if k == key), {})
    notes = []
    if sets.get("compile_mode") == "reduce-overhead" and kind != "cuda":
        notes.append("runs as compile's default mode on CPU")
    if sets.get("amp_dtype") == "bf16" and caps.get("bf16") == "emulated":
        notes.append("emulated bf16")
    return notes


def labelled(label: str, notes: list[str]) -> str:
    """A row's label with how it ran (ran_as), where that differs from what the label names."""
    return f"{label} ({'; '.join(notes)})" if notes else label


def mfu_text(row: dict, gemm_dtype: str, units: int, sheet: float | None) -> str:
    """A row's MFU, each figure named with the peak it is over and that peak's dtype (a bf16 row on a CPU is over
    the fp32 GEMM peak, an fp32 row on a GPU over the bf16 one)."""
    text = f"MFU {show(row['mfu_gemm'], '.1%')} against the measured {gemm_dtype} GEMM peak"
    text += f" x {units} cores" if units > 1 else ""
    if sheet:
        text += f", {show(row['mfu_datasheet'], '.1%')} against the datasheet bf16 peak"
    return text


def steady(row: dict) -> str:
    """A row's steady state, or that it timed no step (every step of the trial inside its warm-up)."""
    if row["img_s"] is None:
        return "steady state: no step timed (every step inside the warm-up)"
    return f"steady state {row['img_s']:>9,.0f} img/s = {row['steady_s_per_60k']:.2f} s/60k"


def main():
    p = parser(__doc__)
    p.add_argument("--models", default="resnet18,lenet", help="comma-separated: resnet18, lenet")
    p.add_argument(
        "--rounds",
        type=count("rounds"),
        default=1,
        help="rounds, each every rung and the d2l recipe in turn; the figures are medians over them (default 1)",
    )
    p.add_argument(
        "--rungs",
        default=",".join(key for key, *_ in LADDER),
        help=f"comma-separated rungs of the ladder (default: all): {', '.join(key for key, *_ in LADDER)}",
    )
    p.add_argument(
        "--images", type=count("images"), default=60000, help="training images per epoch (default: all 60,000)"
    )
    p.add_argument(
        "--batch",
        type=count("batch size"),
        default=256,
        help="batch size of every rung and of the d2l recipe (d2l's: 256)",
    )
    p.add_argument(
        "--peer",
        type=Path,
        default=None,
        help="the d2l recipe (default: the first of ../shared/peers/, shared/peers/, peers/ holding it; "
        "if none does, Parallax alone is measured and no ratio is printed)",
    )
    p.add_argument(
        "--no-peer",
        nargs="?",
        const="--no-peer given",
        default=None,
        metavar="REASON",
        help="measure Parallax alone (run.sh passes this, with the reason, on a node without torchvision)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = p.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()]
    if not rungs or set(rungs) - {key for key, *_ in LADDER}:
        p.error(f"--rungs takes a comma-separated subset of {', '.join(key for key, *_ in LADDER)}; got {args.rungs!r}")
    if args.peer is not None and not args.peer.exists():
        p.error(f"the d2l recipe is not at {args.peer}; pass --peer PATH")
    args.peer = None if args.no_peer else args.peer or next((q for q in PEERS if q.exists()), None)
    peer_note = args.no_peer or ("" if args.peer else "no d2l_reference.py found")
    if not models or set(models) - set(LR):
        p.error(f"--models takes a comma-separated subset of {', '.join(LR)}; got {args.models!r}")
    source = resolve_source(args)
    ensure_data(args.data, source)
    available = store.load(args.data, source).train_x.shape[0]
    steps = min(args.images, available) // args.batch
    if steps < 2:
        p.error(f"--images {args.images} gives {steps} batch(es) of {args.batch}; need at least 2")
    images = steps * args.batch  # every run trains exactly these: whole batches, same count for all three
    host = probe()

    def say(*parts):
        print(*parts, f"| data: {source}", flush=True)

    # --- the matmul peak (measured in every round, best kept) and FLOPs per image
    threads = torch.get_num_threads()

    def gemm_peak() -> float:
        if host.kind == "cuda":
            flops = matmul_peak(torch.device("cuda", 0), 8192, torch.bfloat16)
            torch.cuda.empty_cache()  # give the GEMM's 384 MiB back before training
            return flops
        torch.set_num_threads(1)
        flops = matmul_peak(torch.device("cpu"), 1024, torch.float32)
        torch.set_num_threads(threads)
        return flops

    gemm_dtype = "bf16" if host.kind == "cuda" else "fp32"  # gemm_peak's
    if host.kind == "cuda":
        gemm_what = "bf16 GEMM 8192^3 on cuda:0"
        sheet = datasheet_peak(host.name)
        sheet_what = (
            f"datasheet dense bf16 {sheet / 1e12:,.0f} TFLOP/s ({host.name})"
            if sheet
            else f"no datasheet entry for {host.name!r}"
        )
    else:
        gemm_what = "fp32 GEMM 1024^3, one core; the bf16 rows are measured against it too"
        sheet, sheet_what = None, "no datasheet peak (CPU host)"
    fpi = {m: flops_per_image(m, 8, torch.device("cpu")) for m in models}  # per image: batch-independent
    say(host_line())
    say(
        f"{images:,} training images per epoch ({steps} steps of {args.batch}) on the first device; "
        f"{args.rounds} round(s), alternating; d2l recipe "
        + (str(args.peer) if args.peer else f"not run ({peer_note}): no ratios")
    )

    cfg = ladder_cfg(args.data, source, images, steps)
    runs = {m: {key: [] for key, _ in ROWS} for m in models}
    gemms = []
    for r in range(args.rounds):
        gemms.append(gemm_peak())
        say(f"round {r + 1} peak: {gemms[-1] / 1e12:,.3f} TFLOP/s ({gemm_what})")
        for model in models:
            with tempfile.TemporaryDirectory() as tmp:
                for rung in rungs:
                    runs[model][rung].append(parallax(cfg, Path(tmp), model, rung, args.batch, host))
            if args.peer:
                try:
                    runs[model]["d2l"].append(d2l(args.peer, args.data, model, args.batch, steps))
                except PeerFailed as e:  # Parallax's rows still count: reported, then measured alone
                    print(f"d2l peer failed: {e}", flush=True)
                    args.peer, peer_note = None, f"failed: {e}"
            d = runs[model]["d2l"][-1] if (args.peer and runs[model]["d2l"]) else None
            last = {key: runs[model][key][-1] for key in rungs}
            done = "; ".join(
                f"{key} not run: {x['failed'].rstrip('.')}"  # the reason's own full stop ends no list item
                if "failed" in x
                else f"{key} {x['epoch_s']:.2f} s warm, "
                + ("no step timed" if x["img_s"] is None else f"{x['img_s']:,.0f} img/s")
                for key, x in last.items()
            )
            say(
                f"round {r + 1} {model}: {done}"
                + (
                    f"; d2l epoch 1 {d['epoch1_s']:.2f} s, epoch 2 {d['epoch_s']:.2f} s, {d['img_s']:,.0f} img/s"
                    if d
                    else ""
                )
            )

    gemm = max(gemms)
    say(f"peak: measured {gemm / 1e12:,.3f} TFLOP/s (best of {len(gemms)} round(s), {gemm_what}); {sheet_what}")
    # fp32 rows on a GPU with cuDNN's TF32 switch on (torch's default, Ampere and newer) are TF32-conv rows
    caps = host_capabilities(host)
    fp32 = fp32_label(caps)
    labels = {key: label.replace("fp32", fp32) for key, label in ROWS}
    report = {
        "host": host_line(),
        "data_source": source,
        "device": host.name,
        "device_kind": host.kind,
        "tf32": caps.get("tf32"),
        "tf32_text": caps.get("tf32_text"),
        "fp32_label": fp32,
        "images_per_epoch": images,
        "rungs": rungs,
        "batch": args.batch,
        "rounds": args.rounds,
        "peer": str(args.peer or ""),
        "peer_note": peer_note,
        "peak_gemm_flops": gemm,
        "peak_gemm_rounds": gemms,
        "peak_gemm_what": gemm_what,
        "peak_gemm_dtype": gemm_dtype,
        "peak_datasheet_flops": sheet,
        "models": {},
    }
    for model in models:
        ref = runs[model]["d2l"]
        ref_s, ref_ips = (med([x["epoch_s"] for x in ref]), med([x["img_s"] for x in ref])) if ref else (None, None)
        say(f"{model} B={args.batch}: {fpi[model] / 1e9:,.3f} GFLOP per training image (forward + backward)")
        out = report["models"][model] = {"flops_per_image": fpi[model], "rows": {}}
        for key, _ in ROWS:
            notes = ran_as(key, host.kind, caps)
            label = labelled(labels[key], notes)
            failed = [x["failed"] for x in runs[model][key] if "failed" in x]
            xs = [x for x in runs[model][key] if "failed" not in x]
            if failed:
                out.setdefault("not_run", {})[key] = failed[-1]
                say(f"  {labels[key]:28s} not run ({key}): {failed[-1]}")  # no run: no note on how it ran
            if not xs:
                continue  # no d2l recipe here, or the rung did not run
            epoch_s, ips = med([x["epoch_s"] for x in xs]), med([x["img_s"] for x in xs])
            # one device, except the d2l recipe on a CPU host: it computes with every core
            units = host.n if (key == "d2l" and host.kind == "cpu") else 1
            row = {
                "runs": xs,
                "epoch_s": epoch_s,
                "epoch_s_per_60k": epoch_s * 60000 / images,
                "img_s": ips,
                "steady_s_per_60k": 60000 / ips if ips else None,
                "epoch_ratio_vs_d2l": ref_s / epoch_s if ref_s else None,
                "img_s_ratio_vs_d2l": ips / ref_ips if (ips and ref_ips) else None,
                "mfu_gemm": fpi[model] * ips / (gemm * units) if ips else None,
                "mfu_datasheet": fpi[model] * ips / sheet if (ips and sheet) else None,
                "mfu_gemm_peak": f"measured {gemm_dtype} GEMM",
                "label": label.strip(),
                "ran_as": notes,
            }
            out["rows"][key] = row
            row["epoch1_s"] = med([x["epoch1_s"] for x in xs])
            say(
                f"  {label:28s} warm epoch {epoch_s:6.2f} s (cold {row['epoch1_s']:.2f} s) = "
                f"{row['epoch_s_per_60k']:.2f} s/60k; {steady(row)}"
            )
            mfu = mfu_text(row, gemm_dtype, units, sheet)
            if key != "d2l" and ref:
                say(
                    f"  {'':26s} vs d2l recipe: epoch {row['epoch_ratio_vs_d2l']:.2f}x faster, "
                    f"img/s {show(row['img_s_ratio_vs_d2l'], '.2f')}x; {mfu}"
                )
            else:
                say(f"  {'':26s} {mfu}" + ("" if ref else "; no d2l recipe: no ratio"))
            if "compile" in key and (c := compile_cost(row)):
                row["compile_cost"] = c
                say(
                    f"  {'':26s} compiling costs {c['cost_s']:.1f} s (cold epoch less warm): "
                    f"{c['per_epoch_over_1']:.2f} s/epoch over 1 epoch, {c['per_epoch_over_10']:.2f} s/epoch over 10, "
                    f"{row['epoch_s']:.2f} s warm"
                )
        if model == "resnet18":
            out["targets"] = targets(out["rows"], host.kind, say)
        if model == "lenet":
            out["targets"] = lenet_target(out["rows"], host.kind, say)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        say(f"wrote {args.json}")


if __name__ == "__main__":
    main()
