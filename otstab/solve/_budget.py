"""``budget_used``: a certificate's tolerance R and an observed shift's cost S side by side.

By the definition of R,

    R(beta, r) = inf { M_c(Q, P^) : E_Q[W l(Z)] >= r },

every lifted perturbation ``Q`` of the certificate's evaluation data cheaper than R has risk
``E_Q[W l] < r``. :func:`otstab.shift_cost` returns such a ``Q`` for the current data: a plan
of cost ``S_upper`` whose W-weighted Z-marginal is ``P_cur``, so ``E_Q[W l] = E_{P_cur}[l]``.
Hence ``S_upper < R_lower`` proves that the model's risk on the current sample is below r
(same model, loss, r, thetas, divergence, transport cost and reference data: checked here as
far as the two results record them). ``S / R`` is the share of the tolerance already used.

It lives beside :class:`otstab.StabilityResult` (whose ``budget_used`` method calls it) and reads
a :class:`otstab.ShiftCost` by its attributes, so that the solving layer never imports the
shift layer above it (docs/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .._results import ResultMixin
from .._validation import check_level
from ..errors import ValidationError

__all__ = ["budget_used", "BudgetUse"]


@dataclass(repr=False)
class BudgetUse(ResultMixin):
    """R and S side by side (:func:`budget_used`).

    Attributes
    ----------
    R, R_lower, R_upper : the certificate's value and certified interval
    R_ci : (low, high), the sampling confidence interval of R at ``level`` (nan when the
        certificate has none)
    S, S_lower, S_upper : the shift cost and its certified interval
    share : float
        ``S_upper / R_lower``: the share of the tolerance used, on the safe side (nan when
        R is 0 or infinite).
    certified : bool
        ``S_upper < R_lower``: the model's risk on the current data is proven below ``r``.
    outcome : str
        ``certified_below_r``, ``not_certified`` (the intervals overlap, or S >= R: no
        conclusion, the risk may or may not reach r) or ``unreachable_r`` (R = inf: no
        allowed shift reaches r at all).
    conclusion : str
        The sentence the numbers license.
    """

    R: float
    R_lower: float
    R_upper: float
    S: float
    S_lower: float
    S_upper: float
    share: float
    certified: bool
    outcome: str
    conclusion: str
    r: float
    level: float = 0.95
    R_ci: tuple = (math.nan, math.nan)
    share_point: float = math.nan
    notes: list = field(default_factory=list, repr=False)

    _repr_fields = ("outcome", "share", "R", "R_lower", "S", "S_upper", "r")

    def summary(self) -> str:
        lo, hi = self.R_ci
        ci = "" if math.isnan(lo) else f"   {self.level:.0%} interval [{lo:.6g}, {hi:.6g}]"
        lines = ["Tolerance used by the observed shift",
                 f"  R(beta, r={self.r:.6g})      {self.R:.6g}   certified "
                 f"[{self.R_lower:.6g}, {self.R_upper:.6g}]{ci}",
                 f"  S (shift cost)       {self.S:.6g}   certified "
                 f"[{self.S_lower:.6g}, {self.S_upper:.6g}]",
                 f"  share used S/R       {_pct(self.share)}",
                 f"  conclusion           {self.conclusion}"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"quantity": "R", "value": self.R, "lower": self.R_lower,
                              "upper": self.R_upper},
                             {"quantity": "S", "value": self.S, "lower": self.S_lower,
                              "upper": self.S_upper}])


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.1%}"


def _check_same_problem(result, shift) -> list[str]:
    notes = []
    for name in ("theta1", "theta2"):
        a, b = float(getattr(result, name)), float(getattr(shift, name))
        if not (a == b or (math.isfinite(a) and math.isfinite(b)
                           and abs(a - b) <= 1e-12 * max(abs(a), abs(b)))):
            raise ValidationError(f"{name} differs: the certificate has {a:g}, the shift "
                                  f"cost {b:g}; S and R are comparable only at the same prices")
    if str(result.divergence).lower() != str(shift.divergence).lower():
        raise ValidationError(f"divergence differs: the certificate has "
                              f"{result.divergence!r}, the shift cost {shift.divergence!r}")
    info = getattr(result, "info", {}) or {}
    if "feature_costs" in info:
        raise ValidationError("the certificate was computed with feature_costs (a priced "
                              "metric) that shift_cost does not apply; S is not in its units")
    cert_cost = info.get("cost")
    if (cert_cost is None) != (shift.cost != "datacost"):
        raise ValidationError(f"the transport costs differ: the certificate uses "
                              f"{'a DataCost' if cert_cost is not None else 'the encoded cost'}"
                              f", the shift cost {shift.cost!r}")
    if cert_cost is not None and shift.info.get("cost_spec") is not None \
            and cert_cost != shift.info["cost_spec"]:
        raise ValidationError("the DataCost differs: the certificate's resolved cost is not "
                              "the shift cost's (resolve both on the same model and "
                              "reference data)")
    n = getattr(result, "n", 0)
    if n and n != shift.n_ref:
        raise ValidationError(f"the certificate was computed on {n} rows, the shift cost's "
                              f"reference sample has {shift.n_ref}: P_ref must be the "
                              "certificate's evaluation data")
    proj = shift.info.get("ref_projection")
    X = getattr(result, "X", None)
    if proj is not None and isinstance(X, np.ndarray) and X.ndim == 2 \
            and X.shape[0] == len(proj) and X.shape[1] == shift.info.get("ref_dim"):
        mine = X @ _probe(X.shape[1])
        if not np.allclose(mine, proj, rtol=1e-9, atol=1e-9 * max(1.0, float(
                np.max(np.abs(proj))))):
            raise ValidationError("the shift cost's reference rows are not the certificate's "
                                  "evaluation data (in the model's input space)")
    elif proj is None or X is None:
        notes.append("the reference rows could not be compared with the certificate's "
                     "evaluation data; S < R is a guarantee only when they are the same")
    pw = info.get("sample_weight")
    sw = shift.info.get("sample_weight")
    if pw is not None or sw is not None:
        wa = np.full(shift.n_ref, 1.0 / shift.n_ref) if pw is None else np.asarray(pw, float)
        wb = np.full(shift.n_ref, 1.0 / shift.n_ref) if sw is None else np.asarray(sw, float)
        if wa.shape != wb.shape or not np.allclose(wa, wb, rtol=1e-9, atol=1e-15):
            raise ValidationError("sample_weight differs: shift_cost's reference weights "
                                  "must be the certificate's")
    return notes


def _probe(d: int) -> np.ndarray:
    return np.random.default_rng(20261126).normal(size=d)


def budget_used(result, shift, *, level: float = 0.95) -> BudgetUse:
    """Put a certificate (:class:`otstab.StabilityResult`) and a shift cost
    (:class:`otstab.ShiftCost`) side by side, with the conclusion they license.

    Refuses (ValidationError) when the two are not in the same units: different thetas,
    divergence, transport cost, number of reference rows, reference data (when both record
    it) or sample weights.
    """
    level = check_level(level)
    notes = _check_same_problem(result, shift)
    R = float(result.value)
    R_lo = float(getattr(result, "value_lower", R))
    R_up = float(getattr(result, "value_upper", R))
    if math.isnan(R_lo):
        R_lo = R
    if math.isnan(R_up):
        R_up = R
    try:
        ci = tuple(float(x) for x in result.ci(level))
    except Exception:  # noqa: BLE001 - a certificate without inference
        ci = (math.nan, math.nan)
    S, S_lo, S_up = float(shift.value), float(shift.value_lower), float(shift.value_upper)
    r = float(result.r)
    if math.isfinite(R_lo) and R_lo > 0:
        share = S_up / R_lo                       # inf when S is
    elif R_lo == 0:
        share = math.inf if S_up > 0 else math.nan
    else:                                         # R = inf: no shift uses any of it
        share = 0.0 if math.isfinite(S_up) else math.nan
    point = S / R if math.isfinite(R) and R > 0 and math.isfinite(S) else math.nan
    if math.isinf(R_lo) and math.isfinite(S_up):
        outcome = "certified_below_r"
        conclusion = (f"risk on the current data is certified below r = {r:.6g}: no allowed "
                      "perturbation of the reference data reaches r (R = inf) and the shift "
                      f"costs {S_up:.6g}")
    elif S_up < R_lo:
        outcome = "certified_below_r"
        conclusion = (f"risk on the current data is certified below r = {r:.6g}: the shift "
                      f"costs at most {S_up:.6g} < R >= {R_lo:.6g} ({_pct(share)} of the "
                      "tolerance used)")
    elif S_lo >= R_up:
        outcome = "not_certified"
        conclusion = (f"no guarantee: the shift costs at least {S_lo:.6g} >= R = {R_up:.6g}, "
                      "the whole tolerance; the risk on the current data may reach r "
                      "(evaluate it there)")
    else:
        outcome = "not_certified"
        conclusion = (f"no guarantee: the intervals of S [{S_lo:.6g}, {S_up:.6g}] and R "
                      f"[{R_lo:.6g}, {R_up:.6g}] overlap")
    if outcome == "certified_below_r" and math.isfinite(ci[0]) and S_up >= ci[0]:
        notes.append(f"S exceeds the lower end of R's {level:.0%} sampling interval: the "
                     "guarantee holds for this current sample, but a fresh reference sample "
                     "could give an R below S")
    return BudgetUse(R=R, R_lower=R_lo, R_upper=R_up, S=S, S_lower=S_lo, S_upper=S_up,
                     share=share, certified=outcome == "certified_below_r", outcome=outcome,
                     conclusion=conclusion, r=r, level=level, R_ci=ci, share_point=point,
                     notes=notes)
