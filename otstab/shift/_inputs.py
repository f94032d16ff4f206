"""Inputs shared by worst_subpopulation and conditional_shift: the default nuisance
regressors, covariates encoded for them, loss vectors, grids of p, folds, and the CVaR
of a sample."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import pandas as pd

from .._validation import (
    as_float_vector,
    check_probability,
    check_scalar,
    is_categorical,
)
from ..errors import InputTypeError, ValidationError
from ..modeling._models import per_sample_losses

#: The grid of ``p`` used by :func:`worst_subpopulation` when ``p=None``: 0.01, 0.02, ..., 1.
DEFAULT_P_GRID = np.round(np.arange(1, 101) / 100.0, 2)


_MAX_NATIVE_CATEGORIES = 255  # HistGradientBoosting native categorical support limit


# Largest accepted |loss| (and bound, approx_error, discrete_eps, all in loss units). The default
# regressors fit in float32 (largest ~3.4e38): above it their gradients overflow and the fit is
# silently wrong; squared errors of larger losses also overflow float64. 1e30 leaves room for
# sums over many rows. Every output scales with the loss unit (p* does not change), so larger
# losses only need a larger unit.
_MAX_ABS_LOSS = 1e30


def _default_regressor(categorical_mask, random_state):
    """The default ``E[loss | features]`` regressor (squared loss).

    ``HistGradientBoostingRegressor(max_iter=200, learning_rate=0.05, max_leaf_nodes=15,
    min_samples_leaf=20, l2_regularization=1.0, early_stopping=False)``, with native
    categorical support for the categorical columns. Gradient-boosted trees as in the paper
    (which used XGBoost); the moderate learning rate and leaf size keep the fit smooth at a few
    thousand rows without tuning.
    """
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=20,
        l2_regularization=1.0, early_stopping=False,
        categorical_features=_cat_arg(categorical_mask), random_state=random_state,
    )


def _default_quantile_regressor(categorical_mask, random_state):
    """The default conditional-quantile regressor (pinball loss), level set per ``p``."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        loss="quantile", quantile=0.5, max_iter=100, learning_rate=0.1, max_leaf_nodes=15,
        min_samples_leaf=20, early_stopping=False,
        categorical_features=_cat_arg(categorical_mask), random_state=random_state,
    )


def _cat_arg(mask):
    mask = np.asarray(mask, dtype=bool)
    return mask if mask.any() else None


@dataclass
class _Encoded:
    """Attributes ready for a regressor: ``native`` (categoricals as integer codes, with
    ``categorical`` marking them) and ``onehot`` (categoricals one-hot encoded)."""

    native: np.ndarray
    categorical: np.ndarray
    onehot: np.ndarray
    names: list
    dropped: list
    discrete: bool  # every kept column is discrete (categorical or few distinct values)

    @property
    def width(self) -> int:
        return self.native.shape[1]


def _as_frame(X, name: str, n_expected: int | None = None) -> pd.DataFrame:
    if isinstance(X, pd.DataFrame):
        df = X.copy()
        df.columns = [str(c) for c in df.columns]
        return df.reset_index(drop=True)
    if isinstance(X, pd.Series):
        return X.to_frame(name=str(X.name) if X.name is not None else f"{name}0").reset_index(
            drop=True)
    arr = np.asarray(X)
    if arr.ndim == 0:
        raise ValidationError(f"{name} must be a 1-D or 2-D array-like of per-row attributes, "
                              f"got a scalar")
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise ValidationError(f"{name} must be 1-D or 2-D (n_samples, n_columns), "
                              f"got shape {arr.shape}")
    return pd.DataFrame(arr.copy(), columns=[f"{name}{j}" for j in range(arr.shape[1])])


def _encode(X, name: str, n: int) -> _Encoded:
    """Validate and encode attribute columns; constant columns are dropped with a warning."""
    df = _as_frame(X, name)
    if len(df) != n:
        raise ValidationError(f"inconsistent numbers of samples: losses has {n}, "
                              f"{name} has {len(df)}")
    if df.shape[1] == 0:
        raise ValidationError(f"{name} has no columns")
    native_cols, onehot_cols, cats, names, dropped = [], [], [], [], []
    discrete = True
    small = min(20, max(2, n // 5))
    for c in df.columns:
        col = df[c]
        if col.isna().any():
            i = int(np.argmax(col.isna().to_numpy()))
            raise ValidationError(f"{name} column {c!r} has missing values (first at row {i}); "
                                  "drop or impute them first")
        if col.nunique(dropna=False) <= 1:
            dropped.append(c)
            continue
        if pd.api.types.is_bool_dtype(col):
            vals = col.to_numpy(dtype=np.float64)
            native_cols.append(vals)
            onehot_cols.append(vals[:, None])
            cats.append(False)
            names.append(c)
        elif not pd.api.types.is_numeric_dtype(col) or is_categorical(col):
            codes, uniques = pd.factorize(col, sort=True)
            if len(uniques) > _MAX_NATIVE_CATEGORIES:
                raise ValidationError(
                    f"{name} column {c!r} has {len(uniques)} categories; at most "
                    f"{_MAX_NATIVE_CATEGORIES} are supported, encode it numerically first")
            native_cols.append(codes.astype(np.float64))
            onehot_cols.append(np.eye(len(uniques))[codes])
            cats.append(True)
            names.append(c)
        else:
            vals = col.to_numpy(dtype=np.float64)
            if not np.all(np.isfinite(vals)):
                i = int(np.argmax(~np.isfinite(vals)))
                raise ValidationError(f"{name} column {c!r} contains NaN or inf (first at row "
                                      f"{i})")
            native_cols.append(vals)
            onehot_cols.append(vals[:, None])
            cats.append(False)
            names.append(c)
            discrete = discrete and len(np.unique(vals)) <= small
    if dropped:
        warnings.warn(
            f"{name}: dropping constant column(s) {dropped[:10]} (they define no "
            "sub-population)", UserWarning, stacklevel=3)
    if native_cols:
        native = np.column_stack(native_cols)
        onehot = np.column_stack(onehot_cols)
    else:
        native = np.empty((n, 0))
        onehot = np.empty((n, 0))
    return _Encoded(native=native, categorical=np.array(cats, dtype=bool), onehot=onehot,
                    names=names, dropped=dropped, discrete=discrete)


def _loss_vector(losses) -> np.ndarray:
    """Finite 1-D float losses of magnitude at most ``_MAX_ABS_LOSS``."""
    arr = as_float_vector(losses, "losses")
    big = np.abs(arr) > _MAX_ABS_LOSS
    if big.any():
        i = int(np.argmax(big))
        raise ValidationError(
            f"losses must be at most {_MAX_ABS_LOSS:g} in absolute value, got {arr[i]:g} at "
            f"index {i}; express them in a larger unit (every result scales with the losses)")
    return arr


def _loss_unit_scalar(x, name: str, **kwargs) -> float:
    """A scalar in loss units: finite, ``>= 0`` and at most ``_MAX_ABS_LOSS``."""
    return check_scalar(x, name, low=0.0, high=_MAX_ABS_LOSS, **kwargs)


def _check_losses(losses, bound) -> tuple[np.ndarray, float | None]:
    arr = _loss_vector(losses)
    if bound is None:
        return arr, None
    B = _loss_unit_scalar(bound, "bound", low_inclusive=False)
    if np.any(arr < 0):
        i = int(np.argmax(arr < 0))
        raise ValidationError(f"losses must be >= 0 when bound is given (losses in [0, bound]), "
                              f"got {arr[i]} at index {i}")
    if np.any(arr > B):
        i = int(np.argmax(arr > B))
        raise ValidationError(f"losses must be <= bound={B}, got {arr[i]} at index {i}")
    return arr, B


def _check_p(p, *, allow_none: bool) -> tuple[np.ndarray, bool]:
    """Returns (sorted unique grid, is_scalar)."""
    if p is None:
        if allow_none:
            return DEFAULT_P_GRID.copy(), False
        raise ValidationError("p is required: a fraction in (0, 1] or a grid of them")
    if np.ndim(p) == 0:
        return np.array([check_probability(p, "p")]), True
    arr = np.asarray(p)
    if arr.ndim != 1 or arr.size == 0:
        raise ValidationError(f"p must be a scalar or a non-empty 1-D grid, got shape {arr.shape}")
    vals = [check_probability(v.item() if hasattr(v, "item") else v, f"p[{i}]")
            for i, v in enumerate(arr)]
    return np.unique(np.array(vals, dtype=np.float64)), False


def _is_estimator(obj) -> bool:
    return hasattr(obj, "fit") and hasattr(obj, "predict") and not isinstance(obj, type)


def _check_learner(obj, name: str) -> str:
    """'default', 'estimator' or 'callable'."""
    if obj is None:
        return "default"
    if isinstance(obj, type):
        raise InputTypeError(f"{name} must be an estimator instance or a callable, got the class "
                             f"{obj.__name__} (did you forget the parentheses?)")
    if _is_estimator(obj):
        return "estimator"
    if callable(obj):
        return "callable"
    raise InputTypeError(f"{name} must be a scikit-learn style regressor (with fit/predict) or a "
                         f"callable, got {type(obj).__name__}")


def _predictions(values, name: str, n: int) -> np.ndarray:
    try:
        arr = np.array(values, dtype=np.float64, copy=True).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{name} must return numbers: {exc}") from exc
    if arr.shape[0] != n:
        raise ValidationError(f"{name} returned {arr.shape[0]} values for {n} rows")
    if not np.all(np.isfinite(arr)):
        raise ValidationError(f"{name} returned NaN or inf")
    return arr


def _fold_ids(n: int, folds, rng: np.random.Generator, name: str) -> np.ndarray:
    """Random (shuffled, near-equal) fold labels 0..K-1, or validated user labels."""
    if isinstance(folds, (Integral, np.integer)) and not isinstance(folds, (bool, np.bool_)):
        K = int(folds)
        if K < 2:
            raise ValidationError(f"{name} must be >= 2, got {K}")
        if n < 2 * K:
            raise ValidationError(f"{name}={K} needs at least {2 * K} rows (2 per fold), got {n}")
        ids = np.empty(n, dtype=np.int64)
        for k, chunk in enumerate(np.array_split(rng.permutation(n), K)):
            ids[chunk] = k
        return ids
    if isinstance(folds, (bool, np.bool_)) or np.ndim(folds) != 1:
        raise InputTypeError(f"{name} must be an int (number of folds) or a 1-D array of fold "
                             f"labels per row, got {type(folds).__name__}")
    labels = np.asarray(folds)
    if labels.shape[0] != n:
        raise ValidationError(f"inconsistent numbers of samples: losses has {n}, "
                              f"{name} has {labels.shape[0]}")
    _, ids = np.unique(labels, return_inverse=True)
    counts = np.bincount(ids)
    if counts.size < 2 or counts.min() < 2:
        raise ValidationError(f"{name} labels must define at least 2 folds with at least 2 rows "
                              f"each, got fold sizes {counts.tolist()}")
    return ids.astype(np.int64)


def _clone(est):
    from sklearn.base import clone

    try:
        return clone(est)
    except Exception:  # noqa: BLE001 - not clonable: fall back to a deep copy
        import copy

        return copy.deepcopy(est)


@dataclass
class _Tail:
    """A sample sorted in decreasing order with its cumulative sums (``cum[j]`` = sum of the
    ``j`` largest values). ``G(p) = p * CVaR_p`` is the linear interpolation of ``cum / m`` on
    the breakpoints ``j / m``."""

    desc: np.ndarray
    cum: np.ndarray

    @classmethod
    def of(cls, values) -> _Tail:
        desc = np.sort(np.asarray(values, dtype=np.float64))[::-1].copy()
        return cls(desc=desc, cum=np.concatenate([[0.0], np.cumsum(desc)]))

    @property
    def m(self) -> int:
        return self.desc.shape[0]

    def G(self, p) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        x = p * self.m
        k = np.minimum(np.floor(x).astype(np.int64), self.m - 1)
        return (self.cum[k] + (x - k) * self.desc[k]) / self.m

    def cvar(self, p) -> np.ndarray:
        """``[sum_{i<=k} v_(i) + (p m - k) v_(k+1)] / (p m)`` with ``k = floor(p m)``."""
        p = np.asarray(p, dtype=np.float64)
        return self.G(p) / p

    def eta(self, p) -> np.ndarray:
        """The dual minimiser ``v_(k+1)`` (the ``(1-p)``-quantile; the minimum at ``p = 1``)."""
        x = np.asarray(p, dtype=np.float64) * self.m
        k = np.minimum(np.floor(x + 1e-9).astype(np.int64), self.m - 1)
        return self.desc[k]


def _cvar(values, p) -> np.ndarray:
    return _Tail.of(values).cvar(p)


def _first_crossing(tails: list[_Tail], threshold: float, offset: float = 0.0) -> float:
    """``inf { p in (0, 1] : mean_f G_f(p) + offset <= threshold * p }``, exactly.

    ``f(p) = mean_f G_f(p) + offset - threshold * p`` is concave and piecewise linear on the
    union of the folds' breakpoints and ``f(p)/p`` is non-increasing, so the set is ``[p*, 1]``;
    ``p*`` is the root on the first segment whose right end satisfies the inequality. NaN when
    even ``p = 1`` fails (not certifiable); 0 when every ``p`` passes.
    """
    breaks = np.unique(np.concatenate([np.arange(t.m + 1) / t.m for t in tails]))
    G = np.mean([np.interp(breaks, np.arange(t.m + 1) / t.m, t.cum / t.m) for t in tails], axis=0)
    F = G + offset - threshold * breaks
    tol = 1e-12 * max(1.0, abs(threshold), float(np.max(np.abs(G))))
    ok = F <= tol
    if not ok[-1]:
        return math.nan
    j = int(np.argmax(ok[1:])) + 1  # first breakpoint > 0 that passes
    if j == 1 and F[0] <= tol:  # offset 0 and W_p <= threshold already as p -> 0
        return 0.0
    a, b = breaks[j - 1], breaks[j]
    Fa, Fb = F[j - 1], min(F[j], 0.0)
    return float(a + Fa * (b - a) / (Fa - Fb))


def _fold_weights(v: np.ndarray, p: float) -> np.ndarray:
    """Exact worst-case weights of one fold: top ``k = floor(p m)`` rows get ``1/p``, the next
    row ``(p m - k)/p``, the rest 0 (ties broken by position)."""
    m = v.shape[0]
    order = np.argsort(-v, kind="stable")
    x = p * m
    k = min(int(math.floor(x + 1e-9)), m)
    w = np.zeros(m)
    w[order[:k]] = 1.0 / p
    if k < m:
        w[order[k]] = max(x - k, 0.0) / p
    return w


def _pct(level: float) -> str:
    return f"{100 * level:.4g}%"


def _model_losses(model, X, y, loss) -> np.ndarray:

    return np.asarray(per_sample_losses(model, X, y, loss), dtype=np.float64)


def _columns_of(X, cols, name: str):
    """``cols`` given as column name(s) of a DataFrame ``X`` -> ``X[cols]``; else ``cols``."""
    if cols is None:
        return None
    is_names = isinstance(cols, str) or (
        isinstance(cols, (list, tuple)) and len(cols) > 0 and all(isinstance(c, str) for c in cols))
    if not is_names:
        return cols
    if not isinstance(X, pd.DataFrame):
        raise ValidationError(f"{name} given as column names {cols!r} needs X to be a DataFrame")
    names = [cols] if isinstance(cols, str) else list(cols)
    missing = [c for c in names if c not in X.columns]
    if missing:
        raise ValidationError(f"{name}: column(s) {missing} not in X (columns: "
                              f"{list(X.columns)[:20]})")
    return X[names]
