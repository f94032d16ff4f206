"""Exact logistic-loss certificates of binary linear models under a :class:`otstab.DataCost`.

The logistic loss of a raw row ``u`` is ``phi(z_i + g)`` with ``phi(t) = log(1 + e^t)``,
``z_i = -y_i s(u_i)`` and ``g`` the score change in the direction ``-y_i`` (a sum over the raw
variables, :mod:`otstab.datacost_linear`). The d-transform
``l_h(u_i) = max_moves h phi(z_i + g) - theta1 c`` does not separate as the hinge's does
(:mod:`otstab.datacost_hinge`), but its conjugate form does: with
``phi(t) = max_{lam in [0, 1]} lam t - phi*(lam)``, ``phi*(lam) = lam log lam + (1 - lam)
log(1 - lam)``, the two maxima commute and

    l_h(u_i) = max_{lam in [0, 1]} F_i(lam),
    F_i(lam) = h (lam z_i - phi*(lam)) + Psi_i(h lam),
    Psi_i(eta) = max_moves (eta g - theta1 c) = sum_v psi_v(eta),

``Psi_i`` being the hinge's separable transform (each variable's best level, integer step or
clipped continuous move found on its own). ``F_i`` is concave (the entropy part) plus convex
(``Psi_i``), so it may have several local maxima; its maximum is found by branch and bound
over ``lam``: on a cell ``[lam_1, lam_2]`` the convex ``Psi_i`` lies below its chord, so
``F_i`` lies below the concave ``h (lam z - phi*(lam)) + chord(lam)``, whose maximum is in
closed form (``lam = sigmoid(z + slope / h)``); every evaluated ``lam`` gives a move (the
maximiser of ``Psi_i`` at ``h lam``) whose true objective ``h phi(z + g) - theta1 c`` is a
lower bound. Cells whose upper bound does not exceed the best move by ``REL_TOL`` are dropped;
the maximiser lies in ``[sigmoid(z), sigmoid(z + G_i(h))]`` (``G_i(h)``: the gain of the
maximiser of ``Psi_i`` at ``h``, since the optimal ``lam = sigmoid(z + g*)`` and the gain is
nondecreasing in ``eta``). Cells are kept on the side of 1/2 where ``lam`` (or ``1 - lam``)
is small, so that cells near ``lam = 1`` keep their precision.

``dl_h/dh`` is the logistic loss at the maximising move (envelope theorem; at a tie of two
moves the right derivative is the larger loss), and the 1-D concave dual of
:func:`otstab_solvers.dual.solve_dual` is maximised on it. Q* moves each sample to its
maximising raw row at the optimal ``h``; where the maximiser jumps at ``h`` the masses are
split between the two so that the risk of Q* is r (as the hinge path does). The audit
re-scores Q*'s raw rows with the model's ``decision_function`` and re-prices them with the
cost.
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers.dual import solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.weights import chi2_solution

from ..errors import SolverError
from . import _audit as audit
from ._datacost_linear import flip_problem, integer_step, split_at_kink
from ._datacost_result import edges_before_dual, raw_result

__all__ = ["LogisticOracle", "certify_datacost_logistic"]

#: relative tolerance of the branch and bound (a cell is dropped when its upper bound is
#: within this of the best move) and of ties between moves
REL_TOL = 1e-13
#: cells each sample's range of lam starts with
START_CELLS = 8
#: relative distance under which two moves count as tied when Q* is built (the dual's h is
#: within its tolerance of a kink, where the maximiser jumps; a move this close to the best
#: changes Q*'s cost by at most this much, far below the audit's tolerance)
Q_TIE = 1e-9
MAX_ROUNDS = 200


def _softplus(t):
    return np.logaddexp(0.0, t)


def _sigmoid(t):
    return 0.5 * (1.0 + np.tanh(0.5 * t))


def _entropy(nu):
    """``phi*(nu) = nu log nu + (1 - nu) log(1 - nu)`` (0 at the ends)."""
    nu = np.asarray(nu, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(nu > 0, nu * np.log(np.where(nu > 0, nu, 1.0)), 0.0)
        b = np.where(nu < 1, (1.0 - nu) * np.log1p(-np.where(nu < 1, nu, 0.0)), 0.0)
    return a + b


class LogisticOracle:
    """``l_h`` of every sample by branch and bound (see the module doc), with one-sided
    derivatives and the maximising moves."""

    h_max = math.inf

    def __init__(self, z, finite, integer, continuous, theta1):
        self.z = np.asarray(z, dtype=np.float64)
        self.n = self.z.size
        self.fin, self.ints, self.conts = finite, integer, continuous
        self.theta1 = theta1
        self.loss0 = _softplus(self.z)
        self.rounds = 0

    # -- Psi_i(eta) and its maximiser, for rows idx at per-row eta ------------------------
    def psi(self, eta, idx, right=True):
        """``(Psi, gain, cost, curvature, choices, steps, gains)`` of rows ``idx`` at
        ``eta`` (one per row): the best move of each variable on its own (ties: the larger
        gain on the right side, the smaller on the left)."""
        t1 = self.theta1
        m = idx.size
        gain = np.zeros(m)
        cost = np.zeros(m)
        curv = np.zeros(m)
        choices = np.full((m, len(self.fin)), -1, dtype=np.intp)
        steps = np.zeros((m, len(self.ints)))
        gains = np.zeros((m, len(self.conts)))
        rows = np.arange(m)
        for j, (G, C) in enumerate(self.fin):
            Gi, Ci = G[idx], C[idx]
            with np.errstate(invalid="ignore"):
                V = np.where(np.isfinite(Ci), eta[:, None] * Gi - t1 * Ci, -np.inf)
            best = np.maximum(V.max(axis=1, initial=-np.inf), 0.0)
            tol = REL_TOL * (1.0 + np.abs(best) + eta * np.abs(Gi).max(axis=1, initial=0.0))
            tie = V >= (best - tol)[:, None]
            key = np.where(tie, Gi if right else -Gi, -np.inf)
            pick = np.argmax(key, axis=1)
            g_pick = Gi[rows, pick]
            stay_ok = best <= tol
            use = tie[rows, pick] & ~(stay_ok & ((g_pick <= 0) if right else (g_pick >= 0)))
            choices[:, j] = np.where(use, pick, -1)
            gain += np.where(use, g_pick, 0.0)
            cost += np.where(use, Ci[rows, pick], 0.0)
        for j, (a, q, K) in enumerate(self.ints):
            a, q, K = a[idx], q[idx], K[idx]
            k, _ = integer_step(eta, a, q, K, t1, REL_TOL, right)
            steps[:, j] = k
            gain += a * k
            cost += q * k * k
        for j, (Q, U) in enumerate(self.conts):
            Q, U = Q[idx], U[idx]
            free = eta / (2.0 * t1 * Q)
            g = np.minimum(free, U)
            gains[:, j] = g
            gain += g
            cost += Q * g * g
            inside = (free < U) if right else (free <= U)
            curv += np.where(inside & (U > 0), 1.0 / (2.0 * t1 * Q), 0.0)
        return eta * gain - t1 * cost, gain, cost, curv, choices, steps, gains

    # -- l_h ------------------------------------------------------------------------------
    def argmax(self, h, right=True, tie=REL_TOL):
        """``(l_h, dl_h/dh on that side, d2, choices, steps, gains, gap)`` of every sample;
        ``gap``: the largest upper bound left above the best move (the branch and bound's
        own certificate, ``<= REL_TOL`` relative unless cells reached the float limit).
        ``tie``: moves within this relative distance of the best count as tied (the side
        picks among them: the larger loss on the right, the smaller on the left); Q* is built
        with a looser tie than the dual's, since the dual's ``h`` lies near a kink, not on
        it."""
        n, z = self.n, self.z
        nf, ni, nc = len(self.fin), len(self.ints), len(self.conts)
        choices = np.full((n, nf), -1, dtype=np.intp)
        steps = np.zeros((n, ni))
        gains = np.zeros((n, nc))
        best = h * self.loss0  # staying put
        wobj = best.copy()  # the objective of each sample's witness move
        loss = self.loss0.copy()
        d2 = np.zeros(n)
        gap = np.zeros(n)
        if not math.isfinite(self.theta1) or h <= 0.0:
            return best, loss, d2, choices, steps, gains, gap
        t1 = self.theta1
        all_rows = np.arange(n)

        def offer(idx, eta):
            """Evaluate the move maximising Psi at eta for rows idx; keep it where better
            (or tied and better for the side). Returns Psi at eta and the move's objective."""
            val, g, c, cv, ch, st, gs = self.psi(eta, idx, right)
            obj = h * _softplus(z[idx] + g) - t1 * c
            lo = _softplus(z[idx] + g)
            top_ = best.copy()
            np.maximum.at(top_, idx, obj)
            # the witness: among the moves within the tie of the best, the side's choice (the
            # larger loss on the right, the smaller on the left)
            tol = tie * (1.0 + np.abs(top_[idx]))
            cand = np.flatnonzero(obj >= top_[idx] - tol)
            if cand.size:
                key = lo if right else -lo
                order = cand[np.argsort(key[cand], kind="stable")]
                rows_ = idx[order]
                _, last = np.unique(rows_[::-1], return_index=True)
                pick = order[::-1][last]
                r_ = idx[pick]
                tr = tie * (1.0 + np.abs(top_[r_]))
                stale = wobj[r_] < top_[r_] - tr
                side = (lo[pick] > loss[r_]) if right else (lo[pick] < loss[r_])
                take = stale | side
                pick, r_ = pick[take], r_[take]
                wobj[r_] = obj[pick]
                loss[r_] = lo[pick]
                choices[r_] = ch[pick]
                steps[r_] = st[pick]
                gains[r_] = gs[pick]
                lam = _sigmoid(z[r_] + g[pick])
                k = cv[pick]
                den = 1.0 - k * h * lam * (1.0 - lam)
                d2[r_] = np.where(den > 0, lam * lam * k / np.where(den > 0, den, 1.0), 0.0)
            best[:] = top_
            return val, obj

        # the range of lam: [sigmoid(z), sigmoid(z + G(h))]
        top = self.psi(np.full(n, h), all_rows, True)[1]
        live = np.flatnonzero(top > 0)
        if not live.size:
            return best, loss, d2, choices, steps, gains, gap
        lam_lo, lam_hi = _sigmoid(z[live]), _sigmoid(z[live] + top[live])
        # cells: (row, flip, nu1, nu2, Psi1, Psi2): lam = nu (flip False) or 1 - nu (True),
        # nu <= 1/2 so that either end keeps its precision
        edges = [lam_lo + (lam_hi - lam_lo) * k / START_CELLS for k in range(START_CELLS + 1)]
        rows_l, l1_l, l2_l = [], [], []
        for k in range(START_CELLS):
            rows_l.append(live)
            l1_l.append(edges[k])
            l2_l.append(edges[k + 1])
        row = np.concatenate(rows_l)
        l1 = np.concatenate(l1_l)
        l2 = np.concatenate(l2_l)
        # cells crossing 1/2 are cut there
        cross = (l1 < 0.5) & (l2 > 0.5)
        if cross.any():
            row = np.concatenate([row, row[cross]])
            l1, l2 = np.concatenate([l1, np.full(cross.sum(), 0.5)]), \
                np.concatenate([np.where(cross, 0.5, l2), l2[cross]])
        keep = l2 > l1
        row, l1, l2 = row[keep], l1[keep], l2[keep]
        flip = l1 >= 0.5
        nu1 = np.where(flip, 1.0 - l2, l1)
        nu2 = np.where(flip, 1.0 - l1, l2)
        # exact complements near 1: recompute from z (1 - sigmoid(t) = sigmoid(-t))
        at_lo = flip & (l1 == lam_lo[np.searchsorted(live, row)])
        at_hi = flip & (l2 == lam_hi[np.searchsorted(live, row)])
        pos = np.searchsorted(live, row)
        nu2 = np.where(at_lo, _sigmoid(-z[row]), nu2)
        nu1 = np.where(at_hi, _sigmoid(-(z[live] + top[live])[pos]), nu1)

        def eta_of(r_, f, nu):
            return np.where(f, h - h * nu, h * nu)

        p1 = offer(row, eta_of(row, flip, nu1))[0]
        p2 = offer(row, eta_of(row, flip, nu2))[0]
        for rnd in range(MAX_ROUNDS):
            self.rounds = max(self.rounds, rnd + 1)
            zf = np.where(flip, -z[row], z[row])
            base = np.where(flip, h * z[row], 0.0)
            width = nu2 - nu1
            s = np.where(width > 0, (p2 - p1) / np.where(width > 0, width, 1.0), 0.0)
            nh = np.clip(_sigmoid(zf + s / h), nu1, nu2)
            ub = base + h * (nh * zf - _entropy(nh)) + p1 + s * (nh - nu1)
            got = offer(row, eta_of(row, flip, nh))[1]
            tol = REL_TOL * (1.0 + np.abs(best[row]))
            # open: the cell may hold a better move, or one tied with the best that no
            # evaluation has offered yet (its side decides the derivative at a kink)
            open_ = (ub > best[row] + tol) | ((ub >= best[row] - tie * (1.0 + np.abs(best[row])))
                                              & (ub - got > tol))
            # cells at the float limit, or the last round's: their excess is the gap left
            stop = width <= 8.0 * np.spacing(np.maximum(nu2, 1e-300))
            if rnd == MAX_ROUNDS - 1:
                stop[:] = True
            if (open_ & stop).any():
                np.maximum.at(gap, row[open_ & stop], (ub - best[row])[open_ & stop])
            open_ &= ~stop
            if not open_.any():
                break
            row, flip, nu1, nu2, p1, p2 = (row[open_], flip[open_], nu1[open_], nu2[open_],
                                           p1[open_], p2[open_])
            mid = 0.5 * (nu1 + nu2)
            pm = offer(row, eta_of(row, flip, mid))[0]
            row = np.concatenate([row, row])
            flip = np.concatenate([flip, flip])
            nu1, nu2 = np.concatenate([nu1, mid]), np.concatenate([mid, nu2])
            p1, p2 = np.concatenate([p1, pm]), np.concatenate([pm, p2])
        return best, loss, d2, choices, steps, gains, gap

    def evaluate(self, h, side="right"):
        lh, d1, d2, *_ = self.argmax(h, side == "right")
        return lh, d1, d2


def certify_datacost_logistic(model, prob, rc, parts, frame, *, r, theta1, theta2, divergence,
                              t_start, loss_name="logistic"):
    """``certify(..., loss="logistic", cost=DataCost)`` of a binary linear classifier."""
    n = prob.n
    rows = np.arange(n)
    y = prob.y.astype(np.float64)
    z = -y * prob.scores
    coef = -y[:, None]
    fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rows)
    oracle = LogisticOracle(z, fin, ints, conts, theta1)
    p = prob.p
    loss0 = _softplus(z)
    edge = edges_before_dual(model, prob, rc, frame, loss0, r, theta1, theta2, divergence,
                             t_start, loss_name)
    if edge is not None:
        return edge
    sol = solve_dual(oracle, r, theta2, divergence, p=p)
    if sol.status != OPTIMAL or not math.isfinite(sol.h):
        raise SolverError(f"the logistic dual under the DataCost did not converge "
                          f"({sol.native_status}); r may be unreachable")
    h = float(sol.h)
    left = oracle.argmax(h, right=False, tie=Q_TIE)
    right = oracle.argmax(h, right=True, tie=Q_TIE)
    lh = right[0]
    w, src, mass, star, X0 = split_at_kink(frame, rows, layout, left, right, lh, r, p,
                                           theta2, divergence)
    scores = np.asarray(model.decision_function(star), dtype=np.float64)
    loss_star = _softplus(-y[src] * scores)
    moved2 = rc.cost(X0, star)
    wa = w[src]
    alpha = None if divergence == "kl" or math.isinf(theta2) else \
        chi2_solution(lh, theta2, p)[1]
    res = raw_result(model, prob, rc, frame, star, src, mass, wa, loss0, loss_star, moved2,
                     float(sol.value), h, alpha, r, theta1, theta2, divergence, t_start, sol,
                     loss_name)
    res.info["bb_gap"] = float(max(left[6].max(initial=0.0), right[6].max(initial=0.0)))
    why = audit.accept(res)
    if why:
        raise SolverError("the logistic certificate under the DataCost failed its audit on the "
                          "model's own scores of Q*'s raw rows: " + "; ".join(why))
    return res


