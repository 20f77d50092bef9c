"""Regenerate docs/errors.md from the bad-input cases the test suite checks (tests/test_errors.py).

    .venv/bin/python docs/make_errors.py > docs/errors.md
"""
import contextlib
import io
import os
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONWARNINGS"] = "ignore"


def main():
    import pytest  # noqa: F401  (the cases' module imports it)
    from tests import test_errors as te
    from pipeline import data
    from pipeline.__main__ import main as cli
    tmp = Path(tempfile.mkdtemp())
    synth = tmp / "synthetic"
    data.prepare(synth, "synthetic", progress=False)

    class MP:  # the fixture's monkeypatch, by hand
        def setenv(self, k, v): os.environ[k] = v
        def chdir(self, p): os.chdir(p)

    os.environ["DVC_ROOT"] = str(tmp)
    te.env.__wrapped__(lambda: None, tmp, synth, MP())
    print("# Errors: every bad input and the message it gets\n")
    print("Each stops before any work, exits non-zero and writes nothing to the MLflow or Optuna stores "
          "(checked by `tests/test_errors.py`; regenerate this page with `python docs/make_errors.py`). "
          "Paths below come from a temporary directory.\n")
    for name, argv, _ in te.CASES:
        if argv is None:
            continue
        argv = [a.replace("{tmp}", "/tmp/x" if False else str(tmp)) for a in argv]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = cli(argv)
            except SystemExit as e:
                code = e.code
        msg = " ".join(err.getvalue().split()).replace(str(tmp), "$TMP")
        msg = msg[msg.find("error:"):] if "error:" in msg else msg
        print(f"## {name}\n\n`python -m pipeline {' '.join(argv).replace(str(tmp), '$TMP')}` → exit {code}\n")
        print("> " + "\n> ".join(textwrap.wrap(msg, 110)) + "\n")


if __name__ == "__main__":
    main()
