"""Logistic and cross-entropy certificates of boosted tree ensembles: a certified interval.

A boosted classifier's class scores ``F(z) = base + sum over trees of the leaf value`` are
constant on every intersection of one leaf per tree, and the loss of a row with label ``y`` is
``l(z) = log(1 + sum_{k != y} exp(-M_k(z)))`` with ``M_k = F_y - F_k`` (binary: the logistic
loss ``log(1 + exp(-y m))`` of the log-odds ``m``; :mod:`otstab.modeling._tree_margins` checks
that the model's ``predict_proba`` is this softmax). The d-transform of sample ``i``,
``l_h(x_i) = sup_z h l(z) - theta1 c(x_i, z)``, is a maximum over the reachable leaf
intersections (the same boxes as the 0/1 branch and bound of :mod:`otstab.solve._bounds`):

* **value_lower (certified)**. A finite family of boxes covering the input space with, for
  box ``k``, ``A_k >= sup of l over the box`` (the *independent-trees* bound: every ``M_k`` is
  at least ``base + sum over trees of the smallest leaf margin among the leaves meeting the
  box``, less the rounding band of the model's own sum, and ``l`` is decreasing in each
  ``M_k``) and ``B_k <= theta1 inf c(x_i, box)`` (the largest over trees of the distance to
  the nearest leaf of that tree within the box, to the closure of the float64 inputs), gives
  ``l_h <= max_k (h A_k - B_k)`` for every ``h`` at once. The exact dual of that finite
  d-transform (:class:`~otstab.solve._datacost_cross_entropy.FiniteOracle`) is then ``<= R``
  (the dual is decreasing in each ``l_h``; weak duality), less its rounding bound. The boxes
  come from a best-first branch and bound per sample at the current ``h``: the box with the
  largest ``h A_k - B_k`` is split on an edge of its most damaging leaf, until the box on top
  holds one leaf per tree (its value is then attained: exact at that ``h``) or the budget
  runs out. Only the upper envelope of the lines ``h A_k - B_k`` (``h >= 0``) is kept, which
  loses nothing.
* **value_upper (found, audited)**. Candidate points per sample: ``x_i`` itself and the
  input nearest ``x_i`` of each of the top boxes (for a one-leaf-per-tree box: of the leaves'
  intersection), with ``A`` = the model's own loss there and ``B = theta1 c(x_i, z)``; the
  exact dual of this finite problem is achieved by a Q* of those real points (split at a kink
  so that its risk is r), which :mod:`otstab.solve._audit` re-scores with the model. Any
  restriction of the moves can only raise R: the value is an upper bound.

Rounds: the duals' ``h`` moves the search; each round runs the branch and bound at the upper
end's ``h`` from scratch with a larger budget on the samples that carry most of the gap
(``p_i w_i (upper l_h - found l_h)``), until ``value_lower >= (1 - rtol) value_upper``,
``max_nodes`` per sample, ``node_budget`` in all or ``time_budget`` seconds. When the ends meet
within the audit's tolerance the status is ``optimal``. See docs/math.md ("Boosted trees:
logistic and cross-entropy") and docs/bounds.md.

With numba, :mod:`otstab.solve._tree_smooth_kernel` runs the same search compiled, samples in
parallel (batches of about ``CHUNK_NODES`` boxes, the time budget read between batches);
:class:`SmoothSearch` is the fallback without numba and the reference it is tested against.
"""

from __future__ import annotations

import heapq
import math
import sys
import time

import numpy as np
from otstab_solvers.dual import dual_objective, solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.weights import pmean, weights_at

from ..errors import SolverError, ValidationError
from ..modeling import _tree_margins as tree_margins
from ..modeling._costs import Rescaled
from ..modeling._nonlinear import PredictOnlyModel, as_model_input
from ..modeling._params import check_options
from . import _audit as audit
from ._bounds import (
    BOUND_OPTIONS,
    VALUE_SLACK,
    LeafTable,
    leaf_table,
    sample_leaves,
    tree_bound,
    worst_leaf,
)
from ._datacost_cross_entropy import FiniteOracle
from ._piecewise import edge_kind, edge_result
from ._refine import check_rtol
from ._results import StabilityResult

__all__ = ["tree_smooth_model", "certify_tree_smooth", "unused_features", "SmoothSearch",
           "MAX_NODES"]

#: boxes per sample (all rounds' last run) by default
MAX_NODES = 16384
#: nodes per sample in the first round; each later round multiplies it by GROWTH
FIRST_NODES = 16
GROWTH = 4
#: lines kept per sample in each finite d-transform (upper envelope, then adjacent merges)
MAX_LINES = 48
#: candidate points per sample taken from the top boxes of each run
TOP_POINTS = 6
#: rounds at most (the last ones only while the found points do not reach r)
MAX_ROUNDS = 10
#: relative move of h below which a round at the full budget is not repeated
H_MOVE = 0.02
#: share of the total weighted gap the refined samples of a round cover
GAP_SHARE = 0.9
#: a round at h searches, for sample i, only the leaves within the squared distance
#: FAR_FACTOR h lmax_i / theta1 (lmax_i: the largest loss it can reach); the inputs beyond it
#: get one line (lmax_i, that distance): below h l(x_i) up to FAR_FACTOR times the round's h
FAR_FACTOR = 4.0
#: the same in the first round (1 would search every sample; at 300 trees of depth 6 and
#: 5,000 rows 0.9 leaves 93% of them at their root box and doubles the ratio in 120 s)
FIRST_SHARE = GAP_SHARE
#: relative rounding allowance of a loss bound A and a distance bound B
A_ROUND = 1e-13
B_ROUND = 1e-12
#: boxes per batch of the compiled search (the time budget is checked between batches; a
#: batch holds at least two samples a thread)
CHUNK_NODES = 4096


def tree_smooth_model(prob):
    """``(adapter, s)`` when ``prob`` is a boosted tree ensemble bound to the logistic or
    cross-entropy loss (``s``: the per-feature scale of ``feature_costs``, or None), else
    None."""
    ad, s = prob.nonlinear, None
    if isinstance(ad, Rescaled):
        ad, s = ad.inner, ad.s
    if isinstance(ad, PredictOnlyModel) and ad.margins and \
            ad.loss_name in ("logistic", "cross_entropy"):
        return ad, s
    return None


def _priced(theta1, d2):
    """``theta1 d2`` with 0 for no move (also when ``theta1 = inf``)."""
    d2 = np.asarray(d2, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(d2 > 0, theta1 * d2, 0.0)


def _key(h, ev):
    """The largest ``h A_j - B_j`` of a box's lines."""
    return float(np.max(h * ev[0] - ev[1]))


def best_first(search, leaves: int, h: float, budget: int, deadline: float, limit: float):
    """``(heap, exact)``: the best-first search of ``search`` (its ``root`` box, and its
    ``evaluate(alive, *box)`` / ``split(*box, alive, info)``) at ``h`` from the root box over
    ``leaves`` leaves, until the box on top is exact (one leaf per tree: ``exact``) or
    ``budget`` / ``limit`` boxes or the ``deadline`` are spent. The heap's entries are
    ``(key, counter, box, evaluation)``, the largest ``h A - B`` first (``h = inf``: the
    largest loss ``A``)."""
    def key(ev):
        return -float(np.max(ev[0])) if math.isinf(h) else -_key(h, ev)

    ev = search.evaluate(np.arange(leaves), *search.root)
    if ev is None:  # pragma: no cover - the root holds x itself (distance 0 < far)
        raise AssertionError("the root box holds no input")
    heap = [(key(ev), 0, search.root, ev)]
    counter, used, exact = 1, 1, False
    while heap:
        _, _, box, top = heap[0]
        if top[3]:
            exact = True
            break
        if used >= budget or used >= limit or time.perf_counter() > deadline:
            break
        heapq.heappop(heap)
        for child in search.split(*box, top[2], top[4]):
            used += 1
            cev = search.evaluate(top[2], *child)
            if cev is not None:
                heapq.heappush(heap, (key(cev), counter, child, cev))
                counter += 1
    return heap, exact


def heap_lines(heap) -> np.ndarray:
    """The lines ``(A, B)`` of every box left in a :func:`best_first` heap, one a row."""
    return np.column_stack([np.concatenate([e[3][0] for e in heap] + [np.zeros(0)]),
                            np.concatenate([e[3][1] for e in heap] + [np.zeros(0)])])


def unused_features(prob) -> np.ndarray:
    """Boolean (d,): the features no tree of the boosted ensemble of ``prob`` splits on
    (moving them changes no margin)."""
    adapter, s = tree_smooth_model(prob)
    X = prob.X if s is None else prob.nonlinear.back(prob.X)
    table = leaf_table(adapter.model, prob.d, np.asarray(X, dtype=np.float64))
    return ~(np.isfinite(table.lo).any(axis=0) | np.isfinite(table.hi).any(axis=0))


def _ce_bound(M):
    """``log(1 + sum_k exp(-M_k))`` over the last axis (an upper bound of the loss when ``M``
    are lower bounds of the margins), rounded up."""
    M = np.atleast_1d(np.asarray(M, dtype=np.float64))
    out = np.logaddexp.reduce(np.concatenate([np.zeros(M.shape[:-1] + (1,)), -M], axis=-1),
                              axis=-1)
    return out * (1.0 + A_ROUND) + 1e-300


class SmoothSearch:
    """One sample's leaves and its branch and bound over boxes for a smooth loss.

    ``x``: the sample (caller's coordinates), ``y``: its class index, ``mv``: the movable
    features, ``w``: the prices of the squared distance per movable feature."""

    def __init__(self, table: LeafTable, x, y: int, mv, w, theta1: float):
        self.table, self.x_full, self.mv, self.theta1 = table, x, mv, theta1
        self.w = np.asarray(w, dtype=np.float64)
        (self.idx, self.lo, self.hi, self.a, self.b, self.x, self.tree, self.marg,
         self.base) = sample_leaves(table, x, y, mv)
        self.n_trees = table.n_trees
        size = float(np.max(np.abs(table.base), initial=0)) + table.scale
        # the rounding band of the model's own sum and of this one (as in the 0/1 bounds)
        self.tol = 4 * (table.n_trees + 2) * np.finfo(np.float64).eps * size + 1e-15 + \
            table.tol
        d_mv = self.x.size
        self._cut_order = (np.repeat(np.arange(d_mv), 2), np.tile([True, False], d_mv))
        # the root box and its edges (blo, bhi, ea, eb)
        self.root = (np.full(d_mv, -np.inf), np.full(d_mv, np.inf), np.full(d_mv, -np.inf),
                     np.full(d_mv, np.inf))
        self.nodes = 0
        #: squared distance from which a box's leaves are left out (run)
        self.far = math.inf

    # -- boxes --------------------------------------------------------------------------------
    def evaluate(self, alive, blo, bhi, ea=None, eb=None):
        """``(A, B, alive, single, info, point)`` of the box ``blo < c(x) <= bhi``, or None
        when no input lies in it. ``A``, ``B``: arrays of lines covering the box, ``l(z) <=
        A_j`` for every input z of the box with ``theta1 c(x, z) >= B_j`` and below the next
        ``B`` (shells by distance: a point at distance delta lies, in every tree, in a leaf
        within delta, so its margins are bounded by those leaves alone); ``single``: one leaf
        per tree (``A`` is then the loss of every input of the box up to the rounding band);
        ``point``: an input of a one-leaf-per-tree box near x (movable coordinates).
        ``ea``, ``eb``: the box's :meth:`LeafTable.edges` when known."""
        self.nodes += 1
        table = self.table
        if ea is None:
            ea, eb = table.edges(blo, bhi)
        lo = np.maximum(self.lo[alive], blo)
        hi = np.minimum(self.hi[alive], bhi)
        meet = np.all(lo < hi, axis=1)
        alive, lo, hi = alive[meet], lo[meet], hi[meet]
        a = np.maximum(self.a[alive], ea)
        b = np.minimum(self.b[alive], eb)
        gap = np.maximum(np.maximum(a - self.x, self.x - b), 0.0)
        dist = (gap * gap) @ self.w
        # only the leaves closer than far (the inputs at or beyond it: the tail line, run)
        near = dist < self.far
        alive, lo, hi, dist = alive[near], lo[near], hi[near], dist[near]
        if alive.size == 0:
            return None
        marg = self.marg[alive]
        got = tree_bound(self.tree[alive], self.n_trees, marg, self.base)
        if got is None:
            return None
        starts, mins, bound = got
        single = starts.size == alive.size
        if single:
            rlo, rhi = lo.max(axis=0), hi.min(axis=0)
            point = self.nearest_input(rlo, rhi)
            if point is None:
                return None
            ra, rb = table.edges(rlo, rhi)
            rgap = np.maximum(np.maximum(ra - self.x, self.x - rb), 0.0)
            key = max(float(np.max(dist)), float((rgap * rgap) @ self.w))
            A = np.atleast_1d(_ce_bound(bound - self.tol))
            B = self._price(np.array([key]))
        else:
            point = None  # (the input nearest x, for the top boxes only: run())
            A, B = self._shells(dist, marg, starts)
        return A, B, alive, single, (mins, starts, lo, hi, bound), point

    def _shells(self, dist, marg, starts):
        """Lines ``(A_j, B_j)``: with the leaves sorted by distance, ``A_j`` bounds the loss
        by the leaves up to the j-th (every tree present) and ``B_j`` prices its distance."""
        m = dist.size
        group = np.zeros(m, dtype=np.intp)
        group[starts[1:]] = 1
        group = np.cumsum(group)
        idx = np.arange(m)
        by_tree = np.lexsort((idx, dist, group))  # per tree, by distance (ties: index)
        v = marg[by_tree]
        # the running minimum per tree, exactly: on the ranks of the values (integers, exact
        # in float64), each tree's ranks lifted above all later trees' so that the minimum
        # restarts at every tree, then mapped back to the values themselves
        srt = np.argsort(v, axis=0, kind="stable")
        rank = np.empty(v.shape, dtype=np.float64)
        np.put_along_axis(rank, srt, np.arange(m, dtype=np.float64)[:, None], axis=0)
        off = float(m) * (group[-1] - group[by_tree]).astype(np.float64)[:, None]
        run_rank = (np.minimum.accumulate(rank + off, axis=0) - off).astype(np.intp)
        run = np.take_along_axis(np.take_along_axis(v, srt, axis=0), run_rank, axis=0)
        first = np.ones(m, dtype=bool)
        first[1:] = group[by_tree][1:] != group[by_tree][:-1]
        delta = run.copy()
        delta[1:] -= np.where(first[1:, None], 0.0, run[:-1])
        d_leaf = np.empty_like(delta)
        d_leaf[by_tree] = delta
        f_leaf = np.empty(m, dtype=bool)
        f_leaf[by_tree] = first
        order = np.lexsort((idx, dist))  # all leaves by distance (the same ties)
        total = self.base + np.cumsum(d_leaf[order], axis=0)
        present = np.cumsum(f_leaf[order])
        ds = dist[order]
        last = np.ones(m, dtype=bool)
        last[:-1] = ds[1:] > ds[:-1]  # the last of each run of equal distances
        ok = last & (present == self.n_trees)
        # the rounding of the cumulative sums (m terms) on top of the sums' band
        tol = self.tol + (m + 2) * np.finfo(np.float64).eps * (
            np.abs(self.base) + np.abs(d_leaf).sum(axis=0))
        return _ce_bound(total[ok] - tol), self._price(ds[ok])

    def nearest_input(self, lo, hi):
        """An input with ``lo < c(z) <= hi`` near x (movable coordinates), or None when the
        box holds none: x's own coordinate where it is inside, else the float64 input next to
        the edge of the closure (for float32 comparisons, closer than the float32 value
        :meth:`LeafTable.inner_point` takes), where its comparison value is inside."""
        base = self.table.inner_point(self.x, lo, hi)
        if base is None or not self.table.f32:
            return base
        ea, eb = self.table.edges(lo, hi)
        x = self.x
        with np.errstate(invalid="ignore"):
            pt = np.where(x < ea, np.nextafter(ea, np.inf), np.where(x > eb, eb, x))
            c = pt.astype(np.float32).astype(np.float64)
            ok = (c > lo) & (c <= hi) & np.isfinite(pt)
        return np.where(ok, pt, base)

    def _price(self, dist):
        """``theta1`` times squared distances, rounded down (0 stays 0)."""
        return _priced(self.theta1, dist) * (1.0 - B_ROUND)

    def split(self, blo, bhi, ea0, eb0, alive, info):
        """Split the box on an edge of the most damaging leaf of the most spread tree (the
        rule of the 0/1 bounds, on the class margin that bounds the loss most)."""
        mins, starts, lo, hi, bound = info
        worst, rows = worst_leaf(self.marg, alive, mins, starts, bound)
        js, upper_side = self._cut_order
        cut = np.where(upper_side, lo[worst][js], hi[worst][js])
        valid = (blo[js] < cut) & (cut < bhi[js])
        if not valid.any():
            # the worst leaf covers the box: cut on an edge of any other leaf of that tree
            for other in rows:
                cut = np.where(upper_side, lo[other][js], hi[other][js])
                valid = (blo[js] < cut) & (cut < bhi[js])
                if valid.any():
                    break
        if not valid.any():  # pragma: no cover - two leaves of a tree in a box differ somewhere
            raise AssertionError("no split found")
        ea, eb = self.table.edges(np.where(upper_side, cut, blo[js]),
                                  np.where(upper_side, bhi[js], cut))
        g = np.maximum(np.maximum(ea - self.x[js], self.x[js] - eb), 0.0) * \
            np.sqrt(self.w[js])
        pick = int(np.argmax(np.where(valid, g, -np.inf)))
        j, s = int(js[pick]), float(cut[pick])
        e_s = float(ea[pick] if upper_side[pick] else eb[pick])  # the edge of s
        lo1, hi1, eb1 = blo.copy(), bhi.copy(), eb0.copy()
        hi1[j], eb1[j] = s, e_s
        lo2, hi2, ea2 = blo.copy(), bhi.copy(), ea0.copy()
        lo2[j], ea2[j] = s, e_s
        return (lo1, hi1, ea0, eb1), (lo2, hi2, ea2, eb0)

    def run(self, h: float, budget: int, deadline: float = math.inf, limit: float = math.inf,
            far: float = math.inf, tail: float = math.inf):
        """Best-first search at ``h`` from the root box for at most ``budget`` boxes (and at
        most ``limit`` boxes, or until ``deadline``: the same stopping point for a deadline
        and for ``limit`` = the boxes it had examined, the checks coming in the same order).

        ``far``, ``tail``: the boxes keep only their leaves closer than ``far`` (squared,
        priced distance; their shells cover the inputs closer than it: such an input lies, in
        every tree, in a leaf closer than it) and one line ``(tail, theta1 far)`` covers the
        inputs at or beyond it (``tail``: a bound of the loss of every input, the root box's
        largest ``A``). A box with no leaf of some tree closer than ``far`` holds no input
        closer than it and is left out.

        Returns ``(lines, points, exact)``: ``lines`` (m, 2) the ``(A, B)`` of boxes covering
        the input space (``l_h <= max (h A - B)`` for every h), ``points`` the inputs (movable
        coordinates) of the top boxes at ``h``, ``exact``: the box on top holds one leaf per
        tree (its value at ``h`` is attained)."""
        self.far = far
        try:
            return self._run(h, budget, deadline, limit, far, tail)
        finally:
            self.far = math.inf

    def _run(self, h, budget, deadline, limit, far, tail):
        heap, exact = best_first(self, self.idx.size, h, budget, deadline, limit)
        lines = heap_lines(heap)
        if math.isfinite(far):
            lines = np.vstack([lines, [tail, float(self._price(np.array([far]))[0])]])
        top_entries = heapq.nsmallest(TOP_POINTS, heap)
        points = []
        for e in top_entries:
            pt = e[3][5] if e[3][3] else self.nearest_input(*e[2][:2])
            if pt is not None:
                points.append(pt)
        return lines, points, exact


# ----------------------------------------------------------------------------------------------
# finite d-transforms: upper envelopes of lines
# ----------------------------------------------------------------------------------------------


def envelope(A, B, limit=MAX_LINES):
    """Positions of the lines ``h A - B`` on their upper envelope over ``h >= 0`` (exact:
    the maximum over the others is never larger), at most ``limit`` (beyond it, adjacent
    lines are merged by the caller through :func:`merged`)."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    fin = np.flatnonzero(np.isfinite(B))
    if fin.size == 0:
        return fin
    # at h = 0 the line with the smallest B (ties: the largest A) is on top; any line with a
    # smaller A is below it for every h >= 0
    order = fin[np.lexsort((-A[fin], B[fin]))]
    # the Pareto front first (a line with a larger B and no larger A is below one before it)
    a_sorted = A[order]
    best_before = np.maximum.accumulate(np.r_[-np.inf, a_sorted[:-1]])
    keep = order[a_sorted > best_before]
    # sort by slope, ties: smallest B only
    keep = keep[np.lexsort((B[keep], A[keep]))]
    hull: list[int] = []
    for k in keep:
        if hull and A[hull[-1]] == A[k]:
            continue  # same slope, larger (or equal) B: below
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            # j is useless if k overtakes i no later than j does
            if (B[k] - B[i]) * (A[j] - A[i]) <= (B[j] - B[i]) * (A[k] - A[i]):
                hull.pop()
            else:
                break
        hull.append(int(k))
    return np.array(hull, dtype=np.intp)


def merged(A, B, limit=MAX_LINES):
    """``(A', B')``: at most ``limit`` lines whose maximum is at least that of ``(A, B)``
    for every ``h >= 0`` (the envelope, then runs of adjacent envelope lines merged into
    ``(largest A, smallest B)``)."""
    pos = envelope(A, B)
    A, B = A[pos], B[pos]
    if A.size <= limit:
        return A, B
    groups = np.array_split(np.arange(A.size), limit)
    return (np.array([A[g].max() for g in groups]), np.array([B[g].min() for g in groups]))


def _padded(rows, width):
    """(n, width) arrays A, B from per-sample line lists (``B = inf`` pads)."""
    n = len(rows)
    A = np.zeros((n, width))
    B = np.full((n, width), np.inf)
    for i, (a, b) in enumerate(rows):
        A[i, :a.size], B[i, :b.size] = a, b
    return A, B


# ----------------------------------------------------------------------------------------------
# the path
# ----------------------------------------------------------------------------------------------


def lines_oracle(lines) -> FiniteOracle:
    """The finite d-transform of per-sample lines ``[(A_i, B_i), ...]`` (padded to one
    width)."""
    return FiniteOracle(*_padded(lines, max(a.size for a, _ in lines)))


def kept_candidates(A, B) -> np.ndarray:
    """Positions of one sample's candidate lines ``(A, B)`` that the found side keeps: the
    upper envelope, with the sample itself (position 0: staying is always allowed), at most
    ``MAX_LINES``."""
    keep = envelope(A, B)
    if 0 not in keep:
        keep = np.r_[0, keep]
    return keep[:MAX_LINES]


def round_lower(lines, sol_u, r, theta2, divergence, p):
    """``(lower, sol_l, value)``: a round's over-estimate of the d-transforms (the lines),
    its dual's solution and the certified lower end from it (the dual function at its own
    optimum and at the upper end's h)."""
    lower = lines_oracle(lines)
    sol_l = solve_dual(lower, r, theta2, divergence, p=p,
                       h_init=sol_u.h if _ok(sol_u) else None)
    return lower, sol_l, _lower_value(lower, sol_l, sol_u, r, theta2, divergence, p)


def next_round(sol_u, lower, found, *, h, budget, max_nodes, rtol, value_lower, stopped,
               rounds, can_move, n, theta2, divergence, p, settled=None):
    """After a round of the interval search: None to stop, else the next round's ``(h,
    budget, samples)``. It stops when a budget stopped the round, after ``MAX_ROUNDS``,
    without moves, when the interval meets ``rtol``, and while h no longer moves at the full
    budget (or once ``settled(h_next)``: e.g. every search ended exact about the next h).
    Otherwise: the upper end's h (or, while r is out of the candidates' reach, a larger one:
    higher losses), a larger budget, and the samples that carry the gap there."""
    if stopped or rounds >= MAX_ROUNDS or not can_move:
        return None
    upper = float(sol_u.value) if _ok(sol_u) else math.inf
    if _ok(sol_u) and rtol is not None and value_lower >= (1.0 - rtol) * upper:
        return None
    h_next = float(sol_u.h) if _ok(sol_u) else 4.0 * h
    if _ok(sol_u) and (budget >= max_nodes or (settled is not None and settled(h_next))) and \
            abs(h_next - h) <= H_MOVE * h:
        return None
    todo = _gap_samples(lower, found.oracle(), h_next, theta2, divergence, p) \
        if _ok(sol_u) and rtol is not None else np.arange(n)
    if todo.size == 0:
        return None
    return h_next, min(budget * GROWTH, max_nodes), todo


def finish_interval(res, found, *, value_lower, sol_l, total, rounds, stopped, exact, log,
                    r, method, what, note):
    """The end of an interval search: the audit of the found side (a dual value it cannot
    confirm keeps Q*, which still bounds R above; a failed audit of Q* raises, ``what``
    saying "the ... failed its audit on ..."), the certified lower end and its record
    (``method``), and the interval closed or explained (``note``, with the budget that
    stopped the search)."""
    why = audit.accept(res)
    if why:
        # a dual value the audit cannot confirm (e.g. h = 0 with R below the resolution of the
        # dual: a sample within rounding of a threshold): Q* reaching r still bounds R above
        why2 = audit.accept(res, exact=False, value_lower=value_lower)
        if why2:
            raise SolverError(f"{what}: " + "; ".join(why2))
        res.info["unconfirmed_dual"] = "; ".join(why)
    res.info["lower_bound"] = {
        "method": method, "value": value_lower,
        "h": float(sol_l.h) if _ok(sol_l) else None,
        "nodes": int(total), "rounds": rounds, "stopped": stopped,
        # node_budget = this reproduces the interval on any machine (None: nothing cut)
        "node_budget": int(total) if stopped else None,
        "exact": exact.copy(), "log": log}
    res.info["candidates"] = int(sum(a.size for a in found.A))
    if res.status != audit.OPTIMAL:  # an unresolved value: the audit's interval stands
        res.value_lower = min(res.value_lower, value_lower) if value_lower > 0 else \
            res.value_lower
        return res
    if audit.close_interval(res, value_lower, r):
        return res
    if stopped:
        note += (f"; the {stopped.replace('_', ' ')} stopped the search after {total} boxes "
                 f"(node_budget={total} reproduces it on any machine)")
    res.message = f"{res.message}; {note}" if res.message else note
    return res


def no_found_rows(what, r, sol_u, value_lower, stopped, total) -> SolverError:
    """The error of a search whose found rows never reach r (``what``: "the ... found no
    points")."""
    return SolverError(
        f"{what} that reach r = {r:g} ({sol_u.native_status}); the certified "
        f"lower end is {value_lower:.6g}"
        + (f"; the {stopped.replace('_', ' ')} stopped the search after {total} boxes"
           if stopped else "") + ": raise max_nodes or the budget, or lower r")


def _options(options):
    check_options(options, BOUND_OPTIONS, "the logistic / cross-entropy loss of a tree "
                  "ensemble (the certified tree interval)")
    max_nodes = options.get("max_nodes", MAX_NODES)
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, (int, np.integer)) \
            or max_nodes < 1:
        raise ValidationError(f"max_nodes must be a positive integer, got {max_nodes!r}")
    node_budget = options.get("node_budget")
    if node_budget is not None and (isinstance(node_budget, bool) or not isinstance(
            node_budget, (int, np.integer)) or node_budget < 1):
        raise ValidationError(f"node_budget must be a positive integer, got {node_budget!r}")
    time_budget = options.get("time_budget")
    if time_budget is not None and not (isinstance(time_budget, (int, float, np.number))
                                        and not isinstance(time_budget, bool)
                                        and float(time_budget) >= 0):
        raise ValidationError(f"time_budget must be a number of seconds >= 0, got "
                              f"{time_budget!r}")
    rtol = check_rtol(options.get("rtol", 0.01))
    return int(max_nodes), node_budget, time_budget, rtol, bool(options.get("progress", False))


class _Found:
    """The found side: candidate points per sample (prob coordinates), their model losses
    ``A`` and prices ``B`` (the first candidate of every sample is the sample itself)."""

    def __init__(self, prob, loss0, theta1):
        self.prob, self.theta1 = prob, theta1
        n = prob.n
        self.Z = [prob.X[i][None, :].astype(np.float64) for i in range(n)]
        self.A = [np.array([loss0[i]]) for i in range(n)]
        self.B = [np.zeros(1) for _ in range(n)]

    def add(self, rows, Z):
        """New candidates ``Z`` (prob coordinates) for the samples ``rows``."""
        if not len(rows):
            return
        rows = np.asarray(rows, dtype=np.intp)
        Z = np.asarray(Z, dtype=np.float64)
        A = np.asarray(self.prob.losses(Z, self.prob.y[rows]), dtype=np.float64)
        diff = Z - self.prob.X[rows]
        B = _priced(self.theta1, np.einsum("ij,ij->i", diff, diff))
        for i in np.unique(rows):
            at = np.flatnonzero(rows == i)
            Ai = np.concatenate([self.A[i], A[at]])
            Bi = np.concatenate([self.B[i], B[at]])
            Zi = np.concatenate([self.Z[i], Z[at]])
            keep = kept_candidates(Ai, Bi)
            self.A[i], self.B[i], self.Z[i] = Ai[keep], Bi[keep], Zi[keep]

    def oracle(self):
        return lines_oracle(list(zip(self.A, self.B)))

    def points(self, which, src):
        return np.array([self.Z[i][c] for i, c in zip(src, which)])


def certify_tree_smooth(prob, *, r, theta1, theta2, divergence, mask=None, solver="auto",
                        **options) -> StabilityResult:
    """``certify(model, X, y, loss="logistic" / "cross_entropy")`` of a boosted tree ensemble
    (see the module doc): a certified interval, ``optimal`` when its ends meet."""
    t_start = time.perf_counter()
    if solver not in ("auto", "dual"):
        raise ValidationError(f"solver={solver!r} does not apply to the logistic / "
                              "cross-entropy loss of a tree ensemble (use 'auto')")
    max_nodes, node_budget, time_budget, rtol, progress = _options(options)
    found_model = tree_smooth_model(prob)
    if found_model is None:  # pragma: no cover - the dispatcher checks it
        raise ValidationError("not a boosted tree ensemble with a smooth loss")
    adapter, s = found_model
    model = adapter.model
    loss = adapter.loss_name
    n, d = prob.n, prob.d
    p = prob.p
    X = prob.X if s is None else prob.nonlinear.back(prob.X)  # the caller's coordinates
    X = np.asarray(X, dtype=np.float64)
    tree_margins.check_log_odds(model, as_model_input(model, X))
    table = leaf_table(model, d, X)
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    w = np.ones(d) if s is None else s * s
    yi = (prob.y > 0).astype(np.intp) if adapter.task == "binary" else \
        np.asarray(prob.y, dtype=np.intp)
    loss0 = np.asarray(prob.losses(prob.X), dtype=np.float64)
    can_move = math.isfinite(theta1) and bool(mv.any())
    edge = edge_kind(loss0, r, theta2, can_move, p)
    if edge is not None:
        return edge_result(prob, loss0, r, theta1, theta2, divergence, edge, t_start,
                           loss=loss)
    # the compiled search (otstab/solve/_tree_smooth_kernel.py) when numba is there; the
    # NumPy search (SmoothSearch) otherwise: the same boxes, lines and points
    from . import _tree_smooth_kernel as smooth_kernel  # (numba: loaded only here)

    compiled = can_move and smooth_kernel.available()
    kt = smooth_kernel.KernelTable(table, mv, w) if compiled else None
    searches: list = []
    if compiled:
        # the root box of every sample (one box each): its lines, whose largest A is the
        # largest loss a sample can reach
        roots = [(A, B) for A, B, _, _, _ in _kernel_runs(kt, X, yi, np.arange(n),
                                                           np.ones(n, dtype=np.int64), 1.0,
                                                           theta1)]
        lmax = np.array([float(np.max(A)) for A, _ in roots])
    elif can_move:
        searches = [SmoothSearch(table, X[i], int(yi[i]), mv, w[mv], theta1) for i in range(n)]
        # the largest loss a sample can reach: the bound of its root box (every leaf)
        roots = [sm.evaluate(np.arange(sm.idx.size), *sm.root)[:2] for sm in searches]
        lmax = np.array([float(np.max(ev[0])) for ev in roots])
    else:  # only reweighting: l_h = h l(x_i) exactly (the model's own loss), no search
        roots, lmax = [], loss0.copy()
    top = pmean(lmax, p) if math.isinf(theta2) else float(np.max(lmax[p > 0] if p is not None
                                                                   else lmax))
    if r > top * (1.0 + 1e-12):
        beyond = (f"r = {r:g} exceeds the largest loss any perturbation can reach "
               f"({'the mean over samples' if math.isinf(theta2) else 'the largest over samples'}"
               f" of the loss at the ensemble's lowest margins: {top:.6g})")
        return edge_result(prob, loss0, r, theta1, theta2, divergence, ("unreachable", beyond),
                           t_start, loss=loss)
    found = _Found(prob, loss0, theta1)
    deadline = math.inf if time_budget is None else t_start + float(time_budget)
    # the root boxes' lines are a first over-estimate: its dual's h starts the search
    lines: list = [merged(ev[0], ev[1]) for ev in roots] if can_move else \
        [(loss0[i:i + 1].copy(), np.zeros(1)) for i in range(n)]
    total = len(roots)
    root = lines_oracle(lines)
    sol_root = solve_dual(root, r, theta2, divergence, p=p)
    h = float(sol_root.h) if _ok(sol_root) and sol_root.h > 0 or not can_move else \
        _initial_h(table, X, mv, w, theta1, lmax, loss0)
    exact = np.full(n, not can_move)
    budget = min(FIRST_NODES, max_nodes)
    # the first round: the samples that carry the gap at the root's h, the largest first
    todo = _gap_samples(root, found.oracle(), h, theta2, divergence, p,
                        share=FIRST_SHARE) if can_move \
        else np.zeros(0, dtype=np.intp)
    rounds, stopped = 0, None
    sol_u = sol_l = None
    value_lower = 0.0
    log = []
    while True:
        rounds += 1
        new_rows: list = []
        new_points: list = []
        pos, t_round = 0, time.perf_counter()
        far = _far(h, lmax, theta1)
        while pos < todo.size:
            # (the stops are checked before and after each sample's search (each batch's,
            # compiled), and inside it (NumPy): a time budget stops where node_budget = the
            # boxes examined stops again)
            stopped = _stop(node_budget, total, deadline)
            if stopped:
                break
            if compiled:
                # a batch in parallel; one sample (with the rest of the budget) where the
                # node budget could cut the batch: each sample's search is then the one the
                # sequential loop would run
                ids = todo[pos:pos + max(2 * smooth_kernel.threads(), CHUNK_NODES // budget)]
                b = budget
                if node_budget is not None and node_budget - total < ids.size * (budget + 1):
                    ids = ids[:1]
                    b = max(1, min(budget, node_budget - total))
                runs = _kernel_runs(kt, X, yi, ids, np.full(ids.size, b, dtype=np.int64), h,
                                    theta1, far[ids], lmax[ids])
            else:
                ids = todo[pos:pos + 1]
                sm = searches[int(ids[0])]
                sm.nodes = 0
                L, pts, ex = sm.run(h, budget, deadline,
                                    math.inf if node_budget is None else node_budget - total,
                                    far[ids[0]], lmax[ids[0]])
                runs = [(*merged(L[:, 0], L[:, 1]), pts, ex, sm.nodes)]
            for i, (A, B, pts, ex, used) in zip(ids, runs):
                total += used
                lines[i], exact[i] = (A, B), ex
                new_rows.append(np.full(len(pts), i))
                new_points.append(_to_prob(pts, X[i], mv, s))
            pos += ids.size
            if progress and compiled and time.perf_counter() - t_round > 2.0:
                t_round = time.perf_counter()
                sys.stderr.write(f"  tree interval: round {rounds}, {pos}/{todo.size} samples "
                                 f"{total} boxes {t_round - t_start:.1f}s\n")
                sys.stderr.flush()
            stopped = _stop(node_budget, total, deadline)
            if stopped:
                break
        if new_rows:  # one call of the model per round (its predict has a fixed cost)
            found.add(np.concatenate(new_rows), np.concatenate(new_points))
        sol_u = solve_dual(found.oracle(), r, theta2, divergence, p=p)
        lower, sol_l, proved = round_lower(lines, sol_u, r, theta2, divergence, p)
        # every round's over-estimate is a proof of its own: the best one stands
        value_lower = max(value_lower, proved)
        upper = float(sol_u.value) if _ok(sol_u) else math.inf
        log.append({"round": rounds, "nodes": int(total), "h": h, "lower": value_lower,
                    "upper": upper})
        if progress:
            sys.stderr.write(f"  tree interval: round {rounds} [{value_lower:.6g}, "
                             f"{upper:.6g}] {total} boxes {time.perf_counter() - t_start:.1f}s\n")
            sys.stderr.flush()
        step = next_round(sol_u, lower, found, h=h, budget=budget, max_nodes=max_nodes,
                          rtol=rtol, value_lower=value_lower, stopped=stopped, rounds=rounds,
                          can_move=can_move, n=n, theta2=theta2, divergence=divergence, p=p)
        if step is None:
            break
        h, budget, todo = step
    if not _ok(sol_u):
        raise no_found_rows("the logistic / cross-entropy certificate of the tree ensemble "
                            "found no points", r, sol_u, value_lower, stopped, total)
    res = _build(prob, found, sol_u, loss, loss0, r, theta1, theta2, divergence, t_start)
    return finish_interval(
        res, found, value_lower=value_lower, sol_l=sol_l, total=total, rounds=rounds,
        stopped=stopped, exact=exact, log=log, r=r,
        method="branch-and-bound over leaf boxes (independent-trees bound of the margins), "
               "exact dual of the finite over-estimate of l_h",
        what="the tree ensemble's logistic / cross-entropy certificate failed its audit on "
             "the model's own losses at Q*",
        note=f"{loss} loss of a tree ensemble: the audited Q* of real points gives the upper "
             "end (value_upper), the exact dual of an over-estimate of l_h from leaf boxes "
             "the certified lower end (value_lower)")


def _stop(node_budget, total, deadline):
    """``"node_budget"`` or ``"time_budget"`` when that budget is spent, else None."""
    if node_budget is not None and total >= node_budget:
        return "node_budget"
    if time.perf_counter() > deadline:
        return "time_budget"
    return None


def _ok(sol) -> bool:
    return sol is not None and sol.status == OPTIMAL and math.isfinite(sol.h) and \
        math.isfinite(sol.value)


def _to_prob(points, x, mv, s):
    """Full rows in the problem's coordinates from movable coordinates ``points``."""
    if not points:
        return np.zeros((0, x.size))
    Z = np.tile(x, (len(points), 1))
    Z[:, mv] = np.asarray(points)
    return Z if s is None else Z * s[None, :]


def _kernel_runs(kt, X, yi, ids, budgets, h, theta1, far=None, tail=None):
    """:meth:`SmoothSearch.run` of the samples ``ids`` by the compiled search: a list of
    ``(A, B, points, exact, used)`` (the lines merged as :func:`merged` does)."""
    from . import _tree_smooth_kernel as smooth_kernel

    return smooth_kernel.smooth_batch(kt, X, yi, ids, budgets, h, theta1, MAX_LINES,
                                      TOP_POINTS, far, tail)


def _far(h, lmax, theta1):
    """Per sample the squared distance beyond which a round at ``h`` leaves the leaves out
    (:data:`FAR_FACTOR`; infinite where it is not a positive number)."""
    with np.errstate(invalid="ignore", over="ignore"):
        far = FAR_FACTOR * h * lmax / theta1
    return np.where(np.isfinite(far) & (far > 0), far, np.inf)


def _initial_h(table, X, mv, w, theta1, lmax, loss0):
    """A first ``h``: the price at which reaching the largest loss costs about as much as the
    distance to the nearest leaf edge, typically (medians over samples)."""
    dist, gain = [], []
    a_all, b_all = table.leaf_edges()
    fixed = ~mv
    C = table.comparable(X)
    for i in range(X.shape[0]):  # (the leaves holding x_i in its fixed features)
        ok = np.all((table.lo[:, fixed] < C[i, fixed]) & (C[i, fixed] <= table.hi[:, fixed]),
                    axis=1)
        a, b, x = a_all[ok][:, mv], b_all[ok][:, mv], X[i, mv]
        gap = np.maximum(np.maximum(a - x, x - b), 0.0)
        dd = (gap * gap) @ w[mv]
        dd = dd[dd > 0]
        if dd.size:
            dist.append(float(dd.min()) * theta1)
    gain = np.maximum(lmax - loss0, 0.0)
    g = float(np.median(gain[gain > 0])) if np.any(gain > 0) else 1.0
    dm = float(np.median(dist)) if dist else 1.0
    return max(dm / g, 1e-12) * 2.0


def _lower_value(lower, sol_l, sol_u, r, theta2, divergence, p) -> float:
    """The certified lower end: the dual function of the over-estimate at the best ``h``
    found (its own optimum, the upper end's h), less its rounding bound."""
    best = 0.0
    for sol in (sol_l, sol_u):
        if sol is None or not math.isfinite(sol.h):
            continue
        h = float(sol.h)
        val = float(dual_objective(lower.evaluate(h)[0], h, r, theta2, divergence, p))
        if math.isfinite(val):
            best = max(best, val - VALUE_SLACK * abs(val) - audit.CANCEL_RTOL * abs(h) * r)
    return max(best, 0.0)


def _gap_samples(lower, upper, h, theta2, divergence, p, share=GAP_SHARE):
    """The samples whose gap ``p_i w_i (upper l_h - found l_h)`` at ``h`` covers ``share`` of
    the total, largest first (the order of the next round: under a budget the samples that
    matter most are refined first). (A search that ended exact at another h may not be at
    this one: ``exact`` is not read.)"""
    lu = lower.evaluate(h)[0]
    lf = upper.evaluate(h)[0]
    wts, _ = weights_at(lf, theta2, divergence, p)
    n = lu.size
    pw = wts / n if p is None else wts * p
    gap = pw * np.maximum(lu - lf, 0.0)
    tot = float(gap.sum())
    order = np.argsort(-gap, kind="stable")
    if share >= 1.0:
        return order
    if not tot > 0:
        return np.zeros(0, dtype=np.intp)
    cum = np.cumsum(gap[order])
    k = int(np.searchsorted(cum, share * tot)) + 1
    return order[:k]


def _build(prob, found, sol, loss, loss0, r, theta1, theta2, divergence, t_start):
    """Q* of the candidates' dual at its h (split at a kink so that its risk is r)."""
    n, p = prob.n, prob.p
    fo = found.oracle()
    h = float(sol.h)
    wts, alpha, src, mass, which, lh = fo.split_at(h, r, theta2, divergence, p)
    X_star = found.points(which, src)
    res = audit.audit_points(prob, X_star, src, mass, wts[src], theta1, theta2, divergence,
                             float(sol.value))
    return StabilityResult(
        value=float(sol.value), h=h, alpha=alpha if divergence == "chi2" else None,
        X_star=X_star, weights=wts[src], source=src, mass=mass, solver="dual",
        status=sol.status, solve_time=sol.solve_time, r=r, theta1=theta1, theta2=theta2,
        divergence=divergence, loss=loss, message="", dual_gap_bound=sol.gap_bound,
        iterations=sol.iterations, split=src.size > n, X=prob.X,
        feature_names=prob.feature_names, index=prob.index,
        info={"oracle": "FiniteOracle (tree candidates)", "native_status": sol.native_status,
              "wall_time": time.perf_counter() - t_start, **sol.info},
        **res)
