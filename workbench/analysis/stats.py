"""Paired statistics: is a difference between two arms more than noise?

- Paired binary outcomes (N cases, pass/fail per arm): discordant counts, the exact McNemar test
  (two-sided binomial test of the discordant pairs against p = 1/2) and intervals for the paired
  difference of proportions: Newcombe's hybrid score interval (1998, methods 10 and 11, without
  and with continuity correction), Tango's score interval (1998), the exact conditional interval
  (Clopper-Pearson on the discordant pairs) and Wald for reference; :func:`match_interval` finds
  which method and table reproduce an interval a write-up reports.
- Paired timing blocks (ABBA ...): the ratio candidate/control with a confidence interval, either a
  t-interval on the per-block log ratios (the ratio is then a geometric mean of per-block ratios)
  or a percentile bootstrap over blocks of the ratio of means (fixed seed).
- A/A: the same analysis of the control against itself gives the noise band a difference must beat.

No scipy at run time: the binomial tail is summed exactly in integers and the Student t quantile is
found by bisection on the regularized incomplete beta function (tests check both against scipy).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from statistics import NormalDist
from typing import Sequence

import numpy as np
import xarray as xr

from workbench.errors import KernelArgumentError

__all__ = ["mcnemar_exact", "newcombe_paired_ci", "tango_paired_ci", "exact_conditional_paired_ci", "wald_paired_ci",
           "PAIRED_CI_METHODS", "paired_intervals", "match_interval", "parse_reported", "describe_match", "paired_binary", "paired_binary_table", "read_outcomes", "paired_timing",
           "abba_blocks", "aa_comparison", "t_quantile"]


# ---------------------------------------------------------------------------------------------
# distributions


def _betacf(a: float, b: float, x: float) -> float:
    # continued fraction of the incomplete beta function (modified Lentz)
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (bisection to 1e-12).

    Example
    -------
    >>> round(t_quantile(0.975, 7), 6)
    2.364624
    """
    if not 0.0 < q < 1.0 or not df > 0:
        raise KernelArgumentError(f"t_quantile needs 0 < q < 1 and df > 0, got q={q}, df={df}", key="q",
                                  fix="pass a probability strictly between 0 and 1 and positive df")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------------------------------------
# paired binary outcomes


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts ``b`` and ``c``.

    The two-sided binomial test of ``b`` successes in ``b + c`` trials with p = 1/2:
    ``min(1, 2 P(X <= min(b, c)))``, summed exactly in integers (1.0 when there are no
    discordant pairs).

    Example
    -------
    >>> round(mcnemar_exact(7, 4), 6)
    0.548828
    """
    b, c = _count("b", b), _count("c", c)
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2 ** n)
    return float(min(Fraction(1), 2 * tail))


def _count(name, v) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
        raise KernelArgumentError(f"{name} must be a non-negative int count, got {v!r}", key=name,
                                  fix=f"pass {name} as the number of pairs")
    return int(v)


def _wilson(x: int, n: int, z: float) -> tuple[float, float]:
    p = x / n
    den = 1.0 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def newcombe_paired_ci(n11: int, n10: int, n01: int, n00: int, *, confidence: float = 0.95,
                       continuity: bool = False) -> tuple[float, float]:
    """Newcombe's hybrid score interval (1998, paired paper) for p_candidate - p_control.

    ``n11``: both pass; ``n10``: control passes, candidate fails; ``n01``: control fails,
    candidate passes; ``n00``: both fail. Method 10 (``continuity=False``): the Wilson intervals of
    both pass rates combined ("square and add") with Newcombe's estimate of their correlation,
    phi with numerator ``max(n11 n00 - n10 n01 - N/2, 0)`` when the association is positive and
    ``n11 n00 - n10 n01`` when negative. Method 11 (``continuity=True``): the same with
    continuity-corrected Wilson intervals (wider, conservative).

    Example
    -------
    >>> lo, hi = newcombe_paired_ci(47, 5, 2, 10)           # 52/64 -> 49/64
    >>> round(lo, 4), round(hi, 4)
    (-0.1376, 0.0416)
    """
    n11, n10, n01, n00 = _table(n11, n10, n01, n00)
    n = n11 + n10 + n01 + n00
    z = _z(confidence)
    wilson = _wilson_cc if continuity else _wilson
    p1, p2 = (n11 + n01) / n, (n11 + n10) / n  # candidate, control
    l1, u1 = wilson(n11 + n01, n, z)
    l2, u2 = wilson(n11 + n10, n, z)
    den = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    num = n11 * n00 - n10 * n01
    # Newcombe's phi: a positive association is shrunk by N/2 (to 0 at most), a negative one is kept
    num = max(num - n / 2, 0.0) if num >= 0 else num
    phi = num / math.sqrt(den) if den > 0 else 0.0
    d = p1 - p2
    dl = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    du = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, d - dl), min(1.0, d + du)


def _wilson_cc(x: int, n: int, z: float) -> tuple[float, float]:
    # Wilson's score interval with continuity correction (Newcombe 1998, single proportion, method 4)
    p = x / n
    den = 2 * (n + z * z)
    lo = 0.0 if x == 0 else (2 * n * p + z * z - 1 - z * math.sqrt(max(0.0, z * z - 2 - 1 / n + 4 * p * (n * (1 - p) + 1)))) / den
    hi = 1.0 if x == n else (2 * n * p + z * z + 1 + z * math.sqrt(max(0.0, z * z + 2 - 1 / n + 4 * p * (n * (1 - p) - 1)))) / den
    return max(0.0, lo), min(1.0, hi)


def _table(n11, n10, n01, n00) -> tuple[int, int, int, int]:
    t = tuple(_count(k, v) for k, v in (("n11", n11), ("n10", n10), ("n01", n01), ("n00", n00)))
    if sum(t) == 0:
        raise KernelArgumentError("the table is empty (no pairs)", key="n11", fix="pass at least one pair")
    return t


def _z(confidence) -> float:
    _confidence(confidence)
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _root(f, lo: float, hi: float) -> float:
    # bisection for a sign change of f on [lo, hi] (f(lo) and f(hi) of opposite signs), to 1e-13
    flo = f(lo)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
        if hi - lo < 1e-13:
            break
    return 0.5 * (lo + hi)


def tango_paired_ci(n11: int, n10: int, n01: int, n00: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Tango's (1998) score interval for p_candidate - p_control from paired outcomes.

    The limits are the differences d0 at which the score statistic
    ``(n01 - n10 - N d0) / sqrt(N (2 q + d0 (1 - d0)))`` equals -z and +z, where q is the maximum
    likelihood estimate of the control-only cell probability under the constraint d = d0 (the root
    of a quadratic). Unlike Wald-type intervals it is defined when a discordant cell is 0.

    Example
    -------
    >>> lo, hi = tango_paired_ci(47, 5, 2, 10)
    >>> round(lo, 4), round(hi, 4)
    (-0.1451, 0.0422)
    """
    n11, n10, n01, n00 = _table(n11, n10, n01, n00)
    n = n11 + n10 + n01 + n00
    z = _z(confidence)
    x, y = n01, n10  # candidate only, control only

    def score(d0: float) -> float:
        b = -(x + y) + (2 * n - x + y) * d0
        c = -y * d0 * (1 - d0)
        q = (math.sqrt(max(0.0, b * b - 8 * n * c)) - b) / (4 * n)
        var = n * (2 * q + d0 * (1 - d0))
        return (x - y - n * d0) / math.sqrt(var) if var > 0 else math.copysign(math.inf, x - y - n * d0)

    est = (x - y) / n
    eps = 1e-12
    lo = -1.0 if est <= -1.0 else _root(lambda d: score(d) - z, -1.0 + eps, est)
    hi = 1.0 if est >= 1.0 else _root(lambda d: score(d) + z, est, 1.0 - eps)
    return lo, hi


def _beta_quantile(q: float, a: float, b: float) -> float:
    return _root(lambda x: _betainc(a, b, x) - q, 0.0, 1.0)


def exact_conditional_paired_ci(n11: int, n10: int, n01: int, n00: int, *,
                                confidence: float = 0.95) -> tuple[float, float]:
    """The exact conditional interval for p_candidate - p_control (as reviewed in Newcombe 1998, paired data).

    Given the ``m = n10 + n01`` discordant pairs, the candidate-only count is binomial(m, pi); the
    Clopper-Pearson interval [pi_L, pi_U] of pi maps to the difference as ``m (2 pi - 1) / N``. With
    no discordant pair the interval is [0, 0] (the method says nothing then; prefer the score
    intervals).

    Example
    -------
    >>> lo, hi = exact_conditional_paired_ci(47, 5, 2, 10)
    >>> round(lo, 4), round(hi, 4)
    (-0.1013, 0.0458)
    """
    n11, n10, n01, n00 = _table(n11, n10, n01, n00)
    n = n11 + n10 + n01 + n00
    _confidence(confidence)
    a = 1.0 - confidence
    m = n10 + n01
    if m == 0:
        return 0.0, 0.0
    pl = 0.0 if n01 == 0 else _beta_quantile(a / 2, n01, m - n01 + 1)
    pu = 1.0 if n01 == m else _beta_quantile(1 - a / 2, n01 + 1, m - n01)
    return m * (2 * pl - 1) / n, m * (2 * pu - 1) / n


def wald_paired_ci(n11: int, n10: int, n01: int, n00: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """The simple asymptotic (Wald) interval for p_candidate - p_control, for reference only (it
    collapses to a point with no discordant pair and overshoots near the bounds).

    Example
    -------
    >>> lo, hi = wald_paired_ci(47, 5, 2, 10)
    >>> round(lo, 4), round(hi, 4)
    (-0.1271, 0.0333)
    """
    n11, n10, n01, n00 = _table(n11, n10, n01, n00)
    n = n11 + n10 + n01 + n00
    d = (n01 - n10) / n
    se = math.sqrt(max(0.0, (n10 + n01) - (n01 - n10) ** 2 / n)) / n
    h = _z(confidence) * se
    return max(-1.0, d - h), min(1.0, d + h)


PAIRED_CI_METHODS = {
    "newcombe": ("Newcombe (1998) hybrid score interval, method 10 (Wilson intervals + phi correlation)",
                 lambda t, c: newcombe_paired_ci(*t, confidence=c)),
    "newcombe_cc": ("Newcombe (1998) hybrid score interval with continuity correction, method 11",
                    lambda t, c: newcombe_paired_ci(*t, confidence=c, continuity=True)),
    "tango": ("Tango (1998) score interval (constrained maximum likelihood)",
              lambda t, c: tango_paired_ci(*t, confidence=c)),
    "exact_conditional": ("exact conditional interval (Clopper-Pearson on the discordant pairs, mapped to the difference)",
                          lambda t, c: exact_conditional_paired_ci(*t, confidence=c)),
    "wald": ("simple asymptotic (Wald) interval, for reference", lambda t, c: wald_paired_ci(*t, confidence=c)),
}


def paired_intervals(n11: int, n10: int, n01: int, n00: int, *, confidence: float = 0.95) -> xr.Dataset:
    """Every paired interval of :data:`PAIRED_CI_METHODS` for the same table, side by side.

    Returns
    -------
    xarray.Dataset along ``interval`` (the method): ``ci_low``, ``ci_high``, ``width``, ``contains_zero``;
    scalar ``rate_diff``; attrs ``descriptions`` (method -> what it is).

    Example
    -------
    >>> ds = paired_intervals(47, 5, 2, 10)
    >>> ds.interval.values.tolist()
    ['newcombe', 'newcombe_cc', 'tango', 'exact_conditional', 'wald']
    """
    t = _table(n11, n10, n01, n00)
    _confidence(confidence)
    rows = [fn(t, confidence) for _, fn in PAIRED_CI_METHODS.values()]
    lo = np.array([r[0] for r in rows])
    hi = np.array([r[1] for r in rows])
    ds = xr.Dataset({"ci_low": ("interval", lo), "ci_high": ("interval", hi), "width": ("interval", hi - lo),
                     "contains_zero": ("interval", (lo <= 0.0) & (0.0 <= hi)),
                     "description": ("interval", [v[0] for v in PAIRED_CI_METHODS.values()]),
                     "rate_diff": (t[2] - t[1]) / sum(t)},
                    coords={"interval": list(PAIRED_CI_METHODS)})
    ds.attrs.update(analysis="paired_intervals", confidence=float(confidence), estimate="rate_diff", null=0.0,
                    ci_method="each standard paired method")
    return ds


_REPORTED = re.compile(
    r"^\s*(\d+)\s*/\s*(\d+)\s*(?:vs\.?|->|→|to)\s*(\d+)\s*/\s*(\d+)\s*:?\s*"
    r"\[\s*([-+]?\d*\.?\d+)\s*,\s*([-+]?\d*\.?\d+)\s*\]\s*(pp|%)?\s*$", re.IGNORECASE)


def parse_reported(text: str) -> dict:
    """Read a reported screen and interval, ``"51/64 vs 50/64: [-9.5612, +6.5981] pp"``.

    The first count is the control's passes, the second the candidate's, out of the same N. Limits
    with ``pp`` or ``%`` are percentage points, else proportions. Returns the keyword arguments of
    :func:`match_interval` plus ``low``/``high``.

    Example
    -------
    >>> parse_reported("51/64 vs 50/64: [-9.5612, +6.5981] pp")["high"]
    0.065981
    """
    m = _REPORTED.match(text or "")
    if not m:
        raise KernelArgumentError(f"cannot read the reported interval {text!r}", key="reported",
                                  fix="write it as 'CONTROL/N vs CANDIDATE/N: [LOW, HIGH] pp', e.g. "
                                      "'51/64 vs 50/64: [-9.5612, +6.5981] pp' (without pp: proportions)")
    pc, n1, pk, n2 = (int(m.group(i)) for i in range(1, 5))
    if n1 != n2:
        raise KernelArgumentError(f"paired arms must share N, got {n1} and {n2} in {text!r}", key="reported",
                                  fix="give both pass counts out of the same number of paired cases")
    scale = 100.0 if m.group(7) else 1.0
    low, high = float(m.group(5)) / scale, float(m.group(6)) / scale
    if not low <= high:
        raise KernelArgumentError(f"the reported interval is reversed in {text!r}", key="reported",
                                  fix="write the lower limit first")
    return {"n": n1, "pass_control": pc, "pass_candidate": pk, "low": round(low, 12), "high": round(high, 12)}


def match_interval(low: float, high: float, *, n: int, pass_control: int, pass_candidate: int,
                   confidence: float = 0.95, tol: float = 5e-5) -> xr.Dataset:
    """Which method and which table reproduce a reported interval?

    A write-up gives the pass counts of both arms and an interval on the difference, but not always
    the discordant cells. Every 2x2 table with those margins is enumerated (the control-only count
    runs over all values the margins allow) and every method of :data:`PAIRED_CI_METHODS` applied;
    ``reproduces`` marks the (table, method) pairs whose limits both lie within ``tol`` of
    ``low``/``high`` (proportions, so 5e-5 is 0.005 percentage points).

    Returns
    -------
    xarray.Dataset over ``table`` x ``interval`` (the method): ``ci_low``, ``ci_high``, ``error`` (the larger of
    the two limits' distances), ``reproduces``; ``control_only``/``candidate_only``/``both_pass``/
    ``neither`` per table; scalar ``any_reproduces``.
    """
    for k, v in (("n", n), ("pass_control", pass_control), ("pass_candidate", pass_candidate)):
        _count(k, v)
    if not (pass_control <= n and pass_candidate <= n):
        raise KernelArgumentError(f"pass counts {pass_control}, {pass_candidate} exceed n={n}", key="n",
                                  fix="pass the number of paired cases as n")
    tables = []
    for n10 in range(0, n + 1):
        n11 = pass_control - n10
        n01 = pass_candidate - n11
        n00 = n - n11 - n10 - n01
        if min(n11, n01, n00) >= 0:
            tables.append((n11, n10, n01, n00))
    lo = np.full((len(tables), len(PAIRED_CI_METHODS)), np.nan)
    hi = lo.copy()
    for i, t in enumerate(tables):
        for j, (_, fn) in enumerate(PAIRED_CI_METHODS.values()):
            lo[i, j], hi[i, j] = fn(t, confidence)
    err = np.maximum(abs(lo - low), abs(hi - high))
    arr = np.array(tables, dtype=np.int64).reshape(-1, 4)
    ds = xr.Dataset({"ci_low": (("table", "interval"), lo), "ci_high": (("table", "interval"), hi),
                     "error": (("table", "interval"), err), "reproduces": (("table", "interval"), err <= tol),
                     "both_pass": ("table", arr[:, 0]), "control_only": ("table", arr[:, 1]),
                     "candidate_only": ("table", arr[:, 2]), "neither": ("table", arr[:, 3])},
                    coords={"table": np.arange(len(tables)), "interval": list(PAIRED_CI_METHODS)})
    ds["any_reproduces"] = bool(ds.reproduces.any())
    ds.attrs.update(analysis="match_interval", target=[float(low), float(high)], tol=float(tol),
                    confidence=float(confidence))
    return ds


def _confidence(confidence):
    if not isinstance(confidence, (int, float)) or not 0.0 < confidence < 1.0:
        raise KernelArgumentError(f"confidence must be in (0, 1), got {confidence!r}", key="confidence",
                                  fix="pass confidence=0.95")


def paired_binary_table(n11: int, n10: int, n01: int, n00: int, *, confidence: float = 0.95,
                        alpha: float = 0.05, interval: str = "newcombe") -> xr.Dataset:
    """:func:`paired_binary` from the 2x2 table of pairs (see :func:`newcombe_paired_ci`)."""
    n11, n10, n01, n00 = _table(n11, n10, n01, n00)
    n = n11 + n10 + n01 + n00
    if interval not in PAIRED_CI_METHODS:
        raise KernelArgumentError(f"unknown interval {interval!r}", key="interval",
                                  fix=f"pass one of {', '.join(PAIRED_CI_METHODS)}")
    _confidence(confidence)
    lo, hi = PAIRED_CI_METHODS[interval][1]((n11, n10, n01, n00), confidence)
    p = mcnemar_exact(n10, n01)
    ds = xr.Dataset(
        {
            "table": (("control", "candidate"), np.array([[n11, n10], [n01, n00]], dtype=np.int64)),
            "n": n, "pass_control": n11 + n10, "pass_candidate": n11 + n01,
            "rate_control": (n11 + n10) / n, "rate_candidate": (n11 + n01) / n,
            "control_only": n10, "candidate_only": n01, "discordant": n10 + n01,
            "rate_diff": (n01 - n10) / n, "ci_low": lo, "ci_high": hi, "p_value": p,
            "significant": p < alpha,
        },
        coords={"control": ["pass", "fail"], "candidate": ["pass", "fail"]},
    )
    ds["rate_diff"].attrs["units"] = "proportion (candidate - control)"
    ds.attrs.update(analysis="paired_binary", kind="binary", estimate="rate_diff", null=0.0, confidence=float(confidence),
                    alpha=float(alpha),
                    test="exact McNemar: two-sided binomial test of control_only vs candidate_only pairs, p = 1/2",
                    ci_method=PAIRED_CI_METHODS[interval][0], interval=interval)
    return ds


def paired_binary(control: Sequence[bool], candidate: Sequence[bool], *, confidence: float = 0.95,
                  alpha: float = 0.05, interval: str = "newcombe") -> xr.Dataset:
    """Paired pass/fail outcomes of two arms on the same N cases.

    Parameters
    ----------
    control, candidate: ``[N]`` bool (or 0/1), case i of both arms is one pair
    confidence: level of the interval on the difference in pass rates
    alpha: significance level of the McNemar test (``significant = p_value < alpha``)
    interval: the method of ``ci_low``/``ci_high``, a key of :data:`PAIRED_CI_METHODS`

    Returns
    -------
    xarray.Dataset: ``table[control, candidate]`` (pass/fail counts of the pairs), ``n``,
    ``pass_*``, ``rate_*``, ``control_only`` / ``candidate_only`` (discordant counts), ``rate_diff``
    (candidate - control rate), ``ci_low``/``ci_high`` (``interval``), ``p_value`` (exact McNemar),
    ``significant``; ``outcome[case, arm]``.

    Example
    -------
    >>> a = [1] * 47 + [1] * 5 + [0] * 2 + [0] * 10         # 52/64 pass
    >>> b = [1] * 47 + [0] * 5 + [1] * 2 + [0] * 10         # 49/64 pass
    >>> ds = paired_binary(a, b)
    >>> int(ds.control_only), int(ds.candidate_only), round(float(ds.p_value), 6)
    (5, 2, 0.453125)
    """
    a, b = _bools("control", control), _bools("candidate", candidate)
    if a.shape != b.shape:
        raise KernelArgumentError(f"control and candidate must pair up case by case: {a.shape[0]} vs {b.shape[0]} "
                                  "outcomes", key="candidate", fix="pass one outcome per case for both arms")
    ds = paired_binary_table(int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum()), int((~a & ~b).sum()),
                             confidence=confidence, alpha=alpha, interval=interval)
    return ds.assign(outcome=(("case", "arm"), np.stack([a, b], -1))).assign_coords(
        case=np.arange(a.shape[0]), arm=["control", "candidate"])


def describe_match(m: xr.Dataset) -> str:
    """A sentence on a :func:`match_interval` result: which methods and tables reproduce the
    reported interval, or how far the nearest one is."""
    lo_t, hi_t = m.attrs["target"]
    head = (f"reported [{100 * lo_t:+.4f}, {100 * hi_t:+.4f}] pp ({int(100 * m.attrs['confidence'])}%): ")
    err = m.error.values
    if bool(m.any_reproduces):
        hits = [f"{m.interval.values[j]} at {int(m.control_only[i])} control-only vs {int(m.candidate_only[i])} "
                f"candidate-only pairs" for i, j in zip(*np.nonzero(m.reproduces.values))]
        return head + "reproduced by " + "; ".join(hits)
    i, j = np.unravel_index(int(np.nanargmin(err)), err.shape)
    return (head + f"no method of {m.sizes['interval']} reproduces it on any of the {m.sizes['table']} tables with "
            f"those margins (within {100 * m.attrs['tol']:.3g} pp); nearest: {m.interval.values[j]} at "
            f"{int(m.control_only[i])} vs {int(m.candidate_only[i])} discordant pairs, "
            f"[{100 * float(m.ci_low[i, j]):+.4f}, {100 * float(m.ci_high[i, j]):+.4f}] pp, {100 * err[i, j]:.3f} pp off")


_TRUE = {"1", "true", "pass", "passed", "yes", "y", "t", "ok", "correct"}
_FALSE = {"0", "false", "fail", "failed", "no", "n", "f", "wrong", "incorrect"}


def read_outcomes(path, *, control: str = "control", candidate: str = "candidate") -> tuple[np.ndarray, np.ndarray]:
    """Per-case pass/fail outcomes of two arms from a file: CSV (or TSV) with one row per case and
    columns ``control`` and ``candidate`` (names as given), or JSON, either
    ``{"control": [...], "candidate": [...]}`` or a list of ``{"control": .., "candidate": ..}``
    records. Values: 1/0, true/false, pass/fail, yes/no (any case).

    Returns ``(control [N] bool, candidate [N] bool)``; a missing file, column or an unreadable
    value is a KernelArgumentError naming the file, the column and the row.
    """
    import json
    from pathlib import Path

    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise KernelArgumentError(f"outcomes file {p} does not exist", key="outcomes", file=p,
                                  fix="pass a CSV with columns control,candidate (one row per case)")
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text())
            df = pd.DataFrame(data if isinstance(data, list) else {k: list(v) for k, v in data.items()})
        else:
            df = pd.read_csv(p, sep=None, engine="python", dtype=str)
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise KernelArgumentError(f"cannot read outcomes from {p}: {e}", key="outcomes", file=p,
                                  fix="write a CSV with a header row naming the columns control,candidate") from None
    out = []
    for col in (control, candidate):
        if col not in df.columns:
            raise KernelArgumentError(f"{p} has no column {col!r}; it has {list(df.columns)}", key=col, file=p,
                                      fix="name the arms' columns with control=/candidate= (paired_stats: "
                                          "-p control_column / -p candidate_column)")
        vals = []
        for i, v in enumerate(df[col].tolist()):
            t = str(v).strip().lower()
            if t in _TRUE or t in _FALSE:
                vals.append(t in _TRUE)
            else:
                raise KernelArgumentError(f"{p}: row {i + 1} of column {col!r} is {v!r}, not a pass/fail outcome", key=col,
                                          file=p, fix="write 1/0, true/false or pass/fail")
        out.append(np.array(vals, dtype=bool))
    if not len(out[0]):
        raise KernelArgumentError(f"{p} holds no cases", key="outcomes", file=p, fix="one row per case")
    return out[0], out[1]


def _bools(name, v) -> np.ndarray:
    a = np.asarray(v)
    if a.ndim != 1 or a.size == 0 or not (a.dtype == bool or np.isin(a, (0, 1)).all()):
        raise KernelArgumentError(f"{name} must be a non-empty 1-D sequence of bools (or 0/1), got shape {a.shape}",
                                  key=name, fix=f"pass {name} = [True, False, ...], one per case")
    return a.astype(bool)


# ---------------------------------------------------------------------------------------------
# paired timing


def abba_blocks(times: Sequence[float], *, pattern: str = "ABBA") -> tuple[np.ndarray, np.ndarray]:
    """Split a flat sequence of timings run in repeated ``pattern`` blocks into the two arms.

    Returns ``(control [blocks, reps], candidate [blocks, reps])``; "A" is the control.

    Example
    -------
    >>> a, b = abba_blocks([1.0, 2.0, 2.2, 1.1, 1.0, 2.1, 2.0, 0.9])
    >>> a.tolist(), b.tolist()
    ([[1.0, 1.1], [1.0, 0.9]], [[2.0, 2.2], [2.1, 2.0]])
    """
    t = np.asarray(times, dtype=np.float64).ravel()
    if not pattern or set(pattern) != {"A", "B"}:
        raise KernelArgumentError(f"pattern must use both letters A and B, got {pattern!r}", key="pattern",
                                  fix="pass pattern='ABBA'")
    if t.size == 0 or t.size % len(pattern):
        raise KernelArgumentError(f"times must hold whole {pattern} blocks: {t.size} values is not a multiple "
                                  f"of {len(pattern)}", key="times", fix="drop the incomplete last block")
    blocks = t.reshape(-1, len(pattern))
    lab = np.array(list(pattern))
    return blocks[:, lab == "A"], blocks[:, lab == "B"]


def paired_timing(control, candidate, *, confidence: float = 0.95, method: str = "log_t", n_boot: int = 10000,
                  seed: int = 0) -> xr.Dataset:
    """Ratio candidate / control of paired timings, with a confidence interval.

    Parameters
    ----------
    control, candidate: ``[blocks]`` or ``[blocks, reps]`` positive times (block i of both arms
        ran together, e.g. one ABBA block; see :func:`abba_blocks`)
    method: ``"log_t"``: t-interval on the per-block log ratios log(mean_B / mean_A),
        exponentiated (the ratio is the geometric mean of the per-block ratios); ``"bootstrap"``:
        percentile bootstrap over blocks of mean(candidate) / mean(control), ``n_boot`` resamples,
        ``seed`` fixed (reproducible)

    Returns
    -------
    xarray.Dataset: ``ratio``, ``ci_low``, ``ci_high``, ``significant`` (the interval excludes
    1), ``block_ratio[block]``, ``mean_control``, ``mean_candidate``.

    Example
    -------
    >>> ds = paired_timing([1.00, 1.02, 0.99, 1.01], [1.10, 1.11, 1.09, 1.12])
    >>> round(float(ds.ratio), 3), bool(ds.significant)
    (1.1, True)
    """
    a, b = _times("control", control), _times("candidate", candidate)
    if a.shape[0] != b.shape[0]:
        raise KernelArgumentError(f"control and candidate need the same number of blocks, got {a.shape[0]} and "
                                  f"{b.shape[0]}", key="candidate", fix="pair the timings block by block")
    _confidence(confidence)
    ma, mb = a.mean(1), b.mean(1)
    r = np.log(mb / ma)
    n = r.size
    if method == "log_t":
        if n < 2:
            raise KernelArgumentError("log_t needs at least 2 blocks", key="control", fix="run more blocks")
        est = float(np.exp(r.mean()))
        half = t_quantile(0.5 + confidence / 2, n - 1) * r.std(ddof=1) / math.sqrt(n)
        lo, hi = float(np.exp(r.mean() - half)), float(np.exp(r.mean() + half))
        desc = "t-interval on per-block log ratios log(mean_candidate / mean_control), exponentiated (geometric mean)"
    elif method == "bootstrap":
        est = float(mb.mean() / ma.mean())
        idx = np.random.default_rng(seed).integers(0, n, size=(int(n_boot), n))
        boots = mb[idx].mean(1) / ma[idx].mean(1)
        lo, hi = (float(v) for v in np.quantile(boots, [0.5 - confidence / 2, 0.5 + confidence / 2]))
        desc = f"percentile bootstrap over blocks of mean(candidate)/mean(control), n_boot={int(n_boot)}, seed={seed}"
    else:
        raise KernelArgumentError(f"method must be 'log_t' or 'bootstrap', got {method!r}", key="method",
                                  fix="pass method='log_t' or method='bootstrap'")
    ds = xr.Dataset(
        {"ratio": est, "ci_low": lo, "ci_high": hi, "significant": not (lo <= 1.0 <= hi),
         "block_ratio": ("block", np.exp(r)), "mean_control": float(ma.mean()), "mean_candidate": float(mb.mean()),
         "control": (("block", "rep_control"), a), "candidate": (("block", "rep_candidate"), b)},
        coords={"block": np.arange(n)},
    )
    ds["ratio"].attrs["units"] = "candidate time / control time"
    ds.attrs.update(analysis="paired_timing", kind="timing", estimate="ratio", null=1.0, confidence=float(confidence),
                    method=method, ci_method=desc, blocks=int(n))
    return ds


def _times(name, v) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.size == 0 or not np.isfinite(a).all() or (a <= 0).any():
        raise KernelArgumentError(f"{name} must be positive finite times [blocks] or [blocks, reps], got shape "
                                  f"{np.shape(v)}", key=name, fix=f"pass {name} as seconds per run, one row per block")
    return a


# ---------------------------------------------------------------------------------------------
# A/A


def aa_comparison(aa: xr.Dataset, ab: xr.Dataset) -> xr.Dataset:
    """Put an A/A result (control vs its repeat) beside the A/B result of the same analysis.

    ``aa`` and ``ab`` are two :func:`paired_binary` or two :func:`paired_timing` results. The A/A
    interval is the noise band: a difference must lie outside it, and the A/B interval must
    exclude the null (0 for a difference of rates, 1 for a ratio), to count as real.

    Returns
    -------
    xarray.Dataset along ``comparison`` ("A/A", "A/B"): ``estimate``, ``ci_low``, ``ci_high``;
    scalars ``noise_low``/``noise_high`` (the A/A interval), ``outside_noise``,
    ``excludes_null``, ``beats_noise`` (both).

    Example
    -------
    >>> aa = paired_timing([1.0, 1.01, 0.99, 1.0], [1.01, 1.0, 1.0, 0.99])
    >>> ab = paired_timing([1.0, 1.01, 0.99, 1.0], [1.2, 1.21, 1.19, 1.2])
    >>> bool(aa_comparison(aa, ab).beats_noise)
    True
    """
    for name, d in (("aa", aa), ("ab", ab)):
        if not isinstance(d, xr.Dataset) or d.attrs.get("analysis") not in ("paired_binary", "paired_timing"):
            raise KernelArgumentError(f"{name} must be a paired_binary or paired_timing result", key=name,
                                      fix=f"pass {name}=paired_timing(...) or paired_binary(...)")
    if aa.attrs["analysis"] != ab.attrs["analysis"]:
        raise KernelArgumentError(f"aa is a {aa.attrs['analysis']} result but ab is a {ab.attrs['analysis']} result",
                                  key="ab", fix="compare results of the same analysis")
    est = ab.attrs["estimate"]
    null = float(ab.attrs["null"])
    e_aa, e_ab = float(aa[est]), float(ab[est])
    nlo, nhi = float(aa.ci_low), float(aa.ci_high)
    outside = not (nlo <= e_ab <= nhi)
    excludes = not (float(ab.ci_low) <= null <= float(ab.ci_high))
    ds = xr.Dataset(
        {"estimate": ("comparison", [e_aa, e_ab]),
         "ci_low": ("comparison", [nlo, float(ab.ci_low)]), "ci_high": ("comparison", [nhi, float(ab.ci_high)]),
         "noise_low": nlo, "noise_high": nhi, "outside_noise": outside, "excludes_null": excludes,
         "beats_noise": outside and excludes},
        coords={"comparison": ["A/A", "A/B"]},
    )
    ds.attrs.update(analysis="aa_comparison", kind=ab.attrs["kind"], estimate=est, null=null,
                    ci_method=ab.attrs["ci_method"], confidence=float(ab.attrs["confidence"]),
                    rule="beats_noise: the A/B estimate lies outside the A/A interval and the A/B interval excludes the null")
    return ds
