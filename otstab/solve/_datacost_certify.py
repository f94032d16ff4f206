"""``certify(..., cost=DataCost)``: the checks and the preparation shared by the exact
DataCost certificates of linear classifiers, then the loss's own path
(:mod:`otstab.datacost_zero_one` for ``loss="zero_one"``, :mod:`otstab.datacost_hinge` for
``loss="hinge"``, :mod:`otstab.datacost_smooth` for ``loss="logistic"``,
:mod:`otstab.solve._datacost_cross_entropy` for the multiclass cross-entropy (a certified
interval); their shared linear pieces: :mod:`otstab.datacost_linear`). Tree classifiers take
:mod:`otstab.solve._datacost_trees` (0/1) or, boosted ensembles with the logistic /
cross-entropy loss, :mod:`otstab.solve._datacost_tree_smooth`; MLPs
:mod:`otstab.solve._datacost_networks` (certified intervals).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from otstab_solvers.zero_one import DistanceOracle

from ..errors import ValidationError
from ..modeling import _pipeline as pipeline
from ..modeling._datacost import DataCost, as_cost
from ..modeling._losses import PiecewiseLinear, SmoothLoss, ZeroOne
from ..modeling._models import resolve_model
from ..modeling._params import check_options
from ..modeling._tree_margins import has_margins
from . import _datacost_inference as datacost_inference
from . import _inference as inference
from ._datacost_cross_entropy import FiniteOracle, certify_datacost_cross_entropy
from ._datacost_hinge import HingeOracle, certify_datacost_hinge
from ._datacost_linear import flip_problem, linear_parts, raw_frame, selected_variables
from ._datacost_networks import certify_datacost_network, is_network_model
from ._datacost_smooth import LogisticOracle, certify_datacost_logistic
from ._datacost_tree_smooth import certify_datacost_tree_smooth
from ._datacost_trees import TREE_OPTIONS, certify_datacost_trees, final_estimator, is_tree_model
from ._datacost_zero_one import certify_datacost_zero_one, zero_one_distances
from ._zero_one import move_prices

__all__ = ["certify_datacost", "prepare", "loss_oracle", "loss_kind", "dro_oracle",
           "choose_cost", "ENCODERS"]

#: options of the network path under a DataCost (the certified side's time budget)
NETWORK_OPTIONS = ("time_budget",)
#: preprocessing steps that make a Pipeline's raw variables categorical or ordinal
ENCODERS = ("categorical", "ordinal")


def _has_encoders(model) -> bool:
    """Whether a Pipeline's preprocessing one-hot or ordinal encodes some raw variable."""
    try:
        names = [str(c) for c in model[:-1].get_feature_names_out()]
    except Exception:  # noqa: BLE001 - preprocessing without feature names: no raw map
        return False
    rmap = pipeline.raw_map(model, names)
    return rmap is not None and any(v.kind in ENCODERS for v in rmap.variables)


def _supported(model, loss, trees_too=True) -> bool:
    """Whether the DataCost paths answer this Pipeline's final estimator and loss as well as
    the encoded cost does: exactly (linear models), or, for tree classifiers and the 0/1 loss
    or boosted ensembles and the logistic / cross-entropy loss (``trees_too``), with a
    certified interval on valid raw rows (module docs of :mod:`._datacost_trees` and
    :mod:`._datacost_tree_smooth`)."""
    try:
        kind = loss_kind(loss)
    except ValidationError:
        return False
    if trees_too and is_tree_model(model):
        return kind == "zero_one" or (kind == "logistic" and has_margins(final_estimator(model)))
    est = model.steps[-1][1]
    classes = getattr(est, "classes_", None)
    if getattr(est, "coef_", None) is None or classes is None:
        return False
    return kind == "zero_one" or len(classes) == 2


def choose_cost(cost, model, X, loss, *, features=None, feature_costs=None, solver="auto",
                options=(), trees_too=True) -> tuple[DataCost | None, str]:
    """``(cost, how)``: the cost a call uses and how it was chosen. ``cost=None`` (the
    default) is ``"auto"`` when a Pipeline with encoders (OneHotEncoder, OrdinalEncoder) gets
    a raw DataFrame and the DataCost paths answer its final estimator and the loss (exactly
    for linear models; tree classifiers with the 0/1 loss, unless ``trees_too`` is False,
    with a certified interval), and the encoded cost otherwise (also when the call asks for
    something only the encoded cost has: ``feature_costs``, encoded column names in
    ``features``, a conic or first-order ``solver``, solver options other than the tree
    search's); ``"encoded"``, ``"auto"``, a ``DataCost`` or a dict are taken as given
    (:func:`otstab.datacost.as_cost`)."""
    if cost is not None:
        dc = as_cost(cost)
        return dc, ("encoded (given)" if dc is None else "DataCost (given)")
    piped = bool(getattr(model, "steps", None)) and len(model.steps) > 1
    if not (piped and isinstance(X, pd.DataFrame) and _has_encoders(model)):
        return None, "encoded (default)"
    if not _supported(model, loss, trees_too):
        if is_tree_model(model):
            how = ("encoded (default: a cost on the data's own variables answers tree "
                   "classifiers with loss='zero_one', and boosted ensembles with "
                   "loss='logistic' / 'cross_entropy', in certify and its sweeps in this "
                   "version; under the encoded "
                   "cost a tree's split on a one-hot indicator is crossed by a fractional move "
                   "(LightGBM splits them at about 1e-35), so R can be vanishingly small and "
                   "say nothing about rows that could exist: certify(..., loss='zero_one') "
                   "gives a certified interval on the data's own variables)")
            warnings.warn(f"transport cost {how}", UserWarning, stacklevel=3)
            return None, how
        return None, ("encoded (default: cost='auto' is the default only where it is exact "
                      "(linear models) or, for tree classifiers with the 0/1 loss, a tight "
                      "certified interval; with the 0/1 loss, MLP pipelines take cost='auto' "
                      "for a certified interval on the data's own variables, where the "
                      "encoded cost moves one-hot indicators by fractions)")
    raw = set(map(str, X.columns))
    named = [] if features is None else list(np.atleast_1d(np.asarray(features, dtype=object)))
    allowed = TREE_OPTIONS if trees_too and is_tree_model(model) else ()
    if feature_costs is not None or any(not isinstance(f, str) or f not in raw
                                        for f in named) \
            or str(solver).lower() not in ("auto", "dual", "closed_form") \
            or not set(options) <= set(allowed):
        return None, ("encoded (default: the call's feature_costs, encoded features, solver "
                      "or solver options belong to the encoded cost)")
    return DataCost(), ("auto (default for a Pipeline with encoders on a raw DataFrame: a "
                        "DataCost on the data's own variables; cost='encoded' for the paper's "
                        "cost)")


def loss_kind(loss) -> str:
    """``"zero_one"``, ``"hinge"`` or ``"logistic"`` (also ``cross_entropy``): the losses with
    an exact path under a DataCost; any other is refused."""
    if isinstance(loss, ZeroOne):
        return "zero_one"
    if isinstance(loss, PiecewiseLinear) and loss.name == "hinge":
        return "hinge"
    if isinstance(loss, SmoothLoss) and loss.name in ("logistic", "cross_entropy"):
        return "logistic"
    raise ValidationError(
        f"cost=DataCost is exact for loss='zero_one', 'hinge', 'logistic' and "
        f"'cross_entropy' (binary; multiclass: a certified interval) of linear models in this "
        f"version; loss={loss.name!r} needs cost='encoded'")


def dro_oracle(model, X, y, *, loss, cost: DataCost, theta1, features=None,
               sample_weight=None):
    """``(prob, oracle, slopes)`` for :func:`otstab.worst_case_risk` under the cost: the exact
    d-transform oracle of every sample (the 0/1 distances' oracle, or the hinge / logistic
    one) and the limits ``l_h / h`` (None: unbounded)."""
    kind = loss_kind(loss)
    prob, rc, parts, frame = prepare(model, X, y, loss=loss, cost=cost, features=features,
                                     sample_weight=sample_weight)
    if kind == "zero_one":
        wrong = np.asarray(prob.losses(prob.X)) > 0
        dstar = np.zeros(prob.n)
        rows = np.flatnonzero(~wrong)
        if rows.size and math.isfinite(theta1):
            dstar[rows] = zero_one_distances(prob, rc, parts, frame, rows)
        elif rows.size:
            dstar[rows] = math.inf
        a = move_prices(dstar, theta1)
        return prob, DistanceOracle(a), np.isfinite(a).astype(float)
    if prob.scorer.task != "binary":
        raise ValidationError(f"loss={loss.name!r} with cost=DataCost needs a binary classifier")
    make, _, slopes = loss_oracle(prob, rc, parts, frame, loss=loss, theta1=theta1)
    return prob, make(), slopes


def prepare(model, X, y, *, loss, cost: DataCost, features=None, sample_weight=None):
    """``(prob, rc, parts, frame)``: the resolved model and data, the cost resolved on the raw
    rows (``features``: only these raw variables may move, the others made immutable), each
    variable's part of the linear scores and the raw rows."""
    prob = resolve_model(model, X, y, loss=loss, sample_weight=sample_weight)
    if prob.scorer is None or prob.scorer.task not in ("binary", "multiclass"):
        raise ValidationError(
            "cost=DataCost is exact for linear classifiers (a Pipeline ending in one) in this "
            "version; use cost='encoded' for other models")
    frame, cost = _restrict(raw_frame(model, X, prob), cost, features)
    rc = cost.resolve(model, frame, prob.feature_names)
    parts = linear_parts(model, prob, rc, frame)
    return prob, rc, parts, frame


def loss_oracle(prob, rc, parts, frame, *, loss, theta1):
    """``(make, loss0, slopes)`` of the hinge or logistic loss under the cost: ``make(idx)``
    is the d-transform oracle of the rows ``idx`` (None: all), ``loss0`` the losses at the
    data and ``slopes`` the limits ``l_h / h`` as h grows (the largest loss a sample can
    reach; None when some sample's loss is unbounded)."""
    n = prob.n
    y = prob.y.astype(np.float64)
    fin, ints, conts, _ = flip_problem(rc, parts, frame, -y[:, None], np.arange(n))
    # the largest gain of each sample: its best option per variable
    top = np.zeros(n)
    for G, C in fin:
        top += np.maximum(np.where(np.isfinite(C), G, -np.inf).max(axis=1, initial=0.0), 0.0)
    for a, _q, K in ints:
        with np.errstate(invalid="ignore"):
            top += np.where(a > 0, a * K, 0.0)
    for _Q, U in conts:
        top += U
    if isinstance(loss, SmoothLoss):
        z = -y * prob.scores

        def make(idx=None):
            idx = np.arange(n) if idx is None else idx
            return LogisticOracle(z[idx], *datacost_inference.subset_options(fin, ints, conts,
                                                                              idx), theta1)
        loss0 = np.logaddexp(0.0, z)
        reach = np.logaddexp(0.0, z + top)
    else:
        mprime = 1.0 - y * prob.scores

        def make(idx=None):
            idx = np.arange(n) if idx is None else idx
            return HingeOracle(mprime[idx], *datacost_inference.subset_options(fin, ints, conts,
                                                                               idx), theta1)
        loss0 = np.maximum(mprime, 0.0)
        reach = np.maximum(mprime + top, 0.0)
    if not math.isfinite(theta1):
        return make, loss0, loss0
    return make, loss0, (None if np.any(np.isinf(reach)) else reach)


def certify_datacost(model, X, y, *, loss, r, theta1, theta2, divergence, solver, features,
                     se, feature_costs, sample_weight, t_start, cost: DataCost,
                     **solver_options):
    """``certify(..., cost=DataCost)`` (called by :func:`otstab.certify`; see the module
    doc)."""
    kind = loss_kind(loss)
    hinge, smooth = kind == "hinge", kind == "logistic"
    if feature_costs is not None:
        raise ValidationError("feature_costs prices the encoded cost; with cost=DataCost use "
                              "DataCost(price={...})")
    if solver not in ("auto", "dual", "closed_form"):
        raise ValidationError(f"solver={solver!r} does not apply to loss='zero_one' (use "
                              "'auto', 'closed_form' or 'dual')")
    tree = is_tree_model(model)
    network = is_network_model(model)
    check_options(solver_options, TREE_OPTIONS if tree else NETWORK_OPTIONS if network else (),
                  "the tree path under a DataCost" if tree else "the network path under a "
                  "DataCost" if network else "the exact 0/1 path under a DataCost")
    if r > 1.0 and not (hinge or smooth):
        raise ValidationError(f"r is an error rate for loss='zero_one' and must be in [0, 1], "
                              f"got {r}")
    spec = inference.resolve_se(se)
    if tree:  # tree classifiers: a certified interval (otstab.solve._datacost_trees)
        if kind == "hinge":
            raise ValidationError("cost=DataCost with a tree model: loss='zero_one', "
                                  "'logistic' or 'cross_entropy' (boosted ensembles) in this "
                                  "version; loss='hinge' needs cost='encoded'")
        prob = resolve_model(model, X, y, loss=loss, sample_weight=sample_weight)
        if smooth:  # boosted ensembles (otstab.solve._datacost_tree_smooth)
            return _tree_smooth(model, X, y, prob, loss=loss, cost=cost, features=features,
                                spec=spec, r=r, theta1=theta1, theta2=theta2,
                                divergence=divergence, solver=solver, t_start=t_start,
                                **solver_options)
        if prob.scorer is None:
            frame, cost = _restrict(raw_frame(model, X, prob), cost, features)
            rc = cost.resolve(model, frame, prob.feature_names)
            res = certify_datacost_trees(model, prob, rc, frame, r=r, theta1=theta1,
                                         theta2=theta2, divergence=divergence, solver=solver,
                                         t_start=t_start, **solver_options)
            if spec == "analytic":
                res.inference = lambda: inference.analytic(res)  # type: ignore[assignment]
            elif spec is None:
                res.inference = None
            else:  # each sample's found distance (exact where its search completed)
                wrong = np.asarray(prob.losses(prob.X)) > 0
                value = datacost_inference.zero_one_replicator(
                    np.asarray(res.info["dstar"], dtype=np.float64), wrong, prob.p, r=r,
                    theta1=theta1, theta2=theta2, divergence=divergence, solver=solver)
                res.inference = datacost_inference.bootstrap(res, prob.n, prob.p, spec, value)
            return res
    if network:  # MLP classifiers: a certified interval (otstab.solve._datacost_networks)
        if kind != "zero_one":
            raise ValidationError(f"cost=DataCost with a network: loss='zero_one' only in this "
                                  f"version; loss={loss.name!r} needs cost='encoded'")
        if spec not in ("analytic", None):
            raise ValidationError("se='bootstrap' is not available for networks under "
                                  "cost=DataCost yet; use se='analytic' or None")
        prob = resolve_model(model, X, y, loss=loss, sample_weight=sample_weight)
        frame, cost = _restrict(raw_frame(model, X, prob), cost, features)
        rc = cost.resolve(model, frame, prob.feature_names)
        res = certify_datacost_network(model, prob, rc, frame, r=r, theta1=theta1,
                                       theta2=theta2, divergence=divergence, solver=solver,
                                       t_start=t_start, **solver_options)
        res.inference = (lambda: inference.analytic(res)) if spec == "analytic" else None
        return res
    prob, rc, parts, frame = prepare(model, X, y, loss=loss, cost=cost, features=features,
                                     sample_weight=sample_weight)
    kept: dict = {}
    if smooth:
        if prob.scorer.task != "binary" and loss.name != "cross_entropy":
            raise ValidationError(
                "loss='logistic' with cost=DataCost needs a binary classifier; a multiclass "
                "model takes loss='cross_entropy' (a certified interval) or cost='encoded'")
        if prob.scorer.task == "binary":
            res = certify_datacost_logistic(model, prob, rc, parts, frame, r=r, theta1=theta1,
                                            theta2=theta2, divergence=divergence,
                                            t_start=t_start, loss_name=loss.name)
        else:  # a certified interval (otstab.solve._datacost_cross_entropy)
            res = certify_datacost_cross_entropy(model, prob, rc, parts, frame, r=r,
                                                 theta1=theta1, theta2=theta2,
                                                 divergence=divergence, t_start=t_start,
                                                 keep=kept)
        res.info["cost"] = rc.to_dict()
        res.info["cost_description"] = rc.describe()
    elif hinge:
        if prob.scorer.task != "binary":
            raise ValidationError("loss='hinge' needs a binary classifier")
        res = certify_datacost_hinge(model, prob, rc, parts, frame, r=r, theta1=theta1,
                                     theta2=theta2, divergence=divergence, t_start=t_start)
        res.info["cost"] = rc.to_dict()
        res.info["cost_description"] = rc.describe()
    else:
        res = certify_datacost_zero_one(model, prob, rc, parts, frame, r=r, theta1=theta1,
                                        theta2=theta2, divergence=divergence, solver=solver,
                                        t_start=t_start)
    if spec == "analytic":
        res.inference = lambda: inference.analytic(res)  # type: ignore[assignment]
    elif spec is None:
        res.inference = None
    else:  # a bootstrap over the rows, each replicate by the same exact path
        res.inference = _bootstrap(res, prob, rc, parts, frame, spec, loss=loss, r=r,
                                   theta1=theta1, theta2=theta2, divergence=divergence,
                                   solver=solver, kept=kept)
    return res


def _tree_smooth(model, X, y, prob, *, loss, cost, features, spec, r, theta1, theta2,
                 divergence, solver, t_start, **options):
    """``loss="logistic"`` / ``"cross_entropy"`` of a boosted tree Pipeline under the cost: a
    certified interval (:mod:`otstab.solve._datacost_tree_smooth`)."""
    if solver not in ("auto", "dual"):
        raise ValidationError(f"solver={solver!r} does not apply to the {loss.name} loss of a "
                              "tree ensemble under a DataCost (use 'auto')")
    if loss.name == "logistic" and len(getattr(final_estimator(model), "classes_", ())) != 2:
        raise ValidationError("loss='logistic' needs a binary classifier; a multiclass model "
                              "takes loss='cross_entropy'")
    if spec not in ("analytic", None):
        raise ValidationError("se='bootstrap' is not available for the logistic / "
                              "cross-entropy loss of tree ensembles under cost=DataCost yet; "
                              "use se='analytic' or None")
    frame, cost = _restrict(raw_frame(model, X, prob), cost, features)
    rc = cost.resolve(model, frame, prob.feature_names)
    res = certify_datacost_tree_smooth(model, prob, rc, frame, r=r, theta1=theta1,
                                       theta2=theta2, divergence=divergence, solver=solver,
                                       t_start=t_start, loss_name=loss.name, **options)
    res.inference = (lambda: inference.analytic(res)) if spec == "analytic" else None
    return res


def _bootstrap(res, prob, rc, parts, frame, spec, *, loss, r, theta1, theta2, divergence,
               solver, kept=None):
    """``se="bootstrap"``: :mod:`otstab.datacost_inference`. ``kept``: what the multiclass
    cross-entropy path kept (its candidates' oracle: each replicate solves the exact dual on
    the drawn rows' candidates, an upper value, as ``value_upper`` is)."""
    n, p = prob.n, prob.p
    if kept and "oracle" in kept:
        fo = kept["oracle"]
        value = datacost_inference.oracle_replicator(
            lambda idx: FiniteOracle(fo.A[idx], fo.B[idx]), kept["loss0"], p, r=r,
            theta2=theta2, divergence=divergence)
        return datacost_inference.bootstrap(res, n, p, spec, value)
    if isinstance(loss, ZeroOne):
        dstar = np.asarray(res.info["dstar"], dtype=np.float64)
        wrong = np.asarray(prob.losses(prob.X)) > 0
        value = datacost_inference.zero_one_replicator(
            dstar, wrong, p, r=r, theta1=theta1, theta2=theta2, divergence=divergence,
            solver=solver)
        return datacost_inference.bootstrap(res, n, p, spec, value)
    make, loss0, _ = loss_oracle(prob, rc, parts, frame, loss=loss, theta1=theta1)
    value = datacost_inference.oracle_replicator(make, loss0, p, r=r, theta2=theta2,
                                                 divergence=divergence)
    return datacost_inference.bootstrap(res, n, p, spec, value)


def _restrict(frame, cost, features):
    """``(frame, cost)`` with every variable outside ``features`` made immutable."""
    if features is not None:
        keep = set(selected_variables(features))
        extra = sorted(nm for nm in keep if nm not in frame.columns)
        if extra:
            raise ValidationError(f"features: unknown variable {extra[0]!r}"
                                  + pipeline.suggest(extra[0], frame.columns))
        d = cost.to_dict()
        d["immutable"] = sorted(set(d["immutable"]) | {c for c in frame.columns
                                                      if c not in keep})
        cost = DataCost.from_dict(d)
    return frame, cost
