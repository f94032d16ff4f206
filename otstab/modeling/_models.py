"""Models: :class:`LinearModel` and the adapter that turns a user's model into arrays.

Accepted directly:

- :class:`LinearModel` (``coef`` 1-D: binary classifier with labels -1/+1 predicting the sign of
  the score; ``coef`` 2-D: multiclass with labels 0..K-1; ``task="regression"`` for a linear
  regressor);
- fitted scikit-learn linear classifiers (anything with ``coef_``, ``intercept_``, ``classes_``:
  LogisticRegression, LinearSVC, SGDClassifier, RidgeClassifier, Perceptron, ...) and linear
  regressors (LinearRegression, Ridge, Lasso, QuantileRegressor, ...);
- a scikit-learn ``Pipeline`` whose last step is one of those: the preprocessing runs first and
  perturbations act on the final estimator's inputs (named by ``get_feature_names_out``);
- differentiable nonlinear models through :mod:`otstab.nonlinear` (MLPs, PyTorch modules, ...).

Labels are the model's own labels (``classes_``), mapped internally to -1/+1 (binary) or 0..K-1.

Data contract (as scikit-learn's): a DataFrame ``X`` is matched by column name to the model's
``feature_names_in_`` (a Pipeline's: its first step's) -- reordered to the model's order when
all columns are there, refused naming the missing and unexpected ones otherwise; an array is
taken by position (:func:`otstab._validation.align_columns`). Reported feature names are the
model's. Complex values, text in numeric data and duplicate column names are refused.
``SVC`` / ``NuSVC`` with more than two classes are refused: their ``coef_`` holds one-vs-one
pairwise hyperplanes (K(K-1)/2 rows, as many as classes when K = 3), not one row per class.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from otstab_solvers.weights import ScaledWeights, dense, pmean, support_max

from .._validation import (
    align_columns,
    as_float_matrix,
    as_float_vector,
    as_sample_weight,
    check_finite_matrix,
    check_real,
    fitted_feature_names,
)
from ..errors import IncompatibleLossError, InputTypeError, NotFittedError, ValidationError
from ..scale import _data as scale
from . import _fingerprint as fingerprint
from . import _nonlinear as nonlinear
from . import _pass_kernels
from ._fingerprint import Fingerprint
from ._losses import Loss, MulticlassHinge, PiecewiseLinear, SmoothLoss, ZeroOne, get_loss

__all__ = ["LinearModel", "LinearScorer", "Problem", "resolve_model", "linear_scorer",
           "per_sample_losses"]


class LinearModel:
    """A linear model for users without scikit-learn.

    Parameters
    ----------
    coef : array-like, shape (d,) or (K, d)
        1-D: a binary classifier with labels -1/+1 predicting ``sign(x @ coef + intercept)``
        (score > 0 means +1), or a regressor when ``task="regression"``.
        2-D: a multiclass classifier with labels 0..K-1 predicting ``argmax(x @ coef.T + b)``.
    intercept : float or array-like of shape (K,)
    task : {"auto", "classification", "regression"}
    """

    def __init__(self, coef, intercept=0.0, *, task: str = "auto"):
        coef = np.array(coef, dtype=np.float64, copy=True)
        if coef.ndim not in (1, 2) or coef.size == 0:
            raise ValidationError(
                f"coef must be a non-empty 1-D or 2-D array, got shape {coef.shape}")
        if not np.all(np.isfinite(coef)):
            raise ValidationError("coef contains NaN or inf")
        if task not in ("auto", "classification", "regression"):
            raise ValidationError(
                f"task must be 'auto', 'classification' or 'regression', got {task!r}"
            )
        if task == "regression" and coef.ndim != 1:
            raise ValidationError("a regression LinearModel needs a 1-D coef")
        K = 1 if coef.ndim == 1 else coef.shape[0]
        if coef.ndim == 2 and K < 2:
            raise ValidationError("a 2-D coef needs at least 2 rows (classes)")
        b = np.array(intercept, dtype=np.float64, copy=True).reshape(-1)
        if b.size == 1 and K > 1:
            b = np.repeat(b, K)
        if b.size != K or not np.all(np.isfinite(b)):
            raise ValidationError(
                f"intercept must be a finite scalar or have {K} entries, got {b.size}")
        self.coef_ = coef
        self.intercept_ = b if coef.ndim == 2 else float(b[0])
        self.task = "regression" if task == "regression" else "classification"
        if self.task == "classification":
            self.classes_ = np.array([-1, 1]) if coef.ndim == 1 else np.arange(K)
        self.n_features_in_ = coef.shape[-1]

    def decision_function(self, X) -> np.ndarray:
        X = as_float_matrix(X)
        return X @ self.coef_.T + self.intercept_

    def predict(self, X) -> np.ndarray:
        s = self.decision_function(X)
        if self.task == "regression":
            return s
        if s.ndim == 1:
            return np.where(s > 0, 1, -1)
        return np.argmax(s, axis=1)

    def __repr__(self) -> str:
        return f"LinearModel(coef shape {self.coef_.shape}, task={self.task!r})"


#: rows per block when scoring float32 data, and when computing losses from scores
SCORE_BLOCK = 1 << 14
LOSS_BLOCK = 1 << 14


@dataclass
class LinearScorer:
    """Scores ``X @ W.T + b``; ``W`` is (K, d) with K = 1 for binary and regression."""

    W: np.ndarray
    b: np.ndarray
    task: str  # "binary" | "multiclass" | "regression"
    classes: np.ndarray | None = None

    @property
    def d(self) -> int:
        return self.W.shape[1]

    def scores(self, X: np.ndarray) -> np.ndarray:
        if getattr(X, "dtype", np.float64) == np.float32:
            # float32 data is scored in float64 over row blocks (each block cast exactly), so
            # no float64 copy of X is made and the scores equal those of X.astype(float64)
            n = X.shape[0]
            out = np.empty((n, self.W.shape[0]) if self.task == "multiclass" else n)
            for s in range(0, n, SCORE_BLOCK):
                out[s:s + SCORE_BLOCK] = self.scores(X[s:s + SCORE_BLOCK].astype(np.float64))
            return out
        out = X @ self.W.T if self.task == "multiclass" else X @ self.W[0]
        out += self.b if self.task == "multiclass" else self.b[0]  # in place: no second array
        return out

    def scores_and_fingerprint(self, X: np.ndarray) -> tuple[np.ndarray, Fingerprint]:
        """:meth:`scores` and the :class:`otstab.fingerprint.Fingerprint` of ``X`` in one pass:
        each block of rows (about 1 MB) is scored and then fingerprinted while in cache; a
        float32 block is cast to float64 once for both."""
        n, d = X.shape
        fp = Fingerprint(n, d)
        multi = self.task == "multiclass"
        out = np.empty((n, self.W.shape[0]) if multi else n)
        Wt = self.W.T if multi else self.W[0]
        layout = fingerprint.kernel_layout(X)
        if layout is not None:
            # compiled (numba): each row read once for both sums, at the speed of one product
            fingerprint.compiled_pass(X, layout, self.W, self.b,
                                      out if multi else out.reshape(n, 1), fp)
            return out, fp
        if fingerprint.column_major(X):
            # column-major (a DataFrame's values): one product streams each column (4x faster
            # than blocks), and the fingerprint one more (Fingerprint.fill_columns; through
            # blocks of rows it cost two)
            fp.fill_columns(X, work=None if multi else out)  # (X v in the scores' buffer)
            np.dot(X, Wt, out=out)
        else:
            # blocks of about 1 MB (a float32 block cast once for both products), each
            # scored and fingerprinted while in cache, on one BLAS thread per block and the
            # blocks spread over Python threads (each_block: the same numbers on any thread
            # count and for float32 as for its float64 copy)
            def visit(block: np.ndarray, s: int) -> None:
                np.dot(block, Wt, out=out[s:s + block.shape[0]])
                fp.fill(block, s)

            fingerprint.each_block(X, visit)
        out += self.b if multi else self.b[0]
        return out, fp


@dataclass
class Problem:
    """A (model, data, loss) triple resolved to arrays.

    ``y`` holds internal labels (-1/+1 as int8, 0..K-1 or real targets); ``y_original`` the
    caller's.
    ``scorer`` is set for linear models, ``nonlinear`` (an ``otstab.nonlinear`` adapter) otherwise.
    ``sample_weight``: the probabilities p of the samples (the caller's weights normalised to
    sum 1; None: uniform, also when every weight is equal), so that P0 = sum_i p_i delta_{z_i}:
    a :class:`~otstab_solvers.weights.ScaledWeights` read from the caller's weights (no
    n-vector of p until ``p`` is asked for), or an array. ``weights``: it as given, for the
    passes that read p block by block; ``p``: the n-vector.
    """

    model: object
    X: np.ndarray
    y: np.ndarray
    y_original: np.ndarray
    loss: Loss
    feature_names: list[str]
    scorer: LinearScorer | None = None
    nonlinear: Any = None  # a DifferentiableModel
    index: object = None
    extra: dict = field(default_factory=dict)
    scores: np.ndarray | None = None  # model scores at X (linear models), computed once
    sample_weight: ScaledWeights | np.ndarray | None = None

    @property
    def p(self) -> np.ndarray | None:
        """The sample probabilities as an n-vector (None: uniform)."""
        return dense(self.sample_weight)

    @property
    def weights(self) -> ScaledWeights | np.ndarray | None:
        """The sample probabilities read by slices (``weights[s:e]``; None: uniform): the
        passes over blocks of rows read them from the caller's weights, no n-vector."""
        return self.sample_weight

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    def losses(self, X: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
        """Per-sample loss at features ``X`` (same labels). The losses at the data itself are
        computed once and kept (read-only): every path and the audit need them."""
        if X is self.X and y is None:
            cached = self.extra.get("base_losses")
            if cached is None:
                cached = self._losses(X, self.y)
                cached.setflags(write=False)
                self.extra["base_losses"] = cached
            return cached
        return self._losses(X, self.y if y is None else y)

    def loss_stats(self) -> tuple[float, float]:
        """``(base risk, largest loss)`` of the data: the P0-mean of the per-sample losses and
        their largest value over the samples of positive probability. For a linear model whose
        losses are not cached, over blocks of the scores (no n-vector of losses, nor of the
        probabilities, is made)."""
        p = self.weights
        key = (self.scores, self.y, p, self.X)  # (a subset or a reweighting is a new problem)
        known = self.extra.get("loss_stats")
        if known is not None and all(a is b for a, b in zip(known[0], key)):
            return known[1]
        cached = self.extra.get("base_losses")
        if cached is not None or self.scorer is None or self.scores is None:
            losses = self.losses(self.X)
            out = pmean(losses, dense(p)), support_max(losses, dense(p))
            self.extra["loss_stats"] = (key, out)
            return out
        on, got = self._compiled_stats(), None
        if on == "logistic":  # the sum compiled; the largest loss from the loss's own values
            total, rows = _pass_kernels.logistic_stats(self.scores, self.y, p)
            if rows is not None:  # (else many rows tie at the smallest margin: the blocks)
                got = total, float(self._loss_block(self.scores[rows], self.y[rows]).max())
        elif on is not None:  # one compiled loop over the scores (numba; at least 2^17 rows)
            got = _pass_kernels.loss_stats(self.scores, self.y, on,
                                           getattr(self.loss, "slopes", ()),
                                           getattr(self.loss, "intercepts", ()), p)
        if got is not None:
            total, top = got
        else:
            total, top = 0.0, -math.inf
            for s in range(0, self.n, LOSS_BLOCK):
                e = min(s + LOSS_BLOCK, self.n)
                lb = self._loss_block(self.scores[s:e], self.y[s:e])
                if p is None:
                    total += float(np.sum(lb))
                    top = max(top, float(lb.max()))
                else:
                    pb = p[s:e]
                    total += float(np.dot(pb, lb))
                    live = lb[pb > 0]
                    if live.size:
                        top = max(top, float(live.max()))
        out = (total / self.n if p is None else total), top
        self.extra["loss_stats"] = (key, out)
        return out

    def _compiled_stats(self) -> str | None:
        """How :meth:`loss_stats` runs compiled (``on`` of :func:`_pass_kernels.loss_stats`, or
        "logistic": :func:`_pass_kernels.logistic_stats`), or None: a piecewise-linear loss of
        a binary or regression model, or the binary 0/1 or logistic loss, on scores of
        contiguous float64, with numba and enough rows."""
        s, loss = self.scores, self.loss
        if s is None or s.ndim != 1 or not s.flags.c_contiguous or s.dtype != np.float64 \
                or self.scorer is None or self.scorer.task == "multiclass":
            return None
        if isinstance(loss, PiecewiseLinear):
            on = loss.on
        elif isinstance(loss, ZeroOne) and self.scorer.task == "binary":
            on = "zero_one"
        elif isinstance(loss, SmoothLoss) and loss.name == "logistic" \
                and self.scorer.task == "binary" and self.y.dtype == np.int8:
            on = "logistic"
        else:
            return None
        if self.y.dtype not in (np.int8, np.float64) or not _pass_kernels.available(self.n):
            return None
        return on

    def _losses(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        if self.scorer is not None:
            scores = self.scores if (X is self.X and self.scores is not None) else \
                self.scorer.scores(X)
            return self.losses_from_scores(scores, y)
        return self.nonlinear.loss_values(X, y)

    def losses_from_scores(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-sample loss from model scores (linear models), over blocks of rows when there
        are many (one output array, cache-sized temporaries)."""
        n = np.shape(scores)[0]
        if n <= LOSS_BLOCK:
            return self._loss_block(scores, y)
        out = np.empty(n)
        for s in range(0, n, LOSS_BLOCK):
            out[s:s + LOSS_BLOCK] = self._loss_block(scores[s:s + LOSS_BLOCK],
                                                     y[s:s + LOSS_BLOCK])
        return out

    def _loss_block(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        loss = self.loss
        # a linear problem: the scorer is set
        if isinstance(loss, MulticlassHinge) and self.scorer.task == "binary":  # type: ignore[union-attr]
            scores = np.column_stack([np.zeros_like(scores), scores])
            y = (y > 0).astype(np.intp)
        return loss.values(scores, y)


def _is_pipeline(model) -> bool:
    return hasattr(model, "steps") and hasattr(model, "named_steps") and len(model.steps) > 0


def linear_scorer(model) -> LinearScorer | None:
    coef = getattr(model, "coef_", None)
    if coef is None:
        return None
    W = np.array(coef, dtype=np.float64, copy=True)
    if W.ndim == 1:
        W = W[None, :]
    b = np.array(getattr(model, "intercept_", 0.0), dtype=np.float64, copy=True).reshape(-1)
    if b.size == 1 and W.shape[0] > 1:
        b = np.repeat(b, W.shape[0])
    if not (np.all(np.isfinite(W)) and np.all(np.isfinite(b))):
        raise ValidationError("model coefficients contain NaN or inf")
    classes = getattr(model, "classes_", None)
    is_regressor = classes is None or getattr(model, "task", None) == "regression"
    if is_regressor:
        if W.shape[0] != 1:
            raise InputTypeError(
                f"multi-output regressors are not supported (coef_ has shape {np.shape(coef)})"
            )
        return LinearScorer(W, b[:1], "regression", None)
    classes = np.asarray(classes)
    if len(classes) > 2 and hasattr(model, "support_vectors_"):
        _raise_one_vs_one(model, len(classes))
    if len(classes) == 2:
        if W.shape[0] != 1:
            raise InputTypeError(f"binary classifier with coef_ of shape {W.shape} is not linear")
        return LinearScorer(W, b[:1], "binary", classes)
    if W.shape[0] != len(classes):
        raise InputTypeError(
            f"coef_ has {W.shape[0]} rows but the model has {len(classes)} classes "
            "(one-vs-one models are not linear in this sense)"
        )
    return LinearScorer(W, b, "multiclass", classes)


def _raise_one_vs_one(model, K: int):
    """libsvm classifiers (SVC, NuSVC) are one-vs-one: with K > 2 classes, ``coef_`` holds the
    K(K-1)/2 pairwise hyperplanes (as many rows as classes when K = 3), not one per class."""
    name = type(model).__name__
    raise InputTypeError(
        f"model {name} with {K} classes is one-vs-one: its coef_ holds the {K * (K - 1) // 2} "
        "pairwise hyperplanes, not one row per class, so its scores are not linear per class. "
        "Use LinearSVC or LogisticRegression (one row per class), or certify the 0/1 loss "
        "through the model's predictions alone, as for any classifier without linear scores "
        "(a certified interval, docs/bounds.md): "
        "certify(otstab.nonlinear.adapt(model), X, y, loss='zero_one', ...)"
    )


def _encode_labels(y, scorer_task: str, classes) -> tuple[np.ndarray, np.ndarray]:
    y_orig = np.asarray(y.to_numpy() if isinstance(y, (pd.Series, pd.DataFrame)) else y)
    if y_orig.ndim == 2 and 1 in y_orig.shape:
        y_orig = y_orig.reshape(-1)
    if y_orig.ndim != 1:
        raise ValidationError(f"y must be 1-D, got shape {y_orig.shape}")
    check_real(y_orig, "y")
    if scorer_task == "regression":
        return as_float_vector(y_orig, "y"), y_orig
    if y_orig.dtype.kind == "f" and not np.all(np.isfinite(y_orig)):
        i = int(np.argmax(~np.isfinite(y_orig)))
        raise ValidationError(f"y contains NaN or inf (first at index {i})")
    if scorer_task == "binary":
        signs = _binary_signs(y_orig, classes)
        if signs is not None:
            return signs, y_orig
    codes = _codes_fast(y_orig, classes)
    if codes is None:
        lookup = {c.item() if hasattr(c, "item") else c: k for k, c in enumerate(classes)}
        codes = np.array([lookup.get(v, -1) for v in y_orig.tolist()], dtype=np.intp)
    if np.any(codes < 0):
        unknown = y_orig[codes < 0]
        shown = sorted({repr(u.item() if hasattr(u, "item") else u) for u in unknown})[:5]
        raise ValidationError(
            f"y contains label(s) {', '.join(shown)} unknown to the model; "
            f"the model's classes are {list(classes)}"
        )
    if scorer_task == "binary":
        return np.where(codes == 1, 1, -1).astype(np.int8), y_orig
    return codes, y_orig


def _binary_signs(y, classes):
    """+1 for the second class, -1 for the first, when y and the two classes are numbers and
    every label is one of them (None otherwise: the general path encodes and reports)."""
    classes = np.asarray(classes)
    if y.dtype.kind not in "biuf" or classes.dtype.kind not in "biuf" or classes.size != 2:
        return None
    pos = y == classes[1]
    if np.count_nonzero(pos) + np.count_nonzero(y == classes[0]) != y.size:
        return None
    signs = pos.astype(np.int8)  # 2 pos - 1, in place (faster than np.where on booleans)
    signs *= 2
    signs -= 1
    return signs


def _codes_fast(y, classes):
    """Vectorised label -> class index (-1 if unknown); None when the types do not compare."""
    try:
        classes = np.asarray(classes)
        if y.dtype.kind not in "biuf" or classes.dtype.kind not in "biuf":
            if y.dtype.kind not in "UO" or classes.dtype.kind not in "UO":
                return None
        sorter = np.argsort(classes, kind="stable")
        cs = classes[sorter]
        idx = np.searchsorted(cs, y)
        idx = np.clip(idx, 0, len(cs) - 1)
        found = cs[idx] == y
        return np.where(found, sorter[idx], -1).astype(np.intp)
    except TypeError:
        return None


def check_loss_fits(loss: Loss, task: str, model_name: str) -> None:
    """Raise IncompatibleLossError when the loss cannot be used with this kind of model."""
    ok = True
    if isinstance(loss, PiecewiseLinear):
        ok = (loss.on == "margin" and task == "binary") or (
            loss.on == "residual" and task == "regression"
        )
    elif isinstance(loss, (MulticlassHinge, ZeroOne)):
        ok = task in ("binary", "multiclass")
    elif isinstance(loss, SmoothLoss):
        ok = {"logistic": ("binary",), "cross_entropy": ("binary", "multiclass"),
              "squared": ("regression",)}[loss.name].__contains__(task)
    if not ok:
        kind = {"binary": "a binary classifier", "multiclass": "a multiclass classifier",
                "regression": "a regressor"}[task]
        hint = {
            "binary": "hinge, multiclass_hinge, zero_one, logistic or cross_entropy",
            "multiclass": "multiclass_hinge, zero_one or cross_entropy",
            "regression": "absolute, pinball(tau), epsilon_insensitive(eps) or squared",
        }[task]
        raise IncompatibleLossError(
            f"loss {loss.name!r} does not fit {model_name}, which is {kind}; use {hint}"
        )


def resolve_model(model, X, y, *, loss, sample_weight=None) -> Problem:
    """Validate ``(model, X, y, loss)`` and reduce them to arrays (never mutating the inputs).

    ``sample_weight``: nonnegative weights of the evaluation rows (survey weights), stored
    normalised as ``Problem.sample_weight`` (None when absent or all equal)."""
    loss = get_loss(loss)
    if scale.is_dask(X):
        prob = _resolve_dask(model, X, y, loss)
        sample_weight = scale.as_numpy_labels(sample_weight)  # a Dask vector: one n-vector
    else:
        prob = _resolve_arrays(model, X, y, loss)
    sw = as_sample_weight(sample_weight, prob.n)
    if sw is not None and not sw.owned:  # the caller's array, by reference: fingerprinted
        fingerprint.register_weights(sw.w)
        sw.check = functools.partial(fingerprint.check, sw.w)
    prob.sample_weight = sw
    return prob


def _resolve_arrays(model, X, y, loss) -> Problem:
    """:func:`resolve_model` for in-memory data."""
    index = X.index if isinstance(X, pd.DataFrame) else None
    # columns matched by name to the model's feature_names_in_ (a reordered copy if needed)
    X, names = align_columns(X, model)
    est = model
    if _is_pipeline(model):
        est = model.steps[-1][1]
        pre = model[:-1]
        try:
            Xt = pre.transform(X)
        except Exception as exc:  # the user's preprocessing failed on this data
            raise ValidationError(f"the pipeline's preprocessing failed on X: {exc}") from exc
        if hasattr(Xt, "toarray"):
            Xt = Xt.toarray()
        try:
            names = [str(c) for c in pre.get_feature_names_out()]
        except Exception:
            names = None
        # a linear final step: no copy (fingerprinted with the scores below)
        linear = getattr(est, "coef_", None) is not None
        Xa = as_float_matrix(Xt, "X (after the pipeline's preprocessing)", copy=not linear)
        if names is None or len(names) != Xa.shape[1]:
            names = [f"x{j}" for j in range(Xa.shape[1])]
    else:
        # a linear model's X is kept by reference, not copied (a read-only view): results own
        # their data through a fingerprint of X taken in the scores pass and checked before
        # every later read (otstab.fingerprint; docs/guarantees.md); the NaN/inf check runs on
        # the scores (no extra pass); float32 data stays float32 (scored in float64 block by
        # block, moved points built in float64); a Fortran-ordered X (a DataFrame's values) is
        # kept in that order (no transposing copy). Other models: X is copied (one memcpy),
        # except a read-only NumPy array, kept by reference and fingerprinted (one pass)
        linear = getattr(est, "coef_", None) is not None
        frozen = isinstance(X, np.ndarray) and not X.flags.writeable
        Xa = as_float_matrix(X, "X", copy=not linear and not frozen, check_finite=not linear,
                             float32=linear, fortran=linear)
        if not linear and frozen:
            fingerprint.register(Xa, fingerprint.of_matrix(Xa))

    scorer = linear_scorer(est)
    model_name = type(est).__name__
    if scorer is None:
        adapter = nonlinear.adapt(est)
        if adapter is None:
            _raise_unfitted_or_unsupported(est)
        task = adapter.task
        check_loss_fits(loss, task, model_name)
        yy, y_orig = _encode_labels(y, task, getattr(adapter, "classes", None))
        _check_rows(Xa, yy)
        adapter.bind_loss(loss)
        return Problem(model, Xa, yy, y_orig, loss, names, None, adapter, index)

    if Xa.shape[1] != scorer.d:
        raise ValidationError(
            f"X has {Xa.shape[1]} features but the model expects {scorer.d}"
        )
    check_loss_fits(loss, scorer.task, model_name)
    yy, y_orig = _encode_labels(y, scorer.task, scorer.classes)
    _check_rows(Xa, yy)
    scores, fp = scorer.scores_and_fingerprint(Xa)
    if not Xa.flags.writeable:  # the caller's array (or a view of it), kept by reference
        fingerprint.register(Xa, fp)
    # one sum finds a NaN or inf (it propagates); the elementwise test runs only when the sum
    # is not finite (also when finite scores overflow it)
    if not math.isfinite(float(np.sum(scores))) and not np.all(np.isfinite(scores)):
        check_finite_matrix(Xa, "X")  # names the offending entry
        raise ValidationError("the model's scores on X are not finite (overflow?)")
    return Problem(model, Xa, yy, y_orig, loss, names, scorer, None, index, scores=scores)


def _resolve_dask(model, X, y, loss) -> Problem:
    """A Dask ``X`` (linear models): one blockwise pass for the scores; X stays distributed
    (:class:`otstab.scale.DaskRows`)."""
    scorer = linear_scorer(model) if not _is_pipeline(model) else None
    if scorer is None:
        raise InputTypeError(
            f"Dask input needs a linear model (otstab.LinearModel or a fitted scikit-learn "
            f"linear model, not {type(model).__name__}); compute X into memory for others")
    check_loss_fits(loss, scorer.task, type(model).__name__)
    Xr, names, scores = scale.prepare(X, scorer.W, scorer.b, fitted_feature_names(model))
    yy, y_orig = _encode_labels(scale.as_numpy_labels(y), scorer.task, scorer.classes)
    _check_rows(Xr, yy)
    return Problem(model, Xr, yy, y_orig, loss, names, scorer, None, None, scores=scores)


def _check_rows(Xa, yy):
    if Xa.shape[0] != yy.shape[0]:
        raise ValidationError(
            f"X and y have different numbers of samples: {Xa.shape[0]} and {yy.shape[0]}"
        )


def _raise_unfitted_or_unsupported(est):
    name = type(est).__name__
    try:
        from sklearn.base import BaseEstimator
        from sklearn.exceptions import NotFittedError as SkNotFitted
        from sklearn.utils.validation import check_is_fitted

        if isinstance(est, BaseEstimator):
            try:
                check_is_fitted(est)
            except SkNotFitted as exc:
                raise NotFittedError(
                    f"model {name} is not fitted; call fit(X, y) before certifying it"
                ) from exc
    except ImportError:
        pass
    raise InputTypeError(
        f"model of type {name} is not supported: expected otstab.LinearModel, a fitted "
        "scikit-learn linear model (with coef_), a Pipeline ending in one, or a differentiable "
        "model supported by otstab.nonlinear"
    )


def per_sample_losses(model, X, y, loss) -> np.ndarray:
    """Per-sample losses of ``model`` on ``(X, y)`` with the same loss objects as ``certify``.

    Works for every model ``certify`` accepts whose loss can be evaluated from scores (linear
    models), and for nonlinear models through ``otstab.nonlinear``.
    """
    loss = get_loss(loss)
    fitted = resolve_model(model, X, y, loss=loss)
    return fitted.losses(fitted.X)
