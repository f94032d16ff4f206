"""The found side of smooth losses of networks: a second, stronger search after the Adam loop.

The paper's Algorithm 1 (``solver="first_order"``: Adam on the inner problems
``max_x h l(f(x), y) - theta1 ||x - x_i||^2``, an envelope root search on h) finds *a* local
maximiser per sample. :func:`stronger_search` runs the same outer search again with

* projected gradient ascent (``inner_method="gradient"``: step ``G / (2 theta1)`` with a per-row
  step factor) instead of Adam, every iterate kept inside the move bound ``h G / theta1``
  (``G``: a global Lipschitz constant of the loss in the movable coordinates; beyond that
  distance ``h l(x) - theta1 t^2 <= h (l_i + G t) - theta1 t^2 < h l_i``, so no maximiser is
  cut off);
* restarts from the certified side's hints at each h: ``x_i`` moved by the radius where the
  certified over-estimate of the d-transform (:class:`otstab.solve._crown.TransformUpper`) is
  largest, along the loss gradient at ``x_i`` and along the Adam loop's own move, plus the
  Adam loop's points rescaled to h (and the solver's usual starts: the unmoved data, the
  bracket ends, the shared direction, ``random_starts`` Gaussian ones);
* the Adam loop's h as the first h tried.

Both answers are audited (the model re-scores every atom); the caller keeps the one with the
lower audited cost, so ``value_upper`` never rises above the Adam loop's. Nothing here touches
the certified side: ``value_lower`` comes from the over-estimate alone.
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers.first_order import solve_first_order

from . import _crown as crown

__all__ = ["stronger_search", "hint_starts", "STRONG_OPTIONS"]

#: the solver options of the second search (``random_starts``: Gaussian starts per h)
STRONG_OPTIONS = {"inner_method": "gradient", "random_starts": 2, "screen_steps": 8}


def _local(oracle):
    """The :class:`~otstab.solve._crown.TransformUpper` inside ``oracle``, or None."""
    if isinstance(oracle, crown.TransformUpper):
        return oracle
    for part in (getattr(oracle, "a", None), getattr(oracle, "b", None)):
        if isinstance(part, crown.TransformUpper):
            return part
    return None


def _unit(D):
    nrm = np.sqrt(np.sum(D * D, axis=1))
    return np.where((nrm > 0)[:, None], D / np.where(nrm > 0, nrm, 1.0)[:, None], 0.0)


def hint_starts(oracle, X, grad0, moves, mv, h):
    """Start points at ``h`` from the certified over-estimate ``oracle`` (a
    :class:`~otstab.solve._crown.TransformUpper` or a minimum holding one): each ``x_i`` moved
    by ``t_i`` (the radius where the over-estimate of ``h l - theta1 t^2`` is largest) and by
    ``t_i / 2``, along the loss gradient ``grad0`` at ``x_i`` and along ``moves`` (the found
    moves, rows of zeros where none). Empty when the oracle has no radii."""
    up = _local(oracle)
    if up is None:
        return []
    t = np.asarray(up.argmax_radius(h), dtype=np.float64)
    if not np.all(np.isfinite(t)) or not np.any(t > 0):
        return []
    out = []
    for D in (grad0 * mv, moves * mv):
        U = _unit(D)
        if not np.any(U):
            continue
        for f in (1.0, 0.5):
            out.append(X + (f * t)[:, None] * U)
    return out


def stronger_search(adapter, prob, oracle, first, *, r, theta1, theta2, divergence, mask=None):
    """The second search (module doc) for a network ``adapter`` bound to its smooth loss, after
    the Adam loop's solution ``first``; ``oracle``: the certified over-estimate (its radii give
    the hints; None: no hints). Returns a ``FirstOrderSolution`` or None when it does not
    apply (no network, nothing can move, no h to start from)."""
    net = crown.as_network(adapter)
    X = prob.X
    n, d = X.shape
    mv = np.ones(d) if mask is None else np.asarray(mask, dtype=bool).astype(np.float64)
    if net is None or not (math.isfinite(theta1) and theta1 > 0) or not mv.any():
        return None
    h0 = float(first.h)
    if not (math.isfinite(h0) and h0 > 0):
        return None
    G = crown.network_lipschitz(net, mask if mask is None else np.asarray(mask, dtype=bool))
    G *= math.sqrt(2.0) if net.task == "multiclass" else 1.0
    _, grad0 = adapter.loss_and_grad(X, prob.y)
    grad0 = np.asarray(grad0, dtype=np.float64)
    Z1 = np.asarray(first.X_star, dtype=np.float64)
    moves = np.where(np.all(np.isfinite(Z1), axis=1)[:, None], Z1 - X, 0.0)

    def extra(h):
        pts = hint_starts(oracle, X, grad0, moves, mv, h)
        pts.append(X + (h / h0) * moves)
        return pts

    radius = (lambda h: h * G / theta1 * (1 + 1e-9)) if math.isfinite(G) and G > 0 else None
    return solve_first_order(adapter.loss_and_grad, X, prob.y, r=r, theta1=theta1,
                             theta2=theta2, divergence=divergence, mask=mask, weights=prob.p,
                             h_init=h0, extra_starts=extra, max_move=radius, **STRONG_OPTIONS)
