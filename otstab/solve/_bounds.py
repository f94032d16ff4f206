"""Certified lower bounds for models without an exact path (``status = 'bounds'``).

R(beta, r) is nondecreasing in every sample's d-transform ``l_h(z_i)`` taken with a minus sign:
a larger ``l_h`` can only lower the dual ``h r - T(l_h)``. So any **over-estimate** of ``l_h``
(for the 0/1 loss: any **under-estimate** ``dlow_i <= d*_i`` of the squared distance to the
nearest misclassified point, since ``l_h = (h - theta1 d*_i)_+``) plugged into the same exact
1-D dual gives a number ``<= R``: a certified lower bound. This module computes those
under/over-estimates; each is a proof, not a heuristic:

* **tree ensembles, 0/1 loss** (:func:`tree_lower_distances`; scikit-learn decision trees,
  random forests, extra trees, gradient boosting, histogram gradient boosting; XGBoost and
  LightGBM through the leaf layouts of :mod:`otstab.trees`): a best-first
  branch and bound over boxes of the input space. A box is discarded when no point of it closer
  than the known upper bound ``U_i`` can flip the prediction, which is proved by the
  *independent-trees* bound: every class margin ``F_y - F_k`` is at least the sum over trees of
  the smallest leaf margin among the leaves the box can reach within distance ``U_i``. Boxes are
  explored in order of a lower bound on their distance to ``x_i`` (the *radius key* of
  :mod:`otstab.solve._radius_key`: the smallest radius at which that margin bound, over the
  leaves within the radius, can reach the tie band), so at any moment the smallest
  key among the open boxes (capped at ``U_i``) is a certified lower bound on ``d*_i``; run to
  completion it is exact (distances are taken to the closure of the float64 inputs of a box,
  whose ends, for trees comparing ``float32(x)``, lie halfway between float32 values). A box
  that meets one leaf per tree within ``U_i`` is decided by the model's own ``predict`` at the
  input of the leaves' intersection nearest ``x_i``. ``max_nodes`` and ``time_budget`` stop
  the search; the bound is reported at whatever point it stops. A search that completes on
  such a box has found a real misclassified input at the exact distance ``d*_i``
  (``_Sample.point``): it is returned (``info["region_points"]``) for the found side to adopt
  and its distance becomes the sample's upper end. With numba the same search
  runs compiled and in parallel over samples (:mod:`otstab.solve._tree_kernel`; same bounds,
  ties handed back to this module's search, which asks the model).
* **MLPs, 0/1 loss** (:func:`mlp_lower_distances`; scikit-learn ``MLPClassifier`` through
  :class:`otstab.nonlinear.MLPModel`): ``d*_i >= rho^2`` whenever ``m_i >= rho L_i(rho)`` with
  ``m_i`` the smallest logit margin at ``x_i`` and ``L_i(rho)`` a certified Lipschitz constant of
  the margin on the ball of radius rho: the Jacobian is ``W_L D_{L-1} ... D_1 W_1`` with each
  activation-derivative diagonal ``D_l`` confined, by interval propagation over the ball, to
  ``[s_lo, s_hi]``; the part with ``D = mid`` is kept as a matrix, the rest is bounded in norm.
  Identity activations give ``L_i`` = the exact norm of the collapsed linear model (the bound is
  then exact). rho is found by bisection between the global bound and ``sqrt(U_i)``.
* **MLPs, smooth losses** (:func:`mlp_transform_upper`): a global Lipschitz constant ``G`` of
  the loss in x (``|dl/df| <= 1`` for logistic, ``||softmax - e_y|| <= sqrt 2`` for
  cross-entropy, times a Lipschitz constant of the network) gives
  ``l_h <= sup_t h (l_i + G t) - theta1 t^2 = h l_i + h^2 G^2 / (4 theta1)``; squared loss:
  ``l <= (e_i + L t)^2`` gives ``l_h <= h e_i^2 theta1 / (theta1 - h L^2)`` for
  ``h < theta1 / L^2`` (``+inf`` beyond).

With per-feature prices (a model wrapped in :class:`otstab.costs.Rescaled`, coordinates
``x~ = sqrt(c) x``) an MLP's first layer reads ``W_1 / sqrt(c)`` and the tree boxes stay in the
caller's coordinates with their distances priced, ``sum_j c_j gap_j^2``: the same proofs in the
priced metric.

:func:`zero_one_lower_value` and :func:`smooth_lower_value` turn these into the lower bound on
R. ``dtai-veritas`` (a tree-ensemble verifier) is not available from this machine's package
index, so it was not measured (docs/bounds.md).
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
from otstab_solvers.dual import solve_dual
from otstab_solvers.weights import pmean
from otstab_solvers.zero_one import solve_zero_one

from ..errors import InputTypeError, ValidationError
from ..modeling import _trees as trees
from ..modeling._costs import Rescaled
from ..modeling._nonlinear import as_model_input
from ..modeling._perturbation import (
    f32_above,
    f32_atmost,
    f32_edge,
    f32_first_input,
    f32_last_input,
    tree_boxes,
)
from . import _crown as crown
from . import _relu_regions as relu_regions
from ._audit import CANCEL_RTOL
from ._radius_key import radius_key
from ._refine import check_rtol, refine

__all__ = ["LeafTable", "leaf_table", "sample_leaves", "worst_leaf",
           "tree_lower_distances",
           "mlp_lower_distances",
           "mlp_lipschitz", "mlp_transform_upper", "zero_one_lower_value",
           "smooth_lower_value", "certified_distances", "network_transform_upper",
           "BOUND_OPTIONS"]

#: options of the lower bounds, accepted by ``certify`` next to the perturbation search's
BOUND_OPTIONS = ("max_nodes", "time_budget", "node_budget", "progress", "steps", "rtol")

#: how far past the 0/1 duals' threshold h the tree searches of a round look (a factor of
#: h / theta1; :func:`otstab.solve._refine.refine`)
TREE_REACH = 1.25

#: relative slack taken off a computed dual value so that its rounding cannot lift it above R
VALUE_SLACK = 1e-12


# ----------------------------------------------------------------------------------------------
# tree ensembles as a table of leaf boxes
# ----------------------------------------------------------------------------------------------


@dataclass
class LeafTable:
    """Every leaf of a tree ensemble as a box and a contribution to the class scores.

    Leaf ``L`` of tree ``tree[L]`` holds the points with ``lo[L, j] < c(x_j) <= hi[L, j]`` for
    every feature ``j``, where ``c`` is the comparison the trees make (``float32(x)`` for
    scikit-learn trees, ``x`` itself for histogram gradient boosting, ``f32``). The class scores
    are ``F(x) = base + sum over trees of value[leaf of x]`` (shape ``(K,)``, ``K >= 2``) and the
    prediction is their argmax (binary models: ``F = (0, decision_function)``).
    """

    lo: np.ndarray
    hi: np.ndarray
    tree: np.ndarray
    value: np.ndarray
    base: np.ndarray
    f32: bool
    n_trees: int
    #: sum over the trees of their largest leaf value in absolute value (the size of a score)
    scale: float = 0.0
    #: margins within this distance of 0 may be predicted either way by the model (on top of
    #: the float64 rounding of the sum): XGBoost sums and squashes in float32
    tol: float = 0.0

    def comparable(self, X: np.ndarray) -> np.ndarray:
        """``c(X)``: the values the trees compare with their thresholds."""
        return X.astype(np.float32).astype(np.float64) if self.f32 else X

    def scores(self, X: np.ndarray) -> np.ndarray:
        """``F(X)`` from the table (checked against the model's own scores)."""
        C = self.comparable(X)
        out = np.tile(self.base, (X.shape[0], 1))
        # blocks of leaves, a feature at a time (the sum's order is not the model's: this
        # serves the checks against the model, which allow for rounding)
        for s in range(0, self.lo.shape[0], 256):
            lo, hi = self.lo[s:s + 256], self.hi[s:s + 256]
            inside = np.ones((C.shape[0], lo.shape[0]), dtype=bool)
            for j in np.flatnonzero(np.isfinite(lo).any(axis=0) | np.isfinite(hi).any(axis=0)):
                inside &= (C[:, j:j + 1] > lo[:, j]) & (C[:, j:j + 1] <= hi[:, j])
            out += inside.astype(np.float64) @ self.value[s:s + 256]
        return out

    def edges(self, lo, hi):
        """The closure ``[a, b]`` (float64) of the inputs x with ``lo < c(x) <= hi``: exactly
        ``[lo, hi]`` when the trees compare x itself; for ``c = float32`` each edge lies
        halfway between the float32 values around the threshold (inputs on one side round to
        the float32 value at most the threshold, on the other to the one above it). The
        distance from x_i to this closure is the infimum of the distances to those inputs."""
        if not self.f32:
            return lo, hi
        return f32_edge(np.asarray(lo, dtype=np.float64)), f32_edge(np.asarray(hi,
                                                                               dtype=np.float64))

    def leaf_edges(self):
        """:meth:`edges` of every leaf (computed once)."""
        cached = self.__dict__.get("_leaf_edges")
        if cached is None:
            cached = self.__dict__["_leaf_edges"] = self.edges(self.lo, self.hi)
        return cached

    def inner_point(self, x, lo, hi):
        """The input nearest to ``x`` (per coordinate) whose comparison value lies in
        ``lo < c(p) <= hi``, or None when no input does (a box between two adjacent float32
        values holds none)."""
        if self.f32:
            c = x.astype(np.float32).astype(np.float64)
            c = np.where(c <= lo, f32_above(lo), np.where(c > hi, f32_atmost(hi), c))
        else:
            with np.errstate(invalid="ignore"):
                c = np.where(x <= lo, np.nextafter(lo, np.inf), np.where(x > hi, hi, x))
        if not np.all((c > lo) & (c <= hi) & np.isfinite(c)):
            return None
        return c


def _sk_tree(tree, d, leaf_value, cols=None):
    return tree_boxes(tree.children_left, tree.children_right, tree.feature, tree.threshold,
                      leaf_value, d, cols)


def leaf_table(model, d: int, X_check: np.ndarray | None = None) -> LeafTable:
    """The :class:`LeafTable` of a fitted tree classifier (scikit-learn decision tree, random
    forest, extra trees, gradient boosting, histogram gradient boosting; XGBoost and LightGBM,
    read by :func:`otstab.trees.external_layout` and checked on both sides of every
    threshold).

    ``X_check``: a few rows on which the table's prediction is compared with the model's own
    ``predict_proba``/``decision_function`` (an :class:`otstab.errors.InputTypeError` if they
    disagree: a structure this module does not understand is refused, never guessed).
    """
    name = type(model).__name__
    classes = getattr(model, "classes_", None)
    if classes is None:
        raise InputTypeError(f"{name} is not a fitted classifier (no classes_)")
    K = len(classes)
    los: list = []
    his: list = []
    vals: list = []
    tree_ids: list = []

    def add(parts):
        lo, hi, v = parts
        tree_ids.extend([tree_ids[-1] + 1 if tree_ids else 0] * len(lo))
        los.extend(lo)
        his.extend(hi)
        vals.extend(v)

    def proba_leaf(tree, scale):
        def f(node):
            v = np.asarray(tree.value[node], dtype=np.float64).reshape(-1)
            s = v.sum()
            return scale * (v / s if s > 0 else v)
        return f

    f32 = True
    kind = "proba"
    if hasattr(model, "tree_") and getattr(model.tree_, "n_outputs", 1) == 1:
        add(_sk_tree(model.tree_, d, proba_leaf(model.tree_, 1.0)))
    elif name in ("RandomForestClassifier", "ExtraTreesClassifier"):
        ests = model.estimators_
        for est in ests:
            add(_sk_tree(est.tree_, d, proba_leaf(est.tree_, 1.0 / len(ests))))
    elif name == "GradientBoostingClassifier":
        kind = "decision"
        lr = float(model.learning_rate)
        E = np.asarray(model.estimators_, dtype=object)
        for m in range(E.shape[0]):
            for k in range(E.shape[1]):
                t = E[m, k].tree_
                col = k + 1 if E.shape[1] == 1 else k

                def gb_leaf(node, t=t, col=col):
                    out = np.zeros(K)
                    out[col] = lr * float(t.value[node].reshape(-1)[0])
                    return out
                add(_sk_tree(t, d, gb_leaf))
    elif name == "HistGradientBoostingClassifier":
        kind = "decision"
        f32 = False
        preds = model._predictors
        for it in preds:
            for k, pr in enumerate(it):
                nodes = pr.nodes
                if np.any(nodes["is_categorical"]):
                    raise InputTypeError("histogram gradient boosting with categorical splits "
                                         "is not supported by the lower bounds")
                col = k + 1 if len(it) == 1 else k
                leaf = nodes["is_leaf"].astype(bool)
                left = np.where(leaf, -1, nodes["left"].astype(np.intp))

                def hgb_leaf(node, nodes=nodes, col=col):
                    out = np.zeros(K)
                    out[col] = float(nodes["value"][node])
                    return out
                add(tree_boxes(left, nodes["right"], nodes["feature_idx"], nodes["num_threshold"],
                           hgb_leaf, d))
    elif trees.library(model) is not None:
        kind = "margin"
        layout, K, f32 = trees.external_layout(model, d)
        for lo, hi, v, _ in layout:
            add((lo, hi, v))
    else:
        raise InputTypeError(f"no certified lower bound for {name}: supported are scikit-learn "
                             "decision trees, random forests, extra trees, gradient boosting and "
                             "histogram gradient boosting classifiers, XGBoost and LightGBM")
    table = LeafTable(lo=np.array(los), hi=np.array(his), tree=np.array(tree_ids, dtype=np.intp),
                      value=np.array(vals), base=np.zeros(K), f32=f32,
                      n_trees=max(tree_ids) + 1)
    table.scale = float(np.sum(np.maximum.reduceat(
        np.abs(table.value).max(axis=1), np.flatnonzero(np.r_[True, np.diff(table.tree) != 0]))))
    if X_check is None or X_check.shape[0] == 0:
        raise ValidationError("leaf_table needs rows X_check to check the table against the "
                              "model")
    Xc = np.asarray(X_check[:32], dtype=np.float64)
    if kind == "margin":  # and on both sides of every threshold: the comparisons themselves
        Xc = np.concatenate([Xc, trees.threshold_probes(table.lo, table.hi, f32, Xc[0])])
    own = table.scores(Xc)
    if kind == "margin":
        # XGBoost sums float32 leaf values in float32: agreement to its rounding
        raw = trees.raw_margins(model, Xc)
        shift = raw - own
        size = 1.0 + table.scale + np.abs(raw).max()
        atol = (1e-5 if f32 else 1e-9) * size
        if not np.allclose(shift, shift[0], rtol=0, atol=atol):
            raise InputTypeError(f"{name}: the leaf layout read from the model's dump does not "
                                 "reproduce its raw margins; no certified lower bound")
        table.base = shift[0].copy()
        # float32 sums and sigmoid: margins within this band may be predicted either way
        table.tol = 1e-5 * size + 1e-6 if f32 else 0.0
    elif kind == "decision":
        dec = np.asarray(model.decision_function(as_model_input(model, Xc)), dtype=np.float64)
        dec = np.column_stack([np.zeros(len(dec)), dec]) if dec.ndim == 1 else dec
        shift = dec - own
        if not np.allclose(shift, shift[0], rtol=0, atol=1e-9 * (1 + np.abs(dec).max())):
            raise InputTypeError(f"{name}: the scores are not a constant plus the sum of the "
                                 "leaf values (an init estimator?); no certified lower bound")
        table.base = shift[0].copy()
    else:
        proba = np.asarray(model.predict_proba(as_model_input(model, Xc)), dtype=np.float64)
        if not np.allclose(own, proba, rtol=0, atol=1e-9):
            raise InputTypeError(f"{name}: the leaf table does not reproduce predict_proba; "
                                 "no certified lower bound")
    return table


def sample_leaves(table: LeafTable, x, y: int, mv):
    """The leaves one sample can reach, restricted to its movable features ``mv``: ``(idx,
    lo, hi, a, b, x_mv, tree, marg, base)`` with ``idx`` the leaves that hold ``x`` in every
    fixed feature, their bounds ``lo < c(x) <= hi`` and float64 closures ``[a, b]`` on the
    movable features, ``x``'s movable coordinates, each leaf's tree, its class margins
    ``F_y - F_k`` (k != y) and the base margins."""
    a, b = table.leaf_edges()  # float64 boxes [a, b] holding each leaf
    fixed = ~mv
    cx = table.comparable(x[None, :])[0]  # fixed features: exactly the leaves holding x
    ok = np.all((table.lo[:, fixed] < cx[fixed]) & (cx[fixed] <= table.hi[:, fixed]), axis=1)
    idx = np.flatnonzero(ok)
    V = table.value[idx]
    others = [k for k in range(table.value.shape[1]) if k != y]
    return (idx, table.lo[idx][:, mv], table.hi[idx][:, mv], a[idx][:, mv], b[idx][:, mv],
            x[mv], table.tree[idx], V[:, [y]] - V[:, others], table.base[y] - table.base[others])


def tree_bound(tree, n_trees: int, marg, base):
    """``(starts, mins, bound)`` of the leaves that meet a box, grouped by tree (``tree``:
    their tree ids, in runs; ``marg``: their margins, leaves x classes): where each tree's
    run starts, each tree's smallest margin per class, and the box's margin bound ``base +
    sum of mins`` per class. None when some of the ``n_trees`` trees has no leaf in the box
    (no point of the box)."""
    starts = np.flatnonzero(np.concatenate(([True], tree[1:] != tree[:-1])))
    if starts.size < n_trees:
        return None
    mins = np.minimum.reduceat(marg, starts, axis=0)  # (trees, classes)
    return starts, mins, base + mins.sum(axis=0)


def worst_leaf(marg, alive, mins, starts, bound):
    """The split rule of the tree branch and bounds: ``(worst, rows)``, the position (in
    ``alive``) of the leaf with the smallest margin, on the class whose margin bound is
    lowest, within the tree whose reachable leaves spread that margin most (trees with one
    leaf left are skipped).
    ``marg``: the sample's leaf margins (leaves x classes), ``alive``: the leaves meeting the
    box, grouped by tree from ``starts``; ``mins``: each tree's smallest margin per class;
    ``bound``: the box's margin bound per class; ``rows``: that tree's positions."""
    k = int(np.argmin(bound))
    col = marg[alive, k]
    maxs = np.maximum.reduceat(col, starts)
    ends = np.r_[starts[1:], alive.size]
    spread = np.where(ends - starts > 1, maxs - mins[:, k], -1.0)  # trees with 2+ leaves
    t = int(np.argmax(spread))
    rows = np.arange(starts[t], ends[t])
    return int(rows[int(np.argmin(col[rows]))]), rows


class _Sample:
    """The leaves reachable from one sample, in a form the branch and bound works on."""

    def __init__(self, table: LeafTable, x, y: int, mv, upper: float, predict, weights=None):
        self.upper, self.predict, self.y, self.mv, self.x_full = upper, predict, y, mv, x
        # per-feature prices of the squared distance (feature_costs; default 1)
        self.w = np.ones(int(mv.sum())) if weights is None else np.asarray(weights)[mv]
        (self.idx, self.lo, self.hi, self.a, self.b, self.x, self.tree, self.marg,
         self.base) = sample_leaves(table, x, y, mv)
        self.n_trees = table.n_trees
        self.table = table
        self.found = None  # the input of the box a completed search ended on (point())
        d_mv = self.x.size
        self._cut_order = (np.repeat(np.arange(d_mv), 2), np.tile([True, False], d_mv))
        # a margin bound must clear the rounding of the model's own sum of the leaf values
        # and of this table's (each at most (trees + 1) eps times the sum of the magnitudes):
        # within it a tie, which argmax breaks towards the first class, is possible, so the
        # box is split until the model's predict decides it
        size = float(np.max(np.abs(table.base), initial=0)) + table.scale
        self.size = size
        self.tol = 4 * (table.n_trees + 2) * np.finfo(np.float64).eps * size + 1e-15 + table.tol

    def evaluate(self, alive, blo, bhi):
        """``(key, alive, single, info)`` for the box ``blo < c(x) <= bhi``, or None when the
        box is proved to hold no misclassified input closer than U.

        ``alive``: candidate leaf positions. ``key``: a lower bound on the distance from x to
        the inputs of the box closer than U. ``single``: the box meets one leaf per tree within
        U, so every input of it closer than U lies in the intersection of those leaves and has
        one prediction; that prediction was checked with the model's ``predict`` and is wrong,
        and ``key`` is then the exact distance to the intersection."""
        ea, eb = self.table.edges(blo, bhi)
        lo = np.maximum(self.lo[alive], blo)
        hi = np.minimum(self.hi[alive], bhi)
        meet = np.all(lo < hi, axis=1)
        alive = alive[meet]
        lo, hi = lo[meet], hi[meet]
        # edges are monotone: the closure of leaf and box is the intersection of the closures
        a = np.maximum(self.a[alive], ea)
        b = np.minimum(self.b[alive], eb)
        gap = np.maximum(np.maximum(a - self.x, self.x - b), 0.0)
        dist = (gap * gap) @ self.w
        near = dist < self.upper
        alive, dist, lo, hi = alive[near], dist[near], lo[near], hi[near]
        tree = self.tree[alive]
        if alive.size == 0:
            return None
        got = tree_bound(tree, self.n_trees, self.marg[alive], self.base)
        if got is None:  # some tree has no leaf here: no point of the box
            return None
        starts, mins, bound = got
        key = float(np.max(np.minimum.reduceat(dist, starts)))
        if np.all(bound > self.tol):
            return None  # proved: no point of the box within U changes the prediction
        # the margins as well: no input closer than the radius key can be misclassified
        key = max(key, radius_key(dist, starts, self.marg[alive], self.base, self.tol,
                                  self.size))
        single = starts.size == alive.size
        if single:
            # an input of the box closer than U lies, in every tree, in a leaf within U: the
            # only one left; so it lies in the intersection of the leaves, one prediction
            rlo, rhi = lo.max(axis=0), hi.min(axis=0)
            p = self.table.inner_point(self.x, rlo, rhi)
            if p is None:
                return None  # no input lies in the intersection
            ra, rb = self.table.edges(rlo, rhi)
            rgap = np.maximum(np.maximum(ra - self.x, self.x - rb), 0.0)
            rdist = float((rgap * rgap) @ self.w)
            if not rdist < self.upper:
                return None
            # the margins of the intersection are exact sums of one leaf per tree: one below
            # -tol is a misclassification the model's own sum agrees with; otherwise (a tie
            # within rounding, or right) the model's predict decides
            if not np.any(bound < -self.tol) and self._right(p):
                return None
            key = max(key, rdist)
        return key, alive, single, (mins, starts, lo, hi, bound)

    def point(self, blo, bhi, alive):
        """The input nearest ``x`` (full coordinates) of the intersection of the box with the
        leaves ``alive`` (one per tree: a box the search ends on), or None when it holds no
        input: ``x``'s own coordinate where it lies in the intersection, else the nearest
        input inside (for float32 comparisons the first input past the float32 edge)."""
        lo = np.maximum(self.lo[alive], blo).max(axis=0)
        hi = np.minimum(self.hi[alive], bhi).min(axis=0)
        c = self.table.comparable(self.x[None, :])[0]
        if self.table.f32:
            with np.errstate(over="ignore", invalid="ignore"):
                p = np.where(c <= lo, f32_first_input(lo), np.where(c > hi, f32_last_input(hi),
                                                                     self.x))
        else:
            p = np.where(c <= lo, np.nextafter(lo, np.inf), np.where(c > hi, hi, self.x))
        cp = self.table.comparable(p[None, :])[0]
        if not np.all((cp > lo) & (cp <= hi) & np.isfinite(p)):
            return None
        z = self.x_full.copy()
        z[self.mv] = p
        return z

    def _right(self, p) -> bool:
        """The model's own prediction at the input with movable coordinates ``p``."""
        z = self.x_full.copy()
        z[self.mv] = p
        return bool(self.predict(z[None, :])[0] == self.y)

    def split(self, blo, bhi, alive, info):
        """Split the box on an edge of the most damaging leaf of the most spread tree."""
        mins, starts, lo, hi, bound = info
        worst, _ = worst_leaf(self.marg, alive, mins, starts, bound)
        # candidate cuts: each edge of the worst leaf inside the box, in the order (feature,
        # lower edge then upper edge); the one that moves its half farthest from x wins
        js, upper_side = self._cut_order
        cut = np.where(upper_side, lo[worst][js], hi[worst][js])
        valid = (blo[js] < cut) & (cut < bhi[js])
        if not valid.any():  # pragma: no cover - a tree with 2 leaves here has an inner edge
            raise AssertionError("no split found")
        a, b = self.table.edges(np.where(upper_side, cut, blo[js]),
                                np.where(upper_side, bhi[js], cut))
        g = np.maximum(np.maximum(a - self.x[js], self.x[js] - b), 0.0) * np.sqrt(self.w[js])
        k = int(np.argmax(np.where(valid, g, -np.inf)))
        best = (g[k], int(js[k]), float(cut[k]))
        _, j, s = best
        lo1, hi1 = blo.copy(), bhi.copy()
        hi1[j] = s
        lo2, hi2 = blo.copy(), bhi.copy()
        lo2[j] = s
        return (lo1, hi1), (lo2, hi2)


def _branch_and_bound(smp: _Sample, max_nodes: int, deadline: float):
    """Certified lower bound on d*_i by best-first search: ``(bound, exact, nodes, timed_out)``
    (``timed_out``: the deadline, not ``max_nodes``, stopped it; rerun with ``max_nodes =
    nodes`` it stops at the same box, the boxes being examined in a fixed order)."""
    d = smp.x.size
    root = (np.full(d, -np.inf), np.full(d, np.inf))
    ev = smp.evaluate(np.arange(smp.idx.size), *root)
    if ev is None:
        return smp.upper, True, 1, False
    heap = [(ev[0], 0, root, ev)]
    counter, nodes = 1, 1
    while heap:
        key, _, box, ev = heap[0]
        if ev[2]:  # a box with one leaf per tree whose prediction may change: exact
            smp.found = smp.point(*box, ev[1])  # (its misclassified input nearest x)
            return min(key, smp.upper), True, nodes, False
        if nodes >= max_nodes:
            return min(key, smp.upper), False, nodes, False
        if time.perf_counter() > deadline:
            return min(key, smp.upper), False, nodes, True
        heapq.heappop(heap)
        for child in smp.split(*box, ev[1], ev[3]):
            nodes += 1
            cev = smp.evaluate(ev[1], *child)
            if cev is not None:
                heapq.heappush(heap, (max(cev[0], key), counter, child, cev))
                counter += 1
    return smp.upper, True, nodes, False


def _progress(done, total, t0, stream=sys.stderr):
    width = 30
    k = int(width * done / max(total, 1))
    stream.write(f"\r  lower bounds [{'#' * k}{'.' * (width - k)}] {done}/{total} "
                 f"{time.perf_counter() - t0:.1f}s")
    if done == total:
        stream.write("\n")
    stream.flush()


def tree_lower_distances(model, X, yi, *, mask=None, upper=None, max_nodes=200,
                         time_budget=None, node_budget=None, progress=False, weights=None,
                         rtol=None, duals=None, table=None, compiled=None, merge=None,
                         reach=None):
    """Certified lower bounds ``dlow_i <= d*_i`` for a scikit-learn tree-ensemble classifier.

    Parameters
    ----------
    model : fitted tree classifier (see :func:`leaf_table`)
    X : array (n, d); yi : class indices (0..K-1) of the labels
    mask : boolean array (d,), optional
        Movable features.
    upper : array (n,), optional
        Known upper bounds ``d*_i <= upper_i`` (``inf`` when unknown); only points closer
        than ``upper_i`` are examined, and ``dlow_i = upper_i`` proves the upper bound exact.
    max_nodes : int
        Boxes examined per sample (effort).
    time_budget : float, optional
        Seconds for all samples; samples are processed in order of ``upper`` (the smallest
        distances first: they decide R), those left when time runs out get the bound of their
        root box only (one box each). Where it stops depends on the machine's speed: ``info``
        then holds the ``node_budget`` that reproduces the same bounds on any machine.
    node_budget : int, optional
        Boxes for all samples (deterministic): samples in order of ``upper`` get up to
        ``max_nodes`` each while the budget lasts, the rest their root box only.
    progress : bool
        A progress bar on stderr.
    weights : array (d,), optional
        Per-feature prices ``c`` of the squared distance ``sum_j c_j (x'_j - x_j)^2``
        (``feature_costs``; default 1): the boxes' distances are priced the same way, so the
        bounds hold in that metric.
    rtol, duals : optional
        The stopping rule of :func:`otstab.solve._refine.refine`: rounds of growing budgets for the
        samples that enter the 0/1 dual (``duals``: a :class:`otstab.solve._refine.ZeroOneDuals`),
        until ``value_lower >= (1 - rtol) value_upper``. None: ``max_nodes`` for every sample.
    table : LeafTable, optional
        The model's :func:`leaf_table` if already read (and checked) for these rows.
    compiled : bool, optional
        The compiled, parallel search of :mod:`otstab.solve._tree_kernel` (same bounds as the
        NumPy search; None: whenever numba is installed).
    merge : int, optional
        The compiled search only: the cap on the leaves of a group of merged trees
        (:func:`otstab.solve._tree_kernel.merge_groups`; 0: the independent-trees bound, the
        NumPy search's; None: :data:`otstab.solve._tree_kernel.MERGE_CAP`).

    Returns
    -------
    (dlow, info): ``dlow`` array (n,) and ``info`` with ``exact`` (bool array: the search
    completed), ``nodes`` (total boxes examined), ``stopped`` (``"time_budget"``,
    ``"node_budget"`` or None: what cut the search short of ``max_nodes`` per sample) and
    ``node_budget`` (the ``node_budget`` that reproduces these bounds; None when nothing cut
    the search).
    """
    if node_budget is not None:
        if isinstance(node_budget, bool) or not isinstance(node_budget, (int, np.integer)) \
                or node_budget < 1:
            raise ValidationError(f"node_budget must be a positive integer, got {node_budget!r}")
        node_budget = int(node_budget)
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, (int, np.integer)) \
            or max_nodes < 1:
        raise ValidationError(f"max_nodes must be a positive integer, got {max_nodes!r}")
    if time_budget is not None and not (isinstance(time_budget, (int, float, np.number))
                                        and float(time_budget) >= 0):
        raise ValidationError(f"time_budget must be a number of seconds >= 0, got "
                              f"{time_budget!r}")
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    up = np.full(n, np.inf) if upper is None else np.asarray(upper, dtype=np.float64)
    if table is None:
        table = leaf_table(model, d, X)
    yi = np.asarray(yi, dtype=np.intp)
    classes = np.asarray(model.classes_)

    def predict(Z):
        return np.searchsorted(classes, model.predict(as_model_input(model, Z)))
    t0 = time.perf_counter()
    deadline = math.inf if time_budget is None else t0 + float(time_budget)

    # the inputs of the boxes the completed searches end on (one leaf per tree, misclassified:
    # real points at the exact distance), for the found side (otstab.solve._zero_one)
    points = np.full((n, d), np.nan)

    def adopt(i, smp, upper):
        """The point of a search that ended on a box with one leaf per tree: kept, and its
        distance returned as the sample's new upper end (when below ``upper``)."""
        z = smp.found
        if z is None:
            return upper
        gap = (z - X[i])[mv]
        dz = float((gap * gap) @ smp.w)
        if not dz < upper:
            return upper
        points[i] = z
        return dz

    def search(i, budget, dl, upper):
        smp = _Sample(table, X[i], int(yi[i]), mv, upper, predict, weights)
        res = _branch_and_bound(smp, budget, dl)
        return (*res, adopt(i, smp, upper))

    # imported here: numba (1.4 s to import) only loads when a tree search runs
    from . import _tree_kernel as tree_kernel

    search_many = None
    if compiled is None:
        compiled = tree_kernel.available()
    if compiled:  # the compiled, parallel search (otstab/solve/_tree_kernel.py)
        kt = tree_kernel.KernelTable(table, mv, weights, merge=merge)

        def search_many(ids, budgets, dl, uppers):
            boxes = np.empty((len(ids), 2, int(mv.sum())))
            low, ex, used, status = tree_kernel.search_batch(kt, X, yi, ids, budgets, uppers,
                                                             boxes=boxes)
            out = []
            for q, i in enumerate(ids):
                if status[q] == tree_kernel.FALLBACK:  # a tie only the model's predict
                    # decides: this sample by the NumPy path, same budget (no deadline, so
                    # that a node budget reproduces it)
                    out.append(search(int(i), int(budgets[q]), math.inf, float(uppers[q])))
                    continue
                up_i = float(uppers[q])
                if ex[q] and low[q] < up_i:  # ended on a box with one leaf per tree
                    smp = _Sample(table, X[i], int(yi[i]), mv, up_i, predict, weights)
                    ev = smp.evaluate(np.arange(smp.idx.size), boxes[q, 0], boxes[q, 1])
                    if ev is not None and ev[2]:
                        smp.found = smp.point(boxes[q, 0], boxes[q, 1], ev[1])
                        up_i = adopt(int(i), smp, up_i)
                out.append((float(low[q]), bool(ex[q]), int(used[q]), False, up_i))
            return out

    def bar(done):
        if progress and (done % 50 == 0 or done == n):
            _progress(min(done, n), n, t0)

    dlow, exact, info = refine(n, search, up.copy(), duals, rtol=check_rtol(rtol),
                               max_nodes=max_nodes, node_budget=node_budget, deadline=deadline,
                               progress=bar, search_many=search_many,
                               reach=TREE_REACH if reach is None else reach)
    out = {"exact": exact, "time": time.perf_counter() - t0, **info}
    if np.isfinite(points).all(axis=1).any():
        out["region_points"] = points
    return dlow, out


# ----------------------------------------------------------------------------------------------
# MLPs
# ----------------------------------------------------------------------------------------------


def _act_slopes(act, zl, zu):
    """Range ``[s_lo, s_hi]`` of the activation's derivative over ``[zl, zu]``."""
    if act == "identity":
        one = np.ones_like(zl)
        return one, one
    if act == "relu":
        return (zl > 0).astype(float), (zu > 0).astype(float)
    if act == "tanh":
        def g(z):
            return 1.0 - np.tanh(z) ** 2
    elif act == "logistic":
        def g(z):
            s = 0.5 * (1.0 + np.tanh(0.5 * z))
            return s * (1.0 - s)
    else:  # pragma: no cover - MLPModel refuses other activations
        raise InputTypeError(f"unsupported activation {act!r}")
    lo = np.minimum(g(zl), g(zu))  # derivatives are unimodal with the peak at 0
    hi = np.where((zl <= 0) & (zu >= 0), g(np.zeros_like(zl)), np.maximum(g(zl), g(zu)))
    return lo, hi


def _act(act, Z):
    if act == "identity":
        return Z
    if act == "relu":
        return np.maximum(Z, 0.0)
    if act == "tanh":
        return np.tanh(Z)
    return 0.5 * (1.0 + np.tanh(0.5 * Z))


def _check_mlp(adapter):
    if not (hasattr(adapter, "W") and hasattr(adapter, "activation")):
        raise InputTypeError(f"{type(adapter).__name__} is not an otstab MLPModel: certified "
                             "MLP bounds need the numpy weights of a scikit-learn MLP")


def _output_rows(adapter, yi):
    """Rows ``(e_y - e_k)^T`` of the margins per sample: array (n, K-1, K_out)."""
    K = adapter.W[-1].shape[1]
    if adapter.task == "binary":  # logit f: class 1 iff f > 0; margin s f with s = +-1
        s = np.where(np.asarray(yi) == 1, 1.0, -1.0)
        return s[:, None, None] * np.ones((1, 1, 1))
    eye = np.eye(K)
    rows = [eye[y][None, :] - np.delete(eye, y, axis=0) for y in np.asarray(yi)]
    return np.array(rows)


def _margin_lipschitz(adapter, X, rho, R, mv):
    """Certified Lipschitz constants (n, K-1) of the margins ``R_i f(x)`` over the L2 balls of
    radius ``rho_i`` (``inf`` allowed) around ``X_i``, movable coordinates only."""
    with np.errstate(all="ignore"):  # infinite radii: intervals overflow to +-inf on purpose
        return _margin_lipschitz_raw(adapter, X, rho, R, mv)


def _margin_lipschitz_raw(adapter, X, rho, R, mv):
    W, b, act = adapter.W, adapter.b, adapter.activation
    W1 = W[0][mv]  # (d_mv, H1)
    n = X.shape[0]
    rho = np.asarray(rho, dtype=np.float64)
    # C: the Jacobian of the current pre-activations w.r.t. x with every activation slope at
    # the midpoint of its range, (n, H, d_mv); e: a bound on the spectral norm of the rest
    C = np.broadcast_to(W1.T[None], (n, W1.shape[1], W1.shape[0]))
    e = np.zeros(n)
    z = X @ W[0] + b[0]
    zr = rho[:, None] * np.sqrt(np.sum(W1 * W1, axis=0))[None, :]  # exact over the L2 ball
    zr = np.nan_to_num(zr, nan=np.inf)
    for layer in range(1, len(W)):
        zl, zu = z - zr, z + zr
        s_lo, s_hi = _act_slopes(act, zl, zu)
        mid, rad = 0.5 * (s_lo + s_hi), 0.5 * (s_hi - s_lo)
        amax = np.maximum(np.abs(s_lo), np.abs(s_hi))
        Wn = W[layer]
        if layer == len(W) - 1:
            # the margins' rows pulled back through the output layer: g = R W_L^T, and
            # g D (C + E) = g mid C + g (D - mid) C + g D E, the middle term bounded row by row
            g = np.einsum("nmk,hk->nmh", R, Wn)  # (n, K-1, H)
            lin = np.einsum("nmh,nhd->nmd", g * mid[:, None, :], C)
            cn = np.sqrt(np.einsum("nhd,nhd->nh", C, C))  # ||C_h||
            out = (np.sqrt(np.einsum("nmd,nmd->nm", lin, lin))
                   + np.einsum("nmh,nh->nm", np.abs(g), rad * cn)
                   + np.sqrt(np.einsum("nmh,nh->nm", g * g, amax * amax)) * e[:, None])
            return np.nan_to_num(out, nan=np.inf)
        # D C = mid C + (D - mid) C: ||(D - mid) C|| <= ||rad C||_F; ||D E|| <= max|D| e
        e = np.sqrt(np.einsum("nh,nhd->n", rad * rad, C * C)) + np.max(amax, axis=1) * e
        C = np.einsum("nhd,hk->nkd", mid[:, :, None] * C, Wn)
        e = e * np.linalg.norm(Wn, 2)
        # interval of the activations, then of the next pre-activations (center-radius form)
        if act == "identity":
            al, au = zl, zu
        else:
            al, au = _act(act, np.maximum(zl, -1e300)), _act(act, np.minimum(zu, 1e300))
        c, r_ = 0.5 * (al + au), 0.5 * (au - al)
        z = np.nan_to_num(c, nan=0.0, posinf=0.0, neginf=0.0) @ Wn + b[layer]
        zr = np.nan_to_num(np.nan_to_num(r_, nan=np.inf) @ np.abs(Wn), nan=np.inf)
    raise AssertionError("an MLP has at least one hidden layer")  # pragma: no cover


def mlp_lipschitz(adapter, mask=None) -> float:
    """A global Lipschitz constant (L2) of the network's output map in the movable
    coordinates: the exact norm of the collapsed linear map for identity activations, else
    the product of the layers' spectral norms times the activations' largest slope."""
    _check_mlp(adapter)
    d = adapter.W[0].shape[0]
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    Ws = [adapter.W[0][mv]] + list(adapter.W[1:])
    if adapter.activation == "identity":
        M = Ws[0]
        for Wl in Ws[1:]:
            M = M @ Wl
        return float(np.linalg.norm(M, 2))
    slope = {"relu": 1.0, "tanh": 1.0, "logistic": 0.25}[adapter.activation]
    out = 1.0
    for Wl in Ws:
        out *= float(np.linalg.norm(Wl, 2))
    return out * slope ** (len(Ws) - 1)


def mlp_lower_distances(adapter, X, yi, *, mask=None, upper=None, steps=24, chunk=256):
    """Certified lower bounds ``dlow_i <= d*_i`` for an sklearn MLP classifier (0/1 loss).

    ``yi``: class indices (binary: 0/1 with 1 the positive class). ``upper``: known upper
    bounds (the bisection never goes beyond them). Misclassified samples get 0. Returns
    ``(dlow, info)``.
    """
    _check_mlp(adapter)
    t0 = time.perf_counter()
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    yi = np.asarray(yi, dtype=np.intp)
    up = np.full(n, np.inf) if upper is None else np.asarray(upper, dtype=np.float64)
    out = np.asarray(adapter.outputs(X), dtype=np.float64)
    R = _output_rows(adapter, yi)
    F = out[:, None] if out.ndim == 1 else out
    M = np.einsum("nmk,nk->nm", R, F)  # margins F_y - F_k (binary: the signed logit)
    margin = np.min(M, axis=1)
    dlow = np.zeros(n)
    if not mv.any():
        dlow = np.where(margin > 0, np.inf, 0.0)
        return dlow, {"time": time.perf_counter() - t0}
    for s in range(0, n, chunk):
        sl = slice(s, s + chunk)
        rho = _certified_radius(adapter, X[sl], R[sl], M[sl], up[sl], mv, steps)
        dlow[sl] = np.where(margin[sl] > 0, rho * rho, 0.0)
    return np.minimum(dlow, up), {"time": time.perf_counter() - t0}


def _certified_radius(adapter, X, R, M, up, mv, steps):
    """The largest radius rho (by bisection between the global bound and sqrt(up)) with
    ``M_ik >= rho L_ik(rho)`` for every margin k: no point closer than rho changes the
    prediction. ``M``: margins (n, K-1)."""
    pos = np.all(M > 0, axis=1)

    def certified(rho):
        L = _margin_lipschitz(adapter, X, rho, R, mv)
        with np.errstate(invalid="ignore"):
            return pos & np.all(M >= rho[:, None] * L, axis=1)

    Lg = _margin_lipschitz(adapter, X, np.full(X.shape[0], np.inf), R, mv)
    Lg = np.minimum(Lg, np.sqrt(np.sum(R * R, axis=2)) * mlp_lipschitz(adapter, mv))
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.min(np.where(Lg > 0, M / Lg, np.inf), axis=1)
    lo = np.where(pos, lo, 0.0)
    hi = np.sqrt(up)
    lo = np.minimum(lo, hi)
    for _ in range(steps):
        open_ = np.isfinite(hi) & (hi > lo * (1 + 1e-6))
        if not open_.any():
            break
        mid = np.where(open_, 0.5 * (lo + hi), lo)
        ok = certified(mid) & open_
        lo = np.where(ok, mid, lo)
        hi = np.where(open_ & ~ok, mid, hi)
    return lo


def mlp_transform_upper(adapter, loss: str, base, theta1: float, mask=None):
    """An over-estimate of the d-transform of a smooth loss of an sklearn MLP; ``base``: the
    per-sample losses at the evaluation points.

    Returns an oracle ``evaluate(h) -> (l_h_up, d/dh, d2/dh2)`` with ``h_max`` (for
    :func:`otstab_solvers.dual.solve_dual`), built from a global Lipschitz constant of the
    network (:func:`mlp_lipschitz`) and the losses at X (module docstring).
    """
    _check_mlp(adapter)
    Lf = mlp_lipschitz(adapter, mask)
    if not math.isfinite(theta1) or Lf == 0.0:
        Lf = 0.0
    base = np.asarray(base, dtype=np.float64)
    if loss == "squared":
        e = np.sqrt(np.maximum(base, 0.0))
        return _SquaredUpper(e, Lf * Lf, theta1)
    G = Lf * (math.sqrt(2.0) if loss == "cross_entropy" and adapter.task == "multiclass"
              else 1.0)
    return _QuadraticUpper(base, 0.0 if Lf == 0.0 else G * G / (4.0 * theta1))


def network_transform_upper(adapter, loss, X, y, base, theta1, mask=None, h_ref=None):
    """The tightest available over-estimate of the d-transform of a smooth loss of a network:
    the nested-ball bound of :func:`otstab.solve._crown.smooth_oracle` (classifiers) and the global
    one of :func:`mlp_transform_upper`, sample by sample the smaller; None when neither
    applies. Returns ``(oracle, method)``."""
    local = crown.smooth_oracle(adapter, loss, X, y, theta1, mask=mask, h_ref=h_ref)
    mlp = as_mlp(adapter)
    glob = None if mlp is None else mlp_transform_upper(mlp, loss, base, theta1, mask)
    if local is None:
        return glob, "a global Lipschitz over-estimate of l_h"
    if glob is None:
        return local, "linear bound propagation over nested balls (CROWN)"
    return (crown.MinOracle(local, glob),
            "linear bound propagation over nested balls (CROWN) and a global Lipschitz bound")


class _QuadraticUpper:
    """``l_h = h l_i + c h^2``."""

    h_max = math.inf

    def __init__(self, base, c):
        self.base, self.c, self.n = base, float(c), base.size

    def evaluate(self, h):
        return (h * self.base + self.c * h * h, self.base + 2 * self.c * h,
                np.full(self.n, 2 * self.c))


class _SquaredUpper:
    """``l_h = h e_i^2 theta1 / (theta1 - h L^2)`` for ``h < theta1 / L^2``."""

    def __init__(self, e, L2, theta1):
        self.e2, self.L2, self.t1, self.n = e * e, float(L2), float(theta1), e.size
        self.h_max = self.t1 / self.L2 if self.L2 > 0 else math.inf

    def evaluate(self, h):
        if self.L2 == 0.0:
            return h * self.e2, self.e2, np.zeros(self.n)
        q = self.t1 - h * self.L2
        lh = h * self.e2 * self.t1 / q
        d1 = self.e2 * self.t1 * self.t1 / (q * q)
        d2 = 2.0 * self.e2 * self.t1 * self.t1 * self.L2 / (q * q * q)
        return lh, d1, d2


# ----------------------------------------------------------------------------------------------
# lower bounds on R
# ----------------------------------------------------------------------------------------------


def _slack(value, h, r):
    return max(value - VALUE_SLACK * abs(value) - CANCEL_RTOL * abs(h) * r, 0.0)


def zero_one_lower_value(dlow, loss0, r, theta1, theta2, divergence, p=None) -> float:
    """Certified lower bound on R for the 0/1 loss from ``dlow_i <= d*_i``: the exact 0/1
    dual on ``a = theta1 dlow`` (R is nondecreasing in each d*_i), less its rounding bound.
    ``inf`` when even these distances cannot reach r. ``p``: the sample probabilities."""
    dlow = np.where(np.asarray(loss0) > 0, 0.0, np.asarray(dlow, dtype=np.float64))
    if r <= pmean(np.asarray(loss0, dtype=np.float64), p):
        return 0.0
    a = dlow * theta1 if math.isfinite(theta1) else np.where(dlow > 0, np.inf, 0.0)
    if r >= 1.0 and not np.all(np.isfinite(a)):
        return 0.0  # the limit case: leave it to the exact path's own answer
    method = "closed_form" if divergence == "kl" or math.isinf(theta2) else "dual"
    sol = solve_zero_one(a, r, theta2, divergence, method=method, p=p)
    if not math.isfinite(sol.value):
        return math.inf if sol.native_status == "unreachable" else 0.0
    if sol.status != "optimal":
        return 0.0
    return _slack(float(sol.value), sol.h, r)


def smooth_lower_value(oracle, r, theta2, divergence, p=None) -> float:
    """Certified lower bound on R from an over-estimating d-transform oracle: the dual at the
    best point the 1-D solver found (any h gives a lower bound), less its rounding bound.
    ``p``: the sample probabilities (None: uniform)."""
    sol = solve_dual(oracle, r, theta2, divergence, p=p)
    if not (math.isfinite(sol.value) and math.isfinite(sol.h)):
        return 0.0
    return _slack(float(sol.value), sol.h, r)


class _MLPWeights:
    """A feed-forward network in the layout of :class:`~otstab.nonlinear.MLPModel`: numpy
    weights ``W[l]`` (in, out), biases ``b[l]``, one hidden activation, ``task``."""

    def __init__(self, W, b, activation, task):
        self.W, self.b, self.activation, self.task = W, b, activation, task

    def outputs(self, X):
        """The network's logits (binary: one logit, class 1 iff > 0)."""
        Z = np.asarray(X, dtype=np.float64)
        for Wl, bl in zip(self.W[:-1], self.b[:-1]):
            Z = _act(self.activation, Z @ Wl + bl)
        out = Z @ self.W[-1] + self.b[-1]
        return out[:, 0] if self.task == "binary" else out


#: torch activation modules and their names in the MLP bounds
_TORCH_ACTIVATIONS = {"ReLU": "relu", "Tanh": "tanh", "Sigmoid": "logistic",
                      "Identity": "identity"}


def as_mlp(adapter):
    """``adapter`` in the MLP layout the certified bounds read, or None: an sklearn MLP
    adapter as it is; a :class:`~otstab.nonlinear.TorchModel` whose module is an
    ``nn.Sequential`` of ``Linear`` layers with one kind of elementwise activation between
    them (ReLU, Tanh, Sigmoid or Identity; ``Dropout`` is the identity in eval mode) and no
    activation after the last layer (the outputs are logits). A binary module with two
    outputs is collapsed to the difference of its logits, as the adapter reads it."""
    if hasattr(adapter, "W") and hasattr(adapter, "activation"):
        return adapter
    if isinstance(adapter, Rescaled):  # x = x~ / s: the first layer reads W_1 / s
        inner = as_mlp(adapter.inner)
        if inner is None:
            return None
        return _MLPWeights([inner.W[0] / adapter.s[:, None], *inner.W[1:]], list(inner.b),
                           inner.activation, inner.task)
    module = getattr(adapter, "module", None)
    if module is None or type(module).__name__ != "Sequential":
        return None
    W, b, acts = [], [], set()
    for layer in module.children():
        kind = type(layer).__name__
        if kind == "Linear":
            w = layer.weight.detach().cpu().double().numpy().T
            bias = (layer.bias.detach().cpu().double().numpy() if layer.bias is not None
                    else np.zeros(w.shape[1]))
            W.append(np.array(w, copy=True))
            b.append(np.array(bias, copy=True))
        elif kind in _TORCH_ACTIVATIONS and W:
            if len(acts) == len(W):  # two activations in a row
                return None
            acts.add(_TORCH_ACTIVATIONS[kind])
        elif kind != "Dropout":
            return None
    if len(W) < 2 or len({*acts}) != 1 or len(acts) == 0:
        return None
    n_act = sum(1 for layer in module.children()
                if type(layer).__name__ in _TORCH_ACTIVATIONS)
    if n_act != len(W) - 1 or type(list(module.children())[-1]).__name__ != "Linear":
        return None
    if adapter.task == "binary" and W[-1].shape[1] == 2:
        W[-1] = (W[-1][:, 1] - W[-1][:, 0])[:, None]
        b[-1] = np.array([b[-1][1] - b[-1][0]])
    return _MLPWeights(W, b, acts.pop(), adapter.task)


def certified_distances(model, X, y, *, mask=None, upper=None, **options):
    """Certified ``dlow_i <= d*_i`` for an :class:`~otstab.nonlinear.MLPModel`, a
    :class:`~otstab.nonlinear.TorchModel` of the form :func:`as_mlp` reads, or a
    scikit-learn tree classifier (``model`` or ``model.model``), with ``y`` in internal labels
    (-1/+1 binary, 0..K-1 multiclass). Returns ``(dlow, info)`` (``info["method"]`` names the
    bound) or ``None`` when no certified bound is available for this model."""
    y = np.asarray(y)
    mlp = as_mlp(model)
    net = crown.as_network(model)  # linear bound propagation (otstab/solve/_crown.py)
    if net is not None and net.task != "regression":
        yi = (y > 0).astype(np.intp) if net.task == "binary" else y.astype(np.intp)
        prev = None if mlp is None else mlp_lower_distances(mlp, X, yi, mask=mask,
                                                            upper=upper)[0]
        dlow, info = crown.lower_distances(net, X, yi, mask=mask, upper=upper, previous=prev,
                                           **{k: v for k, v in options.items()
                                              if k in ("steps", "time_budget")})
        dlow, info = relu_regions.tighten(net, X, yi, upper, dlow, info, mask=mask)
        info.pop("deadline", None)
        return dlow, info
    if mlp is not None:
        yi = (y > 0).astype(np.intp) if mlp.task == "binary" else y.astype(np.intp)
        dlow, info = mlp_lower_distances(mlp, X, yi, mask=mask, upper=upper,
                                         **{k: v for k, v in options.items() if k == "steps"})
        return dlow, {**info, "method": "local-Lipschitz (MLP)"}
    weights = None
    if isinstance(model, Rescaled):  # feature_costs: the trees' boxes in the caller's x
        X, weights = model.back(X), model.s * model.s
        model = model.inner
    raw = getattr(model, "model", model)
    classes = getattr(raw, "classes_", None)
    if classes is None:
        return None
    yi = (y > 0).astype(np.intp) if len(classes) == 2 else y.astype(np.intp)
    opts = {k: v for k, v in options.items()
            if k in ("max_nodes", "time_budget", "node_budget", "progress", "rtol", "duals",
                     "table")}
    if opts.get("duals") is None:
        opts.pop("rtol", None)
    try:
        dlow, info = tree_lower_distances(raw, X, yi, mask=mask, upper=upper, weights=weights,
                                          **opts)
    except InputTypeError:
        return None
    if weights is not None:  # (points in the caller's x, the problem's are rescaled)
        info.pop("region_points", None)
    method = "branch-and-bound (tree ensemble)"
    if info["stopped"] == "time_budget":
        method = (f"branch-and-bound (tree ensemble; the time budget stopped it after "
                  f"{info['node_budget']} boxes: node_budget={info['node_budget']} reproduces "
                  "it on any machine)")
    return dlow, {**info, "method": method}
