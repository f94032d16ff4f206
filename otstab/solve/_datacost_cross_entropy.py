"""Cross-entropy certificates of multiclass linear models under a :class:`otstab.DataCost`: a
certified interval ``[value_lower, value_upper]`` (``status = 'bounds'``, or ``'optimal'``
when its ends meet within the audit's tolerance).

With ``K`` classes, scores ``s_k`` and ``d_k(u) = s_k(u) - s_y(u)`` (linear in the raw
variables, a sum over them: :mod:`otstab.solve._datacost_linear`), the cross-entropy of a raw
row is ``CE(u) = log(1 + sum_{k != y} e^{d_k(u)})``, sandwiched by maxima of binary logistic
losses ``phi(t) = log(1 + e^t)`` (``E0_i = sum_k e^{d_k(u_i)}``, ``Delta_k = d_k(u) -
d_k(u_i)``):

    max_k phi(d_k(u)) <= CE(u) <= max_k phi(d_k(u_i) - log pi_k + Delta_k)

for any probability vector ``pi`` over the wrong classes (``sum_k a_k e^{Delta_k} <=
max_k (a_k / pi_k) e^{Delta_k}``): uniform gives ``phi(d_k(u) + log(K - 1))``, ``pi_k``
proportional to ``e^{d_k(u_i)}`` gives ``phi(log E0_i + Delta_k)``, and the softmax weights of
the wrong classes at a row ``u*`` make the bound tight at ``u*``.

A maximum over ``k`` commutes with the d-transform's maximum over moves, so each side's
d-transform is a maximum over ``k`` of the exact binary logistic transforms of
:mod:`otstab.solve._datacost_smooth` (:class:`MaxOracle`).

* **value_lower**: the dual function is decreasing in ``l_h``, so at any ``h`` the dual
  function of the smallest upper transform (each raised by its branch and bound's gap) is a
  lower bound on R (weak duality). The transforms: ``pi`` uniform, ``pi`` from the data, and
  ``pi`` from Q*'s rows (the upper end's); the bound is taken at the optimal ``h`` of the
  first two duals, at the candidates' ``h`` and by a short bounded search near it.
* **value_upper**: the cost of a valid Q* made of raw rows. Each sample gets a finite set of
  candidate rows: the maximising moves of every class's lower and upper transforms at those
  ``h`` (both sides of a kink), minorise-maximise steps from the best one (:func:`_mm_step`),
  and staying. On these candidates the problem is exact: ``l_h`` is the maximum of ``h CE(c)
  - theta1 cost(c)`` over them, the true cross-entropy of each candidate computed from the
  model's own ``decision_function`` (convex piecewise-linear in ``h``), and its dual gives Q*
  (masses split at a kink so that the risk is r) and the value, which the audit confirms by
  re-scoring Q*'s raw rows. Restricting the moves can only raise R, so the value is an upper
  bound on R; since the candidates hold the Q* of the lower surrogate loss (``max_k
  phi(d_k) <= CE``), it is also at most that loss's R.

See docs/math.md ("Multiclass cross-entropy: a certified interval").
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers.dual import dual_objective, solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.weights import weights_at
from scipy.optimize import minimize_scalar

from ..errors import SolverError
from ..modeling._losses import SmoothLoss
from . import _audit as audit
from ._datacost_linear import flip_problem, moved_rows
from ._datacost_result import edges_before_dual, raw_result
from ._datacost_smooth import Q_TIE, REL_TOL, LogisticOracle

__all__ = ["MaxOracle", "FiniteOracle", "certify_datacost_cross_entropy", "class_slots"]

#: rounds of local improvement of the candidates (each re-solves the candidates' dual) and
#: minorise-maximise steps per round (:func:`_mm_step`)
IMPROVE_ROUNDS = 1
IMPROVE_STEPS = 2
#: the search for a better h of the lower end: (from, to) times the candidates' h, and at
#: most this many evaluations
LOWER_SEARCH = (0.5, 1.2, 10)
#: smallest weight of a wrong class in the third upper transform (its ``-log pi`` shift)
PI_FLOOR = 1e-12
#: relative distance under which two candidates (or two classes' transforms) tie at h
TIE = 1e-12


class MaxOracle:
    """``l_h = max_j l_h^{(j)}`` of every sample over the oracles ``parts`` (each with
    ``argmax(h, right) -> (l_h, d1, d2, ...)``); at a tie the side picks the larger (right)
    or smaller (left) derivative."""

    h_max = math.inf

    def __init__(self, parts):
        self.parts = list(parts)
        self.n = self.parts[0].n

    def evaluate(self, h, side="right"):
        right = side == "right"
        outs = [o.argmax(h, right) for o in self.parts]
        L = np.stack([o[0] for o in outs])
        D1 = np.stack([o[1] for o in outs])
        D2 = np.stack([o[2] for o in outs])
        top = L.max(axis=0)
        tie = L >= top - TIE * (1.0 + np.abs(top))
        key = np.where(tie, D1 if right else -D1, -np.inf)
        pick = np.argmax(key, axis=0)
        cols = np.arange(L.shape[1])
        return top, D1[pick, cols], D2[pick, cols]


class FiniteOracle:
    """``l_h = max_c (h A[:, c] - B[:, c])`` over finitely many candidates per sample
    (``A``: the loss at each candidate, ``B``: ``theta1`` times its cost; ``-inf`` pads)."""

    h_max = math.inf

    def __init__(self, A, B):
        self.A = np.asarray(A, dtype=np.float64)
        self.B = np.asarray(B, dtype=np.float64)
        self.n = self.A.shape[0]

    def pick(self, h, right=True, tie=TIE):
        """``(l_h, the side's candidate)``: among the candidates within the relative ``tie``
        of the best, the larger loss on the right, the smaller on the left (Q* is built with
        a looser tie than the dual's, since the dual's ``h`` lies near a kink, not on it)."""
        with np.errstate(invalid="ignore"):
            V = np.where(np.isfinite(self.B), h * self.A - self.B, -np.inf)
        top = V.max(axis=1)
        tie = V >= (top - tie * (1.0 + np.abs(top)))[:, None]
        key = np.where(tie, self.A if right else -self.A, -np.inf)
        return top, np.argmax(key, axis=1)

    def evaluate(self, h, side="right"):
        top, c = self.pick(h, side == "right")
        return top, self.A[np.arange(self.n), c], np.zeros(self.n)

    def split_at(self, h, r, theta2, divergence, p=None, tie=Q_TIE):
        """Q* of the dual at ``h`` as candidates: every sample at its left candidate, and
        where the left and right candidates differ, shares moved to the right one in order
        until the risk is exactly r. Returns ``(w, alpha, src, mass, which, l_h)``: the
        weights and chi2 multiplier at h, each atom's sample, mass and candidate column."""
        n = self.n
        rows = np.arange(n)
        lh, cl = self.pick(h, False, tie)
        _, cr = self.pick(h, True, tie)
        w, alpha = weights_at(lh, theta2, divergence, p)  # alpha: chi2's multiplier
        pw = w / n if p is None else w * p
        aL, aR = self.A[rows, cl], self.A[rows, cr]
        gain = pw * (aR - aL)
        kinked = np.flatnonzero(gain > 0)
        frac = np.zeros(n)
        frac[kinked] = audit.shares_in_order(gain[kinked], r - float(np.sum(pw * aL)))
        split = np.flatnonzero((frac > 0) & (frac < 1.0))
        first = np.where(frac >= 1.0, cr, cl)
        src = np.concatenate([rows, split])
        mass = np.concatenate([np.where(frac >= 1.0, 1.0, 1.0 - frac), frac[split]])
        which = np.concatenate([first, cr[split]])
        return w, alpha, src, mass, which, lh


def class_slots(y, K):
    """``(n, K - 1)`` other classes of each sample, in increasing order."""
    y = np.asarray(y, dtype=np.intp)
    j = np.arange(K - 1)[None, :]
    return j + (j >= y[:, None])


def _ce(model, frame, y):
    """The cross-entropy of raw rows from the model's own ``decision_function``."""
    S = np.asarray(model.decision_function(frame), dtype=np.float64)
    return SmoothLoss("cross_entropy").values(S, y)


def certify_datacost_cross_entropy(model, prob, rc, parts, frame, *, r, theta1, theta2,
                                   divergence, t_start, loss_name="cross_entropy", keep=None):
    """``certify(..., loss="cross_entropy", cost=DataCost)`` of a multiclass linear classifier
    (see the module doc). ``keep``: a dict that receives the candidates' oracle
    (``"oracle"``: a :class:`FiniteOracle`) and the losses at the data (``"loss0"``), for the
    bootstrap."""
    n = prob.n
    rows = np.arange(n)
    y = prob.y.astype(np.intp)
    S = np.asarray(prob.scores, dtype=np.float64)
    K = S.shape[1]
    p = prob.p
    loss0 = SmoothLoss("cross_entropy").values(S, y)
    edge = edges_before_dual(model, prob, rc, frame, loss0, r, theta1, theta2, divergence,
                             t_start, loss_name)
    if edge is not None:
        return edge
    slots = class_slots(y, K)
    shift = math.log(K - 1)
    # log sum_{k != y} e^{d_k} at the data: CE0 + log(1 - e^{-CE0})
    log_e0 = np.logaddexp.reduce(S[rows[:, None], slots] - S[rows, y][:, None], axis=1)
    lower, upper, upper_e, layouts, options = [], [], [], [], []
    for j in range(K - 1):
        k = slots[:, j]
        coef = -np.eye(K)[y]
        coef[rows, k] += 1.0
        fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rows)
        z = S[rows, k] - S[rows, y]
        lower.append(LogisticOracle(z, fin, ints, conts, theta1))
        upper.append(LogisticOracle(z + shift, fin, ints, conts, theta1))
        upper_e.append(LogisticOracle(log_e0, fin, ints, conts, theta1))
        layouts.append(layout)
        options.append((fin, ints, conts))
    d0 = S[rows[:, None], slots] - S[rows, y][:, None]  # (n, K - 1)

    def lower_at(h, pi=None):
        """The certified lower bound on R at ``h``: the dual function of the smallest of the
        upper transforms (each raised by its branch and bound's gap); ``pi`` (n, K - 1): a
        probability vector per sample over its wrong classes for a third one (module doc)."""
        groups = [upper, upper_e]
        if pi is not None:
            groups.append([LogisticOracle(d0[:, j] - np.log(pi[:, j]), *options[j], theta1)
                           for j in range(K - 1)])
        ub = None
        for group in groups:
            outs = [o.argmax(h, True) for o in group]
            # + the branch and bound's own slack: cells within REL_TOL of the best are
            # dropped, and the gap of those stopped at the float limit
            top = np.max([o[0] + o[6] + REL_TOL * (1.0 + np.abs(o[0])) for o in outs],
                         axis=0)
            ub = top if ub is None else np.minimum(ub, top)
        return max(float(dual_objective(ub, h, r, theta2, divergence, p)), 0.0)

    # the certified lower end: the duals of the upper losses (module doc), each at the
    # optimal h of either, later also at the candidates' h
    hs = []
    for group in (upper, upper_e):
        sol_u = solve_dual(MaxOracle(group), r, theta2, divergence, p=p,
                           h_init=hs[0] if hs else None)
        if sol_u.status == OPTIMAL and math.isfinite(sol_u.h):
            hs.append(float(sol_u.h))
    if not hs:
        raise SolverError(f"the cross-entropy dual under the DataCost did not converge "
                          f"({sol_u.native_status}); r may be unreachable")
    lows = {h: lower_at(h) for h in hs}
    sol_l = solve_dual(MaxOracle(lower), r, theta2, divergence, p=p, h_init=hs[0])
    if sol_l.status == OPTIMAL and math.isfinite(sol_l.h):
        hs.append(float(sol_l.h))
    # candidates: every class's maximisers of both transforms at both h, both sides
    cands = [frame]
    for h in hs:
        for group in (lower, upper):
            for j, o in enumerate(group):
                for right in (False, True):
                    out = o.argmax(h, right, tie=Q_TIE)
                    cands.append(moved_rows(frame.copy(), rows, layouts[j], out[3], out[4],
                                            out[5], np.ones(n, dtype=bool)))
    A = np.column_stack([loss0] + [_ce(model, c, y) for c in cands[1:]])
    C = np.column_stack([np.zeros(n)] + [rc.cost(frame, c) for c in cands[1:]])
    B = _priced(C, theta1)
    fo = FiniteOracle(A, B)
    if math.isfinite(theta1):
        for _ in range(IMPROVE_ROUNDS):  # local improvement at the candidates' own h
            sol = solve_dual(fo, r, theta2, divergence, p=p)
            if sol.status != OPTIMAL or not math.isfinite(sol.h):
                break
            h = float(sol.h)
            _, c = fo.pick(h, True)
            start = _pick_rows(cands, c, rows)
            for _step in range(IMPROVE_STEPS):
                start = _mm_step(model, rc, parts, frame, start, y, K, h, theta1)
                cands.append(start)
                A = np.column_stack([A, _ce(model, start, y)])
                B = np.column_stack([B, _priced(rc.cost(frame, start), theta1)])
            fo = FiniteOracle(A, B)
    if keep is not None:
        keep.update(oracle=fo, loss0=loss0)
    sol = solve_dual(fo, r, theta2, divergence, p=p)
    if sol.status != OPTIMAL or not math.isfinite(sol.h):
        raise SolverError(f"the cross-entropy dual on the candidate rows did not converge "
                          f"({sol.native_status}); r may be out of their reach")
    h = float(sol.h)
    w, alpha, src, mass, which, lh = fo.split_at(h, r, theta2, divergence, p)
    star = _pick_rows(cands, which, src)
    X0 = frame.iloc[src].reset_index(drop=True)
    loss_star = _ce(model, star, y[src])
    moved2 = rc.cost(X0, star)
    alpha = None if math.isinf(theta2) else alpha
    res = raw_result(model, prob, rc, frame, star, src, mass, w[src], loss0, loss_star, moved2,
                     float(sol.value), h, alpha, r, theta1, theta2, divergence, t_start, sol,
                     loss_name)
    why = audit.accept(res)
    if why:
        raise SolverError("the cross-entropy certificate under the DataCost failed its audit "
                          "on the model's own scores of Q*'s raw rows: " + "; ".join(why))
    _, cr = fo.pick(h, True, Q_TIE)
    pi = _wrong_class_weights(model, _pick_rows(cands, cr, rows), y, slots)
    lows[h] = lower_at(h, pi)
    if h > 0:  # weak duality holds at every h: a short search for a better one near h
        seen: dict = {}

        def neg(t):
            seen[t] = lower_at(t, pi)
            return -seen[t]
        minimize_scalar(neg, bounds=(LOWER_SEARCH[0] * h, LOWER_SEARCH[1] * h),
                        method="bounded", options={"maxiter": LOWER_SEARCH[2],
                                                   "xatol": 1e-3 * h})
        lows.update(seen)
    h_low = max(lows, key=lambda t: lows[t])
    value_lower = lows[h_low]
    res.info["lower_bound"] = {
        "method": "dual function at h of min(max_k l_h[log(1 + (K-1) e^{d_k})], max_k l_h["
                  "log(1 + E0 e^{d_k - d_k(x)})]) >= l_h[CE] (weak duality)",
        "h": h_low, "value": value_lower}
    res.info["candidates"] = len(cands)
    if audit.close_interval(res, value_lower, r):
        return res
    note = ("multiclass cross-entropy under the DataCost: Q* (valid raw rows, the best of "
            "each class's logistic maximisers, improved locally) gives the upper end "
            "(value_upper), the dual of a loss proved >= CE the certified lower end "
            "(value_lower)")
    res.message = f"{res.message}; {note}" if res.message else note
    return res


def _wrong_class_weights(model, rows_, y, slots):
    """``pi`` (n, K - 1): the softmax weights of each sample's wrong classes at the raw rows
    ``rows_``, renormalised over them, floored at ``PI_FLOOR`` and renormalised (any
    probability vector gives a valid upper transform; this one is tight at ``rows_``)."""
    S = np.asarray(model.decision_function(rows_), dtype=np.float64)
    W = S[np.arange(S.shape[0])[:, None], slots]
    W = np.exp(W - W.max(axis=1, keepdims=True))
    W = np.maximum(W / W.sum(axis=1, keepdims=True), PI_FLOOR)
    return W / W.sum(axis=1, keepdims=True)


def _priced(C, theta1):
    """``theta1`` times the costs ``C`` (inf: forbidden; ``theta1 = inf``: only staying)."""
    C = np.asarray(C, dtype=np.float64)
    if not math.isfinite(theta1):
        return np.where(C > 0, math.inf, 0.0)
    return np.where(np.isfinite(C), theta1 * C, math.inf)


def _mm_step(model, rc, parts, frame, start, y, K, h, theta1):
    """One minorise-maximise step of ``h CE(u) - theta1 c(x, u)`` from the raw rows ``start``:
    CE is convex in the score differences ``d``, so ``CE(d') >= CE(d) + lam . (d' - d)`` with
    ``lam`` the softmax weights of the wrong classes at ``start``; the move maximising
    ``h lam . d(u') - theta1 c(x, u')`` (separable: each variable's best option on its own)
    therefore does at least as well as ``start`` (its objective is >= start's). Returns the
    new raw rows."""
    n = len(frame)
    rows = np.arange(n)
    S = np.asarray(model.decision_function(start), dtype=np.float64)
    P = np.exp(S - S.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    coef = P.copy()
    coef[rows, y] -= 1.0  # sum_k lam_k (e_k - e_y): lam_k = P_k for k != y, sum = 1 - P_y
    fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rows)
    psi = LogisticOracle(np.zeros(n), fin, ints, conts, theta1).psi(np.full(n, h), rows, True)
    moved = moved_rows(frame.copy(), rows, layout, psi[4], psi[5], psi[6],
                       np.ones(n, dtype=bool))
    return moved


def _pick_rows(cands, which, src):
    """The raw row ``src[a]`` of candidate frame ``which[a]`` for every atom ``a``."""
    out = cands[0].iloc[src].reset_index(drop=True).copy()
    for c in np.unique(which):
        if c == 0:
            continue
        at = np.flatnonzero(which == c)
        part = cands[c].iloc[src[at]]
        for nm in out.columns:
            col = np.array(out[nm].astype(object).to_numpy(), dtype=object)
            col[at] = part[nm].astype(object).to_numpy()
            out[nm] = col
    for nm in out.columns:
        dt = cands[0][nm].dtype
        if dt.kind in "iuf":
            vals = np.asarray(out[nm].to_numpy(), dtype=np.float64)
            out[nm] = vals.astype(dt) if dt.kind == "f" or np.all(vals == np.round(vals)) \
                else vals
        else:
            out[nm] = out[nm].infer_objects() if dt.kind == "O" else out[nm].astype(dt)
    return out
