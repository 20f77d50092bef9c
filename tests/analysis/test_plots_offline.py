"""The offline template of `dvc plots show`: DVC's placeholder for the plots, none for its CDN scripts, the libraries
inline (vl-convert-python ships them; the test that needs it is skipped, visibly, where it is not installed)."""

from __future__ import annotations

import builtins

import pytest

from pipeline.analysis.plots import dvc_template as plots_offline


def test_template_inlines_the_bundle_and_keeps_dvc_out_of_the_cdn():
    page = plots_offline.template("window.vegaEmbed = function () {}; var s = '</script>';")
    assert "{plot_divs}" in page and "{scripts}" not in page and "http" not in page.split("<body>")[0]
    assert "window.vegaEmbed" in page and "</script>';" not in page  # an inner </script would end the script
    with pytest.raises(ValueError):
        plots_offline.template("'{plot_divs}'")


def test_without_vl_convert_the_message_says_what_to_install(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_vl_convert(name, *args, **kwargs):
        if name == "vl_convert":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vl_convert)
    with pytest.raises(ImportError, match="pip install vl-convert-python"):
        plots_offline.write(tmp_path / "t.html")
    assert not (tmp_path / "t.html").exists()


def test_offline_template_with_vl_convert(tmp_path):
    pytest.importorskip("vl_convert", reason="vl-convert-python is not installed (pip install vl-convert-python)")
    page = plots_offline.write(tmp_path / "t.html").read_text()
    assert "{plot_divs}" in page and "window.vegaEmbed" in page and "cdn.jsdelivr" not in page


def test_page_names_the_data_source(tmp_path):
    """A synthetic run's page opens with the same SYNTHETIC line as the PNG figures; no summary: no line."""
    page = plots_offline.template("var x = 1;", source="synthetic")
    head = page.split("{plot_divs}")[0]
    assert "SYNTHETIC" in head and 'class="source synthetic"' in head
    assert 'class="source' not in plots_offline.template("var x = 1;")
    (tmp_path / "summary.json").write_text('{"data_source": "synthetic"}')
    assert plots_offline.read_source(tmp_path / "summary.json") == "synthetic"
    assert plots_offline.read_source(tmp_path / "missing.json") == ""


def test_batch_legend_uses_distinct_shapes():
    """In DVC's efficiency and throughput templates the batch is the point shape as well as the dash, so its legend
    shows different symbols, and the revision is not a shape that would merge with it."""
    import json

    from ..conftest import REPO

    for name, field in (("efficiency_by_strategy", "batch"), ("throughput_by_strategy", "batch_size")):
        spec = json.loads((REPO / ".dvc" / "plots" / f"{name}.json").read_text())
        enc = spec["spec"]["layer"][1]["encoding"] if "spec" in spec else spec["encoding"]
        assert enc["shape"]["field"] == enc["strokeDash"]["field"] == field, name
        assert enc["strokeDash"]["legend"] is None, name  # its legend would draw the batches as identical dots
        assert enc["strokeWidth"]["field"] == "rev", name
