"""Several sweep workers on one study: every trial recorded once, live trials kept while CPU burners load every core,
and a worker stalled past the grace period keeps its trial.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from optuna.trial import TrialState

from tests.sweep.test_reliability import (  # noqa: F401 (_no_strays: autouse, as there)
    GRACE_S,
    _no_strays,
    assert_stores_intact,
    figure,
    finish,
    make_repo,
    mlflow_runs,
    rows,
    start_sweep,
    study,
    wait_for,
)


@pytest.mark.slow
def test_three_workers_on_one_study_record_every_trial_once(tmp_path, synthetic_root):
    _three_workers(tmp_path, synthetic_root, "3 sweep processes, one study, fresh SQLite stores")


@pytest.mark.slow
def test_three_workers_keep_every_live_trial_while_cpu_burners_load_every_core(tmp_path, synthetic_root):
    """A loaded host (load average 2x its cores) delays heartbeats and SQLite commits: no live trial may be taken
    over as stale, no trial recorded twice, no traceback."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * os.cpu_count())]
    try:
        _three_workers(tmp_path, synthetic_root, f"as above, with {len(burners)} CPU burners on {os.cpu_count()} cores")
    finally:
        for b in burners:
            b.kill()
            b.wait()


@pytest.mark.slow
def test_a_worker_stalled_past_the_grace_period_keeps_its_trial(tmp_path, synthetic_root):
    """The extreme of a loaded host: a live worker that gets no CPU for longer than the grace period (SIGSTOP, then
    SIGCONT). Its heartbeat is stale, but it is alive on this host: its trial is not taken over, it finishes it,
    and every trial is recorded once (before: another worker failed it as stale and ran a copy, and the stalled
    one crashed with UpdateFinishedTrialError when it resumed)."""
    lrs = [0.05, 0.1, 0.15, 0.2]
    root, env = make_repo(
        tmp_path, synthetic_root, "single", f"{{devices: [1], batch_size: [64], lr: {lrs}}}", train_limit=4096, epochs=2
    )
    procs = [start_sweep(root, env, "single", log=f"worker{i}.log") for i in range(2)]

    def mid_trial():  # once every worker is running trials: one training its trial's second epoch (computing,
        # holding no SQLite lock: a worker stopped inside a write would stall the others on the lock instead)
        logs = [
            [ln for ln in (root / f"worker{i}.log").read_text().splitlines() if "] trial " in ln]
            for i in range(len(procs))
        ]
        if not all(logs):
            return None
        return next((p for p, lines in zip(procs, logs) if " epoch 1/2:" in lines[-1]), None)

    victim = wait_for(mid_trial, 120, what="a worker in the middle of a trial")
    os.kill(victim.pid, signal.SIGSTOP)
    time.sleep(GRACE_S + 10)  # stale for 10 s: the other workers check at each trial they finish (every few s)
    os.kill(victim.pid, signal.SIGCONT)
    logs = [finish(p, root, log=f"worker{i}.log") for i, p in enumerate(procs)]
    for text in logs:
        assert "Traceback" not in text and "UpdateFinishedTrialError" not in text and "taken over" not in text, text[
            -3000:
        ]
    s = study(root)
    assert len(s.trials) == len(lrs) and all(t.state == TrialState.COMPLETE for t in s.trials)
    runs, parents, children = mlflow_runs(root)
    assert len(children) == len(lrs) and all(c.info.status == "FINISHED" for c in children)
    figure(
        case=f"a worker SIGSTOPped mid-trial for {GRACE_S + 10} s (grace {GRACE_S} s)",
        trials=len(lrs),
        optuna_records=len(s.trials),
        mlflow_trial_runs=len(children),
        taken_over=0,
    )


def _three_workers(tmp_path, synthetic_root, case):
    lrs = [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5]
    root, env = make_repo(
        tmp_path, synthetic_root, "single", f"{{devices: [1], batch_size: [64], lr: {lrs}}}", train_limit=1024, epochs=1
    )
    t0 = time.monotonic()
    # fresh stores, three workers at once: the first creates the stores and the study, the others wait for it
    procs = [start_sweep(root, env, "single", log=f"worker{i}.log") for i in range(3)]
    logs = [finish(p, root, log=f"worker{i}.log") for i, p in enumerate(procs)]
    seconds = time.monotonic() - t0
    for text in logs:
        assert "locked" not in text and "Traceback" not in text, text[-3000:]
    per_worker = [len(re.findall(r"\] trial \d+/\d+ -> ", text)) for text in logs]
    assert sum(per_worker) == len(lrs)  # each trial run by exactly one worker

    s = study(root)
    assert len(s.trials) == len(lrs) and all(t.state == TrialState.COMPLETE for t in s.trials)
    assert sorted(t.params["lr"] for t in s.trials) == lrs
    runs, parents, children = mlflow_runs(root)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == len(lrs) and all(c.info.status == "FINISHED" for c in children)
    assert sorted(c.info.run_id for c in children) == sorted(t.user_attrs["mlflow_run_id"] for t in s.trials)
    assert sorted(int(c.data.tags["trial"]) for c in children) == list(range(len(lrs)))
    assert len(runs) == len(lrs) + 1
    out = rows(root, "single")
    assert len(out) == len(lrs) and all(r["state"] == "complete" for r in out)
    assert_stores_intact(root)
    figure(
        case=case,
        trials=len(lrs),
        trials_per_worker=per_worker,
        optuna_records=len(s.trials),
        mlflow_trial_runs=len(children),
        locked_errors=0,
        sweep_seconds=round(seconds, 1),
    )
