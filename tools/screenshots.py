"""Screenshots of the MLflow UI over this repository's store, for docs/screenshots/ (rerun after a sweep).

    .venv/bin/python tools/screenshots.py [--out docs/screenshots] [--port 0] [--set tracking.uri=...]

Starts `python -m pipeline ui` on a free 127.0.0.1 port over the store params.yaml names (mlruns/mlflow.db by
default), drives headless Chromium through Playwright, and saves six PNGs: the runs table (runs-table.png), the
fastest trial (trial.png), the compare view of the fastest trial per strategy with its parallel-coordinates plot on
throughput (compare.png), and the analysis run's metrics, efficiency figure and chart tab (analysis*.png). Needs a store
with sweeps and an analysis run (`make pipeline-offline`, or `python -m pipeline sweep --strategy S` and
`python -m pipeline analyze`).

The browser is a fresh profile with nothing set in it: the runs table opens through the link `python -m pipeline ui`
prints (MLflow's shared view that pipeline/tracking/ui_view.py writes as an experiment tag), so its throughput,
efficiency
and accuracy columns are what any new browser shows on its first load, MLflow's assistant panel beside them as it
opens on a first visit (no tag or URL parameter closes it). Every page is opened with
`workflowType=machine_learning`, MLflow's own URL parameter for its model-training navigation. The one click the
script makes on every later page is closing that panel, as a user does once.

Requirements (no browser download): Chromium at /usr/bin/chromium (`apt-get install -y chromium`) and the
`playwright` package (`.venv/bin/pip install playwright`; not `playwright install`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}  # a laptop's browser: the answer's columns must fit its first screen
# true when a rendered leaf element's text contains the text
SHOWN_JS = """(text) => [...document.querySelectorAll('body *')].some(e => e.childElementCount === 0
  && e.offsetParent !== null && e.textContent.includes(text))"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--out",
        type=Path,
        default=Path("docs/screenshots"),
        help="folder for the PNGs, relative to the repository root (default: docs/screenshots)",
    )
    p.add_argument("--port", type=int, default=0, help="UI port on 127.0.0.1 (default: 0 = a free one)")
    p.add_argument("--chromium", default=CHROMIUM, help=f"the Chromium executable (default: {CHROMIUM})")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the UI to start (default: 90)")
    p.add_argument("--params", default=None, help="params file (default: params.yaml at the repository root)")
    p.add_argument(
        "--flagged",
        action="store_true",
        help="instead: a trial flagged as measured under interference in the runs table, on its page and "
        "in optuna-dashboard (flagged-runs-table.png, flagged-trial.png, flagged-optuna.png)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a parameter, repeatable (default: none; the store and experiment are the ones "
        "params.yaml and its profile name, e.g. --set tracking.uri=...)",
    )
    return p.parse_args(argv)


def missing_requirements(chromium: str) -> list[str]:
    """What this script cannot run without, each with how to get it; [] when all is there."""
    out = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        out.append(
            f"Playwright is not installed: {sys.executable} -m pip install playwright "
            "(its own browser download, `playwright install`, is not needed)"
        )
    if not (os.path.isfile(chromium) and os.access(chromium, os.X_OK)):
        out.append(f"Chromium was not found at {chromium}: apt-get install -y chromium, or pass --chromium PATH")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_runs(client, experiment_id: str, flagged: bool = False) -> dict:
    """The runs to show: the fastest trial (flagged: of those measured under interference), the fastest trial of
    each strategy (to compare), the analysis run."""
    runs = client.search_runs([experiment_id], max_results=5000)
    trials = [
        r
        for r in runs
        if "mlflow.parentRunId" in r.data.tags
        and "throughput_img_s" in r.data.metrics
        and r.info.status == "FINISHED"
        and (not flagged or "parallax.flagged" in r.data.tags)
    ]
    best: dict = {}
    for r in sorted(trials, key=lambda r: -r.data.metrics["throughput_img_s"]):
        best.setdefault(r.data.tags.get("strategy", "?"), r)
    analysis = next((r for r in runs if r.data.tags.get("stage") == "analyze"), None)
    return {
        "trial": trials and max(trials, key=lambda r: r.data.metrics["throughput_img_s"]),
        "compare": list(best.values())[:4],
        "analysis": analysis,
        "all": runs,
    }


def start_ui(args, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline", "ui", "--port", str(port)]
    cmd += (["--params", args.params] if args.params else []) + [a for s in args.overrides for a in ("--set", s)]
    log = tempfile.TemporaryFile(mode="w+")  # the server's output, shown if it fails to start
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"the MLflow UI exited with {proc.returncode}: {log.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    stop_ui(proc)
    raise SystemExit(f"the MLflow UI did not answer on 127.0.0.1:{port} within {args.timeout:.0f} s")


def stop_ui(proc: subprocess.Popen) -> None:
    """The server and the workers it started (its own session's process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def shoot(page, url: str, path: Path, wait_text: str, prepare=None, height: int = 0, first_visit=False) -> None:
    """Open `url`, wait until `wait_text` shows, close the assistant panel (not on a `first_visit`: the page as a new
    browser shows it), `prepare(page)` if given, save the viewport (or the page's top `height` pixels)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(url, wait_until="load")  # not "networkidle": the UI polls the server for as long as it is open
    try:
        page.wait_for_function(SHOWN_JS, arg=wait_text, timeout=30_000)
    except PlaywrightTimeout:
        page.screenshot(path=str(path))
        raise SystemExit(f"{url} did not show {wait_text!r} within 30 s; the page as it was: {path}") from None
    if not first_visit:
        tidy(page)
    if prepare:
        prepare(page)
    page.wait_for_timeout(1500)  # charts and tables finish their layout
    if height:
        # the UI scrolls inside <main>, not the document: grow the viewport to the content's height
        full = page.evaluate(
            "Math.max(document.documentElement.scrollHeight, ...[...document.querySelectorAll("
            "'main')].map(m => m.scrollHeight + m.getBoundingClientRect().top + 16))"
        )
        page.set_viewport_size({"width": page.viewport_size["width"], "height": min(max(full, 600), height)})
        page.wait_for_timeout(500)
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEWPORT)
    shrink(path)
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} ({path.stat().st_size // 1024} KB)")


def tidy(page) -> None:
    """Close MLflow 3's assistant panel, which opens beside every page on a first visit."""
    close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
    if close.count() and close.first.is_visible():
        close.first.click()
        page.wait_for_timeout(300)


def expand_studies(page) -> None:
    """Open every study row (its +), so that its trials and their `flagged` column show."""
    for button in page.locator('button[data-component-id*="runnamecellrenderer"]').all():
        if button.is_visible():
            button.click()
            page.wait_for_timeout(300)


def plot_throughput(page) -> None:
    """The compare page's parallel-coordinates plot: throughput added beside MLflow's default (the first metrics
    by name, each under the trial record's own name), chosen in its Metrics box as a user would."""
    box = page.get_by_text("Metrics:", exact=True).locator("xpath=following::*[contains(@class,'select')][1]")
    box.first.click()
    page.keyboard.type("throughput_img_s")
    page.wait_for_timeout(500)
    # the option titled exactly so, not epoch_throughput_img_s, which the list shows first
    exact = page.locator('[title="throughput_img_s"] >> visible=true')
    if exact.count():
        exact.first.click()
    else:
        page.keyboard.press("Enter")
    page.keyboard.press("Escape")


def shrink(path: Path) -> None:
    """256 colours: a UI screenshot stays legible at a fraction of the size (skipped without Pillow)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def take(args, base: str, experiment_id: str, picked: dict) -> None:
    from playwright.sync_api import sync_playwright

    from pipeline.tracking import ui_view

    ml = "workflowType=machine_learning"
    view = ui_view.view_state(picked["all"])  # what the shared view the UI server wrote shows
    # the table is drawn once the first metric column's header is there
    first_metric = next(
        (c[len("metrics.`") : -1] for c in view["selectedColumns"] if c.startswith("metrics.")), "Run Name"
    )
    exp = f"{base}/#/experiments/{experiment_id}"
    with tempfile.TemporaryDirectory(prefix="parallax-chromium-") as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORT
        )
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        pre = "flagged-" if args.flagged else ""
        shoot(
            page,
            f"{base}/{ui_view.path(experiment_id)}",
            args.out / f"{pre}runs-table.png",
            first_metric,
            prepare=expand_studies if args.flagged else None,
            first_visit=not args.flagged,
        )
        r = picked["trial"]
        shoot(page, f"{exp}/runs/{r.info.run_id}?{ml}", args.out / f"{pre}trial.png", r.info.run_name, height=2000)
        if args.flagged:
            dashboard(args, page, r)
        elif len(picked["compare"]) >= 2:
            ids = json.dumps([r.info.run_id for r in picked["compare"]])
            shoot(
                page,
                f"{base}/#/compare-runs?runs={ids}&experiments={json.dumps([experiment_id])}&{ml}",
                args.out / "compare.png",
                "Parallel Coordinates Plot",
                prepare=plot_throughput,
            )
        if picked["analysis"] and not args.flagged:
            run = f"{exp}/runs/{picked['analysis'].info.run_id}"
            shoot(page, f"{run}?{ml}", args.out / "analysis.png", "analysis", height=2000)
            shoot(page, f"{run}/artifacts/efficiency.png?{ml}", args.out / "analysis-efficiency.png", "efficiency.png")
            shoot(page, f"{run}/model-metrics?{ml}", args.out / "analysis-charts.png", "figures/efficiency")
        ctx.close()


def dashboard(args, page, run) -> None:
    """optuna-dashboard (`python -m pipeline.cli.dashboard`) on the trials of `run`'s study, its numeric `flagged`
    and `foreign_cores` attributes shown; skipped with a line where optuna-dashboard is not installed."""
    import optuna

    try:
        import optuna_dashboard  # noqa: F401
    except ImportError:
        print("optuna-dashboard is not installed: flagged-optuna.png not taken", file=sys.stderr)
        return
    from pipeline.cli.dashboard import storage_url

    url = storage_url()
    study_id = optuna.storages.get_storage(url).get_study_id_from_name(run.data.tags["study"])
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli.dashboard", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/api/meta", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        shoot(page, f"{base}/dashboard/studies/{study_id}/trials", args.out / "flagged-optuna.png", "foreign_cores")
    finally:
        stop_ui(proc)


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = missing_requirements(args.chromium)
    if missing:
        print("tools/screenshots.py cannot run:\n" + "\n".join(f"  - {m}" for m in missing), file=sys.stderr)
        return 2
    from mlflow import MlflowClient

    from pipeline.config import loader
    from pipeline.tracking.client import experiment_name, tracking_uri

    cfg = loader.load(args.params, args.overrides)
    client = MlflowClient(tracking_uri(cfg))
    exp = client.get_experiment_by_name(experiment_name(cfg))
    picked = pick_runs(client, exp.experiment_id, args.flagged) if exp else None
    if not picked or not picked["trial"]:
        print(
            f"no finished trial in experiment {experiment_name(cfg)!r} of the store "
            f"{tracking_uri(cfg)}: run the sweeps first (make pipeline-offline)",
            file=sys.stderr,
        )
        return 1
    args.out = REPO / args.out  # an absolute --out stays as it is
    args.out.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    ui = start_ui(args, port)
    try:
        take(args, f"http://127.0.0.1:{port}", exp.experiment_id, picked)
    finally:
        stop_ui(ui)
    return 0


if __name__ == "__main__":
    sys.exit(main())
