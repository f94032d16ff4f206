"""Per-feature move prices: a diagonal metric in the cost of moving samples.

With ``feature_costs`` the cost of moving a sample is ``theta1 sum_j c_j (x*_j - x_j)^2``
instead of ``theta1 ||x* - x||^2``; ``c_j = inf`` makes feature j immutable (age, sex, ...),
``c_j = 1`` is the default price and ``c_j > 1`` makes a feature dearer to change.

For a linear model this keeps the exact reduced form: in the coordinates
``x~_j = sqrt(c_j) x_j`` the cost is Euclidean again and the model reads
``W~_j = W_j / sqrt(c_j)`` (the same scores), so every exact path runs unchanged on the
rescaled problem (for the hinge loss ``c2 = a^2 sum_j W_j^2 / (4 theta1 c_j)``). The
most sensitive distribution is mapped back, ``x*_j = x~*_j / sqrt(c_j)``; the audited cost is
the weighted one. Immutable features are masked out (as with ``features=``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .errors import IncompatibleLossError, ValidationError
from .models import LinearScorer, Problem

__all__ = ["check_feature_costs", "scaled_problem", "unscale_result"]


def check_feature_costs(feature_costs, names: list[str]) -> np.ndarray | None:
    """The price vector ``c`` (length d) from a dict {name or index: price} or a sequence;
    None when every price is 1. Prices must be in ``(0, inf]``."""
    if feature_costs is None:
        return None
    d = len(names)
    c = np.ones(d)
    if isinstance(feature_costs, dict):
        index = {str(nm): j for j, nm in enumerate(names)}
        for key, val in feature_costs.items():
            if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
                if not -d <= int(key) < d:
                    raise ValidationError(f"feature_costs: index {key} out of range for {d} "
                                          "features")
                j = int(key)
            elif str(key) in index:
                j = index[str(key)]
            else:
                raise ValidationError(f"feature_costs: unknown feature {key!r}; the model's "
                                      f"features are {names[:10]}{' ...' if d > 10 else ''}")
            c[j] = _price(val, key)
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


def scaled_problem(prob: Problem, c: np.ndarray, mask: np.ndarray | None):
    """``(prob~, mask~)``: the problem in the coordinates ``x~ = sqrt(c) x`` (immutable
    features masked out and left unscaled)."""
    if prob.scorer is None:
        raise IncompatibleLossError(
            "feature_costs is supported for linear models (and Pipelines ending in one), whose "
            "reduced form stays exact; for other models rescale the inputs yourself")
    finite = np.isfinite(c)
    s = np.where(finite, np.sqrt(np.where(finite, c, 1.0)), 1.0)
    movable = finite if mask is None else (mask & finite)
    if not movable.any():
        raise ValidationError("feature_costs and features leave no feature free to move")
    sc = prob.scorer
    scorer = LinearScorer(sc.W / s[None, :], sc.b, sc.task, sc.classes)
    Xs = prob.X * s[None, :]
    return replace(prob, X=Xs, scorer=scorer, extra={**prob.extra, "scale": s}), \
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
    res.X = prob.X
    res.info["feature_costs"] = c.tolist()
    return res
