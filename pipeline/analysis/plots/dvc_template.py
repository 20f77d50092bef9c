"""An HTML template for `dvc plots show --html-template` that works offline.

DVC's own page loads vega, vega-lite and vega-embed from a CDN (dvc_render's VegaRenderer.SCRIPTS), so without a
network it is blank. DVC fills a template's `{plot_divs}` with its plots and, where the template has it, `{scripts}`
with those CDN tags; this template has no `{scripts}` and inlines the three libraries instead, from vega/ beside this
file: vega 6.2.0, vega-lite 5.21.0 and vega-embed in one script that assigns vegaEmbed, vegaLite and vega to the
window, as the CDN scripts do (the bundle vl-convert-python 1.9.0.post1 builds, `javascript_bundle(vl_version=
"5.21")`; BSD-3-Clause and their dependencies' licences in vega/LICENSES.md). Vendored, not installed: that package
is an 84 MiB native install whose only use here is these 0.86 MiB of JavaScript. Nothing is fetched at run time.

    python -m pipeline.analysis.plots.dvc_template results/dvc_plots/offline.html     # or: make plots
    dvc plots show --html-template results/dvc_plots/offline.html -o results/dvc_plots

The page opens with the workspace's data source (results/analysis/summary.json's `data_source`, or the summary
named as second argument) in the words of the PNG figures (figures.source_note), so a synthetic run's plots say so.
"""

from __future__ import annotations

import hashlib
import html
import json
import sys
from pathlib import Path

from pipeline.records import files

VEGA_LITE = "5.21"  # the major version of DVC's templates ("$schema": .../vega-lite/v5.json)
BUNDLE = Path(__file__).with_name("vega") / "vega-bundle.min.js"
BUNDLE_SHA256 = "9568278d3a5a7f71ceef77e8bf3d586baecb43ea9589fb950423cc03908fca39"
SUMMARY = Path("results/analysis/summary.json")

PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    <title>Parallax: DVC plots (offline)</title>
    <script type="text/javascript">
{bundle}
    </script>
    <style>body {{ font-family: sans-serif; }} table {{ border-spacing: 15px; }}
    .source {{ font-weight: bold; }} .synthetic {{ color: #c00; }}</style>
</head>
<body>
    {source}
    <p>Parallax plots through <code>dvc plots show</code>; vega, vega-lite and vega-embed are inlined (vega-lite
    {version}), so this page needs no network.</p>
    {{plot_divs}}
</body>
</html>
"""


def source_line(source: str) -> str:
    """The page's data-source paragraph ("" where the source is unknown)."""
    from pipeline.analysis.plots.figures import source_note

    note = source_note(source)
    if not note:
        return ""
    cls = "source synthetic" if "SYNTHETIC" in note else "source"
    return f"<p class=\"{cls}\">{html.escape(note)} (the workspace's results; each revision's in its own rows)</p>"


def read_source(summary: Path) -> str:
    """summary.json's data source, or "" where there is no readable summary."""
    try:
        return json.loads(Path(summary).read_text()).get("data_source") or ""
    except (OSError, ValueError, AttributeError):
        return ""


def template(bundle: str, version: str = VEGA_LITE, source: str = "") -> str:
    """The page around a JavaScript bundle: `{plot_divs}` for DVC, no `{scripts}` (DVC's CDN tags), and the data
    source's line."""
    if "{plot_divs}" in bundle or "{scripts}" in bundle:
        raise ValueError("the JavaScript bundle contains a DVC placeholder")
    bundle = bundle.replace("</script", "<\\/script")  # an inline script ends at the first </script
    return PAGE.format(bundle=bundle, version=version, source=source_line(source))


def bundle() -> str:
    """The vendored vega, vega-lite and vega-embed script; OSError names the file where it is missing or changed."""
    data = BUNDLE.read_bytes()
    if hashlib.sha256(data).hexdigest() != BUNDLE_SHA256:
        raise OSError(
            f"{BUNDLE} is not the vendored vega bundle (its SHA-256 differs): restore it from the repository "
            f"(git checkout -- {BUNDLE.name} in its folder) or reinstall Parallax."
        )
    return data.decode("utf-8")


def write(path: Path, summary: Path = SUMMARY) -> Path:
    """Write the offline template to `path`."""
    script = bundle()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(path, template(script, source=read_source(summary)))  # whole, never through a symlink
    return path


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m pipeline.analysis.plots.dvc_template OUT.html [SUMMARY.json]")
    try:
        print(f"wrote {write(Path(sys.argv[1]), *map(Path, sys.argv[2:]))}")
    except OSError as e:
        sys.exit(f"error: {e}")
