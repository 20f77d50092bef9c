"""Bad input stops before any work: non-zero exit, a one-paragraph message naming the problem and the fix,
and nothing written to the MLflow or Optuna stores. docs/errors.md lists these cases and their messages."""

from __future__ import annotations

import shutil

import pytest

from pipeline.cli import main
from pipeline.host.devices import probe

HOST = probe()

# (id, argv after `python -m pipeline`, a phrase the message must contain)
CASES = [
    ("unknown strategy", ["train", "--out", "{tmp}/o", "--set", "train.strategy=horovod"], "horovod"),
    ("unknown strategy (flag)", ["train", "--out", "{tmp}/o", "--strategy", "horovod"], "invalid choice"),
    ("unknown model", ["train", "--out", "{tmp}/o", "--set", "train.model=lenett"], "Did you mean `lenet`"),
    ("unknown params.yaml key", ["train", "--out", "{tmp}/o", "--params", "{tmp}/bad_key.yaml"], "train.lrr"),
    (
        "params file that does not exist",
        ["train", "--out", "{tmp}/o", "--params", "{tmp}/nonexist.yaml"],
        "does not exist",
    ),
    ("value of the wrong type", ["train", "--out", "{tmp}/o", "--set", "train.epochs=two"], "expected an integer"),
    ("batch size 0", ["train", "--out", "{tmp}/o", "--batch-size", "0"], "must be >= 1"),
    ("batch size negative", ["train", "--out", "{tmp}/o", "--batch-size", "-8"], "must be >= 1"),
    (
        "batch not divisible by devices",
        ["train", "--out", "{tmp}/o", "--strategy", "ddp", "--devices", str(min(2, HOST.n)), "--batch-size", "255"]
        if HOST.n >= 2
        else None,
        "not divisible",
    ),
    ("lr zero", ["train", "--out", "{tmp}/o", "--lr", "0"], "must be > 0"),
    ("lr not a number", ["train", "--out", "{tmp}/o", "--set", "train.lr=fast"], "expected a number"),
    ("epochs < 1", ["train", "--out", "{tmp}/o", "--epochs", "0"], "must be >= 1"),
    (
        "more devices than the host has",
        [
            "train",
            "--out",
            "{tmp}/o",
            "--strategy",
            "ddp",
            "--devices",
            str(HOST.n + 1),
            "--batch-size",
            str(8 * (HOST.n + 1)),
        ],
        "exceeds",
    ),
    (
        "strategy unavailable on this host",
        ["train", "--out", "{tmp}/o", "--strategy", "dp"] if HOST.kind == "cpu" else None,
        "needs CUDA",
    ),
    ("sweep --n-trials negative", ["sweep", "--strategy", "single", "--n-trials", "-1"], "-1 is negative"),
    ("empty search space", ["sweep", "--strategy", "ddp", "--set", "sweep.spaces.ddp.lr=[]"], "empty"),
    (
        "a train knob that a selected strategy cannot take, in a sweep",
        ["sweep", "--strategy", "ddp", "--set", "sweep.strategies=[ddp, single]", "--set", "train.comm_hook=fp16"],
        "sweep.spaces.ddp.comm_hook",
    ),
    (
        "a train setting and the user's own space that disagree",
        ["sweep", "--strategy", "ddp", "--set", "train.lr=0.2", "--set", "sweep.spaces.ddp.lr=[0.1, 0.3]"],
        "the two disagree",
    ),
    ("malformed --set", ["train", "--out", "{tmp}/o", "--set", "train.lr"], "Malformed --set"),
    (
        "--set of a section as a value, with a flag",
        ["train", "--out", "{tmp}/o", "--set", "train=5", "--strategy", "single"],
        "`train` in --set: expected a mapping",
    ),
    ("missing data directory", ["train", "--out", "{tmp}/o", "--set", "data.dir={tmp}/nowhere"], "No prepared data"),
    (
        "data directory is not a directory",
        ["sweep", "--strategy", "single", "--set", "data.dir={tmp}/afile"],
        "unreadable",
    ),
    # a damaged file is caught by manifest.json's md5 before it is parsed (the IDX reader's own errors: test_data.py)
    (
        "data file with a wrong magic number",
        ["train", "--out", "{tmp}/o", "--set", "data.dir={damaged}/badmagic"],
        "changed after the download stage wrote it",
    ),
    (
        "data file of the wrong size",
        ["sweep", "--strategy", "single", "--set", "data.dir={damaged}/truncated"],
        "23520008 bytes; the manifest says",
    ),
    (
        "storage URL that cannot be opened",
        ["sweep", "--strategy", "single", "--set", "sweep.storage=sqlite:////nonexistent/dir/optuna.db"],
        "sweep.storage",
    ),
    ("unknown profile", ["sweep", "--strategy", "ddp", "--set", "profile=huge"], "Valid profiles"),
    (
        "output device outside the trial",
        ["train", "--out", "{tmp}/o", "--set", "train.output_device=-1"],
        "must be >= 0",
    ),
    ("profile that is a path", ["sweep", "--strategy", "single", "--set", "profile=../params"], "Invalid profile"),
    ("sweep --out at a directory", ["sweep", "--strategy", "single", "--out", "{tmp}"], "is a directory"),
    ("train --out at an existing file", ["train", "--out", "{tmp}/afile"], "is an existing file"),
    ("train --out empty", ["train", "--out="], "the path is empty"),
    ("--params empty", ["train", "--out", "{tmp}/o", "--params="], "the path is empty"),
    ("train --out where nothing can be written", ["train", "--out", "{tmp}/afile/o"], "cannot be written"),
    ("analyze --sweeps that does not exist", ["analyze", "--sweeps", "{tmp}/nowhere"], "does not exist"),
    (
        "analyze --out where nothing can be written",
        ["analyze", "--sweeps", "{damaged}/badmagic", "--out", "{tmp}/afile/o"],
        "cannot be written",
    ),
    ("doctor --out at an existing file", ["doctor", "--out", "{tmp}/afile"], "is an existing file"),
    ("overlap --out at an existing file", ["overlap", "--out", "{tmp}/afile"], "is an existing file"),
    (
        "overlap with the MLflow server unreachable",
        ["overlap", "--out", "{tmp}/ov", "--set", "tracking.uri=http://127.0.0.1:1"],
        "Cannot reach",
    ),
    ("collectives --out at a directory", ["collectives", "--out", "{tmp}"], "is a directory"),
    ("seed beyond 32 bits", ["train", "--out", "{tmp}/o", "--seed", str(2**64 + 1)], "must be <= 4294967295"),
    (
        "collective timeout beyond 30 days",
        ["train", "--out", "{tmp}/o", "--set", "train.timeout_s=1e300"],
        "must be <= 2592000",
    ),
    (
        "global batch larger than the training set",
        ["train", "--out", "{tmp}/o", "--batch-size", "60001"],
        "larger than the training set",
    ),
    ("params.yaml not UTF-8", ["train", "--out", "{tmp}/o", "--params", "{tmp}/latin1.yaml"], "not UTF-8"),
    (
        "a section that is not a mapping, with a flag",
        ["train", "--out", "{tmp}/o", "--params", "{tmp}/list_train.yaml", "--lr", "0.1"],
        "expected a mapping",
    ),
    (
        "Optuna storage unreachable",
        ["sweep", "--strategy", "single", "--set", "sweep.storage=postgresql://parallax:PW@127.0.0.1:1/optuna"],
        "Cannot reach",
    ),
    (
        "MLflow tracking server unreachable",
        ["train", "--out", "{tmp}/o", "--set", "tracking.uri=http://127.0.0.1:1"],
        "Cannot reach",
    ),
    (
        "store address without its scheme",
        ["sweep", "--strategy", "single", "--set", "sweep.storage=parallax:PW@127.0.0.1:1/optuna"],
        "sweep.storage='***@127.0.0.1:1/optuna' is a server's address without its scheme",
    ),
    ("fit --devices 0", ["fit", "--devices", "0,3"], "argument --devices: 0 devices: a count k is from 1 to 1024"),
    ("fit --devices too many", ["fit", "--devices", "99999999"], "a count k is from 1 to 1024"),
    ("fit --strategies unknown", ["fit", "--strategies", "bogus,single"], "unknown strategy 'bogus'; valid:"),
    ("fit --batch-size 0", ["fit", "--batch-size", "0"], "0 is not a batch"),
    ("fit --device-memory 0", ["fit", "--device-memory", "0"], "one device's memory is from 1MiB"),
    (
        "MLflow database corrupt",
        ["train", "--out", "{tmp}/o", "--set", "tracking.uri=sqlite:///{tmp}/corrupt.db"],
        "not a usable SQLite database",
    ),
    (
        "Optuna database corrupt",
        ["sweep", "--strategy", "single", "--set", "sweep.storage=sqlite:///{tmp}/corrupt.db"],
        "not a usable SQLite database",
    ),
    (
        "sweep --out at a file that is not its table",
        ["sweep", "--strategy", "single", "--out", "{tmp}/afile"],
        "not a sweep table",
    ),
    (
        "train: a setting its run would never use",
        ["train", "--out", "{tmp}/o", "--set", "train.amp_dtype=fp16"],
        "applies with train.autocast=true",
    ),
    (
        "train: the answer's load without its figure",
        ["train", "--out", "{tmp}/o", "--answer-load-cores", "1.2"],
        "--answer-load-cores is the load of the answer's figure",
    ),
    ("train: an answer figure of 0", ["train", "--out", "{tmp}/o", "--answer-img-s", "0"], "--answer-img-s"),
    (
        "fit: no row to show",
        ["fit", "--model", "lenet", "--strategies", "single", "--devices", "2"],
        "fit has no row to show",
    ),
    ("fit: a batch above the training set", ["fit", "--batch-size", "100000000"], "larger than the training set"),
    ("fit: a device memory without its unit", ["fit", "--device-memory", "80"], "--device-memory"),
    ("fit --count-ahead with a question", ["fit", "--batch-size", "512", "--count-ahead", "lenet"], "answers nothing"),
    ("doctor --set of another command's key", ["doctor", "--set", "sweep.n_trials=3"], "never read"),
    (
        "doctor --set a setting no row runs",
        ["doctor", "--strategies", "single", "--set", "train.amp_dtype=fp16"],
        "reaches none of doctor's rows",
    ),
    ("compare --keep that is not a regular expression", ["compare", "--keep", "("], "--keep"),
]


@pytest.fixture
def env(make_cfg, tmp_path, synthetic_root, monkeypatch):
    make_cfg()  # sets DVC_ROOT=tmp_path
    (tmp_path / "experiments").mkdir(exist_ok=True)
    from tests.conftest import REPO

    for p in ("cpu",):
        shutil.copy(REPO / "experiments" / f"{p}.yaml", tmp_path / "experiments")
    (tmp_path / "params.yaml").write_text(f"profile: cpu\ndata: {{source: synthetic, dir: {synthetic_root}}}\n")
    (tmp_path / "bad_key.yaml").write_text("profile: cpu\ntrain:\n  lrr: 0.1\n")
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "latin1.yaml").write_bytes(b"profile: cpu\ntrain: {lr: 0.1}  # r\xe9glage\n")
    (tmp_path / "list_train.yaml").write_text(
        f"profile: cpu\ndata: {{source: synthetic, dir: {synthetic_root}}}\ntrain: [1, 2]\n"
    )
    (tmp_path / "corrupt.db").write_bytes(b"this is not a database" * 100)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def damaged(synthetic_root, tmp_path_factory):
    """Two damaged copies of the synthetic data set, made once for the module (a copy is ~40 MB; one per case
    filled gigabytes of the test host's disk)."""
    root = tmp_path_factory.mktemp("damaged")
    for name, damage in (("badmagic", b"\x00\x00\x09\x09"), ("truncated", None)):
        d = root / name
        shutil.copytree(synthetic_root, d)
        f = next((d / "FashionMNIST" / "raw").glob("train-images-idx3-ubyte"))
        raw = f.read_bytes()
        f.write_bytes(damage + raw[4:] if damage else raw[: len(raw) // 2])
    return root


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_stops_before_any_work(env, damaged, case, capsys):
    name, argv, needle = case
    if argv is None:
        pytest.skip("not applicable on this host")
    argv = [a.replace("{tmp}", str(env)).replace("{damaged}", str(damaged)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code != 0
    assert needle in " ".join(err.split()), err  # the paragraph is wrapped at 100 columns
    assert "Traceback" not in err
    assert not (env / "mlruns" / "mlflow.db").exists() and not (env / "mlruns" / "optuna.db").exists()
    assert not (env / "o" / "metrics.json").exists()


def test_at_least_fifteen_cases_are_listed_in_the_docs():
    from tests.conftest import REPO

    doc = (REPO / "docs" / "errors.md").read_text()
    assert len(CASES) >= 15
    missing = [c[0] for c in CASES if c[0] not in doc]
    assert not missing, f"docs/errors.md lacks: {missing}"
