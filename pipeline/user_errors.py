"""`user_errors`: the package's errors turned into one paragraph on stderr and an exit status (no traceback), and
`say`, which writes such a paragraph."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap

from pipeline.errors import DataError, Infeasible, PathError, Stopped, StoreError, TrialFailed, interruption
from pipeline.redact import redact
from pipeline.signals import on_sigterm, threading_main

# modules of the optional extras (pyproject.toml), and the extra that installs each
EXTRAS = {
    "mlflow": "pipeline",
    "optuna": "pipeline",
    "dvc": "pipeline",
    "pandas": "pipeline",
    "matplotlib": "pipeline",
    "torchvision": "download",
}


class _Status:
    code = 0


@contextlib.contextmanager
def user_errors():
    """Turn the package's errors into one paragraph on stderr and an exit status; never a raw traceback
    (PARALLAX_TRACEBACK=1 shows it for an unexpected error)."""
    from pipeline.config.loader import ConfigError

    status = _Status()
    previous = None
    if threading_main():
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield status
    except (ConfigError, Infeasible, DataError, PathError) as e:
        say(f"error: {e}")
        status.code = 2  # bad input: nothing was run
    except (StoreError, Stopped) as e:
        say(f"error: {e}")
        status.code = 1
    except TrialFailed as e:
        say(f"error: the trial failed ({e.kind}): {e}")
        status.code = 1
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        say(f"interrupted ({signal.Signals(signum).name})")
        status.code = 128 + signum
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top not in EXTRAS:
            _unexpected(e, status)
            return
        hint = (
            "; torchvision must be the build made for your torch (0.26 for torch 2.11, 0.29 for 2.14), so install "
            "the matching version by name rather than the newest"
            if top == "torchvision"
            else ""
        )
        say(
            f"error: this command needs {top}, which is not installed: the training core and `doctor` run without "
            f"it, the pipeline does not. Install the extra: pip install -e '.[{EXTRAS[top]}]' (or `make setup`, "
            f"which installs the tested set){hint}."
        )
        status.code = 2
    except Exception as e:
        if (signalled := interruption(e)) is None:
            _unexpected(e, status)
            return
        say(f"interrupted ({signal.Signals(signalled.signum).name})")
        status.code = 128 + signalled.signum
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _unexpected(e: Exception, status) -> None:
    if os.environ.get("PARALLAX_TRACEBACK"):
        raise e
    if isinstance(e, ModuleNotFoundError) and e.name and e.name.split(".")[0] != "pipeline":
        say(
            f"error: {e.name.split('.')[0]} is not installed for this interpreter ({sys.executable}): a set-up step, "
            f"not a fault. Run `make setup` in the Parallax checkout, then use .venv/bin/python (or `source "
            f".venv/bin/activate` first)."
        )
        status.code = 1
        return
    first = (str(e).strip().splitlines() or [""])[0][:500]
    say(
        f"error: unexpected {type(e).__name__}: {first}. Nothing more was run. If the message names a file, a "
        f"disk or a server, fix that and rerun; otherwise rerun with PARALLAX_TRACEBACK=1 for the traceback "
        f"and report it."
    )
    status.code = 1


def say(msg: str) -> None:
    print(textwrap.fill(redact(msg), width=100, break_long_words=False, break_on_hyphens=False), file=sys.stderr)
