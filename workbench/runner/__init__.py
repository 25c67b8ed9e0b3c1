"""Run parameterized notebooks headless: papermill, offline HTML reports, gates as a CI verdict.

The package is split by concern: :mod:`.params` (the ``parameters`` cell: declaration, types,
binding ``-p`` values), :mod:`.kernel` (the kernel that runs this interpreter), :mod:`.report`
(offline HTML pages and the index), :mod:`.execute` (the pipeline: execute, collect gates,
judge, export, one :class:`NotebookResult` each; a failure is a
:class:`~workbench.errors.NotebookFailure` naming notebook, cell and gates).

``workbench run`` (see :func:`run_notebooks`) executes each notebook with papermill on a kernel
of the current interpreter, with the notebook's own folder as working directory (as in
JupyterLab; paths in parameters are resolved against the repository by
:func:`workbench.notebook.resolve`) and a per-cell timeout. It writes into the output folder::

    <name>.ipynb     the executed notebook (outputs, injected parameters, saved widget state)
    <name>.html      the same as a page that works offline
    plotly.min.js    one copy of plotly.js, referenced by every page
    results.json     every notebook's status, parameters, error and gates
    index.html       a summary linking every report

Parameters are declared in the one cell tagged ``parameters``, one per line::

    control: str = "captures/control"  # the reference run, relative to the repository
    max_aa_rel_l2: float = 1e-5  # A/A noise ceiling
    interactive: bool = False  # show the widget explorer

Unknown names are refused, values given as text (``-p NAME VALUE``) are converted to the declared
type. plotly >= 6.1 emits only ``application/vnd.plotly.v1+json`` under a kernel, which nbconvert
drops; :class:`PlotlyToHTML` turns each such output into a div and a ``Plotly.newPlot`` call.
"""

from workbench.errors import NotebookError, NotebookFailure, ParameterError
from workbench.runner.execute import NotebookResult, RunResult, run_notebooks
from workbench.runner.kernel import KERNEL_NAME
from workbench.runner.params import (Parameter, _bind, convert_value, find_notebooks, load_params_file,
                                     parse_parameters, read_notebook)
from workbench.runner.report import PLOTLY_MIMETYPE, PlotlyToHTML, export_html

__all__ = ["Parameter", "NotebookResult", "RunResult", "ParameterError", "NotebookError", "NotebookFailure",
           "parse_parameters", "convert_value", "find_notebooks", "run_notebooks", "load_params_file",
           "read_notebook", "export_html", "PlotlyToHTML", "PLOTLY_MIMETYPE", "KERNEL_NAME", "_bind"]
