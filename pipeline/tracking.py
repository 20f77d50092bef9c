"""MLflow tracking: the only importer of mlflow in the package.

Store: sqlite:///<repo>/mlruns/mlflow.db with artifacts in <repo>/mlruns/artifacts, anchored at the repository
root ($DVC_ROOT under DVC, so `dvc exp run --temp` loses nothing). Runs are written through MlflowClient with
explicit run ids (no global "active run"), so a crashed trial can always be ended with a status.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import time
from pathlib import Path

from .config import repo_root
from .errors import StoreError, redact
from .preflight import check_store

RUNNING = "RUNNING"
# MLflow 3's UI reads this experiment tag to choose its view: without it an experiment opens on the GenAI "Traces"
# overview; "custom_model_development" (mlflow/server/js: ExperimentKind.CUSTOM_MODEL_DEVELOPMENT) opens the runs table
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
MIB = 2**20
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # no "View run at" line per ended run
# MLflow 3 sends usage telemetry to its servers from a background thread unless told not to; a research pipeline
# on a cluster should not phone home for its users (set MLFLOW_DISABLE_TELEMETRY=false to allow it)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@contextlib.contextmanager
def _first_contact():
    """MLflow's HTTP client retries 7 times over about two minutes, and waits 120 s per request: right for a long
    sweep against a busy server, wrong for the first request, which should say at once that nobody answers."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    saved = {k: os.environ.get(k) for k in quick}
    os.environ.update({k: v for k, v in quick.items() if saved[k] is None})  # the user's settings win
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def tracking_uri(cfg) -> str:
    return cfg.tracking.uri or f"sqlite:///{repo_root() / 'mlruns' / 'mlflow.db'}"


def experiment_name(cfg) -> str:
    return cfg.tracking.experiment or f"parallax-{cfg.profile}"


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Tracker:
    """One MLflow experiment; creates the store once (before any parallel writer) and the experiment if needed."""

    def __init__(self, cfg):
        import mlflow
        from mlflow.tracking import MlflowClient
        uri = tracking_uri(cfg)
        check_store(uri, "tracking.uri")  # unreachable, corrupt or unwritable: fails now, in seconds
        mlflow.set_tracking_uri(uri)
        self.uri = uri
        name = experiment_name(cfg)
        try:
            with _first_contact():
                self.client = MlflowClient(tracking_uri=uri)
                exp = self._get_or_create(name, cfg)
        except Exception as e:  # a server that answers but is not MLflow, a schema MLflow cannot migrate, ...
            raise StoreError(
                f"Cannot use the MLflow tracking store {redact(uri)} (tracking.uri): {type(e).__name__}: "
                f"{redact((str(e).strip().splitlines() or [''])[0][:300])}. Check that it is an MLflow tracking "
                f"server or database of a supported version (docs/scale-out.md), or leave tracking.uri empty for "
                f"the local store in mlruns/. Nothing was run.") from None
        self.experiment_id = exp.experiment_id
        self.name = name

    def _get_or_create(self, name, cfg):
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            artifacts = None
            if self.uri.startswith("sqlite:///") or "://" not in self.uri:
                artifacts = (repo_root() / "mlruns" / "artifacts").as_uri()
            try:
                self.client.create_experiment(name, artifact_location=artifacts,
                                              tags={"profile": cfg.profile, **EXPERIMENT_KIND})
            except Exception:  # another worker created it first
                pass
            exp = self.client.get_experiment_by_name(name)
        for k, v in EXPERIMENT_KIND.items():
            if exp.tags.get(k) is None:  # an experiment made before the tag was set (or by another tool)
                self.client.set_experiment_tag(exp.experiment_id, k, v)
        return exp

    # --- runs ---------------------------------------------------------------------------------------
    def start_run(self, name: str, tags: dict, parent_id: str | None = None) -> str:
        tags = {k: str(v) for k, v in tags.items() if v is not None}
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param
        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def log_metrics(self, run_id: str, metrics: dict, step: int | None = None) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()
                 if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))]
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
        self.client.log_inputs(run_id, [DatasetInput(ds._to_mlflow_entity(),
                                                     [InputTag("mlflow.data.context", context)])])

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

    def find_runs(self, filter_string: str) -> list:
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, max_results=10000)

    def end_stale_runs(self, filter_string: str, status: str = "KILLED") -> int:
        """End RUNNING runs left behind by a killed process (matched by filter); returns how many."""
        runs = self.find_runs(f"{filter_string} and attributes.status = 'RUNNING'")
        for r in runs:
            self.set_tags(r.info.run_id, {"parallax.ended_by": "resume: its process died"})
            self.end_run(r.info.run_id, status)
        return len(runs)


def base_tags(cfg, host, stage: str | None = None) -> dict:
    t = cfg.train
    return {
        "strategy": t.strategy, "model": t.model, "devices": t.devices, "device_kind": host.kind,
        "device_name": host.name, "host": host.hostname, "data_source": cfg.data.source,
        "synthetic": str(cfg.data.source == "synthetic").lower(), "git_sha": git_sha(),
        "dvc_stage": stage or ("" if not os.environ.get("DVC_ROOT") else "unknown"), "profile": cfg.profile,
        "oversubscribed": str(t.devices > host.n * t.nnodes).lower(),
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


def capability_tags(caps: dict) -> dict:
    """capabilities.host_capabilities(host) as flat run tags: what makes a number from this host what it is."""
    cpu, gpus = caps.get("cpu") or {}, caps.get("gpus") or []
    return {"host.cpu_isa": ",".join(cpu.get("isa") or []) or "none",
            "host.torch_cpu_capability": cpu.get("torch_cpu_capability"), "host.bf16": caps.get("bf16"),
            "host.fp16": caps.get("fp16"), "host.cpu_bf16": cpu.get("bf16"), "host.cpu_fp16": cpu.get("fp16"),
            "host.gpu_name": ",".join(sorted({g["name"] for g in gpus})) or None,
            "host.gpu_compute_capability": ",".join(sorted({g["compute_capability"] for g in gpus})) or None,
            "host.nccl": caps.get("nccl") or None, "host.interconnect": caps.get("interconnect") or None,
            "host.torch": caps.get("torch"),
            "host.cuda": caps.get("cuda") or None}


def trial_params(cfg) -> dict:
    t = cfg.train
    return {"model": t.model, "strategy": t.strategy, "devices": t.devices, "batch_size": t.batch_size,
            "per_device_batch": t.batch_size // t.devices, "lr": t.lr, "epochs": t.epochs, "seed": t.seed,
            "max_steps": t.max_steps, "data_source": cfg.data.source, "train_limit": cfg.data.train_limit,
            "bucket_cap_mb": t.bucket_cap_mb, "grad_as_bucket_view": t.grad_as_bucket_view,
            "accum_steps": t.accum_steps, "comm_hook": t.comm_hook, "amp_dtype": t.amp_dtype}


def epoch_metrics(record: dict) -> dict:
    return {"train/loss": record.get("train_loss"), "test/acc": record.get("test_acc"),
            "perf/epoch_s": record.get("epoch_s"), "perf/epoch_throughput_img_s": record.get("throughput_img_s")}


def final_metrics(m: dict) -> dict:
    out = {"perf/throughput_img_s": m.get("throughput_img_s"), "perf/time_to_acc_s": m.get("time_to_acc_s"),
           "test/final_acc": (m.get("test_acc") or [None])[-1], "mem/imbalance": m.get("mem_imbalance"),
           "perf/wall_s": m.get("wall_s")}
    out.update(memory_metrics(m))
    return {**out, **breakdown_metrics(m.get("breakdown") or {})}


def memory_metrics(m: dict) -> dict:
    """Peak memory per device and device 0's excess in MiB, the report's unit (bytes stay in metrics.json)."""
    out = {f"mem/peak_mib/dev{i}": p / MIB for i, p in enumerate(m.get("peak_mem_bytes") or []) if p is not None}
    if m.get("mem_device0_excess") is not None:
        out["mem/device0_excess_mib"] = m["mem_device0_excess"] / MIB
    return out


def summary_metrics(summary: dict) -> dict:
    """summary.json's numbers as metrics of the analysis run: the top-level ones under summary/, each strategy's
    as <strategy>/<name> (sentences, objects and flags stay in the file)."""
    def numbers(d: dict, prefix: str) -> dict:
        return {f"{prefix}/{k}": v for k, v in d.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out = numbers(summary, "summary")
    for name, s in (summary.get("strategies") or {}).items():
        out.update(numbers(s, name))
    return out


def breakdown_metrics(bd: dict) -> dict:
    """The step-time breakdown as breakdown/<part>_s and breakdown/<part>_share (of the sampled step), the residual
    included, so the MLflow UI compares trials part by part; nothing where no step was sampled."""
    step, parts = bd.get("step_s"), dict(bd.get("parts_s") or {})
    if not bd.get("samples") or not step or not parts:
        return {}
    parts["residual"] = bd.get("residual_s")
    out = {"breakdown/step_s": step, "breakdown/samples": bd["samples"]}
    for name, s in parts.items():
        if isinstance(s, (int, float)):
            out[f"breakdown/{name}_s"], out[f"breakdown/{name}_share"] = s, s / step
    return out


def log_completed_run(tracker: Tracker, run_id: str, metrics: dict, out_dir: Path) -> None:
    """Everything a finished trial leaves in its run: final metrics (at the last epoch's step, after the learning
    curves) and the metrics file."""
    tracker.log_metrics(run_id, final_metrics(metrics), step=len(metrics.get("test_acc") or []))
    tracker.set_tags(run_id, {"mem_method": metrics.get("mem_method"),
                              "parallel_devices": str(metrics.get("parallel_devices")).lower(),
                              "mem_devices": json.dumps(metrics.get("mem_devices")),
                              "comm_hook_used": metrics.get("comm_hook_used"),
                              "mem_peak_bytes": json.dumps(metrics.get("peak_mem_bytes"))})
    if (out_dir / "metrics.json").exists():
        tracker.log_artifact(run_id, out_dir / "metrics.json")
