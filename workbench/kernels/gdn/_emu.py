"""What the two emulated CUDA builds (:mod:`~workbench.kernels.gdn.cuda_emu` for the scalar
kernels, :mod:`~workbench.kernels.gdn.mma_emu` for the tensor-core path) share around
``ext.launch``: they take CPU tensors, and a launch that fails says why the emulation stopped it
(a barrier never reached, a bad shared-memory size, ...)."""

from __future__ import annotations

import contextlib
import ctypes

import torch

from workbench.errors import KernelArgumentError, WorkbenchError

__all__ = ["require_cpu", "explained", "bind_failure"]


def require_cpu(*tensors) -> None:
    """Refuse CUDA tensors (the emulation runs on the host)."""
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        raise KernelArgumentError("q: the emulation takes CPU tensors", key="q",
                                  fix="run the CUDA build (backend='ext') on CUDA tensors")


def bind_failure(lib: ctypes.CDLL) -> None:
    """Type the build's ``wb_emu_last_failure`` (why this thread's last launch failed, "" if none)."""
    lib.wb_emu_last_failure.argtypes, lib.wb_emu_last_failure.restype = [], ctypes.c_char_p


@contextlib.contextmanager
def explained(lib: ctypes.CDLL):
    """Within: a workbench error raised by a launch of ``lib`` is raised again, the same type, file,
    key and fix, with the emulation's reason added to its message (where it gave one)."""
    try:
        yield
    except WorkbenchError as e:
        why = (lib.wb_emu_last_failure() or b"").decode()
        if not why:
            raise
        raise type(e)(f"{e.message}; emulation: {why}", file=e.file, key=e.key, fix=e.fix) from e
