"""Questions answered with many certificates: per-feature stability, stability curves, model
comparison and the inverse question (worst-case risk at a budget). Built on
:mod:`otstab.solve`."""

from ._comparison import Comparison, compare, plot_compare
from ._dro import WorstCaseRisk, worst_case_risk
from ._features import FeatureStability, feature_stability
from ._sweeps import StabilityCurve, stability_curve

__all__ = ["compare", "Comparison", "plot_compare", "worst_case_risk", "WorstCaseRisk",
           "feature_stability", "FeatureStability", "stability_curve", "StabilityCurve"]
