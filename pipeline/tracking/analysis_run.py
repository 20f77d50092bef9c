"""The MLflow `analysis` run of the analyze stage: what its page shows at first sight.

Its description is the report's opening (title, synthetic-data warning, host, the "Reading" section); its metrics
are summary.json's numbers (tracking.summary_metrics); every output file is an artifact (the Artifacts tab previews
the PNGs) and every figure also a keyed image (figures/<name>, for MLflow's image-grid charts). Then it rewrites
the experiment's shared runs-table view (ui_view.py), so the link `python -m pipeline ui` prints opens on
Parallax's columns.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.tracking import client as tracking, ui_view

NOTE_LIMIT = 5000  # characters of report.md in the run's description (MLflow caps tag values at 8,000)


def report_head(text: str, limit: int = NOTE_LIMIT) -> str:
    """report.md up to the end of its "Reading" section (or its first `limit` characters), and where the rest is."""
    start = text.find("\n## Reading")
    cut = text.find("\n## ", start + 1) if start >= 0 else -1
    head = (text[:cut] if cut > 0 else text)[:limit].rstrip()
    return head + "\n\n(The full report is the artifact report.md; the figures are under Images and Artifacts.)"


def log_figures(tracker: tracking.Tracker, run_id: str, paths) -> None:
    """PNG figures as keyed images (figures/<name>, step 0): MLflow's image-grid charts can set them side by side."""
    from PIL import Image  # matplotlib's own dependency
    for p in paths:
        with Image.open(p) as im:
            tracker.client.log_image(run_id, im.convert("RGB"), key=f"figures/{Path(p).stem}", step=0)


def log_analysis_run(cfg, summary: dict, out_dir: Path) -> str:
    """Log the analysis run; it ends FAILED with the reason if logging fails. Returns the run id."""
    out_dir = Path(out_dir)
    tracker = tracking.Tracker(cfg)
    run_id = tracker.start_run("analysis", {"stage": "analyze", "git_sha": tracking.git_sha(), "profile": cfg.profile,
                                            "data_source": summary.get("data_source", "")})
    status, reason = "FAILED", ""
    try:
        if (out_dir / "report.md").exists():
            tracker.set_tags(run_id, {"mlflow.note.content": report_head((out_dir / "report.md").read_text())})
        tracker.log_metrics(run_id, tracking.summary_metrics(summary))
        log_figures(tracker, run_id, sorted(out_dir.glob("*.png")))
        tracker.log_artifacts(run_id, out_dir)
        status = "FINISHED"
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        raise
    finally:
        tracker.close_run(run_id, status, reason)
    ui_view.publish_view(tracker.client, tracker.experiment_id)
    return run_id

