"""``certify``: the OT stability criterion R(beta, r) of a model on evaluation data.

Entry layer. Data flows one way: the user's model and data are validated and resolved to
arrays (:mod:`otstab.models`), one solving path runs (:mod:`otstab.piecewise`,
:mod:`otstab.zero_one`, :mod:`otstab.smooth`), a backend from ``otstab_solvers`` returns
``(h, alpha, value, status)``, and the certificate layer (:mod:`otstab.audit`) audits the most
sensitive distribution Q* built from it and decides the status.
"""

from __future__ import annotations

import functools
import math
import time

from ..errors import ValidationError
from ..modeling import _pipeline as pipeline
from ..modeling._costs import check_feature_costs, scaled_problem, unscale_result
from ..modeling._losses import Loss, MulticlassHinge, PiecewiseLinear, ZeroOne, get_loss
from ..modeling._models import resolve_model
from ..modeling._params import DIVERGENCES, SOLVERS, check_common
from ..modeling._reduction import feature_mask, reduce_problem
from ..modeling._threads import one_blas_thread
from . import _dask_path as dask_path
from . import _inference as inference
from ._datacost_certify import certify_datacost, choose_cost
from ._piecewise import reweighting_only_result, solve_reduced
from ._results import StabilityResult
from ._smooth import certify_smooth
from ._tree_smooth import certify_tree_smooth, tree_smooth_model
from ._zero_one import certify_distances, certify_zero_one_problem, certify_zero_one_search

__all__ = ["certify", "certify_distances", "check_common", "SOLVERS", "DIVERGENCES"]


def certify(model, X, y, *, loss: str | Loss, r: float, theta1: float = 1.0,
            theta2: float = 0.25, divergence: str = "kl", solver: str = "auto", features=None,
            se="analytic", feature_costs=None, sample_weight=None, cost=None,
            **solver_options) -> StabilityResult:
    """Compute the OT stability criterion R(beta, r) and the most sensitive distribution.

    Parameters
    ----------
    model : otstab.LinearModel, fitted scikit-learn linear model or Pipeline, or a model
        supported by :mod:`otstab.nonlinear`
    X : array-like or DataFrame, shape (n, d)
        Evaluation features (never modified).
    y : array-like, shape (n,)
        Labels in the model's own label set (``classes_``) or regression targets.
    loss : str or otstab.losses.Loss
        ``"hinge"``, ``"multiclass_hinge"``, ``"absolute"``, ``"zero_one"``, ``"logistic"``,
        ``"cross_entropy"``, ``"squared"``, ``otstab.losses.pinball(tau)``,
        ``otstab.losses.epsilon_insensitive(eps)`` or a ``PiecewiseLinear``.
    r : float >= 0
        Risk threshold (for 0/1 loss an error rate in [0, 1]).
    theta1 : float in (0, inf]
        Price of moving samples (data corruption); ``math.inf``: only reweighting.
    theta2 : float in (0, inf]
        Price of reweighting (sub-population shift); ``math.inf``: only moving samples.
    divergence : {"kl", "chi2"}
    solver : str
        ``"auto"`` (specialised dual when it applies, else the conic backends in the order
        Clarabel, MOSEK, ECOS, SCS; an inaccurate or failed status or a failed audit moves on to
        the next), ``"dual"``, ``"conic"`` (conic backends only, in that order), a named conic
        backend (``"clarabel"``, ``"mosek"``, ``"ecos"``, ``"scs"``), or ``"first_order"``.
    features : sequence of column names or indices, optional
        Only these features may move (the feature mask); default all. Names are the final
        estimator's input columns or, for a Pipeline, the raw columns of X (a raw column
        stands for all of its encoded columns, e.g. a one-hot block; :mod:`otstab.pipeline`).
    feature_costs : dict {name or index: price} or sequence of d prices, optional
        Per-feature move prices ``c_j`` in ``(0, inf]``: moving costs
        ``theta1 sum_j c_j (x*_j - x_j)^2``; ``inf`` makes a feature immutable (every model
        and path; see :mod:`otstab.costs`). Keys as in ``features``: a Pipeline's raw column
        is priced per unit of the raw variable (a one-hot block: each indicator). Default:
        every price 1.
    sample_weight : array-like of shape (n,), optional
        Nonnegative weights of the evaluation rows (survey weights): P0 is the weighted
        empirical distribution ``sum_i p_i delta_{z_i}`` with ``p = sample_weight / sum``.
        Every path takes it (the specialised dual, the conic backends, the exact smooth and
        0/1 paths, the perturbation search, the first-order path) and both SEs: the analytic
        one is the weighted influence function, the bootstrap resamples rows with their
        weights. With Dask input the weights may be a Dask array or Series aligned with X's
        rows (gathered on the gathered path, kept on the workers on the distributed one).
        Equal weights are the unweighted problem.
    cost : None (default), "encoded", "auto", otstab.DataCost or its ``to_dict()``
        The transport cost. ``"encoded"``: the squared distance in the final estimator's
        input space (the paper's cost). ``"auto"`` or a ``DataCost``: a cost on the data's own
        variables, with Q* made of valid raw rows (:mod:`otstab.datacost`); exact for the 0/1
        loss of linear classifiers and the hinge and logistic losses of binary ones (and
        Pipelines ending in them: :mod:`otstab.datacost_zero_one`,
        :mod:`otstab.datacost_hinge`, :mod:`otstab.datacost_smooth`). For the 0/1 loss of
        tree classifiers (scikit-learn, XGBoost, LightGBM, CatBoost) under a DataCost: a
        certified interval from leaf boxes rewritten in the raw variables
        (:mod:`otstab.solve._datacost_trees`), exact when every search completes; for the
        logistic / cross-entropy loss of boosted ensembles the same boxes give a certified
        interval of the smooth loss (:mod:`otstab.solve._datacost_tree_smooth`). None:
        ``"auto"`` when a Pipeline with encoders (OneHotEncoder, OrdinalEncoder) gets a raw
        DataFrame and those paths answer its final estimator and the loss (linear models;
        tree classifiers with the 0/1 loss and boosted ensembles with the logistic /
        cross-entropy loss, where the encoded cost collapses: a fraction of a one-hot
        indicator crosses a split), else ``"encoded"``; ``res.info["cost_used"]``
        (and the summary) says which cost was used and why
        (:func:`otstab.datacost_certify.choose_cost`).
    se : "analytic" (default), "bootstrap", ``otstab.inference.Bootstrap(n_resamples,
        random_state, interval, progress)`` or None
        Sampling uncertainty of R (``res.se``, ``res.ci(level)``,
        ``res.lower_confidence_bound(level)``; ``docs/inference.md``): the influence-function
        SE (computed on first access, one pass over Q*'s weights) or a bootstrap over the
        evaluation rows (run now, re-solving per replicate).
    **solver_options
        Passed to the backend (e.g. ``max_iter`` for Clarabel). The certified tree bounds of
        the 0/1 loss take ``max_nodes``, ``node_budget``, ``time_budget``, ``progress`` and
        ``rtol`` (default 0.01: stop refining once ``value_lower >= (1 - rtol) value_upper``;
        None: every sample gets ``max_nodes`` boxes; docs/bounds.md).

    Returns
    -------
    StabilityResult
        Audited by :mod:`otstab.audit`: ``status`` is ``optimal`` (exact), ``bounds`` (not
        exact: ``value_lower <= R <= value_upper``), ``zero`` or ``unreachable``; an answer
        that fails its audit is never returned (:class:`otstab.errors.SolverError`).
    """
    t_start = time.perf_counter()
    r, theta1, theta2, divergence = check_common(r, theta1, theta2, divergence, solver)
    solver = solver.lower()
    loss_obj = get_loss(loss)
    data_cost, how = choose_cost(cost, model, X, loss_obj, features=features,
                                 feature_costs=feature_costs, solver=solver,
                                 options=tuple(solver_options))
    if data_cost is not None:  # a cost on the raw variables (otstab.datacost_certify)
        res = certify_datacost(model, X, y, loss=loss_obj, r=r, theta1=theta1, theta2=theta2,
                               divergence=divergence, solver=solver, features=features, se=se,
                               feature_costs=feature_costs, sample_weight=sample_weight,
                               t_start=t_start, cost=data_cost, **solver_options)
        res.info["cost_used"] = how
        return res
    res = _certify_encoded(model, X, y, loss_obj, r, theta1, theta2, divergence, solver,
                           features, se, feature_costs, sample_weight, t_start,
                           **solver_options)
    res.info["cost_used"] = how
    return res


def _certify_encoded(model, X, y, loss_obj, r, theta1, theta2, divergence, solver, features,
                     se, feature_costs, sample_weight, t_start, **solver_options):
    """``certify`` under the encoded cost (the paper's)."""
    if dask_path.wants_distributed(X, loss_obj, model) and feature_costs is None \
            and se in ("analytic", None) and solver in ("auto", "dual"):
        # Dask data beyond DISTRIBUTED_MIN_ROWS rows: the scores stay on the workers and the
        # dual's sums run blockwise (otstab.dask_path; docs/scale.md)
        try:
            res = dask_path.certify_distributed(
                model, X, y, loss=loss_obj, r=r, theta1=theta1, theta2=theta2,
                divergence=divergence, solver=solver, features=features,
                sample_weight=sample_weight, **solver_options)
        except dask_path.NotDistributed:
            pass  # an edge the distributed path leaves to the gathered scores
        else:
            if se is None:
                res.inference = None
            res.info["wall_time"] = time.perf_counter() - t_start  # the whole call
            return res
    prob = resolve_model(model, X, y, loss=loss_obj, sample_weight=sample_weight)
    if isinstance(loss_obj, ZeroOne) and r > 1.0:
        raise ValidationError(
            f"r is an error rate for loss='zero_one' and must be in [0, 1], got {r}")
    features = pipeline.expand_features(model, features, prob.feature_names)
    mask = feature_mask(prob.d, features, prob.feature_names)
    spec = inference.resolve_se(se)
    costs = check_feature_costs(feature_costs, prob.feature_names, model)
    original = prob
    if costs is not None:  # a diagonal metric: solve in x~ = sqrt(c) x (otstab.costs)
        prob, mask = scaled_problem(prob, costs, mask)
    res = _solve(prob, loss_obj, r, theta1, theta2, divergence, solver, mask, t_start,
                 **solver_options)
    if costs is not None:
        unscale_result(res, prob, original, costs)
    if prob.weights is not None:
        res.info["sample_weight"] = prob.weights
    # raw units for res.to_frame(raw=True): built on first use (a copy of the raw rows)
    builder = _raw_view_builder(model, X, prob.feature_names)
    if builder is not None:
        res.info["raw_view"] = builder
    if spec == "analytic":
        # built on first access (a lazy property of StabilityResult)
        res.inference = lambda: inference.analytic(res)  # type: ignore[assignment]
    elif spec is not None:
        value = inference.replicator(prob, r=r, theta1=theta1, theta2=theta2,
                                     divergence=divergence, mask=mask, solver=solver,
                                     **solver_options)
        res.inference = inference.bootstrap(res, inference.resample(prob.n, spec, value), spec)
    # the whole call (validation, search, lower bounds, audit, bootstrap), not only the solver
    res.info["wall_time"] = time.perf_counter() - t_start
    return res


def _raw_view_builder(model, X, names):
    """For a Pipeline, a picklable builder of the result's :class:`otstab.pipeline.RawView`
    (``res.to_frame(raw=True)``); the raw rows are copied now so that later changes to the
    caller's X cannot reach the result. None for other models (their raw columns are
    ``res.X``)."""
    if not getattr(model, "steps", None):
        return None
    X = X.copy() if hasattr(X, "copy") else X
    return functools.partial(pipeline.raw_view, model, X, names)


def _solve(prob, loss_obj, r, theta1, theta2, divergence, solver, mask, t_start,
           **solver_options) -> StabilityResult:
    """The solving path of ``prob`` (0/1, smooth or piecewise-linear). A linear model's paths
    work on its scores, in blocks of a few thousand numbers: BLAS runs them on one thread
    (:mod:`otstab.threads`); the first-order path and nonlinear models keep BLAS's threads."""
    if prob.scorer is None or solver == "first_order":
        return _dispatch(prob, loss_obj, r, theta1, theta2, divergence, solver, mask, t_start,
                         **solver_options)
    with one_blas_thread():
        return _dispatch(prob, loss_obj, r, theta1, theta2, divergence, solver, mask, t_start,
                         **solver_options)


def _dispatch(prob, loss_obj, r, theta1, theta2, divergence, solver, mask, t_start,
              **solver_options) -> StabilityResult:
    if prob.scorer is None and math.isinf(theta1):
        # nothing moves: the model is only evaluated at the data, and the reweighting dual
        # of its own losses is exact (no search, no bounds)
        return reweighting_only_result(prob, r, theta1, theta2, divergence, t_start)
    if isinstance(loss_obj, ZeroOne):
        if prob.scorer is not None and solver != "first_order":
            return certify_zero_one_problem(prob, r, theta1, theta2, divergence, mask, solver,
                                            t_start, **solver_options)
        return certify_zero_one_search(prob, r=r, theta1=theta1, theta2=theta2,
                                       divergence=divergence, mask=mask, solver=solver,
                                       **solver_options)
    if solver != "first_order" and tree_smooth_model(prob) is not None:
        # logistic / cross-entropy of a boosted tree ensemble (otstab/solve/_tree_smooth.py)
        return certify_tree_smooth(prob, r=r, theta1=theta1, theta2=theta2,
                                   divergence=divergence, mask=mask, solver=solver,
                                   **solver_options)
    if prob.scorer is None or not isinstance(loss_obj, (PiecewiseLinear, MulticlassHinge)) \
            or solver == "first_order":
        return certify_smooth(prob, r=r, theta1=theta1, theta2=theta2,
                              divergence=divergence, mask=mask, solver=solver,
                              **solver_options)
    red = reduce_problem(prob, theta1, mask)
    return solve_reduced(prob, red, r, theta1, theta2, divergence, solver, t_start,
                         **solver_options)
