"""The offline template of `dvc plots show`: DVC's placeholder for the plots, none for its CDN scripts, the libraries
inline from the vendored bundle (pipeline/analysis/plots/vega/), with no package to install."""

from __future__ import annotations

import builtins

import pytest

from pipeline.analysis.plots import dvc_template


def test_template_inlines_the_bundle_and_keeps_dvc_out_of_the_cdn():
    page = dvc_template.template("window.vegaEmbed = function () {}; var s = '</script>';")
    assert "{plot_divs}" in page and "{scripts}" not in page and "http" not in page.split("<body>")[0]
    assert "window.vegaEmbed" in page and "</script>';" not in page  # an inner </script would end the script
    with pytest.raises(ValueError):
        dvc_template.template("'{plot_divs}'")


def test_the_offline_page_needs_no_vl_convert(tmp_path, monkeypatch):
    """The page inlines the vendored vega, vega-lite and vega-embed: vl-convert-python need not be installed."""
    real = builtins.__import__

    def no_vl_convert(name, *args, **kwargs):
        if name == "vl_convert":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vl_convert)
    page = dvc_template.write(tmp_path / "t.html").read_text()
    assert "{plot_divs}" in page and "cdn.jsdelivr" not in page and "<script src" not in page
    for name in ("vegaEmbed", "vega", "vegaLite"):
        assert f"window.{name}=" in page, name
    assert 'const v24="6.2.0"' in page and 'var x25="5.21.0"' in page  # vega 6.2.0, vega-lite 5.21.0


def test_a_changed_bundle_is_refused_by_name(tmp_path, monkeypatch):
    changed = tmp_path / "vega-bundle.min.js"
    changed.write_text("window.vegaEmbed = 1;")
    monkeypatch.setattr(dvc_template, "BUNDLE", changed)
    with pytest.raises(OSError, match="vega-bundle.min.js is not the vendored vega bundle"):
        dvc_template.write(tmp_path / "t.html")
    assert not (tmp_path / "t.html").exists()


def test_the_bundle_ships_with_its_licences():
    from ..conftest import REPO

    licences = (dvc_template.BUNDLE.parent / "LICENSES.md").read_text()
    assert "BSD 3-Clause" in licences and "University of Washington Interactive Data Lab" in licences
    text = (REPO / "pyproject.toml").read_text()
    assert '"vega/*.js", "vega/LICENSES.md"' in text  # package data: installed with the wheel


def test_page_names_the_data_source(tmp_path):
    """A synthetic run's page opens with the same SYNTHETIC line as the PNG figures; no summary: no line."""
    page = dvc_template.template("var x = 1;", source="synthetic")
    head = page.split("{plot_divs}")[0]
    assert "SYNTHETIC" in head and 'class="source synthetic"' in head
    assert 'class="source' not in dvc_template.template("var x = 1;")
    (tmp_path / "summary.json").write_text('{"data_source": "synthetic"}')
    assert dvc_template.read_source(tmp_path / "summary.json") == "synthetic"
    assert dvc_template.read_source(tmp_path / "missing.json") == ""


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
