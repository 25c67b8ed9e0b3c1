"""Reports: each executed notebook as an offline HTML page (plotly figures kept, one shared
plotly.js) and an index page of every notebook's status and gates.

plotly >= 6.1 emits only ``application/vnd.plotly.v1+json`` under a kernel, which nbconvert
drops; :class:`PlotlyToHTML` turns each such output into a div and a ``Plotly.newPlot`` call.
"""

from __future__ import annotations

import html
import os
import shutil
from pathlib import Path

from workbench.runner.params import read_notebook

__all__ = ["PLOTLY_MIMETYPE", "PLOTLY_JS", "PlotlyToHTML", "export_html", "copy_plotly_js", "write_index"]

PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
PLOTLY_JS = "plotly.min.js"


def _plotly_div(spec: dict) -> str:
    import plotly.io as pio

    fig = {"data": spec.get("data", []), "layout": spec.get("layout", {}),
           "frames": spec.get("frames", [])}
    cfg = spec.get("config") or {}
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, validate=False,
                       config=cfg or None)


def _preprocessor_base():
    from nbconvert.preprocessors import Preprocessor

    return Preprocessor


class PlotlyToHTML(_preprocessor_base()):
    """Give every plotly mimetype output a text/html rendering (a div + ``Plotly.newPlot``) that
    uses the page's one shared plotly.js; nbconvert would otherwise drop the figure silently."""

    def preprocess_cell(self, cell, resources, index):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY_MIMETYPE in data and "text/html" not in data:
                data["text/html"] = _plotly_div(data[PLOTLY_MIMETYPE])
                resources.setdefault("plotly_figures", 0)
                resources["plotly_figures"] += 1
        return cell, resources


_TEMPLATE = r"""{%- extends 'lab/index.html.j2' -%}
{#- offline: no require.js (it would capture plotly.js as an AMD module), no MathJax or mermaid from a CDN -#}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js -%}
{{ super() }}
<script src="{{ resources.plotly_js_url }}"></script>
{%- endblock html_head_js -%}
"""


def export_html(nb, dest: str | os.PathLike, *, plotly_js_url: str = PLOTLY_JS,
                title: str | None = None) -> Path:
    """Write ``nb`` (node or path) as an offline HTML page referencing ``plotly_js_url``."""
    import jinja2
    from nbconvert import HTMLExporter

    if not hasattr(nb, "cells"):
        nb = read_notebook(nb)
    exporter = HTMLExporter(template_name="lab", template_file="workbench.html.j2",
                            extra_loaders=[jinja2.DictLoader({"workbench.html.j2": _TEMPLATE})])
    exporter.register_preprocessor(PlotlyToHTML(), enabled=True)
    resources = {"plotly_js_url": plotly_js_url, "metadata": {"name": title or Path(dest).stem}}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    dest = Path(dest)
    dest.write_text(body, encoding="utf-8")
    return dest


def copy_plotly_js(out: Path) -> Path:
    """Ship the installed plotly package's plotly.min.js once into the report folder."""
    import plotly

    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    dst = out / PLOTLY_JS
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        shutil.copyfile(src, dst)
    return dst


def write_index(res) -> Path:
    """index.html of a :class:`~workbench.runner.execute.RunResult`: one row per notebook."""
    rows = []
    for r in res.notebooks:
        color = "#1a7f37" if r.status == "passed" else "#cf222e"
        gate_cells = " ".join(
            f"<span title='{html.escape(str(g['value']))} {html.escape(g['op'])} "
            f"{html.escape(str(g['threshold']))}' style='color:{'#1a7f37' if g['passed'] else '#cf222e'}'>"
            f"{html.escape(g['name'])}</span>" for g in r.gates)
        err = ""
        if r.status != "passed" and r.error:
            err = html.escape(f"cell {r.error.get('cell')}: {r.error.get('ename')}: "
                              f"{(r.error.get('evalue') or '').splitlines()[0] if r.error.get('evalue') else ''}")
        found = "<br>".join(html.escape(f["text"]) for f in getattr(r, "findings", []))
        link = f"<a href='{html.escape(r.html)}'>{html.escape(r.notebook)}</a>" if r.html else html.escape(r.notebook)
        nb = f" <a href='{html.escape(r.ipynb)}'>.ipynb</a>" if r.ipynb else ""
        rows.append(f"<tr><td>{link}{nb}</td><td style='color:{color};font-weight:bold'>{r.status}</td>"
                    f"<td>{found}</td><td>{sum(g['passed'] for g in r.gates)}/{len(r.gates)}</td><td>{gate_cells}</td>"
                    f"<td>{err}</td><td>{r.seconds:.1f} s</td></tr>")
    verdict = "all notebooks passed" if res.ok else "FAILED"
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>workbench reports</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}}</style></head>
<body><h1>workbench reports: {verdict}</h1>
<table><tr><th>notebook</th><th>status</th><th>findings</th><th>gates</th><th>gate names</th><th>error</th><th>time</th></tr>
{''.join(rows)}
</table><p><a href="results.json">results.json</a></p></body></html>
"""
    path = res.out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
