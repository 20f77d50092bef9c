"""How a trial's processes start: fork, spawn, or a forkserver that has torch loaded already.

Every trial runs in processes of its own (ranks.py: the isolation that makes time budgets and clean device state
possible). What that costs per trial is the start: `spawn` starts a fresh interpreter that imports torch and
torch._dynamo (every optimizer imports it, torch/_compile.py) and tears them down again, 2-4 s a trial on a 2-core
CPU; `fork` copies the caller, which has them loaded, but a process that has touched CUDA cannot fork a usable child.
`forkserver` (auto on GPUs) is the third way: Python's multiprocessing starts one small server process per command,
which imports torch, torch._dynamo and the rank entry once and never touches CUDA; each rank of each trial is a fork
of that server, so it starts with everything loaded and may initialise CUDA itself, and it ends with `os._exit`
(multiprocessing's own forkserver child), skipping the interpreter's teardown. Isolation is that of spawn: a rank
shares no Python state with the caller, and a trial leaves nothing in the server (each rank is a fresh fork of it).

The server is started early (`start_early`, before the caller imports torch itself), so its imports run beside the
caller's on a second core. Its environment is the caller's at that moment: what the caller changes later (a trial's
cache folders, `doctor --dump-events`) reaches each rank through `env_delta` / `apply_env`.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os

# what every rank imports before its first step beside the rank entry: loaded in the server (preload.py) and, with
# fork, in the caller
IMPORTS = ("torch", "torch._dynamo")  # torch._dynamo: every optimizer imports it (torch/_compile.py)

_SERVER_ENV: dict[str, str] | None = None  # os.environ when this process started its forkserver


def resolve(method: str, kind: str) -> str:
    """The start method a trial uses: `method` as configured (train.start_method), auto = forkserver on GPUs (a
    process that has touched CUDA cannot fork), fork on CPU (the caller's loaded data and modules are shared)."""
    if method != "auto":
        return method
    return "forkserver" if kind == "cuda" else "fork"


def start_early(method: str, heavy_modules=()) -> None:
    """Start this process's forkserver now, with preload.py and `heavy_modules` imported in it, when `method` may
    resolve to forkserver; it then loads them while the caller does its own set-up. Idempotent."""
    global _SERVER_ENV
    if method not in ("forkserver", "auto") or _SERVER_ENV is not None:
        return
    if method == "auto" and not _cuda_likely():
        return
    multiprocessing.set_forkserver_preload(["pipeline.trial.preload", *heavy_modules])
    _SERVER_ENV = dict(os.environ)
    multiprocessing.forkserver.ensure_running()


def _cuda_likely() -> bool:
    """Whether auto will resolve to forkserver, guessed without importing torch (the point is to start before it): an
    NVIDIA driver's device node. A wrong guess costs nothing: the server then starts when the first trial needs it."""
    return os.path.exists("/dev/nvidiactl")


def prepare(method: str, heavy_modules=()) -> None:
    """Before launching a trial's ranks with `method` (resolved): what they need loaded, loaded where they start."""
    if method == "forkserver":
        start_early("forkserver", heavy_modules)
    elif method == "fork":  # once per process, inherited by every forked rank of every trial
        import importlib

        for module in (*IMPORTS, *heavy_modules):
            importlib.import_module(module)


def prepared(method: str, heavy_modules=()) -> str:
    """`method`, prepared: for a caller that launches ranks of its own through the elastic launcher."""
    prepare(method, heavy_modules)
    return method


def server_pids() -> list[int]:
    """This process's forkserver, while it runs: its ranks' CPU time is the trial's own (measure/interference.py).
    Python names the server's PID in a private attribute only."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    return [pid] if pid else []


def env_delta(method: str) -> dict[str, tuple[str | None, str | None]]:
    """The caller's environment changes since its forkserver started, {name: (then, now)}: empty unless `method` is
    forkserver (fork and spawn take the caller's current environment)."""
    if method != "forkserver" or _SERVER_ENV is None:
        return {}
    now = dict(os.environ)
    return {
        k: (_SERVER_ENV.get(k), now.get(k)) for k in _SERVER_ENV.keys() | now.keys() if _SERVER_ENV.get(k) != now.get(k)
    }


def apply_env(delta: dict[str, tuple[str | None, str | None]]) -> None:
    """In a rank: take the caller's changes, except where the launcher set a variable of its own for this rank (its
    value then differs from the server's)."""
    for name, (then, now) in delta.items():
        if os.environ.get(name) != then:
            continue
        if now is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = now
