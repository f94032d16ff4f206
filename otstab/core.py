"""``certify``: the OT stability criterion R(beta, r) of a model on evaluation data.

Pipeline (data flows one way): the user's model and data are validated and reduced to arrays
(:mod:`otstab.reduction`), a backend from ``otstab_solvers`` returns ``(h, alpha, value,
status)``, and :func:`build_result` turns that into the most sensitive distribution Q* and
audits it (primal cost, risk, mass, gap).
"""

from __future__ import annotations

import math
import time

import numpy as np
from otstab_solvers import conic as _conic
from otstab_solvers.dual import PiecewiseOracle, dual_objective, oracle_for, refine, solve_dual
from otstab_solvers.result import INACCURATE, OPTIMAL, DualSolution
from otstab_solvers.weights import chi2_alpha, chi2_weights, kl_weights, phi

from ._validation import check_positive_extended, check_scalar
from .errors import SolverError, SolverNotAvailableError, ValidationError
from .losses import MulticlassHinge, PiecewiseLinear, ZeroOne, get_loss
from .models import Problem, resolve_model
from .reduction import Reduced, feature_mask, reduce_problem
from .results import StabilityResult

__all__ = ["certify", "certify_distances", "stability_curve", "check_common", "SOLVERS",
           "AUDIT_TOL"]

#: names accepted by ``solver=``
SOLVERS = ("auto", "dual", "conic", "first_order") + tuple(_conic.BACKENDS)
#: relative audit tolerance under which an answer is accepted (gap and risk shortfall)
AUDIT_TOL = 1e-6
DIVERGENCES = ("kl", "chi2")


def check_common(r, theta1, theta2, divergence, solver=None):
    """Validate the scalar arguments shared by every entry point."""
    r = check_scalar(r, "r", low=0.0)
    theta1 = check_positive_extended(theta1, "theta1")
    theta2 = check_positive_extended(theta2, "theta2")
    if not isinstance(divergence, str) or divergence.lower() not in DIVERGENCES:
        raise ValidationError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
    if solver is not None and (not isinstance(solver, str) or solver.lower() not in SOLVERS):
        raise ValidationError(f"solver must be one of {list(SOLVERS)}, got {solver!r}")
    return r, theta1, theta2, divergence.lower()


def certify(model, X, y, *, loss, r, theta1=1.0, theta2=0.25, divergence="kl", solver="auto",
            features=None, **solver_options) -> StabilityResult:
    """Compute the OT stability criterion R(beta, r) and the most sensitive distribution.

    Parameters
    ----------
    model : otstab.LinearModel, fitted scikit-learn linear model or Pipeline, or a model
        supported by :mod:`otstab.nonlinear`
    X : array-like or DataFrame, shape (n, d)
        Evaluation features (never modified).
    y : array-like, shape (n,)
        Labels in the model's own label set (``classes_``) or regression targets.
    loss : str or otstab.losses.Loss
        ``"hinge"``, ``"multiclass_hinge"``, ``"absolute"``, ``"zero_one"``, ``"logistic"``,
        ``"cross_entropy"``, ``"squared"``, ``otstab.losses.pinball(tau)``,
        ``otstab.losses.epsilon_insensitive(eps)`` or a ``PiecewiseLinear``.
    r : float >= 0
        Risk threshold (for 0/1 loss an error rate in [0, 1]).
    theta1 : float in (0, inf]
        Price of moving samples (data corruption); ``math.inf``: only reweighting.
    theta2 : float in (0, inf]
        Price of reweighting (sub-population shift); ``math.inf``: only moving samples.
    divergence : {"kl", "chi2"}
    solver : str
        ``"auto"`` (specialised dual when it applies, else the conic backends in the order
        Clarabel, MOSEK, ECOS, SCS; an inaccurate or failed status or a failed audit moves on to
        the next), ``"dual"``, ``"conic"`` (conic backends only, in that order), a named conic
        backend (``"clarabel"``, ``"mosek"``, ``"ecos"``, ``"scs"``), or ``"first_order"``.
    features : sequence of column names or indices, optional
        Only these features may move (the feature mask); default all.
    **solver_options
        Passed to the backend (e.g. ``max_iter`` for Clarabel).

    Returns
    -------
    StabilityResult
    """
    t_start = time.perf_counter()
    r, theta1, theta2, divergence = check_common(r, theta1, theta2, divergence, solver)
    solver = solver.lower()
    loss_obj = get_loss(loss)
    prob = resolve_model(model, X, y, loss=loss_obj)
    if isinstance(loss_obj, ZeroOne) and r > 1.0:
        raise ValidationError(
            f"r is an error rate for loss='zero_one' and must be in [0, 1], got {r}")
    mask = feature_mask(prob.d, features, prob.feature_names)

    if isinstance(loss_obj, ZeroOne) and prob.scorer is not None and solver != "first_order":
        from .zero_one import certify_zero_one_problem

        return certify_zero_one_problem(prob, r, theta1, theta2, divergence, mask, solver,
                                        t_start, **solver_options)
    if prob.scorer is None or not isinstance(loss_obj, (PiecewiseLinear, MulticlassHinge)) \
            or solver == "first_order":
        from . import nonlinear

        return nonlinear.certify_problem(prob, r=r, theta1=theta1, theta2=theta2,
                                         divergence=divergence, mask=mask, solver=solver,
                                         **solver_options)
    red = reduce_problem(prob, theta1, mask)
    return solve_reduced(prob, red, r, theta1, theta2, divergence, solver, t_start,
                         **solver_options)


# ----------------------------------------------------------------------------------------------
# solving the reduced form


def _edge_case(red: Reduced, r: float, theta2: float, divergence: str):
    """Decide trivial and unreachable thresholds before any solver runs.

    Returns None (a solver is needed) or a tuple (kind, message) with kind in
    {"zero", "unreachable", "limit"}.
    """
    losses = red.loss_values()
    base = float(np.mean(losses))
    if r <= base:
        return "zero", f"r = {r:g} <= base risk {base:.6g}: no perturbation is needed"
    can_move = bool(np.any(red.c2 > 0))
    if can_move:
        return None
    if math.isinf(theta2):
        return "unreachable", (
            f"no perturbation of the allowed kind can raise the risk above its base value "
            f"{base:.6g} (samples cannot move: theta1 = inf, a zero model or masked features; "
            "and theta2 = inf forbids reweighting)"
        )
    lmax = float(losses.max())
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


def _conic_order(solver: str) -> list[str]:
    if solver in ("auto", "conic"):
        return list(_conic.CONIC_ORDER)
    return [solver]


def solve_reduced(prob: Problem, red: Reduced, r, theta1, theta2, divergence, solver, t_start,
                  *, program=None, **solver_options) -> StabilityResult:
    """Run the solver chain on a reduced form and build the audited result."""
    edge = _edge_case(red, r, theta2, divergence)
    if edge is not None:
        return _edge_result(prob, red, r, theta1, theta2, divergence, edge, t_start)

    log: list[dict] = []
    candidates: list[str] = []
    if solver in ("auto", "dual"):
        candidates.append("dual")
    if solver != "dual":
        candidates += _conic_order(solver)
    last_error = None
    solver_options = dict(solver_options)
    do_refine = solver_options.pop("refine", True)
    oracle = oracle_for(red.c1, red.c2)
    for name in candidates:
        if name == "dual":
            sol = solve_dual(oracle, r, theta2, divergence,
                             **{k: v for k, v in solver_options.items()
                                if k in ("tol", "max_iter")})
        else:
            backend = _conic.get_backend(name)
            ok, why = backend.availability()
            if not ok:
                log.append({"solver": name, "status": "skipped", "reason": why})
                if solver == name:
                    raise SolverNotAvailableError(why)
                continue
            if program is None:  # a caller sweeping r passes one program (DPP: compiled once)
                program = _conic.ConicProgram(red.c1, red.c2, theta2, divergence)
            sol = program.solve(backend, r, **solver_options)
            if sol.status == OPTIMAL and do_refine:
                h_raw = sol.h
                h_ref, _, _, steps = refine(oracle, sol.h, r, theta2, divergence)
                sol.h = h_ref
                sol.info.update({"h_raw": h_raw, "refine_steps": steps})
        if sol.status not in (OPTIMAL,):
            log.append({"solver": name, "status": sol.status,
                        "reason": f"solver reported {sol.native_status!r}; trying the next"})
            last_error = f"{name}: {sol.status} ({sol.native_status})"
            continue
        res = build_result(prob, red, sol, r, theta1, theta2, divergence, t_start,
                           oracle=oracle)
        audit_ok = (res.gap <= 1e-5 and res.risk_star >= r - 1e-5 * max(1.0, r)
                    and abs(res.total_mass - 1.0) <= 1e-6)
        if not audit_ok:
            log.append({"solver": name, "status": INACCURATE,
                        "reason": f"audit failed (gap {res.gap:.2e}, risk {res.risk_star:.8g} "
                                  f"vs r {r:.8g}); trying the next"})
            last_error = f"{name}: audit failed (gap {res.gap:.2e})"
            if solver not in ("auto", "conic"):
                break
            continue
        log.append({"solver": name, "status": sol.status, "reason": "answered"})
        res.solver_log = log
        if len(log) > 1:
            res.message = (res.message + " " if res.message else "") + "fallbacks: " + "; ".join(
                f"{e['solver']} {e['status']}" for e in log[:-1])
        return res
    raise SolverError(
        f"no solver produced a trustworthy answer (solver={solver!r}): {last_error}. "
        f"Tried: {[e['solver'] + ' ' + e['status'] for e in log]}"
    )


def _weights_at(lh: np.ndarray, theta2: float, divergence: str):
    if divergence == "kl" or math.isinf(theta2):
        return kl_weights(lh, theta2), (None if divergence == "kl" else 0.0)
    alpha = chi2_alpha(lh, theta2)
    return chi2_weights(lh, theta2, alpha), alpha


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
    w, alpha = _weights_at(lh, theta2, divergence)
    # risk with every tied sample on its low piece, and the gain of moving each to its high one
    need = n * r - float(w @ d_lo)
    gain = w * (d_hi - d_lo)
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
    value = float(dual_objective(lh, h, r, theta2, divergence))
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
        res = _audit_sampled(prob, red, moved_block, src, piece, h, mass, w[src], theta1,
                             theta2, divergence, value)
    else:
        res = _audit_blocks(prob, moved_block, src, mass, w[src], theta1, theta2, divergence,
                            value)
    audit = res.pop("audit")
    return StabilityResult(
        value=value, h=h, alpha=alpha,
        X_star=lambda: red.move(X, src, piece, h), weights=w[src], source=src, mass=mass,
        solver=sol.solver, status=sol.status, solve_time=sol.solve_time,
        r=r, theta1=theta1, theta2=theta2, divergence=divergence, loss=prob.loss.name,
        dual_gap_bound=sol.gap_bound, iterations=sol.iterations,
        compile_time=sol.compile_time, split=bool(split_rows.size),
        X=prob.X, feature_names=prob.feature_names, index=prob.index,
        info={"solver_value": sol.value, "native_status": sol.native_status,
              "solver_alpha": sol.alpha, "wall_time": time.perf_counter() - t_start,
              "audit": audit, **sol.info},
        **res,
    )


AUDIT_BLOCK = 1 << 15
#: above this many samples the audit evaluates the loss on the moved scores computed from the
#: reduced form and checks them against the model on a random sample of atoms (AUDIT_SAMPLE)
AUDIT_DIRECT_MAX = 200_000
AUDIT_SAMPLE = 20_000


def _audit_sampled(prob, red, moved_block, src, piece, h, mass, w, theta1, theta2, divergence,
                   value) -> dict:
    """Audit for large n: the loss is evaluated at the moved scores ``s + (x* - x) W^T`` and the
    distances from the displacement, both from the reduced form in O(n); a random sample of
    atoms is then materialised and re-scored by the model (and re-measured) to confirm them."""
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
    direct_d2 = np.zeros(pick.size) if delta is None else np.einsum("ij,ij->i", delta, delta)
    err = max(float(np.max(np.abs(direct_loss - loss_star[pick]) / (1 + np.abs(direct_loss)))),
              float(np.max(np.abs(direct_d2 - moved2[pick]) / (1 + direct_d2))))
    out = _audit_sums(prob, loss_star, moved2, mass, w, theta1, theta2, divergence, value)
    out["audit"] = {"method": "sampled", "sample": int(pick.size), "max_rel_error": err}
    if err > 1e-8:
        out["gap"] = math.inf  # the reduced form and the model disagree: never pass this off
    return out


def _audit_blocks(prob, moved_block, src, mass, w, theta1, theta2, divergence, value) -> dict:
    """The audit of :func:`_audit`, computed over blocks of atoms (bounded memory)."""
    m = src.size
    loss_star = np.empty(m)
    moved2 = np.empty(m)
    n = prob.n
    bounds = list(range(0, n, AUDIT_BLOCK)) + [n] + ([m] if m > n else [])
    for s, e in zip(bounds[:-1], bounds[1:]):
        Xg, Xs, delta = moved_block(s, e)
        loss_star[s:e] = prob.losses(Xs, prob.y[src[s:e]])
        moved2[s:e] = 0.0 if delta is None else np.einsum("ij,ij->i", delta, delta)
    out = _audit_sums(prob, loss_star, moved2, mass, w, theta1, theta2, divergence, value)
    out["audit"] = {"method": "direct", "sample": int(m), "max_rel_error": 0.0}
    return out


def _audit_sums(prob, loss_star, moved2, mass, w, theta1, theta2, divergence, value) -> dict:
    n = prob.n
    loss_base = prob.losses(prob.X)
    move_cost = 0.0 if math.isinf(theta1) else theta1 * float(np.sum(mass * w * moved2)) / n
    rew_cost = 0.0 if math.isinf(theta2) else theta2 * float(
        np.sum(mass * phi(w, divergence))) / n
    primal = move_cost + rew_cost
    risk_star = float(np.sum(mass * w * loss_star)) / n
    total_mass = float(np.sum(mass * w)) / n
    base = float(np.mean(loss_base))
    moved_risk = float(np.sum(mass * loss_star)) / n
    gap = abs(primal - value) / max(1.0, abs(value)) if math.isfinite(value) else math.nan
    return {
        "risk_base": base, "risk_star": risk_star, "total_mass": total_mass,
        "primal_cost": primal, "gap": gap,
        "decomposition": {"base": base, "corruption": moved_risk - base,
                          "reweighting": risk_star - moved_risk,
                          "cost_moving": move_cost, "cost_reweighting": rew_cost},
        "loss_star": loss_star, "loss_base": loss_base,
    }


def _audit(prob, X_star, src, mass, w, theta1, theta2, divergence, r, value) -> dict:
    """Recompute the cost, risk and mass of Q* from the model and the cost function."""
    loss_star = prob.losses(X_star, prob.y[src])
    diff = X_star - prob.X[src]
    moved2 = np.einsum("ij,ij->i", diff, diff)
    return _audit_sums(prob, loss_star, moved2, mass, w, theta1, theta2, divergence, value)


def _edge_result(prob, red, r, theta1, theta2, divergence, edge, t_start) -> StabilityResult:
    kind, message = edge
    n = red.n
    src = np.arange(n)
    mass = np.ones(n)
    X_star = prob.X.copy()
    if kind == "zero":
        w = np.ones(n)
        value, h, alpha, status = 0.0, 0.0, (0.0 if divergence == "chi2" else None), OPTIMAL
    elif kind == "limit":
        losses = red.loss_values()
        A = losses >= losses.max() * (1 - 1e-12)
        w = np.where(A, n / A.sum(), 0.0)
        frac = A.sum() / n
        value = theta2 * (math.log(1 / frac) if divergence == "kl" else (1 / frac - 1))
        h, alpha, status = math.inf, None, OPTIMAL
    else:
        w = np.ones(n)
        value, h, alpha, status = math.inf, math.nan, None, "unreachable"
    res = _audit(prob, X_star, src, mass, w, theta1, theta2, divergence, r, value)
    if kind == "unreachable":
        res["primal_cost"], res["gap"] = math.nan, math.nan
    return StabilityResult(
        value=value, h=h, alpha=alpha, X_star=X_star, weights=w, source=src, mass=mass,
        solver="none", status=status, solve_time=0.0, r=r, theta1=theta1, theta2=theta2,
        divergence=divergence, loss=prob.loss.name, message=message,
        X=prob.X, feature_names=prob.feature_names, index=prob.index,
        info={"wall_time": time.perf_counter() - t_start, "edge_case": kind},
        solver_log=[{"solver": "none", "status": status, "reason": message}],
        dual_gap_bound=0.0 if kind != "unreachable" else math.nan,
        **res,
    )


def certify_distances(*args, **kwargs):
    """Exact 0/1-loss certificate from precomputed distances d*_i (see otstab.zero_one)."""
    from .zero_one import certify_distances as _cd

    return _cd(*args, **kwargs)


def stability_curve(*args, **kwargs):
    """R(beta, r) over a grid of thresholds (see otstab.sweeps)."""
    from .sweeps import stability_curve as _sc

    return _sc(*args, **kwargs)
