"""report.md of the analysis stage: tables, findings in plain language generated from the numbers.

Built on tables/points.py's tables (and tables/knob_effects.py's knob table); writes one file, report.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pipeline.analysis.report import answer, causes, confidence, memory_fit, sharding
from pipeline.analysis.report.host import host_capabilities_section, nodes_line
from pipeline.analysis.report.markdown import md_table
from pipeline.analysis.tables import knob_effects
from pipeline.analysis.tables.points import (
    MEM_BASIS,
    MEM_LISTS,
    MIB,
    best_row,
    group_by,
    is_serial,
    is_unavailable,
    joined,
    shown_extras,
)
from pipeline.analysis.tables.summary import provenance
from pipeline.records import files
from pipeline.records.trial import PROVENANCE


def _mib(v):
    return v / MIB if v is not None and not (isinstance(v, float) and math.isnan(v)) else math.nan


# memory peaks are counted bytes, not timed: the note after each memory claim
MEM_SURE = "how sure: counted (bytes), not timed, so host load does not move it; the median over the point's trials"


def _basis_text(basis: str) -> str:
    """A memory row's mem_basis in words (one or several, comma-joined)."""
    return "; ".join(MEM_BASIS.get(b, b) for b in basis.split(", ")) if basis else "basis not recorded"


def _per_device_mib(lists) -> list[str]:
    return [" / ".join(f"{v / MIB:,.1f}" for v in p) if len(p) else "—" for p in lists]


MEM_NOISE = 0.01  # counted bytes, yet allocator rounding and probe timing move a peak by a few tenths of a percent


def _ties(t, col, floor) -> str:
    """The strategy with the largest `col`, or "tie: a, b" when others reach `floor` too (a tie is not a finding)."""
    names = list(dict.fromkeys(t.sort_values(col, ascending=False, kind="stable").loc[t[col] >= floor, "strategy"]))
    return names[0] if len(names) == 1 else "tie: " + ", ".join(names)


def _models_line(df) -> str:
    """Each model the figures are of, with where it comes from (d2l, torchvision, an entry point's package)."""
    if "model_source" not in df or "model" not in df:
        return ""
    named = {m: s for m, s in zip(df["model"], df["model_source"]) if isinstance(s, str) and s}
    return "Models: " + "; ".join(f"`{m}` from {s}" for m, s in sorted(named.items())) + "." if named else ""


def _reading(pts, eff, mem, status, df) -> list[str]:
    """Plain-language findings, generated from the tables (one block per model); under load, that first."""
    out = [line for line in (causes.load_line(df, pts), _models_line(df)) if line]
    rerun = answer.rerun_command(df)
    for model in sorted(pts["model"].unique()):
        p, e, m = (t[t["model"] == model] for t in (pts, eff, mem))
        tag = f" ({model})" if pts["model"].nunique() > 1 else ""
        fastest = confidence.fastest_claim(confidence.with_throughput_intervals(p, e), tag, rerun)
        out += [fastest] if fastest else []
        w_all = e[(e["kind"] == "weak") & e["efficiency"].notna() & (e["k"] >= 2)]
        # two ends measured under loads that are not comparable (tables/comparable.py): labelled, never ranked
        apart = confidence.incomparable(w_all, tag, rerun)
        out += [apart] if apart else []
        w_like = w_all[w_all["comparable"].astype(bool)] if len(w_all) else w_all
        # above 1: physically implausible beyond its interval (never presented as a finding), else within noise
        out += [s for s in (confidence.implausible(r, tag) for r in w_like.to_dict("records")) if s]
        w = confidence.plausible(w_like)
        if len(w):
            out.append(confidence.efficiency_claim(w, tag, rerun))
        elif len(w_like) or not apart:  # (every efficiency not comparable: the line above says so)
            why = causes.no_efficiency_cause(df[df["model"] == model], p, w_like)
            out.append(f"Weak-scaling efficiency{tag}: undefined ({why}).")
        # device-0 memory and imbalance only mean something with >= 2 devices reported separately
        m2 = m[(m["k"] >= 2) & (m["peak_mem_bytes"].map(len) >= 2)] if len(m) else m
        if len(m2):
            dev0 = m2.assign(dev0=[q[0] for q in m2["peak_mem_bytes"]])
            r0 = best_row(dev0, "dev0")
            who = _ties(dev0, "dev0", r0["dev0"] * (1 - MEM_NOISE))
            out.append(
                f"Most memory on device 0 with k≥2{tag}: **{who}**, {r0['dev0'] / MIB:,.1f} MiB "
                f"(k={r0['k']:g}, B={r0['batch_size']:g}; figure: {_basis_text(r0['mem_basis'])}); {MEM_SURE}."
            )
            imb = best_row(m2, "mem_imbalance")
            if imb["mem_imbalance"] <= 1 + MEM_NOISE:
                out.append(
                    f"Memory imbalance (max/mean) at k≥2{tag}: no imbalance beyond noise (every point within "
                    f"{MEM_NOISE:.0%} of even; figure: {_basis_text(imb['mem_basis'])}); {MEM_SURE}."
                )
            else:
                out.append(
                    f"Worst memory imbalance (max/mean){tag}: "
                    f"**{_ties(m2, 'mem_imbalance', imb['mem_imbalance'] - MEM_NOISE)}**, "
                    f"{imb['mem_imbalance']:.2f}× at k={imb['k']:g}, B={imb['batch_size']:g}; "
                    f"device-0 excess there {_mib(imb['dev0_excess_bytes']):,.1f} MiB (both from: "
                    f"{_basis_text(imb['mem_basis'])}); {MEM_SURE}."
                )
        if len(m):
            if m["mem_method"].nunique() > 1 or m["mem_basis"].nunique() > 1:
                out.append(
                    "Memory was measured with different methods ("
                    + ", ".join(sorted(set(m["mem_method"]) - {""}))
                    + "): compare across those with care."
                )
        r = best_row(p, "final_test_acc")
        if r is not None:
            who = _ties(p, "final_test_acc", r["final_test_acc"] - answer.ACC_TIE)
            within = f" within {answer.ACC_TIE}" if who.startswith("tie") else ""
            out.append(
                f"Best final test accuracy{tag}: **{who}**{within}, {r['final_test_acc']:.4f} (k={r['k']:g}, "
                f"B={r['batch_size']:g}, lr={r['best_lr']:g}); "
                f"how sure: best of {r['n_lrs']:g} lr(s) over {r['n_trials']:g} trial(s) of one seed, whose "
                "seed-to-seed spread is not measured."
            )
    serial = sorted({r["strategy"] for r in pts.to_dict("records") if r["k"] >= 2 and is_serial(r)})
    for s in serial:
        out.append(
            f"**{s}**: its k devices do not run in parallel on this host "
            '(parallel_devices=False), so its "scaling" is not real parallel scaling.'
        )
    down = [s for s, st in status.items() if st["status"] != "measured"]
    if down:
        out.append("Not measured here: " + ", ".join(f"{s} ({status[s]['status']})" for s in down) + ".")
    if pts.empty:
        states = ", ".join(f"{n} {st}" for st, n in df["state"].value_counts().items()) or "no trial rows"
        out.insert(0, f"No complete, non-oversubscribed trial ({states}): nothing to compare.")
    return out


def _transports(df) -> list[str]:
    """Which gradient transport each strategy and k used (comm_hook_used; the tables group by the setting)."""
    if "comm_hook_used" not in df:
        return []
    done = df[(df["state"] == "complete") & (df["comm_hook_used"].astype(str) != "")]
    used = done.groupby(["strategy", "devices"])["comm_hook_used"].agg(lambda v: "/".join(sorted(set(map(str, v)))))
    names = {"shm": "shared memory", "none": "DDP's own all-reduce (Gloo/NCCL)"}
    parts = [f"{s} k={int(k)}: {names.get(v, v)}" for (s, k), v in used.items()]
    setting = "/".join(sorted(set(done["comm_hook"]) - {""})) or "none"  # the grouping key reads `none` as empty
    return [f"Gradient transport (train.comm_hook={setting}): " + "; ".join(parts) + "."] if parts else []


def _host_section(df):
    cols = ["host", "device_kind", "device_name", "host_devices"]
    h = df[df[cols[0]] != ""].groupby(cols, dropna=False).size().reset_index(name="trials")
    src = joined(df["data_source"]) or "unknown"
    return [
        "## Host and devices\n\n",
        md_table(h, [*cols, "trials"], ["host", "kind", "device", "devices N", "trials"]),
        f"\nData source: **{src}**.\n",
        *nodes_line(df),
    ]


def _load_col(t):
    """under_load shown as the cores busy elsewhere ('yes' where unmeasured), NaN ('—') where not under load."""
    if t.empty:
        return t
    return t.assign(
        under_load=[
            (f"{c:.2f} cores" if not math.isnan(c) else "yes") if u else math.nan
            for u, c in zip(t["under_load"].astype(bool), t["load_cores"].astype(float))
        ]
    )


def _tables(df, pts, eff, mem, acc):
    x = shown_extras(df)
    pts = _load_col(pts)
    n = ["nodes"] if (pts["nodes"] > 1).any() else []  # where some point's k devices spanned nodes (SLURM)
    s = [
        "\n## Throughput per point\n\n",
        "Median over learning rates (and repeats) of complete trials; accuracy from the best lr"
        + ("; nodes: the nodes its k devices spanned" if n else "")
        + ".\n\n",
        "under_load: the cores other processes kept busy where every trial of the point was flagged as measured "
        "under interference and its figures come from those trials ('—': measured without interference).\n\n",
        md_table(
            pts,
            [
                "strategy",
                "model",
                *x,
                "k",
                *n,
                "batch_size",
                "per_device_batch",
                "throughput_img_s",
                "under_load",
                "n_trials",
                "n_lrs",
                "best_lr",
                "final_test_acc",
            ],
        ),
        "\n## Scaling efficiency\n\n",
        "E(k) = T(k)/(k·T(1)) with T(1) measured by the same strategy: weak at fixed per-device "
        "batch b, strong at fixed global batch B. '—' = no k=1 reference (undefined, not 0). efficiency_95: its 95% "
        "bootstrap interval over images/s readings (one per window of timed steps) and trials ('—': one measurement, "
        "unknown); n_measured: readings/trials at k, then at k=1; comparable: 'no' where its k point and its k=1 "
        'reference were measured under loads that are not comparable (docs/metrics.md, "Like against like"), so the '
        "ratio is the load difference as much as the scaling, never ranked ('—': comparable).\n",
    ]
    for kind in ("weak", "strong"):
        e = _load_col(confidence.interval_columns(eff[(eff["kind"] == kind) & (eff["k"] >= 2)]))
        e = e.assign(comparable=[math.nan if c else "no" for c in e["comparable"].astype(bool)]) if len(e) else e
        s += [
            f"\n### {kind.capitalize()} scaling\n\n",
            md_table(
                e,
                [
                    "strategy",
                    "model",
                    *x,
                    "k",
                    *n,
                    "per_device_batch",
                    "batch_size",
                    "throughput_img_s",
                    "base_throughput_img_s",
                    "speedup",
                    "efficiency",
                    "efficiency_95",
                    "n_measured",
                    "under_load",
                    "comparable",
                    "parallel_devices",
                ],
            ),
        ]
    mm = mem.assign(
        peak_mem_mib_dev=_per_device_mib(mem["peak_mem_bytes"]),
        **{f"{c}_mib": _per_device_mib(mem[c]) for c in MEM_LISTS},
        dev0_excess_mib=mem["dev0_excess_bytes"] / MIB,
    )
    gpu = [f"{c}_mib" for c in MEM_LISTS if mem[c].map(len).any()]  # GPU figures, shown where a row has them
    s += [
        "\n## Memory per device\n\n",
        "Per device in MiB, device 0 first. peak_mem_mib_dev holds the figure mem_basis names (peak_mem_mib: the "
        "largest device's); imbalance = max/mean and device-0 excess = peak[0] − mean(peak[1:]) (k ≥ 2) are "
        "computed from it. steady_step_above_resident "
        f"(GPUs): {MEM_BASIS['steady_step_above_resident']}, what the strategy itself costs, data and evaluation "
        "left out. "
        f"memtracker_step (CPU): {MEM_BASIS['memtracker_step']}."
        + (
            " resident: allocated before the first step (model, optimizer, the whole data set on every device, the "
            "libraries' workspaces); workspace: of the resident, what cuBLAS and cuDNN keep once used, the same for "
            "every strategy (a fixed cost per device and process, not the strategy's); "
            "reserved_peaks: the caching allocator's reserved peak; nvml_used: the device's used memory as NVML "
            "sees it (every process and CUDA context on it, so extra contexts on device 0 show here); '—': not "
            "measured."
            if gpu
            else ""
        )
        + "\n\n",
        md_table(
            mm,
            [
                "strategy",
                "model",
                *x,
                "k",
                "batch_size",
                "mem_method",
                "mem_basis",
                "peak_mem_mib_dev",
                *gpu,
                "peak_mem_mib",
                "mem_imbalance",
                "dev0_excess_mib",
            ],
        ),
        *sharding.section(mem, md_table),
        *memory_fit.section(mem, md_table),
        "\n## Accuracy\n\n",
        "Final test accuracy and time to the target accuracy ('—': not reached).\n\n",
        md_table(
            acc,
            [
                "strategy",
                "model",
                *x,
                *(["epochs"] if acc["epochs"].nunique() > 1 else []),
                "k",
                "batch_size",
                "lr",
                "final_test_acc",
                "time_to_acc_s",
                "target_acc",
            ],
        ),
    ]
    return s


def _problems(df, status):
    s = ["\n## Unavailable on this host\n\n"]
    un = df[(df["state"] == "skipped") & df["reason"].map(is_unavailable)]
    lines = [f"- **{st}**: {r} ({len(g)} point(s) skipped)" for (st, r), g in group_by(un, ("strategy", "reason"))]
    lines += [
        f"- **{n}**: {st['reason']}"
        for n, st in status.items()
        if st["status"] in ("missing", "empty") or st["status"].startswith("unreadable")
    ]
    s += ["\n".join(lines) + "\n" if lines else "_none_\n"]
    other = df[(df["state"] == "skipped") & ~df["reason"].map(is_unavailable)]
    s += [
        "\n## Other skipped points\n\n",
        md_table(other.groupby(["strategy", "reason"], sort=False).size().reset_index(name="points")),
    ]
    bad = df[~df["state"].isin(["complete", "skipped"])]
    s += [
        "\n## Failed and pruned trials\n\n",
        md_table(bad, ["strategy", "model", "k", "batch_size", "lr", "trial", "state", "reason"]),
    ]
    inter = df[df["interfered"] & (df["state"] == "complete")]
    s += [
        "\n## Measured under interference\n\n",
        "Other processes used this host's cores while these trials ran (beyond the threshold of "
        "`pipeline/measure/interference.py`); their speed is not the strategy's. A point that also has trials "
        "measured without interference leaves them out of its throughput and efficiency; a point whose trials "
        "were all flagged keeps them, labelled under load. Accuracy and memory keep them.\n\n"
        if len(inter)
        else "",
        md_table(
            inter,
            ["strategy", "model", "k", "batch_size", "lr", "throughput_img_s", "foreign_cores", "interference_reason"],
        ),
    ]
    ov = df[df["oversubscribed"]]
    s += [
        "\n## Excluded: oversubscribed runs (functional tests, not in scaling or memory)\n\n",
        md_table(ov, ["strategy", "model", "k", "batch_size", "lr", "state", "throughput_img_s"]),
    ]
    return s


def knob_section(table) -> list[str]:
    """The DDP communication knobs' section: one table and one figure per varied knob
    (pipeline.analysis.tables.knob_effects.knob_table)."""
    if table.empty:
        return [
            "\n## DDP communication knobs\n\nNo knob was varied in these sweeps (turn them on with the "
            "`cpu-comm` profile or `sweep.spaces.ddp.<knob>: [...]`).\n"
        ]
    out = [
        "\n## DDP communication knobs\n\nEach row is one measured point; accuracy beside throughput shows a "
        "faster but worse setting.\n"
    ]
    for knob in table["knob"].unique():
        t = table[table["knob"] == knob].sort_values(["strategy", "k", "batch_size", "value"])
        out += [
            f"\n### {knob}\n\n",
            md_table(t, knob_effects.COLUMNS),
            f"\n![{knob}](knob_{knob}.png)\n",
        ]
    return out


def overlap_section(overlap_md: Path) -> list[str]:
    """The overlap stage's own markdown (results/overlap/overlap.md), or how to make it."""
    if not overlap_md.exists():
        return [
            "\n## Automatic parallelism and communication overlap\n\nNot measured: run the `overlap` stage "
            "(`dvc repro -s overlap`).\n"
        ]
    return ["\n" + overlap_md.read_text()]


def _mixed(df) -> dict[str, list[str]]:
    """Per strategy, the PROVENANCE names whose rows hold more than one value."""
    out: dict[str, list[str]] = {}
    for s, g in group_by(df, ("strategy",)):
        names = [k for k in PROVENANCE if k in g and g[k].dropna().astype(str).nunique() > 1]
        if names:
            out[s[0] if isinstance(s, tuple) else s] = names
    return out


def mixed_warning(df) -> list[str]:
    """The warning on top of report.md where a strategy's figures pool rows of different code, data or torch."""
    mixed = _mixed(df)
    if not mixed:
        return []
    which = "; ".join(f"{s}: {', '.join(f'{k} {provenance(df, s)[k]}' for k in names)}" for s, names in mixed.items())
    return [
        "> **⚠️ WARNING: FIGURES FROM DIFFERENT CODE OR DATA MIXED.** A strategy's rows hold several values of what "
        f"they were measured with ({which}): its figures pool trials of different code, data or torch. Read them as "
        "such, or sweep it again into a table of its own (`python -m pipeline sweep --strategy S --out NEW.jsonl`).\n\n"
    ]


def measured_with_section(df, status) -> list[str]:
    """Per strategy, the code, data and torch its rows were measured with (summary.json's and metrics.json's
    code_digest, data_digest, torch_version)."""
    t = pd.DataFrame([{"strategy": s, **provenance(df, s)} for s in status])
    t = t[t[list(PROVENANCE)].notna().any(axis=1)] if len(t) else t
    if t.empty:
        return ["\n## Measured with\n\nThe sweep tables record no code_digest, data_digest or torch_version.\n"]
    mixed = _mixed(df)
    t = t.assign(mixed=[", ".join(mixed.get(s, [])) or "no" for s in t["strategy"]])
    return [
        "\n## Measured with\n\nThe trial's code (`code_digest`), the prepared data's content (`data_digest`) and "
        "the torch release (`torch_version`) each strategy's rows were measured with; several values, "
        "comma-separated, mark figures that pool them.\n\n",
        md_table(t, ["strategy", *PROVENANCE, "mixed"]),
    ]


def write_report(path, df, notes, status, pts, eff, mem, acc, extra=(), first=None):
    """report.md: the answer first (answer.py's lines, `first`, or built here), then the host, reading and tables."""
    s = ["# Parallax analysis report\n\n"]
    synth = sorted(set(df.loc[df["data_source"] == "synthetic", "strategy"]))
    if synth:
        s.append(
            "> **⚠️ WARNING: SYNTHETIC DATA.** Trials of " + ", ".join(synth) + " ran on "
            "deterministic synthetic Fashion-MNIST-shaped data, not Fashion-MNIST: their "
            "accuracies say nothing about the real task.\n\n"
        )
    s += mixed_warning(df)
    s += ["\n".join((first or answer.build(df, status, pts, eff, mem)).lines) + "\n\n"]
    s += [f"{len(df)} trial rows, {int((df['state'] == 'complete').sum())} complete.\n\n"]
    s += _host_section(df) + host_capabilities_section(df)
    s += [
        "\n## Reading\n\n",
        "\n".join(f"- {line}" for line in _reading(pts, eff, mem, status, df) + _transports(df)) + "\n",
    ]
    st = pd.DataFrame([{"strategy": k, **v} for k, v in status.items()])
    s += [
        "\n## Strategies\n\n",
        md_table(
            st, ["strategy", "status", "n_complete", "n_failed", "n_pruned", "n_skipped", "n_oversubscribed", "reason"]
        ),
    ]
    s += measured_with_section(df, status)
    s += _tables(df, pts, eff, mem, acc)
    s += ["\n## Figures\n\n"] + [f"![{n}]({n}.png)\n\n" for n in ("efficiency", "throughput", "memory", "accuracy")]
    s += list(extra)
    s += _problems(df, status)
    if notes:
        s += ["\n## Notes\n\n", "\n".join(f"- {n}" for n in notes) + "\n"]
    files.write_text(path, "".join(s))
