"""Solving paths for smooth losses: the exact path for linear models and the first-order path.

* A linear model with ``loss="logistic"`` / ``"cross_entropy"`` / ``"squared"`` and
  ``solver="auto"`` or ``"dual"``: the exact d-transform oracles of
  :mod:`otstab_solvers.smooth` and the 1-D dual solver. At a switching point of the
  d-transform (two maximisers of ``h l(x) - theta1 ||x - x_i||^2`` with the same value, a kink
  of the dual) Q* mixes the two maximisers of the switching samples so that its risk is exactly
  r, as the piecewise-linear path splits tied samples. Multinomial cross-entropy above the
  documented threshold ``h_concave`` is not exact (``status = 'bounds'``).
* A differentiable nonlinear model (MLP, PyTorch module, callable) or ``solver="first_order"``:
  :func:`otstab_solvers.first_order.solve_first_order`, a local search (the paper's
  Algorithms 1 and 2): its audited Q* gives an upper bound on R (``status = 'bounds'``).

Every answer goes through the audit of :mod:`otstab.audit`.
"""

from __future__ import annotations

import math
import time

import numpy as np
from otstab_solvers.dual import solve_dual
from otstab_solvers.first_order import solve_first_order
from otstab_solvers.result import OPTIMAL
from otstab_solvers.smooth import CrossEntropyOracle, LogisticOracle, SquaredOracle
from otstab_solvers.weights import weights_at

from . import audit, bounds
from .errors import IncompatibleLossError, ValidationError
from .nonlinear import SMOOTH_LOSSES, LinearDifferentiable, loss_name
from .params import check_options
from .piecewise import edge_kind, edge_result
from .results import StabilityResult

__all__ = ["certify_smooth", "linear_smooth_oracle", "FIRST_ORDER_OPTIONS"]

#: ``**solver_options`` accepted by the first-order path (passed to ``solve_first_order``)
FIRST_ORDER_OPTIONS = ("outer", "inner_steps", "inner_lr", "inner_tol", "max_outer", "tol",
                       "h_init", "outer_lr", "starts", "random_starts", "screen_steps",
                       "inner_method", "h_cap", "seed", "verbose", "callback")
#: relative step in h used to read the two maximisers at a switching point
SWITCH_STEP = 1e-9


def linear_smooth_oracle(W, b, task: str, X, y, *, loss: str, theta1: float, mask=None):
    """Exact d-transform oracle of a smooth loss of a linear model.

    Parameters
    ----------
    W : array of shape (K, d)
        Coefficients (``K = 1`` for binary classifiers and regressors).
    b : array of shape (K,)
        Intercepts.
    task : {"binary", "multiclass", "regression"}
    X : array of shape (n, d)
    y : array of shape (n,)
        Internal labels (-1/+1, 0..K-1) or regression targets.
    loss : {"logistic", "cross_entropy", "squared"}
    theta1 : float in (0, inf]
    mask : boolean array of shape (d,), optional

    Returns
    -------
    LogisticOracle, CrossEntropyOracle or SquaredOracle (with ``argmax`` available).
    """
    W = np.array(W, dtype=np.float64, copy=True)
    if W.ndim == 1:
        W = W[None, :]
    b = np.array(b, dtype=np.float64, copy=True).reshape(-1)
    loss = loss_name(loss)
    if task == "binary" and loss in ("logistic", "cross_entropy"):
        return LogisticOracle.from_linear(X, y, W[0], float(b[0]), theta1, mask)
    if task == "multiclass" and loss == "cross_entropy":
        mv = np.ones(W.shape[1], dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        S = np.asarray(X, dtype=np.float64) @ W.T + b
        return CrossEntropyOracle(S, np.asarray(y).astype(np.int64), W[:, mv], theta1, X=X,
                                  mask=mv)
    if task == "regression" and loss == "squared":
        return SquaredOracle.from_linear(X, y, W[0], float(b[0]), theta1, mask)
    raise IncompatibleLossError(f"loss {loss!r} does not fit a linear {task} model")


def certify_smooth(prob, *, r, theta1, theta2, divergence, mask=None, solver="auto",
                   **solver_options) -> StabilityResult:
    """``certify`` for smooth losses (linear models: exact; others: first-order)."""
    t_start = time.perf_counter()
    loss = loss_name(prob.loss)
    if loss not in SMOOTH_LOSSES:
        raise IncompatibleLossError(
            f"loss {loss!r} needs a linear model for the exact path; with solver='first_order' "
            "or a nonlinear model use 'logistic', 'cross_entropy', 'squared' or 'zero_one'")
    if solver not in ("auto", "dual", "first_order"):
        raise ValidationError(
            f"solver {solver!r} does not apply to the smooth loss {loss!r}: use 'auto', 'dual' "
            "(exact, linear models) or 'first_order'")
    if prob.scorer is not None and solver != "first_order":
        check_options(solver_options, ("tol", "max_iter"), "the exact smooth path")
        return _certify_linear_exact(prob, loss, r, theta1, theta2, divergence, mask, t_start,
                                     **solver_options)
    if solver == "dual":
        raise ValidationError("solver='dual' needs a linear model; use 'auto' or 'first_order'")
    check_options(solver_options, FIRST_ORDER_OPTIONS, "the first-order solver")
    return _certify_first_order(prob, loss, r, theta1, theta2, divergence, mask, t_start,
                                **solver_options)


def _certify_first_order(prob, loss, r, theta1, theta2, divergence, mask, t_start,
                         **solver_options):
    if prob.scorer is not None:
        sc = prob.scorer
        adapter = LinearDifferentiable(sc.W, sc.b, sc.task, sc.classes).bind_loss(loss)
    else:
        adapter = prob.nonlinear
    sol = solve_first_order(adapter.loss_and_grad, prob.X, prob.y, r=r, theta1=theta1,
                            theta2=theta2, divergence=divergence, mask=mask, weights=prob.p,
                            **solver_options)
    if sol.status == "unreachable":
        return edge_result(prob, prob.losses(prob.X), r, theta1, theta2, divergence,
                           ("unreachable", sol.message or "the search found no perturbation "
                            "that reaches r"), t_start, loss=loss, exact=False)
    message = ("first-order solution: a local search, so the cost of the returned Q* "
               "(value_upper) is an upper bound on R, not R itself")
    if sol.message:
        message = sol.message + "; " + message
    # certified lower bound: the same dual on an over-estimate of l_h (sklearn MLPs)
    value_lower = 0.0
    mlp = bounds.as_mlp(adapter)
    if mlp is not None:
        oracle = bounds.mlp_transform_upper(mlp, loss, prob.losses(prob.X), theta1, mask)
        value_lower = bounds.smooth_lower_value(oracle, r, theta2, divergence, p=prob.p)
        message += ("; value_lower from a global Lipschitz over-estimate of l_h "
                    "(otstab.bounds)")
    else:
        message += "; no certified lower bound for this model (value_lower = 0)"

    def attempt():
        src = sol.atom_source
        res = audit.audit_points(prob, sol.atom_X, src, sol.atom_share, sol.atom_weight,
                                 theta1, theta2, divergence, sol.value)
        cand = StabilityResult(
            value=float(sol.value), h=sol.h, alpha=sol.alpha, X_star=sol.atom_X,
            weights=sol.atom_weight, source=src, mass=sol.atom_share, solver="first_order",
            status=sol.status, solve_time=time.perf_counter() - t_start, r=r, theta1=theta1,
            theta2=theta2, divergence=divergence, loss=loss, message=message,
            iterations=sol.iterations, split=sol.h_split is not None, exact=False, X=prob.X,
            feature_names=prob.feature_names, index=prob.index,
            info={"trace": sol.trace, "n_grad_evals": sol.n_grad_evals, "n_calls": sol.n_calls,
                  "h_split": sol.h_split, "outer": sol.outer,
                  "solver_primal_cost": sol.primal_cost,
                  "wall_time": time.perf_counter() - t_start, **sol.info},
            **res)
        return cand, False, value_lower

    return audit.first_accepted([("first_order", attempt)], solver="first_order")


def _zero_direction(oracle) -> bool:
    a = getattr(oracle, "direction_norm2", None)
    if a is not None:
        return bool(np.all(np.asarray(a) == 0))
    return getattr(oracle, "q", 1) == 0


def _certify_linear_exact(prob, loss, r, theta1, theta2, divergence, mask, t_start,
                          **solver_options):
    sc = prob.scorer
    oracle = linear_smooth_oracle(sc.W, sc.b, sc.task, prob.X, prob.y, loss=loss,
                                  theta1=theta1, mask=mask)
    base = prob.losses(prob.X)
    p = prob.p
    cannot_move = math.isinf(theta1) or _zero_direction(oracle)
    edge = edge_kind(base, r, theta2, not cannot_move, p)
    if edge is not None:
        return edge_result(prob, base, r, theta1, theta2, divergence, edge, t_start, loss=loss)

    def attempt():
        sol = solve_dual(oracle, r, theta2, divergence, p=p, **solver_options)
        if sol.status != OPTIMAL:
            raise audit.Skip(f"dual reported {sol.native_status!r}", sol.status)
        cand = _build(prob, oracle, sol, loss, r, theta1, theta2, divergence, t_start)
        exact = bool(getattr(oracle, "exact_at", lambda _h: True)(cand.h))
        return cand, exact, 0.0

    return audit.first_accepted([("dual", attempt)], solver="dual")


def _build(prob, oracle, sol, loss, r, theta1, theta2, divergence, t_start):
    """Q* at the dual's h: every sample at its maximiser, and at a switching point the
    switching samples mixed between their two maximisers so that the risk is exactly r."""
    n = prob.n
    h = float(sol.h)
    lh = oracle.evaluate(h)[0]
    p = prob.p
    w, alpha = weights_at(lh, theta2, divergence, p)
    # q: each sample's share of P0 times n (all ones without sample weights)
    q = np.ones(n) if p is None else p * n
    X_star = oracle.argmax(h)
    loss_star = prob.losses(X_star)
    src = np.arange(n)
    mass = np.ones(n)
    risk = float(w @ loss_star) / n if p is None else float((p * w) @ loss_star)
    split_note = ""
    if h > 0 and abs(risk - r) > 1e-12 * r:
        X_lo, X_hi = oracle.argmax(h * (1 - SWITCH_STEP)), _argmax_above(oracle, h)
        if X_hi is not None:
            l_lo, l_hi = prob.losses(X_lo), prob.losses(X_hi)
            need = n * r - float((q * w) @ l_lo)
            gain = q * w * (l_hi - l_lo)
            cand = np.flatnonzero(gain > 0)
            if need > 0 and cand.size and float(gain[cand].sum()) >= need * (1 - 1e-12):
                frac = np.zeros(n)
                cg = np.cumsum(gain[cand])
                full = cg <= need
                frac[cand[full]] = 1.0
                k = int(np.count_nonzero(full))
                if k < cand.size:
                    frac[cand[k]] = (need - (cg[k - 1] if k else 0.0)) / gain[cand[k]]
                part = np.flatnonzero((frac > 0) & (frac < 1))
                X_star = np.where((frac >= 1)[:, None], X_hi, X_lo)
                loss_star = np.where(frac >= 1, l_hi, l_lo)
                X_star = np.concatenate([X_star, X_hi[part]])
                loss_star = np.concatenate([loss_star, l_hi[part]])
                src = np.concatenate([src, part])
                mass = np.concatenate([np.where((frac > 0) & (frac < 1), 1 - frac, 1.0),
                                       frac[part]])
                split_note = (f"switching point of the d-transform at h = {h:.6g}: "
                              f"{int(np.count_nonzero(frac > 0))} sample(s) moved to their "
                              "second maximiser (one split) so that the risk of Q* is r")
    diff = X_star - prob.X[src]
    moved2 = np.einsum("ij,ij->i", diff, diff)
    res = audit.audit_sums(prob.losses(prob.X), loss_star, moved2, mass, w[src], theta1, theta2,
                           divergence, float(sol.value), p, src)
    msg = split_note
    if not getattr(oracle, "exact_at", lambda _h: True)(h):
        msg = (f"multinomial cross-entropy above h_concave = {getattr(oracle, 'h_concave', 0):.4g}"
               ": l_h is the best of several local maxima, so the dual value is not certified; "
               "the cost of the returned Q* (value_upper) is an upper bound on R, see "
               "docs/nonlinear.md")
    return StabilityResult(
        value=float(sol.value), h=h, alpha=alpha if divergence == "chi2" else None,
        X_star=X_star, weights=w[src], source=src, mass=mass, solver="dual",
        status=sol.status, solve_time=sol.solve_time, r=r, theta1=theta1, theta2=theta2,
        divergence=divergence, loss=loss, message=msg, dual_gap_bound=sol.gap_bound,
        iterations=sol.iterations, split=src.size > n, X=prob.X,
        feature_names=prob.feature_names, index=prob.index,
        info={"oracle": type(oracle).__name__, "native_status": sol.native_status,
              "wall_time": time.perf_counter() - t_start, **sol.info},
        **res)


def _argmax_above(oracle, h):
    """The maximisers just above h (None where the d-transform is unbounded there)."""
    try:
        return oracle.argmax(h * (1 + SWITCH_STEP))
    except ValueError:
        return None
