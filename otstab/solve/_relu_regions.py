"""Exact lower bounds on ``d*_i`` for one-hidden-layer ReLU / LeakyReLU networks, by regions.

Inside the ball of radius ``sqrt(U_i)`` (``U_i``: a found squared distance) the units whose
pre-activation interval excludes 0 keep their slope; with ``k`` unstable units the ball meets
at most ``2^k`` activation regions, on each of which every margin is affine:
``m_P(x_i + delta) = c_P + a_P . delta``. The squared distance to the misclassified part of a
region is at least that to the polyhedron ``{delta : the region's k sign constraints,
a_P . delta <= -c_P}`` (the ball and the stable units' constraints are dropped: fewer
constraints, a smaller distance). Its value is bounded from below by weak duality of
``min 1/2 |delta|^2 s.t. G delta <= h``: every ``lambda >= 0`` gives
``1/2 |delta*|^2 >= -1/2 |G^T lambda|^2 - h . lambda``; ``lambda`` comes from the NNLS form
of the least-distance program (:func:`_dual_bound`), and a rounding allowance is taken off.
The minimum over regions and margins, capped at ``U_i``, is a certified ``dlow_i``; it is the
exact ``d*_i`` when the NNLS solution is exact. Samples with more than ``max_unstable``
unstable units (default 8) are left to the CROWN bound, and the samples are taken nearest
first until ``max_patterns`` regions (default 8192) have been examined.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from scipy.optimize import nnls

from ._crown import margin_rows

__all__ = ["region_lower_distances", "tighten"]


def _dual_bound(G, h):
    """Per region ``p``: a lower bound on ``min |delta|^2 s.t. G_p delta <= h_p`` and the
    minimiser. The least-distance program is solved by NNLS (Lawson and Hanson 1974, ch. 23:
    ``w = argmin_{w >= 0} |[-G^T; -h^T] w - e_{d+1}|``); ``w`` is a direction of dual
    multipliers, and weak duality along it, ``max_t>=0 -t h.w - t^2 |G^T w|^2 / 2``, gives the
    bound ``(h.w)_-^2 / |G^T w|^2`` whatever the accuracy of ``w`` (an empty region: ``inf``
    when ``G^T w = 0`` and ``h.w < 0``). Returns ``(bound (P,), delta (P, d))``."""
    P, c, d = G.shape
    bound = np.zeros(P)
    delta = np.zeros((P, d))
    b = np.zeros(d + 1)
    b[-1] = 1.0
    for p in range(P):
        A = np.vstack([-G[p].T, -h[p][None, :]])
        try:
            w, _ = nnls(A, b, maxiter=50 * (c + 1))
        except RuntimeError:  # no convergence: the trivial multiplier
            continue
        v = G[p].T @ w
        hw = float(h[p] @ w)
        vv = float(v @ v)
        if hw >= 0:
            continue
        size = hw * hw + float(np.abs(h[p] * w).sum()) ** 2
        if vv <= 1e-300:
            bound[p] = np.inf
            continue
        bound[p] = max(hw * hw / vv - 1e-9 * size / vv, 0.0)
        delta[p] = -v * (-hw / vv)  # the minimiser -G^T lambda at the best scale
    return bound, delta


def region_lower_distances(net, X, yi, upper, *, mask=None, only=None, max_unstable=8,
                           max_patterns=8192, deadline=None):
    """Certified ``dlow_i`` for a :class:`otstab.solve._crown.Network` (NumPy) with one hidden ReLU
    or LeakyReLU layer; NaN where not computed (other samples, too many unstable units,
    misclassified samples). ``upper``: found squared distances ``U_i``; ``only``: the samples
    to treat, in this order (indices or a boolean mask); ``deadline``: a ``perf_counter`` time
    after which the rest is left out; ``max_patterns``: the regions examined in all (a
    deterministic budget: the samples after the one that would exceed it are left out).
    Returns ``(dlow, points)``: ``points[i]`` is the
    minimiser of the region that gave the bound (a candidate for the found side, to be
    checked with the model: it lies on the boundary up to rounding)."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    out = np.full(n, np.nan)
    pts = np.full((n, d), np.nan)
    if len(net.W) != 2 or net.acts[0][0] not in ("relu", "leaky_relu") or net.ops.torch:
        return out, pts
    leak = net.acts[0][1] if net.acts[0][0] == "leaky_relu" else 0.0
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    W0, b0, W1, b1 = net.W[0], net.b[0], net.W[1], net.b[1]
    Wm = W0[mv]  # (d_mv, H)
    wn = np.sqrt(np.sum(Wm * Wm, axis=0))
    C = margin_rows(net, yi)  # (n, m, K)
    U = np.asarray(upper, dtype=np.float64)
    used = 0
    order = np.arange(n) if only is None else np.asarray(only)
    if order.dtype == bool:
        order = np.flatnonzero(order)
    for i in order:
        if not (np.isfinite(U[i]) and U[i] > 0):
            continue
        if deadline is not None and time.perf_counter() > deadline:
            break
        z0 = X[i] @ W0 + b0
        R = np.sqrt(U[i])
        unst = np.flatnonzero(np.abs(z0) < R * wn * (1 + 1e-9) + 1e-12)
        k = unst.size
        if k > max_unstable:
            continue
        if 2 ** k > max_patterns - used:  # the deterministic budget of regions is spent
            break
        used += 2 ** k
        A = C[i] @ W1.T  # (m, H): margins = A relu(z) + C b1
        cb = C[i] @ b1
        base = np.where(z0 > 0, 1.0, leak)
        pats = np.array(list(itertools.product((1.0, leak), repeat=k)),
                        dtype=np.float64).reshape(2 ** k, k)
        P = pats.shape[0]
        sig = np.tile(base, (P, 1))
        sig[:, unst] = pats
        # sign constraints of the unstable units: active -w.delta <= z0, inactive w.delta <= -z0
        act = pats == 1.0
        sgn = np.where(act, -1.0, 1.0)  # (P, k)
        Gs = sgn[:, :, None] * Wm[:, unst].T[None]  # (P, k, d_mv)
        hs = np.where(act, z0[unst][None], -z0[unst][None])
        best = np.inf
        for r in range(A.shape[0]):
            cP = (sig * A[r][None]) @ z0 + cb[r]  # (P,)
            aP = (sig * A[r][None]) @ Wm.T  # (P, d_mv)
            G = np.concatenate([Gs, aP[:, None, :]], axis=1)
            h = np.concatenate([hs, -cP[:, None]], axis=1)
            q, delta = _dual_bound(G, h)
            j = int(np.argmin(q))
            if q[j] < best:
                best = float(q[j])
                pts[i] = X[i]
                pts[i, mv] += delta[j]
        out[i] = min(best, U[i])
    return out, pts


def tighten(net, X, yi, upper, dlow, info, *, mask=None):
    """The step after :func:`otstab.solve._crown.lower_distances`: the activation regions of the
    samples where ``dlow`` is below ``upper``, nearest first, within the deadline recorded in
    ``info``. Returns ``(dlow, info)`` (``info["region_points"]``: the regions' minimisers,
    candidates for the found side)."""
    if upper is None or net.ops.torch is not None or len(net.W) != 2:
        return dlow, info
    up = np.asarray(upper, dtype=np.float64)
    gap = np.flatnonzero(np.isfinite(up) & (dlow < up * (1 - 1e-9)))
    gap = gap[np.argsort(up[gap], kind="stable")]
    if gap.size == 0:
        return dlow, info
    ex, pts = region_lower_distances(net, X, yi, up, mask=mask, only=gap,
                                     deadline=info.get("deadline"))
    done = np.isfinite(ex)
    if not done.any():
        return dlow, info
    info = {**info, "method": info["method"] + " and activation regions (one hidden ReLU layer)",
            "region_points": pts, "n_regions_solved": int(done.sum())}
    return np.where(done, np.maximum(dlow, ex), dlow), info
