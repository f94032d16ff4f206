"""Solving path: linear models with piecewise-linear losses (hinge, absolute, pinball, ...).

The model and loss are reduced to ``l_h(z_i) = max_k c1[i,k] h + c2[i,k] h^2``
(:mod:`otstab.reduction`); the specialised 1-D/2-D dual of :mod:`otstab_solvers.dual` or a
conic backend returns ``(h, alpha, value, status)``; :func:`build_result` builds Q* at ``h``
(with exact tie splitting) and the certificate layer (:mod:`otstab.audit`) audits it. The
solver chain tries the next method when a backend reports an inaccurate or failed status or its
answer fails the audit.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from otstab_solvers import conic as _conic
from otstab_solvers import sorted_kernels as kernels
from otstab_solvers.blockwise import BlockwiseDual, affine_blocks, in_memory, weight_map_blocks
from otstab_solvers.dual import (
    AffineRows,
    negated_keys,
    oracle_for,
    refine,
    solve_dual,
    solve_two_piece,
)
from otstab_solvers.multiclass import (
    MulticlassDual,
    MulticlassOracle,
    multiclass_blocks,
    solve_multiclass,
)
from otstab_solvers.result import OPTIMAL, DualSolution
from otstab_solvers.weights import dense, phi, pmean, support_max, weights_at

from ..errors import SolverError, SolverNotAvailableError
from ..modeling import _fingerprint as fingerprint
from ..modeling._fingerprint import each_run
from ..modeling._models import Problem
from ..modeling._params import check_options
from ..modeling._reduction import Reduced
from ..modeling._threads import usable_cpus
from . import _audit as audit
from ._results import Lazy, StabilityResult

__all__ = ["solve_reduced", "build_result", "DUAL_OPTIONS", "AUDIT_DIRECT_MAX", "AUDIT_SAMPLE"]

#: ``**solver_options`` of the specialised dual
DUAL_OPTIONS = ("tol", "max_iter", "refine")
#: rows per block of the certificate builder (temporaries of 128 KB stay in cache and in
#: the allocator's heap)
AUDIT_BLOCK = 1 << 14
#: above AUDIT_DIRECT_MAX samples the audit evaluates the loss on the moved scores computed from
#: the reduced form and checks them against the model on a random sample of atoms
#: (AUDIT_SAMPLE; :mod:`otstab.audit`)
AUDIT_DIRECT_MAX = audit.AUDIT_DIRECT_MAX
AUDIT_SAMPLE = audit.AUDIT_SAMPLE
#: atoms per block of the sampled check, at most (fewer for wide data:
#: :func:`otstab.audit.rows_per_block`)
SAMPLE_BLOCK = 2048
SAMPLED_RTOL = audit.SAMPLED_RTOL
EPS = float(np.finfo(float).eps)


def edge_kind(losses: np.ndarray | None, r: float, theta2: float, can_move: bool, p=None, *,
              stats: tuple[float, float] | None = None):
    """Decide trivial and unreachable thresholds before any solver runs, on every path.

    ``losses``: the per-sample losses of the data, or ``stats``: their ``(P0-mean, largest
    over the support)`` (:meth:`otstab.models.Problem.loss_stats`); ``can_move``: some sample
    can move at a finite price; ``p``: the sample probabilities (None: uniform). Returns None
    (a solver is needed) or ``(kind, message)`` with kind ``"zero"`` (r reached by the data,
    :func:`otstab.audit.reached`), ``"unreachable"`` or ``"limit"`` (r equals the largest loss
    and nothing moves: attained only as h -> inf, :func:`limit_weights`).
    """
    # losses is given when stats is not
    base = pmean(cast(np.ndarray, losses), p) if stats is None else stats[0]
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
    lmax = support_max(cast(np.ndarray, losses), p) if stats is None else stats[1]
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


def edge_case(red: Reduced, r: float, theta2: float, losses: np.ndarray | None = None, p=None,
              *, stats: tuple[float, float] | None = None):
    """:func:`edge_kind` of a piecewise reduced form (samples can move where ``c2 > 0``)."""
    if stats is None and losses is None:
        losses = red.loss_values()
    return edge_kind(losses, r, theta2, red.can_move(), p, stats=stats)


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
    # the probabilities as the caller's weights read by slices (no n-vector of p): the
    # blockwise dual, the weights and the audit's sums slice them; the dense paths get p
    p = prob.weights
    # the base risk and largest loss, over blocks (the n-vector of losses is built only when
    # asked for: an edge case, ``res.loss_base``)
    stats = prob.loss_stats()
    edge = edge_case(red, r, theta2, p=p, stats=stats)
    if edge is not None:
        return edge_result(prob, prob.losses(prob.X), r, theta1, theta2, divergence, edge,
                           t_start)
    solver_options = dict(solver_options)
    if solver in ("auto", "dual"):
        check_options(solver_options, DUAL_OPTIONS,
                      f"solver={solver!r} (backend settings need a named backend, e.g. "
                      "solver='clarabel')")
    do_refine = solver_options.pop("refine", True)
    dual_opts = {k: v for k, v in solver_options.items() if k in ("tol", "max_iter")}
    # a named backend gets the caller's settings; the fallbacks of "auto" run on defaults
    conic_opts = {} if solver == "auto" else solver_options
    # weighted samples: the dual's sums over blocks of rows (the pieces computed per block: no
    # (K, n) array, no n-vectors of l_h); the sorted view serves uniform samples only
    weighted_rows = p is not None and red.c1_dense is None and red.rows is not None
    # a hinge-shaped form with uniform samples: solve_two_piece sorts the keys it needs (a
    # window of them); the dense weighted dual sorts all of them
    oracle = red.oracle(sorted_view=p is not None and not weighted_rows)
    # weighted_rows: c1_dense is None, the rows form is set
    dual = BlockwiseDual(in_memory(affine_blocks(cast(AffineRows, red.rows), red.c2,
                                                 oracle.c1abs, p)),
                         red.n, 1.0) if weighted_rows else oracle
    if red.lean_multiclass:
        # the multiclass hinge: the dual's sums over blocks of rows whose pieces are computed
        # from the scores and labels at each evaluation (no (K, n) array, no n-vector)
        weighted_rows = True
        dual = MulticlassDual(multiclass_blocks(
            cast(MulticlassOracle, oracle), p,
            keep=divergence == "chi2" and not math.isinf(theta2)),
            red.n, float(red.n) if p is None else 1.0)
    state = {"program": program}

    def run_dual():
        if p is None and oracle._hinge_piece is not None:
            sol = solve_two_piece(oracle, r, theta2, divergence, base=stats[0], **dual_opts)
        elif p is None and red.lean_multiclass:
            sol = solve_multiclass(cast(MulticlassOracle, oracle), cast(MulticlassDual, dual),
                                   r, theta2, divergence, base=stats[0], **dual_opts)
        else:
            sol = solve_dual(dual, r, theta2, divergence,
                             p=None if weighted_rows else dense(p), **dual_opts)
        # a sorted view (an n-vector of keys) served the solve only: freed before Q* is
        # built (a conic fallback refines h on the plain oracle)
        oracle.prefix = None
        if isinstance(dual, MulticlassDual):  # (and the pieces its blocks kept)
            dual.release()
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
                                                       weights=dense(p))
            sol = state["program"].solve(backend, r, **conic_opts)
            if sol.status != OPTIMAL:
                raise audit.Skip(f"{name} reported {sol.native_status!r}", sol.status)
            if do_refine:
                h_raw = sol.h
                h_ref, _, _, steps = refine(oracle, sol.h, r, theta2, divergence, p=dense(p))
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
    and at most one sample is split.

    The work is done over blocks of rows (:data:`AUDIT_BLOCK`), so that beyond ``l_h`` itself
    no temporary of the size of the data is made: one pass finds ``l_h`` and the weights'
    normalisation, a second one the tied samples and (above :data:`AUDIT_DIRECT_MAX` rows)
    the audit's sums. Q*'s per-atom arrays (``weights``, ``source``, ``mass``, ``X_star``,
    ``loss_star``) are then built on first access. At most ``AUDIT_DIRECT_MAX`` rows the audit
    re-scores every atom with the model instead.
    """
    h = float(sol.h)
    n = red.n
    oracle = red.oracle(sorted_view=False) if oracle is None else oracle
    # the sorted view the dual came from (solve_two_piece; an n-vector of keys): the keyed
    # builder takes it over and frees it once its sums are taken; no result keeps it
    if sol.info.get("view") is not None and n > AUDIT_DIRECT_MAX and prob.weights is None and h > 0:
        return _build_keyed(prob, red, sol, sol.info.pop("view"), oracle, r, theta1, theta2,
                            divergence, t_start)
    sol.info.pop("view", None)
    if tie_rtol is None:
        tie_rtol = 1e-10 if sol.solver == "dual" else 1e-7
    if getattr(oracle, "prefix", None) is not None:
        # the result keeps the oracle (Q*'s atoms are built on first access) but not its
        # sorted view, whose arrays only the solver needed
        oracle = copy.copy(oracle)
        oracle.prefix = None
    p = prob.weights  # (read by slices: no n-vector of p)
    blocks = [(s, min(s + AUDIT_BLOCK, n)) for s in range(0, n, AUDIT_BLOCK)]
    # l_h over blocks, a few passes, instead of an n-vector of it (the largest over the support
    # in O(K) for uniform samples)
    wm = weight_map_blocks(lambda s, e: oracle.values(h, slice(s, e)), n, theta2, divergence,
                           p=p, top=oracle.values_max(h) if p is None else None,
                           alpha=sol.alpha)

    def lh_at(rows):
        """l_h of ``rows`` (recomputed: the same arithmetic, the same numbers)."""
        return oracle.values(h, rows)
    sampled = n > AUDIT_DIRECT_MAX
    # every sample on its low piece (the tied ones moved afterwards): the risk it reaches, the
    # tied samples (those whose high piece gains risk) and, for the sampled audit, the sums
    sums = _Sums(n, p)
    low_risk = 0.0
    tied = []
    for s, e in blocks:
        lh_b, k_lo, d_lo, k_hi, d_hi = oracle.scan(h, tie_rtol, slice(s, e))
        w = wm(lh_b)
        pw = w if p is None else p[s:e] * w
        low_risk += float(pw @ d_lo)
        if d_hi is not d_lo:  # (the scan returns one array for both sides when nothing ties)
            gain = pw * (d_hi - d_lo)
            at = np.flatnonzero(gain > 0)
            if at.size:
                tied.append((at + s, gain[at], k_lo[at], k_hi[at]))
        if sampled:
            rows = slice(s, e)
            sums.add(rows, 1.0, w, *_reduced_atoms(prob, red, rows, k_lo, h))
            sums.add_phi(rows, w, divergence)
    t_rows, t_gain, t_lo, t_hi = (np.concatenate(c) for c in zip(*tied)) if tied else \
        (np.zeros(0, dtype=np.intp), np.zeros(0), np.zeros(0, dtype=np.intp),
         np.zeros(0, dtype=np.intp))
    need = n * r - low_risk if p is None else r - low_risk
    frac = audit.shares_in_order(t_gain, need) if h > 0 else np.zeros(t_rows.size)
    moving = frac > 0
    split = (frac > 0) & (frac < 1)
    value = h * r - wm.term
    # the dual objective at h from Q*'s own l_h (the pieces clipped by their max, not the
    # solver's sums): the audit refuses a solver value above it (weak duality)
    dual_at_h = value
    if sol.solver == "dual" and math.isfinite(sol.value):
        # the specialised dual evaluated F at this very h, at a kink on the side where l_h is
        # resolved best (the scan's max over pieces keeps the rounding of the moving piece)
        value = max(value, float(sol.value))
    # F(h) = h r - T(h) with T(h) >= mean(l_h) >= 0 (the losses are nonnegative): a value above
    # h r is rounding of T (prefix sums of the sorted oracle can round below 0); at a kink where
    # every l_h is 0, h r is the exact value
    value = min(value, h * r)
    X = prob.X
    near_base = None
    if h == 0.0:
        # (the dual saw r at the base risk: an upper bound on R for r within its rounding,
        # from the curvature c2 of each sample's loss piece, audit.upper_near_base)
        curv = 0.0
        for s, e in blocks:
            k = oracle.scan(0.0, tie_rtol, slice(s, e))[3]
            if red.lean_multiclass:
                assert red.mrows is not None  # lean_multiclass
                c2k = red.mrows.C[red.mrows.labels[s:e], k]
            else:
                c2 = red.c2
                c2k = c2[0][k] if c2.shape[0] == 1 else c2[np.arange(s, e), k]
            curv += float(np.sum(c2k)) / n if p is None else float(p[s:e] @ c2k)
        near_base = audit.upper_near_base(r, prob.loss_stats()[0], curv, n)

    def build_atoms():
        """(source, piece, mass, weight) of every atom: each sample on its main piece, plus
        one extra atom per split sample."""
        piece = np.empty(n, dtype=np.intp)
        for s, e in blocks:
            piece[s:e] = oracle.scan(h, tie_rtol, slice(s, e))[1]
        up = frac >= 1.0
        piece[t_rows[up]] = t_hi[up]
        mass = np.ones(n)
        mass[t_rows[split]] = 1.0 - frac[split]
        srows = t_rows[split]
        src = np.concatenate([np.arange(n), srows])
        piece = np.concatenate([piece, t_hi[split]])
        mass = np.concatenate([mass, frac[split]])
        w = wm(lh_at(slice(None)))
        return src, piece, mass, np.concatenate([w, w[srows]])

    atoms = Lazy(build_atoms)
    if sampled:
        # the tied samples that move: a share frac of their mass goes from the low piece to
        # the high one (the sums are linear in the mass; the weight stays the sample's)
        mrows = t_rows[moving]
        if mrows.size:
            w = wm(lh_at(mrows))
            f = frac[moving]
            sums.add(mrows, f, w, *_reduced_atoms(prob, red, mrows, t_hi[moving], h))
            sums.add(mrows, -f, w, *_reduced_atoms(prob, red, mrows, t_lo[moving], h))
        res = sums.result(prob, theta1, theta2, value)
        res["audit"] = _sample_check(prob, red, h, *_scanned_atoms(prob, red, oracle, h,
                                                                    tie_rtol, t_rows, t_hi,
                                                                    frac))
        if res["audit"]["max_rel_error"] > SAMPLED_RTOL:  # the reduced form and the model
            res["primal_cost"] = res["gap"] = math.inf   # disagree: never pass this off
        res["loss_star"] = lambda: _reduced_atoms(prob, red, atoms()[0], atoms()[1], h)[0]
        moved2 = lambda: red.sq_displacement(atoms()[0], atoms()[1], h)  # noqa: E731
    else:
        src, piece, mass, w_atoms = atoms()

        def moved_block(s, e):
            """(x_src, x*, x* - x_src) for atoms s..e; main atoms are rows s..e of X."""
            sb = src[s:e]
            Xg = X[s:e] if e <= n else X[sb]
            delta = red.displacement(sb, piece[s:e], h)
            if delta is None:
                return Xg, Xg, None
            return Xg, Xg + delta, delta

        res = _audit_blocks(prob, moved_block, src, mass, w_atoms, theta1, theta2,
                            divergence, value)
        moved2 = res.pop("moved2")  # per atom: for the influence function (otstab.inference)
    out = _candidate(prob, red, sol, atoms, res, moved2, bool(split.any()),
                     _Question(r, theta1, theta2, divergence, t_start),
                     _Answer(h, value, wm.alpha, dual_at_h,
                             8.0 * EPS * oracle._bound(h)))  # (l_h: a few ulps of |c1| h + c2 h^2)
    if near_base is not None:
        out.info["upper_near_base"] = near_base
    return out


@dataclass(frozen=True)
class _Question:
    """What a builder was asked: the threshold ``r``, the prices, the divergence, and when the
    call started."""

    r: float
    theta1: float
    theta2: float
    divergence: str
    t_start: float


@dataclass(frozen=True)
class _Answer:
    """The dual's answer a builder hands on: ``h``, the value, ``alpha``, the dual objective at
    ``h`` recomputed from the rows (None: not recomputed) and its rounding."""

    h: float
    value: float
    alpha: Any
    dual_at_h: float | None = None
    dual_rounding: float = 0.0


def _candidate(prob, red, sol, atoms, res, moved2, split: bool, question: _Question,
               answer: _Answer) -> StabilityResult:
    """The candidate result of a builder: ``atoms`` (lazy) gives Q*'s ``(source, piece,
    mass, weight)``, ``res`` the audit's fields, ``moved2`` each atom's squared move."""
    h, value, alpha = answer.h, answer.value, answer.alpha
    dual_at_h, dual_rounding = answer.dual_at_h, answer.dual_rounding
    r, theta1, theta2 = question.r, question.theta1, question.theta2
    divergence, t_start = question.divergence, question.t_start
    audit_info = res.pop("audit")
    X = prob.X
    return StabilityResult(
        value=value, h=h, alpha=alpha,
        # lazy fields: callables built on first access by StabilityResult's properties
        X_star=lambda: red.move(X, atoms()[0], atoms()[1], h),  # type: ignore[arg-type]
        weights=lambda: atoms()[3],  # type: ignore[arg-type]
        source=lambda: atoms()[0], mass=lambda: atoms()[2],  # type: ignore[arg-type]
        solver=sol.solver, status="candidate", solve_time=sol.solve_time,
        r=r, theta1=theta1, theta2=theta2, divergence=divergence, loss=prob.loss.name,
        dual_gap_bound=sol.gap_bound, iterations=sol.iterations,
        compile_time=sol.compile_time, split=split,
        X=prob.X, feature_names=prob.feature_names, index=prob.index,
        info={"solver_value": sol.value, "native_status": sol.native_status,
              "solver_alpha": sol.alpha, "wall_time": time.perf_counter() - t_start,
              "audit": audit_info, "moved2": moved2, "dual_at_h": dual_at_h,
              "dual_at_h_rounding": dual_rounding,
              # x* - x of the atoms ``atoms`` (None: no move), for Q* built blockwise
              "displacement": lambda idx: red.displacement(atoms()[0][idx], atoms()[1][idx],
                                                           h),
              **sol.info},
        **res,
    )


def _build_keyed(prob, red, sol, view, oracle, r, theta1, theta2, divergence,
                 t_start) -> StabilityResult:
    """:func:`build_result` from the sorted view the dual came from (a hinge-shaped form,
    uniform samples, KL, chi2 or theta2 = inf, above ``AUDIT_DIRECT_MAX`` rows; chi2 by
    :meth:`~otstab_solvers.sorted_oracle.SortedTwoPiece.chi2_sums`).

    The view gives Q* as a rule on each sample's key (:class:`~otstab_solvers.sorted_oracle.
    KeyRule`: which samples move, their weights and losses at the moved points) and the
    audit's sums in one pass over the samples that move; the samples that stay share one
    weight and a zero loss. Only tied samples are looked up in the rows (one pass, when there
    are any): they are split in row order as :func:`build_result` splits them, so that the
    risk of Q* is r. The sampled check materialises random atoms by the same rule and
    compares the rule's loss and squared move with the model's."""
    h = float(sol.h)
    n = red.n
    value = min(float(sol.value), h * r)  # (F(h) <= h r: the losses are nonnegative)
    chi2 = divergence == "chi2" and not math.isinf(theta2)
    if chi2:
        rule, sums = view.chi2_sums(h, theta2)
    else:
        rule, sums = view.moving_sums(h, theta2, phi_atol=_PHI_RTOL * abs(value) * n / theta2)
    # the rounding of the keyed sums' T: a few ulps of the terms of l_h, and for KL that of
    # log(Z / n) (Z a sum of n exponentials, without the expm1 pass of the solver's sums);
    # for chi2 a few ulps of its terms per halving of the sum
    dual_rounding = 8.0 * EPS * (h * view.umax + view.c * h * h) + (
        0.0 if math.isinf(theta2) else
        32.0 * EPS * max(1.0, math.log2(n)) * (sums["T_abs"] if chi2 else theta2))
    del view
    k_move = oracle._hinge_piece
    k_stay = 1 - k_move
    # the tied samples, in row order, by the rule's thresholds (the view's counts)
    t_rows, t_nu = _tied_rows(oracle, rule, n) if sums["p_r"] > sums["p_l"] else \
        (np.zeros(0, dtype=np.intp), np.zeros(0))
    if t_rows.size != sums["p_r"] - sums["p_l"]:
        raise audit.Skip(f"the rows hold {t_rows.size} tied samples where the sorted view "
                         f"counts {sums['p_r'] - sums['p_l']}")
    t_w, t_d = rule.weights(t_nu), rule.loss_moved(t_nu)
    frac = audit.shares_in_order(t_w * t_d, n * r - sums["wd"])
    up, split = frac >= 1.0, (frac > 0) & (frac < 1)
    d2 = float(red.sq_displacement(np.zeros(1, dtype=np.intp), np.array([k_move]), h)[0])
    w0, n_stay = rule.stay_weight(), n - sums["p_r"]
    sums_ = _Sums(n, None)
    sums_.risk = (sums["wd"] + float(frac @ (t_w * t_d))) / n
    sums_.mass = (sums["w"] + float(t_w.sum()) + n_stay * w0) / n
    sums_.move = d2 * (sums["w"] + float(frac @ t_w)) / n
    sums_.moved_risk = (sums["d"] + float(frac @ t_d)) / n
    sums_.phi = 0.0 if math.isinf(theta2) else (
        sums["phi"] + float(np.sum(phi(t_w, divergence))) + n_stay * float(
            phi(np.array([w0]), divergence)[0])) / n
    res = sums_.result(prob, theta1, theta2, value)
    t_up, t_split = t_rows[up], t_rows[split]

    def pieces_weights(rows):
        """The piece and weight of the samples ``rows`` (main atoms) by the rule."""
        nu = negated_keys(oracle, rows, np.empty(_count(rows, n)))
        piece = np.where(rule.moving(nu), k_move, k_stay)
        if t_up.size:
            src = np.arange(n)[rows] if isinstance(rows, slice) else rows
            piece[np.isin(src, t_up)] = k_move
        return piece, rule.weights(nu)

    def build_atoms():
        """(source, piece, mass, weight) of every atom: each sample on its piece, plus one
        extra atom per split sample (its moving share)."""
        piece = np.empty(n, dtype=np.intp)
        w = np.empty(n)
        for s, e in _blocks(n):
            piece[s:e], w[s:e] = pieces_weights(slice(s, e))
        mass = np.ones(n)
        mass[t_split] = 1.0 - frac[split]
        return (np.concatenate([np.arange(n), t_split]),
                np.concatenate([piece, np.full(t_split.size, k_move)]),
                np.concatenate([mass, frac[split]]), np.concatenate([w, w[t_split]]))

    atoms = Lazy(build_atoms)

    def sampled_atoms():
        """Random atoms, as :func:`_sample_check` takes them: rows, pieces and the rule's
        (loss at x*, squared move) of each."""
        m = n + t_split.size
        pick = audit.sample_positions(m, AUDIT_SAMPLE)
        main, extra = pick[pick < n], pick[pick >= n] - n
        rows = np.concatenate([main, t_split[extra]])
        piece = np.concatenate([pieces_weights(main)[0], np.full(extra.size, k_move)])
        nu = negated_keys(oracle, rows, np.empty(rows.size))
        moves = piece == k_move
        return rows, piece, np.where(moves, rule.loss_moved(nu), 0.0), np.where(moves, d2, 0.0)

    res["audit"] = _sample_check(prob, red, h, *sampled_atoms())
    if res["audit"]["max_rel_error"] > SAMPLED_RTOL:  # the rule and the model disagree
        res["primal_cost"] = res["gap"] = math.inf
    res["loss_star"] = lambda: _reduced_atoms(prob, red, atoms()[0], atoms()[1], h)[0]
    moved2 = lambda: red.sq_displacement(atoms()[0], atoms()[1], h)  # noqa: E731
    return _candidate(prob, red, sol, atoms, res, moved2, bool(split.any()),
                      _Question(r, theta1, theta2, divergence, t_start),
                      _Answer(h, value, sums["alpha"] if chi2 else
                              (None if divergence == "kl" else 0.0),
                              h * r - sums["T"], dual_rounding))


#: relative share of the value that the cancellation of the keyed builder's sum of phi may
#: reach before it is summed per sample (1e-3 of the audit's tolerance)
_PHI_RTOL = 1e-3 * audit.AUDIT_RTOL


def _blocks(n):
    return [(s, min(s + AUDIT_BLOCK, n)) for s in range(0, n, AUDIT_BLOCK)]


def _count(rows, n) -> int:
    return len(range(*rows.indices(n))) if isinstance(rows, slice) else int(np.size(rows))


def _tied_rows(oracle, rule, n):
    """The rows whose keys the rule counts as tied, ascending, and their keys."""
    rows, keys = [], []
    buf = np.empty(AUDIT_BLOCK)
    for s, e in _blocks(n):
        nu = negated_keys(oracle, slice(s, e), buf[:e - s])
        at = np.flatnonzero(rule.tied(nu))
        if at.size:
            rows.append(at + s)
            keys.append(nu[at])
    if not rows:
        return np.zeros(0, dtype=np.intp), np.zeros(0)
    return np.concatenate(rows), np.concatenate(keys)


def _reduced_atoms(prob, red, rows, piece, h):
    """(loss at x*, ||x* - x||^2) of the atoms ``(rows, piece)`` from the reduced form: the
    loss at the moved scores ``s + (x* - x) W^T`` and the squared move, without forming x*."""
    shift, moved2 = red.moves(prob.scorer.W, rows, piece, h)
    scores = prob.scores[rows]
    if shift is not None:
        scores = scores + shift
    return prob.losses_from_scores(scores, prob.y[rows]), moved2


class _Sums:
    """The audit's sums over Q*'s atoms, accumulated block by block: ``E_P0[mass W l(x*)]``,
    ``E_P0[mass W]``, ``E_P0[mass W |x* - x|^2]``, ``E_P0[mass l(x*)]`` and ``E_P0[phi(W)]``
    (each atom carrying its share ``mass`` of its sample's P0-mass)."""

    def __init__(self, n, p):
        self.n, self.p = n, p
        self.risk = self.mass = self.move = self.moved_risk = self.phi = 0.0

    def _pm(self, rows, mass):
        return (mass / self.n) if self.p is None else mass * self.p[rows]

    def add(self, rows, mass, w, loss_star, moved2):
        if self.p is None and np.ndim(mass) == 0:  # one P0-mass for every atom: factor it out
            c = mass / self.n
            self.risk += c * float(w @ loss_star)
            self.mass += c * float(np.sum(w))
            self.move += c * float(w @ moved2)
            self.moved_risk += c * float(np.sum(loss_star))
            return
        pm = np.broadcast_to(self._pm(rows, mass), w.shape)
        pmw = pm * w
        self.risk += float(pmw @ loss_star)
        self.mass += float(np.sum(pmw))
        self.move += float(pmw @ moved2)
        self.moved_risk += float(pm @ loss_star)

    def add_phi(self, rows, w, divergence):
        if self.p is None:
            self.phi += float(np.sum(phi(w, divergence))) / self.n
            return
        self.phi += float(self.p[rows] @ phi(w, divergence))

    def result(self, prob, theta1, theta2, value) -> dict:
        move_cost = 0.0 if math.isinf(theta1) else theta1 * self.move
        rew_cost = 0.0 if math.isinf(theta2) else theta2 * self.phi
        # the base risk from the cached losses or over blocks; the losses themselves are
        # built when ``res.loss_base`` is read
        base = prob.loss_stats()[0]
        return audit.summarise(lambda: prob.losses(prob.X), move_cost, rew_cost, self.risk,
                               self.mass, self.moved_risk, value, None, self.p, base=base)


def _scanned_atoms(prob, red, oracle, h, tie_rtol, t_rows, t_hi, frac):
    """Random atoms of the Q* :func:`build_result` builds (the rows and pieces of the scan,
    the moving tied samples on their high piece), with the reduced form's loss at x* and
    squared move of each (:func:`_reduced_atoms`)."""
    n = prob.n
    split_rows = t_rows[(frac > 0) & (frac < 1)]
    m = n + split_rows.size
    pick = audit.sample_positions(m, AUDIT_SAMPLE)
    main = pick[pick < n]
    rows = np.concatenate([main, split_rows[pick[pick >= n] - n]])
    piece = oracle.scan(h, tie_rtol, main)[1]
    up = t_rows[frac >= 1.0]
    pos = np.searchsorted(up, main)
    hit = (pos < up.size) & (up[np.minimum(pos, up.size - 1)] == main) if up.size else \
        np.zeros(main.size, dtype=bool)
    piece[hit] = t_hi[frac >= 1.0][pos[hit]]
    extra = pick[pick >= n] - n
    split_hi = t_hi[(frac > 0) & (frac < 1)]
    piece = np.concatenate([piece, split_hi[extra]])
    return (rows, piece, *_reduced_atoms(prob, red, rows, piece, h))


def _sample_check(prob, red, h, rows, piece, loss_star, moved2) -> dict:
    """The reduced form against the model on random atoms (``rows``, ``piece``; at most
    AUDIT_SAMPLE): each is materialised (x* = x + displacement), re-scored by the model and
    re-measured, and compared with the loss at x* and the squared move the audit's sums
    used (``loss_star``, ``moved2``). The blocks are spread over the threads of the scores
    pass (:func:`otstab.modeling._fingerprint.each_run`), on as many threads as the process
    has CPUs: the largest error of all blocks, the same on any number of threads."""
    # (BLAS is limited to one thread after the scores pass, so blas_threads() says 1 here:
    # the CPUs the process may use instead, above the size where threads pay)
    big = rows.size * prob.d >= fingerprint.PARALLEL_MIN
    workers = usable_cpus() if big else 1
    # small blocks: the gathered rows, their moves and the moved rows stay cache-sized, and
    # all threads' together as large as one thread's were
    step = audit.rows_per_block(prob.d, max(SAMPLE_BLOCK // workers, 256))
    # a margin / residual form's moves x* - x = t g_i v in one compiled loop per block (the
    # same moved rows as NumPy's outer product and sum, bit for bit; the squared moves
    # summed in order): numba is there and the data large (sorted_kernels)
    compiled = red.v is not None and red.kind != "multiclass" and \
        kernels.use_kernel(prob.n) and not math.isinf(red.theta1) and h != 0.0
    if compiled:
        t = h / (2.0 * red.theta1)
        v = np.ascontiguousarray(red.v, dtype=np.float64)
    errs: list[float] = []

    def run(lo: int, hi: int) -> None:
        err = 0.0
        if compiled:
            xs_buf, d2_buf = np.empty((step, prob.d)), np.empty(step)
        for s in range(lo, hi, step):
            e = min(s + step, hi)
            rb, pb = rows[s:e], piece[s:e]
            Xg = prob.X[rb]
            if compiled and Xg.ndim == 2 and Xg.dtype in (np.float64, np.float32):
                k = rb.size
                Xs, direct_d2 = xs_buf[:k], d2_buf[:k]
                kernels.moved_rows(np.ascontiguousarray(Xg), t * red.coef(rb, pb), v, Xs,
                                   direct_d2)
                direct_loss = np.asarray(prob.losses(Xs, prob.y[rb]), dtype=np.float64)
            else:
                delta = red.displacement(rb, pb, h)
                Xs = Xg if delta is None else Xg + delta
                direct_loss, direct_d2 = audit.rescored(prob.losses, prob.y[rb], Xg, Xs)
            err = max(err, audit.sampled_error(direct_loss, loss_star[s:e], direct_d2,
                                               moved2[s:e]))
        errs.append(err)  # (list.append is atomic)

    each_run(rows.size, step, run, rows.size * prob.d, workers)
    return {"method": "sampled", "sample": int(rows.size), "max_rel_error": max(errs)}


def _audit_blocks(prob, moved_block, src, mass, w, theta1, theta2, divergence, value) -> dict:
    """The audit computed over blocks of atoms (bounded memory), the loss from the model."""
    m = src.size
    loss_star = np.empty(m)
    moved2 = np.empty(m)
    n = prob.n
    # cache-sized blocks of the n x d temporaries (x, x*, x* - x)
    step = audit.rows_per_block(prob.d, AUDIT_BLOCK)
    bounds = list(range(0, n, step)) + [n] + ([m] if m > n else [])
    for s, e in zip(bounds[:-1], bounds[1:]):
        Xg, Xs, _ = moved_block(s, e)
        loss_star[s:e], moved2[s:e] = audit.rescored(prob.losses, prob.y[src[s:e]], Xg, Xs)
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


def reweighting_only_result(prob, r, theta1, theta2, divergence, t_start,
                            **fields) -> StabilityResult:
    """The answer when no sample can move (``theta1 = inf``), for any model: R is the
    reweighting dual of the data's own losses (``l_h = h * loss``), exact whatever the model,
    since the model is only evaluated at the data. Edges as :func:`edge_result`; otherwise Q*
    is the data reweighted by the dual's weights, audited on the model's own losses."""
    losses = prob.losses(prob.X)
    edge = edge_kind(losses, r, theta2, False, prob.p)
    if edge is not None:
        return edge_result(prob, losses, r, theta1, theta2, divergence, edge, t_start, **fields)
    n = prob.n
    # max(0, h * loss) = h * loss (losses are >= 0): the hinge shape, sorted once
    oracle = oracle_for(np.column_stack([losses, np.zeros(n)]), np.zeros((1, 2)))
    sol = solve_dual(oracle, r, theta2, divergence, p=prob.p)
    if sol.status != OPTIMAL:
        raise SolverError(f"the reweighting-only dual (theta1 = inf) failed "
                          f"({sol.native_status})")
    h = float(sol.h)
    w, alpha = weights_at(h * losses, theta2, divergence, prob.p)
    src, mass = np.arange(n), np.ones(n)
    res = audit.audit_points(prob, prob.X, src, mass, w, theta1, theta2, divergence,
                             float(sol.value))
    fields.setdefault("loss", prob.loss.name)
    out = StabilityResult(
        value=float(sol.value), h=h, alpha=alpha, X_star=prob.X, weights=w, source=src,
        mass=mass, solver="dual", status="candidate", solve_time=sol.solve_time, r=r,
        theta1=theta1, theta2=theta2, divergence=divergence,
        message="theta1 = inf: no sample moves; R is the reweighting dual of the data's own "
                "losses, exact for any model",
        X=prob.X, feature_names=prob.feature_names, index=prob.index,
        info={"wall_time": time.perf_counter() - t_start, "reweighting_only": True},
        dual_gap_bound=sol.gap_bound, iterations=sol.iterations, **fields, **res)
    why = audit.accept(out)
    if why:
        raise SolverError("the reweighting-only certificate (theta1 = inf) failed its audit: "
                          + "; ".join(why))
    return out
