"""``worst_case_risk``: the inverse question, the DRO view of the OT stability criterion.

:func:`otstab.certify` answers "how far to failure?": the smallest OT cost ``R(r)`` of a
perturbation that drives the risk up to ``r``. This module answers "how bad within a budget?":

    W(eps) = sup { E_Q[W l(X, Y)] : M_c(Q, P0) <= eps },

the largest risk any distribution within OT cost ``eps`` of the evaluation data can cause, with
the same lifted cost (moving priced by ``theta1``, reweighting by ``theta2`` via KL or chi2).

Math (docs/dro.md). ``certify`` solves the dual ``R(r) = sup_{h >= 0} h r - T(h)`` where
``T(h)`` is the convex conjugate term of the d-transform ``l_h`` (KL:
``theta2 log mean exp(l_h / theta2)``; chi2: the alpha-minimised term; ``theta2 = inf``: the
mean), with ``T(0) = 0`` and ``T'(0+) =`` the base risk. ``R`` is convex and nondecreasing, and by
Lagrangian duality

    W(eps) = inf_{h > 0} (eps + T(h)) / h,

whose minimiser solves ``G(h) := h T'(h) - T(h) = eps``; ``G`` is nondecreasing
(``G' = h T'' >= 0``), so the root is found by bisection on the exact oracles that ``certify``
uses (the piecewise-linear reduced form, the 0/1 distances, the exact smooth d-transforms).
Every ``h`` gives an upper bound ``(eps + T(h)) / h >= W``; the bisection closes on the root to
machine precision. The optimal ``h*`` is the dual optimum of ``certify`` at ``r = W(eps)`` and the
worst-case distribution is that certificate's ``Q*``: the result carries
``certify(r=W(eps))`` (audited as usual), whose value is ``eps`` up to rounding.

Limits: when the risk cannot grow without bound (samples cannot move, or the 0/1 loss) the
largest reachable risk ``W_sup`` is finite and costs ``eps_sup``; for ``eps >= eps_sup`` the
answer is ``W_sup`` (status ``capped``: the budget is not exhausted, the certificate's value is
``eps_sup <= eps``). ``eps = 0`` gives the base risk; ``eps = inf`` gives ``W_sup`` (``inf``
when the loss is unbounded and samples can move).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from otstab_solvers.dual import oracle_for
from otstab_solvers.weights import chi2_solution, kl_dual_term, kl_weights, pmean, support_max
from otstab_solvers.zero_one import DistanceOracle

from .._results import ResultMixin
from .._validation import check_scalar
from ..errors import IncompatibleLossError, SolverError, ValidationError
from ..modeling import _pipeline as pipeline
from ..modeling._costs import check_feature_costs, scaled_problem
from ..modeling._losses import MulticlassHinge, PiecewiseLinear, ZeroOne, get_loss
from ..modeling._models import resolve_model
from ..modeling._nonlinear import SMOOTH_LOSSES, loss_name
from ..modeling._params import check_common
from ..modeling._reduction import feature_mask, reduce_problem
from ..solve import _datacost_certify as datacost_certify
from ..solve._core import certify
from ..solve._results import StabilityResult
from ..solve._smooth import linear_smooth_oracle, margin_oracle
from ..solve._zero_one import linear_distances, move_prices

__all__ = ["worst_case_risk", "WorstCaseRisk", "dro_oracle"]

#: largest h tried while bracketing the root of G(h) = eps
H_CAP = 1e300
#: bisection steps (geometric while the bracket spans more than a factor 2, then arithmetic)
MAX_STEPS = 400


@dataclass(repr=False)
class WorstCaseRisk(ResultMixin):
    """The answer of :func:`worst_case_risk`.

    Attributes
    ----------
    risk : float
        ``W(eps)``, the largest risk within OT cost ``eps`` (``inf``: unbounded).
    eps : float
        The budget.
    risk_base : float
        The risk of the evaluation data itself (``W(0)``).
    h : float
        The optimal dual multiplier ``h*`` (``lambda = 1 / h*`` in the DRO literature); ``nan``
        when there is none (``eps = 0``, capped or unbounded answers).
    status : str
        ``optimal`` (the budget is used up: ``certificate.value == eps``), ``zero``
        (``eps = 0``), ``capped`` (``eps`` exceeds the cost ``eps_sup`` of the largest reachable
        risk, which is the answer; the certificate's value is ``eps_sup``), ``supremum`` (the
        largest reachable risk is approached but not attained; no certificate), ``unbounded``
        (``risk = inf``) or ``bounds`` (the certificate is not exact: multinomial
        cross-entropy above ``h_concave``; ``risk`` is then a lower bound).
    certificate : StabilityResult or None
        ``otstab.certify(..., r=risk)``: the worst-case distribution Q* (``X_star``,
        ``weights``, ``source``, ``mass``) and its audit.
    """

    risk: float
    eps: float
    risk_base: float
    h: float
    status: str
    theta1: float
    theta2: float
    divergence: str
    loss: str
    risk_sup: float = math.inf
    eps_sup: float = math.inf
    message: str = ""
    evaluations: int = 0
    solve_time: float = 0.0
    certificate: StabilityResult | None = field(default=None, repr=False)

    _repr_fields = ("risk", "eps", "risk_base", "h", "status", "loss", "theta1", "theta2",
                    "divergence", "risk_sup", "eps_sup")

    @property
    def X_star(self):
        return None if self.certificate is None else self.certificate.X_star

    @property
    def weights(self):
        return None if self.certificate is None else self.certificate.weights

    def to_frame(self) -> pd.DataFrame:
        """One row: the budget, the answer and its certificate's value and status."""
        c = self.certificate
        return pd.DataFrame([{
            "eps": self.eps, "risk": self.risk, "risk_base": self.risk_base, "h": self.h,
            "status": self.status, "risk_sup": self.risk_sup, "eps_sup": self.eps_sup,
            "certificate_value": math.nan if c is None else c.value,
            "certificate_status": None if c is None else c.status}])

    def summary(self) -> str:
        lines = [
            f"Worst-case risk within OT cost eps ({self.loss} loss, {self.divergence}, "
            f"theta1={self.theta1:g}, theta2={self.theta2:g})",
            f"  budget eps           {self.eps:.6g}",
            f"  base risk            {self.risk_base:.6g}",
            f"  worst-case risk      {self.risk:.6g}   [{self.status}]",
        ]
        if self.certificate is not None and math.isfinite(self.certificate.value):
            c = self.certificate
            lines.append(f"  certify(r=risk)      {c.value:.6g}   [{c.status}, gap {c.gap:.2e}]")
        if self.message:
            lines.append(f"  note: {self.message}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def dro_oracle(prob, theta1: float, mask=None):
    """The exact d-transform oracle of ``certify``'s path for a resolved linear problem, and the
    per-sample limit slopes ``s_i = lim l_h(z_i) / h`` (None when some ``l_h`` grows faster
    than linearly, i.e. the risk is unbounded)."""
    loss = prob.loss
    sc = prob.scorer
    if sc is None:
        raise IncompatibleLossError(
            "worst_case_risk needs a linear model (the exact paths of certify); for other "
            "models use certify over a grid of r")
    W = sc.W if mask is None else sc.W * np.asarray(mask)[None, :]
    if isinstance(loss, ZeroOne):
        dstar, _ = linear_distances(prob, mask)
        a = move_prices(dstar, theta1)
        return DistanceOracle(a), np.isfinite(a).astype(float)
    if isinstance(loss, (PiecewiseLinear, MulticlassHinge)):
        red = reduce_problem(prob, theta1, mask)
        slopes = None if np.any(red.c2 > 0) else red.loss_values()
        return oracle_for(red.c1, red.c2), slopes
    name = loss_name(loss)
    if name not in SMOOTH_LOSSES:
        raise IncompatibleLossError(f"loss {name!r} has no exact path for worst_case_risk")
    # a binary classifier or regressor: the d-transform on its margins or residuals (X is not
    # copied); multiclass cross-entropy: the oracle on the n x K scores
    rows = margin_oracle(prob, name, theta1, mask)
    oracle = rows[0] if rows is not None else linear_smooth_oracle(
        sc.W, sc.b, sc.task, prob.X, prob.y, loss=name, theta1=theta1, mask=mask)
    if sc.task == "multiclass":
        moves = bool(np.any(W != W[:1]))
    else:
        moves = bool(np.any(W != 0))
    slopes = None if (moves and math.isfinite(theta1)) else prob.losses(prob.X)
    return oracle, slopes


def _conjugate(oracle, h: float, theta2: float, divergence: str, p=None):
    """``(T(h), T'(h+))``: the divergence term of ``certify``'s dual and its right derivative,
    ``E_w[d l_h / dh]`` at the weights of Q* (envelope theorem); ``p``: the sample
    probabilities (None: uniform)."""
    with np.errstate(over="ignore", invalid="ignore"):
        lh, d1 = oracle.evaluate(h)[:2]
        if not (np.all(np.isfinite(lh)) and np.all(np.isfinite(d1))):
            return math.inf, math.inf
        if math.isinf(theta2):
            return pmean(lh, p), pmean(d1, p)
        if divergence == "kl":
            w = kl_weights(lh, theta2, p)
            T = kl_dual_term(lh, theta2, p)
        else:
            w, _, T = chi2_solution(lh, theta2, p)
    return float(T), pmean(w * d1, p)


def _solve(oracle, eps: float, theta2: float, divergence: str, p=None):
    """``(W, h*, evaluations)``: minimise ``(eps + T(h)) / h`` over ``0 < h < h_max`` by
    bisection on the nondecreasing ``G(h) = h T'(h) - T(h)``; ``None`` for W when
    ``G < eps`` up to ``H_CAP`` (the budget exceeds what any finite h prices)."""
    h_max = float(getattr(oracle, "h_max", math.inf))
    best = [math.inf, math.nan]
    count = [0]

    def G(h):
        count[0] += 1
        T, Tp = _conjugate(oracle, h, theta2, divergence, p)
        if not math.isfinite(T):
            return math.inf
        q = (eps + T) / h
        if q < best[0]:
            best[:] = [q, h]
        return h * Tp - T

    h = min(1.0, 0.5 * h_max)
    if G(h) >= eps:
        hi, lo = h, h / 4.0
        while G(lo) >= eps:
            hi, lo = lo, lo / 4.0
            if lo < 1e-300:
                raise SolverError(f"eps = {eps:g} is below what double precision can price")
    else:
        lo = h
        while True:
            hi = 4.0 * lo if 4.0 * lo < h_max else 0.5 * (lo + h_max)
            if hi >= H_CAP or hi == lo:
                return None, math.nan, count[0]
            if G(hi) >= eps:
                break
            lo = hi
    for _ in range(MAX_STEPS):
        if hi - lo <= 4.0 * np.finfo(float).eps * hi:
            break
        mid = math.sqrt(lo * hi) if hi > 2.0 * lo else 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if G(mid) >= eps:
            hi = mid
        else:
            lo = mid
    G(lo)  # both ends of the final bracket are candidates (a kink root lies between them)
    G(hi)
    return best[0], best[1], count[0]


def worst_case_risk(model, X, y, *, loss, eps: float, theta1: float = 1.0,
                    theta2: float = 0.25, divergence: str = "kl", solver: str = "auto",
                    features=None, feature_costs=None, sample_weight=None, cost=None,
                    **solver_options) -> WorstCaseRisk:
    """The largest risk any distribution within OT cost ``eps`` of the data can cause.

    ``W(eps) = sup { E_Q[W l] : M_c(Q, P0) <= eps }`` with the lifted cost of
    :func:`otstab.certify`; the inverse of ``certify``:
    ``certify(r=worst_case_risk(eps).risk).value == eps``.

    Parameters
    ----------
    model, X, y, loss, theta1, theta2, divergence, features, feature_costs, sample_weight :
        As in :func:`otstab.certify`; ``model`` must be a linear model (the exact paths:
        piecewise-linear losses, 0/1, logistic, cross-entropy, squared). With
        ``sample_weight`` the risks are weighted means and the budget is priced on the
        weighted data, as ``certify`` prices it.
    eps : float in [0, inf]
        The OT budget (same units as ``certify``'s value).
    cost : None or "encoded" (default), "auto", otstab.DataCost or its ``to_dict()``
        The transport cost, as in :func:`otstab.certify`; under a ``DataCost`` the exact
        oracles of ``certify``'s DataCost paths (0/1, hinge, logistic of linear classifiers;
        :mod:`otstab.datacost_certify`), the budget priced in the data's own units.
    solver, **solver_options :
        Passed to the ``certify`` calls that build and audit Q*.

    Returns
    -------
    WorstCaseRisk
        ``risk``, ``h``, ``status`` and ``certificate`` (``certify`` at ``r = risk``: Q* and
        its audit).
    """
    t0 = time.perf_counter()
    eps = check_scalar(eps, "eps", low=0.0, allow_inf=True)
    _, theta1, theta2, divergence = check_common(0.0, theta1, theta2, divergence, solver)
    loss_obj = get_loss(loss)
    data_cost, _how = datacost_certify.choose_cost(cost, model, X, loss_obj, features=features,
                                                   feature_costs=feature_costs, solver=solver,
                                                   options=tuple(solver_options),
                                                   trees_too=False)
    cost = "encoded" if data_cost is None else data_cost  # the certificates' cost: this one
    if data_cost is not None:  # a cost on the raw variables (otstab.datacost_certify)
        if feature_costs is not None:
            raise ValidationError("feature_costs prices the encoded cost; with cost=DataCost "
                                  "use DataCost(price={...})")
        prob, oracle, slopes = datacost_certify.dro_oracle(
            model, X, y, loss=loss_obj, cost=data_cost, theta1=theta1, features=features,
            sample_weight=sample_weight)
    else:
        prob = resolve_model(model, X, y, loss=loss_obj, sample_weight=sample_weight)
        mask = feature_mask(prob.d, pipeline.expand_features(model, features,
                                                             prob.feature_names),
                            prob.feature_names)
        costs = check_feature_costs(feature_costs, prob.feature_names, model)
        if costs is not None:  # certify's metric: solve in x~ = sqrt(c) x (otstab.costs)
            prob, mask = scaled_problem(prob, costs, mask)
        oracle, slopes = dro_oracle(prob, theta1, mask)
    p = prob.p
    base = pmean(prob.losses(prob.X), p)
    if slopes is None:
        w_sup = math.inf
    else:
        w_sup = support_max(slopes, p) if math.isfinite(theta2) else pmean(slopes, p)
    common = dict(eps=eps, risk_base=base, theta1=theta1, theta2=theta2,
                  divergence=divergence, loss=loss_name(loss_obj), risk_sup=w_sup)

    def cert(r):
        return certify(model, X, y, loss=loss_obj, r=r, theta1=theta1, theta2=theta2,
                       divergence=divergence, features=features, solver=solver,
                       feature_costs=feature_costs, sample_weight=sample_weight,
                       cost=cost, **solver_options)

    def done(**kw):
        return WorstCaseRisk(**common, **kw, solve_time=time.perf_counter() - t0)

    if eps == 0.0:
        return done(risk=base, h=math.nan, status="zero", eps_sup=math.nan,
                    message="eps = 0: the data's own risk", certificate=cert(base))
    # the largest reachable risk and its cost (finite only when l_h grows linearly)
    sup_cert = None
    eps_sup = math.inf
    if math.isfinite(w_sup):
        sup_cert = cert(w_sup)
        if sup_cert.status in ("optimal", "zero", "limit"):
            eps_sup = float(sup_cert.value)
        else:
            sup_cert = None
    if math.isfinite(eps_sup) and eps >= eps_sup:
        return done(risk=w_sup, h=math.nan, status="capped", eps_sup=eps_sup,
                    certificate=sup_cert,
                    message=f"eps = {eps:g} >= {eps_sup:.6g}, the cost of the largest reachable "
                            f"risk {w_sup:.6g}: the budget is not exhausted")
    if math.isinf(eps):
        status = "unbounded" if math.isinf(w_sup) else "supremum"
        return done(risk=w_sup, h=math.nan, status=status, eps_sup=eps_sup,
                    message="eps = inf: the supremum of the risk over all allowed "
                            "perturbations" + ("" if status == "unbounded" else
                                               " (approached, not attained)"))
    risk, h, evals = _solve(oracle, eps, theta2, divergence, p)
    if risk is None:
        if math.isinf(w_sup):
            raise SolverError(f"could not bracket the optimal h for eps = {eps:g}")
        return done(risk=w_sup, h=math.nan, status="supremum", eps_sup=eps_sup,
                    evaluations=evals,
                    message=f"the largest reachable risk {w_sup:.6g} is approached as h -> inf "
                            "but not attained within eps")
    risk = min(risk, w_sup)
    certificate = cert(risk)
    status = "bounds" if certificate.status == "bounds" else "optimal"
    message = ""
    if status == "bounds":
        message = ("the certificate is not exact (multinomial cross-entropy above h_concave): "
                   "risk is a lower bound on W(eps)")
    elif certificate.status == "zero":
        status = "zero"
        message = "eps is below the resolution of the base risk"
    return done(risk=risk, h=h, status=status, eps_sup=eps_sup, evaluations=evals,
                certificate=certificate, message=message)

