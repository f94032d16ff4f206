"""Training with the same machinery: adversarial and tilted logistic regression, and ``harden``.

Both estimators minimise one distributionally robust objective built from the two halves of
the paper's lifted cost (docs/dro.md):

    J(w, b) = T_t( l_gamma(z_1; w, b), ..., l_gamma(z_n; w, b) ) + ||w||^2 / (2 C n),

* ``l_gamma(z_i) = sup_x loss(x, y_i) - gamma ||x - x_i||^2_M``, the d-transform of the logistic
  loss at ``h = 1`` with moving price ``gamma`` (``M``: the features allowed to move), computed
  exactly by :class:`otstab_solvers.smooth.LogisticOracle` (a 1-D root search per sample, no
  inner gradient loop); ``gamma = inf`` gives the plain loss;
* ``T_t(v) = t log mean exp(v / t)``, the KL reweighting term with price ``t``; ``t = inf``
  gives the mean.

:class:`AdversarialLogisticRegression` is ``t = inf`` (adversarial training, AT, in the
Wasserstein form of Sinha et al. 2018; with ``features=[...]`` the targeted AT of the paper's
Sec. 4.2), :class:`TiltedLogisticRegression` is ``gamma = inf`` (tilted ERM, the paper's App. D.2
form ``t log E exp(loss / t)``: ERM as ``t -> inf``, the largest loss as ``t -> 0``). With
``gamma = t = inf`` the objective is scikit-learn's ``LogisticRegression(C=C)`` (divided by
``C n``), so the fitted coefficients match it.

Gradients: by the envelope theorem the gradient of ``l_gamma`` in ``(w, b)`` is the gradient
of the loss at the maximiser ``x*_i`` (unique for the logistic loss except on a null set), and
the gradient of ``T_t`` weights the samples by ``w_i = n softmax(l_i / t)``.

PyTorch versions for MLPs are in :mod:`otstab.train_torch` (``AdversarialMLPClassifier``,
``TiltedMLPClassifier``; the ``torch`` extra).
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from numbers import Real

import numpy as np
import pandas as pd
from otstab_solvers.smooth import LogisticOracle
from otstab_solvers.weights import kl_dual_term, kl_weights
from scipy.optimize import minimize
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.model_selection import ParameterGrid
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from .._progress import check_progress, progress_bar
from .._results import ResultMixin
from .._validation import check_positive_extended, renamed_kwargs
from ..analysis._features import feature_stability
from ..errors import InputTypeError, ValidationError
from ..modeling._reduction import feature_mask
from ..solve._core import certify

__all__ = ["AdversarialLogisticRegression", "TiltedLogisticRegression", "robust_objective",
           "select_by_validation", "harden", "HardenResult"]

log = logging.getLogger(__name__)


def robust_objective(coef, intercept, X, signs, *, gamma=math.inf, t=math.inf, mask=None):
    """``(J, grad_coef, grad_intercept, X_star)``: the unregularised objective
    ``T_t(l_gamma)`` of the module docstring, its gradient and the maximisers ``x*_i``.

    ``signs`` are labels in {-1, +1}; ``mask`` a boolean vector of the features that may move
    (default all). ``X_star`` is ``X`` itself when ``gamma = inf``.
    """
    coef = np.asarray(coef, dtype=np.float64)
    n = X.shape[0]
    margins = signs * (X @ coef + intercept)
    if math.isinf(gamma):
        values = np.logaddexp(0.0, -margins)
        X_star = X
        moved = margins
    else:
        oracle = LogisticOracle.from_linear(X, signs, coef, intercept, gamma, mask)
        values = oracle.evaluate(1.0)[0]
        X_star = oracle.argmax(1.0)
        moved = margins - oracle.steps(1.0)  # the margin at the maximiser
    w = kl_weights(values, t)  # all ones when t = inf
    J = kl_dual_term(values, t)
    g = w * signs * expit(-moved)  # -d loss / d score at x*, weighted
    grad_coef = -(g @ X_star) / n
    grad_intercept = -float(np.sum(g)) / n
    return J, grad_coef, grad_intercept, X_star


class _RobustLogistic(ClassifierMixin, BaseEstimator):
    """Binary logistic regression minimising ``T_t(l_gamma) + ||w||^2 / (2 C n)`` by L-BFGS."""

    def _prices(self):  # (gamma, t, features)
        raise NotImplementedError

    def _check_params(self):
        if isinstance(self.C, (bool, np.bool_)) or not isinstance(self.C, Real) \
                or not self.C > 0 or not math.isfinite(self.C):
            raise ValidationError(f"C must be a positive finite number, got {self.C!r}")
        if isinstance(self.max_iter, (bool, np.bool_)) or not isinstance(
                self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise ValidationError(f"max_iter must be a positive integer, got {self.max_iter!r}")
        if isinstance(self.tol, (bool, np.bool_)) or not isinstance(self.tol, Real) \
                or not self.tol > 0:
            raise ValidationError(f"tol must be a positive number, got {self.tol!r}")

    def fit(self, X, y):
        """Fit on features ``X`` (n, d) and binary labels ``y``."""
        self._check_params()
        gamma, t, features = self._prices()
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        y_type = type_of_target(y, input_name="y", raise_unknown=True)
        if y_type != "binary":
            raise ValueError("Only binary classification is supported. The type of the target "
                             f"is {y_type}.")
        self.classes_ = np.unique(y)
        if self.classes_.size != 2:
            raise ValueError(f"{type(self).__name__} needs two classes; y has 1 class "
                             f"({self.classes_[0]!r})")
        names = list(getattr(self, "feature_names_in_", [])) or None
        mask = feature_mask(X.shape[1], features, names)
        signs = np.where(y == self.classes_[1], 1.0, -1.0)
        n, d = X.shape
        reg = 1.0 / (self.C * n)

        def fun(p):
            J, gc, gi, _ = robust_objective(p[:d], p[d], X, signs, gamma=gamma, t=t, mask=mask)
            return J + 0.5 * reg * float(p[:d] @ p[:d]), np.append(gc + reg * p[:d], gi)

        res = minimize(fun, np.zeros(d + 1), jac=True, method="L-BFGS-B",
                       options={"maxiter": self.max_iter, "gtol": self.tol, "ftol": 1e-15})
        self.coef_ = res.x[:d][None, :].copy()
        self.intercept_ = np.array([res.x[d]])
        self.n_iter_ = np.array([res.nit])
        self.objective_ = float(res.fun)
        return self

    def decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return X @ self.coef_[0] + self.intercept_[0]

    def predict(self, X):
        check_is_fitted(self)
        return self.classes_[(self.decision_function(X) > 0).astype(int)]

    def predict_proba(self, X):
        p = expit(self.decision_function(X))
        return np.column_stack([1.0 - p, p])

    def predict_log_proba(self, X):
        s = self.decision_function(X)
        return np.column_stack([-np.logaddexp(0.0, s), -np.logaddexp(0.0, -s)])

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags


class AdversarialLogisticRegression(_RobustLogistic):
    """Adversarially trained binary logistic regression (Wasserstein AT; targeted AT).

    Minimises ``mean_i sup_x [loss(x, y_i) - gamma ||x - x_i||^2_M] + ||w||^2 / (2 C n)``; the
    inner sup is the exact d-transform (no inner loop).

    Parameters
    ----------
    gamma : float in (0, inf]
        Price of moving a training sample (smaller: stronger adversary); ``inf``: ERM.
    features : sequence of column names or indices, optional
        Only these features may be perturbed (targeted AT, Sec. 4.2); default all.
    C : float > 0
        Inverse L2 regularisation strength, as in scikit-learn's ``LogisticRegression``.
    max_iter, tol : L-BFGS settings.
    """

    def __init__(self, gamma=1.0, features=None, C=1.0, max_iter=500, tol=1e-8):
        self.gamma = gamma
        self.features = features
        self.C = C
        self.max_iter = max_iter
        self.tol = tol

    def _prices(self):
        return check_positive_extended(self.gamma, "gamma"), math.inf, self.features


class TiltedLogisticRegression(_RobustLogistic):
    """Tilted ERM for binary logistic regression (the paper's App. D.2).

    Minimises ``t log mean_i exp(loss_i / t) + ||w||^2 / (2 C n)``: ERM as ``t -> inf``, the
    largest loss as ``t -> 0``.

    Parameters
    ----------
    t : float in (0, inf]
        Tilt (the KL reweighting price); ``inf``: ERM.
    C, max_iter, tol : as in :class:`AdversarialLogisticRegression`.
    """

    def __init__(self, t=1.0, C=1.0, max_iter=500, tol=1e-8):
        self.t = t
        self.C = C
        self.max_iter = max_iter
        self.tol = tol

    def _prices(self):
        return math.inf, check_positive_extended(self.t, "t"), None


def select_by_validation(estimator, param_grid, X_train, y_train, X_val, y_val):
    """Hyperparameter selection by validation accuracy (the paper's App. D.3).

    Fits a clone of ``estimator`` for each setting of ``param_grid`` (a dict of lists, as in
    scikit-learn's ``ParameterGrid``) on the training set and keeps the one with the highest
    accuracy on the validation set (the first on ties). Returns ``(best fitted estimator,
    DataFrame of settings and validation accuracies)``.
    """
    rows, best, best_acc = [], None, -math.inf
    for params in ParameterGrid(param_grid):
        est = clone(estimator).set_params(**params).fit(X_train, y_train)
        acc = float(np.mean(est.predict(X_val) == np.asarray(y_val)))
        rows.append({**params, "val_accuracy": acc})
        if acc > best_acc:
            best, best_acc = est, acc
    return best, pd.DataFrame(rows)


@dataclass(repr=False)
class HardenResult(ResultMixin):
    """Before/after of :func:`harden`: the targeted feature's score (``certify`` with only that
    feature moving), the all-feature value, accuracy, and the hardened model.

    ``feature`` is the label of what was hardened (a feature, a block, or the names passed as
    ``features`` joined by ", "), ``columns`` the columns that moved; ``ranking`` the
    :class:`otstab.features.FeatureStability` that chose it (None when ``features`` was
    given)."""

    feature: str
    before: dict
    after: dict
    model: object = field(repr=False)
    ranking: object = field(default=None, repr=False)
    columns: list = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.before, self.after], index=["before", "after"])

    def _headline(self):
        return [("feature", self.feature),
                *[(f"{k}_{when}", getattr(self, when).get(k)) for k in ("score", "value",
                                                                      "accuracy")
                  for when in ("before", "after")]]

    def summary(self) -> str:
        return f"hardening feature {self.feature!r}\n{self.to_frame().to_string()}"

    def __str__(self) -> str:
        return self.summary()


@renamed_kwargs(feature="features", groups="feature_groups")
def harden(model, X, y, *, X_eval=None, y_eval=None, loss="zero_one", r, theta1=1.0,
           theta2=0.25, divergence="kl", features=None, feature_groups=None, gamma=1.0, C=1.0,
           progress=None, verbose=None) -> HardenResult:
    """Certify -> pick the most fragile feature -> targeted AT -> re-certify.

    ``model`` is a fitted binary linear classifier, ``X, y`` its training data, ``X_eval,
    y_eval`` the evaluation data (default the training data). Without ``features`` the feature
    (or block of ``feature_groups``) with the lowest :func:`otstab.feature_stability` score on
    the evaluation data is hardened; ``features`` (a column name or a list of them; formerly
    ``feature``) names the columns to harden instead. A
    :class:`AdversarialLogisticRegression` with ``gamma``, ``C`` and those columns as its
    ``features`` is fitted on ``X, y``; both models are certified on the evaluation data
    (``score``: only those columns move; ``value``: all features) and their accuracies
    reported (``print(result)`` shows the before/after table; it is also logged at INFO level
    on the ``"otstab"`` logger). ``progress``: a progress bar on stderr (None: only when
    stderr is a terminal). ``verbose`` is deprecated (it printed the table).
    """
    if verbose is not None:
        warnings.warn("harden(): 'verbose' is deprecated and will be removed in the next "
                      "release; the table is no longer printed: print(result), or see the "
                      "'otstab' logger at INFO level", FutureWarning, stacklevel=3)
    if not hasattr(model, "predict"):
        raise InputTypeError(f"model must be a fitted classifier, got {type(model).__name__}")
    show = check_progress(progress)
    X_eval = X if X_eval is None else X_eval
    y_eval = y if y_eval is None else y_eval
    settings = dict(loss=loss, r=r, theta1=theta1, theta2=theta2, divergence=divergence)
    ranking = None
    with progress_bar(6, "harden", show) as bar:
        if features is None:
            ranking = feature_stability(model, X_eval, y_eval, feature_groups=feature_groups,
                                        progress=False, **settings)
            label = ranking.table["feature"].iloc[0]
            cols = list(ranking.table["columns"].iloc[0])
        else:
            cols = [features] if isinstance(features, str) or np.ndim(features) == 0 \
                else list(features)
            if not cols:
                raise ValidationError("features must name at least one column")
            label = ", ".join(map(str, cols))
        bar.update()
        new = AdversarialLogisticRegression(gamma=gamma, features=cols, C=C).fit(X, y)
        bar.update()

        def row(m):
            out = {"score": certify(m, X_eval, y_eval, features=cols, **settings).value}
            bar.update()
            out["value"] = certify(m, X_eval, y_eval, **settings).value
            bar.update()
            out["accuracy"] = float(np.mean(m.predict(X_eval) == np.asarray(y_eval)))
            return out

        out = HardenResult(feature=str(label), before=row(model), after=row(new), model=new,
                           ranking=ranking, columns=[str(c) for c in cols])
    log.info("%s", out.summary())
    return out
