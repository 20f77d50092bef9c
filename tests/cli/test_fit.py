"""`python -m pipeline fit` on the gpu basis: the device's memory (read from the CUDA device, else an 80 GB part's),
and for one strategy and k each term with its figure and its source, measured or assumed."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.cli.commands import main

COMMAND = ["fit", "--model", "resnet18", "--batch-size", "256", "--strategies", "ddp", "--devices", "2"]


def no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def test_fit_prints_each_term_with_its_figure_and_source(fit_root, capsys):
    """The command of docs/metrics.md: the fixed cost (context, workspaces: assumed here), the resident parameters,
    data set and DDP's buckets, the step's activations, gradients, buckets, optimizer state, the allocator's
    rounding (assumed), the total; each with MiB and its source, no line wider than 100 columns."""
    assert main(COMMAND) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines()), max(out.splitlines(), key=len)
    # each term's line: two spaces, its part (11 columns), the term (25), MiB (8), two spaces, the source
    terms = {line[13:38].strip(): line[38:].split() for line in out.splitlines() if line[:2] == "  " and len(line) > 38}
    assert "CUDA context + kernels" in terms, out
    assert terms["CUDA context + kernels"][:2] == ["800.0", "assumed"]
    assert terms["library workspaces"][:2] == ["64.0", "assumed"]
    for term in ("parameters", "data set", "buckets (resident)", "activations", "buckets (step)", "optimizer state"):
        assert terms[term][1].startswith("modelled"), (term, terms[term])
        assert float(terms[term][0]) > 0, term
    assert float(terms["buckets (resident)"][0]) == float(terms["parameters"][0])  # 4 B per parameter, k=2: whole
    assert terms["reserved over allocated"][1] == "assumed:"
    assert "fixed cost 864 MiB per device" in out and "context assumed, workspaces assumed" in out
    if no_cuda():
        assert "device memory 79.65 GiB: assumed (default: an 80 GB part as NVIDIA counts it: 81,559 MiB)" in out


def test_fit_reads_the_device_memory_from_cuda_else_an_80gb_part(fit_root, capsys, monkeypatch):
    """No --device-memory: the CUDA device's total (torch.cuda.mem_get_info), its kept fixed cost by name; without a
    device, 81,559 MiB (assumed); --device-memory as written (80GB = 80e9 bytes)."""
    import torch

    monkeypatch.setattr("pipeline.scaling.device._driver_visible", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=0: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=0: (1 << 30, 40_339 * 2**20))
    (fit_root / "runs").mkdir()
    kept = {"context_mib": 500.0, "workspace_mib": None, "source": "NVML", "date": "2026-11-27", "torch": "2.11"}
    (fit_root / "runs" / "device_basis.json").write_text(json.dumps({"NVIDIA A100-SXM4-40GB": kept}))
    assert main(COMMAND) == 0
    out = capsys.readouterr().out
    assert "device memory 39.39 GiB: measured (torch.cuda.mem_get_info() total of NVIDIA A100-SXM4-40GB)" in out
    assert "fixed cost 564 MiB per device (NVIDIA A100-SXM4-40GB): context measured, workspaces assumed" in out
    monkeypatch.setattr("pipeline.scaling.device._driver_visible", lambda: False)
    assert main([*COMMAND, "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "device memory 74.51 GiB: given (--device-memory)" in out  # 80e9 bytes
    assert main(COMMAND) == 0
    assert "device memory 79.65 GiB: assumed" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*COMMAND, "--device-memory", "eighty"])


@pytest.mark.parametrize(
    "flags",
    [
        ["--model", "lenet"],
        ["--batch-size", "512"],  # the default's value, given: still refused
        ["--device-memory", "8GiB"],
        ["--device-name", "NVIDIA H100 80GB HBM3"],
        ["--optimizer", "adamw"],
        ["--devices", "1,2"],
        ["--strategies=ddp"],
    ],
    ids=lambda v: " ".join(v),
)
def test_count_ahead_refuses_a_flag_of_the_answer_by_its_name(flags, fit_root, capsys, monkeypatch):
    """`fit --count-ahead` counts and answers nothing: a flag of the answer given with it (before or after it, its
    value the default's or not) is refused, exit 2, the flag named with what to do, before anything is counted."""
    from pipeline.scaling import memory

    monkeypatch.setattr(memory, "count_ahead", lambda *a, **k: pytest.fail("counted despite the refusal"))
    for argv in (["fit", "--count-ahead", *flags], ["fit", *flags, "--count-ahead", "lenet"]):
        assert main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"takes no {flags[0].split('=')[0]}." in err, err
        assert "drop --count-ahead to answer" in err and "Nothing was run" in err, err
    main(["fit", "--count-ahead", "--model", "lenet", "--batch-size", "64"])
    err = " ".join(capsys.readouterr().err.split())
    assert "takes no --model, --batch-size." in err and "`python -m pipeline fit --count-ahead lenet`" in err, err


def test_count_ahead_refusal_suggests_the_models_named(fit_root, capsys, monkeypatch):
    """The refusal's suggestion counts the models the user named after --count-ahead (and with --model), each once;
    resnet50 only where none is named."""
    from pipeline.scaling import memory

    monkeypatch.setattr(memory, "count_ahead", lambda *a, **k: pytest.fail("counted despite the refusal"))
    for argv, suggested in [
        (["--batch-size", "512", "--count-ahead", "lenet"], "--count-ahead lenet`"),
        (["--count-ahead", "lenet", "resnet18", "lenet", "--devices", "2"], "--count-ahead lenet resnet18`"),
        (["--model", "resnet18", "--count-ahead", "lenet"], "--count-ahead lenet resnet18`"),
        (["--count-ahead", "--optimizer", "sgd"], "--count-ahead resnet50`"),
    ]:
        assert main(["fit", *argv]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"(`python -m pipeline fit {suggested})" in err, (argv, err)


def test_a_batch_larger_than_the_training_set_is_refused_before_counting(fit_root, capsys, monkeypatch):
    """As train refuses it: a global batch above the 60,000 training images is refused, exit 2, the size named,
    before anything is counted; the training set itself is a batch fit answers."""
    from pipeline.scaling import memory

    asked, is_counted = [], memory.is_counted
    monkeypatch.setattr(memory, "is_counted", lambda *a, **k: asked.append(a) or is_counted(*a, **k))
    assert main(["fit", "--batch-size", "100000000", "--strategies", "ddp", "--devices", "1,8"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--batch-size 100,000,000 is larger than the training set (60,000 images)" in err, err
    assert "at most 60,000. Nothing was run." in err and not asked, err
    assert main(["fit", "--model", "lenet", "--batch-size", "60000", "--strategies", "ddp", "--devices", "1"]) == 0


def test_count_ahead_alone_counts_without_a_refusal(fit_root, capsys, monkeypatch):
    """Every flag of the answer left at its default: --count-ahead counts (the counting itself: tests/scaling)."""
    from pipeline.scaling import memory

    def count_ahead(models):  # resnet18 in the cache already
        named = tuple(dict.fromkeys(models))
        return tuple(m for m in named if m != "resnet18"), tuple(m for m in named if m == "resnet18")

    monkeypatch.setattr(memory, "count_ahead", count_ahead)
    assert main(["fit", "--count-ahead", "lenet", "resnet18", "lenet"]) == 0
    assert "counted lenet for fit in " in (out := capsys.readouterr().out) and "kept already: resnet18" in out
    assert main(["fit", "--count-ahead", "resnet18"]) == 0
    assert "nothing to count; kept already: resnet18 (runs/memory_model.json)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("batch", "strategy", "label"),
    [
        (256, "ddp", "counted at B/k=128 on the meta device"),
        (192, "ddp", "counted at per-device batch 64 and 128 on the meta device, interpolated to B/k=96"),
        (1024, "ddp", "counted at per-device batch 64 and 128 on the meta device, extended to B/k=512"),
        (
            256,
            "ddp_amp",
            "counted at per-device batch 16 and 32 with fake CPU tensors under autocast, extended to B/k=128",
        ),
    ],
)
def test_fit_says_how_the_activations_are_counted(batch, strategy, label, fit_root, capsys, monkeypatch):
    """The activations' source names what the figure is: a count at B/k where B/k is an anchor, else the line
    through the counts at the anchors (memory.COUNT_ANCHORS; under autocast, memory.AUTOCAST_ANCHORS on fake CPU
    tensors), interpolated or extended to B/k."""
    from pipeline.scaling import memory

    monkeypatch.setattr(memory, "_COUNTED", {})  # only the anchors counted in this process: no other test's batches
    argv = ["fit", "--model", "resnet18", "--batch-size", str(batch), "--strategies", strategy, "--devices", "2"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())  # the source folds at 100 columns
    assert re.search(rf" activations [0-9.]+ modelled: {re.escape(label)} gradients ", out), out


def test_count_ahead_with_no_name_counts_d2ls_two_models(fit_root, capsys, monkeypatch):
    """`make setup` runs `fit --count-ahead` with no name: memory.count_ahead counts d2l's LeNet and ResNet-18
    (memory.known_models), each at fit's anchors and at the autocast anchors (the counting itself: tests/scaling)."""
    from pipeline.scaling import memory

    seen = []
    monkeypatch.setattr(memory, "layout", lambda model, cache=None: seen.append(("layout", model)))
    monkeypatch.setattr(memory, "counted", lambda model, b, amp, cache=None: seen.append((model, tuple(b), amp)))
    monkeypatch.setattr(memory, "is_counted", lambda model, cache=None: False)  # a fresh checkout: nothing kept
    assert main(["fit", "--count-ahead"]) == 0
    assert "counted lenet, resnet18 for fit in " in capsys.readouterr().out
    assert seen == [
        ("layout", "lenet"),
        ("lenet", memory.COUNT_ANCHORS, False),
        ("lenet", memory.AUTOCAST_ANCHORS, True),
        ("layout", "resnet18"),
        ("resnet18", memory.COUNT_ANCHORS, False),
        ("resnet18", memory.AUTOCAST_ANCHORS, True),
    ], seen


def test_fit_names_what_it_leaves_out_and_reads_each_name_once(fit_root, capsys):
    """A k that does not divide the batch is named, not dropped unsaid; a repeated strategy or k gives one row; a
    device memory under 1 GiB reads in MiB; a device name with nothing kept says so beside the assumed context."""
    base = ["fit", "--model", "lenet", "--batch-size", "6"]
    assert main([*base, "--strategies", "ddp,ddp", "--devices", "2,2,3,4"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("ddp ")]
    assert [r[1] for r in rows] == ["2", "3"], out
    assert "(k=4 left out: a strategy splits the global batch 6 evenly over k)" in out
    assert main([*base, "--strategies", "ddp", "--devices", "2", "--device-memory", "512MiB"]) == 0
    assert "device memory 512 MiB: given (--device-memory)" in capsys.readouterr().out
    assert main([*base, "--strategies", "ddp", "--devices", "2", "--device-name", "NVIDIA H10"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no kept figure for 'NVIDIA H10' in device_basis.json (kept: none), so the assumed default" in out
    with pytest.raises(SystemExit):
        main([*base, "--devices", "2,,3"])


def test_fit_says_why_it_leaves_each_k_out(fit_root, capsys):
    """A one-device strategy at k > 1 is left out for that, not for a batch k divides; a k that leaves part of the
    batch over for that; each reason as fit_table gives it (memory.left_out), in the table's notes and in the
    refusal when no row is left."""
    base = ["fit", "--model", "lenet", "--batch-size", "512"]
    assert main([*base, "--strategies", "single", "--devices", "2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "k=2 left out: single runs on one device only (k=1)" in err, err
    assert "divides" not in err.split("Give")[0] and "Give k=1 or a parallel strategy" in err, err
    assert main([*base, "--strategies", "single,ddp", "--devices", "1,2,3"]) == 0
    out = capsys.readouterr().out
    assert "(k=2, 3 left out: single runs on one device only (k=1))" in out, out
    assert "(k=3 left out: a strategy splits the global batch 512 evenly over k)" in out, out


def test_the_ks_left_out_are_named_in_order(fit_root, capsys):
    """--devices in any order: each reason names its ks smallest first, in the refusal and in the table's notes."""
    base = ["fit", "--model", "lenet", "--batch-size", "512", "--devices", "4,8,2,3"]
    assert main([*base, "--strategies", "single"]) == 2
    assert "k=2, 3, 4, 8 left out: single runs on one device only" in " ".join(capsys.readouterr().err.split())
    assert main([*base, "--strategies", "ddp,single"]) == 0
    assert "(k=2, 3, 4, 8 left out: single runs on one device only (k=1))" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--device-memory", "-5GiB"], ["--device-memory=-5GiB"], ["--device-memory", "-1"]])
def test_a_negative_device_memory_gets_the_range_message(argv, fit_root, capsys):
    """A negative size after --device-memory is its value, not an option argparse expects a value before: refused
    with the flag's range (1MiB to 16TiB), exit 2, before anything is counted."""
    with pytest.raises(SystemExit) as e:
        main(["fit", "--model", "lenet", *argv])
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code == 2 and "argument --device-memory: '-" in err, err
    assert "one device's memory is from 1MiB" in err and "expected one argument" not in err, err


def test_signed_values_joins_only_the_flag_that_takes_one():
    """parser.signed_values: the flag and a '-<digit>' token after it joined; another flag, an option after it and
    anything after `--` as given."""
    from pipeline.cli.parser import signed_values

    assert signed_values(["fit", "--device-memory", "-5GiB"]) == ["fit", "--device-memory=-5GiB"]
    assert signed_values(["fit", "--device-memory", "-.5G"]) == ["fit", "--device-memory=-.5G"]
    assert signed_values(["fit", "--device-memory", "--model"]) == ["fit", "--device-memory", "--model"]
    assert signed_values(["fit", "--batch-size", "-5"]) == ["fit", "--batch-size", "-5"]
    assert signed_values(["--", "--device-memory", "-5"]) == ["--", "--device-memory", "-5"]


def test_a_largest_batch_beyond_the_training_set_is_said_as_such(fit_root, capsys):
    """No global batch holds more than the training set's images (pipeline/data/files.py TRAIN_IMAGES): a largest
    batch beyond it is said as "more than the 60,000 training images", one within it as the number, each row within
    100 columns."""
    from pipeline.data.files import TRAIN_IMAGES

    base = ["fit", "--model", "lenet", "--batch-size", "512", "--strategies", "ddp", "--devices", "2"]
    assert main(base) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("ddp "))
    assert row.endswith(f"more than the {TRAIN_IMAGES:,} training images") and TRAIN_IMAGES == 60_000, out
    assert all(len(line) <= 100 for line in out.splitlines()), out
    assert main([*base, "--device-memory", "2GiB"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ddp "))
    assert 0 < int(row.split()[-1]) <= TRAIN_IMAGES, row


def test_a_device_name_with_no_kept_figure_is_said_on_the_fixed_cost_line(fit_root, capsys):
    """--device-name with nothing kept for it: the fixed cost line says so, with the names kept (or none), whatever
    the rows; a name kept reads its figure with no such words."""
    base = ["fit", "--model", "lenet", "--batch-size", "512", "--device-name", "bogus"]
    assert main(base) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "fixed cost 864 MiB per device (bogus): no kept figure for 'bogus' in device_basis.json (kept: none), so the "
        "assumed default: context assumed, workspaces assumed" in out
    ), out
    (fit_root / "runs").mkdir()
    kept = {"context_mib": 500.0, "workspace_mib": 60.0, "source": "NVML", "date": "2026-11-27", "torch": "2.11"}
    (fit_root / "runs" / "device_basis.json").write_text(json.dumps({"NVIDIA H200": kept}))
    assert main(base) == 0
    assert "(kept: 'NVIDIA H200'), so the assumed default" in " ".join(capsys.readouterr().out.split())
    assert main([*base[:-1], "NVIDIA H200"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fixed cost 560 MiB per device (NVIDIA H200): context measured, workspaces measured" in out, out


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"context_mib": -500}, "context_mib -500 is not a non-negative number of MiB"),
        ({"context_mib": 500, "workspace_mib": "x", "date": "2026-11-27", "torch": "2.11"}, "workspace_mib 'x'"),
        ({"context_mib": 500}, "date None is not the text its source line says"),
        ({"context_mib": True, "date": "2026-11-27", "torch": "2.11"}, "context_mib True"),
        ([500], "a JSON list, not an object of figures"),
    ],
    ids=["negative", "text", "no date", "bool", "list"],
)
def test_a_kept_fixed_cost_that_cannot_be_read_is_ignored_and_said(entry, why, fit_root, capsys):
    """runs/device_basis.json is read, never trusted: an entry with a negative or non-numeric figure, or without
    the fields its source line says, is ignored with one stderr line naming the file and the entry, and fit answers
    with the assumed fixed cost (864 MiB), labelled assumed."""
    name = "NVIDIA H100 80GB HBM3"
    (fit_root / "runs").mkdir()
    store = fit_root / "runs" / "device_basis.json"
    store.write_text(json.dumps({name: entry}))
    assert main(["fit", "--model", "lenet", "--strategies", "ddp", "--devices", "2", "--device-name", name]) == 0
    captured = capsys.readouterr()
    out, err = " ".join(captured.out.split()), captured.err
    said = [line for line in err.splitlines() if line.startswith("ignored ")]
    assert len(said) == 1 and f"{store}, entry {name!r}: " in said[0] and why in said[0], err
    assert f"fixed cost 864 MiB per device ({name}): no kept figure for {name!r}" in out, out
    assert "context assumed, workspaces assumed" in out and "?" not in out and "-" + "436" not in out, out


@pytest.mark.parametrize("text", ["[]", "{not json", '{"NVIDIA H100 80GB HBM3": 7}'])
def test_a_store_file_that_is_not_figures_by_name_is_ignored(text, fit_root, capsys):
    """A device_basis.json that is not JSON or not an object: ignored, said on stderr, the assumed defaults."""
    (fit_root / "runs").mkdir()
    (fit_root / "runs" / "device_basis.json").write_text(text)
    argv = [
        "fit",
        "--model",
        "lenet",
        "--strategies",
        "ddp",
        "--devices",
        "2",
        "--device-name",
        "NVIDIA H100 80GB HBM3",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "ignored " in captured.err and "device_basis.json" in captured.err, captured.err
    assert "fixed cost 864 MiB per device" in captured.out


@pytest.mark.parametrize(
    "mangle",
    [
        lambda data: [],
        lambda data: "counts",
        lambda data: {k: ([] if k.startswith("lenet|fp32") else v) for k, v in data.items()},
        lambda data: {k: ({"64": [-1, "x"]} if k.startswith("lenet|fp32") else v) for k, v in data.items()},
        lambda data: {k: ({"64": [5, [1]]} if k.startswith("lenet|fp32") else v) for k, v in data.items()},
        lambda data: {k: ({**v, "numel": "x"} if k.startswith("layout|lenet") else v) for k, v in data.items()},
        lambda data: {k: ({**v, "units": [[999]]} if k.startswith("layout|lenet") else v) for k, v in data.items()},
    ],
    ids=["list", "text", "entry a list", "negative count", "units short", "layout numel", "unit index"],
)
def test_a_count_cache_that_cannot_be_read_is_counted_again(mangle, tmp_path, monkeypatch, capsys):
    """runs/memory_model.json is read, never trusted: a file that is not an object, or an entry (a layout, a count)
    of the wrong shape, is ignored with one stderr line naming the file (and the entry), and fit counts again and
    answers as from a good cache."""
    from pipeline.scaling import memory

    cache = tmp_path / "runs" / "memory_model.json"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(memory, "_cache_file", lambda c: cache)
    argv = ["fit", "--model", "lenet", "--strategies", "ddp", "--devices", "2"]

    def fresh():
        memory.layout.cache_clear()
        memory._COUNTED.clear()

    fresh()
    assert main(argv) == 0
    good = capsys.readouterr().out
    cache.write_text(json.dumps(mangle(json.loads(cache.read_text()))))
    fresh()
    assert main(argv) == 0
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() if line.startswith("ignored ")]
    assert said and all(str(cache) in line and "counting again" in line for line in said), captured.err
    assert captured.out == good
    fresh()
    monkeypatch.setattr("pipeline.scaling.device._SAID", set())  # each ignored entry said again, were it there
    assert main(argv) == 0  # the cache written anew: read as it is, nothing more said
    assert "ignored " not in capsys.readouterr().err


def test_a_fit_whose_strategies_run_no_autocast_finds_its_counts_kept_and_says_no_counting(
    tmp_path, monkeypatch, capsys
):
    """`fit --strategies ddp` counts fp32 only: a second run finds those counts kept and says no "counting" (the
    autocast counts, which no strategy asked for needs, are not asked of the cache)."""
    from pipeline.scaling import memory

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(memory, "_cache_file", lambda cache: tmp_path / "counts.json")
    memory.layout.cache_clear()  # this process's counts from other tests: the file is what a new process reads
    monkeypatch.setattr(memory, "_COUNTED", {})
    argv = ["fit", "--model", "lenet", "--batch-size", "256", "--strategies", "ddp", "--devices", "2"]
    assert main(argv) == 0
    assert "counting lenet's activations" in capsys.readouterr().err
    assert main(argv) == 0
    assert "counting" not in capsys.readouterr().err
    assert not memory.is_counted("lenet")  # the autocast counts: not made, and asked for where a strategy needs them


def test_a_fit_with_no_row_to_show_refuses_before_counting(tmp_path, monkeypatch, capsys):
    """Every k left out (memory.applicable): the refusal comes first, with no "counting" said and nothing counted
    or kept, however uncounted the model is."""
    from pipeline.scaling import memory

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    counts = tmp_path / "counts.json"
    monkeypatch.setattr(memory, "_cache_file", lambda cache: counts)
    memory.layout.cache_clear()
    monkeypatch.setattr(memory, "_COUNTED", {})
    assert not memory.is_counted("lenet")
    assert main(["fit", "--model", "lenet", "--batch-size", "512", "--strategies", "single", "--devices", "2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no row to show" in err and "counting" not in err, err
    assert not counts.exists() and not memory._COUNTED
