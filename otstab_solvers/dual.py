"""Specialised solvers for the 1-D (KL) and 2-D (chi2) duals (MATH.md, Proposition 1).

The dual objective, as a function of the scalar ``h >= 0``, is concave:

- KL:   F(h) = h r - theta2 log mean_i exp(l_h(z_i)/theta2)
- chi2: F(h) = h r - [-alpha - theta2 + theta2 mean_i w_i^2] at the exact alpha(h)
  (alpha solves the piecewise-linear equation of Remark 5 by a sort)
- theta2 = inf (either divergence): F(h) = h r - mean_i l_h(z_i)

Its derivative (envelope theorem) is ``g(h) = r - E_w[d l_h/dh]`` with ``d l_h/dh`` the loss at
the maximiser; ``g`` is nonincreasing. We find the root of ``g`` by a safeguarded Newton method
inside a bracket ``[lo, hi]`` with ``g(lo) > 0 > g(hi)``. For the piecewise-linear reduced form
``l_h = max_k c1[i,k] h + c2[i,k] h^2`` the derivative jumps at "kinks" (a sample switches
piece); the solver locates them exactly: when the samples that switch between ``lo`` and ``hi``
all switch at one point, the root is that kink if ``g`` changes sign across it, else the
bracket is cut there. So optima at a kink (common for hinge and 0/1 losses) are found exactly,
not by slow bisection.

Every function evaluation is O(nK): the pieces are scanned one at a time over contiguous 1-D
columns, so no n x K temporary is made. The hinge shape (two pieces, one of them zero) is
evaluated from sorted keys instead (:mod:`otstab_solvers.sorted_oracle`); for KL and
theta2 = inf :func:`solve_two_piece` sorts only the keys whose kinks lie in a bracket found on a
subsample, not all n (chi2: also those where its active set may end).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import sorted_kernels as kernels
from .result import FAILED, OPTIMAL, DualSolution
from .sorted_oracle import SortedTwoPiece, WindowMiss, window_thresholds
from .weights import (
    chi2_dual_term,
    chi2_solution,
    kl_dual_term,
    log_mean_shifted,
    pmean,
    support_max,
)

__all__ = ["PiecewiseOracle", "AffineRows", "AffineOracle", "oracle_for", "solve_dual",
           "solve_two_piece", "negated_keys", "sorted_view_of", "keys_umax", "dual_objective",
           "refine", "WINDOW_MIN_N", "WINDOW_SUBSAMPLE"]

#: below this many samples :func:`solve_two_piece` sorts every key (a sort is cheap there)
WINDOW_MIN_N = 1 << 17
#: keys of the subsample on which :func:`solve_two_piece` locates the bracket of its window
WINDOW_SUBSAMPLE = 1 << 14
#: relative half-widths of the windows tried around the subsample's h, in turn
WINDOW_WIDTHS = (0.06, 0.25, 0.75)
#: a window's front (the keys that move at every h of its bracket: up to 0.97 n) is computed
#: from the rows where a pass reads it, not stored (compiled kernels, rows forms of the hinge
#: shape: ``SortedTwoPiece.window(front_rows=True)``); False: stored
WINDOW_FRONT_FROM_ROWS = True
#: below this share of effective samples under the subsample's KL weights at its h (the
#: weights concentrate on the largest losses when r nears the largest loss) the first
#: window is skipped: the subsample's h is then off by up to 8 % (n = 1e6, three data sets,
#: r = base + 0.9 .. 0.99 (largest - base): effective sizes 114-491 of 16,384; at the
#: middle 3,176-4,000 and off by at most 1.5 %), and a missed window costs a second write
#: of the keys and two more exact passes
WINDOW_ESS_SHARE = 1.0 / 16.0


def tie_step(vmax, d, kk, v, dk, k: int, scale, right: bool) -> None:
    """One piece ``k`` (values ``v``, derivatives ``dk``) of the one-sided tie rule, in place
    on the running largest value ``vmax``, its derivative ``d`` and piece ``kk``: the piece
    is taken where it is above the largest by more than ``scale``, or within ``scale`` of it
    with a larger (``right``) or smaller derivative. Shared by :class:`PiecewiseOracle` and
    :class:`otstab_solvers.multiclass.MulticlassOracle`, so that both decide ties alike."""
    diff = v - vmax
    cand = diff >= -scale
    cand &= (diff > scale) | ((dk > d) if right else (dk < d))
    np.copyto(d, dk, where=cand)
    np.copyto(kk, k, where=cand)
    np.maximum(vmax, v, out=vmax)


def tie_step_both(vmax, d_lo, d_hi, k_lo, k_hi, v, dk, k: int, scale) -> None:
    """:func:`tie_step` for both sides at once (``scan``): the piece replaces both where it is
    above the largest by more than ``scale``; within ``scale`` of it, the low side where its
    derivative is smaller and the high side where it is larger."""
    diff = v - vmax
    above = diff > scale
    tie = np.abs(diff) <= scale
    np.copyto(d_lo, dk, where=above)
    np.copyto(d_hi, dk, where=above)
    np.copyto(k_lo, k, where=above)
    np.copyto(k_hi, k, where=above)
    if tie.any():
        lo_upd = tie & (dk < d_lo)
        hi_upd = tie & (dk > d_hi)
        np.copyto(d_lo, dk, where=lo_upd)
        np.copyto(k_lo, k, where=lo_upd)
        np.copyto(d_hi, dk, where=hi_upd)
        np.copyto(k_hi, k, where=hi_upd)
    np.maximum(vmax, v, out=vmax)


class PiecewiseOracle:
    """``l_h`` of the reduced form ``max_k c1[i,k] h + c2[i,k] h^2`` and its derivatives.

    ``evaluate(h)`` returns ``(l_h, right derivative, second derivative)``, each of shape (n,);
    at a tie the piece with the largest derivative is taken (the right derivative; ``side="left"``
    takes the smallest). The pieces are scanned one at a time over contiguous 1-D columns, so no
    n x K temporary is made; work is O(nK) per evaluation.
    """

    h_max = math.inf
    TIE = 1e-12
    #: a :class:`~otstab_solvers.sorted_oracle.SortedTwoPiece` for the same ``l_h`` when the
    #: reduced form has the hinge shape (set by :func:`oracle_for`); ``solve_dual`` then
    #: evaluates from prefix sums
    prefix: Any = None
    _hinge_piece: int | None = None
    #: the sample probabilities of a block (set by :mod:`otstab_solvers.blockwise`)
    p: np.ndarray | None

    def __init__(self, c1, c2, *, c1abs: float | None = None):
        c1 = np.asarray(c1, dtype=np.float64)
        c2 = np.asarray(c2, dtype=np.float64)
        if c2.ndim == 1:
            c2 = c2[None, :]
        self.n, self.K = c1.shape
        self.c1 = c1
        self.c2 = c2
        self._c1T = np.ascontiguousarray(c1.T)  # (K, n): each piece a contiguous column
        self._rowwise = c2.shape[0] > 1
        self._c2T = np.ascontiguousarray(c2.T) if self._rowwise else c2[0]
        c2z = (~np.any(c2 != 0, axis=0))
        self._zero = [bool(c2z[k] and not np.any(self._c1T[k])) for k in range(self.K)]
        # the largest |c1| (the scale of the tie tolerance); ``c1abs``: that of a larger data
        # set these rows are a block of, so that ties are decided as on all of it
        self._c1max = self._c1T.max(axis=1) if self.n else np.zeros(self.K)  # per piece
        self._c1abs = float(c1abs) if c1abs is not None else (
            max(float(self._c1max.max()), -float(self._c1T.min())) if c1.size else 0.0)

    @property
    def c1abs(self) -> float:
        """The largest |c1[i, k]| the tie tolerance is scaled by."""
        return self._c1abs

    def _c2k(self, k):
        return self._c2T[k]

    def with_c2(self, c2) -> PiecewiseOracle:
        """The same ``c1`` with another ``c2`` (shares the transposed ``c1``; used for
        per-feature scores, where only ``c2`` changes)."""
        c1T = self._c1T  # (an AffineOracle builds its whole array here)
        new = object.__new__(PiecewiseOracle)
        new.__dict__.update(self.__dict__)
        new._c1T, new.c1 = c1T, c1T.T
        c2 = np.asarray(c2, dtype=np.float64)
        if c2.ndim == 1:
            c2 = c2[None, :]
        new.c2 = c2
        new._rowwise = c2.shape[0] > 1
        new._c2T = np.ascontiguousarray(c2.T) if new._rowwise else c2[0]
        c2z = ~np.any(c2 != 0, axis=0)
        new._zero = [bool(c2z[k] and not np.any(self._c1T[k])) for k in range(self.K)]
        new.prefix = None
        if self.prefix is not None and not new._rowwise:
            k1 = self._hinge_piece
            assert k1 is not None  # a prefix view is made for a hinge shape only
            if new._zero[1 - k1] and c2[0, k1] >= 0:
                new.prefix = self.prefix.with_c(float(c2[0, k1]))
        return new

    def scan(self, h: float, tol: float | None = None, rows=None):
        """(l_h, k_lo, d_lo, k_hi, d_hi): the tied pieces with the smallest and largest
        derivative at ``h`` (the same piece where there is no tie). Ties are values within
        ``tol`` times a bound on the terms |c1| h + c2 h^2 over all samples. ``rows``: only these
        samples (a slice or an index array; the tie threshold stays that of all samples)."""
        tol = self.TIE if tol is None else tol
        sel = slice(None) if rows is None else rows
        if self.K == 2 and self._zero[0] and not self._zero[1]:
            return self._scan_after_zero(h, tol, sel)
        n = self._rows_in(sel) if self.K else 0
        hh = h * h
        # None until the first piece (the arrays then)
        vmax: Any = None
        d_lo: Any = None
        d_hi: Any = None
        k_lo = np.zeros(n, dtype=np.intp)
        k_hi = np.zeros(n, dtype=np.intp)
        scale = None
        for k in range(self.K):
            c1k: Any = None if self._zero[k] else self._piece(k, sel)
            c2k = self._c2T[k][sel] if self._rowwise else self._c2T[k]
            if self._zero[k]:
                v = np.zeros(n)
                dk = v
            else:
                dk = c1k + (2.0 * h) * c2k
                v = c1k * h + c2k * hh if self._rowwise or c2k != 0.0 else c1k * h
            if vmax is None:
                vmax, d_lo, d_hi = v.copy(), dk.copy(), dk.copy()
                continue
            if scale is None:
                scale = tol * self._bound(h)
            tie_step_both(vmax, d_lo, d_hi, k_lo, k_hi, v, dk, k, scale)
        return vmax, k_lo, d_lo, k_hi, d_hi

    def _scan_after_zero(self, h, tol, sel):
        """:meth:`scan` when piece 0 is identically zero and piece 1 is not (the hinge
        shape): the same numbers with masks instead of masked copies. Against the zero piece
        (value and derivative 0) piece 1 wins where it is above, and a tie goes to it on the
        side its derivative lies (low side: negative, high side: positive)."""
        c1k = self._piece(1, sel)
        c2k = self._c2T[1][sel] if self._rowwise else self._c2T[1]
        dk = c1k + (2.0 * h) * c2k
        v = c1k * h + c2k * (h * h) if self._rowwise or c2k != 0.0 else c1k * h
        scale = tol * self._bound(h)
        above = v > scale
        tie = np.abs(v) <= scale
        if not tie.any():  # the usual case: both sides are the same arrays
            d = np.where(above, dk, 0.0)
            k = above.astype(np.intp)
            np.maximum(v, 0.0, out=v)
            return v, k, d, k, d
        lo = above | (tie & (dk < 0.0))
        hi = above | (tie & (dk > 0.0))
        d_lo = np.where(lo, dk, 0.0)
        d_hi = np.where(hi, dk, 0.0)
        np.maximum(v, 0.0, out=v)
        return v, lo.astype(np.intp), d_lo, hi.astype(np.intp), d_hi

    def values_max(self, h: float) -> float:
        """The largest l_h over all samples, in O(K): each piece's value is nondecreasing in
        c1 at h >= 0 and rounding is monotone, so the largest is reached at the piece's
        largest c1 with the same arithmetic as :meth:`values` (rowwise c2: computed)."""
        if self._rowwise or not self.n:
            return float(np.max(self.values(h))) if self.n else 0.0
        hh = h * h
        out = -math.inf
        for k in range(self.K):
            if self._zero[k]:
                v = 0.0
            else:
                c2k = self._c2T[k]
                v = float(self._c1max[k] * h + c2k * hh if c2k != 0.0 else self._c1max[k] * h)
            out = max(out, v)
        return out

    def values(self, h: float, rows=None) -> np.ndarray:
        """l_h of the samples ``rows`` (a slice or index array; default all): the first output
        of :meth:`scan`, computed alone (the same arithmetic, so the same numbers)."""
        sel = slice(None) if rows is None else rows
        hh = h * h
        vmax: Any = None  # the array from the first piece on
        v: Any
        for k in range(self.K):
            if self._zero[k]:
                v = 0.0
            else:
                c1k = self._piece(k, sel)
                c2k = self._c2T[k][sel] if self._rowwise else self._c2T[k]
                v = c1k * h + c2k * hh if self._rowwise or c2k != 0.0 else c1k * h
            if vmax is None:
                vmax = np.zeros(self._rows_in(sel)) + v
            else:
                np.maximum(vmax, v, out=vmax)
        return vmax

    def _piece(self, k: int, sel) -> np.ndarray:
        """``c1[sel, k]`` (a view or a gathered copy; read-only use)."""
        return self._c1T[k][sel]

    def _rows_in(self, sel) -> int:
        """How many samples ``sel`` (a slice, an index array or a boolean mask) selects."""
        if isinstance(sel, slice):
            return len(range(*sel.indices(self.n)))
        sel = np.asarray(sel)
        return int(np.count_nonzero(sel)) if sel.dtype == bool else int(sel.shape[0])

    def _bound(self, h):
        """An upper bound on max_i |l_h(z_i)|, for the tie threshold."""
        c2max = float(np.max(self._c2T)) if self._c2T.size else 0.0
        return h * self._c1abs + h * h * c2max

    def _second(self, ks):
        if self._rowwise:
            return 2.0 * self._c2T[ks, np.arange(self.n)]
        return 2.0 * self._c2T[ks]

    def _scan_side(self, h: float, right: bool):
        """(l_h, derivative, piece) with ties resolved towards the largest (right) or smallest
        (left) derivative: the one-sided version of :meth:`scan`, with fewer passes."""
        n = self.n
        hh = h * h
        # None until the first piece (the arrays / the tie scale then)
        vmax: Any = None
        d: Any = None
        v: Any
        dk: Any
        kk = np.zeros(n, dtype=np.intp)
        scale: Any = None
        for k in range(self.K):
            if self._zero[k]:
                v = dk = 0.0
            else:
                c1k = self._piece(k, slice(None))  # (an AffineOracle computes it here)
                c2k = self._c2k(k)
                dk = c1k + (2.0 * h) * c2k
                v = c1k * h + c2k * hh if self._rowwise or c2k != 0.0 else c1k * h
            if vmax is None:
                vmax = np.broadcast_to(v, (n,)).copy()
                d = np.broadcast_to(dk, (n,)).copy()
                continue
            if scale is None:
                scale = self.TIE * self._bound(h)
            tie_step(vmax, d, kk, v, dk, k, scale, right)
        return vmax, d, kk

    def evaluate(self, h: float, *, side: str = "right", with_pieces: bool = False):
        lh, d1, k = self._scan_side(h, side == "right")
        d2 = self._second(k)
        if with_pieces:
            return lh, d1, d2, k
        return lh, d1, d2

    def crossings(self, ka: np.ndarray, kb: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The h > 0 where pieces ``ka[i]`` and ``kb[i]`` of sample ``idx[i]`` are equal."""
        dc1 = self._c1T[kb, idx] - self._c1T[ka, idx]
        if self._rowwise:
            dc2 = self._c2T[ka, idx] - self._c2T[kb, idx]
        else:
            dc2 = self._c2T[ka] - self._c2T[kb]
        with np.errstate(divide="ignore", invalid="ignore"):
            hc = np.where(dc2 != 0.0, dc1 / dc2, np.nan)
        return hc


class AffineRows:
    """The pieces ``c1[i, k] = a_k u_i + b_k`` of a loss that depends on each sample through
    one number ``u_i``, computed from per-sample arrays on demand instead of stored: the margin
    ``u = y s`` (``kind="margin"``) or the residual ``u = y - s`` (``kind="residual"``) of the
    scores ``s`` and labels/targets ``y``. ``piece(k, rows)`` gives the same numbers as the
    stored column would (the same arithmetic).
    """

    BLOCK = 1 << 14

    def __init__(self, s, y, kind: str, a, b):
        if kind not in ("margin", "residual"):
            raise ValueError(f"kind must be 'margin' or 'residual', got {kind!r}")
        self.s, self.y, self.kind = s, y, kind
        self.a = np.asarray(a, dtype=np.float64)
        self.b = np.asarray(b, dtype=np.float64)
        self.n, self.K = int(np.shape(s)[0]), int(self.a.size)
        self._range = None

    def u(self, rows) -> np.ndarray:
        return self.y[rows] * self.s[rows] if self.kind == "margin" else \
            self.y[rows] - self.s[rows]

    def piece(self, k: int, rows) -> np.ndarray:
        a, b = float(self.a[k]), float(self.b[k])
        u = self.u(rows)
        # a u + b; with a = -1, 0 or 1 in one operation: fl(b - u) = fl((-u) + b) and
        # fl(u + b) are the same numbers (the product by +-1 is exact)
        if a == -1.0:
            return np.subtract(b, u, out=u)
        if a == 1.0:
            u += b
            return u
        out = np.multiply(u, a, out=u)
        out += b
        return out

    def negated_piece(self, k: int, rows, out: np.ndarray) -> np.ndarray:
        """``-(a_k u + b_k)`` of ``rows`` written into ``out`` (the same numbers as
        ``-piece(k, rows)``: rounding to nearest is symmetric, so with a = -1 it is
        fl(u - b))."""
        a, b = float(self.a[k]), float(self.b[k])
        if a == -1.0:
            if self.kind == "margin":
                np.multiply(self.y[rows], self.s[rows], out=out)
            else:
                np.subtract(self.y[rows], self.s[rows], out=out)
            out -= b
            return out
        return np.negative(self.piece(k, rows), out=out)

    def blocks(self):
        return ((i, min(i + self.BLOCK, self.n)) for i in range(0, self.n, self.BLOCK))

    def u_range(self):
        """(smallest, largest) u, over blocks (inf, -inf for no rows; one compiled loop over
        the rows for at least :data:`~otstab_solvers.sorted_kernels.KERNEL_MIN_KEYS`)."""
        if self._range is None and self.n and kernels.use_kernel(self.n) and \
                kernels.rows_ok(self.y, self.s):
            self._range = kernels.u_range(self.y, self.s, self.kind == "residual")
        if self._range is None:
            lo, hi = math.inf, -math.inf
            for i, j in self.blocks():
                u = self.u(slice(i, j))
                lo, hi = min(lo, float(u.min())), max(hi, float(u.max()))
            self._range = (lo, hi)
        return self._range

    def piece_extreme(self, k: int, largest: bool = True) -> float:
        """The largest (or smallest) ``c1[:, k]``: at the largest or smallest u (``a_k u + b_k``
        rounds monotonically in u), with the same arithmetic as :meth:`piece`."""
        lo, hi = self.u_range()
        u = hi if (self.a[k] >= 0) == largest else lo
        return float(u * self.a[k] + self.b[k])

    def materialize(self) -> np.ndarray:
        """The (K, n) array of every piece (built block by block)."""
        out = np.empty((self.K, self.n))
        for i, j in self.blocks():
            u = self.u(slice(i, j))
            for k in range(self.K):
                np.multiply(u, self.a[k], out=out[k, i:j])
                out[k, i:j] += self.b[k]
        return out


class AffineOracle(PiecewiseOracle):
    """:class:`PiecewiseOracle` of ``c1 = a_k u_i + b_k`` (:class:`AffineRows`) with one shared
    ``c2`` row: the pieces are computed per block of rows where they are needed (no (K, n)
    array); the whole array is built, once, only by the methods that scan all samples at
    once (``evaluate``, ``crossings``, ``with_c2``; e.g. the dense weighted dual)."""

    def __init__(self, rows: AffineRows, c2, *, c1abs: float | None = None):
        c2 = np.asarray(c2, dtype=np.float64)
        if c2.ndim == 1:
            c2 = c2[None, :]
        if c2.shape != (1, rows.K):
            raise ValueError(f"c2 must have shape (1, {rows.K}), got {c2.shape}")
        self.rows = rows
        self.n, self.K = rows.n, rows.K
        self.c2 = c2
        self._rowwise = False
        self._c2T = c2[0]
        self._zero = [bool(c2[0, k] == 0 and rows.a[k] == 0 and rows.b[k] == 0)
                      for k in range(self.K)]
        self._dense: np.ndarray | None = None
        if self.n:
            self._c1max = np.array([rows.piece_extreme(k) for k in range(self.K)])
            c1min = min(rows.piece_extreme(k, largest=False) for k in range(self.K))
            self._c1abs = max(float(self._c1max.max()), -c1min)
        else:
            self._c1max, self._c1abs = np.zeros(self.K), 0.0
        if c1abs is not None:  # the rows are a block of a larger form: its tie tolerance
            self._c1abs = float(c1abs)

    def crossings(self, ka: np.ndarray, kb: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """:meth:`PiecewiseOracle.crossings` from the rows' ``u`` (no (K, n) array; each
        piece with the arithmetic of :meth:`AffineRows.materialize`)."""
        if self._dense is not None:
            return super().crossings(ka, kb, idx)
        u = self.rows.u(idx)
        a, b = self.rows.a, self.rows.b
        dc1 = (u * a[kb] + b[kb]) - (u * a[ka] + b[ka])
        dc2 = self._c2T[ka] - self._c2T[kb]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(dc2 != 0.0, dc1 / dc2, np.nan)

    @property  # the base's array, built on first access here
    def _c1T(self) -> np.ndarray:  # type: ignore[override]
        if self._dense is None:
            self._dense = self.rows.materialize()
        return self._dense

    @property
    def c1(self) -> np.ndarray:
        return self._c1T.T

    def _piece(self, k: int, sel) -> np.ndarray:
        if self._dense is not None:
            return self._dense[k][sel]
        return self.rows.piece(k, sel)


def oracle_for(c1, c2, *, rows: AffineRows | None = None,
               sorted_view: bool = True) -> PiecewiseOracle:
    """The oracle ``solve_dual`` should use for the reduced form ``(c1, c2)``.

    A :class:`PiecewiseOracle` (``rows`` given instead of ``c1``: an :class:`AffineOracle`,
    whose pieces are computed per block); when the form has the hinge shape (two pieces, one
    identically zero, one shared ``c2 >= 0``: ``l_h = max(0, u_i h + c h^2)``), it also carries
    a sorted prefix-sum view (``prefix``) so that each dual evaluation costs O(log n) (chi2,
    theta2 = inf) or one exp pass over the active samples (KL), after one sort.
    ``sorted_view=False``: the shape is only recorded (``_hinge_piece``); the view is built
    by :func:`solve_two_piece`, which sorts fewer keys where it can, or :func:`sorted_view_of`.
    """
    oracle = PiecewiseOracle(c1, c2) if rows is None else AffineOracle(rows, c2)
    if oracle.K == 2 and not oracle._rowwise:
        for k1 in (0, 1):
            if oracle._zero[1 - k1] and oracle.c2[0, k1] >= 0 and not oracle._zero[k1]:
                if math.isfinite(oracle._c1abs):
                    oracle._hinge_piece = k1
                    if sorted_view:
                        oracle.prefix = sorted_view_of(oracle)
                break
    return oracle


def negated_keys(oracle: PiecewiseOracle, rows, out: np.ndarray) -> np.ndarray:
    """``-u`` of the samples ``rows`` (a slice or index array) of a hinge-shaped oracle,
    written into ``out`` (the negated moving piece: the same numbers as ``-c1[rows, k1]``,
    and as the keys of its sorted views)."""
    k1 = oracle._hinge_piece
    assert k1 is not None, "a hinge-shaped oracle"
    if isinstance(oracle, AffineOracle) and oracle._dense is None:
        return oracle.rows.negated_piece(k1, rows, out)
    return np.negative(oracle._c1T[k1][rows], out=out)


def sorted_view_of(oracle: PiecewiseOracle) -> SortedTwoPiece:
    """The fully sorted view of a hinge-shaped oracle: the negated keys written block by block
    into one array and sorted in place."""
    k1 = oracle._hinge_piece
    c = float(oracle.c2[0, k1])
    nu = np.empty(oracle.n)
    if isinstance(oracle, AffineOracle) and oracle._dense is None and \
            float(oracle.rows.a[k1]) == -1.0:
        # the hinge's keys ``y s - b`` (or ``y - s - b``): one product and one subtraction in
        # place over all rows (no temporary; the same numbers as block by block, a third of
        # the time of 61 calls at n = 1e6)
        negated_keys(oracle, slice(0, oracle.n), nu)
    else:
        for i in range(0, oracle.n, AffineRows.BLOCK):
            j = min(i + AffineRows.BLOCK, oracle.n)
            negated_keys(oracle, slice(i, j), nu[i:j])
    return SortedTwoPiece.from_negated(nu, "hinge", c, tie=oracle.TIE)


def keys_umax(oracle: PiecewiseOracle) -> float:
    """The largest ``|u|`` of a hinge-shaped oracle's keys (the full view's tie scale)."""
    k1 = oracle._hinge_piece
    assert k1 is not None, "a hinge-shaped oracle"
    if isinstance(oracle, AffineOracle) and oracle._dense is None:
        lo, hi = oracle.rows.piece_extreme(k1, False), oracle.rows.piece_extreme(k1, True)
    else:
        col = oracle._c1T[k1]
        lo, hi = float(col.min()), float(col.max())
    return max(abs(lo), abs(hi))


def solve_two_piece(oracle: PiecewiseOracle, r: float, theta2: float, divergence: str, *,
                    tol: float = 1e-13, max_iter: int = 200, min_n: int | None = None,
                    base: float | None = None) -> DualSolution:
    """:func:`solve_dual` of a hinge-shaped oracle (:func:`oracle_for` with
    ``sorted_view=False``), sorting only the keys it needs.

    With at least ``min_n`` samples (default :data:`WINDOW_MIN_N`):
    the dual is solved on a strided subsample of :data:`WINDOW_SUBSAMPLE` keys, and the full
    dual on a window (:meth:`SortedTwoPiece.window`) around that ``h``: only the keys whose
    kinks lie in the bracket are sorted (from the second width when the KL weights leave
    the subsample less than :data:`WINDOW_ESS_SHARE` of its keys as effective samples at its
    ``h``). The bracket is accepted only when the full data's derivative changes sign across
    it (``g(h_lo) > 0 > g(h_hi)``, each on its inner side);
    otherwise a wider one is tried (:data:`WINDOW_WIDTHS`) around the Newton estimate of the
    root from the end that missed it, and in the end every key is sorted
    (:func:`sorted_view_of`). The answer is that of the fully sorted view up to the order
    of summation (KL) and is exact in the same sense. chi2's window sorts, besides ``B``,
    the keys where its active set may end (:func:`_chi2_front`; a window whose front holds
    that end is left at once, :class:`~otstab_solvers.sorted_oracle.WindowMiss`, and every
    key sorted). Small data sort every key.
    ``sol.info["window"]`` records what was done; ``sol.info["view"]`` is the view the answer
    came from (valid at ``sol.h``; a caller that keeps the solution should drop it).
    ``base``: the data's base risk ``mean(max(u, 0))`` when known; the subsample is then
    solved at ``r`` moved by the difference of the two base risks, which decides ``h`` where
    ``r`` is near the base risk (over 162 instances at n = 1e6 the subsample's ``h`` was off by
    4 % at the median and 84 % at the 95th percentile without it, 1 % and 4.5 % with it).
    """
    n = oracle.n
    min_n = WINDOW_MIN_N if min_n is None else min_n
    k1 = oracle._hinge_piece
    if k1 is None:
        raise ValueError("solve_two_piece needs a hinge-shaped oracle (oracle_for)")
    c = float(oracle.c2[0, k1])
    tries = []
    chi2 = divergence == "chi2" and not math.isinf(theta2)
    if n >= max(min_n, 1) and c > 0.0:
        t0 = time.perf_counter()
        stride = max(1, n // WINDOW_SUBSAMPLE)
        m = len(range(0, n, stride))
        sub = SortedTwoPiece.from_negated(negated_keys(oracle, slice(0, n, stride),
                                                       np.empty(m)), "hinge", c, tie=oracle.TIE)
        # the subsample's threshold moved by the difference of the two base risks (E[l'(0+)]
        # of either): where r is near the base risk that difference decides h
        if base is not None:
            r_sub = r - base + float(np.sum(np.maximum(-sub.nu, 0.0))) / m
        else:
            r_sub = r
        sub_sol = solve_dual(sub, r_sub, theta2, divergence, tol=1e-10) if r_sub > 0 else \
            DualSolution(math.nan, None, math.nan, FAILED, "dual")
        h_sub = sub_sol.h if sub_sol.status == OPTIMAL else math.nan
        umax = keys_umax(oracle)
        sub_keys = sub.nu  # (sorted: the window's sizes are estimated from them)
        sub._sorted.buffers = None  # (its KL scratch: 2 x 128 KB)
        if not chi2:  # (chi2's windows read its active set: _chi2_front)
            del sub
        center = h_sub
        widths: tuple[float, ...] = WINDOW_WIDTHS
        if stride > 1 and divergence == "kl" and not math.isinf(theta2) and \
                math.isfinite(h_sub) and h_sub > 0 and \
                _kl_ess(sub_keys, c, h_sub, theta2) < WINDOW_ESS_SHARE * m:
            widths = WINDOW_WIDTHS[1:] or WINDOW_WIDTHS
        for width in widths if math.isfinite(h_sub) and h_sub > 0 else ():
            h_lo, h_hi = center * (1.0 - width), center * (1.0 + width)
            # the array's size from the subsample's share of kept keys, with room for twice
            # its sampling error (a counting pass first in the rare case that is too little)
            k_sub = int(sub_keys.searchsorted(window_thresholds(c, h_lo, h_hi, umax,
                                                                    oracle.TIE)[1], "right"))
            size = int((k_sub + 2.0 * math.sqrt(k_sub) + 4) * n / m) + 1024
            view = None  # (a missed window's keys are freed before the next one's are written)
            view = SortedTwoPiece.window(lambda i, j, out: negated_keys(oracle, slice(i, j),
                                                                         out),
                                         n, c, h_lo, h_hi, umax, size=min(size, n),
                                         tie=oracle.TIE, rows=_key_rows(oracle),
                                         front_rows=WINDOW_FRONT_FROM_ROWS,
                                         front_below=_chi2_front(sub, h_lo, h_hi, theta2)
                                         if chi2 else None)
            try:
                sol = solve_dual(view, r, theta2, divergence, tol=tol, max_iter=max_iter,
                                 bracket=(h_lo, h_hi), h_init=center)
            except WindowMiss as miss:  # chi2's active set ends inside the front: sort all
                tries.append({"width": width, "h": center, "status": str(miss)})
                view = None
                break
            tries.append({"width": width, "h": center, "sorted": view.n_fin - view.sorted_from,
                          "kept": view.n_fin, "status": sol.native_status})
            h_next = sol.info.get("h_newton", math.nan)
            if math.isfinite(h_next) and h_next > 0:  # a missed root: seen from outside
                center = h_next
            if sol.status == OPTIMAL:
                sol.solve_time = time.perf_counter() - t0
                sol.info["window"] = {"h_subsample": h_sub, "tries": tries}
                sol.info["view"] = view
                return sol
    t0 = time.perf_counter()
    view = None  # (as above)
    view = sorted_view_of(oracle)
    sol = solve_dual(view, r, theta2, divergence, tol=tol, max_iter=max_iter)
    sol.solve_time = time.perf_counter() - t0
    if tries:
        sol.info["window"] = {"tries": tries, "fallback": "sorted every key"}
    sol.info["view"] = view
    return sol


def _key_rows(oracle: PiecewiseOracle):
    """``(y, s, b, residual)``: the negated keys of a hinge-shaped rows form are ``y s - b``
    (margin) or ``(y - s) - b`` (residual) row by row, which the window's compiled pass
    computes itself (:func:`~otstab_solvers.sorted_kernels.partition_rows`); None for other
    forms or arrays (the window writes the keys block by block)."""
    k1 = oracle._hinge_piece
    if not isinstance(oracle, AffineOracle) or oracle._dense is not None or k1 is None:
        return None
    rows = oracle.rows
    if float(rows.a[k1]) != -1.0 or not kernels.rows_ok(rows.y, rows.s):
        return None
    return rows.y, rows.s, float(rows.b[k1]), rows.kind == "residual"


#: the keys of the subsample by which chi2's window sorts more than the active set's end
#: needs (:func:`_chi2_front`): this share of the subsample, plus three standard errors
CHI2_FRONT_SLACK = 0.02


def _chi2_front(sub: SortedTwoPiece, h_lo: float, h_hi: float, theta2: float):
    """The negated key below which a chi2 window may leave its keys unsorted (the front),
    from the subsample's view ``sub``: where its active set ends (the largest ``l`` with a
    positive weight, MATH.md Remark 5) at either end of the bracket ``[h_lo, h_hi]``, moved
    down by :data:`CHI2_FRONT_SLACK` of the subsample and three standard errors of its count.
    None: every weight is positive at both ends (the front is the window's own); ``-inf``: no
    front. A wrong guess costs time only: the window's evaluation checks where the active set
    ends (:class:`~otstab_solvers.sorted_oracle.WindowMiss`)."""
    m = sub.n
    out = math.inf
    for h in (h_lo, h_hi):
        p = sub.count(h, "right")
        A, B, dA, dB, d2 = sub.coefficients(h)
        alpha = float(sub._chi2(p, A, B, dA, dB, d2, theta2)[3])
        if alpha + 2.0 * theta2 > 0.0:  # every weight positive (l >= 0 > -alpha - 2 theta2)
            continue
        # active: l = A u + B > -alpha - 2 theta2, i.e. nu < (alpha + 2 theta2 + B) / A
        j = int(sub.nu.searchsorted((alpha + 2.0 * theta2 + B) / A, side="left"))
        j -= int(CHI2_FRONT_SLACK * m + 3.0 * math.sqrt(j) + 1)
        out = min(out, float(sub.nu[j]) if j > 0 else -math.inf)
    return None if math.isinf(out) and out > 0 else out


def _kl_ess(nu: np.ndarray, c: float, h: float, theta2: float) -> float:
    """The effective number of samples ``(sum w)^2 / sum w^2`` of the KL weights
    ``exp(l_h / theta2)`` of the hinge keys ``-nu`` at ``h`` (``l_h = max(0, -nu h +
    c h^2)``)."""
    fin = nu[np.isfinite(nu)]
    if fin.size == 0:
        return 0.0
    x = np.maximum(fin * -h + c * h * h, 0.0) / theta2
    w = np.exp(x - float(x.max()))
    return float(w.sum()) ** 2 / float(w @ w)


def _exp_shifted(a, m):
    """exp(a - m) with the exponent clamped at -700: terms below 1e-304 are far under the
    rounding of any sum they enter, and keeping them out of the subnormal range avoids
    microcoded (10-100x slower) arithmetic on them."""
    return np.exp(np.maximum(a - m, -700.0))


def _reduce(lh, d1, d2, theta2, divergence, n, p=None):
    """(divergence term, mean_w d1, curvature) at one h (``p``: sample probabilities)."""
    if p is not None:
        return _reduce_weighted(lh, d1, d2, theta2, divergence, p)
    if math.isinf(theta2):
        return float(np.mean(lh)), float(np.mean(d1)), float(np.mean(d2)), None
    if divergence == "kl":
        a = lh / theta2
        m = a.max()
        e = _exp_shifted(a, m)
        Z = e.sum()
        term = theta2 * (m + log_mean_shifted(a, m, e))
        # einsum, not @: a BLAS dot may spawn threads, which is slow on small busy machines
        mu = float(np.einsum("i,i->", e, d1)) / Z
        var = float(np.einsum("i,i->", e, (d1 - mu) ** 2)) / Z
        curv = float(np.einsum("i,i->", e, d2)) / Z + var / theta2
        return term, mu, curv, None
    w, alpha, term = chi2_solution(lh, theta2)
    mu = float(np.einsum("i,i->", w, d1)) / n
    act = w > 0
    da = d1[act]
    curv = (float(np.einsum("i,i->", w, d2)) + float(((da - da.mean()) ** 2).sum())
            / (2.0 * theta2)) / n
    return term, mu, curv, alpha


def _reduce_weighted(lh, d1, d2, theta2, divergence, p):
    """:func:`_reduce` with sample probabilities ``p`` (every mean a p-weighted sum)."""
    if math.isinf(theta2):
        return pmean(lh, p), pmean(d1, p), pmean(d2, p), None
    if divergence == "kl":
        a = np.where(p > 0, lh / theta2, -np.inf)  # zero-probability rows: not in P0
        m = support_max(a, p)
        e = _exp_shifted(a, m)
        pe = p * e
        Z = float(np.sum(pe))
        term = theta2 * (m + log_mean_shifted(a, m, e, p))
        mu = float(np.dot(pe, d1)) / Z
        var = float(np.dot(pe, (d1 - mu) ** 2)) / Z
        curv = float(np.dot(pe, d2)) / Z + var / theta2
        return term, mu, curv, None
    w, alpha, term = chi2_solution(lh, theta2, p)
    pw = p * w
    mu = float(np.dot(pw, d1))
    act = (w > 0) & (p > 0)
    pa, da = p[act], d1[act]
    dbar = float(np.dot(pa, da)) / float(np.sum(pa))
    curv = float(np.dot(pw, d2)) + float(np.dot(pa, (da - dbar) ** 2)) / (2.0 * theta2)
    return term, mu, curv, alpha


def dual_objective(lh, h, r, theta2, divergence, p=None):
    """F(h) = h r - divergence term of ``l_h`` values (exact alpha for chi2)."""
    if divergence == "kl" or math.isinf(theta2):
        return h * r - kl_dual_term(lh, theta2, p)
    return h * r - chi2_dual_term(lh, theta2, p=p)


@dataclass(slots=True)
class _Point:
    """A point of :func:`solve_dual`'s search: ``h``, the dual objective ``F``, its derivative
    ``g`` and curvature ``curv``, the multiplier ``alpha`` and the oracle's pieces ``k`` there
    (None: not tracked)."""

    h: float
    F: float
    g: float
    curv: float
    alpha: Any
    k: Any = None
    side: str = "right"


class _Bracket(NamedTuple):
    """What :func:`_bracket_within` found: ``lo`` and ``hi`` (``hi`` None: ``g(lo) = 0``), or
    (``lo`` None) the ``failure`` and the Newton estimate ``h_newton`` of the root."""

    lo: _Point | None = None
    hi: _Point | None = None
    failure: str = ""
    h_newton: float = math.nan


def solve_dual(oracle, r: float, theta2: float, divergence: str, *, tol: float = 1e-13,
               max_iter: int = 200, h_init: float | None = None, p=None,
               bracket: tuple[float, float] | None = None) -> DualSolution:
    """Maximise the concave dual over ``h >= 0`` given an oracle for ``l_h``.

    The oracle has ``n``, ``h_max`` and ``evaluate(h) -> (l_h, dl_h/dh, d2l_h/dh2 or None)``;
    piecewise oracles (``evaluate(..., with_pieces=True)`` and ``crossings``) get exact kink
    handling. Stops when the concavity bound on ``F* - F(best)`` from the bracket (F* lies below
    the tangent at either end) is below ``tol * max(1, |F|)``; that bound is ``gap_bound``.
    ``p``: probabilities of the samples (None: uniform); the sorted prefix-sum view is then
    not used (the oracle is evaluated densely). ``bracket = (h_lo, h_hi)``: the oracle is
    evaluated inside it only (a window, :func:`solve_two_piece`), from ``h_init`` (a guess
    inside it; default its ends) by Newton steps until ``g`` changes sign; when the root is
    not inside (``g`` > 0 on the right of ``h_lo``, < 0 on the left of ``h_hi``) the status is
    FAILED with ``native_status`` "root below the bracket" or "root above the bracket", and
    ``info["h_newton"]`` the Newton estimate of the root from that end.
    """
    t0 = time.perf_counter()
    n = oracle.n
    # a sorted view (or an oracle carrying one) is evaluated from its prefix sums
    fast = oracle if isinstance(oracle, SortedTwoPiece) else getattr(oracle, "prefix", None)
    probs = p  # (``p`` names the points of the search below)
    if probs is not None:
        if isinstance(oracle, SortedTwoPiece):
            raise ValueError("a SortedTwoPiece oracle has no weighted form; pass the dense "
                             "oracle with p")
        fast = None
    kinks = fast is not None or hasattr(oracle, "crossings")
    evals = 0

    def at(h, side="right"):
        nonlocal evals
        evals += 1
        if fast is not None:
            term, mu, curv, alpha, k = fast.reduce(h, side, theta2, divergence)
            return _Point(h, h * r - term, r - mu, curv, alpha, k, side)
        k = None
        if kinks:
            lh, d1, d2, k = oracle.evaluate(h, side=side, with_pieces=True)
        else:
            lh, d1, d2 = oracle.evaluate(h)
        if d2 is None:
            d2 = np.zeros_like(lh)
        term, mu, curv, alpha = _reduce(lh, d1, d2, theta2, divergence, n, probs)
        return _Point(h, h * r - term, r - mu, curv, alpha, k)

    def finish(p, status, gap=0.0, note=""):
        return DualSolution(
            h=p.h, alpha=p.alpha, value=p.F, status=status, solver="dual",
            native_status=note or status, iterations=evals, gap_bound=gap,
            solve_time=time.perf_counter() - t0,
        )

    if bracket is not None:
        ends = _bracket_within(at, bracket, h_init, fast)
        if ends.lo is None:
            nowhere = _Point(math.nan, math.nan, math.nan, math.nan, None)
            sol = finish(nowhere, FAILED, math.nan, ends.failure)
            sol.info["h_newton"] = ends.h_newton  # where the root is, seen from outside
            return sol
        if ends.hi is None:  # g = 0 at lo: a maximiser
            return finish(ends.lo, OPTIMAL)
        pair = [ends.lo, ends.hi]
        del ends  # (the search owns its points: a dense oracle's hold n-vectors of pieces)
        return _solve_bracketed(at, oracle, fast, kinks, pair, r, tol, max_iter, finish)
    p0 = at(0.0, "right")
    if p0.g <= 0.0:
        p0.F = 0.0
        if divergence == "chi2":
            p0.alpha = 0.0
        return finish(p0, OPTIMAL, 0.0, "r <= base risk")
    lo = p0
    # bracket: Newton guesses from the last point, at least doubling, until g < 0
    h = h_init if h_init and h_init > 0 else (1.0 / p0.curv * p0.g if p0.curv > 0
                                             else 1.0)
    h = min(max(h, 1e-8), 1e6) if math.isfinite(h) else 1.0
    hi = None
    for _ in range(400):
        if h >= oracle.h_max:
            h = 0.5 * (lo.h + oracle.h_max)
        p = at(h)
        if not math.isfinite(p.F):
            return finish(lo, FAILED, math.nan, "non-finite dual objective while bracketing")
        if p.g < 0.0:
            hi = p
            break
        lo = p
        if p.g == 0.0:
            return finish(p, OPTIMAL)
        step = p.g / p.curv if p.curv > 0 else math.inf
        h = max(2.0 * h, h + 1.5 * step if math.isfinite(step) else 4.0 * h)
    if hi is None:
        return finish(lo, FAILED, math.nan, "could not bracket the root (threshold unreachable?)")
    pair = [lo, hi]
    del lo, hi, p, p0  # (the search owns its points: a dense oracle's hold n-vectors of pieces)
    return _solve_bracketed(at, oracle, fast, kinks, pair, r, tol, max_iter, finish)


#: a Newton step towards the root from a guess inside a window is lengthened by this factor,
#: so that it usually lands past the root (the bracket the search needs) close to it
OVERSHOOT = 2e-3
#: a model step (:func:`_step`) lands this share of h past the model's root instead (twice as
#: far at each retry, as OVERSHOOT): more than the model's error near the root (2e-13 of h
#: near the base risk at n = 1e6) and little enough that |g| stays within the search's stop
#: rule (1e-11 r; here at most 7e-12 at the grid's thresholds)
MODEL_OVERSHOOT = 5e-12


def _bracket_within(at, bracket, h_init, fast=None) -> _Bracket:
    """``lo, hi``: points of the window ``bracket`` with ``g(lo) > 0 > g(hi)`` (``hi`` None:
    ``g(lo) = 0``), found by Newton steps from ``h_init`` (the oracle's model step where it
    has one, :func:`_step`; lengthened by :data:`OVERSHOOT`, twice as much each time they
    fall short; the ends of the window at the last); or (``lo`` None) the reason the root is
    not inside and the Newton estimate of the root from the end that shows it."""
    h_lo, h_hi = bracket
    lo = hi = None
    if h_init is not None and h_lo < h_init < h_hi:
        p = at(h_init, "right")
        if not math.isfinite(p.F):
            return _Bracket(failure="non-finite dual objective in the bracket")
        factor = 1.0 + OVERSHOOT
        for _ in range(6):
            if p.g == 0.0:
                return _Bracket(p)
            if p.g > 0.0:
                lo = p
            else:
                hi = p
            if lo is not None and hi is not None:
                return _Bracket(lo, hi)
            h = _step(fast, p, factor)
            if not h_lo < h < h_hi:
                break
            p = at(h, "right")
            factor = 1.0 + 2.0 * (factor - 1.0)
    if lo is None:
        lo = at(h_lo, "right")
        if lo.g <= 0.0:
            return _Bracket(failure="root below the bracket", h_newton=_newton(lo))
    if hi is None:
        hi = at(h_hi, "left")
        if hi.g >= 0.0:
            return _Bracket(failure="root above the bracket", h_newton=_newton(hi))
    if not math.isfinite(lo.F) or not math.isfinite(hi.F):
        return _Bracket(failure="non-finite dual objective in the bracket")
    return _Bracket(lo, hi)


def _newton(p: _Point, factor: float = 1.0) -> float:
    """The Newton estimate of the root from the point ``p``, its step lengthened by
    ``factor`` (nan without curvature)."""
    return p.h + factor * (p.g / p.curv) if p.curv > 0 else math.nan


def _step(fast, p: _Point, factor: float = 1.0) -> float:
    """The next point from ``p``: the root of the oracle's local model there (a sorted
    view's :meth:`~otstab_solvers.sorted_oracle.SortedTwoPiece.model_step`: KL, counting the
    kinks on the way) when it has one, else :func:`_newton`; the step lengthened by
    ``factor`` (a model step: past its root by :data:`MODEL_OVERSHOOT` of ``h`` per
    :data:`OVERSHOOT` of ``factor``). Issue 31: from the subsample's ``h`` the window's
    search took 4 / 3 / 3 exact KL passes at the grid's middle / near-base / near-max
    thresholds (n = 1e6), 3 / 2 / 3 with the model."""
    h = fast.model_step(p.h, p.side, p.g, p.curv) if fast is not None and \
        hasattr(fast, "model_step") else math.nan
    if not math.isfinite(h):
        return _newton(p, factor)
    # past the model's root by MODEL_OVERSHOOT of h (factor 1 + k OVERSHOOT: k times that)
    over = (factor - 1.0) / OVERSHOOT * MODEL_OVERSHOOT * abs(h)
    return h + math.copysign(over, h - p.h)


def _solve_bracketed(at, oracle, fast, kinks, pair, r, tol, max_iter, finish):
    """The safeguarded Newton search of :func:`solve_dual` inside ``pair = [lo, hi]`` (points
    with ``g(lo) > 0 > g(hi)``; taken over: the list is emptied, so that a point the search
    leaves behind is freed), kinks located exactly."""
    lo, hi = pair
    pair.clear()

    def bound(lo, hi):
        w = hi.h - lo.h
        ub = min(lo.F + max(lo.g, 0.0) * w, hi.F + max(-hi.g, 0.0) * w)
        best = lo if lo.F >= hi.F else hi
        return best, max(ub - best.F, 0.0)

    widths = [hi.h - lo.h]
    poor = False  # the last Newton step reduced |g| by less than half
    for _ in range(max_iter):
        best, gap = bound(lo, hi)
        width = hi.h - lo.h
        # the value needs a small gap; the risk of Q* (the derivative) needs a small |g| or a
        # narrow bracket (the tie split of Q* then closes the audit exactly)
        # both tests are relative (to the value, to r and to h): a tiny value or threshold is
        # solved to the same relative precision as a large one
        if gap <= tol * abs(best.F) and (
                abs(best.g) <= 1e-11 * abs(r) or width <= 1e-11 * hi.h):
            return finish(best, OPTIMAL, gap)
        if width <= 4 * np.finfo(float).eps * hi.h:
            return finish(best, OPTIMAL, gap, "bracket at machine precision")
        n_kinks = 0
        if kinks:
            n_kinks, k_min, k_max, k_mid = _kinks_between(oracle, fast, lo, hi)
            if n_kinks and k_max - k_min <= 1e-12 * k_max:
                # one kink left in the bracket: the root is there iff g changes sign across it
                hk = k_mid
                left, right = at(hk, "left"), at(hk, "right")
                if left.g >= 0.0 >= right.g:
                    # F is continuous at the kink: both sides are the same number up to the
                    # rounding of l_h on each side's pieces. Keep the side whose divergence
                    # term T = h r - F is smaller: a side on a flat piece (l_h = 0, T exactly
                    # 0) beats one on a moving piece whose c1 h + c2 h^2 cancels to rounding
                    # (the audit compares the value with the cost of Q* either way)
                    t_left, t_right = abs(hk * r - left.F), abs(hk * r - right.F)
                    best = left if t_left <= t_right else right
                    return finish(best, OPTIMAL, 0.0, "optimum at a kink")
                if right.g > 0:
                    lo = right
                else:
                    hi = left
                widths.append(hi.h - lo.h)
                continue
        cur = lo if abs(lo.g) < abs(hi.g) else hi
        h_new = None
        slow = len(widths) >= 3 and widths[-1] > 0.5 * widths[-3]
        # Newton with the larger of the local curvature and the bracket's secant slope: where
        # many small derivative jumps (dense kinks) dominate, the local curvature underestimates
        # how fast g falls and plain Newton overshoots back and forth
        slope = max(cur.curv, (lo.g - hi.g) / width) if poor else cur.curv
        if not slow and slope > 0:
            cand = cur.h + cur.g / slope if poor else _step(fast, cur)
            if lo.h < cand < hi.h:
                h_new = cand
        if h_new is None and n_kinks:
            h_new = k_mid
        if h_new is None:
            denom = lo.g - hi.g
            cand = lo.h + lo.g * width / denom if denom > 0 else math.nan
            if not slow and lo.h < cand < hi.h:
                h_new = cand
            else:
                h_new = 0.5 * (lo.h + hi.h)
        p = at(h_new, "right")
        poor = abs(p.g) > 0.5 * abs(cur.g)
        if p.g > 0:
            lo = p
        elif p.g == 0:
            return finish(p, OPTIMAL)
        else:
            hi = p
        widths.append(hi.h - lo.h)
    best, gap = bound(lo, hi)
    status = OPTIMAL if gap <= 1e-9 * abs(best.F) else FAILED
    return finish(best, status, gap, "" if status == OPTIMAL else "max_iter reached")


def _kinks_between(oracle, fast, lo, hi):
    """(count, smallest, largest, middle) of the kinks strictly between two points."""
    if fast is not None:
        return fast.kinks_between(lo.k, hi.k, lo.h, hi.h)
    sw = np.nonzero(lo.k != hi.k)[0]
    if not sw.size:
        return 0, math.nan, math.nan, math.nan
    hc = oracle.crossings(lo.k[sw], hi.k[sw], sw)
    hc = hc[np.isfinite(hc) & (hc > lo.h) & (hc < hi.h)]
    if not hc.size:
        return 0, math.nan, math.nan, math.nan
    return hc.size, float(hc.min()), float(hc.max()), float(np.median(hc))


def refine(oracle, h: float, r: float, theta2: float, divergence: str, *, steps: int = 4,
           p=None):
    """Iterative refinement of an approximate dual solution (e.g. from a conic solver).

    Takes up to ``steps`` Newton steps on the exact dual derivative from ``h``, keeping a step
    only if it raises the dual objective (or, where the objective is flat to its rounding,
    keeps it and shrinks the derivative). Interior-point solvers determine ``h`` to about the
    square root of their tolerance because the dual is flat near its optimum; the risk of Q*
    depends on the derivative, so the refined ``h`` is what makes the primal audit close.
    Returns ``(h, F(h), alpha, n_accepted_steps)``.
    """
    n = oracle.n

    def at(hh):
        lh, d1, d2 = oracle.evaluate(hh)[:3]
        term, mu, curv, alpha = _reduce(lh, d1, np.zeros_like(lh) if d2 is None else d2,
                                        theta2, divergence, n, p)
        return hh * r - term, r - mu, curv, alpha

    F, g, curv, alpha = at(h)
    accepted = 0
    for _ in range(steps):
        if curv <= 0 or g == 0:
            break
        cand = max(h + g / curv, 0.0)
        if cand >= oracle.h_max:
            break
        F2, g2, curv2, alpha2 = at(cand)
        # near the optimum F is flat to rounding (it changes by ~g^2 / curv): a step that
        # keeps F within its rounding and shrinks |g| is kept too (the risk of Q* is g)
        if not (F2 > F or (F2 >= F - 4.0 * np.finfo(float).eps * abs(F)
                           and abs(g2) < abs(g))):
            break
        h, F, g, curv, alpha = cand, F2, g2, curv2, alpha2
        accepted += 1
    return h, F, alpha, accepted
