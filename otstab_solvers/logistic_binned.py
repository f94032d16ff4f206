"""Where to look for the dual's ``h``: the logistic dual on binned margins.

When every sample shares one price ``c`` (a linear model, no per-sample directions), the
logistic d-transform ``l_h`` depends on a sample only through its margin ``m``, smoothly
(:mod:`otstab_solvers.logistic_uniform`). The dual's objective and derivative are means of
``l_h(m_i)`` and of the loss at the maximiser over the samples' margins; replacing the ``n``
margins by ``K`` weighted representatives (two points per each of ``K`` equal-width bins that
match the mean and variance of its margins, :func:`binned_margins`) changes the mean of a
smooth function of the margins by terms of the third and higher central moments of the bins
(``O(width^3)`` at most, ``O(width^4)`` where the density of the margins is smooth), so the
root ``h_c`` of the binned dual lies close to the exact root. :func:`binned_guess` returns
it, at a cost of ``O(K)`` per evaluation instead of ``O(n)`` Newton solves.

``h_c`` only chooses where the exact dual is evaluated: the exact search
(:func:`otstab_solvers.dual.solve_dual` with ``bracket`` and ``h_init``) starts there and
stops on its own criterion, so a poor guess costs evaluations, never accuracy.

This module imports neither otstab nor Dask.
"""

from __future__ import annotations

import math

import numpy as np

from .dual import solve_dual
from .result import OPTIMAL
from .smooth import LogisticOracle

__all__ = ["binned_margins", "binned_root", "binned_guess", "BINS", "MIN_N"]

#: number of equal-width bins of the margins
BINS = 1 << 12
#: below this many samples the exact search runs alone (binning saves nothing there)
MIN_N = 1 << 16
#: rows per block of the binning passes
_BLOCK = 1 << 16


def binned_margins(margins_of, n: int, p=None, bins: int = BINS):
    """``(points, mass)``: two points per non-empty bin of ``bins`` equal-width bins over
    ``[min m, max m]``, the bin's mean margin plus and minus its standard deviation, each with
    half the bin's probability mass (``mass`` sums to 1): a two-point rule that matches the
    first two moments of each bin (module docstring). ``margins_of(s, e)`` returns the
    margins of rows ``s..e`` (read twice, in blocks: no n-vector is made); ``p``: the sample
    probabilities (None: uniform)."""
    lo, hi = math.inf, -math.inf
    for s in range(0, n, _BLOCK):
        m = margins_of(s, min(s + _BLOCK, n))
        lo, hi = min(lo, float(m.min())), max(hi, float(m.max()))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("the margins must be finite")
    width = (hi - lo) / bins
    scale = 1.0 / width if width > 0 else 0.0
    count, first, second = np.zeros(bins), np.zeros(bins), np.zeros(bins)
    for s in range(0, n, _BLOCK):
        e = min(s + _BLOCK, n)
        m = margins_of(s, e)
        k = np.subtract(m, lo)
        k *= scale
        idx = k.astype(np.intp)
        np.minimum(idx, bins - 1, out=idx)
        k -= idx
        k -= 0.5  # the offset from the bin's centre, in bin widths (no cancellation)
        w = None if p is None else p[s:e]
        count += np.bincount(idx, weights=w, minlength=bins)
        if w is not None:
            k *= w
        first += np.bincount(idx, weights=k, minlength=bins)
        k *= k if w is None else k / np.where(w > 0, w, 1.0)
        second += np.bincount(idx, weights=k, minlength=bins)
    keep = count > 0
    count, first, second = count[keep], first[keep], second[keep]
    centre = lo + (np.flatnonzero(keep) + 0.5) * width
    mean = first / count
    sd = np.sqrt(np.maximum(second / count - mean * mean, 0.0)) * width
    mean = centre + mean * width
    points = np.clip(np.concatenate([mean - sd, mean + sd]), lo, hi)
    mass = np.concatenate([count, count])
    order = np.argsort(points, kind="stable")
    return points[order], mass[order] / mass.sum()


def binned_root(points, mass, direction_norm2: float, theta1: float, r: float, theta2: float,
                divergence: str) -> float | None:
    """The root of the logistic dual on weighted margins ``points`` (probabilities ``mass``,
    e.g. from :func:`binned_margins`), or None when that dual has no positive root (r at or
    below its base risk, or the search failed)."""
    oracle = LogisticOracle(points, direction_norm2, theta1)
    sol = solve_dual(oracle, r, theta2, divergence, p=mass, tol=1e-12)
    if sol.status != OPTIMAL or not (sol.h > 0.0 and math.isfinite(sol.h)):
        return None
    return float(sol.h)


def binned_guess(margins_of, n: int, direction_norm2: float, theta1: float, r: float,
                 theta2: float, divergence: str, p=None, bins: int = BINS) -> float | None:
    """The root ``h_c`` of the logistic dual on the binned margins (:func:`binned_margins`,
    :func:`binned_root`), or None: the caller then searches the exact dual from scratch."""
    points, mass = binned_margins(margins_of, n, p, bins)
    return binned_root(points, mass, direction_norm2, theta1, r, theta2, divergence)
