"""`python -m pipeline doctor`: on this host, in one command, which strategies run, whether each agrees with
single-device SGD, and what each costs (img/s, per-device peak memory); the others are unavailable, with the reason.

For every strategy and k = 1..min(N, 2, --max-devices): the one-step equivalence check the tests use
(pipeline/doctor/equivalence.py: TF32 off), one short timed run (the host's TF32 switches: an fp32 row on a GPU whose
cuDNN convolutions use TF32 is labelled "fp32 (TF32 convs)"), the per-device peak memory. ddp_amp runs twice, bf16 and
fp16 (+GradScaler). A host with fewer than two devices also runs the multi-process strategies at k=2 with ranks
sharing its device (Gloo), tagged `oversubscribed`: a functional check whose timings mean nothing.
Needs only the training core: no MLflow, Optuna or DVC. Writes doctor.json and doctor.md.
`--dump-events DIR`: each profiled trial process (dp, dp_criterion, fsdp) writes its first sampled step's profiler
events to DIR (comm_probes.dump_events): on a GPU host, the replay fixtures tests/fixtures/ takes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline import catalog, paths, scratch
from pipeline.config import loader
from pipeline.config.settle import DDP_SETTLE_STEPS
from pipeline.data import store
from pipeline.doctor import equivalence
from pipeline.errors import DataError, Infeasible
from pipeline.host.capabilities import fp32_label, host_capabilities
from pipeline.host.devices import Host, probe
from pipeline.measure.comm_probes import DUMP_ENV
from pipeline.strategies import STRATEGIES
from pipeline.trial import graphs
from pipeline.trial.launch import check_feasible, host_mode_refusal, run_trial

MIB = 2**20
# every row's timed window opens after DDP's synchronised iterations 1-10 (config/settle.py says where in torch; the
# next is the 100th, past the doctor's timed steps), Meter timing from step index warmup_steps on: the same steps
# for all strategies, none of them synchronised by DDP's statistics
WARMUP_STEPS = DDP_SETTLE_STEPS


def warmup(base, strategy: str) -> int:
    """A timed run's warm-up steps: WARMUP_STEPS, and under train.cuda_graphs past the graph's capture as well
    (graphs.min_warmup), so its timed steps are replays."""
    return max(WARMUP_STEPS, graphs.min_warmup(strategy)) if base.train.cuda_graphs else WARMUP_STEPS


TEST_IMAGES = 256  # what each timed run evaluates: its accuracy is no figure doctor reports


@dataclass(frozen=True)
class Case:
    strategy: str
    k: int
    sets: tuple[str, ...] = ()  # extra configuration of this variant (e.g. train.amp_dtype=fp16)
    variant: str = ""  # its name in the table
    tag: str = ""  # "oversubscribed": ranks share a device; functional only


@dataclass
class Row:
    strategy: str
    k: int
    variant: str
    tag: str
    status: str = "failed"  # passed | failed | skipped (GradScaler skipped the check's step) | unavailable
    reason: str = ""  # why unavailable or skipped, or the error / the mismatch that failed it
    check: str = ""  # the equivalence verdict in words
    img_s: float | None = None
    step_ms: float | None = None
    peak_mem_mib_dev: list[float] = field(default_factory=list)  # per device, as mem_basis says (GPU: above resident)
    mem_method: str = ""
    mem_basis: str = ""
    resident_mib: list[float] = field(default_factory=list)  # GPU: data, model, optimizer, workspaces before step 1
    workspace_mib: list[float] = field(default_factory=list)  # GPU: of the resident, the libraries' workspaces
    reserved_peak_mib: list[float] = field(default_factory=list)  # GPU: the caching allocator's reserved peak
    nvml_used_mib: list[float] = field(default_factory=list)  # GPU: NVML's used memory (every process, contexts)
    amp_scale: float | None = None  # fp16: GradScaler's final scale
    amp_skipped_steps: int | None = None  # fp16: optimizer steps GradScaler skipped in the timed run
    amp_step_syncs: bool | None = None  # fp16: GradScaler read found_inf to the host every step (no fused optimizer)
    backend: str = ""
    amp_dtype: str = ""
    comm_hook_used: str = ""
    steps: int = 0  # steps asked of the timed run after warm-up: an emulated dtype's, fewer or as many as the settings'
    warmup_steps: int = 0  # the timed run's warm-up (warmup()): the settings', or past its capture under CUDA graphs
    # steps the timed run timed (its record's timed_steps): `steps` less those the breakdown sampled
    # (train.breakdown_every), which leave the timing; None where it did not run
    timed_steps: int | None = None
    # the timed run measured under interference (measure/interference.py, as a sweep trial is): 1 flagged, 0 not
    flagged: int | None = None
    flagged_reason: str = ""
    seconds: float = 0.0


def plan(host: Host, strategies, max_devices: int = 2) -> list[Case]:
    """The cases to run on `host`, in table order."""
    kmax = max(1, min(host.n, 2, max_devices))
    cases = []
    for name in strategies:
        row, variants = catalog.spec(name), STRATEGIES[name].VARIANTS
        for k in [1] if row.one_device_only else range(1, kmax + 1):
            cases += [Case(name, k, sets, variant) for variant, sets in variants]
        if row.multiprocess and host.n < 2 <= max_devices:  # ranks sharing the device: the first variant suffices
            variant, sets = variants[0]
            cases.append(Case(name, 2, ("train.oversubscribe=true", *sets), variant, "oversubscribed"))
    return cases


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def run_case(
    case: Case,
    base,
    host: Host,
    ref: dict | None,
    init: dict,
    work: Path,
    steps: int,
    per_device_batch: int,
    model: str,
    emulated: tuple[str, ...] = (),
) -> Row:
    """One row: feasibility, the equivalence step, the timed run. `emulated`: dtypes this host only emulates
    (their timed run is cut to a sixth of the steps, at least 5, never more than `steps`: an emulated fp16 step on a
    CPU is ~10x slower)."""
    row = Row(case.strategy, case.k, case.variant, case.tag)
    if any(f"amp_dtype={d}" in s for d in emulated for s in case.sets):
        steps = min(steps, max(5, steps // 6))
    row.steps = steps
    t0 = time.perf_counter()
    sets = (f"train.strategy={case.strategy}", f"train.devices={case.k}", *case.sets)
    # a setting only some rows run with (catalog.APPLIES_WITH: ddp_amp's amp_dtype) is the others' default, as in a
    # sweep's trials: a trial refuses a setting it would record and never run (loader.unapplied_refusal)
    sets += tuple(f"train.{k}={v}" for k, v in loader.unapplied(loader.override(base, sets).train).items())
    try:
        check_feasible(loader.override(base, sets), host)
    except Infeasible as e:
        row.status, row.reason = "unavailable", str(e)
        return row
    if ref is None:
        row.reason = "the single-device reference step failed; nothing to compare with"
        return row
    try:
        tag = f"{case.strategy}-{case.k}-{case.variant or 'fp32'}-{case.tag or 'x'}".replace("+", "")
        got, eq = equivalence.one_step(base, work / f"eq-{tag}", case.strategy, case.k, extra=case.sets)
        verdict = equivalence.check(
            ref, got, eq, init=init, low_precision="amp_dtype" in " ".join(case.sets), device_kind=host.kind
        )
        row.check = verdict.detail
        batch = per_device_batch * case.k
        row.warmup_steps = warm = warmup(base, case.strategy)
        cfg = loader.override(
            base,
            [
                *sets,
                f"train.model={model}",
                f"train.batch_size={batch}",
                f"train.warmup_steps={warm}",
                f"train.max_steps={warm + steps}",
                f"data.train_limit={batch * (warm + steps + 1)}",
                f"data.test_limit={TEST_IMAGES}",
            ],
        )
        m = run_trial(cfg, work / f"timed-{tag}", progress=False, timeout_s=cfg.sweep.trial_timeout_s)
        row.img_s = m["throughput_img_s"]
        row.timed_steps = m.get("timed_steps")
        row.step_ms = 1000 * batch / row.img_s if row.img_s else None
        interference = m.get("interference") or {}
        if "interfered" in interference:
            row.flagged = int(bool(interference["interfered"]))
            row.flagged_reason = interference.get("interference_reason") or ""
        row.peak_mem_mib_dev = [round(p / MIB, 2) for p in m["peak_mem_bytes"] or []]
        row.mem_method, row.backend = m["mem_method"], m.get("backend") or ""
        row.mem_basis = m.get("mem_basis") or ""
        row.resident_mib, row.workspace_mib, row.reserved_peak_mib, row.nvml_used_mib = (
            [round(p / MIB, 2) for p in m.get(key) or []]
            for key in ("mem_resident_bytes", "mem_workspace_bytes", "mem_reserved_peak_bytes", "mem_nvml_used_bytes")
        )
        row.amp_scale, row.amp_skipped_steps, row.amp_step_syncs = (
            m.get("amp_scale"),
            m.get("amp_skipped_steps"),
            m.get("amp_step_syncs"),
        )
        row.amp_dtype, row.comm_hook_used = m.get("amp_dtype") or "", m.get("comm_hook_used") or ""
        row.status = "passed" if verdict.ok else "skipped" if verdict.skipped else "failed"
        row.reason = (
            ""
            if verdict.ok
            else verdict.detail
            if verdict.skipped
            else f"does not match single-device SGD: {verdict.detail}"
        )
    except Exception as e:  # a doctor reports a broken strategy; it does not crash on it
        row.status, row.reason = "failed", _first_line(e)
    finally:
        row.seconds = round(time.perf_counter() - t0, 2)
    return row


def _data_root(base) -> Path:
    root = Path(base.data.dir)
    return root if root.is_absolute() else paths.repo_root() / root


def _data(base, work: Path) -> tuple[str, str]:
    """(dir, source): the configured data if it is prepared, else the synthetic stand-in made in `work` (a --set of
    data.dir or data.source that would fall back to it is refused before: _data_refusal)."""
    root = _data_root(base)
    try:
        store.load(root, base.data.source, 1, 1)
        return str(root), base.data.source
    except DataError:
        store.prepare(work / "data", "synthetic", progress=False)
        return str(work / "data"), "synthetic"


def run(
    base,
    out: Path,
    strategies=None,
    max_devices: int = 2,
    steps: int = 30,
    per_device_batch: int = 128,
    model: str = "lenet",
    say=print,
    dump_events: Path | None = None,
    sets: dict | None = None,
) -> dict:
    """Run every case, write out/doctor.json and out/doctor.md, return the report. `sets`: the user's --set options
    that took effect ({dotted key: value}, `took_effect`), recorded in the settings."""
    if dump_events is not None:  # read by breakdown.Breakdown in every trial process (spawned ranks inherit it)
        os.environ[DUMP_ENV] = str(Path(dump_events).resolve())
        try:
            return run(base, out, strategies, max_devices, steps, per_device_batch, model, say, sets=sets)
        finally:
            os.environ.pop(DUMP_ENV, None)
            say(
                f"profiler events of the profiled strategies' first sampled step: {dump_events}"
                + ("" if base.train.breakdown_every else " (none: train.breakdown_every=0 samples no step)")
            )
    host = probe()
    strategies = list(strategies or catalog.NAMES)
    caps = host_capabilities(host)
    say(
        f"doctor: {host.kind} x{host.n} ({host.name}); torch {caps['torch']}"
        + (
            f", CUDA {caps['cuda']}, NCCL {caps['nccl']}"
            if host.kind == "cuda"
            else f", CPU ISA {caps['cpu']['isa_text']}"
        )
        + f"; bf16 {caps['bf16']}, fp16 {caps['fp16']}"
        + (f"; TF32: {caps['tf32_text']}" if caps["tf32_text"] else "")
    )
    with scratch.folder("parallax-doctor-") as tmp:  # also removes the folders of killed doctor runs
        work = Path(tmp)
        data_dir, source = _data(base, work)
        base = loader.override(base, [f"data.dir={data_dir}", f"data.source={source}", "train.epochs=1"])
        if source == "synthetic":
            say("data: SYNTHETIC stand-in (not Fashion-MNIST): equivalence and speed only, accuracy means nothing")
        init = equivalence.initial_state()
        try:  # single-device SGD, whose math the knobs it has none of (a comm hook, the buckets) do not change
            ref, _ = equivalence.one_step(own_knobs(base, catalog.REFERENCE), work / "reference", catalog.REFERENCE, 1)
        except Exception as e:
            ref = None
            say(f"the single-device reference step failed: {_first_line(e)}")
        cases = plan(host, strategies, max_devices)
        rows = []
        for i, case in enumerate(cases, 1):
            row = run_case(
                case,
                base,
                host,
                ref,
                init,
                work,
                steps,
                per_device_batch,
                model,
                tuple(d for d in ("bf16", "fp16") if caps[d] != "native"),
            )
            rows.append(row)
            said = asdict(row)  # the labels doctor.md gives its speed and steps: _speed_notes, _steps_note
            say(
                f"[{i}/{len(cases)}] {_label(said)}: {row.status}"
                + (f", {row.img_s:,.0f} img/s{_speed_notes(said)}{_steps_note(said, steps)}" if row.img_s else "")
                + (f" - {row.reason.splitlines()[0]}" if row.reason else "")
                + f" ({row.seconds:.1f} s)"
            )
    report = {
        "host": caps,
        "data_source": source,
        "synthetic": source == "synthetic",
        "settings": {
            "model": model,
            "steps": steps,
            "per_device_batch": per_device_batch,
            "max_devices": max_devices,
            "warmup_steps": WARMUP_STEPS,
            # the optimizer the step takes: SGD unless a --set chose another (train.optimizer)
            "equivalence": f"one {base.train.optimizer} step"
            + (", eager (a CUDA graph's replays are not compared)" if base.train.cuda_graphs else "")
            + f", lr {equivalence.LR}, LeNet, global batch 64, against "
            f"`single`, TF32 off, fp16 GradScaler from scale {equivalence.FP16_INIT_SCALE:g}",
            "sets": dict(sets or {}),
            # what the equivalence step takes whatever --set says: such a --set reaches the timed run only
            "equivalence_sets": equivalence.own_settings(base),
        },
        "rows": [asdict(r) for r in rows],
        "counts": {s: sum(r.status == s for r in rows) for s in ("passed", "failed", "skipped", "unavailable")},
    }
    write(report, out)
    return report


def _label(r: dict) -> str:
    extra = ", ".join(x for x in (r["variant"], r["tag"]) if x)
    return f"{r['strategy']} k={r['k']}" + (f" ({extra})" if extra else "")


def precision(r: dict, h: dict) -> str:
    """The row's arithmetic: its autocast type, else fp32, "fp32 (TF32 convs)" where the timed run's cuDNN
    convolutions use TF32 (capabilities.fp32_label)."""
    amp = r.get("amp_dtype") or r["variant"].split("+")[0]
    if amp in ("bf16", "fp16", "bfloat16", "float16"):
        return {"bfloat16": "bf16", "float16": "fp16"}.get(amp, amp)
    return fp32_label(h)


def markdown(report: dict) -> str:
    h = report["host"]
    lines = [
        f"# Parallax doctor: {h['hostname']}",
        "",
        f"- devices: {h['kind']} x{h['devices']} ({h['name']})",
        f"- torch {h['torch']}, Python {h['python']}, CUDA build {h['cuda'] or '-'}, cuDNN {h['cudnn'] or '-'}, "
        f"NCCL {h['nccl'] or '-'}, Gloo {'yes' if h['gloo'] else 'no'}",
        f"- CPU ISA: {h['cpu']['isa_text']} (PyTorch kernels: {h['cpu']['torch_cpu_capability']})",
        f"- bf16 {h['bf16']}, fp16 {h['fp16']} on these devices ("
        + (
            "; ".join(f"GPU {g['index']} {g['name']}: cc {g['compute_capability']}" for g in h.get("gpus", []))
            or f"bf16: {h['cpu']['bf16_why']}; fp16: {h['cpu']['fp16_why']}"
        )
        + ")",
        # TF32 is a cuDNN/cuBLAS switch: a CPU host has no line for it
        *(
            [f"- TF32: {h.get('tf32_text') or 'not recorded'} (the timed runs; the equivalence step pins fp32)"]
            if h["kind"] == "cuda"
            else []
        ),
        f"- data: {report['data_source']}" + (" (SYNTHETIC stand-in, labelled)" if report["synthetic"] else ""),
        f"- equivalence: {report['settings']['equivalence']}; timed run: {report['settings']['model']}, "
        f"{report['settings']['steps']} steps after warm-up"
        + (
            f" ({w} steps: past DDP's runtime statistics{_past_capture(report, w)})"
            if (w := report["settings"].get("warmup_steps"))
            else ""
        )
        + f", batch {report['settings']['per_device_batch']} per device",
        f"- {report['counts']['passed']} passed, {report['counts']['failed']} failed, "
        + (f"{report['counts']['skipped']} skipped, " if report["counts"].get("skipped") else "")
        + f"{report['counts']['unavailable']} unavailable",
        *([f"- --set: {_sets_text(given)}{_timed_only(report)}"] if (given := report["settings"].get("sets")) else []),
        "",
        "| strategy | status | precision | img/s | ms/step | peak MiB per device | workspace MiB | memory from "
        "| backend | check or reason |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        tput = f"{r['img_s']:,.0f}{_speed_notes(r)}" if r["img_s"] else "-"
        step = f"{r['step_ms']:.1f}" if r["step_ms"] else "-"
        if r["step_ms"]:
            step += _steps_note(r, report["settings"]["steps"])
        lines.append(
            f"| {_label(r)} | {r['status']} | {precision(r, h)} | {tput} | {step} | "
            f"{', '.join(f'{p:.1f}' for p in r['peak_mem_mib_dev']) or '-'} | "
            f"{', '.join(f'{p:.1f}' for p in r.get('workspace_mib') or []) or '-'} | {r['mem_method'] or '-'} | "
            f"{r['backend'] or '-'} | {_said(r).replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def _speed_notes(r: dict) -> str:
    """What qualifies a row's img/s, the same in doctor.md and on the console: " (under load)", " (shared device: not
    a speed)", " (a host sync per step: GradScaler)"; "" for none."""
    notes = []
    if r["tag"] == "oversubscribed":
        notes.append("shared device: not a speed")
    elif r.get("flagged"):
        notes.append("under load")
    if r.get("amp_step_syncs"):
        notes.append("a host sync per step: GradScaler")
    return "".join(f" ({n})" for n in notes)


def _steps_note(r: dict, asked: int) -> str:
    """Where the row's timing rests on other steps than the header's: " (5 steps: emulated dtype)", " (27 of 30
    steps timed: 3 sampled for the breakdown)", both where both apply; else ""."""
    steps, timed = r.get("steps") or asked, r.get("timed_steps")
    why = ["emulated dtype"] if steps != asked else []
    if timed is not None and timed != steps:
        why.append(f"{steps - timed} sampled for the breakdown")
        return f" ({timed} of {steps} steps timed: {'; '.join(why)})"
    return f" ({steps} steps: {why[0]})" if why else ""


def _said(r: dict) -> str:
    """The row's check or reason, and why its timing is suspect where the run was measured under load."""
    text = r["reason"] or r["check"]
    if r.get("flagged"):
        text += f"; timing measured under load: {r.get('flagged_reason') or 'other processes used the host'}"
    return text


def write(report: dict, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "doctor.json").write_text(json.dumps(report, indent=2))
    (out / "doctor.md").write_text(markdown(report))


def _past_capture(report, settled: int) -> str:
    """The rows that warm up longer than `settled` steps, past their CUDA graph's capture: "; 12 for ddp (...)"."""
    longer: dict = {}
    for r in report["rows"]:
        if (r.get("warmup_steps") or 0) > settled:
            longer.setdefault(r["warmup_steps"], []).append(r["strategy"])
    return "".join(
        f"; {n} for {', '.join(dict.fromkeys(names))}, past the CUDA graph's capture" for n, names in longer.items()
    )


# the configuration doctor sets itself in every timed run, with the flag that sets it instead ("": none does) and why:
# a --set of one is refused (own_set_refusal), as doctor would override it unsaid
OWN_KEYS = {
    "train.strategy": ("--strategies", "each row runs its own strategy"),
    "train.devices": ("--max-devices", "each row runs its own k"),
    "train.model": ("--model", "the timed run's model"),
    "train.batch_size": ("--batch-per-device", "the timed run's batch is the per-device batch times k"),
    "train.max_steps": ("--steps", "the timed run stops after its warm-up and timed steps"),
    "train.epochs": ("--steps", "the timed run is one epoch, cut at its steps"),
    "train.warmup_steps": ("", f"every timed run warms up {WARMUP_STEPS} steps, past DDP's synchronised ones"),
    "train.oversubscribe": ("", "doctor adds the rows whose ranks share a device on a one-device host"),
    "data.train_limit": ("--steps or --batch-per-device", "the timed run's images are its steps' batches"),
    "data.test_limit": ("", f"the timed run evaluates {TEST_IMAGES} images"),
}


# what doctor's runs read besides the train and data sections (a --set of anything else is refused: never run); the
# run's time limit, as a sweep trial's (run_trial's timeout_s)
READ_ELSEWHERE = ("sweep.trial_timeout_s",)
# why a --set of a key doctor's runs never read does not take effect: its section, or the key itself
UNREAD = {
    "profile": "doctor reads params.yaml and --set, never a profile: its rows are the strategies it checks",
    "data.mirror": "doctor downloads nothing: it runs on data.dir's prepared data, else the synthetic stand-in",
    "sweep": "doctor runs no sweep; of the sweep section its runs read only sweep.trial_timeout_s, each run's limit",
    "tracking": "doctor logs nothing to MLflow or a listener: it writes doctor.json and doctor.md",
}


def refusal(cfg, items, strategies) -> str:
    """Why doctor refuses to run `cfg` (params.yaml and the --set options `items`) on `strategies`: a --set of a key
    it sets itself (own_set_refusal) or its runs never read (_unread_refusal), a setting no row would run with
    (knob_refusal, _unapplied_refusal), a mode this host's kind of device cannot run (_host_refusal), data it would not
    use (_data_refusal); "" when every setting reaches a run.
    Each message names the key, why and what to do, and ends "Nothing was run."."""
    return (
        own_set_refusal(items, strategies)
        or _unread_refusal(items)
        or knob_refusal(cfg, strategies)
        or _unapplied_refusal(cfg, strategies)
        or _host_refusal(cfg)
        or _data_refusal(cfg, items)
    )


def _host_refusal(cfg) -> str:
    """Why doctor refuses a mode no row can run on this host's kind of device (launch.host_mode_refusal:
    train.cuda_graphs on a CPU host), before a row runs or the last report is replaced; "" otherwise."""
    if not (why := host_mode_refusal(cfg.train, probe())):
        return ""
    return f"{why.removesuffix('.')}: every row of doctor's would be unavailable. Leave it out. Nothing was run."


def _unread_refusal(items) -> str:
    """Why doctor refuses the first --set option in `items` that gives a key its runs never read: outside the train
    and data sections (READ_ELSEWHERE aside), or data.mirror; "" for none."""
    for item in items or ():
        for key in _set_keys(item):
            section = key.partition(".")[0]
            if key in READ_ELSEWHERE or (section in ("train", "data") and key not in UNREAD):
                continue
            why = UNREAD.get(key) or UNREAD.get(section) or f"the {section} section configures another command"
            return (
                f"--set {item!r}: doctor's runs never read `{key}` ({why}), so this --set would not take effect. "
                "Leave it out. Nothing was run."
            )
    return ""


def _unapplied_refusal(cfg, strategies) -> str:
    """Why doctor refuses a setting of catalog.APPLIES_WITH away from its default that no row of `strategies` runs
    with (as the sweep refuses it, loader.sweep_refusal): its knob is off, or no selected row has the design; ""
    otherwise."""
    defaults = loader.TrainConfig()
    for k, (_, need) in catalog.APPLIES_WITH.items():
        value = getattr(cfg.train, k)
        points = [(s, {n: getattr(cfg.train, n) for n in catalog.knobs(s)}) for s in strategies]
        if value == getattr(defaults, k) or any(catalog.applies(k, s, point) for s, point in points):
            continue
        rows = catalog.designed_with(k)
        fixes = (
            [f"turn `{need}` on (`--set train.{need}=true`)"]
            if any(need in catalog.knobs(s) for s in strategies)
            else []
        )
        fixes += [f"select {' or '.join(rows)} with --strategies"] if rows else []
        return (
            f"`train.{k}={_text(value)}` reaches none of doctor's rows ({', '.join(strategies)}): "
            f"{catalog.applies_with(k, _text(value))}, so its runs would never run with it. To use it, "
            f"{', or '.join(fixes)}; else leave it out. Nothing was run."
        )
    return ""


def _data_refusal(cfg, items) -> str:
    """Why doctor refuses a --set of data.dir or data.source whose data is not prepared: doctor would run on the
    synthetic stand-in instead (_data). data.source=synthetic alone asks for the stand-in: "" for it, as for none."""
    asked = [(item, key) for item in items or () for key in _set_keys(item) if key in ("data.dir", "data.source")]
    if not asked or (cfg.data.source == "synthetic" and all(key == "data.source" for _, key in asked)):
        return ""
    root = _data_root(cfg)
    try:
        store.load(root, cfg.data.source, 1, 1)
        return ""
    except DataError as e:
        return (
            f"--set {asked[-1][0]!r}: doctor finds no {cfg.data.source} data in {root} ({e}), so its runs would use "
            "the synthetic stand-in instead. Prepare the data first, or leave the --set out to run on the stand-in. "
            "Nothing was run."
        )


def own_knobs(cfg, strategy: str):
    """`cfg` with every knob `strategy` has none of (catalog.knobs) at its default: the reference step's Config,
    which a --set of another strategy's knob (train.comm_hook for ddp's rows) would otherwise refuse."""
    defaults = loader.TrainConfig()
    away = [
        k for k in catalog.KNOBS if k not in catalog.knobs(strategy) and getattr(cfg.train, k) != getattr(defaults, k)
    ]
    return loader.override(cfg, [f"train.{k}={json.dumps(getattr(defaults, k))}" for k in away]) if away else cfg


def knob_refusal(cfg, strategies) -> str:
    """Why doctor refuses a knob `cfg` sets away from its default that none of `strategies` has (catalog.knobs): no
    row would run with it. "" when each knob set reaches a row; a row whose strategy lacks it is unavailable, with
    the reason (launch.check_feasible)."""
    defaults = loader.TrainConfig()
    for k in catalog.KNOBS:
        value = getattr(cfg.train, k)
        if value == getattr(defaults, k) or any(k in catalog.knobs(s) for s in strategies):
            continue
        why = next((f" ({s}: {w})" for s in strategies if (w := catalog.why_not(s, k))), "")
        every = [n for n in catalog.NAMES if k in catalog.knobs(n)]
        return (
            f"`train.{k}={_text(value)}` reaches none of doctor's rows: {', '.join(f'`{s}`' for s in strategies)} "
            f"{'has' if len(strategies) == 1 else 'have'} no `{k}` knob{why}. Select a strategy that takes it with "
            f"--strategies ({', '.join(every)}), or leave it out. Nothing was run."
        )
    return ""


def _set_keys(item: str) -> list[str]:
    """The dotted keys one --set option gives a value or removes (a mapping's value: each key inside it)."""
    body = item.lstrip("+~")
    key, sep, _ = body.partition("=")
    if item.startswith("~") or not sep:
        return [key]

    def flat(node, prefix):
        return [k for n, v in node.items() for k in (flat(v, f"{prefix}{n}.") if isinstance(v, dict) else [prefix + n])]

    return flat(loader.parse_set([body]), "")


def own_set_refusal(items, strategies) -> str:
    """Why doctor refuses the first --set option in `items` that gives a key doctor sets itself (OWN_KEYS, and the
    keys of `strategies`' variants: ddp_amp's train.amp_dtype), naming the flag to use instead; "" for none."""
    own = dict(OWN_KEYS)
    for name in strategies:
        variants = STRATEGIES[name].VARIANTS
        for _, sets in variants:
            for s in sets:
                own[s.partition("=")[0]] = ("", f"{name} runs once per variant: {', '.join(v for v, _ in variants)}")
    for item in items or ():
        for key in _set_keys(item):
            if key in own:
                flag, why = own[key]
                return (
                    f"--set {item!r}: doctor sets `{key}` itself ({why}), so this --set would not take effect. "
                    + (f"Use {flag} instead." if flag else "Leave it out: doctor takes no other value of it.")
                    + " Nothing was run."
                )
    return ""


def took_effect(cfg, items) -> dict:
    """{dotted key: the value `cfg` holds} for every key the --set options `items` give or remove, in their order:
    what doctor records in its settings (the --set options it refuses are never run)."""
    out = {}
    for item in items or ():
        for key in _set_keys(item):
            value = cfg
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
            out.pop(key, None)
            out[key] = asdict(value) if hasattr(value, "__dataclass_fields__") else value
    return out


def _text(v) -> str:
    """A value as a --set spells it (YAML's spelling of a non-text value: true, 0.001, null)."""
    return v if isinstance(v, str) else json.dumps(v)


def _timed_only(report: dict) -> str:
    """The --set options that reach the timed run only, the equivalence step taking its own value of them
    (equivalence.own_settings), in words: "" for none."""
    given, own = report["settings"].get("sets") or {}, report["settings"].get("equivalence_sets") or {}
    apart = [f"{k}={_text(own[k])}" for k in given if k in own and own[k] != given[k]]
    return f" (the timed run only: the equivalence step runs {', '.join(apart)})" if apart else ""


def _sets_text(sets: dict) -> str:
    """The --set options that took effect, as key=value (YAML's spelling of a non-text value: true, 0.001, null)."""
    return ", ".join(f"{k}={_text(v)}" for k, v in sets.items())
