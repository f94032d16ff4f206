"""The certificate layer: one audit and one status decision for every solving path.

Every path (piecewise-linear dual or conic, 0/1 closed form and distances, exact smooth,
first-order, perturbation search) hands a *candidate* to this module: a dual value ``value``
(R(beta, r) as the solver computed it), the multiplier ``h`` and the atoms of the most
sensitive distribution Q* (points, weights, masses). The audit recomputes, independently of
the solver,

* ``primal_cost``: the OT cost of Q*, ``theta1 E[W ||x* - x||^2] + theta2 E[phi(W)]``,
* ``risk_star``: the risk of Q*, ``E_Q*[W l(x*, y)]`` with the model's own loss,
* ``total_mass``: ``E_Q*[W]``,

and :func:`accept` decides the status. A candidate is accepted when

* ``value >= 0`` and finite (``h = 0`` is feasible in the dual, so R >= 0),
* ``|total_mass - 1| <= MASS_TOL``,
* ``risk_star >= r (1 - RISK_RTOL)`` (Q* reaches the threshold, up to 1e-8 relative),
* ``|primal_cost - value| + CANCEL_RTOL h r <= AUDIT_RTOL |value|``.

The tolerance is relative to the value itself, not to 1, so it stays relative for tiny
values. ``CANCEL_RTOL h r`` bounds the rounding of the dual value itself: ``value = h r - T(h)``
is a difference of two numbers of size ``h r`` and cannot be computed to better than a few
ulps of ``h r`` (``CANCEL_RTOL = 4e-15``, about 18 ulps). When that rounding alone exceeds
``AUDIT_RTOL |value|`` (extreme price ratios: ``value / (h r) < 1e-7``) the value cannot be
certified to the promised precision in double precision, and the instance is refused rather
than answered.

``gap`` (reported on every result) is ``|primal_cost - value| / |value|``. The dual value is a
lower bound on R for any feasible dual point and ``primal_cost`` an upper bound (Q* is
feasible), so an accepted exact candidate pins R to within the tolerance.

Statuses (the only place that sets them):

* ``optimal``: exact path, audit passed; ``value_lower == value == value_upper``;
* ``bounds``: a path that is not exact (first-order, perturbation search for nonlinear
  models); the found Q* passed the audit, so ``value_upper = primal_cost`` is an upper bound
  on R; ``value_lower`` is the best certified lower bound the path has (0 when it has none);
* ``zero``: ``r`` is reached by the data itself (see :func:`reached`); R = 0;
* ``unreachable``: no allowed perturbation reaches r; R = inf.

A candidate that fails its audit is never returned: the path tries its next method and
:class:`otstab.errors.SolverError` says what was tried when none passes.
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers.weights import phi

from ..errors import SolverError

__all__ = ["AUDIT_RTOL", "RISK_RTOL", "MASS_TOL", "CANCEL_RTOL", "REACHED_RTOL", "AUDIT_DIRECT_MAX",
           "AUDIT_SAMPLE", "AUDIT_CELLS", "SAMPLED_RTOL", "sampled_error", "rows_per_block",
           "sample_positions", "audit_sums",
           "audit_points", "problems", "resolution_problem", "weak_duality_problem", "accept",
           "first_accepted", "unresolved_interval", "upper_near_base",
           "reached", "tolerance"]

#: relative tolerance of |cost(Q*) - value|
AUDIT_RTOL = 1e-6
#: relative shortfall of the risk of Q* below r that is put down to rounding
RISK_RTOL = 1e-8
#: tolerance of |E_Q*[W] - 1|
MASS_TOL = 1e-9
#: rounding bound of the dual value, relative to h r (see the module docstring)
CANCEL_RTOL = 4e-15
#: r counts as reached by the data when r <= base (1 + REACHED_RTOL) (status ``zero``): 0,
#: R(r) is continuous and positive above the base risk (issue 27), and a threshold whose value
#: the dual cannot resolve gets a certified interval instead (:func:`unresolved_interval`)
REACHED_RTOL = 0.0

OPTIMAL, BOUNDS, ZERO, UNREACHABLE = "optimal", "bounds", "zero", "unreachable"

#: above this many samples, paths of linear models may sum the audit from their reduced form
#: (the loss at the moved scores, the squared move) and confirm it on AUDIT_SAMPLE random atoms
#: materialised and re-scored by the model (:func:`sampled_check`)
AUDIT_DIRECT_MAX = 200_000
AUDIT_SAMPLE = 20_000
#: entries (rows x features) of each n x d temporary of an audit over blocks of rows (512 KB)
AUDIT_CELLS = 1 << 16
#: largest relative disagreement between the reduced form and the model on the sampled atoms
SAMPLED_RTOL = 1e-8


def reached(r: float, base: float) -> bool:
    """Whether the data's own risk ``base`` reaches ``r``: ``r <= base``.

    Decided on the library's own evaluation of the mean loss. Above it R(r) is positive (and
    continuous in r): close to the base risk, R is about ``h (r - base) / 2``, which the dual
    ``h r - T(h)`` may not resolve to the audit's 1e-6 in double precision; such an answer is
    not rounded to 0 but returned with a certified interval (status ``bounds``,
    :func:`unresolved_interval`).
    """
    return r <= base * (1.0 + REACHED_RTOL)


def tolerance(value: float, h: float, r: float, rounding: float | None = None) -> float:
    """The largest accepted |primal_cost - value|: AUDIT_RTOL |value| less the rounding bound
    of the dual value (negative when the value cannot be resolved; see the module docstring).
    ``rounding``: the path's own bound when it computes the value in a closed form that does not
    subtract two numbers of size h r (default ``CANCEL_RTOL h r``)."""
    if rounding is None:
        rounding = CANCEL_RTOL * abs(h) * r if math.isfinite(h) else 0.0
    return AUDIT_RTOL * abs(value) - rounding


def resolution_problem(value: float, h: float, r: float, rounding: float | None = None) -> str:
    """Why a dual value cannot be certified to AUDIT_RTOL in double precision ("" if it can):
    a negative value, or one whose own rounding bound CANCEL_RTOL h r exceeds AUDIT_RTOL
    |value|. Feature scores, which have no Q* of their own, are refused by the same rule."""
    if not math.isfinite(value):
        return ""
    if value < 0.0:
        return (f"the dual value {value:.6g} is negative, {UNRESOLVED} (rounding at these "
                "prices)")
    if math.isfinite(float(h)) and tolerance(value, h, r, rounding) < 0:
        return (f"the value {value:.6g} is {UNRESOLVED} in double "
                f"precision (h r = {abs(h) * r:.6g})")
    return ""


def weak_duality_problem(value: float, h: float, r: float, dual_at_h: float | None,
                         rounding: float | None = None, lh_rounding: float = 0.0) -> list[str]:
    """Why ``value`` is not a dual value the builder can confirm ([] if it is).

    ``dual_at_h``: the dual objective at the returned ``h`` as the builder of Q* evaluates it
    from its own ``l_h`` (clipped at the zero piece, a code path apart from the solver's sums;
    None: the path has none). Any ``h`` gives a lower bound on R (weak duality), and the audit
    matches ``value`` with the cost of Q*, an upper bound; the pair certifies R only when
    ``value`` is itself the dual objective at ``h``. A solver's value above it by more than
    the audit's tolerance and the rounding of the dual (``CANCEL_RTOL h r``, plus
    ``lh_rounding``, the path's bound on the rounding of each ``l_h``: at a kink a sample's
    ``c1 h + c2 h^2`` cancels to a few ulps of its terms, which either side may keep) is
    refuted."""
    if dual_at_h is None or not math.isfinite(value) or not math.isfinite(float(h)):
        return []
    if rounding is None:
        rounding = CANCEL_RTOL * abs(h) * r
    excess = value - float(dual_at_h)
    if not excess <= AUDIT_RTOL * abs(value) + rounding + lh_rounding:
        return [f"the value {value:.10g} exceeds the dual objective at h = {h:.6g} recomputed "
                f"from Q*'s l_h, {dual_at_h:.10g} (weak duality: not a dual value)"]
    return []


#: the marks of the audit problems that only say that the value is not resolved
UNRESOLVED = "below the resolution of the dual"
NEAR_BASE = "r within the rounding of the base risk"


def unresolved_interval(res, why: list[str], gap_bound: float = 0.0):
    """``(lower, upper)``: a certified interval for R when the candidate fails its audit only
    because its value is not resolved in double precision (None otherwise).

    - the value is below the dual's rounding (:func:`resolution_problem`): the dual
      objective at ``h`` less its rounding ``CANCEL_RTOL h r`` is a lower bound (weak duality;
      the weak-duality check passed); the cost of Q* (plus that rounding) an upper bound
      when Q* reaches r (otherwise the value plus the solver's ``gap_bound``, from the
      concavity of the dual on its bracket, and twice that rounding);
    - the dual answered ``h = 0`` while ``r`` is above the base risk (``r`` within the
      rounding of the dual's own sums): ``[0, res.info["upper_near_base"]]`` (inf when the path
      gives none); see :func:`upper_near_base`.
    """
    if not why or any(UNRESOLVED not in w and NEAR_BASE not in w for w in why):
        return None  # (the mass, the risk or weak duality failed: no interval either)
    h, r = float(res.h), float(res.r)
    # Q* reaches r (in the computed risk, without the audit's 1e-8 allowance, which may exceed
    # r - base here): its cost is an upper bound found apart from the solver
    cost = float(res.primal_cost)
    feasible = res.risk_star >= r and math.isfinite(cost)
    if any(NEAR_BASE in w for w in why):
        upper = float(res.info.get("upper_near_base", math.inf))
        return 0.0, min(upper, cost) if feasible else upper
    if not math.isfinite(h):
        return None
    rounding = res.info.get("value_rounding")
    rho = CANCEL_RTOL * abs(h) * r if rounding is None else float(rounding)
    value = float(res.value)
    dual_at_h = res.info.get("dual_at_h")
    low = max((value if dual_at_h is None else min(value, float(dual_at_h))) - rho, 0.0)
    if feasible:  # (plus the rounding of the losses the dual is evaluated from)
        return low, max(cost * (1.0 + 1e-12) + rho, low)
    gap = float(gap_bound) if math.isfinite(gap_bound) else math.inf
    return low, max(value, 0.0) + max(gap, 0.0) + 2.0 * rho


def upper_near_base(r: float, base: float, curvature: float, n: int) -> float:
    """An upper bound on R when ``r`` lies within rounding of the base risk ``base``.

    Every divergence term is at least the mean ``l_h`` (KL by Jensen, chi2 at the weights 1,
    theta2 = inf by definition), and each sample's ``l_h`` is at least ``h l_i + c2 h^2`` on
    the piece its loss comes from; so ``F(h) <= h (r - base*) - C h^2`` with ``C`` the mean
    ``c2`` of those pieces (``curvature``) and ``base*`` the exact base risk, and ``R <=
    delta^2 / (4 C)`` with ``delta = r - base`` plus the rounding of the computed base
    (``16 eps log2(n) base``)."""
    if not curvature > 0:
        return math.inf
    eps = float(np.finfo(float).eps)
    delta = max(r - base, 0.0) + 16.0 * eps * max(1.0, math.log2(max(n, 2))) * abs(base)
    return delta * delta / (4.0 * curvature)


def audit_sums(loss_base, loss_star, moved2, mass, w, theta1, theta2, divergence,
               value, p=None, src=None) -> dict:
    """Cost, risk and mass of Q* from per-atom arrays.

    ``loss_base`` (n,): the loss of each evaluation sample; ``loss_star``, ``moved2``,
    ``mass``, ``w`` (one entry per atom): the loss at the atom's point, its squared distance
    from its source sample, its share of that sample's mass and its weight. ``p`` (n,): the
    sample probabilities (None: uniform) and ``src`` the source sample of each atom: an atom
    then carries ``p[src] * mass`` of P0 and every sum is weighted by it.
    """
    # the P0-mass of each atom: its share of its sample times the sample's probability
    pm = mass / loss_base.size if p is None else mass * p[src]
    pmw = pm * w
    move_cost = 0.0 if math.isinf(theta1) else theta1 * float(np.dot(pmw, moved2))
    rew_cost = 0.0 if math.isinf(theta2) else theta2 * float(np.dot(pm, phi(w, divergence)))
    return summarise(loss_base, move_cost, rew_cost, float(np.dot(pmw, loss_star)),
                     float(np.sum(pmw)), float(np.dot(pm, loss_star)), value, loss_star, p)


def summarise(loss_base, move_cost, rew_cost, risk_star, total_mass, moved_risk, value,
              loss_star=None, p=None, *, base: float | None = None) -> dict:
    """The audit fields of a result from its sums (paths that sum compactly call this);
    ``p``: the sample probabilities (None: uniform) of the base risk. ``base``: the base risk
    when already known, ``loss_base`` then may be a builder (a result's lazy field)."""
    if base is None:
        base = float(np.mean(loss_base)) if p is None else float(np.dot(p, loss_base))
    primal = move_cost + rew_cost
    return {
        "risk_base": base, "risk_star": risk_star, "total_mass": total_mass,
        "primal_cost": primal, "gap": relative_gap(primal, value),
        "decomposition": {"base": base, "corruption": moved_risk - base,
                          "reweighting": risk_star - moved_risk,
                          "cost_moving": move_cost, "cost_reweighting": rew_cost},
        "loss_star": loss_star, "loss_base": loss_base,
    }


def relative_gap(primal: float, value: float) -> float:
    """|primal - value| / |value| (0 when both are 0; nan when either is not finite)."""
    if not (math.isfinite(primal) and math.isfinite(value)):
        return math.nan
    diff = abs(primal - value)
    if diff == 0.0:
        return 0.0
    return diff / abs(value) if value != 0.0 else math.inf


def audit_points(prob, X_star, src, mass, w, theta1, theta2, divergence, value) -> dict:
    """The audit of Q* given as points: the loss is recomputed with the model at every atom."""
    loss_star, moved2 = rescored(prob.losses, prob.y[src], prob.X[src], X_star)
    return audit_sums(prob.losses(prob.X), loss_star, moved2, mass, w, theta1, theta2,
                      divergence, value, prob.p, src)


def rows_per_block(d: int, max_rows: int) -> int:
    """Rows per block of an audit over ``d`` features: at most ``max_rows``, and at most
    :data:`AUDIT_CELLS` entries in each n x d temporary (gathered, moved, re-scored rows)."""
    return max(1, min(max_rows, AUDIT_CELLS // max(d, 1)))


def sample_positions(m: int, k: int, seed: int = 0) -> np.ndarray:
    """``min(k, m)`` distinct positions in ``range(m)``, ascending, drawn at random (fixed
    seed: the same atoms on every run): a stratified sample, one position drawn uniformly in
    each of ``k`` consecutive strata of ``m // k`` or ``m // k + 1`` positions, so every
    position is drawn with probability about ``k / m``, the sample spreads over all the rows,
    and no array of size ``m`` nor a sort is needed."""
    if k >= m:
        return np.arange(m)
    if k <= 0:
        return np.zeros(0, dtype=np.intp)
    rng = np.random.default_rng(seed)
    edges = (np.arange(k + 1, dtype=np.int64) * m) // k  # strata [edges[i], edges[i + 1])
    width = np.diff(edges)  # >= 1 as m > k
    return (edges[:-1] + (rng.random(k) * width).astype(np.int64)).astype(np.intp)


def shares_in_order(gain, need: float) -> np.ndarray:
    """The share of each candidate's mass moved so that their (positive) gains, taken in order,
    add up to ``need``: 1 while the running sum stays within it, the fraction that completes it
    for the next candidate, 0 after; at most one share lies strictly between 0 and 1, and
    every share is 0 when ``need <= 0``. (How Q* splits tied or switching samples so that its
    risk is exactly r.)"""
    frac = np.zeros(np.size(gain))
    if need > 0 and frac.size:
        cg = np.cumsum(gain)
        full = cg <= need
        frac[full] = 1.0
        k = int(np.count_nonzero(full))
        if k < frac.size:
            frac[k] = (need - (cg[k - 1] if k else 0.0)) / gain[k]
    return frac


def rescored(losses, y, Xg, Xs):
    """The model's own loss at moved points ``Xs`` (``losses(Xs, y)``) and each point's squared
    move from ``Xg`` as Q* holds it: ``x* - x`` in floating point, not the exact displacement
    (a move below the resolution of x is not one a user can reproduce)."""
    diff = Xs - Xg
    return np.asarray(losses(Xs, y), dtype=np.float64), np.einsum("ij,ij->i", diff, diff)


def sampled_error(direct_loss, loss, direct_d2, d2) -> float:
    """The largest relative disagreement of the reduced form (``loss``, ``d2``) with the model
    (``direct_loss``, ``direct_d2``: the loss and squared move of the materialised atoms)."""
    if not np.size(direct_loss):
        return 0.0
    return max(float(np.max(np.abs(direct_loss - loss) / (1 + np.abs(direct_loss)))),
               float(np.max(np.abs(direct_d2 - d2) / (1 + direct_d2))))


def problems(res) -> list[str]:
    """Why a candidate result fails its audit (empty: it passes)."""
    out = []
    value, r = res.value, res.r
    # a negative value of an exact dual is rounding (h = 0 is feasible, so R >= 0): not
    # resolved, the other checks still apply
    negative = isinstance(value, float) and math.isfinite(value) and value < 0.0 and \
        math.isfinite(float(res.h))
    if not (isinstance(value, float) and math.isfinite(value)) or (value < 0.0 and
                                                                   not negative):
        out.append(f"value {value!r} is not a finite nonnegative number")
        return out
    if not abs(res.total_mass - 1.0) <= MASS_TOL:
        out.append(f"mass of Q* {res.total_mass:.12g} != 1")
    if not res.risk_star >= r * (1.0 - RISK_RTOL):
        out.append(f"risk of Q* {res.risk_star:.10g} < r = {r:.10g}")
    if res.h == 0.0 and value == 0.0 and r > res.risk_base:
        # the dual saw no room above the base risk in its own sums (g(0+) <= 0), but r lies
        # above the base risk: R > 0 is below the rounding of the dual here, not 0
        out.append(f"{NEAR_BASE}: h = 0 while r = {r:.17g} > base risk {res.risk_base:.17g}")
    rounding = res.info.get("value_rounding")
    out += weak_duality_problem(value, res.h, r, res.info.get("dual_at_h"), rounding,
                                res.info.get("dual_at_h_rounding", 0.0))
    if negative:
        return out + [resolution_problem(value, res.h, r, rounding)]
    tol = tolerance(value, res.h, r, rounding)
    diff = abs(res.primal_cost - value)
    unresolved = resolution_problem(value, res.h, r, rounding)
    if unresolved:
        out.append(unresolved)
    elif not diff <= tol:
        out.append(f"cost of Q* {res.primal_cost:.10g} != value {value:.10g} "
                   f"(|diff| {diff:.3g} > tolerance {tol:.3g})")
    return out


def accept(res, *, exact: bool = True, value_lower: float = 0.0) -> list[str]:
    """Audit a candidate; when it passes set its status and bounds (and return []).

    ``exact``: the path computes R itself (then ``status = 'optimal'``); otherwise the found
    Q* gives the upper bound ``primal_cost`` and ``value_lower`` is the path's certified lower
    bound (``status = 'bounds'``).
    """
    if not exact:
        # the path's own estimate is not certified: the answer is the cost of the found Q*
        res.info["solver_estimate"] = res.value
        if isinstance(res.primal_cost, float) and math.isfinite(res.primal_cost):
            res.value, res.gap = float(res.primal_cost), 0.0
    why = problems(res)
    interval = unresolved_interval(res, why, float(getattr(res, "dual_gap_bound", 0.0) or 0.0)) \
        if exact else None
    res.info.setdefault("audit", {})
    res.info["audit"] = {**res.info["audit"],
                         "tolerance": tolerance(res.value, res.h, res.r,
                                                res.info.get("value_rounding")),
                         "passed": not why, "problems": why}
    if interval is not None:
        # exact path, value not resolved in double precision: a certified interval
        lo, hi = interval
        res.info["dual_value"] = res.value
        res.info["unresolved"] = "; ".join(why)
        res.exact = False
        res.status = BOUNDS
        res.value = res.value_upper = hi
        res.value_lower = min(lo, hi)
        res.gap = (hi - lo) / hi if hi > 0 else 0.0
        note = ("the value is not resolved in double precision at this threshold (r close "
                "to the base risk, or extreme prices): certified interval "
                f"[{res.value_lower:.6g}, {hi:.6g}]")
        res.message = f"{res.message} {note}" if res.message else note
        return []
    if why:
        return why
    res.exact = bool(exact)
    if exact:
        res.status = OPTIMAL
        res.value_lower = res.value_upper = res.value
    else:
        res.status = BOUNDS
        res.value_upper = res.primal_cost
        res.value_lower = min(max(float(value_lower), 0.0), res.primal_cost)
    return []


def close_interval(res, value_lower: float, r: float) -> bool:
    """An audited answer whose certified lower end came from elsewhere (a dual of an
    over-estimate): True, with ``value_lower = value_upper = value``, when it meets the
    audited value within the audit's tolerance; otherwise the answer becomes ``bounds``
    (``value_upper`` the audited value, ``value_lower`` the certified end, capped by it) and
    False."""
    tol = tolerance(res.value, res.h, r)
    if value_lower >= res.value - tol:
        res.value_lower = res.value_upper = res.value
        return True
    res.status, res.exact = BOUNDS, False
    res.value_upper = res.value
    res.value_lower = min(value_lower, res.value)
    return False


def mark_edge(res, kind: str) -> None:
    """Status and bounds of an answer decided before solving (``zero``, ``unreachable``,
    ``limit``); the limit case is audited like any other answer."""
    if kind == "zero":
        res.status, res.value_lower, res.value_upper = ZERO, 0.0, 0.0
    elif kind == "unreachable":
        res.status, res.value_lower, res.value_upper = UNREACHABLE, math.inf, math.inf
    else:
        why = accept(res)
        if why:
            raise SolverError(f"the limit-case answer failed its audit: {'; '.join(why)}")


def first_accepted(attempts, *, solver: str):
    """Run ``attempts`` (``(name, thunk)`` pairs; a thunk returns ``(candidate, exact,
    value_lower)`` or raises :class:`Skip`) in order and return the first candidate whose
    audit passes, with its ``solver_log``; raise :class:`SolverError` listing every try."""
    log = []
    for name, thunk in attempts:
        try:
            cand, exact, lower = thunk()
        except Skip as exc:
            log.append({"solver": name, "status": exc.status, "reason": str(exc)})
            if exc.fatal:
                raise exc.fatal from None
            continue
        why = accept(cand, exact=exact, value_lower=lower)
        if why:
            log.append({"solver": name, "status": "audit_failed",
                        "reason": "audit failed: " + "; ".join(why)})
            continue
        log.append({"solver": name, "status": cand.status, "reason": "answered"})
        cand.solver_log = log
        if len(log) > 1:
            note = "fallbacks: " + "; ".join(f"{e['solver']} {e['status']}" for e in log[:-1])
            cand.message = f"{cand.message} {note}" if cand.message else note
        return cand
    tried = "; ".join(f"{e['solver']}: {e['status']} ({e['reason']})" for e in log)
    raise SolverError(f"no method produced an answer that passes the audit "
                      f"(solver={solver!r}). Tried: {tried}. If theta1 and theta2 differ by "
                      "many orders of magnitude from each other or from the losses, double "
                      "precision may not resolve this instance: rescale the prices or use "
                      "math.inf for a perturbation that is effectively forbidden")


class Skip(Exception):
    """An attempt that produced no candidate (a solver that is not installed, or reported
    an inaccurate or failed status). ``fatal``: an error to raise at once instead."""

    def __init__(self, reason: str, status: str = "skipped", fatal: Exception | None = None):
        super().__init__(reason)
        self.status = status
        self.fatal = fatal
