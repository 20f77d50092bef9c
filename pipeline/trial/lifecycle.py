"""A trial's life, announced to listeners: the one way a configuration is run, by `python -m pipeline train` and by
each sweep trial alike. Each store that keeps something of a trial (MLflow, Optuna, the console, a user's own) is a
listener: a small object with a method per moment it cares about, in its own wing.

    record = Trial(cfg, out_dir, [MlflowListener(...), StudyListener(...), SweepConsole(...)]).run()

The moments, in order (a listener defines only those it needs; each gets the Trial first, whose fields say what is
known: cfg, out_dir, label, bounded, run_id, record, untimed, flagged):

    claimed()           before anything else
    started()           the trial is about to run (MLflow opens its run)
    noted(attrs)        a runner learnt something to keep (a SLURM job id and node count; MLflow's run id)
    epoch(record)       an epoch ended; a listener returning True stops the trial at this epoch's end (pruning)
    ran()               the training ended, by any way
    flagged(reason)     the trial ran under interference (measure/interference.py)
    finished(record)    the trial's record (record["stopped"]: stopped early, e.g. pruned)
    failed(error)       the trial failed by itself (a TrialFailed): the Trial then raises it
    cancelled(why)      a listener cancelled the trial (Trial.cancel: another worker took it over); nothing is kept
    stopped(error, why, interrupted)   a fault or Ctrl-C: the trial runs again; the Trial then raises the error
    closed()            always last

A failure of kind in `host_faults` (the host's or the cluster's, not the trial's: a trial folder that refuses
writes, SLURM's controller gone) is a fault, announced as stopped. A listener that raises in finished (a store
refusing to record a success) turns the end into stopped: no failure passes for a success. Listeners record; the
owner of the trial's queue decides (the sweep's study listener): a trial whose end it already holds keeps that end
when a later listener raises, so each trial has one outcome.

Users add a store with `tracking.listeners` (import paths "package.module:Class", each built with the trial's
Config): every trial, in the sweep and in `train`, announces its life to it too (docs/usage.md). A parameter names a
class, never code to run: an entry is checked for its form and its origin (an installed package or this project,
never the standard library) before anything is imported, then must be a class with at least one moment
(listener_classes). One with an `epoch` method can stop a trial (STOPS), so it is part of a sweep study's identity.
A user's listener hears a TrialView, a copy it cannot change or cancel: it records, the sweep's queue decides.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import importlib.util
import inspect
import site
import sys
import sysconfig
from pathlib import Path

from pipeline.config.loader import ConfigError
from pipeline.config.schema import LISTENER_ENTRY, LISTENER_FORM
from pipeline.errors import TrialFailed, interruption
from pipeline.records import files
from pipeline.store_faults import root_cause

MOMENTS = (
    "claimed",
    "started",
    "noted",
    "epoch",
    "ran",
    "flagged",
    "finished",
    "failed",
    "cancelled",
    "stopped",
    "closed",
)
STOPS = "epoch"  # the moment whose answer stops a trial: a listener that has it can stop trials (pruning does)
PROJECT = Path(__file__).resolve().parents[2]  # the checkout this package is loaded from


def user_listeners(cfg) -> list:
    """The listeners tracking.listeners names, each built with the trial's Config; one that cannot be loaded or built
    is a ConfigError naming it (the sweep checks them before it opens a store)."""
    built = []
    for path, cls in listener_classes(cfg):
        try:
            built.append(cls(cfg))
        except Exception as e:  # the store's own set-up (a connection, a file): named, never "unexpected"
            raise _refused(path, f"cannot be built with the trial's Config ({type(e).__name__}: {e})") from None
    return built


def stopping_listeners(cfg) -> list[str]:
    """The tracking.listeners entries that can stop a trial (they have an `epoch` method): part of a study's
    identity, since a point one of them stopped is measured only by a study without it."""
    return [path for path, cls in listener_classes(cfg) if callable(getattr(cls, STOPS, None))]


def listener_classes(cfg) -> list[tuple[str, type]]:
    """Each tracking.listeners entry with its class. Its form and its module's origin are checked before anything
    is imported (a module's top-level code runs on import): a class name, from an installed package or this project,
    never the standard library; after the import, a class with at least one moment. Else a ConfigError naming it."""
    out = []
    for path in cfg.tracking.listeners:
        if not isinstance(path, str) or not LISTENER_ENTRY.fullmatch(path):
            raise _refused(path, f"is not {LISTENER_FORM}")
        module, _, name = path.partition(":")
        if why := _foreign(module.partition(".")[0]):
            raise _refused(path, f"{why}; nothing was imported")
        try:
            cls = getattr(importlib.import_module(module), name)
        except Exception as e:  # ImportError, AttributeError, or whatever its top-level code raised
            raise _refused(path, f"cannot be loaded ({type(e).__name__}: {e})") from None
        if not inspect.isclass(cls):
            raise _refused(path, f"is a {type(cls).__name__}, not a class")
        if _stdlib(cls.__module__.partition(".")[0]):
            raise _refused(path, f"is the standard library's class {cls.__module__}.{cls.__qualname__}")
        if not any(callable(getattr(cls, m, None)) for m in MOMENTS):
            raise _refused(path, f"has none of a listener's moments ({', '.join(MOMENTS)})")
        out.append((path, cls))
    return out


def _refused(path, why: str) -> ConfigError:
    return ConfigError(
        f"tracking.listeners: {path!r} {why}. Each entry is 'package.module:Class', a class of an installed package "
        f"or of this project ({PROJECT}) with a method per moment it hears, taking the trial's Config (docs/usage.md)"
    )


def _stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names or top == "__main__"


def _foreign(top: str) -> str:
    """Why the top-level module `top` is no place for a listener, read without importing it; "" when it is one."""
    if _stdlib(top):
        return f"names the standard library's module {top!r}"
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: finds its file, runs nothing
    except (ImportError, ValueError) as e:
        return f"cannot be loaded ({type(e).__name__}: {e})"
    if spec is None:
        return f"cannot be loaded (no module named {top!r})"
    if spec.origin in ("built-in", "frozen"):
        return f"names the interpreter's {spec.origin} module {top!r}"
    places = [Path(p).resolve() for p in (spec.submodule_search_locations or [spec.origin]) if p]
    installed = [Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]]
    stdlib = [Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")]

    def under(place, roots):
        return any(place.is_relative_to(r) for r in roots)

    for place in places:  # site-packages lie under the standard library's folder outside a virtualenv: first
        if under(place, installed):
            continue
        if under(place, stdlib):
            return f"names the standard library's module {top!r} ({place})"
        if under(place, [PROJECT]) or top in importlib.metadata.packages_distributions():  # or installed editable
            continue
        return f"is a module at {place}, neither an installed package nor part of this project"
    return ""


def run_locally(tcfg, out_dir, on_epoch=None, progress=True, timeout_s=None, label="", note=None):
    """The runner of a trial on this host (launch.run_trial); SLURM's runner has the same signature."""
    from pipeline.trial.launch import run_trial

    return run_trial(tcfg, out_dir, on_epoch=on_epoch, progress=progress, timeout_s=timeout_s)


class Trial:
    """One configuration `cfg`, run once into `out_dir` by `runner`, its life announced to `listeners` (then to
    those tracking.listeners names). `bounded`: why its steps are capped, "" when not (records.labels.bound)."""

    def __init__(
        self,
        cfg,
        out_dir,
        listeners,
        *,
        runner=run_locally,
        label: str = "",
        progress: bool = True,
        timeout_s: float | None = None,
        host_faults=(),
        bounded: str = "",
    ):
        self.cfg, self.out_dir, self.label, self.bounded = cfg, Path(out_dir), label, bounded
        self.listeners = [*listeners, *user_listeners(cfg)]
        self.owners = len(listeners)  # the first ones are the sweep's own; the rest hear a TrialView
        self.runner, self.progress, self.timeout_s, self.host_faults = runner, progress, timeout_s, set(host_faults)
        self.run_id: str | None = None  # its MLflow run, once one is open
        self.record = None
        self.untimed = ""  # why the record has no throughput (measure.meter.untimed), "" when it has one
        self.flagged = ""  # why it counts as measured under interference, "" when it does not
        self.cancelled = ""  # why a listener cancelled it

    def announce(self, moment: str, *args) -> list:
        return [
            getattr(one, moment)(*self._heard(i, args)) for i, one in enumerate(self.listeners) if hasattr(one, moment)
        ]

    def _heard(self, i: int, args: tuple) -> tuple:
        """What listener i hears: the trial itself for the sweep's own; for a user's, a TrialView and copies of the
        records and notes (an error is passed as it is)."""
        if i < self.owners:
            return (self, *args)
        entry = type(self.listeners[i])
        return (
            TrialView(self, f"{entry.__module__}:{entry.__qualname__}"),
            *(copy.deepcopy(a) if isinstance(a, (dict, list)) else a for a in args),
        )

    def note(self, attrs: dict) -> None:
        self.announce("noted", attrs)

    def cancel(self, why: str) -> None:
        self.cancelled = self.cancelled or why

    def _epoch(self, record: dict) -> bool:
        return any(self.announce("epoch", record)) or bool(self.cancelled)

    def run(self):
        """The trial's record; None when cancelled. Raises its TrialFailed after `failed`, or the fault or
        interruption after `stopped`."""
        try:
            self.announce("claimed")
            self.announce("started")
            try:
                if not self.cancelled:
                    record = self._train()
            except TrialFailed as e:
                failure = e if e.kind in self.host_faults else on_a_full_disk(e, self.out_dir)
                if failure.kind in self.host_faults:
                    raise failure from None
                if not self.cancelled:
                    self.announce("failed", failure)
                    raise failure from None
            if self.cancelled:
                self.announce("cancelled", self.cancelled)
                return None
            self._finish(record)
            return record
        except TrialFailed as e:
            if e.kind not in self.host_faults:
                raise  # failed, and announced as such
            self._stop(e)
            raise
        except BaseException as e:
            self._stop(e)
            signalled = interruption(e)
            if signalled is None or isinstance(e, KeyboardInterrupt):
                raise  # as it is: its chain names the root cause (store_faults.root_cause)
            raise signalled from None  # a signal torch's launcher caught, as the Interrupted it is
        finally:
            self.announce("closed")

    def _train(self):
        try:
            return self.runner(
                self.cfg,
                self.out_dir,
                on_epoch=self._epoch,
                progress=self.progress,
                timeout_s=self.timeout_s,
                label=self.label,
                note=self.note,
            )
        finally:
            self.announce("ran")

    def _finish(self, record) -> None:
        from pipeline.measure import meter

        self.record = record
        self.untimed = "" if record["stopped"] else meter.untimed(record)
        interference = record.get("interference") or {}
        if interference.get("interfered"):
            self.flagged = interference.get("interference_reason") or "measured under load"
            self.announce("flagged", self.flagged)
        self.announce("finished", record)

    def _stop(self, e: BaseException) -> None:
        """Every listener hears of a fault or an interruption, each once, whatever the others do."""
        signalled = interruption(e)  # Ctrl-C, or a signal torch's launcher caught as SignalException
        interrupted = signalled is not None
        e = e if isinstance(e, KeyboardInterrupt) else signalled or e
        host = isinstance(e, TrialFailed) and e.kind in self.host_faults
        why = (
            f"interrupted ({e or type(e).__name__})"
            if interrupted
            else f"{e.kind}: {e}"
            if host
            else f"error: {root_cause(e)}"
        )
        for i, one in enumerate(self.listeners):
            if hasattr(one, "stopped"):
                try:
                    one.stopped(*self._heard(i, ()), e, why, interrupted)
                except Exception:  # a store that is failing: the fault is being reported already
                    pass


class TrialView:
    """A trial as a user's listener (tracking.listeners) hears it: the fields a moment knows, copied, read-only.
    It has no cancel: a user's store records; only the sweep's queue decides a trial's outcome."""

    FIELDS = ("cfg", "out_dir", "label", "bounded", "run_id", "record", "untimed", "flagged")

    def __init__(self, trial: Trial, entry: str):
        for name in self.FIELDS:
            object.__setattr__(self, name, copy.deepcopy(getattr(trial, name)))
        object.__setattr__(self, "_entry", entry)

    def __setattr__(self, name, value):
        raise AttributeError(f"tracking.listeners: {self._entry!r} cannot set the trial's {name}: it hears a copy")

    def cancel(self, why: str) -> None:
        raise ConfigError(
            f"tracking.listeners: {self._entry!r} cancelled a trial ({why!r}): a user's listener records what it "
            "hears and cannot cancel a trial; to stop one early, return True from its `epoch` (docs/usage.md)"
        )


def on_a_full_disk(failed: TrialFailed, out_dir: Path) -> TrialFailed:
    """A trial failed some other way whose folder now refuses a write: the host's failure after all (in a multi-process
    trial the launcher may report a peer of the rank whose write failed, as worker_died), so its point is kept."""
    from pipeline.trial.ranks import UNWRITABLE

    if failed.kind == UNWRITABLE:
        return failed
    refused = files.refuses_writes(out_dir)
    if refused is None:
        return failed
    return TrialFailed(
        f"the host could not write the trial directory {out_dir} ({refused}); the trial itself ended "
        f"{failed.kind}: {failed}",
        UNWRITABLE,
    )
