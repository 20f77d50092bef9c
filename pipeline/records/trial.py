"""One trial's record: every per-trial measurement declared once, with its kind (its type) and its views.

`summarize` builds a TrialRecord once per trial from every rank's result; the rest are views of it: metrics.json and
the Optuna attribute `metrics` (every field); PARAM, METRIC, TAG: MLflow; OPTUNA: numeric Optuna user attributes
(optuna-dashboard plots them); TABLE: a column of results/sweeps/<strategy>.jsonl, which records/table.typed reads
back for analysis. Every view's key is the field's own name (`wall_s` is `wall_s` on MLflow, in the table and in
metrics.json): no declaration names another. Values computed from fields (final accuracy, peaks in MiB, the
breakdown's parts) are declared in DERIVED, each under its own name too (final_test_acc, peak_mem_mib). Adding a
measurement: one line in TrialRecord (rank= fills it from the ranks' results; POINT carries it into the analysis and
metrics.json), plus the code that measures it; tests/records/test_record.py checks that every field reaches every
view it declares, under its own name. Torch-free: analysis imports it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from pipeline import zoo
from pipeline.records.derived import (  # noqa: F401 (BD_COLUMNS, BD_PARTS, JSON, breakdown_metrics: the record's names)
    BD_COLUMNS,
    BD_PARTS,
    DERIVED,
    JSON,
    METRIC,
    MIB,
    OPTUNA,
    PARAM,
    POINT,
    TABLE,
    TAG,
    breakdown_metrics,
    sampled_breakdown,
)

# What a study's figures were computed with beyond its settings (sweep/provenance.py), one name each on the study,
# its MLflow runs and its table's rows: the trial's code, the prepared data's content, the torch release
PROVENANCE = ("code_digest", "data_digest", "torch_version")
# Table columns that describe the Optuna trial (or the skipped point), not the run: filled by records/table.trial_row
ROW_COLUMNS = {
    "study": "str",
    "trial": "int",
    "state": "str",
    "reason": "str",
    "mlflow_run_id": "str",
    **dict.fromkeys(PROVENANCE, "str"),
}


def _f(*views: str, rank: str | None = None):
    """A field and the views it appears in, under its own name in every one (no view renames it); `rank`: how
    summarize fills it from the ranks' results by its own name (RANK_AGGREGATES), so a measurement a rank returns
    needs no line of its own there."""
    if rank is not None and rank not in RANK_AGGREGATES:
        raise ValueError(f"rank={rank!r}: one of {sorted(RANK_AGGREGATES)}")
    return field(default=None, metadata={"views": frozenset(views), "rank": rank})


def _numbers(ranks, key) -> list:
    return [r[key] for r in ranks if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


# how a rank-measured field becomes the trial's value: the main rank's, or the largest / smallest over every rank
RANK_AGGREGATES = {
    "main": lambda main, ranks, key: main.get(key),
    "max": lambda main, ranks, key: max(_numbers(ranks, key), default=None),
    "min": lambda main, ranks, key: min(_numbers(ranks, key), default=None),
}


@dataclass(frozen=True)
class TrialRecord:
    # what was asked (the trial's configuration: known before it runs)
    model: str | None = _f(PARAM, TAG, TABLE)
    # where the model comes from (d2l, torchvision 0.29.1, entry point mypkg.models:build (mypkg 1.0)) and how it meets
    # 1x28x28 images (pipeline/zoo.py)
    model_source: str | None = _f(PARAM, TAG, TABLE)
    model_adaptation: str | None = _f(PARAM, TAG, TABLE)
    strategy: str | None = _f(PARAM, TAG, TABLE)
    devices: int | None = _f(PARAM, TAG, TABLE)
    batch_size: int | None = _f(PARAM, TABLE)
    per_device_batch: int | None = _f(PARAM, TABLE)
    lr: float | None = _f(PARAM, TABLE)
    optimizer: str | None = _f(PARAM, TABLE)  # train.optimizer: sgd, sgd_momentum or adamw
    epochs: int | None = _f(PARAM, TABLE)
    seed: int | None = _f(PARAM, TABLE)
    max_steps: int | None = _f(PARAM, TABLE)
    data_source: str | None = _f(PARAM, TAG, TABLE)
    synthetic: bool | None = _f(TAG)
    # the data limits too: the report's command reruns its answer on the images the sweep measured on
    train_limit: int | None = _f(PARAM, TABLE)
    test_limit: int | None = _f(TABLE)
    nnodes: int | None = _f(PARAM, TAG, TABLE)  # a SLURM trial's ceil(k / slurm.devices_per_node)
    warmup_steps: int | None = _f()
    target_acc: float | None = _f(TABLE)
    bucket_cap_mb: int | None = _f(PARAM, TABLE)
    grad_as_bucket_view: bool | None = _f(PARAM, TABLE)
    accum_steps: int | None = _f(PARAM, TABLE)
    comm_hook: str | None = _f(PARAM, TABLE)
    amp_dtype: str | None = _f(PARAM)  # the setting before the trial, what the strategy resolved after (ddp_amp)
    # the execution modes (catalog.MODES): same arithmetic, different execution
    compile: bool | None = _f(PARAM, TABLE)
    compile_mode: str | None = _f(PARAM, TABLE)
    cuda_graphs: bool | None = _f(PARAM, TABLE)
    cudnn_benchmark: bool | None = _f(PARAM, TABLE)
    autocast: bool | None = _f(PARAM, TABLE)
    # where it ran (capabilities.host_capabilities: the facts that change a number)
    oversubscribed: bool | None = _f(TAG, TABLE)
    device_kind: str | None = _f(TAG, TABLE)
    device_name: str | None = _f(TAG, TABLE)
    host: str | None = _f(TAG, TABLE)
    host_devices: int | None = _f(TABLE)
    torch: str | None = _f()
    cuda: str | None = _f()
    host_cpu_isa: str | None = _f(TAG, TABLE)
    host_torch_cpu_capability: str | None = _f(TAG)
    host_bf16: str | None = _f(TAG, TABLE)
    host_fp16: str | None = _f(TAG, TABLE)
    host_cpu_bf16: str | None = _f(TAG)
    host_cpu_fp16: str | None = _f(TAG)
    host_gpu_name: str | None = _f(TAG, TABLE)
    host_gpu_cc: str | None = _f(TAG, TABLE)
    host_nccl: str | None = _f(TAG, TABLE)
    host_torch: str | None = _f(TAG)
    host_cuda: str | None = _f(TAG)
    host_interconnect: str | None = _f(TAG, TABLE)
    host_tf32: str | None = _f(TAG, TABLE)  # the launching process's TF32 switches (read once)
    tf32: str | None = _f(TAG)  # the TF32 switches the main rank trained under (train.fp32_precision=ieee pins them)
    # what it measured
    parallel_devices: bool | None = _f(TAG, TABLE)
    steps: int | None = _f()
    stopped: bool | None = _f()
    # the trial's images/s over its timed steady-state steps: one name in every view (MLflow, Optuna, the sweep table,
    # metrics.json, the report); the slowest rank's: all ranks meet at every all-reduce, so the trial runs at its pace
    throughput_img_s: float | None = _f(METRIC, OPTUNA, TABLE, rank="min")
    throughput_windows: list[float] | None = _f(TABLE)  # steady-state img/s per window, element-wise slowest rank
    timed_steps: int | None = _f()
    epoch_s: list[float] | None = _f(TABLE)
    test_acc: list[float] | None = _f(TABLE)
    train_loss: list[float] | None = _f(TABLE)
    epoch_throughput_img_s: list[float] | None = _f()  # each epoch's images/s (the epoch records' own name)
    time_to_acc_s: float | None = _f(METRIC, TABLE)
    startup_s: float | None = _f(METRIC, TABLE)  # the warm-up steps' seconds (meter.py)
    eval: str | None = _f()
    peak_mem_bytes: list[float] | None = _f(TAG, TABLE)  # per device, of kind mem_basis
    mem_imbalance: float | None = _f(METRIC, OPTUNA, TABLE)
    mem_device0_excess: float | None = _f()
    mem_method: str | None = _f(TAG, TABLE)
    mem_basis: str | None = _f(TAG, TABLE)  # what peak_mem_bytes (so imbalance, dev-0 excess) holds
    mem_resident_bytes: list[float] | None = _f(TABLE)  # CUDA: allocated before step 0 (model, optimizer, data, libs)
    mem_workspace_bytes: list[float] | None = _f(TABLE)  # CUDA: of the resident, the libraries' (cuBLAS, cuDNN)
    mem_reserved_peak_bytes: list[float] | None = _f(TABLE)  # CUDA: the caching allocator's reserved peak
    mem_nvml_used_bytes: list[float] | None = _f(TABLE)  # CUDA with NVML: the device's used memory, every process's
    mem_devices: list[str] | None = _f(TAG)
    comm_hook_used: str | None = _f(TAG, TABLE)  # what comm_hook=auto became (ddp, ddp_amp); None elsewhere
    amp_scale: float | None = _f()  # fp16 GradScaler's scale after the last step (ddp_amp); None elsewhere
    amp_skipped_steps: int | None = _f()  # optimizer steps GradScaler skipped (inf/NaN gradients); None without one
    # fp16 GradScaler's step reads found_inf to the host (a sync per step: no fused optimizer); None without one
    amp_step_syncs: bool | None = _f(TABLE)
    backend: str | None = _f()  # process group of a multi-process trial: nccl or gloo; None otherwise
    breakdown: dict | None = _f()  # where a sampled steady-state step goes (breakdown.py), main rank's view
    interference: dict | None = _f()  # what else used the host meanwhile (interference.py)
    wall_s: float | None = _f(METRIC, TABLE)  # wall-clock seconds, from launching its ranks to its results

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def params(self) -> dict:  # None too, logged as "None" as ever
        return self._view(PARAM)

    def metrics(self) -> dict:
        return {k: v for k, v in self._view(METRIC).items() if _finite(v)}

    def breakdown_parts(self) -> dict:
        """The sampled step's breakdown: <part>_s and <part>_share, step_s, samples ({} where no step was sampled)."""
        return sampled_breakdown(self)

    def tags(self) -> dict:
        return {k: _tag(v) for k, v in self._view(TAG).items() if v is not None}

    def optuna_attrs(self) -> dict:
        return {k: float(v) for k, v in self._view(OPTUNA).items() if _finite(v)}

    def table_row(self) -> dict:
        return self._view(TABLE)

    def _view(self, view: str) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            if view in f.metadata["views"]:
                out[f.name] = getattr(self, f.name)
        for d in DERIVED:
            if view in d.views:
                value = d.fn(self)
                out.update({d.name + k: v for k, v in value.items()} if d.expand else {d.name: value})
        return out

    def __getitem__(self, key: str):  # record["throughput_img_s"]: metrics.json's key, for callers that read by name
        return getattr(self, key)

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    @classmethod
    def from_dict(cls, m: dict) -> TrialRecord:
        """A record from its metrics.json (keys it does not know are dropped, missing ones are None)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (m or {}).items() if k in names})


# what every rank reports for summarize: its lists, per device (memory) or per window (throughput), joined over the
# ranks by summarize, and the fields declared with rank= (RANK_AGGREGATES); trial/loop.py gathers these keys
RANK_LISTS = (
    "peak_mem_bytes",
    "mem_resident_bytes",
    "mem_workspace_bytes",
    "mem_reserved_peak_bytes",
    "mem_nvml_used_bytes",
    "throughput_windows",
)


def rank_keys() -> list[str]:
    """The keys each rank's part of a trial carries to the main rank (beside its rank, node, host and devices)."""
    return [*RANK_LISTS, *(f.name for f in dataclasses.fields(TrialRecord) if f.metadata["rank"])]


# ---------------------------------------------------------------- building it


def planned(cfg, host, host_fields: dict | None = None) -> TrialRecord:
    """What is known before the trial runs: its configuration, the host and its capability_fields."""
    t = cfg.train
    return TrialRecord(
        model=t.model,
        model_source=zoo.source(t.model),
        model_adaptation=zoo.adaptation(t.model),
        strategy=t.strategy,
        devices=t.devices,
        batch_size=t.batch_size,
        per_device_batch=t.batch_size // t.devices,
        lr=t.lr,
        optimizer=t.optimizer,
        epochs=t.epochs,
        seed=t.seed,
        max_steps=t.max_steps,
        data_source=cfg.data.source,
        synthetic=cfg.data.source == "synthetic",
        train_limit=cfg.data.train_limit,
        test_limit=cfg.data.test_limit,
        nnodes=t.nnodes,
        warmup_steps=max(t.warmup_steps, 1),
        target_acc=t.target_acc,
        bucket_cap_mb=t.bucket_cap_mb,
        grad_as_bucket_view=t.grad_as_bucket_view,
        accum_steps=t.accum_steps,
        comm_hook=t.comm_hook,
        amp_dtype=t.amp_dtype,
        compile=t.compile,
        compile_mode=t.compile_mode,
        cuda_graphs=t.cuda_graphs,
        cudnn_benchmark=t.cudnn_benchmark,
        autocast=t.autocast,
        oversubscribed=t.devices > host.n * t.nnodes,
        device_kind=host.kind,
        device_name=host.name,
        host=host.hostname,
        host_devices=host.n,
        torch=host.torch,
        cuda=host.cuda,
        **(host_fields or {}),
    )


def capability_fields(caps: dict) -> dict:
    """capabilities.host_capabilities(host) as the record's host_* fields."""
    cpu, gpus = caps.get("cpu") or {}, caps.get("gpus") or []
    return {
        "host_cpu_isa": cpu.get("isa_text") or ",".join(cpu.get("isa") or []) or "none",
        "host_torch_cpu_capability": cpu.get("torch_cpu_capability"),
        "host_bf16": caps.get("bf16"),
        "host_fp16": caps.get("fp16"),
        "host_cpu_bf16": cpu.get("bf16"),
        "host_cpu_fp16": cpu.get("fp16"),
        "host_gpu_name": ",".join(sorted({g["name"] for g in gpus})) or None,
        "host_gpu_cc": ",".join(sorted({g["compute_capability"] for g in gpus})) or None,
        "host_nccl": caps.get("nccl") or None,
        "host_torch": caps.get("torch"),
        "host_cuda": caps.get("cuda") or None,
        "host_interconnect": caps.get("interconnect") or None,
        "host_tf32": caps.get("tf32_text"),
    }


def summarize(
    cfg,
    host,
    strategy,
    results: list[dict],
    wall_s: float,
    host_fields: dict | None = None,
    interference: dict | None = None,
) -> TrialRecord:
    """The trial's record from every rank's result (results[0]: the main rank's, which may gather all ranks)."""
    main = results[0]
    ranks = main.get("ranks") or results  # every rank of every node, gathered by the trial itself
    peaks = [p for r in ranks for p in (r["peak_mem_bytes"] or [])]
    windows = [r["throughput_windows"] for r in (*ranks, *results) if r.get("throughput_windows")]
    return dataclasses.replace(
        planned(cfg, host, host_fields),
        parallel_devices=host.kind == "cuda" or strategy.parallel_on_cpu,
        steps=main["steps"],
        stopped=main["stopped"],
        # slowest rank, window by window (throughput_img_s: RANK_AGGREGATES, below)
        throughput_windows=[min(w) for w in zip(*windows)] if windows else [],
        timed_steps=main["timed_steps"],
        epoch_s=main["epoch_s"],
        test_acc=main["test_acc"],
        train_loss=main["train_loss"],
        epoch_throughput_img_s=main["epoch_throughput_img_s"],
        time_to_acc_s=main["time_to_acc_s"],
        startup_s=main.get("startup_s"),
        eval="test set split across the trial's processes, correct counts summed"
        if strategy.multiprocess
        else "on this process's first device",
        peak_mem_bytes=peaks,
        mem_imbalance=imbalance(peaks),
        mem_device0_excess=device0_excess(peaks),
        mem_method=main["mem_method"],
        mem_basis=main.get("mem_basis"),
        mem_resident_bytes=_per_device(ranks, "mem_resident_bytes"),
        mem_workspace_bytes=_per_device(ranks, "mem_workspace_bytes"),
        mem_reserved_peak_bytes=_per_device(ranks, "mem_reserved_peak_bytes"),
        mem_nvml_used_bytes=_per_device(ranks, "mem_nvml_used_bytes"),
        mem_devices=[
            f"node{r.get('node', '0')}:{r.get('host', host.hostname)}/{d}"
            + (f"/rank{r['rank']}" if strategy.multiprocess else "")
            for r in ranks
            for d in r["device_names"][: len(r["peak_mem_bytes"] or [])]
        ],
        comm_hook_used=main.get("comm_hook_used"),
        amp_dtype=main["amp_dtype"],
        backend=main.get("backend"),
        amp_scale=main.get("amp_scale"),
        amp_skipped_steps=main.get("amp_skipped_steps"),
        amp_step_syncs=main.get("amp_step_syncs"),
        tf32=main.get("tf32"),
        breakdown=main.get("breakdown"),
        interference=interference,
        wall_s=wall_s,
        **{
            f.name: RANK_AGGREGATES[f.metadata["rank"]](main, ranks, f.name)
            for f in dataclasses.fields(TrialRecord)
            if f.metadata["rank"]
        },
    )


def _per_device(ranks, key) -> list | None:
    """Every rank's per-device `key`, aligned with peak_mem_bytes; None where no rank has it (CPU)."""
    if not any(r.get(key) for r in ranks):
        return None
    return [v for r in ranks for v in (r.get(key) or [None] * len(r["peak_mem_bytes"] or []))]


def imbalance(peaks) -> float | None:
    """max / mean of peak_mem_bytes (of kind mem_basis) over the trial's devices (1.0 = perfectly balanced)."""
    peaks = [p for p in peaks if p is not None]
    return max(peaks) / (sum(peaks) / len(peaks)) if peaks and sum(peaks) else None


def device0_excess(peaks) -> float | None:
    """peak[0] - mean(peak[1:]) (of kind mem_basis): what device 0 holds beyond the others (needs >= 2 devices)."""
    return peaks[0] - sum(peaks[1:]) / (len(peaks) - 1) if len(peaks) >= 2 else None


# ---------------------------------------------------------------- the sweep table's columns


def _kind(annotation: str) -> str:
    return annotation.split("[")[0].split("|")[0].strip()


def table_kinds() -> dict:
    """Every column of the sweep table and its kind (int, float, str, bool, list)."""
    out = dict(ROW_COLUMNS)
    for f in dataclasses.fields(TrialRecord):
        if TABLE in f.metadata["views"]:
            out[f.name] = _kind(str(f.type))
    out.update({d.name: d.kind for d in DERIVED if TABLE in d.views})
    return out


COLUMNS = list(table_kinds())


def point_columns(record=TrialRecord) -> list[str]:
    """The sweep-table columns of the fields declared with the POINT view: analysed per point and in metrics.json."""
    return [f.name for f in dataclasses.fields(record) if POINT in f.metadata["views"] and TABLE in f.metadata["views"]]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _tag(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)
