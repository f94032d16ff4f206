"""The solving paths and the audit: one candidate ``(h, alpha, value)`` and Q* per path, and
the only place that decides a status.

``certify`` (``_core``) dispatches to the piecewise (``_piecewise``), 0/1 (``_zero_one``),
smooth (``_smooth``), DataCost (``_datacost_*``) and distributed (``_dask_path``) paths; each
hands its candidates to ``_audit.first_accepted``; ``_bounds`` adds certified lower bounds and
``_inference`` the standard errors; ``_budget`` (``budget_used``) compares a certificate with
an observed shift's cost. Imports only :mod:`otstab.modeling` and below.
"""

from ._audit import first_accepted
from ._budget import BudgetUse, budget_used
from ._core import certify, certify_distances
from ._datacost_certify import certify_datacost
from ._inference import Bootstrap, Inference
from ._results import StabilityResult

__all__ = ["certify", "certify_distances", "certify_datacost", "StabilityResult", "Bootstrap",
           "Inference", "first_accepted", "budget_used", "BudgetUse"]
