"""Build and load the native (C++/CUDA) kernels of ``kernels/`` on first use.

The sources live in the repository's top-level ``kernels/<family>/`` folder (shipped inside the
package as ``workbench/_csrc`` when installed from a wheel). Element code is written once as
``__host__ __device__`` functions in headers; a CPU translation unit is compiled by the system C++
compiler and a CUDA one by nvcc. Both export ``extern "C"`` launchers that are called through
ctypes with raw pointers, so no torch extension toolchain (ninja, torch headers) is needed.

Builds are cached under ``$WORKBENCH_CACHE`` (default ``~/.cache/workbench``) keyed by the sha256
of the sources, flags and compiler version; a build is compiled into a temporary file and renamed
into place, under a file lock, so concurrent processes never load a half-written library.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from workbench.errors import BackendUnavailableError

__all__ = ["source_dir", "cache_dir", "find_cxx", "find_nvcc", "availability", "build", "load"]


def source_dir() -> Path:
    """Folder holding the native sources (``kernels/`` of the repository)."""
    here = Path(__file__).resolve()
    for cand in (here.parents[2] / "kernels", here.parents[1] / "_csrc"):
        if cand.is_dir():
            return cand
    raise BackendUnavailableError(
        "native kernel sources not found", file=here.parents[2] / "kernels",
        fix="install the workbench from a source checkout (pip install -e .)",
    )


def cache_dir() -> Path:
    root = Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "workbench"))
    d = root / "native"
    d.mkdir(parents=True, exist_ok=True)
    return d


@lru_cache(maxsize=None)
def find_cxx() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@lru_cache(maxsize=None)
def find_nvcc() -> str | None:
    cands = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cands.append(str(Path(home) / "bin" / "nvcc"))
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def availability() -> tuple[bool, str]:
    """``is_available()`` of an ext backend that builds for the CPU (g++) and for CUDA (nvcc)."""
    if find_cxx() is None and find_nvcc() is None:
        return False, "no C++ compiler (g++) and no nvcc found"
    return True, "native C++ (CPU tensors) / CUDA (GPU tensors, needs nvcc)"


@lru_cache(maxsize=None)
def _version(tool: str) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except Exception as e:  # pragma: no cover - broken toolchain
        return f"unknown ({e})"


def _command(kind: str, sources: list[Path], out: Path, flags: list[str]) -> list[str]:
    inc = [f"-I{source_dir()}"]
    if kind == "cpu":
        cxx = find_cxx()
        if cxx is None:
            raise BackendUnavailableError(
                "no C++ compiler found for the CPU build of the native kernels",
                fix="install g++ (Debian: apt-get install g++) or set CXX",
            )
        return [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off",
                *inc, *flags, *map(str, sources), "-o", str(out)]
    if kind == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise BackendUnavailableError(
                "nvcc not found for the CUDA build of the native kernels",
                fix="install the CUDA toolkit and put nvcc on PATH (or set NVCC / CUDA_HOME)",
            )
        arch = os.environ.get("WORKBENCH_CUDA_ARCH", "-gencode=arch=compute_90a,code=sm_90a")
        return [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--fmad=false",
                *arch.split(), *inc, *flags, *map(str, sources), "-o", str(out)]
    raise ValueError(f"kind must be 'cpu' or 'cuda', got {kind!r}")


def build(name: str, sources: list[str | Path], *, kind: str = "cpu", flags: list[str] | None = None,
          headers: list[str | Path] | None = None) -> Path:
    """Compile ``sources`` (relative to :func:`source_dir`) into a cached shared library.

    Returns the path of the library. Raises BackendUnavailableError with the compiler's output
    when the build fails.
    """
    flags = list(flags or [])
    src_root = source_dir()
    srcs = [src_root / s for s in sources]
    # every header of the tree counts, listed or not: a changed shared header (kernels/common/)
    # must never leave a stale library in the cache
    hdrs = sorted({*(src_root / h for h in (headers or [])), *src_root.rglob("*.h")})
    h = hashlib.sha256()
    for p in [*srcs, *hdrs]:
        h.update(str(p.relative_to(src_root)).encode())
        h.update(p.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(kind.encode())
    tool = find_cxx() if kind == "cpu" else find_nvcc()
    h.update(_version(tool or "").encode())
    h.update(os.environ.get("WORKBENCH_CUDA_ARCH", "").encode())
    out = cache_dir() / f"{name}-{kind}-{h.hexdigest()[:16]}.so"
    if out.exists():
        return out
    lock = cache_dir() / f".{out.name}.lock"
    with open(lock, "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        if out.exists():
            return out
        fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".so.tmp")
        os.close(fd)
        cmd = _command(kind, srcs, Path(tmp), flags)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            Path(tmp).unlink(missing_ok=True)
            raise BackendUnavailableError(
                f"building native {name} ({kind}) failed:\n$ {' '.join(cmd)}\n{proc.stderr[-4000:]}",
                file=srcs[0], fix="fix the compiler error above, or use another backend",
            )
        os.replace(tmp, out)
    return out


@lru_cache(maxsize=None)
def _load_cached(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path)


def load(name: str, sources: list[str | Path], *, kind: str = "cpu", flags: list[str] | None = None,
         headers: list[str | Path] | None = None) -> ctypes.CDLL:
    """Build (if needed) and load a native library with ctypes."""
    return _load_cached(str(build(name, sources, kind=kind, flags=flags, headers=headers)))
