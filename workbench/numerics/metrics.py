"""The one comparison primitive of the workbench.

:func:`compare` reports, for two tensors of the same shape, the same fields everywhere: relative L2,
max abs error and where, mean abs, cosine, SQNR, ULP distance in a given format, the fraction
outside ``atol + rtol*|a|`` and NaN/Inf counts on each side. ``a`` is the reference (control,
oracle); ``b`` the candidate.

One fused pass in float64 (numba, parallel over both cores) reads each element once, straight from
memory-mapped captures, so comparing gigabytes costs no more memory than the tensors' pages.
ULP distances are exact integers (uint64: fp64 distances across signs exceed int64), histogrammed
exactly up to 255 ULP and by powers of two above, so the median is exact whenever it is below
256 ULP.

Each thread walks its block in L1-sized sub-blocks: a bit-identical sub-block costs one vectorised
sum of squares; otherwise a vectorised pass (float sums reassociated, never assuming finiteness)
gives the sums and counts, a sub-block holding a NaN/Inf is redone element by element, the ULP
pass runs only where a sub-block differs, and the sub-block is rescanned for the argmax only when
its maximum beats the running one. ``max_abs_index`` is the first index (row-major) of the maximum.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numba
import numpy as np
import torch
from numba.core import types
from numba.core.extending import overload
from numba.cpython.unsafe.numbers import leading_zeros, viewer

from workbench.errors import KernelArgumentError
from workbench.numerics.dtypes import canonical, fmt

__all__ = ["Comparison", "compare", "compare_batch", "as_numpy_bits", "FIELDS", "BATCH_MAX"]

_EXACT_BINS = 256
# Below this many elements a single thread beats waking numba's pool (which costs milliseconds
# per call on a loaded machine, and captures hold thousands of small tensors).
_PARALLEL_MIN = 1 << 20
_NBINS = _EXACT_BINS + 64
_BLOCK = 1 << 16

# stats vector layout
_N, _SA2, _SB2, _SAB, _SD2, _SAD, _MAXD, _ARG, _OUT, _NANA, _NANB, _INFA, _INFB, _MAXU, _NDIFF, _NBOTH, _NMIS = range(17)
_NSTATS = 17


@dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare`; ``str()`` gives the one fixed line format.

    Errors are measured over elements finite on both sides; ``n_nonfinite_mismatch`` counts the
    elements where exactly one side is NaN/Inf or the two Infs differ.
    """

    numel: int
    shape: tuple
    dtype: str
    rel_l2: float
    max_abs: float
    max_abs_index: tuple | None
    mean_abs: float
    cosine: float
    sqnr_db: float
    max_ulp: int
    median_ulp: float
    frac_outside: float
    n_diff: int
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    n_nonfinite_mismatch: int
    atol: float = 0.0
    rtol: float = 0.0
    ref_norm: float = field(default=0.0, repr=False)

    @property
    def bitwise_equal(self) -> bool:
        """True when every element has the same value (NaN equal to NaN)."""
        return self.n_diff == 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["max_abs_index"] = list(self.max_abs_index) if self.max_abs_index is not None else None
        d["bitwise_equal"] = self.bitwise_equal
        return d

    def __str__(self) -> str:
        where = "" if self.max_abs_index is None else f"@{list(self.max_abs_index)}"
        return (
            f"rel_l2={self.rel_l2:.3e} max_abs={self.max_abs:.3e}{where} mean_abs={self.mean_abs:.3e} "
            f"cos={self.cosine:.8f} sqnr={self.sqnr_db:.1f}dB ulp[{self.dtype}] max={self.max_ulp} "
            f"med={self.median_ulp:g} out={self.frac_outside:.3e} diff={self.n_diff}/{self.numel} "
            f"nan={self.nan_a}/{self.nan_b} inf={self.inf_a}/{self.inf_b}"
        )


FIELDS = [
    "rel_l2", "max_abs", "mean_abs", "cosine", "sqnr_db", "max_ulp", "median_ulp",
    "frac_outside", "n_diff", "nan_a", "nan_b", "inf_a", "inf_b", "n_nonfinite_mismatch",
]


def _lut(kind: str) -> np.ndarray:
    bits = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        if kind == "bf16":
            return (bits << 16).view(np.float32).astype(np.float64)
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)


_LUTS: dict[str, np.ndarray] = {}


def _decoder(kind: str):
    """What the kernel decodes ``kind`` with: None for native floats, an empty float32 marker
    for bf16 (decoded by shifting its bits into a float32), the float64 table for fp16."""
    if kind == "bf16":
        return _BF16_MARK
    if kind == "fp16":
        return _get_lut(kind)
    return None


_BF16_MARK = np.empty(0, dtype=np.float32)


def _get_lut(kind: str) -> np.ndarray:
    if kind not in _LUTS:
        _LUTS[kind] = _lut(kind)
    return _LUTS[kind]


_SUB = 2048  # elements per sub-block: both arms' bits and the bin scratch stay in L1
_HCOPIES = 4  # histogram copies, so runs of equal bins do not serialise on one counter


def _load(v, lut, i):  # pragma: no cover - replaced by the overload below inside numba
    raise NotImplementedError


@overload(_load, inline="always")
def _load_impl(v, lut, i):
    """Element ``i`` as float64: native floats convert; bf16 bits (``lut`` a float32 marker)
    shift into float32; fp16 bits go through the float64 table."""
    if lut is None or isinstance(lut, types.NoneType):
        return lambda v, lut, i: np.float64(v[i])
    if lut.dtype == types.float32:
        return lambda v, lut, i: np.float64(viewer(np.uint32(np.uint32(v[i]) << np.uint32(16)), np.float32))
    return lambda v, lut, i: lut[v[i]]


@numba.njit(inline="always")
def _ordered(bits, signbit):
    # monotone integer image of a float's bits: adjacent floats differ by 1, +0 and -0 coincide
    mag = np.int64(bits) & (signbit - 1)
    if np.int64(bits) & signbit:
        return -mag
    return mag


@numba.njit(inline="always")
def _ulp(ba, sa, bb, sb):
    # exact |ordered(a) - ordered(b)| as uint64 (fp64 distances reach 2**64 - 2)
    oa = _ordered(ba, sa)
    ob = _ordered(bb, sb)
    if oa >= ob:
        return np.uint64(oa) - np.uint64(ob)
    return np.uint64(ob) - np.uint64(oa)


@numba.njit(inline="always")
def _bin(u):
    # exact bins below 256, then one bin per power of two: [2**k, 2**(k+1)) -> 248 + k
    if u < np.uint64(_EXACT_BINS):
        return np.int64(u)
    return np.int64(_EXACT_BINS - 8 + 63) - np.int64(leading_zeros(u))


@numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _sums(va, luta, vb, lutb, atol, rtol, runmax):
    """Vectorised sums over the (sub-block) slices ``va``, ``vb``; valid only when every element is finite on both sides:
    a NaN or Inf makes ``sa2`` or ``sb2`` non-finite, and the caller redoes the sub-block."""
    sa2 = 0.0
    sb2 = 0.0
    sab = 0.0
    sd2 = 0.0
    sad = 0.0
    nout = 0
    ndiff = 0
    ngt = 0
    for i in range(va.shape[0]):  # from 0: no negative-index wraparound, so no gathers
        x = _load(va, luta, i)
        y = _load(vb, lutb, i)
        sa2 += x * x
        sb2 += y * y
        sab += x * y
        d = abs(y - x)
        sd2 += d * d
        sad += d
        ne = x != y
        nout += (d > atol + rtol * abs(x)) & ne
        ndiff += ne
        ngt += d > runmax
    return sa2, sb2, sab, sd2, sad, nout, ndiff, ngt


@numba.njit(nogil=True, cache=True)
def _n_equal_bits(ia, ib):
    n = 0
    for i in range(ia.shape[0]):
        n += ia[i] == ib[i]
    return n


@numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _sq(va, luta):
    """Sum of squares, vectorised; non-finite exactly when some element is NaN/Inf."""
    s = 0.0
    for i in range(va.shape[0]):
        x = _load(va, luta, i)
        s += x * x
    return s


@numba.njit(nogil=True, cache=True)
def _ulp_bins(ia, sa, ib, sb, bins):
    maxu = np.uint64(0)
    for i in range(ia.shape[0]):
        u = _ulp(ia[i], sa, ib[i], sb)
        if u > maxu:
            maxu = u
        bins[i] = _bin(u)
    return maxu


@numba.njit(nogil=True, cache=True)
def _scatter(bins, m, h):
    m4 = m - m % 4
    for j in range(0, m4, 4):
        h[0, bins[j]] += 1
        h[1, bins[j + 1]] += 1
        h[2, bins[j + 2]] += 1
        h[3, bins[j + 3]] += 1
    for j in range(m4, m):
        h[0, bins[j]] += 1


@numba.njit(nogil=True, cache=True)
def _range_stats(va, ia, luta, sa, vb, ib, lutb, sb, atol, rtol, lo, hi, same_bits, s, hist):
    """The statistics of elements ``lo:hi`` into ``s`` (a stats vector) and ``hist`` (the ULP
    histogram, added to); returns the largest ULP distance. One block of :func:`_kernel`, and one
    small tensor of :func:`_batch_kernel`: the same arithmetic either way."""
    h = np.zeros((_HCOPIES, _NBINS), dtype=np.int64)
    bins = np.empty(_SUB, dtype=np.int16)
    sa2 = 0.0
    sb2 = 0.0
    sab = 0.0
    sd2 = 0.0
    sad = 0.0
    maxd = -1.0
    arg = -1
    nout = 0
    nana = 0
    nanb = 0
    infa = 0
    infb = 0
    maxu = np.uint64(0)
    ndiff = 0
    nboth = 0
    nmis = 0
    for s_lo in range(lo, hi, _SUB):
        s_hi = min(hi, s_lo + _SUB)
        if same_bits and _n_equal_bits(ia[s_lo:s_hi], ib[s_lo:s_hi]) == s_hi - s_lo:
            # bit-identical sub-block (common before a divergence): one sum decides it
            a2 = _sq(va[s_lo:s_hi], luta)
            if a2 - a2 == 0.0:
                sa2 += a2
                sb2 += a2
                sab += a2
                nboth += s_hi - s_lo
                h[0, 0] += s_hi - s_lo
                continue
        runmax = max(maxd, 0.0)
        a2, b2, ab, d2, ad, no, nd, ngt = _sums(va[s_lo:s_hi], luta, vb[s_lo:s_hi], lutb, atol, rtol, runmax)
        if a2 - a2 == 0.0 and b2 - b2 == 0.0:
            # every element finite on both sides (or the fast path overflowed: see below)
            sa2 += a2
            sb2 += b2
            sab += ab
            sd2 += d2
            sad += ad
            nout += no
            ndiff += nd
            nboth += s_hi - s_lo
            if ngt > 0:
                # the first index of the sub-block's maximum, if it beats the running one
                for i in range(s_lo, s_hi):
                    d = abs(_load(vb, lutb, i) - _load(va, luta, i))
                    if d > runmax:
                        runmax = d
                        maxd = d
                        arg = i
            if nd > 0:
                mu = _ulp_bins(ia[s_lo:s_hi], sa, ib[s_lo:s_hi], sb, bins)
                if mu > maxu:
                    maxu = mu
                _scatter(bins, s_hi - s_lo, h)
            else:
                h[0, 0] += s_hi - s_lo
            continue
        # a NaN/Inf (or a square overflowing float64): the careful element-wise path
        for i in range(s_lo, s_hi):
            x = _load(va, luta, i)
            y = _load(vb, lutb, i)
            fx = x - x == 0.0
            fy = y - y == 0.0
            if fx and fy:
                nboth += 1
                sa2 += x * x
                sb2 += y * y
                sab += x * y
                if x == y:
                    h[0, 0] += 1
                    continue
                ndiff += 1
                d = abs(y - x)
                sd2 += d * d
                sad += d
                if d > maxd:
                    maxd = d
                    arg = i
                if d > atol + rtol * abs(x):
                    nout += 1
                u = _ulp(ia[i], sa, ib[i], sb)
                if u > maxu:
                    maxu = u
                h[0, _bin(u)] += 1
            else:
                if x != x:
                    nana += 1
                elif not fx:
                    infa += 1
                if y != y:
                    nanb += 1
                elif not fy:
                    infb += 1
                same = (x != x and y != y) or (x == y)
                if not same:
                    nout += 1
                    ndiff += 1
                    nmis += 1
    for c in range(_HCOPIES):
        for k in range(_NBINS):
            hist[k] += h[c, k]
    s[_N] = max(hi - lo, 0)
    s[_SA2] = sa2
    s[_SB2] = sb2
    s[_SAB] = sab
    s[_SD2] = sd2
    s[_SAD] = sad
    s[_MAXD] = maxd
    s[_ARG] = arg
    s[_OUT] = nout
    s[_NANA] = nana
    s[_NANB] = nanb
    s[_INFA] = infa
    s[_INFB] = infb
    s[_NDIFF] = ndiff
    s[_NBOTH] = nboth
    s[_NMIS] = nmis
    return maxu


@numba.njit(parallel=True, nogil=True, cache=True)
def _kernel(va, ia, luta, sa, vb, ib, lutb, sb, atol, rtol, n_blocks, same_bits):
    n = va.shape[0]
    stats = np.zeros((n_blocks, _NSTATS), dtype=np.float64)
    hist = np.zeros((n_blocks, _NBINS), dtype=np.int64)
    maxus = np.zeros(n_blocks, dtype=np.uint64)  # ULP counts exceed float64's exact integers
    block = (n + n_blocks - 1) // n_blocks
    for blk in numba.prange(n_blocks):
        lo = blk * block
        hi = min(n, lo + block)
        maxus[blk] = _range_stats(va, ia, luta, sa, vb, ib, lutb, sb, atol, rtol, lo, hi, same_bits,
                                  stats[blk], hist[blk])
    return stats, hist, maxus


@numba.njit(nogil=True, cache=True)
def _median_of(hist):
    """:func:`_hist_median` inside numba (the same integer arithmetic)."""
    total = 0
    for k in range(hist.shape[0]):
        total += hist[k]
    if total == 0:
        return 0.0
    half = (total + 1) // 2
    c = 0
    for k in range(hist.shape[0]):
        c += hist[k]
        if c >= half:
            if k < _EXACT_BINS:
                return float(k)
            return float(2 ** (k - _EXACT_BINS + 8))
    return 0.0


@numba.njit(parallel=True, nogil=True, cache=True)
def _batch_kernel(va, ia, luta, sa, vb, ib, lutb, sb, atol, rtol, offa, offb, ns):
    """Many small tensors of one format in one call: pair ``p`` is ``va[offa[p]:offa[p] + ns[p]]``
    against ``vb[offb[p]:...]``, each one block of :func:`_range_stats` (as :func:`compare` runs a
    tensor of at most ``_BLOCK`` elements), pairs spread over the threads."""
    m = ns.shape[0]
    stats = np.zeros((m, _NSTATS), dtype=np.float64)
    maxus = np.zeros(m, dtype=np.uint64)
    medians = np.zeros(m, dtype=np.float64)
    for p in numba.prange(m):
        hist = np.zeros(_NBINS, dtype=np.int64)
        a0 = offa[p]
        b0 = offb[p]
        n = ns[p]
        maxus[p] = _range_stats(va[a0:a0 + n], ia[a0:a0 + n], luta, sa, vb[b0:b0 + n], ib[b0:b0 + n], lutb, sb,
                                atol, rtol, 0, n, True, stats[p], hist)
        medians[p] = _median_of(hist)
    return stats, maxus, medians


# formats the batched path reads straight from a shard: storage dtype of the values, of the bits
_BATCH_VIEWS = {"fp32": (np.float32, np.int32), "fp64": (np.float64, np.int64),
                "bf16": (np.uint16, np.uint16), "fp16": (np.uint16, np.uint16)}
BATCH_MAX = _BLOCK  # tensors of at most this many elements are one block: batched exactly as compare() runs them


def compare_batch(buf_a: np.ndarray, offs_a, buf_b: np.ndarray, offs_b, ns, shapes, kind: str, *,
                  atol: float = 1e-5, rtol: float = 1e-3) -> dict[str, np.ndarray]:
    """:func:`compare` of many small same-format tensors at once, as columns.

    ``buf_a``/``buf_b`` are flat arrays of one storage format (bf16/fp16 as uint16 bits, fp32,
    fp64: e.g. a whole memory-mapped shard viewed as that format); pair ``p`` is the ``ns[p]``
    elements from element ``offs_a[p]`` of ``buf_a`` against those from ``offs_b[p]`` of
    ``buf_b``, of shape ``shapes[p]``, and at most :data:`BATCH_MAX` elements. ULPs are counted
    in ``kind``. Returns one array per field of :class:`Comparison` (``max_abs_index`` an object
    array of tuples or None, plus ``ref_norm``), each value the one :func:`compare` gives.
    """
    vt, it = _BATCH_VIEWS[kind]
    va, vb = buf_a.view(vt), buf_b.view(vt)
    ia, ib = va.view(it), vb.view(it)
    offs_a = np.ascontiguousarray(offs_a, dtype=np.int64)
    offs_b = np.ascontiguousarray(offs_b, dtype=np.int64)
    ns = np.ascontiguousarray(ns, dtype=np.int64)
    if len(ns) and int(ns.max()) > BATCH_MAX:
        raise KernelArgumentError(f"compare_batch: tensors of at most {BATCH_MAX} elements, got {int(ns.max())}",
                                  key="ns", fix="compare larger tensors one by one with compare()")
    luta = _decoder(kind)
    sign = _SIGN[kind]
    st, maxu, med = _batch_kernel(va, ia, luta, sign, vb, ib, luta, sign, float(atol), float(rtol),
                                  offs_a, offs_b, ns)
    return finish_batch(st, maxu, med, ns, shapes, kind, atol, rtol)


def finish_batch(st, maxu, median, ns, shapes, kind, atol, rtol) -> dict[str, np.ndarray]:
    """:func:`_finish` over rows of one-block statistics, vectorised (the same formulas)."""
    n = np.asarray(ns, dtype=np.int64)
    sa2, sb2, sab, sd2, sad = (st[:, i] for i in (_SA2, _SB2, _SAB, _SD2, _SAD))
    nboth = st[:, _NBOTH]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(sa2 > 0, np.sqrt(sd2 / np.where(sa2 > 0, sa2, 1.0)), np.where(sd2 == 0, 0.0, np.inf))
        pos = (sa2 > 0) & (sb2 > 0)
        cos = np.where(pos, sab / np.sqrt(np.where(pos, sa2 * sb2, 1.0)), np.where(sa2 == sb2, 1.0, 0.0))
        # math.log10 per row, as _finish does: numpy's SIMD log10 may differ from libm's by an ULP on
        # some CPUs (seen on an AVX-512 EPYC), and the bulk path must give the one-by-one values
        ratio = np.where(sa2 > 0, sa2, 1.0) / np.where(sd2 > 0, sd2, 1.0)
        logs = np.fromiter((math.log10(x) for x in ratio.tolist()), dtype=np.float64, count=len(ratio))
        sqnr = np.where(sd2 == 0, np.inf, np.where(sa2 > 0, 10.0 * logs, -np.inf))
        mean = np.where(nboth > 0, sad / np.where(nboth > 0, nboth, 1.0), 0.0)
        frac = np.where(n > 0, st[:, _OUT] / np.where(n > 0, n, 1), 0.0)
    maxd = st[:, _MAXD]
    max_abs = np.where(maxd > 0, maxd, 0.0)
    where = np.empty(len(n), dtype=object)
    for p in np.flatnonzero(maxd > 0).tolist():
        shp = shapes[p]
        where[p] = tuple(int(v) for v in np.unravel_index(int(st[p, _ARG]), shp)) if len(shp) else ()
    return {
        "rel_l2": rel, "max_abs": max_abs, "max_abs_index": where, "mean_abs": mean, "cosine": cos,
        "sqnr_db": sqnr, "max_ulp": maxu, "median_ulp": median,
        "frac_outside": frac, "n_diff": st[:, _NDIFF].astype(np.int64), "nan_a": st[:, _NANA].astype(np.int64),
        "nan_b": st[:, _NANB].astype(np.int64), "inf_a": st[:, _INFA].astype(np.int64),
        "inf_b": st[:, _INFB].astype(np.int64), "n_nonfinite_mismatch": st[:, _NMIS].astype(np.int64),
        "ref_norm": np.sqrt(sa2),
    }


def as_numpy_bits(x) -> tuple[np.ndarray, str]:
    """A flat numpy view of a CPU tensor/array without copying, and its canonical format.

    bf16 and fp16 come back as uint16 bit patterns; other float dtypes as themselves. Non-float
    dtypes are converted to float64 (a copy).
    """
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().reshape(-1)
        if t.dtype in (torch.bfloat16, torch.float16):
            return t.view(torch.int16).numpy().view(np.uint16), canonical(t.dtype)
        if t.dtype in (torch.float32, torch.float64):
            return t.numpy(), canonical(t.dtype)
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return t.to(torch.float32).numpy(), "fp32"
        return t.to(torch.float64).numpy(), "fp64"
    a = np.ascontiguousarray(x).reshape(-1)
    if a.dtype == np.float16:
        return a.view(np.uint16), "fp16"
    if a.dtype in (np.float32, np.float64):
        return a, canonical(a.dtype)
    return a.astype(np.float64), "fp64"


_INT_VIEW = {"fp64": np.int64, "fp32": np.int32, "bf16": np.uint16, "fp16": np.uint16}
_SIGN = {"fp64": np.int64(-(2**63)), "fp32": np.int64(2**31), "bf16": np.int64(2**15), "fp16": np.int64(2**15)}


def _bits_in(values: np.ndarray, kind: str, target: str) -> np.ndarray:
    """Integer bits of the values rounded (RNE, by torch) to ``target``."""
    if kind == target:
        return values.view(_INT_VIEW[kind]) if kind in ("fp32", "fp64") else values
    if kind in ("bf16", "fp16"):
        t = torch.from_numpy(values.view(np.int16)).view(torch.bfloat16 if kind == "bf16" else torch.float16)
    else:
        t = torch.from_numpy(values)
    td = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[target]
    r = t.to(td)
    if target in ("bf16", "fp16"):
        return r.view(torch.int16).numpy().view(np.uint16)
    return r.numpy().view(_INT_VIEW[target])


def _coarser(ka: str, kb: str) -> str:
    order = {"fp64": 3, "fp32": 2, "fp16": 1, "bf16": 0}
    return ka if order[ka] <= order[kb] else kb


def compare(a, b, *, dtype=None, atol: float = 1e-5, rtol: float = 1e-3,
            chunk: int = 1 << 24) -> Comparison:
    """Compare candidate ``b`` against reference ``a``.

    Parameters
    ----------
    a, b: tensors or arrays of the same shape, any float dtype (bf16/fp16/fp32/fp64), on any
        device (non-CPU tensors are copied to the CPU). Two integer (or bool) inputs are
        compared exactly as integers (``dtype`` "int": ``max_ulp`` is the largest |a - b|, so
        2**53 and 2**53 + 1 differ); an integer against a float is compared as float64.
    dtype: format in which ULP distances are counted ("bf16", "fp16", "fp32", "fp64"); by default
        the coarser of the two inputs' formats. Values are rounded (RNE) to it for the ULP count.
    atol, rtol: an element is "outside" when ``|b - a| > atol + rtol * |a|``.
    chunk: elements per pass when a conversion is needed (bounds memory); native layouts are
        read in one pass without copies.

    Returns
    -------
    Comparison

    Example
    -------
    >>> import torch
    >>> c = compare(torch.ones(4), torch.tensor([1.0, 1.0, 1.0, 1.5]), dtype="fp32")
    >>> c.max_abs, c.max_abs_index, c.max_ulp
    (0.5, (3,), 4194304)
    """
    shape_a = tuple(a.shape)
    shape_b = tuple(b.shape)
    if shape_a != shape_b:
        raise KernelArgumentError(
            f"compare: shapes differ, a {list(shape_a)} vs b {list(shape_b)}", key="b",
            fix="compare tensors of the same shape (reshape or slice first)",
        )
    ia, ib = _as_integers(a), _as_integers(b)
    if ia is not None and ib is not None:
        return _compare_integers(ia, ib, shape_a, atol, rtol)
    va, ka = as_numpy_bits(a)
    vb, kb = as_numpy_bits(b)
    ulp = canonical(dtype) if dtype is not None else _coarser(ka, kb)
    if ulp not in _INT_VIEW:
        raise KernelArgumentError(
            f"compare: ULP format must be one of {sorted(_INT_VIEW)}, got {dtype!r}", key="dtype",
            fix="pass dtype='bf16', 'fp16', 'fp32' or 'fp64'",
        )
    luta = _decoder(ka)
    lutb = _decoder(kb)
    sign = _SIGN[ulp]
    n = va.shape[0]
    blocks = max(1, min(256, (n + _BLOCK - 1) // _BLOCK))
    native = ka == ulp and kb == ulp
    step = n if native or n == 0 else chunk
    prev_threads = numba.get_num_threads()
    if n < _PARALLEL_MIN:
        numba.set_num_threads(1)  # thread-local; restored below
    try:
        parts = _run_chunks(va, ka, vb, kb, ulp, luta, lutb, sign, n, step, blocks, atol, rtol, native)
    finally:
        numba.set_num_threads(prev_threads)
    stats_parts, hist_parts, maxu_parts = parts
    st = np.concatenate(stats_parts) if stats_parts else np.zeros((0, _NSTATS))
    hist = np.concatenate(hist_parts).sum(axis=0) if hist_parts else np.zeros(_NBINS, np.int64)
    max_ulp = int(np.concatenate(maxu_parts).max()) if maxu_parts else 0
    return _finish(st, hist, max_ulp, n, shape_a, ulp, atol, rtol)


def _run_chunks(va, ka, vb, kb, ulp, luta, lutb, sign, n, step, blocks, atol, rtol, native):
    stats_parts, hist_parts, maxu_parts = [], [], []
    for lo in range(0, max(n, 1), max(step, 1)):
        hi = min(n, lo + step)
        sa, sb = va[lo:hi], vb[lo:hi]
        ia = _bits_in(sa, ka, ulp)
        ib = _bits_in(sb, kb, ulp)
        nb = max(1, min(blocks, (hi - lo + _BLOCK - 1) // _BLOCK))
        st, hi_, mu = _kernel(sa, ia, luta, sign, sb, ib, lutb, sign, float(atol), float(rtol), nb, native)
        # block-local argmax indices are relative to the chunk
        st[:, _ARG] = np.where(st[:, _ARG] >= 0, st[:, _ARG] + lo, -1)
        stats_parts.append(st)
        hist_parts.append(hi_)
        maxu_parts.append(mu)
    return stats_parts, hist_parts, maxu_parts


def _as_integers(x) -> np.ndarray | None:
    """A flat int64/uint64 numpy view of an integer or bool tensor/array, else None."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex:
            return None
        t = x.detach().cpu().contiguous().reshape(-1)
        if t.dtype == torch.uint64:
            return t.view(torch.int64).numpy().view(np.uint64)
        return t.to(torch.int64).numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iub":
        return None
    a = np.ascontiguousarray(a).reshape(-1)
    return a.astype(np.uint64) if a.dtype == np.uint64 else a.astype(np.int64)


def _compare_integers(a: np.ndarray, b: np.ndarray, shape, atol, rtol) -> Comparison:
    """Integers (token ids, indices, positions) compared exactly: 2**53 and 2**53 + 1 differ.

    ``max_ulp`` is the largest exact |a - b| (one integer step is one unit); the float fields are
    computed from the exact differences in float64.
    """
    n = a.shape[0]
    if a.dtype != b.dtype:  # int64 vs uint64: compare in Python integers (rare, small)
        a, b = a.astype(object), b.astype(object)
        d = np.array([abs(int(x) - int(y)) for x, y in zip(a, b)], dtype=object)
        dmax = int(max(d, default=0))
        df = d.astype(np.float64)
        af = a.astype(np.float64)
        bf = b.astype(np.float64)
    else:
        # |a - b| exactly, as uint64: the modular difference of the larger minus the smaller
        hi, lo = np.maximum(a, b), np.minimum(a, b)
        du = hi.astype(np.uint64) - lo.astype(np.uint64) if a.dtype != np.uint64 else hi - lo
        dmax = int(du.max()) if n else 0
        df = du.astype(np.float64)
        af, bf = a.astype(np.float64), b.astype(np.float64)
    ne = df > 0
    ndiff = int(ne.sum())
    sa2, sb2, sab, sd2 = float(af @ af), float(bf @ bf), float(af @ bf), float(df @ df)
    if ndiff:
        j = int(np.argmax(df))
        max_idx = tuple(int(v) for v in np.unravel_index(j, shape)) if shape else ()
    else:
        max_idx = None
    rel = (math.sqrt(sd2 / sa2) if sa2 > 0 else (0.0 if sd2 == 0 else math.inf))
    cos = sab / math.sqrt(sa2 * sb2) if sa2 > 0 and sb2 > 0 else (1.0 if sa2 == sb2 else 0.0)
    sqnr = math.inf if sd2 == 0 else (10.0 * math.log10(sa2 / sd2) if sa2 > 0 else -math.inf)
    out = int((ne & (df > atol + rtol * np.abs(af))).sum())
    median = float(np.median(df)) if n else 0.0
    return Comparison(
        numel=int(n), shape=tuple(int(v) for v in shape), dtype="int", rel_l2=rel, max_abs=float(dmax),
        max_abs_index=max_idx, mean_abs=float(df.mean()) if n else 0.0, cosine=float(cos), sqnr_db=float(sqnr),
        max_ulp=dmax, median_ulp=median, frac_outside=out / n if n else 0.0, n_diff=ndiff,
        nan_a=0, nan_b=0, inf_a=0, inf_b=0, n_nonfinite_mismatch=0, atol=float(atol), rtol=float(rtol),
        ref_norm=math.sqrt(sa2),
    )


def _finish(st, hist, max_ulp, n, shape, ulp, atol, rtol) -> Comparison:
    tot = st.sum(axis=0) if len(st) else np.zeros(_NSTATS)
    sa2, sb2, sab, sd2, sad = (float(tot[i]) for i in (_SA2, _SB2, _SAB, _SD2, _SAD))
    nboth = int(tot[_NBOTH])
    if len(st) and st[:, _MAXD].max() >= 0:
        j = int(np.argmax(st[:, _MAXD]))
        max_abs = float(st[j, _MAXD])
        max_idx = tuple(int(v) for v in np.unravel_index(int(st[j, _ARG]), shape)) if shape else ()
        if max_abs == 0.0:
            max_idx = None
    else:
        max_abs, max_idx = 0.0, None
    if sa2 > 0:
        rel = math.sqrt(sd2 / sa2)
    else:
        rel = 0.0 if sd2 == 0 else math.inf
    cos = sab / math.sqrt(sa2 * sb2) if sa2 > 0 and sb2 > 0 else (1.0 if sa2 == sb2 else 0.0)
    sqnr = math.inf if sd2 == 0 else (10.0 * math.log10(sa2 / sd2) if sa2 > 0 else -math.inf)
    median = _hist_median(hist)
    ndiff = int(tot[_NDIFF])
    return Comparison(
        numel=int(n), shape=tuple(int(s) for s in shape), dtype=ulp, rel_l2=rel, max_abs=max_abs,
        max_abs_index=max_idx, mean_abs=sad / nboth if nboth else 0.0, cosine=float(cos),
        sqnr_db=float(sqnr), max_ulp=max_ulp,
        median_ulp=median, frac_outside=float(tot[_OUT]) / n if n else 0.0, n_diff=ndiff,
        nan_a=int(tot[_NANA]), nan_b=int(tot[_NANB]), inf_a=int(tot[_INFA]), inf_b=int(tot[_INFB]),
        n_nonfinite_mismatch=int(tot[_NMIS]),
        atol=float(atol), rtol=float(rtol), ref_norm=math.sqrt(sa2),
    )


def _hist_median(hist: np.ndarray) -> float:
    total = int(hist.sum())
    if total == 0:
        return 0.0
    half = (total + 1) // 2
    c = np.cumsum(hist)
    b = int(np.searchsorted(c, half))
    if b < _EXACT_BINS:
        return float(b)
    return float(2 ** (b - _EXACT_BINS + 8))  # lower bound of a power-of-two bucket
