"""One table of strategies (pipeline/catalog.py): the classes, config validation, the sweep's space, the analysis
order, the scaling model and the docs all follow it, and no module outside strategies/ branches on a strategy's name.
"""

from __future__ import annotations

import ast
import dataclasses

import pytest

from pipeline import catalog, strategies
from pipeline.analysis.tables import rows
from pipeline.config import loader, schema
from pipeline.records import table
from pipeline.scaling import model
from pipeline.sweep.space import points

from ..conftest import REPO
from . import import_graph as ig

ALLOWED = ("pipeline/catalog.py", "pipeline/strategies/")


def test_each_registered_class_matches_its_row():
    assert list(strategies.STRATEGIES) == list(catalog.NAMES)
    assert strategies.disagreements() == []
    for name, cls in strategies.STRATEGIES.items():
        assert cls.name == name
        row = catalog.spec(name)
        assert strategies.class_facts(cls) == {k: getattr(row, k) for k in strategies.class_facts(cls)}


def test_a_class_that_disagrees_with_its_row_is_reported(monkeypatch):
    name = next(n for n in catalog.NAMES if not catalog.spec(n).multiprocess)
    monkeypatch.setattr(strategies.STRATEGIES[name], "multiprocess", True)
    assert any(d.startswith(f"{name}.multiprocess") for d in strategies.disagreements())


def test_rows_are_consistent():
    assert len(set(catalog.NAMES)) == len(catalog.NAMES) and catalog.REFERENCE == catalog.NAMES[0]
    assert catalog.spec(catalog.REFERENCE).one_device_only
    for row in catalog.STRATEGIES:
        assert row.comm in catalog.COMM_PATTERNS, row
        assert row.knobs == tuple(k for k in catalog.KNOBS if k in row.knobs), row  # a subset, in KNOBS' order
        assert not (row.one_device_only and row.comm != "none"), row
        assert row.shards == tuple(x for x in catalog.SHARDABLE if x in row.shards), row  # a subset, in order
    with pytest.raises(KeyError, match="valid: "):
        catalog.spec("nope")


def test_config_reads_the_catalog():
    train = {f.name: f for f in dataclasses.fields(schema.TrainConfig)}
    assert train["strategy"].metadata["choices"] == catalog.NAMES
    assert loader.SweepConfig().strategies == catalog.NAMES
    space = {f.name for f in dataclasses.fields(schema.SpaceConfig)}
    assert set(catalog.KNOBS) <= space and set(catalog.KNOBS) <= set(train)  # each knob: a space list, a train value


@pytest.mark.parametrize("name", catalog.NAMES)
def test_a_strategys_space_may_vary_only_its_own_knobs(name):
    cfg = loader.load(REPO / "params.yaml", ["profile="], root=REPO)
    for knob, values in (("bucket_cap_mb", "[1, 25]"), ("comm_hook", "[none, fp16]")):
        sets = [f"sweep.spaces.{name}.devices=[1]", f"sweep.spaces.{name}.{knob}={values}"]
        if knob in catalog.knobs(name):
            pts = points(loader.override(cfg, sets), name)
            assert len({p[knob] for p in pts}) == 2
        else:
            with pytest.raises(loader.ConfigError, match=f"`{name}` has no `{knob}` knob"):
                loader.override(cfg, sets)
    # `default` may hold any knob: each strategy takes the dimensions its row lists
    pts = points(loader.override(cfg, ["sweep.spaces.default.bucket_cap_mb=[1, 25]"]), name)
    assert all(set(p) & set(catalog.KNOBS) == set(catalog.knobs(name)) for p in pts)


def test_analysis_and_sweep_tables_use_the_catalog():
    assert rows.EXPECTED == catalog.NAMES and rows.EXTRAS[-len(catalog.KNOBS) :] == catalog.KNOBS
    assert table.KNOBS == catalog.KNOBS
    assert set(catalog.KNOBS) <= set(table.COLUMNS)


@pytest.mark.parametrize("name", catalog.NAMES)
def test_the_scaling_model_has_every_strategys_pattern(name):
    layout = model.model_layout("lenet")
    calls = model.step_collectives(name, 2, layout)
    assert bool(calls) == catalog.communicates(name)
    with pytest.raises(ValueError, match="no communication model"):
        model.step_collectives("nope", 2, layout)


def test_docs_table_is_the_catalog():
    text = (REPO / "docs" / "strategies.md").read_text()
    begin, end = text.index(catalog.DOC_BEGIN) + len(catalog.DOC_BEGIN) + 1, text.index(catalog.DOC_END)
    assert text[begin:end] == catalog.markdown_table(), (
        "docs/strategies.md is out of date: run `python tools/sync_catalog.py`"
    )


# ----------------------------------------------------------------------------- no strategy-name branches


def name_branches(tree: ast.AST, names=catalog.NAMES) -> list[int]:
    """Lines comparing something with a strategy-name literal (==, !=, in, not in, a tuple/list/set of them)."""

    def literals(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(literals(x) & set(names) for x in (node.left, *node.comparators)):
                out.append(node.lineno)
        elif isinstance(node, ast.match_case) and literals(getattr(node.pattern, "value", None)) & set(names):
            out.append(node.pattern.lineno)
    return sorted(set(out))


def test_no_strategy_name_branch_outside_strategies_and_the_catalog():
    found = []
    for module, path in ig.module_files().items():
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"{rel}:{line}" for line in name_branches(ig.parse(path))]
    assert not found, (
        "strategy-name branches outside pipeline/strategies/ and pipeline/catalog.py (ask the "
        f"strategy's catalog row instead): {', '.join(found)}"
    )


def test_the_branch_check_can_fail():
    code = (
        "def f(strategy, row):\n"
        "    if strategy in ('ddp', 'ddp_amp'):\n"
        "        return 1\n"
        "    if strategy == 'fsdp' or 'single' != strategy:\n"
        "        return 2\n"
        "    words = {'ddp': 'all-reduce'}\n"  # a lookup table is not a branch
        "    return row.comm == 'bucket_allreduce' or strategy == 'other'\n"
    )
    assert name_branches(ast.parse(code)) == [2, 4]


def test_each_autocast_strategy_is_compared_with_its_fp32_twin():
    """report_host explains a slow autocast row against this baseline: same collectives, same process model."""
    base = catalog.autocast_baselines()
    assert base == {s.name: base[s.name] for s in catalog.STRATEGIES if s.autocast}
    for amp, fp32 in base.items():
        a, b = catalog.spec(amp), catalog.spec(fp32)
        assert not b.autocast and (a.comm, a.multiprocess) == (b.comm, b.multiprocess)


def test_each_sharding_strategy_is_compared_with_an_unsharded_twin():
    """The report's memory section shows what a sharding row saved against this baseline: a row that shards
    nothing, in full precision, with the same process model."""
    base = catalog.sharding_baselines()
    assert set(base) == {s.name for s in catalog.STRATEGIES if s.shards}
    assert base, "fsdp shards its state: it has a baseline"
    for sharded, plain in base.items():
        a, b = catalog.spec(sharded), catalog.spec(plain)
        assert not b.shards and not b.autocast and b.comm != "none" and a.multiprocess == b.multiprocess


def test_the_docs_tool_rewrites_only_the_table():
    """tools/sync_catalog.py replaces what lies between the markers and keeps the text around them."""
    from tools.sync_catalog import regenerate

    text = f"before\n{catalog.DOC_BEGIN}\nstale\n{catalog.DOC_END}\nafter\n"
    assert regenerate(text) == f"before\n{catalog.DOC_BEGIN}\n{catalog.markdown_table()}{catalog.DOC_END}\nafter\n"


def test_dvc_yaml_has_a_sweep_stage_per_catalog_strategy():
    """dvc.yaml's sweep `foreach` (a fixed list: DVC puts ${item} into a shell command) is the catalog's names, as
    tools/sync_catalog.py writes them; the tool rewrites a stale list and keeps the rest of the file."""
    from tools.sync_catalog import sweep_stages, with_sweep_stages

    text = (REPO / "dvc.yaml").read_text()
    assert sweep_stages(text) == list(catalog.NAMES), "dvc.yaml is out of date: run `python tools/sync_catalog.py`"
    stale = text.replace(f"[{', '.join(catalog.NAMES)}]", "[single, ddp]")
    assert sweep_stages(stale) == ["single", "ddp"] and with_sweep_stages(stale) == text


def test_a_row_without_a_class_is_reported(monkeypatch):
    """A catalog row whose module pipeline/strategies/NAME.py is missing shows up in disagreements()."""
    assert strategies._class_of("no_such_strategy") is None
    monkeypatch.setattr(catalog, "NAMES", (*catalog.NAMES, "no_such_strategy"))
    assert any("'no_such_strategy' has no class" in d for d in strategies.disagreements())


def test_each_class_is_found_in_the_module_named_after_its_row():
    for name, cls in strategies.STRATEGIES.items():
        assert cls.__module__ == (
            "pipeline.strategies.base" if name == catalog.REFERENCE else f"pipeline.strategies.{name}"
        ), name
