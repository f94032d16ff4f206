"""``certify(tree pipeline, ..., loss="logistic" / "cross_entropy", cost=DataCost)``: boosted
tree ensembles under a cost on the data's own variables, a certified interval (issue 29).

The d-transform of sample ``i`` is a maximum over the raw leaf regions it can reach
(:class:`otstab.solve._raw_trees.RawTable`: every leaf as intervals of the numeric and integer
variables and level sets of the categorical ones)::

    l_h(x_i) = sup over valid raw rows u of  h l(u) - theta1 c(x_i, u)

with ``l`` the log-loss of the ensemble's margins (constant on every intersection of one leaf
per tree) and ``c`` the DataCost. The design is that of :mod:`otstab.solve._tree_smooth`,
with raw boxes in place of encoded ones:

* **value_lower (certified)**. A best-first branch and bound over raw boxes (the root: the
  values the sample may take, bounds, ``increase_only`` / ``decrease_only`` and immutables
  applied; a categorical level it may not take is left out) keeps, for each box, lines
  ``(A_j, B_j)`` with ``l(u) <= A_j`` for every raw row ``u`` of the box whose priced cost is at
  least ``B_j``: the leaves meeting the box sorted by their least cost from ``x_i``, ``A_j``
  the independent-trees bound (the smallest margin of each tree among its leaves up to the
  j-th, less the rounding band of the model's sum) and ``B_j = theta1`` times the j-th cost
  (a row at cost delta lies, in every tree, in a leaf of cost at most delta). The least cost
  from ``x_i`` to a raw box is *exact*, not a relaxation: the DataCost is a sum over variables,
  and each term is that variable's least cost over its interval (integers: the nearest integer
  inside) or level set (the cheapest allowed level). Hence ``l_h <= max_j (h A_j - B_j)`` for
  every h, and the exact dual of that finite d-transform (a
  :class:`~otstab.solve._datacost_cross_entropy.FiniteOracle`, decreasing in each ``l_h``) is a
  lower bound on R by weak duality (less its rounding bound).
* **value_upper (found, audited)**. Candidate raw rows per sample: ``x_i`` itself and the
  cheapest raw row of each of the top boxes at the round's h (a valid row: the value of
  ``x_i`` where it is inside, else the nearest raw value inside the interval; the cheapest
  allowed level). Their losses come from the Pipeline itself (its ``transform``, then the
  ensemble's own margins, whose softmax is checked against ``predict_proba``), their prices
  from the DataCost (:meth:`ResolvedCost.cost`). The exact dual of this finite problem gives
  Q* (split at a kink so that its risk is r), whose raw rows the audit re-scores and
  re-prices: restricting the moves can only raise R, so its value is an upper bound.

Rounds over h, budgets (``max_nodes`` per sample, ``node_budget`` in all, ``time_budget``
seconds; a stop by time records the boxes examined, ``node_budget`` reproduces it), ``rtol``
and the status promises are those of :func:`otstab.solve._tree_smooth.certify_tree_smooth`:
``optimal`` only when the ends meet within the audit's tolerance, else ``bounds`` with
``value_lower`` certified. See docs/math.md ("Boosted trees under a DataCost").
"""

from __future__ import annotations

import heapq
import math
import sys
import time

import numpy as np
import pandas as pd
from otstab_solvers.dual import solve_dual

from ..modeling import _tree_margins as tree_margins
from ..modeling._nonlinear import as_model_input
from ._bounds import tree_bound
from ._datacost_cross_entropy import _priced as priced_costs
from ._datacost_linear import encode
from ._datacost_result import edges_before_dual, raw_result
from ._datacost_trees import _moved_frame, final_estimator
from ._raw_trees import RawTable, _as_row, _RawSample, raw_table, sample_costs
from ._tree_smooth import (
    B_ROUND,
    FAR_FACTOR,
    FIRST_NODES,
    FIRST_SHARE,
    H_MOVE,
    TOP_POINTS,
    SmoothSearch,
    _ce_bound,
    _gap_samples,
    _ok,
    _options,
    _stop,
    best_first,
    finish_interval,
    heap_lines,
    kept_candidates,
    lines_oracle,
    merged,
    next_round,
    no_found_rows,
    round_lower,
)

__all__ = ["RawSmoothSearch", "certify_datacost_tree_smooth"]

#: boxes per sample of the search for its largest loss (only while the found rows do not
#: reach r)
DIVE_NODES = 64


class RawSmoothSearch(_RawSample):
    """One sample's branch and bound over raw boxes for a smooth loss: the boxes, leaves and
    split rule of :class:`otstab.solve._raw_trees._RawSample`, each box summarised by lines
    ``(A, B)`` as in :class:`otstab.solve._tree_smooth.SmoothSearch` (module doc).

    ``x``, ``w``, ``c``: the sample's numeric values, the prices of their squared moves and
    its level costs (:func:`otstab.solve._raw_trees.sample_costs`); ``root``: its root box
    ``(lo, hi, level mask)``; ``y``: its class position."""

    #: the lines of a box from its leaves' costs (shared with the encoded search)
    _shells = SmoothSearch._shells

    def __init__(self, raw: RawTable, x, w, c, y: int, root, theta1: float):
        super().__init__(raw, x, w, c, y, math.inf, None)
        self.theta1 = theta1
        self.n_trees = raw.n_trees
        self.root = root
        self.nodes = 0
        #: squared, priced distance from which a box's leaves are left out (run: ``far``)
        self.far = math.inf
        # each variable's current level (cost 0; None: some other level is free too)
        cur = np.flatnonzero(np.asarray(c) == 0)
        self._cur = cur if cur.size == self.ncat else None

    def _levels(self, alive, bmask):
        """``(kept, level cost)``: the leaves ``alive`` that allow some level of the box in
        every categorical variable, and the cheapest such level per variable, summed. Only
        the variables the box restricts are checked (a leaf allows some level of each
        variable); only the leaves that exclude a current level are priced."""
        raw = self.raw
        M = raw.mask[alive]
        keep = np.ones(alive.size, dtype=bool)
        full = np.logical_and.reduceat(bmask, self.cs)
        for k in np.flatnonzero(~full):
            s, e = raw.start[k], raw.start[k + 1]
            keep &= (M[:, s:e] & bmask[s:e]).any(axis=1)
        M = M[keep]
        cost = np.zeros(M.shape[0])
        if self._cur is not None and bmask[self._cur].all():
            away = np.flatnonzero(~M[:, self._cur].all(axis=1))
        else:
            away = np.arange(M.shape[0])
        if away.size:
            cost[away] = self._cat_min(M[away] & bmask)
        return keep, cost

    def _price(self, dist):
        """``theta1`` times raw costs, rounded down (0 stays 0)."""
        d = np.asarray(dist, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            return np.where(d > 0, self.theta1 * d, 0.0) * (1.0 - B_ROUND)

    def evaluate(self, alive, blo, bhi, bmask):  # type: ignore[override]
        """``(A, B, alive, single, info, point)`` of the raw box, or None when no valid raw row
        lies in it; ``point``: its cheapest raw row ``(cost, values, level positions)`` for a
        one-leaf-per-tree box (None otherwise)."""
        self.nodes += 1
        raw = self.raw
        lo = np.maximum(raw.lo[alive], blo)
        hi = np.minimum(raw.hi[alive], bhi)
        meet = np.all(lo < hi, axis=1)
        alive, lo, hi = alive[meet], lo[meet], hi[meet]
        if self.ncat:
            keep, cat_cost = self._levels(alive, bmask)
            alive, lo, hi = alive[keep], lo[keep], hi[keep]
        else:
            cat_cost = 0.0
        if alive.size == 0:
            return None
        gap = self._num_gap(lo, hi)
        dist = (gap * gap) @ self.w + cat_cost
        # only the leaves closer than far (the rows at or beyond it: the tail line, run)
        fin = np.isfinite(dist) & (self.theta1 * dist < self.far)
        alive, lo, hi, dist = alive[fin], lo[fin], hi[fin], dist[fin]
        if alive.size == 0:
            return None
        marg = self.marg[alive]
        got = tree_bound(raw.tree[alive], raw.n_trees, marg, self.base)
        if got is None:
            return None
        starts, mins, bound = got
        single = starts.size == alive.size
        point = None
        if single:
            rlo, rhi = lo.max(axis=0), hi.min(axis=0)
            rM = (raw.mask[alive] & bmask).all(axis=0) if self.ncat else np.zeros(0, dtype=bool)
            if np.any(rlo >= rhi) or (self.ncat and not np.logical_or.reduceat(
                    rM, self.cs).all()):
                return None
            closure = float((self._num_gap(rlo[None], rhi[None])[0] ** 2) @ self.w
                            + self._cat_min(rM[None])[0])
            if not math.isfinite(closure):
                return None
            point = self._point(rlo, rhi, rM)
            A = np.atleast_1d(_ce_bound(bound - self.tol))
            B = self._price(np.array([max(closure, float(np.max(dist)))]))
        else:
            A, B = self._shells(dist, marg, starts)
        return A, B, alive, single, (mins, starts, lo, hi, None, bound), point

    def nearest(self, box):
        """The cheapest raw row of a box (``(cost, values, level positions)``), or None."""
        blo, bhi, bmask = box
        if np.any(blo >= bhi) or (self.ncat and not np.logical_or.reduceat(
                bmask, self.cs).all()):
            return None
        pt = self._point(blo, bhi, bmask)
        return pt if math.isfinite(pt[0]) else None

    def run(self, h: float, budget: int, deadline: float = math.inf, limit: float = math.inf,
            far: float = math.inf, tail: float = math.inf):
        """Best-first search at ``h`` from the root box (at most ``budget`` and ``limit``
        boxes, until ``deadline``; ``h = inf``: the largest loss bound first). Returns
        ``(lines (m, 2), points, exact)``: the lines of the open boxes (``l_h <= max (h A -
        B)`` for every h; their largest ``A`` bounds every reachable loss), the cheapest raw
        rows of the top boxes at ``h``, and whether the box on top holds one leaf per tree
        (``l_h`` attained up to rounding at this h).

        ``far``, ``tail``: the boxes keep only their leaves whose priced cost is below ``far``
        (a row cheaper than ``far`` lies, in every tree, in such a leaf) and one line
        ``(tail, far)`` covers the rows at or beyond it (``tail``: a bound of every reachable
        loss)."""
        self.far = far
        try:
            return self._run(h, budget, deadline, limit, far, tail)
        finally:
            self.far = math.inf

    def _run(self, h, budget, deadline, limit, far, tail):
        heap, exact = best_first(self, self.raw.lo.shape[0], h, budget, deadline, limit)
        lines = heap_lines(heap)
        if math.isfinite(far):
            lines = np.vstack([lines, [tail, far * (1.0 - B_ROUND)]])
        points = []
        for e in heapq.nsmallest(TOP_POINTS, heap):
            pt = e[3][5] if e[3][3] else self.nearest(e[2])
            if pt is not None:
                points.append(pt)
        return lines, points, exact


class _RawFound:
    """The found side: candidate raw rows per sample (``None``: the sample itself, always
    kept), their losses from the Pipeline (``A``) and their priced costs (``B``)."""

    def __init__(self, model, prob, rc, frame, loss0, theta1, yi):
        self.model, self.prob, self.rc, self.frame = model, prob, rc, frame
        self.theta1, self.yi = theta1, yi
        n = prob.n
        self.moves: list = [[None] for _ in range(n)]
        self.A = [np.array([loss0[i]]) for i in range(n)]
        self.B = [np.zeros(1) for _ in range(n)]

    def add(self, rows, moves):
        """New candidates: ``moves[k]`` (``{variable: value}``) for sample ``rows[k]``."""
        if not len(rows):
            return
        rows = np.asarray(rows, dtype=np.intp)
        sub = self.frame.iloc[rows].reset_index(drop=True)
        moved = _moved_frame(sub, moves)
        A = model_losses(self.model, self.prob, moved, rows)
        B = priced_costs(self.rc.cost(sub, moved), self.theta1)
        for i in np.unique(rows):
            at = np.flatnonzero(rows == i)
            Ai = np.concatenate([self.A[i], A[at]])
            Bi = np.concatenate([self.B[i], B[at]])
            mv = self.moves[i] + [moves[k] for k in at]
            keep = kept_candidates(Ai, Bi)
            self.A[i], self.B[i] = Ai[keep], Bi[keep]
            self.moves[i] = [mv[k] for k in keep]

    def oracle(self):
        return lines_oracle(list(zip(self.A, self.B)))

    def rows(self, which, src) -> pd.DataFrame:
        """The raw rows of the atoms (sample ``src[a]``'s candidate ``which[a]``)."""
        sub = self.frame.iloc[np.asarray(src)].reset_index(drop=True)
        return _moved_frame(sub, [self.moves[i][c] for i, c in zip(src, which)])


def model_losses(model, prob, rows: pd.DataFrame, src) -> np.ndarray:
    """The loss of raw rows by the Pipeline itself: its ``transform``, then the ensemble's own
    margins (their softmax checked against its ``predict_proba``), labels of samples
    ``src``."""
    Z = encode(model, rows)
    final = final_estimator(model)
    tree_margins.check_log_odds(final, as_model_input(final, Z))
    return np.asarray(prob.losses(Z, prob.y[np.asarray(src)]), dtype=np.float64)


def _unreachable(model, prob, rc, frame, loss0, r, theta1, theta2, divergence, t_start,
                 loss_name, top):
    """r above the largest loss any valid raw row reaches: R = inf."""
    why = (f"r = {r:g} exceeds the largest loss any valid raw row can reach "
           f"({'the mean over samples' if math.isinf(theta2) else 'the largest over samples'}"
           f" of the loss at the ensemble's lowest margins: {top:.6g})")
    return edges_before_dual(model, prob, rc, frame, loss0, r, theta1, theta2, divergence,
                             t_start, loss_name, edge=("unreachable", why))


def certify_datacost_tree_smooth(model, prob, rc, frame, *, r, theta1, theta2, divergence,
                                 solver, t_start, loss_name, **options):
    """The logistic / cross-entropy certificate of a boosted tree Pipeline under a DataCost
    (module doc), its inputs prepared by :func:`otstab.solve._datacost_certify.
    certify_datacost` (``prob``: the resolved model, ``prob.X`` the encoded rows; ``rc``: the
    resolved cost; ``frame``: the raw rows)."""
    max_nodes, node_budget, time_budget, rtol, progress = _options(options)
    final = final_estimator(model)
    classes = np.asarray(final.classes_)
    yi = np.searchsorted(classes, np.asarray(prob.y_original)).astype(np.intp)
    Z = np.asarray(prob.X, dtype=np.float64)
    tree_margins.check_log_odds(final, as_model_input(final, Z))
    n, p = prob.n, prob.p
    loss0 = np.asarray(prob.losses(prob.X), dtype=np.float64)
    edge = edges_before_dual(model, prob, rc, frame, loss0, r, theta1, theta2, divergence,
                             t_start, loss_name)
    if edge is not None:
        return _finish(edge, prob, rc, t_start)
    raw = raw_table(final, rc, frame, lambda f: encode(model, f), Z)
    X, w, rlo, rhi, c = sample_costs(raw, rc, frame)
    searches = [RawSmoothSearch(raw, X[i], w, c[i], int(yi[i]),
                                (rlo[i].copy(), rhi[i].copy(), np.isfinite(c[i])), theta1)
                for i in range(n)]
    can_move = math.isfinite(theta1)
    if can_move:
        roots = [sm.evaluate(np.arange(raw.lo.shape[0]), *sm.root)[:2] for sm in searches]
    else:  # nothing moves: l_h = h l(x_i) exactly (the Pipeline's own loss), no search
        roots = [(loss0[i:i + 1].copy(), np.zeros(1)) for i in range(n)]
    lmax = np.array([float(np.max(A)) for A, _ in roots])
    total = n
    top = _reach(lmax, p, theta2)
    if r > top * (1.0 + 1e-12):
        return _finish(_unreachable(model, prob, rc, frame, loss0, r, theta1, theta2,
                                    divergence, t_start, loss_name, top), prob, rc, t_start)
    found = _RawFound(model, prob, rc, frame, loss0, theta1, yi)
    deadline = math.inf if time_budget is None else t_start + float(time_budget)
    lines: list = [merged(A, B) for A, B in roots]
    lower = lines_oracle(lines)
    sol_root = solve_dual(lower, r, theta2, divergence, p=p)
    h = float(sol_root.h) if _ok(sol_root) and sol_root.h > 0 else 1.0
    exact = np.zeros(n, dtype=bool)
    h_of = np.full(n, math.nan)  # the h of each sample's last search
    budget = min(FIRST_NODES, max_nodes)
    todo = _gap_samples(lower, found.oracle(), h, theta2, divergence, p, share=FIRST_SHARE) \
        if can_move else np.zeros(0, dtype=np.intp)
    rounds, stopped = 0, None
    sol_u = sol_l = None
    value_lower = 0.0
    log = []
    t_bar = time.perf_counter()
    while True:
        rounds += 1
        new_rows: list = []
        new_moves: list = []
        for pos, i in enumerate(todo):
            stopped = _stop(node_budget, total, deadline)
            if stopped:
                break
            sm = searches[int(i)]
            sm.nodes = 0
            far = FAR_FACTOR * h * lmax[i]
            L, pts, ex = sm.run(h, budget, deadline,
                                math.inf if node_budget is None else node_budget - total,
                                far if math.isfinite(far) and far > 0 else math.inf,
                                float(lmax[i]))
            total += sm.nodes
            lines[i], exact[i], h_of[i] = merged(L[:, 0], L[:, 1]), ex, h
            for pt in pts:
                new_rows.append(int(i))
                new_moves.append(_as_row(raw, pt))
            if progress and time.perf_counter() - t_bar > 2.0:
                t_bar = time.perf_counter()
                sys.stderr.write(f"  tree interval (DataCost): round {rounds}, "
                                 f"{pos + 1}/{todo.size} samples {total} boxes "
                                 f"{t_bar - t_start:.1f}s\n")
                sys.stderr.flush()
        found.add(new_rows, new_moves)
        sol_u = solve_dual(found.oracle(), r, theta2, divergence, p=p)
        if not _ok(sol_u) and not stopped and can_move:
            # the found rows do not reach r: per sample a search for its largest loss, whose
            # top rows are found rows of high loss and whose open boxes bound the largest
            # loss it can reach (then r may be proved unreachable)
            new_rows, new_moves = [], []
            for i in range(n):
                stopped = _stop(node_budget, total, deadline)
                if stopped:
                    break
                sm = searches[i]
                sm.nodes = 0
                L, pts, _ = sm.run(math.inf, max(budget, DIVE_NODES), deadline,
                                   math.inf if node_budget is None else node_budget - total)
                total += sm.nodes
                lmax[i] = min(lmax[i], float(np.max(L[:, 0])))
                for pt in pts:
                    new_rows.append(i)
                    new_moves.append(_as_row(raw, pt))
            found.add(new_rows, new_moves)
            sol_u = solve_dual(found.oracle(), r, theta2, divergence, p=p)
            top = _reach(lmax, p, theta2)
            if not _ok(sol_u) and r > top * (1.0 + 1e-12):
                return _finish(_unreachable(model, prob, rc, frame, loss0, r, theta1, theta2,
                                            divergence, t_start, loss_name, top), prob, rc,
                               t_start)
        lower, sol_l, proved = round_lower(lines, sol_u, r, theta2, divergence, p)
        value_lower = max(value_lower, proved)
        upper = float(sol_u.value) if _ok(sol_u) else math.inf
        log.append({"round": rounds, "nodes": int(total), "h": h, "lower": value_lower,
                    "upper": upper})
        if progress:
            sys.stderr.write(f"  tree interval (DataCost): round {rounds} [{value_lower:.6g}, "
                             f"{upper:.6g}] {total} boxes {time.perf_counter() - t_start:.1f}s\n")
            sys.stderr.flush()
        step = next_round(sol_u, lower, found, h=h, budget=budget, max_nodes=max_nodes,
                          rtol=rtol, value_lower=value_lower, stopped=stopped, rounds=rounds,
                          can_move=can_move, n=n, theta2=theta2, divergence=divergence, p=p,
                          settled=lambda h_next: bool(np.all(
                              exact & (np.abs(h_of - h_next) <= H_MOVE * h_next))))
        if step is None:
            break
        h, budget, todo = step
    if not _ok(sol_u):
        raise no_found_rows("the logistic / cross-entropy certificate of the tree Pipeline "
                            "under the DataCost found no valid raw rows", r, sol_u,
                            value_lower, stopped, total)
    res = _build(model, prob, rc, frame, found, sol_u, loss0, r, theta1, theta2, divergence,
                 t_start, loss_name)
    return _finish(finish_interval(
        res, found, value_lower=value_lower, sol_l=sol_l, total=total, rounds=rounds,
        stopped=stopped, exact=exact, log=log, r=r,
        method="branch-and-bound over raw leaf boxes (independent-trees bound of the "
               "margins, exact least DataCost to each box), exact dual of the finite "
               "over-estimate of l_h",
        what="the tree Pipeline's logistic / cross-entropy certificate under the DataCost "
             "failed its audit on the Pipeline's own losses and the cost of Q*'s raw rows",
        note=f"{loss_name} loss of a tree Pipeline under the DataCost: the audited Q* of "
             "valid raw rows gives the upper end (value_upper), the exact dual of an "
             "over-estimate of l_h from raw leaf boxes the certified lower end "
             "(value_lower)"), prob, rc, t_start)


def _reach(lmax, p, theta2) -> float:
    """The largest risk any perturbation reaches from per-sample loss bounds ``lmax``: their
    mean (``theta2 = inf``), else their largest over the samples of positive weight."""
    n = lmax.size
    if math.isinf(theta2):
        return float(np.sum(lmax * (p if p is not None else 1.0 / n)))
    return float(np.max(lmax[p > 0] if p is not None else lmax))


def _finish(res, prob, rc, t_start):
    res.info["cost"] = rc.to_dict()
    res.info["cost_description"] = rc.describe()
    if prob.weights is not None:
        res.info["sample_weight"] = prob.weights
    res.info["wall_time"] = time.perf_counter() - t_start
    return res


def _build(model, prob, rc, frame, found, sol, loss0, r, theta1, theta2, divergence, t_start,
           loss_name):
    """Q* of the candidates' dual at its h (split at a kink so that its risk is r), its raw
    rows re-scored by the Pipeline and re-priced by the cost (a candidate: the caller
    audits it)."""
    fo = found.oracle()
    h = float(sol.h)
    wts, alpha, src, mass, which, _ = fo.split_at(h, r, theta2, divergence, prob.p)
    star = found.rows(which, src)
    loss_star = model_losses(model, prob, star, src)
    moved2 = np.asarray(rc.cost(frame.iloc[src].reset_index(drop=True), star),
                        dtype=np.float64)
    alpha = None if math.isinf(theta2) else alpha
    return raw_result(model, prob, rc, frame, star, src, mass, wts[src], loss0, loss_star,
                      moved2, float(sol.value), h, alpha, r, theta1, theta2, divergence,
                      t_start, sol, loss_name)
