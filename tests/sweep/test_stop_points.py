"""A sweep stopped at any point leaves nothing RUNNING: Ctrl-C between a trial's claim and its start (the quiet
wait, the trial's set-up), and the death of the process that ran the stage (DVC, or a stand-in for it).

The signals are real: sent from outside to a sweep in a subprocess, or raised in this process (signal.raise_signal)
at the moment a function of the sweep is called. Each case checks the stores: no Optuna trial and no MLflow run
RUNNING, the claimed trial failed as interrupted and its point waiting again.

    .venv/bin/python -m pytest tests/sweep/test_stop_points.py -q
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from pipeline.sweep import claims, stage, study_parent, worker
from pipeline.sweep.stage import load_study, run_sweep
from tests.sweep.test_reliability import left_behind, make_repo, mlflow_runs, study, trial_started, wait_for

LONG = "{devices: [1], batch_size: [64], lr: [0.1, 0.2, 0.3]}"  # with 20 epochs: a minute of trials at least
ONE = ["sweep.strategies=[single]", "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1, 0.2]}"]


@pytest.fixture(autouse=True)
def _no_strays(tmp_path):
    yield
    for p in left_behind(tmp_path / "repo"):
        p.kill()


def _sigint():
    signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt on return, here


def _interrupting(fn):
    """`fn`, with Ctrl-C landing as it is first called (once: a rerun, or the sweep's own clean-up, goes through)."""
    fired = []

    def hooked(*a, **k):
        if not fired:
            fired.append(fn)
            _sigint()
        return fn(*a, **k)

    return hooked


def _interrupting_after_a_claim(monkeypatch):
    """claims.finished, with Ctrl-C landing at its first call after a trial is claimed (the sweep also counts the
    finished trials before it claims any, to say how many are left)."""
    real_claim, real_finished = claims.claim, claims.finished
    claimed = []

    def claim(*a, **k):
        trial = real_claim(*a, **k)
        claimed.append(trial)
        return trial

    fire = _interrupting(real_finished)
    monkeypatch.setattr(claims, "claim", claim)
    return lambda study: fire(study) if claimed else real_finished(study)


def _nothing_running(s, runs) -> None:
    """No trial and no MLflow run RUNNING; each interrupted trial failed as such, with its point waiting again."""
    assert not s.get_trials(states=(TrialState.RUNNING,))
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    failed = s.get_trials(states=(TrialState.FAIL,))
    assert failed and all("interrupted" in t.user_attrs["reason"] for t in failed)
    waiting = {t.system_attrs["fixed_params"]["lr"] for t in s.get_trials(states=(TrialState.WAITING,))}
    assert {t.system_attrs["fixed_params"]["lr"] for t in failed} <= waiting


# ----------------------------------------------------------------------------- Ctrl-C before the trial starts


def test_ctrl_c_in_the_quiet_wait_leaves_nothing_running(tmp_path, synthetic_root):
    """SIGINT to the sweep's process group while it waits for a quiet moment (a CPU burner keeps the host busy):
    exit 130, the claimed trial failed as interrupted and enqueued again, the parent run KILLED."""
    root, env = make_repo(tmp_path, synthetic_root, "single", LONG, epochs=1)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "sweep",
                "--strategy",
                "single",
                "--set",
                "sweep.quiet_wait_s=60",
                "--set",
                "train.interference_threshold=0",
            ],
            cwd=root,
            env=env,
            stdout=open(root / "sweep.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: "trial 1/" in (root / "sweep.log").read_text(), 120, proc, "trial 1 to be claimed")
        time.sleep(1.5)  # in the wait: the burner keeps the host above the threshold for 60 s
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(30)
        print(f"FIGURE the sweep exited {time.monotonic() - t0:.1f} s after SIGINT in the quiet wait")
    finally:
        burner.kill()
    text = (root / "sweep.log").read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text
    runs, parents, _ = mlflow_runs(root)
    _nothing_running(study(root), runs)
    assert [p.info.status for p in parents] == ["KILLED"]


@pytest.mark.parametrize(
    "where",
    [
        "claim, before the owner is recorded",
        "between claim and run",
        "the trial's label",
        "the quiet wait",
        "the trial's set-up",
    ],
)
def test_ctrl_c_between_claim_and_start_leaves_nothing_running(make_cfg, tmp_path, monkeypatch, where):
    """Ctrl-C at each point between a trial's claim and its start: the trial is failed as interrupted and its
    point enqueued again, the parent run ended KILLED."""
    cfg = make_cfg(*ONE, *(["sweep.quiet_wait_s=5"] if where == "the quiet wait" else []))
    set_attr = optuna.storages.RDBStorage.set_trial_system_attr
    owner = _interrupting(set_attr)
    target = {
        "claim, before the owner is recorded": (
            optuna.storages.RDBStorage,
            "set_trial_system_attr",
            lambda self, tid, key, value: (owner if key == claims.WORKER_ATTR else set_attr)(self, tid, key, value),
        ),
        "between claim and run": (claims, "finished", _interrupting_after_a_claim(monkeypatch)),
        "the trial's label": (worker, "counter", _interrupting(worker.counter)),
        "the quiet wait": (stage.QuietGate, "wait", _interrupting(lambda self: None)),
        "the trial's set-up": (worker, "TrialRun", _interrupting(worker.TrialRun)),
    }[where]
    monkeypatch.setattr(*target)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, "single", tmp_path / "single.jsonl")
    runs, parents, _ = mlflow_runs(tmp_path)
    _nothing_running(study(tmp_path), runs)
    assert [p.info.status for p in parents] == ["KILLED"]


def test_ctrl_c_while_the_parent_run_is_closed_ends_it_killed_and_a_rerun_finishes_it(
    make_cfg, tmp_path, monkeypatch, default_sigint
):
    """Ctrl-C after the last trial, while the study's results are logged on its parent run: the run ends KILLED,
    not RUNNING, and a rerun logs them and ends it FINISHED."""
    cfg = make_cfg("sweep.strategies=[single]", "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1]}")
    monkeypatch.setattr(study_parent, "summarise", _interrupting(study_parent.summarise))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, "single", tmp_path / "single.jsonl")
    assert [p.info.status for p in mlflow_runs(tmp_path)[1]] == ["KILLED"]
    run_sweep(cfg, "single", tmp_path / "single.jsonl")
    assert [p.info.status for p in mlflow_runs(tmp_path)[1]] == ["FINISHED"]


def _foreign_trial(cfg, worker) -> int:
    """A trial claimed by `worker` (another process), as a second worker on the study would hold it."""
    s = load_study(cfg, "single")
    trial = claims.claim(s)
    s._storage.set_trial_system_attr(trial._trial_id, claims.WORKER_ATTR, worker)
    return trial.number


@pytest.mark.parametrize("alive", [True, False])
def test_ctrl_c_leaves_the_parent_running_only_for_a_live_worker(make_cfg, tmp_path, monkeypatch, alive):
    """Ctrl-C while another worker holds a trial: the parent run stays RUNNING if that worker is alive (it ends the
    run), and is ended KILLED if its process is gone (nobody else would end it before a rerun)."""
    cfg = make_cfg(*ONE)
    run_sweep(cfg, "single", tmp_path / "single.jsonl", max_new_trials=0)  # the set-up alone
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        if not alive:
            other.kill()
            other.wait()
        number = _foreign_trial(
            cfg, {"host": socket.gethostname(), "pid": other.pid, "start": claims.start_time(other.pid) or "1"}
        )
        monkeypatch.setattr(worker, "counter", _interrupting(worker.counter))
        with pytest.raises(KeyboardInterrupt):
            run_sweep(cfg, "single", tmp_path / "single.jsonl")
    finally:
        other.kill()
    assert [t.number for t in study(tmp_path).get_trials(states=(TrialState.RUNNING,))] == [number]  # not failed here
    assert [p.info.status for p in mlflow_runs(tmp_path)[1]] == ["RUNNING" if alive else "KILLED"]


# ----------------------------------------------------------------------------- the process that ran the stage dies

RUNNER = "import subprocess, sys; sys.exit(subprocess.Popen(sys.argv[1:]).wait())"  # DVC's cmd_run, in short


def _sweep_process(top: int) -> psutil.Process:
    """The sweep under process `top` (not its trial's ranks, which carry its command line)."""

    def find():
        procs = [p for p in psutil.Process(top).children(recursive=True) if "sweep" in " ".join(p.cmdline())]
        return next((p for p in procs if p.parent().pid not in {q.pid for q in procs}), None)

    return wait_for(find, 60, what="the sweep to start")


def _is_gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _ends_with_its_runner(root, runner, sig) -> None:
    sweep = _sweep_process(runner.pid)
    wait_for(lambda: trial_started(root, 0), 180, runner, "trial 0 to report its first epoch")
    t0 = time.monotonic()
    os.kill(runner.pid, sig)
    runner.wait(30)
    wait_for(lambda: _is_gone(sweep), 20, what="the sweep to end with the process that ran it")
    gone_s = time.monotonic() - t0
    wait_for(lambda: not left_behind(root), 30, what="the trial's ranks to exit")
    text = (root / "sweep.log").read_text()
    assert "is gone" in text and "interrupted (SIGTERM)" in text and "Traceback" not in text, text[-3000:]
    runs, parents, _ = mlflow_runs(root)
    _nothing_running(study(root), runs)
    assert [p.info.status for p in parents] == ["KILLED"]
    print(f"FIGURE sweep ended {gone_s:.1f} s after its runner got {signal.Signals(sig).name}")


@pytest.mark.slow
@pytest.mark.parametrize("between, sig", [("nothing", signal.SIGTERM), ("a shell", signal.SIGKILL)])
def test_the_sweep_ends_when_the_process_that_ran_it_dies(tmp_path, synthetic_root, between, sig):
    """A stand-in for DVC (DVC_STAGE set, the command run as a child, or through `sh -c` that stays between) is
    signalled alone: the sweep notices within seconds, stops as on SIGTERM and leaves nothing RUNNING."""
    root, env = make_repo(tmp_path, synthetic_root, "single", LONG, epochs=20)
    cmd = [sys.executable, "-m", "pipeline", "sweep", "--strategy", "single", "--set", "sweep.quiet_wait_s=0"]
    if between == "a shell":
        cmd = ["sh", "-c", " ".join(cmd) + "; echo the sweep exited"]
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, *cmd],
        cwd=root,
        env={**env, "DVC_STAGE": "sweep@single"},
        stdout=open(root / "sweep.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _ends_with_its_runner(root, runner, sig)


@pytest.mark.slow
def test_sigterm_to_dvc_repro_ends_the_sweep(tmp_path, synthetic_root):
    """`dvc repro` SIGTERMed alone exits at once and leaves its stage command running (DVC has no SIGTERM
    handler): the sweep stops within seconds, leaving nothing RUNNING and no writer in the workspace."""
    dvc = shutil.which("dvc", path=os.path.dirname(sys.executable)) or shutil.which("dvc")
    if dvc is None:
        pytest.skip("dvc is not installed")
    root, env = make_repo(tmp_path, synthetic_root, "single", LONG, epochs=20)
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=root, env=env, check=True)
    (root / "dvc.yaml").write_text(
        f"stages:\n  sweep:\n    cmd: {sys.executable} -m pipeline sweep --strategy single --set sweep.quiet_wait_s=0\n"
    )
    runner = subprocess.Popen(
        [dvc, "repro", "-q"],
        cwd=root,
        env=env,
        stdout=open(root / "sweep.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _ends_with_its_runner(root, runner, signal.SIGTERM)
