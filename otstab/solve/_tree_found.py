"""A fast found side for tree ensembles, 0/1 loss (issue 29: speed).

The generic perturbation search (:mod:`otstab.modeling._perturbation`) scans every coordinate
line, random directions and their refinements with the model's own ``predict``: thousands of
predictions per sample, most of the time of a large ensemble's certificate (XGBoost and
LightGBM at 300 trees of depth 6: 720-820 s of 840-940 s for 5,000 rows). Here the upper ends
of the distances ``d*_i`` are found with far fewer, far cheaper evaluations:

1. **candidates**: for each sample, its ``k`` nearest evaluation rows that the model predicts
   as another class (among at most :data:`NEIGHBOUR_ROWS` rows of each predicted class, evenly
   spaced: the search over all rows is quadratic); on the segment from ``x_i`` to each, a
   bisection for a flip point (the candidate end is misclassified, the ``x_i`` end is not):
   :data:`COARSE` halvings on every segment, the rest on the :data:`KEEP` segments whose flip
   point is nearest;
2. the **coordinate-wise shrink** of the best point towards ``x_i`` threshold by threshold
   (:func:`otstab.modeling._perturbation._coordinate_shrink`: exact along each coordinate),
   one sweep over the coordinates, then the remaining sweeps, ``n_refine`` rounds of random
   perturbations of the best direction and a second shrink (the refinement), for the samples
   the budget below selects;
3. for XGBoost and LightGBM the evaluations of steps 1-2 are done by **a compiled walk of the
   leaf table** (:class:`TreeEvaluator`, numba): the trees rebuilt from the table's leaf boxes
   as complete binary trees and walked without branches, a level at a time over a block of
   rows, blocks in parallel, checked against the table's own scores (themselves checked
   against the model's) before use. At 500 trees of depth 6 it scores 205,000 to 215,000 rows
   a second on this 2-core machine against XGBoost's own ``predict`` at 98,000 to 113,000
   (load 1.6) and LightGBM's at about 14,000; without numba, or for other libraries, the
   model's own ``predict``;
4. **the model's own predict** on every final point: a point the model does not misclassify
   (the walk sums in another order; a tie) is dropped, and such samples, as well as samples
   with no candidate, go to the generic search.

Every distance returned belongs to a point the model itself misclassifies, so it is an upper
bound on ``d*_i``, as the generic search's are; the audit re-scores Q* with the model again.
Closer points come later from the certified side: a search of the branch and bound that
completes ends on a box with one leaf per tree, whose input nearest ``x_i`` is misclassified
at the exact distance (:meth:`otstab.solve._bounds._Sample.point`); certify adopts it after
the model's check.

**Budget.** R depends on a distance only through ``(h - theta1 d_i)_+``, ``h`` the 0/1 dual's
threshold on the found distances: a sample far above ``h`` does not enter ``value_upper``,
however loosely its distance is known. With ``duals`` (certify passes the problem's), every
sample gets the bisection; the samples with ``theta1 d_i < SHRINK_MARGIN h`` then get the
first shrink sweep, and those of them with ``theta1 d_i < MARGIN h`` after it the refinement;
in rounds while the new ``h`` lets more in (every step decides on distances alone, never on
time, so ``verify`` recomputes the same points). Every step is per sample (the random
directions of a sample are drawn for it whatever else is refined, from a generator started
afresh each round), so a refined sample gets exactly the point that refining every sample
gives; the others keep the point of the last step they had. The margins are wide because the
refinement shrinks some distances by more than ten times (a far bisection point whose shrink
is stuck). Measured on the stage distances of XGBoost, 500 trees of depth 6, 10,000 rows
(every sample through every stage, then each selection replayed): margins (32, 8) refine
1,856 samples (3,664 shrunk) for 1.1% on ``value_upper``, where one sweep for every sample
and a margin of 64 (the rule before) refined 7,153 for 0.0%, and (64, 8) 1,878 for 0.6%:
about 360 rows scored a sample against 910 (300 with the coarse bisection of step 1). From
:data:`LARGE_ABOVE` samples x trees the margins are (16, 4) (:data:`LARGE_MARGINS`): 1,201
refined, 1,927 shrunk, +3.7% on ``value_upper`` in the same replay, about 40% less time in
the shrink and refinement stages (XGBoost at 1e5 rows: 442 s of found side at (32, 8),
load 6 to 7).
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from .._progress import progress_bar
from ..errors import InputTypeError
from ..modeling import _perturbation as perturbation
from ..modeling import _trees as trees
from ..modeling._costs import Rescaled
from ..modeling._nonlinear import as_model_input
from . import _bounds as bounds

__all__ = ["TreeEvaluator", "found_distances"]

try:  # the compiled walk; NumPy otherwise
    import numba
except ImportError:  # pragma: no cover - numba is optional
    numba = None  # type: ignore[assignment]

_KERNEL = None
#: one walk at a time: each already uses every core, and numba's fallback threading layer
#: (workqueue, where neither OpenMP nor TBB is installed) aborts on concurrent launches
_WALK_LOCK = threading.Lock()
_prange = numba.prange if numba is not None else range
_log = logging.getLogger(__name__)

#: samples x trees from which the fast found side replaces the generic search (below it the
#: generic search's ~4,000 predictions a sample are affordable and find points 5-20% closer)
FAST_ABOVE = 200_000

#: deepest tree the evaluator lays out as a complete binary tree (2^depth leaves per tree)
MAX_DEPTH = 12


def _kernel():
    """The numba walk (compiled on first use), or None without numba."""
    global _KERNEL
    if _KERNEL is None and numba is not None:
        _KERNEL = _compile()
    return _KERNEL


def _walk(C, feat, thr, leafval, base, depth, out):  # pragma: no cover - compiled
    """``out[r] = base + sum over trees t (in order) of leafval[t, leaf of C[r]]``;
    tree ``t`` a complete binary tree of ``depth[t]`` levels (heap order).

    Blocks of rows in parallel (``prange``); in a block, a tree at a time and a level at a
    time over the rows (independent loads the processor overlaps, where a row at a time
    is a chain of dependent ones); the sum of each row is in tree order whatever the
    blocks, so the scores do not depend on the number of threads."""
    n = C.shape[0]
    T = feat.shape[0]
    K = base.shape[0]
    nb = (n + _BLOCK - 1) // _BLOCK
    for b in _prange(nb):
        b0 = b * _BLOCK
        m = min(n, b0 + _BLOCK) - b0
        node = np.empty(m, dtype=np.int64)
        acc = np.empty((m, K))
        for r in range(m):
            for k in range(K):
                acc[r, k] = base[k]
        for t in range(T):
            for r in range(m):
                node[r] = 0
            first = (1 << depth[t]) - 1
            for _ in range(depth[t]):  # branchless: right iff c > threshold
                for r in range(m):
                    nd = node[r]
                    node[r] = 2 * nd + 1 + (C[b0 + r, feat[t, nd]] > thr[t, nd])
            for r in range(m):
                leaf = node[r] - first
                for k in range(K):
                    acc[r, k] += leafval[t, leaf, k]
        for r in range(m):
            for k in range(K):
                out[b0 + r, k] = acc[r, k]


def _compile():
    """numba's compilation of :func:`_walk`, cached on disk where numba finds a place for it
    (the compilation takes seconds), else compiled in each process."""
    try:
        return numba.njit(parallel=True, nogil=True, cache=True)(_walk)
    except Exception:  # noqa: BLE001 - no cache locator (a read-only installation)
        return numba.njit(parallel=True, nogil=True, cache=False)(_walk)


#: rows of a block of the walk (a block's rows stay in cache over the trees)
_BLOCK = 256


def _build_tree(lo, hi, val):
    """Node arrays of one tree from its leaf boxes ``lo < c <= hi`` (a partition of the line
    by binary splits), or None when the boxes are not such a partition."""
    feat, thr, left, right, leaf = [], [], [], [], []

    def new():
        feat.append(-1)
        thr.append(0.0)
        left.append(-1)
        right.append(-1)
        leaf.append(-1)
        return len(feat) - 1

    stack = [(new(), np.arange(lo.shape[0]))]
    while stack:
        node, ids = stack.pop()
        if ids.size == 1:
            leaf[node] = int(ids[0])
            continue
        L, H = lo[ids], hi[ids]
        # a split (j, t) of these leaves: t one of their upper ends, no leaf with
        # L_j < t < H_j (each leaf on one side); the most even one (the walk's depth: the
        # original trees' own splits, where first-found splits can make a tree deeper)
        with np.errstate(invalid="ignore"):
            cut = np.any((L[None, :, :] < H[:, None, :]) & (H[:, None, :] < H[None, :, :]),
                         axis=1)  # (candidate leaf a, feature j): t = H[a, j] cuts a leaf
            n_left = np.sum(H[None, :, :] <= H[:, None, :], axis=1)
        m = ids.size
        ok = np.isfinite(H) & ~cut & (n_left > 0) & (n_left < m)
        if not ok.any():
            return None
        even = np.where(ok, np.minimum(n_left, m - n_left), -1)
        a, j = np.unravel_index(int(np.argmax(even)), even.shape)  # ties: the first (a, j)
        j, t = int(j), float(H[a, j])
        go_left = H[:, j] <= t
        feat[node], thr[node] = j, t
        a, b = new(), new()
        left[node], right[node] = a, b
        stack.append((a, ids[go_left]))
        stack.append((b, ids[~go_left]))
    return (np.array(feat, dtype=np.int64), np.array(thr), np.array(left, dtype=np.int64),
            np.array(right, dtype=np.int64), np.array(leaf, dtype=np.int64), val)


def _depth(part):
    f, lf, rt = part[0], part[2], part[3]
    best, stack = 0, [(0, 0)]
    while stack:
        node, dep = stack.pop()
        if f[node] < 0:
            best = max(best, dep)
        else:
            stack.extend(((int(lf[node]), dep + 1), (int(rt[node]), dep + 1)))
    return best


class TreeEvaluator:
    """The class scores ``F(x)`` of a :class:`otstab.solve._bounds.LeafTable`, by walking
    trees rebuilt from its leaf boxes (module doc). ``TreeEvaluator.build(table, X)`` returns
    None when the boxes are not read as trees or the walk disagrees with ``table.scores``."""

    def __init__(self, table, feat, thr, leafval, depth):
        self.table = table
        self.feat, self.thr, self.leafval, self.depth = feat, thr, leafval, depth
        self.base = np.asarray(table.base, dtype=np.float64)
        # binary models: F = (0, margin); the walk sums the margin alone
        self.binary = self.base.size == 2 and self.base[0] == 0 and not leafval[:, :, 0].any()
        if self.binary:
            self.leafval = np.ascontiguousarray(leafval[:, :, 1:])
            self.base = self.base[1:]
        self.rows = 0

    @classmethod
    def build(cls, table, X_check):
        if _kernel() is None:
            return None
        starts = np.flatnonzero(np.r_[True, np.diff(table.tree) != 0])
        ends = np.r_[starts[1:], table.tree.size]
        parts = []
        for s, e in zip(starts, ends):
            part = _build_tree(table.lo[s:e], table.hi[s:e], table.value[s:e])
            if part is None:
                return None
            parts.append(part)
        tdepth = np.array([max(_depth(p), 1) for p in parts], dtype=np.int64)  # per tree
        depth = int(tdepth.max())
        if depth > MAX_DEPTH:
            return None
        T, K = len(parts), table.value.shape[1]
        feat = np.zeros((T, 2 ** depth - 1), dtype=np.int64)
        thr = np.full((T, 2 ** depth - 1), np.inf)  # padding: always left
        leafval = np.zeros((T, 2 ** depth, K))
        for t, (f, th, lf, rt, leaf, val) in enumerate(parts):
            stack = [(0, 0, 0)]  # (node, heap position, depth)
            while stack:
                node, pos, dep = stack.pop()
                if f[node] < 0:
                    while dep < tdepth[t]:  # down the left edge of the padding
                        pos, dep = 2 * pos + 1, dep + 1
                    leafval[t, pos - (2 ** int(tdepth[t]) - 1)] = val[leaf[node]]
                    continue
                feat[t, pos], thr[t, pos] = f[node], th[node]
                stack.append((int(lf[node]), 2 * pos + 1, dep + 1))
                stack.append((int(rt[node]), 2 * pos + 2, dep + 1))
        # trees that compare float32 values (XGBoost, scikit-learn) with float32 thresholds:
        # the walk in float32 (half the memory traffic), the same comparisons
        if table.f32 and np.array_equal(thr.astype(np.float32).astype(np.float64), thr):
            thr = thr.astype(np.float32)
        ev = cls(table, feat, thr, leafval, tdepth)
        Xc = np.asarray(X_check[:256], dtype=np.float64)
        if not np.allclose(ev.scores(Xc), table.scores(Xc), rtol=0,
                           atol=1e-9 * (1.0 + table.scale)):
            return None
        ev.rows = 0
        return ev

    def _walk(self, Z):
        Z = np.asarray(Z, dtype=np.float64)
        self.rows += Z.shape[0]
        with np.errstate(over="ignore", invalid="ignore"):
            C = np.ascontiguousarray(self.table.comparable(Z), dtype=self.thr.dtype)
        out = np.empty((Z.shape[0], self.base.size))
        with _WALK_LOCK:
            _kernel()(C, self.feat, self.thr, self.leafval, self.base, self.depth, out)
        return out

    def scores(self, Z):
        out = self._walk(Z)
        return np.c_[np.zeros(out.shape[0]), out] if self.binary else out

    def predict(self, Z):
        """Class indices (argmax of the scores; ties to the first class, like the models)."""
        if self.binary:
            return (self._walk(Z)[:, 0] > 0).astype(np.intp)
        return np.argmax(self._walk(Z), axis=1)


#: rows of each predicted class that the neighbour search reads (evenly spaced over the rows
#: of that class; all of them below): over all rows the search is quadratic, 330 s at 1e5
NEIGHBOUR_ROWS = 2048


def _reference_rows(pred0, cap):
    """Per predicted class, up to ``cap`` of its rows, evenly spaced (deterministic)."""
    out = []
    for c in np.unique(pred0):
        rows = np.flatnonzero(pred0 == c)
        if rows.size > cap:
            rows = rows[np.linspace(0, rows.size - 1, cap).round().astype(np.intp)]
        out.append(rows)
    return np.sort(np.concatenate(out))


def _neighbours(X, yi, pred0, idx, mv, k, cap=None):
    """Per sample of ``idx``: up to ``k`` rows of X predicted as another class than its label,
    nearest first (masked squared distance) among the reference rows
    (:func:`_reference_rows`, ``cap`` a class; default :data:`NEIGHBOUR_ROWS`); -1 where there
    are fewer."""
    ref = _reference_rows(pred0, NEIGHBOUR_ROWS if cap is None else int(cap))
    Xm = X[:, mv]
    sq = np.sum(Xm * Xm, axis=1)
    out = np.full((idx.size, k), -1, dtype=np.intp)
    lab = yi[idx]
    for c in np.unique(lab):  # the samples of one label against the rows of the others
        pos = np.flatnonzero(lab == c)
        other = ref[pred0[ref] != c]
        kk = min(k, other.size)
        if kk == 0:
            continue
        Rm, sr = Xm[other], sq[other]
        for s in range(0, pos.size, 512):
            ps = pos[s:s + 512]
            rows = idx[ps]
            D2 = sq[rows][:, None] - 2.0 * Xm[rows] @ Rm.T + sr[None, :]
            nn = np.argpartition(D2, kk - 1, axis=1)[:, :kk]
            dn = np.take_along_axis(D2, nn, axis=1)
            o = np.argsort(dn, axis=1, kind="stable")
            out[ps, :kk] = other[np.take_along_axis(nn, o, axis=1)]
    return out


#: the bisection: ``COARSE`` halvings on every segment, then the rest of ``steps`` on the
#: ``KEEP`` segments of each sample whose coarse flip point is nearest (76 rows a sample with
#: 8 neighbours and 16 steps, where every segment to the end took 136)
COARSE, KEEP = 6, 2


def _bisect_segments(pred, X, yi, idx, mv, nbr, steps, coarse=None, keep=None):
    """Flip points on the segments ``x_i -> x_j`` (j in nbr): ``(best (idx,), points)``
    (:data:`COARSE`, :data:`KEEP`; per sample: the segments of the others do not matter)."""
    coarse = COARSE if coarse is None else int(coarse)
    keep = KEEP if keep is None else int(keep)
    rows_i = np.repeat(idx, nbr.shape[1])
    rows_j = nbr.reshape(-1)
    ok = rows_j >= 0
    rows_i, rows_j = rows_i[ok], rows_j[ok]
    A = X[rows_i]
    U = np.zeros_like(A)
    U[:, mv] = X[rows_j][:, mv] - A[:, mv]
    lo = np.zeros(rows_i.size)
    hi = np.ones(rows_i.size)
    yr = yi[rows_i]
    # the far end must be wrong for the walk too (it is for the model)
    good = pred(A + U) != yr
    live = np.arange(rows_i.size)
    for step in range(steps):
        if step == min(coarse, steps) and keep < nbr.shape[1]:
            # the KEEP segments of each sample whose flip point is nearest so far
            d2c = np.where(good, hi * hi * np.sum(U * U, axis=1), np.inf)
            order = np.lexsort((d2c, rows_i))  # by sample, then distance (stable)
            first = np.r_[0, np.flatnonzero(np.diff(rows_i[order])) + 1]
            rank = np.arange(order.size) - np.repeat(first, np.diff(np.r_[first,
                                                                           order.size]))
            live = np.sort(order[(rank < keep) & np.isfinite(d2c[order])])
        mid = 0.5 * (lo[live] + hi[live])
        wrong = pred(A[live] + mid[:, None] * U[live]) != yr[live]
        hi[live] = np.where(wrong, mid, hi[live])
        lo[live] = np.where(wrong, lo[live], mid)
    Pt = A + hi[:, None] * U
    d2 = np.where(good, np.sum((Pt - A) ** 2, axis=1), np.inf)
    best = np.full(X.shape[0], np.inf)
    np.minimum.at(best, rows_i, d2)
    P = np.full(X.shape, np.nan)
    win = np.isfinite(d2) & (d2 == best[rows_i])
    P[rows_i[win]] = Pt[win]
    return best, P


#: a sample's search is refined when ``theta1 d_i < MARGIN h`` after its first shrink sweep
#: (the refinement shrinks some distances by 10 times and more; module doc, "budget")
MARGIN = 8.0

#: a sample gets the first shrink sweep when ``theta1 d_i < SHRINK_MARGIN h`` after the
#: bisection (module doc, "budget")
SHRINK_MARGIN = 32.0

#: samples x trees from which the narrower margins ``LARGE_MARGINS`` (first shrink,
#: refinement) apply: 500 trees on 1e5 rows within 10 minutes (module doc, "budget")
LARGE_ABOVE = 20_000_000
LARGE_MARGINS = (16.0, 4.0)


def _selected(duals, best, idx, done, margin):
    """The samples of ``idx`` not yet refined whose price ``theta1 d_i`` is below ``margin``
    times the dual's h on ``best`` (every one where h is not finite)."""
    _, h = duals(best)
    t1 = duals.theta1 if np.isfinite(duals.theta1) else 1.0
    near = t1 * best[idx] < margin * h if np.isfinite(h) else np.ones(idx.size, dtype=bool)
    return idx[near & ~done[idx]]


def found_distances(table, model_predict, X, yi, mv, thresholds, *, walk=True, k=8, steps=16,
                    n_refine=2, seed=0, duals=None, margin=None, shrink_margin=None,
                    progress=False):
    """Upper ends ``d_i`` (squared distances of points the model misclassifies) for the
    samples the model classifies rightly, by the steps of the module doc. ``duals``: a
    :class:`otstab.solve._refine.ZeroOneDuals` to refine only the samples that can enter the
    dual (module doc, "budget"); None refines every sample. Returns ``(best (n,), P (n, d),
    n_model_rows, n_walked_rows, rest, refined (n,))``: ``rest`` the correct samples left to
    the generic search (no point found, or the model disagreed), ``refined`` the samples that
    went through the whole refinement. ``progress``: a bar of the four stages on stderr
    (bisection, first shrink, refinement rounds, the model's check), each also logged."""
    with progress_bar(4, f"found side ({X.shape[0]} rows)", bool(progress)) as bar:
        return _found_distances(table, model_predict, X, yi, mv, thresholds, walk, k, steps,
                                n_refine, seed, duals, margin, shrink_margin, bar)


def _found_distances(table, model_predict, X, yi, mv, thresholds, walk, k, steps, n_refine,
                     seed, duals, margin, shrink_margin, bar):
    t0 = time.perf_counter()

    def stage(name, m):
        bar.update(1)
        _log.info("tree found side: %s (%d samples) done at %.1f s", name, m,
                 time.perf_counter() - t0)

    ev = TreeEvaluator.build(table, X) if walk else None
    n, d = X.shape
    model_rows = [0]

    def by_model(Z):
        model_rows[0] += Z.shape[0]
        return model_predict(Z)

    pred = ev.predict if ev is not None else by_model
    pred0 = by_model(X)
    mis = pred0 != yi
    best = np.where(mis, 0.0, np.inf)
    P = np.where(mis[:, None], X, np.nan)
    idx = np.flatnonzero(~mis)
    mv = mv & np.array([T.size > 0 for T in thresholds])
    if idx.size == 0 or not mv.any():
        return best, P, model_rows[0], 0, idx[:0], np.zeros(n, dtype=bool)
    # the bisection to the neighbours, every sample
    nbr = _neighbours(X, yi, pred0, idx, mv, k)
    b, Pb = _bisect_segments(pred, X, yi, idx, mv, nbr, steps)
    best[idx], P[idx] = b[idx], Pb[idx]
    stage("bisection", idx.size)
    # then, in rounds while h lets more in, the first shrink sweep for the samples with
    # theta1 d_i < shrink_margin h, and the refinement for those of them with theta1 d_i <
    # margin h (all of them without duals): every step is per sample (keyed random
    # directions), so a refined sample gets the point it gets when every sample is refined
    f32 = table.f32
    margin = MARGIN if margin is None else float(margin)
    shrink_margin = max(SHRINK_MARGIN if shrink_margin is None else float(shrink_margin),
                        margin)
    shrunk = np.zeros(n, dtype=bool)
    done = np.zeros(n, dtype=bool)
    first = True
    while True:
        todo1 = idx[~shrunk[idx]] if duals is None else _selected(duals, best, idx, shrunk,
                                                                  shrink_margin)
        if todo1.size:
            shrunk[todo1] = True
            perturbation._coordinate_shrink(pred, X, yi, todo1, mv, thresholds, best, P,
                                            sweeps=1, f32=f32)
        if first:
            stage("first shrink", int(shrunk.sum()))
        cand = idx[shrunk[idx]]
        todo = cand[~done[cand]] if duals is None else _selected(duals, best, cand, done,
                                                                 margin)
        if not todo1.size and not todo.size:
            break
        first = False
        if not todo.size:
            continue
        done[todo] = True
        perturbation._coordinate_shrink(pred, X, yi, todo, mv, thresholds, best, P, sweeps=2,
                                        f32=f32)
        if n_refine:
            # (a generator afresh each round: row i's directions are those of one round)
            perturbation._refine_random(pred, X, yi, todo, mv, np.random.default_rng(seed),
                                        best, P, n_refine, 1e-6, keyed=True)
            perturbation._coordinate_shrink(pred, X, yi, todo, mv, thresholds, best, P,
                                            f32=f32)
    stage("refinement", int(done.sum()))
    # the model's own predict on every final point
    have = idx[np.isfinite(best[idx])]
    agree = by_model(P[have]) != yi[have] if have.size else np.zeros(0, dtype=bool)
    lost = have[~agree]
    best[lost] = np.inf
    P[lost] = np.nan
    rest = idx[~np.isfinite(best[idx])]
    ok = idx[np.isfinite(best[idx])]
    best[ok] = np.sum((P[ok] - X[ok]) ** 2, axis=1)
    stage("the model's check", have.size)
    return best, P, model_rows[0], 0 if ev is None else ev.rows, rest, done


def tree_search(model, X, y, *, mask=None, duals=None, progress=False, **options):
    """:func:`otstab.modeling._perturbation.perturbation_search` (``labels="internal"``) for a
    tree-ensemble classifier through :func:`found_distances` when samples x trees is at least
    :data:`FAST_ABOVE`; the generic search for the samples it leaves, for smaller problems, and
    for every model it does not apply to (single decision trees, which have an exact path;
    per-feature prices; one movable feature, whose line search is exact; models without a
    leaf table). ``duals`` (a :class:`otstab.solve._refine.ZeroOneDuals`): refine only the
    samples that can enter the 0/1 dual (:func:`found_distances`); ``progress``: its stages
    on stderr. Returns
    ``(result, table)``: the :class:`~otstab.solve._bounds.LeafTable` read (None where the
    generic search ran), for the lower bounds to reuse."""

    def generic():
        return perturbation.perturbation_search(model, X, y, mask=mask, labels="internal",
                                                **options), None

    raw = getattr(model, "model", model)
    classes = getattr(raw, "classes_", None)
    X = np.asarray(X, dtype=np.float64)
    if isinstance(model, Rescaled) or classes is None or perturbation._is_tree(raw) \
            or X.ndim != 2 or X.shape[0] < 2:
        return generic()
    d = X.shape[1]
    mv = perturbation._mask_bool(mask, d)
    thresholds = perturbation._ensemble_thresholds(raw, d)
    if thresholds is None or int((mv & np.array([T.size > 0 for T in thresholds])).sum()) < 2:
        return generic()
    try:
        table = bounds.leaf_table(raw, d, X)
    except InputTypeError:
        return generic()
    if X.shape[0] * table.n_trees < FAST_ABOVE:  # the generic search is affordable: tighter
        return generic()[0], table
    classes = np.asarray(classes)
    yv = np.asarray(y)
    yi = (yv > 0).astype(np.intp) if len(classes) == 2 else yv.astype(np.intp)

    def model_predict(Z):
        # (CatBoost's multiclass predict is a column)
        return np.searchsorted(classes, np.asarray(raw.predict(as_model_input(raw, Z))).ravel())

    # the walk for XGBoost and LightGBM (module doc: it beats their own predict)
    large = X.shape[0] * table.n_trees >= LARGE_ABOVE
    out = found_distances(table, model_predict, X, yi, mv, thresholds,
                          walk=trees.library(raw) in ("xgboost", "lightgbm"), duals=duals,
                          shrink_margin=LARGE_MARGINS[0] if large else None,
                          margin=LARGE_MARGINS[1] if large else None, progress=progress)
    best, P, rows, walked, rest, refined = out
    _log.debug("tree found side: %d samples refined of %d, %d rows walked, %d predicted",
               int(refined.sum()), X.shape[0], walked, rows)
    if rest.size:
        sub = perturbation.perturbation_search(model, X[rest], yv[rest], mask=mask,
                                               labels="internal", **options)
        best[rest], P[rest] = sub.distances, sub.points
        rows += sub.n_predictions
    return perturbation.PerturbationResult(
        distances=best, points=P, exact=False, method="tree_ensemble",
        misclassified=best == 0, n_predictions=rows), table
