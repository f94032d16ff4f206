"""otstab: how much would the world have to change before this model fails?

Computes the optimal-transport stability criterion of Blanchet, Cui, Li and Liu (ICML 2024):
the smallest OT perturbation of the evaluation data -- moving samples (data corruption, priced
by ``theta1``) and reweighting them (sub-population shift, priced by ``theta2``) -- that drives
the model's risk up to a threshold ``r``. Also: worst-case subpopulation risk, conditional-shift
stability and group metrics.

Public names are imported lazily so ``import otstab`` stays fast and optional parts never load
their dependencies until used.
"""

from importlib import import_module

__version__ = "0.1.0"

_LAZY = {
    # core (certify and friends)
    "certify": "otstab.core",
    "certify_distances": "otstab.core",
    "stability_curve": "otstab.sweeps",
    "feature_stability": "otstab.features",
    "FeatureStability": "otstab.features",
    "StabilityCurve": "otstab.sweeps",
    "StabilityResult": "otstab.results",
    "LinearModel": "otstab.models",
    "Bootstrap": "otstab.inference",
    "DataCost": "otstab.datacost",
    # related evaluations
    "worst_subpopulation": "otstab.worst_case",
    "conditional_shift": "otstab.worst_case",
    "WorstCaseResult": "otstab.worst_case",
    "ConditionalShiftResult": "otstab.worst_case",
    "worst_subpopulation_of_model": "otstab.worst_case",
    "conditional_shift_of_model": "otstab.worst_case",
    "group_metrics": "otstab.groups",
    "diagnose_shift": "otstab.groups",
    "ShiftDiagnosis": "otstab.groups",
    "select_model": "otstab.groups",
    "GroupMetrics": "otstab.groups",
    "ModelSelection": "otstab.groups",
    "subset_distances": "otstab.subsets",
    "SubsetDistances": "otstab.subsets",
    # the inverse question and model comparison
    "worst_case_risk": "otstab.dro",
    "WorstCaseRisk": "otstab.dro",
    "compare": "otstab.comparison",
    "Comparison": "otstab.comparison",
    "harden": "otstab.train",
    "HardenResult": "otstab.train",
}
_SUBMODULES = {"losses", "errors", "datasets", "plot", "models", "results", "certificate",
               "report", "cli", "nonlinear", "perturbation", "zero_one", "train",
               "worst_case", "groups", "subsets", "features", "sweeps", "inference", "dro",
               "comparison", "pipeline", "core", "audit", "params", "piecewise", "smooth",
               "reduction", "datacost", "datacost_linear", "datacost_zero_one", "datacost_hinge",
               "datacost_smooth", "datacost_inference", "datacost_certify",
               "datacost_features"}

__all__ = sorted(set(_LAZY) | _SUBMODULES | {"__version__"})


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = import_module(f"otstab.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'otstab' has no attribute {name!r}")


def __dir__():
    return __all__
