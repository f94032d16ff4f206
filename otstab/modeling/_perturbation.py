"""Smallest perturbations that make a classifier err: the distances ``d*_i`` of the 0/1 loss.

For the 0/1 loss the d-transform is ``l_h(z_i) = (h - theta1 d*_i)_+`` with

    d*_i = min { ||x - x_i||^2 : model.predict(x) != y_i, only masked coordinates of x move }

(0 when ``x_i`` is already misclassified). With these distances the stability dual is exact
(``otstab.certify_distances``). This module computes them for any classifier:

* **linear models** (anything with ``coef_`` and ``classes_``, ``otstab.LinearModel``): closed
  form, exact. Binary: ``d* = s^2 / ||w_M||^2`` with the score ``s`` on the correct side;
  multiclass: ``min_{k != y} (s_y - s_k)_+^2 / ||(w_y - w_k)_M||^2``.
* **decision trees** (``DecisionTreeClassifier``, ``ExtraTreeClassifier``): exact. Each leaf is
  a box ``lo < x <= hi``; ``d*`` is the squared distance to the nearest box whose leaf predicts
  another class (boxes that need a non-masked coordinate to move are out of reach).
* **differentiable models** (scikit-learn MLPs, PyTorch modules, :class:`~otstab.nonlinear.
  CallableModel` with ``predict``): gradient-guided search (DeepFool-style linearised steps on
  the classification margin, or ascent along the loss gradient for callables), a bisection to
  the decision boundary along the segment from ``x_i``, then ``n_refine`` rounds that re-aim
  the ray from ``x_i`` along the margin gradient at the boundary point found (the optimality
  condition of the nearest boundary point); random directions as a fallback.
* **any other classifier** (random forests, gradient boosting, histogram gradient boosting,
  kernel SVMs, pipelines, ...): a documented heuristic. Rays from ``x_i`` along the masked
  coordinate axes (both signs), ``n_directions`` random directions and the directions towards
  the nearest evaluation samples predicted as another class are scanned on a geometric grid of
  radii up to ``max_radius`` (samples with no hit: again up to ``100 max_radius``); the first
  misclassified grid point is refined by bisection; then ``n_refine`` rounds of random
  perturbations of the best direction, scanned up to the best radius so far, try to shorten
  it. For ensembles of scikit-learn trees the split thresholds are used too: features that no
  split uses do not affect the prediction and stay fixed (moving them would only add
  distance), each coordinate line is searched exactly (probes just past each threshold),
  and the coordinates of the best point are pulled back towards ``x_i`` threshold by
  threshold. With a single movable feature that some split uses, this is exact.

Per-feature prices (``feature_costs``, :mod:`otstab.costs`) reach this module as a model
wrapped in :class:`otstab.costs.Rescaled` on the coordinates ``x~ = sqrt(c) x``, where the
distance is Euclidean again: decision trees are then searched in the caller's coordinates with
the priced distance ``sum_j c_j (x'_j - x_j)^2`` (still exact), every other model in ``x~``.

Except for linear models and trees the distances are **upper bounds** on ``d*_i`` (the point
returned is verified to be misclassified), so the resulting ``R`` is an upper bound too.
For linear models the distance is the exact infimum; the returned point lies a rounding step
beyond the boundary, so that it is actually misclassified. For trees (and the coordinate lines
of tree ensembles) the distance is the smallest over the float64 inputs, attained by the
returned point: trees compare ``float32(x) <= threshold``, so a leaf's first (last) input is
the float64 value halfway between the float32 values around its threshold if that rounds into
the leaf, else the next one (within a float64 step of the real infimum). Q*'s cost is then
exactly the value's, with no float32 step between them. Samples for which no misclassified
point is found get ``inf`` (and a NaN point): for them ``l_h = 0`` for every ``h``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._results import ResultMixin
from .._validation import align_columns, as_float_matrix
from ..errors import IncompatibleLossError, InputTypeError, ValidationError
from . import _nonlinear as nonlinear
from . import _trees as trees
from ._costs import Rescaled
from ._models import linear_scorer
from ._nonlinear import CallableModel

__all__ = ["PerturbationResult", "perturbation_search", "min_perturbation_distances"]


@dataclass(repr=False)  # the mixin's repr: the distances by shape, not every value
class PerturbationResult(ResultMixin):
    """Distances ``d*_i`` and the nearest misclassified points found.

    Attributes
    ----------
    distances : ndarray of shape (n,)
        Squared distances (exact infimum when ``exact``; otherwise upper bounds).
    points : ndarray of shape (n, d)
        A misclassified point per sample (``x_i`` itself when already misclassified; NaN when
        none was found, with ``distances = inf``).
    exact : bool
        True for linear models and decision trees.
    method : str
        ``"linear"``, ``"tree"``, ``"gradient"`` or ``"search"``.
    misclassified : ndarray of bool, shape (n,)
        Samples already misclassified (``d* = 0``).
    n_predictions : int
        Number of rows passed to the model's prediction (cost of the search).
    """

    distances: np.ndarray
    points: np.ndarray = field(repr=False)
    exact: bool
    method: str
    misclassified: np.ndarray = field(repr=False)
    n_predictions: int = 0

    def to_frame(self):
        import pandas as pd  # noqa: PLC0415

        return pd.DataFrame({"distance2": self.distances, "misclassified": self.misclassified})


# ----------------------------------------------------------------------------------------------
# model wrappers working on class indices 0..K-1
# ----------------------------------------------------------------------------------------------


class _Predictor:
    """predict -> class indices, with a row counter."""

    def __init__(self, fn):
        self.fn = fn
        self.rows = 0

    def __call__(self, Z: np.ndarray) -> np.ndarray:
        self.rows += Z.shape[0]
        if Z.shape[0] == 0:
            return np.zeros(0, dtype=np.intp)
        return np.asarray(self.fn(Z)).astype(np.intp)


def _classes_lookup(classes):
    return {c.item() if hasattr(c, "item") else c: k for k, c in enumerate(classes)}


def _to_indices(values, classes, name="y") -> np.ndarray:
    lookup = _classes_lookup(classes)
    out = np.empty(len(values), dtype=np.intp)
    bad = []
    for i, v in enumerate(nonlinear.label_column(values).tolist()):
        k = lookup.get(v)
        if k is None:
            bad.append(v)
            k = -1
        out[i] = k
    if bad:
        shown = sorted({repr(b) for b in bad})[:5]
        raise ValidationError(f"{name} contains label(s) {', '.join(shown)} unknown to the model; "
                              f"its classes are {list(classes)}")
    return out


def _internal_to_indices(y, task: str) -> np.ndarray:
    y = np.asarray(y)
    if task == "binary":
        if not np.all(np.isin(y, (-1, 1))):
            raise ValidationError("internal binary labels must be -1/+1")
        return (y > 0).astype(np.intp)
    yi = y.astype(np.intp)
    if not np.array_equal(yi, y):
        raise ValidationError("internal multiclass labels must be integers 0..K-1")
    return yi


def _mask_bool(mask, d: int) -> np.ndarray:
    if mask is None:
        return np.ones(d, dtype=bool)
    m = np.asarray(mask)
    if m.dtype == bool:
        if m.shape != (d,):
            raise ValidationError(f"mask must have shape ({d},), got {m.shape}")
        return m.copy()
    if not np.issubdtype(m.dtype, np.integer):
        raise ValidationError("mask must be a boolean array or integer column indices")
    out = np.zeros(d, dtype=bool)
    idx = m.reshape(-1)
    if idx.size and (idx.min() < -d or idx.max() >= d):
        raise ValidationError(f"mask: index out of range for {d} features")
    out[idx] = True
    return out


def _is_tree(model) -> bool:
    return hasattr(model, "tree_") and hasattr(model, "classes_") and \
        not hasattr(model, "estimators_")


def _linear_parts(model):
    """(W, b, task) of a linear classifier, via the same adapter as certify; None otherwise."""

    if getattr(model, "classes_", None) is None:
        return None
    try:
        sc = linear_scorer(model)
    except Exception:  # noqa: BLE001 - not a linear classifier in the sense of certify
        return None
    if sc is None or sc.task not in ("binary", "multiclass"):
        return None
    return sc.W, sc.b, sc.task


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------


def min_perturbation_distances(model, X, y, *, mask=None, return_points=False, **options):
    """Squared distances ``d*_i`` to the nearest misclassified point (0 if misclassified).

    Parameters
    ----------
    model : classifier
        A fitted scikit-learn classifier, ``otstab.LinearModel``, or an
        :mod:`otstab.nonlinear` adapter (``MLPModel``, ``TorchModel``, ``CallableModel`` with
        ``predict``, ...).
    X : array-like of shape (n, d)
    y : array-like of shape (n,)
        Labels in the model's own label set (``classes_``); pass ``labels="internal"`` for
        internal labels (-1/+1, 0..K-1).
    mask : boolean array of shape (d,) or column indices, optional
        Only these features may move.
    return_points : bool
        Also return the misclassified points found, shape (n, d).
    **options
        See :func:`perturbation_search`.

    Returns
    -------
    ndarray of shape (n,), or ``(distances, points)``
        Exact for linear models and decision trees, upper bounds otherwise.
    """
    res = perturbation_search(model, X, y, mask=mask, **options)
    if return_points:
        return res.distances, res.points
    return res.distances


def perturbation_search(model, X, y, *, mask=None, labels="model", n_directions=16,
                        n_refine=3, max_radius=None, tol=1e-6, max_iter=50, seed=0
                        ) -> PerturbationResult:
    """Nearest misclassified points and their squared distances (see the module docstring).

    Parameters
    ----------
    model, X, y, mask
        As in :func:`min_perturbation_distances`.
    labels : {"model", "internal"}
        Whether ``y`` holds the model's labels or internal labels.
    n_directions : int
        Random directions per sample (search and fallback).
    n_refine : int
        Refinement rounds (gradient re-aiming or random direction perturbations).
    max_radius : float, optional
        Largest distance searched along a ray (``100 max_radius`` for samples with no
        misclassified point within it); default twice the diagonal of the bounding box of ``X``
        on the masked features (1 if that is 0).
    tol : float
        Relative bisection tolerance on the distance.
    max_iter : int
        Maximum DeepFool iterations.
    seed : int
        Seed of the random directions.

    Returns
    -------
    PerturbationResult
    """

    X, _ = align_columns(X, getattr(model, "model", model))
    X = as_float_matrix(X, "X")
    n, d = X.shape
    y = np.asarray(y)
    if y.ndim == 2 and 1 in y.shape:
        y = y.reshape(-1)
    if y.shape != (n,):
        raise ValidationError(f"y must have shape ({n},), got {y.shape}")
    if labels not in ("model", "internal"):
        raise ValidationError(f"labels must be 'model' or 'internal', got {labels!r}")
    mv = _mask_bool(mask, d)
    n_directions = int(n_directions)
    n_refine = int(n_refine)
    if n_directions < 0 or n_refine < 0:
        raise ValidationError("n_directions and n_refine must be >= 0")
    if not tol > 0:
        raise ValidationError(f"tol must be > 0, got {tol}")
    rng = np.random.default_rng(seed)
    if max_radius is None:
        span = X[:, mv].max(axis=0) - X[:, mv].min(axis=0) if mv.any() else np.zeros(0)
        max_radius = 2.0 * float(np.sqrt(np.sum(span ** 2)))
        if not max_radius > 0:
            max_radius = 1.0
    max_radius = float(max_radius)
    if not max_radius > 0:
        raise ValidationError(f"max_radius must be > 0, got {max_radius}")

    adapter = model if isinstance(model, nonlinear.DifferentiableModel) else None
    raw = model.model if isinstance(model, nonlinear.PredictOnlyModel) else model
    if adapter is not None and adapter.task == "regression":
        raise IncompatibleLossError("the 0/1 loss needs a classifier, got a regressor")

    # --- labels as class indices -----------------------------------------------------------
    if adapter is not None and not isinstance(adapter, nonlinear.PredictOnlyModel):
        classes = adapter.classes
        task = adapter.task
    else:
        classes = getattr(raw, "classes_", None)
        if classes is None:
            if not (hasattr(raw, "predict") or nonlinear._is_torch_module(raw)):
                raise InputTypeError(f"{type(raw).__name__} is not a classifier (no classes_ "
                                     "and no predict)")
            adapter = nonlinear.adapt(raw)
            classes, task = adapter.classes, adapter.task
        else:
            classes = np.asarray(classes)
            task = "binary" if len(classes) == 2 else "multiclass"
    if labels == "internal":
        yi = _internal_to_indices(y, task)
    else:
        yi = _to_indices(y, classes)

    # --- dispatch ----------------------------------------------------------------------------
    if isinstance(model, Rescaled):
        return _rescaled(model, X, yi, task, mv, rng, n_directions, n_refine, max_radius, tol,
                         max_iter)
    lin: tuple | None = _linear_parts(raw) if adapter is None or isinstance(
        adapter, nonlinear.PredictOnlyModel) else None
    if isinstance(adapter, nonlinear.LinearDifferentiable):
        lin = (adapter.W, adapter.b, adapter.task)
    if lin is not None:
        return _linear(X, yi, lin[0], lin[1], lin[2], mv)  # lin: (W, b, task)
    if (adapter is None or isinstance(adapter, nonlinear.PredictOnlyModel)) and _is_tree(raw):
        return _tree(raw, X, yi, mv)
    if adapter is None and nonlinear._is_sklearn_mlp(raw):
        adapter = nonlinear.MLPModel(raw)
    if adapter is None and nonlinear._is_torch_module(raw):
        adapter = nonlinear.adapt(raw)
    if adapter is not None and not isinstance(adapter, nonlinear.PredictOnlyModel):
        return _gradient(adapter, X, yi, task, mv, rng, n_directions, n_refine, max_radius, tol,
                         max_iter)
    if not hasattr(raw, "predict"):
        raise InputTypeError(f"{type(raw).__name__} has no predict method")
    pred = _Predictor(lambda Z: _to_indices(raw.predict(nonlinear.as_model_input(raw, Z)),
                                            classes, "model.predict(X)"))
    return _search(pred, X, yi, mv, rng, n_directions, n_refine, max_radius, tol,
                   thresholds=_ensemble_thresholds(raw, d), f32=_compares_float32(raw))


def _rescaled(model, X, yi, task, mv, rng, n_directions, n_refine, max_radius, tol,
              max_iter) -> PerturbationResult:
    """The search in the coordinates ``x~ = s x`` of :class:`otstab.costs.Rescaled` (per-feature
    prices ``c = s^2``): a decision tree exactly in the caller's coordinates with the weighted
    distance ``sum_j s_j^2 (x'_j - x_j)^2`` (points mapped to ``x~``); a differentiable model by
    its gradients in ``x~``; any other classifier by the search in ``x~``, with the split
    thresholds of a tree ensemble mapped to ``x~`` (probes then lie within a float32 step of
    the thresholds rather than just past them, so the answer is not claimed exact)."""
    inner, s = model.inner, model.s
    raw = getattr(inner, "model", None)
    if isinstance(inner, nonlinear.PredictOnlyModel) and _is_tree(raw):
        res = _tree(raw, model.back(X), yi, mv, weights=s * s)
        res.points = res.points * s[None, :]
        return res
    if inner.differentiable:
        return _gradient(model, X, yi, task, mv, rng, n_directions, n_refine, max_radius, tol,
                         max_iter)
    pred = _Predictor(lambda Z: _internal_to_indices(model.predict_internal(Z), task))
    thresholds = _ensemble_thresholds(raw, X.shape[1]) if raw is not None else None
    if thresholds is not None:
        thresholds = [np.unique(T * s[j]) for j, T in enumerate(thresholds)]
    res = _search(pred, X, yi, mv, rng, n_directions, n_refine, max_radius, tol,
                  thresholds=thresholds, f32=raw is None or _compares_float32(raw))
    scaled = bool(np.any(s[mv] != 1.0))
    if scaled and res.exact and np.any(~np.isfinite(res.distances) | (res.distances > 0)):
        res.exact = False
    return res


# ----------------------------------------------------------------------------------------------
# exact: linear models
# ----------------------------------------------------------------------------------------------


def _push_until(pred, X, P, U, yi, rows, scale):
    """Move P[rows] along U[rows] by growing steps until predict != y; updates P in place."""
    if rows.size == 0:
        return np.zeros(0, dtype=bool)
    ok = pred(P[rows]) != yi[rows]
    eps = 1e-12
    todo = rows[~ok]
    while todo.size and eps < 1e-3:
        Q = P[todo] + (eps * scale[todo])[:, None] * U[todo]
        good = pred(Q) != yi[todo]
        P[todo[good]] = Q[good]
        todo = todo[~good]
        eps *= 10.0
    done = np.ones(rows.size, dtype=bool)
    done[np.isin(rows, todo)] = False
    return done


def _linear(X, yi, W, b, task, mv) -> PerturbationResult:
    n, d = X.shape
    Wm = W * mv[None, :]
    S = X @ W.T + b
    counter = {"rows": 0}

    def pred_fn(Z):
        counter["rows"] += Z.shape[0]
        s = Z @ W.T + b
        if task == "binary":
            return (s[:, 0] > 0).astype(np.intp)
        return np.argmax(s, axis=1)

    pred = _Predictor(pred_fn)
    current = pred(X)
    mis = current != yi
    dist = np.zeros(n)
    P = X.copy()
    U = np.zeros_like(X)
    if task == "binary":
        w = Wm[0]
        a = float(w @ w)
        s = S[:, 0]
        # correct: y=1 needs s <= 0; y=0 needs s > 0. distance |s| / ||w_M||
        if a > 0:
            dist = np.where(mis, 0.0, s * s / a)
            step = -(s / a)[:, None] * w[None, :]
            P = np.where(mis[:, None], X, X + step)
            sgn = np.where(yi == 1, -1.0, 1.0)  # class 1 must lower the score, class 0 raise it
            U = np.where(mis[:, None], 0.0, sgn[:, None] * w[None, :] / np.sqrt(a))
        else:
            dist = np.where(mis, 0.0, np.inf)
    else:
        K = W.shape[0]
        rows = np.arange(n)
        best = np.full(n, np.inf)
        bestk = np.full(n, -1)
        for k in range(K):
            D = Wm[yi] - Wm[k][None, :]
            dn = np.sum(D * D, axis=1)
            gap = np.maximum(S[rows, yi] - S[:, k], 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                dk = np.where(dn > 0, gap * gap / np.where(dn > 0, dn, 1.0), np.inf)
            dk[yi == k] = np.inf
            better = dk < best
            best[better] = dk[better]
            bestk[better] = k
        dist = np.where(mis, 0.0, best)
        fin = ~mis & np.isfinite(best)
        idx = np.nonzero(fin)[0]
        if idx.size:
            D = Wm[yi[idx]] - Wm[bestk[idx]]
            dn = np.sum(D * D, axis=1)
            gap = S[idx, yi[idx]] - S[idx, bestk[idx]]
            P[idx] = X[idx] - (gap / dn)[:, None] * D
            U[idx] = -D / np.sqrt(dn)[:, None]
    fin = ~mis & np.isfinite(dist)
    scale = 1.0 + np.sqrt(np.sum(X * X, axis=1))
    done = _push_until(pred, X, P, U, yi, np.nonzero(fin)[0], scale)
    todo = np.nonzero(fin)[0][~done]
    P[~np.isfinite(dist)] = np.nan
    if todo.size:  # pragma: no cover - only with extreme magnitudes
        P[todo] = np.nan
    return PerturbationResult(distances=dist, points=P, exact=True, method="linear",
                              misclassified=mis, n_predictions=counter["rows"])


# ----------------------------------------------------------------------------------------------
# exact: decision trees
# ----------------------------------------------------------------------------------------------


def tree_boxes(left, right, feature, threshold, leaf_value, d, cols=None):
    """Leaf boxes ``(lo, hi)`` (``lo < x <= hi``) of one binary tree given as node arrays
    (left/right child, -1 at leaves), with ``leaf_value(node)`` of each leaf; ``cols`` maps the
    tree's feature numbers to columns (bagging over feature subsets)."""
    los, his, vals = [], [], []
    stack = [(0, np.full(d, -np.inf), np.full(d, np.inf))]
    while stack:
        node, lo, hi = stack.pop()
        if left[node] == -1:
            los.append(lo)
            his.append(hi)
            vals.append(leaf_value(node))
            continue
        f = int(feature[node])
        f = int(cols[f]) if cols is not None else f
        t = float(threshold[node])
        hl, lr = hi.copy(), lo.copy()
        hl[f] = min(hl[f], t)
        lr[f] = max(lr[f], t)
        stack.append((int(left[node]), lo, hl))
        stack.append((int(right[node]), lr, hi))
    return los, his, vals



def _tree_leaves(tree, d: int):
    """Boxes (lo, hi) of the leaves (lo < x <= hi) and their class index."""
    lo_list, hi_list, leaf_ids = tree_boxes(tree.children_left, tree.children_right,
                                            tree.feature, tree.threshold, int, d)
    leaf_ids = np.array(leaf_ids)
    value = tree.value[leaf_ids]
    if value.ndim == 3:
        value = value[:, 0, :]
    cls = np.argmax(value, axis=1)
    return np.array(lo_list), np.array(hi_list), cls


def f32_above(v: np.ndarray) -> np.ndarray:
    """Smallest float32 value strictly above v (as float64); v may be -inf."""
    c = v.astype(np.float32)
    for _ in range(3):
        bad = c.astype(np.float64) <= v
        c = np.where(bad, np.nextafter(c, np.float32(np.inf)), c)
    return c.astype(np.float64)


def f32_atmost(v: np.ndarray) -> np.ndarray:
    """Largest float32 value <= v (as float64)."""
    c = v.astype(np.float32)
    for _ in range(3):
        bad = c.astype(np.float64) > v
        c = np.where(bad, np.nextafter(c, np.float32(-np.inf)), c)
    return c.astype(np.float64)


def f32_edge(v: np.ndarray) -> np.ndarray:
    """Where ``float32(x) <= v`` flips on float64 inputs: between the float32 values around v
    (``f32_atmost(v)`` and ``f32_above(v)``; infinite v stay infinite)."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        c = v.astype(np.float32)  # the nearest float32: one step from the other neighbour
        below = c.astype(np.float64) <= v
        other = np.nextafter(c, np.where(below, np.float32(np.inf), np.float32(-np.inf)))
        out = 0.5 * (c.astype(np.float64) + other.astype(np.float64))
    return np.where(np.isfinite(v), out, v)


def f32_first_input(v: np.ndarray) -> np.ndarray:
    """Smallest float64 x with ``float32(x) > v``: the edge halfway between the float32 values
    around v if it rounds up (ties go to the even one), else the next float64 above it."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore"):
        m = f32_edge(v)
        ok = m.astype(np.float32).astype(np.float64) > v
    return np.where(np.isfinite(v), np.where(ok, m, np.nextafter(m, np.inf)), v)


def f32_last_input(v: np.ndarray) -> np.ndarray:
    """Largest float64 x with ``float32(x) <= v`` (see :func:`f32_first_input`)."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore"):
        m = f32_edge(v)
        ok = m.astype(np.float32).astype(np.float64) <= v
    return np.where(np.isfinite(v), np.where(ok, m, np.nextafter(m, -np.inf)), v)


def _tree(model, X, yi, mv, weights=None) -> PerturbationResult:
    """Exact nearest misclassified points of a decision tree; ``weights``: per-feature prices
    of the squared distance (default 1)."""
    n, d = X.shape
    w2 = mv.astype(np.float64) if weights is None else np.where(mv, weights, 0.0)
    classes = np.asarray(model.classes_)
    pred = _Predictor(lambda Z: _to_indices(model.predict(nonlinear.as_model_input(model, Z)),
                                            classes, "model.predict(X)"))
    mis = pred(X) != yi
    lo, hi, cls = _tree_leaves(model.tree_, d)
    # the leaf boxes seen by float64 inputs: [first, last] input of each (inclusive), so the
    # distance is the smallest over the inputs a caller can pass, attained by the point
    # returned (Q*'s cost is that point's: no gap between the value and the audited cost)
    lo_e, hi_e = f32_first_input(lo), f32_last_input(hi)
    X32 = X.astype(np.float32).astype(np.float64)
    best = np.full(n, np.inf)
    bestleaf = np.full(n, -1)
    fixed = ~mv
    for L in range(lo.shape[0]):
        cand = yi != cls[L]
        if not np.any(cand) or np.any(lo_e[L] > hi_e[L]):
            continue  # no input lies in the leaf
        low = X32 <= lo[L][None, :]
        high = X32 > hi[L][None, :]
        gap = np.where(low, np.maximum(lo_e[L][None, :] - X, 0.0),
                       np.where(high, np.maximum(X - hi_e[L][None, :], 0.0), 0.0))
        dist = (gap * gap) @ w2
        if fixed.any():
            inside = np.all((X32[:, fixed] > lo[L][fixed]) & (X32[:, fixed] <= hi[L][fixed]),
                            axis=1)
            dist = np.where(inside, dist, np.inf)
        dist = np.where(cand, dist, np.inf)
        better = dist < best
        best[better] = dist[better]
        bestleaf[better] = L
    dist = np.where(mis, 0.0, best)
    P = X.copy()
    idx = np.nonzero(~mis & np.isfinite(best))[0]
    if idx.size:
        lo_b, hi_b = lo[bestleaf[idx]], hi[bestleaf[idx]]
        x = X[idx]
        x32 = X32[idx]
        inside = (x32 > lo_b) & (x32 <= hi_b)
        target = np.where(x32 <= lo_b, lo_e[bestleaf[idx]], hi_e[bestleaf[idx]])
        P[idx] = np.where(inside | ~mv[None, :], x, target)
        bad = pred(P[idx]) == yi[idx]
        if np.any(bad):  # pragma: no cover - float32 rounding corner cases
            P[idx[bad]] = np.nan
            dist[idx[bad]] = np.inf
    P[~np.isfinite(dist)] = np.nan
    return PerturbationResult(distances=dist, points=P, exact=True, method="tree",
                              misclassified=mis, n_predictions=pred.rows)


# ----------------------------------------------------------------------------------------------
# search helpers
# ----------------------------------------------------------------------------------------------


_MAX_ROWS = 1 << 17  # rows per prediction call in the batched scans


def _bisect(pred, X, yi, rows, U, t_lo, t_hi, tol):
    """Bisection on t in [t_lo, t_hi] along X[rows] + t U; predict(X + t_hi U) != y.

    All rays at once (one prediction call per halving). Returns the final t_hi per ray.
    """
    t_lo = t_lo.copy()
    t_hi = t_hi.copy()
    for _ in range(80):
        act = np.nonzero(t_hi - t_lo > tol * np.maximum(t_hi, 1e-12))[0]
        if act.size == 0:
            break
        mid = 0.5 * (t_lo[act] + t_hi[act])
        Z = X[rows[act]] + mid[:, None] * U[act]
        wrong = _predict_chunked(pred, Z) != yi[rows[act]]
        t_hi[act[wrong]] = mid[wrong]
        t_lo[act[~wrong]] = mid[~wrong]
    return t_hi


def _predict_chunked(pred, Z):
    if Z.shape[0] <= _MAX_ROWS:
        return pred(Z)
    return np.concatenate([pred(Z[s:s + _MAX_ROWS]) for s in range(0, Z.shape[0], _MAX_ROWS)])


def _scan(pred, X, yi, rows, U, radii, tol):
    """Nearest misclassified step along many rays at once.

    ``rows`` (m,) is the sample of each ray, ``U`` (m, d) its unit direction and ``radii``
    (m, R) an increasing grid of steps per ray. The first misclassified grid point of each ray is
    refined by bisection from the last correct one; rays whose bracket cannot beat the best hit
    of their sample are skipped. Returns the step per ray (inf where none was found).
    """
    m, R = radii.shape
    d = X.shape[1]
    first = np.full(m, -1)
    per = max(1, _MAX_ROWS // max(R, 1))
    for s0 in range(0, m, per):
        sl = np.arange(s0, min(s0 + per, m))
        Z = X[rows[sl]][:, None, :] + radii[sl][:, :, None] * U[sl][:, None, :]
        wrong = (pred(Z.reshape(-1, d)) != np.repeat(yi[rows[sl]], R)).reshape(sl.size, R)
        has = wrong.any(axis=1)
        first[sl[has]] = np.argmax(wrong[has], axis=1)
    t = np.full(m, np.inf)
    hit = np.nonzero(first >= 0)[0]
    if hit.size == 0:
        return t
    t_hit = radii[hit, first[hit]]
    t_prev = np.where(first[hit] > 0, radii[hit, np.maximum(first[hit] - 1, 0)], 0.0)
    # per sample: only rays whose lower end is below the sample's best upper end can win
    best_hit = np.full(X.shape[0], np.inf)
    np.minimum.at(best_hit, rows[hit], t_hit)
    keep = t_prev < best_hit[rows[hit]]
    hit, t_hit, t_prev = hit[keep], t_hit[keep], t_prev[keep]
    t[hit] = _bisect(pred, X, yi, rows[hit], U[hit], t_prev, t_hit, tol)
    return t


def _random_units(rng, m, mv):
    R = rng.standard_normal((m, mv.size)) * mv[None, :]
    nr = np.sqrt(np.sum(R * R, axis=1))
    nr[nr == 0] = 1.0
    return R / nr[:, None]


def _update(best, P, rows, t, U, X):
    """Keep, per sample, the shortest of the current best and the new candidate rays."""
    fin = np.isfinite(t)
    rows, t, U = rows[fin], t[fin], U[fin]
    if rows.size == 0:
        return
    order = np.lexsort((t, rows))  # by sample, then by step
    rows, t, U = rows[order], t[order], U[order]
    firsts = np.ones(rows.size, dtype=bool)
    firsts[1:] = rows[1:] != rows[:-1]
    rows, t, U = rows[firsts], t[firsts], U[firsts]
    # the distance of the point as it is (x + t u rounds: for a step far below |x| its length
    # differs from t by a relative ulp(x) / t, and t^2 could undercut the true distance)
    Z = X[rows] + t[:, None] * U
    d2 = np.sum((Z - X[rows]) ** 2, axis=1)
    better = d2 < best[rows]
    r = rows[better]
    best[r] = d2[better]
    P[r] = Z[better]


def _direction_search(pred, X, yi, idx, mv, rng, best, P, n_directions, max_radius, tol,
                      extra_dirs=None):
    """Coordinate (both signs), random and extra directions for the samples ``idx``."""
    d = X.shape[1]
    dirs = []
    for j in np.nonzero(mv)[0]:
        e = np.zeros((idx.size, d))
        e[:, j] = 1.0
        dirs.append(e)
        dirs.append(-e)
    for _ in range(n_directions):
        dirs.append(_random_units(rng, idx.size, mv))
    if extra_dirs is not None:
        dirs.extend(extra_dirs)
    if not dirs:
        return
    U = np.concatenate(dirs, axis=0)
    rows = np.tile(idx, len(dirs))
    ok = np.sum(U * U, axis=1) > 0
    U, rows = U[ok], rows[ok]
    radii = np.broadcast_to(max_radius * np.geomspace(1e-4, 1.0, 25), (rows.size, 25))
    t = _scan(pred, X, yi, rows, U, radii, tol)
    _update(best, P, rows, t, U, X)


def _refine_random(pred, X, yi, idx, mv, rng, best, P, n_refine, tol, n_per_round=8,
                   keyed=False):
    """Perturb each sample's best direction, scan up to its best radius; keep improvements.

    ``keyed``: the random directions of a sample do not depend on which other samples are
    refined (drawn for every row of X, then selected), so refining a subset gives each of its
    samples the point that refining all of them gives."""
    grid = np.linspace(0.05, 1.0, 20)
    every = None
    for rnd in range(n_refine):
        rows0 = idx[np.isfinite(best[idx]) & (best[idx] > 0)]
        if keyed:
            every = _random_units(rng, X.shape[0] * n_per_round, mv).reshape(
                n_per_round, X.shape[0], -1)
        if rows0.size == 0:
            return
        base = P[rows0] - X[rows0]
        rad = np.sqrt(np.sum(base * base, axis=1))
        U0 = base / rad[:, None]
        sigma = 0.5 / (rnd + 1)
        noise = every[:, rows0].reshape(-1, X.shape[1]) if every is not None else _random_units(
            rng, rows0.size * n_per_round, mv)
        U = np.tile(U0, (n_per_round, 1)) + sigma * noise
        U = U * mv[None, :]
        U /= np.maximum(np.sqrt(np.sum(U * U, axis=1)), 1e-300)[:, None]
        rows = np.tile(rows0, n_per_round)
        radii = np.tile(rad, n_per_round)[:, None] * grid[None, :]
        t = _scan(pred, X, yi, rows, U, radii, tol)
        _update(best, P, rows, t, U, X)


def _neighbour_dirs(X, yi, current, mv, idx, k=3):
    """Directions from x_i to its k nearest samples predicted as another class (masked)."""
    Xm = X * mv[None, :]
    kk = min(k, X.shape[0] - 1)
    if kk <= 0:
        return []
    out = [np.zeros((idx.size, X.shape[1])) for _ in range(kk)]
    sq = np.sum(Xm * Xm, axis=1)
    for start in range(0, idx.size, 512):
        rows = idx[start:start + 512]
        D2 = sq[rows][:, None] - 2.0 * Xm[rows] @ Xm.T + sq[None, :]
        D2[current[None, :] == yi[rows][:, None]] = np.inf
        D2[D2 <= 1e-300] = np.inf
        nn = np.argsort(D2, axis=1)[:, :kk]
        for j in range(kk):
            V = Xm[nn[:, j]] - Xm[rows]
            nv = np.sqrt(np.sum(V * V, axis=1))
            okj = np.isfinite(D2[np.arange(rows.size), nn[:, j]]) & (nv > 0)
            out[j][start:start + rows.size] = np.where(
                okj[:, None], V / np.maximum(nv, 1e-300)[:, None], 0.0)
    return out


def _ensemble_thresholds(model, d: int):
    """Finite split thresholds per feature of a tree ensemble, or None if unknown.

    Supports ensembles of scikit-learn trees (``estimators_`` of random forests, extra trees,
    gradient boosting, AdaBoost with trees, bagging of trees, whose trees see the columns
    ``estimators_features_``) and histogram gradient boosting (numeric splits only). None when
    the prediction may depend on ``X`` otherwise (categorical splits, a gradient boosting
    ``init`` estimator other than the constant prior) or a private structure is not as
    expected: the generic search then applies. A feature with no threshold is never split on,
    so the prediction does not depend on it. Infinite thresholds (splits of missing values)
    separate no finite values and are dropped.
    """
    feats: list[np.ndarray] = []
    thrs: list[np.ndarray] = []
    if trees.library(model) in ("xgboost", "lightgbm", "catboost"):
        try:
            layout = trees.external_layout(model, d)[0]
        except Exception:  # noqa: BLE001 - not readable: the generic search applies
            return None
        lo = np.concatenate([np.array(t[0]) for t in layout])
        hi = np.concatenate([np.array(t[1]) for t in layout])
        return [np.unique(np.r_[lo[:, j], hi[:, j]][np.isfinite(np.r_[lo[:, j], hi[:, j]])])
                for j in range(d)]
    try:
        if hasattr(model, "_predictors"):
            for it in model._predictors:
                for pr in it:
                    nodes = pr.nodes
                    if np.any(nodes["is_categorical"]):
                        return None
                    internal = ~nodes["is_leaf"].astype(bool)
                    feats.append(np.asarray(nodes["feature_idx"][internal], dtype=np.intp))
                    thrs.append(np.asarray(nodes["num_threshold"][internal], dtype=np.float64))
        elif hasattr(model, "estimators_"):
            init = getattr(model, "init_", "zero")
            if not (isinstance(init, str) and init == "zero") and \
                    type(init).__name__ not in ("DummyClassifier", "DummyRegressor"):
                return None
            ests = list(np.ravel(np.asarray(model.estimators_, dtype=object)))
            cols = getattr(model, "estimators_features_", None)
            if cols is not None:  # bagging: tree k sees the columns cols[k]
                cols = [np.asarray(c, dtype=np.intp) for c in cols]
                if len(cols) != len(ests):
                    return None
            for k, est in enumerate(ests):
                tree = getattr(est, "tree_", None)
                if tree is None:
                    return None
                internal = tree.children_left != -1
                f = np.asarray(tree.feature[internal], dtype=np.intp)
                feats.append(cols[k][f] if cols is not None else f)
                thrs.append(np.asarray(tree.threshold[internal], dtype=np.float64))
        else:
            return None
    except Exception:  # private structures changed: fall back to the generic search
        return None
    if not feats:
        return None
    f = np.concatenate(feats)
    t = np.concatenate(thrs)
    if f.size and (f.min() < 0 or f.max() >= d):
        return None
    keep = np.isfinite(t)
    f, t = f[keep], t[keep]
    return [np.unique(t[f == j]) for j in range(d)]


def _compares_float32(model) -> bool:
    """Whether a tree model compares ``float32(x) <= threshold`` (scikit-learn's trees,
    XGBoost) rather than ``x <= threshold`` in float64 (histogram gradient boosting,
    LightGBM)."""
    return trees.compares_float32(model)


def _line_first_wrong(pred, B, y_rows, j, T, start, sign, limit, block=32, f32=True,
                      first_block=4):
    """Nearest probe on the lines ``B[r] + (v - B[r, j]) e_j`` that is misclassified.

    Probes, in order of distance from ``start[r]`` in direction ``sign[r]``: ``start`` itself,
    then just past each threshold of ``T`` (the prediction is constant between consecutive
    thresholds). Only probes with ``|v - start| < limit`` count. Returns ``v`` per row (nan where
    none is misclassified). ``T`` is not empty: ``_search`` keeps the features that no split
    uses fixed. ``f32``: the trees compare ``float32(v) <= t`` (probes are the float64 inputs
    nearest each threshold on either side, and ``start`` lies on the side of its float32
    value), else ``v <= t`` in float64 (probes ``nextafter(t)`` and ``t``). The probes go in
    blocks of ``first_block``, doubling up to ``block`` (most lines flip within a few probes;
    the answer does not depend on the block sizes, only the number of predictions does).
    """
    m = B.shape[0]
    out = np.full(m, np.nan)
    if m == 0:
        return out
    if f32:
        up_vals, down_vals = f32_first_input(T), f32_last_input(T)
        cstart = start.astype(np.float32).astype(np.float64)
    else:
        up_vals, down_vals, cstart = np.nextafter(T, np.inf), T, start
    first_up = np.searchsorted(T, cstart, side="left")       # thresholds >= c(start)
    last_down = first_up - 1                                  # thresholds < c(start)
    avail = np.where(sign > 0, T.size - first_up, last_down + 1) + 1  # + the start itself
    k0 = 0  # the probes before this block (the same for every open line)
    size = max(1, min(int(first_block), int(block)))
    open_ = np.arange(m)
    while open_.size:
        kk = np.arange(size)[None, :] + k0                            # probe number, 0 = start
        valid = kk < avail[open_][:, None]
        sg = sign[open_][:, None]
        ti = np.where(sg > 0, first_up[open_][:, None] + kk - 1, last_down[open_][:, None] - kk + 1)
        ti = np.clip(ti, 0, T.size - 1)
        vals = np.where(sg > 0, up_vals[ti], down_vals[ti])
        vals = np.where(kk == 0, start[open_][:, None], vals)
        steps = np.abs(vals - start[open_][:, None])
        valid &= steps < limit[open_][:, None]
        rr, cc = np.nonzero(valid)
        if rr.size == 0:
            break
        Z = B[open_[rr]].copy()
        Z[:, j] = vals[rr, cc]
        wrong = _predict_chunked(pred, Z) != y_rows[open_[rr]]
        W = np.zeros(valid.shape, dtype=bool)
        W[rr, cc] = wrong
        has = W.any(axis=1)
        h = np.nonzero(has)[0]
        if h.size:
            out[open_[h]] = vals[h, np.argmax(W[h], axis=1)]
        more = ~has & valid[:, -1]
        k0 += size
        size = min(2 * size, int(block))
        open_ = open_[more]
    return out


def _coordinate_thresholds(pred, X, yi, idx, mv, thresholds, best, P, f32=True):
    """Exact nearest misclassified point along each masked coordinate line (both signs)."""
    for j in np.nonzero(mv)[0]:
        T = thresholds[j]
        for sgn in (1.0, -1.0):
            start = X[idx, j]
            v = _line_first_wrong(pred, X[idx], yi[idx], j, T, start, np.full(idx.size, sgn),
                                  np.sqrt(best[idx]), f32=f32)
            ok = np.isfinite(v)
            rows = idx[ok]
            d2 = (v[ok] - start[ok]) ** 2
            better = d2 < best[rows]
            r = rows[better]
            best[r] = d2[better]
            P[r] = X[r]
            P[r, j] = v[ok][better]


def _coordinate_shrink(pred, X, yi, idx, mv, thresholds, best, P, sweeps=3, f32=True):
    """Pull each coordinate of the best point back towards x_i while it stays misclassified.

    For each masked coordinate ``j`` the probes run from ``x_ij`` towards the current ``p_j``
    (just past each threshold in between), so the first misclassified probe is the best value
    of that coordinate given the others: a monotone, exact coordinate-wise improvement.
    """
    for _ in range(sweeps):
        improved = False
        for j in np.nonzero(mv)[0]:
            T = thresholds[j]
            rows = idx[np.isfinite(best[idx]) & (best[idx] > 0)]
            if rows.size == 0:
                return
            start = X[rows, j]
            delta = P[rows, j] - start
            mov = np.abs(delta) > 0
            rows, start, delta = rows[mov], start[mov], delta[mov]
            if rows.size == 0:
                continue
            v = _line_first_wrong(pred, P[rows], yi[rows], j, T, start, np.sign(delta),
                                  np.abs(delta), f32=f32)
            ok = np.isfinite(v)
            r = rows[ok]
            if r.size:
                P[r, j] = v[ok]
                best[r] = np.sum((P[r] - X[r]) ** 2, axis=1)
                improved = True
        if not improved:
            return


def _search(pred, X, yi, mv, rng, n_directions, n_refine, max_radius, tol,
            thresholds=None, f32=True) -> PerturbationResult:
    current = pred(X)
    mis = current != yi
    best = np.where(mis, 0.0, np.inf)
    P = np.where(mis[:, None], X, np.nan)
    idx = np.nonzero(~mis)[0]
    exact = False
    if thresholds is not None:
        # moving a feature that no split uses never changes the prediction: keep it fixed
        mv = mv & np.array([T.size > 0 for T in thresholds])
    if idx.size and mv.any():
        if thresholds is not None:
            _coordinate_thresholds(pred, X, yi, idx, mv, thresholds, best, P, f32=f32)
            # with one movable feature the coordinate line is the whole search space
            exact = int(mv.sum()) == 1
        if not exact:
            extra = _neighbour_dirs(X, yi, current, mv, idx)
            _direction_search(pred, X, yi, idx, mv, rng, best, P, n_directions, max_radius,
                              tol, extra_dirs=extra)
            left = idx[~np.isfinite(best[idx])]
            if left.size:  # nothing within max_radius (a single sample has no scale): farther
                _direction_search(pred, X, yi, left, mv, rng, best, P, n_directions,
                                  100.0 * max_radius, tol)
            _refine_random(pred, X, yi, idx, mv, rng, best, P, n_refine, tol)
            if thresholds is not None:
                _coordinate_shrink(pred, X, yi, idx, mv, thresholds, best, P, f32=f32)
    elif idx.size:
        exact = True  # nothing may move: no misclassified point is reachable
    return PerturbationResult(distances=best, points=P, exact=exact,
                              method="tree_ensemble" if thresholds is not None else "search",
                              misclassified=mis, n_predictions=pred.rows)


# ----------------------------------------------------------------------------------------------
# differentiable models
# ----------------------------------------------------------------------------------------------


def _gradient(adapter, X, yi, task, mv, rng, n_directions, n_refine, max_radius, tol,
              max_iter) -> PerturbationResult:

    n, d = X.shape
    yint = (2.0 * yi - 1.0) if task == "binary" else yi

    def pred_fn(Z):
        p = adapter.predict_internal(Z)
        return (p > 0).astype(np.intp) if task == "binary" else np.asarray(p).astype(np.intp)

    pred = _Predictor(pred_fn)
    has_margin = not isinstance(getattr(adapter, "inner", adapter), CallableModel)

    def direction(Z, rows):
        """Unit masked direction that lowers the margin (or raises the loss) and the margin."""
        if has_margin:
            g, G = adapter.margin_and_grad(Z, yint[rows])
            G = -G
        else:
            g, G = adapter.loss_and_grad(Z, yint[rows])
            g = None
        G = G * mv[None, :]
        gn = np.sqrt(np.sum(G * G, axis=1))
        return g, G, gn

    current = pred(X)
    mis = current != yi
    best = np.where(mis, 0.0, np.inf)
    P = np.where(mis[:, None], X, np.nan)
    idx = np.nonzero(~mis)[0]
    if idx.size == 0 or not mv.any():
        return PerturbationResult(distances=best, points=P, exact=False, method="gradient",
                                  misclassified=mis, n_predictions=pred.rows)

    # 1) DeepFool-style linearised steps (margin models) / ray along the loss gradient
    if has_margin:
        Z = X[idx].copy()
        active = np.arange(idx.size)
        found = np.zeros(idx.size, dtype=bool)
        for _ in range(max_iter):
            if active.size == 0:
                break
            g, G, gn = direction(Z[active], idx[active])
            ok = gn > 1e-150
            step = np.where(ok, (np.maximum(g, 0.0) + 1e-12) / np.where(ok, gn * gn, 1.0), 0.0)
            Z[active] = Z[active] + (1.02 * step)[:, None] * G
            wrong = pred(Z[active]) != yi[idx[active]]
            found[active[wrong]] = True
            active = active[~wrong & ok]
        hit = np.nonzero(found)[0]
        if hit.size:
            V = Z[hit] - X[idx[hit]]
            nv = np.sqrt(np.sum(V * V, axis=1))
            U = V / np.maximum(nv, 1e-300)[:, None]
            t = _bisect(pred, X, yi, idx[hit], U, np.zeros(hit.size), nv, tol)
            _update(best, P, idx[hit], t, U, X)
    else:
        _, G, gn = direction(X[idx], idx)
        ok = gn > 0
        U = np.where(ok[:, None], G / np.maximum(gn, 1e-300)[:, None], 0.0)
        radii = np.broadcast_to(max_radius * np.geomspace(1e-4, 1.0, 25), (int(ok.sum()), 25))
        t = _scan(pred, X, yi, idx[ok], U[ok], radii, tol)
        _update(best, P, idx[ok], t, U[ok], X)

    # 2) re-aim: at the boundary point, the optimal direction is along the margin gradient
    for _ in range(n_refine):
        rows = idx[np.isfinite(best[idx]) & (best[idx] > 0)]
        if rows.size == 0:
            break
        _, G, gn = direction(P[rows], rows)
        ok = gn > 0
        rows, G, gn = rows[ok], G[ok], gn[ok]
        U = G / gn[:, None]
        rad = np.sqrt(best[rows])
        radii = 1.5 * rad[:, None] * np.linspace(0.5, 1.0, 11)[None, :]
        t = _scan(pred, X, yi, rows, U, radii, tol)
        _update(best, P, rows, t, U, X)

    # 3) fallback for samples still without a point: direction search
    left = idx[~np.isfinite(best[idx])]
    if left.size:
        _direction_search(pred, X, yi, left, mv, rng, best, P, n_directions, max_radius, tol)
        _refine_random(pred, X, yi, left, mv, rng, best, P, n_refine, tol)
    return PerturbationResult(distances=best, points=P, exact=False, method="gradient",
                              misclassified=mis, n_predictions=pred.rows)
