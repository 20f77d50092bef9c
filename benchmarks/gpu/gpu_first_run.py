"""The first hour on a GPU node: the GPU review's "first GPU run" list, in order, within 10 minutes on one GPU, and
one file that says per finding (G1-G22) what the hardware showed.

    python -m benchmarks.gpu.gpu_first_run [--out first-run] [--budget-s 580]     (the bundle's run.sh runs it)
    python -m benchmarks.gpu.gpu_first_run --dry-run                              the plan, on any host

Every step is a subprocess with a timeout of its own (capped by what is left of the budget), so a hang costs its
slot, not the run; a step that needs more GPUs than the node has is skipped and says so. The steps write under
OUT/steps/<name>/ (logs, doctor.json, metrics.json, the G1 replay fixture); the one file is OUT/first-run.md: a
table with one row per finding (what ran, what it showed, or "not exercised") and, at its end, the same as JSON.
Figures are copied from the steps' own JSON, not judged: reading them is docs/gpu.md's "the first GPU run".
A CPU host is refused (exit 2): nothing here means anything without CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FINDINGS = tuple(f"G{i}" for i in range(1, 23))
SYNTH = ("--set", "data.source=synthetic")
DOCTOR = ("-m", "pipeline", "doctor", *SYNTH, "--strategies", "single,dp,dp_criterion,ddp,ddp_amp,fsdp")


@dataclass(frozen=True)
class Step:
    name: str
    findings: tuple[str, ...]
    what: str
    argv: tuple[str, ...]  # after the Python executable; {out} is the step's directory
    timeout_s: int
    devices: int = 1  # GPUs it needs
    fallback: tuple[str, ...] = ()  # argv to retry with when this build rejects an option (exit 2)


@dataclass
class Result:
    step: str
    status: str  # passed | failed | timeout | skipped | not run
    why: str = ""
    seconds: float = 0.0
    exit: int | None = None
    figures: dict = field(default_factory=dict)


# the GPU review's "Proposed order for the first GPU run" (docs/gpu.md), with the facts the other findings need first
PLAN = (
    Step("host", ("G7", "G17", "G20"), "CUDA ordinals vs NVML (uuid), CUDA_VISIBLE_DEVICES, nvidia-smi topo",
         (str(Path(__file__).resolve()), "--host-facts", "{out}/host.json"), 30),
    Step("data", (), "the synthetic data set the steps train on", ("-m", "pipeline", "download", *SYNTH), 45),
    Step("doctor_breakdown_off", ("G2", "G4", "G13", "G14", "G15", "G19", "G21", "G22"),
         "doctor with train.breakdown_every=0", (*DOCTOR, "--set", "train.breakdown_every=0", "--out", "{out}"), 115),
    Step("doctor_default", ("G1", "G2", "G12", "G18"),
         "doctor as shipped (sampled steps profiled), one sampled step's events dumped",
         (*DOCTOR, "--out", "{out}", "--dump-events", "{out}/events"), 115,
         fallback=(*DOCTOR, "--out", "{out}")),
    Step("dp_output_device_1", ("G5",), "train dp k=2 with train.output_device=1, one epoch",
         ("-m", "pipeline", "train", *SYNTH, "--strategy", "dp", "--devices", "2", "--epochs", "1",
          "--set", "train.output_device=1", "--no-track", "--quiet", "--out", "{out}"), 45, devices=2),
    Step("equivalence_tf32_on", ("G6",), "doctor's one-step equivalence with TF32 on",
         ("-m", "pipeline", "doctor", *SYNTH, "--strategies", "dp,ddp", "--steps", "3",
          "--set", "train.fp32_precision=tf32", "--out", "{out}"), 40),
    Step("equivalence_tf32_off", ("G6",), "doctor's one-step equivalence with TF32 off",
         ("-m", "pipeline", "doctor", *SYNTH, "--strategies", "dp,ddp", "--steps", "3",
          "--set", "train.fp32_precision=ieee", "--out", "{out}"), 40),
    Step("memory_single", ("G3",), "LeNet single, one epoch: resident at reset vs the peaks",
         ("-m", "pipeline", "train", *SYNTH, "--strategy", "single", "--epochs", "1", "--no-track", "--quiet",
          "--out", "{out}"), 35),
    Step("memory_dp_k2", ("G3", "G21"), "LeNet dp k=2, one epoch: resident at reset vs the peaks per device",
         ("-m", "pipeline", "train", *SYNTH, "--strategy", "dp", "--devices", "2", "--epochs", "1", "--no-track",
          "--quiet", "--out", "{out}"), 35, devices=2),
    Step("collectives", ("G9", "G16"), "collectives, the in-process ops timed apart",
         ("-m", "pipeline", "collectives", *SYNTH, "--out", "{out}/collectives.json"), 50, devices=2),
    Step("overlap", ("G10",), "the overlap stage (side stream)", ("-m", "pipeline", "overlap", "--out", "{out}"), 30),
)
# what a finding's row says when no step covers it
UNCOVERED = {"G8": "sampled only inside trials (gpu_monitor fields of doctor's rows, if the build records them)",
             "G11": "shown by the install itself: run.sh's install.txt and its 'core requirements' line"}
KEYS = ("img_s", "step_ms", "peak_mem", "resident", "reserved", "nvml", "comm", "tf32", "scale", "skipped",
        "status", "reason", "check", "backend", "alpha", "beta", "saving", "nccl", "uuid", "visible", "interconnect",
        "gpu_", "epoch_s", "output_device", "mem_")


def figures(out: Path, limit: int = 40) -> dict:
    """Numbers and short strings under names that matter (KEYS), from every JSON the step wrote, flattened."""
    found = {}

    def walk(prefix, v):
        if len(found) >= limit:
            return
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                label = "/".join(str(x[k]) for k in ("strategy", "k", "variant") if x.get(k) not in (None, ""))
                walk(f"{prefix}[{label or i}]", x)
        elif any(k in prefix.rsplit(".", 1)[-1].lower() for k in KEYS) and (
                not isinstance(v, str) or len(v) <= 160):
            found[prefix] = v

    for path in sorted(out.rglob("*.json")):
        if path.parent.name != "events":  # the replay fixtures: large, and the point is that they exist
            try:
                walk(path.stem, json.loads(path.read_text()))
            except (ValueError, OSError):
                continue
    return found


def host_facts(path: Path) -> None:
    """Per CUDA ordinal: torch's name, uuid, PCI ids, NVML index and NVML's uuid at the same index (G7), with
    CUDA_VISIBLE_DEVICES and nvidia-smi's topology (G17): every call guarded, every failure written down."""
    import torch

    def guard(f):
        try:
            return f()
        except Exception as e:  # noqa: BLE001 - a fact that cannot be read is itself the fact
            return f"unavailable ({type(e).__name__}: {e})"

    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001
        pynvml, nvml_error = None, f"{type(e).__name__}: {e}"
    else:
        nvml_error = ""
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        row = {"ordinal": i, "name": props.name, "uuid": str(getattr(props, "uuid", "")),
               "pci": [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")],
               "nvml_index": guard(lambda: torch.cuda._get_nvml_device_index(i))}
        if pynvml:
            row["nvml_uuid_at_same_index"] = guard(lambda: pynvml.nvmlDeviceGetUUID(
                pynvml.nvmlDeviceGetHandleByIndex(i)))
        gpus.append(row)

    def smi(*args):
        return guard(lambda: subprocess.run(["nvidia-smi", *args], capture_output=True, text=True,
                                            timeout=15).stdout)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                "nvml": nvml_error or "pynvml imported", "gpus": gpus,
                                "nvidia_smi_L": smi("-L"), "nvidia_smi_topo": smi("topo", "-m")},
                               indent=1, default=str))


def run_step(step: Step, out: Path, timeout_s: float, python: str = sys.executable) -> Result:
    """One step as a subprocess in its own directory, killed at timeout_s; its output goes to OUT/log.txt."""
    out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)  # a checkout's pipeline too
    env = {**os.environ, "DVC_ROOT": str(out.parent.parent), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
           "MPLBACKEND": "Agg"}
    t0 = time.monotonic()
    for argv in (step.argv, step.fallback):
        if not argv:
            break
        cmd = [python, *(a.replace("{out}", str(out)) for a in argv)]
        try:
            run = subprocess.run(cmd, cwd=out.parent.parent, env=env, capture_output=True, text=True,
                                 timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            (out / "log.txt").write_text(f"$ {' '.join(cmd)}\n{e.stdout or ''}{e.stderr or ''}")
            return Result(step.name, "timeout", f"no result in {timeout_s:.0f} s", time.monotonic() - t0)
        (out / "log.txt").write_text(f"$ {' '.join(cmd)}\n{run.stdout}{run.stderr}")
        if not (run.returncode == 2 and "unrecognized arguments" in run.stderr):
            break
    last = (run.stderr.strip() or run.stdout.strip() or "no output").splitlines()[-1][:200]
    res = Result(step.name, "passed" if run.returncode == 0 else "failed", "" if run.returncode == 0 else last,
                 time.monotonic() - t0, run.returncode, figures(out))
    if argv is step.fallback and step.fallback:
        res.why = (res.why + "; " if res.why else "") + f"this build rejects {step.argv[-2]} (ran without it)"
    fixtures = sorted((out / "events").glob("events-*.json"))  # doctor --dump-events: one per profiled trial
    if fixtures:
        res.figures["replay_fixtures"] = ", ".join(str(f) for f in fixtures)
    return res


def run_plan(plan, out: Path, budget_s: float, gpus: int, runner=run_step) -> list[Result]:
    """The steps in order, each under min(its timeout, what is left of the budget)."""
    results, start = [], time.monotonic()
    for step in plan:
        left = budget_s - (time.monotonic() - start)
        if step.devices > gpus:
            results.append(Result(step.name, "skipped", f"needs {step.devices} GPUs, this node has {gpus}"))
        elif left < 10:
            results.append(Result(step.name, "not run", f"the {budget_s:.0f} s budget was spent"))
        else:
            results.append(runner(step, out / "steps" / step.name, min(step.timeout_s, left)))
    return results


def rows(plan, results) -> list[dict]:
    """One row per finding: the steps that exercised it, their outcome and figures, or why it was not."""
    by_step = {r.step: r for r in results}
    out = []
    for g in FINDINGS:
        steps = [s for s in plan if g in s.findings]
        ran = [by_step[s.name] for s in steps if s.name in by_step and by_step[s.name].status in ("passed", "failed")]
        if ran:
            shown = "; ".join(f"{r.step}: {r.status}" + (f" ({r.why})" if r.why else "") for r in ran)
            out.append({"finding": g, "exercised": True, "ran": [s.what for s in steps], "showed": shown,
                        "figures": {r.step: r.figures for r in ran}})
        else:
            why = "; ".join(f"{by_step[s.name].step}: {by_step[s.name].status} ({by_step[s.name].why})"
                            for s in steps if s.name in by_step) or UNCOVERED.get(g, "no step of this run covers it")
            out.append({"finding": g, "exercised": False, "ran": [s.what for s in steps],
                        "showed": f"not exercised: {why}", "figures": {}})
    return out


def write_report(path: Path, plan, results, facts: dict) -> dict:
    """first-run.md: the per-finding table, the steps, then everything as one JSON block (load() reads it back)."""
    report = {"facts": facts, "steps": [asdict(r) for r in results], "findings": rows(plan, results)}
    lines = ["# Parallax: first GPU run", ""] + [f"- {k}: {v}" for k, v in facts.items()] + [
        "", "| finding | ran | what the hardware showed | figures |", "|---|---|---|---|"]
    for r in report["findings"]:
        figs = "; ".join(f"{k}={v}" for fs in r["figures"].values() for k, v in list(fs.items())[:8])
        lines.append(f"| {r['finding']} | {', '.join(r['ran']) or '-'} | {r['showed']} | {figs[:600] or '-'} |")
    lines += ["", "| step | status | seconds | why |", "|---|---|---|---|"]
    lines += [f"| {r.step} | {r.status} | {r.seconds:.1f} | {r.why or '-'} |" for r in results]
    lines += ["", "```json", json.dumps(report, indent=1, default=str), "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return report


def load(path: Path) -> dict:
    """The JSON block of a first-run.md."""
    text = path.read_text()
    return json.loads(text[text.rindex("```json") + len("```json"):text.rindex("```")])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("first-run"), help="default: ./first-run")
    p.add_argument("--budget-s", type=float, default=580, help="the whole run's wall-clock budget (default 580)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (any host)")
    p.add_argument("--host-facts", type=Path, metavar="FILE", help=argparse.SUPPRESS)  # the host step
    args = p.parse_args(argv)
    if args.host_facts:
        host_facts(args.host_facts)
        return 0
    if args.dry_run:
        for i, s in enumerate(PLAN, 1):
            needs = f", needs {s.devices} GPUs" if s.devices > 1 else ""
            print(f"{i:2d}. {s.name} [{', '.join(s.findings) or 'setup'}] <= {s.timeout_s} s{needs}: {s.what}\n"
                  f"    python {' '.join(s.argv)}")
        print(f"budget {args.budget_s:.0f} s; steps' timeouts sum to {sum(s.timeout_s for s in PLAN)} s")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("gpu_first_run needs CUDA: this host has no CUDA device (use --dry-run to see the plan)",
              file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count()
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus,
             "gpu0": torch.cuda.get_device_name(0), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"), "budget_s": args.budget_s}
    out = args.out.resolve()
    results = run_plan(PLAN, out, args.budget_s, gpus)
    write_report(out / "first-run.md", PLAN, results, facts)
    print(f"wrote {out / 'first-run.md'}: " + ", ".join(f"{r.step} {r.status}" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
