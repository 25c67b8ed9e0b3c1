"""Real-browser tests: JupyterLab driven by headless chromium (Playwright), and an exported HTML
report opened from disk with the network blocked. Screenshots are kept in the test's tmp dir and
copied to /tmp/wb-screens/.

Skipped (with the reason) only when the playwright package or a chromium binary is missing; CI
installs both (`pip install playwright`, `apt-get install chromium`; never `playwright install`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from .conftest import ROOT

CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SCREENS = Path("/tmp/wb-screens")

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None, reason="the playwright Python package is not installed "
                       "(pip install playwright)"),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium, or set "
                       "WORKBENCH_CHROMIUM)"),
]


def _keep(page, tmp_path: Path, name: str) -> Path:
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    SCREENS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SCREENS / name)
    return shot


@pytest.fixture
def browser():
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on a free localhost port, temporary token, config, runtime and workspace dirs,
    serving a copy of first_divergence.ipynb with interactive = True."""
    root = tmp_path / "lab"
    root.mkdir()
    nb = nbformat.read(ROOT / "notebooks" / "first_divergence.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert "interactive: bool = False" in cell.source
    cell.source = cell.source.replace("interactive: bool = False", "interactive: bool = True")
    nbformat.write(nb, root / "first_divergence.ipynb")
    port, token = _free_port(), os.urandom(16).hex()
    # every cell attached to the page (no windowing), so what a cell printed is found however far
    # down the notebook it is; the notebook's own kernel (python3) started without asking, as with
    # "Always start the preferred kernel" ticked: on a loaded machine the kernel specs can reach the
    # page after the notebook, and JupyterLab then asks "Select Kernel" again and again
    tracker = tmp_path / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none", "autoStartDefaultKernel": True}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), WORKBENCH_ROOT=str(ROOT),
               JUPYTER_PLATFORM_DIRS="1")
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
         f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + BUSY_MS / 1000
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# Upper bound of every wait that depends on the machine's speed (kernel start, imports, numba JIT,
# a full notebook run). The waits end at the event they wait for, so a long bound costs nothing on
# a fast machine and keeps a loaded one (a busy 2-core CI runner) from failing on a timeout.
BUSY_MS = int(float(os.environ.get("WORKBENCH_BROWSER_WAIT_S", "600")) * 1000)

def _answer_dialogs(page) -> list[str]:
    """Accept JupyterLab's modal dialogs with their default button, as a user reading them would
    (for instance "Select Kernel" with the notebook's own kernel preselected, which JupyterLab can
    raise when Run All comes before the session is wired); print their texts for the log."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    texts = []
    for _ in range(10):
        dialog = page.locator(".jp-Dialog")
        if not dialog.count():
            break
        texts.append(" ".join(dialog.first.inner_text().split())[:300])
        try:
            dialog.first.locator(".jp-mod-accept").first.click(timeout=10_000)
            dialog.first.wait_for(state="detached", timeout=10_000)
        except PlaywrightTimeout:
            continue  # still shown (a busy page, or the next dialog in its place): read and answer again
    if texts:
        print("JupyterLab dialogs answered:", texts)
    return texts


_EXECUTED = """() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]
    .some(p => /\\[\\d+\\]/.test(p.textContent))"""
_QUEUED = """() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]
    .some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""


def _run_all_cells(page, attempts: int = 4) -> None:
    """Run > Run All Cells, as a user would, until a cell has finished executing.

    Right after the kernel reports idle, JupyterLab can still be wiring the session to the
    notebook panel: a first click may run nothing, or a dialog ("Select Kernel", raised when the
    kernel was slow to answer on a busy machine) may replace the kernel and drop the queued cells.
    A user would answer the dialog and click again, and so do we. Only a prompt turning into [n]
    (a cell executed, not merely queued as [*]) proves that the run is under way.
    """
    per_attempt = min(BUSY_MS, 240_000) / 1000
    for i in range(attempts):
        _answer_dialogs(page)
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        start = time.time()
        end = start + per_attempt
        while time.time() < end:
            if page.evaluate(_EXECUTED):
                return
            if time.time() - start > 60 and not page.evaluate(_QUEUED):
                break  # the click queued nothing: click again
            if page.locator(".jp-Dialog").count():
                break  # answered at the top of the next attempt, then Run All again
            page.wait_for_timeout(1000)
        if page.locator(".lm-Menu").count():  # a menu left open, not a dialog
            page.keyboard.press("Escape")
        print(f"Run All attempt {i + 1}: no cell executed yet; trying again")
    raise AssertionError(f"Run All Cells executed no cell in {attempts} attempts")


_RUNNING = """() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]
    .some(p => /\\[\\*\\]/.test(p.textContent))"""
_PROMPTS = """() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]
    .map(p => p.textContent.trim())"""
_ERRORS = """() => [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
    .filter(o => /Traceback/.test(o.textContent) &&
                 /stderr|error/.test(o.dataset.mimeType || ''))
    .map(o => o.textContent.slice(-1500))"""


def _diagnosis(page, lab_log: Path | None) -> str:
    """What a reader of a failed CI log needs: each cell's prompt, the errors shown, the tail of
    JupyterLab's own log."""
    parts = [f"prompts: {page.evaluate(_PROMPTS)}"]
    for err in page.evaluate(_ERRORS):
        parts.append("error output:\n" + err)
    status = page.locator(".jp-Notebook-ExecutionIndicator").first
    if status.count():
        parts.append(f"kernel status: {status.get_attribute('data-status')}")
    if lab_log is not None and lab_log.exists():
        parts.append("JupyterLab log (tail):\n" + lab_log.read_text(errors="replace")[-2500:])
    return "\n".join(parts)


def _wait_for_run(page, text, lab_log: Path | None = None, reruns: int = 2) -> None:
    """Wait until ``text`` shows. A cell that fails ends the wait at once with its error. A run
    that stops short of ``text`` (a dialog on the way, or the kernel replaced under load so that
    the queued cells were dropped: idle, nothing queued, for 30 s) is run again, as a user would,
    at most ``reruns`` times."""
    end = time.time() + BUSY_MS / 1000
    target = page.get_by_text(text)
    want = repr(getattr(text, "pattern", text))
    idle_since = None
    while time.time() < end:
        if target.count():
            return
        errors = page.evaluate(_ERRORS)
        if errors:
            raise AssertionError(f"a cell failed before {want} showed:\n"
                                 + _diagnosis(page, lab_log))
        stalled = False
        if page.locator(".jp-Dialog").count():
            print("a dialog interrupted the run")  # _run_all_cells answers it (and prints its text)
            stalled = True
        elif (page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count()
              and not page.evaluate(_RUNNING)):
            idle_since = idle_since or time.time()
            stalled = time.time() - idle_since > 30
        else:
            idle_since = None
        if stalled:
            if reruns <= 0:
                raise AssertionError(f"the run stopped short of {want}:\n"
                                     + _diagnosis(page, lab_log))
            print(f"the run stopped short ({page.evaluate(_PROMPTS)}): running all cells again")
            reruns -= 1
            idle_since = None
            _run_all_cells(page)
        page.wait_for_timeout(1000)
    raise AssertionError(f"{want} did not appear within {BUSY_MS / 1000:.0f} s:\n"
                         + _diagnosis(page, lab_log))


_WIDGET_OUTPUTS = """() => ({views: document.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length,
    notes: [...document.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent.trim())
        .filter(t => /(error|loading)[^\\n]{0,20}widget/i.test(t)).map(t => t.slice(0, 200))})"""


def _wait_for_widget(page, selector: str, tmp_path: Path) -> None:
    """Wait for a widget's part to be drawn. A widget view can fail to attach when the kernel was
    replaced during Run All on a loaded machine (its output then reads "Error displaying widget" or
    stays "Loading widget..."); a user would clear the outputs and run all cells again, and so do
    we, once (after reloading the page), saying so with what each widget output showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(selector, timeout=min(BUSY_MS, 240_000))
        return
    except PlaywrightTimeout:
        _keep(page, tmp_path, "jupyterlab_widget_not_drawn.png")
        print(f"{selector} not drawn; widget outputs: {page.evaluate(_WIDGET_OUTPUTS)}; "
              "clearing the outputs and running all cells again")
    # "model not found" outlives a second Run All when the page's widget manager lost its kernel
    # connection (lab.log: "Discarding N buffered messages" as the page connected): a reload binds
    # a new manager to the running kernel, as a user reloading the tab would
    page.reload()
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=BUSY_MS)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=BUSY_MS)
    page.locator(".lm-MenuBar-itemLabel", has_text="Edit").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Clear Outputs of All Cells").first.click()
    _run_all_cells(page)
    _wait_for_run(page, re.compile(r"all \d+ gate\(s\) passed"), tmp_path / "lab.log")
    try:
        page.wait_for_selector(selector, timeout=BUSY_MS)
    except PlaywrightTimeout:
        raise AssertionError(f"{selector} was not drawn after a second run; widget outputs: "
                             f"{page.evaluate(_WIDGET_OUTPUTS)}\n" + _diagnosis(page, tmp_path / "lab.log"))


def metric_title(metric: str) -> str:
    from workbench.plots._style import metric_title as words
    return words(metric)


def _explorer_ytitle(page) -> str:
    return page.locator(".workbench-explorer .js-plotly-plot .ytitle").first.text_content()


def test_jupyterlab_runs_notebook_and_widget_redraws(lab, browser, tmp_path):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(BUSY_MS)  # clicks and locators wait for the page, however busy the machine
    page.goto(f"{base}/lab/tree/first_divergence.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=BUSY_MS)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=BUSY_MS)
    _run_all_cells(page)
    try:
        _wait_for_run(page, re.compile(r"all \d+ gate\(s\) passed"), tmp_path / "lab.log")  # the last cell
    finally:
        _keep(page, tmp_path, "jupyterlab_first_divergence_run.png")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=BUSY_MS)
    # two figures at top level and one in the explorer, all drawn by plotly.js
    _wait_for_widget(page, ".workbench-explorer .js-plotly-plot .main-svg", tmp_path)
    assert page.locator(".jp-OutputArea .js-plotly-plot .main-svg").count() >= 3
    assert _explorer_ytitle(page) == metric_title("rel_l2")
    page.locator(".workbench-explorer select").first.select_option("max_abs")
    page.wait_for_function(
        f"() => document.querySelector('.workbench-explorer .js-plotly-plot .ytitle')?.textContent === "
        f"{json.dumps(metric_title('max_abs'))}", timeout=BUSY_MS)
    # the capture explorer (workbench.widgets): both figures are drawn on the page with the traces
    # the Python side holds, and follow every control; the same explorer built here says how many
    cx = ".workbench-capture-explorer"
    _wait_for_widget(page, f"{cx} .js-plotly-plot .main-svg", tmp_path)
    from workbench.widgets import CaptureExplorer
    from workbench.widgets.explorer import ALL

    mirror = CaptureExplorer(ROOT / "captures" / "control", ROOT / "captures" / "candidate",
                             aa=ROOT / "captures" / "control-repeat")
    counts = f"() => Array.from(document.querySelectorAll('{cx} .js-plotly-plot')).map(g => (g.data || []).length)"

    def expect_drawn(what: str) -> None:
        want = [len(mirror.by_layer.figure.data), len(mirror.by_step.figure.data)]
        assert min(want) > 0, f"{what}: the explorer has nothing to draw ({mirror.status.value})"
        try:
            page.wait_for_function(f"want => {{ const n = ({counts})(); return n.length === 2 && "
                                   f"n[0] === want[0] && n[1] === want[1]; }}", arg=want, timeout=BUSY_MS)
        except Exception:
            raise AssertionError(f"{what}: the page draws {page.evaluate(counts)} traces, the explorer holds {want}")

    expect_drawn("first drawn")
    assert page.locator(f"{cx} .js-plotly-plot .ytitle").first.text_content() == metric_title("rel_l2")
    labels = [d.description for d in mirror.controls.values()]
    for control, value in (("op", "gdn"), ("step", 0), ("metric", "max_abs"), ("op", ALL)):
        mirror.controls[control].value = value
        page.locator(f"{cx} select").nth(labels.index(control)).select_option(str(value))
        expect_drawn(f"after {control}={value}")
    assert page.locator(f"{cx} .js-plotly-plot .ytitle").first.text_content() == metric_title("max_abs")
    # the graft form: Graft re-runs the candidate with the chosen op's input from the control (the
    # first divergence's op, chosen by default); the verdict and the figure of the grafted run show
    gp = ".workbench-graft-panel"
    page.wait_for_selector(f"{gp} button", timeout=BUSY_MS)
    chosen = page.locator(f"{gp} select option:checked").first.text_content().replace("\xa0", " ")  # ipywidgets' nbsp
    assert chosen == "layer 3 qsa (step 0, rank 0)  <- first divergence", chosen
    page.locator(f"{gp} button", has_text="Graft").click()
    page.wait_for_selector(f"{gp} .js-plotly-plot .main-svg", timeout=BUSY_MS)
    page.get_by_text(re.compile(r"still diverges: the fault starts in this op")).first.wait_for(timeout=BUSY_MS)
    assert page.locator(f"{gp} .js-plotly-plot .legendtext").filter(has_text=re.compile(r"^grafted$")).count() == 1
    page.locator(gp).scroll_into_view_if_needed()
    _keep(page, tmp_path, "jupyterlab_graft_form.png")
    page.locator(".workbench-explorer").scroll_into_view_if_needed()
    _keep(page, tmp_path, "jupyterlab_first_divergence.png")
    assert not page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                            has_text="Traceback").count()


def test_html_report_renders_offline(suite, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    blocked = []

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((suite.out / "first_divergence.html").as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=BUSY_MS)
    assert page.locator(".js-plotly-plot").count() >= 2
    assert page.locator(".js-plotly-plot .heatmaplayer, .js-plotly-plot .hm").count() >= 1
    (fd,) = [n for n in json.loads((suite.out / "results.json").read_text())["notebooks"]
             if n["notebook"].endswith("first_divergence.ipynb")]
    assert page.locator(".workbench-gate[data-passed='true']").count() == len(fd["gates"]) >= 3
    assert page.locator(".workbench-finding").count() == len(fd["findings"]) >= 2
    # the explorer works offline: plotly's own dropdown switches the figure to another metric
    explorer = page.locator(".js-plotly-plot", has=page.locator(".updatemenu-header-group")).first
    explorer.scroll_into_view_if_needed()
    assert explorer.locator(".ytitle").first.text_content() == metric_title("rel_l2")
    explorer.locator(".updatemenu-header-group").first.click()
    explorer.locator(".updatemenu-dropdown-button", has_text="metric=max_abs, op=all").first.click()
    page.wait_for_function(
        f"el => el.querySelector('.ytitle')?.textContent === {json.dumps(metric_title('max_abs'))}",
        arg=explorer.element_handle(), timeout=BUSY_MS)
    assert explorer.locator(".scatterlayer .trace").count() >= 4  # a curve per op, drawn in the new metric
    assert not errors, errors
    assert not blocked, f"the offline report asked the network for {blocked}"
    _keep(page, tmp_path, "report_first_divergence.png")
    assert json.loads((suite.out / "results.json").read_text())["ok"]
