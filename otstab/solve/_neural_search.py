"""The found side for differentiable classifiers: shorter moves to misclassification.

:func:`refine_min_norm` takes the misclassified points a search found (one per sample) and
looks for closer ones by the DeepFool step from the boundary (Moosavi-Dezfooli et al. 2016):
at a boundary point ``p`` the margin is linearised, ``m(x) ~ m(p) + g . (x - p)``, and the
point of that hyperplane nearest ``x_i`` is tried; the segment from ``x_i`` to it (stretched
until the model misclassifies its end, if needed) is bisected to the boundary. A point is kept
only if the model's own prediction at it differs from the label and it is closer than the
best so far, so every returned distance is that of a point the model misclassifies (an upper
bound on ``d*_i``, never a claim of minimality). Only the movable coordinates move.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._crown import as_network

__all__ = ["refine_min_norm", "refine_result", "adopt_points"]


def _wrong(model, P, y):
    return np.asarray(model.predict_internal(P)) != y


def _boundary(model, X, Q, y, steps=30):
    """Points on the segments ``X -> Q`` (``Q`` misclassified) just on the misclassified side
    of the boundary nearest ``X`` along them (bisection on the prediction)."""
    lo = np.zeros(X.shape[0])
    hi = np.ones(X.shape[0])
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        bad = _wrong(model, X + mid[:, None] * (Q - X), y)
        hi = np.where(bad, mid, hi)
        lo = np.where(bad, lo, mid)
    return X + hi[:, None] * (Q - X)


def refine_min_norm(model, X, y, points, distances, *, mask=None, iters=12, only=None):
    """Closer misclassified points than ``points`` (squared distances ``distances``), for a
    classifier adapter with ``margin_and_grad`` and ``predict_internal`` (internal labels
    ``y``). ``only``: a boolean mask of the samples to refine (default: every sample with a
    finite distance > 0). Returns ``(points, distances)`` (new arrays; the inputs are not
    modified), each no farther than before."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    P = np.array(points, dtype=np.float64, copy=True)
    D = np.array(distances, dtype=np.float64, copy=True)
    n, d = X.shape
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    sel = np.isfinite(D) & (D > 0) & np.all(np.isfinite(P), axis=1)
    if only is not None:
        sel &= np.asarray(only, dtype=bool)
    idx = np.flatnonzero(sel)
    if idx.size == 0 or not mv.any():
        return P, D
    Xs, ys = X[idx], y[idx]
    cur = P[idx]
    best_p, best_d = cur.copy(), D[idx].copy()
    for _ in range(iters):
        m, g = model.margin_and_grad(cur, ys)
        g = np.where(mv[None, :], g, 0.0)
        g2 = np.sum(g * g, axis=1)
        lin = m + np.sum(g * (Xs - cur), axis=1)  # linearised margin at x_i
        ok = (g2 > 0) & (lin > 0)
        if not ok.any():
            break
        step = np.where(ok, lin / np.where(g2 > 0, g2, 1.0), 0.0)
        Q = Xs - step[:, None] * g
        # stretch the segment until its end is misclassified (at most 2^6)
        bad = _wrong(model, Q, ys)
        for _s in range(6):
            if np.all(bad | ~ok):
                break
            Q = np.where((bad | ~ok)[:, None], Q, Xs + 1.5 * (Q - Xs))
            bad = _wrong(model, Q, ys)
        use = ok & bad
        if not use.any():
            break
        B = np.where(use[:, None], _boundary(model, Xs, Q, ys), cur)
        B = Xs + (B - Xs) * (1 + 1e-9)  # a hair beyond the boundary
        dist = np.sum((B - Xs) ** 2, axis=1)
        better = use & (dist < best_d) & _wrong(model, B, ys)
        best_p[better], best_d[better] = B[better], dist[better]
        cur = np.where(use[:, None], B, cur)
    P[idx], D[idx] = best_p, best_d
    return P, D


def _checked(check, X, old_P, old_D, P, D):
    """Rows of ``(P, D)`` whose points ``check`` (the problem's own per-row loss, > 0 when
    misclassified) does not confirm go back to ``(old_P, old_D)``."""
    changed = D < old_D
    if check is None or not changed.any():
        return P, D
    loss = np.asarray(check(np.where(np.isfinite(P), P, X)))
    bad = changed & ~(loss > 0)
    P[bad], D[bad] = old_P[bad], old_D[bad]
    return P, D


def refine_result(model, X, y, pr, mask=None, check=None):
    """:func:`refine_min_norm` applied to a :class:`~otstab.perturbation.PerturbationResult`
    of a network (:func:`otstab.solve._crown.as_network`); other models and exact results are
    returned unchanged. ``check``: the problem's per-row losses at points (one per sample),
    which must confirm every new point."""
    if pr.exact or as_network(model) is None or model.task == "regression":
        return pr
    P, D = refine_min_norm(model, X, y, pr.points, pr.distances, mask=mask)
    P, D = _checked(check, np.asarray(X, dtype=np.float64), pr.points, pr.distances, P, D)
    if np.array_equal(D, pr.distances):
        return pr
    return dataclasses.replace(pr, points=P, distances=D)


def adopt_points(model, X, y, dist, points, candidates, check=None):
    """Take the candidate points (NaN rows: none) that the model misclassifies and that are
    closer than ``dist``: pushed a hair beyond the boundary along the ray from ``x_i``
    (``1e-9`` relative) and checked with the model's own prediction and ``check`` (as in
    :func:`refine_result`). Returns new ``(dist, points)``."""
    if candidates is None:
        return dist, points
    X = np.asarray(X, dtype=np.float64)
    cand = np.asarray(candidates, dtype=np.float64)
    has = np.all(np.isfinite(cand), axis=1)
    if not has.any():
        return dist, points
    idx = np.flatnonzero(has)
    Q = X[idx] + (cand[idx] - X[idx]) * (1 + 1e-9)
    dq = np.sum((Q - X[idx]) ** 2, axis=1)
    ok = (np.asarray(model.predict_internal(Q)) != np.asarray(y)[idx]) & (dq < dist[idx])
    if not ok.any():
        return dist, points
    new_d, new_p = np.array(dist, copy=True), np.array(points, copy=True)
    new_d[idx[ok]], new_p[idx[ok]] = dq[ok], Q[ok]
    return _checked(check, X, points, dist, new_p, new_d)[::-1]
