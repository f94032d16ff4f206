"""0/1 loss: exact certificates from the distance d*_i to the nearest misclassified point.

For a linear binary classifier with margin m_i = y_i (w . x_i + b), d*_i = (m_i)_+^2 / ||w||^2;
for a linear multiclass classifier d*_i = min_{k != y_i} ((s_y - s_k)_+)^2 / ||w_y - w_k||^2
(norms restricted to the features allowed to move). ``l_h = (h - theta1 d*_i)_+`` and the dual
is solved exactly in O(n log n) (:mod:`otstab_solvers.zero_one`).

Q* moves each sample either to its nearest misclassified point or not at all, and reweights;
when the optimum sits at a breakpoint (a tie between staying and moving) one sample's mass is
split so that the error rate under Q* is exactly r. The nearest misclassified point is pushed a
relative 1e-9 of its margin (plus a few hundred ulps of its scores) beyond the decision boundary
so that it is misclassified by the model's own rule (ties at a score of 0 go to the negative
class), which changes the cost by a relative 2e-9 (more only within rounding of the boundary).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from otstab_solvers import zero_one_kernels
from otstab_solvers.blockwise import BlockwiseDual, in_memory, price_block, weight_map_blocks
from otstab_solvers.dual import solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.weights import NEAR_ONE, chi2_solution, dense, kl_weights, phi, pmean
from otstab_solvers.zero_one import solve_window, solve_window_chi2, solve_zero_one

from .._validation import as_bool_vector, as_float_matrix, as_float_vector
from ..errors import ValidationError
from ..modeling._losses import ZeroOne, zero_one
from ..modeling._models import Problem
from ..modeling._nonlinear import LinearDifferentiable
from ..modeling._params import check_common, check_options
from . import _audit as audit
from . import _bounds as bounds
from . import _neural_search as neural_search
from . import _zero_one_pass as zero_one_pass
from ._refine import RTOL, ZeroOneDuals
from ._results import Lazy, LazyInfo, StabilityResult

__all__ = ["linear_distances", "move_prices", "NearPoints", "certify_distances",
           "certify_zero_one_problem", "certify_zero_one_search", "SEARCH_OPTIONS"]

PUSH = 1e-9
EPS = float(np.finfo(float).eps)


#: moved rows per block of the 0/1 audit (cache-sized temporaries): materialised points, and
#: the reduced form's losses and moves
MOVED_BLOCK = 4096
REDUCED_BLOCK = 1 << 14
#: sample weights: Q*'s weights computed from the prices where read (:class:`_MapWeights`;
#: False: the arrays of the candidates' prices, weights and masses, as before)
MAP_WEIGHTS = True
#: the solvers whose chi2 alpha is the exact one of their h (Q*'s weights from it; the
#: window's closed form: alpha = -mean(l_h))
CHI2_ALPHA_SOLVERS = ("zero_one_dual", "zero_one_closed_form")
#: rows per block of the sampled audit's materialised points (its n x d temporaries: three
#: of them are about 0.11 n-vector at n = 1e6, d = 50)
AUDIT_BLOCK_ROWS = 768
#: rows of the strided subsample that places the price quantile of RowPrices.smallest
SUBSAMPLE = 1 << 14
#: half-widths of the window of sorted prices of RowPrices.solve_window, in square roots of
#: the subsample's size (plus 8 positions): about 3 % of the rows either side at n = 1e6 for
#: the first (4 standard deviations of the subsample's share); the second after a miss
WINDOW_MARGINS = (4.0, 12.0)
#: a move plan keeps no array of positions when at most this many candidate rows (or this
#: share of them) are tied at h: they are put last (_move_plan)
TIED_LAST_MIN = 64
TIED_LAST_SHARE = 0.01
#: above audit.AUDIT_DIRECT_MAX rows the weak-duality check (:func:`_dual_at_h`) runs when at
#: most 1 / DUAL_CHECK_SHARE of the rows move (its pass costs about 0.08 X @ coef per tenth
#: of the rows for KL at n = 1e6)
DUAL_CHECK_SHARE = 64


def linear_distances(prob: Problem, mask: np.ndarray | None = None):
    """d*_i and the nearest misclassified points for a linear classifier.

    Returns ``(dstar, X_near)``; ``dstar`` is ``inf`` where no move along the allowed features
    can change the prediction; ``X_near`` a :class:`NearPoints` (rows built on demand).
    """
    sc = prob.scorer
    assert sc is not None, "a linear classifier"
    X = prob.X
    W = sc.W if mask is None else sc.W * mask[None, :]
    S = prob.scores if prob.scores is not None else sc.scores(X)
    # which samples are misclassified now (a boolean per row, over blocks of the scores)
    loss0 = misclassified(prob, S)
    if sc.task == "binary":
        prices, near = _binary_near(prob, W, S, loss0, 1.0)
        return prices.dstar(), near
    y = prob.y.astype(np.intp)
    sy = np.take_along_axis(S, y[:, None], axis=1)
    gaps = np.maximum(sy - S, 0.0)  # (n, K): s_y - s_k
    n, K = S.shape
    # ||w_j - w_k||^2 of every pair of classes (K x K, from the differences: no cancellation
    # of ||w_j||^2 + ||w_k||^2 - 2 w_j.w_k for close classes); a row's is looked up, never
    # formed as an n x d array of differences
    D = W[:, None, :] - W[None, :, :]
    NK = np.einsum("jkd,jkd->jk", D, D)
    d = np.full(n, np.inf)
    kbest = np.zeros(n, dtype=np.intp)
    for k in range(K):
        nk = NK[y, k]  # ||w_y - w_k||^2
        with np.errstate(divide="ignore", invalid="ignore"):
            dk = np.where(nk > 0, gaps[:, k] ** 2 / np.where(nk > 0, nk, 1.0), np.inf)
        dk = np.where(y == k, np.inf, dk)
        better = dk < d
        d = np.where(better, dk, d)
        kbest = np.where(better, k, kbest)
    d = np.where(loss0 > 0, 0.0, d)
    nk = NK[y, kbest]
    g = gaps[np.arange(n), kbest]
    push = _push(g, np.abs(sy[:, 0]) + np.abs(S[np.arange(n), kbest]),
                 np.abs(sc.b[y]) + np.abs(sc.b[kbest]))
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where((loss0 > 0) | ~np.isfinite(d) | (nk == 0), 0.0,
                        (g + push) / np.where(nk > 0, nk, 1.0))
    P = W @ sc.W.T  # P[k] = the scores' change along W_k (masked)

    def moves(rows, c):
        return -(c[:, None] * (P[y[rows]] - P[kbest[rows]])), c * c * nk[rows]
    near = NearPoints(X, step, lambda rows: W[y[rows]] - W[kbest[rows]], moves, S, y)
    near.misclassified = loss0
    return d, near


def linear_prices(prob: Problem, mask: np.ndarray | None, theta1: float):
    """``(prices, X_near)`` of a binary linear classifier: the move prices ``a_i = theta1
    d*_i`` as a :class:`RowPrices` (computed per block of rows, never stored) and the
    nearest misclassified points (:class:`NearPoints`, with ``misclassified`` set)."""
    sc = prob.scorer
    assert sc is not None, "a linear classifier"
    if sc.task != "binary":
        raise ValueError("linear_prices needs a binary linear classifier")
    W = sc.W if mask is None else sc.W * mask[None, :]
    S = prob.scores if prob.scores is not None else sc.scores(prob.X)
    return _binary_near(prob, W, S, misclassified(prob, S), theta1)


def _binary_near(prob, W, S, wrong, theta1):
    """:func:`linear_prices` given the (masked) weights, the scores and the misclassified
    rows: the nearest misclassified point of row i is ``x_i - c_i w`` with
    ``c_i = (max(m_i, 0) + push) / ||w||^2 * y_i`` (m the margin), at squared distance
    ``d*_i = max(m_i, 0)^2 / ||w||^2`` (0 where misclassified)."""
    sc, X = prob.scorer, prob.X
    w = W[0]
    nw = float(w @ w)
    wv = float(w @ sc.W[0])  # the score's change along the (masked) direction w
    def moves(rows, c):  # (-(c wv), c c nw): the same numbers, one buffer each
        sq = np.multiply(c, c)
        sq *= nw
        return np.multiply(c, -wv), sq
    near = NearPoints(X, None, lambda rows: w[None, :], moves, S, prob.y)
    near.misclassified = wrong
    prices = RowPrices(S, prob.y, wrong, nw, theta1)
    if nw == 0.0:
        near.c = np.zeros(X.shape[0])
        return prices, near
    y, b = prob.y, sc.b[0]

    def step(rows):  # built for the rows Q* moves only (margins recomputed: not kept)
        # (mr + _push(mr, |m|, b)) / nw * y, 0 where misclassified: the same operations in
        # three buffers (a block of rows: its temporaries are what the pass holds per thread)
        yr = y[rows]
        m = np.multiply(yr, S[rows])
        mr = np.maximum(m, 0.0)
        t = np.abs(m, out=m)  # 256 eps (1 + |m| + |b|)
        t += 1.0
        t += abs(b)
        t *= 256.0 * EPS
        c = np.multiply(mr, PUSH)  # PUSH mr + that, + mr
        c += t
        c += mr
        del t, mr
        c /= nw
        c *= yr
        np.copyto(c, 0.0, where=wrong[rows])
        return c

    near.c = step
    near.binary = (float(b), wv)
    return prices, near


class RowPrices:
    """The move prices ``a_i = theta1 d*_i`` of a binary linear classifier, computed from the
    scores where they are needed (``d*_i = max(m_i, 0)^2 / ||w||^2`` with the margin
    ``m_i = y_i s_i``; 0 where misclassified; ``inf`` for every correct row when ``w = 0``),
    so that a 0/1 certificate holds no n-vector of distances or prices: the closed form gets
    one sorted copy (:meth:`sorted`), Q* the rows below ``h`` (:meth:`near`). Every number is
    the one an n-vector of ``d*`` would hold (the same operations, row by row)."""

    BLOCK = 1 << 14

    def __init__(self, S, y, wrong, nw: float, theta1: float):
        self.S, self.y, self.wrong, self.nw, self.theta1 = S, y, wrong, float(nw), theta1
        self.size = int(S.shape[0])
        #: the sorted strided subsample of the prices and its stride (:meth:`_subsample`)
        self._sub: tuple[np.ndarray, int] | None = None
        #: what the last :meth:`_window` pass summed (the keywords of ``solve_window``)
        self._window_sums: dict[str, Any] = {}
        #: ``(reduced, loss0)`` of the certificate: the window pass keeps the rows below
        #: its window for :meth:`near_weighted` (``_fused``, a zero_one_pass.Below)
        self._fuse: tuple | None = None
        self._fused: Any = None

    def _dstar(self, rows) -> np.ndarray:
        if self.nw == 0.0:
            return np.where(self.wrong[rows], 0.0, np.inf)
        d = np.multiply(self.y[rows], self.S[rows])  # the margins; d* in one buffer
        np.maximum(d, 0.0, out=d)
        # a misclassified row's margin is <= 0 (d* = 0 already) when ``wrong`` comes from
        # these scores; 0 for any other one (a masked copy only then: it is several times
        # slower than the rest)
        fix = d > 0.0
        fix &= self.wrong[rows]
        if fix.any():
            np.copyto(d, 0.0, where=fix)
        d *= d
        d /= self.nw
        return d

    def __getitem__(self, rows) -> np.ndarray:
        if isinstance(rows, slice) and rows.step in (None, 1) and self.nw > 0.0 and \
                math.isfinite(self.theta1) and zero_one_kernels.use_kernel(self.size):
            i, j, _ = rows.indices(self.size)
            out = np.empty(max(j - i, 0))
            if out.size:  # (one compiled loop: the same numbers)
                zero_one_kernels.price_rows(self.S, self.y, self.wrong, i, j, self.nw,
                                            self.theta1, out)
            return out
        return move_prices(self._dstar(rows), self.theta1)

    def _blocks(self):
        return ((i, min(i + self.BLOCK, self.size)) for i in range(0, self.size, self.BLOCK))

    def dstar(self) -> np.ndarray:
        """All ``d*_i`` (an n-vector, built when asked for: ``res.info["dstar"]``)."""
        out = np.empty(self.size)
        for i, j in self._blocks():
            out[i:j] = self._dstar(slice(i, j))
        return out

    def array(self) -> np.ndarray:
        """All prices (an n-vector; the rare dense paths)."""
        out = np.empty(self.size)
        for i, j in self._blocks():
            out[i:j] = self[i:j]
        return out

    def sorted(self) -> np.ndarray:
        """The prices in ascending order (one n-vector, sorted in place)."""
        out = self.array()
        out.sort()
        return out

    def _subsample(self) -> tuple[np.ndarray, int]:
        """``(sorted prices of every stride-th row, stride)`` (:data:`SUBSAMPLE` rows; kept:
        it sizes the arrays of :meth:`smallest` and :meth:`near`)."""
        stride = max(1, self.size // SUBSAMPLE)
        if self._sub is None or self._sub[1] != stride:
            sub = self[0:self.size:stride]
            sub.sort()
            self._sub = (sub, stride)
        return self._sub

    def _estimate(self, thr: float) -> int | None:
        """How many prices are at most ``thr``, from above: the subsample's count scaled to
        all rows with room for twice its sampling error (as the hinge windows' arrays; None:
        no subsample, or the estimate reaches every row)."""
        if self._sub is None or self._sub[1] == 1:
            return None
        sub = self._sub[0]
        k = int(sub.searchsorted(thr, side="right"))
        size = int((k + 2.0 * math.sqrt(k) + 4) * self.size / sub.size) + 1024
        return size if size < self.size else None

    def smallest(self, share: float) -> np.ndarray:
        """Every price up to about the ``share`` quantile (with a margin), ascending: the
        quantile's price is read off a strided subsample of :data:`SUBSAMPLE` rows, then one
        writing pass keeps the prices at most that one (into an array sized from the
        subsample; a counting pass first when that proves too small), and only those are
        sorted. All prices when the margin reaches the largest."""
        sub, stride = self._subsample()
        if stride == 1:  # (the subsample is every row: all prices, sorted)
            return sub.copy()
        m = sub.size
        k = int(math.ceil((share + 0.01) * m + 4.0 * math.sqrt(m))) + 1
        if k >= m or not math.isfinite(float(sub[k])):
            return self.sorted()
        tau = float(sub[k])
        size = self._estimate(tau)
        if size is None:  # (the margin reaches about every row: all of them, one pass)
            return self.sorted()
        out = self._write_below(tau, size)
        if out is None:
            out = self._write_below(tau, sum(int(np.count_nonzero(self[i:j] <= tau))
                                             for i, j in self._blocks()))
        assert out is not None  # (sized by the count)
        out.sort()
        return out

    def solve_window(self, r: float, theta2: float, divergence: str):
        """The KL (or theta2 = inf) closed form with ``r < 1`` from a window of the sorted
        prices (:func:`otstab_solvers.zero_one.solve_window`): the strided subsample's own
        closed form says what share of the rows moves; the prices within
        :data:`WINDOW_MARGINS` subsample positions (times the square root of its size) of
        that share are written and sorted, and one pass over the rows sums the terms of the
        prices below them. None when the window misses the answer at every margin (or with
        no subsample, or prices of 0 or inf only): the caller sorts the prices."""
        sub, stride = self._subsample()
        if stride == 1 or self.nw == 0.0 or not math.isfinite(self.theta1):
            return None
        m, n = sub.size, self.size
        chi2 = divergence == "chi2" and math.isfinite(theta2)
        if math.isinf(theta2):
            q = max(math.ceil(r * n - 1e-12 * n), 1) / n
        else:
            ss = solve_zero_one(sub, r, theta2, divergence, presorted=True)
            if chi2 and ss.status == OPTIMAL and math.isfinite(ss.h):
                q = float(sub.searchsorted(ss.h, side="left")) / m  # (the dual on the
            elif ss.status == OPTIMAL and "n_moved" in ss.info:   # subsample)
                q = ss.info["n_moved"] / m
            elif ss.status == OPTIMAL and ss.native_status == "r <= base risk":
                q = r
            else:
                return None
        for c in WINDOW_MARGINS:
            half = c * math.sqrt(m) + 8.0
            klo, khi = int(math.floor(q * m - half)), int(math.ceil(q * m + half))
            lo = float(sub[klo]) if klo > 0 else 0.0
            hi = float(sub[khi]) if khi < m else math.inf
            if chi2:
                sol = solve_window_chi2(self._window(lo, hi, theta2, chi2=True), r, theta2, n,
                                        **self._window_sums)
            else:
                sol = solve_window(self._window(lo, hi, theta2), r, theta2, divergence, n,
                                   **self._window_sums)
            if sol is not None:
                return sol
        return None

    def _window(self, lo: float, hi: float, theta2: float, chi2: bool = False) -> np.ndarray:
        """The prices in ``[lo, hi]`` ascending (finite ones), from one pass over the rows
        that also sums the closed form's terms of the prices below ``lo``
        (``self._window_sums``, the keywords of ``solve_window``; with ``chi2`` those of
        ``solve_window_chi2``: the sums of ``lo - a`` and its square)."""
        below, below_exp, below_gap, n_zero, n_inf, above = 0, 0.0, 0.0, 0, 0, 0
        below_sq = below_a = 0.0
        below_em1 = math.nan
        neg = -1.0 / theta2
        # every exponent below lo small (lo / theta2 < 0.5): the expm1 terms instead, from
        # which the exp terms follow (the closed form may need either)
        small = math.isfinite(theta2) and lo / theta2 < 0.5 and not chi2
        gaps = chi2 or not math.isfinite(theta2)  # (sums of lo - a: chi2, theta2 = inf)
        if small:
            below_em1 = 0.0
        fin_hi = min(hi, float(np.finfo(np.float64).max))  # (a <= fin_hi: finite)

        # the rows below lo kept for the moved-rows pass (zero_one_pass.Below): with KL
        # terms exp(-a / theta2) unclamped (lo / theta2 <= 700) and not all small (or none:
        # a window from 0)
        fuse = self._fuse if zero_one_pass.FUSED and self._fuse is not None and \
            (not small or lo <= 0.0) and (zero_one_pass.FUSED_CHI2 if chi2 else (
                lo / theta2 <= 700.0 if math.isfinite(theta2) else zero_one_pass.FUSED_INF)) \
            else None
        self._fused = None
        if fuse is not None:  # (room for the rows below lo: none below a window from 0)
            est = 0 if lo <= 0.0 else self._estimate(lo)
            out_b = zero_one_pass._Out(est if est is not None else self.size,
                                       row_index_dtype(self.size))

        kernel = self._kernel_args(fuse, small, gaps, chi2)
        if kernel is not None:
            mode, fargs = kernel
            idt = row_index_dtype(self.size)

        def compiled(i, j, back=False):
            """:func:`block` in one compiled loop (otstab_solvers.zero_one_kernels); the
            NumPy block where the kept rows' sums are not finite."""
            m = j - i
            keep = fuse is not None and not out_b.full
            kb, win_a = np.empty(m if keep else 0, dtype=idt), np.empty(m)
            wrows, res = np.empty(m, dtype=idt), np.empty(zero_one_kernels.N_OUT)
            zero_one_kernels.window_block(self.S, self.y, self.wrong, i, j, self.nw,
                                          self.theta1, lo, fin_hi, mode, theta2, keep,
                                          *fargs, kb, win_a, wrows, res)
            if keep and not res[17]:
                return block(i, j, back)
            nz, ni, nb, above, nwin, nkb, nl = (int(x) for x in res[:7])
            bsums = None
            if keep and nb:
                bsums = (float(res[12]), nl, *(float(x) for x in res[13:17]))
                at = out_b.reserve(nkb, back)
                if at is not None:
                    np.add(kb[:nkb], i, out=out_b.cand[at:at + nkb], casting="unsafe")
            del kb
            part = rows = None
            if nwin:
                part = win_a[:nwin].copy()
                if fuse is not None:
                    rows = wrows[:nwin].copy()
            return (nz, ni, nb, float(res[7]), float(res[8]), float(res[9]),
                    (float(res[10]), float(res[11])), above, part, rows, bsums)

        def block(i, j, back=False):
            """What rows i..j add: (zeros, infs, below lo, expm1 / exp / gap terms, above
            hi, the prices in the window, their rows, the sums of the rows below lo)."""
            a = self[i:j]
            nz = int(np.count_nonzero(a == 0.0))
            ni = int(np.count_nonzero(a == math.inf))
            lt = a < lo
            nb = int(np.count_nonzero(lt))
            em1 = ex = gap = sq = asum = 0.0
            e = None
            if nb:
                # few below lo: their prices alone; else every row's, the others' terms
                # cleared (clamped at 0, or left out of the sum by the mask)
                ab = a[lt] if 2 * nb < a.size else a
                if small:  # expm1((lo - a) / theta2) > 0 below lo
                    e = np.subtract(lo, ab)
                    np.maximum(e, 0.0, out=e)
                    e /= theta2
                    em1 = float(np.sum(np.expm1(e, out=e)))
                elif not gaps:  # exp(max(-a / theta2, -700)): the closed form's terms,
                    e = np.multiply(ab, neg)  # shifted by the smallest price 0
                    np.maximum(e, -700.0, out=e)
                    np.exp(e, out=e)
                    ex = float(np.sum(e)) if ab is not a else _masked_sum(e, lt, nb)
                else:  # lo - a > 0 below lo (and its square: chi2)
                    e = np.subtract(lo, ab)
                    gap = float(np.sum(np.maximum(e, 0.0, out=e)))
                    if chi2:  # (and the prices below lo themselves)
                        sq = float(np.dot(e, e))
                        asum = float(np.sum(ab)) if ab is not a else \
                            _masked_sum(np.minimum(a, lo), lt, nb)
            bsums = None
            if fuse is not None and nb and not out_b.full:
                lb = fuse[1][i:j]
                lb = lb if lb.dtype == bool else lb > 0
                kb, bsums = zero_one_pass.below_block(  # (chi2: the terms lo - a)
                    i, a, lt, nb, e if math.isfinite(theta2) else None, lb, fuse[0], lo)
                at = out_b.reserve(kb.size, back)
                if at is not None:
                    np.add(kb, i, out=out_b.cand[at:at + kb.size], casting="unsafe")
            del e
            inw = a <= fin_hi
            k = int(np.count_nonzero(inw))
            part = rows = None
            if k > nb:  # (every row below lo is also <= hi)
                inw &= a >= lo
                part = a[inw]
                if fuse is not None:
                    rows = np.flatnonzero(inw).astype(row_index_dtype(self.size))
                    rows += i
            return nz, ni, nb, em1, ex, gap, (sq, asum), a.size - k, part, rows, bsums

        # the blocks on the pass's threads, each block's terms kept and added up in block
        # order below (the same numbers on any thread count)
        blocks = list(self._blocks())
        got: list = [None] * len(blocks)
        workers = min(zero_one_pass.pass_workers(self.size), len(blocks))

        def run(w):  # (the second run from its last block: it writes kept rows from the back)
            span = range(len(blocks) * w // workers, len(blocks) * (w + 1) // workers)
            for b in (span if w == 0 else reversed(span)):
                got[b] = (block if kernel is None else compiled)(*blocks[b], w > 0)

        zero_one_pass.run_blocks([lambda w=w: run(w) for w in range(workers)], workers)
        parts, part_rows = [], []
        bsum = [0.0, 0, 0.0, 0.0, 0.0, 0.0]  # A, NL, WD2, WDL, QDL, SDD of the rows below lo
        for nz, ni, nb, em1, ex, gap, sq, ab, part, rows, bsums in got:
            n_zero += nz
            n_inf += ni
            above += ab
            if nb:
                below += nb
                if small:
                    below_em1 += em1
                elif not gaps:
                    below_exp += ex
                else:
                    below_gap += gap
                    below_sq += sq[0]
                    below_a += sq[1]
            if part is not None:
                parts.append(part)
                if rows is not None:
                    part_rows.append(rows)
            if bsums is not None:
                for q, x in enumerate(bsums):
                    bsum[q] += x
        got.clear()
        if fuse is not None and not out_b.full:
            wrows = np.concatenate(part_rows) if part_rows else \
                np.empty(0, dtype=row_index_dtype(self.size))
            W = below_exp if math.isfinite(theta2) and not chi2 else float(below)
            self._fused = zero_one_pass.Below(lo, hi, theta2, fuse[0], fuse[1],
                                              out_b.compact(), (W, *bsum), wrows,
                                              (below_gap, below_sq) if chi2 else None)
        del part_rows
        if small:  # exp(-a / theta2) = exp(-lo / theta2) (1 + expm1((lo - a) / theta2))
            below_exp = math.exp(-lo / theta2) * (below + below_em1)
        self._window_sums = {
            "below": below, "below_exp": below_exp, "below_gap": below_gap, "lo": lo,
            "below_em1": below_em1,
            "n_zero": n_zero, "n_fin": self.size - n_inf, "top": above == n_inf}
        if chi2:
            self._window_sums = {
                "below": below, "lo": lo, "d1": below_gap, "d2": below_sq, "a1": below_a,
                "n_zero": n_zero,
                "n_fin": self.size - n_inf, "top": above == n_inf}
        out = np.concatenate(parts) if parts else np.empty(0)
        del parts
        out.sort()
        return out

    def compiled_moves(self, moves):
        """``(b, wv, push, tiny)``, what the compiled passes
        (:mod:`otstab_solvers.zero_one_kernels`) need to recompute the audit's moves ``moves``
        (``(reduced, loss0)``, :meth:`NearPoints.reduced` and the misclassified rows; None:
        no moves summed, zeros), or None where those passes do not serve: fewer rows than
        they are loaded for, no numba, scores other than float64, or moves other than the
        binary ones of :func:`_binary_near` over these prices' own misclassified rows."""
        S, y, wrong = self.S, self.y, self.wrong
        if not (S.dtype == np.float64 and S.ndim == 1 and S.flags.c_contiguous and
                y.dtype in (np.int8, np.float64) and y.ndim == 1 and y.flags.c_contiguous and
                wrong.dtype == bool and wrong.flags.c_contiguous and self.nw > 0.0):
            return None
        near = None if moves is None else getattr(moves[0], "__self__", None)
        if moves is not None and (getattr(near, "binary", None) is None or
                                  moves[1] is not wrong):
            return None
        if not zero_one_kernels.use_kernel(self.size):
            return None
        b, wv = (0.0, 0.0) if near is None else near.binary
        return b, wv, PUSH, 256.0 * EPS

    def _kernel_args(self, fuse, small: bool, gaps: bool, chi2: bool):
        """``(mode, (b, wv, push, tiny))`` of the compiled window pass
        (:func:`otstab_solvers.zero_one_kernels.window_block`), or None where it does not
        serve (:meth:`compiled_moves`; and rows kept with theta2 = inf, whose terms are 1:
        NumPy's blocks)."""
        if fuse is not None and gaps and not chi2:
            return None
        moves = self.compiled_moves(fuse)
        if moves is None:
            return None
        mode = zero_one_kernels.MODE_SMALL if small else (
            zero_one_kernels.MODE_CHI2 if chi2 else (
                zero_one_kernels.MODE_GAP if gaps else zero_one_kernels.MODE_EXP))
        return mode, moves

    def _write_below(self, tau: float, size: int | None) -> np.ndarray | None:
        """The prices at most ``tau`` in row order, in an array of ``size`` (None: it is too
        small, or no size)."""
        if size is None:
            return None
        out = np.empty(size)
        at = 0
        for i, j in self._blocks():
            ai = self[i:j]
            part = ai[ai <= tau]
            if at + part.size > size:
                return None
            out[at:at + part.size] = part
            at += part.size
        out.resize(at, refcheck=False)  # (the estimate's spare room given back)
        return out

    def near(self, h: float, tol: float = 1e-10):
        """:func:`_near`: the rows with ``a_i <= h`` (up to the tie tolerance) and their
        prices, over blocks, written into arrays sized from the strided subsample (row
        indices as int32 below 2^31 rows; a counting pass first when that proves too
        small, or for small data), so that no copy of them is made."""
        thr = h + tol * h
        self._subsample()
        got = self._write_near(h, tol, self._estimate(thr))
        if got is None:
            got = self._write_near(h, tol, sum(int(np.count_nonzero(self[i:j] <= thr))
                                               for i, j in self._blocks()))
        assert got is not None  # (sized by the count)
        self._sub = None  # (Q*'s rows are the last use of the subsample)
        return got

    def _write_near(self, h, tol, size):
        """:meth:`near` into arrays of ``size`` rows (None: too small, or no size)."""
        if size is None:
            return None
        cand = np.empty(size, dtype=row_index_dtype(self.size))
        vals = np.empty(size)
        at = 0
        for i, j in self._blocks():
            k, ak = _near(self[i:j], h, tol)
            if at + k.size > size:
                return None
            np.add(k, i, out=cand[at:at + k.size], casting="unsafe")
            vals[at:at + k.size] = ak
            at += k.size
        cand.resize(at, refcheck=False)
        vals.resize(at, refcheck=False)
        return cand, vals

    def near_weighted(self, h: float, fn, loss0, divergence: str | None, tol: float = 1e-10,
                      reduced=None):
        """:meth:`near` without the prices, and in the same pass what Q*'s plan and audit sum
        over the weights ``fn(a)`` of those rows (``fn(a)``: the weight of a row of price
        ``a``, ``fn(h)`` that of every row with ``l_h = 0``): ``(cand, tied, sums)`` with
        ``tied`` the positions in ``cand`` of the rows with ``a >= h - tol h`` (ascending;
        the others are below h), and ``sums`` the sums over the candidates of the weights
        (``"w"``), of ``phi`` of them (``"phi"``, of ``divergence``; None: unit weights, phi
        0 not summed), of the weights of the misclassified ones (``"wl"``), the count of
        those (``"l"``), and the weights of the correctly classified rows below h
        (``"w_gain"``). Uniform samples; one pass over the rows (blocks on the pass's
        threads, :mod:`otstab.solve._zero_one_pass`), the weights computed per block (no
        n-vector of prices or weights).

        ``reduced`` (:meth:`NearPoints.reduced`): the rows below h moved, summed as
        ``_finish`` sums them with the weights at hand: ``"wd2"`` (weight times squared
        move), ``"wdl"`` (weight times change of loss), ``"qdl"`` (change of loss), over
        ``"n_below"`` rows."""
        fz, self._fused = self._fused, None
        got = None if fz is None else \
            zero_one_pass.fused_near(self, fz, h, fn, loss0, divergence, tol, reduced)
        del fz
        if got is None:
            self._subsample()
            size = self._estimate(h + tol * h)
            got = zero_one_pass.near_pass(self, h, fn, loss0, divergence, tol, reduced, size,
                                          row_index_dtype(self.size))
        self._sub = None  # (Q*'s rows are the last use of the subsample)
        return got

    def finite(self):
        """(any, all, count among the correctly classified rows) of finite prices."""
        if self.nw > 0.0 and math.isfinite(self.theta1) and self.size:
            # every price is finite when the one of the largest |score| is (a price grows
            # with the margin, and rounding is monotone): two reductions over the scores,
            # no pass of prices
            top = max(abs(float(np.max(self.S))), abs(float(np.min(self.S))))
            top = top * top / self.nw
            if math.isfinite(top * self.theta1 if self.theta1 != 1.0 else top):
                return True, True, self.size - int(np.count_nonzero(self.wrong))
        any_, all_, movable = False, True, 0
        for i, j in self._blocks():
            fin = np.isfinite(self[i:j])
            any_ = any_ or bool(fin.any())
            all_ = all_ and bool(fin.all())
            movable += int(np.count_nonzero(fin & ~self.wrong[i:j]))
        return any_, all_, movable


def _masked_sum(x: np.ndarray, mask: np.ndarray, count: int) -> float:
    """``sum(x[mask])`` (``count`` true entries; ``x`` finite): a plain sum when every entry
    is true, else a dot with the mask as floats (``np.sum(where=)`` and a dot with the
    booleans themselves are several times slower)."""
    if count == x.size:
        return float(np.sum(x))
    return float(np.dot(x, mask.astype(np.float64)))


def misclassified(prob: Problem, S=None) -> np.ndarray:
    """A boolean per sample: misclassified by the model now (its 0/1 loss is 1). From the
    problem's cached losses when its loss is 0/1 and they exist, else over blocks of the
    scores ``S`` (no n-vector of float losses is made)."""
    cached = prob.extra.get("base_losses") if isinstance(prob.loss, ZeroOne) else None
    if cached is not None:
        return cached > 0
    S = prob.scores if S is None else S
    n = S.shape[0]
    out = np.empty(n, dtype=bool)
    for s in range(0, n, REDUCED_BLOCK):
        e = min(s + REDUCED_BLOCK, n)
        if S.ndim == 1:  # ZeroOne.values' binary rule, without its float losses
            np.not_equal(S[s:e] > 0, prob.y[s:e] > 0, out=out[s:e])
        else:
            out[s:e] = zero_one.values(S[s:e], prob.y[s:e]) > 0
    return out


def move_prices(dstar, theta1: float) -> np.ndarray:
    """``a_i = theta1 d*_i``: the price of moving each sample to its nearest misclassified
    point (``theta1 = inf``: 0 for a misclassified sample, ``inf`` for the others). With
    ``theta1 = 1`` the prices are ``dstar`` itself (no copy; neither is written to)."""
    if theta1 == 1.0:
        return dstar
    return dstar * theta1 if math.isfinite(theta1) else np.where(dstar > 0, np.inf, 0.0)


class NearPoints:
    """The nearest misclassified points ``x_i - c_i D_i`` of a linear classifier, built only
    for the rows asked for (``near[rows]``): ``c`` per row (an array, or a function of the
    rows), ``direction(rows)`` the rows' directions (one shared row for binary models). No
    n x d array is formed."""

    def __init__(self, X, c, direction, moves=None, scores=None, labels=None):
        self.X, self.c, self.direction = X, c, direction
        self.shape = X.shape
        #: ``moves(rows, c) -> (change of the model's scores, squared move)`` of the rows with
        #: steps ``c`` (None: not known from the scores); ``scores``, ``labels`` at the data
        self.moves_fn, self.scores, self.labels = moves, scores, labels
        #: which rows are misclassified now (booleans; set by :func:`linear_distances`)
        self.misclassified = None
        #: ``(b, wv)`` of a binary model's steps (:func:`_binary_near`: the compiled window
        #: pass recomputes its moves from them), None for any other
        self.binary: tuple[float, float] | None = None

    def steps(self, rows) -> np.ndarray:
        """``c`` of ``rows`` (the signed step along each row's direction)."""
        return self.c(rows) if callable(self.c) else self.c[rows]

    def moves(self, rows):
        """``(change of the model's scores, squared move)`` of ``rows`` moved to their
        nearest points, from the scores (without forming the points)."""
        return self.moves_fn(rows, self.steps(rows))

    def reduced(self, rows):
        """``(0/1 loss, squared move)`` at the moved points of ``rows``, from the scores."""
        change, sq = self.moves(rows)
        change += self.scores[rows]  # (the moved scores, in the change's buffer)
        return zero_one.values(change, self.labels[rows]), sq

    def points_and_reduced(self, X, rows):
        """``(x, x_near, loss, squared move)`` of ``rows``: :meth:`__getitem__`'s points and
        :meth:`reduced`'s numbers (the same operations) from one computation of the steps."""
        c = self.steps(rows)
        Xr = X[rows]
        Xm = -c[:, None] * self.direction(rows)  # (displacement's operations)
        Xm += Xr
        change, sq = self.moves_fn(rows, c)
        change += self.scores[rows]
        return Xr, Xm, zero_one.values(change, self.labels[rows]), sq

    def displacement(self, rows) -> np.ndarray:
        """``x_near - x`` for ``rows``."""
        return -self.steps(rows)[:, None] * self.direction(rows)

    def __getitem__(self, rows) -> np.ndarray:
        return self.X[rows] + self.displacement(rows)


def _push(gap, score_scale, intercept_scale):
    """How far past the decision boundary (in score units) a moved point is put so that the
    model's own rule misclassifies it: a relative PUSH of the gap, plus a few hundred ulps of
    the scores involved (their rounding when the model recomputes them). Relative to the gap
    this costs 2 PUSH of the move's cost, and more only for samples within rounding of the
    boundary (the audit then measures the cost of the point actually returned)."""
    return PUSH * gap + 256.0 * EPS * (1.0 + score_scale + np.abs(intercept_scale))


def row_index_dtype(n: int):
    """The integer type of arrays of row indices among ``n`` rows: int32 below 2^31 rows
    (half the memory of intp), else intp."""
    return np.int32 if n < 2**31 else np.intp


def _near(a, h, tol=1e-10):
    """Rows with ``a_i <= h`` (up to the tie tolerance), the only rows Q* can move, and
    their ``a``."""
    cand = np.flatnonzero(a <= h + tol * h)  # a = inf never qualifies
    if cand.dtype != row_index_dtype(a.size):  # (int32 below 2^31 rows: half the memory)
        cand = cand.astype(row_index_dtype(a.size))
    return cand, a[cand]


class _RowMass:
    """``q = n p``, each row's probability times n (sample weights), computed where it is
    read (``q[rows]``, sums over blocks of rows) instead of held as an n-vector beside ``p``:
    the same numbers ``p * n`` holds."""

    def __init__(self, p: np.ndarray, n: int):
        self.p, self.n = p, n
        self.size = int(p.size)

    def __getitem__(self, rows):
        return self.p[rows] * self.n

    def _blocks(self):
        return ((s, min(s + REDUCED_BLOCK, self.size)) for s in range(0, self.size, REDUCED_BLOCK))

    def dot(self, x) -> float:
        """sum_i q_i x_i (``x`` of any numeric or boolean type), over blocks of rows."""
        return sum((float(np.dot(self[s:e], x[s:e])) for s, e in self._blocks()), 0.0)

    def sum(self) -> float:
        return sum((float(np.sum(self[s:e])) for s, e in self._blocks()), 0.0)

    def times(self, v: np.ndarray) -> np.ndarray:
        """``q * v`` (an n-vector: the dense weights' rare paths)."""
        return self.p * self.n * v


class _Weights:
    """The weights of Q* over the n samples, kept compact: every row outside ``idx`` has the
    weight ``base`` (its ``l_h`` is 0), the rows ``idx`` have ``vals``; or a dense array
    (``dense``). Sums over all rows cost O(len(idx)) plus one pass over the summed array.

    ``q`` (a :class:`_RowMass`): n times the sample probabilities (sample weights); the sums
    and :meth:`at` then carry each row's share ``q_i`` of P0 (``sum_i q_i w_i = n``), so that
    every ``sum / n`` below is the p-weighted sum."""

    def __init__(self, n, *, base=None, idx=None, vals=None, dense=None, q=None):
        self.n, self.base, self.idx, self.vals, self.dense = n, base, idx, vals, dense
        self.q = q
        self._qw = None if q is None or dense is None else q.times(dense)
        # compact with sample weights: q of the rows idx, and the q-mass of the other rows
        self._qi = None if q is None or dense is not None else q[idx]
        self._q_rest = None if self._qi is None else q.sum() - float(np.sum(self._qi))
        self._dots = {}

    def at(self, pos):
        """Weights of the rows ``idx[pos]`` (times their ``q`` with sample weights)."""
        if self._qw is not None:
            return self._qw[self.idx[pos]]
        if self.dense is not None:
            return self.dense[self.idx[pos]]
        return self.vals[pos] if self._qi is None else self.vals[pos] * self._qi[pos]

    def dot(self, x):
        """sum_i w_i x_i (sum_i q_i w_i x_i with sample weights; remembered per array: the
        plan and the audit both need it)."""
        key = id(x)
        if key not in self._dots:
            if self._qw is not None:
                val = float(np.dot(self._qw, x))
            elif self.dense is not None:
                val = float(np.dot(self.dense, x))
            elif self._qi is None:  # the rows outside idx at the shared weight, idx at theirs
                xi = x[self.idx]
                # (a boolean x as a mask: no float copy of it)
                vx = float(np.sum(self.vals, where=xi)) if xi.dtype == bool else \
                    float(np.dot(self.vals, xi))
                val = self.base * (float(np.sum(x)) - float(np.sum(xi))) + vx
            else:  # over blocks of the rows idx (cache-sized temporaries)
                val = self.base * self.q.dot(x)
                for s in range(0, self.idx.size, REDUCED_BLOCK):
                    e = s + REDUCED_BLOCK
                    xi = x[self.idx[s:e]]
                    qi = self._qi[s:e]
                    val += float(np.dot(self.vals[s:e] * qi, xi)) \
                        - self.base * float(np.dot(qi, xi))
            self._dots[key] = (x, val)  # keeps x alive, so its id is not reused
        return self._dots[key][1]

    def total(self):
        if self._qw is not None:
            return float(np.sum(self._qw))
        if self.dense is not None:
            return float(np.sum(self.dense))
        if self._qi is not None:
            return self.base * self._q_rest + float(np.dot(self._qi, self.vals))
        return self.base * (self.n - self.idx.size) + float(np.sum(self.vals))

    def phi_total(self, divergence):
        """sum_i phi(w_i) (sum_i q_i phi(w_i) with sample weights)."""
        if self._qw is not None:
            return self.q.dot(phi(self.dense, divergence))
        if self.dense is not None:
            return _phi_sum(self.dense, divergence)
        phi_base = _phi_sum(np.array([self.base]), divergence)
        if self._qi is not None:  # (over blocks of the rows idx: phi's temporaries)
            return phi_base * self._q_rest + sum(
                (float(np.dot(self._qi[s:s + REDUCED_BLOCK],
                              phi(self.vals[s:s + REDUCED_BLOCK], divergence)))
                 for s in range(0, self.idx.size, REDUCED_BLOCK)), 0.0)
        return phi_base * (self.n - self.idx.size) + _phi_sum(self.vals, divergence)

    def array(self):
        if self.dense is not None:
            return self.dense
        w = np.full(self.n, self.base)
        w[self.idx] = self.vals
        return w


class _PriceWeights(_Weights):
    """Compact weights of uniform samples given as a function of the prices: the rows
    ``idx`` (candidates) have ``fn(a_i)``, recomputed from :class:`RowPrices` per block
    when asked (:meth:`at`), every other row ``base``; the sums over all rows come from
    the pass that found the rows (:meth:`RowPrices.near_weighted`): no n-vector of weights
    or prices is kept."""

    def __init__(self, n, base, idx, fn, prices, sums, loss0):
        super().__init__(n, base=base, idx=idx, vals=None)
        self.fn, self.prices, self.sums = fn, prices, sums
        rest = self.base * (float(np.count_nonzero(loss0)) - sums["l"])  # (rows outside idx)
        self._dots[id(loss0)] = (loss0, rest + sums["wl"])

    def at(self, pos):
        return self.fn(self.prices[self.idx[pos]])

    def dot(self, x):
        key = id(x)
        if key not in self._dots:  # (any other array: a pass over the candidates)
            val = self.base * float(np.sum(x))
            for s in range(0, self.idx.size, REDUCED_BLOCK):
                rows = self.idx[s:s + REDUCED_BLOCK]
                xi = x[rows].astype(np.float64)
                val += float(np.dot(self.at(slice(s, s + REDUCED_BLOCK)) - self.base, xi))
            self._dots[key] = (x, val)
        return self._dots[key][1]

    def total(self):
        return self.base * (self.n - self.idx.size) + self.sums["w"]

    def phi_total(self, divergence):
        phi_base = _phi_sum(np.array([self.base]), divergence)
        return phi_base * (self.n - self.idx.size) + self.sums["phi"]

    def array(self):
        w = np.full(self.n, self.base)
        for s in range(0, self.idx.size, REDUCED_BLOCK):
            w[self.idx[s:s + REDUCED_BLOCK]] = self.at(slice(s, s + REDUCED_BLOCK))
        return w


class _MapWeights(_Weights):
    """Compact weights with sample weights (``q = n p``): every row outside ``idx`` has the
    weight map's weight at ``l_h = 0``, the rows ``idx`` ``wm((h - a_i)_+)``, computed from
    the prices per block of ``idx`` where read, with their ``q`` (the numbers
    :class:`_Weights` holds as ``vals`` and ``q[idx]``, without those arrays)."""

    def __init__(self, n, wm, h, a, idx, q):
        super().__init__(n, base=float(wm(np.zeros(1))[0]), idx=idx, vals=None)
        self.q, self.wm, self.h, self.a = q, wm, h, a
        self._rest = None  # the q-mass of the rows outside idx

    def _vals(self, rows):
        return self.wm(np.maximum(self.h - self.a[rows], 0.0))

    def _parts(self):
        for s in range(0, self.idx.size, REDUCED_BLOCK):
            rows = self.idx[s:s + REDUCED_BLOCK]
            yield rows, self._vals(rows), self.q[rows]

    def q_rest(self) -> float:
        if self._rest is None:
            self._rest = self.q.sum() - sum((float(np.sum(qi)) for _, _, qi in
                                             self._parts()), 0.0)
        return self._rest

    def at(self, pos):
        rows = self.idx[pos]
        return self._vals(rows) * self.q[rows]

    def dot(self, x):
        key = id(x)
        if key not in self._dots:  # (over blocks of the rows idx, as _Weights)
            val = self.base * self.q.dot(x)
            for rows, vals, qi in self._parts():
                xi = x[rows]
                val += float(np.dot(vals * qi, xi)) - self.base * float(np.dot(qi, xi))
            self._dots[key] = (x, val)
        return self._dots[key][1]

    def total(self):
        return self.base * self.q_rest() + sum(
            (float(np.dot(qi, vals)) for _, vals, qi in self._parts()), 0.0)

    def phi_total(self, divergence):
        phi_base = _phi_sum(np.array([self.base]), divergence)
        return phi_base * self.q_rest() + sum(
            (float(np.dot(qi, phi(vals, divergence))) for _, vals, qi in self._parts()), 0.0)

    def array(self):
        w = np.full(self.n, self.base)
        for rows, vals, _ in self._parts():
            w[rows] = vals
        return w


def _near_rows(a, h, tol=1e-10) -> np.ndarray:
    """The rows of :func:`_near` (``a_i <= h + tol h``) without their prices: counted, then
    written per block into one array of :func:`row_index_dtype` (no int64 positions)."""
    thr = h + tol * h
    n = a.size
    blocks = [(s, min(s + REDUCED_BLOCK, n)) for s in range(0, n, REDUCED_BLOCK)]
    out = np.empty(sum(int(np.count_nonzero(a[s:e] <= thr)) for s, e in blocks),
                   dtype=row_index_dtype(n))
    at = 0
    for s, e in blocks:
        k = np.flatnonzero(a[s:e] <= thr)
        np.add(k, s, out=out[at:at + k.size], casting="unsafe")
        at += k.size
    return out


def _tied_positions(a, cand, h, tol=1e-10) -> np.ndarray:
    """The positions in ``cand`` of the rows not below ``h`` (``a_i >= h - tol h``: the
    plan's ties), per block of ``cand``."""
    lim = h - tol * h
    parts = [np.flatnonzero(a[cand[s:s + REDUCED_BLOCK]] >= lim) + s
             for s in range(0, cand.size, REDUCED_BLOCK)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.intp)


def _row_weight_fn(h, sol, theta2, divergence):
    """The weight of a row of price ``a`` at ``h`` as a function (the numbers
    :func:`_weights` computes for an array of candidate prices), for the closed form of KL
    (its unit weight), chi2 (the dual's alpha) and theta2 = inf; None otherwise."""
    if not math.isfinite(h):
        return None
    if math.isinf(theta2):
        return lambda a: np.ones(np.shape(a))
    info = sol.info if sol is not None else {}
    if divergence == "kl" and info.get("unit_weight", 0.0) > 1e-250:
        uw = float(info["unit_weight"])
        log_uw = math.log(uw)

        def kl(a, with_phi=False):  # uw exp(max(h - a, 0) / theta2), in one buffer
            v = np.subtract(h, a)
            np.maximum(v, 0.0, out=v)
            v /= theta2
            if not with_phi:
                np.exp(v, out=v)
                v *= uw
                return v
            w = np.exp(v)
            w *= uw
            return w, _phi_kl_logs(w, np.add(v, log_uw, out=v))
        kl.gives_phi = True  # type: ignore[attr-defined]
        kl.theta2, kl.log_uw = theta2, log_uw  # type: ignore[attr-defined]
        return kl
    if divergence == "chi2" and sol is not None and sol.alpha is not None \
            and sol.solver in CHI2_ALPHA_SOLVERS:
        alpha = float(sol.alpha)

        def chi2w(a):
            return np.maximum((np.maximum(h - a, 0.0) + alpha) / (2.0 * theta2) + 1.0, 0.0)
        chi2w.theta2, chi2w.alpha = theta2, alpha  # type: ignore[attr-defined]
        return chi2w
    return None


def _phi_kl_logs(w, t):
    """phi_KL(w) = w log w - w + 1 given ``t = log w`` (the weights' exponents: no log is
    taken), into ``t``; below ``|w - 1| < NEAR_ONE`` the Taylor series of
    :func:`otstab_solvers.weights.phi` (full relative accuracy near 1)."""
    t *= w
    t -= w
    t += 1.0
    dist = w - 1.0
    np.abs(dist, out=dist)
    near = np.flatnonzero(dist < NEAR_ONE)
    if near.size:
        t[near] = phi(w[near], "kl")
    return t


def _price_weights(rp, h, sol, theta2, divergence, n, loss0, reduced=None):
    """``(w, tied, alpha)`` for :class:`RowPrices` (uniform samples, ``r < 1``): the
    candidates of Q* and its weights (:class:`_PriceWeights`) from one pass over the rows,
    ``tied`` the positions of the candidates not below h (for :func:`_move_plan`); None
    where :func:`_weights` must decide (no closed-form weight, or chi2 weights whose mass is
    not 1 at the dual's alpha)."""
    fn = _row_weight_fn(h, sol, theta2, divergence)
    if fn is None:
        return None
    cand, tied, sums = rp.near_weighted(  # (theta2 = inf: every weight 1, no phi summed)
        h, fn, loss0, None if math.isinf(theta2) else divergence, reduced=reduced)
    if reduced is None:
        sums.pop("n_below")  # (no moves summed)
    base = float(fn(np.array([h]))[0])  # (l_h = 0)
    w = _PriceWeights(n, base, cand, fn, rp, sums, loss0)
    alpha = None if divergence == "kl" else (0.0 if math.isinf(theta2) else float(sol.alpha))
    if divergence == "chi2" and math.isfinite(theta2) and abs(w.total() / n - 1.0) > 1e-13:
        return None  # (the dual's alpha belongs to a slightly different h)
    return w, tied, alpha


def _phi_sum(w, divergence):
    """sum_i phi(w_i), each term accurate also for weights close to 1 (no ``sum w^2 - 2 sum w
    + n`` style cancellation, which a large theta2 would turn into cost)."""
    # over blocks of rows: phi's temporaries stay cache-sized
    return sum((float(np.sum(phi(w[s:s + REDUCED_BLOCK], divergence)))
                for s in range(0, w.size, REDUCED_BLOCK)), 0.0)


def _move_plan(h, w, loss0, r, n, ac, tol=1e-10, below=None, tied=None):
    """Which samples Q* moves: ``(moved, split)`` as positions in ``w.idx`` (the rows with
    ``a_i <= h``, whose ``a`` is ``ac``).

    ``moved`` are the rows moved whole (``a_i < h``, plus tied rows ``a_i = h`` moved one by
    one until the risk reaches r); ``split`` is ``None`` or ``(position, fraction moved)`` for
    the one tied row whose mass is split. Works on the rows with ``a_i <= h`` only.

    Compact weights (uniform samples) with few tied rows: the tied rows are first put last in
    ``w.idx`` (and ``w.vals``), keeping their order, so that the moved rows are the first
    ``moved`` positions (an int, no array of positions) and a split row the next one.
    ``below`` (booleans per candidate) or ``tied`` (the ascending positions of the candidates
    not below h) when known, else from ``ac``.
    """
    t = tol * h
    cand = w.idx
    if tied is None:
        if below is None:
            below = ac < h - t
        tied = np.flatnonzero(~below)
    n_below = cand.size - tied.size
    compact = w.dense is None and (w.q is None or isinstance(w, _MapWeights)) and \
        tied.size <= max(TIED_LAST_MIN, TIED_LAST_SHARE * cand.size)
    if compact and tied.size:
        _tied_last(w, tied, n_below)
        tied = np.arange(n_below, cand.size)
    if compact:
        moved = n_below
    else:
        if below is None:
            below = np.ones(cand.size, dtype=bool)
            below[tied] = False
        moved = np.flatnonzero(below)
    del below
    # the moved rows add their weight where they were classified correctly (loss 0 -> 1);
    # over blocks of them (cache-sized gathers)
    risk = w.dot(loss0)
    if isinstance(w, _PriceWeights):  # (summed by the pass that found the rows)
        risk += w.sums["w_gain"]
    else:
        for s in range(0, n_below, REDUCED_BLOCK):
            mb = slice(s, min(s + REDUCED_BLOCK, n_below)) if compact else \
                moved[s:s + REDUCED_BLOCK]
            risk += float(np.sum(w.at(mb), where=~(loss0[cand[mb]] > 0)))
    need = n * r - risk
    split = None
    if need > 0 and tied.size:
        gain = w.at(tied) * (1.0 - loss0[cand[tied]])
        cg = np.cumsum(gain)
        full = cg <= need * (1 + 1e-15)
        k = int(np.count_nonzero(full))  # (a prefix of the tied rows: the gains are >= 0)
        if full.any():
            if compact:  # the first k tied rows follow the moved ones
                moved = n_below + k
            else:
                moved = np.concatenate([moved, tied[full]])
                moved.sort()
        if k < tied.size and gain[k] > 0:
            before = cg[k - 1] if k > 0 else 0.0
            split = (int(tied[k]), min(max((need - before) / gain[k], 0.0), 1.0))
    return moved, split


def _tied_last(w, tied, n_below):
    """Put the tied positions ``tied`` (ascending) at the end of ``w.idx`` and ``w.vals``, in
    their order, and the positions below ``h`` they displace into their places: only the
    positions involved move (at most twice the tied ones)."""
    size = w.idx.size
    at = np.union1d(tied, np.arange(n_below, size))  # the holes below n_below, then the end
    is_below = np.isin(at, tied, assume_unique=True, invert=True)
    order = np.concatenate([at[is_below], at[~is_below]])
    for arr in (w.idx, w.vals):
        # one weight broadcast over the rows (every order is the same), or None (weights
        # computed from the prices)
        if arr is None or arr.strides == (0,):
            continue
        arr[at] = arr[order]


def _unit(n, q):
    """Every weight 1 (no reweighting)."""
    if q is None:
        return _Weights(n, base=1.0, idx=np.empty(0, dtype=np.intp), vals=np.empty(0))
    return _Weights(n, idx=np.empty(0, dtype=np.intp), dense=np.ones(n), q=q)


def _weights(a, h, sol, theta2, divergence, n, cand, ac, q=None):
    """The weights of Q* at ``h`` (a :class:`_Weights`) and chi2's alpha. Samples with
    ``a_i >= h`` have ``l_h = 0`` and share one weight, so only the rows ``cand`` (a superset
    of ``a_i < h``) get their own (the KL closed form returns the shared weight; chi2 takes
    the dual's exact alpha); otherwise the weights are computed densely. ``q``: n times the
    sample probabilities (None: uniform); the weights are then computed densely with them."""
    if q is not None:
        # the weight map over blocks of rows (no n-vector of l_h): the rows with l_h = 0 share
        # its weight at 0, the rows ``cand`` get their own
        wm = weight_map_blocks(lambda s, e: np.maximum(h - a[s:e], 0.0), n, theta2,
                               divergence, p=q.p)
        if ac is None:  # (computed from the prices when read)
            return _MapWeights(n, wm, h, a, cand, q), wm.alpha
        vals = wm(np.maximum(h - ac, 0.0))
        return _Weights(n, base=float(wm(np.zeros(1))[0]), idx=cand, vals=vals, q=q), wm.alpha
    if math.isinf(theta2):
        # every weight 1: one read-only number broadcast over the rows (no array of ones,
        # which at r near 1 is an n-vector)
        return _Weights(n, base=1.0, idx=cand, vals=np.broadcast_to(1.0, (cand.size,))), \
            (None if divergence == "kl" else 0.0)
    info = sol.info if sol is not None else {}
    if divergence == "kl" and info.get("unit_weight", 0.0) > 1e-250 and math.isfinite(h):
        uw = float(info["unit_weight"])
        # uw exp(max(h - a, 0) / theta2), in one buffer (the same numbers)
        vals = np.subtract(h, ac)
        np.maximum(vals, 0.0, out=vals)
        vals /= theta2
        np.exp(vals, out=vals)
        vals *= uw
        return _Weights(n, base=uw, idx=cand, vals=vals), None
    if divergence == "chi2" and sol is not None and sol.alpha is not None \
            and math.isfinite(h) and sol.solver in CHI2_ALPHA_SOLVERS:
        alpha = float(sol.alpha)
        base = max(alpha / (2.0 * theta2) + 1.0, 0.0)
        vals = np.maximum((np.maximum(h - ac, 0.0) + alpha) / (2.0 * theta2) + 1.0, 0.0)
        w = _Weights(n, base=base, idx=cand, vals=vals)
        if abs(w.total() / n - 1.0) <= 1e-13:
            return w, alpha
        # the dual's alpha belongs to a slightly different h: recompute it exactly below
    shift = 0.0
    if isinstance(a, RowPrices):  # the dense weights need every price
        a = a.array()
    if math.isfinite(h) and a.size and h >= float(a.max()):
        # every sample moves (r = 1): l_h = h - a, and the weights depend on l_h only up to a
        # constant (KL) or through l_h + alpha (chi2): use -a, without the rounding of h - a
        lh, shift = -a, h
    else:
        lh = np.maximum(h - a, 0.0)
    if divergence == "kl":
        return _Weights(n, idx=cand, dense=kl_weights(lh, theta2)), None
    w, alpha, _ = chi2_solution(lh, theta2)
    return _Weights(n, idx=cand, dense=w), alpha - shift


@dataclass(frozen=True)
class _Inputs:
    """What every answer of one 0/1 certificate shares (:func:`_finish`, :func:`_limit_result`):
    the prices ``a`` and losses ``loss0`` of the samples, the question (``r``, ``theta1``,
    ``theta2``, ``divergence``), the data ``X`` and the nearest misclassified points
    ``X_near``, the labels ``y``, the model's loss function, the result's ``names`` and
    ``index``, the start time, the distances ``dstar`` and the base risk."""

    a: Any
    loss0: np.ndarray
    r: float
    theta1: float
    theta2: float
    divergence: str
    X: Any
    X_near: Any
    y: Any
    losses_fn: Any
    names: Any
    index: Any
    t_start: float
    dstar: Any
    base: float | None = None


def _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, X, X_near, y, losses_fn,
                     names, index, t_start, dstar, base=None, *, exact=True, value_lower=0.0,
                     p=None):
    """Edge cases, the exact 0/1 dual, Q* and its audit. ``exact=False`` when the distances
    are upper bounds (a perturbation search): the answer is then an upper bound on R and
    ``value_lower`` the certified lower bound passed to the audit. ``p``: the sample
    probabilities (None: uniform)."""
    n = a.size
    rp = a if isinstance(a, RowPrices) else None  # prices computed per block
    base = pmean(loss0, p) if base is None else base
    q = None if p is None else _RowMass(p, n)
    # (any, all finite prices among the charged samples, the largest error rate reachable by
    # moving alone): one pass, only if an edge case below asks
    reach = Lazy(lambda: _reach(a, loss0, p))
    method = "dual" if solver == "dual" else "closed_form"
    no_moves = (np.empty(0, dtype=np.intp), None)
    common = _Inputs(a=a, loss0=loss0, r=r, theta1=theta1, theta2=theta2,
                     divergence=divergence, X=X, X_near=X_near, y=y, losses_fn=losses_fn,
                     names=names, index=index, t_start=t_start, dstar=dstar, base=base)
    if audit.reached(r, base):
        message = f"r = {r:g} <= base error rate {base:.6g}: no perturbation is needed"
        res = _finish(common, value=0.0, h=0.0, alpha=(0.0 if divergence == "chi2" else None),
                      status="zero", message=message, plan=no_moves,
                      w=_unit(n, q), solver_name="none", sol=None,
                      log=[{"solver": "none", "status": "zero", "reason": message}])
        audit.mark_edge(res, "zero")
        return res
    unreachable = None
    if math.isinf(theta2) and r > reach()[2]:
        unreachable = (f"r = {r:g} exceeds the largest error rate reachable by moving "
                       "samples alone (theta2 = inf and some samples cannot be moved)")
    if unreachable is None and base == 0.0 and not reach()[0]:
        unreachable = ("no sample is misclassified and none can be moved "
                       "(theta1 = inf, a zero model or masked features)")
    if unreachable is None and r >= 1.0 and not reach()[1]:
        if base > 0 and math.isfinite(theta2):
            res = _limit_result(common, p=p)
            audit.mark_edge(res, "limit")
            return res
        unreachable = "r = 1 needs every sample misclassified, which moving cannot achieve here"
    if unreachable:
        res = _finish(common, value=math.inf, h=math.nan, alpha=None, status="unreachable",
                      message=unreachable, plan=no_moves, w=_unit(n, q),
                      solver_name="none", sol=None,
                      log=[{"solver": "none", "status": "unreachable", "reason": unreachable}])
        audit.mark_edge(res, "unreachable")
        return res

    # what the window pass keeps for Q*'s pass: the audit's reduced form (above
    # AUDIT_DIRECT_MAX rows) and the losses
    fuse = (X_near.reduced if isinstance(X_near, NearPoints) and X_near.moves_fn and
            X is not None and n > audit.AUDIT_DIRECT_MAX else None, loss0)

    def attempt(how):
        def thunk():
            # (RowPrices: one sorted copy for the solve, freed before Q* is built)
            if p is not None and r < 1.0:
                sol = _weighted_dual(a, p, r, theta2, divergence)
            elif p is not None:  # (r = 1: the dense dual, one n-vector of prices)
                sol = solve_zero_one(a.array() if rp is not None else a, r, theta2,
                                     divergence, method=how, p=dense(p))
            elif rp is None:
                sol = solve_zero_one(a, r, theta2, divergence, method=how, p=p)
            elif how == "closed_form" and r < 1.0 and (divergence == "kl" or
                                                       math.isinf(theta2)):
                # a window of the sorted prices around the answer (one pass, no sorted
                # copy); else: Q* moves at most r n samples, the cheapest: their prices are
                # all the closed form needs (sorted, with a margin; all of them when the
                # margin is short)
                rp._fuse = fuse  # (the window pass keeps the rows below its window)
                sol = rp.solve_window(r, theta2, divergence)
                rp._fuse = None
                if sol is None:
                    sol = solve_zero_one(rp.smallest(r), r, theta2, divergence, method=how,
                                         presorted=True, n=n)
                if sol.native_status == "needs more prices":
                    sol = solve_zero_one(rp.sorted(), r, theta2, divergence, method=how,
                                         presorted=True)
            elif how == "closed_form" and r < 1.0 and divergence == "chi2":
                # the chi2 closed form from a window of the sorted prices (no sorted
                # n-vector); else the dual on every sorted price
                rp._fuse = fuse
                sol = rp.solve_window(r, theta2, divergence)
                rp._fuse = None
                if sol is None:
                    sol = solve_zero_one(rp.sorted(), r, theta2, divergence, method=how,
                                         presorted=True)
            else:
                sol = solve_zero_one(rp.sorted(), r, theta2, divergence, method=how,
                                     presorted=True)
            if sol.status != OPTIMAL:
                raise audit.Skip(f"0/1 {how} reported {sol.native_status!r}", sol.status)
            # (above AUDIT_DIRECT_MAX rows, where the audit sums the moves from the scores,
            # the pass that finds the rows sums those of the rows below h)
            red = X_near.reduced if isinstance(X_near, NearPoints) and X_near.moves_fn \
                and X is not None and n > audit.AUDIT_DIRECT_MAX else None
            got = _price_weights(rp, sol.h, sol, theta2, divergence, n, loss0, red) \
                if rp is not None and p is None and r < 1.0 else None
            if got is not None:  # (no n-vector of prices or weights: from the scores)
                w, tied, alpha = got
                del got
                cand = w.idx
                ac = None
                plan = _move_plan(sol.h, w, loss0, r, n, None, tied=tied)
                del tied
            elif q is not None and r < 1.0 and MAP_WEIGHTS:
                # sample weights: the candidate rows written per block (int32, no n-vector
                # of int64 positions), their weights and masses computed from the prices when
                # read (_MapWeights: no array of the candidates' prices, weights or masses),
                # the tied ones as positions
                cand = _near_rows(a, sol.h)
                w, alpha = _weights(a, sol.h, sol, theta2, divergence, n, cand, None, q)
                plan = _move_plan(sol.h, w, loss0, r, n, None,
                                  tied=_tied_positions(a, cand, sol.h))
                ac = None
            else:
                cand, ac = _near(a, sol.h) if rp is None else rp.near(sol.h)
                w, alpha = _weights(a, sol.h, sol, theta2, divergence, n, cand, ac, q)
                plan = _move_plan(sol.h, w, loss0, r, n, ac)
            if rp is not None:  # (what the window pass kept is not read again: the result
                rp._fused = None  # holds the prices, for res.info["dstar"])
            # the dual objective at h from the rows that move (the audit's weak-duality check;
            # at r = 1 the value is a closed form without h r - T(h): no check). One pass over
            # those rows (an exp each for KL): done where the audit re-scores every row anyway
            # or where few rows move, so that the large-n path keeps its cost
            cheap = n <= audit.AUDIT_DIRECT_MAX or cand.size <= n // DUAL_CHECK_SHARE
            if cheap and ac is None:
                ac = a[cand]
            dual_at_h = _dual_at_h(sol.h, r, theta2, divergence, n, cand, ac, alpha, p) \
                if r < 1.0 and math.isfinite(sol.h) and cheap else None
            del cand, ac  # (the weights keep the rows; their prices are not needed again)
            res = _finish(common, value=float(sol.value), h=sol.h, alpha=alpha, status="candidate",
                          message="", plan=plan, w=w, solver_name=sol.solver, sol=sol, log=[],
                          dual_at_h=dual_at_h)
            return res, exact, value_lower
        return thunk

    attempts = [(method, attempt(method))]
    if solver == "auto" and method == "closed_form" and p is None:
        attempts.append(("dual", attempt("dual")))  # the kink-exact dual on the distances
    return audit.first_accepted(attempts, solver=solver)


def _weighted_dual(a, p, r, theta2, divergence):
    """The 0/1 dual with sample probabilities ``p``, summed over blocks of rows
    (:class:`~otstab_solvers.blockwise.BlockwiseDual` of ``l_h = (h - a_i)_+``): no sorted copy
    of the prices, no n-vector of ``l_h``; kink-exact like the dense dual it replaces."""
    n = a.size
    blocks = [price_block(a, s, min(s + REDUCED_BLOCK, n), p)
              for s in range(0, n, REDUCED_BLOCK)]
    sol = solve_dual(BlockwiseDual(in_memory(blocks), n, 1.0), r, theta2, divergence)
    sol.solver = "zero_one_dual"
    return sol


def _dual_at_h(h, r, theta2, divergence, n, cand, ac, alpha, p=None) -> float:
    """``h r - T(h)`` from the rows ``cand`` (prices ``ac``, a superset of ``a_i < h``; every
    other row has ``l_h = 0``): T is the divergence term of ``l_h = (h - a)_+`` (chi2 at the
    builder's ``alpha``: any alpha gives a lower bound). Written in ``expm1`` / ``l + alpha``
    form, so that a large theta2 does not cancel. O(|cand|)."""
    lc = np.maximum(h - ac, 0.0)
    pc = np.full(lc.size, 1.0 / n) if p is None else p[cand]
    rest = (n - lc.size) / n if p is None else max(1.0 - float(np.sum(pc)), 0.0)
    if math.isinf(theta2):
        T = float(pc @ lc)
    elif divergence == "kl":
        M = float(lc.max()) if lc.size else 0.0
        s = rest * math.expm1(-M / theta2) + float(pc @ np.expm1((lc - M) / theta2))
        T = M + theta2 * math.log1p(s)
    else:
        two = 2.0 * theta2

        def part(v):  # theta2 (w^2 - 1), w = ((l + alpha) / (2 theta2) + 1)_+
            return np.where(v + two > 0, v + v * v / (2.0 * two), -theta2)
        T = -alpha + rest * float(part(np.array([alpha]))[0]) + float(pc @ part(lc + alpha))
    return h * r - T


def _reach(a, loss0, p=None):
    """``(any, all, top)``: whether any and whether every sample of positive probability has a
    finite price, and the largest error rate reachable by moving alone (the misclassified
    samples plus the correct ones that can move). ``a``: prices, or :class:`RowPrices`
    (its rows per block); with sample weights ``p`` (an array or read by slices) over blocks
    of rows: no n-vector of prices or probabilities."""
    n = a.size
    if p is not None:
        return _reach_weighted(a, loss0, p)
    if isinstance(a, RowPrices):
        any_, all_, movable = a.finite()
        return any_, all_, (float(np.sum(loss0)) + movable) / n
    fin = np.isfinite(a)
    movable = fin & (loss0 == 0)
    top = (float(np.sum(loss0)) + int(np.count_nonzero(movable))) / n
    return bool(fin.any()), bool(fin.all()), top


def _reach_weighted(a, loss0, p):
    """:func:`_reach` with sample weights, block by block. ``top`` is 1 less the P0-mass of
    the rows that can never be misclassified (correct, no finite price): exactly 1 when there
    are none, although the normalised p may sum to 1 - 1 ulp (their probabilities summed in
    one ``np.sum``, as over the whole array)."""
    n = a.size
    any_, all_, stuck = False, True, []
    for s in range(0, n, REDUCED_BLOCK):
        e = min(s + REDUCED_BLOCK, n)
        fin, pb = np.isfinite(a[s:e]), p[s:e]
        live = pb > 0
        lf = fin[live]
        any_ = any_ or bool(lf.any())
        all_ = all_ and bool(lf.all())
        st = ~fin & (loss0[s:e] == 0) & live
        if st.any():
            stuck.append(pb[st])
    return any_, all_, (1.0 - float(np.sum(np.concatenate(stuck))) if stuck else 1.0)


def _limit_result(inputs, p=None):
    a, loss0, theta2, divergence = inputs.a, inputs.loss0, inputs.theta2, inputs.divergence
    n = a.size
    A = loss0 > 0
    if p is None:
        w = _Weights(n, idx=np.empty(0, dtype=np.intp), dense=np.where(A, n / A.sum(), 0.0))
        frac_A = A.sum() / n
    else:  # the p-mass of the misclassified samples
        A &= p > 0
        frac_A = float(np.sum(p[A]))
        w = _Weights(n, idx=np.empty(0, dtype=np.intp), dense=np.where(A, 1.0 / frac_A, 0.0),
                     q=_RowMass(p, n))
    value = theta2 * (math.log(1 / frac_A) if divergence == "kl" else (1 / frac_A - 1))
    msg = ("r = 1 is attained only in the limit h -> inf, with all mass on the misclassified "
           "samples")
    return _finish(replace(inputs, X_near=None), value=value, h=math.inf, alpha=None,
                   status="limit", message=msg, plan=(np.empty(0, dtype=np.intp), None), w=w,
                   solver_name="none", sol=None,
                   log=[{"solver": "none", "status": OPTIMAL, "reason": msg}])


def _finish(inputs, *, value, h, alpha, status, message, plan, w, solver_name, sol, log,
            dual_at_h=None):
    """Q* and its audit (``inputs``: an :class:`_Inputs`).

    Q* has one atom per sample (moved to its nearest misclassified point or not) plus one
    extra atom for a split sample. Only the moved atoms differ from the data, so the audit
    (cost, risk and mass of Q*) is summed over them and over the compact weights, with the
    model's own loss recomputed at every moved point (above ``audit.AUDIT_DIRECT_MAX`` rows,
    for linear models: from the moved scores, confirmed on ``audit.AUDIT_SAMPLE`` random moved
    rows materialised and re-scored by the model, as the piecewise path does); the per-atom
    arrays (``source``, ``mass``, ``weights``, ``loss_star``, ``X_star``) are built on first
    access.
    """
    a, loss0, r, theta1, theta2 = inputs.a, inputs.loss0, inputs.r, inputs.theta1, inputs.theta2
    divergence, X, X_near, y = inputs.divergence, inputs.X, inputs.X_near, inputs.y
    losses_fn, names, index = inputs.losses_fn, inputs.names, inputs.index
    t_start, dstar, base = inputs.t_start, inputs.dstar, inputs.base
    n = a.size
    moved_pos, split = plan
    if isinstance(moved_pos, int):  # the first positions of w.idx (a split row next)
        k_whole = moved_pos
        if split is not None and split[0] != k_whole:
            raise ValueError("a compact plan's split row follows its moved rows")
        rows = w.idx[:k_whole + (split is not None)]
    else:
        k_whole = moved_pos.size
        # the moved rows (the split row last), gathered without an array of their positions
        rows = np.empty(k_whole + (split is not None), dtype=w.idx.dtype)
        np.take(w.idx, moved_pos, out=rows[:k_whole], mode="clip")  # (valid positions;
        # "clip" writes into ``out`` directly, "raise" would buffer a copy)
        if split is not None:
            rows[-1] = w.idx[split[0]]
    moved = rows[:k_whole]

    def w_rows(s, e):
        """The weights of the moved atoms s..e (gathered per block)."""
        if isinstance(moved_pos, int):  # (the split row, if any, is position k_whole)
            return w.at(slice(s, min(e, rows.size)))
        pos = moved_pos[s:min(e, k_whole)]
        if split is not None and e > k_whole:
            pos = np.append(pos, split[0])
        return w.at(pos)

    def moved_points(sel):
        """(x, x*) of the moved rows ``rows[sel]``."""
        rs = rows[sel]
        Xr = X[rs]
        if not isinstance(X_near, NearPoints):
            return Xr, np.asarray(X_near[rs], dtype=np.float64)
        Xm = X_near.displacement(rs)  # x + (x* - x) in the displacement's buffer
        Xm += Xr
        return Xr, Xm

    # the loss at every moved point and the squared distance moved, over blocks of rows,
    # summed as they come (the moved points are not kept: X_star and the displacement
    # rebuild them when asked; above AUDIT_DIRECT_MAX rows neither are the per-row losses)
    f = split[1] if split is not None else 0.0  # the split atom (the last row) has mass f
    q = w.q
    acc = {"wd2": 0.0, "wdl": 0.0, "qdl": 0.0}

    def accumulate(s, e, lm, dd):
        """Add the moved atoms s..e (losses ``lm``, squared moves ``dd``) to the sums; the
        split atom's share 1 - f that stays is taken back."""
        wr = w_rows(s, e)
        dlb = lm - loss0[rows[s:e]]  # the change of loss of each moved atom
        acc["wd2"] += float(np.dot(wr, dd))
        acc["wdl"] += float(np.dot(wr, dlb))
        acc["qdl"] += float(np.sum(dlb)) if q is None else float(np.dot(q[rows[s:e]], dlb))
        if split is not None and e == rows.size:
            keep = 1.0 - f
            qs = 1.0 if q is None else float(q[rows[-1]])
            acc["wd2"] -= keep * float(wr[-1]) * float(dd[-1])
            acc["wdl"] -= keep * float(wr[-1]) * float(dlb[-1])
            acc["qdl"] -= keep * qs * float(dlb[-1])

    audit_info = {"method": "direct", "sample": int(rows.size), "max_rel_error": 0.0}
    reduced = X_near.reduced if isinstance(X_near, NearPoints) and X_near.moves_fn else None
    if X is not None and X_near is not None and rows.size and reduced is not None \
            and n > audit.AUDIT_DIRECT_MAX:
        # large n: the loss and move of every moved row from the scores (the reduced form),
        # confirmed on a random sample of moved rows materialised and re-scored by the model;
        # with weights from the prices and a compact plan the rows below h (the first
        # positions) were summed by the pass that found them: the tied rows here
        start = 0
        sums = getattr(w, "sums", {})
        if "n_below" in sums and isinstance(moved_pos, int) and sums["n_below"] <= k_whole:
            start = sums["n_below"]
            for key in ("wd2", "wdl", "qdl"):
                acc[key] = sums[key]
        for s in range(start, rows.size, REDUCED_BLOCK):
            accumulate(s, min(s + REDUCED_BLOCK, rows.size), *reduced(rows[s:s + REDUCED_BLOCK]))

        def loss_m():  # the loss at the moved points, for ``loss_star`` (built when asked)
            out = np.empty(rows.size)
            for s in range(0, rows.size, REDUCED_BLOCK):
                out[s:s + REDUCED_BLOCK] = reduced(rows[s:s + REDUCED_BLOCK])[0]
            return out

        pick = audit.sample_positions(rows.size, audit.AUDIT_SAMPLE)
        err = 0.0
        # in blocks: the gathered rows, the moved rows and the moves stay cache-sized
        step = audit.rows_per_block(X.shape[1], min(pick.size, AUDIT_BLOCK_ROWS))
        for s in range(0, pick.size, step):
            rs = rows[pick[s:s + step]]
            # (x, x*) and the reduced form of the sampled rows from one computation of their
            # steps (moved_points and reduced each computed them)
            Xr, Xm, lm, dd = X_near.points_and_reduced(X, rs)
            direct_l, direct_d2 = audit.rescored(losses_fn, y[rs], Xr, Xm)
            err = max(err, audit.sampled_error(direct_l, lm, direct_d2, dd))
        audit_info = {"method": "sampled", "sample": int(pick.size), "max_rel_error": err}
    elif X is not None and X_near is not None and rows.size:
        # (at most AUDIT_DIRECT_MAX rows: the per-row arrays are kept and summed whole, so
        # that the sums do not depend on the block size)
        lm_all = np.empty(rows.size)
        d2 = np.empty(rows.size)
        # cache-sized blocks of each n x d temporary; Dask: one gather
        step = audit.rows_per_block(X.shape[1], MOVED_BLOCK) if isinstance(X, np.ndarray) \
            else rows.size
        for s in range(0, rows.size, step):
            e = min(s + step, rows.size)
            Xr, Xm = moved_points(slice(s, e))
            lm_all[s:e], d2[s:e] = audit.rescored(losses_fn, y[rows[s:e]], Xr, Xm)
        accumulate(0, rows.size, lm_all, d2)
        loss_m = Lazy.of(lm_all)
    else:
        lm_all = np.ones(rows.size)
        d2 = (dstar() if isinstance(dstar, Lazy) else dstar)[rows] if rows.size else \
            np.zeros(0)
        accumulate(0, rows.size, lm_all, np.where(np.isfinite(d2), d2, 0.0))
        loss_m = Lazy.of(lm_all)
    total = w.total()  # sum over atoms of mass * w: a split row's two atoms add up to its w
    move_cost = 0.0 if math.isinf(theta1) else theta1 * acc["wd2"] / n
    rew_cost = 0.0 if math.isinf(theta2) else theta2 * w.phi_total(divergence) / n
    primal = move_cost + rew_cost
    # risk: every atom at loss0, corrected on the moved atoms
    risk_star = (w.dot(loss0) + acc["wdl"]) / n
    base = float(np.mean(loss0)) if base is None else base
    mdl = acc["qdl"]  # sum over the moved atoms of P0-mass * (change of loss)
    moved_risk = base + mdl / n
    if audit_info["max_rel_error"] > audit.SAMPLED_RTOL:  # the reduced form and the model
        primal = math.inf                                  # disagree: never pass this off
    gap = audit.relative_gap(primal, value)
    if status == "unreachable":
        primal, gap = math.nan, math.nan
    n_atoms = n + (split is not None)

    split_row = int(rows[-1]) if split is not None else None

    def source():
        src = np.arange(n_atoms)
        if split is not None:
            src[n] = split_row
        return src

    def mass():
        out = np.ones(n_atoms)
        if split is not None:
            out[split_row], out[n] = 1.0 - f, f
        return out

    def weights():
        wa = w.array()
        return wa if split is None else np.concatenate([wa, wa[split_row:split_row + 1]])

    def loss_star():
        out = np.empty(n_atoms)
        out[:n] = loss0  # (float or boolean losses)
        k = moved.size
        lm = loss_m()
        out[moved] = lm[:k]
        if split is not None:
            out[n] = lm[k]
        return out

    def x_star():
        if X is None:
            return np.empty((n_atoms, 0))
        out = np.empty((n_atoms, X.shape[1]))
        out[:n] = X
        if rows.size:
            Xm = moved_points(slice(None))[1]
            out[moved] = Xm[:moved.size]
            if split is not None:
                out[n] = Xm[-1]
        return out

    def displacement(atoms):
        """x* - x of the atoms ``atoms`` (Q* built blockwise, :mod:`otstab.scale`)."""
        atoms = np.asarray(atoms)
        out = np.zeros((atoms.size, X.shape[1]))
        if rows.size:
            at = np.full(n_atoms, -1, dtype=np.intp)
            at[moved] = np.arange(moved.size)
            if split is not None:
                at[n] = rows.size - 1
            pos = at[atoms]
            sel = pos >= 0
            Xr, Xm = moved_points(pos[sel])
            out[sel] = Xm - Xr
        return out

    return StabilityResult(
        value=value, h=h, alpha=alpha, X_star=x_star, weights=weights, source=source,
        mass=mass, risk_base=base, risk_star=risk_star, total_mass=total / n,
        primal_cost=primal, gap=gap,
        decomposition={"base": base, "corruption": moved_risk - base,
                       "reweighting": risk_star - moved_risk, "cost_moving": move_cost,
                       "cost_reweighting": rew_cost},
        solver=solver_name, status=status,
        solve_time=(sol.solve_time if sol is not None else 0.0), r=r, theta1=theta1,
        theta2=theta2, divergence=divergence, loss="zero_one", message=message,
        solver_log=log, dual_gap_bound=(sol.gap_bound if sol is not None else 0.0),
        iterations=(sol.iterations if sol is not None else 0), split=split is not None,
        loss_star=loss_star,
        loss_base=loss0 if loss0.dtype == np.float64 else (lambda: loss0.astype(np.float64)),
        X=X if X is not None else np.empty((n, 0)), feature_names=names, index=index,
        info=LazyInfo({
            "dstar": dstar, "wall_time": time.perf_counter() - t_start, "audit": audit_info,
            **({"displacement": displacement} if X is not None and X_near is not None
               else {}),
            **({"value_rounding": sol.info["value_rounding"]}
               if sol is not None and "value_rounding" in sol.info else {}),
            # (l_h = h - a rounds to a few ulps of h)
            **({"dual_at_h": dual_at_h, "dual_at_h_rounding": 8.0 * EPS * abs(h)}
               if dual_at_h is not None else {})}),
    )


def certify_zero_one_problem(prob: Problem, r, theta1, theta2, divergence, mask, solver,
                             t_start, **solver_options) -> StabilityResult:
    """0/1 certificate of a linear classifier (called by :func:`otstab.certify`)."""
    if solver not in ("auto", "dual", "closed_form"):
        raise ValidationError(
            f"solver={solver!r} does not apply to loss='zero_one' (use 'auto', 'closed_form' "
            "or 'dual'): the 0/1 loss has no conic program, its dual is solved exactly"
        )
    check_options(solver_options, (), "the exact 0/1 path of a linear classifier")
    assert prob.scorer is not None, "a linear classifier"
    if prob.scorer.task == "binary":
        # the prices per block of rows: the closed form sorts one copy, Q* takes the rows
        # below h; d* itself is built only if ``res.info["dstar"]`` is read. Sample weights
        # are read by slices too (the weighted dual's blocks): no n-vector of prices or p
        a, X_near = linear_prices(prob, mask, theta1)
        return _solve_and_build(a, X_near.misclassified, r, theta1, theta2, divergence,
                                solver, prob.X, X_near, prob.y, prob.losses,
                                prob.feature_names, prob.index, t_start, Lazy(a.dstar),
                                p=prob.weights)
    dstar, X_near = linear_distances(prob, mask)  # 0 where misclassified
    loss0 = X_near.misclassified  # booleans (the float losses are built if asked for)
    a = move_prices(dstar, theta1)
    return _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, prob.X, X_near,
                            prob.y, prob.losses, prob.feature_names, prob.index, t_start,
                            dstar, p=prob.p)


def certify_distances(dstar, r, *, theta1=1.0, theta2=0.25, divergence="kl", solver="auto",
                      misclassified=None, X=None, X_nearest=None) -> StabilityResult:
    """Exact 0/1-loss certificate for any classifier, from precomputed distances.

    Parameters
    ----------
    dstar : array-like (n,)
        Squared distance from each evaluation sample to the nearest misclassified point
        (0 for misclassified samples; ``inf`` if it cannot be misclassified). For nonlinear
        models these are usually upper bounds (see ``otstab.perturbation``), which makes the
        certified value an upper bound on R as well.
    r : float in [0, 1]
        Error-rate threshold.
    misclassified : array-like of bool (n,), optional
        Which samples are misclassified now; default ``dstar == 0``.
    X, X_nearest : arrays (n, d), optional
        The samples and their nearest misclassified points, to build Q* as points.
    """
    t_start = time.perf_counter()
    r, theta1, theta2, divergence = check_common(r, theta1, theta2, divergence)
    if r > 1.0:
        raise ValidationError(f"r is an error rate and must be in [0, 1], got {r}")
    d = as_float_vector(dstar, "dstar", finite=False)
    if not float(d.min()) >= 0.0:  # one pass: the min is NaN if any entry is
        bad = np.flatnonzero(np.isnan(d) | (d < 0))[0]
        raise ValidationError(f"dstar must be >= 0 (inf allowed), without NaN; got {d[bad]} "
                              f"at index {bad}")
    n = d.size
    base = None
    if misclassified is None:
        wrong = d == 0
        base = np.count_nonzero(wrong) / n
        loss0 = wrong.astype(float)
    else:
        loss0 = as_bool_vector(misclassified, "misclassified").astype(float)
        if loss0.shape != (n,):
            raise ValidationError(
                f"misclassified must have shape ({n},), got {loss0.shape}")
    if (X is None) != (X_nearest is None):
        raise ValidationError("pass both X and X_nearest, or neither")
    Xa = Xn = None
    if X is not None:
        Xa = as_float_matrix(X, "X")
        Xn = as_float_matrix(X_nearest, "X_nearest")
        if Xa.shape != Xn.shape or Xa.shape[0] != n:
            raise ValidationError(
                f"X and X_nearest must both have shape ({n}, d); got {Xa.shape} and {Xn.shape}")
    if solver not in ("auto", "dual", "closed_form"):
        raise ValidationError(f"solver must be 'auto', 'closed_form' or 'dual', got {solver!r}")
    if misclassified is not None:  # misclassified samples are at distance 0
        d = np.where(loss0 > 0, 0.0, d)
    # (without ``misclassified``, loss0 > 0 exactly where d == 0: nothing to zero)
    if theta1 == 1.0:
        a = d
    else:
        a = move_prices(d, theta1)

    def losses_fn(Xs, ys):  # without a model, moved atoms are misclassified by construction
        return None

    names = [f"x{j}" for j in range(Xa.shape[1])] if Xa is not None else []
    res = _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, None, None,
                           None, losses_fn, names, None, t_start, d, base=base)
    if Xa is not None:
        assert Xn is not None and res.loss_star is not None and res.loss_base is not None
        moved = res.loss_star > res.loss_base[res.source]
        res.X = Xa
        res.X_star = np.where(moved[:, None], Xn[res.source], Xa[res.source])
        res.feature_names = names
    return res


#: options of the perturbation search (0/1 loss of a nonlinear classifier)
SEARCH_OPTIONS = ("n_directions", "n_refine", "max_radius", "seed")


def demote_unproved(res, value_lower) -> None:
    """A result decided from distances a search could not prove minimal is only an upper
    bound: an ``optimal`` or ``unreachable`` status becomes ``bounds``, with the found value
    as ``value_upper`` and the certified ``value_lower`` (at most the found value)."""
    if res.status in ("unreachable", "optimal"):
        was = res.status
        res.status, res.exact, res.value_upper = "bounds", False, res.value
        res.value_lower = value_lower if was == "unreachable" else min(value_lower, res.value)


def certify_zero_one_search(prob: Problem, *, r, theta1, theta2, divergence, mask, solver,
                            adopt_points=True, **solver_options) -> StabilityResult:
    """0/1 loss of a nonlinear classifier: perturbation distances, then the exact 0/1 dual.

    Options ``n_directions``, ``n_refine``, ``max_radius`` and ``seed`` go to
    :func:`otstab.perturbation.perturbation_search`. The distances are exact for decision trees
    (and tree ensembles with one movable feature), upper bounds otherwise; R is nondecreasing in
    every distance, so the answer is then an upper bound on R (``status = 'bounds'``). For
    scikit-learn tree ensembles and MLPs, :mod:`otstab.bounds` proves lower bounds on the
    distances (options ``max_nodes``, ``time_budget``, ``progress``), and the same dual on them
    gives the certified ``value_lower``. ``adopt_points``: the misclassified inputs the lower
    bounds' searches end on (tree boxes with one leaf per tree, MLP regions), re-checked by
    the model, replace farther found points (deterministic under a node budget, which
    reproduces a time-stopped search).
    """
    if r > 1.0:
        raise ValidationError(
            f"r is an error rate for loss='zero_one' and must be in [0, 1], got {r}")
    if solver not in ("auto", "dual", "closed_form", "first_order"):
        raise ValidationError(f"solver={solver!r} does not apply to loss='zero_one' (use "
                              "'auto', 'closed_form' or 'dual')")
    check_options(solver_options, SEARCH_OPTIONS + bounds.BOUND_OPTIONS,
                  "the 0/1 loss of a nonlinear classifier (the perturbation search)")
    bound_options = {k: solver_options.pop(k) for k in bounds.BOUND_OPTIONS
                     if k in solver_options}
    t_start = time.perf_counter()
    model = prob.nonlinear if prob.nonlinear is not None else prob.model
    if prob.nonlinear is None and prob.scorer is not None:
        sc = prob.scorer
        model = LinearDifferentiable(sc.W, sc.b, sc.task, sc.classes)
    loss0 = prob.losses(prob.X)
    from . import _tree_found as tree_found  # (numba, when installed: loaded only here)

    # (the dual's h tells the tree found side which samples to refine)
    pr, table = tree_found.tree_search(
        model, prob.X, prob.y, mask=mask,
        duals=ZeroOneDuals(loss0, r, theta1, theta2, divergence, prob.p),
        progress=bool(bound_options.get("progress", False)), **solver_options)
    pr = neural_search.refine_result(model, prob.X, prob.y, pr, mask, prob.losses)
    dstar = np.where(loss0 > 0, 0.0, pr.distances)
    a = move_prices(dstar, theta1)
    X_near = np.where(np.isfinite(pr.points), pr.points, prob.X)
    value_lower, lower_info = 0.0, None
    if not pr.exact:
        # rtol: refine first the samples that decide R (otstab.solve._refine; default 0.01)
        bound_options.setdefault("rtol", RTOL)
        if table is not None:
            bound_options["table"] = table  # the leaf table read by the found side
        lower = bounds.certified_distances(
            model, prob.X, prob.y, mask=mask, upper=dstar,
            duals=ZeroOneDuals(loss0, r, theta1, theta2, divergence, prob.p), **bound_options)
        if lower is not None:
            dlow, lower_info = lower
            met = lower_info.pop("region_points", None)
            dstar, X_near = neural_search.adopt_points(  # closer points the bounds met
                model, prob.X, prob.y, dstar, X_near, met if adopt_points else None,
                prob.losses)
            a = move_prices(dstar, theta1)
            value_lower = bounds.zero_one_lower_value(dlow, loss0, r, theta1, theta2,
                                                      divergence, prob.p)
    res = _solve_and_build(a, loss0, r, theta1, theta2, divergence,
                           "dual" if solver == "dual" else "auto", prob.X, X_near, prob.y,
                           prob.losses, prob.feature_names, prob.index, t_start, dstar,
                           exact=bool(pr.exact), value_lower=value_lower, p=prob.p)
    res.info.update({"perturbation_method": pr.method, "n_predictions": pr.n_predictions})
    if lower_info is not None:
        res.info["lower_bound"] = lower_info
    if not pr.exact:
        demote_unproved(res, value_lower)
    if not pr.exact and res.status == "bounds":
        how = (f"the lower end is proved by {lower_info['method']} lower bounds on the "
               "distances" if lower_info is not None else
               "no certified lower bound is available for this model (value_lower = 0)")
        how_found = ("search" if pr.method == "search"
                     else f"{pr.method.replace('_', '-')} search")
        note = (f"distances to misclassification found by a {how_found} are upper "
                f"bounds, so the value is an upper bound on R (value_upper); {how}")
        res.message = f"{res.message}; {note}" if res.message else note
    return res
