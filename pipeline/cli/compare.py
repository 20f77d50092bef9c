"""`python -m pipeline compare`: experiments side by side, one row per figure and one column per experiment, from
DVC's own experiment table (`dvc.api.exp_show`, the rows `dvc exp show` prints).

Hand-written because DVC's table has the transpose: one column per figure, each as wide as its key
(`weak_efficiency.ddp_amp.k2`, 26 characters), so a 120-column terminal holds three before the rest turn into `…`,
and `dvc metrics show` is one row as wide as every key together. Here a figure is a row, so any number of
strategies and k fit; the columns (experiments) wrap into blocks that each fit the width.
"""

from __future__ import annotations

import re

from pipeline.config.loader import ConfigError

WIDTH = 120  # columns a block of experiments fits in
CELL_MIN = 12  # characters a value shows at least; a longer one (a sweep space, a list) may end in …
WHOLE = "dvc exp show --json"
META = ("Experiment", "rev", "typ", "Created", "parent", "State", "Executor")  # exp_show's columns that are no figure


def default_keep() -> str:
    """The figures shown by default: the weak- and strong-scaling efficiencies (metrics.json's keys for them; a
    profile that sweeps one global batch measures strong scaling only) and what labels them: the data the figures
    are of (metrics.json's data_source, not params.yaml's data.source, which `make pipeline-offline` puts back to
    fashion-mnist after its synthetic run: `synthetic` is no Fashion-MNIST figure), the cores other processes kept
    busy where a point was measured under load (`load_cores.S.kK`), and an efficiency whose two ends are not
    comparable (`weak_efficiency_comparable.S.kK` 0)."""
    from pipeline.analysis.tables.summary import STRONG_EFFICIENCY, WEAK_EFFICIENCY

    kinds = f"{re.escape(WEAK_EFFICIENCY)}|{re.escape(STRONG_EFFICIENCY)}"
    return rf"^(({kinds})(_comparable)?\.|load_cores\.|data_source$)"


def default_figures() -> str:
    """The figures among default_keep(), the others label them: an experiment shows by default when it has one."""
    from pipeline.analysis.tables.summary import STRONG_EFFICIENCY, WEAK_EFFICIENCY

    return rf"^({re.escape(WEAK_EFFICIENCY)}|{re.escape(STRONG_EFFICIENCY)})\."


def _label(row: dict) -> str:
    return str(row.get("Experiment") or row.get("rev") or "?")


def _text(v) -> str:
    if v is None or v == "" or v == "!":
        return "-"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _cell(v, cut: int) -> str:
    text = _text(v)
    return text if len(text) <= cut else text[: cut - 1] + "…"


def table(rows: list[dict], keep: str, width: int = WIDTH, needs: str | None = None) -> list[str]:
    """The lines: a block per group of experiments that fits `width`, each a header then one line per figure whose
    key matches `keep` (re.search), for each experiment with a value under such a key (one that `needs` matches too,
    where given: a label alone shows no experiment); a value too long for two experiments to share a block
    (CELL_MIN characters at least) ends in …, and a line says where it shows whole; experiments without any such
    figure are named once at the end."""
    pattern = re.compile(keep)
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in META and pattern.search(k)))
    needed = [k for k in keys if needs is None or re.search(needs, k)]
    shown = [r for r in rows if any(_text(r.get(k)) != "-" for k in needed)]
    if not keys or not shown:
        return []
    first = max(len("figure"), *map(len, keys)) + 2
    cut = max(CELL_MIN, (width - first) // 2 - 2)
    cols = [(r, max(len(_label(r)), *(len(_cell(r.get(k), cut)) for k in keys)) + 2) for r in shown]
    blocks, block, used = [], [], first
    for col in cols:
        if block and used + col[1] > width:
            blocks.append(block)
            block, used = [], first
        block.append(col)
        used += col[1]
    blocks.append(block)
    lines: list[str] = []
    for b in blocks:
        lines.append(("" if not lines else "\n") + "figure".ljust(first) + "".join(_label(r).rjust(w) for r, w in b))
        lines += [k.ljust(first) + "".join(_cell(r.get(k), cut).rjust(w) for r, w in b) for k in keys]
    if any(len(_text(r.get(k))) > cut for r in shown for k in keys):
        lines.append(f"(… ends a value cut to {cut} characters; `{WHOLE}` prints each whole)")
    if hidden := [_label(r) for r in rows if r not in shown]:
        lines.append(f"(no such figure in {', '.join(hidden)}: a baseline has none until its dvc.lock is committed)")
    return lines


def run(args) -> int:
    from pipeline import paths

    given = args.keep is not None  # "" is a regex too: re.search matches it everywhere, as "."
    keep = args.keep if given else default_keep()
    try:
        re.compile(keep)
    except re.error as e:
        raise ConfigError(f"--keep {keep!r} is not a regular expression ({e}). Give a Python regex.") from None
    root = paths.repo_root()
    import dvc.api
    from dvc.exceptions import DvcException

    try:
        rows = dvc.api.exp_show(repo=str(root))
    except DvcException as e:
        raise ConfigError(
            f"dvc exp show found no experiments in {root} ({e}). Run it in the Parallax checkout, after "
            "`make pipeline` or `make pipeline-offline`."
        ) from None
    lines = table(rows, keep, needs=None if given else default_figures())
    if not lines and not given:
        from pipeline.analysis.tables.summary import WEAK_EFFICIENCY

        raise ConfigError(
            f"No experiment has {WEAK_EFFICIENCY} figures: run `make pipeline` or `make pipeline-offline`."
        )
    if not lines:
        figures = list(dict.fromkeys(k for r in rows for k, v in r.items() if k not in META and _text(v) != "-"))
        if figures:  # results there, none of them asked for
            raise ConfigError(
                f"No figure matches --keep {keep!r}; the experiments in {root} hold {len(figures)}, e.g. "
                f"{', '.join(figures[:6])}. Give a Python regex of those keys (docs/usage.md)."
            )
        raise ConfigError(
            f"No experiment in {root} has a figure yet: run the pipeline first (`make pipeline` or "
            "`make pipeline-offline`)."
        )
    print("\n".join(lines))
    return 0
