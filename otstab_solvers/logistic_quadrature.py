"""The logistic dual of many prices on one set of margins, by per-bin Chebyshev quadrature.

With one price ``c`` for every sample the logistic d-transform ``l_h`` is one function of the
margin ``m`` (:mod:`otstab_solvers.logistic_uniform`), analytic except at the switching point
of the band of two local maxima (``T = h / (2 c) > 4``). The exact dual at ``h`` needs sums
over the samples of smooth functions of the margin: ``e = exp(l_h / theta2 - M)``, ``e loss*``,
``e loss*^2``, ``e d2``, ``expm1(l_h / theta2 - M)`` and ``loss*`` for KL; ``l_h``, ``loss*``,
``d2`` for ``theta2 = inf``. ``feature_stability`` needs them for one price per feature on the
SAME margins (issue 31), so the margins are summarised once:

* the margins are sorted and cut into groups of consecutive margins, at equal counts
  (``BINS / 2`` groups: narrow bins where the margins are dense) and at ``BINS / 2`` equal
  widths over their range (no bin wider than that where they are sparse: outliers, heavy
  tails); a bin's interval is its own samples' smallest and largest margin, and it keeps its
  Chebyshev moments ``M_bk = sum_i T_k(x_i)`` (``x_i`` the sample's position in that
  interval, in ``[-1, 1]``), ``k = 0..DEGREE``;
* a function ``f`` is evaluated exactly (the per-sample solve,
  :func:`otstab_solvers.smooth.logistic_dtransform`) at the ``DEGREE + 1`` Chebyshev points of
  each bin; its interpolant ``sum_k a_bk T_k`` integrates against the moments exactly, so
  ``sum_i f(m_i)`` is ``sum_bk a_bk M_bk`` up to the interpolation error of each bin;
* that error is estimated, per bin, by ``N_b (|a_b,DEGREE-1| + |a_b,DEGREE|)`` (the last two
  coefficients: for a function analytic on a neighbourhood of the bin they decay faster than
  geometrically, and the interpolation error is below twice the sum of the dropped ones). The
  bins with the largest estimates are evaluated sample by sample (the exact pass, on their
  slice of the sorted margins) until what is left sums to at most :data:`RTOL` of each sum,
  with every bin that meets the band of two local maxima evaluated sample by sample in any
  case (``l_h`` has its kink there).

So each sum equals the exact pass's to within :data:`RTOL` (relative, by the estimate; the
exact pass's own rounding is some 1e-16 per term), at a cost of ``BINS (DEGREE + 1)`` exact
solves per price instead of ``n``. The reduction of the sums is the one of
:mod:`otstab_solvers.logistic_pass` (KL: log-sum-exp with the ``expm1`` sum where every
``l_h / theta2`` is close to the largest). chi2's weights ``(l_h - shift + alpha) / (2
theta2) + 1`` are positive on a prefix of the sorted margins (``l_h`` does not increase with
the margin): :meth:`MarginQuadrature.dual_at_chi2` finds ``alpha`` by the active-set steps of
:class:`otstab_solvers.blockwise.BlockwiseDual` on the bins' sums, sums the bins wholly
inside the set by the quadrature and those its edge cuts (the kink of the weights) sample by
sample. (Relative estimates there are against the sums of the summands' magnitudes: ``s``
changes sign and its sum cancels.)

This module imports neither otstab nor Dask.
"""

from __future__ import annotations

import math

import numpy as np

from . import logistic_kernels
from .smooth import logistic_dtransform

__all__ = ["MarginQuadrature", "solve_from", "BINS", "DEGREE", "RTOL"]

#: bins of the margins (at most; half cut at equal counts, half at equal widths)
BINS = 2048
#: degree of each bin's Chebyshev interpolant
DEGREE = 8
#: the estimated interpolation error left in each sum, relative to the sum
RTOL = 1e-14
#: the share of the samples above which per-sample evaluation is left to the exact pass
MAX_EXACT_SHARE = 0.25


class MarginQuadrature:
    """Sums of smooth functions of the margins ``margins`` (module docstring): built once,
    read at any price ``c`` and ``h`` by :meth:`dual_at`. Keeps the sorted margins (one
    n-vector) for the bins evaluated sample by sample."""

    def __init__(self, margins, bins: int = BINS, degree: int = DEGREE):
        ms = np.sort(np.asarray(margins, dtype=np.float64).reshape(-1))
        if ms.size == 0 or not (math.isfinite(ms[0]) and math.isfinite(ms[-1])):
            raise ValueError("the margins must be finite and not empty")
        self.n = ms.size
        self.sorted = ms
        n = ms.size
        lo, hi = float(ms[0]), float(ms[-1])
        self.degree = int(degree)
        # the bins: groups of consecutive sorted margins, cut both at equal counts (narrow
        # where the margins are dense) and at equal widths over the range (never wider than
        # a share of it where they are sparse); each bin's interval is its own samples'
        # smallest and largest margin
        half = max(int(bins) // 2, 1)
        cuts = (np.arange(half) * n) // half
        if hi > lo:
            cuts = np.union1d(cuts, np.searchsorted(ms, lo + np.arange(1, half) * ((hi - lo)
                                                                                  / half)))
        self.starts = np.unique(np.minimum(cuts, n - 1))
        self.stops = np.append(self.starts[1:], n)
        self.count = (self.stops - self.starts).astype(np.float64)
        self.bins = np.arange(self.starts.size)
        b_lo, b_hi = ms[self.starts], ms[self.stops - 1]
        centre = 0.5 * (b_lo + b_hi)
        hw = 0.5 * (b_hi - b_lo)
        inv = np.divide(1.0, hw, out=np.zeros_like(hw), where=hw > 0)
        p = self.degree
        mom = np.empty((self.starts.size, p + 1))
        mom[:, 0] = self.count
        if p >= 1 and logistic_kernels.use_kernel(n):  # (one compiled pass, no n-vector)
            logistic_kernels.moments(ms, self.starts, self.stops, centre, inv, mom)
        elif p >= 1:
            which = np.repeat(self.bins, self.stops - self.starts)
            pos = ms - centre[which]
            pos *= inv[which]  # x in [-1, 1] (0 in a bin of one margin value)
            del which
            np.clip(pos, -1.0, 1.0, out=pos)
            t_prev = np.ones_like(pos)
            t_cur = pos.copy()
            mom[:, 1] = np.add.reduceat(t_cur, self.starts)
            for k in range(2, p + 1):
                t_next = 2.0 * pos * t_cur
                t_next -= t_prev
                mom[:, k] = np.add.reduceat(t_next, self.starts)
                t_prev, t_cur = t_cur, t_next
            del t_prev, t_cur, pos
        # Chebyshev points of the first kind and the map from values to coefficients
        j = np.arange(p + 1)
        xk = np.cos(math.pi * (j + 0.5) / (p + 1))
        C = (2.0 / (p + 1)) * np.cos(np.outer(np.arange(p + 1), math.pi * (j + 0.5) / (p + 1)))
        C[0] *= 0.5
        self.C_last = C[p - 1:p + 1].T.copy()  # values -> the last two coefficients
        self.weights = mom @ C  # values at the points -> the bin's sum
        self.nodes = (centre[:, None] + hw[:, None] * xk[None, :]).reshape(-1)
        self.edges = (b_lo, b_hi)
        self.width = float(np.max(hw)) * 2.0 if hw.size else 0.0

    def _exact(self, sel, c, h):
        """``(l_h, loss*, d2)`` of the samples of the bins ``sel`` (their sorted margins)."""
        parts = [self.sorted[self.starts[b]:self.stops[b]] for b in sel]
        m = np.concatenate(parts) if parts else np.empty(0)
        if not m.size:
            return m, m, m
        return logistic_dtransform(m, np.broadcast_to(c, m.shape), h)[:3]

    def _kink_bins(self, c, h):
        """The bins (boolean, per bin) that meet the band of two local maxima of the
        d-transform at price ``c`` and ``h`` (``T = h / 2c > 4``), where the kink of ``l_h``
        lies: they are always summed sample by sample. None of them when ``T <= 4``."""
        T = h / (2.0 * c)
        if T <= 4.0:
            return np.zeros(self.bins.size, dtype=bool)
        L = 2.0 * math.atanh(math.sqrt(1.0 - 4.0 / T))
        sl = 1.0 / (1.0 + math.exp(L))
        lo_band, hi_band = T * sl + L, T * (1.0 - sl) - L
        pad = 1e-9 * (1.0 + abs(lo_band) + abs(hi_band)) + 1e-12 * self.width
        return (self.edges[1] >= lo_band - pad) & (self.edges[0] <= hi_band + pad)

    def dual_at(self, c: float, h: float, r: float, theta2: float):
        """``(F, g, curv, moved, exact_share)`` of the logistic dual (KL with ``theta2``, or
        ``theta2 = inf``) at ``h`` for the price ``c`` (finite, > 0), as
        :class:`otstab_solvers.logistic_pass._Pass` computes them, or None when more than
        :data:`MAX_EXACT_SHARE` of the samples would need the per-sample solve (the caller
        then runs the exact pass)."""
        nb, p = self.bins.size, self.degree
        lh, loss, d2 = logistic_dtransform(self.nodes, np.broadcast_to(c, self.nodes.shape),
                                           h)[:3]
        lh, loss, d2 = (a.reshape(nb, p + 1) for a in (lh, loss, d2))
        forced = self._kink_bins(c, h)
        kl = math.isfinite(theta2)
        exact_sel = np.empty(0, dtype=np.intp)
        ex = self._exact(exact_sel, c, h)
        M = 0.0
        for _ in range(4):
            sel = np.flatnonzero(forced)
            if float(self.count[sel].sum()) > MAX_EXACT_SHARE * self.n:
                return None
            if not np.array_equal(sel, exact_sel):
                exact_sel, ex = sel, self._exact(sel, c, h)
            if kl:  # (a shift: any value near the largest l_h / theta2)
                M = max(float(np.max(lh)), float(np.max(ex[0])) if ex[0].size else -math.inf)
                M /= theta2
            funcs = _functions(lh, loss, d2, theta2, M)
            keep = ~forced
            fk = funcs[keep]
            S = _dot(self.weights[keep], fk)
            if ex[0].size:
                S += _functions(ex[0], ex[1], ex[2], theta2, M).sum(axis=0)
            last = _last(fk, self.C_last)
            rel = np.max(last * self.count[keep, None] / np.maximum(np.abs(S), 1e-300), axis=1)
            order = np.argsort(rel)
            over = np.cumsum(rel[order]) > RTOL
            if not over.any():
                break
            forced[np.flatnonzero(keep)[order[over]]] = True
        else:
            return None
        N = float(self.n)
        share = float(self.count[forced].sum()) / N
        if not kl:
            sl_, sd1, sd2 = S[:3]
            return h * r - sl_ / N, r - sd1 / N, sd2 / N, sd1 / N, share
        Z, Z1, Z2, Z3, em1, s1 = S
        log_mean = math.log1p(em1 / N) if Z > 0.5 * N else math.log(Z / N)
        mu = Z1 / Z
        var = max(Z2 / Z - mu * mu, 0.0)
        term = theta2 * (M + log_mean)
        return h * r - term, r - mu, Z3 / Z + var / theta2, s1 / N, share


    def _exact_bins(self, sel, c, h, cache):
        """``(l_h, loss*, d2)`` of the samples of the bins ``sel``, each bin solved once per
        ``h`` (``cache``: bin -> its arrays)."""
        for b in sel:
            if b not in cache:
                m = self.sorted[self.starts[b]:self.stops[b]]
                cache[b] = logistic_dtransform(m, np.broadcast_to(c, m.shape), h)[:3]
        if not len(sel):
            e = np.empty(0)
            return e, e, e
        return tuple(np.concatenate([cache[b][i] for b in sel]) for i in range(3))

    def dual_at_chi2(self, c: float, h: float, r: float, theta2: float):
        """:meth:`dual_at` for chi2 (finite ``theta2``), as
        :meth:`otstab_solvers.blockwise.BlockwiseDual.chi2` reduces it: ``alpha`` from the
        active set ``{l_h - shift + alpha > -2 theta2}`` (a prefix of the sorted margins:
        ``l_h`` does not increase with the margin), whose bins are summed by the quadrature
        except the bins the set's edge cuts (summed sample by sample, with the bins of the
        kink of ``l_h`` and those whose estimate is not negligible)."""
        nb, p = self.bins.size, self.degree
        ms = self.sorted
        # the nodes, and each bin's smallest and largest margin (l_h at its ends)
        pts = np.concatenate([self.nodes, self.edges[0], self.edges[1], ms[:1]])
        lh_all, loss_all, d2_all = logistic_dtransform(pts, np.broadcast_to(c, pts.shape),
                                                        h)[:3]
        k0 = nb * (p + 1)
        lh, loss, d2 = (a[:k0].reshape(nb, p + 1) for a in (lh_all, loss_all, d2_all))
        l_lo, l_hi = lh_all[k0:k0 + nb], lh_all[k0 + nb:k0 + 2 * nb]
        shift = float(lh_all[-1])  # l_h at the smallest margin: the largest
        forced = self._kink_bins(c, h)
        cache: dict = {}
        N = float(self.n)
        two = 2.0 * theta2
        ls_nodes = lh - shift
        # per bin: the quadrature's sums of 1 and l - shift (the steps of alpha need these)
        sum_ls = np.einsum("bj,bj->b", self.weights, ls_nodes)
        alpha = -float(np.sum(sum_ls)) / N  # every row active
        count = None
        for _ in range(64):
            full = (l_hi - shift + alpha > -two) & ~forced
            cut = ~full & (l_lo - shift + alpha > -two)
            ex = self._exact_bins(np.flatnonzero(cut), c, h, cache)
            act = ex[0] - shift + alpha > -two
            k = float(np.sum(self.count[full])) + float(np.count_nonzero(act))
            SL = float(np.sum(sum_ls[full])) + float(np.sum((ex[0] - shift)[act]))
            if not k > 0.0:
                return None
            if count is not None and k >= count:
                break
            count = k
            alpha = (two * (N - k) - SL) / k
        else:
            return None
        for _ in range(4):  # the sums at alpha; bins whose estimate is not negligible: exact
            full = (l_hi - shift + alpha > -two) & ~forced
            cut = ~full & (l_lo - shift + alpha > -two)
            sel = np.flatnonzero(cut)
            if float(self.count[sel].sum()) > MAX_EXACT_SHARE * self.n:
                return None
            ex = self._exact_bins(sel, c, h, cache)
            funcs = _chi2_functions(lh[full], loss[full], d2[full], shift, alpha, theta2)
            S = _dot(self.weights[full], funcs)
            P = float(np.sum(self.count[full]))
            if ex[0].size:
                lh_e, loss_e, d2_e = ex
                fe = _chi2_functions(lh_e, loss_e, d2_e, shift, alpha, theta2)
                act = ex[0] - shift + alpha > -two
                S += fe[act].sum(axis=0)
                P += float(np.count_nonzero(act))
            last = _last(funcs, self.C_last)
            # relative to the sums of |summand| (s changes sign: its sum cancels)
            scale = np.einsum("b,bq->q", self.count[full], np.max(np.abs(funcs), axis=1))
            rel = np.max(last * self.count[full, None] / np.maximum(scale, 1e-300), axis=1)
            order = np.argsort(rel)
            over = np.cumsum(rel[order]) > RTOL
            if not over.any():
                break
            forced[np.flatnonzero(full)[order[over]]] = True
        else:
            return None
        Ss, S2, swd, swd2, sd, sdd = S
        # loss* over every sample (the moving share): the quadrature, the bins summed sample
        # by sample above exactly, and those of the largest estimates too
        exact = cut | forced
        lastm = _last(loss[:, :, None], self.C_last)[:, 0] * self.count
        lastm[exact] = 0.0
        moved_q = float(_dot(self.weights, loss[:, :, None])[0])
        order = np.argsort(lastm)
        exact[order[np.cumsum(lastm[order]) > RTOL * abs(moved_q)]] = True
        keep = ~exact
        moved = float(_dot(self.weights[keep], loss[keep][:, :, None])[0])
        moved += float(np.sum(self._exact_bins(np.flatnonzero(exact), c, h, cache)[1]))
        term = (Ss + S2 / (2.0 * two) - theta2 * (N - P)) / N - alpha
        mu = swd / N
        curv = (swd2 + max(sdd - sd * sd / P, 0.0) / two) / N
        share = float(self.count[cut].sum()) / N
        return h * r - (term + shift), r - mu, curv, moved / N, share


def _dot(weights, funcs):
    """``sum_bj weights_bj funcs_bjq`` (einsum: the arrays are small, and a BLAS call would
    wake its threads for each)."""
    return np.einsum("bj,bjq->q", weights, funcs)


def _last(funcs, C_last):
    """``|a_b,DEGREE-1| + |a_b,DEGREE|`` of each bin and summand (shape (bins, q))."""
    return np.abs(np.einsum("bjq,jl->bql", funcs, C_last)).sum(axis=2)


def _chi2_functions(lh, loss, d2, shift, alpha, theta2):
    """chi2's summands on the active rows: ``s``, ``s^2``, ``w loss*``, ``w d2``, ``loss*``,
    ``loss*^2`` with ``s = l_h - shift + alpha``, ``w = s / (2 theta2) + 1``
    (:func:`otstab_solvers.blockwise.block_chi2`)."""
    s = lh - shift
    s += alpha
    w = s / (2.0 * theta2) + 1.0
    return np.stack([s, s * s, w * loss, w * d2, loss, loss * loss], axis=-1)


def _functions(lh, loss, d2, theta2, M):
    """The summands (last axis) of the dual's sums at each point (module docstring)."""
    if not math.isfinite(theta2):
        return np.stack([lh, loss, d2], axis=-1)
    a = lh / theta2 - M
    np.maximum(a, -700.0, out=a)
    e = np.exp(a)
    el = e * loss
    return np.stack([e, el, el * loss, e * d2, np.expm1(a), loss], axis=-1)


def solve_from(quad: MarginQuadrature, c: float, h_c: float, r: float, theta2: float,
               g_rtol: float, divergence: str = "kl"):
    """``(h, F, g, moved, exact_share)`` at the first point from ``h_c`` (the binned root)
    whose derivative is within ``g_rtol r`` (Newton steps as
    :func:`otstab_solvers.logistic_pass.solve_at_root` takes them, up to its ``MAX_NEWTON``
    within its ``WINDOW`` of ``h_c``), or None (the caller then runs the exact pass)."""
    from .logistic_pass import MAX_NEWTON, WINDOW

    if not (h_c > 0.0 and math.isfinite(h_c)):
        return None
    h = h_c
    share = 0.0
    for _ in range(MAX_NEWTON + 1):
        got = quad.dual_at_chi2(c, h, r, theta2) if divergence == "chi2" \
            and math.isfinite(theta2) else quad.dual_at(c, h, r, theta2)
        if got is None:
            return None
        F, g, curv, moved, sh = got
        share = max(share, sh)
        if not (math.isfinite(F) and math.isfinite(g)):
            return None
        if abs(g) <= g_rtol * abs(r):
            return h, F, g, moved, share
        if not curv > 0.0:
            return None
        h = h + g / curv
        if not (h > 0.0 and abs(h - h_c) <= WINDOW * h_c):
            return None
    return None
