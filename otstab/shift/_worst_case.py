"""Worst-case subpopulation risk and conditional-shift stability.

Two estimators of how bad a model's average loss can get when the evaluation population is
replaced by a sub-population, both model-agnostic (they take per-sample losses):

:func:`worst_subpopulation`
    Li, Namkoong and Xia (NeurIPS 2021), "Evaluating model performance under worst-case
    subpopulations". With the *conditional risk* ``mu(z) = E[loss | Z = z]`` of attributes ``Z``,
    the worst average loss over every sub-population that makes up at least a fraction ``p`` of
    the population (paper: ``alpha``) is

        W_p = sup { E_Q mu(Z) : dQ_Z/dP_Z <= 1/p } = CVaR_p(mu(Z)),

    the mean of the upper ``p``-tail of ``mu(Z)``. ``mu`` is unknown, so it is fitted by
    regression on one half of the data and the tail mean of the fitted ``h(Z)`` is taken on the
    other half (two-stage, cross-fitted). ``p* = inf {p : W_p <= threshold}`` is the smallest
    sub-population size whose worst case stays acceptable; ``p_star`` *estimates* it from the
    fitted curve, and only ``p_star_upper``, from the dimension-free band, is *certified*
    (with probability ``>= 1 - delta``, given a known loss range).

:func:`conditional_shift`
    Subbaswamy, Adams and Saria (AISTATS 2021), "Evaluating model robustness and stability to
    dataset shift". Variables split into immutable ``Z`` and mutable ``W``; the shift replaces
    ``P(W | Z)`` by ``Q(W | Z)`` with density ratio at most ``1/p`` while ``P(Z)`` is kept.
    With ``mu0(w, z) = E[loss | W = w, Z = z]`` the worst-case risk is

        R_p = E_Z[ CVaR_p(mu0(W, Z) | Z) ],

    estimated by the debiased (DML2, cross-fitted) estimator of the paper with an
    influence-function standard error and a normal confidence interval.

Convention throughout: ``p`` in (0, 1] is the fraction of the population kept in the worst-case
sub-population (``p = 1`` is the plain average), and
``CVaR_p(U) = inf_eta { eta + E(U - eta)_+ / p }`` whose minimiser ``eta`` is the
``(1 - p)``-quantile of ``U``.

See ``docs/worst_case.md`` for the formulas, the defaults and an example.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import numpy as np
import pandas as pd

from .._progress import check_progress, progress_bar
from .._results import ResultMixin
from .._validation import (
    as_float_vector,
    check_probability,
    check_random_state,
    check_same_length,
    check_scalar,
    renamed_kwargs,
)
from ..errors import InputTypeError, ValidationError
from ..modeling._losses import ZeroOne, get_loss
from ..modeling._models import per_sample_losses

__all__ = [
    "worst_subpopulation",
    "conditional_shift",
    "worst_subpopulation_of_model",
    "conditional_shift_of_model",
    "WorstCaseResult",
    "ConditionalShiftResult",
    "plot_worst_case",
    "plot_conditional_shift",
    "DEFAULT_P_GRID",
]

#: The grid of ``p`` used by :func:`worst_subpopulation` when ``p=None``: 0.01, 0.02, ..., 1.
DEFAULT_P_GRID = np.round(np.arange(1, 101) / 100.0, 2)

_MAX_NATIVE_CATEGORIES = 255  # HistGradientBoosting native categorical support limit

# Largest accepted |loss| (and bound, approx_error, discrete_eps, all in loss units). The default
# regressors fit in float32 (largest ~3.4e38): above it their gradients overflow and the fit is
# silently wrong; squared errors of larger losses also overflow float64. 1e30 leaves room for
# sums over many rows. Every output scales with the loss unit (p* does not change), so larger
# losses only need a larger unit.
_MAX_ABS_LOSS = 1e30


# ------------------------------------------------------------------------------------------
# default nuisance regressors
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# input handling
# ------------------------------------------------------------------------------------------


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


def _is_categorical(col: pd.Series) -> bool:
    return not pd.api.types.is_numeric_dtype(col) or isinstance(col.dtype, pd.CategoricalDtype)


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
        elif _is_categorical(col):
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


# ------------------------------------------------------------------------------------------
# CVaR of a sample and the piecewise-linear curve p -> p * CVaR_p
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------


@dataclass(repr=False)
class WorstCaseResult(ResultMixin):
    """Worst-case subpopulation risk ``W_p = CVaR_p(E[loss | Z])`` (:func:`worst_subpopulation`).

    Attributes
    ----------
    value : float or None
        ``W_p`` at a scalar ``p`` (None for a grid: see ``curve``).
    p : float or ndarray
        The scalar ``p`` or the sorted grid.
    curve : DataFrame or None
        For a grid: columns ``p, W_p, lower, upper, eta, raw_cvar, halfwidth,
        halfwidth_fixed_h`` (one row per ``p``).
    eta : float or ndarray
        The dual minimiser (the ``(1-p)``-quantile of the fitted ``h(Z)``), averaged over folds.
    weights : ndarray or None
        At a scalar ``p``: the worst-case density ratio ``dQ/dP`` per row, in ``[0, 1/p]``:
        ``1/p`` on rows with ``h(Z_i) > eta`` (within their fold), a fraction on the boundary row,
        0 elsewhere; mean 1 within each fold. None for a grid (use :meth:`weights_at`).
    p_star : float or None
        The *estimate* ``inf {p : W^_p <= threshold}`` on the estimated curve (solved exactly on
        the piecewise-linear curve), with no margin for error: not a guarantee. 0 when every
        sub-population passes, NaN when even the average loss exceeds the threshold; None
        without a threshold.
    p_star_upper : float or None
        The *guarantee* ``inf {p : W^_p + halfwidth_p <= threshold}`` from the dimension-free
        band: with probability at least ``level`` every sub-population of size at least
        ``p_star_upper`` has risk at most ``threshold`` (when ``bound`` was given). NaN when the
        data cannot certify the threshold at any ``p``.
    threshold : float or None
        The acceptable loss level ``l_bar``.
    certificate : str or None
        Decided by the guarantee only: ``"certified"`` when ``p_star_upper`` is a number and the
        loss range was given (``bound``), else ``"not certified"``. None without a threshold.
    estimate : str or None
        The label of ``p_star``: ``"estimated"`` (a number) or ``"not met"`` (NaN: even the
        estimated average loss exceeds the threshold). None without a threshold.
    guarantee : str or None
        One sentence: what is certified, at what confidence, or why nothing is.
    vacuous_note : str or None
        One line when the dimension-free band is vacuous (``halfwidth >= loss_bound``) at some
        ``p``, with the ``n`` at which it would stop being vacuous (:meth:`nonvacuous_n`);
        None when it is informative at every ``p``.
    lower, upper : float or None
        At a scalar ``p``: ``value -/+ halfwidth`` clipped to the loss range; NaN when the band
        is vacuous (``halfwidth >= loss_bound``). In ``curve`` likewise per ``p``.
    halfwidth : float or ndarray
        Dimension-free bound (Theorem 2 of the paper) on ``|W_p - value|``; simultaneous over all
        ``p`` with probability at least ``level``.
    halfwidth_fixed_h : float or ndarray
        DKW bound on the second-stage error ``|W_p(h) - value|`` for the fitted ``h`` (ignores
        the error of ``h`` itself); simultaneous over ``p`` with probability ``>= level``.
    raw_cvar : float or ndarray
        Plug-in ``CVaR_p`` of the raw losses: ``W_p`` for ``Z = all columns (X, Y)``, an upper
        bound on ``W_p`` for every ``Z``.
    mean_loss : float
        ``W_1``, the average loss.
    loss_bound : float
        ``B`` used by the bounds (``bound`` if given, else the observed loss range).
    loss_bound_source : str
        ``"given"`` or ``"empirical"`` (the bounds then are plug-in, not guarantees).
    level, approx_error : float
        Confidence level of the bands (their failure probability is ``delta = 1 - level``,
        also an attribute) and the user-supplied approximation error
        ``eps_app = ||h* - mu||_2`` of the regressor class.
    n, cv : int
        Rows and number of cross-fitting folds (1 when a fixed ``h`` was supplied).
    fold_mse, fold_mse_min : list of float
        Per evaluation fold: ``Delta_S2(h1)`` (out-of-fold squared error of the fitted ``h``)
        and ``Delta_min`` (squared error of the same regressor refitted in-sample on that fold).
    columns_used, columns_dropped : list of str
        ``Z`` columns used and constant columns dropped.
    h : ndarray
        Cross-fitted ``h(Z_i)`` per row (not in ``to_dict``).
    fold : ndarray
        Evaluation fold per row (not in ``to_dict``).
    regressors : list
        The fitted first-stage regressors, one per fold (not in ``to_dict``).
    """

    value: float | None
    p: Any
    curve: pd.DataFrame | None
    eta: Any
    weights: np.ndarray | None
    p_star: float | None
    p_star_upper: float | None
    threshold: float | None
    certificate: str | None
    estimate: str | None
    lower: float | None
    upper: float | None
    halfwidth: Any
    halfwidth_fixed_h: Any
    raw_cvar: Any
    mean_loss: float
    loss_bound: float
    loss_bound_source: str
    level: float
    approx_error: float
    n: int
    cv: int
    fold_mse: list
    fold_mse_min: list
    columns_used: list
    columns_dropped: list
    guarantee: str | None = None
    vacuous_note: str | None = None
    h: np.ndarray | None = field(repr=False, default=None)
    fold: np.ndarray | None = field(repr=False, default=None)
    regressors: list | None = field(repr=False, default=None)
    _tails: list | None = field(repr=False, default=None)
    _U: float = field(repr=False, default=math.nan)
    _range: tuple = field(repr=False, default=(-math.inf, math.inf))

    _repr_fields = ("value", "p", "lower", "upper", "p_star", "p_star_upper", "threshold",
                    "certificate", "mean_loss", "loss_bound", "level", "n", "cv")

    @property
    def delta(self) -> float:
        """Failure probability of the bands, ``1 - level``."""
        return 1.0 - self.level

    def value_at(self, p) -> np.ndarray | float:
        """Cross-fitted ``W_p`` at any ``p`` (scalar or array), from the stored fitted ``h``."""
        arr = np.asarray(p, dtype=np.float64)
        grid = np.atleast_1d(arr).reshape(-1)
        for i, v in enumerate(grid):
            check_probability(float(v), "p" if arr.ndim == 0 else f"p[{i}]")
        assert self._tails is not None, "set by worst_subpopulation"
        out = np.mean([t.cvar(grid) for t in self._tails], axis=0)
        return float(out[0]) if arr.ndim == 0 else out

    def weights_at(self, p) -> np.ndarray:
        """Worst-case density ratio ``dQ/dP`` per row at a scalar ``p`` (see ``weights``)."""
        p = check_probability(p, "p")
        assert self.fold is not None and self.h is not None, "set by worst_subpopulation"
        w = np.zeros(self.n)
        for k in range(self.cv):
            idx = np.flatnonzero(self.fold == k)
            w[idx] = _fold_weights(self.h[idx], p)
        return w

    def nonvacuous_n(self, p) -> float:
        """The smallest number of rows at which the dimension-free half-width at ``p`` drops
        below the loss range ``B`` (``math.inf`` if none does), from the bound's rate.

        The bound of :func:`worst_subpopulation` (Notes) is recomputed with every fold grown in
        proportion, ``m_k -> m_k N / n``, holding the fitted regressor's excess error
        ``[Delta_S2(h1) - Delta_min]_+`` and ``approx_error`` fixed. Those terms do not shrink
        with ``N`` in the formula, so when ``sqrt(excess + approx_error^2)`` (averaged over
        folds) is already ``>= p B`` no ``N`` suffices.
        """
        p = check_probability(p, "p")
        assert self.fold is not None, "set by worst_subpopulation"
        sizes = np.bincount(self.fold, minlength=self.cv).astype(np.float64)
        excess = np.array(self.fold_mse) - np.array(self.fold_mse_min)
        B = self.loss_bound

        def vacuous(N: int) -> bool:
            return _dimension_free_U(excess, sizes * N / self.n, B, self.delta,
                                     self.approx_error) / p >= B

        floor = float(np.mean(np.sqrt(np.maximum(excess, 0.0) + self.approx_error**2)))
        if floor >= p * B:
            return math.inf
        lo, hi = 0, max(self.n, 1)  # vacuous(lo) holds (N = 0 is infinitely wide)
        while vacuous(hi):
            lo, hi = hi, 2 * hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if vacuous(mid) else (lo, mid)
        return hi

    def summary(self) -> str:
        """What was estimated, what is guaranteed (and at what confidence), and whether the
        band is vacuous at this ``n``."""
        src = "given" if self.loss_bound_source == "given" else "observed"
        lines = [f"Worst-case subpopulation risk: n = {self.n:,}, Z = {self.columns_used}, "
                 f"{self.cv} fold(s), loss range B = {self.loss_bound:g} ({src})",
                 f"  mean loss (W_1)   {self.mean_loss:.4g}"]
        if self.curve is None:
            band = ("vacuous" if self.lower is None or math.isnan(self.lower)
                    else f"[{self.lower:.4g}, {self.upper:.4g}]")
            lines.append(f"  W_{self.p:g} (estimate) {self.value:.4g}, {_pct(self.level)} "
                         f"dimension-free band {band}")
        else:
            lines.append(f"  W_p (estimates)   {len(self.curve)} values of p: see to_frame()")
        if self.threshold is not None:
            est = ("not met: even the estimated mean loss exceeds it" if self.estimate == "not met"
                   else f"{self.p_star:.4g} (estimated, no margin for error: not a guarantee)")
            lines += [f"  threshold         {self.threshold:g}",
                      f"  p_star            {est}",
                      f"  p_star_upper      {self.p_star_upper:.4g}",
                      f"  certificate       {self.guarantee}"]
        if self.vacuous_note:
            lines.append(f"  note: {self.vacuous_note}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_frame(self) -> pd.DataFrame:
        """The curve (one row per ``p``; a single row for a scalar ``p``)."""
        if self.curve is not None:
            return self.curve.copy()
        return pd.DataFrame({
            "p": [self.p], "W_p": [self.value], "lower": [self.lower], "upper": [self.upper],
            "eta": [self.eta], "raw_cvar": [self.raw_cvar], "halfwidth": [self.halfwidth],
            "halfwidth_fixed_h": [self.halfwidth_fixed_h],
        })


@dataclass(repr=False)
class ConditionalShiftResult(ResultMixin):
    """Conditional-shift worst-case risk ``R_p = E_Z[CVaR_p(mu0 | Z)]`` (:func:`conditional_shift`).

    Nothing here is a finite-sample guarantee: ``R_p`` is an estimate and its interval is an
    asymptotic normal confidence interval (see ``guarantee``).

    Attributes
    ----------
    value : float or None
        ``R_p`` (DML2 estimate) at a scalar ``p``; None for a grid (see ``curve``).
    se : float or None
        Influence-function standard error ``sigma / sqrt(N)``.
    ci : tuple or None
        ``(low, high)`` asymptotic normal confidence interval at ``level``: its coverage tends
        to ``level`` as ``N`` grows when the nuisances converge fast enough; not a guarantee.
    p : float or ndarray
        The scalar ``p`` or the sorted grid.
    curve : DataFrame or None
        For a grid: columns ``p, R_p, se, ci_lower, ci_upper, joint, joint_se``.
    eta : ndarray
        Cross-fitted conditional quantile ``eta^(Z_i)`` per row, shape ``(n,)`` for a scalar
        ``p`` and ``(n, len(p))`` for a grid (columns follow ``p``). NaN at ``p = 1``, where any
        value below the conditional minimum is optimal.
    selector : ndarray of bool
        Worst-case selector ``h_i = 1[mu^_i (+ u_i) > eta^_i]``; the worst-case reweighting is
        ``dQ/dP = h / p``. Same shape as ``eta``.
    joint_value, joint_se : float or None
        The same estimator with ``Z`` empty, i.e. when ``(W, Z)`` may shift jointly
        (``>= value``): how much the immutability of ``Z`` protects the model.
    mean_loss : float
        ``R_1``, the average loss.
    level : float
        Confidence level of ``ci``.
    n, folds : int
        Rows and cross-fitting folds.
    discrete_eps : float
        Width of the uniform noise added to ``mu^`` for discrete ``W`` (0 when off). The
        estimate then targets ``R_{p,eps}`` in ``[R_p, R_p + eps]``.
    inner_split : bool
        Whether the quantile targets were out-of-fold predictions (see the function).
    w_columns, z_columns, columns_dropped : list of str
        Columns used and constant columns dropped.
    guarantee : str
        One sentence saying what is estimated and what the interval does (and does not)
        guarantee.
    psi : ndarray
        Per-row influence values (scalar ``p``) or ``(n, len(p))`` (not in ``to_dict``).
    mu : ndarray
        Cross-fitted ``mu^(W_i, Z_i)`` (not in ``to_dict``).
    fold : ndarray
        Fold per row (not in ``to_dict``).
    regressors : list
        Fitted ``mu`` regressors per fold (not in ``to_dict``).
    """

    value: float | None
    se: float | None
    ci: tuple | None
    p: Any
    curve: pd.DataFrame | None
    eta: np.ndarray
    selector: np.ndarray
    joint_value: float | None
    joint_se: float | None
    mean_loss: float
    level: float
    n: int
    folds: int
    discrete_eps: float
    inner_split: bool
    w_columns: list
    z_columns: list
    columns_dropped: list
    guarantee: str = ""
    psi: np.ndarray | None = field(repr=False, default=None)
    mu: np.ndarray | None = field(repr=False, default=None)
    fold: np.ndarray | None = field(repr=False, default=None)
    regressors: list | None = field(repr=False, default=None)

    _repr_fields = ("value", "se", "ci", "p", "joint_value", "mean_loss", "level", "n",
                    "folds", "w_columns", "z_columns")

    @property
    def weights(self) -> np.ndarray:
        """Worst-case density ratio ``dQ/dP = selector / p`` (same shape as ``selector``)."""
        return self.selector / np.asarray(self.p, dtype=np.float64)

    def __post_init__(self):
        self.guarantee = (
            f"none: R_p and the joint-shift value are DML2 estimates; the {_pct(self.level)} "
            f"interval is an asymptotic normal CI (influence-function standard error), whose "
            f"coverage tends to {_pct(self.level)} as n grows, not a finite-sample guarantee")

    def summary(self) -> str:
        """What was estimated and what the confidence interval means."""
        lines = [f"Conditional-shift worst-case risk (DML2): n = {self.n:,}, W = "
                 f"{self.w_columns}, Z = {self.z_columns}, {self.folds} folds",
                 f"  mean loss (R_1)   {self.mean_loss:.4g}"]
        if self.curve is None:
            assert self.ci is not None, "a scalar p has its interval"
            lines += [f"  R_{self.p:g} (estimate) {self.value:.4g}, {_pct(self.level)} "
                      f"asymptotic CI ({self.ci[0]:.4g}, {self.ci[1]:.4g})",
                      f"  joint shift       {self.joint_value:.4g} (estimate)"]
        else:
            lines.append(f"  R_p (estimates)   {len(self.curve)} values of p: see to_frame()")
        lines.append(f"  guaranteed        {self.guarantee}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_frame(self) -> pd.DataFrame:
        """The curve (one row per ``p``; a single row for a scalar ``p``)."""
        if self.curve is not None:
            return self.curve.copy()
        assert self.ci is not None, "a scalar p has its interval"
        return pd.DataFrame({
            "p": [self.p], "R_p": [self.value], "se": [self.se], "ci_lower": [self.ci[0]],
            "ci_upper": [self.ci[1]], "joint": [self.joint_value], "joint_se": [self.joint_se],
        })


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


# ------------------------------------------------------------------------------------------
# worst-case subpopulation (paper 000)
# ------------------------------------------------------------------------------------------


def _one_minus(delta):
    """``level = 1 - delta`` for the deprecated ``delta=`` (other input is left for the
    level check to refuse)."""
    if isinstance(delta, (bool, np.bool_)) or not isinstance(delta, (int, float, np.number)):
        return delta
    return 1.0 - float(delta)


@renamed_kwargs(delta=("level", _one_minus))
def worst_subpopulation(
    losses,
    Z,
    *,
    p=None,
    threshold=None,
    regressor=None,
    cv: int = 2,
    level: float = 0.95,
    bound=None,
    approx_error: float = 0.0,
    random_state=None,
    progress=None,
) -> WorstCaseResult:
    """Worst-case risk over all sub-populations of size ``>= p`` defined by attributes ``Z``.

    Two-stage cross-fitted estimator of ``W_p = CVaR_p(mu(Z))``, ``mu(z) = E[loss | Z = z]``
    (Li, Namkoong and Xia, 2021): split the rows into ``cv`` folds (halves by default); on the
    other folds fit ``h ~ E[loss | Z]`` by squared-loss regression and clip it to the loss range;
    on the fold take the upper-``p`` tail mean of ``v_i = h(Z_i)`` sorted decreasingly,
    ``[sum_{i<=k} v_(i) + (p m - k) v_(k+1)] / (p m)`` with ``k = floor(p m)``; average over
    folds.

    Parameters
    ----------
    losses : array-like of shape (n,)
        Held-out per-sample losses of the model (any model; see
        :func:`worst_subpopulation_of_model`). Must be finite; in ``[0, bound]`` when ``bound``
        is given.
    Z : array-like, Series or DataFrame with n rows
        Attributes defining sub-populations (e.g. demographics, metadata, or all features).
        DataFrame columns may be categorical (``category``, string/object or bool dtype): the
        default regressor uses HistGradientBoosting's native categorical support; a
        user-supplied estimator gets them one-hot encoded. Constant columns are dropped with a
        ``UserWarning``; it is an error if no column is left. Missing values are an error.
    p : float or array-like of float in (0, 1], optional
        Sub-population fraction(s). None: the grid 0.01, 0.02, ..., 1 (``DEFAULT_P_GRID``).
        A grid is sorted and de-duplicated.
    threshold : float, optional
        Acceptable loss level ``l_bar``; enables the estimate ``p_star``, the guarantee
        ``p_star_upper`` and the ``certificate`` label (decided by the guarantee only).
    regressor : estimator or callable, optional
        Any scikit-learn regressor (cloned and refitted per fold), or a callable ``h(Z) ->
        array`` treated as a fixed conditional risk fitted on other data (no split: the plug-in
        uses all rows, ``cv`` is ignored; pass the true ``mu`` to evaluate a known model).
        Default: ``HistGradientBoostingRegressor(max_iter=200, learning_rate=0.05,
        max_leaf_nodes=15, min_samples_leaf=20, l2_regularization=1.0, early_stopping=False)``.
    cv : int, default 2
        Number of cross-fitting folds (2 = the paper's halves, swapped and averaged).
    level : float in (0, 1), default 0.95
        Confidence level of the reported bands: they fail with probability at most
        ``delta = 1 - level`` (split across folds and events). Formerly ``delta`` (the
        failure probability itself: ``delta=0.05`` is ``level=0.95``).
    bound : float, optional
        ``B`` with losses in ``[0, B]`` (the paper's Assumption 1), needed for the bounds to be
        guarantees. None: ``B`` is the observed range ``max(l) - min(0, min(l))`` and the bands
        are plug-in only (``loss_bound_source = "empirical"``); negative losses are allowed.
    approx_error : float, default 0
        ``eps_app``: an upper bound on ``||h* - mu||_2``, the approximation error of the
        regressor class, added to the dimension-free bound.
    random_state : None, int, numpy Generator or RandomState
        Seeds the fold split and the default regressor.
    progress : None, True or False
        A progress bar on stderr over the regressor fits (None: only when stderr is a
        terminal).

    Returns
    -------
    WorstCaseResult

    Notes
    -----
    Bounds, with ``m`` the fold size, ``K`` the number of folds and ``B`` the loss range:

    - fixed-h (DKW): ``(B/p) sqrt(log(2K/delta) / (2 m))``;
    - dimension-free (Theorem 2): ``(1/p) ( sqrt([Delta_S2(h1) - Delta_min]_+ + eps_app^2 +
      4 B^2 sqrt(2 log(3K/delta) / m)) + B sqrt(log(6K/delta) / (2 m)) )`` with
      ``Delta_S(h) = mean_S (l - h(Z))^2`` and ``Delta_min`` the in-sample error of the
      regressor refitted on the evaluation fold (a proxy for the in-class minimum; exact for
      least squares, so for a flexible regressor the bound is only as good as that proxy).

    Each fold's bound holds uniformly over ``p`` (the DKW and Hoeffding events do not depend on
    ``p``); ``delta`` is divided over the ``K`` folds and three events, so the averaged band is
    simultaneous over ``p`` with probability at least ``1 - delta``.
    """
    l, B_given = _check_losses(losses, bound)
    n = l.shape[0]
    if Z is None:
        raise ValidationError("Z is required: the attributes defining sub-populations")
    grid, scalar = _check_p(p, allow_none=True)
    if threshold is not None:
        threshold = check_scalar(threshold, "threshold")
    level = check_scalar(level, "level", low=0.0, high=1.0, low_inclusive=False,
                         high_inclusive=False)
    delta = 1.0 - level
    approx_error = _loss_unit_scalar(approx_error, "approx_error")
    kind = _check_learner(regressor, "regressor")
    rng = check_random_state(random_state)
    show = check_progress(progress)

    if B_given is not None:
        lo, B, source = 0.0, B_given, "given"
    else:
        lo = min(0.0, float(l.min()))
        B, source = float(l.max()) - lo, "empirical"
        if B <= 0:
            B = 1.0  # all losses equal 0: any positive range gives a zero-width band
    hi = lo + B

    if kind == "callable":
        check_same_length(losses=l, Z=Z)
        h_all = np.clip(_predictions(regressor(Z), "regressor(Z)", n), lo, hi)
        fold = np.zeros(n, dtype=np.int64)
        K = 1
        used, dropped = _callable_columns(Z)
        fitted = [regressor]
        mse = [float(np.mean((l - h_all) ** 2))]
        mse_min = list(mse)  # a fixed h is a one-element class: h* = h
    else:
        enc = _encode(Z, "Z", n)
        if enc.width == 0:
            raise ValidationError(
                "Z has only constant columns; a constant attribute defines no sub-population "
                "(W_p would equal the mean loss for every p)")
        if not isinstance(cv, (Integral, np.integer)) or isinstance(cv, (bool, np.bool_)):
            raise InputTypeError(f"cv must be an int >= 2, got {type(cv).__name__}")
        fold = _fold_ids(n, int(cv), rng, "cv")
        K = int(cv)
        seed = int(rng.integers(0, 2**31 - 1))
        if kind == "default":
            base = _default_regressor(enc.categorical, seed)
            Xf = enc.native
        else:
            base = regressor
            Xf = enc.onehot
        h_all = np.empty(n)
        fitted, mse, mse_min = [], [], []
        with progress_bar(2 * K, "worst_subpopulation", show) as bar:
            for k in range(K):
                te, tr = fold == k, fold != k
                est = _clone(base).fit(Xf[tr], l[tr])
                bar.update()
                h_all[te] = np.clip(_predictions(est.predict(Xf[te]), "regressor.predict",
                                                 te.sum()), lo, hi)
                fitted.append(est)
                mse.append(float(np.mean((l[te] - h_all[te]) ** 2)))
                ref = _clone(base).fit(Xf[te], l[te])
                bar.update()
                ref_pred = np.clip(_predictions(ref.predict(Xf[te]), "regressor.predict",
                                                te.sum()), lo, hi)
                mse_min.append(float(np.mean((l[te] - ref_pred) ** 2)))
        used, dropped = enc.names, enc.dropped

    tails = [_Tail.of(h_all[fold == k]) for k in range(K)]
    sizes = np.array([t.m for t in tails], dtype=np.float64)
    W = np.mean([t.cvar(grid) for t in tails], axis=0)
    eta = np.mean([t.eta(grid) for t in tails], axis=0)
    dkw_fixed = np.mean(B * np.sqrt(np.log(2 * K / delta) / (2 * sizes)))
    U = _dimension_free_U(np.array(mse) - np.array(mse_min), sizes, B, delta, approx_error)
    hw = U / grid
    hw_fixed = dkw_fixed / grid
    # a vacuous band (half-width >= the loss range) says nothing: NaN, not a clipped [lo, hi]
    vacuous = hw >= B
    lower = np.where(vacuous, np.nan, np.clip(W - hw, lo, hi))
    upper = np.where(vacuous, np.nan, np.clip(W + hw, lo, hi))
    raw = _cvar(l, grid)

    p_star = p_star_upper = certificate = estimate = None
    if threshold is not None:
        p_star = _first_crossing(tails, threshold)
        p_star_upper = _first_crossing(tails, threshold, offset=U) if threshold < hi else 0.0
        # the label follows the guarantee (p_star_upper, a bound on known-range losses) only
        certificate = ("certified" if source == "given" and not math.isnan(p_star_upper)
                       else "not certified")
        estimate = "not met" if math.isnan(p_star) else "estimated"

    common = dict(
        p_star=p_star, p_star_upper=p_star_upper, threshold=threshold, certificate=certificate,
        estimate=estimate, mean_loss=float(np.mean(l)), loss_bound=float(B),
        loss_bound_source=source,
        level=level, approx_error=approx_error, n=n, cv=K, fold_mse=mse, fold_mse_min=mse_min,
        columns_used=list(used), columns_dropped=list(dropped), h=h_all, fold=fold,
        regressors=fitted, _tails=tails, _U=U, _range=(lo, hi),
    )
    if scalar:
        pp = float(grid[0])
        weights = np.zeros(n)
        for k in range(K):
            idx = np.flatnonzero(fold == k)
            weights[idx] = _fold_weights(h_all[idx], pp)
        res = WorstCaseResult(
            value=float(W[0]), p=pp, curve=None, eta=float(eta[0]), weights=weights,
            lower=float(lower[0]), upper=float(upper[0]), halfwidth=float(hw[0]),
            halfwidth_fixed_h=float(hw_fixed[0]), raw_cvar=float(raw[0]), **common)
    else:
        curve = pd.DataFrame({"p": grid, "W_p": W, "lower": lower, "upper": upper, "eta": eta,
                              "raw_cvar": raw, "halfwidth": hw, "halfwidth_fixed_h": hw_fixed})
        res = WorstCaseResult(
            value=None, p=grid, curve=curve, eta=eta, weights=None, lower=None, upper=None,
            halfwidth=hw, halfwidth_fixed_h=hw_fixed, raw_cvar=raw, **common)
    res.guarantee = _guarantee_sentence(res)
    res.vacuous_note = _vacuous_note(res, grid, hw)
    return res


def _dimension_free_U(excess, sizes, B: float, delta: float, approx_error: float) -> float:
    """``p`` times the dimension-free half-width (Theorem 2), averaged over the folds:
    ``mean_k sqrt([excess_k]_+ + eps_app^2 + 4 B^2 sqrt(2 log(3K/delta) / m_k))
    + B sqrt(log(6K/delta) / (2 m_k))`` with ``K = len(sizes)``."""
    sizes = np.asarray(sizes, dtype=np.float64)
    K = sizes.size
    first = np.sqrt(np.maximum(np.asarray(excess, dtype=np.float64), 0.0) + approx_error**2
                    + 4 * B**2 * np.sqrt(2 * np.log(3 * K / delta) / sizes))
    return float(np.mean(first + B * np.sqrt(np.log(6 * K / delta) / (2 * sizes))))


def _pct(level: float) -> str:
    return f"{100 * level:.4g}%"


def _guarantee_sentence(res: WorstCaseResult) -> str | None:
    """What the threshold certificate guarantees (or why it does not), in one sentence."""
    if res.threshold is None:
        return None
    t, q, conf = res.threshold, res.p_star_upper, _pct(res.level)
    if q is None or math.isnan(q):
        return (f"not certified: W_p + halfwidth_p <= {t:g} holds at no p, so nothing is "
                f"guaranteed at {conf} confidence")
    size = "every sub-population" if q == 0.0 else f"every sub-population of size >= {q:.4g}"
    if res.loss_bound_source != "given":
        return (f"not certified: the band uses the observed loss range B = "
                f"{res.loss_bound:g} (pass bound=B, a known range of the losses, to make it a "
                f"guarantee); as a plug-in it would give {size} risk <= {t:g}")
    return (f"certified: with probability >= {conf}, {size} has risk <= {t:g} (dimension-free "
            f"bound, losses in [0, {res.loss_bound:g}])")


def _vacuous_note(res: WorstCaseResult, grid: np.ndarray, hw: np.ndarray) -> str | None:
    """One line when the dimension-free band is vacuous (half-width >= B) at some ``p`` of the
    grid, with the ``n`` at which it would stop being vacuous."""
    vac = grid[hw >= res.loss_bound]
    if vac.size == 0:
        return None
    where = (f"every p of the grid (p <= {vac[-1]:g})" if vac.size == grid.size
             else f"p <= {vac[-1]:g}")
    ends = [vac[-1]] if vac.size == 1 else [vac[-1], vac[0]]
    parts = []
    for pp in ends:
        need = res.nonvacuous_n(pp)
        parts.append(f"at p = {pp:g} from n = {need:,}" if math.isfinite(need) else
                     f"at p = {pp:g} not by more rows alone (the excess-error and approx_error "
                     f"terms already reach p B: a better-fitting regressor is needed)")
    return (f"At n = {res.n:,} the {_pct(res.level)} dimension-free band is vacuous "
            f"(half-width >= the loss range B = {res.loss_bound:g}) for {where}: lower/upper "
            f"are NaN there. By the bound's rate (half-width ~ n^-1/4, the regressor's excess "
            f"error held fixed) it stops being vacuous {' and '.join(parts)}.")


def _callable_columns(Z) -> tuple[list, list]:
    if isinstance(Z, pd.DataFrame):
        return [str(c) for c in Z.columns], []
    if isinstance(Z, pd.Series):
        return [str(Z.name)], []
    d = np.shape(Z)[1] if np.ndim(Z) == 2 else 1
    return [f"Z{j}" for j in range(d)], []


# ------------------------------------------------------------------------------------------
# conditional shift (paper 001)
# ------------------------------------------------------------------------------------------


def _with_quantile(est, level: float):
    """A clone of ``est`` set to the quantile ``level`` (its ``quantile`` or, for
    ``GradientBoostingRegressor(loss="quantile")``-style estimators, its ``alpha``)."""
    est = _clone(est)
    try:
        params = est.get_params()
    except Exception as exc:  # noqa: BLE001
        raise InputTypeError("quantile_regressor must be a scikit-learn style estimator with a "
                             "`quantile` parameter, or a callable (Z, level)") from exc
    loss = params.get("loss")
    if "quantile" in params:
        if loss is not None and loss != "quantile":
            raise ValidationError(f"quantile_regressor has loss={loss!r}; expected "
                                  "loss='quantile' (pinball loss)")
        return est.set_params(quantile=level)
    if "alpha" in params and loss == "quantile":
        return est.set_params(alpha=level)
    raise ValidationError(
        "quantile_regressor must expose its quantile level as a `quantile` parameter (e.g. "
        "HistGradientBoostingRegressor(loss='quantile'), sklearn.linear_model.QuantileRegressor) "
        "or `alpha` with loss='quantile'")


def _lower_quantile(values: np.ndarray, level: float) -> float:
    """The smallest ``x`` with empirical ``F(x) >= level``: a pinball-loss minimiser."""
    return float(np.quantile(values, level, method="inverted_cdf"))


def conditional_shift(
    losses,
    W,
    Z,
    *,
    p,
    folds=10,
    regressor=None,
    quantile_regressor=None,
    discrete_eps=None,
    level: float = 0.95,
    inner_split: bool = False,
    random_state=None,
    progress=None,
) -> ConditionalShiftResult:
    """Worst-case risk when ``P(W | Z)`` shifts (density ratio ``<= 1/p``) and ``P(Z)`` is kept.

    DML2 estimator of ``R_p = E_Z[CVaR_p(mu0(W, Z) | Z)]`` (Subbaswamy, Adams and Saria,
    2021). For each fold ``k``: fit ``mu^_k ~ E[loss | W, Z]`` on the other folds; fit
    ``eta^_k``, the conditional ``(1-p)``-quantile of ``mu^_k(W, Z)`` given ``Z``, by
    pinball-loss regression on the other folds; for ``i`` in fold ``k`` with
    ``h_i = 1[mu^_i > eta^_i]``

        psi_i = eta^_i + ( (mu^_i - eta^_i)_+ + h_i (l_i - mu^_i) ) / p,

    ``R^_p = mean psi``, ``se = sd(psi) / sqrt(N)`` and ``CI = R^_p -/+ z_{1-a/2} se``
    (asymptotically normal, Theorem 1 of the paper). ``mu^`` does not depend on ``p`` and is fitted
    once for a whole grid of ``p``.

    Parameters
    ----------
    losses : array-like of shape (n,)
        Per-sample losses (finite). For the 0-1 loss, worst-case accuracy is ``1 - R_p``.
    W : array-like, Series or DataFrame with n rows
        Mutable variables whose conditional distribution given ``Z`` may shift. Categorical
        columns are handled as in :func:`worst_subpopulation`. Constant columns are dropped with
        a warning; an error if none is left (nothing could shift).
    Z : array-like, Series, DataFrame or None
        Immutable variables whose distribution is kept. None (or only constant columns, dropped
        with a warning) means ``Z`` is empty: ``R_p`` is then ``CVaR_p(mu0(W))``, the
        worst-case subpopulation risk of attribute ``W``.
    p : float or array-like of float in (0, 1]
        Fraction(s) of the population kept; a grid is sorted and de-duplicated.
    folds : int or array-like of labels, default 10
        Number of cross-fitting folds (the paper used 10), or a fold label per row.
    regressor : estimator or callable, optional
        Regressor for ``mu0`` on the columns ``[W, Z]`` (cloned per fold), or a callable
        ``mu(W, Z) -> array`` giving the known ``mu0`` (called once on all rows; ``Z`` may be
        None). Default: the HistGradientBoosting regressor of :func:`worst_subpopulation`.
    quantile_regressor : estimator or callable, optional
        Pinball-loss regressor of ``mu^`` on ``Z``, with a ``quantile`` parameter (set to
        ``1 - p`` for each ``p``), or a callable ``eta(Z, level) -> array`` giving the known
        conditional quantile. Default: ``HistGradientBoostingRegressor(loss="quantile",
        max_iter=100, learning_rate=0.1, max_leaf_nodes=15, min_samples_leaf=20,
        early_stopping=False)``. Unused when ``Z`` is empty (``eta`` is then the empirical
        quantile).
    discrete_eps : float >= 0, optional
        Width ``eps`` of the noise ``u_i ~ U(0, eps)`` added to ``mu^`` in the quantile fit, in
        ``h`` and in ``(.)_+`` (Algorithm 2 of the paper), which breaks the ties of a discrete
        ``W``; the target becomes ``R_{p,eps}`` in ``[R_p, R_p + eps]``. None: ``1e-5`` times
        the loss range when every ``W`` column is discrete (categorical, bool, or at most
        ``min(20, n/5)`` distinct values), else 0. 0 disables.
    level : float in (0, 1), default 0.95
        Confidence level.
    inner_split : bool, default False
        If True, the quantile regression of fold ``k`` uses out-of-fold predictions of ``mu``
        (a 2-fold split inside the training folds) instead of the in-sample ``mu^_k``, which
        matters for regressors that interpolate their training losses (e.g. deep forests).
    random_state : None, int, numpy Generator or RandomState
        Seeds the folds, the noise ``u`` and the default regressors.
    progress : None, True or False
        A progress bar on stderr over the regressor fits (None: only when stderr is a
        terminal).

    Returns
    -------
    ConditionalShiftResult
    """
    l = _loss_vector(losses)
    n = l.shape[0]
    grid, scalar = _check_p(p, allow_none=False)
    level = check_scalar(level, "level", low=0.0, high=1.0, low_inclusive=False,
                         high_inclusive=False)
    kind_mu = _check_learner(regressor, "regressor")
    kind_q = _check_learner(quantile_regressor, "quantile_regressor")
    rng = check_random_state(random_state)
    show = check_progress(progress)
    if W is None:
        raise ValidationError("W is required: the mutable variables whose distribution shifts")
    encW = _encode(W, "W", n)
    if encW.width == 0:
        raise ValidationError("W has only constant columns: nothing can shift")
    if Z is None:
        encZ = _Encoded(np.empty((n, 0)), np.zeros(0, dtype=bool), np.empty((n, 0)), [], [],
                        True)
    else:
        encZ = _encode(Z, "Z", n)
        if encZ.width == 0:
            warnings.warn("Z has only constant columns: treating Z as empty (a joint shift of W)",
                          UserWarning, stacklevel=2)
    z_empty = encZ.width == 0
    if discrete_eps is None:
        rng_l = float(l.max() - l.min())
        eps = 1e-5 * (rng_l if rng_l > 0 else 1.0) if encW.discrete else 0.0
    else:
        eps = _loss_unit_scalar(discrete_eps, "discrete_eps")
    if not isinstance(inner_split, (bool, np.bool_)):
        raise InputTypeError(f"inner_split must be a bool, got {type(inner_split).__name__}")

    fold = _fold_ids(n, folds, rng, "folds")
    K = int(fold.max()) + 1
    seed = int(rng.integers(0, 2**31 - 1))
    u = np.asarray(rng.uniform(0.0, eps, size=n)) if eps > 0 else np.zeros(n)

    total = (0 if kind_mu == "callable" else K) + K * int(np.sum(grid < 1.0))
    with progress_bar(total, "conditional_shift", show) as bar:
        # ---- mu: cross-fitted predictions and, per fold, the targets of the quantile fit
        mu = np.empty(n)
        train_targets: list[np.ndarray] = []
        fitted: list = []
        if kind_mu == "callable":
            mu_all = _predictions(regressor(W, Z), "regressor(W, Z)", n)
            mu[:] = mu_all
            for k in range(K):
                train_targets.append(mu_all[fold != k])
            fitted = [regressor]
        else:
            if kind_mu == "default":
                Xmu = np.column_stack([encW.native, encZ.native])
                base = _default_regressor(np.concatenate([encW.categorical,
                                                          encZ.categorical]), seed)
            else:
                Xmu = np.column_stack([encW.onehot, encZ.onehot])
                base = regressor
            for k in range(K):
                te, tr = fold == k, fold != k
                est = _clone(base).fit(Xmu[tr], l[tr])
                bar.update()
                mu[te] = _predictions(est.predict(Xmu[te]), "regressor.predict", int(te.sum()))
                fitted.append(est)
                if inner_split:
                    tr_idx = np.flatnonzero(tr)
                    half = rng.permutation(tr_idx.size) % 2 == 0
                    tgt = np.empty(tr_idx.size)
                    for a, b in ((half, ~half), (~half, half)):
                        e2 = _clone(base).fit(Xmu[tr_idx[a]], l[tr_idx[a]])
                        tgt[b] = e2.predict(Xmu[tr_idx[b]])
                    train_targets.append(_predictions(tgt, "regressor.predict", tr_idx.size))
                else:
                    train_targets.append(_predictions(est.predict(Xmu[tr]), "regressor.predict",
                                                      int(tr.sum())))

        # ---- per p: eta, selector, psi
        Xq = encZ.native if kind_q == "default" else encZ.onehot
        z_crit = float(_norm_ppf(0.5 + level / 2))
        etas = np.empty((n, grid.size))
        sel = np.zeros((n, grid.size), dtype=bool)
        psis = np.empty((n, grid.size))
        jpsis = np.empty((n, grid.size))
        for j, pp in enumerate(grid):
            if pp >= 1.0:
                # R_1 = E[loss]: every row is selected and psi_i = l_i; eta is not identified.
                etas[:, j] = np.nan
                sel[:, j] = True
                psis[:, j] = l
                jpsis[:, j] = l
                continue
            q = 1.0 - pp
            eta_j = np.empty(n)
            jeta = np.empty(n)
            qfit = None
            if kind_q == "callable" and not z_empty:
                qfit = _predictions(quantile_regressor(Z, q), "quantile_regressor(Z, level)", n)
            for k in range(K):
                te, tr = fold == k, fold != k
                target = train_targets[k] + u[tr]
                jeta[te] = _lower_quantile(target, q)
                if z_empty:
                    eta_j[te] = jeta[te]
                elif qfit is not None:
                    eta_j[te] = qfit[te]
                else:
                    if kind_q == "default":
                        qest = _default_quantile_regressor(encZ.categorical, seed)
                        qest.set_params(quantile=q)
                    else:
                        qest = _with_quantile(quantile_regressor, q)
                    qest.fit(Xq[tr], target)
                    eta_j[te] = _predictions(qest.predict(Xq[te]), "quantile_regressor.predict",
                                             int(te.sum()))
                bar.update()
            psis[:, j], sel[:, j] = _dml_score(l, mu, u, eta_j, pp)
            jpsis[:, j], _ = _dml_score(l, mu, u, jeta, pp)
            etas[:, j] = eta_j

    R = psis.mean(axis=0)
    se = psis.std(axis=0) / math.sqrt(n)
    JR = jpsis.mean(axis=0)
    Jse = jpsis.std(axis=0) / math.sqrt(n)
    common = dict(
        mean_loss=float(np.mean(l)), level=level, n=n, folds=K, discrete_eps=float(eps),
        inner_split=bool(inner_split), w_columns=list(encW.names), z_columns=list(encZ.names),
        columns_dropped=list(encW.dropped) + list(encZ.dropped), mu=mu, fold=fold,
        regressors=fitted,
    )
    if scalar:
        r, s = float(R[0]), float(se[0])
        return ConditionalShiftResult(
            value=r, se=s, ci=(r - z_crit * s, r + z_crit * s), p=float(grid[0]), curve=None,
            eta=etas[:, 0], selector=sel[:, 0], joint_value=float(JR[0]),
            joint_se=float(Jse[0]), psi=psis[:, 0], **common)
    curve = pd.DataFrame({"p": grid, "R_p": R, "se": se, "ci_lower": R - z_crit * se,
                          "ci_upper": R + z_crit * se, "joint": JR, "joint_se": Jse})
    return ConditionalShiftResult(
        value=None, se=None, ci=None, p=grid, curve=curve, eta=etas, selector=sel,
        joint_value=None, joint_se=None, psi=psis, **common)


def _dml_score(l, mu, u, eta, p) -> tuple[np.ndarray, np.ndarray]:
    """``psi_i = eta_i + ((mu_i + u_i - eta_i)_+ + h_i (l_i - mu_i)) / p``, ``h_i = 1[mu_i + u_i
    > eta_i]``."""
    mu_u = mu + u
    h = mu_u > eta
    psi = eta + (np.maximum(mu_u - eta, 0.0) + h * (l - mu)) / p
    return psi, h


def _norm_ppf(q: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(q))


# ------------------------------------------------------------------------------------------
# convenience forms taking (model, X, y, loss)
# ------------------------------------------------------------------------------------------


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


@renamed_kwargs(delta=("level", _one_minus))
def worst_subpopulation_of_model(model, X, y, *, loss, Z=None, p=None, threshold=None,
                                 regressor=None, cv: int = 2, level: float = 0.95, bound=None,
                                 approx_error: float = 0.0, random_state=None,
                                 progress=None) -> WorstCaseResult:
    """:func:`worst_subpopulation` of ``model``'s per-sample ``loss`` on held-out ``(X, y)``.

    Losses come from :func:`otstab.models.per_sample_losses`. ``Z`` defaults to all columns of
    ``X``; with a DataFrame ``X`` it may be a column name or a list of names. For the 0-1 loss
    ``bound`` defaults to 1 (its known range, so the band is a guarantee). The other
    arguments are those of :func:`worst_subpopulation`.
    """
    losses = _model_losses(model, X, y, loss)
    Zv = X if Z is None else _columns_of(X, Z, "Z")
    if bound is None and isinstance(get_loss(loss), ZeroOne):
        bound = 1.0  # the 0-1 loss lies in [0, 1]: a known range, so a guarantee
    return worst_subpopulation(losses, Zv, p=p, threshold=threshold, regressor=regressor,
                               cv=cv, level=level, bound=bound, approx_error=approx_error,
                               random_state=random_state, progress=progress)


def conditional_shift_of_model(model, X, y, *, loss, W, Z, p, folds=10, regressor=None,
                               quantile_regressor=None, discrete_eps=None,
                               level: float = 0.95, inner_split: bool = False,
                               random_state=None, progress=None) -> ConditionalShiftResult:
    """:func:`conditional_shift` of ``model``'s per-sample ``loss`` on held-out ``(X, y)``.

    ``W`` and ``Z`` may be column names (or lists of names) of a DataFrame ``X``, or arrays.
    The other arguments are those of :func:`conditional_shift`.
    """
    losses = _model_losses(model, X, y, loss)
    return conditional_shift(losses, _columns_of(X, W, "W"), _columns_of(X, Z, "Z"), p=p,
                             folds=folds, regressor=regressor,
                             quantile_regressor=quantile_regressor, discrete_eps=discrete_eps,
                             level=level, inner_split=inner_split, random_state=random_state,
                             progress=progress)


# ------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------


def _plot_band(ax, df, col: str, band_cols: tuple[str, str], other_col: str, *, band: str,
               curve: str, point: str, other: str):
    """``df[col]`` against ``df["p"]`` with its band ``df[band_cols]`` (NaN: not drawn) and
    ``df[other_col]`` for comparison; a single p is drawn as a point with error bars."""
    # float arrays: a column holding None is of object dtype, which matplotlib < 3.8 refuses
    p, v = df["p"].to_numpy(float), df[col].to_numpy(float)
    lo, hi = df[band_cols[0]].to_numpy(float), df[band_cols[1]].to_numpy(float)
    if len(df) > 1:
        ax.fill_between(p, lo, hi, alpha=0.2, label=band)
        ax.plot(p, v, label=curve)
        ax.plot(p, df[other_col].to_numpy(float), "--", label=other)
    else:
        ax.errorbar(p, v, yerr=[v - lo, hi - v], fmt="o", capsize=3, label=point)
        ax.plot(p, df[other_col], "x", label=other)


def plot_worst_case(result: WorstCaseResult, ax=None):
    """Plot the estimated ``W_p`` against ``p`` with the dimension-free band (not drawn where
    it is vacuous), the raw-loss CVaR and, when a threshold was given, the threshold, the
    estimated ``p_star`` and, when certified, the guaranteed ``p_star_upper``. Returns the
    matplotlib Axes."""
    import matplotlib.pyplot as plt

    if not isinstance(result, WorstCaseResult):
        raise InputTypeError(f"result must be a WorstCaseResult, got {type(result).__name__}")
    if ax is None:
        _, ax = plt.subplots()
    kind = "guaranteed" if result.loss_bound_source == "given" else "plug-in"
    band = f"{_pct(result.level)} {kind} band (dimension-free)"
    if result.vacuous_note:
        band += ", vacuous where not drawn"
    _plot_band(ax, result.to_frame(), "W_p", ("lower", "upper"), "raw_cvar", band=band,
               curve="W_p estimate (worst-case subpopulation)", point="W_p estimate",
               other="CVaR_p of raw losses")
    if result.threshold is not None:
        ax.axhline(result.threshold, color="grey", lw=0.8, ls=":", label="threshold")
        if result.estimate == "estimated":
            ax.axvline(result.p_star, color="C3", lw=0.8, ls="--",
                       label=f"estimated p* = {result.p_star:.3g} (not a guarantee)")
        if result.certificate == "certified":
            ax.axvline(result.p_star_upper, color="C2", lw=1.2,
                       label=f"certified p >= {result.p_star_upper:.3g} "
                             f"({_pct(result.level)})")
    ax.set_xlabel("subpopulation fraction p")
    ax.set_ylabel("worst-case risk")
    ax.legend()
    return ax


def plot_conditional_shift(result: ConditionalShiftResult, ax=None):
    """Plot ``R_p`` against ``p`` with its confidence band and the joint-shift value.
    Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if not isinstance(result, ConditionalShiftResult):
        raise InputTypeError(f"result must be a ConditionalShiftResult, "
                             f"got {type(result).__name__}")
    if ax is None:
        _, ax = plt.subplots()
    ci = f"{_pct(result.level)} asymptotic CI (not a guarantee)"
    _plot_band(ax, result.to_frame(), "R_p", ("ci_lower", "ci_upper"), "joint", band=ci,
               curve="R_p estimate (conditional shift)", point=f"R_p estimate, {ci}",
               other="joint shift of (W, Z), estimate")
    ax.set_xlabel("subpopulation fraction p")
    ax.set_ylabel("worst-case risk")
    ax.legend()
    return ax
