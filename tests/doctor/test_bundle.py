"""The air-gapped GPU bundle: what it carries, and its install + run on a simulated node that has its own PyTorch
and no registry (a fresh venv that sees this environment's packages, Parallax excluded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pipeline.doctor import bundle

from ..conftest import REPO


def test_only_what_the_node_lacks_is_carried():
    node = bundle.node_packages(["torch==2.11.0+cu130", "numpy==2.5.2", "PyYAML==6.0.2", "# comment", "-e x"])
    assert node == {"torch": "2.11.0", "numpy": "2.5.2", "pyyaml": "6.0.2"}
    assert bundle.missing(["torch>=2.11", "numpy>=1.24", "pyyaml>=6", "tqdm>=4.66"], node) == ["tqdm>=4.66"]
    assert bundle.missing(["torch>=2.12"], node) == ["torch>=2.12"]  # an older torch than supported is named
    # the documented node (torch, pandas, matplotlib, pytest) lacks these three: a default bundle carries them
    assert bundle.missing(bundle.core_requirements(), bundle.node_packages(bundle.DOCUMENTED_NODE)) == [
        "pyyaml>=6",
        "tqdm>=4.66",
        "psutil>=5.9",
    ]


# the smoke run's doctor and benchmark without ddp_amp, whose bf16 a CPU without bf16 instructions emulates (7x an fp32
# step): these tests prove the install contract; every strategy's own checks are tests/doctor/test_doctor.py's
SMOKE = {
    "QUICK": "1",
    "DOCTOR_ARGS": "--strategies single,dp,ddp --steps 3",
    "BENCH_ARGS": "--models lenet --images 2048 --rounds 1 --rungs single,ddp",
}


def _node(tmp: Path) -> Path:
    """A venv standing for the GPU node: this environment's packages visible, as a node's system site would be."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    site = Path(sysconfig.get_paths()["purelib"])
    shared = tmp / "node-site"
    shared.mkdir()
    for entry in site.iterdir():  # everything but Parallax itself
        if not entry.name.lower().startswith(("parallax", "__editable__", "_parallax")):
            (shared / entry.name).symlink_to(entry)
    venv_site = next((tmp / "venv" / "lib").glob("python*/site-packages"))
    (venv_site / "node-packages.pth").write_text(f"{shared}\n")
    return tmp / "venv"


@pytest.mark.slow
def test_bundle_installs_offline_keeps_torch_and_runs_the_checks(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pipeline.doctor.bundle", "--out", str(tmp_path / "gpu-bundle")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr + built.stdout
    assert "MiB" in built.stdout and (tmp_path / "gpu-bundle.tar.gz").exists()
    assert bundle.size(tmp_path / "gpu-bundle") <= bundle.LIMIT
    # the configuration the first-run check's steps read, beside its script (gpu_first_run.project_root)
    assert (tmp_path / "gpu-bundle" / "params.yaml").exists()
    assert (tmp_path / "gpu-bundle" / "experiments" / "cpu.yaml").exists()
    venv = _node(tmp_path)
    site = tmp_path / "parallax-site"
    env = {
        **os.environ,
        **SMOKE,
        "PARALLAX_SITE": str(site),
        "PYTHON": str(venv / "bin" / "python"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
    }  # no registry, no local wheel folder: only the bundle
    env.pop("PYTHONPATH", None)
    run = subprocess.run(
        ["bash", str(tmp_path / "gpu-bundle" / "run.sh"), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    before, after = (tmp_path / "out" / "install.txt").read_text().split("before install: ")[1].split(", after: ")
    assert before.strip() == after.strip()
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pipeline; print(pipeline.__file__)"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(site))  # the bundled wheel, not this checkout
    assert not list(venv.glob("lib/python*/site-packages/pipeline"))  # the node's environment untouched
    doc = json.loads((tmp_path / "out" / "doctor" / "doctor.json").read_text())
    assert doc["counts"]["failed"] == 0 and doc["counts"]["passed"] >= 2
    assert {r["strategy"] for r in doc["rows"]} == {"single", "dp", "ddp"}  # DOCTOR_ARGS reached doctor
    assert json.loads((tmp_path / "out" / "gpu_epoch.json").read_text())["rungs"] == ["single", "ddp"]


def _stub_python(tmp: Path, cuda: bool = True, writes: bool = True) -> tuple[Path, Path]:
    """A stand-in for the node's Python that records each command run.sh gives it and answers run.sh's own
    questions: a fixed torch version, and a CUDA device present (exit 0) or, `cuda` false, none (exit 1). With
    `writes`, the first-run check writes its first-run.md (`--out DIR` is its third and fourth argument)."""
    log, stub = tmp / "calls.txt", tmp / "python"
    stub.write_text(
        "#!/usr/bin/env bash\n"
        f"printf '%s\\n' \"$*\" >> '{log}'\n"
        'case "$*" in *"print(torch.__version__)"*) echo 2.11.0;; esac\n'
        + ("" if cuda else 'case "$*" in *"torch.cuda.is_available()"*) exit 1;; esac\n')
        + (
            'case "$2" in benchmarks.gpu.gpu_first_run) mkdir -p "$4" && echo "# first run" > "$4/first-run.md";; '
            "esac\n"
            if writes
            else ""
        )
    )
    stub.chmod(0o755)
    return stub, log


@pytest.mark.parametrize(
    "given, passed",
    [(None, ""), ("--budget-s 300 --trial-s 4", " --budget-s 300 --trial-s 4")],
)
def test_first_run_args_reach_the_first_run_check(tmp_path, given, passed):
    """run.sh passes FIRST_RUN_ARGS (a budget under a shorter outer limit) to gpu_first_run as it is, and nothing
    when it is unset; FIRST_RUN=only stops there."""
    stub, log = _stub_python(tmp_path)
    env = {**os.environ, "PYTHON": str(stub), "PARALLAX_SITE": str(tmp_path / "site"), "FIRST_RUN": "only"}
    env.pop("FIRST_RUN_ARGS", None)
    if given is not None:
        env["FIRST_RUN_ARGS"] = given
    run = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu" / "gpu_node.sh"), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    first_run = [c for c in log.read_text().splitlines() if c.startswith("-m benchmarks.gpu.gpu_first_run")]
    assert first_run == [f"-m benchmarks.gpu.gpu_first_run --out {tmp_path / 'out' / 'first-run'}{passed}"]
    assert not any(c.startswith("-m pipeline doctor") for c in log.read_text().splitlines())
    assert run.stdout.splitlines()[-1] == f"results in {tmp_path / 'out' / 'first-run' / 'first-run.md'}"


def _run_sh(tmp_path, **env):
    """run.sh on the stub Python, FIRST_RUN and FIRST_RUN_ARGS as given (absent where not)."""
    environ = {**os.environ, "PYTHON": str(tmp_path / "python"), "PARALLAX_SITE": str(tmp_path / "site")}
    for name in ("FIRST_RUN", "FIRST_RUN_ARGS", "QUICK", "DOCTOR_ARGS", "BENCH_ARGS"):
        environ.pop(name, None)
    return subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu" / "gpu_node.sh"), str(tmp_path / "out")],
        cwd=tmp_path,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_first_run_only_without_cuda_fails_with_the_reason_and_names_no_results(tmp_path):
    """FIRST_RUN=only on a host without CUDA runs nothing: run.sh exits 1 saying why and how to rehearse on the CPU
    (FIRST_RUN_ARGS=--allow-cpu), and names no first-run.md, not even one an earlier run left there."""
    _, log = _stub_python(tmp_path, cuda=False)
    old = tmp_path / "out" / "first-run" / "first-run.md"
    old.parent.mkdir(parents=True)
    old.write_text("# an earlier run's\n")
    os.utime(old, (1e9, 1e9))
    run = _run_sh(tmp_path, FIRST_RUN="only")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "no CUDA device here" in run.stderr and "FIRST_RUN_ARGS=--allow-cpu" in run.stderr
    assert "results in" not in run.stdout + run.stderr
    assert not any("gpu_first_run" in c or "pipeline doctor" in c for c in log.read_text().splitlines())


def test_first_run_args_allow_cpu_rehearses_the_check_without_cuda(tmp_path):
    """FIRST_RUN_ARGS=--allow-cpu passes run.sh's CUDA gate: the first-run check runs on the CPU with it."""
    _, log = _stub_python(tmp_path, cuda=False)
    run = _run_sh(tmp_path, FIRST_RUN="only", FIRST_RUN_ARGS="--allow-cpu --budget-s 60")
    assert run.returncode == 0, run.stdout + run.stderr
    first_run = [c for c in log.read_text().splitlines() if c.startswith("-m benchmarks.gpu.gpu_first_run")]
    assert first_run == [
        f"-m benchmarks.gpu.gpu_first_run --out {tmp_path / 'out' / 'first-run'} --allow-cpu --budget-s 60"
    ]
    assert run.stdout.splitlines()[-1] == f"results in {tmp_path / 'out' / 'first-run' / 'first-run.md'}"


def test_a_first_run_check_that_writes_no_report_is_not_named_as_results(tmp_path):
    """A first-run check that ends without writing first-run.md (a --dry-run, a crash before its first line) leaves
    run.sh naming no results file."""
    _stub_python(tmp_path, writes=False)
    run = _run_sh(tmp_path, FIRST_RUN="only", FIRST_RUN_ARGS="--dry-run")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "results in" not in run.stdout and "no first-run.md written" in run.stderr


def test_the_last_line_names_only_the_results_files_written(tmp_path):
    """Without CUDA (the first-run check skipped), doctor and the benchmark run; the last line names only the files
    that exist: here the benchmark's log, which run.sh writes itself, and no doctor.md the stub did not write."""
    _, log = _stub_python(tmp_path, cuda=False)
    run = _run_sh(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert any(c.startswith("-m pipeline doctor") for c in log.read_text().splitlines())
    assert run.stdout.splitlines()[-1] == f"results in {tmp_path / 'out'} (gpu_epoch.log)"


# the GPU node as documented: its own PyTorch, pandas, matplotlib and pytest (and what those pull in), nothing else
DOCUMENTED_BARE = ("torch", "pandas", "matplotlib", "pytest")
ABSENT_THERE = ("yaml", "tqdm", "psutil", "torchvision", "pynvml")


def _closure(roots) -> list:
    """The installed distributions of `roots` and everything their requirements (markers evaluated) pull in."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = {}, list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            seen[name] = dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _bare_node(tmp: Path) -> Path:
    """A venv standing for the documented node: no system site, and a .pth onto links to only the files of
    DOCUMENTED_BARE's distributions and their dependencies, so pyyaml, tqdm, psutil and torchvision are absent."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    site = Path(sysconfig.get_paths()["purelib"])
    shared = tmp / "node-site"
    shared.mkdir()
    for dist in _closure(DOCUMENTED_BARE):
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if (site / top).exists() and not (shared / top).exists():
                (shared / top).symlink_to(site / top)
    venv_site = next((tmp / "venv" / "lib").glob("python*/site-packages"))
    (venv_site / "node-packages.pth").write_text(f"{shared}\n")
    return tmp / "venv"


@pytest.mark.slow
def test_the_default_bundle_runs_on_the_documented_bare_node(tmp_path):
    """G11: the node as documented (torch, pandas, matplotlib, pytest; no pyyaml, tqdm, psutil, torchvision) gets
    a working Parallax from a default `make gpu-bundle`: the install's requirement check passes, doctor runs, and
    the GPU benchmark reports the missing d2l peer (torchvision absent) and still writes its JSON.
    Proves the install contract on a CPU stand-in; whether a real node's image matches the documented one, and
    the benchmark's figures, only that node can show."""
    peer = tmp_path / "d2l_reference.py"
    peer.write_text("import torchvision  # as the seeds' recipe does\n")
    built = subprocess.run(
        [sys.executable, "-m", "pipeline.doctor.bundle", "--out", str(tmp_path / "gpu-bundle"), "--peer", str(peer)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr + built.stdout
    assert bundle.size(tmp_path / "gpu-bundle") <= bundle.LIMIT
    venv = _bare_node(tmp_path)
    py = str(venv / "bin" / "python")
    for module in ABSENT_THERE:  # the stand-in is as bare as documented
        gone = subprocess.run([py, "-c", f"import {module}"], cwd=tmp_path, capture_output=True, timeout=120)
        assert gone.returncode != 0, f"{module} is importable on the simulated bare node"
    env = {
        **os.environ,
        **SMOKE,
        "PARALLAX_SITE": str(tmp_path / "parallax-site"),
        "PYTHON": py,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
    }
    env.pop("PYTHONPATH", None)
    run = subprocess.run(
        ["bash", str(tmp_path / "gpu-bundle" / "run.sh"), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "core requirements: all met" in run.stdout
    doc = json.loads((tmp_path / "out" / "doctor" / "doctor.json").read_text())
    assert doc["counts"]["failed"] == 0 and doc["counts"]["passed"] >= 2
    assert "d2l peer skipped" in run.stdout
    report = json.loads((tmp_path / "out" / "gpu_epoch.json").read_text())
    assert report["peer"] == "" and "torchvision" in report["peer_note"]


@pytest.mark.slow
def test_gpu_epoch_reports_a_failing_d2l_peer_and_still_writes_its_json(tmp_path, synthetic_root):
    """G11: the d2l recipe failing (here: torchvision missing, as on the documented node) is reported as
    "d2l peer failed: ..." and the benchmark goes on and writes its JSON, Parallax's rows without ratios.
    A CPU run of the real script with a stub peer; the GPU figures themselves need a GPU."""
    peer = tmp_path / "d2l_reference.py"
    peer.write_text("raise ModuleNotFoundError(\"No module named 'torchvision'\")\n")
    out = tmp_path / "gpu_epoch.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu.gpu_epoch",
            "--data",
            str(synthetic_root),
            "--source",
            "synthetic",
            "--models",
            "lenet",
            "--images",
            "512",
            "--rounds",
            "1",
            "--rungs",
            "single,ddp,ddp_amp",
            "--peer",
            str(peer),
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "d2l peer failed: " in run.stdout and "torchvision" in run.stdout
    report = json.loads(out.read_text())
    assert "torchvision" in report["peer_note"]
    assert set(report["models"]["lenet"]["rows"]) == {"single", "ddp", "ddp_amp"}
    assert "best rung (" in run.stdout and "500,000 img/s" in run.stdout, "LeNet's bar is judged"
    assert "eager ddp k=1 within 10%" not in run.stdout  # a ResNet-18 bar: not printed for lenet
