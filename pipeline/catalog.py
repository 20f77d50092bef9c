"""The strategies and their knobs: one torch-free table that config, sweep, analysis, the scaling model, doctor, the
strategy classes and the docs read (docs/strategies.md is checked against it by tests/architecture/test_catalog.py).

Nothing heavy is imported here (no torch, optuna, mlflow or pandas): validating params.yaml or listing strategies
costs nothing. A strategy's behaviour lives in its class under pipeline/strategies/; what the rest of the pipeline
needs to know about it without importing torch lives in its row here, and tests/architecture/test_catalog.py checks
that each
registered class agrees with its row. Code outside strategies/ and this module asks a row (`spec(name).multiprocess`,
`knobs(name)`, `spec(name).comm`), never compares a strategy's name.
"""

from __future__ import annotations

from dataclasses import dataclass

# The sweep knobs: a dimension of the search space only for the strategies whose row accepts it (SpaceConfig holds a
# default for each; train.<knob> configures one run, refused for a strategy whose row does not list it). Two kinds:
# DDP's communication design, and the execution modes (same arithmetic, different execution: torch.compile,
# cuDNN's autotuner, autocast on the one-device reference so AMP's gain is told apart from DDP's cost). Every mode is
# off by default: the reference row of every comparison runs eager, fp32, unautotuned.
COMM_KNOBS = ("bucket_cap_mb", "grad_as_bucket_view", "accum_steps", "comm_hook")
MODES = ("compile", "compile_mode", "cuda_graphs", "cudnn_benchmark", "autocast")
KNOBS = (*COMM_KNOBS, *MODES)
# The train settings that configure something only some trials run: setting -> (what it is, what it applies with).
# What it applies with is a knob of the point, on, or a row's flag of the same name (autocast: ddp_amp's row, or
# single's autocast knob; gathers: dp's rows). Away from its default it would be recorded and never run where it does
# not apply: a trial refuses it (loader.unapplied_refusal, from trial/launch.py's check), a sweep none of whose points
# runs with it refuses it (loader.sweep_refusal) and runs the points it does not apply to at its default
# (sweep/space.py), doctor refuses it where none of its rows runs with it and runs the others at its default.
APPLIES_WITH = {
    "compile_mode": ("torch.compile's mode", "compile"),
    "amp_dtype": ("autocast's type", "autocast"),
    "amp_init_scale": ("the fp16 GradScaler's first scale", "autocast"),
    "output_device": ("the device nn.DataParallel gathers outputs on", "gathers"),
}

# Why a row leaves out a mode another row takes (the error names it; docs/strategies.md lists it): what a design
# cannot do is itself a finding about it
_NO_COMPILE_DP = (
    "nn.DataParallel replicates the module inside every forward (threads, one replica per device), which "
    "torch.compile cannot trace: the compiled wrapper would run the replicas eagerly"
)
_NO_COMPILE_SCRATCH = (
    "the step runs each replica of the wrapper's list by hand, one after another: compiling the wrapper compiles "
    "nothing that runs"
)
_NO_COMPILE_FSDP = (
    "PyTorch's FSDP2 memory tracker (FSDPMemTracker, the per-device memory figure on CPU) fails inside a compiled "
    "FSDP module's hooks (torch 2.14): a compiled fsdp trial would lose its memory figure, half of what is compared"
)
_NO_GRAPHS_THREADS = (
    "its step starts threads and replicates the module on the host in every forward: nothing a CUDA graph can replay"
)
_NO_GRAPHS_SCRATCH = "its step runs each replica by hand and copies gradients between devices from the host"
_NO_GRAPHS_ZERO = (
    "ZeroRedundancyOptimizer's step decides on the host which rank broadcasts each parameter, outside the captured "
    "autograd graph; its capture is not checked"
)
_NO_GRAPHS_FSDP = (
    "FSDP2's hooks all-gather and free parameters from the host, with stream and event logic of their own, around "
    "every unit"
)
_NO_AUTOCAST = (
    "autocast is the one-device reference's mode, ddp_amp's counterpart; every other row runs fp32 (ddp_amp: always "
    "bf16/fp16)"
)

# The training state a strategy may shard across its ranks instead of replicating it (a row's `shards`, in this
# order): the scaling model adds the collectives sharding issues, the report shows the memory it saved
SHARDABLE = ("params", "grads", "optimizer")

# The communication patterns the scaling model knows (pipeline.scaling.model.step_collectives), one per row
COMM_PATTERNS = {
    "none": "no communication (one device)",
    "copy_allreduce": "one copy-based all-reduce per parameter tensor after backward (d2l's scratch)",
    "dp_gather_logits": "replicate parameters, scatter the batch, gather the logits, reduce gradients to device 0",
    "dp_gather_losses": "replicate parameters, scatter the batch, gather k losses, reduce gradients to device 0",
    "bucket_allreduce": "one all-reduce per gradient bucket, overlapped with backward",
    "shard_units": "per sharded unit: all-gather before forward and backward, reduce-scatter of gradients",
}


@dataclass(frozen=True)
class StrategySpec:
    """One strategy's row. The defaults describe `single`, the baseline every strategy is a difference from."""

    name: str
    description: str  # one line, for the docs and the CLI
    knobs: tuple[str, ...] = ()  # sweep knobs it accepts (a subset of KNOBS, in KNOBS' order)
    why_not: tuple[tuple[str, str], ...] = ()  # (knob, why this row leaves it out), where the reason is the design's
    multiprocess: bool = False  # one process per device, started by PyTorch's elastic launcher
    one_device_only: bool = False  # runs at train.devices=1 only
    cuda_only: bool = False  # unavailable on a CPU-only host
    parallel_on_cpu: bool = True  # False: on a CPU host the k "devices" run one after another in one process
    autocast: bool = False  # runs its forward under autocast with train.amp_dtype
    gathers: bool = False  # gathers the outputs (or the losses) on one device, train.output_device
    comm: str = "none"  # the collective pattern of one step (COMM_PATTERNS), as the scaling model counts it
    shards: tuple[str, ...] = ()  # the state split across ranks (a subset of SHARDABLE, in its order); () replicates
    # raised when a change to the strategy's own code changes what its trials measure (its step's speed or result):
    # part of a study's identity (sweep/space.py), so a store's trials from before are not filed beside the new ones
    revision: int = 1


STRATEGIES: tuple[StrategySpec, ...] = (
    StrategySpec("single", "the baseline: one device, one process", knobs=MODES, one_device_only=True),
    StrategySpec(
        "scratch",
        "d2l's data parallelism from scratch: replicas in one process, hand-written all-reduce",
        knobs=("cudnn_benchmark",),
        why_not=(
            ("compile", _NO_COMPILE_SCRATCH),
            ("compile_mode", _NO_COMPILE_SCRATCH),
            ("cuda_graphs", _NO_GRAPHS_SCRATCH),
            ("autocast", _NO_AUTOCAST),
        ),
        parallel_on_cpu=False,
        comm="copy_allreduce",
    ),
    StrategySpec(
        "dp",
        "torch.nn.DataParallel: one process, outputs gathered on one device",
        knobs=("cudnn_benchmark",),
        why_not=(
            ("compile", _NO_COMPILE_DP),
            ("compile_mode", _NO_COMPILE_DP),
            ("cuda_graphs", _NO_GRAPHS_THREADS),
            ("autocast", _NO_AUTOCAST),
        ),
        cuda_only=True,
        gathers=True,
        comm="dp_gather_logits",
    ),
    StrategySpec(
        "dp_criterion",
        "DataParallelModel + DataParallelCriterion: the loss computed on each device",
        knobs=("cudnn_benchmark",),
        why_not=(
            ("compile", _NO_COMPILE_DP),
            ("compile_mode", _NO_COMPILE_DP),
            ("cuda_graphs", _NO_GRAPHS_THREADS),
            ("autocast", _NO_AUTOCAST),
        ),
        cuda_only=True,
        gathers=True,
        comm="dp_gather_losses",
    ),
    StrategySpec(
        "ddp",
        "DistributedDataParallel: one process per device, bucketed all-reduce",
        knobs=(*COMM_KNOBS, "compile", "compile_mode", "cuda_graphs", "cudnn_benchmark"),
        why_not=(("autocast", _NO_AUTOCAST),),
        multiprocess=True,
        comm="bucket_allreduce",
        revision=2,  # 2: no buffer broadcast at k=1 (DDP's broadcast_buffers with one rank)
    ),
    StrategySpec(
        "ddp_amp",
        "DDP + torch.amp autocast (bf16, or fp16 with a GradScaler), the successor of Apex",
        knobs=(*COMM_KNOBS, "compile", "compile_mode", "cuda_graphs", "cudnn_benchmark"),
        why_not=(("autocast", _NO_AUTOCAST),),
        multiprocess=True,
        autocast=True,
        comm="bucket_allreduce",
        revision=2,  # 2: no buffer broadcast at k=1 (DDP's broadcast_buffers with one rank); fp16 steps fused
    ),
    StrategySpec(
        "zero1",
        "ZeRO-1: DDP with the optimizer state sharded across ranks (ZeroRedundancyOptimizer)",
        knobs=(*COMM_KNOBS, "compile", "compile_mode", "cudnn_benchmark"),
        why_not=(("cuda_graphs", _NO_GRAPHS_ZERO), ("autocast", _NO_AUTOCAST)),
        multiprocess=True,
        comm="bucket_allreduce",
        shards=("optimizer",),
        revision=2,  # 2: no buffer broadcast at k=1 (DDP's broadcast_buffers with one rank)
    ),
    StrategySpec(
        "fsdp",
        "FSDP2 fully_shard: parameters, gradients and optimizer state sharded across ranks",
        knobs=("cudnn_benchmark",),
        why_not=(
            ("compile", _NO_COMPILE_FSDP),
            ("compile_mode", _NO_COMPILE_FSDP),
            ("cuda_graphs", _NO_GRAPHS_FSDP),
            ("autocast", _NO_AUTOCAST),
        ),
        multiprocess=True,
        comm="shard_units",
        shards=SHARDABLE,
        revision=2,  # 2: on CPU its convolutions take channels_last weights at use (models.channels_last_at_use)
    ),
)
SPECS: dict[str, StrategySpec] = {s.name: s for s in STRATEGIES}
NAMES: tuple[str, ...] = tuple(SPECS)
REFERENCE = NAMES[0]  # the single-device baseline the others are checked and compared against


class UnknownStrategy(KeyError):
    """A name that is not a row of the catalog."""

    def __str__(self) -> str:
        return f"unknown strategy {self.args[0]!r}; valid: {', '.join(NAMES)}"


def spec(name: str) -> StrategySpec:
    """The row of strategy `name`; UnknownStrategy (a KeyError) for any other name."""
    try:
        return SPECS[name]
    except KeyError:
        raise UnknownStrategy(name) from None


def knobs(name: str) -> tuple[str, ...]:
    """The sweep knobs `name` accepts (none for an unknown name: a sweep table may hold a retired strategy)."""
    row = SPECS.get(name)
    return row.knobs if row else ()


def why_not(name: str, knob: str) -> str:
    """Why strategy `name` leaves out `knob`, where its row says; "" otherwise."""
    row = SPECS.get(name)
    return dict(row.why_not).get(knob, "") if row else ""


def applies(setting: str, name: str, point: dict) -> bool:
    """Whether train.<setting> (a key of APPLIES_WITH) reaches a trial of strategy `name` at `point` (its knob values;
    a knob it leaves out is off): its knob is on there, or the row's flag of that name is."""
    need = APPLIES_WITH[setting][1]
    return bool(point.get(need) or getattr(SPECS.get(name), need, False))


def designed_with(setting: str) -> list[str]:
    """The rows whose design runs train.<setting> (a key of APPLIES_WITH) whatever their knobs: ddp_amp's autocast
    for amp_dtype; the rows a refusal of the setting names as the ones to select."""
    need = APPLIES_WITH[setting][1]
    return [s.name for s in STRATEGIES if getattr(s, need, False)]


def applies_with(setting: str, value) -> str:
    """What train.<setting>=value is and what it applies with, for a refusal: the one text a sweep and a trial give."""
    what, need = APPLIES_WITH[setting]
    rows = designed_with(setting)
    on = [s.name for s in STRATEGIES if need in s.knobs] if need in KNOBS else []
    where = " or ".join([*([f"train.{need}=true" + (f" ({', '.join(on)})" if rows else "")] if on else []), *rows])
    return f"train.{setting}={value} is {what} and applies with {where}"


def is_one_device_only(name: str) -> bool:
    """True for a known strategy that runs on one device only (an unknown name: False)."""
    row = SPECS.get(name)
    return bool(row and row.one_device_only)


def communicates(name: str) -> bool:
    """True for a known strategy whose step issues collectives (the scaling model has something to model)."""
    row = SPECS.get(name)
    return bool(row and row.comm != "none")


# docs/strategies.md holds markdown_table() between these lines
DOC_BEGIN = "<!-- generated from pipeline/catalog.py: catalog.markdown_table() -->"
DOC_END = "<!-- end of the generated table -->"


def autocast_baselines() -> dict[str, str]:
    """Each autocast strategy and the strategy it is measured against: the first row without autocast that
    communicates the same way with the same process model (ddp_amp -> ddp)."""
    return {
        a.name: b.name
        for a in STRATEGIES
        if a.autocast
        for b in [
            next(
                (b for b in STRATEGIES if not b.autocast and b.comm == a.comm and b.multiprocess == a.multiprocess),
                None,
            )
        ]
        if b
    }


def sharding_baselines() -> dict[str, str]:
    """Each strategy that shards state and the strategy its memory is compared with: the first row that shards
    nothing, has no autocast and communicates, with the same process model (fsdp -> ddp)."""
    return {
        a.name: b.name
        for a in STRATEGIES
        if a.shards
        for b in [
            next(
                (
                    b
                    for b in STRATEGIES
                    if not b.shards and not b.autocast and b.comm != "none" and b.multiprocess == a.multiprocess
                ),
                None,
            )
        ]
        if b
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "-"


def markdown_table() -> str:
    """The catalog as a Markdown table (docs/strategies.md holds exactly this between DOC_BEGIN and DOC_END)."""
    lines = [
        "| strategy | what it is | sweep knobs | processes | devices | parallel on CPU | autocast | "
        "communication per step | sharded across ranks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in STRATEGIES:
        devices = "1 only" if s.one_device_only else "k, CUDA only" if s.cuda_only else "k"
        on_cpu = "n/a" if s.cuda_only else _yes(s.parallel_on_cpu)
        lines.append(
            f"| `{s.name}` | {s.description} | {', '.join(f'`{k}`' for k in s.knobs) or '-'} | "
            f"{'one per device' if s.multiprocess else 'one'} | {devices} | {on_cpu} | "
            f"{_yes(s.autocast)} | {COMM_PATTERNS[s.comm]} | {', '.join(s.shards) or '-'} |"
        )
    modes = ", ".join(f"`{m}`" for m in MODES)
    lines += ["", f"Execution modes ({modes}; all off by default) a row leaves out:", ""]
    lines += [f"- `{s.name}` without `{knob}`: {why}." for s in STRATEGIES for knob, why in s.why_not]
    return "\n".join(lines) + "\n"
