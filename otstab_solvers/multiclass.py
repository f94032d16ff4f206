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

import math

import numpy as np

from .dual import PiecewiseOracle

__all__ = ["MulticlassRows", "MulticlassOracle", "multiclass_blocks", "BLOCK"]

#: rows per block: the (B, K) temporaries of a block stay in the cache
BLOCK = 1 << 13
#: evaluations whose pieces a block keeps (int8: an eighth of an n-vector each), for the kinks
#: between the ends of the dual's bracket
PIECES_KEPT = 4


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
        self._present: np.ndarray | None = None

    def subset(self, s: int, e: int) -> MulticlassRows:
        """Rows ``s..e`` (views of the same arrays)."""
        return MulticlassRows(self.S[s:e], self.labels[s:e], self.C)

    def blocks(self):
        return ((i, min(i + self.BLOCK, self.n)) for i in range(0, self.n, self.BLOCK))

    def block(self, sel) -> tuple[np.ndarray, np.ndarray]:
        """``(c1, c2)`` of the rows ``sel`` (a slice or an index array), each (B, K): the
        numbers of :meth:`materialize` (``(1 + s_k) - s_y``, 0 at the label)."""
        S = self.S[sel]
        y = self.labels[sel]
        ar = np.arange(S.shape[0])
        sy = S[ar, y]
        c1 = np.add(1.0, S)
        c1 -= sy[:, None]
        c1[ar, y] = 0.0
        return c1, self.C.take(y, axis=0)

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
        over blocks; (inf, -inf) without rows."""
        if self._range is None:
            lo, hi = math.inf, -math.inf
            for i, j in self.blocks():
                c1 = self.block(slice(i, j))[0]
                lo, hi = min(lo, float(c1.min())), max(hi, float(c1.max()))
            self._range = (lo, hi)
        return self._range


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
        parts, m = self._blocks_of(slice(None) if rows is None else rows)
        out = np.empty(m)
        hh = h * h
        for sel, at in parts:
            c1, c2 = self.rows.block(sel)
            c1 *= h
            c2 = c2 * hh
            c1 += c2
            np.max(c1, axis=1, out=out[at])
        return out

    def values_max(self, h: float) -> float:
        """The largest l_h over all samples (over blocks)."""
        if not self.n:
            return 0.0
        hh = h * h
        top = -math.inf
        for s, e in self.rows.blocks():
            c1, c2 = self.rows.block(slice(s, e))
            c1 *= h
            c2 *= hh
            c1 += c2
            top = max(top, float(c1.max()))
        return top

    def scan(self, h: float, tol: float | None = None, rows=None):
        """:meth:`PiecewiseOracle.scan` (the same tie rule and numbers), a block at a time."""
        tol = self.TIE if tol is None else tol
        parts, m = self._blocks_of(slice(None) if rows is None else rows)
        vmax, d_lo, d_hi = np.empty(m), np.empty(m), np.empty(m)
        k_lo, k_hi = np.zeros(m, dtype=np.intp), np.zeros(m, dtype=np.intp)
        scale = tol * self._bound(h)
        hh = h * h
        same = True  # no tie anywhere: d_hi is d_lo
        for sel, at in parts:
            c1, c2 = self.rows.block(sel)
            D = c2 * (2.0 * h)
            D += c1
            V = c1
            V *= h
            c2 *= hh
            V += c2
            vm, dl, dh = V[:, 0].copy(), D[:, 0].copy(), D[:, 0].copy()
            kl, kh = k_lo[at], k_hi[at]
            for k in range(1, self.K):
                v, dk = V[:, k], D[:, k]
                diff = v - vm
                above = diff > scale
                tie = np.abs(diff) <= scale
                np.copyto(dl, dk, where=above)
                np.copyto(dh, dk, where=above)
                np.copyto(kl, k, where=above)
                np.copyto(kh, k, where=above)
                if tie.any():
                    lo_upd = tie & (dk < dl)
                    hi_upd = tie & (dk > dh)
                    np.copyto(dl, dk, where=lo_upd)
                    np.copyto(kl, k, where=lo_upd)
                    np.copyto(dh, dk, where=hi_upd)
                    np.copyto(kh, k, where=hi_upd)
                np.maximum(vm, v, out=vm)
            vmax[at], d_lo[at], d_hi[at] = vm, dl, dh
            same = same and bool(np.array_equal(kl, kh))
        if same:
            return vmax, k_lo, d_lo, k_lo, d_lo
        return vmax, k_lo, d_lo, k_hi, d_hi

    def _side(self, h: float, right: bool, sel):
        """``(l_h, derivative, second derivative, piece)`` of the rows ``sel`` (one block),
        ties resolved as :meth:`PiecewiseOracle._scan_side` does: where one piece alone is
        within the tie tolerance of the largest value it is the piece (the sequential rule
        picks it: every other piece is below it by more than the tolerance), and the rows
        with two or more such pieces go through the sequential rule itself."""
        c1, c2 = self.rows.block(sel)
        m = c1.shape[0]
        hh = h * h
        V = c1 * h
        V += c2 * hh
        ar = np.arange(m)
        kk = np.argmax(V, axis=1)
        vmax = V[ar, kk]
        scale = self.TIE * self._bound(h)
        near = V >= (vmax - scale)[:, None]
        many = np.flatnonzero(np.count_nonzero(near, axis=1) > 1)
        if many.size:
            D = c2[many] * (2.0 * h)
            D += c1[many]
            Vm = V[many]
            vm, d, km = Vm[:, 0].copy(), D[:, 0].copy(), np.zeros(many.size, dtype=np.intp)
            for k in range(1, self.K):
                v, dk = Vm[:, k], D[:, k]
                diff = v - vm
                cand = diff >= -scale
                cand &= (diff > scale) | ((dk > d) if right else (dk < d))
                np.copyto(d, dk, where=cand)
                np.copyto(km, k, where=cand)
                np.maximum(vm, v, out=vm)
            kk[many] = km
        c2k = c2[ar, kk]
        d = c2k * (2.0 * h)
        d += c1[ar, kk]
        c2k *= 2.0
        return vmax, d, c2k, kk

    def evaluate(self, h: float, *, side: str = "right", with_pieces: bool = False):
        key = (h, side)
        if self._last is not None and self._last[0] == key:
            lh, d1, d2, k = self._last[1]
        elif self.n <= BLOCK:
            lh, d1, d2, k = self._side(h, side == "right", slice(None))
        else:
            lh, d1, d2 = np.empty(self.n), np.empty(self.n), np.empty(self.n)
            k = np.empty(self.n, dtype=np.intp)
            for s, e in self.rows.blocks():
                lh[s:e], d1[s:e], d2[s:e], k[s:e] = self._side(h, side == "right",
                                                               slice(s, e))
        if self.keep:
            self._last = (key, (lh, d1, d2, k))
        if key not in self._pieces:
            if len(self._pieces) >= PIECES_KEPT:
                self._pieces.pop(next(iter(self._pieces)))
            self._pieces[key] = k.astype(np.int8 if self.K <= 127 else np.intp)
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
