"""The scalar settings every entry point shares, validated once (bottom layer).

``r`` (the risk threshold), ``theta1`` (price of moving samples), ``theta2`` (price of
reweighting), ``divergence`` (KL or chi2 for the reweighting cost), ``solver`` and the
``**solver_options`` a path accepts. Prices are in ``(0, inf]``; ``math.inf`` switches the
corresponding perturbation off. Finite prices must lie in ``[THETA_MIN, THETA_MAX]``: outside
that range the products and quotients of the dual under- or overflow in double precision, and
the answer could not be audited (use ``math.inf`` for "never", and rescale the loss or the
features for extreme ratios).
"""

from __future__ import annotations

import math

from otstab_solvers import conic as _conic

from .._validation import check_positive_extended, check_scalar
from ..errors import ValidationError

__all__ = ["SOLVERS", "DIVERGENCES", "THETA_MIN", "THETA_MAX", "check_common",
           "check_options"]

#: names accepted by ``solver=``
SOLVERS = ("auto", "dual", "conic", "first_order", "closed_form") + tuple(_conic.BACKENDS)
DIVERGENCES = ("kl", "chi2")
#: the range of finite prices theta1, theta2 that double precision can audit
THETA_MIN = 1e-100
THETA_MAX = 1e100


def _check_price(x, name: str) -> float:
    x = check_positive_extended(x, name)
    if math.isfinite(x) and not THETA_MIN <= x <= THETA_MAX:
        raise ValidationError(
            f"{name} = {x:g} is outside the supported range [{THETA_MIN:g}, {THETA_MAX:g}] of "
            f"finite prices (use math.inf to forbid this perturbation, or rescale the data)")
    return x


def check_common(r, theta1, theta2, divergence, solver="auto"):
    """Validate ``r``, ``theta1``, ``theta2``, ``divergence`` and ``solver``; returns
    ``(r, theta1, theta2, divergence)`` with the divergence lower-cased."""
    r = check_scalar(r, "r", low=0.0)
    theta1 = _check_price(theta1, "theta1")
    theta2 = _check_price(theta2, "theta2")
    if not isinstance(divergence, str) or divergence.lower() not in DIVERGENCES:
        raise ValidationError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
    check_solver(solver)
    return r, theta1, theta2, divergence.lower()


def check_solver(solver, allowed=SOLVERS) -> str:
    """``solver`` lower-cased, or a ValidationError naming the accepted ones."""
    if not isinstance(solver, str) or solver.lower() not in allowed:
        raise ValidationError(f"solver must be one of {list(allowed)}, got {solver!r}")
    return solver.lower()


def check_options(options: dict, allowed, where: str) -> None:
    """Refuse ``**solver_options`` that the chosen path would not use."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValidationError(
            f"unknown solver option(s) {unknown} for {where}; expected some of "
            f"{sorted(allowed)}")
