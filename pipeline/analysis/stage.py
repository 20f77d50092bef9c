"""Analysis stage: scaling efficiency, memory per device and accuracy from every sweep table.

    python -m pipeline analyze          # or: dvc repro -s analyze

Reads results/sweeps/*.jsonl (one row per trial, written by records/table.py) and writes into
results/analysis/: metrics.json (the DVC metric: flat numbers only), summary.json (the structured summary),
efficiency/throughput/memory/accuracy.csv (tidy, for DVC plots), efficiency/throughput/memory/accuracy.png,
knobs.csv (+ one knob_*.png per varied DDP knob), best.yaml (the fastest configuration as params-style `train:`
and `data:` sections), breakdown.csv + breakdown.png (where a sampled step goes),
model.csv + model.png (the scaling model beside the measurements: every number in them modelled) and report.md.
results/collectives.json, when present (pipeline.scaling.collectives.measure() written as JSON), is this host's
collectives for the model; the stage never measures them itself (it launches no processes). Only complete,
non-oversubscribed trials enter the numbers; everything else is listed with its reason.
Undefined stays NaN (CSV: row absent; JSON: null), never 0.
The outputs are one generation (records/files.py `replacing_folder`): all are written into a new folder beside the
output folder, generation.json last (the time, the inputs' sha256, each file's sha256), and the two folders are
exchanged in one rename (where the file system cannot, the files are replaced one by one, generation.json last), so a
kill at any moment leaves the earlier analysis whole or the new one whole, never a mix; a file there that analyze does
not write (a user's notes) is kept. A write refused (a full disk) stops the stage with one paragraph naming the folder
and its free space, the earlier analysis left whole.

The wing, arrows one way (tests/architecture/test_imports.py keeps it so): tables/ reads neither report/ nor plots/;
report/ and plots/ read tables/ and not each other; this module reads all three.
    tables/rows.py     reading the sweep tables into one typed frame
    tables/points.py   point, scaling, memory, accuracy tables (pure pandas, on rows.py; stats.py's intervals)
    tables/summary.py  summary.json's dict and metrics.json; tables/knob_effects.py  the knobs' table
    tables/step_parts.py  the step-time breakdown; tables/projection.py  the scaling model, all modelled
    plots/figures.py   the figures (plots/dvc_template.py: the offline page for `dvc plots show`)
    report/document.py  report.md (with report/host.py, why.py, sharding.py, memory_fit.py, causes.py, confidence.py)
    report/answer.py   report.md's first screen and best.yaml: strategy, k, why, cost, how sure, command
    stage.py           this entry: the only module that decides which files are written (on all of them)
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from pipeline.analysis.plots import figures
from pipeline.analysis.report import answer, document, why
from pipeline.analysis.tables import projection
from pipeline.analysis.tables.knob_effects import knob_table
from pipeline.analysis.tables.points import (
    accuracy_table,
    memory_devices,
    memory_table,
    point_table,
    scaling_table,
    shown_extras,
    with_throughput_intervals,
)
from pipeline.analysis.tables.points import shown_extras as _shown  # noqa: F401
from pipeline.analysis.tables.rows import EXPECTED, load_sweeps, read_sweeps  # noqa: F401
from pipeline.analysis.tables.rows import normalize as _normalize  # noqa: F401
from pipeline.analysis.tables.step_parts import breakdown_losses, breakdown_table
from pipeline.analysis.tables.summary import flat_metrics, strategy_status, summarize

# Names tests/analysis/test_analyze.py reaches through this module.
from pipeline.analysis.tables.summary import jsonable as _jsonable  # noqa: F401
from pipeline.analysis.tables.summary import strategy_metrics as _strategy_metrics  # noqa: F401
from pipeline.errors import Stopped
from pipeline.records import files
from pipeline.records.table import SUFFIX


def _csv(df, path, cols, shown):
    df = df[[*cols[:2], *shown, *cols[2:]]].copy()
    for c in ("k", "batch_size", "per_device_batch", "device", "peak_mem_bytes"):
        if c in df and df[c].dropna().map(lambda v: float(v).is_integer()).all():
            df[c] = df[c].astype("Int64")  # 2, not 2.0; an empty cell stays empty
    _to_csv(df, path)


def _to_csv(df, path: Path) -> None:
    with files.replacing(path, "w", newline="") as f:
        df.to_csv(f, index=False)


@contextlib.contextmanager
def _writing(out: Path):
    """The outputs' writes: one the host refuses (a full disk, a read-only folder) stops the stage in one paragraph."""
    try:
        yield
    except OSError as e:
        what = f"{Path(e.filename).name}: " if e.filename else ""
        raise Stopped(
            f"analyze could not write its outputs in {out} ({what}{e.strerror or e}); {files.free_text(out)} there. "
            f"{out} keeps the earlier analysis whole, every file as its generation.json lists it (a folder that "
            f"cannot be replaced whole, such as a mount point, has its files replaced one by one and holds no "
            f"generation.json until a run completes). Free space there (or write the analysis elsewhere with --out) "
            f"and rerun analyze."
        ) from None


def _measured(t):
    """`t` with the `measured` column DVC's plots show (a ring and legend entry, a tooltip line): "under load" for a
    point from trials all flagged as measured under interference (tables/points.py's under_load), else "quiet"."""
    return t.assign(measured=t["under_load"].eq(True).map({True: "under load", False: "quiet"}))


def _point_labels(t, x) -> list[str]:
    """Each row's configuration as one label, the varying columns `x` included ("ddp lenet k=2 B=256
    optimizer=adamw"): the memory plot's bars, one per device of each label, so two configurations that differ only
    in a varying column (AdamW beside SGD) are two bars, never one bar stacked from both."""
    shown = [c for c in x if c not in ("host", "data_source")]
    return [
        " ".join([f"{r['strategy']} {r['model']} k={r['k']:g} B={r['batch_size']:g}", *(f"{c}={r[c]}" for c in shown)])
        for r in t.to_dict("records")
    ]


def _write_csvs(out: Path, pts, eff, mem, acc, x) -> None:
    """The tidy CSVs of DVC plots; columns that vary (host, data source, knobs) after strategy and model; the speeds'
    `measured` label last."""
    _csv(
        _measured(eff[eff["efficiency"].notna()]),
        out / "efficiency.csv",
        [
            "strategy",
            "model",
            "k",
            "per_device_batch",
            "batch_size",
            "kind",
            "efficiency",
            "efficiency_lo",
            "efficiency_hi",
            "speedup",
            "speedup_lo",
            "speedup_hi",
            "throughput_img_s",
            "n_windows",
            "n_repeats",
            "comparable",  # False: its two ends measured under loads that are not comparable (tables/comparable.py)
            "measured",
        ],
        x,
    )
    _csv(
        _measured(with_throughput_intervals(pts[pts["throughput_img_s"].notna()], eff)),
        out / "throughput.csv",
        [
            "strategy",
            "model",
            "k",
            "batch_size",
            "per_device_batch",
            "throughput_img_s",
            "throughput_lo",  # its 95% interval (DVC's plot: a bar), empty where the bootstrap gives none
            "throughput_hi",
            "measured",
        ],
        x,
    )
    devs = memory_devices(mem)  # the GPU-only figures (resident, reserved peak, NVML) where any device has them
    _csv(
        devs.assign(point=_point_labels(devs, x)),
        out / "memory.csv",
        [
            "strategy",
            "model",
            "k",
            "batch_size",
            "point",
            "device",
            "peak_mem_bytes",
            "peak_mem_mib_dev",
            "peak_mem_mib",
            *(c for c in ("resident_bytes", "reserved_peak_bytes", "nvml_used_bytes") if devs[c].notna().any()),
        ],
        x + (["mem_method"] if mem["mem_method"].nunique() > 1 else []),
    )
    _csv(
        acc, out / "accuracy.csv", ["strategy", "model", "k", "batch_size", "lr", "final_test_acc", "time_to_acc_s"], x
    )


def _write_figures(out: Path, status, pts, eff, mem, knobs, source: str) -> None:
    colors = figures.style(status)
    figures.plot_efficiency(eff, out / "efficiency.png", colors, source)
    figures.plot_throughput(pts, out / "throughput.png", colors, source, eff)
    figures.plot_memory(mem, out / "memory.png", source)
    figures.plot_accuracy(pts, out / "accuracy.png", colors, source)
    for knob in knobs["knob"].unique():
        figures.plot_knob(knobs, knob, out / f"knob_{knob}.png", source)


def read_collectives(path: Path) -> tuple[dict | None, list[str]]:
    """This host's measured collectives (results/collectives.json), if present and readable."""
    if not path.exists():
        return None, []
    try:
        measured = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, [f"{path} is unreadable ({type(e).__name__}): the model ran without the host's collectives"]
    if measured.get("measured") is False:  # a one-device host: nothing to time
        return None, [f"No collectives measured on this host: {measured.get('reason', 'unknown')}."]
    return measured, []


def _why(out: Path, df, eff, collectives, source: str) -> list[str]:
    """Breakdown and model: their CSVs, figures and the report's "Why it scales" section."""
    bd = breakdown_table(df)
    losses = breakdown_losses(bd, eff)
    model, model_notes = projection.model_table(df, eff, collectives)
    _to_csv(bd, out / "breakdown.csv")
    _to_csv(model, out / "model.csv")
    figures.plot_breakdown(bd, out / "breakdown.png", source)
    figures.plot_model(eff, model, out / "model.png", source)
    return why.why_section(bd, losses, model, model_notes)


def analyze(
    sweeps_dir, out_dir, target_acc: float | None = None, expected=EXPECTED, collectives_json: Path | None = None
) -> dict:
    """Read every sweep table, write all outputs into out_dir and return the summary dict. collectives_json: this
    host's measured collectives (default: collectives.json beside the sweeps directory, used only if present)."""
    tables_read = sorted(Path(sweeps_dir).glob(f"*{SUFFIX}"))  # the inputs generation.json names, by their sha256
    df, notes, tables = read_sweeps(sweeps_dir, expected)
    collectives_path = Path(collectives_json or Path(sweeps_dir).parent / "collectives.json")
    collectives, more = read_collectives(collectives_path)
    notes += more
    out = Path(out_dir)
    pts, eff, mem = point_table(df), scaling_table(df), memory_table(df)
    acc = accuracy_table(df, target_acc)
    status = strategy_status(df, tables, sweeps_dir, expected)
    summary = summarize(df, status, pts, eff, mem, target_acc)
    knobs = knob_table(pts, eff)
    overlap_md = Path(sweeps_dir).parent / "overlap" / "overlap.md"
    overlap = document.overlap_section(overlap_md)
    best = answer.build(df, status, pts, eff, mem)
    inputs = files.input_digests([*tables_read, collectives_path, overlap_md])
    with _writing(out), files.replacing_folder(out, inputs, owns=("knob_*.png",)) as new:  # from here on only writes
        _write_csvs(new, pts, eff, mem, acc, shown_extras(df))
        _write_figures(new, status, pts, eff, mem, knobs, summary.get("data_source") or "")
        _to_csv(knobs, new / "knobs.csv")
        extra = (
            _why(new, df, eff, collectives, summary.get("data_source") or "") + document.knob_section(knobs) + overlap
        )
        files.write_text(new / "best.yaml", answer.best_yaml(best))
        document.write_report(new / "report.md", df, notes, status, pts, eff, mem, acc, extra, best)
        files.write_text(new / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
        metrics = flat_metrics(summary, pts, eff, mem)  # the DVC metric (sentences stay in report.md)
        files.write_text(new / "metrics.json", json.dumps(metrics, indent=1, allow_nan=False) + "\n")
    return summary
