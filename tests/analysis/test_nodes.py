"""Points whose trials spanned nodes (the sweep table's nnodes, SLURM) say so in the analysis tables and the report;
single-node tables show no nodes column."""

from pipeline.analysis import stage

from .test_analyze import frame, row, write


def test_tables_carry_the_node_count_and_default_to_one():
    """nodes is the points' nnodes; rows without nnodes (older tables, local runs) count as one node."""
    df = frame([row(k=1, B=128, nnodes=1), row(k=2, B=256, thr=1800, nnodes=1), row(k=4, B=512, thr=3000, nnodes=2)])
    pts = stage.point_table(df)
    assert dict(zip(pts["k"], pts["nodes"])) == {1: 1, 2: 1, 4: 2}
    eff = stage.scaling_table(df)
    assert set(eff.loc[eff["k"] == 4, "nodes"]) == {2}
    assert set(stage.point_table(frame([row(k=1), row(k=2, B=256)]))["nodes"]) == {1}


def test_report_names_the_points_across_nodes(tmp_path):
    """The report says k=4 ran on 2 nodes and shows a nodes column; a one-node run's report shows neither."""
    d = tmp_path / "sweeps"
    d.mkdir()
    write([row(k=1, B=128, nnodes=1), row(k=4, B=512, thr=3000, nnodes=2)], d / "ddp.jsonl")
    stage.analyze(d, tmp_path / "out", expected=("ddp",))
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Trials across nodes (SLURM jobs; devices N is one node's): k=4 on 2 nodes." in text
    assert "| nodes |" in text
    write([row(k=1, B=128), row(k=2, B=256, thr=1800)], d / "ddp.jsonl")
    stage.analyze(d, tmp_path / "one", expected=("ddp",))
    text = (tmp_path / "one" / "report.md").read_text()
    assert "Trials across nodes" not in text and "| nodes |" not in text
