"""Worst-case subpopulation risk (paper 000): W_p, the largest mean loss over
subpopulations of mass at least p, with its dimension-free confidence band."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import numpy as np
import pandas as pd

from .._progress import check_progress, progress_bar
from .._results import ResultMixin
from .._validation import (
    check_probability,
    check_random_state,
    check_same_length,
    check_scalar,
    renamed_kwargs,
)
from ..errors import InputTypeError, ValidationError
from ..modeling._losses import ZeroOne, get_loss
from ._inputs import (
    _check_learner,
    _check_losses,
    _check_p,
    _clone,
    _columns_of,
    _cvar,
    _default_regressor,
    _encode,
    _first_crossing,
    _fold_ids,
    _fold_weights,
    _loss_unit_scalar,
    _model_losses,
    _pct,
    _predictions,
    _Tail,
)


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
