"""Parallax command line: a subcommand per DVC stage (download, sweep, overlap, collectives, analyze) and the tools
around them (train, compare, fit, doctor, models, profiles, ui). `COMMAND --help` gives each one's examples.

    python -m pipeline download                       # DVC stage `download`
    python -m pipeline train --strategy ddp --devices 2 --epochs 1 --out runs/ddp2
    python -m pipeline sweep --strategy ddp           # DVC stage `sweep@ddp`
    python -m pipeline overlap                        # DVC stage `overlap`
    python -m pipeline collectives                    # DVC stage `collectives`
    python -m pipeline analyze                        # DVC stage `analyze`
    python -m pipeline compare                        # experiments side by side, one row per metric or param
    python -m pipeline fit --model resnet18 --batch-size 256   # will it fit? memory per device, before running
    python -m pipeline doctor                         # does every strategy run and agree here? (no MLflow needed)
    python -m pipeline models                         # every model it can build
    python -m pipeline profiles                       # the experiment profiles under experiments/
    python -m pipeline ui                             # MLflow UI on http://127.0.0.1:5000

Every command reads params.yaml (and the profile it names under experiments/) and takes `--set key=value`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pipeline.cli import types
from pipeline.config import loader
from pipeline.config.schema import DEVICES_MAX
from pipeline.config.settle import DDP_SETTLE_STEPS

EPILOG = """configuration: params.yaml selects a profile (experiments/<profile>.yaml); params.yaml entries override
the profile; --set overrides both, e.g. --set data.source=synthetic --set train.lr=0.1.
docs: README.md, docs/errors.md (every error message and its fix)."""


class _Formatter(argparse.HelpFormatter):
    """A subcommand's help: prose paragraphs wrapped to the terminal, a paragraph with indented lines (its examples)
    kept as written."""

    def _fill_text(self, text, width, indent):
        fill = super()._fill_text  # prose: argparse's own wrapping
        return "\n\n".join(
            "\n".join(indent + line for line in para.splitlines())
            if any(line.startswith("  ") for line in para.splitlines())
            else fill(para, width, indent)
            for para in text.split("\n\n")
        )


def _epilog(*examples: str) -> str:
    """A subcommand's epilog: its examples (`command  # what it does`), then the configuration every command reads."""
    return "examples:\n" + "\n".join(f"  {line}" for line in examples) + "\n\n" + EPILOG


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--params", type=types.path, default=None, help="params file (default: params.yaml at the repository root)"
    )
    p.add_argument(
        "-S",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a configuration value, e.g. --set train.lr=0.1; repeatable, later wins "
        "(default: none; layers: built-in < profile < params.yaml < --set). Hydra's prefixes, as `dvc exp run "
        "-S` takes them: +KEY=VALUE adds a key params.yaml leaves unset, ++KEY=VALUE adds or changes one, ~KEY "
        "removes params.yaml's value (the profile's applies); sweep values go in sweep.spaces, e.g. "
        "-S 'sweep.spaces.default.lr=[0.1,0.3]'",
    )


def _cfg(key: str, text: str) -> str:
    """Help of a flag that overrides configuration key `key`: where its value comes from when the flag is unset."""
    section, name = key.split(".")
    built_in = getattr(getattr(loader.Config(), section), name)
    return f"{text} (default: {key} from --set, params.yaml or the profile; built in: {built_in})"


class _Answering(argparse.Action):
    """argparse's `store` for a flag of fit's answer, which also notes the flag as given (in `answering`), its value
    the default or not: `fit --count-ahead` answers nothing, so it refuses each (commands.cmd_fit)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.answering = (*namespace.answering, option_string)


def _train_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        type=types.model,
        metavar="NAME",
        help=_cfg(
            "train.model",
            "model: d2l's lenet or resnet18, a torchvision classifier, an entry point's (see "
            "`python -m pipeline models`)",
        ),
    )
    p.add_argument("--strategy", choices=loader.STRATEGY_NAMES, help=_cfg("train.strategy", "strategy"))
    p.add_argument(
        "--devices", type=int, metavar="K", help=_cfg("train.devices", "devices (GPUs, or CPU cores) for this trial")
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help=_cfg("train.batch_size", "global batch size, split over the devices"),
    )
    p.add_argument("--lr", type=float, help=_cfg("train.lr", "learning rate (SGD)"))
    p.add_argument("--epochs", type=int, help=_cfg("train.epochs", "epochs"))
    p.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help=_cfg("train.max_steps", "stop after N optimizer steps, for quick checks; 0 = no limit"),
    )
    p.add_argument("--seed", type=int, help=_cfg("train.seed", "seed of data order and initial weights"))
    p.add_argument(
        "--out",
        required=True,
        type=types.path,
        metavar="DIR",
        help="output directory for metrics.json and final_state.pt (required: no default)",
    )
    p.add_argument(
        "--no-track",
        action="store_true",
        help="do not log to MLflow (default: log a run to tracking.uri, mlruns/mlflow.db if empty)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (default: progress bar shown)")


# flags whose value may be written with a leading '-' and a digit: argparse takes such a token ("-5GiB") for an
# option unless it reads as a plain number, so `--device-memory -5GiB` would end in "expected one argument" instead
# of the flag's own range message
SIGNED_VALUE_FLAGS = ("--device-memory",)
_SIGNED = re.compile(r"^-[0-9.]")


def signed_values(argv: list[str]) -> list[str]:
    """`argv` with each SIGNED_VALUE_FLAGS flag followed by a '-<digit>...' token joined to it (`--device-memory
    -5GiB` -> `--device-memory=-5GiB`), so that its type function sees the value and refuses it in its own words;
    nothing after a bare `--` is touched."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if argv[i] in SIGNED_VALUE_FLAGS and i + 1 < len(argv) and _SIGNED.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


class _Parser(argparse.ArgumentParser):
    """The command line's parser: joins a signed value to its flag (signed_values) before argparse reads it."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        argv = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(signed_values(argv), namespace)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="python -m pipeline",
        description=__doc__.split("\n\nEvery command")[0],  # the examples; EPILOG says the rest
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "download",
        help="fetch Fashion-MNIST (or write the synthetic stand-in) into data.dir",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline download                               # Fashion-MNIST into data.dir",
            "python -m pipeline download --set data.source=synthetic  # the offline stand-in, labelled synthetic",
        ),
        description="Fetch Fashion-MNIST through torchvision (its mirrors and MD5 checks) into "
        "data.dir, or, with data.source=synthetic, write the deterministic offline "
        "stand-in in the same IDX format. data.mirror points at a URL or local "
        "directory holding the four .gz files, for air-gapped clusters.",
    )
    _common(p)

    p = sub.add_parser(
        "train",
        help="run one training trial and log it to MLflow",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline train --strategy ddp --devices 2 --epochs 1 --out runs/ddp2",
            "python -m pipeline train --max-steps 20 --set data.source=synthetic --no-track --out runs/quick",
        ),
        description="Run one trial: one model, one strategy on K devices; writes OUT/metrics.json "
        "and OUT/final_state.pt and logs an MLflow run. Each flag left unset takes "
        "its train.* value from --set, params.yaml or the profile, in that order.",
    )
    _common(p)
    _train_flags(p)
    p.add_argument(
        "--answer-img-s",
        type=types.positive("images/s of the answer"),
        metavar="N",
        help="the images/s of the report's answer this run reproduces (its printed command sets it): the last line "
        "says how this run's figure compares with it (default: none, no comparison)",
    )
    p.add_argument(
        "--answer-load-cores",
        type=types.busy_cores,
        metavar="C",
        help="the cores other processes kept busy while the answer's figure was measured; nan: under load, the "
        "cores not measured; only with --answer-img-s (default: none, measured quietly)",
    )

    p = sub.add_parser(
        "sweep",
        help="run the Optuna study of one strategy (DVC stage sweep@STRATEGY)",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline sweep --strategy ddp                # the study of stage sweep@ddp",
            "python -m pipeline sweep --strategy ddp --n-trials 2   # at most two more of its trials, here",
            "dvc exp run -S train.epochs=3                          # the DVC way: a new experiment, every stage",
        ),
        description="One Optuna study over devices x batch size x learning rate for one strategy; "
        "every trial is a nested MLflow run; writes results/sweeps/STRATEGY.jsonl. "
        "Rerunning resumes: finished trials are not repeated. The search space is "
        "sweep.spaces.STRATEGY of the profile (experiments/PROFILE.yaml), or its "
        "sweep.spaces.default for a strategy without one.",
    )
    _common(p)
    p.add_argument(
        "--strategy",
        required=True,
        choices=loader.STRATEGY_NAMES,
        help="the strategy whose study runs (required: no default)",
    )
    p.add_argument(
        "--out", type=types.path, default=None, help="sweep table path (default: results/sweeps/STRATEGY.jsonl)"
    )
    p.add_argument(
        "--n-trials",
        type=types.n_trials,
        default=None,
        metavar="N",
        help="run at most N new trials in this worker; 0 sets up the study and runs none (default: every "
        "trial the study still lacks; its size is sweep.n_trials, or the whole grid when that is 0)",
    )

    p = sub.add_parser(
        "analyze",
        help="scaling efficiency, memory imbalance, accuracy: tables, plots, report",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline analyze     # results/sweeps/*.jsonl -> results/analysis/ (report.md, metrics.json)",
            "python -m pipeline analyze --sweeps other/sweeps --out other/analysis",
        ),
        description="Read results/sweeps/*.jsonl and write results/analysis/ (metrics.json: the DVC "
        "metric, flat numbers; summary.json; CSVs; PNGs; report.md), logged as an "
        "MLflow 'analysis' run with its numbers as metrics and its figures. The target "
        "accuracy is analyze.target_acc (params.yaml or the profile).",
    )
    _common(p)
    p.add_argument(
        "--sweeps",
        type=types.path,
        default=Path("results/sweeps"),
        help="directory of the sweep tables, *.jsonl (default: results/sweeps)",
    )
    p.add_argument(
        "--out",
        type=types.path,
        default=Path("results/analysis"),
        help="output directory (default: results/analysis)",
    )

    p = sub.add_parser(
        "compare",
        help="experiments side by side: one row per column of `dvc exp show`, one column per experiment",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline compare                                 # the efficiencies and their labels",
            "python -m pipeline compare --keep 'efficiency|load_cores'  # the rows whose names match",
            "python -m pipeline compare --keep '^train[.]'              # the train settings of each experiment",
        ),
        description="Print `dvc exp show`'s table turned round: one row per column of it (metrics.json's figures, "
        "the params of params.yaml and of the profile, the stages' dependencies), by default the scaling "
        "efficiencies and what labels them; one column per experiment (the workspace, its baseline, each `dvc exp "
        "run`), in blocks that fit 120 columns; a value too long for two experiments side by side ends in … "
        "(`dvc exp show --json` prints it whole).",
    )
    p.add_argument(
        "--keep",
        metavar="REGEX",
        help="the rows to show: the names of `dvc exp show`'s columns that match this Python regex (re.search). "
        "Those names are metrics.json's keys (weak_efficiency.ddp.k2, n_flagged), params (train.lr; FILE:NAME where "
        "params.yaml and the profile both set one, e.g. params.yaml:train.epochs) and the stages' dependency paths "
        "(pipeline/models.py, showing the hash dvc.lock records), as `dvc exp show` prints them; e.g. "
        "'efficiency|load_cores', '^train\\.', or '.' or '' (re.search matches it everywhere too) for every "
        "one (default: the efficiencies "
        "weak_efficiency.S.kK and strong_efficiency.S.kK with their labels weak_efficiency_comparable.S.kK, "
        "load_cores.S.kK and data_source, the data the figures are of)",
    )

    p = sub.add_parser(
        "overlap",
        help="do devices compute at once, does communication hide behind compute?",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline overlap                      # results/overlap/ (overlap.md)",
            "python -m pipeline overlap --out runs/overlap",
        ),
        description="The seeds' automatic-parallelism experiments: a chain of matrix products on "
        "device A, B and both; then compute-and-communicate, sequential vs "
        "overlapped. Writes results/overlap/ and logs an MLflow 'overlap' run. Sizes "
        "and repetitions: overlap.* (params.yaml).",
    )
    _common(p)
    p.add_argument(
        "--out",
        type=types.path,
        default=Path("results/overlap"),
        help="output directory (default: results/overlap)",
    )

    p = sub.add_parser(
        "collectives",
        help="time this host's collectives at the trials' sizes (DVC stage)",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline collectives               # results/collectives.json",
            "python -m pipeline collectives --out runs/collectives.json",
        ),
        description="Time the collectives each strategy issues (all-reduce of DDP's buckets, FSDP's "
        "all-gather and reduce-scatter, scratch's hand-written all-reduce) at the sizes "
        "the trials use, for k = 2..N, and fit latency and bandwidth per collective. "
        "The analysis fits the scaling model on them (labelled modelled). A host with "
        "one device writes why there is nothing to time.",
    )
    _common(p)
    p.add_argument(
        "--out",
        type=types.path,
        default=Path("results/collectives.json"),
        help="output file (default: results/collectives.json)",
    )

    p = sub.add_parser(
        "ui",
        help="open the MLflow UI on 127.0.0.1 (local only)",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline ui                       # http://127.0.0.1:5000, with the runs table's shared view",
            "python -m pipeline ui --port 5001 --no-view",
        ),
        description="Start `mlflow ui` on 127.0.0.1 over the tracking store: tracking.uri from "
        "--set or params.yaml (default: mlruns/mlflow.db at the repository root, which a bare `mlflow ui` does not "
        "open: it opens ./mlflow.db; MLflow's own command for it is `mlflow ui --backend-store-uri "
        "sqlite:///mlruns/mlflow.db`). First "
        "it writes the experiment's shared view (MLflow's own 'share view' tag) and "
        "prints its link: the runs table with throughput, efficiency and accuracy "
        "columns, in any browser, on its first load.",
    )
    _common(p)
    p.add_argument("--port", type=types.port, default=5000, help="port on 127.0.0.1, 1-65535 (default: 5000)")
    p.add_argument(
        "--no-view",
        action="store_true",
        help="do not (re)write the experiment's shared runs-table view, the mlflow.sharedViewState.parallax "
        "experiment tag behind the printed link (default: written, then the link printed)",
    )

    p = sub.add_parser(
        "fit",
        help="will it fit? the modelled peak memory per device of every strategy and k, before running",
        formatter_class=_Formatter,
        description="Per strategy and k: what one GPU needs at --batch-size, whether it fits --device-memory, and "
        "the largest global batch that does. The need is the step's peak above resident plus the resident "
        "parameters, buffers, data set and DDP's buckets (modelled: pipeline/scaling/memory.py, docs/metrics.md; "
        "the activations counted on the meta device: no GPU, no training, no data), rounded up to what the "
        "caching allocator reserves (assumed), plus the device's fixed cost: the CUDA context and the libraries' "
        "workspaces, measured by `doctor` on the device where kept (runs/device_basis.json), else assumed. With "
        "one strategy and k, each term is printed with its figure and its source.",
        epilog=_epilog(
            "python -m pipeline fit --model resnet18 --batch-size 256 --strategies ddp --devices 2   # each term",
            "python -m pipeline fit --model resnet50 --batch-size 512 --device-memory 40GiB",
            "python -m pipeline fit --count-ahead resnet50 vit_b_16   # count ahead, answer nothing",
        ),
    )
    p.add_argument(
        "--model",
        action=_Answering,
        type=types.model,
        default="resnet18",
        metavar="NAME",
        help="the model: d2l's lenet or resnet18, a torchvision classifier (resnet50, vit_b_16), an entry point's; "
        "`python -m pipeline models` lists them (default resnet18)",
    )
    p.add_argument(
        "--batch-size",
        action=_Answering,
        type=types.batch_size,
        default=512,
        metavar="B",
        help="global batch, 1 up to the training set's size (default 512)",
    )
    p.add_argument(
        "--device-memory",
        action=_Answering,
        type=types.device_memory,
        default=None,
        metavar="SIZE",
        help="memory of one device: 80GiB or 80G (x 2^30), 80GB (x 10^9), 512MiB (default: this host's CUDA "
        "device's total, torch.cuda.mem_get_info; without one, 79.6 GiB: an 80 GB part as NVIDIA counts it); from 1MiB "
        "to 16TiB",
    )
    p.add_argument(
        "--device-name",
        action=_Answering,
        default=None,
        metavar="NAME",
        help="the GPU whose fixed cost doctor kept in runs/device_basis.json, e.g. 'NVIDIA H100 80GB HBM3' "
        "(default: this host's CUDA device; without one or without a kept figure, the assumed default)",
    )
    p.add_argument(
        "--optimizer",
        action=_Answering,
        choices=("sgd", "sgd_momentum", "adamw"),
        default="adamw",
        help="train.optimizer: its state per parameter is part of the peak (default adamw)",
    )
    p.add_argument(
        "--devices",
        action=_Answering,
        type=types.device_counts,
        default=(1, 2, 4, 8),
        metavar="K,K",
        help=f"the k to show, each from 1 to {DEVICES_MAX} (default 1,2,4,8)",
    )
    p.add_argument(
        "--strategies",
        action=_Answering,
        type=types.strategy_names,
        default=list(loader.STRATEGY_NAMES),
        metavar="A,B",
        help="comma-separated strategies (default: all)",
    )
    p.set_defaults(answering=())  # the flags above given on the command line (_Answering)
    p.add_argument(
        "--count-ahead",
        nargs="*",
        type=types.model,
        default=None,
        metavar="MODEL",
        help="only count models' activations on this host, once (seconds for d2l's, a minute or more for a large "
        "torchvision model; kept in runs/memory_model.json), so that a later fit answers without loading torch: the "
        "models named (any that --model takes: `python -m pipeline models`), or with none d2l's lenet and resnet18, "
        "as `make setup` runs it; it answers nothing, so it takes no flag of the answer (--model, --batch-size, "
        "--device-memory, --device-name, --optimizer, --devices, --strategies): name the model to count after it "
        "(default: answer, counting the model first only where no counts are kept)",
    )

    sub.add_parser(
        "profiles",
        help="list the experiment profiles under experiments/",
        description="Print each profile of experiments/ with its description (question, space, cost). "
        "Choose one with `dvc exp run -S profile=NAME` or `profile:` in params.yaml.",
        formatter_class=_Formatter,
        epilog=_epilog(
            "python -m pipeline profiles",
            "dvc exp run -S profile=cpu   # an experiment of that profile",
        ),
    )

    p = sub.add_parser(
        "models",
        help="list every model Parallax can build: source, parameters, FSDP units",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every model train.model, sweep.spaces.*.model and --model take, one line each: its name, where "
        "it comes from, its parameter count and its FSDP units (counted on the meta device: no memory, no "
        "initialisation; kept in runs/memory_model.json, so a second listing counts nothing again, though naming "
        "torchvision's models still imports torchvision: seconds).\n\n"
        "Sources, looked up in this order:\n"
        "  d2l          lenet, resnet18: d2l's models for 1x28x28 images\n"
        "  entry point  a factory an installed package registers under the group `parallax.models`:\n"
        '                 [project.entry-points."parallax.models"]  (in the package\'s pyproject.toml)\n'
        '                 mynet = "mypkg.models:build_mynet"     # build_mynet(num_classes=10) -> nn.Module\n'
        "               then `pip install -e .` and `model: mynet`; a module path in params.yaml is refused\n"
        "  torchvision  every classification model of torchvision.models, 10 classes, no pretrained weights,\n"
        "               the gray channel repeated to 3, resized to the model's declared minimum size above 28\n\n"
        "FSDP units (pipeline/models.py blocks): a stage's blocks (an nn.Sequential or nn.ModuleList of several),\n"
        "a child holding over half the parameters opened, else the child; the rest belongs to the root.",
        epilog="examples:\n  python -m pipeline models                      # all of them (the first time: a minute)\n"
        "  python -m pipeline models resnet50 vit_b_16    # these only\n"
        "  python -m pipeline fit --model resnet50 --batch-size 256",
    )
    p.add_argument("names", nargs="*", type=types.model, metavar="NAME", help="models to show (default: all)")

    p = sub.add_parser(
        "doctor",
        help="check this host: every strategy runs, agrees with single-device SGD, costs",
        formatter_class=_Formatter,
        description="For every strategy and k = 1..min(devices, 2, --max-devices): one SGD step "
        "compared with `single` (the tests' equivalence check), one short timed run "
        "and the per-device peak memory; each row passed, failed (with the error) or "
        "unavailable (with the reason). Also what the host offers: devices, "
        "torch/CUDA/NCCL/Gloo versions, whether bf16 and fp16 are native here. Needs "
        "no MLflow, Optuna or DVC. Exit status 1 if any row failed.",
        epilog="Data: data.dir if it holds prepared data, else the synthetic stand-in, made in a "
        "temporary directory and labelled (a --set of data.dir or data.source whose data is not prepared is "
        "refused).\n\n"
        + _epilog(
            "python -m pipeline doctor                                   # every strategy, up to 2 devices",
            "python -m pipeline doctor --max-devices 1 --strategies single,ddp",
            "python -m pipeline doctor --set train.compile=true --strategies ddp   # a mode, checked",
        ),
    )
    _common(p)
    p.add_argument(
        "--out",
        type=types.path,
        default=Path("results/doctor"),
        help="where doctor.json and doctor.md go (default: results/doctor)",
    )
    p.add_argument(
        "--max-devices",
        type=int,
        default=2,
        metavar="K",
        help="largest k to check (default 2; capped at the host's device count, except that a "
        "one-device host also runs k=2 oversubscribed)",
    )
    p.add_argument(
        "--strategies",
        default=",".join(loader.STRATEGY_NAMES),
        metavar="A,B",
        help=f"comma-separated strategies (default: all {len(loader.STRATEGY_NAMES)}, "
        f"{', '.join(loader.STRATEGY_NAMES)})",
    )
    p.add_argument(
        "--model",
        type=types.model,
        metavar="NAME",
        default="lenet",
        help="model of the timed run (default lenet; the equivalence step always uses lenet)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=30,
        help=f"timed steps after {DDP_SETTLE_STEPS} warm-up steps, past DDP's synchronised ones (default 30)",
    )
    p.add_argument(
        "--batch-per-device", type=int, default=128, metavar="B", help="per-device batch of the timed run (default 128)"
    )
    p.add_argument(
        "--dump-events",
        type=types.path,
        default=None,
        metavar="DIR",
        help="write the profiled strategies' first sampled step's profiler events to DIR (replay "
        "fixtures for tests/fixtures/, read back by tests/measure; default: not written). To look at a step, "
        "open the Chrome trace each trial writes, trace/rank<R>.pt.trace.json",
    )
    return ap
