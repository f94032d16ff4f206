"""``stability_curve``: R(beta, r) over a grid of thresholds, reusing one reduction.

The dual path warm-starts each threshold from the previous one; the conic path builds one
cvxpy problem with ``r`` as a Parameter, so the sweep is canonicalised once (DPP) and each
further threshold only re-solves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from otstab_solvers import conic as _conic

from .._progress import check_progress, progress_bar
from .._results import FrameResult
from .._validation import as_float_vector, renamed_kwargs
from ..errors import ValidationError
from ..modeling._losses import MulticlassHinge, PiecewiseLinear, ZeroOne, get_loss
from ..modeling._models import resolve_model
from ..modeling._params import check_common
from ..modeling._reduction import feature_mask, reduce_problem
from ..solve._core import certify
from ..solve._datacost_certify import choose_cost
from ..solve._inference import analytic, check_level
from ..solve._piecewise import solve_reduced

__all__ = ["stability_curve", "StabilityCurve"]

log = logging.getLogger(__name__)


@dataclass(repr=False)
class StabilityCurve(FrameResult):
    """The answer of :func:`stability_curve`: one audited certificate per threshold.

    ``table`` has one row per threshold: ``r``, ``value``, ``h``, ``risk_star``,
    ``primal_cost``, ``gap``, ``status``, ``solver``, ``solve_time`` and, with ``level``,
    ``se``, ``ci_low``, ``ci_high``. ``to_frame()`` returns it (with these settings in
    ``attrs``).
    """

    table: pd.DataFrame
    risk_base: float
    loss: str
    theta1: float
    theta2: float
    divergence: str
    level: float | None = None

    _function = "otstab.stability_curve"

    @property
    def r(self):
        return self.table["r"].to_numpy()

    @property
    def value(self):
        return self.table["value"].to_numpy()

    def summary(self) -> str:
        head = (f"Stability curve R(beta, r) ({self.loss} loss, {self.divergence}, "
                f"theta1={self.theta1:g}, theta2={self.theta2:g}), base risk "
                f"{self.risk_base:.6g}, {len(self.table)} thresholds")
        cols = [c for c in ("r", "value", "status", "gap", "se", "ci_low", "ci_high")
                if c in self.table.columns]
        return head + "\n" + self.table[cols].head(30).to_string(index=False)


@renamed_kwargs(confidence="level")
def stability_curve(model, X, y, *, loss, r, theta1: float = 1.0, theta2: float = 0.25,
                    divergence: str = "kl", solver: str = "auto", features=None,
                    level: float | None = None, sample_weight=None, cost=None,
                    progress=None, **solver_options) -> StabilityCurve:
    """R(beta, r) for every threshold in ``r`` (value versus r).

    Parameters
    ----------
    model, X, y, loss, theta1, theta2, divergence, solver, features, sample_weight, cost :
        As in :func:`otstab.certify` (``cost``: every threshold certified under it).
    r : array-like of float >= 0
        The thresholds.
    level : float in (0, 1), optional
        Add each value's influence-function standard error and interval at this level
        (columns ``se``, ``ci_low``, ``ci_high``; ``docs/inference.md``), drawn as a band by
        :func:`otstab.plot.stability_curve`. (Formerly ``confidence``.)
    progress : None, True or False
        A progress bar on stderr (None: only when stderr is a terminal).
    **solver_options
        Passed to every ``certify`` call, as in :func:`otstab.certify` (e.g. the tree
        ensemble bound's ``max_nodes``, ``time_budget``, ``node_budget``: per threshold).

    Returns
    -------
    StabilityCurve
        ``to_frame()``: one row per threshold with columns ``r``, ``value``, ``h``,
        ``risk_star``, ``primal_cost``, ``gap``, ``status``, ``solver``, ``solve_time``
        (with ``level`` also ``se``, ``ci_low``, ``ci_high``; when a row is not exact,
        status ``bounds``, also ``value_lower`` and ``value_upper``, its certified interval);
        ``risk_base`` is the base risk. Each row is a full audited certificate (see
        :func:`otstab.certify`).
    """
    level = None if level is None else check_level(level)
    show = check_progress(progress)
    grid = as_float_vector(r, "r")
    if np.any(grid < 0):
        raise ValidationError("r must be >= 0")
    _, theta1, theta2, divergence = check_common(float(grid[0]), theta1, theta2, divergence,
                                                 solver)
    solver = solver.lower()
    loss_obj = get_loss(loss)
    prob = resolve_model(model, X, y, loss=loss_obj, sample_weight=sample_weight)
    results = []
    linear = prob.scorer is not None and solver != "first_order"
    data_cost, _how = choose_cost(cost, model, X, loss_obj, features=features, solver=solver,
                                  options=tuple(solver_options))
    if data_cost is None:
        cost = "encoded"  # every threshold's certify then uses the cost chosen here
    if data_cost is None and linear and isinstance(loss_obj, (PiecewiseLinear,
                                                              MulticlassHinge)):
        mask = feature_mask(prob.d, features, prob.feature_names)
        red = reduce_problem(prob, theta1, mask)
        program = None
        if solver not in ("auto", "dual"):  # one program for the sweep, weighted or not
            program = _conic.ConicProgram(red.c1, red.c2, theta2, divergence, weights=prob.p)
        with progress_bar(grid.size, "stability_curve", show) as bar:
            for rv in grid:
                t0 = time.perf_counter()
                res = solve_reduced(prob, red, float(rv), theta1, theta2, divergence, solver,
                                    t0, program=program, **solver_options)
                if prob.weights is not None:
                    res.info["sample_weight"] = prob.weights  # for the weighted influence function
                results.append(res)
                bar.update()
    else:
        if isinstance(loss_obj, ZeroOne) and np.any(grid > 1):
            raise ValidationError("r is an error rate for loss='zero_one': values must be <= 1")
        with progress_bar(grid.size, "stability_curve", show) as bar:
            for rv in grid:
                results.append(certify(model, X, y, loss=loss_obj, r=float(rv), theta1=theta1,
                                       theta2=theta2, divergence=divergence, solver=solver,
                                       features=features, sample_weight=sample_weight,
                                       cost=cost, **solver_options))
                bar.update()
    df = pd.DataFrame({
        "r": grid,
        "value": [res.value for res in results],
        "h": [res.h for res in results],
        "risk_star": [res.risk_star for res in results],
        "primal_cost": [res.primal_cost for res in results],
        "gap": [res.gap for res in results],
        "status": [res.status for res in results],
        "solver": [res.solver for res in results],
        "solve_time": [res.solve_time for res in results],
    })
    if any(not res.exact for res in results):  # a "bounds" row: its certified interval too
        df["value_lower"] = [res.value_lower for res in results]
        df["value_upper"] = [res.value_upper for res in results]
    if level is not None:
        infs = [res.inference if res.inference is not None else analytic(res)
                for res in results]
        bands = [inf_.ci(level) for inf_ in infs]
        df["se"] = [inf_.se for inf_ in infs]
        df["ci_low"] = [b[0] for b in bands]
        df["ci_high"] = [b[1] for b in bands]
    log.debug("stability_curve: %d thresholds certified", len(results))
    return StabilityCurve(df, risk_base=results[0].risk_base if results else float("nan"),
                          loss=loss_obj.name, theta1=theta1, theta2=theta2,
                          divergence=divergence, level=level)
