"""Interference: CPU time of other processes during a window is measured and flagged; our own work is not."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pipeline.measure.interference import Monitor

from ..analysis.test_analyze import write

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="checked on Linux; macOS through psutil's portability"
)

BURN = "import time\nt = time.time()\nwhile time.time() - t < 30: pass\n"


def _spin(cpu_seconds: float) -> None:
    t = time.process_time()  # CPU time, not wall time: a busy host must not shorten it
    while time.process_time() - t < cpu_seconds:
        pass


def test_own_work_and_reaped_children_are_not_interference():
    with Monitor(devices_used=1, threshold=0.5) as m:
        _spin(0.6)  # this process
        subprocess.run(
            [sys.executable, "-c", "import time\nwhile time.process_time() < 0.6: pass"], check=True
        )  # a child reaped inside the window: the trial's own rank
    r = m.result()
    assert r["own_cpu_s"] >= 1.1  # both spins count as the trial's own
    # what other processes did (this host may well be busy) is the rest of the host's busy time, nothing of ours
    assert r["foreign_cpu_s"] == pytest.approx(max(0.0, r["host_busy_cpu_s"] - r["own_cpu_s"]), abs=0.002)
    assert r["interfered"] == (r["foreign_cores"] > 0.5)


def test_a_cpu_burner_outside_the_trial_is_flagged_with_its_share():
    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        time.sleep(0.3)  # the burner is running before the window opens
        with Monitor(devices_used=1, threshold=0.5) as m:
            time.sleep(1.5)
        r = m.result()
    finally:
        burner.kill()
        burner.wait()
    assert r["foreign_cores"] > 0.5, r  # one busy core, whatever else the host does
    assert r["interfered"] and "other processes kept" in r["interference_reason"]
    assert r["foreign_cpu_s"] == pytest.approx(r["foreign_cores"] * r["window_s"], rel=0.01)


def test_every_trial_records_what_else_ran(make_cfg, tmp_path):
    from pipeline.trial.launch import run_trial

    m = run_trial(
        make_cfg("train.max_steps=3", "data.train_limit=1024", "data.test_limit=64"), tmp_path / "t", progress=False
    )
    i = m["interference"]
    assert i["window_s"] > 0 and i["host_cores"] >= 1 and i["own_cpu_s"] > 0
    assert isinstance(i["interfered"], bool) and (i["interference_reason"] != "") == i["interfered"]


def _rows(trials):
    """The sweep table's rows of real trials, through the sweep's own row builder."""
    import types

    import optuna
    from optuna.distributions import CategoricalDistribution

    from pipeline.records.table import trial_row

    rows = []
    for i, (params, metrics) in enumerate(trials):
        t = optuna.trial.create_trial(
            params=params,
            value=metrics["throughput_img_s"],
            distributions={k: CategoricalDistribution([v]) for k, v in params.items()},
            user_attrs={"metrics": metrics.to_json()},
        )
        t.number = i
        rows.append(trial_row(types.SimpleNamespace(study_name="s"), "ddp", t=t))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("burn", [True, False])
def test_a_burner_during_the_k1_trial_is_flagged_and_its_efficiency_is_labelled_under_load(make_cfg, tmp_path, burn):
    from pipeline.analysis.stage import analyze
    from pipeline.host.devices import probe
    from pipeline.trial.launch import run_trial

    if probe().n < 2:
        pytest.skip("needs 2 devices")
    if not burn:  # the negative case needs a quiet host: look for a second first (the load average lags a minute)
        with Monitor(devices_used=0, threshold=0.25) as quiet:
            time.sleep(1.0)
        if quiet.result()["interfered"]:
            pytest.skip(f"the host is busy ({quiet.result()['interference_reason']}): other work would be flagged too")
    base = (
        "train.strategy=ddp",
        "data.train_limit=4096",
        "data.test_limit=128",
        "train.epochs=1",
        "train.interference_threshold=0.25",
    )
    trials = []
    for k in (1, 2):
        burner = subprocess.Popen([sys.executable, "-c", BURN]) if (burn and k == 1) else None
        try:
            m = run_trial(
                make_cfg(*base, f"train.devices={k}", f"train.batch_size={64 * k}"), tmp_path / f"k{k}", progress=False
            )
        finally:
            if burner:
                burner.kill()
                burner.wait()
        trials.append(({"model": "lenet", "devices": k, "batch_size": 64 * k, "lr": 0.2}, m))
    if not burn and any(t[1]["interference"]["interfered"] for t in trials):  # work beside the test began meanwhile
        busy = [t[1]["interference"]["interference_reason"] for t in trials if t[1]["interference"]["interfered"]]
        pytest.skip(f"the host became busy during the trials: {'; '.join(busy)}")
    assert trials[0][1]["interference"]["interfered"] is burn
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    write(_rows(trials), sweeps / "ddp.jsonl")
    analyze(sweeps, tmp_path / "out", expected=("ddp",))
    report = (tmp_path / "out" / "report.md").read_text()
    assert ("Other processes used this host's cores while these trials ran" in report) is burn
    reading = report.split("## Reading")[1].split("\n## ")[0]
    lines = [line for line in reading.splitlines() if "eak-scaling efficiency" in line]
    if burn:  # the k=1 reference was disturbed: its efficiency is labelled as measured under load, or not comparable
        # (the k=2 end measured under another load: docs/metrics.md, "Like against like"), or undefined
        labels = ("measured under load", "not comparable", "undefined")
        assert lines and all(any(w in line for w in labels) for line in lines), reading
        if not trials[1][1]["interference"]["interfered"]:  # a loaded k=1 against a quiet k=2: it says which end
            assert all("k=1 reference's trials were all flagged" in line for line in lines if "under load" in line)
    else:
        assert "Best weak-scaling efficiency" in reading or "Implausible" in reading
