"""The Crammer-Singer multiclass hinge's reduced form, computed per block of rows.

For the loss ``max_k (1[k != y] + s_k - s_y)`` of a linear model with masked class weights
``Wm`` the reduced form (``otstab.modeling.reduce_problem``) has the pieces

    c1[i, k] = (1 + s_ik) - s_iy   (k != y_i),   c1[i, y_i] = 0,
    c2[i, k] = C[y_i, k],          C[y, k] = ||Wm_k - Wm_y||^2 / (4 theta1),

so each sample's pieces are a function of its K scores and its label. :class:`MulticlassRows`
computes them for a block of rows where they are needed instead of storing the two (K, n)
arrays, and :class:`MulticlassOracle` is a :class:`~otstab_solvers.dual.PiecewiseOracle` on
them: the same numbers as the dense oracle of the stored arrays (the same arithmetic, the ties
decided with the same tolerance), with temporaries of one block. :func:`multiclass_blocks`
cuts it into the blocks of :class:`~otstab_solvers.blockwise.BlockwiseDual`, so that a dual
evaluation sums per block and never holds an n-vector.

This module does not import otstab.
"""

from __future__ import annotations

import importlib.util
import math
import time

import numpy as np

from .blockwise import (
    BlockwiseDual,
    block_chi2,
    block_chi2_active,
    block_kl,
    block_l,
    in_memory,
)
from .dual import (
    WINDOW_MIN_N,
    WINDOW_SUBSAMPLE,
    PiecewiseOracle,
    _Point,
    _reduce,
    _solve_bracketed,
    solve_dual,
    tie_step,
    tie_step_both,
)
from .result import OPTIMAL, DualSolution
from .weights import weights_at

__all__ = ["MulticlassRows", "MulticlassOracle", "MulticlassDual", "multiclass_blocks",
           "solve_multiclass", "BLOCK"]

#: rows per block: the (B, K) temporaries of a block stay in the cache
BLOCK = 1 << 13
#: evaluations whose pieces a block keeps (int8: an eighth of an n-vector each), for the kinks
#: between the ends of the dual's bracket
PIECES_KEPT = 4


#: numba is installed (imported on the first call that uses a kernel: 0.3-0.6 s, which a
#: small problem never pays)
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
#: evaluate with the compiled row kernels (:func:`_side_rows`, :func:`_values_rows`; numba):
#: one loop over the rows that reads each score once, in place of the per-block NumPy
#: passes; the same numbers (the same operations per row, the tie rule of
#: :func:`~otstab_solvers.dual.tie_step`). False without numba, or to compare the two.
USE_KERNEL = HAVE_NUMBA
_COMPILED: dict = {}


def _kernel(fn):
    """The compiled ``fn`` (numba, cached on disk; compiled or loaded on first use)."""
    got = _COMPILED.get(fn.__name__)
    if got is None:
        import numba

        got = _COMPILED[fn.__name__] = numba.njit(cache=True, nogil=True)(fn)
    return got
#: the fewest rows a call evaluates with the kernels: below, NumPy's blocks (the kernels
#: load, or compile once, in 0.5-2.5 s: paid only by problems large enough to gain it back)
KERNEL_MIN_ROWS = 1 << 14


def _side_rows(S, y, C, h, scale, right, lh, d1, d2, kk):  # pragma: no cover - compiled
    """l_h, its derivative, its second derivative and piece of every row (into the outputs),
    with :meth:`MulticlassOracle._side`'s numbers: ``c1 = (1 + s_k) - s_y`` (0 at the label),
    ``v = c1 h + C[y, k] h^2``, ``d = 2 h C[y, k] + c1``, and the sequential tie rule (the
    rows where one piece alone is near the largest take it under that rule too)."""
    n, K = S.shape
    hh = h * h
    two_h = 2.0 * h
    for i in range(n):
        yi = y[i]
        sy = S[i, yi]
        vm = 0.0
        d = 0.0
        km = 0
        for k in range(K):
            c1 = 0.0 if k == yi else (1.0 + S[i, k]) - sy
            c2 = C[yi, k]
            v = c1 * h
            v += c2 * hh
            dk = c2 * two_h
            dk += c1
            if k == 0:
                vm, d = v, dk
                continue
            diff = v - vm
            if diff >= -scale and (diff > scale or (dk > d if right else dk < d)):
                d = dk
                km = k
            if v > vm:
                vm = v
        lh[i] = vm
        d1[i] = d
        d2[i] = C[yi, km] * 2.0
        kk[i] = km


def _values_rows(S, y, C, h, out):  # pragma: no cover - compiled
    """l_h of every row (into ``out``): :meth:`MulticlassOracle.values`'s numbers."""
    n, K = S.shape
    hh = h * h
    for i in range(n):
        yi = y[i]
        sy = S[i, yi]
        vm = 0.0
        for k in range(K):
            c1 = 0.0 if k == yi else (1.0 + S[i, k]) - sy
            v = c1 * h
            v += C[yi, k] * hh
            if k == 0 or v > vm:
                vm = v
        out[i] = vm


def _scan_rows(S, y, C, h, scale, vmax, k_lo, d_lo, k_hi, d_hi):  # pragma: no cover
    """:meth:`MulticlassOracle.scan`'s numbers (into the outputs): both sides' pieces and
    derivatives under the rule of :func:`~otstab_solvers.dual.tie_step_both`. Returns the
    number of rows whose two sides differ."""
    n, K = S.shape
    hh = h * h
    two_h = 2.0 * h
    ties = 0
    for i in range(n):
        yi = y[i]
        sy = S[i, yi]
        vm = 0.0
        dl = 0.0
        dh = 0.0
        kl = 0
        kh = 0
        for k in range(K):
            c1 = 0.0 if k == yi else (1.0 + S[i, k]) - sy
            c2 = C[yi, k]
            v = c1 * h
            v += c2 * hh
            dk = c2 * two_h
            dk += c1
            if k == 0:
                vm, dl, dh = v, dk, dk
                continue
            diff = v - vm
            if diff > scale:
                dl, dh, kl, kh = dk, dk, k, k
            elif abs(diff) <= scale:
                if dk < dl:
                    dl, kl = dk, k
                if dk > dh:
                    dh, kh = dk, k
            if v > vm:
                vm = v
        vmax[i] = vm
        d_lo[i] = dl
        d_hi[i] = dh
        k_lo[i] = kl
        k_hi[i] = kh
        if kl != kh:
            ties += 1
    return ties


def _tail_hits(S, y, tau, hit):  # pragma: no cover - compiled
    """``hit[i]``: some ``c1[i, k] >= tau[y_i, k]`` (``c1`` as :meth:`MulticlassRows.block`;
    ``tau[y, y] = inf``)."""
    n, K = S.shape
    for i in range(n):
        yi = y[i]
        sy = S[i, yi]
        found = False
        for k in range(K):
            c1 = 0.0 if k == yi else (1.0 + S[i, k]) - sy
            if c1 >= tau[yi, k]:
                found = True
        hit[i] = found


def _c1_stats(S, y, top):  # pragma: no cover - compiled
    """(smallest, largest) ``c1[i, k]`` of the rows (the zeros at the labels included), and
    ``top[y, k]`` raised to the largest ``c1[i, k]`` of the rows of label ``y``."""
    n, K = S.shape
    lo = np.inf
    hi = -np.inf
    for i in range(n):
        yi = y[i]
        sy = S[i, yi]
        for k in range(K):
            c1 = 0.0 if k == yi else (1.0 + S[i, k]) - sy
            if c1 < lo:
                lo = c1
            if c1 > hi:
                hi = c1
            if c1 > top[yi, k]:
                top[yi, k] = c1
    return lo, hi


def _derivs_rows(S, y, C, h, kk, d1, d2):  # pragma: no cover - compiled
    """:meth:`MulticlassOracle._derivs` (into ``d1``, ``d2``): the derivatives on the pieces
    ``kk``, with :func:`_side_rows`'s operations."""
    n = S.shape[0]
    two_h = 2.0 * h
    for i in range(n):
        yi = y[i]
        k = kk[i]
        c1 = 0.0 if k == yi else (1.0 + S[i, k]) - S[i, yi]
        c2 = C[yi, k]
        d = c2 * two_h
        d += c1
        d1[i] = d
        d2[i] = c2 * 2.0


def _kernel_for(rows, m: int) -> bool:
    """Evaluate ``m`` rows of ``rows`` with the kernels: numba is there, the call is large
    enough (:data:`KERNEL_MIN_ROWS`) and the scores are float64 (the NumPy blocks' arithmetic
    on other types follows NumPy's promotion rules, which the kernels do not copy)."""
    return USE_KERNEL and m >= KERNEL_MIN_ROWS and rows.S.dtype == np.float64


def _as_index(rows):
    """``rows`` (None, a slice, an index array or a boolean mask) as a slice or an index
    array."""
    if rows is None:
        return slice(None)
    if isinstance(rows, np.ndarray) and rows.dtype == bool:
        return np.flatnonzero(rows)
    return rows


class MulticlassRows:
    """The pieces of the multiclass hinge from the scores ``S`` (n, K), the labels (n,) and the
    curvature matrix ``C`` (K, K; zero diagonal). Nothing of size n is stored beyond the
    arrays given (views, not copies)."""

    BLOCK = BLOCK

    def __init__(self, S, labels, C):
        self.S = S
        self.labels = labels
        self.C = np.ascontiguousarray(C, dtype=np.float64)
        self.n, self.K = int(S.shape[0]), int(self.C.shape[0])
        self._range: tuple[float, float] | None = None
        self._top: np.ndarray | None = None
        self._present: np.ndarray | None = None

    def subset(self, s: int, e: int) -> MulticlassRows:
        """Rows ``s..e`` (views of the same arrays)."""
        return MulticlassRows(self.S[s:e], self.labels[s:e], self.C)

    def blocks(self):
        return ((i, min(i + self.BLOCK, self.n)) for i in range(0, self.n, self.BLOCK))

    def block(self, sel) -> tuple[np.ndarray, np.ndarray]:
        """``(c1, c2)`` of the rows ``sel`` (a slice or an index array), each (B, K): the
        numbers of :meth:`materialize` (``(1 + s_k) - s_y``, 0 at the label)."""
        return self.block_at(sel)[:2]

    def block_at(self, sel):
        """``(c1, c2, flat)``: :meth:`block` and the flat positions ``K i + y_i`` of each
        row's label in the (B, K) arrays."""
        S = np.ascontiguousarray(self.S[sel])
        y = self.labels[sel]
        K = self.K
        flat = np.arange(0, K * S.shape[0], K)
        flat += y
        sy = S.reshape(-1).take(flat)
        c1 = np.add(1.0, S)
        c1 -= sy[:, None]
        c1.reshape(-1)[flat] = 0.0
        return c1, self.C.take(y, axis=0), flat

    def block_T(self, sel):
        """``(c1, c2, ar)``: :meth:`block` in the (K, B) layout (each piece a contiguous row:
        the same numbers) and ``arange(B)``."""
        S = np.ascontiguousarray(self.S[sel])
        y = self.labels[sel]
        K, B = self.K, S.shape[0]
        ar = np.arange(B)
        flat = ar * K
        flat += y
        sy = S.reshape(-1).take(flat)
        c1 = np.empty((K, B))
        np.add(1.0, S.T, out=c1)
        c1 -= sy
        np.multiply(y, B, out=flat)
        flat += ar
        c1.reshape(-1)[flat] = 0.0
        return c1, np.take(self.C.T, y, axis=1), ar

    def piece(self, k: int, rows) -> np.ndarray:
        """``c1[rows, k]`` (a fresh array)."""
        S = self.S[rows]
        y = self.labels[rows]
        out = np.add(1.0, S[:, k])
        out -= S[np.arange(S.shape[0]), y]
        out[y == k] = 0.0
        return out

    def materialize(self) -> np.ndarray:
        """The (K, n) array of ``c1`` (built block by block)."""
        out = np.empty((self.K, self.n))
        for i, j in self.blocks():
            out[:, i:j] = self.block(slice(i, j))[0].T
        return out

    def materialize_c2(self) -> np.ndarray:
        """The (K, n) array of ``c2``."""
        out = np.empty((self.K, self.n))
        for k in range(self.K):
            np.take(self.C[:, k], self.labels, out=out[k])
        return out

    def present(self) -> np.ndarray:
        """Which classes occur among the labels (K booleans)."""
        if self._present is None:
            self._present = np.bincount(self.labels, minlength=self.K)[:self.K] > 0
        return self._present

    def c2_max(self) -> float:
        """The largest ``c2[i, k]`` (over the classes that occur; 0 without rows)."""
        pres = self.present()
        return float(self.C[pres].max()) if pres.any() else 0.0

    def can_move(self) -> bool:
        """Some ``c2[i, k] > 0``: some sample can move at a finite price."""
        return self.c2_max() > 0.0

    def c1_range(self) -> tuple[float, float]:
        """(smallest, largest) ``c1[i, k]`` over every row and piece (the zeros included),
        over blocks; (inf, -inf) without rows. The same pass keeps :meth:`c1_top`."""
        if self._range is None:
            lo, hi = math.inf, -math.inf
            top = np.full((self.K, self.K), -np.inf)
            kernel = _kernel_for(self, self.n)
            for i, j in self.blocks():
                if kernel:
                    b_lo, b_hi = _kernel(_c1_stats)(self.S[i:j], self.labels[i:j], top)
                    lo, hi = min(lo, b_lo), max(hi, b_hi)
                    continue
                c1 = self.block_T(slice(i, j))[0]
                lo, hi = min(lo, float(c1.min())), max(hi, float(c1.max()))
                y = self.labels[i:j]
                for yy in range(self.K):
                    of_y = c1[:, y == yy]
                    if of_y.shape[1]:
                        np.maximum(top[yy], of_y.max(axis=1), out=top[yy])
            self._range = (float(lo), float(hi))
            self._top = top
        return self._range

    def c1_top(self) -> np.ndarray:
        """``top[y, k]``: the largest ``c1[i, k]`` over the rows of label ``y`` (-inf where no
        row has that label; 0 at ``k = y``)."""
        if self._top is None:
            self._range = None
            self.c1_range()
        assert self._top is not None
        return self._top


def _top_T(V: np.ndarray, scale: float, out: np.ndarray):
    """``(vmax, piece, many)`` of the columns of ``V`` (K, B; one row per piece): the largest
    value of each row of the data (into ``out``), the first piece that reaches it, and the
    rows where another piece is within twice ``scale`` of it (there the caller applies its
    tie rule; elsewhere the piece is the only one within the tie tolerance of the largest
    value, and the sequential rules of the dense oracle pick it)."""
    K, m = V.shape
    vmax = out
    np.copyto(vmax, V[0])
    sec = np.full(m, -np.inf)
    tmp = np.empty(m)
    for k in range(1, K):
        v = V[k]
        np.minimum(v, vmax, out=tmp)
        np.maximum(sec, tmp, out=sec)
        np.maximum(vmax, v, out=vmax)
    sec += 2.0 * scale
    many = np.flatnonzero(sec >= vmax)
    # the piece at the largest value, as the sum of k [V[k] == vmax]: where no other piece is
    # near the largest, exactly one piece equals it (the rows ``many`` are redone by the
    # caller's rule); small integers, which NumPy adds far faster than it copies by a mask
    small = np.int8 if K <= 127 else np.intp
    kk = np.zeros(m, dtype=small)
    part = np.empty(m, dtype=small)
    for k in range(1, K):
        eq = np.equal(V[k], vmax)
        np.multiply(eq.view(np.int8) if small is np.int8 else eq, k, out=part)
        kk += part
    out_k = kk.astype(np.intp)
    out_k[many] = 0  # (a valid piece until the caller's rule decides these rows)
    return vmax, out_k, many


class MulticlassOracle(PiecewiseOracle):
    """:class:`~otstab_solvers.dual.PiecewiseOracle` of a :class:`MulticlassRows` form: each
    method computes the pieces of a block of rows at a time (``scan``, ``values`` over the
    rows asked; ``evaluate`` over all rows: a block of :class:`~otstab_solvers.blockwise.
    BlockwiseDual` is one of these). The numbers equal the dense oracle's of
    ``(rows.materialize().T, rows.materialize_c2().T)``; ``c1abs``: the tie scale of a larger
    form these rows are a block of. The dense arrays are built (once) only by ``c1`` and
    ``with_c2`` (the paths that take the whole form: conic programs, feature scores)."""

    def __init__(self, rows: MulticlassRows, *, c1abs: float | None = None,
                 c2max: float | None = None):
        self.rows = rows
        self.n, self.K = rows.n, rows.K
        self._rowwise = True
        self._dense: np.ndarray | None = None
        self._dense_c2: np.ndarray | None = None
        if c1abs is None:
            lo, hi = rows.c1_range() if self.n else (0.0, 0.0)
            c1abs = max(hi, -lo) if self.n else 0.0
        self._c1abs = float(c1abs)
        self._c2max = float(rows.c2_max() if c2max is None else c2max)
        # a piece is identically zero only when every label is its class (c1 = c2 = 0 there)
        pres = rows.present() if self.n else np.zeros(self.K, dtype=bool)
        self._zero = [bool(self.n and pres[k] and pres.sum() == 1) for k in range(self.K)]
        self.p = None
        #: keep the last evaluation (chi2 sums one h over several passes)
        self.keep = False
        self._last: tuple | None = None
        self._pieces: dict = {}

    # -- the dense arrays, on demand ---------------------------------------------------------
    @property
    def _c1T(self) -> np.ndarray:  # type: ignore[override]
        if self._dense is None:
            self._dense = self.rows.materialize()
        return self._dense

    @property
    def _c2T(self) -> np.ndarray:  # type: ignore[override]
        if self._dense_c2 is None:
            self._dense_c2 = self.rows.materialize_c2()
        return self._dense_c2

    @property
    def c1(self) -> np.ndarray:  # type: ignore[override]
        return self._c1T.T

    @property
    def c2(self) -> np.ndarray:  # type: ignore[override]
        return self._c2T.T

    @property
    def _c1max(self) -> np.ndarray:  # type: ignore[override]  # (the dense oracle's per-piece largest c1)
        return self._c1T.max(axis=1) if self.n else np.zeros(self.K)

    def with_c2(self, c2) -> PiecewiseOracle:
        return PiecewiseOracle(self.c1, c2)

    def _piece(self, k: int, sel) -> np.ndarray:
        return self.rows.piece(k, sel)

    def _bound(self, h):
        return h * self._c1abs + h * h * self._c2max

    def _blocks_of(self, sel):
        """The row selections of ``sel`` in blocks (a slice in slices of :data:`BLOCK` rows;
        an index array in chunks), with the output positions of each."""
        if isinstance(sel, slice):
            start, stop, step = sel.indices(self.n)
            if step != 1:
                idx = np.arange(start, stop, step)
                return [(idx[i:i + BLOCK], slice(i, min(i + BLOCK, idx.size)))
                        for i in range(0, idx.size, BLOCK)], idx.size
            m = max(stop - start, 0)
            return [(slice(start + i, min(start + i + BLOCK, stop)),
                     slice(i, min(i + BLOCK, m))) for i in range(0, m, BLOCK)], m
        sel = np.asarray(sel)
        if sel.dtype == bool:
            sel = np.flatnonzero(sel)
        return [(sel[i:i + BLOCK], slice(i, min(i + BLOCK, sel.size)))
                for i in range(0, sel.size, BLOCK)], sel.size

    # -- the oracle's methods, per block -----------------------------------------------------
    def values(self, h: float, rows=None) -> np.ndarray:
        """l_h of the samples ``rows`` (default all), the dense oracle's numbers."""
        if _kernel_for(self.rows, self._rows_in(_as_index(rows))):
            sel = _as_index(rows)
            S, y = self.rows.S[sel], self.rows.labels[sel]
            out = np.empty(S.shape[0])
            _kernel(_values_rows)(S, y, self.rows.C, float(h), out)
            return out
        parts, m = self._blocks_of(slice(None) if rows is None else rows)
        out = np.empty(m)
        hh = h * h
        for sel, at in parts:
            c1, c2, _ = self.rows.block_T(sel)
            c1 *= h
            c2 *= hh
            c1 += c2
            o = out[at]
            np.copyto(o, c1[0])
            for k in range(1, self.K):
                np.maximum(o, c1[k], out=o)
        return out

    def values_max(self, h: float) -> float:
        """The largest l_h over all samples, in O(K^2) once :meth:`MulticlassRows.c1_top` is
        known (kept by the pass of ``c1_range``): within a label the pieces share ``c2``, a
        piece's ``c1 h + c2 h^2`` is nondecreasing in ``c1`` at h >= 0 and rounding is
        monotone, so the largest is the one at each (label, piece)'s largest ``c1``, with
        the arithmetic of :meth:`values` (as :meth:`PiecewiseOracle.values_max`)."""
        if not self.n:
            return 0.0
        hh = h * h
        if h >= 0.0:
            at = self.rows.c1_top()[self.rows.present()]
            v = at * h
            v += self.rows.C[self.rows.present()] * hh
            return float(v.max())
        top = -math.inf
        for s, e in self.rows.blocks():
            c1, c2, _ = self.rows.block_T(slice(s, e))
            c1 *= h
            c2 *= hh
            c1 += c2
            top = max(top, float(c1.max()))
        return top

    def scan(self, h: float, tol: float | None = None, rows=None):
        """:meth:`PiecewiseOracle.scan` (the same tie rule and numbers), a block at a time:
        the rows where one piece alone is near the largest value take it (the sequential rule
        does: see :meth:`_side`), the others go through the sequential rule."""
        tol = self.TIE if tol is None else tol
        if _kernel_for(self.rows, self._rows_in(_as_index(rows))):
            sel = _as_index(rows)
            S, y = self.rows.S[sel], self.rows.labels[sel]
            m = S.shape[0]
            vmax, d_lo, d_hi = np.empty(m), np.empty(m), np.empty(m)
            k_lo, k_hi = np.empty(m, dtype=np.intp), np.empty(m, dtype=np.intp)
            scan = _kernel(_scan_rows)
            if not scan(S, y, self.rows.C, float(h), float(tol * self._bound(h)), vmax, k_lo,
                        d_lo, k_hi, d_hi):
                return vmax, k_lo, d_lo, k_lo, d_lo  # (one array for both sides: no tie)
            return vmax, k_lo, d_lo, k_hi, d_hi
        parts, m = self._blocks_of(slice(None) if rows is None else rows)
        vmax, d_lo = np.empty(m), np.empty(m)
        k_lo = np.empty(m, dtype=np.intp)
        scale = tol * self._bound(h)
        hh = h * h
        ties = []  # (positions, k_hi, d_hi) of the rows whose two sides differ
        for sel, at in parts:
            c1, c2, ar = self.rows.block_T(sel)
            V = c1 * h
            V += c2 * hh
            vm, kk, many = _top_T(V, scale, vmax[at])
            flat = kk * ar.size
            flat += ar
            d = c2.reshape(-1).take(flat)
            d *= 2.0 * h
            d += c1.reshape(-1).take(flat)
            if many.size:
                D = c2[:, many] * (2.0 * h)
                D += c1[:, many]
                Vm = V[:, many]
                v0 = Vm[0].copy()
                dl, dh = D[0].copy(), D[0].copy()
                kl, kh = np.zeros(many.size, dtype=np.intp), np.zeros(many.size, dtype=np.intp)
                for k in range(1, self.K):
                    tie_step_both(v0, dl, dh, kl, kh, Vm[k], D[k], k, scale)
                kk[many], d[many] = kl, dl
                two = kl != kh
                if two.any():
                    pos = np.arange(at.start, at.stop)[many[two]]
                    ties.append((pos, kh[two], dh[two]))
            k_lo[at], d_lo[at] = kk, d
        if not ties:
            return vmax, k_lo, d_lo, k_lo, d_lo
        k_hi, d_hi = k_lo.copy(), d_lo.copy()
        for pos, kh_, dh_ in ties:
            k_hi[pos], d_hi[pos] = kh_, dh_
        return vmax, k_lo, d_lo, k_hi, d_hi

    def _side(self, h: float, right: bool, sel):
        """``(l_h, derivative, second derivative, piece)`` of the rows ``sel`` (one block),
        ties resolved as :meth:`PiecewiseOracle._scan_side` does: where one piece alone is
        within the tie tolerance of the largest value it is the piece (the sequential rule
        picks it: every other piece is below it by more than the tolerance), and the rows
        with two or more such pieces go through the sequential rule itself."""
        c1, c2, ar = self.rows.block_T(sel)
        K, m = c1.shape
        hh = h * h
        V = c1 * h
        V += c2 * hh
        scale = self.TIE * self._bound(h)
        vmax, kk, many = _top_T(V, scale, np.empty(m))
        if many.size:
            D = c2[:, many] * (2.0 * h)
            D += c1[:, many]
            Vm = V[:, many]
            vm, d, km = Vm[0].copy(), D[0].copy(), np.zeros(many.size, dtype=np.intp)
            for k in range(1, K):
                tie_step(vm, d, km, Vm[k], D[k], k, scale, right)
            kk[many] = km
        flat = kk * m
        flat += ar
        c2k = c2.reshape(-1).take(flat)
        d = c2k * (2.0 * h)
        d += c1.reshape(-1).take(flat)
        c2k *= 2.0
        return vmax, d, c2k, kk

    def _derivs(self, h: float, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(dl, d2l)`` of every row on its piece ``k`` at ``h``: the numbers of :meth:`_side`
        (the same operations on the same numbers: ``c1 = (1 + s_k) - s_y``, 0 at the label,
        ``c2 = C[y, k]``, ``dl = 2 h c2 + c1``), from the scores of the two classes alone."""
        if _kernel_for(self.rows, self.n):
            d1, d2 = np.empty(self.n), np.empty(self.n)
            derivs = _kernel(_derivs_rows)
            derivs(self.rows.S, self.rows.labels, self.rows.C, float(h), k, d1, d2)
            return d1, d2
        S = np.ascontiguousarray(self.rows.S).reshape(-1)
        y = self.rows.labels
        K = self.K
        at = np.arange(0, K * self.n, K)
        c1k = np.add(1.0, S.take(at + k))
        c1k -= S.take(at + y)
        c1k[k == y] = 0.0
        c2k = self.rows.C.reshape(-1).take(y * K + k)
        d1 = c2k * (2.0 * h)
        d1 += c1k
        c2k *= 2.0
        return d1, c2k

    def kept_values(self, h: float, side: str) -> np.ndarray:
        """l_h at ``(h, side)``: the kept one (:attr:`keep`) when it is that evaluation's."""
        if self._last is not None and self._last[0] == (h, side):
            return self._last[1][0]
        return self.evaluate(h, side=side)[0]

    def evaluate(self, h: float, *, side: str = "right", with_pieces: bool = False):
        key = (h, side)
        if self._last is not None and self._last[0] == key:
            lh, d1, d2, k = self._last[1]
            if d1 is None:  # (kept without them: from the pieces)
                d1, d2 = self._derivs(h, k)
        elif _kernel_for(self.rows, self.n):
            lh, d1, d2 = np.empty(self.n), np.empty(self.n), np.empty(self.n)
            k = np.empty(self.n, dtype=np.intp)
            side_rows = _kernel(_side_rows)
            side_rows(self.rows.S, self.rows.labels, self.rows.C, float(h),
                      float(self.TIE * self._bound(h)), side == "right", lh, d1, d2, k)
        elif self.n <= BLOCK:
            lh, d1, d2, k = self._side(h, side == "right", slice(None))
        else:
            lh, d1, d2 = np.empty(self.n), np.empty(self.n), np.empty(self.n)
            k = np.empty(self.n, dtype=np.intp)
            for s, e in self.rows.blocks():
                lh[s:e], d1[s:e], d2[s:e], k[s:e] = self._side(h, side == "right",
                                                               slice(s, e))
        if key not in self._pieces:
            if len(self._pieces) >= PIECES_KEPT:
                self._pieces.pop(next(iter(self._pieces)))
            self._pieces[key] = k.astype(np.int8 if self.K <= 127 else np.intp)
        if self.keep:  # l_h and the pieces (a small integer type): an eighth of the three
            self._last = (key, (lh, None, None, self._pieces[key]))
        if with_pieces:
            return lh, d1, d2, k
        return lh, d1, d2

    def pieces_at(self, h: float, side: str) -> np.ndarray:
        """The piece of every row at ``h`` on ``side`` (kept from the last evaluations there,
        so that the kinks of a bracket are found without evaluating its ends again)."""
        got = self._pieces.get((h, side))
        if got is not None:
            return got
        return self.evaluate(h, side=side, with_pieces=True)[3]

    def crossings(self, ka: np.ndarray, kb: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The h > 0 where pieces ``ka[i]`` and ``kb[i]`` of sample ``idx[i]`` are equal (the
        dense oracle's arithmetic)."""
        c1, c2 = self.rows.block(idx)
        ar = np.arange(c1.shape[0])
        dc1 = c1[ar, kb] - c1[ar, ka]
        dc2 = c2[ar, ka] - c2[ar, kb]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(dc2 != 0.0, dc1 / dc2, np.nan)


def multiclass_blocks(oracle: MulticlassOracle, p=None, size: int = 1 << 15,
                      keep: bool = False):
    """Blocks of :class:`~otstab_solvers.blockwise.BlockwiseDual` of a
    :class:`MulticlassOracle`: oracles of rows ``s..e`` (views) with its tie scale; ``p``: the
    sample probabilities (a view per block)."""
    out = []
    rows = oracle.rows
    for s in range(0, rows.n, size):
        e = min(s + size, rows.n)
        block = MulticlassOracle(rows.subset(s, e), c1abs=oracle.c1abs, c2max=oracle._c2max)
        block._zero = oracle._zero
        block.p = None if p is None else p[s:e]
        block.keep = keep
        out.append(block)
    return out


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a @ b`` by einsum: a BLAS dot of a block starts its threads, which on a busy machine
    costs 10x the sum itself (0.24 ms against 0.02 ms for 32768 rows, load 5 on 2 cores)."""
    return float(np.einsum("i,i->", a, b))


def _block_kl(block, h, side, theta2):
    """:func:`~otstab_solvers.blockwise.block_kl` with the sum of ``expm1`` computed by
    ``expm1`` only where it keeps accuracy that ``e - 1`` loses: in a block whose mean
    ``e`` is above 1/2 (every value near the block's largest). Elsewhere the sum of
    ``e - 1`` is at most -1/2 per row and ``sum e - mass`` is as accurate (one exp pass
    instead of two)."""
    lh, d1, d2, _ = block_l(block, h, side)
    a = lh / theta2
    live = None if block.p is None else block.p > 0
    av = a if live is None else a[live]
    if not av.size:
        return -math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    m = float(av.max())
    x = np.clip(a - m, -700.0, 0.0, out=a)
    e = np.exp(x)
    pe = e if block.p is None else block.p * e
    mass = float(lh.size) if block.p is None else float(np.sum(block.p))
    Z = float(np.sum(pe))
    if Z > 0.5 * mass:
        em1 = np.expm1(x)
        em1_sum = float(np.sum(em1)) if block.p is None else _dot(block.p, em1)
    else:
        em1_sum = Z - mass
    pd1 = pe * d1
    return (m, Z, float(np.sum(pd1)), _dot(pd1, d1), _dot(pe, d2),
            em1_sum, mass)


def _block_chi2_active(block, h, side, theta2, shift, alpha):
    """:func:`~otstab_solvers.blockwise.block_chi2_active` on the kept ``l_h`` alone (the
    same rows active; the sums by einsum / a masked sum)."""
    kept = getattr(block, "kept_values", None)  # (a dense block: the weighted subsample)
    ls = (kept(h, side) if kept is not None else block_l(block, h, side)[0]) - shift
    act = ls + alpha > -2.0 * theta2
    if block.p is not None:
        act &= block.p > 0
        pa = np.where(act, block.p, 0.0)
        return int(np.count_nonzero(act)), float(np.sum(pa)), _dot(pa, ls)
    k = int(np.count_nonzero(act))
    return k, float(k), float(np.sum(ls, where=act))


def _block_chi2(block, h, side, theta2, shift, alpha):
    """:func:`~otstab_solvers.blockwise.block_chi2` (the same sums, by einsum) from the kept
    ``l_h`` and the derivatives of the kept pieces."""
    lh, d1, d2, _ = block_l(block, h, side)
    ls = lh - shift
    s = ls + alpha
    act = s > -2.0 * theta2
    p = block.p
    if p is not None:
        act &= p > 0
    k = int(np.count_nonzero(act))
    if k < act.size:  # the inactive rows count as zeros
        s, d1, d2, ls = (np.where(act, x, 0.0) for x in (s, d1, d2, ls))
    w = s / (2.0 * theta2)
    w += act
    if p is None:
        return (k, float(k), float(np.sum(s)), _dot(s, s), _dot(w, d1), _dot(w, d2),
                float(np.sum(d1)), _dot(d1, d1), float(np.sum(ls)))
    pw, ps, pd1 = p * w, p * s, p * d1
    return (k, _dot(p, act.astype(np.float64)), float(np.sum(ps)), _dot(ps, s), _dot(pw, d1),
            _dot(pw, d2), float(np.sum(pd1)), _dot(pd1, d1), _dot(p, ls))


#: the blockwise sums :class:`MulticlassDual` takes its own way
_OWN = {block_kl: _block_kl, block_chi2: _block_chi2, block_chi2_active: _block_chi2_active}


class MulticlassDual(BlockwiseDual):
    """:class:`~otstab_solvers.blockwise.BlockwiseDual` over the blocks of
    :func:`multiclass_blocks` held in this process, its KL sums taken by :func:`_block_kl`
    (one exp pass per evaluation); ``total``: ``n`` for uniform rows, 1 when the blocks carry
    probabilities. :meth:`release` frees what the blocks kept for the search."""

    def __init__(self, blocks, n: int, total: float):
        super().__init__(in_memory(blocks), n, total)
        self.blocks = blocks

    def run(self, func, *args):
        return super().run(_OWN.get(func, func), *args)

    def release(self) -> None:
        """Drop the pieces and evaluations the blocks kept (the search is over)."""
        for block in self.blocks:
            block._pieces.clear()
            block._last = None


def _tail_rows(rows: MulticlassRows, c1_sub: np.ndarray, labels_sub: np.ndarray,
               stride: int, per_pair: int) -> np.ndarray | None:
    """The rows at the top of the data for some (label, piece) pair: those with
    ``c1[i, k] >= tau[y_i, k]`` for a ``k != y_i``, ``tau[y, k]`` the ``per_pair / stride``-th
    largest ``c1[:, k]`` over the subsample's rows of label ``y`` (``c1_sub``, ``labels_sub``),
    so that about ``per_pair`` rows of the data pass each threshold. One pass over blocks.

    Whatever ``h >= 0``, a row outside this set has ``l_h`` below ``max_k tau[y, k] h +
    C[y, k] h^2`` of its label ``y``; every row above that is in the set (within a label the
    pieces ``k`` share ``c2``, so their order is that of ``c1``). These are the rows that
    carry the most sensitive distribution near the largest loss, which a strided subsample
    misses. None: the set would hold more than ``16 K^2 per_pair`` rows."""
    K = rows.K
    j = max(1, per_pair // max(stride, 1))
    tau = np.full((K, K), np.inf)
    for y in range(K):
        of_y = c1_sub[labels_sub == y]
        for k in range(K):
            if k == y:
                continue
            col = of_y[:, k]
            tau[y, k] = -np.inf if col.size <= j else float(np.partition(col, -j)[-j])
    thrT = np.ascontiguousarray(tau.T)  # thrT[k, y] = tau[y, k]
    cap = 16 * K * K * per_pair
    found, total = [], 0
    kernel = _kernel_for(rows, rows.n)
    buf = np.empty(min(rows.n, BLOCK), dtype=np.bool_)
    for s, e in rows.blocks():
        if kernel:
            hit = buf[:e - s]
            _kernel(_tail_hits)(rows.S[s:e], rows.labels[s:e], tau, hit)
        else:
            c1 = rows.block_T(slice(s, e))[0]
            hit = np.greater_equal(c1, np.take(thrT, rows.labels[s:e], axis=1)).any(axis=0)
        at = np.flatnonzero(hit)
        if at.size:
            total += at.size
            if total > cap:
                return None
            found.append(at + s)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.intp)


#: the rows per (label, piece) pair that :func:`solve_multiclass` adds to the subsample from
#: the top of the data when the subsample's weights are carried by few of its rows
TAIL_ROWS = 256
#: the subsample's effective size (``(sum w)^2 / sum w^2`` of its most sensitive
#: distribution's weights) below which those rows are added
TAIL_ESS = 2048


def _start(oracle: MulticlassOracle, r: float, theta2: float, divergence: str,
           base: float | None) -> tuple[float, dict, tuple]:
    """``(h_sub, info, (sub, p))``: where the subsample puts the root (nan: nowhere), and the
    subsample's oracle with its probabilities (None: uniform), the model of
    :func:`_model_root`. A strided
    subsample of :data:`~otstab_solvers.dual.WINDOW_SUBSAMPLE` rows first; when the weights
    of its most sensitive distribution sit on fewer than :data:`TAIL_ESS` of its rows (a
    threshold near the largest loss under KL: the weights go to the top rows, which a
    strided sample has few of), the dual is solved again with the rows of
    :func:`_tail_rows` added at their own probability 1/n and the strided rows standing for
    the rest."""
    n = oracle.n
    stride = max(1, n // WINDOW_SUBSAMPLE)
    c1, c2 = oracle.rows.block(slice(0, n, stride))
    sub = PiecewiseOracle(c1, c2, c1abs=oracle.c1abs)
    r_sub = r if base is None else r - base + float(np.mean(c1.max(axis=1)))
    sub_sol = solve_dual(sub, r_sub, theta2, divergence, tol=1e-10) if r_sub > 0 else None
    h_sub = sub_sol.h if sub_sol is not None and sub_sol.status == OPTIMAL else math.nan
    info: dict = {}
    if sub_sol is not None and sub_sol.alpha is not None and math.isfinite(h_sub):
        info["alpha_subsample"] = float(sub_sol.alpha)
    model: tuple = (sub, None)
    if not (math.isfinite(h_sub) and h_sub > 0) or math.isinf(theta2):
        return h_sub, info, model
    w = weights_at(sub.values(h_sub), theta2, divergence)[0]
    ess = float(np.sum(w)) ** 2 / _dot(w, w)
    info["ess"] = ess
    if ess >= TAIL_ESS:
        return h_sub, info, model
    labels_sub = oracle.rows.labels[0:n:stride]
    tail = _tail_rows(oracle.rows, c1, labels_sub, stride, TAIL_ROWS)
    if tail is None or not tail.size:
        return h_sub, info, model
    strided = np.arange(0, n, stride)
    rest = np.setdiff1d(strided, tail, assume_unique=True)
    if not rest.size:
        return h_sub, info, model
    idx = np.concatenate([tail, rest])
    p = np.empty(idx.size)
    p[:tail.size] = 1.0 / n
    p[tail.size:] = (n - tail.size) / (n * rest.size)
    c1w, c2w = oracle.rows.block(idx)
    r_w = r if base is None else r - base + _dot(p, c1w.max(axis=1))
    block = PiecewiseOracle(c1w, c2w, c1abs=oracle.c1abs)
    block.p = p
    # (one block of the blockwise dual: its sums by einsum, :func:`_block_kl`)
    sub_w = MulticlassDual([block], idx.size, 1.0)
    sol_w = solve_dual(sub_w, r_w, theta2, divergence, tol=1e-10) if r_w > 0 else None
    info["tail"] = int(tail.size)
    if sol_w is not None and sol_w.status == OPTIMAL and sol_w.h > 0:
        info["h_strided"] = h_sub
        h_sub, model = sol_w.h, (sub_w, p)
        sub_w.passes = 0
        if sol_w.alpha is not None:
            info["alpha_subsample"] = float(sol_w.alpha)
    return h_sub, info, model


def _sub_mu(model, h: float, theta2: float, divergence: str) -> tuple[float, float]:
    """``(mu, curv)`` of the subsample's dual at ``h`` (right side): its ``r - g`` and ``-g'``."""
    sub, p = model
    if p is not None:  # (a one-block MulticlassDual)
        return sub.reduce(h, "right", theta2, divergence)[1:3]
    lh, d1, d2 = sub.evaluate(h)
    _, mu, curv, _ = _reduce(lh, d1, d2, theta2, divergence, sub.n)
    return mu, curv


def _model_root(model, cur: dict, prev: dict | None, theta2: float, divergence: str,
                lo: float, hi: float) -> float:
    """The root in ``(lo, hi)`` of the full dual's derivative as the subsample models it
    near the full point ``cur``: ``g(h) ~ D(cur) + b (h - h_cur) - mu_sub(h)`` with
    ``D = g_full + mu_sub`` (the full data's derivative less the subsample's shape; a
    control variate: what it leaves to model varies far less than ``g`` itself) and ``b``
    its slope: the secant of ``D`` from the previous full point ``prev`` (which holds the
    kinks' share of the slope, absent from the local curvature), else from the local
    curvatures ``curv_sub - curv_full``. Each point is a dict with ``h``, ``g``, ``curv``
    (the full data's) and ``mu_sub``, ``curv_sub`` (the subsample's at ``h``). Safeguarded
    Newton on the subsample (a few evaluations of its rows); nan where the model has no
    root there."""
    h0, d0 = cur["h"], cur["g"] + cur["mu_sub"]
    if prev is not None and prev["h"] != h0:
        b = (d0 - prev["g"] - prev["mu_sub"]) / (h0 - prev["h"])
    else:
        b = cur["curv_sub"] - cur["curv"]

    def m(h):
        mu, curv = _sub_mu(model, h, theta2, divergence)
        return d0 + b * (h - h0) - mu, b - curv

    h, v, dv = h0, d0 - cur["mu_sub"], b - cur["curv_sub"]
    a_lo, a_hi = lo, hi
    for _ in range(MODEL_STEPS):
        if v > 0:
            a_lo = max(a_lo, h)
        elif v < 0:
            a_hi = min(a_hi, h)
        else:
            return h
        cand = h - v / dv if dv < 0 else math.nan
        if not a_lo < cand < a_hi:
            if not math.isfinite(a_hi):
                cand = 2.0 * h if v > 0 else math.nan
            else:
                cand = 0.5 * (a_lo + a_hi)
        if not math.isfinite(cand):
            return math.nan
        if abs(cand - h) <= MODEL_TOL * h or a_hi - a_lo <= MODEL_TOL * h:
            return cand
        h = cand
        v, dv = m(h)
    return h


#: the subsample's Newton steps on its model of the full derivative (:func:`_model_root`)
MODEL_STEPS = 16
#: the relative precision of the model's root: far below the model's own error (its
#: subsample's sampling error times the step squared), far above the subsample's kinks
MODEL_TOL = 1e-10
#: full evaluations placed by the model before the plain search takes over
MODEL_TRIES = 4
#: a step to the model's root is lengthened by this share of itself, so that it lands past
#: the root (the other end of the bracket) by more than the model's error
MODEL_OVERSHOOT = 1e-4
#: a model root within this share of h of the last full point, with a bracket held, is left
#: to the search's own Newton step (the model's error is then below the kinks' jumps)
MODEL_CLOSE = 1e-5


def solve_multiclass(oracle: MulticlassOracle, dual: BlockwiseDual, r: float, theta2: float,
                     divergence: str, *, base: float | None = None, tol: float = 1e-13,
                     max_iter: int = 200, min_n: int | None = None) -> DualSolution:
    """:func:`~otstab_solvers.dual.solve_dual` of the blockwise ``dual`` of ``oracle`` (uniform
    rows), its bracket found by full evaluations placed by a subsample, so that few passes
    over all rows are made.

    The subsample (:func:`_start`: strided, with the top rows added where its weights sit on
    few rows; its threshold moved by the difference of the two base risks, as
    :func:`~otstab_solvers.dual.solve_two_piece` does; ``base``: the data's base risk) gives
    ``h_sub``, the first full evaluation. Each next one is at the root of the subsample's
    model of the full derivative corrected to the last full point (:func:`_model_root`),
    lengthened by :data:`MODEL_OVERSHOOT`, until two full points have derivatives of both
    signs; the safeguarded search of :func:`~otstab_solvers.dual.solve_dual` then finishes
    inside that bracket (exact kinks, the same stopping rule). After
    :data:`MODEL_TRIES` points without a bracket, or without a subsample, the plain
    :func:`~otstab_solvers.dual.solve_dual` runs. The answer is the full dual's in every
    case: the subsample only decides where the full data is evaluated."""
    n = oracle.n
    min_n = WINDOW_MIN_N if min_n is None else min_n
    t0 = time.perf_counter()
    points: list[dict] = []
    if n >= max(min_n, 1) and dual.total == float(n):
        h_sub, start, model = _start(oracle, r, theta2, divergence, base)
        alpha_sub = start.get("alpha_subsample", math.nan)
        if divergence == "chi2" and math.isfinite(alpha_sub) and dual._alpha is None:
            # chi2's active-set steps start from the subsample's alpha at h_sub (near the full
            # data's there) instead of every row active: fewer passes at the first point; the
            # steps end at the exact alpha from any start
            dual._alpha = alpha_sub
        evals = 0

        def at(h, side="right"):
            nonlocal evals
            evals += 1
            term, mu, curv, alpha, key = dual.reduce(h, side, theta2, divergence)
            return _Point(h, h * r - term, r - mu, curv, alpha, key)

        def finish(p, status, gap=0.0, note=""):
            sol = DualSolution(h=p.h, alpha=p.alpha, value=p.F, status=status, solver="dual",
                               native_status=note or status, iterations=evals,
                               gap_bound=gap, solve_time=time.perf_counter() - t0)
            sol.info["window"] = {"h_subsample": h_sub, "points": points, **start}
            return sol

        lo = hi = None
        h = h_sub
        overshoot = MODEL_OVERSHOOT
        prev = None
        for _ in range(MODEL_TRIES if math.isfinite(h_sub) and h_sub > 0 else 0):
            pt = at(h)
            if not math.isfinite(pt.F):
                lo = hi = None
                break
            if pt.g == 0.0:
                return finish(pt, OPTIMAL)
            if pt.g > 0.0:
                lo = pt
            else:
                hi = pt
            mu_sub, curv_sub = _sub_mu(model, h, theta2, divergence)
            cur = {"h": h, "g": pt.g, "curv": pt.curv, "mu_sub": mu_sub, "curv_sub": curv_sub}
            points.append(cur)
            h_lo, h_hi = (0.0 if lo is None else lo.h), (math.inf if hi is None else hi.h)
            h_root = _model_root(model, cur, prev, theta2, divergence, h_lo, h_hi)
            prev = cur
            if not (math.isfinite(h_root) and h_lo < h_root < h_hi):
                break
            if lo is not None and hi is not None and \
                    abs(h_root - pt.h) <= MODEL_CLOSE * pt.h:
                break  # the search's Newton step from this point ends it
            if lo is None or hi is None:  # past the root, to bracket it
                h = pt.h + (h_root - pt.h) * (1.0 + overshoot)
                overshoot *= 10.0
                if not h_lo < h < h_hi:
                    h = 0.5 * (h_root + (h_lo if h < h_root else h_hi))
            else:
                h = h_root
        del model  # (the subsample's arrays: not held through the search)
        if lo is not None and hi is not None:
            sol = _solve_bracketed(at, dual, dual, True, [lo, hi], r, tol, max_iter, finish)
            if sol.status == OPTIMAL:
                return sol
        del lo, hi
    sol = solve_dual(dual, r, theta2, divergence, tol=tol, max_iter=max_iter)
    sol.solve_time = time.perf_counter() - t0
    if points:
        sol.info["window"] = {"points": points, "fallback": "plain search"}
    return sol
