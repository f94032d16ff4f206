"""Solving paths for smooth losses: the exact path for linear models and the first-order path.

* A linear model with ``loss="logistic"`` / ``"cross_entropy"`` / ``"squared"`` and
  ``solver="auto"`` or ``"dual"``: the exact d-transform oracles of
  :mod:`otstab_solvers.smooth` and the 1-D dual solver. At a switching point of the
  d-transform (two maximisers of ``h l(x) - theta1 ||x - x_i||^2`` with the same value, a kink
  of the dual) Q* mixes the two maximisers of the switching samples so that its risk is exactly
  r, as the piecewise-linear path splits tied samples. Multinomial cross-entropy above the
  documented threshold ``h_concave`` is not exact (``status = 'bounds'``).

  The loss of a linear model depends on each sample through its scores (binary: the margin
  ``y s``; regression: the residual ``y - s``; multiclass: the K class scores): the path
  (:func:`margin_oracle`, :func:`_certify_rows`) works on the model's scores, never copies X,
  sums the dual over blocks of :data:`ROWS_BLOCK` rows
  (:class:`otstab_solvers.blockwise.BlockwiseDual`) and builds Q* from each sample's step
  (:class:`ScoreMoves`: one number along ``w_M``, or the q reduced coordinates of the
  multinomial cross-entropy); X_star and the other per-atom arrays are built on first
  access. Its audit sums the loss at the moved scores and the squared moves
  and checks them against the model on materialised atoms: every atom up to
  :data:`otstab.audit.AUDIT_DIRECT_MAX` rows (the sums then from the model), above it
  :data:`otstab.audit.AUDIT_SAMPLE` random ones.
* A differentiable nonlinear model (MLP, PyTorch module, callable) or ``solver="first_order"``:
  :func:`otstab_solvers.first_order.solve_first_order`, a local search (the paper's
  Algorithms 1 and 2): its audited Q* gives an upper bound on R (``status = 'bounds'``).

Every answer goes through the audit of :mod:`otstab.audit`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from otstab_solvers import logistic_binned, logistic_kernels, logistic_pass
from otstab_solvers.blockwise import BlockwiseDual, RowsBlock, in_memory, weight_map_blocks
from otstab_solvers.dual import solve_dual
from otstab_solvers.first_order import solve_first_order
from otstab_solvers.result import OPTIMAL
from otstab_solvers.smooth import (
    CrossEntropyOracle,
    LogisticOracle,
    SquaredAtPole,
    SquaredOracle,
    solve_squared,
)
from otstab_solvers.weights import NEAR_ONE, WeightMap, phi, weights_at

from ..errors import IncompatibleLossError, ValidationError
from ..modeling._nonlinear import SMOOTH_LOSSES, LinearDifferentiable, loss_name
from ..modeling._params import check_options
from . import _audit as audit
from . import _bounds as bounds
from . import _neural_found as neural_found
from ._piecewise import edge_kind, edge_result
from ._results import StabilityResult

__all__ = ["certify_smooth", "linear_smooth_oracle", "margin_oracle", "ScoreMoves",
           "FIRST_ORDER_OPTIONS"]

#: ``**solver_options`` accepted by the first-order path (passed to ``solve_first_order``)
FIRST_ORDER_OPTIONS = ("outer", "inner_steps", "inner_lr", "inner_tol", "max_outer", "tol",
                       "h_init", "outer_lr", "starts", "random_starts", "screen_steps",
                       "inner_method", "h_cap", "seed", "verbose", "callback")
#: relative step in h used to read the two maximisers at a switching point
SWITCH_STEP = 1e-9
#: rows per block of the margin / residual path (its dual sums and Q*'s audit): the logistic
#: d-transform's vectorised Newton keeps some 40 temporaries of a block (8192 rows: 2.6 MB)
ROWS_BLOCK = 1 << 13
#: relative half-width of the window of h searched around the binned logistic dual's root
BINNED_WINDOW = 1e-2


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
                                stronger=solver == "auto", **solver_options)


def _certify_first_order(prob, loss, r, theta1, theta2, divergence, mask, t_start,
                         stronger=False, **solver_options):
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
    oracle, how = bounds.network_transform_upper(adapter, loss, prob.X, prob.y,
                                                 prob.losses(prob.X), theta1, mask, sol.h)
    if oracle is not None:
        value_lower = bounds.smooth_lower_value(oracle, r, theta2, divergence, p=prob.p)
        message += f"; value_lower from {how} (otstab.bounds)"
    else:
        message += "; no certified lower bound for this model (value_lower = 0)"

    # the found side of networks: a second, stronger search; the cheaper audited Q* is kept
    # (otstab/solve/_neural_found.py); solver="first_order" keeps the paper's loop alone
    sols = [("first_order", sol)]
    if stronger and prob.scorer is None:
        sol2 = neural_found.stronger_search(adapter, prob, oracle, sol, r=r, theta1=theta1,
                                            theta2=theta2, divergence=divergence, mask=mask)
        if sol2 is not None and sol2.status != "unreachable":
            sols.append(("first_order+restarts", sol2))

    def attempt(sol, search):
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
                  "solver_primal_cost": sol.primal_cost, "search": search,
                  "wall_time": time.perf_counter() - t_start, **sol.info},
            **res)
        return cand, False, value_lower

    built = [attempt(s, name) for name, s in sols]
    if len(built) > 1:
        found = ", ".join(f"{name}: {c[0].primal_cost:.6g}" for (name, _), c in zip(sols, built))
        for c in built:
            c[0].info["found_costs"] = found
    order = sorted(range(len(built)), key=lambda k: (
        built[k][0].primal_cost if math.isfinite(built[k][0].primal_cost) else math.inf, k))
    return audit.first_accepted([(sols[k][0], lambda k=k: built[k]) for k in order],
                                solver="first_order")


def _zero_direction(oracle) -> bool:
    a = getattr(oracle, "direction_norm2", None)
    if a is not None:
        return bool(np.all(np.asarray(a) == 0))
    return getattr(oracle, "q", 1) == 0


def _certify_linear_exact(prob, loss, r, theta1, theta2, divergence, mask, t_start,
                          **solver_options):
    """The exact path of a smooth loss of a linear model: the score path
    (:func:`margin_oracle`, :func:`_certify_rows`) whenever the model's scores are at hand,
    which they always are for a resolved linear model; otherwise the dense oracle on X
    (:func:`linear_smooth_oracle`, :func:`_build`), the form the score path is tested
    against (tests/test_smooth_rows.py)."""
    sc = prob.scorer
    rows = margin_oracle(prob, loss, theta1, mask)
    if rows is not None:
        return _certify_rows(prob, loss, *rows, r, theta1, theta2, divergence, t_start,
                             **solver_options)
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
    if h > 0 and getattr(oracle, "switching", True) and abs(risk - r) > 1e-12 * r:
        X_lo, X_hi = oracle.argmax(h * (1 - SWITCH_STEP)), _argmax_above(oracle, h)
        if X_hi is not None:
            l_lo, l_hi = prob.losses(X_lo), prob.losses(X_hi)
            need = n * r - float((q * w) @ l_lo)
            gain = q * w * (l_hi - l_lo)
            cand = np.flatnonzero(gain > 0)
            if need > 0 and cand.size and float(gain[cand].sum()) >= need * (1 - 1e-12):
                frac = np.zeros(n)
                frac[cand] = audit.shares_in_order(gain[cand], need)
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


# ---------------------------------------------------------------------------------------------
# the score path: linear models, whose smooth loss depends on each sample through its scores


@dataclass
class ScoreMoves:
    """How the maximisers of a score oracle move the samples. ``steps(out, rows)`` turns the
    fourth output of the oracle's ``transform_rows`` for ``rows`` into the steps ``Z``
    (rows x q): the maximiser of sample i is ``x_i + D Z_i`` (``D``: d x q, zero off the
    feature mask), its scores ``s_i + M Z_i`` (``M = W D``: the model's score change per unit
    step, one row per score), its squared move ``Z_i' G Z_i`` (``G = D' D``)."""

    D: np.ndarray
    M: np.ndarray
    steps: Callable

    def __post_init__(self):
        self.G = self.D.T @ self.D


def margin_oracle(prob, loss, theta1, mask):
    """``(oracle, moves)`` for a linear model whose smooth loss depends on each sample through
    its scores: a binary classifier with the logistic loss (or the two-class cross-entropy) and
    a regressor with the squared loss (the exact d-transform on the margins ``y s`` or
    residuals ``y - s``: one n-vector), or a multiclass classifier with the cross-entropy (on
    the n x K scores, q = rank of the centred masked weights <= K - 1 reduced coordinates).
    ``moves``: a :class:`ScoreMoves`. X is not read. None for other models."""
    sc = prob.scorer
    scores = prob.scores
    if scores is None:
        return None
    if sc.task == "multiclass" and loss == "cross_entropy" and np.ndim(scores) == 2:
        mv = np.ones(sc.W.shape[1], dtype=bool) if mask is None else np.asarray(mask, bool)
        oracle = CrossEntropyOracle(scores, prob.y, sc.W[:, mv], theta1, copy=False,
                                    cache=False)
        D = np.zeros((sc.W.shape[1], oracle.q))
        D[mv] = oracle.V  # the move V C on the masked features
        return oracle, ScoreMoves(D, sc.W @ D, lambda out, rows: out[3])
    if np.ndim(scores) != 1 or sc.W.shape[0] != 1:
        return None
    direction = sc.W[0] if mask is None else np.where(mask, sc.W[0], 0.0)
    a = float(direction @ direction)
    if sc.task == "binary" and loss in ("logistic", "cross_entropy"):
        # the margin y s falls by the oracle's step t
        oracle, signs = LogisticOracle.of_scores(scores, prob.y, a, theta1), prob.y
    elif sc.task == "regression" and loss == "squared":
        # the residual y - s grows by the oracle's step
        oracle, signs = SquaredOracle(prob.y - scores, a, theta1, copy=False), None
    else:
        return None

    def steps(out, rows):  # the score falls by sign * step: x* = x - (sign step / a) w_M
        st = out[3] if signs is None else signs[rows] * out[3]
        return (-st / a if a > 0 else np.zeros(st.size))[:, None]

    M = np.array([[float(sc.W[0] @ direction)]])  # = a: w . w_M
    return oracle, ScoreMoves(direction[:, None], M, steps)


def _certify_rows(prob, loss, oracle, moves, r, theta1, theta2, divergence, t_start,
                  **solver_options):
    """The score path (module docstring): the dual over blocks of rows, Q* from the steps of
    the samples."""
    n, p = prob.n, prob.p
    can_move = math.isfinite(theta1) and bool(np.any(moves.M != 0))
    edge = edge_kind(None, r, theta2, can_move, p, stats=prob.loss_stats())
    if edge is not None:
        return edge_result(prob, prob.losses(prob.X), r, theta1, theta2, divergence, edge,
                           t_start, loss=loss)
    # chi2 sums one h over several passes (its active-set steps): the blocks keep it
    keep = divergence == "chi2" and math.isfinite(theta2)
    # the squared loss is solved in the distance to its pole (solve_squared): its dual sums the
    # losses g e^2, the d-transform of theta1 = inf
    pole = isinstance(oracle, SquaredOracle) and math.isfinite(oracle.h_max)
    summed = SquaredOracle(oracle.residuals, 0.0, math.inf, copy=False) if pole else oracle
    blocks = [RowsBlock(summed, s, min(s + ROWS_BLOCK, n),
                        None if p is None else p[s:s + ROWS_BLOCK], keep=keep)
              for s in range(0, n, ROWS_BLOCK)]
    dual = BlockwiseDual(in_memory(blocks), n, n if p is None else 1.0, kinks=False,
                         h_max=summed.h_max)

    def attempt():
        if pole:
            sol = solve_squared(dual, r, 1.0 / oracle.h_max, theta2, divergence,
                                **solver_options)
        else:
            sol = _solve_logistic_binned(oracle, dual, n, p, r, theta2, divergence,
                                         solver_options)
            if sol is None:
                sol = solve_dual(dual, r, theta2, divergence, **solver_options)
        blocks.clear()  # (the kept evaluations of chi2)
        if sol.status != OPTIMAL:
            raise audit.Skip(f"dual reported {sol.native_status!r}", sol.status)
        sol.info["passes"] = dual.passes
        exact = bool(getattr(oracle, "exact_at", lambda _h: True)(sol.h))
        at = SquaredAtPole(oracle, sol.info["g"], r) if pole else oracle
        cand = _build_rows(prob, at, moves, sol, loss, r, theta1, theta2, divergence,
                           t_start, exact)
        getattr(oracle, "release", lambda: None)()  # (the logistic oracle's warm starts)
        cand.info["oracle"] = type(oracle).__name__
        return cand, exact, 0.0

    return audit.first_accepted([("dual", attempt)], solver="dual")


def _solve_logistic_binned(oracle, dual, n, p, r, theta2, divergence, solver_options):
    """The exact dual of a logistic oracle with one price, solved from the root of the dual
    on binned margins (:mod:`otstab_solvers.logistic_binned`): one exact pass there and
    Newton steps (:func:`otstab_solvers.logistic_pass.solve_at_root`), else a window of
    :data:`BINNED_WINDOW` around it, the exact search's own stopping rule. None where it does
    not apply (per-sample prices, small n, a caller's ``h_init``) or the root is not in the
    window (the caller then searches from scratch)."""
    if not isinstance(oracle, LogisticOracle) or n < logistic_binned.MIN_N \
            or oracle.c.strides != (0,) or not 0.0 < float(oracle.c[0]) < math.inf \
            or "h_init" in solver_options:
        return None
    rows = None if oracle._scores is None else (oracle._score_signs, oracle._scores)
    h_c, alpha, span = logistic_binned.binned_solution(
        lambda s, e: oracle._margins_of(slice(s, e)), n, float(oracle.direction_norm2[0]),
        oracle.theta1, r, theta2, divergence, p=p, rows=rows)
    if h_c is None:
        return None
    if oracle.margin_range is None:  # (the binning read them: the table of steps need not)
        oracle.margin_range = span
    # one exact pass at h_c, a Newton step where its derivative is not yet small enough
    # (chi2: its sums in that pass, from the binned alpha)
    sol = logistic_pass.solve_at_root(oracle, n, h_c, r, theta2, divergence, p=p,
                                      block=ROWS_BLOCK, keep_values=True, alpha=alpha)
    if sol is not None:
        sol.info["binned_h"] = h_c
        dual.passes += sol.info.pop("passes")
        del sol.info["g"], sol.info["moved"]
        return sol
    window = (h_c * (1.0 - BINNED_WINDOW), h_c * (1.0 + BINNED_WINDOW))
    sol = solve_dual(dual, r, theta2, divergence, bracket=window, h_init=h_c,
                     **solver_options)
    if sol.status != OPTIMAL:
        return None
    sol.info["binned_h"] = h_c
    return sol


class _Steps:
    """The moves of Q*'s atoms on the score path, as arrays only (picklable without the
    problem: :func:`otstab.scale.qstar` ships :meth:`displacement` to Dask workers).

    Sample ``i`` has the step ``Z[i]`` (q numbers) at h: its maximiser is ``x_i + D Z_i``. At a
    switching point the switching samples take their maximiser just below or above h instead
    (``main``: their rows and steps), and one of them may be split (``extra``: its row, its
    second step and the share of its mass moved there, one more atom). Atoms ``0..n-1`` are
    the samples, ``n..m-1`` the split ones.
    """

    def __init__(self, D, Z, *, main=None, extra=None):
        self.D, self.Z = D, Z
        q = Z.shape[1]
        empty = (np.zeros(0, dtype=np.intp), np.zeros((0, q)))
        self.main_rows, self.main_step = main if main is not None else empty
        self.extra_rows, self.extra_step, self.extra_frac = \
            extra if extra is not None else (*empty, np.zeros(0))
        self.n = Z.shape[0]
        self.m = self.n + self.extra_rows.size

    def rows_steps(self, idx):
        """(source row, step) of the atoms ``idx`` (positions in 0..m-1)."""
        idx = np.asarray(idx)
        main = idx < self.n
        src = np.where(main, idx, 0)
        st = np.empty((idx.size, self.Z.shape[1]))
        st[main] = self.Z[idx[main]]
        if self.main_rows.size:
            pos = np.minimum(np.searchsorted(self.main_rows, idx), self.main_rows.size - 1)
            hit = main & (self.main_rows[pos] == idx)
            st[hit] = self.main_step[pos[hit]]
        extra = idx[~main] - self.n
        src[~main] = self.extra_rows[extra]
        st[~main] = self.extra_step[extra]
        return src, st

    def displacement(self, idx):
        """``x* - x`` of the atoms ``idx`` (one row each)."""
        return self.rows_steps(idx)[1] @ self.D.T

    def source(self):
        return np.concatenate([np.arange(self.n), self.extra_rows])

    def mass(self, idx=None):
        """Each atom's share of its sample's mass (of the atoms ``idx``; default all)."""
        idx = np.arange(self.m) if idx is None else np.asarray(idx)
        mass = np.ones(idx.size)
        for k, row in enumerate(self.extra_rows):
            mass[idx == row] = 1.0 - self.extra_frac[k]
            mass[idx == self.n + k] = self.extra_frac[k]
        return mass

    def blocks(self, size=None):
        size = size or ROWS_BLOCK
        return ((s, min(s + size, self.m)) for s in range(0, self.m, size))


class _RowAtoms:
    """Q*'s atoms on the score path (:class:`_Steps`) with the problem: their losses and moves
    from the reduced form, their points, and each sample's ``l_h`` at h (from its step at h:
    the weight of every atom of a sample)."""

    def __init__(self, prob, moves: ScoreMoves, steps: _Steps, h, theta1):
        self.prob, self.moves, self.steps, self.h, self.theta1 = prob, moves, steps, h, theta1
        self.n, self.m = steps.n, steps.m

    def reduced(self, src, st):
        """(loss at x*, ||x* - x||^2) of atoms from the reduced form: the loss at the moved
        scores ``s + M Z`` and ``Z' G Z``."""
        shift = st @ self.moves.M.T
        S = self.prob.scores[src]
        moved = S + (shift[:, 0] if S.ndim == 1 else shift)
        loss = self.prob.losses_from_scores(moved, self.prob.y[src])
        return loss, self.moved2_of(st)

    def moved2_of(self, st):
        """``||x* - x||^2`` of atoms with steps ``st``: ``Z' G Z`` (one step each: ``(Z G)
        Z``, the same bits without a matrix product per block)."""
        G = self.moves.G
        if G.shape == (1, 1):
            z = st[:, 0]
            out = z * float(G[0, 0])
            out *= z
            return out
        return np.einsum("iq,iq->i", st @ G, st)

    #: each sample's ``l_h`` while the build holds it (None: recomputed on each read)
    lh_cache: np.ndarray | None = None
    #: the loss at x* of atoms 0..n-1 (the reduced form's, or the logistic pass's) while the
    #: build holds it, when every atom is its sample at its step at h (None: recomputed on
    #: each read)
    reduced_cache: np.ndarray | None = None

    def l_of(self, loss, d2):
        """``h loss - theta1 d2``: ``l_h`` from a maximiser's loss and squared move."""
        return self.h * loss - (0.0 if math.isinf(self.theta1) else self.theta1 * d2)

    def l_h(self, src):
        """``l_h`` of the samples ``src`` at h: ``h l(x*) - theta1 ||x* - x||^2`` at their
        maximiser at h."""
        if self.lh_cache is not None:
            return self.lh_cache[src]
        if self.reduced_cache is not None:  # (atom i is sample i at its step at h)
            return self.l_of(self.reduced_cache[src], self.moved2_of(self.steps.Z[src]))
        return self.l_of(*self.reduced(src, self.steps.Z[src]))

    def points(self, src, st):
        """(x, x*) of atoms with source rows ``src`` and steps ``st`` (x* in float64)."""
        Xg = np.asarray(self.prob.X[src], dtype=np.float64)
        return Xg, Xg + st @ self.steps.D.T

    def x_star(self):
        X = self.prob.X
        out = np.empty((self.m, X.shape[1]))
        for s, e in self.steps.blocks(audit.rows_per_block(X.shape[1], ROWS_BLOCK)):
            out[s:e] = self.points(*self.steps.rows_steps(np.arange(s, e)))[1]
        return out

    def loss_star(self):
        out = np.empty(self.m)
        for s, e in self.steps.blocks():
            out[s:e] = self.reduced(*self.steps.rows_steps(np.arange(s, e)))[0]
        return out

    def moved2(self):
        return self.reduced(*self.steps.rows_steps(np.arange(self.m)))[1]


def _build_rows(prob, oracle, moves, sol, loss, r, theta1, theta2, divergence, t_start,
                exact=True):
    """Q* at the dual's h on the score path, audited (see :func:`_build`, whose
    switching-point split it follows: only the switching samples take their maximiser just
    below or above h). Each sample's step at h is kept (q n-vectors). ``exact``: False when
    the oracle's ``l_h`` is not certified at h (multinomial cross-entropy above
    ``h_concave``), which the result's message says."""
    n, p, h = prob.n, prob.p, float(sol.h)
    Z = None
    step_rows = getattr(oracle, "step_rows", oracle.transform_rows)
    # the logistic pass at h kept each sample's loss at its maximiser and its step in two
    # n-vectors (logistic_pass): the reduced form takes the losses (the audit's sampled atoms
    # check them against the model) and the steps become the moves in place (no copy)
    vectors = getattr(oracle, "kept_vectors", None)
    vectors = None if vectors is None else vectors(h)
    if vectors is not None:
        loss_h, t_all = vectors
        for s in range(0, n, ROWS_BLOCK):
            rows = slice(s, min(s + ROWS_BLOCK, n))
            zb = moves.steps((None, None, None, t_all[rows]), rows)
            if zb.shape[1] != 1:
                break
            t_all[rows] = zb[:, 0]
        else:
            Z = t_all[:, None]
    # the loss at each maximiser (kept for the audit's sums too: an n-vector, read instead of
    # a second reduced form of every atom; the squared moves follow from the steps)
    if Z is None:
        loss_h = np.empty(n)
    # the logistic pass at h kept each block's loss at its maximiser (logistic_pass): the
    # reduced form takes it (the audit's sampled atoms check it against the model)
    kept = getattr(oracle, "kept", None)
    starts = range(0, n, ROWS_BLOCK) if Z is None else range(0)
    passed = Z is not None or kept is not None and all(
        kept(h, slice(s, min(s + ROWS_BLOCK, n))) is not None for s in starts)
    for s in starts:
        rows = slice(s, min(s + ROWS_BLOCK, n))  # (a slice: the oracle's warm starts apply)
        if passed:  # (each block's kept arrays dropped once read)
            loss_h[rows], t = kept(h, rows, drop=True)
            zb = moves.steps((None, None, None, t), rows)
        else:
            zb = moves.steps(step_rows(h, rows), rows)
        if Z is None:
            Z = np.empty((n, zb.shape[1]))
        Z[rows] = zb
    getattr(oracle, "release", lambda: None)()  # (the warm starts: not read again)
    atoms = _RowAtoms(prob, moves, _Steps(moves.D, Z), h, theta1)
    bounds = list(atoms.steps.blocks())
    # each sample's l_h from the reduced form once (dropped after the audit): the weights,
    # the risk and the audit read them
    may_switch = h > 0 and oracle.switching and \
        getattr(oracle, "may_switch", lambda _h: True)(h)
    lh = None
    if vectors is None:
        lh = np.empty(n)
        for s, e in bounds:
            if passed:
                d2 = atoms.moved2_of(Z[s:e])
            else:
                loss_h[s:e], d2 = atoms.reduced(np.arange(s, e), Z[s:e])
            lh[s:e] = atoms.l_of(loss_h[s:e], d2)
        atoms.lh_cache = lh

    def lh_block(s, e):
        if lh is None:  # from the pass's losses and steps as a block is read (no n-vector)
            return atoms.l_of(loss_h[s:e], atoms.moved2_of(Z[s:e]))
        return lh[s:e]

    kl_sums = sol.info.pop("kl_weights", None)
    chi2_sums = sol.info.pop("chi2_weights", None)
    unit_term = sol.info.pop("unit_term", None)
    if kl_sums is not None and divergence == "kl" and math.isfinite(theta2):
        # the normalisation of the exact pass at h (logistic_pass): the audit's mass of Q*
        # checks it against these l_h
        top, z, term = kl_sums
        wm = WeightMap("kl", theta2, top, n / z if p is None else z, None, term, p is not None)
    elif chi2_sums is not None and divergence == "chi2" and math.isfinite(theta2):
        shift, alpha_s, term = chi2_sums  # (likewise: chi2's alpha from the pass at h)
        wm = WeightMap("chi2", theta2, shift, alpha_s, alpha_s - shift, term, p is not None)
    elif unit_term is not None and math.isinf(theta2):
        # unit weights; their term (the P0-mean of l_h) from the pass at h
        wm = WeightMap(divergence, theta2, 0.0, 1.0, None if divergence == "kl" else 0.0,
                       unit_term, p is not None)
    else:
        wm = weight_map_blocks(lh_block, n, theta2, divergence, p=p, alpha=sol.alpha)

    def qw(s, e):  # n P0-mass times weight of the samples s..e
        w = wm(lh_block(s, e))
        return w if p is None else p[s:e] * n * w

    note = ""
    if may_switch and \
            abs(sum(float(qw(s, e) @ loss_h[s:e]) for s, e in bounds) / n - r) > 1e-12 * r:
        switch = _switch(oracle, atoms, qw, bounds, h, r)
        if switch is not None:
            main, extra, note = switch
            if lh is None:
                lh = np.concatenate([lh_block(s, e) for s, e in bounds])
            atoms = _RowAtoms(prob, moves, _Steps(moves.D, Z, main=main, extra=extra), h,
                              theta1)
            atoms.lh_cache = lh  # (l_h of a sample is from its step at h either way)
    if atoms.m == n and not atoms.steps.main_rows.size:  # every atom at its step at h
        atoms.reduced_cache = loss_h
    loss_h = None  # (the atoms hold it while the audit reads it)
    if not exact:
        note = (f"multinomial cross-entropy above h_concave = {oracle.h_concave:.4g}: l_h is "
                "the best of several local maxima, so the dual value is not certified; the "
                "cost of the returned Q* (value_upper) is an upper bound on R, see "
                "docs/nonlinear.md")
    res = _audit_rows(prob, atoms, wm, theta1, theta2, divergence, float(sol.value))
    atoms.lh_cache = atoms.reduced_cache = None
    audit_info = res.pop("audit")
    weights = lambda: wm(atoms.l_h(atoms.steps.source()))  # noqa: E731
    return StabilityResult(
        value=float(sol.value), h=h, alpha=wm.alpha if divergence == "chi2" else None,
        X_star=atoms.x_star, weights=weights, source=atoms.steps.source,
        mass=atoms.steps.mass,
        solver="dual", status=sol.status, solve_time=sol.solve_time, r=r, theta1=theta1,
        theta2=theta2, divergence=divergence, loss=loss, message=note,
        dual_gap_bound=sol.gap_bound, iterations=sol.iterations, split=atoms.m > n,
        X=prob.X, feature_names=prob.feature_names, index=prob.index,
        info={"oracle": type(oracle).__name__, "native_status": sol.native_status,
              "wall_time": time.perf_counter() - t_start, "audit": audit_info,
              "moved2": atoms.moved2, "displacement": atoms.steps.displacement, **sol.info},
        **res)


def _switch(oracle, atoms, qw, bounds, h, r):
    """At a switching point of the d-transform: the samples whose maximiser just above h has
    a larger loss than the one just below move there one by one (in row order, at most one
    split) until the risk of Q* is r. Returns ``(main, extra, note)`` for :class:`_Steps`
    (None: no such samples, or too little gain)."""
    n = atoms.n
    h_lo, h_hi = h * (1 - SWITCH_STEP), h * (1 + SWITCH_STEP)
    if not h_hi < oracle.h_max:
        return None
    steps = atoms.moves.steps
    low = 0.0
    cand = []
    for s, e in bounds:
        rows = np.arange(s, e)
        z_lo = steps(oracle.transform_rows(h_lo, rows), rows)
        z_hi = steps(oracle.transform_rows(h_hi, rows), rows)
        l_lo = atoms.reduced(rows, z_lo)[0]
        wq = qw(s, e)
        gain = wq * (atoms.reduced(rows, z_hi)[0] - l_lo)
        # a switch jumps between two local maxima; a step that only moves with h (by some
        # 1e-9 of itself here) is not one
        jump = np.linalg.norm(z_hi - z_lo, axis=1) > 1e-6 * (1.0 + np.linalg.norm(z_hi, axis=1))
        sw = np.flatnonzero((gain > 0) & jump)
        # the switching samples count at their low maximiser, the others at h
        l_at = atoms.reduced(rows, atoms.steps.Z[s:e])[0]
        l_at[sw] = l_lo[sw]
        low += float(wq @ l_at)
        if sw.size:
            cand.append((sw + s, gain[sw], z_lo[sw], z_hi[sw]))
    need = n * r - low
    if not cand or need <= 0:
        return None
    rows, gain, z_lo, z_hi = (np.concatenate(c) for c in zip(*cand))
    if float(gain.sum()) < need * (1 - 1e-12):
        return None
    frac = audit.shares_in_order(gain, need)
    main = (rows, np.where((frac >= 1.0)[:, None], z_hi, z_lo))
    part = np.flatnonzero((frac > 0) & (frac < 1))
    extra = (rows[part], z_hi[part], frac[part]) if part.size else None
    moved = int(np.count_nonzero(frac > 0))
    note = (f"switching point of the d-transform at h = {h:.6g}: {moved} sample(s) moved to "
            "their second maximiser (one split) so that the risk of Q* is r")
    return main, extra, note


def _audit_rows(prob, atoms, wm, theta1, theta2, divergence, value) -> dict:
    """The audit of Q* on the score path, over blocks of atoms: up to
    AUDIT_DIRECT_MAX rows every atom is materialised and re-scored by the model (the sums from
    the model); above it the sums come from the reduced form and AUDIT_SAMPLE random atoms are
    checked against the model. A disagreement above SAMPLED_RTOL fails the audit."""
    n, p, m = prob.n, prob.p, atoms.m
    direct = n <= audit.AUDIT_DIRECT_MAX
    risk = tot = move = moved_risk = ph = err = 0.0
    cells = audit.rows_per_block(prob.d, ROWS_BLOCK)

    def model_check(src, st, idx=None):
        """The model's loss and the move at the atoms' points, and their largest relative
        disagreement with the reduced form (the kept one for atoms ``idx`` where the build
        holds it)."""
        if idx is not None and atoms.reduced_cache is not None:
            loss_r, d2_r = atoms.reduced_cache[idx], atoms.moved2_of(st)
        else:
            loss_r, d2_r = atoms.reduced(src, st)
        loss_s, d2_s = audit.rescored(prob.losses, prob.y[src], *atoms.points(src, st))
        return loss_s, d2_s, audit.sampled_error(loss_s, loss_r, d2_s, d2_r)

    # every atom its sample at its step at h (mass 1), uniform samples: the sums of the
    # build's reduced form over blocks, divided by n once (theta2 = inf: unit weights)
    plain = not direct and atoms.reduced_cache is not None and p is None
    # KL's weights exp(l_h / theta2 - shift) * scale: log w = (l_h / theta2 - shift) +
    # log(scale) (clamped at -700 as the weights are), the same to rounding as log(w)
    kl_log = math.log(wm.scale) if plain and divergence == "kl" and math.isfinite(theta2) \
        and not wm.weighted else None
    near_w: list = []  # (KL: the weights near 1 of every block, their phi by one series)
    # the same sums in one compiled loop per block (numba; the moves of one step each, l_h
    # from the loss and the move)
    chi2 = divergence == "chi2" and math.isfinite(theta2)
    fused = plain and atoms.lh_cache is None and atoms.moves.G.shape == (1, 1) \
        and (kl_log is not None or math.isinf(theta2) or chi2) \
        and logistic_kernels.use_kernel(n)
    near_buf = np.empty(ROWS_BLOCK) if fused and kl_log is not None else None
    for s, e in atoms.steps.blocks(ROWS_BLOCK) if plain else ():
        if fused:
            g1 = float(atoms.moves.G[0, 0])
            mr, rb, tb, mv, pb, nn = logistic_kernels.audit_sums(
                atoms.reduced_cache[s:e], atoms.steps.Z[s:e, 0], g1, atoms.h,
                0.0 if math.isinf(theta1) else theta1, theta2,
                wm.shift if kl_log is not None or chi2 else 0.0,
                wm.scale if kl_log is not None or chi2 else 1.0,
                0.0 if kl_log is None else kl_log, NEAR_ONE, near_buf, chi2=chi2)
            moved_risk += mr
            if math.isinf(theta2):
                tot += e - s
                move += mv
                continue
            risk += rb
            tot += tb
            move += mv
            ph += pb
            if nn:
                assert near_buf is not None
                near_w.append(near_buf[:nn].copy())
            continue
        loss_s = atoms.reduced_cache[s:e]
        d2_s = atoms.moved2_of(atoms.steps.Z[s:e])
        moved_risk += float(np.sum(loss_s))
        if math.isinf(theta2):
            tot += e - s
            move += float(np.sum(d2_s))
            continue
        lh = atoms.lh_cache[s:e] if atoms.lh_cache is not None else atoms.l_of(loss_s, d2_s)
        if kl_log is None:
            w = wm(lh)
            ph_w = phi(w, divergence)
        else:  # KL: wm(lh) written out, and log w from its exponent (no log per weight)
            a = lh / theta2
            a -= wm.shift
            np.maximum(a, -700.0, out=a)
            w = np.exp(a)
            w *= wm.scale
            ph_w = a
            ph_w += kl_log
            ph_w *= w
            ph_w -= w
            ph_w += 1.0  # w log w - w + 1
            near = w - 1.0
            np.abs(near, out=near)
            near = np.flatnonzero(near < NEAR_ONE)
            if near.size:  # (phi's series, where w log w - w + 1 cancels: after the loop,
                # one call for every block's few such weights)
                near_w.append(w[near])
                ph_w[near] = 0.0
        risk += float(w @ loss_s)
        tot += float(np.sum(w))
        move += float(w @ d2_s)
        ph += float(np.sum(ph_w))
    if near_w:
        ph += float(np.sum(phi(np.concatenate(near_w), "kl")))
    if plain:
        if math.isinf(theta2):
            risk = moved_risk
        risk, tot, move, moved_risk, ph = (v / n for v in (risk, tot, move, moved_risk, ph))
    for s, e in atoms.steps.blocks(cells if direct else ROWS_BLOCK) if not plain else ():
        idx = np.arange(s, e)
        if not direct and atoms.reduced_cache is not None:
            # every atom is its sample at its step at h (mass 1): the build's reduced form
            src = slice(s, e)
            loss_s = atoms.reduced_cache[src]
            d2_s = atoms.moved2_of(atoms.steps.Z[src])
            mass = np.ones(e - s)
        else:
            src, st = atoms.steps.rows_steps(idx)
            if direct:  # the sums from the model
                loss_s, d2_s, block_err = model_check(src, st)
                err = max(err, block_err)
            else:
                loss_s, d2_s = atoms.reduced(src, st)
            mass = atoms.steps.mass(idx)
        pm = mass / n if p is None else mass * p[src]
        w = wm(atoms.l_h(src))
        pmw = pm * w
        risk += float(pmw @ loss_s)
        tot += float(np.sum(pmw))
        move += float(pmw @ d2_s)
        moved_risk += float(pm @ loss_s)
        ph += float(pm @ phi(w, divergence))
    info = {"method": "direct", "sample": int(m), "max_rel_error": err}
    if not direct:
        pick = audit.sample_positions(m, audit.AUDIT_SAMPLE)
        for s in range(0, pick.size, cells):
            idx = pick[s:s + cells]
            src_i, st_i = atoms.steps.rows_steps(idx)
            err = max(err, model_check(src_i, st_i, idx)[2])
        info = {"method": "sampled", "sample": int(pick.size), "max_rel_error": err}
    move_cost = 0.0 if math.isinf(theta1) else theta1 * move
    rew_cost = 0.0 if math.isinf(theta2) else theta2 * ph
    out = audit.summarise(lambda: prob.losses(prob.X), move_cost, rew_cost, risk, tot,
                          moved_risk, value, None, p, base=prob.loss_stats()[0])
    out["loss_star"] = atoms.loss_star
    if err > audit.SAMPLED_RTOL:  # the reduced form and the model disagree: never pass
        out["primal_cost"] = out["gap"] = math.inf  # this off
    out["audit"] = info
    return out
