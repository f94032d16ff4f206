"""``feature_stability(..., cost=DataCost)``: one score per raw variable, each the certificate
under the cost in which only that variable may move (the others immutable), by the exact
DataCost paths of :mod:`otstab.datacost_certify`."""

from __future__ import annotations

import math

from ..errors import ValidationError
from ..modeling import _pipeline as pipeline
from ..modeling._datacost import DataCost
from ..solve._datacost_linear import raw_frame, selected_variables

__all__ = ["variable_units"]


def variable_units(model, X, prob, cost: DataCost, features=None, groups=None):
    """``(units, frozen, spec)``: ``units`` a list of ``(variable, encoded columns)``, one per
    raw variable (``features``: only these), ``frozen`` whether each cannot move under the
    cost (immutable or priced ``inf``: its score is the reweighting-only value), and ``spec``
    the cost resolved on the full data (``ResolvedCost.to_dict()``: every replicate and
    every variable's certificate uses it)."""
    if groups is not None:
        raise ValidationError("feature_groups: under a DataCost each raw variable is scored "
                              "on its own (its encoded columns move together); leave "
                              "feature_groups=None")
    frame = raw_frame(model, X, prob)
    rc = cost.resolve(model, frame, prob.feature_names)
    names = [v.name for v in rc.variables]
    if features is None:
        chosen = names
    else:
        chosen = selected_variables(features)
        for nm in chosen:
            if nm not in names:
                raise ValidationError(f"features: unknown variable {nm!r}"
                                      + (pipeline.suggest(nm, names)
                                         or f"; the model's variables are {names[:12]}"))
    units = [(nm, list(rc.map.variable(nm).columns)) for nm in chosen]
    frozen = []
    for nm in chosen:
        var = rc.variable(nm)
        assert var is not None  # chosen among the cost's variables above
        frozen.append(var.immutable or not math.isfinite(var.price))
    return units, frozen, rc.to_dict()
