"""The configuration's schema: frozen dataclasses, one per params.yaml section, with each field's default and the
metadata loader.py validates it by (`choice(...)`: one of these values; `bounds(...)`: a range, with the reason for
its upper bound; `text(...)`: a string's length; `path()`: a path the file system takes). Nothing here reads a file;
loader.py builds and validates these from params.yaml, the profile and --set.

A new field is one line in its dataclass (with `metadata=choice(...)`/`bounds(...)` where it has limits; a number
whose size costs memory or time gets an upper bound and its `why`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from pipeline import catalog, zoo

# d2l's two models, the CLI's shortlist; train.model and sweep.spaces.*.model take any name pipeline/zoo.py knows
# (torchvision's classifiers, a user's entry points), checked by `model_name()`
MODELS = zoo.D2L
STRATEGY_NAMES = catalog.NAMES
SOURCES = ("fashion-mnist", "synthetic")
COMM_HOOKS = ("none", "shm", "fp16", "bf16", "powersgd")
OPTIMIZERS = ("sgd", "sgd_momentum", "adamw")
# torch.compile's modes (train.compile_mode, with train.compile=true): reduce-overhead adds CUDA graphs to the
# compiled step (on GPUs; a CPU runs it as default); max-autotune-no-cudagraphs tries more kernels, no graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# a profile is a file name under experiments/, never a path: nothing outside experiments/ is read as one
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
# a tracking.listeners entry names a class, "package.module:Class", its name capitalised as a class's is: the form
# alone refuses a function (`builtins:print`, `code:interact`, `os:system`) before anything is imported
LISTENER_ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Z][A-Za-z0-9_]*")
LISTENER_FORM = (
    "a listener class 'package.module:Class' (a dotted module path, a colon, a class name beginning with a capital "
    "letter; a function such as builtins:print is no listener, and nothing is imported to find out)"
)
SEED_MAX = 2**32 - 1  # Optuna's samplers seed NumPy, which takes 32 bits; torch would take 64
# one size x size float32 matrix per item and arm is held in pinned host memory: 8192 is 256 MiB a matrix, already
# 10 GiB for the default 20 items; larger would exhaust a host's memory instead of measuring anything
OVERLAP_SIZE_MAX = 8192
OVERLAP_SIZE_WHY = (
    "each item holds a size x size float32 matrix in pinned host memory per arm: 8192 is 256 MiB "
    "a matrix; larger exhausts the host's memory"
)
TIMEOUT_MAX_S = 30 * 86400.0  # timers and PyTorch's collective timeout overflow near 1e9 s; 30 days is plenty
DEVICES_MAX = 1024
DEVICES_WHY = (
    "a trial starts one process per device; more than any host or SLURM allocation this runs on only starts "
    "processes until the host's memory is gone"
)
REPEATS_MAX = 100
REPEATS_WHY = (
    "each repeat is one more trial of every point, all enqueued when the study is set up: 100 already make a "
    "20-point grid 2,000 trials; more exhausts the set-up's memory and time"
)
# a study: at most this many trials, its space's points (the sum over its products of the product of its lists'
# lengths) times sweep.repeats
TRIALS_MAX = 100_000
TRIALS_WHY = (
    "every trial is enqueued when the study is set up, about 60 a second: 100,000 take half an hour, and more "
    "exhaust the set-up's memory and time long before their trials could run"
)
OVERLAP_ITEMS_WHY = "each item and each product of a chain holds a size x size matrix: more exhausts the host's memory"
OVERLAP_RUNS_WHY = "each is one more timed run of every arm of the benchmark: more runs for days"
COLLECTIVES_RUNS_WHY = "each is one more timed run of every collective at every size and mode: more runs for days"
COLLECTIVES_GAP_WHY = "each after_compute repeat computes this long first, for every collective and size"
COLLECTIVES_SIZES_WHY = "the largest fitted message is 4 KiB x 4^(n-1) per buffer: 10 is 1 GiB; more exhausts memory"


def model_name():
    """A model name pipeline/zoo.py can build (zoo.refusal says why not, with a "did you mean")."""
    return {"model": True}


def choice(*values):
    return {"choices": values}


def bounds(lo=None, hi=None, lo_open=False, why=""):
    """A number's range; `why` says, in the refusal, what the upper bound protects."""
    return {"lo": lo, "hi": hi, "lo_open": lo_open, "why": why}


def text(max_len: int, why: str, **meta):
    """A string of at most `max_len` characters; `why` says, in the refusal, what takes it."""
    return {"max_len": max_len, "why": why, **meta}


def path():
    """A file system path: each of its names and the whole short enough for the file system (paths.too_long)."""
    return {"path": True}


@dataclass(frozen=True)
class DataConfig:
    source: str = field(default="fashion-mnist", metadata=choice(*SOURCES))
    dir: str = field(default="data/fashion-mnist", metadata=path())
    mirror: str = ""  # URL or local directory holding the four .gz files (air-gapped clusters)
    train_limit: int = field(default=0, metadata=bounds(0))  # 0 = all 60,000
    test_limit: int = field(default=0, metadata=bounds(0))  # 0 = all 10,000


@dataclass(frozen=True)
class TrainConfig:
    model: str = field(default="lenet", metadata=model_name())
    strategy: str = field(default=catalog.REFERENCE, metadata=choice(*STRATEGY_NAMES))
    devices: int = field(default=1, metadata=bounds(1, DEVICES_MAX, why=DEVICES_WHY))
    batch_size: int = field(default=256, metadata=bounds(1))  # global batch, split over devices
    lr: float = field(default=0.2, metadata=bounds(0, lo_open=True))
    # sgd = d2l's plain SGD (no optimizer state; the seeds' recipe); sgd_momentum = SGD with momentum 0.9 (one
    # buffer per parameter); adamw = AdamW with PyTorch's defaults, betas (0.9, 0.999), weight_decay 0.01 (two
    # buffers per parameter, and an lr near 1e-3, not SGD's 0.1-0.3). Stateful optimizers give ZeRO-1 and FSDP
    # optimizer state to shard (strategies/base.py OPTIMIZERS)
    optimizer: str = field(default="sgd", metadata=choice(*OPTIMIZERS))
    epochs: int = field(default=1, metadata=bounds(1))
    max_steps: int = field(default=0, metadata=bounds(0))  # 0 = no limit
    seed: int = field(default=0, metadata=bounds(0, SEED_MAX))  # NumPy's (Optuna's samplers) limit: 32 bits
    # weight init: PyTorch's default (Kaiming-uniform), or d2l's N(0, 0.01) for conv/linear weights, which leaves
    # LeNet on a loss plateau for its first ~150-200 steps (use it to reproduce the seeds exactly)
    init: str = field(default="default", metadata=choice("default", "d2l"))
    warmup_steps: int = field(default=3, metadata=bounds(0))  # excluded from throughput
    target_acc: float = field(default=0.8, metadata=bounds(0, 1))
    oversubscribe: bool = False  # functional tests only: k > N allowed, run tagged and excluded from analysis
    output_device: int = field(default=0, metadata=bounds(0))  # dp: where outputs are gathered
    amp_dtype: str = field(default="auto", metadata=choice("auto", "bf16", "fp16"))
    amp_init_scale: float = field(default=65536.0, metadata=bounds(0, lo_open=True))  # fp16 GradScaler's first scale
    # default: PyTorch's TF32 switches (cuDNN convs in TF32 on Ampere+); ieee: IEEE fp32 convs and matmuls in every
    # process of the trial (capabilities.fp32_pinned; the equivalence check's pin); tf32: TF32 for both (the
    # equivalence check then runs in TF32: the first GPU run compares the two)
    fp32_precision: str = field(default="default", metadata=choice("default", "ieee", "tf32"))
    # collective timeout: a hung rank fails the trial
    timeout_s: float = field(default=120.0, metadata=bounds(1, TIMEOUT_MAX_S))
    check_every: int = field(default=25, metadata=bounds(1))  # steps between NaN/inf loss checks (on the device)
    pin_cores: bool = True  # CPU hosts: pin worker process r of a multi-process trial to core r
    channels_last: bool = True  # NHWC activations: faster convolutions on CPU (oneDNN) and GPU (tensor cores)
    # execution modes (catalog.MODES; a row lists the ones it takes): same arithmetic, different execution
    compile: bool = False  # torch.compile the (wrapped) model
    compile_mode: str = field(default="default", metadata=choice(*COMPILE_MODES))  # with compile=true
    # the whole step (forward, backward, all-reduce, optimizer) captured once as a CUDA graph and replayed: no host
    # launch per kernel (trial/graphs.py; single, ddp, ddp_amp in bf16, on GPUs)
    cuda_graphs: bool = False
    cudnn_benchmark: bool = False  # cuDNN's autotuner picks each convolution's algorithm (GPUs; CPU: no effect)
    autocast: bool = False  # `single` under torch.amp autocast with train.amp_dtype, as ddp_amp runs
    # step-time breakdown (breakdown.py): every N-th steady-state step is timed by phase, outside the throughput
    # window; 0 = off
    breakdown_every: int = field(default=10, metadata=bounds(0))
    # other processes' CPU use (cores, averaged over the trial) beyond which a trial is flagged as measured under
    # interference and leaves throughput and efficiency (interference.py)
    interference_threshold: float = field(default=0.25, metadata=bounds(0))
    # DDP communication knobs (ddp, ddp_amp)
    bucket_cap_mb: float = field(default=25.0, metadata=bounds(0, lo_open=True))
    # gradients as views of DDP's buckets: one copy of the gradients fewer per device, same arithmetic
    grad_as_bucket_view: bool = True
    # optimizer steps use no_sync for accum_steps-1 micro-batches
    accum_steps: int = field(default=1, metadata=bounds(1))
    # none = DDP as PyTorch ships it (its own all-reduce: Gloo on CPU, NCCL on GPUs); shm = shared memory between the
    # ranks of one CPU host (strategies/shm_allreduce.py); fp16/bf16/powersgd = PyTorch's compression hooks
    comm_hook: str = field(default="none", metadata=choice(*COMM_HOOKS))
    # multi-node (torchrun c10d rendezvous); nnodes=1 runs standalone on this host
    nnodes: int = field(default=1, metadata=bounds(1))
    node_rank: int = field(default=0, metadata=bounds(0))
    rdzv_endpoint: str = ""  # host:port of the rendezvous (c10d); empty = a free local port
    rdzv_id: str = field(default="parallax", metadata=text(100, "it names the launcher's folders and the rendezvous"))
    # the address this node advertises to the others (torch's LaunchConfig.local_addr); empty = torch's default, the
    # host name, refused for nodes on separate machines when it resolves to a loopback address only (launch.py)
    local_addr: str = ""
    # how a trial's processes start (trial/start.py); auto = forkserver on GPUs, fork on CPU; fork is refused on GPUs
    start_method: str = field(default="auto", metadata=choice("auto", "fork", "spawn", "forkserver"))


@dataclass(frozen=True)
class SpaceConfig:
    """One strategy's search space; every trial is a point of the product of these lists."""

    model: tuple[str, ...] = ("lenet",)
    devices: tuple[int, ...] = (1, 2)
    batch_size: tuple[int, ...] = (256,)
    lr: tuple[float, ...] = (0.2,)
    # empty = not swept: every point takes train.optimizer (a train value the user sets pins any list: loader.pin)
    optimizer: tuple[str, ...] = ()
    bucket_cap_mb: tuple[float, ...] = (25.0,)
    grad_as_bucket_view: tuple[bool, ...] = (True,)
    accum_steps: tuple[int, ...] = (1,)
    comm_hook: tuple[str, ...] = ("none",)
    compile: tuple[bool, ...] = (False,)
    compile_mode: tuple[str, ...] = ("default",)
    cuda_graphs: tuple[bool, ...] = (False,)
    cudnn_benchmark: tuple[bool, ...] = (False,)
    autocast: tuple[bool, ...] = (False,)


SPACE_KEYS = tuple(f.name for f in dataclasses.fields(SpaceConfig))  # a trial's point: one value of each


@dataclass(frozen=True)
class SweepConfig:
    strategies: tuple[str, ...] = STRATEGY_NAMES
    # Optuna RDB URL; empty = sqlite file mlruns/optuna.db at the store root ($DVC_ROOT when set, else the repository
    # root), against which a relative sqlite:///file.db resolves too (preflight.store_url)
    storage: str = ""
    sampler: str = field(default="grid", metadata=choice("grid", "tpe"))
    n_trials: int = field(default=0, metadata=bounds(0))  # 0 = the whole grid
    pruning: bool = False
    trial_timeout_s: float = field(default=900.0, metadata=bounds(1, TIMEOUT_MAX_S))
    # each point measured this many times, in alternating rounds (a k=1 reference next to its k>1 points in each)
    repeats: int = field(default=1, metadata=bounds(1, REPEATS_MAX, why=REPEATS_WHY))
    # a trial flagged as measured under interference is enqueued again, up to this many times (its row is kept);
    # not after 3 vain quiet waits in a row (measure/quiet.py): on a host that stays busy the copy meets the same load
    remeasure_interfered: int = field(default=0, metadata=bounds(0))
    # before each trial, wait up to this long for other processes to use at most train.interference_threshold
    # cores (measure/quiet.py; after 3 vain waits in a row, one probe per trial); 0 = never wait
    quiet_wait_s: float = field(default=10.0, metadata=bounds(0, TIMEOUT_MAX_S))
    # a trial whose autocast type this host only emulates (bf16 on a CPU without AVX-512-BF16/AMX) runs at most this
    # many optimizer steps, labelled "bounded" (records/labels.py); 0 = no bound
    emulated_max_steps: int = field(default=0, metadata=bounds(0))
    # strategy -> a mapping (one product of lists) or a list of mappings (a union of products, for paired
    # settings such as d2l's "k=1 at B=256, k=2 at B=512"); strategies not listed use `default`
    spaces: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrackingConfig:
    uri: str = ""  # empty = sqlite:///<store root>/mlruns/mlflow.db; a relative sqlite:///file.db is at the store root
    experiment: str = field(  # empty = "parallax-<profile>"
        default="", metadata=text(256, "MLflow's database holds an experiment's name in 256 characters")
    )
    # MLflow's system metrics in every trial run (host CPU/RAM/disk/network, per GPU via pynvml; docs/metrics.md):
    # off by default, since the sampling thread runs in the process whose throughput is measured
    system_metrics: bool = False
    system_metrics_interval_s: float = field(default=2.0, metadata=bounds(0.1, TIMEOUT_MAX_S))
    # more stores for every trial, in the sweep and in `train`: "package.module:Class" import paths, each class built
    # with the trial's Config and told the trial's life (pipeline/trial/lifecycle.py; docs/usage.md). Each is a class
    # of an installed package or of this project, never of the standard library (lifecycle.listener_classes)
    listeners: tuple[str, ...] = field(default=(), metadata={"pattern": LISTENER_ENTRY, "form": LISTENER_FORM})


@dataclass(frozen=True)
class AnalyzeConfig:
    target_acc: float = field(default=0.8, metadata=bounds(0, 1))


@dataclass(frozen=True)
class OverlapConfig:
    size: int = field(default=512, metadata=bounds(16, OVERLAP_SIZE_MAX, why=OVERLAP_SIZE_WHY))  # square matrices
    chain: int = field(default=20, metadata=bounds(1, 1000, why=OVERLAP_ITEMS_WHY))  # products per chain
    items: int = field(default=20, metadata=bounds(1, 1000, why=OVERLAP_ITEMS_WHY))  # results computed, communicated
    reps: int = field(default=7, metadata=bounds(1, 1000, why=OVERLAP_RUNS_WHY))
    warmup: int = field(default=2, metadata=bounds(0, 1000, why=OVERLAP_RUNS_WHY))


@dataclass(frozen=True)
class CollectivesConfig:
    """The collectives stage (scaling/collectives.py): `reps` timed repeats of each collective, size and mode after
    `warmup` untimed ones; `gap_s` seconds of compute before each after_compute repeat; the alpha-beta fit over
    `fit_sizes` message sizes (4 KiB x 4^i), beside the sizes the trials issue."""

    reps: int = field(default=10, metadata=bounds(1, 1000, why=COLLECTIVES_RUNS_WHY))
    warmup: int = field(default=3, metadata=bounds(0, 1000, why=COLLECTIVES_RUNS_WHY))
    gap_s: float = field(default=0.01, metadata=bounds(0, 10, why=COLLECTIVES_GAP_WHY))
    fit_sizes: int = field(default=6, metadata=bounds(2, 10, why=COLLECTIVES_SIZES_WHY))


@dataclass(frozen=True)
class SlurmConfig:
    """The SLURM cluster a sweep submits its trials to (slurm.py); partition "" = off: trials run on this host."""

    partition: str = ""
    devices_per_node: int = field(default=1, metadata=bounds(1))  # a k-device trial gets ceil(k/this) nodes
    device: str = field(default="cuda", metadata=choice("cuda", "cpu"))  # GPUs (gres) or cores per node
    time_limit_min: int = field(  # each trial's job
        default=60, metadata=bounds(1, int(TIMEOUT_MAX_S // 60), why="30 days; SLURM's own limits are shorter")
    )
    account: str = ""
    rdzv_port: int = field(default=29400, metadata=bounds(1024, 65000))  # c10d on the first node; + job id % 500
    poll_s: float = field(default=2.0, metadata=bounds(0.1, 600))  # `scontrol show job` every this many seconds


@dataclass(frozen=True)
class Config:
    profile: str = field(  # "" = no profile
        default="cpu",
        metadata=text(
            100, "it names experiments/<profile>.yaml, its MLflow experiment and its studies", pattern=PROFILE_NAME
        ),
    )
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    sweep: SweepConfig = SweepConfig()
    tracking: TrackingConfig = TrackingConfig()
    analyze: AnalyzeConfig = AnalyzeConfig()
    overlap: OverlapConfig = OverlapConfig()
    collectives: CollectivesConfig = CollectivesConfig()
    slurm: SlurmConfig = SlurmConfig()

    def space(self, strategy: str) -> tuple[SpaceConfig, ...]:
        """The strategy's search space: a union of products (one SpaceConfig per product)."""
        spaces = self.sweep.spaces
        return spaces.get(strategy) or spaces.get("default") or (SpaceConfig(),)

    def to_dict(self) -> dict:
        return plain(dataclasses.asdict(self))


def plain(x):
    """Dataclass dicts to plain YAML-able values (tuples become lists)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


# What each search-space list holds (SpaceConfig's fields are tuples: every element is checked against this)
SPACE_META = {
    "model": model_name(),
    "devices": bounds(1, DEVICES_MAX, why=DEVICES_WHY),
    "batch_size": bounds(1),
    "lr": bounds(0, lo_open=True),
    "optimizer": choice(*OPTIMIZERS),
    "bucket_cap_mb": bounds(0, lo_open=True),
    "accum_steps": bounds(1),
    "comm_hook": choice(*COMM_HOOKS),
}
