"""The first hour on a GPU node: the GPU review's "first GPU run" list within 10 minutes on one GPU, and one file
that says per finding (G1-G22) what the hardware showed.

    python -m benchmarks.gpu.gpu_first_run [--out first-run] [--budget-s 580]     (the bundle's run.sh runs it)
    python -m benchmarks.gpu.gpu_first_run --dry-run [--gpus N] [--trial-s S]     the plan and its limits, any host
    python -m benchmarks.gpu.gpu_first_run --allow-cpu                            the same plan, smaller, on a CPU

It runs the same from any folder: every step's configuration is that of the checkout or bundle this file lives in
(its params.yaml and experiments/, found from this file and given to each step as DVC_ROOT), and everything the steps
write goes to OUT (the synthetic data to OUT/data, given to each step as an absolute data.dir).

Every step is a subprocess with a limit of its own, sized, not guessed: the calibration step first times one trial
(`train`, single, 5 steps) on this host, and each later step's limit is its trials x that cost x SAFETY + MARGIN_S
(a doctor run's trials come from doctor's own plan: one reference trial, and per case an equivalence step and a
timed run). A hang costs its step, not the run; a step whose trials would need more than what is left of the budget
is not started, and says so. Steps go by what they tell: one GPU first, the two-GPU steps next (skipped on one GPU,
with the reason), and last the doctor as shipped, whose k=2 rows share one GPU there (oversubscribed: functional
checks; fsdp's crashed on the first GPU run).
The steps write under OUT/steps/<name>/ (logs, doctor.json, metrics.json, the G1 replay fixture); the one file is
OUT/first-run.md: a table with one row per finding (what ran, what it showed, or "not exercised"), one row per step
(trials, limit, seconds) and, at its end, the same as JSON. It is rewritten after every step, so a run killed by
an outer limit shorter than --budget-s leaves the steps it finished (the others: "not run", "the check stopped
before it"). Figures are copied from the steps' own JSON, not judged: reading them is docs/gpu.md's "the first GPU
run".
A CPU host is refused (exit 2) unless --allow-cpu: then the same plan runs smaller (doctor on single and ddp, a few
steps each) with every CUDA-only step skipped and its reason said: a rehearsal of the check, not of the findings.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout, or the bundle (run.sh beside benchmarks/)
FINDINGS = tuple(f"G{i}" for i in range(1, 23))
# a sized step's limit: its trials at the calibrated cost, times SAFETY (its strategies and k differ from the
# calibration's single k=1, and a shared node varies), plus MARGIN_S for its own process (imports, its report)
SAFETY = 2.0
MARGIN_S = 20
# the cost per trial a plan assumes where none was measured (a dry run, a failed calibration): a stated
# assumption, said wherever it is used; --trial-s S replaces it, the calibration step measures it
DEFAULT_TRIAL_S = 10.0
MIN_LEFT_S = 10  # with less of the budget left, no step is started
GPU_DOCTOR = ("single", "dp", "dp_criterion", "ddp", "ddp_amp", "fsdp")
CPU_DOCTOR = ("single", "ddp")  # the CPU rehearsal: one in-process and one multi-process strategy
CONFIG = "{config}"  # in a step's argv: the --set options every step shares (config())


@dataclass(frozen=True)
class Step:
    name: str
    findings: tuple[str, ...]
    what: str
    argv: tuple[str, ...]  # after the Python executable; {out} is the step's directory, CONFIG the shared --set
    trials: int = 1  # what it costs, in trials (a stage that is not a trial: about one per process it starts)
    devices: int = 1  # GPUs it needs
    cuda_only: str = ""  # why a CPU host skips it ("": it runs there too)
    fixed_s: int = 0  # the limit of a step not sized on the trial cost (host, data, the calibration itself)
    doctor: tuple[tuple[str, ...], int] | None = None  # (strategies, max_devices): trials from doctor's plan
    calibrates: bool = False  # its seconds are the per-trial cost the later steps are sized on
    fallback: tuple[str, ...] = ()  # argv to retry with when this build rejects an option (exit 2)


@dataclass
class Result:
    step: str
    status: str  # passed | failed | timeout | skipped | not run
    why: str = ""
    seconds: float = 0.0
    exit: int | None = None
    figures: dict = field(default_factory=dict)
    trials: int = 0
    limit_s: float | None = None  # the limit it ran under (None: it did not run)


def doctor_step(name, findings, what, strategies, max_devices, sets=(), optional=(), **kw) -> Step:
    """A `doctor` step: its command and its trial count come from the same strategies and max_devices. `optional`:
    options an older build may reject (the step then runs without them)."""
    argv = (
        "-m",
        "pipeline",
        "doctor",
        CONFIG,
        "--strategies",
        ",".join(strategies),
        "--max-devices",
        str(max_devices),
        *sets,
        "--out",
        "{out}",
    )
    return Step(
        name,
        findings,
        what,
        (*argv, *optional),
        doctor=(tuple(strategies), max_devices),
        fallback=argv if optional else (),
        **kw,
    )


def build_plan(kind: str = "cuda") -> tuple[Step, ...]:
    """The steps for a host of `kind` ("cuda" or "cpu"), in the order they run: by what they tell, one GPU first,
    two GPUs next, oversubscribed last. On a CPU the same steps, smaller (doctor on CPU_DOCTOR for 3 timed steps,
    trials cut to 20 steps); its CUDA-only steps stay in the plan, to be skipped with their reason."""
    cpu = kind != "cuda"
    doc, short = (CPU_DOCTOR, ("--steps", "3")) if cpu else (GPU_DOCTOR, ())
    epoch, span = (("--epochs", "1", "--max-steps", "20"), "20 steps") if cpu else (("--epochs", "1"), "one epoch")
    train = ("-m", "pipeline", "train", CONFIG, "--model", "lenet", "--no-track", "--quiet", "--out", "{out}")
    me = str(Path(__file__).resolve())
    dp = "dp runs on CUDA devices only"
    tf32 = "TF32 is a CUDA setting: a CPU computes IEEE fp32 either way"
    return (
        Step(
            "host",
            ("G7", "G17", "G20"),
            "CUDA ordinals vs NVML (uuid), CUDA_VISIBLE_DEVICES, nvidia-smi topo",
            (me, "--host-facts", "{out}/host.json"),
            trials=0,
            fixed_s=45,
        ),
        Step(
            "data",
            (),
            "the synthetic data set the steps train on, in OUT/data",
            ("-m", "pipeline", "download", CONFIG),
            trials=0,
            fixed_s=60,
        ),
        Step(
            "calibration",
            (),
            "one trial (train single, 5 steps), timed: what a trial costs on this host",
            (*train, "--strategy", "single", "--epochs", "1", "--max-steps", "5"),
            fixed_s=90,
            calibrates=True,
        ),
        doctor_step(
            "doctor_breakdown_off",
            ("G2", "G4", "G13", "G19", "G21", "G22"),
            "doctor at k=1 with train.breakdown_every=0",
            doc,
            1,
            sets=("--set", "train.breakdown_every=0", *short),
        ),
        doctor_step(
            "equivalence_tf32_on",
            ("G6",),
            "doctor's one-step equivalence with TF32 on (dp, ddp; k=1)",
            ("dp", "ddp"),
            1,
            sets=("--steps", "3", "--set", "train.fp32_precision=tf32"),
            cuda_only=tf32,
        ),
        doctor_step(
            "equivalence_tf32_off",
            ("G6",),
            "doctor's one-step equivalence with TF32 off (dp, ddp; k=1)",
            ("dp", "ddp"),
            1,
            sets=("--steps", "3", "--set", "train.fp32_precision=ieee"),
            cuda_only=tf32,
        ),
        Step(
            "memory_single",
            ("G3",),
            f"LeNet single, {span}: resident at reset vs the peaks",
            (*train, "--strategy", "single", *epoch),
        ),
        Step(
            "overlap",
            ("G10",),
            "the overlap stage's measurement (side stream), without its MLflow run",
            (me, "--overlap", "{out}", CONFIG),
        ),
        Step(
            "dp_output_device_1",
            ("G5",),
            f"train dp k=2 with train.output_device=1, {span}",
            (*train, "--strategy", "dp", "--devices", "2", *epoch, "--set", "train.output_device=1"),
            devices=2,
            cuda_only=dp,
        ),
        Step(
            "memory_dp_k2",
            ("G3", "G21"),
            f"LeNet dp k=2, {span}: resident at reset vs the peaks per device",
            (*train, "--strategy", "dp", "--devices", "2", *epoch),
            devices=2,
            cuda_only=dp,
        ),
        Step(
            "collectives",
            ("G9", "G16"),
            "collectives, the in-process ops timed apart",
            ("-m", "pipeline", "collectives", CONFIG, "--out", "{out}/collectives.json"),
            trials=2,
            devices=2,
            cuda_only="G9 and G16 are NCCL's; a CPU's Gloo collectives are the pipeline's collectives stage",
        ),
        doctor_step(
            "doctor_default",
            ("G1", "G2", "G12", "G14", "G15", "G18", "G20"),
            "doctor as shipped, k <= 2 (one GPU: the multi-process strategies' k=2 rows share it), "
            "one sampled step's events dumped",
            doc,
            2,
            sets=short,
            optional=("--dump-events", "{out}/events"),
        ),
    )


PLAN = build_plan("cuda")
# what a finding's row says when no step covers it
UNCOVERED = {
    "G8": "sampled only inside trials (gpu_monitor fields of doctor's rows, if the build records them)",
    "G11": "shown by the install itself: run.sh's install.txt and its 'core requirements' line",
}
KEYS = (
    "img_s",
    "step_ms",
    "peak_mem",
    "resident",
    "reserved",
    "nvml",
    "comm",
    "tf32",
    "scale",
    "skipped",
    "status",
    "reason",
    "check",
    "backend",
    "alpha",
    "beta",
    "saving",
    "nccl",
    "uuid",
    "visible",
    "interconnect",
    "gpu_",
    "epoch_s",
    "output_device",
    "mem_",
)


def trials(step: Step, host) -> int:
    """What `step` costs on `host`, in trials: a doctor run one reference trial plus, per case of doctor's own plan
    (pipeline/doctor/checks.py), its equivalence step and its timed run; any other step its stated count."""
    if step.doctor is None:
        return step.trials
    from pipeline.doctor.checks import plan

    strategies, max_devices = step.doctor
    return 1 + 2 * len(plan(host, strategies, max_devices))


def skipped(step: Step, host) -> str:
    """Why `step` cannot run on `host` ("": it can): a CUDA-only step on a CPU, a step needing more GPUs."""
    if host.kind != "cuda":
        return f"needs CUDA: {step.cuda_only}" if step.cuda_only else ""
    return f"needs {step.devices} GPUs, this node has {host.n}" if step.devices > host.n else ""


def limit_s(step: Step, host, trial_s: float) -> float:
    """The step's time limit: fixed for a step not sized on trials, else its trials x trial_s x SAFETY + MARGIN_S."""
    return float(step.fixed_s) if step.fixed_s else trials(step, host) * trial_s * SAFETY + MARGIN_S


def project_root(here: Path | None = None) -> Path | None:
    """The checkout or bundle this file belongs to, when it holds the profiles (experiments/*.yaml) every command's
    configuration starts from. Found from this file, not from the current folder, so that the check runs the same
    from anywhere; a bundle carries params.yaml and experiments/ for it (pipeline/doctor/bundle.py)."""
    here = here or REPO
    return here if any((here / "experiments").glob("*.yaml")) else None


def config(out_root: Path, root: Path | None) -> list[str]:
    """The --set options of every step that reads the configuration: the synthetic data in OUT/data (absolute, so it
    lands in OUT whatever the root), and without profiles beside this file the built-in defaults (profile=)."""
    sets = ["data.source=synthetic", f"data.dir={out_root / 'data'}", *([] if root else ["profile="])]
    return [a for s in sets for a in ("--set", s)]


def expand(argv, out: Path, sets) -> list[str]:
    """argv with {out} filled in and CONFIG replaced by the shared --set options."""
    return [x for a in argv for x in (sets if a == CONFIG else [a.replace("{out}", str(out))])]


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
        elif any(k in prefix.rsplit(".", 1)[-1].lower() for k in KEYS) and (not isinstance(v, str) or len(v) <= 160):
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
        row = {
            "ordinal": i,
            "name": props.name,
            "uuid": str(getattr(props, "uuid", "")),
            "pci": [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")],
            "nvml_index": guard(lambda: torch.cuda._get_nvml_device_index(i)),
        }
        if pynvml:
            row["nvml_uuid_at_same_index"] = guard(
                lambda: pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            )
        gpus.append(row)

    def smi(*args):
        return guard(lambda: subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=15).stdout)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "nvml": nvml_error or "pynvml imported",
                "gpus": gpus,
                "nvidia_smi_L": smi("-L"),
                "nvidia_smi_topo": smi("topo", "-m"),
            },
            indent=1,
            default=str,
        )
    )


def overlap_only(out: Path, overrides) -> None:
    """The overlap stage's measurement (G10) as the stage makes it, without the stage's MLflow run: the documented
    GPU node has no MLflow, and the finding is in overlap.json."""
    from pipeline.config import loader
    from pipeline.scaling import overlap

    overlap.run(loader.load(None, overrides), out)


def _kill(proc) -> None:
    """The step's whole session: its process, and the ranks and workers it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _spawn(cmd, out: Path, base: Path, env: dict, timeout_s: float) -> tuple[int | None, str, str]:
    """Run cmd in a session of its own (a timeout kills its ranks too), its output in files, not pipes, which a
    surviving grandchild would hold open: (exit status, or None at the timeout; stdout; stderr)."""
    so, se = out / ".stdout", out / ".stderr"
    with so.open("w") as o, se.open("w") as e:
        proc = subprocess.Popen(cmd, cwd=base, env=env, stdout=o, stderr=e, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            code = None
        except BaseException:  # Ctrl-C: the step goes with the run
            _kill(proc)
            raise
    texts = so.read_text(errors="replace"), se.read_text(errors="replace")
    so.unlink()
    se.unlink()
    return code, *texts


def run_step(step: Step, out: Path, timeout_s: float, python: str = sys.executable) -> Result:
    """One step as a subprocess in OUT, killed at timeout_s; its output goes to its folder's log.txt. Its
    configuration is the project root's (DVC_ROOT), whatever the current folder; what it writes goes to OUT."""
    out.mkdir(parents=True, exist_ok=True)
    base, root = out.parent.parent, project_root()
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)  # a checkout's pipeline too
    env = {
        **os.environ,
        "DVC_ROOT": str(root or base),
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
    }
    env.pop("DVC_STAGE", None)  # inside a DVC stage repo_root() would be the current folder's project
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(base / ".torchinductor"))  # not the root's runs/
    sets = config(base, root)
    t0 = time.monotonic()
    for argv in (step.argv, step.fallback):
        if not argv:
            break
        cmd = [python, *expand(argv, out, sets)]
        code, stdout, stderr = _spawn(cmd, out, base, env, timeout_s)
        (out / "log.txt").write_text(f"$ {' '.join(cmd)}\n{stdout}{stderr}")
        if code is None:
            return Result(step.name, "timeout", f"no result in {timeout_s:.0f} s", time.monotonic() - t0)
        if not (code == 2 and "unrecognized arguments" in stderr):
            break
    last = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1][:200]
    res = Result(
        step.name,
        "passed" if code == 0 else "failed",
        "" if code == 0 else last,
        time.monotonic() - t0,
        code,
        figures(out),
    )
    if argv is step.fallback and step.fallback:
        res.why = (res.why + "; " if res.why else "") + f"this build rejects {step.argv[-2]} (ran without it)"
    fixtures = sorted((out / "events").glob("events-*.json"))  # doctor --dump-events: one per profiled trial
    if fixtures:
        res.figures["replay_fixtures"] = ", ".join(str(f) for f in fixtures)
    return res


def _calibrated(res: Result, limit: float) -> dict:
    """The per-trial cost the calibration step gives, and where it comes from."""
    if res.status == "passed":
        return {"trial_s": round(res.seconds, 2), "from": f"the calibration step: one trial took {res.seconds:.1f} s"}
    if res.status == "timeout":
        return {"trial_s": limit, "from": f"the calibration ran out of its {limit:.0f} s: a trial costs at least that"}
    return {"trial_s": DEFAULT_TRIAL_S, "from": f"the default {DEFAULT_TRIAL_S:g} s: the calibration {res.status}"}


def run_plan(plan, out: Path, budget_s: float, host, runner=run_step, trial_s: float | None = None, done=None):
    """The steps in order, each under min(its sized limit, what is left of the budget); a step whose trials would
    need more than what is left is not started. The calibration step's seconds become the per-trial cost of the
    steps after it (trial_s given: that cost, no calibration). done(results, cost), if given, hears the results so
    far after each step. Returns the results and that cost with its source."""
    cost = (
        {"trial_s": trial_s, "from": "--trial-s"}
        if trial_s
        else {"trial_s": DEFAULT_TRIAL_S, "from": f"the default {DEFAULT_TRIAL_S:g} s: no calibration ran"}
    )
    results, start = [], time.monotonic()
    for step in plan:
        n, left = trials(step, host), budget_s - (time.monotonic() - start)
        need = 0 if step.fixed_s else n * cost["trial_s"]
        if skip := skipped(step, host):
            res = Result(step.name, "skipped", skip)
        elif step.calibrates and trial_s:
            res = Result(step.name, "skipped", f"--trial-s {trial_s:g}: the limits are sized on it")
        elif left < max(need, MIN_LEFT_S):
            res = Result(
                step.name,
                "not run",
                f"the {budget_s:.0f} s budget was spent"
                if left < MIN_LEFT_S
                else f"its {n} trials need about {need:.0f} s at {cost['trial_s']:.1f} s each, and {left:.0f} s "
                f"of the {budget_s:.0f} s budget are left",
            )
        else:
            limit = limit_s(step, host, cost["trial_s"])
            res = runner(step, out / "steps" / step.name, min(limit, left))
            res.limit_s = round(min(limit, left), 1)
            if left < limit:
                cut = f"its {limit:.0f} s limit cut to the {left:.0f} s left of the budget"
                res.why = f"{res.why}; {cut}" if res.why else cut
            if step.calibrates:
                cost = _calibrated(res, limit)
        res.trials = n
        results.append(res)
        if done:
            done(results, cost)
    return results, cost


def rows(plan, results) -> list[dict]:
    """One row per finding: the steps that exercised it, their outcome and figures, or why it was not."""
    by_step = {r.step: r for r in results}
    out = []
    for g in FINDINGS:
        steps = [s for s in plan if g in s.findings]
        ran = [by_step[s.name] for s in steps if s.name in by_step and by_step[s.name].status in ("passed", "failed")]
        if ran:
            shown = "; ".join(f"{r.step}: {r.status}" + (f" ({r.why})" if r.why else "") for r in ran)
            out.append(
                {
                    "finding": g,
                    "exercised": True,
                    "ran": [s.what for s in steps],
                    "showed": shown,
                    "figures": {r.step: r.figures for r in ran},
                }
            )
        else:
            why = "; ".join(
                f"{by_step[s.name].step}: {by_step[s.name].status} ({by_step[s.name].why})"
                for s in steps
                if s.name in by_step
            ) or UNCOVERED.get(g, "no step of this run covers it")
            out.append(
                {
                    "finding": g,
                    "exercised": False,
                    "ran": [s.what for s in steps],
                    "showed": f"not exercised: {why}",
                    "figures": {},
                }
            )
    return out


STOPPED = "the check stopped before it"  # a step a report written mid-run has not reached


def write_report(path: Path, plan, results, facts: dict) -> dict:
    """first-run.md: the per-finding table, the steps, then everything as one JSON block (load() reads it back).
    Each step without a result yet is "not run" because the check stopped before it: the report is rewritten
    after every step, so a run killed by an outer limit leaves the steps it finished."""
    have = {r.step for r in results}
    results = list(results) + [Result(s.name, "not run", STOPPED) for s in plan if s.name not in have]
    report = {"facts": facts, "steps": [asdict(r) for r in results], "findings": rows(plan, results)}
    title = "# Parallax: first GPU run" + (", rehearsed on a CPU" if facts.get("rehearsal") else "")
    lines = (
        [title, ""]
        + [f"- {k}: {v}" for k, v in facts.items()]
        + ["", "| finding | ran | what the hardware showed | figures |", "|---|---|---|---|"]
    )
    for r in report["findings"]:
        figs = "; ".join(f"{k}={v}" for fs in r["figures"].values() for k, v in list(fs.items())[:8])
        lines.append(f"| {r['finding']} | {', '.join(r['ran']) or '-'} | {r['showed']} | {figs[:600] or '-'} |")
    lines += ["", "| step | status | trials | limit s | seconds | why |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r.step} | {r.status} | {r.trials} | {'-' if r.limit_s is None else f'{r.limit_s:.0f}'} | "
        f"{r.seconds:.1f} | {r.why or '-'} |"
        for r in results
    ]
    lines += ["", "```json", json.dumps(report, indent=1, default=str), "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")  # a kill while writing leaves the last whole report
    part.write_text("\n".join(lines))
    os.replace(part, path)
    return report


def load(path: Path) -> dict:
    """The JSON block of a first-run.md."""
    text = path.read_text()
    return json.loads(text[text.rindex("```json") + len("```json") : text.rindex("```")])


def print_plan(plan, host, trial_s: float, source: str, budget_s: float, out: Path = Path("OUT")) -> None:
    """The dry run: each step with its trials, its sized limit and whether it runs here, then the budget."""
    print(f"per-trial cost: {trial_s:g} s, {source}")
    print(
        f"each step's limit: its trials x {trial_s:g} s x {SAFETY:g} + {MARGIN_S} s; host, data and calibration "
        f"have fixed limits"
    )
    sets, count = config(out, project_root()), 0
    for i, s in enumerate(plan, 1):
        n = trials(s, host)
        skip = skipped(s, host)
        count += 0 if skip else n
        print(
            f"{i:2d}. {s.name} [{', '.join(s.findings) or 'setup'}] {n} trial{'s' * (n != 1)}, limit "
            f"{limit_s(s, host, trial_s):.0f} s{' (fixed)' if s.fixed_s else ''}: {s.what}\n"
            + (f"    skipped here: {skip}\n" if skip else "")
            + f"    python {' '.join(expand(s.argv, out / 'steps' / s.name, sets))}"
        )
    expected = count * trial_s
    print(
        f"budget {budget_s:.0f} s: {count} trials at {trial_s:g} s, about {expected:.0f} s expected "
        + ("(within the budget)" if expected <= budget_s else "(over the budget: the last steps will not run)")
        + "; each step runs under min(its limit, what is left), and one whose trials need more than is left is "
        "not started"
    )


def main(argv=None) -> int:
    from pipeline.cli.types import count, positive
    from pipeline.config.schema import DEVICES_MAX

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("first-run"), help="default: ./first-run")
    p.add_argument(
        "--budget-s",
        type=positive("seconds of budget"),
        default=580,
        help="the whole run's wall-clock budget (default 580)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan, each step's trials and sized limit, and exit (any host)"
    )
    p.add_argument(
        "--gpus",
        type=count("GPUs", hi=DEVICES_MAX),
        metavar="N",
        help="with --dry-run: plan for a node with N GPUs (default: this host's; one without CUDA)",
    )
    p.add_argument(
        "--trial-s",
        type=positive("seconds per trial"),
        metavar="S",
        help=f"size the limits on S seconds per trial, no calibration (default: the calibration step "
        f"measures it; a dry run assumes {DEFAULT_TRIAL_S:g} s)",
    )
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="without CUDA: run the same plan smaller, each CUDA-only step skipped with its reason (a "
        "rehearsal of the check, not of the findings)",
    )
    p.add_argument("--host-facts", type=Path, metavar="FILE", help=argparse.SUPPRESS)  # the host step
    p.add_argument("--overlap", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # the overlap step
    p.add_argument("--set", dest="overrides", action="append", default=[], help=argparse.SUPPRESS)  # its config
    args = p.parse_args(argv)
    if args.host_facts:
        host_facts(args.host_facts)
        return 0
    if args.overlap:
        overlap_only(args.overlap, args.overrides)
        return 0
    if args.gpus and not args.dry_run:
        p.error("--gpus plans a node for --dry-run; a run uses the GPUs it has")
    import torch

    from pipeline.host.devices import Host, probe

    host = probe()
    if args.dry_run:
        if args.gpus or (host.kind != "cuda" and not args.allow_cpu):
            n = args.gpus or (host.n if host.kind == "cuda" else 1)
            print(
                f"plan for a node with {n} CUDA device{'s' * (n != 1)}"
                + ("" if args.gpus else " (this host has none: --gpus N for another node, --allow-cpu for this CPU)")
            )
            host = Host("cuda", n, "(planned)", host.hostname, host.torch, "")
        else:
            print(f"plan for this host: {host.kind} x{host.n} ({host.name})")
        source = (
            "given (--trial-s)"
            if args.trial_s
            else "the stated default: a dry run does not calibrate (a run "
            "times one trial first; --trial-s S sizes on S)"
        )
        print_plan(build_plan(host.kind), host, args.trial_s or DEFAULT_TRIAL_S, source, args.budget_s)
        return 0
    if host.kind != "cuda" and not args.allow_cpu:
        print(
            "gpu_first_run needs CUDA: this host has no CUDA device (--dry-run shows the plan; --allow-cpu runs it "
            "here, smaller, with the CUDA-only steps skipped)",
            file=sys.stderr,
        )
        return 2
    root = project_root()
    facts = {
        "host": f"{host.kind} x{host.n} ({host.name})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": host.n if host.kind == "cuda" else 0,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"),
        "budget_s": args.budget_s,
        "configuration": f"{root}: its params.yaml and experiments/ (every step's DVC_ROOT)"
        if root
        else f"the built-in defaults (profile=): no experiments/*.yaml in {REPO}",
    }
    if host.kind != "cuda":
        facts["rehearsal"] = "on a CPU (--allow-cpu): the CUDA-only steps are skipped; nothing here is a GPU finding"
    out = args.out.resolve()
    plan = build_plan(host.kind)

    def report(results, cost):
        facts["trial_s"], facts["trial_s_from"] = cost["trial_s"], cost["from"]
        write_report(out / "first-run.md", plan, results, facts)

    write_report(out / "first-run.md", plan, [], facts)  # killed in the first step, it still says what ran where
    results, cost = run_plan(plan, out, args.budget_s, host, trial_s=args.trial_s, done=report)
    print(f"wrote {out / 'first-run.md'}: " + ", ".join(f"{r.step} {r.status}" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
