"""Training models that are harder to break: robust logistic regressions, ``harden`` and (with
torch) robust MLPs. Built on :mod:`otstab.solve` and :mod:`otstab.analysis`.

The torch classifiers load lazily so that importing this package never imports torch.
"""

from importlib import import_module

from ._train import (
    AdversarialLogisticRegression,
    HardenResult,
    TiltedLogisticRegression,
    harden,
    robust_objective,
    select_by_validation,
)

_TORCH = {"AdversarialMLPClassifier", "TiltedMLPClassifier", "inner_maximise", "tilted_mean"}

__all__ = ["AdversarialLogisticRegression", "TiltedLogisticRegression", "harden", "HardenResult",
           "robust_objective", "select_by_validation", "AdversarialMLPClassifier",
           "TiltedMLPClassifier", "inner_maximise", "tilted_mean"]


def __getattr__(name):
    if name in _TORCH:
        return getattr(import_module("otstab.training._train_torch"), name)
    raise AttributeError(f"module 'otstab.training' has no attribute {name!r}")
