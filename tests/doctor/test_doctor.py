"""`doctor`: what it plans on each kind of host, what it writes, and that a broken strategy is a failed row."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from pipeline.config.settle import DDP_RUNTIME_STATS_ITERATIONS
from pipeline.doctor import checks
from pipeline.host import capabilities
from pipeline.host.devices import Host, probe
from pipeline.strategies.scratch import ScratchStrategy

from ..conftest import REPO


def _host(kind, n):
    return Host(kind, n, "test device", "testhost", "2.11.0", "13.0" if kind == "cuda" else "")


def _labels(cases):
    return {(c.strategy, c.k, c.variant, c.tag) for c in cases}


def test_one_gpu_plan_covers_every_cuda_path_one_gpu_allows():
    cases = checks.plan(_host("cuda", 1), ["single", "scratch", "dp", "dp_criterion", "ddp", "ddp_amp", "fsdp"])
    labels = _labels(cases)
    for s in ("single", "scratch", "dp", "dp_criterion", "ddp", "fsdp"):
        assert (s, 1, "", "") in labels  # all seven at k=1 ...
    assert {("ddp_amp", 1, "bf16", ""), ("ddp_amp", 1, "fp16+GradScaler", "")} <= labels  # ... both AMP dtypes
    # two ranks sharing the one GPU, for the multi-process strategies only, tagged
    over = {(c.strategy, c.k) for c in cases if c.tag == "oversubscribed"}
    assert over == {("ddp", 2), ("ddp_amp", 2), ("fsdp", 2)}
    assert all("train.oversubscribe=true" in c.sets for c in cases if c.tag)
    assert max(c.k for c in cases if not c.tag) == 1


def test_plan_stops_at_two_devices_and_at_max_devices():
    assert max(c.k for c in checks.plan(_host("cuda", 8), ["ddp"])) == 2
    assert {c.k for c in checks.plan(_host("cpu", 4), ["ddp"], max_devices=1)} == {1}
    assert [c.k for c in checks.plan(_host("cpu", 4), ["single"])] == [1]
    assert not any(c.tag for c in checks.plan(_host("cpu", 2), ["ddp", "fsdp"]))


def test_bf16_is_named_native_only_with_the_instructions_for_it():
    avx2 = capabilities.cpu_capabilities({"avx2", "fma"})
    assert avx2["bf16"] == "emulated" and avx2["fp16"] == "emulated" and avx2["isa"] == ["avx2"]
    assert capabilities.cpu_capabilities({"avx2", "avx512f", "avx512_bf16"})["bf16"] == "native"
    assert capabilities.cpu_capabilities({"amx_tile", "amx_bf16", "amx_fp16"})["fp16"] == "native"
    # AVX-512-FP16 without AMX-FP16: PyTorch's CPU fp16 step measured 130x+ fp32 there (RESULTS section 10)
    fp16_only = capabilities.cpu_capabilities({"avx2", "avx512f", "avx512_bf16", "avx512_fp16"}, env={})
    assert fp16_only["bf16"] == "native" and fp16_only["fp16"] == "emulated"
    assert "avx512_fp16 but no amx_fp16" in fp16_only["fp16_why"]
    host = capabilities.host_capabilities(probe())
    assert host["bf16"] in ("native", "emulated") and host["torch"] and host["gloo"] is True


def test_onednn_isa_cap_below_the_type_makes_it_emulated_and_is_named():
    bf16_cpu = {"avx2", "avx512f", "avx512_bf16"}
    capped = capabilities.cpu_capabilities(bf16_cpu, env={"ONEDNN_MAX_CPU_ISA": "avx2"})
    assert capped["bf16"] == "emulated" and "ONEDNN_MAX_CPU_ISA=AVX2" in capped["bf16_why"]
    assert capped["isa_text"] == "avx2,avx512f,avx512_bf16 (oneDNN capped at AVX2)"
    assert capabilities.cpu_capabilities(bf16_cpu, env={"DNNL_MAX_CPU_ISA": "AVX512_CORE"})["bf16"] == "emulated"
    for unchanged in (
        {},
        {"ONEDNN_MAX_CPU_ISA": "ALL"},
        {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
        {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"},
        {"ONEDNN_MAX_CPU_ISA": "SOMETHING_NEW"},
    ):
        assert capabilities.cpu_capabilities(bf16_cpu, env=unchanged)["bf16"] == "native", unchanged
    amx = {"amx_tile", "amx_bf16", "amx_fp16"}
    fp16 = capabilities.cpu_capabilities(amx, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
    assert fp16["bf16"] == "native" and fp16["fp16"] == "emulated"
    # a cap cannot make a type native that the CPU lacks
    assert capabilities.cpu_capabilities({"avx2"}, env={"ONEDNN_MAX_CPU_ISA": "ALL"})["bf16"] == "emulated"


def _run(make_cfg, tmp_path, strategies, **kw):
    return checks.run(
        make_cfg(),
        tmp_path / "doctor",
        strategies,
        max_devices=kw.pop("max_devices", 1),
        steps=2,
        per_device_batch=32,
        say=lambda *_: None,
        **kw,
    )


def test_planted_failure_is_a_failed_row_not_a_crash(make_cfg, tmp_path, monkeypatch):
    def broken(self, *a, **k):
        raise RuntimeError("planted fault in the step")

    monkeypatch.setattr(ScratchStrategy, "train_step", broken)
    report = _run(make_cfg, tmp_path, ["single", "scratch", "dp"])
    written = json.loads((tmp_path / "doctor" / "doctor.json").read_text())
    assert written == json.loads(json.dumps(report))
    rows = {(r["strategy"], r["k"]): r for r in written["rows"]}
    assert rows[("single", 1)]["status"] == "passed" and rows[("single", 1)]["img_s"] > 0
    assert rows[("single", 1)]["peak_mem_mib_dev"] and rows[("single", 1)]["peak_mem_mib_dev"][0] > 0
    assert rows[("single", 1)]["steps"] == written["settings"]["steps"]
    assert 0 < rows[("single", 1)]["timed_steps"] <= rows[("single", 1)]["steps"]
    assert rows[("scratch", 1)]["status"] == "failed"
    assert "planted fault in the step" in rows[("scratch", 1)]["reason"]
    if probe().kind == "cpu":
        assert rows[("dp", 1)]["status"] == "unavailable" and "CUDA" in rows[("dp", 1)]["reason"]
    assert written["counts"]["failed"] == 1 and written["synthetic"] is True
    md = (tmp_path / "doctor" / "doctor.md").read_text()
    assert "| scratch k=1 | failed |" in md and "SYNTHETIC" in md and f"bf16 {written['host']['bf16']}" in md


def test_a_row_timed_on_fewer_steps_says_so_in_the_table():
    """An emulated dtype's timed run is cut to a sixth of the steps: its row names its own count, not the header's;
    a row whose trial timed fewer steps than it asked (the breakdown's sampled steps leave the timing) says both."""
    rows = [
        dict(
            strategy="ddp_amp",
            k=1,
            variant=v,
            tag="",
            status="passed",
            reason="",
            check="ok",
            img_s=100.0,
            step_ms=10.0,
            peak_mem_mib_dev=[1.0],
            mem_method="m",
            backend="gloo",
            steps=n,
            timed_steps=timed,
        )
        for v, n, timed in (("bf16", 30, 30), ("fp16+GradScaler", 5, 5), ("bf16+sampled", 30, 27))
    ]
    host = capabilities.cpu_capabilities({"avx2"}, env={})
    report = {
        "host": {
            "hostname": "h",
            "kind": "cpu",
            "devices": 1,
            "name": "n",
            "torch": "t",
            "python": "p",
            "cuda": "",
            "cudnn": "",
            "nccl": "",
            "gloo": True,
            "cpu": {**host, "torch_cpu_capability": "AVX2"},
            "bf16": "emulated",
            "fp16": "emulated",
        },
        "data_source": "synthetic",
        "synthetic": True,
        "rows": rows,
        "settings": {"model": "lenet", "steps": 30, "per_device_batch": 64, "equivalence": "e"},
        "counts": {"passed": 3, "failed": 0, "unavailable": 0},
    }
    md = checks.markdown(report)
    assert "30 steps after warm-up" in md
    fp16 = next(line for line in md.splitlines() if line.startswith("| ddp_amp k=1 (fp16"))
    bf16 = next(line for line in md.splitlines() if line.startswith("| ddp_amp k=1 (bf16)"))
    sampled = next(line for line in md.splitlines() if line.startswith("| ddp_amp k=1 (bf16+sampled"))
    assert "(5 steps: emulated dtype)" in fp16 and "steps" not in bf16
    assert "| 10.0 (27 of 30 steps timed: 3 sampled for the breakdown) |" in sampled


def test_a_row_reports_the_steps_its_trial_timed_beside_those_it_asked(make_cfg, tmp_path, monkeypatch):
    """The row's timed_steps is the trial's own count (its record's timed_steps: the breakdown's sampled steps
    left out), its steps the count asked of the trial."""
    metrics = {"throughput_img_s": 1.0, "peak_mem_bytes": [], "mem_method": "m", "timed_steps": 27}
    ref, init = _fake_trials(monkeypatch, metrics=metrics)
    row = checks.run_case(checks.Case("single", 1), make_cfg(), probe(), ref, init, tmp_path, 30, 16, "lenet")
    assert row.status == "passed", row.reason
    assert (row.steps, row.timed_steps) == (30, 27)


def test_a_strategy_that_trains_differently_fails_the_equivalence(make_cfg, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(
        ScratchStrategy,
        "build_optimizer",
        lambda self, model: torch.optim.SGD(model.parameters(), lr=self.cfg.lr * 1.01),
    )
    rows = {r["strategy"]: r for r in _run(make_cfg, tmp_path, ["scratch"])["rows"]}
    assert rows["scratch"]["status"] == "failed"
    assert rows["scratch"]["reason"].startswith("does not match single-device SGD")


@pytest.mark.slow
def test_cli_checks_multiprocess_strategies_and_writes_both_files(synthetic_root, tmp_path):
    out = tmp_path / "doc"
    k = min(2, probe().n)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "doctor",
            "--strategies",
            "single,ddp",
            "--max-devices",
            str(k),
            "--steps",
            "3",
            "--out",
            str(out),
            "--set",
            f"data.dir={synthetic_root}",
            "--set",
            "data.source=synthetic",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = json.loads((out / "doctor.json").read_text())["rows"]
    ddp = [r for r in rows if r["strategy"] == "ddp"]
    assert [r["k"] for r in ddp] == list(range(1, k + 1))
    assert all(r["status"] == "passed" and r["backend"] in ("gloo", "nccl") for r in ddp)
    assert (out / "doctor.md").read_text().count("| ddp k=") == k


@pytest.mark.parametrize("strategy", ["ddp", "ddp_amp"])
def test_timed_steps_start_after_ddps_runtime_stats_iterations(make_cfg, tmp_path, monkeypatch, strategy):
    """G22: DDP's reducer collects runtime stats on iterations 1-10 and its next forward waits on them (a host sync
    on GPUs), so the doctor's timed window opens after them. Checks the warm-up the doctor configures (the timed
    window opens at step index train.warmup_steps, pipeline/measure/meter.py), not timings; the sync itself is
    CUDA's."""
    from pipeline.doctor import equivalence

    seen = {}

    def timed(cfg, out, progress=False, timeout_s=None):
        seen["warmup"], seen["timeout_s"] = cfg.train.warmup_steps, timeout_s
        return {"throughput_img_s": 1.0, "peak_mem_bytes": [], "mem_method": "m"}

    init = equivalence.initial_state()
    ref = {n: v + 0.01 for n, v in init.items()}
    monkeypatch.setattr(checks.equivalence, "one_step", lambda *a, **k: (ref, {"steps": 1}))
    monkeypatch.setattr(checks, "run_trial", timed)
    row = checks.run_case(checks.Case(strategy, 1), make_cfg(), probe(), ref, init, tmp_path, 2, 16, "lenet")
    assert row.status == "passed", row.reason
    # DDP's forward at 0-based step s finds num_iterations_ == s, and collects (syncs) for 1 <= s <= 10
    assert seen["warmup"] > DDP_RUNTIME_STATS_ITERATIONS
    assert seen["timeout_s"] == make_cfg().sweep.trial_timeout_s  # G4: a hung row fails, the doctor goes on


def test_a_row_timed_under_load_is_flagged_in_the_json_and_the_table(make_cfg, tmp_path, monkeypatch):
    """The doctor's timed run carries the sweep's interference check: a run the monitor flagged gives the row
    flagged=1 with the reason in doctor.json, and its doctor.md line says "(under load)" and why."""
    loaded = {"interfered": True, "interference_reason": "other processes kept 1.90 cores busy on average"}
    metrics = {"throughput_img_s": 100.0, "peak_mem_bytes": [], "mem_method": "m", "interference": loaded}
    ref, init = _fake_trials(monkeypatch, metrics=metrics)
    row = checks.run_case(checks.Case("single", 1), make_cfg(), probe(), ref, init, tmp_path, 2, 16, "lenet")
    assert row.status == "passed", row.reason
    assert row.flagged == 1 and "1.90 cores" in row.flagged_reason
    host = capabilities.cpu_capabilities({"avx2"}, env={})
    report = {
        "host": {
            "hostname": "h",
            "kind": "cpu",
            "devices": 1,
            "name": "n",
            "torch": "t",
            "python": "p",
            "cuda": "",
            "cudnn": "",
            "nccl": "",
            "gloo": True,
            "cpu": {**host, "torch_cpu_capability": "AVX2"},
            "bf16": "emulated",
            "fp16": "emulated",
        },
        "data_source": "synthetic",
        "synthetic": True,
        "rows": [asdict(row)],
        "settings": {"model": "lenet", "steps": 2, "per_device_batch": 16, "equivalence": "e"},
        "counts": {"passed": 1, "failed": 0, "unavailable": 0},
    }
    line = next(x for x in checks.markdown(report).splitlines() if x.startswith("| single k=1"))
    assert "100 (under load)" in line and "timing measured under load: other processes kept 1.90 cores" in line


def _fake_trials(monkeypatch, seen=None, metrics=None):
    """The doctor's trials faked: the equivalence step returns a moved copy of the initial weights, the timed run
    records its Config in `seen` and reports `metrics` (default: a throughput)."""
    from pipeline.doctor import equivalence

    init = equivalence.initial_state()
    ref = {n: v + 0.01 for n, v in init.items()}

    def timed(cfg, out, progress=False, timeout_s=None):
        if seen is not None:
            seen.append(cfg)
        return metrics or {"throughput_img_s": 100.0, "peak_mem_bytes": [], "mem_method": "m"}

    monkeypatch.setattr(checks.equivalence, "one_step", lambda *a, **k: (ref, {"steps": 1}))
    monkeypatch.setattr(checks, "run_trial", timed)
    return ref, init


def test_the_sets_that_take_effect_are_in_the_settings_of_both_files(synthetic_root, tmp_path, monkeypatch):
    """A --set that reaches the timed run (train.optimizer=adamw, train.compile=true, amp_dtype with single's
    autocast, the run's time limit sweep.trial_timeout_s) is named in doctor.json's settings and in doctor.md, with
    the value the run took."""
    from pipeline.cli import main

    seen: list = []
    _fake_trials(monkeypatch, seen)
    timed = checks.run_trial
    limits: list = []
    monkeypatch.setattr(checks, "run_trial", lambda *a, **k: limits.append(k["timeout_s"]) or timed(*a, **k))
    sets = ["train.optimizer=adamw", "train.compile=true", "train.autocast=true", "train.amp_dtype=bf16"]
    sets += ["sweep.trial_timeout_s=77", f"data.dir={synthetic_root}", "data.source=synthetic"]
    argv = ["doctor", "--strategies", "single", "--max-devices", "1", "--steps", "2", "--out", str(tmp_path / "d")]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    assert [(c.train.optimizer, c.train.compile, c.train.amp_dtype) for c in seen] == [("adamw", True, "bf16")]
    assert limits == [77]
    doc = json.loads((tmp_path / "d" / "doctor.json").read_text())
    assert doc["settings"]["sets"] == {
        "train.optimizer": "adamw",
        "train.compile": True,
        "train.autocast": True,
        "train.amp_dtype": "bf16",
        "sweep.trial_timeout_s": 77,
        "data.dir": str(synthetic_root),
        "data.source": "synthetic",
    }
    assert doc["settings"]["equivalence"].startswith("one adamw step, "), "the optimizer the step takes"
    md = (tmp_path / "d" / "doctor.md").read_text()
    assert "- --set: train.optimizer=adamw, train.compile=true, train.autocast=true, train.amp_dtype=bf16, " in md
    assert f"sweep.trial_timeout_s=77.0, data.dir={synthetic_root}, data.source=synthetic" in md


@pytest.mark.parametrize(
    "item, strategies, flag",
    [
        ("train.batch_size=8", "single", "--batch-per-device"),
        ("train.devices=2", "single", "--max-devices"),
        ("train.strategy=ddp", "single", "--strategies"),
        ("train.model=lenet", "single", "--model"),
        ("train.max_steps=5", "single", "--steps"),
        ("++train.warmup_steps=0", "single", ""),
        ("data.train_limit=512", "single", "--steps"),
        ("train.amp_dtype=fp16", "single,ddp_amp", ""),
    ],
)
def test_a_set_the_doctor_overrides_is_refused_with_the_flag_to_use(
    tmp_path, monkeypatch, capsys, item, strategies, flag
):
    """doctor sets the strategy, devices, model, batch, steps, warm-up and data limits of its timed runs itself (and
    ddp_amp's dtype per variant): a --set of one exits 2 naming the key and the flag that sets it, before any trial."""
    from pipeline.cli import main

    monkeypatch.setattr(checks, "run", lambda *a, **k: pytest.fail("a refused --set ran the doctor"))
    argv = ["doctor", "--strategies", strategies, "--max-devices", "1", "--out", str(tmp_path / "d"), "--set", item]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())  # one line, as the terminal wraps it
    key = item.lstrip("+").partition("=")[0]
    assert f"`{key}`" in err and "Nothing was run" in err
    assert (f"Use {flag}" in err) if flag else ("Leave it out" in err)


def test_every_key_the_timed_run_sets_is_one_a_set_of_is_refused(make_cfg, tmp_path, monkeypatch):
    """The keys refused (checks.OWN_KEYS and the variants') cover every key doctor's timed run sets: none of the
    user's --set is overridden unsaid."""
    sets: list = []
    real = checks.loader.override
    monkeypatch.setattr(checks.loader, "override", lambda cfg, items: sets.append(list(items)) or real(cfg, items))
    ref, init = _fake_trials(monkeypatch)
    cases = [checks.Case("ddp_amp", 1, ("train.amp_dtype=fp16",), "fp16+GradScaler")]
    cases.append(checks.Case("ddp", 2, ("train.oversubscribe=true",), "", "oversubscribed"))
    for case in cases:
        row = checks.run_case(case, make_cfg(), probe(), ref, init, tmp_path, 2, 16, "lenet")
        assert row.img_s == 100.0, row.reason  # the timed run's keys are among those recorded
    keys = {s.lstrip("+").partition("=")[0] for items in sets for s in items}
    refused = {k for k in keys if checks.own_set_refusal([f"{k}=1"], ["ddp_amp", "ddp"])}
    assert {"train.batch_size", "train.warmup_steps", "data.test_limit"} <= keys and keys == refused


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_under_cuda_graphs_each_run_of_a_row_is_one_a_gpu_runs(make_cfg, tmp_path, monkeypatch, strategy):
    """`doctor --set train.cuda_graphs=true` on a GPU: the reference and equivalence steps run one eager step (a
    graph captures after its warm-up), and the timed run warms up past the capture, so no run of the row is refused
    by the trial's own mode check (launch.mode_refusal), and the row says its warm-up."""
    import torch

    from pipeline.config import loader
    from pipeline.doctor import equivalence
    from pipeline.trial import graphs, launch

    host = _host("cuda", 1)
    base = loader.override(make_cfg(), ["train.cuda_graphs=true", "train.breakdown_every=0"])
    init = equivalence.initial_state()
    refusals = []

    def trial(cfg, out, progress=False, timeout_s=None):
        refusals.append(launch.mode_refusal(cfg.train, host, False, cfg.data.train_limit))
        out.mkdir(parents=True, exist_ok=True)
        torch.save({n: v + 0.01 for n, v in init.items()}, out / "final_state.pt")
        return {"throughput_img_s": 100.0, "peak_mem_bytes": [], "mem_method": "m"}

    monkeypatch.setattr(equivalence, "run_trial", trial)
    monkeypatch.setattr(checks, "run_trial", trial)
    monkeypatch.setattr(checks, "check_feasible", lambda cfg, host: None)
    ref, _ = equivalence.one_step(base, tmp_path / "reference", "single", 1)
    row = checks.run_case(checks.Case(strategy, 1), base, host, ref, init, tmp_path, 2, 16, "lenet")
    assert refusals == ["", "", ""], refusals
    assert row.warmup_steps == max(checks.WARMUP_STEPS, graphs.min_warmup(strategy)) >= graphs.min_warmup(strategy)
    assert row.status == "passed", row.reason


@pytest.mark.parametrize("asked, timed", [(2, 2), (5, 5), (30, 5), (60, 10)])
def test_an_emulated_dtype_row_times_no_more_steps_than_asked(make_cfg, tmp_path, monkeypatch, asked, timed):
    """An emulated dtype's timed run is cut to a sixth of the steps, at least 5, and never to more than asked:
    `--steps 2` times 2 steps, not 5."""
    seen: list = []
    ref, init = _fake_trials(monkeypatch, seen)
    monkeypatch.setattr(checks, "check_feasible", lambda cfg, host: None)
    case = checks.Case("ddp_amp", 1, ("train.amp_dtype=fp16",), "fp16+GradScaler")
    row = checks.run_case(case, make_cfg(), probe(), ref, init, tmp_path, asked, 16, "lenet", ("fp16",))
    assert row.status == "passed", row.reason
    assert row.steps == timed and seen[0].train.max_steps == row.warmup_steps + timed


def test_the_console_line_of_a_row_gives_the_labels_its_table_line_gives(make_cfg, tmp_path, monkeypatch):
    """A row timed under load, or on fewer steps (an emulated dtype), says so on the console as in doctor.md."""
    loaded = {"interfered": True, "interference_reason": "other processes kept 1.90 cores busy on average"}
    metrics = {"throughput_img_s": 100.0, "peak_mem_bytes": [], "mem_method": "m", "interference": loaded}
    _fake_trials(monkeypatch, metrics=metrics)
    monkeypatch.setattr(checks, "check_feasible", lambda cfg, host: None)
    real = checks.host_capabilities
    monkeypatch.setattr(checks, "host_capabilities", lambda host: {**real(host), "fp16": "emulated"})
    lines: list = []
    checks.run(make_cfg(), tmp_path / "d", ["single", "ddp_amp"], max_devices=1, steps=30, say=lines.append)
    fp16 = next(x for x in lines if "ddp_amp k=1 (fp16" in x)
    single = next(x for x in lines if "single k=1" in x)
    assert "100 img/s (under load) (5 steps: emulated dtype)" in fp16, fp16
    assert "100 img/s (under load) (" in single and "steps" not in single, single
    md = (tmp_path / "d" / "doctor.md").read_text()
    assert "| 100 (under load) |" in next(x for x in md.splitlines() if x.startswith("| ddp_amp k=1 (fp16"))


def test_a_knob_of_some_rows_runs_them_against_a_reference_without_it(make_cfg, tmp_path, monkeypatch):
    """`--set train.comm_hook=shm` with single and ddp: the reference step (single-device SGD, which has no comm hook)
    runs without it, so ddp's row is checked; single's row, which has no such knob, is unavailable with why."""
    from pipeline.config import loader

    ref, init = _fake_trials(monkeypatch)
    hooks = []

    def one_step(base, out, strategy, k, extra=()):  # refuses a knob its strategy lacks, as a trial does
        checks.check_feasible(loader.override(base, [f"train.strategy={strategy}", f"train.devices={k}"]), probe())
        hooks.append((strategy, base.train.comm_hook))
        return ref, {"steps": 1}

    monkeypatch.setattr(checks.equivalence, "one_step", one_step)
    report = checks.run(
        make_cfg("train.comm_hook=shm"), tmp_path / "d", ["single", "ddp"], 1, 2, 16, say=lambda *_: None
    )
    rows = {(r["strategy"], r["tag"]): r for r in report["rows"]}
    assert hooks[:2] == [("single", "none"), ("ddp", "shm")]
    assert rows[("ddp", "")]["status"] == "passed", rows[("ddp", "")]["reason"]
    assert rows[("single", "")]["status"] == "unavailable" and "`comm_hook`" in rows[("single", "")]["reason"]
    assert report["counts"]["failed"] == 0


def test_a_setting_of_some_rows_runs_the_others_at_its_default(make_cfg, tmp_path, monkeypatch):
    """`--set train.amp_init_scale=512` with ddp and ddp_amp: ddp_amp's timed run takes it; ddp's, which has no
    GradScaler and whose trial would refuse to record it unrun, runs the default, as a sweep's trial does."""
    seen: list = []
    _fake_trials(monkeypatch, seen)
    report = checks.run(
        make_cfg("train.amp_init_scale=512"), tmp_path / "d", ["ddp", "ddp_amp"], 1, 2, 16, say=lambda *_: None
    )
    rows = {(r["strategy"], r["variant"]): r for r in report["rows"]}
    assert rows[("ddp", "")]["status"] != "unavailable", rows[("ddp", "")]["reason"]
    scales = {(c.train.strategy, c.train.amp_dtype): c.train.amp_init_scale for c in seen}
    assert scales[("ddp", "auto")] == 65536.0 and scales[("ddp_amp", "fp16")] == 512.0, scales


@pytest.mark.parametrize("item", ["train.comm_hook=shm", "train.bucket_cap_mb=5", "train.compile=true"])
def test_a_knob_none_of_the_selected_strategies_has_is_refused(tmp_path, monkeypatch, capsys, item):
    """A knob none of the selected strategies takes would reach no row: exit 2 naming the key and the strategies
    that take it, before any trial."""
    from pipeline.cli import main

    monkeypatch.setattr(checks, "run", lambda *a, **k: pytest.fail("a refused --set ran the doctor"))
    argv = ["doctor", "--strategies", "scratch,fsdp", "--max-devices", "1", "--out", str(tmp_path / "d")]
    assert main([*argv, "--set", item]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"`{item}" in err and "--strategies (" in err and "Nothing was run" in err


@pytest.mark.parametrize(
    "items, strategies, said",
    [
        (["sweep.n_trials=3"], "single", "`sweep.n_trials`"),
        (["analyze.target_acc=0.5"], "single", "`analyze.target_acc`"),
        (["profile=gpu"], "single", "`profile`"),
        (["tracking.uri=sqlite:///x.db"], "single", "`tracking.uri`"),
        (["data.mirror=/nowhere"], "single", "`data.mirror`"),
        (["train.amp_dtype=fp16"], "single", "applies with train.autocast=true"),
        (["train.compile_mode=reduce-overhead"], "single,ddp", "applies with train.compile=true"),
        (["train.output_device=1"], "single,ddp", "applies with"),
        (["data.source=fashion-mnist", "data.dir=NOWHERE"], "single", "synthetic stand-in instead"),
        (["data.source=synthetic", "data.dir=NOWHERE"], "single", "synthetic stand-in instead"),
    ],
)
def test_a_set_no_run_of_the_doctor_takes_is_refused(tmp_path, monkeypatch, capsys, items, strategies, said):
    """A --set doctor's runs never read (another command's section, the download's mirror), a setting that applies
    only with what no selected row runs with (catalog.APPLIES_WITH, as the sweep refuses it), or data doctor would
    replace by the synthetic stand-in: exit 2 naming the key and why, before any trial, never recorded as run."""
    from pipeline.cli import main

    monkeypatch.setattr(checks, "run", lambda *a, **k: pytest.fail("a refused --set ran the doctor"))
    argv = ["doctor", "--strategies", strategies, "--max-devices", "1", "--out", str(tmp_path / "d")]
    sets = [s.replace("NOWHERE", str(tmp_path / "nowhere")) for s in items]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and err.rstrip().endswith("Nothing was run."), err


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_a_mode_this_hosts_kind_cannot_run_is_refused_before_any_row(tmp_path, monkeypatch, capsys, kind):
    """`doctor --set train.cuda_graphs=true` on a CPU host: every row would be unavailable for the host's sake, so
    doctor refuses at once (exit 2, launch.host_mode_refusal's reason) and leaves the last report as it is; a GPU host
    runs its rows."""
    from pipeline.cli import main
    from pipeline.host.devices import Host

    host = Host(kind, 2, "a device", "h", "2.x", "12.8" if kind == "cuda" else "")
    monkeypatch.setattr(checks, "probe", lambda: host)
    ran = []
    monkeypatch.setattr(checks, "run", lambda *a, **k: ran.append(1) or {"counts": {"failed": 0}})
    monkeypatch.setattr("pipeline.scaling.device.keep_from_doctor", lambda report: None)
    out = tmp_path / "d"
    out.mkdir()
    (out / "doctor.md").write_text("the last report\n")
    argv = ["doctor", "--strategies", "single,ddp", "--max-devices", "1", "--out", str(out)]
    code = main([*argv, "--set", "train.cuda_graphs=true", "--set", "train.breakdown_every=0"])
    err = " ".join(capsys.readouterr().err.split())
    if kind == "cpu":
        assert code == 2 and not ran, err
        assert "train.cuda_graphs" in err and "this host is a CPU" in err and err.endswith("Nothing was run."), err
        assert (out / "doctor.md").read_text() == "the last report\n"
    else:
        assert code == 0 and ran, err


def test_a_set_the_equivalence_step_overrides_is_said_to_reach_the_timed_run_only(
    synthetic_root, tmp_path, monkeypatch
):
    """`--set train.lr=0.1 --set train.amp_init_scale=2`: the timed run takes them, the equivalence step runs its own
    lr and GradScaler scale (equivalence.own_settings), and doctor.md says which --set reached the timed run only; a
    --set the step takes as well (train.optimizer) is named plainly."""
    from pipeline.cli import main
    from pipeline.config import loader
    from pipeline.doctor import equivalence

    one_step, seen = equivalence.one_step, []  # the step itself, before _fake_trials fakes it
    _fake_trials(monkeypatch, seen)
    sets = ["train.lr=0.1", "train.amp_init_scale=2", "train.optimizer=adamw", f"data.dir={synthetic_root}"]
    sets += ["data.source=synthetic"]
    argv = ["doctor", "--strategies", "ddp_amp", "--max-devices", "1", "--steps", "2", "--out", str(tmp_path / "d")]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    assert seen and {(c.train.lr, c.train.amp_init_scale) for c in seen} == {(0.1, 2.0)}  # the timed runs take them
    line = next(x for x in (tmp_path / "d" / "doctor.md").read_text().splitlines() if x.startswith("- --set: "))
    assert line.endswith(
        f"(the timed run only: the equivalence step runs train.lr={equivalence.LR}, "
        f"train.amp_init_scale={equivalence.FP16_INIT_SCALE})"
    ), line
    step = {}
    monkeypatch.setattr(equivalence, "run_trial", lambda cfg, out, **k: step.update(t=cfg.train) or pytest.skip())
    base = loader.override(loader.load(None, ["profile="], sweeps=False), ["train.lr=0.1", "train.amp_init_scale=2"])
    with pytest.raises(pytest.skip.Exception):
        one_step(base, tmp_path / "eq", "ddp_amp", 1)  # its autocast takes the GradScaler scale
    own = equivalence.own_settings(base)
    assert (step["t"].lr, step["t"].amp_init_scale) == (own["train.lr"], own["train.amp_init_scale"]) == (0.5, 1024)
