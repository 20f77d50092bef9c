"""MLflow tracking: the only importer of mlflow in the package.

Store: sqlite:///<root>/mlruns/mlflow.db with artifacts in <root>/mlruns/artifacts, at paths.store_root(): the
parent repository under DVC's temp and queued executors too, so every experiment's runs land in one store. Runs
are written through MlflowClient with explicit run ids (no global "active run"), so a crashed trial can always be
ended with a status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline import scratch
from pipeline.env import env_flag
from pipeline.errors import StoreError
from pipeline.paths import repo_root, store_root
from pipeline.preflight import check_store, store_url
from pipeline.redact import redact
from pipeline.tracking import metric_names, server_wait
from pipeline.tracking.store_checks import check_artifacts, half_made

RUNNING = "RUNNING"
# MLflow 3's UI reads this experiment tag to choose its view: without it an experiment opens on the GenAI "Traces"
# overview; "custom_model_development" (mlflow/server/js: ExperimentKind.CUSTOM_MODEL_DEVELOPMENT) opens the runs table
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # no "View run at" line per ended run
# MLflow 3 sends usage telemetry to its servers from a background thread unless told not to; a research pipeline
# on a cluster should not phone home for its users (set MLFLOW_DISABLE_TELEMETRY=false to allow it)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def tracking_uri(cfg) -> str:
    """tracking.uri, a relative SQLite path resolved against the store root; empty = mlruns/mlflow.db there."""
    return store_url(cfg.tracking.uri, "tracking.uri", "mlflow.db")


def ui_command(cfg) -> str:
    """The command that opens this store's runs in MLflow's UI, for every place that names the store. A bare `mlflow
    ui` opens MLflow 3's default ./mlflow.db (./mlruns only where that holds a file store), and reads no file of the
    project: only --backend-store-uri, or MLFLOW_BACKEND_STORE_URI in the user's environment, names another store.
    A SQLite store under the current directory is named from it (`sqlite:///mlruns/mlflow.db`, run from the
    repository root), one elsewhere by its absolute path; a server is opened in a browser; another database through
    `make ui`, which hands tracking.uri (a password too) to MLflow by the environment."""
    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return f"open {redact(uri)} in a browser"
    if not uri.startswith("sqlite:///"):
        return "make ui"
    path = Path(uri[len("sqlite:///") :])
    if path.is_absolute() and path.is_relative_to(Path.cwd().resolve()):
        path = path.relative_to(Path.cwd().resolve())
    return f"mlflow ui --backend-store-uri sqlite:///{path}"


def experiment_name(cfg) -> str:
    return cfg.tracking.experiment or f"parallax-{cfg.profile}"


def git_sha() -> str:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def entry_point() -> str:
    """The command that makes this process's runs, as MLflow's Source column shows it: `python -m pipeline sweep`
    (the module and its subcommand, never the options: a --set may hold a URL's password); another program's file
    as MLflow names it (sys.argv[0])."""
    import pipeline

    main = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    package = Path(pipeline.__file__).resolve().parent
    if main is None or main.suffix != ".py" or not main.is_relative_to(package):
        return sys.argv[0] if main is not None else "<console>"
    parts = main.relative_to(package.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
    sub = sys.argv[1] if len(sys.argv) > 1 and re.fullmatch(r"[a-z][a-z_-]*", sys.argv[1]) else ""
    return f"python -m {module}" + (f" {sub}" if sub else "")


@functools.cache
def _context_tags() -> tuple:
    from mlflow.tracking.context.registry import resolve_tags

    return tuple(resolve_tags().items())


def source_tags() -> dict:
    """MLflow's own provenance tags, which mlflow.start_run sets and MlflowClient.create_run leaves out: the runs
    table's User and Source columns and the run page's git commit. MLflow's context registry resolves them
    (mlflow.user, mlflow.source.type LOCAL, mlflow.source.git.commit/branch/repoURL from sys.argv[0]'s repository,
    credentials stripped); Parallax names the source by its command (`entry_point`) and takes the commit of the
    checkout being run (a DVC executor's temp checkout too: git_sha), where MLflow would leave it out."""
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME

    tags = dict(_context_tags())
    tags[MLFLOW_SOURCE_NAME] = entry_point()
    if (sha := git_sha()) != "unknown":
        tags[MLFLOW_GIT_COMMIT] = sha
    return tags


PIPELINE_RUN_TAG = "parallax.pipeline_run"


def pipeline_run() -> str:
    """The pipeline run a run belongs to, the same for every stage of one run: the DVC experiment's name where
    `dvc exp run` sets DVC_EXP_NAME, else PARALLAX_PIPELINE_RUN where a user sets one, else the workspace at its
    git revision ("workspace@1a2b3c4")."""
    return os.environ.get("DVC_EXP_NAME") or os.environ.get("PARALLAX_PIPELINE_RUN") or f"workspace@{git_sha()[:7]}"


class Tracker:
    """One MLflow experiment; creates the store once (before any parallel writer) and the experiment if needed."""

    def __init__(self, cfg):
        import mlflow
        from mlflow.tracking import MlflowClient

        system_metrics_on(cfg)  # a switch MLflow cannot read refuses the command before any run exists
        uri = tracking_uri(cfg)
        check_store(uri, "tracking.uri")  # unreachable, corrupt or unwritable: fails now, in seconds
        mlflow.set_tracking_uri(uri)
        self.uri = uri
        name = experiment_name(cfg)
        server_wait.bound(uri)  # every request bounded, each retry said (an MLflow server's)
        try:
            with server_wait.first_contact():
                self.client = MlflowClient(tracking_uri=uri)
                exp = self._get_or_create(name, cfg)
        except StoreError:
            raise
        except Exception as e:  # a server that answers but is not MLflow, a schema MLflow cannot migrate, ...
            if cut_short := half_made(uri, e):
                raise StoreError(cut_short) from None
            raise StoreError(
                f"Cannot use the MLflow tracking store {redact(uri)} (tracking.uri): {type(e).__name__}: "
                f"{redact((str(e).strip().splitlines() or [''])[0][:300])}. Check that it is an MLflow tracking "
                f"server or database of a supported version (docs/scale-out.md), or leave tracking.uri empty for "
                f"the local store in mlruns/. Nothing was run."
            ) from None
        self.experiment_id = exp.experiment_id
        self.name = name
        check_artifacts(exp.artifact_location or "", name)
        self._end_orphaned_runs()

    def _get_or_create(self, name, cfg):
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            artifacts = None
            if self.uri.startswith("sqlite:///") or "://" not in self.uri:
                artifacts = (store_root() / "mlruns" / "artifacts").as_uri()
            try:
                self.client.create_experiment(
                    name, artifact_location=artifacts, tags={"profile": cfg.profile, **EXPERIMENT_KIND}
                )
            except Exception:  # another worker created it first
                pass
            exp = self.client.get_experiment_by_name(name)
        if exp.lifecycle_stage == "deleted":
            i = exp.experiment_id
            raise StoreError(
                f"The MLflow experiment {name!r} (id {i}) in {redact(self.uri)} (tracking.uri) is deleted: it is in "
                f"MLflow's trash (deleted in the UI or by `mlflow experiments delete`), where no run can be added "
                f"and no experiment of that name made. Restore it with its runs: MLFLOW_TRACKING_URI="
                f"{redact(self.uri)} mlflow experiments restore --experiment-id {i}; or remove it for good: mlflow "
                f"gc --backend-store-uri {redact(self.uri)} --experiment-ids {i}; or set tracking.experiment to "
                f"another name. Nothing was run."
            )
        for k, v in EXPERIMENT_KIND.items():
            if exp.tags.get(k) is None:  # an experiment made before the tag was set (or by another tool)
                self.client.set_experiment_tag(exp.experiment_id, k, v)
        return exp

    # --- runs ---------------------------------------------------------------------------------------
    def start_run(self, name: str, tags: dict, parent_id: str | None = None, owned: bool = True) -> str:
        """A run with `tags` and MLflow's own provenance tags (source_tags). owned: the run ends with this process
        (ended KILLED by a later command if the process dies first); False for a run that several processes share,
        whose end is theirs to decide (a study's parent run)."""
        tags = {**source_tags(), **{k: str(v) for k, v in tags.items() if v is not None}}
        if owned:
            tags.update({"parallax.pid": str(os.getpid()), "parallax.host": scratch.host_tag()})
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def log_metrics(self, run_id: str, metrics: dict, step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(k, float(v), now, step or 0)
            for k, v in metrics.items()
            if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        if batch:
            self.client.log_batch(run_id, metrics=batch)

    def set_tags(self, run_id: str, tags: dict) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v is not None])

    def log_dataset(self, run_id: str, cfg, context: str = "train") -> None:
        """The trial's data as an MLflow input (the runs table's Datasets column): named by its source, with the
        data files' checksum from data.dir/manifest.json as digest, so real and synthetic data never look alike."""
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.data.sources import LocalArtifactDatasetSource
        from mlflow.entities import DatasetInput, InputTag

        root = Path(cfg.data.dir)
        root = root if root.is_absolute() else repo_root() / root
        name = "synthetic" if cfg.data.source == "synthetic" else "fashion-mnist"
        ds = MetaDataset(LocalArtifactDatasetSource(str(root)), name=name, digest=data_digest(root))
        inputs = [DatasetInput(ds._to_mlflow_entity(), [InputTag("mlflow.data.context", context)])]
        # MLflow's SQL store looks a dataset up, then inserts it: two sweep workers logging the same data at the same
        # moment both insert, and the later one fails on the datasets table's unique key. The row exists by then, so
        # the same call again finds it and only links this run to it.
        for attempt in range(3):
            try:
                return self.client.log_inputs(run_id, inputs)
            except Exception as e:
                if attempt == 2 or not _is_integrity_error(e):
                    raise

    def log_artifact(self, run_id: str, path, subdir: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), subdir)

    def log_artifacts(self, run_id: str, path, subdir: str | None = None) -> None:
        self.client.log_artifacts(run_id, str(path), subdir)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)

    def close_run(self, run_id: str, status: str, reason: str = "") -> None:
        """End a run with its status and, for one that did not finish, the reason as tag `failure`. When the store
        itself fails, a run that did not finish is left as it is (the fault is being reported); a FINISHED one
        raises, so that no failure passes for a success."""
        try:
            if reason:
                self.set_tags(run_id, {"failure": redact(reason)[:5000]})
            self.end_run(run_id, status)
        except Exception:
            if status == "FINISHED":
                raise

    def status(self, run_id: str) -> str | None:
        """The run's state as the store holds it now, or None when the store cannot be read."""
        try:
            return self.client.get_run(run_id).info.status
        except Exception:
            return None

    def is_running(self, run_id: str) -> bool:
        """Whether the store holds the run as RUNNING now; a store that cannot be read raises (status() says None)."""
        return self.client.get_run(run_id).info.status == RUNNING

    def reopen(self, run_id: str) -> None:
        """Mark the run RUNNING unless it is: a study's parent run that a stopped worker ended, joined again by a
        rerun. A store that cannot be read or written raises."""
        if not self.is_running(run_id):
            self.client.update_run(run_id, status=RUNNING)

    def run_name(self, run_id: str) -> str:
        """The run's name as the runs table shows it."""
        return self.client.get_run(run_id).info.run_name

    def rename(self, run_id: str, name: str) -> None:
        self.client.update_run(run_id, name=name)

    def local_artifacts(self, run_id: str | None = None) -> Path | None:
        """The local folder of a run's artifacts (or of the experiment's), or None for a remote artifact store."""
        from urllib.parse import unquote, urlsplit

        try:
            uri = (
                self.client.get_run(run_id).info.artifact_uri
                if run_id
                else self.client.get_experiment(self.experiment_id).artifact_location
            )
        except Exception:
            return None
        parts = urlsplit(uri)
        return Path(unquote(parts.path)) if parts.scheme in ("", "file") else None

    def find_runs(self, filter_string: str) -> list:
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, max_results=10000)

    def _end_orphaned_runs(self) -> None:
        """End KILLED the RUNNING runs this host's processes opened and that process no longer runs (a SIGKILLed
        train, analyze or sweep): MLflow would show them RUNNING for good. Runs of other hosts are left alone."""
        try:
            runs = self.find_runs(f"tags.`parallax.host` = '{scratch.host_tag()}' and attributes.status = 'RUNNING'")
            for r in runs:
                pid = r.data.tags.get("parallax.pid", "")
                if pid.isdigit() and not scratch.alive(int(pid)):
                    self.set_tags(r.info.run_id, {"parallax.ended_by": f"its process ({pid}) died: killed"})
                    self.end_run(r.info.run_id, "KILLED")
        except Exception:  # a repair only: a store that fails is reported by the command's own first write
            pass

    def end_stale_runs(self, filter_string: str, status: str = "KILLED") -> int:
        """End RUNNING runs left behind by a killed process (matched by filter); returns how many."""
        runs = self.find_runs(f"{filter_string} and attributes.status = 'RUNNING'")
        for r in runs:
            self.set_tags(r.info.run_id, {"parallax.ended_by": "resume: its process died"})
            self.end_run(r.info.run_id, status)
        return len(runs)


def base_tags(planned, cfg, stage: str | None = None) -> dict:
    """A trial run's tags when it starts: the planned trial record's (pipeline.records.trial.planned) and where it
    was run from."""
    return {
        **planned.tags(),
        "profile": cfg.profile,
        PIPELINE_RUN_TAG: pipeline_run(),
        "dvc_stage": stage or ("" if not os.environ.get("DVC_ROOT") else "unknown"),
    }


def data_digest(root) -> str | None:
    """A checksum of the data files (the md5s in manifest.json), or None without a manifest (MLflow then digests
    the dataset's name and source)."""
    import hashlib

    try:
        files = json.loads((Path(root) / "manifest.json").read_text())["files"]
        key = "".join(f"{n}:{files[n]['md5']}\n" for n in sorted(files))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def epoch_metrics(record: dict) -> dict:
    return metric_names.epoch_metrics(record)


def summary_metrics(summary: dict) -> dict:
    """The analysis run's metrics: summary.json's counts and each strategy's headline numbers (metric_names)."""
    return metric_names.analysis_metrics(summary)


SYSTEM_METRICS_ENV = "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"  # MLflow's own switch (mlflow.environment_variables)


def system_metrics_on(cfg) -> bool:
    """Whether trial runs sample MLflow's system metrics: tracking.system_metrics, or MLflow's own switch
    MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING set true, as MLflow users turn them on; either turns them on, and the
    variable set false does not turn off what tracking.system_metrics asks for. A value MLflow does not read as true
    or false is a ConfigError naming the variable (Tracker checks it before a run is made)."""
    return cfg.tracking.system_metrics or bool(
        env_flag(SYSTEM_METRICS_ENV, "MLflow's system metrics on (as tracking.system_metrics: true does)")
    )


def this_node() -> str:
    """The label of the system metrics this process samples: SLURM's name for its node inside a job
    (SLURMD_NODENAME), else the host's name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


@dataclasses.dataclass(frozen=True)
class SystemMetrics:
    """Where a trial's system metrics go: run `run_id` in the store at `uri`, a sample every `interval_s`. Picklable,
    so that each node of a SLURM job samples its own host into the run the sweep opened on the login node."""

    run_id: str
    uri: str
    interval_s: float


def system_metrics_target(cfg, run_id: str | None) -> SystemMetrics | None:
    """Where run `run_id`'s system metrics go, decided where the run is opened (the switch read there); None when
    they are off (system_metrics_on) or there is no run."""
    if not (run_id and system_metrics_on(cfg)):
        return None
    return SystemMetrics(run_id, tracking_uri(cfg), cfg.tracking.system_metrics_interval_s)


@contextlib.contextmanager
def sampling(target: SystemMetrics | None, node: str | None = None):
    """MLflow's system metrics of this host (system/<node>/cpu_utilization_percentage,
    system/<node>/system_memory_usage_megabytes, disk, network and, where pynvml finds NVIDIA GPUs,
    system/<node>/gpu_N_*) sampled into `target`'s run while the block runs. `node` (default: this_node(); MLflow's
    own MLFLOW_SYSTEM_METRICS_NODE_ID wins) is MLflow's node_id: each node of a multi-node trial has keys of its own.
    They describe the whole host (every process), beside the trial's own per-device allocator peaks
    (peak_mem_mib_devN), never instead. `target` None: nothing is sampled."""
    if target is None:
        yield None
        return
    try:
        import psutil  # noqa: F401  (MLflow's CPU monitor needs it)
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError as e:
        print(
            f"system metrics are on (tracking.system_metrics or {SYSTEM_METRICS_ENV}) but {e.name} is not "
            f"installed (pip install -e '.[pipeline]' in the Parallax checkout; '.[gpu]' adds GPU metrics): this run "
            f"has no system metrics",
            file=sys.stderr,
        )
        yield None
        return
    monitor = SystemMetricsMonitor(
        target.run_id, sampling_interval=target.interval_s, node_id=node or this_node(), tracking_uri=target.uri
    )
    monitor.start()
    try:
        yield monitor
    finally:
        monitor.finish()


def system_metrics(cfg, run_id: str | None, node: str | None = None):
    """With system metrics on (system_metrics_on: tracking.system_metrics or MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING),
    this host's sampled into run `run_id` every tracking.system_metrics_interval_s while the block runs (sampling)."""
    return sampling(system_metrics_target(cfg, run_id), node)


def log_completed_run(tracker: Tracker, run_id: str, record, out_dir: Path) -> None:
    """Everything a finished trial leaves in its run: its record's metrics (metric_names.trial_metrics, at the last
    epoch's step, after the learning curves), its step-time breakdown as one table and each rank's sampled step as a
    Chrome trace (`trace/rank<R>.pt.trace.json`, from the trial directory or, under SLURM, its node folders), its tags
    (records/trial.py), and the metrics file."""
    tracker.log_metrics(run_id, metric_names.trial_metrics(record), step=len(record.test_acc or []))
    table = metric_names.breakdown_table(record)
    if table:
        tracker.client.log_table(run_id, data=table, artifact_file=metric_names.BREAKDOWN_FILE)
    for trace in sorted(out_dir.glob(metric_names.TRACES)) + sorted(out_dir.glob(f"node*/{metric_names.TRACES}")):
        tracker.log_artifact(run_id, trace, metric_names.TRACE_DIR)
    tracker.set_tags(run_id, record.tags())
    if (out_dir / "metrics.json").exists():
        tracker.log_artifact(run_id, out_dir / "metrics.json")


def _is_integrity_error(e: BaseException | None) -> bool:
    """A unique-key violation anywhere in the exception's chain (SQLAlchemy's IntegrityError, however it is wrapped)."""
    seen = set()
    while e is not None and id(e) not in seen:
        text = str(e)  # SQLite's words, or PostgreSQL's as an MLflow server passes them on (a RestException)
        if type(e).__name__ == "IntegrityError" or "UNIQUE constraint failed" in text or "UniqueViolation" in text:
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
