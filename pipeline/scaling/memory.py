"""A projection, labelled as modelled: the peak memory per device of a strategy at any k, batch, optimizer and
precision, from the model's parameters, the strategy's row (pipeline/catalog.py: `shards`, `comm`, `autocast`), the
optimizer's state per parameter and the activations of one forward and backward, counted once per model and batch.

    python -m pipeline fit --model resnet18 --batch-size 512 --device-memory 80GiB    # will it fit?

Every tensor figure returned here is modelled (`MODELLED`); nothing here is a measurement. "Will it fit?" on the gpu
basis adds what no tensor figure holds: the device's fixed cost (CUDA context, loaded kernels, the libraries'
workspaces: measured by doctor where kept, else assumed; pipeline/scaling/device.py) and the caching allocator's
rounding (reserved modelled from allocated, `RESERVED_FACTOR`, assumed).

The two figures a record holds (pipeline/measure/memory.py), and so the two bases this model predicts:
    cpu  (memtracker_step)      the CPU probe step under MemTracker: parameters included, the optimizer's state
                                included (made after the peak, added), the input batch left out (made before it)
    gpu  (steady_step_above_resident)  the CUDA allocator's peak over the steps after the warm-up above what was
                                resident before the first step (the libraries' workspaces among it): the
                                parameters and buffers are resident and left out, the input batch counts;
                                `resident` adds them back (with the data set every rank holds, and DDP's buckets)
                                for "will it fit?"

Terms per device (bytes; W = 4 bytes per parameter, fp32 master weights under autocast too):
    params       W, or under fsdp each tensor's dim 0 shard padded to a multiple of k
    buffers      BatchNorm's running statistics (replicated, never sharded)
    grads        W, or fsdp's shard (dim 0 split as torch.chunk does; device 0 holds the largest)
    optimizer    per parameter: sgd 0, sgd_momentum 4 bytes, adamw 8 bytes + a 4-byte step per tensor; zero1 keeps
                 the tensors its rank owns (ZeroRedundancyOptimizer's greedy partition, mirrored), fsdp its shards
    buckets      DDP's gradient buckets (bucket_allreduce rows): W. MemTracker counts them on CPU: DDP rebuilds its
                 buckets in the first step, through the dispatcher, so a ddp/zero1 probe step is single's + W to
                 the byte (LeNet and ResNet-18); with grad_as_bucket_view the gradients are the buckets' views and
                 `grads` is 0
    activations  the peak of one forward + backward less the parameters and gradients, counted at the per-device
                 batch on the `meta` device (no memory, no compute; bytes as MemTracker counts them on CPU) or, under
                 autocast, on fake CPU tensors (FakeTensorMode: CPU's autocast rules, no memory, no compute; autocast
                 does not act on `meta`); it holds the saved
                 tensors, the temporaries at the peak, and the gradients not yet made then
    gathered     fsdp: the unsharded unit at the peak: its parameters, its unsharded gradients, at k > 1 the
                 reduce-scatter's input. On the gpu basis at k >= 2 on NCCL, FSDP2 all-gathers the next unit on its
                 own stream while the current one computes (forward prefetch; backward prefetches one unit too), so
                 the parameters of the unit beside it (before it in forward order: backward's prefetch) are
                 unsharded as well; on Gloo (ranks sharing a GPU) and on CPU the collectives block: one unit
    replicas     scratch on a CPU host: the k replicas live in one process, so (k - 1) x (W + grads + state)
    input        the step's input batch where the figure sees it: scratch's chunks on CPU, every row's on GPUs
    step_temps   the optimizer step's temporaries: torch's AdamW one tensor at a time (CPU) holds two of the
                 largest tensor it updates, its foreach form (CUDA) one of everything it updates

    resident     gpu basis, before the first step and outside the step's figure: the parameters, the buffers, the
                 data set every rank holds, and for bucket_allreduce rows DDP's buckets (W): the reducer allocates
                 them in its constructor (LeNet zero1 k=1 on an H200, 2026-11-26: resident single's + W, and its step
                 peak single's + W as well, so the step's `buckets` term stays: two figures, each counted once)

    fixed = params + buffers + buckets + replicas + input
    peak  = max(fixed + activations + grads + gathered + state,  fixed + grads + state + step_temps)
    on CPU, for a torch optimizer (state made lazily in the probe step, added to the probe's peak where that came
    first): fixed + activations + grads + gathered + state where that forward + backward peak, without the state,
    is above the step's; else the step's (_total)
Assumptions (what a miss points to): activations are the `single` step's at the per-device batch (one process per
device; DDP's and FSDP's hooks add nothing else); the step's temporaries are torch's AdamW's; dp and dp_criterion
are projected only (CUDA only: replicas on devices 1..k-1, gradients, gathered outputs and the whole input batch on
device 0); zero1's post-step broadcasts over Gloo copy what they send (not modelled: a miss at the optimizer step).
Not modelled on the gpu basis: NCCL's own buffers at k >= 2 (outside the allocator), a CUDA graph's private pool.

Will it fit (gpu basis, `device_total`): (peak + resident) x RESERVED_FACTOR + the device's fixed cost <= its memory.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pipeline import catalog, zoo
from pipeline.data.files import TEST_IMAGES, TRAIN_IMAGES

MODELLED = True
MIB, GIB = 1 << 20, 1 << 30
INPUT_BYTES = 28 * 28 * 4 + 8  # one normalised float32 image and its int64 label
DATASET_BYTES = (TRAIN_IMAGES + TEST_IMAGES) * (28 * 28 + 8)  # every rank holds Fashion-MNIST's uint8 images and labels
STATE_BYTES = {"sgd": 0, "sgd_momentum": 4, "adamw": 8}  # optimizer state per parameter
STEP_BYTES = {"adamw": 4}  # and per parameter tensor (AdamW's step counter)
# the optimizer step's temporaries: (x the largest tensor it updates one at a time, x all it updates with foreach)
STEP_TEMPS = {"sgd": (0, 0), "sgd_momentum": (0, 0), "adamw": (2, 1)}
# The caching allocator reserves more than is allocated (what an out-of-memory error is about): blocks rounded up to
# 512 B, allocations under 1 MiB carved from 2 MiB segments, larger ones from 20 MiB segments or rounded up to 2 MiB,
# and freed blocks that a later size cannot reuse. Assumed: reserved = allocated x 1.10 (one observation: LeNet k=1
# on an H200, 2026-11-26, reserved peak 108 MiB over 91.5 MiB allocated, 1.18, evaluation's cached blocks included)
RESERVED_FACTOR = 1.10
COUNT_ANCHORS = (64, 128)  # per-device batches counted for `fit`; other batches interpolate (or extend) linearly
# under autocast the count runs on fake CPU tensors (autocast does not act on `meta`), at these small batches,
# extended linearly: shapes only, so a count costs about a second whatever the host's bf16 support
AUTOCAST_ANCHORS = (16, 32)
TERMS = (
    "params",
    "buffers",
    "grads",
    "optimizer",
    "buckets",
    "activations",
    "gathered",
    "replicas",
    "input",
    "step_temps",
)


@dataclass(frozen=True)
class Layout:
    """The model's parameter tensors in parameters() order (numel, dim-0 rows, names, shapes), its FSDP units (indices
    into them, and names), buffers. scaling/model.py's model_layout is a view of it."""

    model: str
    numel: tuple[int, ...]
    rows: tuple[int, ...]
    units: tuple[tuple[int, ...], ...]
    buffer_bytes: int
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    unit_names: tuple[str, ...]

    @property
    def params(self) -> int:
        return sum(self.numel)


@dataclass
class Counted:
    """One model's forward + backward, counted per per-device batch: the peak less the parameters (`fb`), and each
    FSDP unit's own peak inside it (`units`), in bytes; `fit` interpolates between them."""

    fb: dict[int, int] = field(default_factory=dict)
    units: dict[int, list[int]] = field(default_factory=dict)

    def at(self, b: int) -> tuple[float, list[float]]:
        if b in self.fb:
            return float(self.fb[b]), [float(u) for u in self.units[b]]
        lo, hi = self.read_from(b)
        f = (b - lo) / (hi - lo)
        return self.fb[lo] + f * (self.fb[hi] - self.fb[lo]), [
            u + f * (v - u) for u, v in zip(self.units[lo], self.units[hi])
        ]

    def read_from(self, b: int) -> tuple[int, ...]:
        """The counted batches `at(b)` reads: b itself where it is counted, else the two it interpolates between (or
        extends the line through: the lowest two below them all, the highest two above)."""
        if b in self.fb:
            return (b,)
        xs = sorted(self.fb)
        return (xs[0], xs[1]) if b < xs[0] else (xs[-2], xs[-1]) if b > xs[-1] else _bracket(xs, b)


@dataclass(frozen=True)
class ActivationsFrom:
    """How a prediction's activations figure is obtained: counted at per-device batches `counted`, on the meta device
    or (`autocast`) on fake CPU tensors under autocast, and read at the per-device batch `b` (B/k) as counted,
    interpolated between the two counts or extended along the line through them."""

    counted: tuple[int, ...]
    b: int
    autocast: bool = False

    def label(self) -> str:
        how = "with fake CPU tensors under autocast" if self.autocast else "on the meta device"
        if self.counted == (self.b,):
            return f"counted at B/k={self.b} {how}"
        lo, hi = self.counted
        read = "interpolated" if lo < self.b < hi else "extended"
        return f"counted at per-device batch {lo} and {hi} {how}, {read} to B/k={self.b}"


def _bracket(xs, b):
    i = next(i for i, x in enumerate(xs) if x > b)
    return xs[i - 1], xs[i]


def known_models() -> tuple[str, ...]:
    """The models `fit --count-ahead` counts ahead when it names none (d2l's two, as `make setup` runs it); any other
    model pipeline/zoo.py can build is counted when named there, or on its first `fit`, and kept in the same cache."""
    return zoo.D2L


def is_model(name: str) -> bool:
    """Whether the memory model can count `name`: any model pipeline/zoo.py can build (no torch loaded to say so)."""
    return zoo.kind(name) is not None


@functools.cache
def layout(model: str, cache=None) -> Layout:
    """The parameters and units of `model`, built on the `meta` device (no memory, no initialisation); kept in the
    cache file beside the counts, so a later `fit` loads no torch."""
    key = _layout_key(model)
    stored = _read_cache(cache).get(key)
    if stored is not None and (why := _layout_problem(stored)):
        _ignored(cache, key, why)
        stored = None
    if stored:
        return Layout(
            model,
            tuple(stored["numel"]),
            tuple(stored["rows"]),
            tuple(tuple(u) for u in stored["units"]),
            stored["buffer_bytes"],
            tuple(stored["names"]),
            tuple(tuple(s) for s in stored["shapes"]),
            tuple(stored["unit_names"]),
        )
    lay = _build_layout(model)
    _write_cache(cache, key, {f: getattr(lay, f) for f in LAYOUT_FIELDS})
    return lay


LAYOUT_FIELDS = ("numel", "rows", "units", "buffer_bytes", "names", "shapes", "unit_names")  # what the cache keeps


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _wholes(v, n: int | None = None) -> bool:
    """A list of non-negative ints (of length n where given)."""
    return isinstance(v, list) and all(map(_whole, v)) and (n is None or len(v) == n)


def _layout_problem(stored) -> str | None:
    """Why a kept layout cannot be read (None: it can): LAYOUT_FIELDS, each of its type, one per parameter tensor
    (numel, rows, names, shapes) or per unit (units, unit_names), a unit's indices among the tensors."""
    if not isinstance(stored, dict) or not set(LAYOUT_FIELDS) <= set(stored):
        return f"not a layout ({', '.join(LAYOUT_FIELDS)})"
    n = len(stored["numel"]) if isinstance(stored["numel"], list) else -1
    units, names, unit_names = stored["units"], stored["names"], stored["unit_names"]
    if not (
        _wholes(stored["numel"])
        and _wholes(stored["rows"], n)
        and _whole(stored["buffer_bytes"])
        and isinstance(names, list)
        and len(names) == n
        and all(isinstance(x, str) for x in names)
        and isinstance(stored["shapes"], list)
        and len(stored["shapes"]) == n
        and all(_wholes(x) for x in stored["shapes"])
        and isinstance(units, list)
        and all(_wholes(u) and all(i < n for i in u) for u in units)
        and isinstance(unit_names, list)
        and len(unit_names) == len(units)
        and all(isinstance(x, str) for x in unit_names)
    ):
        return "a layout field of the wrong type or length"
    return None


def _ignored(cache, key: str, why: str) -> None:
    from pipeline.scaling.device import ignored

    ignored(_cache_file(cache), key, why, "counting again")


def _layout_key(model: str) -> str:
    return f"layout|{model}|torch {_torch_version()}|code {_code_digest()}{_source(model)}"


def _source(model: str) -> str:
    """The code that builds `model` when it is not this repository's: torchvision's version, or the entry point's
    and its package's (zoo.source); d2l's is in _code_digest."""
    return "" if model in zoo.D2L else f"|{zoo.source(model)}"


def _torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


@functools.cache
def _code_digest() -> str:
    """The models and this module, hashed: a count kept from other code is counted again, never read."""
    h = hashlib.sha1()
    for f in (Path(__file__), Path(__file__).parents[1] / "models.py", Path(__file__).parents[1] / "zoo.py"):
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def is_counted(model: str, cache=None, strategies=None) -> bool:
    """Whether `fit` finds `model`'s layout and counts (fp32, and autocast's unless none of `strategies`, where
    given, runs under autocast) at the anchors in the cache: then it loads no torch."""
    autocast = strategies is None or any(catalog.SPECS[s].autocast for s in strategies)
    stored = _read_cache(cache)
    return _layout_problem(stored.get(_layout_key(model))) is None and all(
        {str(b) for b in anchors} <= set(_kept_counts(model, amp, cache))
        for amp, anchors in ((False, COUNT_ANCHORS), (True, AUTOCAST_ANCHORS))
        if autocast or not amp
    )


def _kept_counts(model: str, autocast: bool, cache=None, units: int | None = None) -> dict:
    """The counts the cache keeps for `model` (per per-device batch, as text: [fb, unit peaks]) that can be read:
    non-negative whole bytes, a peak per unit (`units` of them, where given); any other ignored, said on stderr."""
    key = _cache_key(model, autocast)
    stored = _read_cache(cache).get(key, {})
    if not isinstance(stored, dict):
        _ignored(cache, key, f"a JSON {type(stored).__name__}, not counts by batch")
        return {}
    kept = {}
    for b, v in stored.items():
        if b.isdigit() and isinstance(v, list) and len(v) == 2 and _whole(v[0]) and _wholes(v[1], units):
            kept[b] = v
        else:
            _ignored(cache, key, f"batch {b!r}: {v!r} is not [bytes, [bytes per unit]]")
    return kept


def count_ahead(models=None, cache=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`models`' layouts and counts at the anchors `fit` reads (default known_models()), into the cache (`make setup`
    runs it, through `python -m pipeline fit --count-ahead`), so the first `fit` of each answers from it. Returns
    (the models counted now, those the cache held already)."""
    models = tuple(dict.fromkeys(models or known_models()))
    kept = tuple(m for m in models if is_counted(m, cache))
    for model in models:
        layout(model, cache)
        counted(model, COUNT_ANCHORS, False, cache)
        counted(model, AUTOCAST_ANCHORS, True, cache)
    return tuple(m for m in models if m not in kept), kept


def _build_layout(model: str) -> Layout:
    from pipeline.models import blocks, build_meta

    m = build_meta(model)
    index = {id(p): i for i, p in enumerate(m.parameters())}
    named = list(blocks(m))
    units = tuple(tuple(index[id(p)] for p in unit.parameters()) for _, unit in named)
    params = list(m.named_parameters())
    return Layout(
        model,
        tuple(p.numel() for _, p in params),
        tuple(p.shape[0] for _, p in params),
        units,
        sum(b.numel() * b.element_size() for b in m.buffers()),
        tuple(n for n, _ in params),
        tuple(tuple(p.shape) for _, p in params),
        tuple(n for n, _ in named),
    )


_COUNTED: dict[tuple[str, bool], Counted] = {}


def counted(model: str, batches, autocast: bool = False, cache=None) -> Counted:
    """`model`'s forward + backward counted at each per-device batch of `batches` (once per process, and across
    processes in `cache`, a JSON file: runs/memory_model.json by default)."""
    key = (model, autocast)
    c = _COUNTED.setdefault(key, Counted())
    missing = [b for b in sorted(set(batches)) if b not in c.fb]
    if missing:
        stored = _kept_counts(model, autocast, cache, len(layout(model, cache).units))
        for b in missing:
            if str(b) in stored:
                c.fb[b], c.units[b] = stored[str(b)]
            else:
                c.fb[b], c.units[b] = _count(model, b, autocast)
                stored[str(b)] = [c.fb[b], c.units[b]]
        _write_cache(cache, _cache_key(model, autocast), stored)
    return c


def _cache_key(model: str, autocast: bool) -> str:
    return (
        f"{model}|{'autocast' if autocast else 'fp32'}|torch {_torch_version()}|code {_code_digest()}{_source(model)}"
    )


def _cache_file(cache):
    if cache is not None:
        return cache
    from pipeline import paths

    return paths.repo_root() / "runs" / "memory_model.json"


def _read_cache(cache) -> dict:
    """The cache as written ({} where it is missing; where it is not JSON or not an object of entries, said once on
    stderr: counted again, and the file written anew)."""
    from pipeline.scaling.device import read_object

    return read_object(_cache_file(cache), "counts by key", "counting again")


def _write_cache(cache, key: str, value: dict) -> None:
    path = _cache_file(cache)
    try:
        data = _read_cache(cache)
        data[key] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True))
    except OSError:  # a cache only: a read-only checkout counts again next time
        pass


def _count(model: str, b: int, autocast: bool) -> tuple[int, list[int]]:
    """One forward + backward of `model` at batch `b` under MemTracker, as the trial runs it (channels_last, the
    trial's default, cross-entropy): the peak less the parameters, and each FSDP unit's peak less the parameters."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from pipeline.models import blocks, build

    # autocast does not act on meta tensors; on fake CPU tensors it does, as on the host's CPU, with no compute
    # (the two counts side by side, and what each costs: benchmarks/RESULTS.md, "The memory model")
    torch.manual_seed(0)
    with FakeTensorMode() if autocast else torch.device("meta"):
        m = build(model)
        for p in m.parameters():  # module.to() cannot swap fake parameters: the trial's channels_last, set in place
            if p.dim() == 4:
                p.data = p.data.contiguous(memory_format=torch.channels_last)
        x = torch.randn(b, 1, 28, 28).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (b,))
        units = [unit for _, unit in blocks(m)]
        w = sum(p.numel() * p.element_size() for p in m.parameters())
        tracker = MemTracker()
        tracker.track_external(m)
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
    peak = sum(v.get("Total", 0) for v in tracker.get_tracker_snapshot("peak").values())
    local = [
        max(tracker.memory_tracking[u].local_peak.values(), default=0) if u in tracker.memory_tracking else 0
        for u in units
    ]
    return int(peak - w), [int(v - w) if v else 0 for v in local]


# ----------------------------------------------------------------------------- the partitions


def zero1_owned(numel, k: int) -> list[list[int]]:
    """The parameter tensors (indices) each of k ranks keeps optimizer state for: ZeroRedundancyOptimizer's
    partition (torch/distributed/optim/zero_redundancy_optimizer.py, _partition_parameters): largest first (a stable
    sort), each to the rank with the fewest elements so far, the lowest rank on a tie."""
    owned, sizes = [[] for _ in range(k)], [0] * k
    for i in sorted(range(len(numel)), key=lambda i: numel[i], reverse=True):
        r = sizes.index(min(sizes))
        owned[r].append(i)
        sizes[r] += numel[i]
    return owned


def shard_numel(numel: int, rows: int, k: int, rank: int, padded: bool = False) -> int:
    """Elements of one tensor on `rank` under FSDP2: dim 0 split as torch.chunk does (ceil(rows/k) rows per rank, the
    last ranks fewer or none); `padded`: the storage every rank holds (ceil(rows/k) rows)."""
    per_row, chunk = numel // max(rows, 1), math.ceil(rows / k)
    if padded:
        return chunk * per_row
    return max(0, min(chunk, rows - rank * chunk)) * per_row


# ----------------------------------------------------------------------------- the prediction


@dataclass(frozen=True)
class Prediction:
    """Per device (rank order) the modelled peak in bytes and its terms; `peak` = the largest (the report's)."""

    strategy: str
    model: str
    k: int
    batch_size: int
    optimizer: str
    basis: str
    per_device: tuple[int, ...]
    terms: tuple[dict, ...]
    resident: int  # gpu basis: what is resident before the first step (parameters, buffers, data set, buckets)
    resident_terms: dict = field(default_factory=dict)  # gpu basis: `resident`, term by term (bytes)
    modelled: bool = True
    activations_from: ActivationsFrom | None = None  # how the activations figure is obtained (its source's label)

    @property
    def peak(self) -> int:
        return max(self.per_device)

    @property
    def rank(self) -> int:
        return self.per_device.index(self.peak)


def predict(
    strategy: str,
    model: str,
    k: int,
    batch_size: int,
    optimizer: str = "sgd",
    basis: str = "cpu",
    grad_as_bucket_view: bool = True,  # train.grad_as_bucket_view's default
    autocast: bool | None = None,
    anchors=None,
    cache=None,
    backend: str | None = None,
) -> Prediction:
    """The modelled peak per device of `strategy` at k devices and global batch `batch_size` (module docstring).
    `anchors`: count the activations at these per-device batches and interpolate (fit's fast path); by default
    they are counted at this point's own per-device batch. `backend`: the process group's, on the gpu basis "nccl"
    (one process per GPU, the default) or "gloo" (ranks sharing a GPU); FSDP2 prefetches a unit on NCCL only."""
    row = catalog.spec(strategy)
    amp = row.autocast if autocast is None else autocast
    lay = layout(model, cache)
    b = max(1, batch_size // k)
    c = counted(model, AUTOCAST_ANCHORS if amp else anchors or (b,), amp, cache)
    fb, unit_peaks = c.at(b)
    prefetch = basis == "gpu" and k >= 2 and (backend or "nccl").lower() == "nccl"
    terms = [
        _rank_terms(row, lay, k, r, b, batch_size, optimizer, basis, grad_as_bucket_view, fb, unit_peaks, prefetch)
        for r in range(1 if (basis == "cpu" and not row.parallel_on_cpu) else k)
    ]
    lazy = basis == "cpu" and not _handwritten(row)  # a hand-written optimizer makes its state up front
    per_device = tuple(int(_total(t, lazy)) for t in terms)
    params_resident = [int(t.pop("params_resident")) for t in terms]
    state_resident = [int(t.pop("optimizer_resident")) for t in terms]
    top = per_device.index(max(per_device))  # the rank "will it fit?" is about
    resident_terms = {
        "params": params_resident[top],
        "optimizer": state_resident[top],  # a hand-written optimizer's, made before training (0 for torch's)
        "buffers": lay.buffer_bytes,
        "dataset": DATASET_BYTES,
        # DDP's reducer allocates its buckets in its constructor: on CUDA they are there before the first step
        "buckets": 4 * lay.params if basis == "gpu" and row.comm == "bucket_allreduce" else 0,
    }
    resident = sum(resident_terms.values())
    return Prediction(
        strategy,
        model,
        k,
        batch_size,
        optimizer,
        basis,
        per_device,
        tuple(terms),
        resident,
        resident_terms,
        activations_from=ActivationsFrom(c.read_from(b), b, amp),
    )


def _total(t: dict, lazy_state: bool) -> float:
    """The peak of one rank's terms. `lazy_state` (the CPU probe of a torch optimizer, whose state is made inside
    the probe step's `step()`): the probe adds the state only where its peak came before the state existed
    (pipeline/measure/memory.py), so the figure is the forward + backward's peak plus the state where that peak is
    the higher, else the optimizer step's peak; elsewhere the state is there at every peak."""
    fixed = t["params"] + t["buffers"] + t["buckets"] + t["replicas"] + t["input"]
    fb = fixed + t["activations"] + t["grads"] + t["gathered"]
    step = fixed + t["grads"] + t["optimizer"] + t["step_temps"]
    if lazy_state:
        return fb + t["optimizer"] if fb > step else step
    return max(fb + t["optimizer"], step)


def _handwritten(row) -> bool:
    """d2l's from-scratch recipe (its copy-based all-reduce) steps with a hand-written optimizer, whose state is made
    before training, as d2l does (strategies/scratch.py)."""
    return row.comm == "copy_allreduce"


def _gathers_on_device0(row) -> bool:
    """nn.DataParallel's designs: the batch scattered from, and the outputs (or losses) gathered on, device 0."""
    return row.comm in ("dp_gather_logits", "dp_gather_losses")


def _rank_terms(row, lay: Layout, k, rank, b, batch, optimizer, basis, gav, fb, unit_peaks, prefetch) -> dict:
    w_full = 4 * lay.params
    sharded = set(row.shards)
    fsdp = "params" in sharded
    if fsdp:
        w = 4 * sum(shard_numel(n, r, k, rank, padded=True) for n, r in zip(lay.numel, lay.rows))
        g = 4 * sum(shard_numel(n, r, k, rank) for n, r in zip(lay.numel, lay.rows))
    else:
        w, g = w_full, w_full
    # the tensors whose state this rank keeps, and their elements on it
    if "optimizer" in sharded and not fsdp:
        mine = {i: lay.numel[i] for i in zero1_owned(lay.numel, k)[rank]}
    elif fsdp:
        mine = {i: shard_numel(n, r, k, rank) for i, (n, r) in enumerate(zip(lay.numel, lay.rows))}
    else:
        mine = dict(enumerate(lay.numel))
    state = STATE_BYTES[optimizer] * sum(mine.values()) + STEP_BYTES.get(optimizer, 0) * len(mine)
    one_at_a_time, foreach = STEP_TEMPS[optimizer]
    temps = 4 * (foreach * sum(mine.values()) if basis == "gpu" else one_at_a_time * max(mine.values(), default=0))
    buckets = w_full if row.comm == "bucket_allreduce" else 0
    if buckets and gav:
        g = 0  # the gradients are views of the buckets
    # activations: the counted forward + backward less the gradients it made (the step's `grads` term holds them)
    acts = fb - w_full - lay.buffer_bytes
    gathered = 0.0
    if fsdp and lay.units:
        # the unit FSDP2 holds unsharded nearest the peak (the one with the highest own peak): its parameters, and at
        # k > 1 its unsharded gradients too, beside their shards
        near = max(range(len(lay.units)), key=lambda u: unit_peaks[u])
        gathered = (1 if k == 1 else 2) * 4 * sum(lay.numel[i] for i in lay.units[near])
        if prefetch and len(lay.units) > 1:  # NCCL: the unit beside it is all-gathered while it computes
            beside = near - 1 if near > 0 else near + 1
            gathered += 4 * sum(lay.numel[i] for i in lay.units[beside])
    replicas = 0
    inputs = 0
    if basis == "cpu" and not row.parallel_on_cpu:  # every replica in this one process, one after another
        replicas = (k - 1) * (w_full + w_full + state)
        inputs = batch * INPUT_BYTES  # the chunks are views of the whole batch, which the probe then sees
    if basis == "gpu":
        inputs = b * INPUT_BYTES + b * 28 * 28  # the normalised batch and the uint8 gather it is made from
        if _gathers_on_device0(row) and rank == 0:
            # device 0: the whole batch is normalised there and scattered, the outputs gathered there
            inputs = batch * (INPUT_BYTES + 28 * 28) + 2 * batch * 10 * 4
    params = w
    if basis == "gpu" and not _gathers_on_device0(row) or (basis == "gpu" and rank == 0):
        params = 0  # resident before the first step
    if basis == "gpu" and _gathers_on_device0(row) and rank > 0:
        g, state, temps = 0, 0, 0  # a replica: parameters broadcast in each forward, its gradients reduced to 0
    buffers = 0 if basis == "gpu" else lay.buffer_bytes
    state_resident = 0
    if basis == "gpu" and _handwritten(row):
        state, state_resident = 0, state  # hand-written: made before training, resident
    return {
        "params": params,
        "buffers": buffers,
        "grads": g,
        "optimizer": state,
        "buckets": buckets,
        "activations": max(0.0, acts),
        "gathered": gathered,
        "replicas": replicas,
        "input": inputs,
        "step_temps": temps,
        "params_resident": w,
        "optimizer_resident": state_resident,
    }


# ----------------------------------------------------------------------------- will it fit?


def reserved(allocated: float) -> int:
    """The caching allocator's reserved bytes for `allocated` bytes at the peak: assumed (RESERVED_FACTOR)."""
    return int(allocated * RESERVED_FACTOR)


def device_total(p: Prediction, fixed: int | None = None) -> int:
    """What the device needs at the peak. gpu basis: the allocator's reserved (modelled from the step peak above
    resident plus the resident, x RESERVED_FACTOR) plus the device's fixed cost (`fixed` bytes: context and
    workspaces, device.fixed_cost; None: the assumed default). cpu basis: the peak."""
    if p.basis != "gpu":
        return p.peak
    if fixed is None:
        from pipeline.scaling import device

        fixed = device.fixed_cost(None).bytes
    return reserved(p.peak + p.resident) + fixed


def largest_batch(
    strategy: str, model: str, k: int, device_bytes: int, optimizer: str, fixed: int | None = None, **kw
) -> int:
    """The largest global batch (a multiple of k) whose modelled need (device_total) fits `device_bytes`; 0 if none
    does."""

    def fits(batch):
        p = predict(strategy, model, k, batch, optimizer, anchors=COUNT_ANCHORS, **kw)
        return device_total(p, fixed) <= device_bytes

    if not fits(k):
        return 0
    lo, hi = 1, 2
    while fits(hi * k) and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * k) else (lo, mid)
    return lo * k


class LeftOut(NamedTuple):
    """A strategy at k devices that fit_table leaves out: why, in words, and what to give instead."""

    strategy: str
    k: int
    why: str
    fix: str


def left_out(strategy: str, k: int, batch_size: int) -> LeftOut | None:
    """Why fit_table leaves `strategy` at k devices out (None: it is shown): a one-device strategy at k > 1, else a
    global batch that k devices cannot split evenly."""
    if catalog.spec(strategy).one_device_only and k != 1:
        return LeftOut(strategy, k, f"{strategy} runs on one device only (k=1)", "k=1 or a parallel strategy")
    if batch_size % k:
        why = f"a strategy splits the global batch {batch_size} evenly over k"
        return LeftOut(strategy, k, why, "a k that divides the batch")
    return None


def applicable(strategies, ks, batch_size: int) -> tuple[list[tuple[str, int]], list[LeftOut]]:
    """The (strategy, k) pairs fit_table shows, and those it leaves out, each with its reason (left_out): known
    before a tensor is counted, so a fit with nothing to show says so without counting."""
    pairs = [(s, k) for s in strategies for k in ks]
    outs = [left_out(s, k, batch_size) for s, k in pairs]
    return [p for p, out in zip(pairs, outs) if out is None], [out for out in outs if out is not None]


def fit_table(
    model: str,
    batch_size: int,
    device_bytes: int,
    optimizer: str = "adamw",
    ks=(1, 2, 4, 8),
    strategies=None,
    basis: str = "gpu",
    cache=None,
    fixed: int | None = None,
    backend: str | None = None,
) -> tuple[list[dict], list[LeftOut]]:
    """Per strategy and k: the modelled peak per device at `batch_size` (`prediction`: its terms), what the device
    needs then (device_total, with `fixed` bytes of fixed cost), whether it fits, the largest batch that does. A
    strategy a k does not apply to is left out: returned beside the rows, each with its reason (left_out)."""
    rows, (shown, dropped) = [], applicable(strategies or catalog.NAMES, ks, batch_size)
    kw = {"basis": basis, "cache": cache, "backend": backend}
    for s, k in shown:
        p = predict(s, model, k, batch_size, optimizer, anchors=COUNT_ANCHORS, **kw)
        total = device_total(p, fixed)
        rows.append(
            {
                "strategy": s,
                "k": k,
                "batch_size": batch_size,
                "peak_bytes": p.peak,
                "device_bytes": total,
                "fits": total <= device_bytes,
                "largest_batch": largest_batch(s, model, k, device_bytes, optimizer, fixed, **kw),
                "prediction": p,
            }
        )
    return rows, dropped


def error_pct(measured: float, modelled: float) -> float:
    """(modelled - measured) / measured, in %: positive where the model over-predicts."""
    return 100.0 * (modelled - measured) / measured if measured else math.nan


# what a record's peak_mem_bytes holds (its mem_basis) -> the basis whose figure predicts it; the CUDA allocator's
# figures (mem_method cuda_allocator) are the gpu basis, MemTracker's the cpu basis
# older CUDA rows (step_above_resident) hold the libraries' workspaces in the step: not what the model predicts
RECORD_BASES = {"memtracker_step": "cpu", "steady_step_above_resident": "gpu"}


def basis_of_record(record: dict) -> str | None:
    """The basis whose figure a trial record's `peak_mem_bytes` is (RECORD_BASES); a record without a mem_basis is
    read from its mem_method as pipeline/analysis/tables/points.py reads it (MemTracker: cpu; an older CUDA record
    held the peak with the resident in it, which no basis predicts: None)."""
    if record.get("mem_basis"):
        return RECORD_BASES.get(record["mem_basis"])
    return "cpu" if record.get("mem_method") == "memtracker" else None


# ----------------------------------------------------------------------------- its terms, with their sources

STEP_TERMS = {  # the step's terms on the gpu basis, as `fit` names them (need_terms; their sources: _step_source)
    "params": "parameters (replica)",
    "activations": "activations",
    "grads": "gradients",
    "buckets": "buckets (step)",
    "optimizer": "optimizer state",
    "gathered": "gathered units",
    "input": "input batch",
    "step_temps": "step temporaries",
    "buffers": "buffers",
}
RESIDENT_TERMS = {
    "params": "parameters",
    "optimizer": "optimizer state (resident)",
    "buffers": "buffers",
    "dataset": "data set",
    "buckets": "buckets (resident)",
}


def _step_source(p: Prediction, term: str) -> str:
    """Where the step's `term` of `p` comes from, in words: read from the strategy's catalog row (what it shards,
    how it communicates) and from `p`'s own figures, so a row's text is its design's, never another strategy's."""
    row, t = catalog.spec(p.strategy), p.terms[p.rank]
    sharded = set(row.shards)
    if term == "activations":
        return p.activations_from.label() if p.activations_from else "counted"
    if term == "grads":
        if "grads" in sharded:
            return "its shard of the gradients, 4 B/param"
        if row.comm == "bucket_allreduce":
            return "0: views of DDP's buckets" if not t["grads"] else "4 B/param, beside DDP's buckets"
        if _gathers_on_device0(row) and not t["grads"]:
            return "0: a replica's, reduced to device 0"
        return "4 B/param"
    if term == "optimizer":
        keeps = "of the part of it this rank keeps (sharded)" if "optimizer" in sharded else "of every parameter"
        return f"{p.optimizer}'s state, {keeps}"
    return {
        "params": "broadcast to the replica in each forward",
        "buckets": "DDP's buckets in the step, 4 B/param",
        "gathered": "FSDP2's unsharded unit; 2 at k >= 2 on NCCL",
        "input": (
            "the whole batch, scattered from here, and the gathered outputs"
            if _gathers_on_device0(row) and p.rank == 0
            else "the batch and its uint8 gather"
        ),
        "step_temps": f"the optimizer step's ({p.optimizer} foreach)",
        "buffers": "BatchNorm's running statistics",
    }[term]


def _resident_source(p: Prediction, term: str) -> str:
    """Where the resident `term` of `p` comes from, in words (as _step_source: from the row and `p`)."""
    row = catalog.spec(p.strategy)
    return {
        "params": "its padded shard, 4 B/param" if "params" in row.shards else "4 B/param",
        "optimizer": f"{p.optimizer}'s, hand-written and made before training, as d2l does",
        "buffers": "BatchNorm's running statistics",
        "dataset": "Fashion-MNIST, uint8, " + ("on every rank" if row.multiprocess else "in its one process"),
        "buckets": "made in DDP's constructor, 4 B/param",
    }[term]


def need_terms(p: Prediction, fixed) -> list[tuple[str, str, int, str]]:
    """What device p.rank needs on the gpu basis, term by term: (part, term, bytes, source), `fixed` a
    device.FixedCost. The parts: the fixed cost (measured or assumed), the resident tensors and the step's peak
    above them (modelled; the step's terms that are 0 left out), the allocator's rounding (assumed), the total
    (device_total)."""
    t = p.terms[p.rank]
    rows = [
        ("fixed cost", "CUDA context + kernels", fixed.context.bytes, fixed.context.label),
        ("fixed cost", "library workspaces", fixed.workspaces.bytes, fixed.workspaces.label),
    ]
    rows += [
        ("resident", RESIDENT_TERMS[k], int(v), "modelled: " + _resident_source(p, k))
        for k, v in p.resident_terms.items()
        if v or k not in ("buckets", "optimizer")
    ]
    rows += [
        ("step", STEP_TERMS[k], int(t[k]), "modelled: " + _step_source(p, k))
        for k in ("activations", "grads", "buckets", "optimizer", "step_temps", "gathered", "input", "params")
        if t[k] or k == "grads"
    ]
    rows.append(
        (
            "step",
            "step peak above resident",
            p.peak,
            "modelled: max(forward + backward, optimizer step)",
        )
    )
    allocated = p.peak + p.resident
    rows.append(
        (
            "allocator",
            "reserved over allocated",
            reserved(allocated) - allocated,
            f"assumed: {RESERVED_FACTOR - 1:.0%} of what is allocated (rounding)",
        )
    )
    rows.append(("total", "needed per device", device_total(p, fixed.bytes), "reserved + fixed cost"))
    return rows
