"""The report's first screen: which strategy to use on this host and at which k, why, what it costs, how sure, and a
command to run it (with best.yaml's `train:` and `data:` sections); or, when the tables hold no answer, exactly why not.

Pure: the analysis tables (tables/points.py) and the strategies' status (tables/summary.py) in, sentences and a
mapping out. The pick is confidence.py's: the fastest point per strategy, a best named only when its 95 % interval
clears the runner-up's, a tie said as a tie; like against like (tables/comparable.py): on a busy host the ranking
takes the largest group of points measured under comparable loads and names the faster ones it leaves out, every
ratio and efficiency it quotes has comparable ends or says it has not, and where no two strategies were measured
under comparable loads there is no answer, with the reason and the command to rerun. stage.py writes best.yaml;
document.py puts the lines first.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from pipeline import catalog
from pipeline.analysis.report import confidence
from pipeline.analysis.report.why import part_words
from pipeline.analysis.tables import comparable, stats
from pipeline.analysis.tables.points import EXTRAS, MEM_BASIS, MIB, POINT, best_row, measured
from pipeline.analysis.tables.step_parts import breakdown_table

BEST_YAML = "results/analysis/best.yaml"
# the line that heads the answer's command in report.md: the answer shown on screen ends above it
# (cli/commands.answer_screen)
COMMAND_HEADING = "Run it (or take the sections of " + BEST_YAML + " into your params.yaml):"
RUN_DIR = "runs/best"
ACC_TIE = 0.005  # accuracies this close are one seed's noise, not a difference (seed-to-seed spread is unmeasured)
K1_NOTED = 0.05  # without intervals, a k=1 difference from the baseline is named only beyond 5 %
COMPUTE = ("forward", "backward_compute", "optimizer")
KEY = (*POINT, *EXTRAS)  # what makes a measured point one point (points.point_table groups on it)


@dataclass(frozen=True)
class Answer:
    lines: tuple[str, ...]  # markdown: the report's first screen
    train: dict = field(default_factory=dict)  # best.yaml's `train:` section; {} when there is no answer
    data: dict = field(default_factory=dict)  # best.yaml's `data:` section: the images the answer measured on
    command: str = ""  # the `python -m pipeline train` line; "" when there is no answer
    cause: str = ""  # why there is no answer; "" when there is one


def why_no_answer(df, status) -> str:
    """Why the tables hold no throughput to compare (the one place the first screen's cause comes from)."""
    if df.empty:
        return "no sweep table holds a trial (results/sweeps/*.jsonl): run the sweeps first (`dvc repro`)."
    m = measured(df)
    if len(m) and m["interfered"].all():
        return (
            f"every one of the {len(m)} complete trials was measured under interference (other processes used "
            "this host's cores beyond pipeline/measure/interference.py's threshold), so none has a throughput "
            "to compare. Rerun on a quieter host: raising sweep.remeasure_interfered helps only where the host has "
            "quiet moments (a sweep stops re-measuring once 3 waits in a row found it busy)."
        )
    down = "; ".join(
        f"{s}: {st['status']}" + (f" ({st['reason']})" if st["reason"] else "")
        for s, st in status.items()
        if st["status"] != "measured"
    )
    if m.empty:
        return "no complete, non-oversubscribed trial" + (f": {down}" if down else "") + "."
    return (
        "no complete trial recorded a throughput outside interference"
        + (f" (not measured: {down})" if down else "")
        + "."
    )


def rerun_command(df) -> str:
    """The command that measures every point again, on the data the sweeps measured on (comparable.rerun)."""
    synthetic = "data_source" in df and bool((df["data_source"] == "synthetic").any())
    return comparable.rerun("synthetic" if synthetic else "", interpreter())


def _same(t, r, cols):
    """The rows of `t` at r's values of `cols` (an empty cell matches an empty cell: a key's NaN is a value too)."""
    for c in cols:
        t = t[(t[c] == r[c]) | (t[c].isna() & pd.isna(r[c]))] if len(t) else t
    return t


def _at(t, r, cols=KEY):
    """The one row of table `t` at r's point: r's values in every column of `cols` that `t` holds (KEY: the whole
    point, its optimizer and knobs included); None where there is none. Several rows there mean a table that holds
    one point twice: an error in the code that built it, raised, never one of them picked."""
    m = _same(t, r, [c for c in cols if c in t])
    if len(m) > 1:
        raise ValueError(
            f"{len(m)} rows at one point ({', '.join(f'{c}={r[c]}' for c in cols if c in t)}): a table that "
            "holds one point twice"
        )
    return m.iloc[0] if len(m) else None


def _sides(*named) -> str:
    """The conditions of both sides of a comparison (comparable.condition), said once either side was measured under
    load ("" when all were quiet): "; <a> measured beside 1.10 busy cores, <b> measured quietly"."""
    said = [(name, comparable.condition(r)) for name, r in named]
    if all(how == "quietly" for _, how in said):
        return ""
    return "; " + ", ".join(f"{name} measured {how}" for name, how in said)


def _unlike(best, rerun: str) -> str:
    """Why a busy host gives no answer: no two strategies' points were measured under comparable loads. best: each
    strategy's fastest point, fastest first."""
    named = [(f"{r['strategy']} ({r['throughput_img_s']:,.0f} images/s at k={r['k']:g})", r) for r in best]
    return (
        'no two strategies were measured under comparable loads (the rule: docs/metrics.md, "Like against like"), '
        "so none is ranked against another: their fastest points are " + comparable.not_comparable(named, rerun) + "."
    )


def _left_out(everything, group, top, rerun: str) -> str:
    """The points faster than the answer's that the like-for-like ranking leaves out, each strategy's fastest, with
    why ("" where none is)."""
    inside = {id(r) for r in group}
    faster = [r for r in everything if id(r) not in inside and r["throughput_img_s"] > top["throughput_img_s"]]
    if not faster:
        return ""
    named = [
        (f"{r['strategy']} at k={r['k']:g} ({r['throughput_img_s']:,.0f} images/s)", r)
        for r in confidence.per_strategy(faster, "throughput_img_s")
    ]
    return "faster, but " + comparable.not_comparable([*named, (top["strategy"], top)], rerun)


def _k1_difference(top, p, df, rerun: str) -> str | None:
    """At k=1 and the same per-device batch: the strategy against the single-device baseline, when it differs; when
    the two were measured under loads that are not comparable, that instead of the ratio."""
    ref = catalog.REFERENCE
    if top["strategy"] == ref:
        return None
    one = {**top, "k": 1, "batch_size": top["per_device_batch"]}  # the same point on one device
    # the baseline's: the same point but for the knobs it does not take (its rows leave those empty)
    shared = [c for c in KEY if c not in catalog.KNOBS or c in catalog.knobs(ref)]
    a, b = _at(p, one), _at(p, {**one, "strategy": ref}, shared)
    if a is None or b is None:
        return None
    ratio = a["throughput_img_s"] / b["throughput_img_s"]
    apart = stats.overlap((a["throughput_lo"], a["throughput_hi"]), (b["throughput_lo"], b["throughput_hi"]))
    if apart is True or (apart is None and abs(ratio - 1) < K1_NOTED):
        return None
    if not comparable.comparable(a, b):
        return f"its speed at k=1 against {ref}'s is " + comparable.not_comparable(
            [
                (f"{top['strategy']} ({a['throughput_img_s']:,.0f} images/s)", a),
                (f"{ref} ({b['throughput_img_s']:,.0f})", b),
            ],
            rerun,
        )
    text = (
        f"at k=1 {top['strategy']} already runs {ratio:.2f}× {ref} ({a['throughput_img_s']:,.0f} against "
        f"{b['throughput_img_s']:,.0f} images/s at per-device batch b={top['per_device_batch']:g}"
        f"{_sides((top['strategy'], a), (ref, b))})"
    )
    if catalog.SPECS.get(top["strategy"]) and catalog.SPECS[top["strategy"]].autocast:
        bf16 = sorted(set(df.loc[df["strategy"] == top["strategy"], "host_bf16"].dropna()) - {""})
        text += ", from lower-precision compute under autocast" + (
            f" (bf16 {'/'.join(bf16)} on this host)" if bf16 else ""
        )
    return text + ", before any scaling"


def _scaling(top, eff, rerun: str) -> str | None:
    if top["k"] < 2:
        return None
    r = _at(eff[eff["kind"] == "weak"], top)  # the answer's own point: its optimizer and knobs too
    if r is not None and not pd.isna(r["efficiency"]):
        if not r.get("comparable", True):
            return (
                f"from k=1 to k={top['k']:g} its weak-scaling efficiency "
                f"({confidence.fmt(r['efficiency'], r['efficiency_lo'], r['efficiency_hi'])}) is "
                + confidence.ends_apart(r, rerun)
            )
        return (
            f"from k=1 to k={top['k']:g} it keeps a weak-scaling efficiency of "
            f"{confidence.fmt(r['efficiency'], r['efficiency_lo'], r['efficiency_hi'])}{_ends(r)}"
        )
    weak_gap = f"no k=1 run at its per-device batch b={top['per_device_batch']:g}, so its weak scaling is not measured"
    r = _at(eff[eff["kind"] == "strong"], top)
    if r is None or pd.isna(r["efficiency"]):
        return f"{weak_gap}, nor its strong scaling (no k=1 run at B={top['batch_size']:g} either)"
    if not r.get("comparable", True):
        return (
            f"from k=1 at the same global batch B={top['batch_size']:g} its strong-scaling efficiency "
            f"({confidence.fmt(r['efficiency'], r['efficiency_lo'], r['efficiency_hi'])}) is "
            + confidence.ends_apart(r, rerun)
            + f" ({weak_gap})"
        )
    return (
        f"from k=1 at the same global batch B={top['batch_size']:g} it keeps a strong-scaling efficiency of "
        f"{confidence.fmt(r['efficiency'], r['efficiency_lo'], r['efficiency_hi'])}{_ends(r)} ({weak_gap})"
    )


def _ends(r) -> str:
    """Both ends of an efficiency row (points._intervals: k_under_load, base_under_load), when either was loaded."""
    if not r.get("under_load"):
        return ""
    k = "under load" if r.get("k_under_load") else "quietly"
    base = "under load" if r.get("base_under_load") else "quietly"
    return f" (k={r['k']:g} measured {k}, its k=1 reference {base})"


def _step(top, bd) -> str:
    r = _at(bd, top)
    if r is None:
        return "no step was sampled for a breakdown at this point"
    parts = [
        (sum(r[f"{p}_share"] for p in COMPUTE), "compute"),
        (r["comm_exposed_share"], part_words("comm_exposed", top["strategy"])),
        (r["data_share"], "data"),
        (r["idle_share"], part_words("idle", top["strategy"])),
        (r["residual_share"], "unattributed"),
    ]
    shown = [f"{v:.0%} {w}" for v, w in parts if not pd.isna(v) and abs(v) >= 0.005]
    return f"its step ({r['step_s'] * 1e3:.1f} ms, sampled) is " + ", ".join(shown)


def _synthetic(top) -> bool:
    """Whether the point's trials trained on the synthetic stand-in (its own rows, not any row of the tables)."""
    return top.get("data_source") == "synthetic"


def _cost(top, p_all, mem) -> str:
    # the point's own memory: its optimizer (AdamW's state) and knobs too, not another setting's at the same k and B
    r = _at(mem, top)
    if r is not None and len(r["peak_mem_bytes"]):
        basis = "; ".join(MEM_BASIS.get(b, b) for b in r["mem_basis"].split(", ")) if r["mem_basis"] else ""
        memo = f"peak memory {' / '.join(f'{v / MIB:,.1f}' for v in r['peak_mem_bytes'])} MiB per device" + (
            f" ({basis})" if basis else ""
        )
    else:
        memo = "peak memory not measured"
    # accuracy against the same model's on the same data: another source's accuracy measures something else
    same = p_all[(p_all["model"] == top["model"]) & (p_all["data_source"] == top.get("data_source"))]
    best = best_row(same, "final_test_acc")
    acc = top["final_test_acc"]
    if pd.isna(acc) or best is None:
        accs = "test accuracy not measured"
    elif best["final_test_acc"] - acc <= ACC_TIE:
        accs = f"test accuracy {acc:.4f}, the best measured within {ACC_TIE}"
    else:
        accs = (
            f"test accuracy {acc:.4f} against the best {best['final_test_acc']:.4f} ({best['strategy']}, "
            f"k={best['k']:g}, B={best['batch_size']:g}): {acc - best['final_test_acc']:+.4f}"
        )
    caveat = "; synthetic data: the accuracy says nothing about Fashion-MNIST" if _synthetic(top) else ""
    return f"{memo}; {accs} (one seed: its spread is not measured){caveat}"


def _sure(top, verdict, tied, rest, p) -> str:
    def q(r):
        speed = confidence.fmt(r["throughput_img_s"], r["throughput_lo"], r["throughput_hi"], 0)
        return f"{r['strategy']} {speed}{_sides((top['strategy'], top), (r['strategy'], r))}"

    head = {
        "best": f"{top['strategy']}'s 95% interval is clear of the runner-up's" + (f" ({q(rest[0])})" if rest else ""),
        "only": "the only strategy with a measured throughput",
        "unknown": "not shown ahead beyond noise: an interval is unknown (a single measurement)",
        "indistinguishable": "tie: " + " and ".join(r["strategy"] for r in tied) + " within noise",
    }[verdict]
    fewer = _same(p[(p["strategy"] == top["strategy"]) & (p["k"] < top["k"])], top, ("model",))
    ties_k = [
        r["k"]
        for r in fewer.to_dict("records")
        if stats.overlap((r["throughput_lo"], r["throughput_hi"]), (top["throughput_lo"], top["throughput_hi"]))
    ]
    if ties_k:
        head += (
            f"; tie: k={min(ties_k):g} is within noise of k={top['k']:g}, so the extra devices buy nothing "
            "measurable here"
        )
    return head + "; " + confidence.how_sure(top, "throughput").removeprefix("how sure: ")


def _recorded(rows, col) -> int | None:
    """The whole number the point's trials recorded in `col`, the most frequent where they differ (the larger on a
    tie); None where none recorded one (a table from before the column)."""
    v = pd.to_numeric(rows[col], errors="coerce").dropna() if col in rows else pd.Series(dtype=float)
    return int(v.value_counts().sort_index(ascending=False).idxmax()) if len(v) else None


def _trials(top, df):
    """The measured trials of sweep table `df` at top's point (every KEY column the table holds)."""
    return _same(measured(df), top, [c for c in KEY if c in df])


def _data(top, df) -> dict:
    """best.yaml's data section: the source where it is synthetic and the limits the point's trials trained and
    tested on, always (null in params.yaml means the profile's, which need not be the sweep's)."""
    rows = _trials(top, df)
    limits = {c: n for c in ("train_limit", "test_limit") if (n := _recorded(rows, c)) is not None}
    return {**({"source": "synthetic"} if _synthetic(top) else {}), **limits}


def _train(top, df) -> dict:
    """best.yaml's train section: the point's model, strategy, k, batch, best lr, optimizer (its lr is that
    optimizer's), epochs, step limit and seed (as its trials recorded them) and knobs (as typed)."""
    rows = _trials(top, df)
    epochs = rows["epochs"].dropna()
    knobs = {k: yaml.safe_load(top[k]) for k in catalog.knobs(top["strategy"]) if top.get(k, "") != ""}
    train = {
        "model": top["model"],
        "strategy": top["strategy"],
        "devices": int(top["k"]),
        "batch_size": int(top["batch_size"]),
        "lr": float(top["best_lr"]),
    }
    if top.get("optimizer", ""):
        train["optimizer"] = top["optimizer"]
    if len(epochs):
        train["epochs"] = int(epochs.max())
    train.update({c: n for c in ("max_steps", "seed") if (n := _recorded(rows, c)) is not None})
    return {**train, **knobs}


def _text(v) -> str:
    """A value as the command line takes it back unchanged: floats in full (repr: the shortest exact form)."""
    return str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)


def interpreter() -> str:
    """How the command names Python: the checkout's .venv/bin/python when this runs from a venv named .venv (`make
    setup`'s; a new shell's `python` lacks torch), else `python`."""
    return ".venv/bin/python" if sys.prefix != sys.base_prefix and Path(sys.prefix).name == ".venv" else "python"


def command(train: dict, data_source: str = "", figure: tuple | None = None, data: dict | None = None) -> str:
    """The `python -m pipeline train` line of a train section: its flags, then `--set` for the knobs, for the
    data source the sweep measured on when it is not params.yaml's default (synthetic: the command then runs
    offline too) and for the rest of `data` (the data limits), then the answer's figure it reproduces, `figure` =
    (images/s, cores busy elsewhere: None when measured quietly, NaN when under load by an unmeasured amount): the
    run's last line compares its own with it."""
    flags = {
        "model": "--model",
        "strategy": "--strategy",
        "devices": "--devices",
        "batch_size": "--batch-size",
        "lr": "--lr",
        "epochs": "--epochs",
        "max_steps": "--max-steps",
        "seed": "--seed",
    }
    args = [f"{flags[k]} {_text(v)}" for k, v in train.items() if k in flags]
    args += [f"--set {shlex.quote(f'train.{k}={_text(v)}')}" for k, v in train.items() if k not in flags]
    if data_source == "synthetic":
        args.append("--set data.source=synthetic")
    args += [f"--set data.{k}={_text(v)}" for k, v in (data or {}).items() if k != "source"]
    if figure is not None:
        img_s, cores = figure  # cores (comparable.load): None when measured quietly, NaN under load not measured
        load = "" if cores is None else " --answer-load-cores " + ("nan" if pd.isna(cores) else f"{cores:.2f}")
        args.append(f"--answer-img-s {img_s:.0f}{load}")
    return f"{interpreter()} -m pipeline train " + " ".join(args) + f" --out {RUN_DIR}"


def build(df, status, pts, eff, mem) -> Answer:
    """The answer from the report's own tables: the fastest point per strategy ranked with its interval."""
    p = confidence.with_throughput_intervals(pts, eff)
    p = p[p["throughput_img_s"].notna()]
    if p.empty:
        cause = why_no_answer(df, status)
        return Answer(("## Answer", "", f"**No answer on this host:** {cause}"), cause=cause)
    bd = breakdown_table(df)
    rerun = rerun_command(df)
    lines: list[str] = ["## Answer", ""]
    first: dict = {}
    data: dict = {}
    figure = None
    causes: list[str] = []
    for model in sorted(p["model"].unique()):
        pm = p[p["model"] == model]
        tag = f" ({model})" if p["model"].nunique() > 1 else ""
        everything = pm.to_dict("records")
        group = comparable.largest_group(everything)  # like against like: every point when all are quiet
        rows = confidence.per_strategy(group, "throughput_img_s")
        if len(rows) < 2 <= pm["strategy"].nunique():
            cause = _unlike(confidence.per_strategy(everything, "throughput_img_s"), rerun)
            causes.append(cause + (f" ({model})" if tag else ""))
            lines += [f"**No like-for-like answer{tag}:** {cause}", ""]
            continue
        verdict, tied, rest = confidence.ranking(rows, "throughput")
        top = rows[0]
        speed = confidence.fmt(top["throughput_img_s"], top["throughput_lo"], top["throughput_hi"], 0)
        where = f"global batch B={top['batch_size']:g}, lr={top['best_lr']:g}"  # b: per device, said where used
        if top.get("optimizer", "sgd") not in ("", "sgd"):  # d2l's plain SGD, the default, goes unsaid
            where += f", {top['optimizer']}"
        if top.get("under_load"):  # every trial behind this figure was flagged (points.timed): say so at once
            where += f"; *measured {comparable.condition(top)}*"
        if verdict == "indistinguishable":
            lines.append(
                f"**Tie{tag}: {' and '.join(r['strategy'] for r in tied)} within noise** (their 95% "
                f"intervals overlap); the command runs **{top['strategy']}** at k={top['k']:g}, {where}, the "
                f"higher median: {speed} images/s."
            )
        else:
            among = (
                "the fastest measured on this host"
                if len(group) == len(everything)
                else f"the fastest of {len(rows)} strategies measured {comparable.load_range(group)}, like against "
                "like (docs/metrics.md)"
            )
            lines.append(f"**Use {top['strategy']} at k={top['k']:g}**{tag} ({where}): {speed} images/s, {among}.")
        why = [s for s in (_k1_difference(top, p, df, rerun), _scaling(top, eff, rerun)) if s] + [_step(top, bd)]
        train = _train(top, df)
        if not first:
            first, figure = train, (float(top["throughput_img_s"]), comparable.load(top))
            data = _data(top, df)
        left = _left_out(everything, group, top, rerun)
        lines += [
            "",
            f"- **Why:** {'; '.join(why)}.",
            f"- **Cost:** {_cost(top, pts, mem)}.",
            f"- **How sure:** {_sure(top, verdict, tied, rest, pd.DataFrame(group))}.",
            *([f"- **Not compared:** {left}."] if left else []),
            "",
        ]
    if not first:
        cause = " ".join(causes)
        return Answer(("## Answer", "", f"**No answer on this host:** {cause}"), cause=cause)
    cmd = command(first, data.get("source", ""), figure, data)
    lines += [
        COMMAND_HEADING,
        "",
        "```",
        cmd.replace(" --set", " \\\n    --set")
        .replace(" --answer-img-s", " \\\n    --answer-img-s")
        .replace(" --out", " \\\n    --out"),
        "```",
    ]
    return Answer(tuple(lines), train=first, data=data, command=cmd)


def best_yaml(ans: Answer) -> str:
    """best.yaml: the answer's params-style `train:` and `data:` sections with the command above it; a comment when
    none."""
    if not ans.train:
        return f"# No best configuration on this host: {ans.cause}\n{{}}\n"
    return (
        f'# The best measured configuration of this host (report.md, "Answer"). Take these sections into your '
        f"params.yaml, or run:\n# {ans.command}\n"
        + yaml.safe_dump({"train": ans.train, **({"data": ans.data} if ans.data else {})}, sort_keys=False)
    )
