"""Model adapters for nonlinear models (model layer): scikit-learn MLPs, PyTorch modules,
callables, linear models seen as differentiable functions, and predict-only classifiers.

The solving paths that use them live above this layer: :mod:`otstab.smooth` (exact smooth
losses of linear models and the first-order path) and :mod:`otstab.zero_one` (the 0/1 loss
through the perturbation search of :mod:`otstab.perturbation`). See docs/nonlinear.md.

Label conventions (internal labels, as produced by :func:`otstab.models.resolve_model`):
binary classifiers use ``-1/+1`` (``+1`` is ``classes_[1]``), multiclass ``0..K-1`` (indices
into ``classes_``), regressors the real targets.

Every adapter offers ``loss_and_grad(X, y)`` (the bound smooth loss and its gradient with
respect to ``X``), ``loss_values(X, y)``, ``predict_internal(X)``, ``zero_one(X, y)`` and, for
classifiers, ``margin_and_grad(X, y)`` (``margin > 0`` iff correctly classified).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
from scipy.special import expit

from .._validation import align_columns, as_float_matrix
from ..errors import IncompatibleLossError, InputTypeError, NotFittedError, ValidationError
from . import _tree_margins as tree_margins

__all__ = [
    "as_model_input",
    "DifferentiableModel",
    "MLPModel",
    "TorchModel",
    "CallableModel",
    "LinearDifferentiable",
    "PredictOnlyModel",
    "adapt",
    "zero_one_loss",
    "loss_name",
    "SMOOTH_LOSSES",
]

SMOOTH_LOSSES = ("logistic", "cross_entropy", "squared")
_TASKS = ("binary", "multiclass", "regression")


def loss_name(loss) -> str:
    """The canonical name of a loss given as a name or a Loss object."""
    name = getattr(loss, "name", loss)
    if not isinstance(name, str):
        raise InputTypeError(f"loss must be a name or an otstab.losses.Loss, got "
                             f"{type(loss).__name__}")
    key = name.strip().lower().replace("-", "_").replace("0/1", "zero_one")
    return key


# ----------------------------------------------------------------------------------------------
# per-sample loss / margin from model outputs (shared by all adapters)
# ----------------------------------------------------------------------------------------------


def _loss_from_outputs(task: str, loss: str, out: np.ndarray, y: np.ndarray):
    """Per-sample loss and its derivative with respect to the model outputs."""
    if task == "binary":
        z = out
        yy = y.astype(np.float64)
        if loss in ("logistic", "cross_entropy"):
            val = np.logaddexp(0.0, -yy * z)
            dout = -yy * expit(-yy * z)
            return val, dout
    elif task == "multiclass":
        if loss == "cross_entropy":
            S = out
            idx = y.astype(np.intp)
            mx = np.max(S, axis=1, keepdims=True)
            E = np.exp(S - mx)
            tot = np.sum(E, axis=1, keepdims=True)
            lse = (mx + np.log(tot))[:, 0]
            rows = np.arange(S.shape[0])
            val = lse - S[rows, idx]
            dout = E / tot
            dout[rows, idx] -= 1.0
            return val, dout
    elif task == "regression" and loss == "squared":
        e = y.astype(np.float64) - out
        return e * e, -2.0 * e
    raise IncompatibleLossError(f"loss {loss!r} does not fit a {task} model")


def _margin_from_outputs(task: str, out: np.ndarray, y: np.ndarray):
    """Margin (> 0 iff correctly classified, ties count as errors) and d margin / d outputs."""
    if task == "binary":
        yy = y.astype(np.float64)
        return yy * out, yy.copy()
    if task == "multiclass":
        S = out
        idx = y.astype(np.intp)
        rows = np.arange(S.shape[0])
        other = S.copy()
        other[rows, idx] = -np.inf
        k = np.argmax(other, axis=1)
        marg = S[rows, idx] - S[rows, k]
        dout = np.zeros_like(S)
        dout[rows, idx] = 1.0
        dout[rows, k] -= 1.0
        return marg, dout
    raise IncompatibleLossError("margins are defined for classifiers only")


def _predict_from_outputs(task: str, out: np.ndarray) -> np.ndarray:
    if task == "binary":
        return np.where(out > 0, 1.0, -1.0)
    if task == "multiclass":
        return np.argmax(out, axis=1)
    return out


# ----------------------------------------------------------------------------------------------
# base adapter
# ----------------------------------------------------------------------------------------------


class DifferentiableModel:
    """Base class of the model adapters.

    Subclasses implement ``_outputs_and_vjp(X, fn)``: compute the model outputs ``out`` on
    ``X`` (binary: the logit of ``classes[1]``, shape (n,); multiclass: the softmax logits,
    (n, K); regression: the prediction, (n,)), call ``fn(out) -> (values, dvalues/dout)`` and
    return ``(values, d sum(values) / dX)``; and ``outputs(X)``.
    """

    task: str = "binary"
    classes: np.ndarray | None = None
    loss_name: str | None = None
    differentiable: bool = True

    # -- to implement -------------------------------------------------------------------------
    def outputs(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _outputs_and_vjp(self, X: np.ndarray, fn):  # pragma: no cover - abstract
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------
    def bind_loss(self, loss) -> DifferentiableModel:
        """Choose the loss (name or ``otstab.losses.Loss``); checks that it fits the model."""
        name = loss_name(loss)
        ok = {"logistic": ("binary",), "cross_entropy": ("binary", "multiclass"),
              "squared": ("regression",), "zero_one": ("binary", "multiclass")}
        if name not in ok:
            raise IncompatibleLossError(
                f"loss {name!r} is not available for {self._user_name()}: nonlinear models "
                "support 'logistic', 'cross_entropy' (classifiers), 'squared' (regressors) and "
                "'zero_one' (classifiers)")
        if self.task not in ok[name]:
            raise IncompatibleLossError(f"loss {name!r} does not fit a {self.task} model")
        if name != "zero_one" and not self.differentiable:
            raise IncompatibleLossError(
                f"loss {name!r} needs a differentiable model (gradients of its outputs); "
                f"{self._user_name()} is used through its predictions only, which supports "
                "only loss='zero_one'")
        self.loss_name = name
        return self

    def _user_name(self) -> str:
        """The model as the user knows it, for messages: the class the user passed (a
        scikit-learn estimator, a PyTorch module), not the adapter that wraps it."""
        inner = getattr(self, "model", None)
        if inner is None:
            inner = getattr(self, "module", None)
        if inner is not None:
            return f"a {type(inner).__name__}"
        if getattr(self, "fn", None) is not None:
            return "the wrapped function"
        return "this model"

    def _smooth_loss(self) -> str:
        if self.loss_name is None:
            return "cross_entropy" if self.task != "regression" else "squared"
        if self.loss_name == "zero_one":
            raise IncompatibleLossError("the 0/1 loss has no gradient; use the perturbation "
                                        "distances (otstab.perturbation) instead")
        return self.loss_name

    def loss_and_grad(self, X, y):
        """``(loss (n,), d loss / d X (n, d))`` of the bound smooth loss (internal labels)."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y)
        loss = self._smooth_loss()
        return self._outputs_and_vjp(X, lambda out: _loss_from_outputs(self.task, loss, out, y))

    def margin_and_grad(self, X, y):
        """Classification margin (> 0 iff correct) and its gradient with respect to ``X``."""
        if self.task == "regression":
            raise IncompatibleLossError("margins are defined for classifiers only")
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y)
        return self._outputs_and_vjp(X, lambda out: _margin_from_outputs(self.task, out, y))

    def predict_internal(self, X) -> np.ndarray:
        """Predictions in the internal label coding (-1/+1, 0..K-1 or real values)."""
        return _predict_from_outputs(self.task, self.outputs(np.asarray(X, dtype=np.float64)))

    def zero_one(self, X, y) -> np.ndarray:
        """Misclassification indicator ``1[predict(x) != y]`` (classifiers)."""
        if self.task == "regression":
            raise IncompatibleLossError("the 0/1 loss is defined for classifiers only")
        pred = self.predict_internal(X)
        return (pred != np.asarray(y).astype(pred.dtype)).astype(np.float64)

    def loss_values(self, X, y) -> np.ndarray:
        """Per-sample value of the bound loss (0/1 included)."""
        if self.loss_name == "zero_one":
            return self.zero_one(X, y)
        loss = self._smooth_loss()
        out = self.outputs(np.asarray(X, dtype=np.float64))
        return _loss_from_outputs(self.task, loss, out, np.asarray(y))[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task={self.task!r}, loss={self.loss_name!r})"


# ----------------------------------------------------------------------------------------------
# scikit-learn MLP
# ----------------------------------------------------------------------------------------------

_ACTS = {
    "identity": (lambda Z: Z, lambda Z, A: np.ones_like(Z)),
    "logistic": (expit, lambda Z, A: A * (1.0 - A)),
    "tanh": (np.tanh, lambda Z, A: 1.0 - A * A),
    "relu": (lambda Z: np.maximum(Z, 0.0), lambda Z, A: (Z > 0).astype(Z.dtype)),
}


class MLPModel(DifferentiableModel):
    """A fitted scikit-learn ``MLPClassifier`` or ``MLPRegressor`` in numpy.

    The forward pass and the input gradient are computed from ``coefs_`` and ``intercepts_``
    (hidden activations identity, logistic, tanh, relu; the output is taken before the output
    activation: the logit for binary classifiers, the softmax logits for multiclass ones, the
    prediction for regressors). Multilabel classifiers and multi-output regressors are not
    supported.
    """

    def __init__(self, model):
        coefs = getattr(model, "coefs_", None)
        if coefs is None:
            raise NotFittedError(f"{type(model).__name__} is not fitted (no coefs_)")
        self.model = model
        self.W = [np.array(c, dtype=np.float64, copy=True) for c in coefs]
        self.b = [np.array(c, dtype=np.float64, copy=True) for c in model.intercepts_]
        act = getattr(model, "activation", "relu")
        if act not in _ACTS:
            raise InputTypeError(f"unsupported MLP activation {act!r}")
        self.activation = act
        out_act = getattr(model, "out_activation_", None)
        classes = getattr(model, "classes_", None)
        n_out = self.W[-1].shape[1]
        if classes is not None:
            classes = np.asarray(classes)
            if out_act == "logistic" and n_out == 1 and len(classes) == 2:
                self.task = "binary"
            elif out_act == "softmax" and n_out == len(classes) and len(classes) > 2:
                self.task = "multiclass"
            else:
                raise InputTypeError("multilabel MLPClassifiers are not supported "
                                     f"(out_activation_={out_act!r}, {n_out} outputs)")
            self.classes = classes
        else:
            if n_out != 1:
                raise InputTypeError(f"multi-output regressors are not supported ({n_out} "
                                     "outputs)")
            self.task = "regression"
            self.classes = None
        self.n_features = self.W[0].shape[0]

    def _forward(self, X):
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValidationError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        f = _ACTS[self.activation][0]
        cache = []
        A = X
        for W, b in zip(self.W[:-1], self.b[:-1]):
            Z = A @ W + b
            A = f(Z)
            cache.append((Z, A))
        out = A @ self.W[-1] + self.b[-1]
        if self.task != "multiclass":
            out = out[:, 0]
        return out, cache

    def outputs(self, X):
        return self._forward(np.asarray(X, dtype=np.float64))[0]

    def _outputs_and_vjp(self, X, fn):
        out, cache = self._forward(X)
        val, dout = fn(out)
        if dout.ndim == 1:
            dout = dout[:, None]
        dA = dout @ self.W[-1].T
        deriv = _ACTS[self.activation][1]
        for layer in range(len(cache) - 1, -1, -1):
            Z, A = cache[layer]
            dZ = dA * deriv(Z, A)
            dA = dZ @ self.W[layer].T
        return val, dA


# ----------------------------------------------------------------------------------------------
# PyTorch
# ----------------------------------------------------------------------------------------------


def _is_torch_module(obj) -> bool:
    return any(c.__name__ == "Module" and c.__module__.startswith("torch.nn")
               for c in type(obj).__mro__)


class TorchModel(DifferentiableModel):
    """A PyTorch ``nn.Module`` mapping a float tensor ``(n, d)`` to outputs.

    Parameters
    ----------
    module : torch.nn.Module
        Outputs: ``task="binary"``: shape (n,) or (n, 1) (the logit of ``classes[1]``) or (n, 2)
        (two logits; the logit difference is used); ``"multiclass"``: (n, K) softmax logits;
        ``"regression"``: (n,) or (n, 1).
    task : {"binary", "multiclass", "regression"}
    classes : array-like, optional
        The model's labels (binary default ``[0, 1]``; multiclass default ``0..K-1`` with ``K``
        the ``out_features`` of the last ``nn.Linear``).
    batch_size : int
        Rows per forward/backward pass.

    Notes
    -----
    torch is imported lazily. The module runs on the device of its parameters (move it to a GPU
    yourself to use one), in eval mode during each call (its previous mode is restored), and
    gradients are taken with respect to the input only (parameters' ``.grad`` are untouched).
    """

    def __init__(self, module, *, task: str, classes=None, batch_size: int = 8192):
        try:
            import torch  # noqa: PLC0415 - optional dependency
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("TorchModel needs PyTorch: pip install torch") from exc
        if not isinstance(module, torch.nn.Module):
            raise InputTypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if task not in _TASKS:
            raise ValidationError(f"task must be one of {_TASKS}, got {task!r}")
        self._torch = torch
        self.module = module
        self.task = task
        self.batch_size = int(batch_size)
        params = list(module.parameters())
        self.device = params[0].device if params else torch.device("cpu")
        self.dtype = params[0].dtype if params and params[0].is_floating_point() \
            else torch.float32
        if task == "regression":
            self.classes = None
        elif classes is not None:
            self.classes = np.asarray(classes)
        elif task == "binary":
            self.classes = np.array([0, 1])
        else:
            lin = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
            if not lin:
                raise ValidationError("classes is required for a multiclass TorchModel whose "
                                      "last layer is not an nn.Linear")
            self.classes = np.arange(lin[-1].out_features)
        if task == "binary" and self.classes is not None and len(self.classes) != 2:
            raise ValidationError(f"a binary TorchModel needs 2 classes, got {len(self.classes)}")

    @contextlib.contextmanager
    def _eval_mode(self):
        was_training = self.module.training
        self.module.eval()
        try:
            yield
        finally:
            self.module.train(was_training)

    def _shape_out(self, out):
        if self.task == "multiclass":
            if out.ndim != 2:
                raise ValidationError(f"a multiclass module must output (n, K), got "
                                      f"{tuple(out.shape)}")
            return out
        if out.ndim == 2 and out.shape[1] == 2 and self.task == "binary":
            return out[:, 1] - out[:, 0]
        if out.ndim == 2 and out.shape[1] == 1:
            return out[:, 0]
        if out.ndim != 1:
            raise ValidationError(f"a {self.task} module must output (n,) or (n, 1), got "
                                  f"{tuple(out.shape)}")
        return out

    def outputs(self, X):
        torch = self._torch
        X = np.asarray(X, dtype=np.float64)
        res = []
        with self._eval_mode(), torch.no_grad():
            for s in range(0, X.shape[0], self.batch_size):
                xt = torch.as_tensor(X[s:s + self.batch_size], dtype=self.dtype,
                                     device=self.device)
                res.append(self._shape_out(self.module(xt)).detach().cpu().double().numpy())
        return np.concatenate(res, axis=0) if res else np.zeros(0)

    def _outputs_and_vjp(self, X, fn):
        torch = self._torch
        vals, grads = [], []
        with self._eval_mode():
            for s in range(0, X.shape[0], self.batch_size):
                xt = torch.as_tensor(X[s:s + self.batch_size], dtype=self.dtype,
                                     device=self.device).requires_grad_(True)
                with torch.enable_grad():
                    out = self._shape_out(self.module(xt))
                    out_np = out.detach().cpu().double().numpy()
                    val, dout = fn(out_np)
                    (gx,) = torch.autograd.grad(
                        out, xt, grad_outputs=torch.as_tensor(dout, dtype=out.dtype,
                                                              device=out.device))
                vals.append(val)
                grads.append(gx.detach().cpu().double().numpy())
        return np.concatenate(vals), np.concatenate(grads, axis=0)


# ----------------------------------------------------------------------------------------------
# plain callables, linear models, predict-only classifiers
# ----------------------------------------------------------------------------------------------


class CallableModel(DifferentiableModel):
    """A user function ``fn(X, y) -> (loss, grad_X)`` as a model.

    Parameters
    ----------
    fn : callable
        Receives features (n, d) and internal labels (binary -1/+1, multiclass 0..K-1,
        regression targets) and returns the per-sample loss (n,) and its gradient (n, d).
    task : {"binary", "multiclass", "regression"}
    classes : array-like, optional
        The model's labels (binary default ``[-1, 1]``; required for multiclass).
    predict : callable, optional
        ``predict(X)`` returning labels in ``classes`` (or regression values); needed for the
        0/1 loss and the perturbation distances.

    Notes
    -----
    The loss is whatever ``fn`` computes; ``bind_loss`` only records the name.
    """

    def __init__(self, fn, *, task: str = "binary", classes=None, predict=None):
        if not callable(fn):
            raise InputTypeError("fn must be callable: fn(X, y) -> (loss, grad_X)")
        if task not in _TASKS:
            raise ValidationError(f"task must be one of {_TASKS}, got {task!r}")
        if predict is not None and not callable(predict):
            raise InputTypeError("predict must be callable or None")
        self.fn = fn
        self.task = task
        self.predict = predict
        if task == "regression":
            self.classes = None
        elif classes is not None:
            self.classes = np.asarray(classes)
        elif task == "binary":
            self.classes = np.array([-1, 1])
        else:
            raise ValidationError("classes is required for a multiclass CallableModel")

    def loss_and_grad(self, X, y):
        out = self.fn(np.array(X, dtype=np.float64, copy=True), np.array(y, copy=True))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValidationError("fn must return a tuple (loss, grad_X)")
        return (np.asarray(out[0], dtype=np.float64).reshape(-1),
                np.asarray(out[1], dtype=np.float64))

    def margin_and_grad(self, X, y):
        raise IncompatibleLossError("a CallableModel has no margin; use its loss gradient")

    def loss_values(self, X, y):
        if self.loss_name == "zero_one":
            return self.zero_one(X, y)
        return self.loss_and_grad(X, y)[0]

    def predict_internal(self, X):
        if self.predict is None:
            raise IncompatibleLossError("this CallableModel has no predict function")
        pred = np.asarray(self.predict(np.array(X, dtype=np.float64, copy=True)))
        if self.task == "regression":
            return pred.astype(np.float64)
        return _encode_predictions(pred, self.classes, self.task)

    def outputs(self, X):  # pragma: no cover - not used for callables
        raise IncompatibleLossError("a CallableModel exposes no outputs")


def as_model_input(model, X):
    """``X`` as float64, in a DataFrame with the model's ``feature_names_in_`` when it was
    fitted on one (so scikit-learn does not warn "X does not have valid feature names")."""
    X = np.asarray(X, dtype=np.float64)
    names = getattr(model, "feature_names_in_", None)
    if names is not None and X.ndim == 2 and len(names) == X.shape[1]:
        return pd.DataFrame(X, columns=list(names), copy=False)
    return X


def label_column(pred) -> np.ndarray:
    """Predicted labels as a vector: CatBoost's multiclass ``predict`` returns one column."""
    pred = np.asarray(pred)
    return pred[:, 0] if pred.ndim == 2 and pred.shape[1] == 1 else pred


def _encode_predictions(pred, classes, task) -> np.ndarray:
    lookup = {c.item() if hasattr(c, "item") else c: k for k, c in enumerate(classes)}
    codes = np.array([lookup.get(v, -1) for v in label_column(pred).tolist()], dtype=np.intp)
    if task == "binary":
        return np.where(codes == 1, 1.0, -1.0)
    return codes


class LinearDifferentiable(DifferentiableModel):
    """A linear model ``X @ W.T + b`` as a differentiable model (for ``solver="first_order"``).

    ``W`` has shape (K, d) with ``K = 1`` for binary classifiers and regressors.
    """

    def __init__(self, W, b, task: str, classes=None):
        self.W = np.array(W, dtype=np.float64, copy=True)
        if self.W.ndim == 1:
            self.W = self.W[None, :]
        self.b = np.array(b, dtype=np.float64, copy=True).reshape(-1)
        if task not in _TASKS:
            raise ValidationError(f"task must be one of {_TASKS}, got {task!r}")
        self.task = task
        self.classes = None if classes is None else np.asarray(classes)

    def outputs(self, X):
        S = np.asarray(X, dtype=np.float64) @ self.W.T + self.b
        return S if self.task == "multiclass" else S[:, 0]

    def _outputs_and_vjp(self, X, fn):
        out = self.outputs(X)
        val, dout = fn(out)
        if dout.ndim == 1:
            dout = dout[:, None]
        return val, dout @ self.W


class PredictOnlyModel(DifferentiableModel):
    """Any fitted classifier with ``predict`` and ``classes_`` (trees, forests, kernel SVMs...).

    Only ``loss="zero_one"`` is available (no gradients), except for boosted tree ensembles,
    whose raw margins also give ``loss="logistic"`` / ``"cross_entropy"``
    (:mod:`otstab.modeling._tree_margins`; solved by :mod:`otstab.solve._tree_smooth`).
    """

    differentiable = False

    def __init__(self, model):
        classes = getattr(model, "classes_", None)
        if classes is None or not hasattr(model, "predict"):
            raise InputTypeError(f"{type(model).__name__} is not a fitted classifier with "
                                 "predict and classes_")
        self.model = model
        self.classes = np.asarray(classes)
        if self.classes.ndim != 1:
            raise InputTypeError("multi-output classifiers are not supported")
        self.task = "binary" if len(self.classes) == 2 else "multiclass"

    def predict_internal(self, X):
        pred = np.asarray(self.model.predict(as_model_input(self.model, X)))
        return _encode_predictions(pred, self.classes, self.task)

    @property
    def margins(self) -> bool:
        """Whether the model has raw margins (a boosted tree ensemble): the smooth losses."""
        return tree_margins.has_margins(self.model)

    def bind_loss(self, loss) -> DifferentiableModel:
        name = loss_name(loss)
        if name in ("logistic", "cross_entropy") and self.margins:
            if name == "logistic" and self.task != "binary":
                raise IncompatibleLossError(f"loss 'logistic' does not fit a {self.task} "
                                            "model; use 'cross_entropy'")
            self.loss_name = name
            return self
        if name in ("logistic", "cross_entropy"):
            raise IncompatibleLossError(f"loss {name!r}: " + tree_margins.refusal(self.model))
        return super().bind_loss(loss)

    def outputs(self, X):
        """The raw margins of a boosted tree ensemble (binary: the log-odds of
        ``classes[1]``; multiclass: the K logits)."""
        if not self.margins:
            raise IncompatibleLossError(f"{type(self.model).__name__} has no differentiable "
                                        "outputs")
        S = tree_margins.raw_scores(self.model, as_model_input(self.model, X))
        return S[:, 1] - S[:, 0] if self.task == "binary" else S

    def margin_and_grad(self, X, y):
        raise IncompatibleLossError(f"{type(self.model).__name__} has no gradient")


# ----------------------------------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------------------------------


def _is_sklearn_mlp(model) -> bool:
    return hasattr(model, "coefs_") and hasattr(model, "intercepts_") and \
        hasattr(model, "out_activation_")


def adapt(model):
    """The adapter for ``model``, or None when it is not a model this module knows.

    * an adapter (:class:`DifferentiableModel`) is returned as is;
    * fitted scikit-learn ``MLPClassifier`` / ``MLPRegressor`` -> :class:`MLPModel`;
    * a PyTorch ``nn.Module`` with a last ``nn.Linear`` of 2 or more outputs ->
      :class:`TorchModel` (2 outputs: binary with classes 0/1; more: multiclass); other modules
      must be wrapped in :class:`TorchModel` with an explicit ``task``;
    * any other fitted classifier with ``predict`` and ``classes_`` (decision trees, forests,
      gradient boosting, kernel SVMs, pipelines) -> :class:`PredictOnlyModel` (0/1 loss only);
    * a plain function must be wrapped in :class:`CallableModel`.
    """
    if isinstance(model, DifferentiableModel):
        return model
    if _is_sklearn_mlp(model):
        return MLPModel(model)
    if _is_torch_module(model):
        import torch  # noqa: PLC0415 - only reached when torch is already imported by the user

        lin = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if lin and lin[-1].out_features >= 2:
            k = lin[-1].out_features
            return TorchModel(model, task="binary" if k == 2 else "multiclass")
        raise InputTypeError(
            "a torch.nn.Module with a single output is ambiguous (binary logit or regression): "
            "wrap it as otstab.nonlinear.TorchModel(module, task='binary' or 'regression', "
            "classes=...)")
    if hasattr(model, "classes_") and hasattr(model, "predict"):
        return PredictOnlyModel(model)
    if callable(model) and not hasattr(model, "predict"):
        raise InputTypeError(
            "a plain function must be wrapped: otstab.nonlinear.CallableModel(fn, task=..., "
            "classes=..., predict=...), with fn(X, y) -> (loss, grad_X)")
    return None


def zero_one_loss(model, X, y) -> np.ndarray:
    """Misclassification indicator ``1[model.predict(x) != y]`` for any classifier.

    ``model`` is a fitted classifier with ``predict`` (labels in the model's own label set) or
    an adapter (then ``y`` holds internal labels).
    """
    X, _ = align_columns(X, getattr(model, "model", model))
    X = as_float_matrix(X, "X")
    if isinstance(model, DifferentiableModel):
        return model.zero_one(X, y)
    if not hasattr(model, "predict"):
        raise InputTypeError(f"model must have a predict method, got {type(model).__name__}")
    y = np.asarray(y)
    if y.shape != (X.shape[0],):
        raise ValidationError(f"y must have shape ({X.shape[0]},), got {y.shape}")
    pred = label_column(model.predict(as_model_input(model, X)))
    return (pred != y).astype(np.float64)
