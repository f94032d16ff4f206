"""The related shift evaluations: worst-case subpopulation risk, conditional-shift stability,
group metrics, shift diagnosis, model selection and subset distances. They share the input
checks of :mod:`otstab.modeling` and the result mixin; they do not use the OT solvers."""

from ._groups import (
    GroupMetrics,
    ModelSelection,
    ShiftDiagnosis,
    diagnose_shift,
    group_metrics,
    select_model,
    summary_frame,
)
from ._subsets import SubsetDistances, subset_distances
from ._worst_case import (
    ConditionalShiftResult,
    WorstCaseResult,
    conditional_shift,
    conditional_shift_of_model,
    plot_conditional_shift,
    plot_worst_case,
    worst_subpopulation,
    worst_subpopulation_of_model,
)

__all__ = ["GroupMetrics", "ModelSelection", "ShiftDiagnosis", "diagnose_shift", "group_metrics",
           "select_model", "summary_frame", "SubsetDistances", "subset_distances",
           "ConditionalShiftResult", "WorstCaseResult", "conditional_shift",
           "conditional_shift_of_model", "plot_conditional_shift", "plot_worst_case",
           "worst_subpopulation", "worst_subpopulation_of_model"]
