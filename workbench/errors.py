"""Typed errors of the workbench.

Every error derives from :class:`WorkbenchError` and carries, where they apply, the file, the key
and the fix, so that a message reads::

    ChecksumError: shard sha256 mismatch (expected 3f2a..., found 91bc...)
      file: /data/run1/shard-00001.safetensors
      key:  rank=0 step=3 layer=7 op=gdn name=state
      fix:  the shard was modified or truncated after capture; re-copy it from the source
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "WorkbenchError",
    "CaptureError",
    "IncompleteCaptureError",
    "ManifestError",
    "FormatVersionError",
    "ShardError",
    "ChecksumError",
    "UnsafePathError",
    "DuplicateKeyError",
    "KeyNotFoundError",
    "UnsafeFileError",
    "ImporterError",
    "FileNameError",
    "CaptureBudgetError",
    "CaptureLockedError",
    "DiskFullError",
    "DimsError",
    "KernelArgumentError",
    "BackendUnavailableError",
    "UnknownBackendError",
    "PolicyError",
    "GateError",
    "ParameterError",
    "NotebookError",
    "NotebookFailure",
    "AnalysisError",
    "GraftError",
]


class WorkbenchError(Exception):
    """Root of every error raised by the workbench.

    Parameters
    ----------
    message:
        What went wrong, in one sentence.
    file:
        The file or directory involved, if any.
    key:
        The tensor key (or argument name) involved, if any.
    fix:
        What the user can do about it.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        key: Any = None,
        fix: str | None = None,
    ) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.key = key
        self.fix = fix
        super().__init__(self._format())

    def _format(self) -> str:
        lines = [self.message]
        if self.file is not None:
            lines.append(f"  file: {self.file}")
        if self.key is not None:
            lines.append(f"  key:  {_format_key(self.key)}")
        if self.fix is not None:
            lines.append(f"  fix:  {self.fix}")
        return "\n".join(lines)

    def __reduce__(self):  # keep errors picklable across processes (papermill, multiprocessing)
        return (_rebuild, (type(self), self.message, self.file, self.key, self.fix))


def _rebuild(cls, message, file, key, fix):
    return cls(message, file=file, key=key, fix=fix)


def _format_key(key: Any) -> str:
    if isinstance(key, dict):
        return " ".join(f"{k}={v}" for k, v in key.items())
    return str(key)


class CaptureError(WorkbenchError):
    """A capture directory or one of its files cannot be read or written."""


class IncompleteCaptureError(CaptureError):
    """The directory has no manifest.json: the capture was never committed."""


class ManifestError(CaptureError):
    """manifest.json is malformed (bad JSON, missing or wrong-typed fields)."""


class FormatVersionError(ManifestError):
    """The manifest names a format or version this workbench cannot read."""


class ShardError(CaptureError):
    """A shard listed in the manifest is missing, truncated or not valid safetensors."""


class ChecksumError(ShardError):
    """A shard's sha256 or size differs from the manifest."""


class UnsafePathError(CaptureError):
    """A path in a manifest or dump leaves the capture directory."""


class DuplicateKeyError(CaptureError):
    """Two tensors share the same (rank, step, layer, op, name) key."""


class KeyNotFoundError(CaptureError, KeyError):
    """No tensor (or more than one) matches the requested key."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self._format()


class UnsafeFileError(CaptureError):
    """A file holds something other than tensors (for example a pickled object)."""


class ImporterError(CaptureError):
    """An importer cannot turn a dump into a capture."""


class FileNameError(ImporterError):
    """A dump file name does not follow the expected pattern."""


class CaptureBudgetError(CaptureError):
    """The recorder reached its byte cap."""


class CaptureLockedError(CaptureError):
    """Another CaptureWriter holds the capture's lock."""


class DiskFullError(CaptureError):
    """The file system ran out of space while a capture was written (nothing was committed)."""


class KernelArgumentError(WorkbenchError, ValueError):
    """A kernel argument has the wrong rank, shape, dtype or device."""


class BackendUnavailableError(WorkbenchError, RuntimeError):
    """The requested kernel backend cannot run here; the message says why."""


class UnknownBackendError(WorkbenchError, ValueError):
    """No backend of that name is registered for the kernel family."""


class PolicyError(WorkbenchError, ValueError):
    """A numerics policy knob has an unknown name or an invalid value."""


class GateError(WorkbenchError, AssertionError):
    """A notebook gate (a recorded check) failed."""


class ParameterError(WorkbenchError, ValueError):
    """A notebook parameter is unknown, malformed or of the wrong type."""


class NotebookError(WorkbenchError):
    """A notebook cannot be run (missing, not a notebook, no parameters cell)."""


class NotebookFailure(WorkbenchError):
    """A notebook ran and failed: a cell raised, a gate is false, no gate was recorded, the
    kernel died or its report could not be written.

    Attributes
    ----------
    notebook: the notebook (path relative to the repository)
    cell: 1-based index of the failing cell in the stored notebook (None: not a cell's fault)
    ename, evalue: the exception's type name and message
    source: the first line of the failing cell
    gates: the names of the gates whose check is false
    stage: where it failed: "execute", "gates" or "export"
    """

    def __init__(self, message: str, *, notebook: str, cell: int | None = None, ename: str = "",
                 evalue: str = "", source: str = "", gates: list[str] | None = None, stage: str = "execute",
                 execution_count: int | None = None, fix: str | None = None) -> None:
        super().__init__(message, file=notebook, key=None if cell is None else f"cell {cell}",
                         fix=fix or ("open the report at that cell" if cell else "see the report"))
        self.notebook, self.cell, self.ename, self.evalue = notebook, cell, ename, evalue
        self.source, self.gates, self.stage, self.execution_count = source, list(gates or []), stage, execution_count

    def to_dict(self) -> dict:
        """The ``error`` entry of results.json."""
        return {"cell": self.cell, "execution_count": self.execution_count, "ename": self.ename,
                "evalue": self.evalue, "source": self.source, "gates": self.gates, "stage": self.stage}


class AnalysisError(WorkbenchError, ValueError):
    """An analysis cannot run on the given arguments (no matching tensors, mismatched captures,
    an op without a replay adapter, ...); the message names the argument and the fix."""


class GraftError(AnalysisError):
    """A re-run cannot graft an override (a key the run never produces, a shape it does not
    have, a tensor the model reads before recording it); the message names the key and the fix."""


class DimsError(CaptureError):
    """A tensor layout spec (``dims``) that does not parse, or does not fit its tensor."""


class ClusterError(WorkbenchError, RuntimeError):
    """A dask scheduler that cannot be reached, or a cluster that cannot be started."""
