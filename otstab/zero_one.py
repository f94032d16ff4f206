"""0/1 loss: exact certificates from the distance d*_i to the nearest misclassified point.

For a linear binary classifier with margin m_i = y_i (w . x_i + b), d*_i = (m_i)_+^2 / ||w||^2;
for a linear multiclass classifier d*_i = min_{k != y_i} ((s_y - s_k)_+)^2 / ||w_y - w_k||^2
(norms restricted to the features allowed to move). ``l_h = (h - theta1 d*_i)_+`` and the dual
is solved exactly in O(n log n) (:mod:`otstab_solvers.zero_one`).

Q* moves each sample either to its nearest misclassified point or not at all, and reweights;
when the optimum sits at a breakpoint (a tie between staying and moving) one sample's mass is
split so that the error rate under Q* is exactly r. The nearest misclassified point is pushed a
relative 1e-9 beyond the decision boundary so that it is misclassified by the model's own rule
(ties at a score of 0 go to the negative class), which changes the cost by a relative 2e-9.
"""

from __future__ import annotations

import math
import time

import numpy as np
from otstab_solvers.result import OPTIMAL
from otstab_solvers.weights import chi2_alpha, chi2_weights, kl_weights
from otstab_solvers.zero_one import solve_zero_one

from ._validation import as_float_matrix, as_float_vector
from .errors import SolverError, ValidationError
from .losses import zero_one
from .models import Problem
from .results import StabilityResult

__all__ = ["linear_distances", "certify_distances", "certify_zero_one_problem"]

PUSH = 1e-9


def linear_distances(prob: Problem, mask: np.ndarray | None = None):
    """d*_i and the nearest misclassified points for a linear classifier.

    Returns ``(dstar, X_near)``; ``dstar`` is ``inf`` where no move along the allowed features
    can change the prediction.
    """
    sc = prob.scorer
    X = prob.X
    W = sc.W if mask is None else sc.W * mask[None, :]
    loss0 = zero_one.values(sc.scores(X), prob.y)
    if sc.task == "binary":
        w = W[0]
        nw = float(w @ w)
        m = prob.y * sc.scores(X)
        if nw == 0.0:
            d = np.where(loss0 > 0, 0.0, np.inf)
            return d, X.copy()
        mp = np.maximum(m, 0.0)
        d = np.where(loss0 > 0, 0.0, mp * mp / nw)
        step = np.where(loss0 > 0, 0.0, (mp + PUSH * np.maximum(1.0, mp)) / nw)
        X_near = X - (step * prob.y)[:, None] * w[None, :]
        return d, X_near
    S = sc.scores(X)
    y = prob.y.astype(np.intp)
    sy = np.take_along_axis(S, y[:, None], axis=1)
    gaps = np.maximum(sy - S, 0.0)  # (n, K): s_y - s_k
    n, K = S.shape
    G = np.einsum("kd,kd->k", W, W)
    d = np.full(n, np.inf)
    kbest = np.zeros(n, dtype=np.intp)
    WWt = W @ W.T
    for k in range(K):
        nk = G[y] + G[k] - 2.0 * WWt[y, k]  # ||w_y - w_k||^2
        with np.errstate(divide="ignore", invalid="ignore"):
            dk = np.where(nk > 0, gaps[:, k] ** 2 / np.where(nk > 0, nk, 1.0), np.inf)
        dk = np.where(y == k, np.inf, dk)
        better = dk < d
        d = np.where(better, dk, d)
        kbest = np.where(better, k, kbest)
    d = np.where(loss0 > 0, 0.0, d)
    Delta = W[y] - W[kbest]
    nk = np.einsum("nd,nd->n", Delta, Delta)
    g = gaps[np.arange(n), kbest]
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where((loss0 > 0) | ~np.isfinite(d) | (nk == 0), 0.0,
                        (g + PUSH * np.maximum(1.0, g)) / np.where(nk > 0, nk, 1.0))
    X_near = X - step[:, None] * Delta
    return d, X_near


def _move_fractions(a, h, w, loss0, r, n, tol=1e-10):
    """Which samples move (1), stay (0) or are split (fraction), so that the risk is r."""
    frac = np.where(a < h - tol * max(1.0, h), 1.0, 0.0)
    frac = np.where(np.isfinite(a), frac, 0.0)
    tied = np.nonzero(np.isfinite(a) & (np.abs(a - h) <= tol * max(1.0, h)))[0]
    gain_all = w * (1.0 - loss0)
    risk = float(np.sum(w * np.maximum(loss0, frac)))
    need = n * r - risk
    if need > 0 and tied.size:
        cg = np.cumsum(gain_all[tied])
        full = cg <= need * (1 + 1e-15)
        frac[tied[full]] = 1.0
        k = int(np.count_nonzero(full))
        if k < tied.size and gain_all[tied[k]] > 0:
            before = cg[k - 1] if k > 0 else 0.0
            frac[tied[k]] = min(max((need - before) / gain_all[tied[k]], 0.0), 1.0)
    return frac


def _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, X, X_near, y, losses_fn,
                     names, index, t_start, dstar):
    n = a.size
    base = float(np.mean(loss0))
    method = "dual" if solver == "dual" else "closed_form"
    log = []
    if r <= base:
        h, value, alpha, status, message = 0.0, 0.0, (0.0 if divergence == "chi2" else None), \
            OPTIMAL, f"r = {r:g} <= base error rate {base:.6g}: no perturbation is needed"
        solver_name, sol = "none", None
    else:
        can_move = np.isfinite(a) & (loss0 == 0)
        reach_all = bool(np.all(np.isfinite(a)))
        unreachable = None
        if math.isinf(theta2) and r > (float(np.sum(loss0)) + float(np.sum(can_move))) / n:
            unreachable = (f"r = {r:g} exceeds the largest error rate reachable by moving "
                           "samples alone (theta2 = inf and some samples cannot be moved)")
        elif not can_move.any() and loss0.max() == 0:
            unreachable = ("no sample is misclassified and none can be moved "
                           "(theta1 = inf, a zero model or masked features)")
        elif r >= 1.0 and not reach_all:
            unreachable = None if loss0.max() > 0 and math.isfinite(theta2) else \
                "r = 1 needs every sample misclassified, which moving cannot achieve here"
            if unreachable is None:
                return _limit_result(a, loss0, r, theta1, theta2, divergence, X, y, losses_fn,
                                     names, index, t_start, dstar)
        if unreachable:
            return _finish(value=math.inf, h=math.nan, alpha=None, status="unreachable",
                           message=unreachable, frac=np.zeros(n), w=np.ones(n), a=a, loss0=loss0,
                           r=r, theta1=theta1, theta2=theta2, divergence=divergence, X=X,
                           X_near=X_near, y=y, losses_fn=losses_fn, names=names, index=index,
                           solver_name="none", t_start=t_start, dstar=dstar, sol=None,
                           log=[{"solver": "none", "status": "unreachable", "reason": unreachable}])
        sol = solve_zero_one(a, r, theta2, divergence, method=method)
        if sol.status != OPTIMAL:
            raise SolverError(f"0/1 dual failed: {sol.native_status}")
        h, value, status, message = sol.h, sol.value, OPTIMAL, ""
        solver_name = sol.solver
        alpha = None
        log.append({"solver": solver_name, "status": sol.status, "reason": "answered"})
    lh = np.maximum(h - a, 0.0)
    if divergence == "kl" or math.isinf(theta2):
        w = kl_weights(lh, theta2)
        alpha = None if divergence == "kl" else 0.0
    else:
        alpha = chi2_alpha(lh, theta2)
        w = chi2_weights(lh, theta2, alpha)
    frac = _move_fractions(a, h, w, loss0, r, n) if h > 0 or r > base else np.zeros(n)
    if r <= base:
        frac = np.zeros(n)
    return _finish(value=float(value), h=h, alpha=alpha, status=status, message=message,
                   frac=frac, w=w, a=a, loss0=loss0, r=r, theta1=theta1, theta2=theta2,
                   divergence=divergence, X=X, X_near=X_near, y=y, losses_fn=losses_fn,
                   names=names, index=index, solver_name=solver_name, t_start=t_start,
                   dstar=dstar, sol=sol, log=log)


def _limit_result(a, loss0, r, theta1, theta2, divergence, X, y, losses_fn, names, index,
                  t_start, dstar):
    n = a.size
    A = loss0 > 0
    w = np.where(A, n / A.sum(), 0.0)
    frac_A = A.sum() / n
    value = theta2 * (math.log(1 / frac_A) if divergence == "kl" else (1 / frac_A - 1))
    msg = ("r = 1 is attained only in the limit h -> inf, with all mass on the misclassified "
           "samples")
    return _finish(value=value, h=math.inf, alpha=None, status=OPTIMAL, message=msg,
                   frac=np.zeros(n), w=w, a=a, loss0=loss0, r=r, theta1=theta1, theta2=theta2,
                   divergence=divergence, X=X, X_near=None, y=y, losses_fn=losses_fn,
                   names=names, index=index, solver_name="none", t_start=t_start, dstar=dstar,
                   sol=None, log=[{"solver": "none", "status": OPTIMAL, "reason": msg}])


def _finish(*, value, h, alpha, status, message, frac, w, a, loss0, r, theta1, theta2,
            divergence, X, X_near, y, losses_fn, names, index, solver_name, t_start, dstar,
            sol, log):
    from otstab_solvers.weights import phi

    n = a.size
    rows = np.arange(n)
    split = np.nonzero((frac > 0) & (frac < 1))[0]
    src = np.concatenate([rows, split])
    moved_main = frac >= 1.0
    moved = np.concatenate([moved_main, np.ones(split.size, dtype=bool)])
    mass = np.concatenate([np.where((frac > 0) & (frac < 1), 1.0 - frac, 1.0), frac[split]])
    d_atom = np.where(moved, dstar[src], 0.0)
    if X is not None:
        X_star = np.where(moved[:, None], X_near[src], X[src]) if X_near is not None else X[src]
        loss_star = losses_fn(X_star, y[src])
        moved2 = np.sum((X_star - X[src]) ** 2, axis=1)
    else:
        X_star = np.empty((src.size, 0))
        loss_star = np.where(moved, 1.0, loss0[src])
        moved2 = np.where(np.isfinite(d_atom), d_atom, 0.0)
    wa = w[src]
    move_cost = 0.0 if math.isinf(theta1) else theta1 * float(np.sum(mass * wa * moved2)) / n
    rew_cost = 0.0 if math.isinf(theta2) else theta2 * float(np.sum(mass * phi(wa, divergence))) / n
    primal = move_cost + rew_cost
    risk_star = float(np.sum(mass * wa * loss_star)) / n
    moved_risk = float(np.sum(mass * loss_star)) / n
    base = float(np.mean(loss0))
    gap = abs(primal - value) / max(1.0, abs(value)) if math.isfinite(value) else math.nan
    if status == "unreachable":
        primal, gap = math.nan, math.nan
    return StabilityResult(
        value=value, h=h, alpha=alpha, X_star=X_star, weights=wa, source=src, mass=mass,
        risk_base=base, risk_star=risk_star, total_mass=float(np.sum(mass * wa)) / n,
        primal_cost=primal, gap=gap,
        decomposition={"base": base, "corruption": moved_risk - base,
                       "reweighting": risk_star - moved_risk, "cost_moving": move_cost,
                       "cost_reweighting": rew_cost},
        solver=solver_name, status=status,
        solve_time=(sol.solve_time if sol is not None else 0.0), r=r, theta1=theta1,
        theta2=theta2, divergence=divergence, loss="zero_one", message=message,
        solver_log=log, dual_gap_bound=(sol.gap_bound if sol is not None else 0.0),
        iterations=(sol.iterations if sol is not None else 0), split=bool(split.size),
        loss_star=loss_star, loss_base=loss0,
        X=X if X is not None else np.empty((n, 0)), feature_names=names, index=index,
        info={"dstar": dstar, "wall_time": time.perf_counter() - t_start},
    )


def certify_zero_one_problem(prob: Problem, r, theta1, theta2, divergence, mask, solver,
                             t_start, **solver_options) -> StabilityResult:
    """0/1 certificate of a linear classifier (called by :func:`otstab.certify`)."""
    if solver not in ("auto", "dual", "closed_form"):
        raise ValidationError(
            f"solver={solver!r} does not apply to loss='zero_one' (use 'auto', 'closed_form' "
            "or 'dual'): the 0/1 loss has no conic program, its dual is solved exactly"
        )
    dstar, X_near = linear_distances(prob, mask)
    loss0 = prob.losses(prob.X)
    a = dstar * theta1 if math.isfinite(theta1) else np.where(dstar > 0, np.inf, 0.0)
    a = np.where(loss0 > 0, 0.0, a)
    return _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, prob.X, X_near,
                            prob.y, prob.losses, prob.feature_names, prob.index, t_start,
                            np.where(loss0 > 0, 0.0, dstar))


def certify_distances(dstar, r, *, theta1=1.0, theta2=0.25, divergence="kl", solver="auto",
                      misclassified=None, X=None, X_nearest=None) -> StabilityResult:
    """Exact 0/1-loss certificate for any classifier, from precomputed distances.

    Parameters
    ----------
    dstar : array-like (n,)
        Squared distance from each evaluation sample to the nearest misclassified point
        (0 for misclassified samples; ``inf`` if it cannot be misclassified). For nonlinear
        models these are usually upper bounds (see ``otstab.perturbation``), which makes the
        certified value an upper bound on R as well.
    r : float in [0, 1]
        Error-rate threshold.
    misclassified : array-like of bool (n,), optional
        Which samples are misclassified now; default ``dstar == 0``.
    X, X_nearest : arrays (n, d), optional
        The samples and their nearest misclassified points, to build Q* as points.
    """
    from .core import check_common

    t_start = time.perf_counter()
    r, theta1, theta2, divergence = check_common(r, theta1, theta2, divergence)
    if r > 1.0:
        raise ValidationError(f"r is an error rate and must be in [0, 1], got {r}")
    d = as_float_vector(dstar, "dstar", finite=False)
    if np.any(np.isnan(d)) or np.any(d < 0):
        raise ValidationError("dstar must be >= 0 (inf allowed), without NaN")
    n = d.size
    if misclassified is None:
        loss0 = (d == 0).astype(float)
    else:
        mc = np.asarray(misclassified)
        if mc.shape != (n,):
            raise ValidationError(f"misclassified must have shape ({n},), got {mc.shape}")
        loss0 = mc.astype(bool).astype(float)
    if (X is None) != (X_nearest is None):
        raise ValidationError("pass both X and X_nearest, or neither")
    Xa = Xn = None
    if X is not None:
        Xa = as_float_matrix(X, "X")
        Xn = as_float_matrix(X_nearest, "X_nearest")
        if Xa.shape != Xn.shape or Xa.shape[0] != n:
            raise ValidationError(
                f"X and X_nearest must both have shape ({n}, d); got {Xa.shape} and {Xn.shape}")
    if solver not in ("auto", "dual", "closed_form"):
        raise ValidationError(f"solver must be 'auto', 'closed_form' or 'dual', got {solver!r}")
    a = d * theta1 if math.isfinite(theta1) else np.where(d > 0, np.inf, 0.0)
    a = np.where(loss0 > 0, 0.0, a)

    def losses_fn(Xs, ys):  # without a model, moved atoms are misclassified by construction
        return None

    names = [f"x{j}" for j in range(Xa.shape[1])] if Xa is not None else []
    res = _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, None, None,
                           np.zeros(n), losses_fn, names, None, t_start,
                           np.where(loss0 > 0, 0.0, d))
    if Xa is not None:
        moved = res.loss_star > res.loss_base[res.source]
        res.X = Xa
        res.X_star = np.where(moved[:, None], Xn[res.source], Xa[res.source])
        res.feature_names = names
    return res
