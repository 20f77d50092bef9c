"""A trial's life, announced to listeners: the one way a configuration is run, by `python -m pipeline train` and by
each sweep trial alike. Each store that keeps something of a trial (MLflow, Optuna, the console, a user's own) is a
listener: a small object with a method per moment it cares about, in its own wing.

    outcome = Trial(cfg, out_dir, [MlflowListener(...), StudyRecord(...), SweepConsole(...)], How(...)).run()

The moments, in order (a listener defines only those it needs; each gets the Trial first, whose fields say what is
known: cfg, out_dir, label, bounded, run_id):

    started()           the trial is about to run (MLflow opens its run)
    noted(attrs)        something to keep was learnt (a SLURM job id and node count; MLflow's run id)
    epoch(record)       an epoch ended; a listener returning True stops the trial at this epoch's end
    ended(outcome)      how it ended, decided once (trial/outcome.py): finished, pruned, failed, requeued, fault,
                        cancelled or interrupted, with its record and reason; always last

A failure of kind in `host_faults` (the host's or the cluster's, not the trial's: a trial folder that refuses
writes, SLURM's controller gone) is a fault. A listener that raises in `ended` (a store refusing to record a
success) turns the end into a fault: no failure passes for a success. Listeners record; the owner of the trial's
queue (the sweep's worker, sweep/worker.py) decides what an outcome does to the queue, and is the trial's `judge`
at each epoch's end (pruning, a take-over).

Users add a store with `tracking.listeners` (import paths "package.module:Class", each built with the trial's
Config): every trial, in the sweep and in `train`, announces its life to it too (docs/usage.md). A parameter names a
class, never code to run: an entry is checked for its form and its origin (an installed package or this project,
never the standard library) before anything is imported, then must be a class with at least one moment
(listener_classes). One with an `epoch` method can stop a trial (STOPS), so it is part of a sweep study's identity.
A user's listener hears a TrialView, a copy it cannot change or cancel: it records, the sweep's queue decides.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import site
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from pipeline.config.loader import ConfigError
from pipeline.config.schema import LISTENER_ENTRY, LISTENER_FORM
from pipeline.trial.outcome import FAULT, INTERRUPTED, Outcome, decide, fault

MOMENTS = ("started", "noted", "epoch", "ended")
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


def run_locally(trial: Trial):
    """The runner of a trial on this host (launch.run_trial); SLURM's runner (sweep/slurm.py) takes the same Trial."""
    from pipeline.trial.launch import run_trial

    how = trial.how
    return run_trial(
        trial.cfg, trial.out_dir, on_epoch=trial.epoch_ended, progress=how.progress, timeout_s=how.timeout_s
    )


@dataclasses.dataclass(frozen=True)
class How:
    """How a trial runs: `runner(trial)` trains it and returns its record (here, or as a SLURM job); `label` names it
    on the console; `timeout_s` caps it; `host_faults`: the failure kinds that are the host's or the cluster's (a
    fault, never the trial's failure); `bounded`: why its steps are capped, "" when not (records.labels.bound).
    `judge`: the owner of the trial's queue (the sweep's worker), asked at each epoch's end whether the trial stops
    there (pruning), and once more with None after the training (it may `cancel` the trial: taken over)."""

    runner: Callable = run_locally
    label: str = ""
    progress: bool = True
    timeout_s: float | None = None
    host_faults: frozenset = frozenset()
    bounded: str = ""
    judge: Callable | None = None


class Trial:
    """One configuration `cfg`, run once into `out_dir` as `how` says, its life announced to `listeners` (then to
    those tracking.listeners names)."""

    def __init__(self, cfg, out_dir, listeners, how: How = How()):
        self.cfg, self.out_dir, self.how = cfg, Path(out_dir), how
        self.label, self.bounded = how.label, how.bounded
        self.listeners = [*listeners, *user_listeners(cfg)]
        self.owners = len(listeners)  # the first ones are the sweep's own; the rest hear a TrialView
        self.run_id: str | None = None  # its MLflow run, once one is open
        self.cancelled = ""  # why the owner of its queue cancelled it
        self.outcome: Outcome | None = None

    def announce(self, moment: str, *args) -> list:
        return [
            getattr(one, moment)(*self._heard(i, args)) for i, one in enumerate(self.listeners) if hasattr(one, moment)
        ]

    def _heard(self, i: int, args: tuple) -> tuple:
        """What listener i hears: the trial itself for the sweep's own; for a user's, a TrialView and copies of the
        records, notes and outcome (an error is passed as it is)."""
        if i < self.owners:
            return (self, *args)
        entry = type(self.listeners[i])
        return (TrialView(self, f"{entry.__module__}:{entry.__qualname__}"), *(_copied(a) for a in args))

    def note(self, attrs: dict) -> None:
        self.announce("noted", attrs)

    def cancel(self, why: str) -> None:
        self.cancelled = self.cancelled or why

    def epoch_ended(self, record: dict) -> bool:
        """Each listener hears the epoch; True (a listener's, or the judge's answer, or a cancel) stops the trial at
        this epoch's end."""
        stop = any(self.announce("epoch", record))
        if self.how.judge is not None:
            stop = bool(self.how.judge(self, record)) or stop
        return stop or bool(self.cancelled)

    def run(self) -> Outcome:
        """The trial's one outcome (outcome.decide), after every listener heard it. Nothing is raised: a failure, a
        fault or an interruption is the outcome's `error` (Outcome.record_or_raise raises it)."""
        record = error = None
        try:
            self.announce("started")
            if not self.cancelled:
                record = self._train()
        except BaseException as e:  # decided below: failed, requeued, fault or interrupted
            error = e
        return self._end(decide(record, error, self.cancelled, self.how.host_faults, self.out_dir))

    def _train(self):
        try:
            return self.how.runner(self)
        finally:
            if self.how.judge is not None:
                self.how.judge(self, None)

    def _end(self, outcome: Outcome) -> Outcome:
        """Every listener hears the outcome, each once. A listener that raises on an end turns it into a fault,
        which every listener then hears, whatever the others do; where a user's store raised, the end the sweep's own
        stores held before it stands (Outcome.stands): one outcome per trial."""
        for i, one in enumerate(self.listeners):
            if not hasattr(one, "ended"):
                continue
            try:
                one.ended(*self._heard(i, (outcome,)))
            except Exception as e:
                if outcome.kind in (FAULT, INTERRUPTED):
                    continue  # a store that is failing: the fault is being reported already
                return self._end(fault(e, stands=outcome if i >= self.owners else None))
        self.outcome = outcome
        return outcome


def _copied(arg):
    """An argument as a user's listener hears it: a record, a note or an outcome copied (an error as it is)."""
    if isinstance(arg, Outcome):
        return dataclasses.replace(arg, record=copy.deepcopy(arg.record), stands=None)
    return copy.deepcopy(arg) if isinstance(arg, (dict, list)) else arg


class TrialView:
    """A trial as a user's listener (tracking.listeners) hears it: the fields a moment knows, copied, read-only.
    It has no cancel: a user's store records; only the sweep's queue decides a trial's outcome."""

    FIELDS = ("cfg", "out_dir", "label", "bounded", "run_id")

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
