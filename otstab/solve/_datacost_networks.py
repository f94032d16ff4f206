"""``certify(MLP pipeline, ..., loss="zero_one", cost=DataCost)``: networks under a cost on the
data's own variables (issue 28 item 3, issue 30).

As for trees (:mod:`otstab.solve._datacost_trees`) the 0/1 certificate needs, per sample, a
certified lower bound ``dlow_i`` and a found upper bound ``dup_i`` on ``d*_i``, the cheapest
valid raw move (levels among the data's levels, integers integral, bounds, directions,
immutables) that makes the Pipeline misclassify the row.

* **Lower side (certified).** The DataCost is separable over raw variables, and each variable
  feeds its own encoded columns, so a weighted squared norm of the encoded move,
  ``sum_j w_j (z'_j - z_j)^2``, never exceeds the DataCost of a valid raw move when, for every
  variable, it never exceeds that variable's own cost:

  - numeric and integer variables (price ``p``, scale ``s``, encoded column ``j`` moving
    ``a_j`` per unit, the pipeline's slope): ``w_j = p / (m (s a_j)^2)`` over its ``m``
    columns gives exactly ``p (delta / s)^2`` for any real ``delta`` (integers relaxed to
    reals, bounds and directions dropped: each only removes moves);
  - categorical and ordinal variables: one weight ``c_v`` on the block,
    ``c_v = min over level pairs (a, b) of cost(a -> b) / |e_b - e_a|^2`` with ``e_a`` the
    encoded block of level ``a`` (the pipeline's own encoding; pairs that do not change the
    block cost nothing there); the block is relaxed from its levels to all real vectors.
  - immutable variables, and variables of infinite price, keep their columns fixed.

  The least weighted distance to misclassification is then the encoded distance of the
  rescaled network ``x~ = sqrt(w) z`` (:class:`otstab.modeling._costs.Rescaled`), which the
  network bounds certify (:func:`otstab.bounds.certified_distances`: CROWN, the activation
  regions of one hidden ReLU layer). Relaxing a block to real vectors and integers to reals only
  lowers the minimum, so ``dlow_i <= d*_i``.
* **Lower side, tightened** (:func:`knapsack_lower`; binary networks of one hidden layer):
  bisection on a budget ``B``: every valid raw move of DataCost ``<= B`` stays in an encoded
  box (:func:`_box`), on which CROWN gives ``m(z) >= c + a . (z - z_i)``
  (:func:`_linear_margin`); if the least DataCost of a valid move whose gain ``-a . dz``
  reaches ``c`` (the linear DataCost knapsack, exact over levels, integers, bounds and
  directions) exceeds ``B``, then ``d*_i > B``.
* **Lower side, a split:** a move either changes a level (cost at least the sample's
  cheapest switch, :func:`cheapest_switch`) or moves numeric variables only (cost at least
  their certified weighted distance with the categorical columns fixed), so ``d*_i >= min``
  of the two.
* A row whose current category is not one of the variable's levels (an unseen category)
  keeps ``dlow = 0``: the bounds above price level-to-level switches only.
* **Found side.** Valid raw rows scored by the Pipeline itself: every other level of each
  movable categorical / ordinal variable; along each numeric / integer variable, both ways
  (as its direction allows, inside its bounds), a geometric scan of steps ``2^k`` scales
  (``k = -5..5``) then bisection to the flip (integers rounded away from ``x``); a ray
  along the direction of the numeric variables that lowers the margin fastest per unit of
  cost (the margin's gradient through the pipeline's slopes), scanned and bisected the same
  way; and the three single level switches that lower the true class's probability most,
  their pairs (two variables), and the same line and ray searches from each of these; and
  DeepFool steps in the numeric variables under the cost's metric (:func:`_deepfool`), from
  the data and from those switches.
  The cheapest misclassified row of each sample is ``dup_i`` (its cost priced by
  :meth:`~otstab.modeling._datacost.ResolvedCost.cost` from the rows alone).

The exact 0/1 dual on ``dup`` gives Q* (valid raw rows) and the upper end; the dual on
``dlow`` the certified lower end (:func:`otstab.bounds.zero_one_lower_value`). The audit
re-scores Q*'s raw rows with the Pipeline and re-prices them with the cost
(:func:`otstab.solve._datacost_zero_one._raw_audit`).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from ..errors import ValidationError
from ..modeling._costs import Rescaled
from ..modeling._nonlinear import MLPModel
from . import _bounds as bounds
from . import _crown as crown
from ._datacost_linear import _level_index, encode, flip_problem, predict
from ._datacost_trees import (
    _moved_frame,
    final_estimator,
    finish_raw_bounds,
    raw_distances_result,
)

__all__ = ["certify_datacost_network", "is_network_model", "encoded_weights",
           "found_moves"]

#: the geometric scan of the numeric line search: steps 2^k scales
SCAN = 2.0 ** np.arange(-5, 6)
#: bisection steps of the numeric line search
BISECT = 24
#: the single level switches per sample that the found side combines and searches from
TOP = 3


def is_network_model(model) -> bool:
    """Whether ``model`` (or a Pipeline's last step) is a network this path reads."""
    return type(final_estimator(model)).__name__ == "MLPClassifier"


def encoded_weights(model, rc, frame: pd.DataFrame, d: int) -> np.ndarray:
    """``w`` (d,): per encoded column, the weight of the squared encoded move that never
    exceeds the DataCost of a valid raw move (module doc); ``inf`` for a column no movable
    variable moves. Raises ValidationError when the pipeline maps a numeric variable
    nonlinearly."""
    w = np.full(d, math.inf)
    for v in rc.variables:
        cols = list(rc.map.variable(v.name).columns)
        if not cols or v.immutable or not math.isfinite(v.price):
            continue
        if v.kind in ("numeric", "integer"):
            sl = rc.map.slopes(v.name)
            if any(s is None for s in sl.values()):
                raise ValidationError(
                    f"cost=DataCost with a network: the pipeline maps {v.name!r} nonlinearly; "
                    "declare it categorical (kinds=) or use cost='encoded'")
            live = {j: float(s) for j, s in sl.items() if s != 0}
            for j, s in live.items():
                w[j] = v.price / (len(live) * (v.scale * s) ** 2)
            continue
        assert v.levels is not None  # categorical / ordinal
        probe = frame.iloc[[0] * len(v.levels)].reset_index(drop=True)
        probe[v.name] = pd.Series(list(v.levels), dtype=object)
        E = encode(model, probe)[:, cols]
        c = math.inf
        L = len(v.levels)
        for a in range(L):
            for b in range(L):
                if a == b:
                    continue
                n2 = float(np.sum((E[b] - E[a]) ** 2))
                if n2 == 0.0:
                    continue
                if v.kind == "categorical":
                    cost = v.price * v.switch_cost(v.levels[a], v.levels[b])
                else:
                    cost = v.price * ((b - a) / v.scale) ** 2
                c = min(c, cost / n2)
        w[cols] = c
    return w


def _level_codes(model, rc, frame):
    """``{name: (cols, E (L, |cols|), cur (n,) level positions)}`` of the movable categorical
    and ordinal variables (``E``: the pipeline's encoding of each level)."""

    out = {}
    for v in rc.variables:
        if v.kind in ("numeric", "integer") or v.immutable or not math.isfinite(v.price):
            continue
        cols = list(rc.map.variable(v.name).columns)
        assert v.levels is not None
        probe = frame.iloc[[0] * len(v.levels)].reset_index(drop=True)
        probe[v.name] = pd.Series(list(v.levels), dtype=object)
        E = encode(model, probe)[:, cols]
        out[v.name] = (cols, E, _level_index(frame[v.name].to_numpy(), v.levels))
    return out


def _level_costs(v, cur):
    """(n, L): the cost of each level from each sample's current one (0: itself; ``inf``
    where the current value is not a level)."""
    L = len(v.levels)
    if v.kind == "categorical":
        T = np.array([[0.0 if a == b else v.price * v.switch_cost(v.levels[a], v.levels[b])
                       for b in range(L)] for a in range(L)])
    else:
        k = np.arange(L)
        T = v.price * ((k[None, :] - k[:, None]) / v.scale) ** 2
    C = np.full((cur.size, L), math.inf)
    have = cur >= 0
    C[have] = T[cur[have]]
    return C


def _box(rc, codes, Z, budget):
    """Per sample, the encoded box every valid raw move of DataCost <= ``budget`` stays in
    (directions and bounds dropped: a larger box): ``(lo, hi)`` (n, d)."""
    lo, hi = Z.copy(), Z.copy()
    for v in rc.variables:
        if v.immutable or not math.isfinite(v.price):
            continue
        if v.kind in ("numeric", "integer"):
            for j, sl in rc.map.slopes(v.name).items():
                half = abs(float(sl)) * v.scale * np.sqrt(budget / v.price)
                lo[:, j] -= half
                hi[:, j] += half
            continue
        cols, E, cur = codes[v.name]
        reach = _level_costs(v, cur) <= budget[:, None]  # (n, L)
        for c, j in enumerate(cols):
            e = np.where(reach, E[None, :, c], np.nan)
            lo[:, j] = np.fmin(lo[:, j], np.nanmin(np.where(reach, e, np.inf), axis=1))
            hi[:, j] = np.fmax(hi[:, j], np.nanmax(np.where(reach, e, -np.inf), axis=1))
    return lo, hi


def _linear_margin(net, Z, yint, lo, hi):
    """A linear lower bound ``m(z) >= c + a . (z - Z_i)`` of the binary margin of a
    one-hidden-layer network on the box ``[lo, hi]`` (CROWN with box pre-activation bounds).
    Returns ``(c, a)``."""
    W0, b0 = np.asarray(net.W[0]), np.asarray(net.b[0])
    W1, b1 = np.asarray(net.W[1])[:, 0], float(np.asarray(net.b[1])[0])
    cen, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    pre = cen @ W0 + b0
    rad = half @ np.abs(W0)
    kl, cl, ku, cu = crown.relax(net.ops, net.acts[0], pre - rad - crown.ROUND * (
        np.abs(pre) + rad), pre + rad + crown.ROUND * (np.abs(pre) + rad))
    Lam = yint[:, None] * W1[None, :]
    Lp, Ln = np.maximum(Lam, 0.0), np.minimum(Lam, 0.0)
    coef = Lp * kl + Ln * ku
    const = np.sum(Lp * cl + Ln * cu, axis=1) + yint * b1
    a = coef @ W0.T
    z0 = Z @ W0 + b0
    c = np.sum(coef * z0, axis=1) + const
    size = np.sum(np.abs(coef * z0), axis=1) + np.sum(np.abs(Lp * cl) + np.abs(Ln * cu), axis=1) \
        + abs(b1)
    return c - 1e-10 * (1.0 + size), a


def _knapsack_costs(rc, codes, frame, Z, c, a):
    """Per sample, the least DataCost of a valid raw move whose gain ``-a . dz`` reaches
    ``c`` (the linear DataCost knapsack of :mod:`otstab_solvers.knapsack`, each sample with its
    own linear function)."""
    from otstab_solvers.knapsack import solve_batch


    m = Z.shape[0]
    parts: dict = {}
    for v in rc.variables:
        if v.immutable or not math.isfinite(v.price):
            continue
        if v.kind in ("numeric", "integer"):
            sl = rc.map.slopes(v.name)
            parts[v.name] = ("slope", sum(a[:, j] * float(s_) for j, s_ in sl.items()))
            continue
        cols, E, _ = codes[v.name]
        fl = E @ a[:, cols].T  # (L, m)
        fc = np.zeros((m, m))
        fc[np.arange(m), np.arange(m)] = np.einsum("ij,ij->i", Z[:, cols], a[:, cols])
        parts[v.name] = ("levels", fl, fc)
    fin, ints, conts, _ = flip_problem(rc, parts, frame, -np.eye(m), np.arange(m))
    return solve_batch(c, fin, ints, conts)[0]


def knapsack_lower(model, rc, frame, Z, yint, dlow, dup, *, steps=12, chunk=256):
    """Certified ``d*_i >= B`` by bisection on the budget ``B`` in ``[dlow_i, dup_i]``: the
    box the budget reaches (:func:`_box`), CROWN's linear lower bound of the margin on it,
    and the least DataCost of a valid move that drives that bound to 0 (a knapsack): if it
    exceeds B, no valid move of cost <= B (all inside the box) flips the sample. Binary
    one-hidden-layer networks; returns ``dlow`` unchanged otherwise."""
    net = crown.as_network(MLPModel(final_estimator(model)))
    if net is None or net.task != "binary" or len(net.W) != 2:
        return dlow
    codes = _level_codes(model, rc, frame)
    lo = np.array(dlow, dtype=np.float64, copy=True)
    hi = np.array(dup, dtype=np.float64, copy=True)
    todo = np.flatnonzero(np.isfinite(hi) & (hi > lo * (1 + 1e-6)) & (hi > 0))
    for s0 in range(0, todo.size, chunk):
        idx = todo[s0:s0 + chunk]
        sub = frame.iloc[idx].reset_index(drop=True)
        Zs = Z[idx]
        for _ in range(steps):
            B = np.where(lo[idx] > 0, np.sqrt(lo[idx] * hi[idx]), 0.5 * hi[idx])
            lb, ub = _box(rc, codes if not codes else
                          {k: (cc, E, cur[idx]) for k, (cc, E, cur) in codes.items()}, Zs, B)
            c, a = _linear_margin(net, Zs, yint[idx], lb, ub)
            kap = _knapsack_costs(rc, {k: (cc, E, cur[idx]) for k, (cc, E, cur)
                                       in codes.items()}, sub, Zs, c, a)
            ok = (c > 0) & (kap > B * (1 + 1e-9))
            lo[idx] = np.where(ok, B, lo[idx])
            hi[idx] = np.where(ok, hi[idx], B)
    return np.maximum(dlow, lo)


def numeric_columns(rc, movable) -> np.ndarray:
    """The movable encoded columns of numeric / integer variables (boolean, like
    ``movable``)."""
    out = np.zeros_like(np.asarray(movable, dtype=bool))
    for v in _numeric(rc):
        out[list(rc.map.variable(v.name).columns)] = True
    return out & np.asarray(movable, dtype=bool)


def off_level_rows(rc, frame) -> np.ndarray:
    """Rows whose value of some movable categorical / ordinal variable is not one of its
    levels (an unseen category): the lower bounds here price level-to-level switches only, so
    these rows get ``dlow = 0``."""

    out = np.zeros(len(frame), dtype=bool)
    for v in rc.variables:
        if v.kind in ("numeric", "integer") or v.immutable or not math.isfinite(v.price):
            continue
        out |= _level_index(frame[v.name].to_numpy(), v.levels) < 0
    return out


def cheapest_switch(rc, frame) -> np.ndarray:
    """Per row, the least cost of changing the level of one categorical / ordinal variable
    (``inf`` when none may change): a lower bound on the cost of any move that changes one."""

    out = np.full(len(frame), math.inf)
    for v in rc.variables:
        if v.kind in ("numeric", "integer") or v.immutable or not math.isfinite(v.price):
            continue
        cur = _level_index(frame[v.name].to_numpy(), v.levels)
        C = _level_costs(v, cur)
        C[np.arange(len(frame))[cur >= 0], cur[cur >= 0]] = math.inf
        out = np.minimum(out, C.min(axis=1))
    return out


def _proba_true(model, rows: pd.DataFrame, yi) -> np.ndarray:
    P = np.asarray(model.predict_proba(rows))
    return P[np.arange(len(rows)), yi]


def _wrong(model, rows: pd.DataFrame, y0) -> np.ndarray:
    return predict(model, rows) != np.asarray(y0)


def _level_moves(rc, frame, rows):
    """Every single level switch of the samples ``rows``: ``(sample, variable, level)``."""
    out = []
    for v in rc.variables:
        if v.kind in ("numeric", "integer") or v.immutable or not math.isfinite(v.price):
            continue
        cur = frame[v.name].to_numpy()
        for i in rows:
            for lv in v.levels or ():
                if not _same(lv, cur[i]):
                    out.append((i, v.name, lv))
    return out


def _same(a, b) -> bool:
    try:
        return bool(a == b) or (isinstance(a, float) and isinstance(b, float)
                                and math.isnan(a) and math.isnan(b))
    except (TypeError, ValueError):
        return False


def _line_search(model, rc, base: pd.DataFrame, owner, y0):
    """Along each movable numeric / integer variable, both ways: the smallest scanned step
    that flips the prediction of the rows ``base`` (sample ``owner[k]`` for row ``k``), then
    bisection. Returns ``[(row k, {variable: value})]`` of misclassified moved rows."""
    out: list = []
    m = len(base)
    if m == 0:
        return out
    for v in rc.variables:
        if v.kind not in ("numeric", "integer") or v.immutable or not math.isfinite(v.price):
            continue
        x = base[v.name].to_numpy(dtype=np.float64)
        for t in (1.0, -1.0):
            if v.direction and t != v.direction:
                continue
            room = np.where(t > 0, np.maximum(v.hi, x) - x, x - np.minimum(v.lo, x))
            steps = np.minimum(SCAN[None, :] * v.scale, room[:, None])  # (m, S)
            if v.kind == "integer":
                steps = np.floor(steps)
            S = steps.shape[1]
            big = base.iloc[np.repeat(np.arange(m), S)].reset_index(drop=True)
            vals = (x[:, None] + t * steps).reshape(-1)
            big[v.name] = vals
            bad = _wrong(model, big, np.repeat(y0, S)).reshape(m, S) & (steps > 0).reshape(m, S)
            hit = bad.any(axis=1)
            if not hit.any():
                continue
            k = np.argmax(bad, axis=1)
            ks = np.flatnonzero(hit)
            hi = steps[ks, k[ks]]
            lo = np.where(k[ks] > 0, steps[ks, np.maximum(k[ks] - 1, 0)], 0.0)
            sub = base.iloc[ks].reset_index(drop=True)
            for _ in range(BISECT if v.kind == "numeric" else 60):
                mid = 0.5 * (lo + hi)
                if v.kind == "integer":
                    mid = np.floor(mid)
                    open_ = hi - lo > 1
                else:
                    open_ = hi - lo > 1e-12 * np.maximum(hi, 1.0)
                if not open_.any():
                    break
                probe = sub.copy()
                probe[v.name] = x[ks] + t * mid
                wr = _wrong(model, probe, y0[ks])
                hi = np.where(open_ & wr, mid, hi)
                lo = np.where(open_ & ~wr, mid, lo)
            for j, kk in enumerate(ks):
                out.append((int(kk), {v.name: float(x[kk] + t * hi[j])}))
    return out


def _numeric(rc):
    return [v for v in rc.variables if v.kind in ("numeric", "integer") and not v.immutable
            and math.isfinite(v.price)]


def _ray_search(model, rc, base: pd.DataFrame, y0):
    """From each row of ``base``, along the direction in the movable numeric / integer
    variables that lowers the margin fastest per unit of cost (the margin's gradient through
    the pipeline's slopes, ``delta_v = -g_v scale_v^2 / price_v``, zero against a variable's
    direction), clipped to the bounds: a geometric scan of the cost then bisection (integers
    rounded). Returns ``[(row k, {variable: value})]`` of misclassified moved rows."""
    num = _numeric(rc)
    m = len(base)
    if not num or m == 0:
        return []
    final = final_estimator(model)
    classes = list(final.classes_)
    yi = np.array([classes.index(c) for c in np.asarray(y0)])
    yint = np.where(yi == 1, 1, -1) if len(classes) == 2 else yi
    _, g = MLPModel(final).margin_and_grad(encode(model, base), yint)
    x = np.stack([base[v.name].to_numpy(dtype=np.float64) for v in num], axis=1)
    D = np.zeros_like(x)
    tmax = np.full(m, math.inf)
    for k, v in enumerate(num):
        sl = rc.map.slopes(v.name)
        if any(s_ is None for s_ in sl.values()):
            return []
        gv = sum(g[:, j] * float(s_) for j, s_ in sl.items())
        dv = -gv * v.scale ** 2 / v.price
        if v.direction:
            dv = np.where(np.sign(dv) == v.direction, dv, 0.0)
        D[:, k] = dv
    nrm = np.sqrt(sum(num[k].price * (D[:, k] / num[k].scale) ** 2 for k in range(len(num))))
    D = np.where((nrm > 0)[:, None], D / np.where(nrm > 0, nrm, 1.0)[:, None], 0.0)
    for k, v in enumerate(num):
        room = np.where(D[:, k] > 0, np.maximum(v.hi, x[:, k]) - x[:, k],
                        x[:, k] - np.minimum(v.lo, x[:, k]))
        with np.errstate(divide="ignore", invalid="ignore"):
            tmax = np.minimum(tmax, np.where(D[:, k] != 0, room / np.abs(D[:, k]), math.inf))
    ok = nrm > 0

    def rows_at(idx, t):
        P = base.iloc[idx].reset_index(drop=True)
        for k, v in enumerate(num):
            val = x[idx, k] + t * D[idx, k]
            if v.kind == "integer":
                val = np.round(val)
            P[v.name] = val
        return P

    S = SCAN.size
    idx = np.repeat(np.flatnonzero(ok), S)
    if idx.size == 0:
        return []
    tt = np.minimum(np.tile(SCAN, int(ok.sum())), tmax[idx])
    bad = _wrong(model, rows_at(idx, tt), np.asarray(y0)[idx]).reshape(-1, S)
    hit = bad.any(axis=1)
    rows_ok = np.flatnonzero(ok)[hit]
    if rows_ok.size == 0:
        return []
    kk = np.argmax(bad[hit], axis=1)
    T = tt.reshape(-1, S)[hit]
    hi = T[np.arange(rows_ok.size), kk]
    lo = np.where(kk > 0, T[np.arange(rows_ok.size), np.maximum(kk - 1, 0)], 0.0)
    for _ in range(BISECT):
        mid = 0.5 * (lo + hi)
        wr = _wrong(model, rows_at(rows_ok, mid), np.asarray(y0)[rows_ok])
        hi, lo = np.where(wr, mid, hi), np.where(wr, lo, mid)
    P = rows_at(rows_ok, hi)
    return [(int(k), {v.name: float(P[v.name].iloc[j]) for v in num})
            for j, k in enumerate(rows_ok)]


def _deepfool(model, rc, base: pd.DataFrame, y0, iters=6):
    """DeepFool steps in the movable numeric / integer variables under the cost's metric: at
    the current point, the margin ``m`` and its gradient ``g`` (through the pipeline's slopes)
    give the cheapest move to the linearised boundary, ``delta_v = -1.02 m g_v s_v^2 / p_v /
    sum_u g_u^2 s_u^2 / p_u`` (zero against a direction, clipped to bounds); the segment from
    the data to the last misclassified iterate is then bisected (integers rounded). Returns
    ``[(row k, {variable: value})]`` of misclassified moved rows."""
    num = _numeric(rc)
    m = len(base)
    if not num or m == 0:
        return []
    final = final_estimator(model)
    classes = list(final.classes_)
    y0 = np.asarray(y0)
    yi = np.array([classes.index(c) for c in y0])
    yint = np.where(yi == 1, 1, -1) if len(classes) == 2 else yi
    slopes = [rc.map.slopes(v.name) for v in num]
    if any(s_ is None for sl in slopes for s_ in sl.values()):
        return []
    x0 = np.stack([base[v.name].to_numpy(dtype=np.float64) for v in num], axis=1)
    lo = np.stack([np.minimum(v.lo, x0[:, k]) for k, v in enumerate(num)], axis=1)
    hi = np.stack([np.maximum(v.hi, x0[:, k]) for k, v in enumerate(num)], axis=1)
    wv = np.array([v.scale ** 2 / v.price for v in num])
    x = x0.copy()
    found = np.zeros(m, dtype=bool)
    best = x0.copy()

    def frame_at(idx, xx, rnd=True):
        P = base.iloc[idx].reset_index(drop=True)
        for k, v in enumerate(num):
            P[v.name] = np.round(xx[:, k]) if (rnd and v.kind == "integer") else xx[:, k]
        return P

    for _ in range(iters):
        P = frame_at(np.arange(m), x, rnd=False)
        mg, g = MLPModel(final).margin_and_grad(encode(model, P), yint)
        G = np.stack([sum(g[:, j] * float(s_) for j, s_ in sl.items()) for sl in slopes], 1)
        for k, v in enumerate(num):
            if v.direction:
                G[:, k] = np.where(-np.sign(G[:, k]) == v.direction, G[:, k], 0.0)
        den = np.sum(G * G * wv, axis=1)
        ok = den > 0
        step = np.where(ok, -1.02 * np.maximum(mg, 0.0) / np.where(ok, den, 1.0), 0.0)
        x = np.clip(x + step[:, None] * G * wv, lo, hi)
        wr = _wrong(model, frame_at(np.arange(m), x), y0)
        new = wr & ~found
        best[new] = x[new]
        found |= wr
        if found.all():
            break
    idx = np.flatnonzero(found)
    if idx.size == 0:
        return []
    lo_t, hi_t = np.zeros(idx.size), np.ones(idx.size)
    D = best[idx] - x0[idx]
    for _ in range(BISECT):
        mid = 0.5 * (lo_t + hi_t)
        wr = _wrong(model, frame_at(idx, x0[idx] + mid[:, None] * D), y0[idx])
        hi_t, lo_t = np.where(wr, mid, hi_t), np.where(wr, lo_t, mid)
    P = frame_at(idx, x0[idx] + hi_t[:, None] * D)
    return [(int(k), {v.name: float(P[v.name].iloc[j]) for v in num})
            for j, k in enumerate(idx)]


def found_moves(model, rc, frame: pd.DataFrame, y0, rows):
    """The cheapest misclassified valid raw row found for each sample of ``rows`` (module
    doc): ``(dup, moves)`` with ``moves[i]`` a dict ``{variable: new value}`` (None and
    ``dup = inf`` where none was found)."""
    n = len(frame)
    y0 = np.asarray(y0)
    dup = np.full(n, math.inf)
    moves: list = [None] * n
    classes = list(final_estimator(model).classes_)
    yi = np.array([classes.index(c) for c in y0])

    def consider(cands):
        if not cands:
            return
        idx = np.array([i for i, _ in cands])
        X1 = _moved_frame(frame.iloc[idx].reset_index(drop=True),
                          [mv for _, mv in cands])
        cost = rc.cost(frame.iloc[idx].reset_index(drop=True), X1)
        wr = _wrong(model, X1, y0[idx])
        for k, (i, mv) in enumerate(cands):
            if wr[k] and cost[k] < dup[i]:
                dup[i], moves[i] = float(cost[k]), dict(mv)

    # single level switches
    lv = _level_moves(rc, frame, rows)
    consider([(i, {name: level}) for i, name, level in lv])
    # numeric line searches from the data
    base = frame.iloc[rows].reset_index(drop=True)
    consider([(int(rows[k]), mv) for k, mv in _line_search(model, rc, base, rows, y0[rows])])
    # ... and along the margin's steepest direction per unit of cost
    consider([(int(rows[k]), mv) for k, mv in _ray_search(model, rc, base, y0[rows])])
    consider([(int(rows[k]), mv) for k, mv in _deepfool(model, rc, base, y0[rows])])
    # from each sample's TOP most damaging single switches: pairs of them, and the numeric
    # searches from each
    if lv:
        idx = np.array([i for i, _, _ in lv])
        X1 = _moved_frame(frame.iloc[idx].reset_index(drop=True),
                          [{name: level} for _, name, level in lv])
        pt = _proba_true(model, X1, yi[idx])
        top: dict = {}
        for k in np.argsort(pt, kind="stable"):
            top.setdefault(int(idx[k]), [])
            if len(top[int(idx[k])]) < TOP:
                top[int(idx[k])].append(int(k))
        bases = [(int(idx[k]), {lv[k][1]: lv[k][2]}) for v in top.values() for k in v]
        for i, ksi in top.items():
            for u in range(len(ksi)):
                for v in range(u + 1, len(ksi)):
                    a, b = lv[ksi[u]], lv[ksi[v]]
                    if a[1] != b[1]:
                        bases.append((i, {a[1]: a[2], b[1]: b[2]}))
        consider(bases)
        owner = np.array([i for i, _ in bases])
        start = _moved_frame(frame.iloc[owner].reset_index(drop=True), [sw for _, sw in bases])
        consider([(int(owner[j]), {**bases[j][1], **mv})
                  for j, mv in _line_search(model, rc, start, owner, y0[owner])])
        consider([(int(owner[j]), {**bases[j][1], **mv})
                  for j, mv in _ray_search(model, rc, start, y0[owner])])
        consider([(int(owner[j]), {**bases[j][1], **mv})
                  for j, mv in _deepfool(model, rc, start, y0[owner])])
    return dup, moves


def certify_datacost_network(model, prob, rc, frame, *, r, theta1, theta2, divergence, solver,
                             t_start, time_budget=None):
    """The 0/1 certificate of an MLP Pipeline under a DataCost (module doc), its inputs
    prepared by :func:`otstab.solve._datacost_certify.certify_datacost`."""
    final = final_estimator(model)
    classes = np.asarray(final.classes_)
    y0 = np.asarray(prob.y_original)
    yi = np.searchsorted(classes, y0)
    Z = np.asarray(prob.X, dtype=np.float64)
    n, d = Z.shape
    loss0 = np.asarray(prob.losses(prob.X), dtype=np.float64)
    rows = np.flatnonzero(~(loss0 > 0))
    dlow, dup = np.zeros(n), np.zeros(n)
    moves: list = [None] * n
    t0 = time.perf_counter()
    w = encoded_weights(model, rc, frame, d)
    info: dict = {"method": "weighted encoded distance (DataCost never below it) certified by "
                  "the network bounds"}
    if rows.size and not math.isfinite(theta1):
        dlow[rows] = dup[rows] = math.inf
    elif rows.size:
        dup_r, mv_r = found_moves(model, rc, frame, y0, rows)
        dup[rows] = dup_r[rows]
        for i in rows:
            moves[i] = mv_r[i]
        mask = np.isfinite(w)
        if np.any(w[mask] <= 0):
            info["method"] = "none: a movable variable costs nothing to move (dlow = 0)"
        elif mask.any():
            s = np.where(mask, np.sqrt(np.where(mask, w, 1.0)), 1.0)
            adapter = Rescaled(MLPModel(final), s)
            yint = np.where(yi == 1, 1, -1) if len(classes) == 2 else yi
            up = np.where(np.isfinite(dup), dup, math.inf)
            opts = {} if time_budget is None else {"time_budget": time_budget}
            got = bounds.certified_distances(adapter, Z[rows] * s, yint[rows], mask=mask,
                                             upper=up[rows], **opts)
            if got is not None:
                dl, inf_ = got
                dlow[rows] = np.minimum(dl, dup[rows])
                info = {**inf_, "method": info["method"] + f" ({inf_.get('method')})"}
            sub = frame.iloc[rows].reset_index(drop=True)
            # a move either switches some level (cost >= the sample's cheapest switch) or moves
            # numeric variables only (cost >= their certified weighted distance)
            num = numeric_columns(rc, mask)
            if num.any() and num.sum() < mask.sum():
                sw = cheapest_switch(rc, sub)
                gn = bounds.certified_distances(adapter, Z[rows] * s, yint[rows], mask=num,
                                                upper=up[rows], **opts)
                if gn is not None:
                    split = np.minimum(np.minimum(gn[0], sw), dup[rows])
                    if np.any(split > dlow[rows]):
                        dlow[rows] = np.maximum(dlow[rows], split)
                        info["method"] += ("; raised by min(cheapest level switch, certified "
                                           "numeric-only distance)")
            tight = knapsack_lower(model, rc, sub, Z[rows], yint[rows], dlow[rows], dup[rows])
            if np.any(tight > dlow[rows]):
                dlow[rows] = np.minimum(tight, dup[rows])
                info["method"] += ("; raised by CROWN on the box a budget reaches and the "
                                   "DataCost knapsack on its linear bound")
        else:  # nothing can move: no move flips anything
            dlow[rows] = dup[rows] = math.inf
    odd = off_level_rows(rc, frame)
    if np.any(odd & (dlow > 0)):  # the bounds above read level-to-level costs only
        dlow[odd] = 0.0
        info["method"] += (f"; {int(odd.sum())} row(s) whose current category is not among the "
                           "levels keep dlow = 0")
    info["time"] = time.perf_counter() - t0
    value_lower = bounds.zero_one_lower_value(dlow, loss0, r, theta1, theta2, divergence,
                                              prob.p)
    exact = bool(np.all(dlow[rows] >= dup[rows])) if rows.size else True
    res = raw_distances_result(model, prob, rc, frame, moves, dup, loss0, r, theta1, theta2,
                               divergence, solver, t_start, exact=exact,
                               value_lower=value_lower)
    res.info["lower_bound"] = {**info, "dlow": dlow}
    return finish_raw_bounds(
        res, prob, rc, t_start,
        "distances to misclassification under the DataCost: valid raw rows the Pipeline "
        "misclassifies give the upper end (value_upper); the network bounds on a weighted "
        "encoded distance that never exceeds the DataCost prove the lower end (value_lower)")
