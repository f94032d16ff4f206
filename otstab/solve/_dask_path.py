"""The distributed certificate: Dask data too large to bring its scores to the client.

Entry layer (as :mod:`otstab.core`). :func:`certify_distributed` certifies a linear model with a
piecewise-linear margin or residual loss (hinge, absolute, pinball, ...) on a Dask ``X``
without ever holding an n-vector on the client (``docs/scale.md``):

1. one blockwise pass computes the scores ``X @ W.T + b`` (checking X for NaN/inf and
   fingerprinting every block, as :func:`otstab.scale.prepare`) and **persists** them on the
   workers with the encoded labels and the sample probabilities (8 bytes a row each);
2. the 1-D (KL, theta2 = inf) or 2-D (chi2) dual is solved by
   :func:`otstab_solvers.dual.solve_dual` on a :class:`otstab_solvers.blockwise.BlockwiseDual`:
   every evaluation is one pass of per-block sums over the persisted blocks (O(1) numbers
   back per block), chi2's alpha by blockwise Newton steps on its active set, the kinks of a
   bracket by blockwise counts; each block rebuilds its rows' reduced form
   (:func:`otstab.reduction.reduce_problem`) from its scores;
3. Q* at ``h`` (weights, exact tie splitting in row order, at most one split row) and its
   audit (cost, risk and mass: :func:`otstab.audit.summarise` and :func:`otstab.audit.accept`)
   are two more passes of blockwise sums; a random sample of ``AUDIT_SAMPLE`` rows is gathered,
   moved and re-scored by the model (the sampled check of :mod:`otstab.piecewise`, failing the
   audit above ``SAMPLED_RTOL``); the influence-function SE is summed in the same pass;
4. Q* stays lazy: :func:`otstab.scale.qstar` builds it blockwise from X and the persisted
   blocks; ``res.X_star``, ``res.weights``, ``res.source``, ``res.mass`` gather on first access.

:data:`DISTRIBUTED_MIN_ROWS` is the size from which a Dask input should take this path (the
in-memory solve on the gathered scores is faster below it, and exact to the same precision).
"""

from __future__ import annotations

import math
import time

import numpy as np
from otstab_solvers import blockwise as bw
from otstab_solvers.dual import solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.weights import phi

from .._validation import fitted_feature_names
from ..errors import InputTypeError, ValidationError
from ..modeling._losses import PiecewiseLinear, ZeroOne, get_loss
from ..modeling._models import Problem, check_loss_fits, linear_scorer
from ..modeling._params import check_common, check_options
from ..modeling._reduction import feature_mask, reduce_problem
from ..scale import _data as scale
from . import _audit as audit
from ._inference import Inference
from ._piecewise import AUDIT_SAMPLE, DUAL_OPTIONS, SAMPLED_RTOL
from ._results import StabilityResult
from ._zero_one import linear_distances, move_prices

__all__ = ["certify_distributed", "DISTRIBUTED_MIN_ROWS", "NotDistributed", "wants_distributed"]

#: Dask inputs with more rows than this should be certified by :func:`certify_distributed`
DISTRIBUTED_MIN_ROWS = 20_000_000
#: ties between pieces at h are resolved as the in-memory dual path does (build_result)
TIE_RTOL = 1e-10
#: a 0/1 row with ``|a_i - h| <= ZERO_ONE_TIE h`` is tied (as otstab.zero_one)
ZERO_ONE_TIE = 1e-10


class NotDistributed(InputTypeError):
    """An instance the distributed path does not solve (the 0/1 loss at r = 1, the limit case
    of samples unable to move); :func:`otstab.certify` then solves it on the gathered
    scores."""


def wants_distributed(X, loss, model=None) -> bool:
    """Whether a Dask ``X`` with this loss is large enough for the distributed path (and the
    path supports the loss: piecewise-linear margin or residual losses, 0/1; and the model,
    when given: a linear binary classifier or regressor, not a Pipeline)."""
    if not scale.is_dask(X) or not isinstance(get_loss(loss), (PiecewiseLinear, ZeroOne)):
        return False
    if model is not None:
        scorer = None if hasattr(model, "steps") else linear_scorer(model)
        if scorer is None or scorer.task == "multiclass":
            return False
    n = X.shape[0]
    return bool(isinstance(n, (int, np.integer)) and not math.isnan(n)
                and n > DISTRIBUTED_MIN_ROWS)


# ---------------------------------------------------------------------------------------------
# per-block work (runs on the workers)


class _Spec:
    """What every block needs to rebuild its rows' reduced form: the scorer, loss, theta1,
    mask and the largest |c1| over all blocks (the tie tolerance of piecewise losses)."""

    def __init__(self, scorer, loss, theta1, mask):
        self.scorer, self.loss, self.theta1, self.mask = scorer, loss, theta1, mask
        self.zero_one = isinstance(loss, ZeroOne)
        self.c1abs = None

    def problem(self, s, y) -> Problem:
        """A Problem for one block's rows (scores and internal labels; no X)."""
        return Problem(None, np.empty((s.size, 0)), y, y, self.loss, [], self.scorer,
                       scores=s)

    def oracle(self, s, y, p):
        """``(moves, oracle)`` of one block: the moves of its atoms (a
        :class:`otstab.reduction.Reduced` or :class:`_NearMoves`) and its block oracle, with
        ``loss0`` (the loss at the data) set."""
        prob = self.problem(s, y)
        if self.zero_one:
            dstar, near = linear_distances(prob, self.mask)
            loss0 = prob.losses(prob.X)
            # linear_distances gives d* = 0 where misclassified
            oracle = bw.distance_block(move_prices(dstar, self.theta1), p)
            moves = _NearMoves(near)
        else:
            moves = reduce_problem(prob, self.theta1, self.mask)
            c1abs = self.c1abs if self.c1abs is not None else float(
                np.max(np.abs(moves.c1), initial=0.0))
            oracle = bw.piecewise_block(moves.c1, moves.c2, c1abs, p)
            loss0 = None  # the loss at the data, max_k c1: only the first pass needs it
        oracle.loss0 = loss0
        return moves, oracle

    def scan(self, oracle, h):
        """(l_h, k_lo, d_lo, k_hi, d_hi): the pieces of every row at ``h`` with ties on their
        low and high piece and the loss there (0/1: piece 1 = moved to the nearest
        misclassified point, tied when ``a_i`` is within 1e-10 h of h)."""
        if not self.zero_one:
            return oracle.scan(h, TIE_RTOL)
        a, loss0 = oracle.a, oracle.loss0
        t = ZERO_ONE_TIE * h
        k_lo = (a < h - t).astype(np.intp)
        k_hi = (a <= h + t).astype(np.intp)
        return (np.maximum(h - a, 0.0), k_lo, np.where(k_lo > 0, 1.0, loss0), k_hi,
                np.where(k_hi > 0, 1.0, loss0))


class _NearMoves:
    """The moves of 0/1 atoms (piece 1: to the nearest misclassified point of a binary linear
    classifier, :class:`otstab.zero_one.NearPoints`; piece 0: none), with the interface of
    :class:`otstab.reduction.Reduced` that the audit and Q* use."""

    def __init__(self, near):
        self.near = near

    def displacement(self, src, piece, h):
        return self.near.displacement(src) * (piece > 0)[:, None]

    def score_shift(self, W, src, piece, h):
        return self.moves(W, src, piece, h)[0]

    def sq_displacement(self, src, piece, h):
        return self.moves(W=None, src=src, piece=piece, h=h)[1]

    def moves(self, W, src, piece, h):
        """``(score_shift, sq_displacement)`` from one evaluation of the nearest points'
        moves (as :meth:`otstab.reduction.Reduced.moves`)."""
        shift, sq = self.near.moves(src)
        on = piece > 0
        return shift * on, sq * on


def _on_block(spec, s, y, p, func, args):
    return func(spec.oracle(s, y, p)[1], *args)


def _block_base(oracle):
    """(sum p l, largest l over rows of positive probability, max |c1| (piecewise), P0-mass
    of the rows that are misclassified or can be (0/1), rows of positive probability with a
    finite a (0/1), P0-mass of the rows that can never be misclassified (0/1: correct, no
    finite a))."""
    l0 = oracle.loss0 if oracle.loss0 is not None else oracle.c1.max(axis=1, initial=-np.inf)
    live = np.ones(l0.size, dtype=bool) if oracle.p is None else oracle.p > 0
    q = np.ones(l0.size) if oracle.p is None else oracle.p
    a = getattr(oracle, "a", None)
    fin = np.zeros(l0.size, dtype=bool) if a is None else np.isfinite(a)
    stuck = live & ~fin & (l0 == 0)
    return (float(np.dot(q, l0)), float(l0[live].max()) if live.any() else -math.inf,
            float(getattr(oracle, "c1abs", 0.0)),
            float(np.dot(q, l0 + (fin & (l0 == 0)))), int(np.count_nonzero(fin & live)),
            float(np.sum(q[stuck])) if a is not None else 0.0)


def _weights(lh, theta2, divergence, wpar):
    """The weights of Q* from l_h: exp((l - T)/theta2) (KL, ``wpar`` = T), the chi2 weights
    (``wpar`` = alpha), or 1 (theta2 = inf)."""
    if math.isinf(theta2):
        return np.ones_like(lh)
    if divergence == "kl":
        return np.exp(np.maximum((lh - wpar) / theta2, -700.0))
    return np.maximum((lh + wpar) / (2.0 * theta2) + 1.0, 0.0)


def _block_atoms(spec, s, y, p, h, theta2, divergence, wpar, budget):
    """The main atoms of one block and its split row: ``(red, w, piece, mass, d_lo, gain,
    split)``; ``budget`` is the risk (in P0-mass units) this block's tied rows must add by
    moving to their high piece (None: only the block's totals are wanted); ``split`` is
    ``(local row, fraction moved)`` or None."""
    red, oracle = spec.oracle(s, y, p)
    lh, k_lo, d_lo, k_hi, d_hi = spec.scan(oracle, h)
    w = _weights(lh, theta2, divergence, wpar)
    pw = w if p is None else p * w
    gain = pw * (d_hi - d_lo)
    cand = np.nonzero(gain > 0)[0]
    frac = np.zeros(s.size)
    cg = np.cumsum(gain[cand])
    if budget is None:
        return red, w, None, None, float(np.dot(pw, d_lo)), float(cg[-1]) if cg.size else 0.0
    if budget > 0 and cand.size and h > 0:
        full = cg <= budget * (1 + 1e-15 if spec.zero_one else 1.0)  # as _move_plan
        frac[cand[full]] = 1.0
        nxt = int(np.count_nonzero(full))
        if nxt < cand.size:
            before = cg[nxt - 1] if nxt > 0 else 0.0
            frac[cand[nxt]] = min(max((budget - before) / gain[cand[nxt]], 0.0), 1.0)
    rows = np.nonzero((frac > 0) & (frac < 1))[0]
    piece = np.where(frac >= 1.0, k_hi, k_lo)
    mass = np.where((frac > 0) & (frac < 1), 1.0 - frac, 1.0)
    split = [(int(i), float(frac[i]), int(k_hi[i])) for i in rows]
    return red, w, piece, mass, lh, split


def _block_totals(spec, s, y, p, h, theta2, divergence, wpar):
    """(sum p w d_lo, total tie gain) of one block (the tie split's first pass)."""
    out = _block_atoms(spec, s, y, p, h, theta2, divergence, wpar, None)
    return out[4], out[5]


def _atom_sums(spec, red, s, y, p, src, piece, mass, w, h, divergence):
    """(sum pm w moved2, sum pm phi(w), sum pm w l*, sum pm w, sum pm l*) of some atoms,
    with ``pm`` the atom's P0-mass (its mass times p, or its mass), and l*, moved2."""
    shift, moved2 = red.moves(spec.scorer.W, src, piece, h)  # (one evaluation of both)
    sc = s[src] if shift is None else s[src] + shift
    loss_star = spec.problem(s, y).losses_from_scores(sc, y[src])
    pm = mass if p is None else mass * p[src]
    pmw = pm * w
    sums = (float(np.dot(pmw, moved2)), float(np.dot(pm, phi(w, divergence))),
            float(np.dot(pmw, loss_star)), float(np.sum(pmw)), float(np.dot(pm, loss_star)))
    return sums, loss_star, moved2


def _block_audit(spec, s, y, p, h, theta2, divergence, wpar, budget, picks):
    """The audit sums of one block's atoms (its split atom included), the moments of the
    influence function and, for the rows ``picks``, what the sampled check needs."""
    red, w, piece, mass, lh, split = _block_atoms(spec, s, y, p, h, theta2, divergence, wpar,
                                                  budget)
    m = s.size
    rows = np.arange(m)
    sums, loss_star, moved2 = _atom_sums(spec, red, s, y, p, rows, piece, mass, w, h,
                                         divergence)
    if split:
        i, f, k = split[0]
        extra, _, _ = _atom_sums(spec, red, s, y, p, np.array([i]), np.array([k]),
                                 np.array([f]), w[i:i + 1], h, divergence)
        sums = tuple(a + b for a, b in zip(sums, extra))
    l0 = spec.problem(s, y).losses_from_scores(s, y)
    base = float(np.sum(l0)) if p is None else float(np.dot(p, l0))
    # the influence function is -theta2 (v - E v), v = w (KL), w^2 (chi2), or -(l_h - E l_h)
    v = lh if math.isinf(theta2) else (w - 1.0 if divergence == "kl" else w * w - 1.0)
    q = np.ones(m) if p is None else p
    moments = (float(np.dot(q, v)), float(np.dot(q * q, v * v)), float(np.dot(q * q, v)),
               float(np.dot(q, q)), float(np.dot(q, l0 * l0)), float(np.dot(q, w)),
               float(np.dot(q, w * w)))
    sample = (picks, piece[picks], loss_star[picks], moved2[picks], s[picks], y[picks])
    return sums, base, moments, split, sample


def _block_frame(spec, s, y, p, h, theta2, divergence, wpar, budget, xblock, fp, k, names,
                 include_x, start):
    """Q*'s main atoms of one block as a DataFrame (moved x, weight, mass, source)."""
    import pandas as pd

    xblock = np.asarray(xblock, dtype=np.float64)
    if scale.block_fingerprint(xblock) != fp:
        raise scale.DataChangedError(f"the data of block {k} changed since it was certified")
    red, w, piece, mass, _, _ = _block_atoms(spec, s, y, p, h, theta2, divergence, wpar,
                                             budget)
    rows = np.arange(s.size)
    delta = red.displacement(rows, piece, h)
    xs = xblock if delta is None else xblock + delta
    data = {c: xs[:, j] for j, c in enumerate(names)}
    if include_x:
        data.update({f"{c}_0": xblock[:, j] for j, c in enumerate(names)})
    data.update({"weight": w, "mass": mass, "source": rows + start})
    return pd.DataFrame(data, index=pd.RangeIndex(start, start + s.size))


# ---------------------------------------------------------------------------------------------
# the client side


class _Blocks:
    """Scores, labels and probabilities persisted on the workers, one chunk per block
    (:func:`otstab.scale.prepare_distributed`)."""

    def __init__(self, spec, data, offsets):
        self.spec, self.offsets = spec, offsets
        self.parts = list(data.to_delayed().ravel())
        self.weighted = data.shape[0] == 3
        self.data = data  # keeps the persisted blocks alive

    def __len__(self):
        return len(self.parts)

    def run(self, func, *args):
        """``func(block oracle, *args)`` on every block (for :class:`BlockwiseDual`)."""
        return self.each(_on_block, func, args)

    def each(self, func, *args, per_block=None):
        """``func(spec, s, y, p, *args, *per_block[k])`` on every block k."""
        import dask

        per_block = per_block or [()] * len(self.parts)
        tasks = [dask.delayed(_unpacked)(func, self.spec, part, args, extra)
                 for part, extra in zip(self.parts, per_block)]
        return list(dask.compute(*tasks))


def _unpacked(func, spec, part, args, extra):
    """``func(spec, s, y, p, *args, *extra)`` on one persisted (2 or 3, m) chunk."""
    return func(spec, part[0], part[1], part[2] if part.shape[0] == 3 else None, *args, *extra)


def certify_distributed(model, X, y, *, loss, r, theta1=1.0, theta2=0.25, divergence="kl",
                        solver="auto", features=None, sample_weight=None,
                        **solver_options) -> StabilityResult:
    """:func:`otstab.certify` for a Dask ``X`` with the solve distributed (module docstring).

    Supports linear models (binary classifiers with a margin loss, regressors with a residual
    loss: hinge, absolute, pinball, epsilon-insensitive, ...), both divergences, finite and
    infinite prices, ``features`` and ``sample_weight`` (a Dask array or Series aligned with
    X's rows, or a NumPy array). ``solver``: "auto" or "dual"; options ``tol``, ``max_iter``.
    The SE (``res.se``) is the influence-function SE, summed blockwise.
    """
    t_start = time.perf_counter()
    r, theta1, theta2, divergence = check_common(r, theta1, theta2, divergence, solver)
    solver = solver.lower()
    if solver not in ("auto", "dual"):
        raise ValidationError(f"the distributed path solves the dual only; solver must be "
                              f"'auto' or 'dual', got {solver!r}")
    check_options(solver_options, DUAL_OPTIONS[:2], "the distributed dual")
    loss_obj = get_loss(loss)
    if not scale.is_dask(X):
        raise InputTypeError(f"certify_distributed needs a Dask X, got {type(X).__name__}")
    scorer = linear_scorer(model) if not hasattr(model, "steps") else None
    if scorer is None:
        raise InputTypeError(
            f"Dask input needs a linear model (otstab.LinearModel or a fitted scikit-learn "
            f"linear model, not {type(model).__name__})")
    if not isinstance(loss_obj, (PiecewiseLinear, ZeroOne)):
        raise InputTypeError(
            f"the distributed path supports piecewise-linear margin and residual losses "
            f"(hinge, absolute, pinball, ...) and the 0/1 loss, not {loss_obj.name!r}; use "
            "otstab.certify, which solves on the gathered scores")
    if isinstance(loss_obj, ZeroOne) and r > 1.0:
        raise ValidationError(
            f"r is an error rate for loss='zero_one' and must be in [0, 1], got {r}")
    check_loss_fits(loss_obj, scorer.task, type(model).__name__)
    Xr, names, data = scale.prepare_distributed(X, y, sample_weight, scorer,
                                                fitted_feature_names(model))
    mask = feature_mask(len(names), features, names)
    spec = _Spec(scorer, loss_obj, theta1, mask)
    blocks = _Blocks(spec, data, Xr.offsets)
    n = Xr.shape[0]
    N = 1.0 if blocks.weighted else float(n)
    parts = blocks.run(_block_base)
    base = sum(q[0] for q in parts) / N
    spec.c1abs = max(q[2] for q in parts)
    oracle = bw.BlockwiseDual(blocks.run, n, N)
    oracle.passes = 1
    ctx = dict(prob_X=Xr, names=names, blocks=blocks, n=n, N=N, r=r, theta1=theta1,
               theta2=theta2, divergence=divergence, base=base, t_start=t_start,
               loss=loss_obj.name, oracle=oracle, weighted=blocks.weighted)
    edge = _edge(spec, r, base, parts, theta1, theta2, N)
    if edge is not None:
        return _edge_result(edge, ctx)
    opts = {k: v for k, v in solver_options.items() if k in ("tol", "max_iter")}

    def run_dual():
        sol = solve_dual(oracle, r, theta2, divergence, **opts)
        if sol.status != OPTIMAL:
            raise audit.Skip(f"dual reported {sol.native_status!r}", sol.status)
        return _build(sol, ctx), True, 0.0

    res = audit.first_accepted([("dual", run_dual)], solver=solver)
    res.info["passes_over_scores"] = oracle.passes
    return res


def _edge(spec, r, base, parts, theta1, theta2, N):
    """The thresholds decided before solving (as :func:`otstab.piecewise.edge_kind` and the 0/1
    path), from the blockwise base risk (``parts``: :func:`_block_base` of every block)."""
    if audit.reached(r, base):
        return "zero", f"r = {r:g} <= base risk {base:.6g}: no perturbation is needed"
    lmax = max(q[1] for q in parts)
    if spec.zero_one:
        # the largest error rate moving reaches: 1 less the mass of the rows that cannot be
        # misclassified (exactly 1 when there are none; a sum of the other rows' weights over
        # their total may round to 1 - 1 ulp)
        stuck = sum(q[5] for q in parts)
        if math.isinf(theta2) and stuck > 0 and r > 1.0 - stuck / N:
            return "unreachable", (f"r = {r:g} exceeds the largest error rate reachable by "
                                   "moving samples alone (theta2 = inf and some samples "
                                   "cannot be moved)")
        if base == 0.0 and not sum(q[4] for q in parts):
            return "unreachable", ("no sample is misclassified and none can be moved "
                                   "(theta1 = inf, a zero model or masked features)")
        if r >= 1.0:
            raise NotDistributed("r = 1 for the 0/1 loss (every sample misclassified) is not "
                                 "solved by the distributed path: certify it with "
                                 "otstab.certify")
        return None
    red0 = reduce_problem(spec.problem(np.zeros(1), np.ones(1)), theta1, spec.mask)
    if bool(np.any(red0.c2 > 0)):  # some sample can move at a finite price
        return None
    if math.isinf(theta2) or r > lmax * (1 + 1e-12):
        return "unreachable", (f"no perturbation of the allowed kind can raise the risk to "
                               f"r = {r:g} (base risk {base:.6g}, largest loss {lmax:.6g}; "
                               "samples cannot move)")
    if r >= lmax * (1 - 1e-12):
        raise NotDistributed("r equals the largest loss with samples unable to move (the "
                             "limit case h -> inf): certify it with otstab.certify, which "
                             "solves it on the gathered scores")
    return None


def _edge_result(edge, ctx):
    kind, message = edge
    h = 0.0 if kind == "zero" else math.nan
    value = 0.0 if kind == "zero" else math.inf
    res = _result(ctx, value=value, h=h, alpha=0.0 if ctx["divergence"] == "chi2" else None,
                  wpar=None, theta2=math.inf, budgets=None, solver="none", status=kind,
                  message=message)
    res.info["edge_case"] = kind
    audit.mark_edge(res, kind)
    return res


def _build(sol, ctx):
    """Q* at ``sol.h``, audited blockwise (the candidate for :func:`otstab.audit.accept`)."""
    oracle, blocks = ctx["oracle"], ctx["blocks"]
    theta2, divergence, r, N = ctx["theta2"], ctx["divergence"], ctx["r"], ctx["N"]
    h = float(sol.h)
    alpha = None
    if math.isinf(theta2):
        wpar, term = None, oracle.top(h)[1] / N
        alpha = None if divergence == "kl" else 0.0
    elif divergence == "kl":
        wpar = term = oracle.kl(h, "right", theta2)[0]
    else:
        term, _, _, alpha = oracle.chi2(h, "right", theta2)[:4]
        wpar = alpha
    value = min(max(h * r - term, float(sol.value)), h * r)
    totals = blocks.each(_block_totals, h, theta2, divergence, wpar)
    oracle.passes += 1
    need = N * r - sum(t[0] for t in totals)
    budgets, before = [], 0.0
    for _, g in totals:  # tied rows move in row order, as in build_result
        budgets.append(min(max(need - before, 0.0), g) if need > 0 else 0.0)
        before += g
    return _result(ctx, value=value, h=h, alpha=alpha, wpar=wpar, theta2=theta2,
                   budgets=budgets, sol=sol, solver="dual_blockwise", status="candidate",
                   message="")


def _result(ctx, *, value, h, alpha, wpar, theta2, budgets, sol=None, solver, status,
            message):
    """The blockwise audit pass, the sampled model check and the (lazy) result."""
    blocks, n, N = ctx["blocks"], ctx["n"], ctx["N"]
    divergence = ctx["divergence"]
    hh = 0.0 if not math.isfinite(h) else h
    budgets = budgets or [0.0] * len(blocks)
    offsets = blocks.offsets
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(n, size=min(AUDIT_SAMPLE, n), replace=False))
    blk = np.searchsorted(offsets, pick, side="right") - 1
    per_block = [(budgets[k], pick[blk == k] - offsets[k]) for k in range(len(blocks))]
    parts = blocks.each(_block_audit, hh, theta2, divergence, wpar, per_block=per_block)
    ctx["oracle"].passes += 1
    sums = np.sum([q[0] for q in parts], axis=0)
    base = sum(q[1] for q in parts) / N
    mom = np.sum([q[2] for q in parts], axis=0)
    split = [(int(offsets[k]) + i, f, kk) for k, q in enumerate(parts) for (i, f, kk) in q[3]]
    move, rew, risk, tm, moved_risk = (float(x) / N for x in sums)
    theta1 = ctx["theta1"]
    move_cost = 0.0 if math.isinf(theta1) else theta1 * move
    rew_cost = 0.0 if math.isinf(ctx["theta2"]) else ctx["theta2"] * rew
    out = audit.summarise(np.array([base]), move_cost, rew_cost, risk, tm, moved_risk, value)
    err = _sampled_check(ctx, parts, offsets, hh)
    if err > SAMPLED_RTOL:
        out["primal_cost"] = out["gap"] = math.inf
    if status == "unreachable":
        out["primal_cost"], out["gap"] = math.nan, math.nan
    out["loss_star"] = out["loss_base"] = None
    spec = blocks.spec
    qargs = (hh, theta2, divergence, wpar, budgets, split)
    res = StabilityResult(
        value=value, h=h, alpha=alpha, X_star=None, weights=None, source=None, mass=None,
        solver=solver, status=status, solve_time=sol.solve_time if sol else 0.0,
        r=ctx["r"], theta1=theta1, theta2=ctx["theta2"], divergence=divergence,
        loss=ctx["loss"], message=message,
        dual_gap_bound=sol.gap_bound if sol else 0.0, iterations=sol.iterations if sol else 0,
        split=bool(split), X=ctx["prob_X"], feature_names=ctx["names"], **out,
        info={"solver_value": sol.value if sol else value,
              "native_status": sol.native_status if sol else status,
              "wall_time": time.perf_counter() - ctx["t_start"], "distributed": True,
              "audit": {"method": "blockwise", "sample": int(pick.size),
                        "max_rel_error": err},
              "qstar": lambda include_x=False: _qstar(res, blocks, spec, qargs, include_x)},
    )
    _lazy_atoms(res, blocks, qargs)
    res.inference = _inference(res, mom, n, ctx["weighted"])
    return res


def _sampled_check(ctx, parts, offsets, h) -> float:
    """Largest relative disagreement, on the sampled rows, between the loss and squared move
    of the reduced form and those of the moved point re-scored by the model."""
    spec = ctx["blocks"].spec
    rows = np.concatenate([q[4][0] + offsets[k] for k, q in enumerate(parts)])
    if not rows.size:
        return 0.0
    piece, loss_star, moved2, s, y = (np.concatenate([q[4][j] for q in parts])
                                      for j in range(1, 6))
    Xg = ctx["prob_X"].take(rows)  # fingerprints checked
    prob = spec.problem(s, y)
    red = spec.oracle(s, y, None)[0]
    delta = red.displacement(np.arange(rows.size), piece, h)
    Xs = Xg if delta is None else Xg + delta
    direct, d2 = audit.rescored(prob.losses, y, Xg, Xs)  # the model's own scores at x*
    return audit.sampled_error(direct, loss_star, d2, moved2)


def _inference(res, mom, n, weighted) -> Inference:
    """The influence-function SE from blockwise moments (as :func:`otstab.inference.analytic`:
    IF = -theta2 (v - E v), v = w (KL) or w^2 (chi2); -(l_h - E l_h) when theta2 = inf)."""
    sv, sqv2, sqv, sq2, sl2, sw, sw2 = (float(x) for x in mom)
    notes = []
    if res.status == "unreachable" or not math.isfinite(res.value):
        return Inference(method="influence", se=math.inf, value=float(res.value), n=n,
                         reliable=False, note="r is unreachable on this sample (R = inf)")
    scale_ = 1.0 if math.isinf(res.theta2) else res.theta2
    if res.status == "zero":
        se = 0.0
    elif not weighted:
        se = scale_ * math.sqrt(max(sqv2 / n - (sv / n) ** 2, 0.0)) / math.sqrt(n)
    else:  # sqrt(sum p^2 (v - c)^2), c = sum p v
        c = sv
        se = scale_ * math.sqrt(max(sqv2 - 2.0 * c * sqv + c * c * sq2, 0.0))
    if n < 100:
        notes.append(f"only {n} evaluation rows")
    return Inference(method="influence", se=se, value=float(res.value), n=n,
                     reliable=not notes, note="; ".join(notes))


def _qstar(res, blocks, spec, qargs, include_x):
    """Q* as a lazy Dask DataFrame (:func:`otstab.scale.qstar`)."""
    import dask
    import dask.dataframe as dd
    import pandas as pd

    h, theta2, divergence, wpar, budgets, split = qargs
    X = res.X
    names = [str(c) for c in res.feature_names]
    parts = []
    for k in range(len(blocks)):
        parts.append(dask.delayed(_unpacked)(
            _block_frame, spec, blocks.parts[k],
            (h, theta2, divergence, wpar, budgets[k], X.array.blocks[k], X.fingerprints[k], k,
             names, include_x, int(X.offsets[k])), ()))
    for j, (row, f, piece) in enumerate(split):  # the split atom: its row's high piece
        k = int(np.searchsorted(X.offsets, row, side="right") - 1)
        parts.append(dask.delayed(_unpacked)(
            _split_frame, spec, blocks.parts[k],
            (h, theta2, divergence, wpar, X.array.blocks[k], X.fingerprints[k], k,
             row - int(X.offsets[k]), f, piece, names, include_x, row, X.shape[0] + j), ()))
    cols = names + ([f"{c}_0" for c in names] if include_x else []) + ["weight", "mass",
                                                                        "source"]
    meta = pd.DataFrame({c: pd.Series(dtype=np.float64) for c in cols[:-1]} | {
        "source": pd.Series(dtype=np.int64)}, columns=cols)
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


def _split_frame(spec, s, y, p, h, theta2, divergence, wpar, xblock, fp, k, i, f, piece,
                 names, include_x, row, atom):
    """Q*'s split atom (row ``row``, local row ``i`` of block ``k``, on its high piece)."""
    import pandas as pd

    xblock = np.asarray(xblock, dtype=np.float64)
    if scale.block_fingerprint(xblock) != fp:
        raise scale.DataChangedError(f"the data of block {k} changed since it was certified")
    red, w = _block_atoms(spec, s, y, p, h, theta2, divergence, wpar, None)[:2]
    xrow = xblock[i:i + 1]
    delta = red.displacement(np.array([i]), np.array([piece]), h)
    xs = xrow if delta is None else xrow + delta
    data = {c: xs[:, j] for j, c in enumerate(names)}
    if include_x:
        data.update({f"{c}_0": xrow[:, j] for j, c in enumerate(names)})
    data.update({"weight": w[i:i + 1], "mass": [f], "source": [row]})
    return pd.DataFrame(data, index=pd.RangeIndex(atom, atom + 1))


def _block_losses(spec, s, y, p, h, theta2, divergence, wpar, budget):
    """(loss at the data, loss at the main atoms, loss at the split atoms) of one block."""
    red, w, piece, mass, _, split = _block_atoms(spec, s, y, p, h, theta2, divergence, wpar,
                                                 budget)
    rows = np.arange(s.size)
    src = np.concatenate([rows, [i for i, _, _ in split]]).astype(np.intp)
    pieces = np.concatenate([piece, [k for _, _, k in split]]).astype(np.intp)
    loss_star = _atom_sums(spec, red, s, y, p, src, pieces, np.ones(src.size),
                           np.ones(src.size), h, divergence)[1]
    return spec.problem(s, y).losses_from_scores(s, y), loss_star[:s.size], loss_star[s.size:]


class Gathered:
    """A per-row vector of a distributed result, gathered on first use (``np.asarray``,
    indexing, ``len``)."""

    def __init__(self, build, n):
        self._build, self._value, self.shape, self.size = build, None, (n,), n

    def _get(self):
        if self._value is None:
            self._value = self._build()
        return self._value

    def __array__(self, dtype=None, copy=None):
        v = self._get()
        return v if dtype is None else v.astype(dtype)

    def __getitem__(self, key):
        return self._get()[key]

    def __len__(self):
        return self.shape[0]


def _lazy_atoms(res, blocks, qargs):
    """``X_star``, ``weights``, ``source``, ``mass``, ``loss_star`` and ``loss_base`` gathered
    on first access (Q* from :func:`otstab.scale.qstar`, the losses blockwise)."""
    cache = {}
    h, theta2, divergence, wpar, budgets, _ = qargs

    def frame():
        if "df" not in cache:
            cache["df"] = res.info["qstar"]().compute()
        return cache["df"]

    def losses():
        if "losses" not in cache:
            parts = blocks.each(_block_losses, h, theta2, divergence, wpar,
                                per_block=[(b,) for b in budgets])
            cache["losses"] = (np.concatenate([q[0] for q in parts]),
                               np.concatenate([q[1] for q in parts] + [q[2] for q in parts]))
        return cache["losses"]

    res.X_star = lambda: frame()[[str(c) for c in res.feature_names]].to_numpy()
    res.weights = lambda: frame()["weight"].to_numpy()
    res.source = lambda: frame()["source"].to_numpy()
    res.mass = lambda: frame()["mass"].to_numpy()
    res.loss_star = lambda: losses()[1]
    res.loss_base = Gathered(lambda: losses()[0], res.n)
