"""`overlap` stopped while it logs its MLflow run (Ctrl-C, SIGTERM, or DVC gone): the run ends KILLED, not RUNNING.

.venv/bin/python -m pytest tests/cli/test_stop_overlap.py -q
"""

from __future__ import annotations

import signal

from pipeline.cli import main
from pipeline.scaling import overlap
from pipeline.tracking import client
from tests.sweep.test_reliability import mlflow_runs

TIMES = {"median_s": 1.0}
RESULT = {
    "settings": {"size": 64},
    "concurrent": {"A": TIMES, "B": TIMES, "both": TIMES},
    "communication": {"sequential": TIMES, "overlapped": TIMES},
    "ratio_both_to_sum": 0.5,
    "comm_saving": 0.0,
}


def test_ctrl_c_while_overlap_logs_its_run_ends_it_killed(make_cfg, tmp_path, monkeypatch, default_sigint):
    make_cfg()  # the stores under tmp_path
    (tmp_path / "params.yaml").write_text('profile: ""\ndata: {source: synthetic}\n')
    monkeypatch.chdir(tmp_path)

    def measured(cfg, out, watch=None):  # the measurement itself is tests/scaling's: here only its run is logged
        (out / "overlap.md").write_text("overlap\n")
        return RESULT

    monkeypatch.setattr(overlap, "run", measured)
    monkeypatch.setattr(client.Tracker, "log_artifacts", lambda *a: signal.raise_signal(signal.SIGINT))
    assert main(["overlap", "--out", str(tmp_path / "overlap")]) == 130
    (run,) = mlflow_runs(tmp_path)[0]
    assert run.info.run_name == "overlap" and run.info.status == "KILLED"
