"""The cheapest move that raises a separable score by a given amount: a multiple-choice knapsack
with convex quadratic tails, solved exactly per sample by branch and bound.

Each sample has a *need* ``R > 0`` (how much its score must move in the flipping direction)
and independent variables, each with options ``(gain, cost)``:

* **finite** variables (categorical or ordinal levels): a list of options, plus staying put
  (gain 0, cost 0);
* **integer** variables: ``k = 0, 1, ..., K`` steps, gain ``alpha k``, cost ``q k^2``;
* **continuous** variables: any gain ``g`` in ``[0, U]`` at cost ``Q g^2``.

The answer is ``min sum cost`` subject to ``sum gain >= R``. Finite and integer variables are
branched in a fixed order (depth first, cheapest bound first); the bound of a node is the
convex relaxation of the variables not yet fixed (finite options replaced by their lower
convex hull, integer steps by the continuous parabola through them), whose value as a function
of the remaining need is precomputed once per sample as a piecewise (linear or quadratic)
function of the Lagrange multiplier of the need (:class:`Relaxation`). The relaxation is a
lower bound of every completion (convex hull and parabola lie below the options), so a
subtree is cut only when its bound reaches the incumbent: the answer is the exact minimum up
to a relative ``REL_TOL``. The continuous variables are never branched: once every discrete
variable is fixed their part is solved in closed form (water filling, ``g = min(lam / (2Q),
U)``). An integer variable's steps are visited outwards from the relaxation's real optimum
``k`` (the bound is convex in ``k``, so each direction stops at its first cut).

Arrays only: this module never imports otstab.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

__all__ = ["Relaxation", "Prepared", "solve_one", "solve_batch", "REL_TOL"]

#: a subtree is cut when its bound is within this relative distance of the incumbent
REL_TOL = 1e-13
INF = math.inf


class Relaxation:
    """The convex relaxation ``phi(R)``: the least cost of gain ``>= R`` from ``hulls``
    (lists of lower-hull vertices ``(g, c)`` after ``(0, 0)``, slopes increasing) and
    ``quads`` (``(Q, U)``: gain ``g`` in ``[0, U]`` at cost ``Q g^2``). By convex duality
    ``phi(R) = max_lam lam R - sum_v max_g (lam g - cost_v(g))``; as ``lam`` grows each
    quadratic's gain ``min(lam / 2Q, U)`` grows linearly and each hull jumps to its next
    vertex at that edge's slope. ``value(R)`` finds the multiplier whose total gain reaches
    ``R`` (a jump: linear in R; between jumps: quadratic in R)."""

    def __init__(self, hulls, quads):
        events = []
        B, active = 0.0, 0
        for Q, U in quads:
            if not U > 0.0:
                continue
            B += 0.5 / Q
            active += 1
            if math.isfinite(U):
                events.append((2.0 * Q * U, 1, Q, U))
        for verts in hulls:
            g0 = c0 = 0.0
            for g, c in verts:
                events.append(((c - c0) / (g - g0), 0, g - g0, c - c0))
                g0, c0 = g, c
        events.sort(key=lambda e: e[0])
        A = C0 = 0.0
        self.lam, self.gm, self.gp, self.cm, self.state = [], [], [], [], []
        for lam, kind, a1, a2 in events:
            self.lam.append(lam)
            self.state.append((A, B, C0))
            self.gm.append(A + B * lam)
            self.cm.append(C0 + 0.5 * B * lam * lam)
            if kind == 0:
                A += a1
                C0 += a2
            else:
                active -= 1
                B = B - 0.5 / a1 if active else 0.0
                A += a2
                C0 += a1 * a2 * a2
            self.gp.append(A + B * lam)
        # (rounding: make the jump ends nondecreasing for the bisection)
        for e in range(1, len(self.gp)):
            if self.gp[e] < self.gp[e - 1]:
                self.gp[e] = self.gp[e - 1]
        self.final = (A, B, C0)

    def value(self, R: float) -> tuple[float, float]:
        """``(phi(R), lam)``: the relaxation's least cost of gain ``>= R`` and its multiplier
        (``(inf, nan)`` when the gain cannot reach R, ``(0, 0)`` for ``R <= 0``)."""
        if R <= 0.0:
            return 0.0, 0.0
        e = bisect.bisect_left(self.gp, R)
        if e < len(self.gp):
            if R >= self.gm[e]:
                return self.cm[e] + self.lam[e] * (R - self.gm[e]), self.lam[e]
            A, B, C0 = self.state[e]
        else:
            A, B, C0 = self.final
            if B <= 0.0:
                return INF, math.nan
        t = R - A
        return C0 + 0.5 * t * t / B, t / B


def _pareto(options):
    """Options ``(g, c, index)`` with ``g > 0`` and finite ``c`` that no other option
    dominates (at least the gain for at most the cost), ascending in gain (and cost)."""
    opts = sorted((o for o in options if o[0] > 0.0 and o[1] < INF),
                  key=lambda o: (-o[0], o[1]))
    out, best = [], INF
    for o in opts:
        if o[1] < best:
            out.append(o)
            best = o[1]
    out.reverse()
    return out


def _lower_hull(opts):
    """Vertices after ``(0, 0)`` of the lower convex hull of ``(0, 0)`` and ``opts``
    (ascending gain and cost)."""
    hull = [(0.0, 0.0)]
    for g, c, _ in opts:
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (x1 - x0) * (c - y0) - (y1 - y0) * (g - x0) <= 0.0:
                hull.pop()
            else:
                break
        hull.append((g, c))
    return hull[1:]


def _cut(bound: float, best: float) -> bool:
    return bound >= best * (1.0 - REL_TOL)


def solve_one(need, finite, integer, continuous):
    """The cheapest move of one sample.

    Parameters
    ----------
    need : float
        The gain to reach (``<= 0``: nothing to do).
    finite : list of lists of ``(gain, cost)``
        Each finite variable's options besides staying put (cost ``inf``: forbidden).
    integer : list of ``(alpha, q, K)``
        Gain ``alpha k`` at cost ``q k^2`` for ``k = 0..K`` (``K`` may be ``inf``).
    continuous : list of ``(Q, U)``
        Gain in ``[0, U]`` at cost ``Q g^2``.

    Returns
    -------
    (cost, choices, steps, gains)
        ``cost`` (``inf`` when no move reaches ``need``), the option index of each finite
        variable (-1: stays), the steps ``k`` of each integer variable, the gain of each
        continuous variable.
    """
    return Prepared(finite, integer, continuous).solve(need)


class Prepared:
    """The options of one sample made ready for any need (:func:`solve_one`): Pareto
    options, branching order and the relaxations of every suffix of the order, built once
    and shared by the samples with the same options (:func:`solve_batch`)."""

    def __init__(self, finite, integer, continuous):
        nf, ni = len(finite), len(integer)
        self.nf, self.ni = nf, ni
        pareto = [_pareto([(g, c, j) for j, (g, c) in enumerate(opts)]) for opts in finite]
        # branching order: finite variables by their best gain per cost (the greedy knapsack
        # order: the first dive finds a good incumbent), then integer variables by the cost
        # of one step, coarse first (their relaxation is the loosest; the fine ones, last,
        # are nearly continuous and their windows of steps stay narrow)
        self.forder = sorted(range(nf), key=lambda v: -max(
            (g / c if c > 0 else INF) for g, c, _ in pareto[v]) if pareto[v] else 0.0)
        self.iorder = sorted(range(ni), key=lambda v: -integer[v][1])
        self.fin = [pareto[v] for v in self.forder]
        hulls = [_lower_hull(p) for p in self.fin]
        self.ints = [tuple(integer[v]) for v in self.iorder]
        iquads = [(q / (a * a), a * K) if a > 0.0 and K > 0 else (1.0, 0.0)
                  for a, q, K in self.ints]
        self.conts = [(Q, U) for Q, U in continuous]
        nd = nf + ni
        # phi[i]: relaxation of the variables i.. (finite first, then integer, then
        # continuous); phi[nd] (continuous only) is exact
        self.phi = []
        for i in range(nd + 1):
            hs = hulls[i:] if i < nf else []
            qs = iquads[max(i - nf, 0):] + self.conts
            self.phi.append(Relaxation(hs, qs))

    def solve(self, need):
        """:func:`solve_one` for this sample's options and ``need``."""
        nf, ni, fin, ints, phi = self.nf, self.ni, self.fin, self.ints, self.phi
        conts = self.conts
        if need <= 0.0:
            return 0.0, [-1] * nf, [0] * ni, [0.0] * len(conts)
        nd = nf + ni
        best = [INF, None, None]  # cost, discrete choices, multiplier of the continuous part
        chosen = [None] * nd

        def record(cost, lam):
            if cost < best[0]:
                best[0], best[1], best[2] = cost, list(chosen), lam

        def dfs(i, R, acc):
            if R <= 0.0:
                for j in range(i, nd):
                    chosen[j] = -1 if j < nf else 0
                record(acc, 0.0)
                return
            if i == nd:
                c, lam = phi[nd].value(R)
                if c < INF:
                    record(acc + c, lam)
                return
            if _cut(acc + phi[i].value(R)[0], best[0]):
                return
            nxt = phi[i + 1]
            if i < nf:
                cands = [(acc + nxt.value(R)[0], -1, 0.0, 0.0)]
                for g, c, j in fin[i]:
                    cands.append((acc + c + nxt.value(R - g)[0], j, g, c))
                cands.sort(key=lambda t: t[0])
                for bound, j, g, c in cands:
                    if _cut(bound, best[0]):
                        break
                    chosen[i] = j
                    dfs(i + 1, R - g, acc + c)
                return
            a, q, K = ints[i - nf]
            if not (a > 0.0 and K > 0):
                chosen[i] = 0
                dfs(i + 1, R, acc)
                return
            lam = phi[i].value(R)[1]
            kr = min(lam * a / (2.0 * q), K)
            top = min(K, math.ceil(R / a))
            k0 = min(math.floor(kr), top)
            if i == nd - 1:
                # the last integer variable: q k^2 + phi[nd](R - a k) is the exact cost (only
                # continuous variables follow) and convex in k, minimised over the reals at kr:
                # the integer minimum is at floor(kr) or ceil(kr)
                for k in (k0, k0 + 1):
                    if 0 <= k <= top:
                        chosen[i] = k
                        dfs(i + 1, R - a * k, acc + q * k * k)
                return

            def bound(k):
                return acc + q * k * k + nxt.value(R - a * k)[0]

            down, up = k0, k0 + 1
            bd = bound(down) if down >= 0 else INF
            bu = bound(up) if up <= top else INF
            while True:
                if bd <= bu:
                    if _cut(bd, best[0]):
                        break
                    k = down
                    down -= 1
                    bd = bound(down) if down >= 0 else INF
                else:
                    if _cut(bu, best[0]):
                        break
                    k = up
                    up += 1
                    bu = bound(up) if up <= top else INF
                chosen[i] = k
                dfs(i + 1, R - a * k, acc + q * k * k)

        dfs(0, float(need), 0.0)
        cost, ch, lam = best
        if ch is None:
            return INF, [-1] * nf, [0] * ni, [0.0] * len(conts)
        choices = [-1] * nf
        for pos, v in enumerate(self.forder):
            choices[v] = ch[pos]
        steps = [0] * ni
        for pos, v in enumerate(self.iorder):
            steps[v] = ch[nf + pos]
        gains = [min(lam / (2.0 * Q), U) if U > 0.0 else 0.0 for Q, U in conts]
        return cost, choices, steps, gains


def solve_batch(need, finite=(), integer=(), continuous=()):
    """:func:`solve_one` for every sample (row) of arrays.

    ``need`` (n,); ``finite``: list of ``(G, C)`` arrays (n, L) of the options' gains and
    costs; ``integer``: list of ``(alpha, q, K)`` arrays (n,); ``continuous``: list of
    ``(Q, U)`` arrays (n,). Returns ``(cost (n,), choices (n, nf) int, steps (n, ni) float,
    gains (n, nc))``. Samples with the same options (all but the need) share one
    :class:`Prepared` (few categorical variables and no bounds: a handful for any n).
    """
    need = np.asarray(need, dtype=np.float64)
    n = need.size
    nf, ni, nc = len(finite), len(integer), len(continuous)
    cost = np.zeros(n)
    choices = np.full((n, nf), -1, dtype=np.intp)
    steps = np.zeros((n, ni))
    gains = np.zeros((n, nc))
    todo = np.flatnonzero(need > 0.0)
    F = [(np.asarray(G, dtype=np.float64)[todo].tolist(),
          np.asarray(C, dtype=np.float64)[todo].tolist()) for G, C in finite]
    Ia = [[np.broadcast_to(np.asarray(v, dtype=np.float64), (n,))[todo].tolist() for v in t]
          for t in integer]
    Cq = [[np.broadcast_to(np.asarray(v, dtype=np.float64), (n,))[todo].tolist() for v in t]
          for t in continuous]
    cache: dict = {}
    needs = need[todo].tolist()
    for pos, i in enumerate(todo.tolist()):
        fin = tuple(tuple(zip(G[pos], C[pos])) for G, C in F)
        ints = tuple((a[pos], q[pos], K[pos]) for a, q, K in Ia)
        conts = tuple((Q[pos], U[pos]) for Q, U in Cq)
        key = (fin, ints, conts)
        prep = cache.get(key)
        if prep is None:
            prep = cache[key] = Prepared(fin, ints, conts)
        c, ch, ks, gs = prep.solve(needs[pos])
        cost[i] = c
        choices[i] = ch
        steps[i] = ks
        gains[i] = gs
    return cost, choices, steps, gains
