"""The related shift evaluations: worst-case subpopulation risk, conditional-shift stability,
group metrics, shift diagnosis, model selection and subset distances. They share the input
checks of the bottom layer and the losses of :mod:`otstab.modeling`; they do not use the OT
solvers. Their figures are in :mod:`otstab.plot` (``plot_worst_case``,
``plot_conditional_shift``).

Modules: ``_inputs`` (what worst_subpopulation and conditional_shift share),
``_worst_subpopulation``, ``_conditional_shift``, ``_group_metrics``, ``_diagnosis``,
``_selection``, ``_subsets``; and the cost of an observed shift in a certificate's units
(``_shift_cost``: ``shift_cost``, ``ShiftCost``; it uses the OT transport program, not the
certificate solvers; ``_shift_torch``: its dual's passes on a torch device, ``device=``) with
its history (``_history``: ``History``, SQLite).
"""

from ._conditional_shift import (
    ConditionalShiftResult,
    conditional_shift,
    conditional_shift_of_model,
)
from ._diagnosis import SHIFT_THRESHOLDS, SHIFT_TYPES, ShiftDiagnosis, diagnose_shift
from ._group_metrics import GroupMetrics, group_metrics, per_class_frame, summary_frame
from ._history import History
from ._inputs import DEFAULT_P_GRID
from ._selection import CRITERIA, ModelSelection, select_model
from ._shift_cost import ShiftCost, pairwise_datacost, shift_cost
from ._subsets import SubsetDistances, subset_distances
from ._worst_subpopulation import (
    WorstCaseResult,
    worst_subpopulation,
    worst_subpopulation_of_model,
)

__all__ = ["worst_subpopulation", "worst_subpopulation_of_model", "WorstCaseResult",
           "conditional_shift", "conditional_shift_of_model", "ConditionalShiftResult",
           "DEFAULT_P_GRID", "group_metrics", "GroupMetrics", "summary_frame",
           "per_class_frame", "diagnose_shift", "ShiftDiagnosis", "SHIFT_THRESHOLDS",
           "SHIFT_TYPES", "select_model", "ModelSelection", "CRITERIA", "subset_distances",
           "SubsetDistances", "shift_cost", "ShiftCost", "pairwise_datacost", "History"]
