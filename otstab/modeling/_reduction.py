"""Reduction of (linear model, piecewise-linear loss, theta1, feature mask) to the d-transform form.

For a loss ``l(x, y) = max_k (a_ik . x + b_ik)`` that is piecewise linear in ``x`` (MATH.md),

    l_h(z_i) = max_x h l(x, y_i) - theta1 ||x - x_i||^2_M = max_k c1[i, k] h + c2[i, k] h^2,

    c1[i, k] = a_ik . x_i + b_ik   (the k-th piece at the sample),
    c2[i, k] = ||a_ik restricted to the mask||^2 / (4 theta1),

and the maximising move is ``x_i* = x_i + h a_ik* / (2 theta1)`` on the masked coordinates
(coordinates outside the mask cost infinitely much to move). ``theta1 = inf`` gives ``c2 = 0``
(no move: only reweighting). Everything downstream (conic programs, the specialised dual)
works on ``(c1, c2)`` alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from otstab_solvers.dual import AffineRows, PiecewiseOracle, oracle_for

from ..errors import ValidationError
from ._losses import MulticlassHinge, PiecewiseLinear
from ._models import Problem

__all__ = ["Reduced", "reduce_problem", "feature_mask"]


@dataclass
class Reduced:
    """The reduced form ``l_h(z_i) = max_k c1[i,k] h + c2[i,k] h^2`` plus what is needed to move.

    Attributes
    ----------
    c1 : (n, K) array (a property: built on first access when ``rows`` computes it)
    c1_dense : (n, K) array, or None while ``rows`` computes the pieces on demand
    c2 : (1, K) or (n, K) array, nonnegative
    theta1 : float
    kind : "margin", "residual" or "multiclass"
    v : (d,) masked coefficient direction (margin / residual)
    g : (1, K) coefficient of ``v`` in ``a_ik`` (margin / residual), times ``g_rows[i]``
    g_rows : (n,) per-sample factor of ``g`` (the labels +-1 of a margin loss; None: 1)
    Wm : (K, d) masked class weights (multiclass); a_ik = Wm[k] - Wm[y_i]
    labels : (n,) internal class indices (multiclass)
    rows : :class:`otstab_solvers.dual.AffineRows` (margin / residual): ``c1[i, k] = a_k u_i +
        b_k`` from the scores and labels, computed per block where needed (the specialised
        dual and the certificate builder never hold the (n, K) array)
    """

    c1_dense: np.ndarray | None
    c2: np.ndarray
    theta1: float
    kind: str
    v: np.ndarray | None = None
    g: np.ndarray | None = None
    Wm: np.ndarray | None = None
    labels: np.ndarray | None = None
    g_rows: np.ndarray | None = None
    rows: AffineRows | None = None

    @property
    def c1(self) -> np.ndarray:
        """The (n, K) pieces at the samples (built block by block on first access)."""
        if self.c1_dense is None:
            assert self.rows is not None  # one of the two is set
            self.c1_dense = self.rows.materialize().T
        return self.c1_dense

    @property
    def n(self) -> int:
        if self.c1_dense is not None:
            return self.c1_dense.shape[0]
        assert self.rows is not None  # one of the two is set
        return self.rows.n

    @property
    def K(self) -> int:
        if self.c1_dense is not None:
            return self.c1_dense.shape[1]
        assert self.rows is not None  # one of the two is set
        return self.rows.K

    def loss_values(self) -> np.ndarray:
        """The loss at the data, ``max_k c1[i, k]``."""
        if self.c1_dense is not None:
            return self.c1_dense.max(axis=1)
        assert self.rows is not None  # one of the two is set
        out = np.empty(self.n)
        for i, j in self.rows.blocks():
            rows = slice(i, j)
            out[i:j] = self.rows.piece(0, rows)
            for k in range(1, self.K):
                np.maximum(out[i:j], self.rows.piece(k, rows), out=out[i:j])
        return out

    def oracle(self, *, sorted_view: bool = True) -> PiecewiseOracle:
        """The dual's oracle for this form (:func:`otstab_solvers.dual.oracle_for`; pieces
        computed per block when ``rows`` gives them). A hinge-shaped form is recognised either
        way; ``sorted_view=True`` also sorts its keys now (the view ``prefix``), False leaves
        the sorting to :func:`otstab_solvers.dual.solve_two_piece`."""
        return oracle_for(self.c1_dense, self.c2, sorted_view=sorted_view,
                          rows=self.rows if self.c1_dense is None else None)

    def directions(self, src: np.ndarray, piece: np.ndarray) -> np.ndarray:
        """``a_(src, piece)`` restricted to the mask, one row per atom."""
        if self.kind == "multiclass":
            assert self.Wm is not None and self.labels is not None  # multiclass
            return self.Wm[piece] - self.Wm[self.labels[src]]
        assert self.v is not None  # margin / residual
        return self.coef(src, piece)[:, None] * self.v[None, :]

    def coef(self, src: np.ndarray, piece: np.ndarray) -> np.ndarray:
        """The coefficient of ``v`` in ``a_(src, piece)`` (margin / residual), one per atom."""
        assert self.g is not None  # margin / residual
        g = self.g[0, piece]
        return g if self.g_rows is None else g * self.g_rows[src]

    def displacement(self, src: np.ndarray, piece: np.ndarray, h: float) -> np.ndarray | None:
        """``x* - x`` for each atom, ``h a_(src,piece) / (2 theta1)``; None when nothing moves."""
        if math.isinf(self.theta1) or h == 0.0:
            return None
        t = h / (2.0 * self.theta1)
        if self.kind == "multiclass":
            return t * self.directions(src, piece)
        g = self.coef(src, piece)
        assert self.v is not None  # margin / residual
        return np.multiply.outer(t * g, self.v)

    def score_shift(self, W: np.ndarray, src, piece, h: float) -> np.ndarray | None:
        """Change of the model scores ``(x* - x) @ W.T`` per atom, without forming x*
        (``W`` is the model's full (K_out, d) weight matrix); None when nothing moves."""
        if math.isinf(self.theta1) or h == 0.0:
            return None
        t = h / (2.0 * self.theta1)
        if self.kind == "multiclass":
            assert self.Wm is not None and self.labels is not None  # multiclass
            P = self.Wm @ W.T  # (K, K_out)
            out = t * (P[piece] - P[self.labels[src]])
            return out[:, 0] if W.shape[0] == 1 else out
        g = self.coef(src, piece)
        assert self.v is not None  # margin / residual
        vw = self.v @ W.T  # (K_out,)
        return (t * g)[:, None] * vw[None, :] if W.shape[0] > 1 else (t * g) * float(vw[0])

    def moves(self, W: np.ndarray, src, piece, h: float):
        """``(score_shift(W, ...), sq_displacement(...))`` together (the per-atom coefficient
        computed once); the same numbers as the two methods."""
        if math.isinf(self.theta1) or h == 0.0 or self.kind == "multiclass" or W.shape[0] > 1:
            return self.score_shift(W, src, piece, h), self.sq_displacement(src, piece, h)
        tg = (h / (2.0 * self.theta1)) * self.coef(src, piece)
        assert self.v is not None  # margin / residual
        return tg * float((self.v @ W.T)[0]), tg * tg * float(self.v @ self.v)

    def sq_displacement(self, src, piece, h: float) -> np.ndarray:
        """``||x* - x||^2`` per atom, without forming x*."""
        if math.isinf(self.theta1) or h == 0.0:
            return np.zeros(np.size(piece))
        t = h / (2.0 * self.theta1)
        if self.kind == "multiclass":
            assert self.Wm is not None and self.labels is not None  # multiclass
            diff = self.Wm[:, None, :] - self.Wm[None, :, :]
            G = np.einsum("ykd,ykd->yk", diff, diff)  # G[k, y] = ||w_k - w_y||^2
            return t * t * G[piece, self.labels[src]]
        g = self.coef(src, piece)
        assert self.v is not None  # margin / residual
        return (t * g) ** 2 * float(self.v @ self.v)

    def move(self, X: np.ndarray, src: np.ndarray, piece: np.ndarray, h: float) -> np.ndarray:
        """Moved points ``x_src + h a_(src,piece) / (2 theta1)`` (no move when theta1 = inf)."""
        out = X[src].astype(np.float64, copy=False)  # a fresh array (float64 for float32 X)
        if math.isinf(self.theta1) or h == 0.0:
            return out
        t = h / (2.0 * self.theta1)
        if self.kind == "multiclass":
            out += t * self.directions(src, piece)
        else:
            g = self.coef(src, piece)
            assert self.v is not None  # margin / residual
            out += np.multiply.outer(t * g, self.v)
        return out


def feature_mask(d: int, features=None, names=None) -> np.ndarray | None:
    """Boolean mask of the features allowed to move; None means all."""
    if features is None:
        return None
    idx = np.atleast_1d(np.asarray(features))
    mask = np.zeros(d, dtype=bool)
    for f in idx.tolist():
        if isinstance(f, (bool, np.bool_)):
            raise ValidationError("features must be column indices or names, not booleans")
        if isinstance(f, (int, np.integer)):
            if not -d <= f < d:
                raise ValidationError(f"features: index {f} out of range for {d} features")
            mask[f] = True
        else:
            if names is None or str(f) not in names:
                raise ValidationError(f"features: unknown feature {f!r}")
            mask[list(names).index(str(f))] = True
    if not mask.any():
        raise ValidationError("features selects no feature")
    return mask


def reduce_problem(prob: Problem, theta1: float, mask: np.ndarray | None = None) -> Reduced:
    """Reduce a linear model with a piecewise-linear loss to ``(c1, c2)``."""
    sc = prob.scorer
    loss = prob.loss
    if sc is None:
        raise ValidationError("the reduced form needs a linear model")
    W = sc.W if mask is None else sc.W * mask[None, :]
    inv4 = 0.0 if math.isinf(theta1) else 1.0 / (4.0 * theta1)
    scores = prob.scores if prob.scores is not None else sc.scores(prob.X)
    if isinstance(loss, PiecewiseLinear):
        s = scores
        a = loss.a
        margin = loss.on == "margin"
        g, g_rows = (a[None, :], prob.y) if margin else (-a[None, :], None)
        # c1 is not stored: c1[i, k] = a_k u_i + b_k with u the margin y s or the residual
        # y - s, computed per block of rows where needed (AffineRows); the (K, n) array is
        # built only for the paths that need all of it (conic programs, weighted duals)
        rows = AffineRows(s, prob.y, loss.on, a, loss.b)
        v = W[0]
        c2 = (a * a * float(v @ v) * inv4)[None, :]
        return Reduced(None, c2, theta1, loss.on, v=v, g=g, g_rows=g_rows, rows=rows)
    if isinstance(loss, MulticlassHinge):
        if sc.task == "binary":
            Wm = np.vstack([np.zeros_like(W[0]), W[0]])
            S = np.column_stack([np.zeros(prob.n), scores])
            labels = (prob.y > 0).astype(np.intp)
        else:
            Wm = W
            S = scores
            labels = prob.y.astype(np.intp)
        K = Wm.shape[0]
        n = S.shape[0]
        sy = S[np.arange(n), labels]
        diff = Wm[None, :, :] - Wm[:, None, :]  # diff[y, k] = W_k - W_y
        G = np.einsum("ykd,ykd->yk", diff, diff) * inv4
        # c1 and c2 built one class at a time in the (K, n) layout the oracle scans (c1, c2
        # are views of them: no (n, K) temporaries, no transposed copies)
        c1T = np.empty((K, n))
        c2T = np.empty((K, n))
        for k in range(K):
            np.add(1.0, S[:, k], out=c1T[k])  # (1 + s_k) - s_y, as before
            c1T[k] -= sy
            c1T[k][labels == k] = 0.0
            np.take(G[:, k], labels, out=c2T[k])
        # K > 0 for a fitted classifier (c2 None only for the empty case)
        return Reduced(c1T.T, c2T.T if K > 0 else None,  # type: ignore[arg-type]
                       theta1, "multiclass", Wm=Wm, labels=labels)
    raise ValidationError(f"loss {loss.name!r} has no piecewise-linear reduced form")
