"""Conditional-shift stability (paper 001): the worst-case risk over shifts of Y given W
within subpopulations of mass p, estimated with cross-fitted nuisances (DML)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .._progress import check_progress, progress_bar
from .._results import ResultMixin
from .._stats import z_value
from .._validation import (
    check_random_state,
    check_scalar,
)
from ..errors import InputTypeError, ValidationError
from ._inputs import (
    _check_learner,
    _check_p,
    _clone,
    _columns_of,
    _default_quantile_regressor,
    _default_regressor,
    _encode,
    _Encoded,
    _fold_ids,
    _loss_unit_scalar,
    _loss_vector,
    _model_losses,
    _pct,
    _predictions,
)


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
        z_crit = z_value(level)
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
