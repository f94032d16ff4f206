"""The radius key of a box in the tree branch and bound (issue 29: tightness).

The branch and bound of :mod:`otstab.solve._bounds` (and of :mod:`otstab.solve._raw_trees`)
ranks an open box by a lower bound on the distance from ``x_i`` to the misclassified inputs it
may hold. The plain key is ``max over trees of the distance to the tree's nearest leaf that
meets the box``: an input of the box lies in one leaf of every tree. It ignores the margins:
the box holding ``x_i`` keeps key 0 until the search has split it down to a region that the
independent-trees bound proves safe, so the certified bound on ``d*_i`` stays 0 while that box
is open.

The **radius key** uses the margins too. For a radius ``rho`` let ``B_k(rho) = base_k + sum over
trees of the smallest margin ``F_y - F_k`` among the tree's leaves that meet the box within
distance ``rho``. An input of the box at distance ``delta`` from ``x_i`` lies, in every tree, in
a leaf within ``delta``, so its margin is at least ``B_k(delta)``; if the model misclassifies it
(a margin at most the tie band ``tol``), ``B_k(delta) <= tol`` for some ``k``. ``B_k`` is a
nonincreasing step function of ``rho`` (more leaves, smaller minima), so

    key = min over k of  min { rho : B_k(rho) <= tol }

is a lower bound on the distance of every misclassified input of the box: at least the plain
key (``B_k`` needs one leaf per tree), equal to it when the margins do not help, and, at the
root box, the certified radius of the ball around ``x_i`` (the bound a ball gives by itself).
The sums are taken over the leaves in order of distance; their rounding (one addition per
leaf) is covered by widening ``tol`` by ``8 (leaves + trees + 2) eps`` times the size of a
score, which can only lower the key.
"""

from __future__ import annotations

import numpy as np

__all__ = ["radius_key"]

_EPS = float(np.finfo(np.float64).eps)


def radius_key(dist: np.ndarray, starts: np.ndarray, marg: np.ndarray, base: np.ndarray,
               tol: float, size: float) -> float:
    """The radius key (module doc) of a box.

    ``dist`` (m,): distances from ``x_i`` to the leaves that meet the box (grouped by tree,
    every tree present, groups starting at ``starts``); ``marg`` (m, K-1): their margins
    ``F_y - F_k``; ``base`` (K-1,): the base margins; ``tol``: the tie band; ``size``: a bound
    on the magnitude of a score (base plus the sum over trees of the largest leaf value)."""
    m = dist.size
    T = starts.size
    K1 = marg.shape[1]
    counts = np.diff(np.r_[starts, m])
    tree_of = np.repeat(np.arange(T), counts)
    order = np.lexsort((dist, tree_of))  # by tree, then by distance
    d_s = dist[order]
    M = marg[order]
    pos = np.arange(m) - np.repeat(starts, counts)
    P = np.full((T, int(counts.max()), K1), np.inf)
    P[tree_of, pos] = M
    run = np.minimum.accumulate(P, axis=1)[tree_of, pos]  # (m, K-1): the tree's running min
    key0 = float(d_s[starts].max())  # the plain key: one leaf per tree
    inside = d_s <= key0
    last = starts + np.add.reduceat(inside.astype(np.intp), starts) - 1
    bound0 = base + run[last].sum(axis=0)
    thr = tol + 8.0 * (m + T + 2) * _EPS * size
    rho = np.where(bound0 <= thr, key0, np.inf)
    ev = np.flatnonzero(~inside)  # (pos > 0 there: each tree's nearest leaf is inside)
    if ev.size and not np.all(np.isfinite(rho)):
        ev = ev[np.argsort(d_s[ev], kind="stable")]
        delta = run[ev] - run[ev - 1]  # <= 0: the tree's minimum as the leaf joins
        bounds_e = bound0[None, :] + np.cumsum(delta, axis=0)
        hit = bounds_e <= thr
        anyhit = hit.any(axis=0)
        first = np.argmax(hit, axis=0)
        rho = np.where(np.isfinite(rho), rho,
                       np.where(anyhit, d_s[ev][first], np.inf))
    key = float(rho.min())
    return key if np.isfinite(key) else key0
