"""The memory model (pipeline/scaling/memory.py) against real CPU trials, its "will it fit?" command, and the
report's "Memory: measured beside modelled" section."""

from __future__ import annotations

import json
import os

import pytest

from pipeline import catalog
from pipeline.analysis.report import memory_fit
from pipeline.analysis.report.markdown import md_table
from pipeline.host.devices import probe
from pipeline.scaling import memory
from pipeline.trial.launch import run_trial

from ..analysis.test_analyze import frame, row

TWO_CPUS = probe().kind == "cpu" and probe().n >= 2
# the bound on the CPU probe's figure: mean error <= 3%, largest <= 8%; each point here is held to 3%
TOLERANCE_PCT = 3.0


@pytest.mark.skipif(not TWO_CPUS, reason="the CPU probe's figures, on 2 CPU devices")
@pytest.mark.parametrize("strategy", ["zero1", "fsdp"])
def test_predicted_peaks_hold_against_measured_cpu_trials(make_cfg, tmp_path, strategy):
    """Two strategies that shard (ZeRO-1 unevenly, by whole tensors; FSDP evenly, with a gathered unit) at two
    batches, AdamW, k=2: the modelled peak of every device within 3% of what the trial's probe measured."""
    for batch in (128, 256):
        cfg = make_cfg(
            f"train.strategy={strategy}",
            "train.devices=2",
            "train.model=lenet",
            f"train.batch_size={batch}",
            "train.max_steps=1",
            "train.optimizer=adamw",
            f"data.train_limit={2 * batch}",
            "data.test_limit=64",
        )
        measured = run_trial(cfg, tmp_path / f"{strategy}-{batch}", progress=False)["peak_mem_bytes"]
        p = memory.predict(strategy, "lenet", 2, batch, "adamw", basis="cpu", cache=tmp_path / "counts.json")
        errors = [memory.error_pct(m, v) for m, v in zip(measured, p.per_device)]
        print(strategy, batch, measured, p.per_device, [f"{e:+.2f}%" for e in errors])
        assert len(measured) == len(p.per_device) == 2
        assert all(abs(e) <= TOLERANCE_PCT for e in errors), (strategy, batch, measured, p.per_device, p.terms)


def test_zero1_partition_mirrors_zero_redundancy_optimizer():
    """LeNet at k=2: one rank owns the 102,400-element weight, the other every other tensor."""
    lay = memory.layout("lenet")
    owned = memory.zero1_owned(lay.numel, 2)
    big = lay.numel.index(max(lay.numel))
    assert owned[0] == [big] and sorted(owned[1]) == [i for i in range(len(lay.numel)) if i != big]


def test_fit_answers_for_resnet18_without_building_it(tmp_path, capsys, monkeypatch):
    """`fit` counts ResNet-18 on the meta device (no parameter memory, no GPU), then answers from its counts: per
    strategy and k the modelled peak, whether it fits, the largest batch that does. Once counted, an answer reads the
    counts from the cache and counts nothing (its time is benchmarked, never asserted: the host may be loaded)."""
    from pipeline.cli.commands import main

    monkeypatch.setattr(memory, "_cache_file", lambda cache: tmp_path / "counts.json")
    memory.layout.cache_clear()
    memory._COUNTED.clear()  # counts another test kept in this process would not reach the file
    fp32 = [s for s in catalog.NAMES if not catalog.spec(s).autocast]  # autocast counts on the CPU: slow here
    args = ["fit", "--model", "resnet18", "--batch-size", "512", "--device-memory", "80GiB"]
    assert main([*args, "--strategies", ",".join(fp32)]) == 0  # the first answer counts
    capsys.readouterr()
    memory._COUNTED.clear()
    memory.layout.cache_clear()
    monkeypatch.setattr(memory, "_count", lambda *a: pytest.fail("a cached answer counted the model again"))
    assert main([*args, "--strategies", ",".join(fp32)]) == 0
    out = capsys.readouterr().out
    lines = table(out)
    assert {(r[0], int(r[1])) for r in lines} >= {("single", 1), ("ddp", 2), ("fsdp", 8), ("zero1", 4)}
    assert all(r[3] in ("yes", "no") for r in lines)
    # 80 GiB holds ResNet-18 at 512 on 28x28; at k >= 2 more than the training set's images
    assert all(r[3] == "yes" and (r[4] == "more than the 60,000 training images" or int(r[4]) >= 512) for r in lines)
    assert main([*args[:-1], "2GiB", "--strategies", "single"]) == 0  # the fixed cost (864 MiB) leaves 1.2 GiB
    (single,) = table(capsys.readouterr().out)
    assert single[3] == "no" and 0 < int(single[4]) < 512
    print(out)


def table(out: str) -> list[list[str]]:
    """fit's table rows (strategy, k, needed GiB, fits, largest batch: a number, none, or beyond the training set in
    words), split: the lines after its header, up to the first line that is not a row."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("strategy "))
    rows = []
    for line in lines[start + 1 :]:
        r = line.split(None, 4)
        if len(r) != 5 or not r[1].isdigit():
            break
        rows.append(r)
    return rows


def test_the_report_shows_measured_beside_modelled_and_projects_dp():
    """A CPU table (memtracker_step): each point's measured and modelled peaks with the error; dp, which a CPU host
    cannot run, gets its device-0 excess projected and labelled modelled."""
    # rows without a grad_as_bucket_view column (a table from before it was on by default) had bucket copies
    p = memory.predict("ddp", "lenet", 2, 256, "adamw", basis="cpu", grad_as_bucket_view=False)
    mem = memory_fit_table(
        [
            row(
                "ddp",
                k=2,
                B=256,
                peaks=[p.peak, p.peak],
                optimizer="adamw",
                mem_method="memtracker",
                mem_basis="memtracker_step",
            ),
            row(
                "single",
                k=1,
                B=128,
                peaks=[2 * p.peak],
                optimizer="adamw",
                mem_method="memtracker",
                mem_basis="memtracker_step",
            ),
        ]
    )
    text = "".join(memory_fit.section(mem, md_table))
    assert "### Memory: measured beside modelled" in text and "*modelled*" in text
    t = memory_fit.compared(mem).set_index("strategy")
    assert t.loc["ddp", "error_pct"] == pytest.approx(0, abs=1e-6)
    assert t.loc["single", "error_pct"] < -40  # measured twice the model: a large miss shows
    assert "dp's device-0 excess" in text and "(*modelled*, GPU figure" in text


def memory_fit_table(rows):
    from pipeline.analysis import stage

    return stage.memory_table(frame(rows))


def test_a_knob_read_back_as_text_is_off_when_it_says_false():
    """The analysis rows hold knobs as text (rows.key_text): 'False' is off, '' (a table from before the column) is
    the old default, off; the report would otherwise model DDP's gradient views for a trial that kept copies."""
    assert [memory_fit._flag(v) for v in ("True", "False", "", None, True, False)] == [
        True,
        False,
        False,
        False,
        True,
        False,
    ]


def test_the_autocast_count_on_fake_tensors_is_the_cpus():
    """Under autocast the model counts on fake CPU tensors (no compute: a second, not ResNet-18's 20-35 s of emulated
    bf16); what it counts is what MemTracker sees on the host's CPU for the same forward and backward, to 0.1%."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from pipeline.models import MODELS, blocks

    torch.manual_seed(0)
    m = MODELS["lenet"]().to(memory_format=torch.channels_last)
    x = torch.randn(16, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (16,))
    tracker = MemTracker()
    tracker.track_external(m)
    with tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the forward under autocast, the backward after it
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
    real = sum(v.get("Total", 0) for v in tracker.get_tracker_snapshot("peak").values())
    real -= sum(p.numel() * p.element_size() for p in m.parameters())
    fake, units = memory._count("lenet", 16, autocast=True)
    assert fake > 0 and len(units) == len(list(blocks(m)))
    assert abs(fake - real) <= 1e-3 * real, (fake, real)


@pytest.mark.slow
def test_counted_ahead_a_fit_loads_no_torch(tmp_path, monkeypatch):
    """`fit --count-ahead` (what `make setup` runs) counts every model once; a `fit` after it, in a new process,
    answers for ResNet-18 from the counts without importing torch, and so does the scaling model's layout (the
    analysis stage's projection), equal to the one read from the model itself. Changed model code is counted again."""
    import subprocess
    import sys

    cache = tmp_path / "runs" / "memory_model.json"
    monkeypatch.setattr(memory, "_cache_file", lambda c: cache)
    memory.layout.cache_clear()
    memory._COUNTED.clear()
    assert memory.count_ahead() == (("lenet", "resnet18"), ()) and memory.is_counted("resnet18")
    assert memory.count_ahead(["resnet18", "resnet18"]) == ((), ("resnet18",))  # counted once, then kept
    fit = (
        "import sys; from pipeline.cli.commands import main; "
        "code = main(['fit', '--model', 'resnet18', '--batch-size', '4096', '--device-memory', '24GiB']); "
        "from pipeline.scaling.model import model_layout; import json; "
        "print(json.dumps(model_layout('resnet18'))); "
        "print('torch loaded' if 'torch' in sys.modules else 'no torch', code)"
    )
    p = subprocess.run(
        [sys.executable, "-c", fit], env={**os.environ, "DVC_ROOT": str(tmp_path)}, capture_output=True, text=True
    )
    assert p.stdout.splitlines()[-1] == "no torch 0", p.stdout + p.stderr
    from pipeline.models import MODELS, blocks

    m = MODELS["resnet18"]()
    want_params = [{"name": n, "shape": list(t.shape), "bytes": t.numel() * 4} for n, t in m.named_parameters()]
    want_units = [(n, [list(t.shape) for t in b.parameters()]) for n, b in blocks(m)]
    got = json.loads(p.stdout.splitlines()[-2])
    assert got["params"] == want_params and got["param_bytes"] == 11_175_818 * 4
    assert [(u["name"], u["shapes"]) for u in got["fsdp_units"]] == want_units
    assert "counting" not in p.stderr and "fsdp" in p.stdout
    memory._code_digest.cache_clear()
    monkeypatch.setattr(memory, "_code_digest", lambda: "other code")
    assert not memory.is_counted("resnet18")  # counts of other code are never read


@pytest.mark.slow
def test_a_named_model_is_counted_ahead_and_a_name_fit_cannot_build_is_refused(tmp_path):
    """`fit --count-ahead mobilenet_v3_small` counts that torchvision model (not d2l's), so its first `fit`, in a new
    process, answers from the counts, counting nothing (torchvision is still imported, to know the name is its); a
    name no source holds is refused, pointing at the list of models, before anything is counted."""
    import subprocess
    import sys

    env = {**os.environ, "DVC_ROOT": str(tmp_path)}

    def cli(code: str):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    ahead = cli(
        "from pipeline.cli.commands import main; raise SystemExit(main(['fit', '--count-ahead', 'mobilenet_v3_small']))"
    )
    assert ahead.returncode == 0 and "counted mobilenet_v3_small for fit" in ahead.stdout, ahead.stdout + ahead.stderr
    fit = cli(
        "from pipeline.cli.commands import main; "
        "raise SystemExit(main(['fit', '--model', 'mobilenet_v3_small', '--batch-size', '64', '--device-memory', "
        "'24GiB']))"
    )
    assert fit.returncode == 0 and "counting" not in fit.stderr, fit.stdout + fit.stderr
    assert fit.stdout.startswith("mobilenet_v3_small (torchvision ") and "fsdp" in fit.stdout, fit.stdout

    wrong = cli("from pipeline.cli.commands import main; raise SystemExit(main(['fit', '--count-ahead', 'resnet5O']))")
    assert wrong.returncode == 2 and "python -m pipeline models" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "runs" / "memory_model.json").read_text().count("resnet5O")
