"""The package's user-facing exceptions, and the handler that turns them into a one-paragraph message and an exit
status (no traceback). Torch-free, so that commands which never train (analyze) do not import torch to handle them.
`redact`, which hides every URL's credentials in them, is hand-written: no URL parser finds URLs inside prose, and
urllib ends a password at its first `/?#@`, which shows the rest of one that holds them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import textwrap
import threading

# scheme://USER:SECRET@host and scheme://TOKEN@host -> scheme://***@host: the user may be the secret itself (a token
# given as the user, or as the user of `TOKEN:x-oauth-basic@`), so the whole userinfo goes. A user alone ends at its
# `@`. SQLAlchemy ends a password at its first `@`, browsers and urllib at the first `/?#`; a password may hold any of
# them, a space or a quote, so the secret runs to the LAST `@` that a host follows, on that line and before the next
# URL: more is hidden, never less.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_USER = re.compile(r"[^/\s:@'\"?#]*")
_END = r"(?=[/?#\s'\"),;]|$)"
_AT_HOST = re.compile(r"@(?:\[[0-9A-Fa-f:.]*\]|[\w.%~-]*)(?::\d+)?" + _END)
_WORD = re.compile(r"\S*")
_PORT = re.compile(r"\d{1,5}" + _END)  # scheme://host:PORT/...: no userinfo unless an @host follows in the word
# the query (or fragment, or `;` parameter) names whose values are secrets, matched anywhere in the name and in any
# case: api_key, X-Amz-Signature, AccessToken, sslpassword, client_secret, ...
_NAMES = r"[\w.-]*(?:password|passwd|pwd|secret|token|credential|key|auth|sig|session|jwt|bearer|cookie)[\w.-]*"
_VALUE = r"(?P<secret>(?:[^&\s'\"]|['\"](?![\s),;]|$))*)"  # a quote ends the value only where the URL ends
_QUERY = re.compile(rf"(?P<head>[?&;#]{_NAMES}=){_VALUE}", re.I)
_ENCODED = re.compile(rf"(?P<head>{_NAMES}%3D){_VALUE}", re.I)  # options=-c%20password%3DSECRET
# USER:SECRET@host without its scheme (a forgotten `postgresql://` or `http://`): the whole userinfo goes here too.
# Without a scheme nothing marks a URL, and prose holds `word:` and e-mail addresses (`name@host`, no secret), so
# the form is `word:` at a word's start with an `@` later in the same word (no space), and the secret runs to that
# word's last `@`. A password holding a space is covered only with a scheme.
_BARE = re.compile(r"(?<![\w.%+~:/@-])[\w.%+~-]+:(?!//)(?=[^\s@]*@)")


def _redact_userinfo(text: str, users: bool = True) -> str:
    out, pos = [], 0
    while m := _SCHEME.search(text, pos):
        start = m.end()
        user = _USER.match(text, start).end()
        after = text[user : user + 1]
        if after == "@" and users and _AT_HOST.match(text, user):  # scheme://USER@host: the user alone
            out.append(text[pos:start] + "***")
            pos = user
            continue
        if after != ":":
            out.append(text[pos:start])
            pos = start
            continue
        line = text.find("\n", user)
        line = len(text) if line < 0 else line
        nxt = text.find("://", user, line)
        limit = line if nxt < 0 else nxt
        ats = [a.start() for a in _AT_HOST.finditer(text, user + 1, limit)]
        word = _WORD.match(text, user + 1).end()
        if not ats or (_PORT.match(text, user + 1) and ats[0] > word):
            out.append(text[pos:start])
            pos = start
            continue
        out.append(text[pos:start] + "***")
        pos = ats[-1]
    return "".join(out) + text[pos:]


def _redact_bare(text: str) -> str:
    out, pos = [], 0
    while m := _BARE.search(text, pos):
        word = _WORD.match(text, m.end()).end()
        at = text.rfind("@", m.end(), word)
        out.append(text[pos : m.start()] + "***")
        pos = at
    return "".join(out) + text[pos:]


def _redact(text, users: bool = True) -> str:
    hidden = _redact_bare(_redact_userinfo(str(text), users))
    return _ENCODED.sub(lambda m: f"{m['head']}***", _QUERY.sub(lambda m: f"{m['head']}***", hidden))


def redact(text) -> str:
    """`text` with every credential of every URL in it replaced by ***: the user and password (the whole userinfo,
    `scheme://***@host`, and `***@host` where `user:password@host` lacks its scheme) and the values of secret-like
    query, fragment and `;` parameters (token, api_key, key, secret, password, auth, sig, ...; also URL-encoded,
    `password%3D...`).

    The one helper for anything shown or stored: messages, log lines, MLflow params and tags, CSVs, manifests."""
    return _redact(text)


def has_password(url: str) -> bool:
    """Whether `url` holds a secret that DVC would write to dvc.lock: a password, a secret-like query value, or a
    user alone in an http(s) URL (an MLflow server takes a token as the user). A database URL's user alone is a role
    name, the form docs/scale-out.md recommends (its password in PGPASSWORD or ~/.pgpass): no secret."""
    return _redact(url, users=url.lower().startswith("http")) != url


def env_number(
    name: str, default: float, lo: float, hi: float, what: str, lo_open: bool = False, environ=os.environ
) -> float:
    """The number the environment variable `name` holds, `default` when it is unset. An empty, non-numeric,
    non-finite or out-of-range value is a ConfigError that names the variable: read at import, such a value would
    otherwise surface as an unexpected ValueError, or run with a wait nobody meant."""
    import math

    from pipeline.config.loader import ConfigError

    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = None
    low = value is not None and (value < lo or (lo_open and value == lo))
    if value is None or not math.isfinite(value) or low or value > hi:
        kind = (
            "empty"
            if not raw.strip()
            else "not a number"
            if value is None
            else "not a finite number"
            if not math.isfinite(value)
            else "out of range"
        )
        span = f"above {lo:.10g} and up to {hi:.10g}" if lo_open else f"from {lo:.10g} to {hi:.10g}"
        raise ConfigError(
            f"The environment variable {name}={raw!r} is {kind}: it sets {what}. Give a number "
            f"{span}, or unset it (`unset {name}`) for the default, {default:.10g}. Nothing was run."
        )
    return value


def env_flag(name: str, what: str, environ=os.environ) -> bool | None:
    """The switch the environment variable `name` holds, read as MLflow reads its own (true/1, false/0, any case);
    None when it is unset. Any other value is a ConfigError that names the variable."""
    from pipeline.config.loader import ConfigError

    raw = environ.get(name)
    if raw is None:
        return None
    if raw.lower() not in ("true", "false", "1", "0"):
        raise ConfigError(
            f"The environment variable {name}={raw!r} is neither true nor false (MLflow reads true, false, 1 or 0): "
            f"it turns {what}. Set it to true or false, or unset it (`unset {name}`). Nothing was run."
        )
    return raw.lower() in ("true", "1")


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


@contextlib.contextmanager
def signals_deferred():
    """Hold Ctrl-C and SIGTERM over a few store writes that must not be cut in two (a trial's claim, its owner and
    first heartbeat); a signal that came meanwhile is raised again at the end, to the handler it would have met."""
    if not threading_main():
        yield
        return
    got: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        if got:
            signal.raise_signal(got[0])


# DVC runs a stage's cmd as `$SHELL -c CMD` (dvc/stage/run.py); a shell that does not exec the command stays between
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "busybox"})
LIFELINE_S = 1.0  # how often a stage command run by DVC looks for the process that ran it


def runner() -> tuple[int, str, str | None] | None:
    """The process that ran this stage command, as (pid, command name, start time): under DVC (which sets DVC_STAGE
    for every stage command) the nearest ancestor that is not a shell; None outside DVC. Start time None: the system
    does not show that process, and only the parent pid is watched."""
    if not os.environ.get("DVC_STAGE"):
        return None
    from pipeline import processes  # psutil: only a stage command run by DVC pays its import

    pid = os.getppid()
    for _ in range(8):
        name, ppid, start = processes.name(pid), processes.parent(pid), processes.started(pid)
        if name is None or ppid is None or start is None:
            return pid, "its parent", None
        if name not in _SHELLS or ppid <= 1:
            break
        pid = ppid
    return pid, name, start


def _is_gone(pid: int, start: str | None, parent: int) -> bool:
    if os.getppid() != parent:  # the parent (DVC, or the shell between) died: this process was re-parented
        return True
    if start is None:
        return False
    from pipeline import processes

    return processes.running(pid) is False or not processes.same_start(processes.started(pid), start)


@contextlib.contextmanager
def lifeline(poll_s: float = LIFELINE_S):
    """A stage command run by DVC stops as on SIGTERM once the process that ran it is gone. DVC has no SIGTERM
    handler: a `kill` of `dvc repro` or `dvc exp run` ends DVC at once and leaves its stage command running, a writer
    in the workspace that nobody records. Outside DVC (no DVC_STAGE) nothing is watched: a sweep started with nohup
    outlives its shell, by design."""
    found = runner() if threading_main() else None
    if found is None:
        yield
        return
    (pid, name, start), parent, stop = found, os.getppid(), threading.Event()

    def watch():
        while not stop.wait(poll_s):
            if _is_gone(pid, start, parent):
                try:
                    say(f"the process that ran this stage ({name}, pid {pid}) is gone: stopping as on SIGTERM")
                except (OSError, ValueError):  # its terminal or pipe went with it
                    pass
                os.kill(os.getpid(), signal.SIGTERM)  # the main thread unwinds as on `kill`: nothing left RUNNING
                return

    threading.Thread(target=watch, daemon=True, name="parallax-lifeline").start()
    try:
        yield
    finally:
        stop.set()


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


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def say(msg: str) -> None:
    print(textwrap.fill(redact(msg), width=100, break_long_words=False, break_on_hyphens=False), file=sys.stderr)
