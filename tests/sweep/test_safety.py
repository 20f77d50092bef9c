"""The sweep's outer surfaces are safe: the UI binds to localhost without a shell, no command goes through a shell,
every torch.load is weights-only, DVC commands interpolate only validated names, and a dead peer is named as such.
"""

from __future__ import annotations

import ast
import re
import socket
import subprocess
import sys

import pytest
import yaml

from pipeline.cli import ui
from tests.conftest import REPO
from tests.sweep.test_reliability import figure  # noqa: F401 (shared with test_reliability.py)


def test_ui_binds_to_localhost_without_a_shell(make_cfg, tmp_path, monkeypatch):
    from pipeline.cli import main

    make_cfg()  # DVC_ROOT=tmp_path
    calls = []
    monkeypatch.setattr(ui, "start", lambda argv, env: calls.append((argv, env)) or Ended())
    assert main(["ui", "--set", "profile=", "--port", "5123"]) == 3  # the server's exit status
    ((argv, env),) = calls
    assert argv[:4] == [sys.executable, "-m", "mlflow", "ui"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "0.0.0.0" not in argv
    assert argv[argv.index("--port") + 1] == "5123"
    assert env["MLFLOW_BACKEND_STORE_URI"] == f"sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"  # no job runners, nothing in /dev/shm
    from mlflow import MlflowClient  # the shared runs-table view is written before the UI starts

    exps = MlflowClient(env["MLFLOW_BACKEND_STORE_URI"]).search_experiments()
    assert any("mlflow.sharedViewState.parallax" in e.tags for e in exps)
    for bad in ("5000; rm -rf ~", "99999", "-1", "0"):  # not a port: refused before anything runs
        with pytest.raises(SystemExit):
            main(["ui", "--set", "profile=", "--port", bad])
    assert len(calls) == 1


def test_ui_on_a_busy_port_is_a_clear_error_before_mlflow_starts(make_cfg, monkeypatch, capsys):
    from pipeline.cli import main

    make_cfg()
    calls = []
    monkeypatch.setattr(ui, "start", lambda *a: calls.append(a) or Ended())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["ui", "--set", "profile=", "--port", str(port)]) != 0
    err = capsys.readouterr().err
    assert f"Port {port} on 127.0.0.1 is in use" in err and "--port " in err and "UI_PORT=" in err
    assert calls == []  # MLflow never started


class Ended:
    """A server process that ended at once, with status 3, without listening."""

    returncode = 3

    def poll(self):
        return 3

    def wait(self, timeout=None):
        return 3


# "listening" is written before listen(): the UI's probe can only connect after it, so the link must follow it in
# the output; printed after listen(), a loaded host could deschedule the stand-in between the two and let the probe
# (and the link) in first. A UI that prints its link without waiting still prints it a second before this line.
LISTENS_LATE = """import socket, sys, time
time.sleep(1.0)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); print("listening", flush=True); s.listen(); time.sleep(1.0)
"""


def test_ui_prints_its_link_only_once_the_server_listens(make_cfg, monkeypatch, capfd):
    """MLflow's server takes 10-30 s to listen: the link comes after it does (a stand-in server here listens after
    1 s), so a click never meets "connection refused"; the command ends with the server's status."""
    from pipeline.cli import main

    make_cfg()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setattr(
        ui, "start", lambda argv, env: subprocess.Popen([sys.executable, "-c", LISTENS_LATE, str(port)])
    )
    assert main(["ui", "--set", "profile=", "--port", str(port)]) == 0
    out = capfd.readouterr().out
    assert (
        out.index("Starting MLflow's UI") < out.index("listening") < out.index(f"MLflow UI on http://127.0.0.1:{port}")
    )
    assert out.index("listening") < out.index("viewStateShareKey=parallax")


def _package_calls():
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                yield path.relative_to(REPO), node


def _name(func) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def test_every_torch_load_is_weights_only():
    loads, bad = [], []
    for path, call in _package_calls():
        name = _name(call.func)
        if name in ("torch.load", "torch.serialization.load"):
            loads.append(f"{path}:{call.lineno}")
            kw = {k.arg: k.value for k in call.keywords}
            if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                bad.append(f"{path}:{call.lineno}")
        if name in ("pickle.load", "pickle.loads", "dill.load"):
            bad.append(f"{path}:{call.lineno} ({name})")
    assert not bad, f"loads without weights_only=True: {bad}"
    figure(case="torch.load in pipeline/", calls=len(loads), without_weights_only=0)


def test_no_command_goes_through_a_shell():
    bad = []
    for path, call in _package_calls():
        name = _name(call.func)
        if any(
            k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            for k in call.keywords
        ):
            bad.append(f"{path}:{call.lineno} shell=")
        if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"):
            bad.append(f"{path}:{call.lineno} {name}")
        if re.fullmatch(r"(subprocess\.(run|call|check_call|check_output|Popen)|os\.exec\w+|os\.spawn\w+)", name):
            argv = call.args[0] if call.args else None
            if isinstance(argv, (ast.Constant, ast.JoinedStr, ast.BinOp)):  # a command line as one string
                bad.append(f"{path}:{call.lineno} {name} with a string")
    assert not bad, bad


def test_dvc_commands_interpolate_only_validated_strategy_names():
    """DVC runs each stage's cmd through a shell: the only parameter in one is ${item}, from a fixed list in
    dvc.yaml (not from params.yaml), and every name on it is a strategy."""
    from pipeline.config import loader

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        cmd = stage.get("do", stage)["cmd"]
        assert set(re.findall(r"\$\{([^}]*)\}", cmd)) <= {"item"}, (name, cmd)
        if "foreach" in stage:
            assert stage["foreach"] == list(loader.STRATEGY_NAMES), name
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", s) for s in loader.STRATEGY_NAMES)
    with pytest.raises(loader.ConfigError):
        loader.load(REPO / "params.yaml", ["sweep.strategies=[ddp; rm -rf ~]"], root=REPO)


def test_a_peer_connection_error_is_reported_as_a_likely_dead_rank():
    import types

    from pipeline.trial.rank_watch import failure_reason

    f = types.SimpleNamespace(
        exitcode=1,
        pid=11,
        message={"message": "RuntimeError: [pair.cc:545] Read error [127.0.0.1]:1: Connection reset by peer."},
    )
    e = failure_reason(types.SimpleNamespace(failures={0: f}))
    assert e.kind == "worker_died" and "most likely died" in str(e) and str(e).startswith("rank 0 failed")
