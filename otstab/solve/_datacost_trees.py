"""``certify(tree pipeline, ..., loss="zero_one", cost=DataCost)``: tree ensembles under a cost
on the data's own variables (issue 28 item 3, issue 29).

The distances ``d*_i`` are searched in the raw variables (:mod:`otstab.solve._raw_trees`): a
certified lower bound ``dlow_i`` (the best-first branch and bound over raw boxes; exact when it
completes) and a found upper bound ``dup_i`` (a valid raw row the model misclassifies: a
single-variable line search, improved by every misclassified box the branch and bound meets).
The exact 0/1 dual on ``dup`` gives Q* and the upper end; on ``dlow`` the certified lower end
(:func:`otstab.bounds.zero_one_lower_value`, R being nondecreasing in every distance). When
every sample's search completed the answer is exact (``status = 'optimal'``). The audit
re-scores Q*'s raw rows with the Pipeline itself and re-prices them with the cost
(:func:`otstab.datacost_zero_one._raw_audit`): no solver output is trusted.

Supported final estimators: the tree classifiers of :func:`otstab.bounds.leaf_table`
(scikit-learn decision trees, random forests, extra trees, gradient boosting, histogram
gradient boosting; XGBoost, LightGBM, CatBoost).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from ..modeling import _trees as trees
from ..modeling._nonlinear import as_model_input, label_column
from . import _bounds as bounds
from ._datacost_linear import DataCostView, encode, predict
from ._datacost_zero_one import _raw_audit
from ._raw_trees import raw_table, raw_tree_distances
from ._refine import RTOL, ZeroOneDuals, check_rtol
from ._zero_one import _solve_and_build, demote_unproved, move_prices

__all__ = ["certify_datacost_trees", "is_tree_model", "TREE_OPTIONS"]

#: options of the search under a DataCost (as for the encoded tree bounds)
TREE_OPTIONS = ("max_nodes", "time_budget", "node_budget", "progress", "rtol")

_SK_TREES = {"DecisionTreeClassifier", "ExtraTreeClassifier", "RandomForestClassifier",
             "ExtraTreesClassifier", "GradientBoostingClassifier",
             "HistGradientBoostingClassifier"}


def final_estimator(model):
    return model.steps[-1][1] if getattr(model, "steps", None) else model


def is_tree_model(model) -> bool:
    """Whether ``model`` (or a Pipeline's last step) is a tree classifier this path reads."""
    final = final_estimator(model)
    return type(final).__name__ in _SK_TREES or trees.library(final) is not None


def _moved_frame(frame: pd.DataFrame, found) -> pd.DataFrame:
    """``frame`` with every found row's moved values written in (dtypes kept where they can
    be: an integer column stays integer when its moved values are integral)."""
    out = frame.copy()
    cols: dict = {}
    for i, mv in enumerate(found):
        if not mv:
            continue
        for name, val in mv.items():
            if name not in cols:
                cols[name] = out[name].astype(object).to_numpy().copy()
            cols[name][i] = val
    for name, vals in cols.items():
        col = frame[name]
        if col.dtype.kind in "iu":
            f = np.asarray(vals, dtype=np.float64)
            out[name] = f.astype(col.dtype) if np.all(f == np.round(f)) else f
        elif col.dtype.kind == "f":
            out[name] = np.asarray(vals, dtype=np.float64)
        elif isinstance(col.dtype, pd.CategoricalDtype):
            out[name] = pd.Categorical(vals, categories=col.dtype.categories,
                                       ordered=col.dtype.ordered)
        else:
            out[name] = pd.Series(vals, dtype=object)
    return out


def certify_datacost_trees(model, prob, rc, frame, *, r, theta1, theta2, divergence, solver,
                           t_start, **options):
    """The 0/1 certificate of a tree classifier (or a Pipeline ending in one) under a
    DataCost, its inputs prepared by :func:`otstab.datacost_certify.certify_datacost`."""
    final = final_estimator(model)
    classes = np.asarray(final.classes_)
    y0 = np.asarray(prob.y_original)
    yi = np.searchsorted(classes, y0)
    Z = np.asarray(prob.X, dtype=np.float64)
    loss0 = np.asarray(prob.losses(prob.X), dtype=np.float64)
    wrong0 = loss0 > 0
    n = prob.n
    dlow = np.zeros(n)
    dstar = np.zeros(n)
    found: list = [None] * n
    info = {"exact": np.ones(n, dtype=bool), "nodes": 0, "time": 0.0, "stopped": None,
            "node_budget": None}
    rows = np.flatnonzero(~wrong0)
    if rows.size and not math.isfinite(theta1):
        dstar[rows] = dlow[rows] = math.inf
    elif rows.size:
        sub = frame.iloc[rows].reset_index(drop=True)

        def enc(f):
            return encode(model, f)

        raw = raw_table(final, rc, frame, enc, Z)

        def wrong_fn(Zc, which):
            pred = label_column(final.predict(as_model_input(final, Zc)))
            return pred != classes[yi[rows[which]]]

        def decide_fn(k, moved):
            one = sub.iloc[[k]].reset_index(drop=True)
            one = _moved_frame(one, [moved])
            return bool(predict(model, one)[0] == y0[rows[k]])

        duals = ZeroOneDuals(loss0, r, theta1, theta2, divergence, prob.p)

        def sub_duals(d, rows=rows):
            full = np.zeros(n)
            full[rows] = d
            return duals(full)
        sub_duals.theta1 = theta1  # type: ignore[attr-defined]
        opts = dict(options)
        opts["rtol"] = check_rtol(opts.get("rtol", RTOL))
        lo, up, fnd, info_s = raw_tree_distances(raw, rc, sub, Z[rows], yi[rows], wrong_fn,
                                                 decide_fn, duals=sub_duals, **opts)
        dlow[rows], dstar[rows] = lo, up
        for k, i in enumerate(rows):
            found[i] = fnd[k]
        info = {**info_s, "exact": np.ones(n, dtype=bool)}
        info["exact"][rows] = info_s["exact"]
    exact = bool(np.all(info["exact"]))
    value_lower = 0.0 if exact else bounds.zero_one_lower_value(
        dlow, loss0, r, theta1, theta2, divergence, prob.p)
    res = raw_distances_result(model, prob, rc, frame, found, dstar, loss0, r, theta1, theta2,
                               divergence, solver, t_start, exact=exact,
                               value_lower=value_lower)
    method = "branch-and-bound over raw boxes (tree ensemble under a DataCost)"
    if info["stopped"] == "time_budget":
        method += (f"; the time budget stopped it after {info['node_budget']} boxes: "
                   f"node_budget={info['node_budget']} reproduces it on any machine")
    res.info["lower_bound"] = {**info, "method": method, "dlow": dlow}
    return finish_raw_bounds(
        res, prob, rc, t_start,
        "distances to misclassification under the DataCost: the found rows give the upper end "
        "(value_upper), the branch and bound over raw boxes proves the lower end (value_lower)")


def raw_distances_result(model, prob, rc, frame, moves, dist, loss0, r, theta1, theta2,
                         divergence, solver, t_start, *, exact, value_lower):
    """The 0/1 answer from found raw moves (``moves``, their costs ``dist``) of a model without
    an exact path (trees, networks): the exact dual on these distances, demoted to ``bounds``
    where they are not proved minimal (:func:`demote_unproved`), Q*'s raw rows re-scored by
    the model (:func:`_raw_audit`)."""
    res = _solve_and_build(move_prices(dist, theta1), loss0, r, theta1, theta2, divergence,
                           "dual" if solver == "dual" else "auto", None, None, None,
                           lambda Xm, ym: None, list(prob.feature_names), prob.index, t_start,
                           dist, exact=exact, value_lower=value_lower, p=prob.p)
    if not exact:
        demote_unproved(res, value_lower)
    _raw_audit(res, model, prob, rc, frame, _moved_frame(frame, moves))
    return res


def finish_raw_bounds(res, prob, rc, t_start, note):
    """The common end of the raw-row 0/1 paths of models without an exact one (trees,
    networks): the cost and its description, the sample weights, the note of a ``bounds``
    result (how each end was obtained) and the wall time."""
    res.info["cost"] = rc.to_dict()
    res.info["cost_description"] = rc.describe()
    if prob.weights is not None:
        res.info["sample_weight"] = prob.weights
    if res.status == "bounds":
        res.message = f"{res.message}; {note}" if res.message else note
    res.info["wall_time"] = time.perf_counter() - t_start
    assert isinstance(res.info.get("raw_view"), DataCostView)
    return res
