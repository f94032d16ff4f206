"""Stability-guided training for MLPs in PyTorch: adversarial and tilted MLP classifiers.

The MLP counterparts of :mod:`otstab.train` (docs/dro.md). Both estimators minimise, over
mini-batches ``B``,

    J_B(theta) = T_t( l_gamma(z_i; theta), i in B ) + alpha ||W||^2 / (2 n),

with the cross-entropy loss ``l`` of the network's logits (binary: one logit, multiclass: one
per class), ``T_t(v) = t log mean exp(v / t)`` (``t = inf``: the mean) and the d-transform
``l_gamma(z_i) = sup_x l(f(x), y_i) - gamma ||x - x_i||^2_M`` (``gamma = inf``: the plain loss).
For an MLP the inner sup has no closed form: :func:`inner_maximise` approximates it by
``inner_steps`` steps of gradient ascent on ``x`` (only the features of ``M`` move; the best
iterate per sample is kept, so the objective never falls below its value at ``x_i``), and the
outer step is the gradient of the loss at the found points (Sinha, Namkoong, Duchi 2018; the
paper's adversarial training, targeted when ``features`` is given).

:class:`AdversarialMLPClassifier` is ``t = inf``, :class:`TiltedMLPClassifier` is ``gamma =
inf``; with ``gamma = t = inf`` both are the same ERM training (same seed, same weights).
Weights are initialised and batches shuffled from ``numpy.random.default_rng(seed)`` and the
network is trained in float64 with Adam, so a fit is deterministic given ``seed``.

The fitted estimators expose ``coefs_``, ``intercepts_``, ``activation`` and
``out_activation_`` as scikit-learn's ``MLPClassifier`` does, so :func:`otstab.certify` adapts
them through :class:`otstab.nonlinear.MLPModel` and the certified MLP bounds of
:mod:`otstab.bounds` apply. This module needs PyTorch (``pip install "otstab[torch]"``);
``otstab`` itself never imports it.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

try:
    import torch
except ImportError as exc:
    raise ImportError('otstab.train_torch needs PyTorch: pip install "otstab[torch]"') from exc

from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from .._validation import check_positive_extended
from ..errors import InputTypeError, ValidationError
from ..modeling._reduction import feature_mask

__all__ = ["AdversarialMLPClassifier", "TiltedMLPClassifier", "inner_maximise",
           "tilted_mean"]

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "logistic": torch.sigmoid,
                "identity": lambda z: z}


def _forward(weights, biases, X, activation):
    """Logits of the MLP (before the output activation): (n, k) tensor."""
    act = _ACTIVATIONS[activation]
    A = X
    for W, b in zip(weights[:-1], biases[:-1]):
        A = act(A @ W + b)
    return A @ weights[-1] + biases[-1]


def _cross_entropy(logits, target):
    """Per-sample cross-entropy: one logit and 0/1 targets (binary), else class indices."""
    if logits.shape[1] == 1:
        return torch.nn.functional.binary_cross_entropy_with_logits(
            logits[:, 0], target.to(logits.dtype), reduction="none")
    return torch.nn.functional.cross_entropy(logits, target, reduction="none")


def tilted_mean(values, t):
    """``t log mean exp(values / t)`` (the mean when ``t = inf``) of a 1-D tensor."""
    if math.isinf(t):
        return values.mean()
    return t * (torch.logsumexp(values / t, dim=0) - math.log(values.shape[0]))


def inner_maximise(loss_fn, X, gamma, *, mask=None, steps=10, step_size=None):
    """Approximate ``x*_i = argmax_x loss_fn(x)_i - gamma ||x - x_i||^2_M`` by gradient ascent.

    ``loss_fn`` maps an (n, d) tensor to the n per-sample losses; ``X`` is the (n, d) tensor
    of starting points ``x_i``; ``mask`` a boolean (d,) tensor of the coordinates that may move
    (default all). The default ``step_size = 1 / (2 gamma)`` makes each step the fixed-point map
    ``x <- x_i + M grad loss(x) / (2 gamma)`` (exact after one step for a linear score). The
    best iterate per sample is returned (detached), with its objective value, so the value is
    at least ``loss_fn(X)``. ``gamma = inf`` returns ``X``.
    """
    X = X.detach()
    with torch.no_grad():
        base = loss_fn(X)
    if math.isinf(gamma):
        return X, base
    eta = 1.0 / (2.0 * gamma) if step_size is None else float(step_size)
    best, best_val = X.clone(), base.clone()
    x = X.clone()
    for _ in range(steps):
        x.requires_grad_(True)
        loss = loss_fn(x)
        (grad,) = torch.autograd.grad(loss.sum(), x)
        with torch.no_grad():
            ascent = grad - 2.0 * gamma * (x - X)
            if mask is not None:
                ascent = ascent * mask
            x = x.detach() + eta * ascent
            val = loss_fn(x) - gamma * torch.sum((x - X) ** 2, dim=1)
            better = val > best_val
            best[better] = x[better]
            best_val = torch.where(better, val, best_val)
    return best, best_val


def _is_int(v):
    return isinstance(v, Integral) and not isinstance(v, (bool, np.bool_))


def _check_int(v, name, lowest):
    if not _is_int(v):
        raise InputTypeError(f"{name} must be an integer >= {lowest}, got {v!r}")
    if v < lowest:
        raise ValidationError(f"{name} must be an integer >= {lowest}, got {v!r}")


def _check_real(v, name, *, zero_ok=False):
    """A finite real number > 0 (>= 0 with ``zero_ok``)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, Real):
        raise InputTypeError(f"{name} must be a real number, got {type(v).__name__}")
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        kind = "non-negative" if zero_ok else "positive"
        raise ValidationError(f"{name} must be a {kind} finite number, got {v!r}")
    return float(v)


class _RobustMLP(ClassifierMixin, BaseEstimator):
    """MLP classifier minimising ``T_t(l_gamma) + alpha ||W||^2 / (2 n)`` by mini-batch Adam."""

    def _prices(self):  # (gamma, t, features, inner_steps, inner_lr)
        raise NotImplementedError

    def _check_params(self):
        sizes = self.hidden_layer_sizes
        try:
            sizes = (sizes,) if _is_int(sizes) else tuple(sizes)
        except TypeError:
            sizes = ()
        if not sizes or not all(_is_int(s) and s >= 1 for s in sizes):
            raise ValidationError("hidden_layer_sizes must be a non-empty sequence of positive "
                                  f"integers, got {self.hidden_layer_sizes!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValidationError(f"activation must be one of {sorted(_ACTIVATIONS)}, got "
                                  f"{self.activation!r}")
        for name in ("epochs", "batch_size"):
            _check_int(getattr(self, name), name, 1)
        _check_real(self.lr, "lr")
        _check_real(self.alpha, "alpha", zero_ok=True)
        _check_int(self.seed, "seed", 0)
        return [int(s) for s in sizes]

    def fit(self, X, y):
        """Fit on features ``X`` (n, d) and class labels ``y`` (binary or multiclass)."""
        sizes = self._check_params()
        gamma, t, features, steps, step_size = self._prices()
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        y_type = type_of_target(y, input_name="y", raise_unknown=True)
        if y_type not in ("binary", "multiclass"):
            raise ValueError(f"Unknown label type: {y_type}")
        self.classes_, codes = np.unique(y, return_inverse=True)
        k = self.classes_.size
        if k < 2:
            raise ValueError(f"{type(self).__name__} needs at least two classes; y has 1 class "
                             f"({self.classes_[0]!r})")
        n, d = X.shape
        names = list(getattr(self, "feature_names_in_", [])) or None
        mask = None if features is None else torch.as_tensor(
            feature_mask(d, features, names), dtype=torch.float64)
        rng = np.random.default_rng(self.seed)
        widths = [d, *sizes, 1 if k == 2 else k]
        params = []
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            bound = 1.0 / math.sqrt(fan_in)  # torch.nn.Linear's default range
            params.append(torch.tensor(rng.uniform(-bound, bound, (fan_in, fan_out)),
                                       requires_grad=True))
            params.append(torch.tensor(rng.uniform(-bound, bound, fan_out), requires_grad=True))
        weights, biases = params[0::2], params[1::2]
        Xt = torch.tensor(X)
        target = torch.as_tensor(codes, dtype=torch.int64)
        opt = torch.optim.Adam(params, lr=self.lr)
        reg = self.alpha / (2.0 * n)
        self.loss_curve_ = []
        for _ in range(self.epochs):
            order = rng.permutation(n)
            total = 0.0
            for start in range(0, n, self.batch_size):
                idx = torch.as_tensor(order[start:start + self.batch_size])
                xb, tb = Xt[idx], target[idx]

                def loss_fn(x, tb=tb):
                    return _cross_entropy(_forward(weights, biases, x, self.activation), tb)

                x_star, _ = inner_maximise(loss_fn, xb, gamma, mask=mask,
                                           steps=steps, step_size=step_size)
                objective = tilted_mean(loss_fn(x_star), t)
                penalty = reg * sum(torch.sum(W * W) for W in weights)
                opt.zero_grad()
                (objective + penalty).backward()
                opt.step()
                total += float(objective.detach()) * len(idx)
            self.loss_curve_.append(total / n)
        self.coefs_ = [W.detach().numpy().copy() for W in weights]
        self.intercepts_ = [b.detach().numpy().copy() for b in biases]
        self.n_layers_ = len(widths)
        self.n_outputs_ = widths[-1]
        self.out_activation_ = "logistic" if k == 2 else "softmax"
        self.n_iter_ = self.epochs
        return self

    def _logits(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        with torch.no_grad():
            out = _forward([torch.as_tensor(W) for W in self.coefs_],
                           [torch.as_tensor(b) for b in self.intercepts_], torch.tensor(X),
                           self.activation)
        return out.numpy()

    def decision_function(self, X):
        """The logit (binary, shape (n,)) or the class logits (multiclass, shape (n, k))."""
        out = self._logits(X)
        return out[:, 0] if out.shape[1] == 1 else out

    def predict_log_proba(self, X):
        s = self.decision_function(X)
        if s.ndim == 1:
            return np.column_stack([-np.logaddexp(0.0, s), -np.logaddexp(0.0, -s)])
        mx = np.max(s, axis=1, keepdims=True)
        return s - mx - np.log(np.sum(np.exp(s - mx), axis=1, keepdims=True))

    def predict_proba(self, X):
        return np.exp(self.predict_log_proba(X))

    def predict(self, X):
        s = self.decision_function(X)
        idx = (s > 0).astype(int) if s.ndim == 1 else np.argmax(s, axis=1)
        return self.classes_[idx]


class AdversarialMLPClassifier(_RobustMLP):
    """Adversarially trained MLP classifier (Wasserstein AT; targeted AT with ``features``).

    Minimises ``mean_i sup_x [CE(f(x), y_i) - gamma ||x - x_i||^2_M] + alpha ||W||^2 / (2 n)``
    over mini-batches; the inner sup by ``inner_steps`` steps of gradient ascent on ``x``
    (:func:`inner_maximise`).

    Parameters
    ----------
    hidden_layer_sizes : tuple of int
        Widths of the hidden layers, as in scikit-learn's ``MLPClassifier``.
    gamma : float in (0, inf]
        Price of moving a training sample (smaller: stronger adversary); ``inf``: ERM.
    features : sequence of column names or indices, optional
        Only these features may be perturbed (targeted AT, Sec. 4.2); default all.
    inner_steps : int >= 0
        Gradient-ascent steps of the inner maximisation.
    inner_lr : float, optional
        Step size of the inner ascent; default ``1 / (2 gamma)``.
    activation : {"relu", "tanh", "logistic", "identity"}
    alpha : float >= 0
        L2 penalty on the weights (not the biases), ``alpha ||W||^2 / (2 n)``.
    lr, epochs, batch_size : Adam step size, passes over the data, mini-batch size.
    seed : int
        Seeds the initial weights and the batch order.
    """

    def __init__(self, hidden_layer_sizes=(32,), gamma=1.0, features=None, inner_steps=10,
                 inner_lr=None, activation="relu", alpha=1e-4, lr=0.01, epochs=100,
                 batch_size=64, seed=0):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.gamma = gamma
        self.features = features
        self.inner_steps = inner_steps
        self.inner_lr = inner_lr
        self.activation = activation
        self.alpha = alpha
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.seed = seed

    def _prices(self):
        gamma = check_positive_extended(self.gamma, "gamma")
        _check_int(self.inner_steps, "inner_steps", 0)
        if self.inner_lr is not None:
            _check_real(self.inner_lr, "inner_lr")
        return gamma, math.inf, self.features, self.inner_steps, self.inner_lr


class TiltedMLPClassifier(_RobustMLP):
    """Tilted ERM for an MLP classifier (the paper's App. D.2).

    Minimises ``t log mean_{i in B} exp(CE_i / t) + alpha ||W||^2 / (2 n)`` over mini-batches
    ``B``: ERM as ``t -> inf``, the largest batch loss as ``t -> 0``.

    Parameters
    ----------
    hidden_layer_sizes : tuple of int
    t : float in (0, inf]
        Tilt (the KL reweighting price); ``inf``: ERM.
    activation, alpha, lr, epochs, batch_size, seed :
        as in :class:`AdversarialMLPClassifier`.
    """

    def __init__(self, hidden_layer_sizes=(32,), t=1.0, activation="relu", alpha=1e-4,
                 lr=0.01, epochs=100, batch_size=64, seed=0):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.t = t
        self.activation = activation
        self.alpha = alpha
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.seed = seed

    def _prices(self):
        return math.inf, check_positive_extended(self.t, "t"), None, 0, None
