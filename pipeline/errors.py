"""The package's user-facing exceptions, and the handler that turns them into a one-paragraph message and an exit
status (no traceback). Torch-free, so that commands which never train (analyze) do not import torch to handle them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import textwrap

# scheme://user:SECRET@host -> scheme://user:***@host. SQLAlchemy ends a password at its first `@`, browsers and
# urllib at the first `/?#`; a password may hold any of them, a space or a quote, so the secret runs from `user:` to
# the LAST `@` that a host follows, on that line and before the next URL: more is hidden, never less.
_HEAD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"?#]*:")
_END = r"(?=[/?#\s'\"),;]|$)"
_AT_HOST = re.compile(r"@(?:\[[0-9A-Fa-f:.]*\]|[\w.%~-]*)(?::\d+)?" + _END)
_WORD = re.compile(r"\S*")
_PORT = re.compile(r"\d{1,5}" + _END)  # scheme://host:PORT/...: no userinfo unless an @host follows in the word
# ?password=SECRET, &sslpassword=..., &api_token=... -> ***; a quote ends the value only where the URL ends
_QUERY = re.compile(
    r"(?P<head>[?&;][\w.-]*(?:password|passwd|pwd|secret|token|credential)[\w.-]*=)"
    r"(?P<secret>(?:[^&\s'\"]|['\"](?![\s),;]|$))*)",
    re.I,
)


def _redact_userinfo(text: str) -> str:
    out, pos = [], 0
    while m := _HEAD.search(text, pos):
        start = m.end()
        line = text.find("\n", start)
        line = len(text) if line < 0 else line
        nxt = text.find("://", start, line)
        limit = line if nxt < 0 else nxt
        ats = [a.start() for a in _AT_HOST.finditer(text, start, limit)]
        word = _WORD.match(text, start).end()
        if not ats or (_PORT.match(text, start) and ats[0] > word):
            out.append(text[pos:start])
            pos = start
            continue
        out.append(text[pos:start] + "***")
        pos = ats[-1]
    return "".join(out) + text[pos:]


def redact(text) -> str:
    """Every URL in `text` with its password (and password/token query values) replaced by ***.

    The one helper for anything shown or stored: messages, log lines, MLflow params and tags, CSVs, manifests."""
    return _QUERY.sub(lambda m: f"{m['head']}***", _redact_userinfo(str(text)))


def has_password(url: str) -> bool:
    return redact(url) != url


def root_cause(e: BaseException) -> str:
    """`Type: first line` of the innermost explicit cause: Optuna wraps every driver error into "... e.g. exceeding
    max length", MLflow into MlflowException; the driver's own words (connection refused, locked, disk full) are
    what the user needs."""
    seen = set()
    while e.__cause__ is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


_FAULTS = (
    ("disk_full", ("no space left", "disk is full", "errno 28", "quota exceeded")),
    ("locked", ("database is locked", "database table is locked")),
    ("no_answer", ("timeout expired", "timed out", "read timeout")),
    (
        "unreachable",
        (
            "connection refused",
            "could not connect",
            "connection failed",
            "server closed the connection",
            "name or service not known",
            "no route to host",
        ),
    ),
)
FAULT_TEXT = {
    "disk_full": "the disk is full",
    "locked": "the store is locked by another process",
    "no_answer": "the store did not answer in time",
    "unreachable": "the store is unreachable",
}


def store_fault(e: BaseException) -> str | None:
    """Which store fault `e` (or any exception in its chain) is: a key of FAULT_TEXT, or None."""
    import errno

    texts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk_full"
        texts.append(str(e).lower())
        e = e.__cause__ or e.__context__
    text = " ".join(texts)
    return next((k for k, needles in _FAULTS if any(n in text for n in needles)), None)


class DataError(RuntimeError):
    """User-facing error; its message is one paragraph naming the problem and the fix."""


class Infeasible(ValueError):
    """This trial cannot run on this host (skipped, with the reason)."""


class TrialFailed(RuntimeError):
    """The trial ran and failed; the message names the rank and the error."""

    def __init__(self, reason: str, kind: str = "error"):
        super().__init__(reason)
        self.kind = kind  # "diverged" | "worker_died" | "timeout" | "oom" | "error"


# modules of the optional extras (pyproject.toml), and the extra that installs each
EXTRAS = {
    "mlflow": "pipeline",
    "optuna": "pipeline",
    "dvc": "pipeline",
    "pandas": "pipeline",
    "matplotlib": "pipeline",
    "torchvision": "download",
}


class PathError(RuntimeError):
    """An output path cannot be written (a directory where a file goes, an existing file, no permission)."""


class StoreError(RuntimeError):
    """The MLflow or Optuna store cannot be used: unreachable, corrupt, read-only or full. Names its (redacted)
    address and what to do."""


class Stopped(RuntimeError):
    """A command stopped on a fault after recording what it could: runs and trials closed FAILED with the reason."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or a termination signal: the process exits with 128 + the signal's number (130, 143)."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")


def interruption(e: BaseException) -> Interrupted | None:
    """`e` as an Interrupted when it is one: Ctrl-C, or torch's elastic SignalException (a signal that reached the
    launcher's handlers, e.g. a second Ctrl-C while it tears a trial's workers down); None for any other error."""
    if isinstance(e, Interrupted):
        return e
    if isinstance(e, KeyboardInterrupt):
        return Interrupted(signal.SIGINT)
    sigval = getattr(e, "sigval", None)
    if type(e).__name__ == "SignalException" and sigval is not None:
        return Interrupted(sigval)
    return None


class _Status:
    code = 0


def _on_sigterm(signum, frame):
    raise Interrupted(signum)  # unwinds like Ctrl-C: runs and trials are ended KILLED, nothing left RUNNING


@contextlib.contextmanager
def user_errors():
    """Turn the package's errors into one paragraph on stderr and an exit status; never a raw traceback
    (PARALLAX_TRACEBACK=1 shows it for an unexpected error)."""
    from pipeline.config.loader import ConfigError

    status = _Status()
    previous = None
    if threading_main():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
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
    first = (str(e).strip().splitlines() or [""])[0][:500]
    say(
        f"error: unexpected {type(e).__name__}: {first}. Nothing more was run. If the message names a file, a "
        f"disk or a server, fix that and rerun; otherwise rerun with PARALLAX_TRACEBACK=1 for the traceback "
        f"and report it."
    )
    status.code = 1


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def say(msg: str) -> None:
    print(textwrap.fill(redact(msg), width=100, break_long_words=False, break_on_hyphens=False), file=sys.stderr)
