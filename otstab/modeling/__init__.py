"""What is being certified: models, losses, costs and the reduced problem.

Model adapters (linear, nonlinear, tree ensembles), loss definitions, per-feature prices and
data costs, raw columns of a Pipeline, the piecewise reduced form and the distance search.
Everything here sits below the solving paths (:mod:`otstab.solve`) and never imports them.
"""

from ._costs import check_feature_costs
from ._datacost import DataCost, ResolvedCost, Variable
from ._losses import (
    LOSS_NAMES,
    Loss,
    MulticlassHinge,
    PiecewiseLinear,
    SmoothLoss,
    ZeroOne,
    absolute,
    epsilon_insensitive,
    get_loss,
    hinge,
    multiclass_hinge,
    pinball,
    zero_one,
)
from ._models import LinearModel, LinearScorer, Problem, per_sample_losses, resolve_model
from ._nonlinear import (
    CallableModel,
    DifferentiableModel,
    MLPModel,
    PredictOnlyModel,
    TorchModel,
    adapt,
)
from ._params import DIVERGENCES, SOLVERS
from ._perturbation import PerturbationResult, min_perturbation_distances, perturbation_search
from ._pipeline import auto_groups, raw_map, raw_view
from ._reduction import Reduced, reduce_problem

__all__ = ["check_feature_costs", "DataCost", "ResolvedCost", "Variable", "LOSS_NAMES", "Loss",
           "MulticlassHinge", "PiecewiseLinear", "SmoothLoss", "ZeroOne", "absolute",
           "epsilon_insensitive", "get_loss", "hinge", "multiclass_hinge", "pinball", "zero_one",
           "LinearModel", "LinearScorer", "Problem", "per_sample_losses", "resolve_model",
           "CallableModel", "DifferentiableModel", "MLPModel", "PredictOnlyModel", "TorchModel",
           "adapt", "DIVERGENCES", "SOLVERS", "PerturbationResult", "min_perturbation_distances",
           "perturbation_search", "auto_groups", "raw_map", "raw_view", "Reduced",
           "reduce_problem"]
