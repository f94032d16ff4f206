"""Feature stability (Sec. 2.4 of the paper): which feature makes a model fragile?

To score feature j only coordinate j may move (the cost of moving any other coordinate is
infinite); reweighting is allowed as usual. The score is R_j(beta, r), exactly
``certify(model, X, y, ..., features=[j]).value``; a lower score means a more sensitive
feature. A one-hot block (all columns of one categorical variable) can be scored as one
feature by letting the whole block move (``feature_groups=``; the score is then
``certify(..., features=cols).value``).

For linear models with a piecewise-linear or 0/1 loss every feature is scored from one pass
over the data: the reduced form keeps its ``c1`` and only ``c2`` changes
(``c2_k = a_kj^2 / (4 theta1)``), and for the 0/1 loss ``d*_ij = m_i^2 / beta_j^2`` shares one
sort of the margins across all features. A binary logistic linear model (n >= 2^16, no
sample weights, moderate prices) shares its margins across features: every feature's dual
from one per-bin quadrature of the margins (some 2e4 exact solves per evaluation instead of
n; :mod:`otstab.analysis._features_logistic`).
Other smooth losses and nonlinear models run one certify per feature.

A feature whose move cannot change any loss (``ignored``: for linear models all its
coefficients are zero, or equal across classes for a multiclass model; ``theta1 = inf``
freezes every feature) scores what reweighting alone achieves, as certify does: 0 when
``r <= base risk``, the reweighting-only value when ``r`` is below the largest loss, its limit
value when ``r`` equals the largest loss, ``inf`` above it or with ``theta2 = inf``. That value
is also the result's ``reweighting_only_value``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from otstab_solvers.dual import oracle_for, solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.sorted_oracle import SortedTwoPiece
from otstab_solvers.weights import weights_at
from otstab_solvers.zero_one import solve_zero_one

from .._progress import check_progress, progress_bar
from .._results import FrameResult
from .._validation import check_random_state, renamed_kwargs
from ..errors import SolverError, ValidationError
from ..modeling import _pipeline as pipeline
from ..modeling._costs import check_feature_costs
from ..modeling._datacost import as_cost
from ..modeling._losses import MulticlassHinge, PiecewiseLinear, ZeroOne, get_loss
from ..modeling._models import resolve_model
from ..modeling._params import check_common
from ..modeling._reduction import reduce_problem
from ..solve._audit import reached, resolution_problem
from ..solve._core import certify
from ..solve._datacost_certify import choose_cost
from ..solve._inference import check_level
from ..solve._piecewise import edge_kind, limit_weights
from ..solve._smooth import certify_smooth
from ..solve._tree_smooth import certify_tree_smooth, tree_smooth_model, unused_features
from ..solve._zero_one import (
    certify_zero_one_problem,
    certify_zero_one_search,
    linear_distances,
    move_prices,
)
from ._datacost_features import variable_units
from ._features_logistic import logistic_feature_scores, shared_margins

__all__ = ["feature_stability", "FeatureStability"]

log = logging.getLogger(__name__)

#: prices within which the one-pass scores are used as they are (outside, every feature is
#: scored through certify, whose Q* is audited)
MODERATE = (1e-3, 1e3)

COLUMNS = ["feature", "score", "rank", "h", "share_moving", "share_reweighting", "ignored",
           "columns"]

#: (score, h, share_moving, share_reweighting) of a threshold at or below the base risk
_ZERO = (0.0, 0.0, 0.0, 0.0)
#: ... of an unreachable threshold
_UNREACHABLE = (math.inf, math.nan, math.nan, math.nan)

def _units(names, features, groups, model=None):
    """[(label, column indices)] for the features/groups to score (``groups``: the
    ``feature_groups`` argument).

    ``groups="auto"``: one unit per raw column of the model's input
    (:func:`otstab.pipeline.auto_groups`); ``features`` may name units, encoded columns,
    indices or raw columns (a raw column's encoded columns move together).
    """
    index = {nm: j for j, nm in enumerate(names)}
    if isinstance(groups, str):
        if groups != "auto":
            raise ValidationError(f"feature_groups must be a dict {{name: [columns...]}}, "
                                  f"'auto' or None, got {groups!r}")
        groups = pipeline.auto_groups(model, names)
        if groups is None:
            raise ValidationError("feature_groups='auto': the model's preprocessing cannot be "
                                  "mapped back to raw columns; pass feature_groups as a dict")
    grouped = set()
    units = []
    if groups is not None:
        if not isinstance(groups, dict):
            raise ValidationError("feature_groups must be a dict {name: [columns...]}, 'auto' "
                                  "or None")
        for g, cols in groups.items():
            idx = []
            for c in cols:
                if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
                    if not 0 <= int(c) < len(names):
                        raise ValidationError(
                            f"feature_groups[{g!r}]: column index {c} out of range")
                    idx.append(int(c))
                elif str(c) in index:
                    idx.append(index[str(c)])
                else:
                    raise ValidationError(f"feature_groups[{g!r}]: unknown column {c!r}"
                                          + pipeline.suggest(c, names))
            if not idx:
                raise ValidationError(f"feature_groups[{g!r}] is empty")
            grouped.update(idx)
            units.append((str(g), idx))
    if features is None:
        singles = [(names[j], [j]) for j in range(len(names)) if j not in grouped]
        return singles + units
    chosen = []
    labels = {u[0]: u for u in units}
    for f in np.atleast_1d(np.asarray(features, dtype=object)).tolist():
        if str(f) in labels:
            chosen.append(labels[str(f)])
        elif isinstance(f, (bool, np.bool_)):
            raise ValidationError("features must be names or indices, not booleans")
        elif isinstance(f, (int, np.integer)):
            if not 0 <= int(f) < len(names):
                raise ValidationError(f"features: index {f} out of range")
            chosen.append((names[int(f)], [int(f)]))
        elif str(f) in index:
            chosen.append((str(f), [index[str(f)]]))
        else:  # a raw column of a Pipeline (or an unknown name: suggestions)
            cols = pipeline.expand_features(model, [f], names)
            chosen.append((str(f), [index[c] for c in cols]))
    return chosen


def _dense_parts(w, d_lo, d_hi):
    """(lo, hi, moved_lo, moved_hi): the risk of Q* with weights ``w`` and the tied samples'
    loss at the low (lo) or high (hi) piece, and the same means without the weights."""
    n = w.size
    return (float(w @ d_lo) / n, float(w @ d_hi) / n, float(np.mean(d_lo)),
            float(np.mean(d_hi)))


def _risk_parts(oracle, h, theta2, divergence):
    """:func:`_dense_parts` of Q* at ``h`` (from prefix sums when the oracle is sorted)."""
    if oracle.prefix is not None:
        return oracle.prefix.risk_parts(h, theta2, divergence)
    lh, _, d_lo, _, d_hi = oracle.scan(h)
    return _dense_parts(weights_at(lh, theta2, divergence)[0], d_lo, d_hi)


def _shares(parts, base, r):
    """Share of the excess risk from moving vs reweighting, with ties mixed to reach r."""
    lo, hi, mlo, mhi = parts
    lam = 0.0 if hi <= lo else min(max((r - lo) / (hi - lo), 0.0), 1.0)
    moved = mlo + lam * (mhi - mlo)
    risk = lo + lam * (hi - lo)
    excess = risk - base
    if excess <= 0:
        return 0.0, 0.0
    return (moved - base) / excess, (risk - moved) / excess


def _reweighting_only(losses, r, theta2, divergence, p=None):
    """(score, h, share_moving, share_reweighting) when no sample can move: what certify
    answers for a feature the model ignores (or for theta1 = inf).

    Zero when ``r <= base risk``; ``inf`` with ``theta2 = inf`` or ``r`` above the largest loss;
    the limit value (all mass on the samples of largest loss, h -> inf) when ``r`` equals the
    largest loss; otherwise the dual with ``l_h = h * loss`` (``c2 = 0``). ``p``: the sample
    probabilities (None: uniform).
    """
    edge = edge_kind(losses, r, theta2, False, p)  # certify's own edge decisions
    if edge is not None:
        kind = edge[0]
        if kind == "limit":
            return limit_weights(losses, theta2, divergence, p)[1], math.inf, 0.0, 1.0
        return _ZERO if kind == "zero" else _UNREACHABLE
    n = losses.size
    # max(0, h * loss) = h * loss (losses are >= 0): the hinge shape, so oracle_for sorts once
    # and every dual evaluation works on prefix sums
    oracle = oracle_for(np.column_stack([losses, np.zeros(n)]), np.zeros((1, 2)))
    sol = solve_dual(oracle, r, theta2, divergence, p=p)
    if sol.status != OPTIMAL:
        raise SolverError(f"reweighting-only dual failed ({sol.native_status})")
    return sol.value, sol.h, 0.0, 1.0


def _ignored(prob, cols) -> bool:
    """True when moving ``cols`` cannot change any score difference of a linear model: the
    coefficients are zero (binary, regression) or equal across classes (multiclass)."""
    Wc = prob.scorer.W[:, cols]
    if prob.scorer.task == "multiclass":
        return bool(np.all(Wc == Wc[0]))
    return not np.any(Wc)


@dataclass(frozen=True)
class _Scored:
    """What a feature's certificate leaves for its row (the certificate itself, which holds
    its Q*, is not kept: fifty features would keep fifty of them): the row, whether it is
    exact, its two sides, and (0/1 loss of a nonlinear model) whether a correctly classified
    sample can move."""

    row: tuple
    exact: bool
    value_lower: float
    value_upper: float
    movable: bool | None = None

    @classmethod
    def of(cls, res, loss0=None) -> _Scored:
        movable = None
        if loss0 is not None:
            movable = bool(np.any(np.isfinite(res.info["dstar"]) & (loss0 == 0)))
        return cls(_result_row(res), bool(res.exact), res.value_lower, res.value_upper,
                   movable)


def _result_row(res):
    """(score, h, share_moving, share_reweighting) of a certify result."""
    if not math.isfinite(res.value):
        return (res.value,) + _UNREACHABLE[1:]
    exc = res.risk_star - res.risk_base
    dec = res.decomposition
    if not exc > 0:
        return res.value, res.h, 0.0, 0.0
    return res.value, res.h, dec["corruption"] / exc, dec["reweighting"] / exc


@dataclass(repr=False)
class FeatureStability(FrameResult):
    """The answer of :func:`feature_stability`: one row per feature (or block), most
    sensitive first.

    ``table`` (``to_frame()``) has the columns ``feature``, ``score``, ``rank``, ``h``,
    ``share_moving``, ``share_reweighting``, ``ignored``, ``columns`` (and, for non-exact
    scores, ``score_lower``, ``score_upper``, ``exact``; with ``level``, ``se``, ``ci_low``,
    ``ci_high``, ``p_top_k``). ``reweighting_only_value`` is the score of a feature that cannot
    move; ``ranked_by`` the column the ranks follow.
    """

    table: pd.DataFrame
    r: float
    theta1: float
    theta2: float
    divergence: str
    loss: str
    reweighting_only_value: float
    ranked_by: str = "score"
    level: float | None = None
    n_resamples: int | None = None
    random_state: object = None
    top_k: int | None = None

    _function = "otstab.feature_stability"

    @property
    def most_sensitive(self) -> str | None:
        """The label of the most sensitive feature (rank 1), None for an empty table."""
        return None if self.table.empty else str(self.table["feature"].iloc[0])

    def summary(self) -> str:
        head = (f"Feature stability R_j(beta, r) ({self.loss} loss, r={self.r:g}, "
                f"{self.divergence}, theta1={self.theta1:g}, theta2={self.theta2:g}): "
                f"{len(self.table)} features, lowest = most sensitive; reweighting only "
                f"{self.reweighting_only_value:.6g}")
        cols = [c for c in ("feature", "score", "rank", "share_moving", "ignored", "se",
                            "ci_low", "ci_high", "p_top_k") if c in self.table.columns]
        more = "" if len(self.table) <= 15 else f"\n... {len(self.table) - 15} more"
        return head + "\n" + self.table[cols].head(15).to_string(index=False) + more

    def _headline(self):
        return [("n_features", len(self.table)), ("most_sensitive", self.most_sensitive),
                *[(k, getattr(self, k)) for k in ("r", "loss", "theta1", "theta2",
                                                    "divergence", "reweighting_only_value",
                                                    "level")]]


@renamed_kwargs(confidence="level", n_boot="n_resamples", seed="random_state",
                groups="feature_groups")
def feature_stability(model, X, y, *, loss, r, theta1: float = 1.0, theta2: float = 0.25,
                      divergence: str = "kl", features=None, feature_groups=None,
                      solver: str = "auto", level: float | None = None,
                      n_resamples: int = 200, random_state=0, top_k: int = 3, sample_weight=None,
                      feature_costs=None, progress=None, max_nodes=None, time_budget=None,
                      node_budget=None, rtol=None, cost=None) -> FeatureStability:
    """Score each feature (or group of columns) by R_j(beta, r): lowest = most sensitive.

    ``score`` is ``otstab.certify(model, X, y, loss=loss, r=r, theta1=theta1, theta2=theta2,
    divergence=divergence, features=[j]).value`` (``features=cols`` for a group).

    Parameters
    ----------
    model, X, y, loss, r, theta1, theta2, divergence : as in :func:`otstab.certify`
    features : sequence of names or indices, optional
        Which features (or group names) to score; default all columns (grouped columns are
        scored as their group). A Pipeline's raw column names are accepted (its encoded
        columns are scored together).
    feature_groups : dict {name: [columns]}, "auto" or None
        Blocks of columns scored as one feature (formerly ``groups``), e.g. the one-hot
        columns of a categorical variable (``otstab.datasets.feature_groups(df)``).
        ``"auto"``: one feature per raw column of the model's input, read from its
        preprocessing (a Pipeline's ColumnTransformer, OneHotEncoder, OrdinalEncoder,
        scalers, passthrough; ``"variable: level"`` columns otherwise), named exactly as the
        user's columns (:mod:`otstab.pipeline`).
    solver : "auto" or "first_order"
        Linear models with piecewise-linear or 0/1 losses use the exact one-pass path.

    level : float in (0, 1), optional
        Add the sampling uncertainty of every score from ``n_resamples`` bootstrap replicates
        (rows resampled with replacement, drawn from ``random_state``): columns ``se``,
        ``ci_low``, ``ci_high`` (percentile interval at this level) and ``p_top_k``, the share
        of replicates in which the feature is among the ``top_k`` most sensitive
        (rank <= top_k); see ``docs/inference.md``. (Formerly ``confidence``.)
    n_resamples : int >= 2, default 200
        Bootstrap replicates with ``level`` (formerly ``n_boot``).
    random_state : None, int, numpy Generator or RandomState, default 0
        The bootstrap's random numbers (formerly ``seed``).
    top_k : int >= 1, default 3
        The rank that ``p_top_k`` counts.
    sample_weight : array-like of shape (n,), optional
        Weights of the evaluation rows, as in :func:`otstab.certify`: each feature is then
        scored by ``certify(..., features=cols, sample_weight=sample_weight)`` (no one-pass
        path); with ``level`` the bootstrap resamples rows with their weights.
    feature_costs : dict or sequence, optional
        Per-feature move prices as in :func:`otstab.certify` (any model; a Pipeline's raw
        columns priced in raw units): each feature is scored by
        ``certify(..., features=cols, feature_costs=feature_costs)``; a feature whose price is
        ``inf`` cannot move and scores the reweighting-only value (``ignored``).
    progress : None, True or False
        A progress bar on stderr while features are certified one by one and over the
        bootstrap replicates (None: only when stderr is a terminal).
    cost : None or "encoded" (default), "auto", otstab.DataCost or its ``to_dict()``
        The transport cost, as in :func:`otstab.certify`. Under a ``DataCost`` each raw
        variable is scored by ``certify(..., cost=cost, features=[variable])``: only that
        variable may move (its level, integer steps or value, at the cost's price); a
        variable the cost makes immutable scores the reweighting-only value (``ignored``).
        The cost is resolved once on the full data (:mod:`otstab.datacost_features`).
    max_nodes, time_budget, node_budget, rtol : optional
        The certified lower bound's options, as in :func:`otstab.certify` (0/1 loss of a
        tree ensemble; :func:`otstab.bounds.tree_lower_distances`), passed to each feature's
        certificate: ``time_budget`` seconds and ``node_budget`` boxes are per feature (and
        per bootstrap replicate); ``rtol`` (default 0.01) stops each feature's search once its
        ``score_lower >= (1 - rtol) score_upper``. Paths without that bound refuse them
        (ValidationError).

    Returns
    -------
    FeatureStability
        ``to_frame()``: columns ``feature``, ``score``, ``rank``, ``h``, ``share_moving``,
        ``share_reweighting``, ``ignored`` (moving the feature cannot change the loss; its
        score is then the reweighting-only value), ``columns`` (the columns that moved),
        sorted by score; the arguments and ``reweighting_only_value`` (the score of a feature
        that cannot move) are attributes of the result (and ``attrs`` of the frame).
    """
    groups = feature_groups
    show = check_progress(progress)
    if level is not None:  # the bootstrap's arguments are checked before any work
        level = check_level(level)
        if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) \
                or n_resamples < 2:
            raise ValidationError(f"n_resamples must be an integer >= 2, got {n_resamples!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ValidationError(f"top_k must be an integer >= 1, got {top_k!r}")
        rng = check_random_state(random_state)
    r, theta1, theta2, divergence = check_common(r, theta1, theta2, divergence, solver)
    solver = solver.lower()
    loss_obj = get_loss(loss)
    # the lower bound's options (otstab.bounds), checked by the path that uses them
    bound_opts = {k: v for k, v in (("max_nodes", max_nodes), ("time_budget", time_budget),
                                    ("node_budget", node_budget), ("rtol", rtol))
                  if v is not None}
    prob = resolve_model(model, X, y, loss=loss_obj, sample_weight=sample_weight)
    if isinstance(loss_obj, ZeroOne) and r > 1.0:
        raise ValidationError(f"r is an error rate for loss='zero_one' and must be in [0, 1], "
                              f"got {r}")
    if cost is None and groups is None:  # certify's default (otstab.datacost_certify)
        data_cost = choose_cost(None, model, X, loss_obj, features=features,
                                feature_costs=feature_costs, solver=solver,
                                options=tuple(bound_opts))[0]
    else:
        data_cost = None if cost is None else as_cost(cost)
    spec = None
    if data_cost is not None:  # one unit per raw variable (otstab.datacost_features)
        if feature_costs is not None:
            raise ValidationError("feature_costs prices the encoded cost; with cost=DataCost "
                                  "use DataCost(price={...})")
        units, data_frozen, spec = variable_units(model, X, prob, data_cost, features, groups)
    else:
        units = _units(prob.feature_names, features, groups, model)
    linear_exact = prob.scorer is not None and isinstance(
        loss_obj, (PiecewiseLinear, MulticlassHinge, ZeroOne)) and solver != "first_order"
    extreme = any(math.isfinite(t) and not MODERATE[0] <= t <= MODERATE[1]
                  for t in (theta1, theta2))
    costs = check_feature_costs(feature_costs, prob.feature_names, model)
    frozen = [costs is not None and bool(np.all(np.isinf(costs[cols]))) for _l, cols in units]
    if spec is not None:
        frozen = data_frozen
    if spec is not None or costs is not None or (linear_exact and (extreme or
                                                                  prob.weights is not None)):
        # far from moderate prices the one-pass scores are not audited per feature, and they
        # have no weighted or priced form: score each feature through certify (its Q*
        # audited, or refused like certify refuses)
        base_losses = prob.losses(prob.X)
        rw = _reweighting_only(base_losses, r, theta2, divergence, prob.p)
        log.debug("feature_stability: %d features scored through certify", len(units))
        results = []
        with progress_bar(len(units), "feature_stability", show) as bar:
            for (_label, cols), frz in zip(units, frozen):  # None: immutable, rw's score
                results.append(None if frz else _Scored.of(certify(
                    model, X, y, loss=loss_obj, r=r, theta1=theta1, theta2=theta2,
                    divergence=divergence, solver=solver,
                    features=cols if spec is None else [_label],
                    sample_weight=sample_weight, feature_costs=feature_costs,
                    **({} if spec is None else {"cost": spec}), **bound_opts)))
                bar.update()
        rows = [rw if res is None else res.row for res in results]
        # the rows are certify's: no post-processing for linear models (whose scores carry
        # their interval when certify's is one: the multiclass cross-entropy under a DataCost)
        linear_exact = prob.scorer is not None and all(res is None or res.exact
                                                       for res in results)
    elif not linear_exact:
        base_losses = prob.losses(prob.X)
        shared = None  # (a binary logistic linear model: the units share its margins)
        if not isinstance(loss_obj, ZeroOne) and solver in ("auto", "dual") and not bound_opts:
            shared = shared_margins(prob, r, theta1, theta2, divergence, MODERATE)
        rw = None if shared is None else shared.reweighting_only(base_losses, r, theta1,
                                                                 theta2, divergence)
        if rw is None:
            rw = _reweighting_only(base_losses, r, theta2, divergence)
        results = _nonlinear_results(prob, units, r, theta1, theta2, divergence, solver, show,
                                     bound_opts, shared)
        # (a binary logistic linear model: the units share its margins, _features_logistic)
        rows = [res.row for res in results]
    elif bound_opts:  # the one-pass scores are exact: no lower bound to budget
        raise ValidationError(f"unknown solver option(s) {sorted(bound_opts)} for the exact "
                              "one-pass feature scores of a linear model; they apply to the "
                              "certified lower bound of a tree ensemble (0/1 loss)")
    elif isinstance(loss_obj, ZeroOne):
        base_losses = prob.losses(prob.X)
        rw = _reweighting_only(base_losses, r, theta2, divergence)
        rows = _zero_one_rows(prob, units, r, theta1, theta2, divergence, rw)
    else:
        red = reduce_problem(prob, theta1, None)
        base_losses = red.loss_values()
        rw = _reweighting_only(base_losses, r, theta2, divergence)
        rows = _piecewise_rows(prob, red, units, r, theta1, theta2, divergence, rw)
    # at r = 1 the 0/1 value comes from a closed form without the h r - T(h) cancellation
    # (otstab_solvers.zero_one): its rounding is relative to the value itself
    closed = isinstance(loss_obj, ZeroOne) and r >= 1.0
    for (label, _cols), row in zip([("reweighting only", None), *units], [rw, *rows]):
        why = resolution_problem(row[0], row[1], r,
                                 4e-15 * abs(row[0]) if closed else None)
        if why:  # the same refusal as certify's audit (otstab.audit)
            raise SolverError(f"feature {label!r}: {why}; rescale the prices or use math.inf")
    if prob.scorer is not None:
        ignored = [_ignored(prob, cols) or frz for (_, cols), frz in zip(units, frozen)]
    else:
        ignored = _nonlinear_ignored(prob, units, loss_obj, results)

    df = pd.DataFrame([(label, *row, ign, cols) for (label, cols), row, ign
                       in zip(units, rows, ignored)],
                      columns=["feature", "score", "h", "share_moving", "share_reweighting",
                               "ignored", "cols"])
    df["columns"] = [[prob.feature_names[j] for j in c] for c in df.pop("cols")]
    columns, ranked_by = COLUMNS, "score"
    if not linear_exact and any(res is not None and not res.exact for res in results):
        # not exact: each score is the found (upper) value; rank by the certified lower side
        df["score_lower"] = [rw[0] if res is None else res.value_lower for res in results]
        df["score_upper"] = [rw[0] if res is None else res.value_upper for res in results]
        df["exact"] = [res is None or bool(res.exact) for res in results]
        columns, ranked_by = COLUMNS + ["score_lower", "score_upper", "exact"], "score_lower"
    df = df.sort_values([ranked_by, "score"], kind="stable").reset_index(drop=True)
    df["rank"] = df[ranked_by].rank(method="min").astype(int)
    df = df[columns]
    out = FeatureStability(df, r=r, theta1=theta1, theta2=theta2, divergence=divergence,
                           loss=loss_obj.name, reweighting_only_value=rw[0],
                           ranked_by=ranked_by)
    if level is not None:
        kwargs = dict(loss=loss_obj, r=r, theta1=theta1, theta2=theta2, divergence=divergence,
                      features=features, feature_groups=groups, solver=solver,
                      feature_costs=feature_costs, progress=False, **bound_opts)
        if spec is not None:
            kwargs["cost"] = spec
        _add_uncertainty(df, model, X, y, kwargs, rng, int(n_resamples), level, int(top_k),
                         prob.p, show)
        out.level, out.n_resamples, out.top_k = level, int(n_resamples), int(top_k)
        out.random_state = random_state if random_state is None or isinstance(
            random_state, (int, np.integer)) else type(random_state).__name__
    return out


def _rows(data, idx):
    """Rows ``idx`` of an array, DataFrame or Series."""
    return data.iloc[idx] if hasattr(data, "iloc") else np.asarray(data)[idx]


def _add_uncertainty(df, model, X, y, kwargs, rng, n_resamples, level, top_k, p=None,
                     show=False) -> None:
    """Columns se, ci_low, ci_high, p_top_k from feature_stability on resampled rows (sample
    probabilities ``p`` travel with their rows; ``kwargs``, which every replicate gets, hold
    the scoring arguments, ``feature_costs`` included)."""
    n = len(y)
    scores = np.empty((n_resamples, len(df)))
    in_top = np.zeros(len(df))
    pos = {f: i for i, f in enumerate(df["feature"])}
    log.info("feature_stability: %d bootstrap replicates of %d features", n_resamples, len(df))
    with progress_bar(n_resamples, "feature_stability bootstrap", show) as bar:
        for b in range(n_resamples):
            idx = rng.integers(0, n, n)
            rep = feature_stability(model, _rows(X, idx), _rows(y, idx),
                                    sample_weight=None if p is None else p[idx],
                                    **kwargs).table
            cols = [pos[f] for f in rep["feature"]]
            scores[b, cols] = rep["score"].to_numpy(float)
            in_top[cols] += rep["rank"].to_numpy() <= top_k
            bar.update()
    finite = np.where(np.isfinite(scores), scores, np.nan)
    with np.errstate(invalid="ignore"):
        df["se"] = [float(np.std(c[~np.isnan(c)], ddof=1)) if np.sum(~np.isnan(c)) > 1
                    else math.inf for c in finite.T]
    df["ci_low"] = np.quantile(scores, (1 - level) / 2, axis=0, method="linear")
    df["ci_high"] = np.quantile(scores, (1 + level) / 2, axis=0, method="linear")
    df["p_top_k"] = in_top / n_resamples


def _piecewise_rows(prob, red, units, r, theta1, theta2, divergence, rw):
    """Rows of a linear model with a piecewise-linear loss: one reduced form, only ``c2``
    changes per feature."""
    c1 = red.c1
    base = float(np.mean(red.loss_values()))
    if reached(r, base):
        return [_ZERO] * len(units)
    shared = oracle_for(c1, red.c2)
    # c2 of every unit first; then solve in order of decreasing c2 so that each solve is
    # warm-started from the previous h (h moves smoothly with c2)
    c2s = []
    for _label, cols in units:
        if red.kind == "multiclass":
            mask = np.zeros(prob.d, dtype=bool)
            mask[cols] = True
            c2s.append(reduce_problem(prob, theta1, mask).c2)
        elif math.isfinite(theta1):
            v = red.v[cols]
            a = prob.loss.a
            c2s.append((a * a * float(v @ v) / (4.0 * theta1))[None, :])
        else:
            c2s.append(np.zeros((1, c1.shape[1])))
    order = sorted(range(len(units)), key=lambda i: -float(np.max(c2s[i])))
    out = {}
    h_prev = None
    for i in order:
        label, _cols = units[i]
        c2 = c2s[i]
        if not np.any(c2 > 0):  # no sample can move (certify's test on the masked form)
            out[i] = rw
            continue
        oracle = shared.with_c2(c2)
        sol = solve_dual(oracle, r, theta2, divergence, h_init=h_prev)
        if sol.status != OPTIMAL:
            raise SolverError(f"feature {label!r}: dual solver failed ({sol.native_status})")
        h_prev = sol.h if sol.h > 0 else h_prev
        sm, sr = _shares(_risk_parts(oracle, sol.h, theta2, divergence), base, r)
        out[i] = (sol.value, sol.h, sm, sr)
    return [out[i] for i in range(len(units))]


def _nonlinear_results(prob, units, r, theta1, theta2, divergence, solver, show=False,
                       options=None, margins=None):
    """One certify per feature (exact 1-D duals for smooth losses of linear models, the
    first-order path otherwise) with the feature mask; no one-pass shortcut applies here.
    ``options``: the lower bound's (``max_nodes``, ``time_budget``, ``node_budget``);
    ``margins``: the shared margins of a binary logistic linear model
    (:func:`otstab.analysis._features_logistic.shared_margins`, made there when None)."""
    out = []
    zero_one = isinstance(prob.loss, ZeroOne)
    loss0 = prob.losses(prob.X) if zero_one and prob.scorer is None else None
    shared = None
    if not zero_one and solver in ("auto", "dual") and not options:
        shared = logistic_feature_scores(prob, units, r, theta1, theta2, divergence, MODERATE,
                                         margins)
    log.debug("feature_stability: %d features certified one by one", len(units))
    with progress_bar(len(units), "feature_stability", show) as bar:
        for i, (_label, cols) in enumerate(units):
            if shared is not None and shared[i] is not None:
                out.append(_Scored(shared[i], True, shared[i][0], shared[i][0]))
                bar.update()
                continue
            mask = np.zeros(prob.d, dtype=bool)
            mask[cols] = True
            path = certify_zero_one_search if zero_one else certify_tree_smooth \
                if tree_smooth_model(prob) is not None and solver != "first_order" \
                else certify_smooth
            # (under a time budget no point of the bounds' searches is adopted: verify
            # recomputes each score without the limit, and the scores must reproduce)
            extra = {} if not zero_one else {
                "adopt_points": (options or {}).get("time_budget") is None}
            out.append(_Scored.of(path(prob, r=r, theta1=theta1, theta2=theta2,
                                       divergence=divergence, mask=mask, solver=solver,
                                       **extra, **(options or {})),
                                  loss0))
            bar.update()
    return out


def _nonlinear_ignored(prob, units, loss_obj, results):
    """``ignored`` for a nonlinear model: no sample's loss gradient has a nonzero entry in the
    unit's columns (smooth losses), or the perturbation search of its certificate found no
    move of those columns that changes a correct prediction (0/1 loss: every ``d*`` of a
    correctly classified sample is ``inf``)."""
    if isinstance(loss_obj, ZeroOne):
        return [res is None or not res.movable for res in results]
    if tree_smooth_model(prob) is not None:  # boosted trees: no split on the unit's columns
        unused = unused_features(prob)
        return [res is None or bool(np.all(unused[cols])) for (_label, cols), res in
                zip(units, results)]
    _, grad = prob.nonlinear.loss_and_grad(prob.X, prob.y)
    return [res is None or not np.any(grad[:, cols])
            for (_label, cols), res in zip(units, results)]


def _zero_one_chi2_row(prefix, r, theta2, base):
    """One 0/1 chi2 feature score from the shared sorted distances (O(log n) per evaluation)."""
    sol = solve_dual(prefix, r, theta2, "chi2")
    if sol.status != OPTIMAL:
        raise SolverError(f"0/1 chi2 dual failed ({sol.native_status})")
    sm, sr = _shares(prefix.risk_parts(sol.h, theta2, "chi2"), base, r)
    return sol.value, sol.h, sm, sr


def _zero_one_rows(prob, units, r, theta1, theta2, divergence, rw):
    sc = prob.scorer
    loss0 = prob.losses(prob.X)
    base = float(loss0.mean())
    if reached(r, base):
        return [_ZERO] * len(units)
    rows = []
    binary = sc.task == "binary"
    shared = None
    if binary:
        m = prob.y * sc.scores(prob.X)
        m2 = np.where(loss0 > 0, 0.0, np.maximum(m, 0.0) ** 2)
        order = np.argsort(m2, kind="stable")
        m2_sorted = m2[order]  # misclassified samples have m2 = 0, hence a = 0
        loss_sorted_all = loss0[order]
        if divergence == "chi2" and math.isfinite(theta2) and math.isfinite(theta1) and r < 1:
            # the chi2 dual on one sorted oracle, rescaled per feature: a_ij = s_j m2_i
            shared = SortedTwoPiece(-m2_sorted, "distance", presorted=True)
    for _label, cols in units:
        mask = np.zeros(prob.d, dtype=bool)
        mask[cols] = True
        if binary:
            nb = float(np.sum(sc.W[0, cols] ** 2))
            if shared is not None and nb > 0:
                rows.append(_zero_one_chi2_row(shared.with_scale(theta1 / nb), r, theta2, base))
                continue
            # a_i = theta1 d*_i as certify builds it (linear_distances: d* = inf for a correct
            # sample when the unit's coefficients are zero)
            if nb == 0.0:
                a_sorted = np.where(loss_sorted_all > 0, 0.0, np.inf)
            elif math.isfinite(theta1):
                a_sorted = theta1 * m2_sorted / nb
            else:
                a_sorted = np.where(m2_sorted > 0, np.inf, 0.0)
            loss_sorted = loss_sorted_all
        else:
            d, _ = linear_distances(prob, mask)
            a = move_prices(d, theta1)
            o = np.argsort(a, kind="stable")
            a_sorted, loss_sorted = a[o], loss0[o]
        finite = np.isfinite(a_sorted)
        n = a_sorted.size
        if not np.any(finite & (loss_sorted == 0)):  # no correct sample can be misclassified
            rows.append(rw)
            continue
        if r >= 1.0 and not np.all(finite):
            # r = 1 with some samples unable to move: a limit or unreachable answer, rare;
            # certify's own 0/1 path decides it
            res = certify_zero_one_problem(prob, r, theta1, theta2, divergence, mask, "auto",
                                           time.perf_counter())
            rows.append(_result_row(res))
            continue
        n_reach = float(np.sum(loss_sorted) + np.sum(finite & (loss_sorted == 0)))
        if math.isinf(theta2) and r * n > n_reach:
            rows.append(_UNREACHABLE)
            continue
        sol = solve_zero_one(a_sorted, r, theta2, divergence, presorted=True)
        if sol.status != OPTIMAL:
            raise SolverError(f"0/1 dual failed ({sol.native_status})")
        if "n_moved" in sol.info:
            # KL closed form: Q* in O(1) from the solver's prefix sums. Moved samples (a < h)
            # carry weight mass `moved_weight`; tied ones (a = h, l_h = 0) have weight
            # `unit_weight` each and are moved in the share lam that brings the risk to r
            inf = sol.info
            extra = max(r - inf["moved_weight"], 0.0) * n / inf["unit_weight"]
            moved_frac = (inf["n_moved"] + min(extra, inf["n_tied"])) / n
            sm = (moved_frac - base) / (r - base)
            rows.append((sol.value, sol.h, sm, 1.0 - sm))
            continue
        if math.isinf(theta2):  # no reweighting: all of the excess risk is from moving
            rows.append((sol.value, sol.h, 1.0, 0.0))
            continue
        lh = np.maximum(sol.h - a_sorted, 0.0)
        w = weights_at(lh, theta2, divergence)[0]
        tol = 1e-10 * max(1.0, sol.h)
        d_hi = np.where(a_sorted <= sol.h + tol, 1.0, loss_sorted)
        d_lo = np.where(a_sorted < sol.h - tol, 1.0, loss_sorted)
        sm, sr = _shares(_dense_parts(w, d_lo, d_hi), base, r)
        rows.append((sol.value, sol.h, sm, sr))
    return rows
