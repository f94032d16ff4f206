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
from otstab_solvers.multiclass import MulticlassOracle, MulticlassRows

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
    c1_dense : (n, K) array, or None while ``rows`` or ``mrows`` computes the pieces on demand
    c2 : (1, K) or (n, K) array, nonnegative (a property: the multiclass form builds its
        (n, K) array on first access from ``mrows``)
    c2_dense : the stored ``c2`` (None while ``mrows`` computes it on demand)
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
    mrows : :class:`otstab_solvers.multiclass.MulticlassRows` (multiclass): both pieces from
        the scores and labels, per block of rows (:class:`~otstab_solvers.multiclass.
        MulticlassOracle`; no (n, K) array unless ``c1`` or ``c2`` is read)
    """

    c1_dense: np.ndarray | None
    c2_dense: np.ndarray | None
    theta1: float
    kind: str
    v: np.ndarray | None = None
    g: np.ndarray | None = None
    Wm: np.ndarray | None = None
    labels: np.ndarray | None = None
    g_rows: np.ndarray | None = None
    rows: AffineRows | None = None
    mrows: MulticlassRows | None = None

    @property
    def c1(self) -> np.ndarray:
        """The (n, K) pieces at the samples (built block by block on first access)."""
        if self.c1_dense is None:
            src = self.rows if self.rows is not None else self.mrows
            assert src is not None  # one of the forms is set
            self.c1_dense = src.materialize().T
        return self.c1_dense

    @property
    def c2(self) -> np.ndarray:
        """The (1, K) or (n, K) curvatures (the multiclass (n, K) array built on first
        access)."""
        if self.c2_dense is None:
            assert self.mrows is not None  # the only form without a stored c2
            self.c2_dense = self.mrows.materialize_c2().T
        return self.c2_dense

    @property
    def lean_multiclass(self) -> bool:
        """The multiclass form with its pieces computed per block (no c1 array stored)."""
        return self.mrows is not None and self.c1_dense is None

    def can_move(self) -> bool:
        """Some ``c2 > 0``: some sample can move at a finite price."""
        if self.c2_dense is None and self.mrows is not None:
            return self.mrows.can_move()
        return bool(np.any(self.c2 > 0))

    @property
    def n(self) -> int:
        if self.c1_dense is not None:
            return self.c1_dense.shape[0]
        src = self.rows if self.rows is not None else self.mrows
        assert src is not None  # one of the forms is set
        return src.n

    @property
    def K(self) -> int:
        if self.c1_dense is not None:
            return self.c1_dense.shape[1]
        src = self.rows if self.rows is not None else self.mrows
        assert src is not None  # one of the forms is set
        return src.K

    def loss_values(self) -> np.ndarray:
        """The loss at the data, ``max_k c1[i, k]``."""
        if self.c1_dense is not None:
            return self.c1_dense.max(axis=1)
        out = np.empty(self.n)
        if self.rows is None:
            assert self.mrows is not None  # one of the forms is set
            for i, j in self.mrows.blocks():
                np.max(self.mrows.block(slice(i, j))[0], axis=1, out=out[i:j])
            return out
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
        the sorting to :func:`otstab_solvers.dual.solve_two_piece`. The multiclass form
        without stored pieces: a :class:`~otstab_solvers.multiclass.MulticlassOracle`."""
        if self.lean_multiclass:
            assert self.mrows is not None  # lean_multiclass
            return MulticlassOracle(self.mrows)
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
            labels = prob.y.astype(np.intp, copy=False)
        diff = Wm[None, :, :] - Wm[:, None, :]  # diff[y, k] = W_k - W_y
        G = np.einsum("ykd,ykd->yk", diff, diff) * inv4
        # the pieces c1 = (1 + s_k) - s_y (0 at the label) and c2 = G[y, k] are computed per
        # block of rows from the scores and labels where they are needed (MulticlassRows):
        # no (K, n) arrays unless a path reads red.c1 / red.c2 (conic programs, sweeps)
        return Reduced(None, None, theta1, "multiclass", Wm=Wm, labels=labels,
                       mrows=MulticlassRows(S, labels, G))
    raise ValidationError(f"loss {loss.name!r} has no piecewise-linear reduced form")
