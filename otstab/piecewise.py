"""Solving path: linear models with piecewise-linear losses (hinge, absolute, pinball, ...).

The model and loss are reduced to ``l_h(z_i) = max_k c1[i,k] h + c2[i,k] h^2``
(:mod:`otstab.reduction`); the specialised 1-D/2-D dual of :mod:`otstab_solvers.dual` or a
conic backend returns ``(h, alpha, value, status)``; :func:`build_result` builds Q* at ``h``
(with exact tie splitting) and the certificate layer (:mod:`otstab.audit`) audits it. The
solver chain tries the next method when a backend reports an inaccurate or failed status or its
answer fails the audit.
"""

from __future__ import annotations

import math
import time

import numpy as np
from otstab_solvers import conic as _conic
from otstab_solvers.dual import PiecewiseOracle, dual_objective, oracle_for, refine, solve_dual
from otstab_solvers.result import OPTIMAL, DualSolution
from otstab_solvers.weights import pmean, weights_at

from . import audit
from .errors import SolverNotAvailableError
from .models import Problem
from .params import check_options
from .reduction import Reduced
from .results import StabilityResult

__all__ = ["solve_reduced", "build_result", "DUAL_OPTIONS", "AUDIT_DIRECT_MAX", "AUDIT_SAMPLE"]

#: ``**solver_options`` of the specialised dual
DUAL_OPTIONS = ("tol", "max_iter", "refine")
AUDIT_BLOCK = 1 << 15
#: above this many samples the audit evaluates the loss on the moved scores computed from the
#: reduced form and checks them against the model on a random sample of atoms (AUDIT_SAMPLE)
AUDIT_DIRECT_MAX = 200_000
AUDIT_SAMPLE = 20_000
#: largest relative disagreement between the reduced form and the model on the sampled atoms
SAMPLED_RTOL = 1e-8


def edge_kind(losses: np.ndarray, r: float, theta2: float, can_move: bool, p=None):
    """Decide trivial and unreachable thresholds before any solver runs, on every path.

    ``losses``: the per-sample losses of the data; ``can_move``: some sample can move at a
    finite price; ``p``: the sample probabilities (None: uniform). Returns None (a solver is
    needed) or ``(kind, message)`` with kind ``"zero"`` (r reached by the data,
    :func:`otstab.audit.reached`), ``"unreachable"`` or ``"limit"`` (r equals the largest loss
    and nothing moves: attained only as h -> inf, :func:`limit_weights`).
    """
    base = pmean(losses, p)
    if audit.reached(r, base):
        return "zero", f"r = {r:g} <= base risk {base:.6g}: no perturbation is needed"
    if can_move:
        return None
    if math.isinf(theta2):
        return "unreachable", (
            f"no perturbation of the allowed kind can raise the risk above its base value "
            f"{base:.6g} (samples cannot move: theta1 = inf, a zero model or masked features; "
            "and theta2 = inf forbids reweighting)"
        )
    lmax = float(losses.max() if p is None else losses[p > 0].max())
    if r > lmax * (1 + 1e-12):
        return "unreachable", (
            f"r = {r:g} exceeds the largest loss {lmax:.6g}; with samples unable to move "
            "(theta1 = inf, a zero model or masked features) reweighting alone cannot reach it"
        )
    if r >= lmax * (1 - 1e-12):
        return "limit", (
            f"r equals the largest loss {lmax:.6g}: the value is attained only in the limit "
            "h -> inf, with all mass on the samples of largest loss"
        )
    return None


def edge_case(red: Reduced, r: float, theta2: float, losses: np.ndarray | None = None, p=None):
    """:func:`edge_kind` of a piecewise reduced form (samples can move where ``c2 > 0``)."""
    losses = red.loss_values() if losses is None else losses
    return edge_kind(losses, r, theta2, bool(np.any(red.c2 > 0)), p)


def limit_weights(losses: np.ndarray, theta2: float, divergence: str, p=None):
    """``(w, value)`` of the limit case: all mass on the samples of largest loss (the set A,
    of P0-mass ``P(A)``), at cost ``theta2 log(1/P(A))`` (KL) or ``theta2 (1/P(A) - 1)``."""
    if p is None:
        top = losses >= losses.max() * (1 - 1e-12)
        w = np.where(top, losses.size / top.sum(), 0.0)
        frac = top.sum() / losses.size
    else:  # the p-mass of the samples of largest loss (over the support of p)
        top = (losses >= losses[p > 0].max() * (1 - 1e-12)) & (p > 0)
        frac = float(np.sum(p[top]))
        w = np.where(top, 1.0 / frac, 0.0)
    value = theta2 * (math.log(1 / frac) if divergence == "kl" else (1 / frac - 1))
    return w, value


def _conic_order(solver: str) -> list[str]:
    if solver in ("auto", "conic"):
        return list(_conic.CONIC_ORDER)
    return [solver]


def solve_reduced(prob: Problem, red: Reduced, r, theta1, theta2, divergence, solver, t_start,
                  *, program=None, **solver_options) -> StabilityResult:
    """Run the solver chain on a reduced form and return the first audited answer."""
    p = prob.p
    losses = prob.losses(prob.X)
    edge = edge_case(red, r, theta2, losses, p)
    if edge is not None:
        return edge_result(prob, losses, r, theta1, theta2, divergence, edge, t_start)
    solver_options = dict(solver_options)
    if solver in ("auto", "dual"):
        check_options(solver_options, DUAL_OPTIONS,
                      f"solver={solver!r} (backend settings need a named backend, e.g. "
                      "solver='clarabel')")
    do_refine = solver_options.pop("refine", True)
    dual_opts = {k: v for k, v in solver_options.items() if k in ("tol", "max_iter")}
    # a named backend gets the caller's settings; the fallbacks of "auto" run on defaults
    conic_opts = {} if solver == "auto" else solver_options
    oracle = oracle_for(red.c1, red.c2)
    state = {"program": program}

    def run_dual():
        sol = solve_dual(oracle, r, theta2, divergence, p=p, **dual_opts)
        if sol.status != OPTIMAL:
            raise audit.Skip(f"dual reported {sol.native_status!r}", sol.status)
        return build_result(prob, red, sol, r, theta1, theta2, divergence, t_start,
                            oracle=oracle), True, 0.0

    def run_conic(name):
        def thunk():
            backend = _conic.get_backend(name)
            ok, why = backend.availability()
            if not ok:
                raise audit.Skip(why, fatal=SolverNotAvailableError(why) if solver == name
                                 else None)
            if state["program"] is None:  # a sweep over r passes one program (DPP)
                state["program"] = _conic.ConicProgram(red.c1, red.c2, theta2, divergence,
                                                       weights=p)
            sol = state["program"].solve(backend, r, **conic_opts)
            if sol.status != OPTIMAL:
                raise audit.Skip(f"{name} reported {sol.native_status!r}", sol.status)
            if do_refine:
                h_raw = sol.h
                h_ref, _, _, steps = refine(oracle, sol.h, r, theta2, divergence, p=p)
                sol.h = h_ref
                sol.info.update({"h_raw": h_raw, "refine_steps": steps})
            return build_result(prob, red, sol, r, theta1, theta2, divergence, t_start,
                                oracle=oracle), True, 0.0
        return thunk

    attempts = []
    if solver in ("auto", "dual"):
        attempts.append(("dual", run_dual))
    if solver != "dual":
        attempts += [(name, run_conic(name)) for name in _conic_order(solver)]
    return audit.first_accepted(attempts, solver=solver)


def build_result(prob: Problem, red: Reduced, sol: DualSolution, r, theta1, theta2, divergence,
                 t_start, *, tie_rtol: float | None = None, oracle=None) -> StabilityResult:
    """Most sensitive distribution (Remark 4) at ``sol.h`` with exact tie splitting, audited.

    Samples tied between pieces at h (e.g. "stay" and "move" for the hinge loss) have their
    mass split between the tied piece with the smallest and the largest derivative so that
    the risk of Q* equals r exactly (MATH.md): samples are moved to the high piece one by one
    and at most one sample is split. The audit runs over row blocks; ``X_star`` is built on
    first access.
    """
    h = float(sol.h)
    n = red.n
    if tie_rtol is None:
        tie_rtol = 1e-10 if sol.solver == "dual" else 1e-7
    oracle = PiecewiseOracle(red.c1, red.c2) if oracle is None else oracle
    lh, k_lo, d_lo, k_hi, d_hi = oracle.scan(h, tie_rtol)
    p = prob.p
    w, alpha = weights_at(lh, theta2, divergence, p)
    # risk with every tied sample on its low piece, and the gain of moving each to its high one
    if p is None:
        need = n * r - float(w @ d_lo)
        gain = w * (d_hi - d_lo)
    else:
        need = r - float((p * w) @ d_lo)
        gain = p * w * (d_hi - d_lo)
    cand = np.nonzero(gain > 0)[0]
    frac = np.zeros(n)
    if need > 0 and cand.size and h > 0:
        cg = np.cumsum(gain[cand])
        full = cg <= need
        frac[cand[full]] = 1.0
        nxt = int(np.count_nonzero(full))
        if nxt < cand.size:
            before = cg[nxt - 1] if nxt > 0 else 0.0
            frac[cand[nxt]] = (need - before) / gain[cand[nxt]]
    split_rows = np.nonzero((frac > 0) & (frac < 1))[0]
    # atoms: every sample on its main piece, plus one extra atom per split sample
    main_piece = np.where(frac >= 1.0, k_hi, k_lo)
    main_mass = np.where((frac > 0) & (frac < 1), 1.0 - frac, 1.0)
    src = np.concatenate([np.arange(n), split_rows])
    piece = np.concatenate([main_piece, k_hi[split_rows]])
    mass = np.concatenate([main_mass, frac[split_rows]])
    value = float(dual_objective(lh, h, r, theta2, divergence, p))
    if sol.solver == "dual" and math.isfinite(sol.value):
        # the specialised dual evaluated F at this very h, at a kink on the side where l_h is
        # resolved best (the scan's max over pieces keeps the rounding of the moving piece)
        value = max(value, float(sol.value))
    # F(h) = h r - T(h) with T(h) >= mean(l_h) >= 0 (the losses are nonnegative): a value above
    # h r is rounding of T (prefix sums of the sorted oracle can round below 0); at a kink where
    # every l_h is 0, h r is the exact value
    value = min(value, h * r)
    X = prob.X

    def moved_block(s, e):
        """(x_src, x*, x* - x_src) for atoms s..e; main atoms are rows s..e of X (no copy)."""
        sb = src[s:e]
        Xg = X[s:e] if e <= n else X[sb]
        delta = red.displacement(sb, piece[s:e], h)
        if delta is None:
            return Xg, Xg, None
        return Xg, Xg + delta, delta

    if n > AUDIT_DIRECT_MAX:
        res = _audit_sampled(prob, red, src, piece, h, mass, w[src], theta1, theta2,
                             divergence, value)
    else:
        res = _audit_blocks(prob, moved_block, src, mass, w[src], theta1, theta2, divergence,
                            value)
    sampled = res.pop("audit")
    moved2 = res.pop("moved2")  # per atom: kept for the influence function (otstab.inference)
    return StabilityResult(
        value=value, h=h, alpha=alpha,
        X_star=lambda: red.move(X, src, piece, h), weights=w[src], source=src, mass=mass,
        solver=sol.solver, status="candidate", solve_time=sol.solve_time,
        r=r, theta1=theta1, theta2=theta2, divergence=divergence, loss=prob.loss.name,
        dual_gap_bound=sol.gap_bound, iterations=sol.iterations,
        compile_time=sol.compile_time, split=bool(split_rows.size),
        X=prob.X, feature_names=prob.feature_names, index=prob.index,
        info={"solver_value": sol.value, "native_status": sol.native_status,
              "solver_alpha": sol.alpha, "wall_time": time.perf_counter() - t_start,
              "audit": sampled, "moved2": moved2,
              # x* - x of the atoms ``atoms`` (None: no move), for Q* built blockwise
              "displacement": lambda atoms: red.displacement(src[atoms], piece[atoms], h),
              **sol.info},
        **res,
    )


def _audit_sampled(prob, red, src, piece, h, mass, w, theta1, theta2, divergence,
                   value) -> dict:
    """Audit for large n: the loss is evaluated at the moved scores ``s + (x* - x) W^T`` and the
    distances from the displacement, both from the reduced form in O(n); a random sample of
    atoms is then materialised and re-scored by the model (and re-measured) to confirm them.
    A disagreement above SAMPLED_RTOL fails the audit."""
    shift = red.score_shift(prob.scorer.W, src, piece, h)
    base_scores = prob.scores[src]
    scores = base_scores if shift is None else base_scores + shift
    loss_star = prob.losses_from_scores(scores, prob.y[src])
    moved2 = red.sq_displacement(src, piece, h)
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(src.size, size=min(AUDIT_SAMPLE, src.size), replace=False))
    Xg = prob.X[src[pick]]
    delta = red.displacement(src[pick], piece[pick], h)
    Xs = Xg if delta is None else Xg + delta
    direct_loss = prob.losses(Xs, prob.y[src[pick]])
    diff = None if delta is None else Xs - Xg  # the move as Q* holds it
    direct_d2 = np.zeros(pick.size) if diff is None else np.einsum("ij,ij->i", diff, diff)
    err = max(float(np.max(np.abs(direct_loss - loss_star[pick]) / (1 + np.abs(direct_loss)))),
              float(np.max(np.abs(direct_d2 - moved2[pick]) / (1 + direct_d2))))
    out = audit.audit_sums(prob.losses(prob.X), loss_star, moved2, mass, w, theta1, theta2,
                           divergence, value, prob.p, src)
    out["audit"] = {"method": "sampled", "sample": int(pick.size), "max_rel_error": err}
    out["moved2"] = moved2
    if err > SAMPLED_RTOL:  # the reduced form and the model disagree: never pass this off
        out["primal_cost"] = out["gap"] = math.inf
    return out


def _audit_blocks(prob, moved_block, src, mass, w, theta1, theta2, divergence, value) -> dict:
    """The audit computed over blocks of atoms (bounded memory), the loss from the model."""
    m = src.size
    loss_star = np.empty(m)
    moved2 = np.empty(m)
    n = prob.n
    bounds = list(range(0, n, AUDIT_BLOCK)) + [n] + ([m] if m > n else [])
    for s, e in zip(bounds[:-1], bounds[1:]):
        Xg, Xs, delta = moved_block(s, e)
        loss_star[s:e] = prob.losses(Xs, prob.y[src[s:e]])
        # the move as Q* holds it (x* - x in floating point, not the exact displacement): a
        # move below the resolution of x is not a move the user can reproduce
        diff = None if delta is None else Xs - Xg
        moved2[s:e] = 0.0 if diff is None else np.einsum("ij,ij->i", diff, diff)
    out = audit.audit_sums(prob.losses(prob.X), loss_star, moved2, mass, w, theta1, theta2,
                           divergence, value, prob.p, src)
    out["audit"] = {"method": "direct", "sample": int(m), "max_rel_error": 0.0}
    out["moved2"] = moved2
    return out


def edge_result(prob, losses, r, theta1, theta2, divergence, edge, t_start,
                **fields) -> StabilityResult:
    """The answer when r is reached by the data (``zero``), cannot be reached
    (``unreachable``), or equals the largest loss with samples unable to move (``limit``:
    all mass on the samples of largest loss, audited like any answer). ``losses`` are the
    per-sample losses of the data; ``fields`` go to the result (e.g. ``loss`` name)."""
    kind, message = edge
    n = prob.n
    src = np.arange(n)
    mass = np.ones(n)
    w = np.ones(n)
    value, h, alpha = 0.0, 0.0, (0.0 if divergence == "chi2" else None)
    if kind == "limit":
        w, value = limit_weights(losses, theta2, divergence, prob.p)
        h, alpha = math.inf, None
    elif kind == "unreachable":
        value, h, alpha = math.inf, math.nan, None
    res = audit.audit_points(prob, prob.X, src, mass, w, theta1, theta2, divergence, value)
    if kind == "unreachable":
        res["primal_cost"], res["gap"] = math.nan, math.nan
    fields.setdefault("loss", prob.loss.name)
    out = StabilityResult(
        value=value, h=h, alpha=alpha, X_star=prob.X, weights=w, source=src, mass=mass,
        solver="none", status=kind, solve_time=0.0, r=r, theta1=theta1, theta2=theta2,
        divergence=divergence, message=message,
        X=prob.X, feature_names=prob.feature_names, index=prob.index,
        info={"wall_time": time.perf_counter() - t_start, "edge_case": kind},
        solver_log=[{"solver": "none", "status": kind, "reason": message}],
        dual_gap_bound=0.0 if kind != "unreachable" else math.nan,
        **fields, **res,
    )
    audit.mark_edge(out, kind)
    return out
