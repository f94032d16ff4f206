"""Per-feature move prices: a diagonal metric in the cost of moving samples.

With ``feature_costs`` the cost of moving a sample is ``theta1 sum_j c_j (x*_j - x_j)^2``
instead of ``theta1 ||x* - x||^2``; ``c_j = inf`` makes feature j immutable (age, sex, ...),
``c_j = 1`` is the default price and ``c_j > 1`` makes a feature dearer to change. Keys may be
a Pipeline's raw columns (:func:`check_feature_costs`): priced per unit of the raw variable.

A diagonal metric is a change of variables: in the coordinates ``x~_j = sqrt(c_j) x_j`` the
cost is Euclidean again, so every path runs unchanged on the rescaled problem
(:func:`scaled_problem`). A linear model reads ``W~_j = W_j / sqrt(c_j)`` (the same scores),
which keeps the exact reduced form (for the hinge loss ``c2 = a^2 sum_j W_j^2 / (4 theta1
c_j)``); any other model is wrapped in :class:`Rescaled`, which maps ``x~`` back before
predicting (the perturbation search, the first-order path, the certified bounds; decision trees
and the tree branch and bound price the distance to a leaf box per feature instead, which keeps
them exact and sound). The most sensitive distribution is mapped back,
``x*_j = x~*_j / sqrt(c_j)``; the audited cost is the weighted one. Immutable features are
masked out (as with ``features=``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ValidationError
from . import _pipeline as pipeline
from ._models import LinearScorer, Problem
from ._nonlinear import DifferentiableModel

__all__ = ["check_feature_costs", "Rescaled", "scaled_problem", "unscale_result"]


def check_feature_costs(feature_costs, names: list[str], model=None) -> np.ndarray | None:
    """The price vector ``c`` (length d, per unit of the model's input columns ``names``)
    from a dict {name or index: price} or a sequence; None when every price is 1. Prices
    must be in ``(0, inf]``.

    Dict keys are column indices, the model's input columns, or -- given ``model`` -- its raw
    variables (:mod:`otstab.pipeline`): a raw categorical prices every column of its one-hot
    block (per unit of an indicator), a raw numeric column is priced per unit of the raw
    variable, i.e. ``c / slope^2`` per unit of the model's input for an affine scaler with
    ``dz/dx = slope`` (a StandardScaler with scale ``s``: ``c s^2``). A raw name wins over an
    input column of the same name (a Pipeline without a ColumnTransformer keeps the names).
    """
    if feature_costs is None:
        return None
    d = len(names)
    c = np.ones(d)
    if isinstance(feature_costs, dict):
        set_by: dict[int, object] = {}
        rmap = pipeline.raw_map(model, names) if model is not None else None
        for key, val in feature_costs.items():
            price = _price(val, key)
            for j, cj in _priced_columns(key, price, names, rmap).items():
                if j in set_by:
                    raise ValidationError(
                        f"feature_costs prices column {names[j]!r} twice (keys "
                        f"{set_by[j]!r} and {key!r})")
                set_by[j] = key
                c[j] = cj
    else:
        vals = np.asarray(feature_costs, dtype=object).reshape(-1)
        if vals.size != d:
            raise ValidationError(f"feature_costs must have {d} entries (one per feature), got "
                                  f"{vals.size}")
        c = np.array([_price(v, j) for j, v in enumerate(vals.tolist())])
    if np.all(np.isinf(c)):
        raise ValidationError("feature_costs makes every feature immutable: use theta1=math.inf "
                              "for reweighting only")
    return None if np.all(c == 1.0) else c


def _priced_columns(key, price: float, names: list[str], rmap) -> dict:
    """``{column index: price per unit of that column}`` of one ``feature_costs`` key
    (``rmap``: the model's :class:`otstab.pipeline.RawMap`, or None)."""
    d = len(names)
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if not -d <= int(key) < d:
            raise ValidationError(f"feature_costs: index {key} out of range for {d} features")
        return {int(key) % d: price}
    var = rmap.variable(str(key)) if rmap is not None else None
    if var is not None and var.columns:
        slopes = rmap.slopes(var.name)
        if any(s is None for s in slopes.values()):
            raise ValidationError(
                f"feature_costs: the preprocessing maps raw column {key!r} nonlinearly, so a "
                "price per raw unit is not a constant; price its input column"
                f"{'s' if len(slopes) > 1 else ''} "
                f"{', '.join(repr(names[j]) for j in slopes)} instead (per unit of the "
                "model's input)")
        # cost c dx^2 = c (dz / slope)^2: the price per unit of z is c / slope^2
        return {j: price / s**2 for j, s in slopes.items()}
    if var is not None:
        raise ValidationError(f"feature_costs: {key!r} is a column the model drops (its "
                              "preprocessing never reads it), so it cannot move")
    index = {str(nm): j for j, nm in enumerate(names)}
    if str(key) in index:
        return {index[str(key)]: price}
    candidates = [*(rmap.raw_names if rmap is not None else []), *names]
    raise ValidationError(f"feature_costs: unknown feature {key!r}"
                          + (pipeline.suggest(key, candidates) or
                             f"; the model's features are {names[:10]}"
                             f"{' ...' if d > 10 else ''}"))


def _price(val, key) -> float:
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, float, np.integer,
                                                                  np.floating)):
        raise ValidationError(f"feature_costs[{key!r}] must be a number in (0, inf], got "
                              f"{val!r}")
    v = float(val)
    if not (v > 0.0) or math.isnan(v):
        raise ValidationError(f"feature_costs[{key!r}] must be in (0, inf] (inf: immutable), "
                              f"got {v}")
    return v


class Rescaled(DifferentiableModel):
    """A nonlinear model seen in the coordinates ``x~ = s x``: every call maps its points back,
    ``x = x~ / s``, and gradients forward (``d/dx~ = (d/dx) / s``). ``base`` = ``(X~, X)``:
    the scaled evaluation data itself is mapped back to the caller's ``X`` exactly (not
    ``X~ / s``, which may differ from it by a rounding)."""

    def __init__(self, inner: DifferentiableModel, s: np.ndarray, base=None):
        self.inner, self.s, self._base = inner, s, base
        self.task, self.classes = inner.task, inner.classes
        self.differentiable = inner.differentiable
        self.loss_name = inner.loss_name

    def back(self, Z) -> np.ndarray:
        """``x = x~ / s`` (the caller's own rows for the scaled evaluation data)."""
        if self._base is not None and Z is self._base[0]:
            return self._base[1]
        return np.asarray(Z, dtype=np.float64) / self.s[None, :]

    def bind_loss(self, loss) -> Rescaled:
        self.inner.bind_loss(loss)
        self.loss_name = self.inner.loss_name
        return self

    def outputs(self, X):
        return self.inner.outputs(self.back(X))

    def loss_and_grad(self, X, y):
        val, grad = self.inner.loss_and_grad(self.back(X), y)
        return val, grad / self.s[None, :]

    def margin_and_grad(self, X, y):
        val, grad = self.inner.margin_and_grad(self.back(X), y)
        return val, grad / self.s[None, :]

    def predict_internal(self, X):
        return self.inner.predict_internal(self.back(X))

    def loss_values(self, X, y):
        return self.inner.loss_values(self.back(X), y)

    def __repr__(self) -> str:
        return f"Rescaled({self.inner!r})"


def scaled_problem(prob: Problem, c: np.ndarray, mask: np.ndarray | None):
    """``(prob~, mask~)``: the problem in the coordinates ``x~ = sqrt(c) x`` (immutable
    features masked out and left unscaled). A linear model reads ``W / sqrt(c)`` (the same
    scores); any other model is wrapped in :class:`Rescaled`."""
    finite = np.isfinite(c)
    s = np.where(finite, np.sqrt(np.where(finite, c, 1.0)), 1.0)
    movable = finite if mask is None else (mask & finite)
    if not movable.any():
        raise ValidationError("feature_costs and features leave no feature free to move")
    Xs = prob.X * s[None, :]
    if prob.scorer is not None:  # the same scores (kept: prob.scores, base losses)
        sc = prob.scorer
        changes: dict[str, Any] = {
            "scorer": LinearScorer(sc.W / s[None, :], sc.b, sc.task, sc.classes)}
    else:  # the model sees the caller's rows for Xs: the same base losses
        changes = {"nonlinear": Rescaled(prob.nonlinear, s, (Xs, prob.X))}
    return replace(prob, X=Xs, extra={**prob.extra, "scale": s}, **changes), \
        (None if movable.all() else movable)


def unscale_result(res, scaled: Problem, prob: Problem, c: np.ndarray):
    """Map a result of the rescaled problem ``scaled`` back to the coordinates of ``prob``
    (in place): ``x* = x~* / sqrt(c)``, built on first access like ``X_star`` itself. The
    per-atom squared moves (weighted, as the cost counts them) are kept in
    ``info["moved2"]``."""
    s = scaled.extra["scale"]
    lazy = res.__dict__.get("_lazy_X_star")
    if "moved2" not in res.info and res.info.get("dstar") is None:
        Xs = lazy() if callable(lazy) else lazy
        diff = Xs - scaled.X[np.asarray(res.source)]
        res.info["moved2"] = np.einsum("ij,ij->i", diff, diff)
        lazy = Xs

    def x_star():
        Xs = lazy() if callable(lazy) else lazy
        return Xs / s[None, :]

    res.X_star = x_star
    move = res.info.get("displacement")
    if move is not None:  # x* - x per atom (Q* built blockwise), in the caller's coordinates
        res.info["displacement"] = functools.partial(_unscaled_move, move, s)
    res.X = prob.X
    res.info["feature_costs"] = c.tolist()
    return res


def _unscaled_move(move, s, atoms):
    """``move(atoms) / sqrt(c)``: a displacement of the rescaled problem in the caller's
    coordinates (None: no move)."""
    d = move(atoms)
    return None if d is None else d / s[None, :]
