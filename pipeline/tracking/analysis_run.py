"""The MLflow `analysis` run of the analyze stage: what its page shows at first sight.

Its description is the report's answer, then the rest of the report's opening (title, synthetic-data warning, host,
the "Reading" section): MLflow shows a description's first lines and the rest behind "Show more";
its metrics are summary.json's counts and each strategy's headline numbers (metric_names.analysis_metrics); every
output file is an artifact (best.yaml included; the Artifacts tab previews the PNGs) and the figures that compare
strategies (CHARTS) also keyed images (figures/<name>, MLflow's image-grid charts), rather than one single-bar chart
per number. It writes the report's numbers onto each strategy's study row (log_study_rows), then rewrites the
experiment's shared runs-table view (ui_view.py), so the link
`python -m pipeline ui` prints opens on Parallax's columns.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from pipeline.errors import StoreError
from pipeline.store_faults import FAULT_TEXT, root_cause, store_fault
from pipeline.tracking import client, metric_names, ui_view

# the figures that compare strategies, as keyed images in this order (the run page's image charts); every other
# figure (one per DDP knob) is an artifact only
CHARTS = ("efficiency", "throughput", "memory", "accuracy", "breakdown", "model")
ROOM_MARGIN = 1 << 20  # bytes beyond the outputs: the store's own rows, journal and temporary files
NOTE_LIMIT = 5000  # characters of report.md in the run's description (MLflow caps tag values at 8,000)


def answer_first(text: str) -> str:
    """`text` (report.md or its opening) with its "## Answer" section's lines first, without their heading, and the
    rest after them in order; `text` as it is where it has no answer section."""
    lines = text.split("\n")
    if "## Answer" not in lines:
        return text
    i = lines.index("## Answer")
    j = next((n for n in range(i + 1, len(lines)) if lines[n].startswith("## ")), len(lines))
    body, rest = "\n".join(lines[i + 1 : j]).strip(), "\n".join(lines[:i] + lines[j:]).strip()
    return f"{body}\n\n{rest}\n" if rest else f"{body}\n"


def report_head(text: str, limit: int = NOTE_LIMIT) -> str:
    """report.md up to the end of its "Reading" section (or its first `limit` characters), its answer first
    (answer_first: the lines MLflow's collapsed description shows) and its title left out (the run's page names the
    run), then where the rest is."""
    start = text.find("\n## Reading")
    cut = text.find("\n## ", start + 1) if start >= 0 else -1
    head = text[:cut] if cut > 0 else text
    if head.startswith("# "):
        head = head.partition("\n")[2].lstrip("\n")
    head = answer_first(head)[:limit].rstrip()
    return head + "\n\n(The full report is the artifact report.md; the figures are under Images and Artifacts.)"


def log_figures(tracker: client.Tracker, run_id: str, paths) -> None:
    """PNG figures as keyed images (figures/<name>, step 0): MLflow's image-grid charts can set them side by side."""
    from PIL import Image  # matplotlib's own dependency

    for p in paths:
        with Image.open(p) as im:
            tracker.client.log_image(run_id, im.convert("RGB"), key=f"{metric_names.FIGURES}/{Path(p).stem}", step=0)


def _room(tracker: client.Tracker, out_dir: Path) -> None:
    """Refuse to open the run when the local artifact store cannot hold the outputs twice over (every figure is
    stored as an artifact and as a keyed image) plus a margin for the store's own writes."""
    where = tracker.local_artifacts()
    while where is not None and not where.exists():
        where = where.parent
    if where is None:
        return
    need = 2 * sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file()) + ROOM_MARGIN
    free = shutil.disk_usage(where).free
    if free < need:
        raise StoreError(
            f"The disk holding the MLflow artifacts ({where}) is full: {free // 1024} KiB free, the "
            f"analysis run needs about {need // 1024} KiB. Free space there (or point tracking.uri "
            f"elsewhere) and rerun `python -m pipeline analyze`; {out_dir} is written. No MLflow run "
            f"was opened."
        )


def _failed(tracker: client.Tracker, run_id: str, e: Exception, out_dir: Path) -> Exception:
    """End the run FAILED with the reason (after removing its partial artifacts when the disk is full, so that the
    store has room to record the end) and say what is true of it; returns the exception to raise."""
    reason, fault = root_cause(e), store_fault(e)
    where = tracker.local_artifacts(run_id)
    if fault == "disk_full" and where is not None:
        shutil.rmtree(where, ignore_errors=True)  # an incomplete copy of out_dir, which stays
    tracker.close_run(run_id, "FAILED", reason)
    if fault is None:
        return e
    status = tracker.status(run_id)
    state = (
        f"ended {status}"
        if status in ("FAILED", "KILLED")
        else "could not be ended (the store refused the "
        f"write): it shows {status or 'a state that could not be read back'}"
    )
    place = f" under {where.parent if where else client.store_root() / 'mlruns'}" if fault == "disk_full" else ""
    return StoreError(
        f"The MLflow analysis run {run_id} stopped: {FAULT_TEXT[fault]}{place} ({reason}). The run "
        f"{state}. {out_dir} is written; fix the cause (free disk space, stop the process holding "
        f"the store) and rerun `python -m pipeline analyze`."
    )


def log_analysis_run(cfg, summary: dict, out_dir: Path) -> str:
    """Log the analysis run; it ends FAILED with the reason if logging fails. Returns the run id."""
    out_dir = Path(out_dir)
    tracker = client.Tracker(cfg)
    _room(tracker, out_dir)
    run_id = tracker.start_run(
        "analysis",
        {
            "stage": "analyze",
            "profile": cfg.profile,
            "data_source": summary.get("data_source", ""),
            client.PIPELINE_RUN_TAG: client.pipeline_run(),
        },
    )
    try:
        if (out_dir / "report.md").exists():
            tracker.set_tags(run_id, {"mlflow.note.content": report_head((out_dir / "report.md").read_text())})
        tracker.log_metrics(run_id, client.summary_metrics(summary))
        log_figures(tracker, run_id, [out_dir / f"{c}.png" for c in CHARTS if (out_dir / f"{c}.png").exists()])
        tracker.log_artifacts(run_id, out_dir)
    except Exception as e:
        raise _failed(tracker, run_id, e, out_dir) from None
    except BaseException as e:  # Ctrl-C, SIGTERM, the DVC that ran it gone (lifeline.lifeline): never left RUNNING
        with contextlib.suppress(Exception):
            tracker.close_run(run_id, "KILLED", f"interrupted ({type(e).__name__}) while the analysis was logged")
        raise
    tracker.close_run(run_id, "FINISHED")
    log_study_rows(tracker, summary, out_dir)
    ui_view.publish_view(tracker.client, tracker.experiment_id)
    return run_id


def log_study_rows(tracker: client.Tracker, summary: dict, out_dir: Path) -> None:
    """Each strategy's newest study (parent) run gets the report's numbers (metric_names.study_row_metrics, from
    summary.json and metrics.json): the study row and the report show the same efficiency for every point."""
    flat_path = Path(out_dir) / "metrics.json"
    flat = json.loads(flat_path.read_text()) if flat_path.exists() else {}
    newest: dict = {}
    for run in tracker.find_runs("tags.role = 'study'"):
        s = run.data.tags.get("strategy", "")
        if s and (s not in newest or run.info.start_time > newest[s].info.start_time):
            newest[s] = run
    for s, run in newest.items():
        metrics = metric_names.study_row_metrics(s, summary, flat)
        if metrics:
            tracker.log_metrics(run.info.run_id, metrics)
