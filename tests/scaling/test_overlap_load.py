"""The overlap stage's timings carry the host's load as a trial's do: the measurements run inside the interference
monitor it is handed, overlap.json records `foreign_cores` and `under_load`, and overlap.md says whether they were
measured under load. The measurement itself is replaced by a fixed result (tests/trial/test_stage_launch.py runs it).

    .venv/bin/python -m pytest tests/scaling/test_overlap_load.py -q
"""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from pipeline.config import loader
from pipeline.host.devices import probe
from pipeline.scaling import overlap

TIMES = {"median_s": 1.0, "min_s": 0.9, "max_s": 1.1, "runs_s": [0.9, 1.0, 1.1]}
MEASURED = {
    "devices": ["a", "b"],
    "same_device": False,
    "concurrent": {"A": TIMES, "B": TIMES, "both": TIMES},
    "communication": {"mode": "fake", "sequential": TIMES, "overlapped": TIMES},
}


class FakeMonitor:
    """interference.Monitor's interface with a fixed result; remembers what it was built with and when it ran."""

    running = False  # whether some FakeMonitor's window is open

    def __init__(self, result):
        self.result_, self.made = result, []

    def __call__(self, devices_used, device_kind, gpu_indices, threshold):
        self.made.append((devices_used, device_kind, list(gpu_indices), threshold))
        return self

    def __enter__(self):
        FakeMonitor.running = True
        return self

    def __exit__(self, *exc):
        FakeMonitor.running = False
        return False

    def result(self):
        return {"window_s": 3.0, **self.result_}


@pytest.fixture
def measured(monkeypatch):
    """measure_cpu/measure_cuda replaced by a fixed result; the list says, per call, whether a monitor ran around it."""
    seen = []

    def fake(cfg):
        seen.append(FakeMonitor.running)
        return json.loads(json.dumps(MEASURED))

    monkeypatch.setattr(overlap, "measure_cpu", fake)
    monkeypatch.setattr(overlap, "measure_cuda", fake)
    return seen


def _cfg(threshold=0.25):
    return loader.override(loader.Config(), [f"train.interference_threshold={threshold}"])


@pytest.mark.skipif(probe().kind == "cpu" and probe().n < 2, reason="the overlap stage needs two devices")
def test_timings_beside_busy_processes_are_labelled_under_load(tmp_path, measured):
    busy = FakeMonitor({"foreign_cores": 1.6, "interfered": True, "interference_reason": "1.60 cores"})
    res = overlap.run(_cfg(), tmp_path, watch=busy)
    assert measured == [True], "the measurement ran outside the monitor's window"
    assert busy.made[-1][0] == 2 and busy.made[-1][3] == 0.25  # two devices, train.interference_threshold
    written = json.loads((tmp_path / "overlap.json").read_text())
    assert written["foreign_cores"] == 1.6 and written["under_load"] is True and res["under_load"] is True
    assert written["interference"]["window_s"] == 3.0
    md = (tmp_path / "overlap.md").read_text()
    assert "**Measured under load**: 1.60 cores busy in other processes on average (above 0.25)" in md


@pytest.mark.skipif(probe().kind == "cpu" and probe().n < 2, reason="the overlap stage needs two devices")
def test_a_quiet_host_is_said_with_its_load_and_an_unwatched_run_says_it_is_unknown(tmp_path, measured):
    quiet = FakeMonitor({"foreign_cores": 0.05, "interfered": False, "interference_reason": ""})
    overlap.run(_cfg(), tmp_path / "quiet", watch=quiet)
    assert json.loads((tmp_path / "quiet" / "overlap.json").read_text())["under_load"] is False
    assert (
        "Measured on a quiet host (0.05 cores busy elsewhere on average)."
        in (tmp_path / "quiet" / "overlap.md").read_text()
    )
    overlap.run(_cfg(), tmp_path / "unwatched")
    written = json.loads((tmp_path / "unwatched" / "overlap.json").read_text())
    assert written["foreign_cores"] is None and written["under_load"] is False
    assert "Host load not measured" in (tmp_path / "unwatched" / "overlap.md").read_text()


def test_a_flag_other_than_cores_is_said_in_the_monitors_words():
    res = {
        "under_load": True,
        "foreign_cores": 0.1,
        "interference_threshold": 0.25,
        "interference": {"interference_reason": "1 other process(es) on the trial's GPUs"},
    }
    assert overlap.load_line(res).startswith("**Measured under load**: 1 other process(es) on the trial's GPUs.")
    assert overlap.load_line({}).startswith("Host load not measured")  # an overlap.json from before the monitor


def test_the_stage_hands_the_interference_monitor_to_the_measurement(make_cfg, tmp_path, monkeypatch):
    """`python -m pipeline overlap` runs the measurements inside interference.Monitor, and its MLflow run is tagged
    with the label."""
    from pipeline.measure.interference import Monitor
    from pipeline.tracking import client

    make_cfg()
    (tmp_path / "params.yaml").write_text('profile: ""\ndata: {source: synthetic}\n')
    monkeypatch.chdir(tmp_path)
    handed, tags = [], {}

    def fake_run(cfg, out, watch=None):
        handed.append(watch)
        (out / "overlap.md").write_text("overlap\n")
        return {**MEASURED, "settings": {}, "ratio_both_to_sum": 0.5, "comm_saving": 0.0, "under_load": True}

    real_start = client.Tracker.start_run

    def start_run(self, name, run_tags, *a, **kw):
        tags.update(run_tags)
        return real_start(self, name, run_tags, *a, **kw)

    monkeypatch.setattr(overlap, "run", fake_run)
    monkeypatch.setattr(client.Tracker, "start_run", start_run)
    assert main(["overlap", "--out", str(tmp_path / "overlap")]) == 0
    assert handed == [Monitor] and tags["under_load"] is True
