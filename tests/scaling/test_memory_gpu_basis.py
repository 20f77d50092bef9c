"""The memory model's gpu basis for "will it fit?": DDP's buckets resident, FSDP2's prefetched unit on NCCL, units read
as written (80GB vs 80GiB), the device's fixed cost measured where doctor kept it else assumed, and model_check's
basis taken from the record it compares with."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import types
from pipeline.scaling import memory

MIB = 1 << 20


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    """One counts file for this module: ResNet-18 counted once (seconds), fp32 only."""
    return tmp_path_factory.mktemp("counts") / "memory_model.json"


def gpu(strategy, k=2, batch=256, counts=None, **kw):
    return memory.predict(strategy, "resnet18", k, batch, "sgd", anchors=memory.COUNT_ANCHORS, cache=counts, **kw)


def test_a_part_label_and_a_binary_size_are_read_as_written():
    """80GB is 80e9 bytes (a part's label), 80GiB and 80G are 80 x 2^30 (what torch reports): not the same size."""
    assert types.parse_size("80GB") == 80 * 10**9
    assert types.parse_size("80GiB") == types.parse_size("80G") == 80 * 2**30
    assert types.parse_size("512MB") == 512 * 10**6 and types.parse_size("512MiB") == 512 * 2**20
    assert types.parse_size("79.6 GiB") == int(79.6 * 2**30) and types.parse_size("1024") == 1024
    with pytest.raises(ValueError, match="not a memory size"):
        types.parse_size("eighty")


def test_ddp_buckets_are_resident_on_the_gpu_basis_and_counted_once(counts):
    """The reducer makes its buckets in its constructor: resident for ddp and zero1 (4 B per parameter), not for
    single or fsdp; the step's figure above resident keeps its own bucket term (gradients as their views), so it is
    single's."""
    w = 4 * memory.layout("resnet18", counts).params
    single, fsdp = gpu("single", 1, counts=counts), gpu("fsdp", counts=counts)
    for s in ("ddp", "zero1"):
        p = gpu(s, counts=counts, basis="gpu")
        assert p.resident - gpu("single", 1, counts=counts, basis="gpu").resident == w, s
        assert p.resident_terms["buckets"] == w
        assert p.terms[0]["buckets"] == w and p.terms[0]["grads"] == 0  # the step's: views, not a second copy
    assert gpu("single", 1, counts=counts, basis="gpu").resident_terms["buckets"] == 0
    assert gpu("fsdp", counts=counts, basis="gpu").resident_terms["buckets"] == 0
    assert gpu("ddp", counts=counts, basis="cpu").resident_terms["buckets"] == 0  # the CPU probe counts them in-step
    assert single.peak and fsdp.peak


def test_fsdp_holds_two_units_on_nccl_and_one_on_gloo(counts):
    """At k=2 on the gpu basis (NCCL, one process per GPU) the unit beside the gathered one is all-gathered too
    (prefetch): `gathered` grows by one unit's parameters; on Gloo (ranks sharing a GPU), at k=1 and on the cpu basis
    the collectives block and one unit is held."""
    lay = memory.layout("resnet18", counts)
    unit_bytes = {4 * sum(lay.numel[i] for i in u) for u in lay.units}
    nccl = gpu("fsdp", counts=counts, basis="gpu").terms[0]["gathered"]
    cpu = gpu("fsdp", counts=counts, basis="cpu").terms[0]["gathered"]
    assert nccl - cpu in unit_bytes and nccl > cpu
    assert gpu("fsdp", counts=counts, basis="gpu", backend="gloo").terms[0]["gathered"] == cpu
    one = gpu("fsdp", 1, counts=counts, basis="gpu").terms[0]["gathered"]
    assert one == gpu("fsdp", 1, counts=counts, basis="cpu").terms[0]["gathered"]


def test_the_fixed_cost_is_the_kept_measurement_else_the_assumed_default(tmp_path):
    """doctor on CUDA keeps the context (NVML used - allocator reserved, at k=1) and the workspaces under the
    device's name; the fixed cost of that name is then measured, of any other assumed (the documented default)."""
    from pipeline.scaling import device

    store = tmp_path / "device_basis.json"
    report = {
        "host": {"kind": "cuda", "name": "NVIDIA H200", "torch": "2.11.0+cu130"},
        "rows": [
            {"status": "passed", "k": 1, "nvml_used_mib": [1489.88], "reserved_peak_mib": [108.0]},
            {
                "status": "passed",
                "k": 1,
                "nvml_used_mib": [1500.0],
                "reserved_peak_mib": [100.0],
                "workspace_mib": [66.0],
            },
            {"status": "passed", "k": 2, "nvml_used_mib": [3000.0], "reserved_peak_mib": [100.0]},  # two contexts
        ],
    }
    assert device.keep_from_doctor(report, store) == "NVIDIA H200"
    kept = json.loads(store.read_text())["NVIDIA H200"]
    assert kept["context_mib"] == pytest.approx(1381.9) and kept["workspace_mib"] == 66.0 and kept["torch"]
    measured = device.fixed_cost("NVIDIA H200", store)
    assert measured.context.measured and measured.context.label.startswith("measured (doctor on NVIDIA H200")
    assert measured.workspaces.measured and measured.bytes == int(1381.9 * MIB) + 66 * MIB
    other = device.fixed_cost("NVIDIA H100 80GB HBM3", store)
    assert not other.context.measured and other.context.label.startswith("assumed (default")
    assert other.bytes == (device.DEFAULT_CONTEXT_MIB + device.DEFAULT_WORKSPACE_MIB) * MIB == 864 * MIB
    assert device.keep_from_doctor({"host": {"kind": "cpu"}, "rows": []}, store) is None  # a CPU host keeps nothing
    p = gpu("ddp", counts=tmp_path / "counts.json", basis="gpu")
    allocated = p.peak + p.resident
    assert memory.device_total(p, measured.bytes) == int(allocated * memory.RESERVED_FACTOR) + measured.bytes
    assert memory.device_total(p) == int(allocated * memory.RESERVED_FACTOR) + 864 * MIB


@pytest.mark.parametrize(
    "record, basis",
    [
        ({"mem_basis": "steady_step_above_resident", "mem_method": "cuda_allocator"}, "gpu"),
        ({"mem_basis": "memtracker_step", "mem_method": "memtracker"}, "cpu"),
    ],
)
def test_model_check_compares_on_the_basis_the_record_names(record, basis, counts, monkeypatch):
    """A GPU record's figure is the step's peak above resident (parameters out, the input in): model_check compares
    it with the gpu basis, a CPU record's with the cpu basis."""
    from benchmarks.memory import model_check

    monkeypatch.setattr(memory, "_cache_file", lambda cache: counts)
    got = model_check.modelled_peak(record, "zero1", "lenet", 1, 128, "adamw")
    assert got == memory.predict("zero1", "lenet", 1, 128, "adamw", basis=basis).peak
    assert got != memory.predict("zero1", "lenet", 1, 128, "adamw", basis={"gpu": "cpu", "cpu": "gpu"}[basis]).peak


def test_a_hand_written_optimizers_state_is_resident_on_the_gpu_basis(counts):
    """scratch's optimizer (d2l's, hand-written) makes its state before training: on the gpu basis it is resident,
    the size torch's AdamW keeps for single, never dropped; so scratch with AdamW needs more than with SGD."""

    def scratch(optimizer):
        return memory.predict(
            "scratch", "resnet18", 1, 256, optimizer, anchors=memory.COUNT_ANCHORS, cache=counts, basis="gpu"
        )

    single = memory.predict(
        "single", "resnet18", 1, 256, "adamw", anchors=memory.COUNT_ANCHORS, cache=counts, basis="gpu"
    )
    sgd, adamw = scratch("sgd"), scratch("adamw")
    assert adamw.resident_terms["optimizer"] == single.terms[0]["optimizer"] > 0
    assert adamw.terms[0]["optimizer"] == 0, "made before training: not the step's"
    assert memory.device_total(adamw, 0) > memory.device_total(sgd, 0)
    assert single.resident_terms["optimizer"] == 0, "torch's optimizer makes its state in the first step"


def test_a_kept_entry_is_read_only_where_its_figures_and_source_are_sound(tmp_path, capsys):
    """device.fixed_cost reads an entry with non-negative figures and the date and torch its source line says; any
    other is ignored (said once on stderr), the assumed defaults taken; keep_from_doctor keeps writing beside it."""
    from pipeline.scaling import device

    store = tmp_path / "device_basis.json"
    good = {"context_mib": 900.0, "workspace_mib": None, "date": "2026-11-27", "torch": "2.11"}
    store.write_text(json.dumps({"A": good, "B": {**good, "context_mib": -500}, "C": {**good, "torch": 2}}))
    assert device.fixed_cost("A", store).context.bytes == 900 * MIB
    for name in ("B", "C", "B"):
        cost = device.fixed_cost(name, store)
        assert cost.bytes == 864 * MIB and not cost.context.measured and "(kept: 'A')" in cost.note
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "entry 'B': context_mib -500" in err[0] and "entry 'C': torch 2" in err[1], err
    assert device.entry_problem({"context_mib": float("nan"), "date": "d", "torch": "t"})
    store.write_text("[]")
    assert device.fixed_cost("A", store).bytes == 864 * MIB
    report = {
        "host": {"kind": "cuda", "name": "A", "torch": "2.11"},
        "rows": [{"status": "passed", "k": 1, "nvml_used_mib": [1000.0], "reserved_peak_mib": [100.0]}],
    }
    assert device.keep_from_doctor(report, store) == "A"  # a file that held no object is written anew
    assert device.fixed_cost("A", store).context.measured


# a word of a term's source -> whether a strategy's row has the mechanism it names
MECHANISMS = {
    "bucket": lambda row: row.comm == "bucket_allreduce",
    "DDP": lambda row: row.comm == "bucket_allreduce",
    "shard": lambda row: bool(row.shards),
    "FSDP": lambda row: "params" in row.shards,
    "d2l": lambda row: row.comm == "copy_allreduce",
    "device 0": lambda row: row.gathers,
    "replica": lambda row: row.gathers,
}


def test_each_terms_source_names_only_its_own_strategys_mechanisms(counts):
    """fit's sources are the shown strategy's, read from its catalog row: no strategy's term names a mechanism its row
    lacks (DDP's buckets, a shard, FSDP2's units), and ddp's, fsdp's and single's say what each does."""
    from pipeline import catalog
    from pipeline.scaling import device

    fixed = device.fixed_cost(None)
    sources = {}
    for name in catalog.NAMES:
        row = catalog.spec(name)
        p = memory.predict(
            name,
            "resnet18",
            1 if row.one_device_only else 2,
            256,
            "adamw",
            "gpu",
            anchors=memory.COUNT_ANCHORS,
            cache=counts,
        )
        sources[name] = {term: source for part, term, _, source in memory.need_terms(p, fixed) if part != "total"}
        for term, source in sources[name].items():
            for word, has in MECHANISMS.items():
                assert has(row) or word not in source, (name, term, source)
    assert sources["ddp"]["gradients"] == "modelled: 0: views of DDP's buckets"
    assert sources["fsdp"]["parameters"] == "modelled: its padded shard, 4 B/param"
    assert "shard" in sources["fsdp"]["gradients"] and "shard" in sources["fsdp"]["optimizer state"]
    assert sources["single"]["gradients"] == sources["single"]["parameters"] == "modelled: 4 B/param"
