"""otstab: how much would the world have to change before this model fails?

Computes the optimal-transport stability criterion of Blanchet, Cui, Li and Liu (ICML 2024):
the smallest OT perturbation of the evaluation data -- moving samples (data corruption, priced
by ``theta1``) and reweighting them (sub-population shift, priced by ``theta2``) -- that drives
the model's risk up to a threshold ``r``. Also: worst-case subpopulation risk, conditional-shift
stability and group metrics.

Public names are imported lazily so ``import otstab`` stays fast and optional parts never load
their dependencies until used.
"""

import sys
from importlib import import_module
from importlib.abc import Loader, MetaPathFinder
from importlib.util import spec_from_loader

__version__ = "0.1.0"

_LAZY = {
    # core (certify and friends)
    "certify": "otstab.solve._core",
    "certify_distances": "otstab.solve._core",
    "stability_curve": "otstab.analysis._sweeps",
    "feature_stability": "otstab.analysis._features",
    "FeatureStability": "otstab.analysis._features",
    "StabilityCurve": "otstab.analysis._sweeps",
    "StabilityResult": "otstab.solve._results",
    "LinearModel": "otstab.modeling._models",
    "Bootstrap": "otstab.solve._inference",
    "DataCost": "otstab.modeling._datacost",
    # the cost of an observed shift and its history (issue 32)
    "shift_cost": "otstab.shift._shift_cost",
    "ShiftCost": "otstab.shift._shift_cost",
    "budget_used": "otstab.solve._budget",
    "BudgetUse": "otstab.solve._budget",
    "History": "otstab.shift._history",
    # related evaluations
    "worst_subpopulation": "otstab.shift._worst_subpopulation",
    "conditional_shift": "otstab.shift._conditional_shift",
    "WorstCaseResult": "otstab.shift._worst_subpopulation",
    "ConditionalShiftResult": "otstab.shift._conditional_shift",
    "worst_subpopulation_of_model": "otstab.shift._worst_subpopulation",
    "conditional_shift_of_model": "otstab.shift._conditional_shift",
    "group_metrics": "otstab.shift._group_metrics",
    "diagnose_shift": "otstab.shift._diagnosis",
    "ShiftDiagnosis": "otstab.shift._diagnosis",
    "select_model": "otstab.shift._selection",
    "GroupMetrics": "otstab.shift._group_metrics",
    "ModelSelection": "otstab.shift._selection",
    "subset_distances": "otstab.shift._subsets",
    "SubsetDistances": "otstab.shift._subsets",
    # the inverse question and model comparison
    "worst_case_risk": "otstab.analysis._dro",
    "WorstCaseRisk": "otstab.analysis._dro",
    "compare": "otstab.analysis._comparison",
    "Comparison": "otstab.analysis._comparison",
    "harden": "otstab.training._train",
    "HardenResult": "otstab.training._train",
}
# the modules users reach as ``otstab.<name>`` (kept from the flat layout): each is one private
# module of a subpackage, or a subpackage
_SUBMODULES = {
    "losses": "otstab.modeling._losses",
    "errors": "otstab.errors",
    "datasets": "otstab.datasets",
    "plot": "otstab.reporting._plot",
    "models": "otstab.modeling._models",
    "results": "otstab.solve._results",
    "certificate": "otstab.certificates",
    "report": "otstab.reporting._report",
    "cli": "otstab.cli",
    "nonlinear": "otstab.modeling._nonlinear",
    "perturbation": "otstab.modeling._perturbation",
    "zero_one": "otstab.solve._zero_one",
    "train": "otstab.training._train",
    "worst_case": "otstab.shift",
    "groups": "otstab.shift",
    "subsets": "otstab.shift._subsets",
    "features": "otstab.analysis._features",
    "sweeps": "otstab.analysis._sweeps",
    "inference": "otstab.solve._inference",
    "dro": "otstab.analysis._dro",
    "comparison": "otstab.analysis._comparison",
    "pipeline": "otstab.modeling._pipeline",
    "core": "otstab.solve._core",
    "audit": "otstab.solve._audit",
    "params": "otstab.modeling._params",
    "piecewise": "otstab.solve._piecewise",
    "smooth": "otstab.solve._smooth",
    "reduction": "otstab.modeling._reduction",
    "datacost": "otstab.modeling._datacost",
    "datacost_linear": "otstab.solve._datacost_linear",
    "datacost_zero_one": "otstab.solve._datacost_zero_one",
    "datacost_hinge": "otstab.solve._datacost_hinge",
    "datacost_smooth": "otstab.solve._datacost_smooth",
    "datacost_inference": "otstab.solve._datacost_inference",
    "datacost_features": "otstab.analysis._datacost_features",
    "datacost_certify": "otstab.solve._datacost_certify",
}
# the other modules of the flat layout, still reachable as ``otstab.<name>`` (not in __all__)
_MOVED = {
    "costs": "otstab.modeling._costs",
    "trees": "otstab.modeling._trees",
    "fingerprint": "otstab.modeling._fingerprint",
    "threads": "otstab.modeling._threads",
    "bounds": "otstab.solve._bounds",
    "dask_path": "otstab.solve._dask_path",
    "train_torch": "otstab.training._train_torch",
}
# the subpackages (docs/architecture.md), importable as ``otstab.<name>``
_SUBPACKAGES = {"modeling", "solve", "analysis", "training", "shift", "scale", "certificates",
                "reporting", "cli"}

__all__ = sorted(set(_LAZY) | set(_SUBMODULES) | {"__version__"})


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES or name in _MOVED or name in _SUBPACKAGES:
        module = import_module(_SUBMODULES.get(name) or _MOVED.get(name) or f"otstab.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'otstab' has no attribute {name!r}")


def __dir__():
    return __all__


class _FlatLayout(MetaPathFinder, Loader):
    """``import otstab.<name>`` / ``from otstab.<name> import x`` for a module of the flat
    layout of 0.1.0 (``otstab.losses``, ``otstab.certificate``, ...): the module it moved to,
    under both names (so objects pickled under the old module path load too)."""

    @staticmethod
    def _target(fullname):
        head, _, name = fullname.partition(".")
        if head != "otstab" or "." in name:
            return None
        target = _SUBMODULES.get(name) or _MOVED.get(name)
        return None if target in (None, fullname) else target

    def find_spec(self, fullname, path=None, target=None):
        return spec_from_loader(fullname, self) if self._target(fullname) else None

    def create_module(self, spec):
        module = import_module(self._target(spec.name))
        spec.loader_state = module.__spec__  # the import system sets module.__spec__ = spec
        return module

    def exec_module(self, module):
        # the module keeps its own spec (importlib.resources reads a package's from it)
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _FlatLayout) for f in sys.meta_path):
    sys.meta_path.append(_FlatLayout())
