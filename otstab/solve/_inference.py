"""Sampling uncertainty of R(beta, r): the influence-function SE and the bootstrap.

R is computed on a finite evaluation sample P_n; users read it as a property of the model in
the population P. Two estimates of its sampling error (``docs/inference.md``):

**Influence function** (default, one pass over the weights of Q*). The dual value is a sup over
``(h, alpha)`` of a functional of P_n; at a unique optimum the envelope theorem gives its
derivative towards a point mass at ``z`` by differentiating at the fixed optimum:

- KL:           ``IF(z) = -theta2 (w*(z) - 1)`` (``w*`` the likelihood ratio of Q*)
- chi2:         ``IF(z) = -theta2 (w*(z)^2 - E w*^2)``
- theta2 = inf: ``IF(z) = -(l_h(z) - E l_h)`` with ``l_h(z) = h l(z*) - theta1 |z* - z|^2``

(the 0/1 loss is the case ``l_h = (h - theta1 d*)_+``; the limit case r = largest loss, where
``R = -theta2 log p`` or ``theta2 (1/p - 1)``, falls under the same formulas). Then
``se = sd(IF) / sqrt(n)`` and the interval is ``R +- z se`` (clipped at 0). With sample
weights (P0 = sum_i p_i delta_{z_i}, a ratio estimator) the expectations are p-weighted, the
influence of row i on the estimate is ``n p_i IF(z_i)`` and ``se = sqrt(sum_i p_i^2 IF_i^2)``
(docs/inference.md derives it; equal weights give ``sd(IF) / sqrt(n)``).

**Bootstrap** (``certify(..., se="bootstrap")`` or :class:`Bootstrap`): rows are resampled
with replacement and R re-solved per replicate on the already validated arrays: the
specialised dual on the resampled reduced form (piecewise-linear losses of linear models), the
exact 0/1 dual on the resampled distances (0/1 loss of linear classifiers), the model's own
path on the resampled rows otherwise. Sample weights travel with their rows: each replicate
is the weighted problem on the resampled rows with their weights (renormalised). Percentile or
BCa intervals (the BCa acceleration from the influence function).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from otstab_solvers.dual import oracle_for, solve_dual
from otstab_solvers.result import OPTIMAL

from .._progress import progress_bar
from .._stats import z_value
from .._validation import check_level, check_random_state, renamed_kwargs
from ..errors import ValidationError
from ..modeling import _fingerprint as fingerprint
from ..modeling._losses import MulticlassHinge, PiecewiseLinear, ZeroOne
from ..modeling._models import Problem
from ..modeling._reduction import reduce_problem
from ._piecewise import edge_case, solve_reduced
from ._smooth import certify_smooth
from ._zero_one import (
    certify_distances,
    certify_zero_one_problem,
    certify_zero_one_search,
    linear_distances,
)

__all__ = ["Inference", "Bootstrap", "influence", "analytic", "bootstrap", "replicator",
           "resample", "check_level", "resolve_se", "INTERVALS", "DOUBT_SE", "MIN_ROWS"]

INTERVALS = ("percentile", "bca")
#: r within this many standard errors of the base risk: the normal approximation is doubtful
DOUBT_SE = 3.0
#: effective sample size of the weights of Q* below which the approximation is doubtful
MIN_EFFECTIVE_N = 50.0
#: fewer evaluation rows than this: no sampling error can be estimated (one row: every
#: resample is that row, and sd(IF) = 0; two: three distinct resamples), so se = inf and the
#: interval is (0, inf) rather than a zero-width promise
MIN_ROWS = 3


@dataclass
class Inference:
    """Sampling uncertainty of one value of R.

    Attributes
    ----------
    method : "influence" or "bootstrap"
    se : float
        Standard error (``inf`` for an unreachable threshold).
    value : float
        The value the interval is centred on (R of the result).
    n : int
        Evaluation rows.
    reliable : bool
        False when the normal approximation (or any resampling interval) is doubtful; ``note``
        says why.
    note : str
    replicates : array or None
        Bootstrap values of R (``method == "bootstrap"``).
    interval : "normal", "percentile" or "bca"
    acceleration : float
        BCa acceleration ``sum IF^3 / (6 (sum IF^2)^1.5)``.
    """

    method: str
    se: float
    value: float
    n: int
    reliable: bool = True
    note: str = ""
    replicates: np.ndarray | None = None
    interval: str = "normal"
    acceleration: float = 0.0
    seed: int | None = None

    def _quantile(self, p: float) -> float:
        """The bootstrap quantile at ``p`` (percentile) or its BCa adjustment (over the
        replicates that have a value: a draw of zero-weight rows only has none, nan)."""
        assert self.replicates is not None, "a bootstrap Inference has its replicates"
        reps = self.replicates[~np.isnan(self.replicates)]
        if self.interval == "bca":
            below = np.mean(reps < self.value) + 0.5 * np.mean(reps == self.value)
            below = min(max(below, 0.5 / reps.size), 1 - 0.5 / reps.size)
            z0 = NormalDist().inv_cdf(below)
            zp = NormalDist().inv_cdf(p)
            a = self.acceleration
            p = NormalDist().cdf(z0 + (z0 + zp) / (1 - a * (z0 + zp)))
        return float(np.quantile(reps, p))

    def _no_information(self) -> bool:
        """Fewer than :data:`MIN_ROWS` rows: the interval is (0, inf)."""
        return self.n < MIN_ROWS and not math.isnan(self.value)

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """Two-sided interval ``(low, high)`` at ``level``."""
        level = check_level(level)
        if self._no_information():
            return 0.0, math.inf
        if self.method == "bootstrap":
            return self._quantile((1 - level) / 2), self._quantile((1 + level) / 2)
        if math.isinf(self.se):
            return 0.0, math.inf
        z = z_value(level)
        return max(self.value - z * self.se, 0.0), self.value + z * self.se

    def lower_confidence_bound(self, level: float = 0.95) -> float:
        """One-sided bound: R >= this with probability ``level`` (for gating)."""
        level = check_level(level)
        if self._no_information():
            return 0.0
        if self.method == "bootstrap":
            return self._quantile(1 - level)
        if math.isinf(self.se):
            return 0.0
        return max(self.value - z_value(level, two_sided=False) * self.se, 0.0)

    def to_dict(self, level: float = 0.95) -> dict:
        """The record of a certificate: method, level, se, interval and one-sided bound."""
        lo, hi = self.ci(level)
        return {"method": self.method, "interval": self.interval, "level": float(level),
                "se": self.se, "ci_low": lo, "ci_high": hi,
                "lower_bound": self.lower_confidence_bound(level),
                "n_boot": 0 if self.replicates is None else int(self.replicates.size),
                "seed": None if self.seed is None else int(self.seed),
                "reliable": bool(self.reliable), "note": self.note}

    def spec(self):
        """What re-creates this estimate in ``certify(..., se=...)``."""
        if self.method != "bootstrap":
            return "analytic"
        return Bootstrap(n_resamples=int(self.replicates.size), random_state=int(self.seed),
                         interval=self.interval)


@dataclass(frozen=True, init=False)
class Bootstrap:
    """Bootstrap settings for ``certify(..., se=Bootstrap(...))``.

    n_resamples : replicates (formerly ``n_boot``); random_state : the int seed of the
    resampling (formerly ``seed``; an int, recorded in certificates so that the replicates can
    be replayed); interval : "percentile" or "bca"; progress : a progress bar on stderr.
    """

    n_resamples: int = 200
    random_state: int = 0
    interval: str = "percentile"
    progress: bool = False

    @renamed_kwargs(n_boot="n_resamples", seed="random_state")
    def __init__(self, n_resamples: int = 200, random_state: int = 0,
                 interval: str = "percentile", progress: bool = False):
        for name, value in (("n_resamples", n_resamples), ("random_state", random_state),
                            ("interval", interval), ("progress", progress)):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self):
        if isinstance(self.n_resamples, bool) or not isinstance(
                self.n_resamples, (int, np.integer)) or self.n_resamples < 2:
            raise ValidationError(
                f"n_resamples must be an integer >= 2, got {self.n_resamples!r}")
        if self.interval not in INTERVALS:
            raise ValidationError(f"interval must be one of {INTERVALS}, got {self.interval!r}")
        if isinstance(self.random_state, bool) or not isinstance(
                self.random_state, (int, np.integer)) or self.random_state < 0:
            raise ValidationError("random_state of a Bootstrap must be a non-negative int (it "
                                  f"is recorded to replay the replicates), got "
                                  f"{self.random_state!r}")

    @property
    def n_boot(self) -> int:
        """The former name of ``n_resamples``."""
        return self.n_resamples

    @property
    def seed(self) -> int:
        """The former name of ``random_state``."""
        return self.random_state


def resolve_se(se):
    """``se=`` of certify: "analytic" (default), "bootstrap", a :class:`Bootstrap`, or None."""
    if se is None or isinstance(se, Bootstrap):
        return se
    if isinstance(se, str) and se.lower() in ("analytic", "influence"):
        return "analytic"
    if isinstance(se, str) and se.lower() == "bootstrap":
        return Bootstrap()
    raise ValidationError("se must be 'analytic', 'bootstrap', an "
                          f"otstab.inference.Bootstrap(...) or None, got {se!r}")


# ----------------------------------------------------------------------------------------------
# influence function


def _per_sample(res, atom_values) -> np.ndarray:
    """Mass-weighted sum over the atoms of each sample (both atoms of a split sample carry the
    same l_h and weight, so this is the sample's value)."""
    return np.bincount(np.asarray(res.source), weights=np.asarray(res.mass) * atom_values,
                       minlength=res.n)


def _lh(res) -> np.ndarray:
    """l_h(z_i) per sample, recovered from Q*: ``h loss(x*) - theta1 |x* - x_i|^2``."""
    dstar = res.info.get("dstar") if isinstance(res.info, dict) else None
    if dstar is not None:  # 0/1 loss: l_h = (h - theta1 d*)_+ (d* = 0 when misclassified)
        a = np.asarray(dstar, dtype=float)
        if math.isinf(res.theta1):
            return res.h * np.asarray(res.loss_base, dtype=float)
        return np.maximum(res.h - res.theta1 * a, 0.0)
    vals = res.h * np.asarray(res.loss_star, dtype=float)
    if math.isfinite(res.theta1):
        moved2 = res.info.get("moved2") if isinstance(res.info, dict) else None
        if callable(moved2):  # built on first access (large n: Q* is kept compact)
            moved2 = res.info["moved2"] = moved2()
        if moved2 is None:  # paths that keep Q* as points
            fingerprint.check(res.X, "the influence function")  # X: the caller's array
            src = np.asarray(res.source)
            diff = np.asarray(res.X_star) - res.X[src]
            moved2 = np.einsum("ij,ij->i", diff, diff)
        vals = vals - res.theta1 * np.asarray(moved2, dtype=float)
    return _per_sample(res, vals)


def _probs(res):
    """The sample probabilities of a weighted result (None: uniform)."""
    return res.info.get("sample_weight") if isinstance(res.info, dict) else None


def _centred(v, p):
    return v - (v.mean() if p is None else float(np.dot(p, v)))


def influence(res) -> np.ndarray | None:
    """Empirical influence function of R at each evaluation sample (None when R = inf).

    ``R(P_n + eps (delta_z - P_n)) = R(P_n) + eps IF(z) + o(eps)`` (see the module docstring);
    with sample weights P_n is the weighted empirical distribution and the centring is
    p-weighted.
    """
    p = _probs(res)
    if res.status == "unreachable" or not math.isfinite(res.value):
        return None
    n = res.n
    if res.status == "zero":
        return np.zeros(n)
    if math.isinf(res.theta2):
        return -_centred(_lh(res), p)
    w = _per_sample(res, np.asarray(res.weights, dtype=float))
    if res.divergence == "kl":
        return -res.theta2 * _centred(w, p)
    return -res.theta2 * _centred(w * w, p)


def _notes(res, infl) -> list[str]:
    """Why the normal approximation may be doubtful for this result."""
    notes = []
    n = res.n
    lb = res.loss_base
    p = _probs(res)
    if lb is not None and n > 1 and math.isfinite(res.r):
        se_base = _mean_se(np.asarray(lb, dtype=float), p)
        if abs(res.r - res.risk_base) <= DOUBT_SE * se_base:
            notes.append(f"r is within {DOUBT_SE:g} standard errors of the base risk "
                         f"({res.risk_base:.4g} +- {se_base:.2g}): whether R is 0 in the "
                         "population is uncertain, the normal approximation is doubtful")
        top = float(np.max(lb)) if p is None else float(np.max(lb[p > 0]))
        if math.isinf(res.theta1) and lb.size and abs(res.r - top) <= DOUBT_SE * se_base:
            notes.append("r is close to the largest loss with samples unable to move: the "
                         "value depends on the few samples of largest loss")
    if res.h is not None and math.isinf(res.h):
        notes.append("limit case (h = inf): the value rests on the samples of largest loss")
    if res.status in ("optimal", "bounds") and math.isfinite(res.theta2) and infl is not None:
        # effective sample size of the P0-masses times the weights of Q*: (sum q)^2 / sum q^2
        # with q_i = p_i w_i (q_i = w_i without sample weights)
        w = _per_sample(res, np.asarray(res.weights, dtype=float))
        if p is not None:
            w = p * w
        s2 = float(w @ w)
        n_eff = float(w.sum()) ** 2 / s2 if s2 > 0 else 0.0
        if n_eff < MIN_EFFECTIVE_N:
            notes.append(f"the weights of Q* are concentrated (effective sample size "
                         f"{n_eff:.3g}): the normal approximation is doubtful")
    if n < MIN_ROWS:
        notes.append(_few_rows(n))
    elif n < 100:
        notes.append(f"only {n} evaluation rows")
    return notes


def _few_rows(n: int) -> str:
    return (f"only {n} evaluation row{'s' if n != 1 else ''}: no sampling error can be "
            f"estimated from fewer than {MIN_ROWS} (se = inf, interval (0, inf))")


def _mean_se(v: np.ndarray, p) -> float:
    """Standard error of the (p-weighted) mean of ``v``: ``sd(v) / sqrt(n)``, or
    ``sqrt(sum_i p_i^2 (v_i - sum_j p_j v_j)^2)`` (the same when p is uniform)."""
    if p is None:
        return float(np.std(v)) / math.sqrt(v.size) if v.size else math.nan
    return math.sqrt(float(np.dot(p * p, _centred(v, p) ** 2)))


def _acceleration(infl, p=None) -> float:
    """BCa acceleration ``sum a^3 / (6 (sum a^2)^1.5)`` of the per-row influences ``a`` on the
    estimate (``a_i = IF_i``, or ``n p_i IF_i`` with sample weights: the scale cancels)."""
    if infl is None:
        return 0.0
    if p is not None:
        infl = p * infl
    s2 = float(infl @ infl)
    return float(np.sum(infl ** 3)) / (6.0 * s2 ** 1.5) if s2 > 0 else 0.0


def analytic(res) -> Inference:
    """The influence-function SE of a certify result (one pass over Q*'s weights)."""
    infl = influence(res)
    n = res.n
    notes = []
    if infl is None:
        se = math.inf
        notes.append("r is unreachable on this sample (R = inf): the data say nothing about "
                     "how far from reachable it is in the population")
    else:
        # IF is centred (p-weighted with sample weights): this is sd(IF) / sqrt(n), or
        # sqrt(sum_i p_i^2 IF_i^2) for a weighted P0 (docs/inference.md)
        se = _mean_se(infl, _probs(res)) if n > 0 else math.nan
        if n < MIN_ROWS:
            se = math.inf
    notes += _notes(res, infl)
    if res.status == "bounds":
        notes.append("not exact: the SE is that of the found (upper) value, not of R")
    reliable = infl is not None and not notes
    if not reliable and infl is not None and n >= MIN_ROWS and res.status != "bounds":
        # (not for an interval: a bootstrap too would only re-estimate the found value, and
        # some interval paths refuse it)
        notes.append("prefer se='bootstrap'")
    return Inference(method="influence", se=se, value=float(res.value), n=n,
                     reliable=reliable, note="; ".join(notes))


# ----------------------------------------------------------------------------------------------
# bootstrap


def _subset(prob: Problem, idx: np.ndarray) -> Problem:
    """The problem on the rows ``idx`` (already validated arrays, no copy of the model); a
    sample weight travels with its row (renormalised over the rows drawn)."""
    # the cached losses at the data belong to the original rows: never carry them over
    extra = {k: v for k, v in prob.extra.items() if k not in ("base_losses", "loss_stats")}
    return dataclasses.replace(
        prob, X=prob.X[idx], y=prob.y[idx], y_original=np.asarray(prob.y_original)[idx],
        index=None, scores=None if prob.scores is None else prob.scores[idx],
        sample_weight=_drawn_weights(prob.p, idx), extra=extra)


def _drawn_weights(p, idx):
    """The probabilities of the rows ``idx`` (None without sample weights)."""
    if p is None:
        return None
    q = p[idx]
    return q / float(np.sum(q))


def _weighted_rows(p, value):
    """``value`` made nan on a draw of rows that all have zero weight (no distribution)."""
    if p is None:
        return value
    return lambda idx: value(idx) if np.any(p[idx] > 0) else math.nan


def replicator(prob: Problem, *, r, theta1, theta2, divergence, mask, solver, **options):
    """``value(idx)``: R on the rows ``idx`` of ``prob``, by the fastest exact path.

    Piecewise-linear losses of linear models: the specialised dual on the resampled reduced
    form (edge cases through :func:`otstab.piecewise.solve_reduced`); 0/1 loss of linear
    classifiers: the exact 0/1 dual on the resampled distances; otherwise the model's own path
    (smooth losses, nonlinear models: slower, one solve per replicate).
    """
    return _weighted_rows(prob.p, _replicator(prob, r=r, theta1=theta1, theta2=theta2,
                                              divergence=divergence, mask=mask, solver=solver,
                                              **options))


def _replicator(prob: Problem, *, r, theta1, theta2, divergence, mask, solver, **options):
    loss = prob.loss
    linear = prob.scorer is not None and solver != "first_order"
    if linear and isinstance(loss, ZeroOne) and prob.weights is not None:
        def value(idx):  # the exact 0/1 path of the weighted rows
            return certify_zero_one_problem(_subset(prob, idx), r, theta1, theta2, divergence,
                                            mask, solver, 0.0, **options).value
        return value
    if linear and isinstance(loss, ZeroOne):
        dstar, _ = linear_distances(prob, mask)
        loss0 = prob.losses(prob.X)
        dstar = np.where(loss0 > 0, 0.0, dstar)
        wrong = loss0 > 0

        def value(idx):
            return certify_distances(dstar[idx], r, theta1=theta1, theta2=theta2,
                                     divergence=divergence, misclassified=wrong[idx]).value
        return value
    if linear and isinstance(loss, (PiecewiseLinear, MulticlassHinge)):
        red = reduce_problem(prob, theta1, mask)
        shared_c2 = red.c2.shape[0] == 1

        def value(idx):
            c2 = red.c2 if shared_c2 else red.c2[idx]
            sub = dataclasses.replace(red, c1_dense=red.c1[idx], c2_dense=c2, rows=None,
                                      mrows=None)
            p = _drawn_weights(prob.p, idx)
            if edge_case(sub, r, theta2, p=p) is None and solver in ("auto", "dual"):
                sol = solve_dual(oracle_for(sub.c1, sub.c2), r, theta2, divergence, p=p)
                if sol.status == OPTIMAL:
                    return float(sol.value)
            sub_prob = _subset(prob, idx)
            return solve_reduced(sub_prob, reduce_problem(sub_prob, theta1, mask), r, theta1,
                                 theta2, divergence, solver, 0.0, **options).value
        return value
    if isinstance(loss, ZeroOne):
        def value(idx):
            return certify_zero_one_search(_subset(prob, idx), r=r, theta1=theta1,
                                           theta2=theta2, divergence=divergence, mask=mask,
                                           solver=solver, **options).value
        return value

    def value(idx):  # type: ignore[no-redef]  # one closure per branch
        return certify_smooth(_subset(prob, idx), r=r, theta1=theta1, theta2=theta2,
                              divergence=divergence, mask=mask, solver=solver,
                              **options).value
    return value


def resample(n: int, spec: Bootstrap, value) -> np.ndarray:
    """``spec.n_resamples`` values of ``value(idx)`` over rows resampled with replacement."""
    rng = check_random_state(spec.random_state)
    out = np.empty(spec.n_resamples)
    with progress_bar(spec.n_resamples, "bootstrap", bool(spec.progress)) as bar:
        for b in range(spec.n_resamples):
            out[b] = value(rng.integers(0, n, n))
            bar.update()
    return out


def bootstrap(res, replicates: np.ndarray, spec: Bootstrap) -> Inference:
    """The bootstrap :class:`Inference` of ``res`` from its replicate values."""
    reps = np.asarray(replicates, dtype=float)
    finite = reps[np.isfinite(reps)]
    notes = []
    empty = int(np.count_nonzero(np.isnan(reps)))
    if empty:
        notes.append(f"{empty} of {reps.size} replicates drew only rows of zero weight")
    if finite.size < reps.size - empty:
        notes.append(f"{reps.size - empty - finite.size} of {reps.size} replicates are "
                     "unreachable (R = inf)")
    se = float(np.std(finite, ddof=1)) if finite.size > 1 else math.inf
    if finite.size < reps.size / 2:
        se = math.inf
    if res.status == "bounds":
        notes.append("not exact: the replicates are found (upper) values, not R")
    if res.n < MIN_ROWS:  # the replicates repeat the rows: their spread is no sampling error
        notes.append(_few_rows(res.n))
        se = math.inf
    elif res.n < 100:
        notes.append(f"only {res.n} evaluation rows")
    base = analytic(res)
    return Inference(method="bootstrap", se=se, value=float(res.value), n=res.n,
                     reliable=not notes and res.status != "bounds", note="; ".join(notes),
                     replicates=reps, interval=spec.interval, seed=spec.seed,
                     acceleration=_acceleration(influence(res), _probs(res))
                     if base.se < math.inf else 0.0)
