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

from . import logistic_kernels, sorted_kernels
from .dual import solve_dual
from .result import OPTIMAL
from .smooth import LogisticOracle, _uniform_dtransform
from .weights import weights_at

__all__ = ["binned_margins", "binned_root", "binned_guess", "binned_solution", "BINS", "MIN_N",
           "KINK_ROUNDS"]

#: number of equal-width bins of the margins
BINS = 1 << 12
#: below this many samples the exact search runs alone (binning saves nothing there)
MIN_N = 1 << 16
#: rounds of chi2's bins at the edge of the active set given margin by margin
KINK_ROUNDS = 3
#: the relative half-width of the window around a guess of the binned root
NEAR_WINDOW = 1e-4
#: rows per block of the binning passes
_BLOCK = 1 << 16


class _Bins:
    """Per-bin sums of :func:`binned_margins`' equal-width bins over ``[lo, lo + bins
    width]``: P0-mass ``count``, and the sums of the offsets from the bin's centre (in bin
    widths) ``first`` and of their squares ``second``."""

    def __init__(self, margins_of, n: int, p, bins: int, rows=None):
        # (``rows``: the labels and scores whose products are the margins, for compiled
        # passes: logistic_kernels, numba, at least KERNEL_MIN_KEYS rows, no probabilities)
        fused = rows is not None and p is None and sorted_kernels.rows_ok(*rows) \
            and logistic_kernels.use_kernel(n)
        lo, hi = math.inf, -math.inf
        if fused:
            lo, hi = sorted_kernels.u_range(rows[0], rows[1], False)
        for s in range(0, 0 if fused else n, _BLOCK):
            m = margins_of(s, min(s + _BLOCK, n))
            lo, hi = min(lo, float(m.min())), max(hi, float(m.max()))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError("the margins must be finite")
        self.margins_of, self.n, self.p, self.bins = margins_of, n, p, bins
        self.lo, self.hi = lo, hi
        self.width = width = (hi - lo) / bins
        self.scale = 1.0 / width if width > 0 else 0.0
        count, first, second = np.zeros(bins), np.zeros(bins), np.zeros(bins)
        if fused:  # (per block, as the bincounts below: the same sums)
            part = np.zeros((3, bins))
            for s in range(0, n, _BLOCK):
                part[:] = 0.0
                logistic_kernels.bin_block(rows[0], rows[1], s, min(s + _BLOCK, n), lo,
                                           self.scale, *part)
                count += part[0]
                first += part[1]
                second += part[2]
        for s in range(0, 0 if fused else n, _BLOCK):
            e = min(s + _BLOCK, n)
            k, idx = self._position(margins_of(s, e))
            k -= 0.5  # the offset from the bin's centre, in bin widths (no cancellation)
            w = None if p is None else p[s:e]
            count += np.bincount(idx, weights=w, minlength=bins)
            if w is not None:
                k *= w
            first += np.bincount(idx, weights=k, minlength=bins)
            k *= k if w is None else k / np.where(w > 0, w, 1.0)
            second += np.bincount(idx, weights=k, minlength=bins)
        self.count, self.first, self.second = count, first, second
        self.total = float(count.sum())

    def _position(self, m):
        """``(offset within the bin in widths, bin index)`` of margins ``m``."""
        k = np.subtract(m, self.lo)
        k *= self.scale
        idx = k.astype(np.intp)
        np.minimum(idx, self.bins - 1, out=idx)
        k -= idx
        return k, idx

    def points(self, exact=None):
        """``(points, mass)`` (module docstring: two points per non-empty bin, ``mass``
        summing to 1); ``exact``: ``(bins, margins, mass)``, bins (boolean, per bin) whose
        margins are given one by one with their P0-mass instead."""
        keep = self.count > 0
        if exact is not None:
            keep &= ~exact[0]
        count, first, second = self.count[keep], self.first[keep], self.second[keep]
        width = self.width
        centre = self.lo + (np.flatnonzero(keep) + 0.5) * width
        mean = first / count
        sd = np.sqrt(np.maximum(second / count - mean * mean, 0.0)) * width
        mean = centre + mean * width
        points = np.clip(np.concatenate([mean - sd, mean + sd]), self.lo, self.hi)
        mass = np.concatenate([count, count])
        if exact is not None:
            points = np.concatenate([points, exact[1]])
            mass = np.concatenate([0.5 * mass, exact[2]])
        order = np.argsort(points, kind="stable")
        return points[order], mass[order] / mass.sum()

    def gather(self, sel):
        """``(margins, mass)`` of the samples in the bins ``sel`` (boolean, per bin): one read
        of the margins."""
        ms, ws = [], []
        # the candidates by value (the selected bins' span, padded), then their bins
        on = np.flatnonzero(sel)
        pad = 1e-9 * (abs(self.lo) + abs(self.hi) + self.width)
        a = self.lo + int(on[0]) * self.width - pad
        b = self.lo + (int(on[-1]) + 1) * self.width + pad
        for s in range(0, self.n, _BLOCK):
            e = min(s + _BLOCK, self.n)
            m = self.margins_of(s, e)
            near = m >= a
            near &= m <= b
            if not near.any():
                continue
            idx = np.flatnonzero(near)
            hit = sel[self._position(m[idx])[1]]
            if hit.any():
                idx = idx[hit]
                ms.append(m[idx])
                ws.append(np.ones(idx.size) if self.p is None else self.p[s:e][idx])
        if not ms:
            return np.empty(0), np.empty(0)
        return np.concatenate(ms), np.concatenate(ws)


class _PointsOracle(LogisticOracle):
    """The logistic oracle of the binned points (one price), each evaluation started from
    the steps of the last one when its ``h`` was within 10% (as the blocks of an oracle of
    scores are, :meth:`LogisticOracle.transform_rows`): the search's later points take one or
    two Halley steps instead of up to six from ``t = 0`` and the robust solve of the points
    those leave unconverged. A start only saves iterations: the lean solve's acceptance rules
    are unchanged."""

    def _eval(self, h: float):
        last = self._cache
        h = float(h)
        if last is not None and last[0] == h:
            return last[1]
        c0 = float(self.c[0])
        if last is not None and self.c.strides == (0,) and 0.0 < c0 < math.inf \
                and h > 0.0 and abs(h - last[0]) <= 0.1 * h:
            assert self._margins is not None
            out = _uniform_dtransform(self._margins, c0, h, start_t=last[1][3])
            self._cache = (h, out)
            return out
        return super()._eval(h)


def binned_margins(margins_of, n: int, p=None, bins: int = BINS):
    """``(points, mass)``: two points per non-empty bin of ``bins`` equal-width bins over
    ``[min m, max m]``, the bin's mean margin plus and minus its standard deviation, each with
    half the bin's probability mass (``mass`` sums to 1): a two-point rule that matches the
    first two moments of each bin (module docstring). ``margins_of(s, e)`` returns the
    margins of rows ``s..e`` (read twice, in blocks: no n-vector is made); ``p``: the sample
    probabilities (None: uniform)."""
    return _Bins(margins_of, n, p, bins).points()


def binned_root(points, mass, direction_norm2: float, theta1: float, r: float, theta2: float,
                divergence: str, near: float | None = None) -> float | None:
    """The root of the logistic dual on weighted margins ``points`` (probabilities ``mass``,
    e.g. from :func:`binned_margins`), or None when that dual has no positive root (r at or
    below its base risk, or the search failed). ``near``: a guess; the search runs in a
    window of :data:`NEAR_WINDOW` around it first, from scratch when the root is not there."""
    oracle = _PointsOracle(points, direction_norm2, theta1)
    sol = None
    if near is not None and near > 0.0 and math.isfinite(near):
        sol = solve_dual(oracle, r, theta2, divergence, p=mass, tol=1e-12, h_init=near,
                         bracket=(near * (1.0 - NEAR_WINDOW), near * (1.0 + NEAR_WINDOW)))
    if sol is None or sol.status != OPTIMAL:
        sol = solve_dual(oracle, r, theta2, divergence, p=mass, tol=1e-12)
    if sol.status != OPTIMAL or not (sol.h > 0.0 and math.isfinite(sol.h)):
        return None
    return float(sol.h)


def binned_guess(margins_of, n: int, direction_norm2: float, theta1: float, r: float,
                 theta2: float, divergence: str, p=None, bins: int = BINS) -> float | None:
    """The root ``h_c`` of the logistic dual on the binned margins (:func:`binned_margins`,
    :func:`binned_root`; chi2: with the bins at the edge of the active set given margin by
    margin, :func:`binned_solution`), or None: the caller then searches the exact dual from
    scratch."""
    return binned_solution(margins_of, n, direction_norm2, theta1, r, theta2, divergence, p,
                           bins)[0]


def binned_solution(margins_of, n: int, direction_norm2: float, theta1: float, r: float,
                    theta2: float, divergence: str, p=None, bins: int = BINS, rows=None):
    """``(h_c, alpha, (smallest, largest margin))``: :func:`binned_guess`'s root (None where
    there is none) and, for chi2 with a finite ``theta2``, the multiplier ``alpha`` of the
    binned dual there (the weights are ``((l_h + alpha) / (2 theta2) + 1)_+``; None
    otherwise).

    chi2's weights have a kink at the edge of the active set (a margin ``m*``: ``l_h`` does
    not increase with the margin): the two-point rule of the bin that holds it errs by the
    square of the bin's width (some 1e-8 of ``h`` at n = 1e6, against 1e-13 for a smooth
    summand). Those bins (with a neighbour on each side) are given margin by margin instead,
    gathered by one more read of the margins, and the root is solved again, up to
    :data:`KINK_ROUNDS` times until the edge lies among the exact margins. ``rows``: the
    labels and scores whose products are the margins (the binning's passes compiled,
    :mod:`otstab_solvers.logistic_kernels`, where numba is installed)."""
    binned = _Bins(margins_of, n, p, bins, rows)
    points, mass = binned.points()
    h = binned_root(points, mass, direction_norm2, theta1, r, theta2, divergence)
    span = (binned.lo, binned.hi)
    if h is None or divergence != "chi2" or not math.isfinite(theta2):
        return h, None, span
    sel = np.zeros(bins, dtype=bool)
    for rounds in range(KINK_ROUNDS + 1):
        lh = LogisticOracle(points, direction_norm2, theta1).evaluate(h)[0]
        w, alpha = weights_at(lh, theta2, "chi2", mass)  # (alpha at this h, these points)
        act = np.flatnonzero(w > 0)
        if rounds == KINK_ROUNDS or not act.size or act[-1] + 1 >= points.size:
            break  # (no more rounds, or no edge inside the margins)
        ends = binned._position(points[act[-1]:act[-1] + 2])[1]
        near = np.zeros(bins, dtype=bool)
        near[max(int(ends.min()) - 1, 0):int(ends.max()) + 2] = True
        near &= binned.count > 0
        if not np.any(near & ~sel):  # the edge lies among the exact margins
            break
        sel |= near
        m_ex, p_ex = binned.gather(sel)
        points, mass = binned.points((sel, m_ex, p_ex))
        h_new = binned_root(points, mass, direction_norm2, theta1, r, theta2, divergence,
                            near=h)
        if h_new is None:
            break
        h = h_new
    return h, alpha, span
