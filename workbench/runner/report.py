"""Reports: each executed notebook as an offline HTML page (plotly figures kept, one shared
plotly.js) and an index page of every notebook's status and gates.

plotly >= 6.1 emits only ``application/vnd.plotly.v1+json`` under a kernel, which nbconvert
drops; :class:`PlotlyToHTML` turns each such output into a div and a ``Plotly.newPlot`` call.
"""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

from workbench.runner.params import read_notebook

__all__ = ["PLOTLY_MIMETYPE", "PLOTLY_JS", "PlotlyToHTML", "export_html", "copy_plotly_js", "write_index",
           "summary_html", "capture_inputs", "provenance"]

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
{#- code folded under "code" unless the report is written with show_code -#}
{% block input_group -%}
{%- if cell.cell_type == 'code' and not resources.workbench_show_code -%}
<details class="wb-code"><summary>code</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{%- endblock input_group %}
{#- the report's summary, written (and escaped) by summary_html: verbatim, not bleached -#}
{% block rawcell scoped -%}
{%- if cell.metadata.get('workbench_summary') -%}
{{ cell.source }}
{%- else -%}
{{ super() }}
{%- endif -%}
{%- endblock rawcell %}
{#- offline: no require.js (it would capture plotly.js as an AMD module), no MathJax or mermaid from a CDN -#}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js -%}
{{ super() }}
<script src="{{ resources.plotly_js_url }}"></script>
<style>
details.wb-code > summary {cursor: pointer; color: #57606a; font-size: 12px; margin: 2px 0 2px 70px}
.wb-summary {font-family: sans-serif; font-size: 14px; margin: 8px 0 24px 70px; max-width: 1100px}
.wb-summary table {border-collapse: collapse; margin: 4px 0 12px 0}
.wb-summary td, .wb-summary th {border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top}
.wb-summary .pass {color: #1a7f37; font-weight: bold} .wb-summary .fail {color: #cf222e; font-weight: bold}
.wb-summary h3 {margin: 14px 0 4px 0; font-size: 16px}
/* printed (workbench run --pdf): landscape, so that figures drawn at the window's width fit */
@page {size: A4 landscape; margin: 10mm}
@media print {.jp-OutputArea-output, .js-plotly-plot {break-inside: avoid}}
</style>
{%- endblock html_head_js -%}
"""


def _cell(v) -> str:
    return html.escape(v if isinstance(v, str) else json.dumps(v, default=str))


def summary_html(*, notebook: str, status: str, ipynb: str | None, parameters: dict, inputs: list[dict],
                 findings: list[dict], gates: list[dict], provenance: dict) -> str:
    """The head of a report, for a reviewer who was not there: status, the notebook, what ran on
    what (inputs: each capture parameter's arm and description; provenance: commit, versions,
    machine, date), the findings in words and the gate table; every parameter in a fold."""
    cls = "pass" if status == "passed" else "fail"
    link = f" (<a href='{html.escape(ipynb)}'>executed notebook</a>)" if ipynb else ""
    prov = ", ".join(f"{html.escape(k)} {html.escape(str(v))}" for k, v in provenance.items() if v)
    rows = "".join(f"<tr><td>{html.escape(i['parameter'])}</td><td>{html.escape(i['path'])}</td>"
                   f"<td>{html.escape(i.get('arm') or '')}</td><td>{html.escape(i.get('description') or '')}</td>"
                   f"<td>{html.escape(i.get('created') or '')}</td></tr>" for i in inputs)
    inputs_html = (f"<table><tr><th>parameter</th><th>capture</th><th>arm</th><th>what it is</th><th>recorded</th></tr>"
                   f"{rows}</table>") if inputs else "<p>no capture among the parameters</p>"
    found = "".join(f"<li>{html.escape(f['text'])}</li>" for f in findings) or "<li>none recorded</li>"
    grows = "".join(
        f"<tr><td>{html.escape(g['name'])}</td><td>{html.escape(g.get('kind', 'regression'))}</td>"
        f"<td class='{'pass' if g['passed'] else 'fail'}'>{'passed' if g['passed'] else 'FAILED'}</td>"
        f"<td>{_cell(g['value'])} {html.escape(g['op'])} {_cell(g['threshold'])}</td><td>{html.escape(g.get('help') or '')}</td></tr>"
        for g in gates)
    gates_html = (f"<table><tr><th>gate</th><th>kind</th><th>result</th><th>check</th><th>what it protects</th></tr>"
                  f"{grows}</table>") if gates else "<p>no gate recorded</p>"
    prows = "".join(f"<tr><td>{html.escape(k)}</td><td>{_cell(v)}</td></tr>" for k, v in parameters.items())
    return (f"<section class='wb-summary'><p><span class='{cls}'>{html.escape(status)}</span>: "
            f"{html.escape(notebook)}{link}; {prov}</p>"
            f"<h3>Inputs</h3>{inputs_html}<h3>Findings</h3><ul>{found}</ul><h3>Gates</h3>{gates_html}"
            f"<details><summary>all parameters</summary><table>{prows}</table></details>"
            "<p style='color:#57606a'>The notebook follows; its code is folded under each cell's "
            "\"code\" (<code>workbench run --show-code</code> writes it open).</p></section>")


def capture_inputs(parameters: dict, resolve=None) -> list[dict]:
    """The parameters that name a capture directory: its arm, description and creation time."""
    out = []
    for k, v in parameters.items():
        if not isinstance(v, str) or not v:
            continue
        p = resolve(v) if resolve else Path(v)
        man = Path(p) / "manifest.json"
        if not man.is_file():
            continue
        try:
            m = json.loads(man.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        run = m.get("run") or {}
        desc = str(run.get("description") or "")
        out.append({"parameter": k, "path": v, "arm": str(m.get("arm") or ""),
                    "description": desc if len(desc) <= 240 else desc[:237] + "...",
                    "created": str(m.get("created") or "")})
    return out


def provenance(root: Path | None = None) -> dict:
    """What a reviewer needs to re-run: the commit (dirty or not), versions, machine and date."""
    import datetime
    import platform
    import subprocess

    from workbench import __version__

    commit = ""
    if root is not None:
        try:
            sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            commit = sha + (" (with uncommitted changes)" if sha and dirty else "")
        except (OSError, subprocess.SubprocessError):
            commit = ""
    try:
        import torch
        tv = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        tv = ""
    return {"commit": commit, "workbench": __version__, "python": platform.python_version(), "torch": tv,
            "on": platform.node(), "at": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}


def export_html(nb, dest: str | os.PathLike, *, plotly_js_url: str = PLOTLY_JS,
                title: str | None = None, summary: str | None = None, show_code: bool = False) -> Path:
    """Write ``nb`` (node or path) as an offline HTML page referencing ``plotly_js_url``.

    ``summary``: HTML put after the notebook's first markdown cell (its question), e.g.
    :func:`summary_html`; ``show_code``: code cells open (default: folded under "code").
    """
    import copy

    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    if not hasattr(nb, "cells"):
        nb = read_notebook(nb)
    if summary:
        nb = copy.deepcopy(nb)
        at = next((i + 1 for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), 0)
        nb.cells.insert(at, nbformat.v4.new_raw_cell(summary, metadata={"raw_mimetype": "text/html",
                                                                           "workbench_summary": True}))
    exporter = HTMLExporter(template_name="lab", template_file="workbench.html.j2",
                            extra_loaders=[jinja2.DictLoader({"workbench.html.j2": _TEMPLATE})])
    exporter.register_preprocessor(PlotlyToHTML(), enabled=True)
    resources = {"plotly_js_url": plotly_js_url, "metadata": {"name": title or Path(dest).stem},
                 "workbench_show_code": bool(show_code)}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    dest = Path(dest)
    dest.write_text(body, encoding="utf-8")
    return dest


CHROMIUM_ENV = "WORKBENCH_CHROMIUM"


def find_chromium() -> str | None:
    """The browser that prints reports: $WORKBENCH_CHROMIUM, else chromium / chromium-browser /
    google-chrome on PATH."""
    for c in (os.environ.get(CHROMIUM_ENV), "chromium", "chromium-browser", "google-chrome"):
        if c and (shutil.which(c) or Path(c).is_file()):
            return shutil.which(c) or c
    return None


def export_pdf(page: str | os.PathLike, dest: str | os.PathLike | None = None, *, timeout: float = 180) -> Path:
    """Print an HTML report (``export_html``'s page, next to its plotly.min.js) to PDF with headless
    Chromium, for reviews that take attachments: figures as drawn on the page (their first state:
    a dropdown's other choices are not printed), code folded as in the page.

    The PDF is written next to the page as ``<name>.pdf`` (or ``dest``), whole or not at all.
    Raises NotebookError when no Chromium is found or it does not print.
    """
    import subprocess
    import tempfile

    from workbench.errors import NotebookError

    page = Path(page).resolve()
    dest = Path(dest) if dest is not None else page.with_suffix(".pdf")
    browser = find_chromium()
    if browser is None:
        raise NotebookError("no Chromium to print the PDF with", file=page, key="--pdf",
                            fix=f"install it (apt-get install chromium) or set {CHROMIUM_ENV} to its path")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix="workbench-chromium-") as profile:
            cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   f"--user-data-dir={profile}", "--no-pdf-header-footer", "--run-all-compositor-stages-before-draw",
                   "--virtual-time-budget=30000", f"--print-to-pdf={tmp}", page.as_uri()]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        head = Path(tmp).read_bytes()[:5] if Path(tmp).exists() else b""
        if r.returncode != 0 or head != b"%PDF-":
            raise NotebookError(f"Chromium did not print {page.name} (exit {r.returncode}): "
                                f"{(r.stderr or '').strip().splitlines()[-1:] or ['no output']}", file=page,
                                key="--pdf", fix=f"run it by hand: {' '.join(cmd[:-2])} --print-to-pdf=out.pdf "
                                                 f"{page.as_uri()}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as any file the run writes, not mkstemp's 0600
        os.replace(tmp, dest)
    except subprocess.TimeoutExpired as e:
        raise NotebookError(f"Chromium did not print {page.name} in {timeout:.0f} s", file=page, key="--pdf",
                            fix="retry on a less loaded machine") from e
    finally:
        Path(tmp).unlink(missing_ok=True)
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
        nb += f" <a href='{html.escape(r.pdf)}'>.pdf</a>" if getattr(r, "pdf", None) else ""
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
