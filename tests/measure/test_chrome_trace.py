"""Each rank's first sampled step as a Chrome trace (pipeline/measure/chrome_trace.py): valid Trace Event Format, the
breakdown's parts on its own track, the step the trace shows the step the breakdown reports, and the file logged
beside breakdown.json. A LeNet step at a tiny batch on CPU; no timing thresholds."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from pipeline.errors import TrialFailed
from pipeline.host.devices import probe
from pipeline.measure import chrome_trace
from pipeline.records import files
from pipeline.tracking import client, metric_names
from pipeline.trial import ranks
from pipeline.trial.launch import run_trial

TWO = probe().n >= 2
STEPS, BATCH = 4, 16
SMALL = (
    f"train.batch_size={BATCH}",
    "train.breakdown_every=2",
    f"data.train_limit={BATCH * STEPS}",
    "data.test_limit=32",
)


def _trial(make_cfg, tmp_path, strategy: str, k: int):
    """One trial that samples exactly one step (steady-state step 1 of 3), and the trace files it wrote."""
    cfg = make_cfg(
        f"train.strategy={strategy}",
        f"train.devices={k}",
        f"train.batch_size={BATCH}",
        "train.breakdown_every=2",
        f"data.train_limit={BATCH * STEPS}",
        "data.test_limit=32",
        "train.epochs=1",
    )
    out = tmp_path / "o"
    record = run_trial(cfg, out, progress=False)
    return record, {p.name: json.loads(p.read_text()) for p in sorted((out / "trace").glob("*"))}


def _check_format(trace: dict) -> None:
    """Trace Event Format as Perfetto, chrome://tracing, TensorBoard and HTA read it."""
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] == "ms"
    for e in trace["traceEvents"]:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e), e
        # Kineto names some of its tracks by a string ("Spans"), as the format allows
        assert isinstance(e["ts"], (int, float)) and all(isinstance(e[k], (int, str)) for k in ("pid", "tid")), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e


def _track(trace: dict) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == chrome_trace.CAT:
            by.setdefault(e["name"], []).append(e)
    return by


CASES = [("single", 1), ("scratch", 2), ("fsdp", 2)]


@pytest.mark.parametrize("strategy,k", CASES)
def test_each_rank_writes_its_sampled_step_as_a_chrome_trace(make_cfg, tmp_path, strategy, k):
    if k > 1 and not TWO:
        pytest.skip("needs 2 devices")
    record, traces = _trial(make_cfg, tmp_path, strategy, k)
    bd = record["breakdown"]
    assert bd["samples"] == 1
    assert sorted(traces) == [f"rank{r['rank']}.pt.trace.json" for r in bd["ranks"]]
    step_of = {r["rank"]: r["step_s"] for r in bd["ranks"]}
    for name, trace in traces.items():
        _check_format(trace)
        rank = int(name[len("rank") : -len(".pt.trace.json")])
        track = _track(trace)
        # the breakdown's parts, as it names them: the clock's phases, exposed communication, idle
        assert {"step", "data", "forward", "backward", "optimizer", "idle"} <= set(track), sorted(track)
        if strategy != "single":
            assert "comm_exposed" in track, sorted(track)  # scratch: its all-reduce; fsdp: the profiler's spans
        (step,) = track["step"]
        # the step the trace shows is the step the breakdown reports for this rank (one sample: its mean)
        assert step["dur"] == pytest.approx(step_of[rank] * 1e6, rel=1e-6)
        assert trace["parallax"]["step_s"] == pytest.approx(step_of[rank], rel=1e-9)
        assert trace["parallax"]["rank"] == rank and trace["parallax"]["step"] == bd["sampled_steps"][0]
        # every part lies inside the step, and the parts' total is the step less the residual
        inside = [e for n, es in track.items() if n != "step" for e in es]
        assert all(step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-3 for e in inside)
        parts = trace["parallax"]["parts_s"]
        assert sum(parts.values()) + trace["parallax"]["residual_s"] == pytest.approx(step_of[rank], rel=1e-9)
        exposed = sum(e["dur"] for e in track.get("comm_exposed", [])) / 1e6
        assert exposed == pytest.approx(parts["comm_exposed"], rel=0.02, abs=2e-6)
        if strategy == "fsdp":  # the profiler's own trace, the breakdown's track placed on it by the phase labels
            labels = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
            assert {e["name"] for e in labels} >= {"parallax::forward", "parallax::backward", "parallax::optimizer"}
            assert trace["distributedInfo"]["rank"] == rank
            (fwd,) = track["forward"]
            (label,) = [e for e in labels if e["name"] == "parallax::forward"]
            assert abs(fwd["ts"] - label["ts"]) < label["dur"] and fwd["dur"] <= label["dur"] + 1
        else:
            assert trace["parallax"]["source"] == "the breakdown's clock"


def test_no_sampled_step_no_trace(make_cfg, tmp_path):
    cfg = make_cfg(
        "train.strategy=single",
        f"train.batch_size={BATCH}",
        "train.breakdown_every=0",
        f"data.train_limit={BATCH * STEPS}",
        "data.test_limit=32",
        "train.epochs=1",
    )
    run_trial(cfg, tmp_path / "o", progress=False)
    assert not (tmp_path / "o" / "trace").exists()


def test_the_trial_directory_and_mlflow_name_the_same_files():
    assert metric_names.TRACES == f"{ranks.TRACE_DIR}/rank*.pt.trace.json" and metric_names.TRACE_DIR == ranks.TRACE_DIR


class Record:
    test_acc = [0.5]

    def metrics(self):
        return {}

    def breakdown_parts(self):
        return {}

    def tags(self):
        return {}


class Logged:
    def __init__(self):
        self.artifacts = []

    def log_metrics(self, run_id, metrics, step):
        pass

    def set_tags(self, run_id, tags):
        pass

    def log_artifact(self, run_id, path, subdir=None):
        self.artifacts.append((Path(path).relative_to(self.root).as_posix(), subdir))


def test_every_ranks_trace_is_logged_under_trace(tmp_path):
    """The trial directory's traces, and under SLURM its node folders' (node<i>/trace/), each under `trace/` in the
    trial's MLflow run; an earlier generation's stray files elsewhere are not."""
    for name in ("trace/rank0.pt.trace.json", "node1/trace/rank2.pt.trace.json", "node0/trace/rank1.pt.trace.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    (tmp_path / "trace" / "notes.txt").write_text("")
    tracker = Logged()
    tracker.root = tmp_path
    client.log_completed_run(tracker, "r1", Record(), tmp_path)
    assert tracker.artifacts == [
        ("trace/rank0.pt.trace.json", "trace"),
        ("node0/trace/rank1.pt.trace.json", "trace"),
        ("node1/trace/rank2.pt.trace.json", "trace"),
    ]


def test_a_refused_trace_write_fails_the_trial_as_unwritable(make_cfg, tmp_path, monkeypatch):
    """The rank's write of its trace on a full disk: the trial fails with kind `unwritable`, naming the folder."""
    real = files.write_text

    def full(path, text):
        if str(path).endswith(".pt.trace.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, text)

    monkeypatch.setattr(files, "write_text", full)  # the ranks are forked: they inherit it
    out = tmp_path / "o"
    with pytest.raises(TrialFailed) as e:
        run_trial(make_cfg("train.strategy=single", *SMALL), out, progress=False)
    assert e.value.kind == "unwritable" and str(out) in str(e.value), (e.value.kind, str(e.value))
    assert "rank0.pt.trace.json" in str(e.value)


def test_an_earlier_trials_trace_in_a_reused_folder_is_gone(make_cfg, tmp_path):
    """A folder reused from a trial with more ranks: its rank3 trace is not taken (or logged) as this trial's."""
    out = tmp_path / "o"
    (out / "trace").mkdir(parents=True)
    (out / "trace" / "rank3.pt.trace.json").write_text("{}")
    run_trial(make_cfg("train.strategy=single", *SMALL), out, progress=False)
    assert sorted(p.name for p in (out / "trace").iterdir()) == ["rank0.pt.trace.json"]
