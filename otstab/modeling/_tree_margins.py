"""The raw margins of boosted tree ensembles, for the logistic and cross-entropy losses.

A boosted classifier (scikit-learn ``GradientBoostingClassifier`` and
``HistGradientBoostingClassifier``, XGBoost, LightGBM, CatBoost) scores a row with a sum of
leaf values, its *margin*: binary, one log-odds ``m`` of ``classes_[1]``; ``K`` classes, ``K``
logits. With ``loss="logistic"`` (binary) or ``"cross_entropy"`` the loss of a row is the
negative log-likelihood of its label under ``sigmoid(m)`` / ``softmax(F)``: the model's own
``predict_proba`` when the margin is a log-odds, which :func:`check_log_odds` verifies on the
evaluation rows before any certificate is made (a model whose probabilities are another
function of the margin, such as gradient boosting with ``loss="exponential"`` or LightGBM with
``sigmoid != 1``, is refused).

Random forests, extra trees and single decision trees average leaf *probabilities*: their
scores are not logits (a leaf may give a class probability 0, an infinite cross-entropy), so
the smooth losses are refused for them; they have the 0/1 loss.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputTypeError
from . import _trees as trees

__all__ = ["BOOSTED_SKLEARN", "has_margins", "raw_scores", "check_log_odds", "refusal"]

#: scikit-learn classifiers whose ``decision_function`` is a sum of leaf values
BOOSTED_SKLEARN = ("GradientBoostingClassifier", "HistGradientBoostingClassifier")

#: largest difference between ``softmax(margins)`` and ``predict_proba`` put down to rounding
#: (XGBoost and LightGBM sum and squash in float32)
PROBA_ATOL = 1e-5


def has_margins(model) -> bool:
    """Whether ``model`` is a boosted tree classifier with raw margins (no check of what its
    probabilities are: :func:`check_log_odds`)."""
    if type(model).__name__ in BOOSTED_SKLEARN:
        return hasattr(model, "decision_function")
    return trees.library(model) is not None and hasattr(model, "classes_")


def refusal(model) -> str:
    """Why the smooth losses are not available for the tree model ``model``."""
    name = type(model).__name__
    if name in ("RandomForestClassifier", "ExtraTreesClassifier", "DecisionTreeClassifier",
                "ExtraTreeClassifier"):
        return (f"{name} averages leaf probabilities: its scores are not logits (a leaf may "
                "give a class probability 0), so loss='logistic' / 'cross_entropy' is not "
                "defined on its margin; use loss='zero_one'")
    return (f"a {name} is used through its predictions only, which supports only "
            "loss='zero_one'")


def raw_scores(model, X) -> np.ndarray:
    """The model's own margins, shape (n, K) (binary: the columns 0 and the log-odds)."""
    if type(model).__name__ in BOOSTED_SKLEARN:
        out = np.asarray(model.decision_function(X), dtype=np.float64)
        if out.ndim == 1:
            out = np.column_stack([np.zeros(out.size), out])
        return out
    return trees.raw_margins(model, X)


def softmax(S: np.ndarray) -> np.ndarray:
    """Row-wise softmax of scores (n, K)."""
    E = np.exp(S - S.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def check_log_odds(model, X) -> None:
    """Raise :class:`~otstab.errors.InputTypeError` unless ``softmax(raw_scores)`` is the
    model's ``predict_proba`` on the rows ``X`` (at most 64 are checked)."""
    Xc = X[:64]
    S = raw_scores(model, Xc)
    P = np.asarray(model.predict_proba(Xc), dtype=np.float64)
    if P.shape != S.shape or not np.allclose(softmax(S), P, rtol=0, atol=PROBA_ATOL):
        raise InputTypeError(
            f"{type(model).__name__}: predict_proba is not the softmax (binary: the sigmoid) of "
            "the raw margins (another objective, e.g. loss='exponential' or a LightGBM "
            "sigmoid != 1), so the logistic / cross-entropy loss on the margin is not the "
            "model's log-loss; use loss='zero_one'")
