"""``StabilityResult``: the answer of :func:`otstab.certify`, with its primal-dual certificate.

Notation (Blanchet, Cui, Li, Liu 2024): ``R(beta, r)`` is the smallest OT cost of a perturbation
``Q`` of the evaluation distribution with risk ``E_Q[W l(Z)] >= r``; ``h`` is the dual multiplier
of the risk constraint and ``alpha`` (chi2 only) that of the mass constraint ``E[W] = 1``.
The most sensitive distribution ``Q* = (1/n) sum_a mass_a delta_(x*_a, w_a)`` is a list of atoms:
``source`` (which evaluation sample an atom comes from), ``mass`` (its share of that sample's
mass), the moved point ``X_star`` and the weight ``weights``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from otstab_solvers.weights import ScaledWeights

from .._results import ResultMixin, jsonable
from .._validation import check_level
from ..errors import ValidationError
from ..modeling import _fingerprint as fingerprint
from ..modeling._pipeline import RawView, raw_view
from ._budget import budget_used as _budget_used

if TYPE_CHECKING:
    from ._inference import Inference

__all__ = ["StabilityResult", "Lazy", "LazyInfo"]


@dataclass(repr=False)
class StabilityResult(ResultMixin):
    """Stability certificate.

    Attributes
    ----------
    value : float
        R(beta, r), the minimal perturbation cost that drives the risk to r (the dual value;
        ``inf`` when r is unreachable, 0 when r <= the base risk).
    h, alpha : float, float or None
        Dual solution (alpha only for chi2).
    X_star, weights, source, mass : arrays with one entry per atom of Q*.
    risk_base : float
        E_P0[l], the risk on the evaluation data.
    risk_star : float
        E_Q*[W l], the risk under Q* (reaches r when the answer is right).
    total_mass : float
        E_Q*[W] (equals 1).
    primal_cost : float
        The OT cost of Q* recomputed from the cost function (an upper bound on R).
    gap : float
        |primal_cost - value| / |value|: the primal-dual certificate (see
        :mod:`otstab.audit` for the tolerance under which an answer is accepted).
    exact : bool
        The path computes R itself (``status == 'optimal'``); False for the first-order path
        and the perturbation search of nonlinear models (``status == 'bounds'``).
    value_lower, value_upper : float
        Certified interval for R: no perturbation cheaper than ``value_lower`` reaches r, and
        the returned Q* (audited) reaches r at cost ``value_upper``. Exact answers have
        ``value_lower == value == value_upper``; for non-exact ones ``value`` is the found
        (upper) value and ``value_lower`` the best lower bound the path proves (0 if none).
    decomposition : dict
        base, corruption (I: moving samples), reweighting (II), as in the paper's eq. (4).
    solver, status, solve_time : str, str, float
        ``solve_time``: the final solver's time only; the wall time of the whole ``certify``
        call (search, lower bounds, audit, bootstrap) is ``info["wall_time"]`` (seconds).
    status : str
        ``optimal`` (exact and audited), ``bounds`` (not exact: see value_lower/value_upper),
        ``zero`` (r is reached by the data: R = 0), ``unreachable`` (R = inf).
    message : str
        Why a status is what it is (unreachable threshold, limit case, fallbacks).
    solver_log : list of dict
        Every solver tried, its status and why the next one was tried or skipped.
    """

    value: float
    h: float
    alpha: float | None
    X_star: np.ndarray = field(repr=False)
    weights: np.ndarray
    source: np.ndarray
    mass: np.ndarray
    risk_base: float
    risk_star: float
    total_mass: float
    primal_cost: float
    gap: float
    decomposition: dict
    solver: str
    status: str
    solve_time: float
    r: float = math.nan
    theta1: float = math.nan
    theta2: float = math.nan
    divergence: str = "kl"
    loss: str = ""
    message: str = ""
    solver_log: list = field(default_factory=list)
    dual_gap_bound: float = math.nan
    iterations: int = 0
    compile_time: float = 0.0
    split: bool = False
    exact: bool = True
    value_lower: float = math.nan
    value_upper: float = math.nan
    loss_star: np.ndarray | None = field(default=None, repr=False)
    loss_base: np.ndarray | None = field(default=None, repr=False)
    X: np.ndarray | None = field(default=None, repr=False)
    feature_names: list = field(default_factory=list, repr=False)
    index: object = field(default=None, repr=False)
    info: dict = field(default_factory=dict, repr=False)
    #: sampling uncertainty (:class:`otstab.inference.Inference`; set by certify, built on
    #: first access)
    inference: Inference | None = field(default=None, repr=False)

    #: the headline of ``repr`` (the atoms of Q* are summarised by their count)
    _repr_fields = ("value", "status", "r", "risk_base", "risk_star", "h", "gap", "loss",
                    "theta1", "theta2", "divergence", "solver", "n", "n_atoms")

    @property
    def n(self) -> int:
        return 0 if self.X is None else int(self.X.shape[0])

    @property
    def n_atoms(self) -> int:
        return int(np.size(self.weights))

    @property
    def excess_risk(self) -> float:
        return self.risk_star - self.risk_base

    @property
    def se(self) -> float:
        """Standard error of R over evaluation samples (influence function by default, the
        bootstrap with ``certify(..., se="bootstrap")``; ``nan`` when not computed, ``inf`` when
        r is unreachable). See ``docs/inference.md``."""
        return math.nan if self.inference is None else self.inference.se

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """Confidence interval ``(low, high)`` for R in the population at ``level``."""

        level = check_level(level)
        if self.inference is None:
            return math.nan, math.nan
        return self.inference.ci(level)

    def lower_confidence_bound(self, level: float = 0.95) -> float:
        """One-sided bound: R >= this with confidence ``level`` (the value to gate on)."""

        level = check_level(level)
        if self.inference is None:
            return math.nan
        return self.inference.lower_confidence_bound(level)

    def budget_used(self, shift, level: float = 0.95):
        """This R and an observed shift's cost S (:func:`otstab.shift_cost`) side by side:
        :func:`otstab.budget_used`."""
        return _budget_used(self, shift, level=level)

    def summary(self) -> str:
        """A short human-readable certificate."""
        lines = [
            f"OT stability certificate ({self.loss} loss, {self.divergence}, "
            f"theta1={self.theta1:g}, theta2={self.theta2:g})",
            f"  threshold r          {self.r:.6g}",
            f"  base risk            {self.risk_base:.6g}",
            f"  R(beta, r)           {self.value:.6g}   [{self.status}, solver {self.solver}]",
        ]
        used = self.info.get("cost_used") if isinstance(self.info, dict) else None
        if used:
            lines.append(f"  transport cost       {used}")
        if self.status == "bounds":
            lines += [
                f"  certified interval   [{self.value_lower:.6g}, {self.value_upper:.6g}]"
                f"   (ratio {self._ratio()})",
                f"    no perturbation cheaper than {self.value_lower:.6g} reaches r (certified);"
                f" one of cost {self.value_upper:.6g} does (found: the returned Q*, audited)",
            ]
        if math.isfinite(self.value):
            lines += [
                f"  risk under Q*        {self.risk_star:.6g}",
                f"  cost of Q* (primal)  {self.primal_cost:.6g}   gap {self.gap:.2e}",
                f"  excess risk: corruption {self.decomposition.get('corruption', 0):.4g}, "
                f"reweighting {self.decomposition.get('reweighting', 0):.4g}",
            ]
        inf_ = self.inference
        if inf_ is not None and not math.isnan(inf_.se):
            lo, hi = inf_.ci(0.95)
            lines.append(f"  sampling SE          {inf_.se:.3g}   95% interval [{lo:.6g}, {hi:.6g}]"
                         f" ({inf_.method})")
            if inf_.note:
                lines.append(f"  sampling note: {inf_.note}")
        if self.message:
            lines.append(f"  note: {self.message}")
        return "\n".join(lines)

    def _ratio(self) -> str:
        lo, up = self.value_lower, self.value_upper
        if not (math.isfinite(lo) and math.isfinite(up)) or up <= 0:
            return "n/a"
        return f"{lo / up:.3g}"

    def __str__(self) -> str:
        return self.summary()

    def to_frame(self, raw: bool = False) -> pd.DataFrame:
        """One row per atom: source sample, share of its mass, original x, moved x*, weight,
        loss before and after, squared distance moved.

        Parameters
        ----------
        raw : bool, default False
            False: the columns the model's final estimator sees (standardised, one-hot...).
            True: the user's raw columns (for a Pipeline, its preprocessing inverted by
            :mod:`otstab.pipeline`: scalers exactly, a moved one-hot block as the category with
            the largest indicator after the move plus the fractional indicator values in
            ``"<column>* indicators"``, dropped and unmoved columns unchanged; ``"variable:
            level"`` one-hot columns of a model without preprocessing likewise).
            ``distance2`` stays in the model's space, where the cost is measured.
        """
        fingerprint.check(self.X, "to_frame")  # X is the caller's array (no copy)
        if raw:
            return self.raw_view().frame(self)
        X, loss_base = self.X, self.loss_base
        if X is None or loss_base is None:
            raise ValidationError("to_frame needs X and the per-sample losses; this result "
                                  "was made without them")
        names = list(self.feature_names) or [f"x{j}" for j in range(self.X_star.shape[1])]
        src = np.asarray(self.source)
        data: dict[str, Any] = {"source": src, "mass": self.mass}
        if self.index is not None:
            data["index"] = np.asarray(self.index)[src]
        X0 = X[src]
        for j, nm in enumerate(names):
            data[nm] = X0[:, j]
        for j, nm in enumerate(names):
            data[f"{nm}*"] = self.X_star[:, j]
        data["weight"] = self.weights
        data["loss"] = loss_base[src]
        data["loss*"] = self.loss_star
        data["distance2"] = np.sum((self.X_star - X0) ** 2, axis=1)
        return pd.DataFrame(data)

    def __getstate__(self):
        """Pickled with its lazy fields built (their builders are closures over the solver's
        state) and the callables of ``info`` built (``moved2``) or left out (``displacement``,
        which :func:`otstab.scale.qstar` needs: write Q* of a Dask result before pickling
        it)."""
        fingerprint.check(self.X, "pickling the result")  # X is pickled: as certified
        state = dict(self.__dict__)
        for name in LAZY_FIELDS + ("inference",):
            key = "_lazy_" + name
            if callable(state.get(key)):
                state[key] = getattr(self, name)
        raw = state.get("info") or {}
        info = {k: raw[k] for k in raw}  # (a LazyInfo builds its Lazy values here)
        for key, value in list(info.items()):
            if key == "moved2" and callable(value):
                info[key] = value()
            elif callable(value) and not (key == "raw_view" and
                                          isinstance(value, functools.partial)):
                del info[key]
        state["info"] = info
        return state

    def raw_view(self):
        """The :class:`otstab.pipeline.RawView` behind ``to_frame(raw=True)`` (its ``map``
        says which encoded columns each raw column became); raises ValidationError when the
        model's preprocessing cannot be inverted."""
        view = (self.info or {}).get("raw_view")
        names = list(self.feature_names) or [f"x{j}" for j in range(self.X.shape[1])]
        if view is None:  # no preprocessing: the raw columns are X's
            fingerprint.check(self.X, "raw_view")
            view = raw_view(None, pd.DataFrame(self.X, columns=names), names)
        elif not isinstance(view, RawView):
            view = view()
            if view is None:
                raise ValidationError(
                    "to_frame(raw=True): the model's preprocessing cannot be inverted column by "
                    "column (supported: ColumnTransformer, OneHotEncoder, OrdinalEncoder, "
                    "scalers, SimpleImputer, FunctionTransformer with inverse_func, "
                    "passthrough, drop); use to_frame()")
            self.info["raw_view"] = view
        return view

    def to_dict(self, *, arrays: bool = True) -> dict:
        """Plain-Python dict; ``arrays=False`` leaves out the atoms of Q*."""
        skip = set() if arrays else {"X_star", "weights", "source", "mass"}
        out: dict[str, Any] = {"X_star": self.X_star} if arrays else {}
        for name in self.__dataclass_fields__:
            f = self.__dataclass_fields__[name]
            if not f.repr or name in skip:
                continue
            out[name] = getattr(self, name)
        if arrays:
            out["feature_names"] = list(self.feature_names)
        return jsonable(out)


class Lazy:
    """A value built on first call and kept; pickled as the value (so that closures over it,
    e.g. Q*'s displacement shipped to Dask workers, carry the arrays, not their builder).
    ``Lazy.of(value)``: one already built."""

    def __init__(self, build):
        self._build, self._value = build, None

    @classmethod
    def of(cls, value) -> Lazy:
        out = cls(None)
        out._value = value
        return out

    def __call__(self):
        if self._build is not None:
            self._value, self._build = self._build(), None
        return self._value

    def __getstate__(self):
        return {"_build": None, "_value": self()}


class LazyInfo(dict):
    """``info`` whose :class:`Lazy` values are built on first read (``[]``, ``get``): e.g. a
    0/1 certificate's ``info["dstar"]``, an n-vector the certificate itself never needs."""

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if isinstance(value, Lazy):
            value = value()
            self[key] = value
        return value

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __reduce__(self):  # pickled with its values built
        return (LazyInfo, ({k: self[k] for k in self},))


def _lazy_property(name: str) -> property:
    """A field whose value may be given as a zero-argument builder, called on first access."""
    key = "_lazy_" + name

    def get(self):
        value = self.__dict__.get(key)
        if callable(value):
            if name == "X_star":  # built from X, the caller's array (no copy)
                fingerprint.check(self.X, "X_star")
            sw = self.info.get("sample_weight") if isinstance(self.info, dict) else None
            if isinstance(sw, ScaledWeights):  # (the caller's weights, read by reference)
                sw.unchanged(name)
            value = value()
            self.__dict__[key] = value
        return value

    def set_(self, value):
        self.__dict__[key] = value

    return property(get, set_, doc=f"``{name}`` (built on first access when made lazily).")


#: per-atom arrays that may be built on first access: at large n the audit runs blockwise or on
#: the moved atoms only, and X_star (m x d) or the other atom arrays are materialised only
#: when asked for
LAZY_FIELDS = ("X_star", "weights", "source", "mass", "loss_star", "loss_base")
for _name in LAZY_FIELDS:
    setattr(StabilityResult, _name, _lazy_property(_name))
StabilityResult.inference = _lazy_property("inference")  # type: ignore[assignment]  # a property
