"""A sweep's trials as SLURM jobs, submitted through submitit, when params.yaml or the profile sets `slurm.partition`.

    python -m pipeline sweep --strategy ddp --set slurm.partition=gpu --set slurm.devices_per_node=8   # login node

A k-device trial on nodes of g devices is one job of ceil(k/g) nodes x 1 task; each task runs the trial's ranks
through PyTorch's elastic launcher (launch.run_trial, nproc_per_node = k / nodes), and the nodes meet through the
c10d rendezvous on the allocation's first node, exactly as a hand-typed multi-node `train` does (train.nnodes,
node_rank, rdzv_endpoint). The sweep process stays on the login node: it holds the Optuna claim and its heartbeat,
logs each epoch (the main rank's progress.jsonl, on the shared filesystem) and records the result as for a local
trial, with the job id and node count.
With system metrics on, each node samples its own host into the trial's MLflow run, labelled with its SLURM
name (tracking.sampling); the login node samples nothing.

Why `scontrol show job` and not submitit's own watcher: submitit asks `sacct`, which needs SLURM's accounting
database; without one (a small cluster, the test cluster) a job that ends without its result file (scancel,
preemption, time limit, a node lost) would look RUNNING for ever. submitit still writes the batch script, pickles
the call and reads the results back. Jobs are submitted with --no-requeue: the Optuna queue is the only record of
what runs, so a cancelled or preempted job's trial is enqueued again there (Requeued), never behind its back.
A controller that does not answer `scontrol show job` for UNREACHABLE_S gets the job cancelled (it may still run)
and fails the trial as UNREACHABLE: the cluster's fault, which the sweep handles as a store fault (it stops, and the
point runs again). A trial directory reused from an earlier trial is emptied of that trial's files before the job
is submitted: nothing of it is read as the new trial's epochs or record.

Off (no partition) is `local`, launch.run_trial on this host; submitit is imported only when SLURM is on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pipeline.errors import TrialFailed
from pipeline.records import files
from pipeline.trial import outcome

REQUEUE = {"CANCELLED", "PREEMPTED", "DEADLINE"}  # not the trial's fault: run it again (up to MAX_REQUEUES times)
ENDED = REQUEUE | {"COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "SPECIAL_EXIT"}
MAX_REQUEUES = 2
UNREACHABLE = "slurm_unreachable"  # the failure kind of a trial whose job SLURM's controller stopped answering for
UNREACHABLE_S = 60.0  # how long `scontrol show job` may fail before the job is given up (a controller's fail-over)
UNSUBMITTED = "slurm_submit"  # the failure kind of a trial whose job `sbatch` could not submit


# SLURM ended the trial's job (scancel, preemption): the trial's outcome is `requeued`, its point enqueued again
Requeued = outcome.Requeued


def is_on(cfg) -> bool:
    return bool(cfg.slurm.partition)


def nodes_for(scfg, devices: int) -> int:
    """The nodes a k-device trial gets: ceil(k / slurm.devices_per_node)."""
    return math.ceil(devices / scfg.devices_per_node)


def with_train(tcfg, **changes):
    """The trial's Config with train `changes` this module derives from its validated settings (node counts, the
    allocation's rendezvous), not validated again: the trial's Config is built once, by the sweep."""
    return dataclasses.replace(tcfg, train=dataclasses.replace(tcfg.train, **changes))


def sized(cfg, tcfg):
    """The trial as it runs on the cluster (for the feasibility check): its node count and a rendezvous."""
    if not is_on(cfg):
        return tcfg
    n = nodes_for(cfg.slurm, tcfg.train.devices)
    if n == 1:
        return with_train(tcfg, nnodes=1, rdzv_endpoint="")
    # the nodes' names are not known before the job starts: each node checks the address it advertises when its
    # share of the trial starts there (run_trial), not the login node's
    return with_train(tcfg, nnodes=n, rdzv_endpoint=f"first-node:{cfg.slurm.rdzv_port}", local_addr="each-node")


def cluster_host(cfg, host):
    """What one node of the cluster offers, as the feasibility check reads a host."""
    if not is_on(cfg):
        return host
    return dataclasses.replace(
        host, kind=cfg.slurm.device, n=cfg.slurm.devices_per_node, hostname=f"slurm:{cfg.slurm.partition}"
    )


def runner(cfg, run=None):
    """The function that runs one trial (lifecycle.How.runner): on this host, or as a SLURM job whose nodes each
    sample their own system metrics into `run` (a tracking TrialRun, open by the time the trial runs) when they are
    on."""
    from pipeline.trial.lifecycle import run_locally

    return Runner(cfg.slurm, run) if is_on(cfg) else run_locally


# ----------------------------------------------------------------------------- on each node of the job


def node_main(cfg, out_dir: str, timeout_s: float | None, system_metrics=None) -> dict:
    """One task per node: this node's share of the trial's ranks, in out_dir/node<i>. `cfg`: the trial's Config as
    the sweep built it (pickled by submitit). `system_metrics` (a tracking.SystemMetrics, None when off): the trial's
    run, into which this node samples its own host's system metrics while its ranks run, labelled with its SLURM
    name. Returns the record where this node holds the main rank (its final_state.pt), and a failure as (text, kind)
    rather than raising it."""
    import submitit

    from pipeline.tracking.client import sampling
    from pipeline.trial.launch import run_trial

    env = submitit.JobEnvironment()
    if env.num_nodes > 1:
        port = cfg.slurm.rdzv_port + int(str(env.job_id).split("_")[0]) % 500
        cfg = with_train(
            cfg,
            nnodes=env.num_nodes,
            node_rank=env.node,
            rdzv_endpoint=f"{env.hostnames[0]}:{port}",
            rdzv_id=f"slurm-{env.job_id}",
        )
    node_dir = Path(out_dir) / f"node{env.node}"
    try:
        with sampling(system_metrics, node=env.hostnames[env.node]):
            record = run_trial(cfg, node_dir, on_epoch=None, progress=False, timeout_s=timeout_s)
    except TrialFailed as e:
        return {"node": env.node, "failed": (str(e), e.kind)}
    is_main = (node_dir / "final_state.pt").exists()
    return {
        "node": env.node,
        "host": env.hostnames[env.node],
        "record": record if is_main else None,
        "machine": _boot_id(),
        "cores": len(os.sched_getaffinity(0)),
        "procs": cfg.train.devices // cfg.train.nnodes,
    }


def _boot_id() -> str:
    """The kernel's boot id: the same on "nodes" that are one machine (containers, network namespaces)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


# ----------------------------------------------------------------------------- on the login node


def scontrol(*args: str) -> dict:
    """`scontrol show ... -o` as a dict ({} when SLURM does not know it, or cannot be asked)."""
    return ask(*args)[0]


def ask(*args: str) -> tuple[dict, str]:
    """`scontrol show ... -o` as a dict, and when that is empty, why: scontrol's own words (its stderr)."""
    try:
        p = subprocess.run(["scontrol", "show", *args, "-o"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {}, "no answer within 30 s"
    except OSError as e:
        return {}, f"{type(e).__name__}: {e}"
    fields = {}
    for word in re.split(r"\s+(?=[A-Za-z][\w/:]*=)", p.stdout.strip()):  # values hold spaces (Reason=Not responding)
        key, eq, value = word.partition("=")
        if eq:
            fields.setdefault(key, value.strip())
    return fields, "" if fields else " ".join(p.stderr.split())[:300] or f"exit {p.returncode} without output"


def cancel(job_id: str) -> str:
    """scancel the job; what became of it, for a message."""
    try:
        p = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return f"scancel {job_id} got no answer within 30 s: the job may still run; cancel it once SLURM answers"
    except OSError as e:
        return f"scancel {job_id} could not run ({e}): the job may still run; cancel it once SLURM answers"
    if p.returncode:
        said = " ".join(p.stderr.split())[:200] or f"exit {p.returncode}"
        return f"scancel {job_id} failed ({said}): the job may still run; cancel it once SLURM answers"
    return f"job {job_id} cancelled (scancel)"


def clear(out_dir: Path) -> None:
    """Remove what an earlier trial left in a reused trial directory: its nodes' directories (progress.jsonl,
    record, final state) and the record and final state copied from them."""
    for d in out_dir.glob("node*"):
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)
        else:
            d.unlink()
    for name in ("metrics.json", "final_state.pt"):
        (out_dir / name).unlink(missing_ok=True)


def hostnames(nodelist: str) -> list[str]:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        return out.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return []


def _shared_cores(record, results: list):
    """The record, tagged oversubscribed where nodes that are one machine (one boot id) ran more ranks in all than
    it has cores: each node alone sees all the cores, so the trial's own check cannot tell."""
    machines: dict = {}
    for r in results:
        used = machines.setdefault(r.get("machine") or r["node"], [0, r.get("cores", 0)])
        used[0] += r.get("procs", 0)
    if record.oversubscribed or not any(n > cores for n, cores in machines.values()):
        return record
    return dataclasses.replace(record, oversubscribed=True)


def tasks(job) -> list:
    """submitit's per-task jobs (one per node) of a job."""
    return list(job._sub_jobs) or [job]


def _tail(path: Path, n: int = 300) -> str:
    try:
        return " ".join(Path(path).read_text(errors="replace")[-n:].split())
    except OSError:
        return "(none)"


class Runner:
    """Runs one trial as a SLURM job and waits for it, saying when it is submitted, queued, running and done."""

    def __init__(self, scfg, run=None):
        self.scfg, self.run = scfg, run

    def executor(self, folder: Path, nodes: int, label: str):
        import submitit  # the optional extra `slurm`: only here

        s = self.scfg
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0, python=sys.executable)
        per_node = {"cpus_per_task": s.devices_per_node} if s.device == "cpu" else {"gpus_per_node": s.devices_per_node}
        ex.update_parameters(
            partition=s.partition,
            nodes=nodes,
            ntasks_per_node=1,
            time=s.time_limit_min,
            job_name=f"parallax {label}"[:120],
            additional_parameters={"no_requeue": True},
            **per_node,
            **({"account": s.account} if s.account else {}),
        )
        return ex

    def __call__(self, trial):
        """Run `trial` (a lifecycle.Trial) as one job and return its record."""
        from pipeline.trial.launch import writing_folder

        tcfg, out_dir, on_epoch, label = trial.cfg, trial.out_dir, trial.epoch_ended, trial.label
        timeout_s = trial.how.timeout_s
        with writing_folder(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
            clear(out_dir)  # before the job is queued: the epochs read meanwhile are this trial's only
        nodes = nodes_for(self.scfg, tcfg.train.devices)
        tcfg = with_train(tcfg, nnodes=1, rdzv_endpoint="")  # node_main sets the allocation's
        try:
            sampled = self.run.system_metrics_target() if self.run else None  # each node samples its own host
            job = self.executor(out_dir / "slurm", nodes, label).submit(
                node_main, tcfg, str(out_dir), timeout_s, sampled
            )
        except subprocess.CalledProcessError as e:  # sbatch said why on stderr, above
            raise TrialFailed(
                f"`sbatch` could not submit the trial's job (exit {e.returncode}; its own message is printed above "
                f"this one): SLURM's controller did not take it (no controller answering, no slurm.conf, a partition "
                f"or account it refuses)",
                UNSUBMITTED,
            ) from None
        trial.note({"slurm_job_id": str(job.job_id), "nodes": nodes})

        def say(msg: str) -> None:
            print(
                f"  {label} SLURM job {job.job_id} ({nodes} node{'s' * (nodes > 1)}): {msg}",
                file=sys.stderr,
                flush=True,
            )

        # always said: a job the scheduler starts before the first poll is never seen queued
        say(f"submitted to partition {self.scfg.partition}")

        ended = False
        try:
            info = self.wait(job, out_dir, on_epoch, say)
            ended = True
        except TrialFailed as e:
            ended = e.kind in ("stopped", UNREACHABLE)  # the wait cancelled the job itself
            raise
        finally:
            if not ended:  # interrupted, or stopped by the sweep: never leave the job behind
                cancel(str(job.job_id))
        return self.outcome(job, info, nodes, out_dir, say)

    def wait(self, job, out_dir: Path, on_epoch, say) -> dict:
        """Poll `scontrol show job` until the job ends, handing each epoch record to on_epoch meanwhile."""
        seen, last, lost_since = 0, None, None
        while True:
            info, why = ask("job", str(job.job_id))
            state = info.get("JobState", "")
            shown = (
                "queued"
                if state in ("PENDING", "CONFIGURING", "REQUEUED")
                else ("running" if state in ("RUNNING", "COMPLETING") else state.lower())
            )
            if shown in ("queued", "running") and shown != last:  # the end is said by outcome()
                where = {
                    "queued": f" (Reason={info.get('Reason', '?')})",
                    "running": f" on {info.get('NodeList', '?')}",
                }.get(shown, "")
                say(shown + where)
                last = shown
            seen = self.epochs(out_dir, seen, on_epoch, job)
            if state in ENDED:
                return info
            if info:
                lost_since = None
            else:
                lost_since = lost_since or time.monotonic()
                if all(t.paths.result_pickle.exists() for t in tasks(job)):
                    return info  # SLURM forgot it (MinJobAge) after it ended: its results are here
                lost_s = time.monotonic() - lost_since
                if lost_s > UNREACHABLE_S:
                    cancelled = cancel(str(job.job_id))
                    say(f"`scontrol show job` failed for {lost_s:.0f} s; {cancelled}")
                    raise TrialFailed(
                        f"SLURM job {job.job_id}: `scontrol show job {job.job_id}` failed for {lost_s:.0f} s (over "
                        f"{UNREACHABLE_S:.0f} s), last with: {why}. SLURM's controller is unreachable or lost the "
                        f"job, so its state is unknown; {cancelled}",
                        UNREACHABLE,
                    )
            time.sleep(self.scfg.poll_s)

    def epochs(self, out_dir: Path, seen: int, on_epoch, job) -> int:
        lines = []
        for f in sorted(out_dir.glob("node*/progress.jsonl")):
            lines = f.read_text().splitlines()
        for line in lines[seen:]:
            try:
                record = json.loads(line)
            except ValueError:  # being written
                return seen
            if on_epoch and on_epoch(record):
                cancelled = cancel(str(job.job_id))
                raise TrialFailed(
                    f"stopped at epoch {record['epoch']} by the sweep; {cancelled} (pruning and "
                    f"taken-over trials end their job)",
                    "stopped",
                )
            seen += 1
        return seen

    def outcome(self, job, info: dict, nodes: int, out_dir: Path, say):
        state = info.get("JobState", "UNKNOWN")
        why = f"SLURM job {job.job_id} ended {state}" + (
            f" (Reason={info['Reason']})" if info.get("Reason", "None") != "None" else ""
        )
        if state in REQUEUE:
            say(f"done: {state}; the trial is enqueued again")
            raise Requeued(f"{why}: not the trial's fault; its point is enqueued again", "slurm_" + state.lower())
        if state == "NODE_FAIL":
            lost = [
                f"{h} ({n.get('State', '?')}: {n.get('Reason', '?')})"
                for h in hostnames(info.get("NodeList", ""))
                for n in [scontrol("node", h)]
                if "DOWN" in n.get("State", "") or "NOT_RESPONDING" in n.get("State", "")
            ]
            say(f"done: NODE_FAIL {', '.join(lost)}")
            raise TrialFailed(
                f"{why}: node(s) {', '.join(lost) or info.get('NodeList', '?')} stopped responding to SLURM mid-trial",
                "node_fail",
            )
        if state == "TIMEOUT":
            say("done: TIMEOUT")
            raise TrialFailed(
                f"{why}: over its time limit of {self.scfg.time_limit_min} min (slurm.time_limit_min)", "timeout"
            )
        deadline = time.monotonic() + 10  # a shared filesystem may show the result files late
        while not all(t.paths.result_pickle.exists() for t in tasks(job)) and time.monotonic() < deadline:
            time.sleep(0.5)
        missing = [t for t in tasks(job) if not t.paths.result_pickle.exists()]
        if missing:  # submitit's result() would wait for ever (it asks sacct)
            tail = " | ".join(_tail(t.paths.stderr) for t in missing)
            say(f"done: {state}, {len(missing)} task(s) left no result")
            raise TrialFailed(f"{why}: {len(missing)} of its {nodes} task(s) left no result; stderr: {tail}", "error")
        try:
            results = [t.result() for t in tasks(job)]
        except Exception as e:  # an exception outside the trial (the node could not import the package)
            text = (str(e).strip().splitlines() or [""])[-1][:400]
            say(f"done: {state}, error")
            raise TrialFailed(f"{why}: {text}", "error") from None
        failed = [r["failed"] for r in results if "failed" in r]
        if failed:
            say(f"done: {state}, trial failed")
            raise TrialFailed(f"{failed[0][0]} (SLURM job {job.job_id}, node {results[0].get('node')})", failed[0][1])
        main = next((r for r in results if r.get("record") is not None), None)
        if main is None:
            raise TrialFailed(f"{why}: no node returned the main rank's record", "error")
        record = _shared_cores(main["record"], results)
        node_dir = out_dir / f"node{main['node']}"
        from pipeline.trial.launch import writing_folder

        with writing_folder(out_dir):  # each whole or not at all
            for f in ("metrics.json", "final_state.pt"):
                if (node_dir / f).exists():
                    with open(node_dir / f, "rb") as src, files.replacing(out_dir / f, "wb") as dst:
                        shutil.copyfileobj(src, dst)
            if record is not main["record"]:
                files.write_text(out_dir / "metrics.json", json.dumps(record.to_json(), indent=2))
        say(f"done: {state} on {info.get('NodeList', '?')}")
        return record
