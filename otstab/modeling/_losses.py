"""Losses understood by :func:`otstab.certify`.

Piecewise-linear losses (solved exactly by the conic programs and the specialised dual):

- ``"hinge"``: ``max(0, 1 - m)`` with the margin ``m = y * score``, ``y`` in {-1, +1};
- ``"multiclass_hinge"``: Crammer-Singer, ``max_k (1[k != y] + s_k - s_y)``;
- ``"absolute"``: ``|y - score|``;
- :func:`pinball` ``(tau)``: ``max(tau * e, (tau - 1) * e)`` with the residual ``e = y - score``;
- :func:`epsilon_insensitive` ``(eps)``: ``max(0, |e| - eps)``;
- :class:`PiecewiseLinear`: any convex, nonnegative ``max_k (a_k u + b_k)`` of the margin or the
  residual ``u``.

``"zero_one"`` (misclassification) has its own closed-form path. Smooth losses
(``"logistic"``, ``"cross_entropy"``, ``"squared"``) are handled by the nonlinear path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from otstab_solvers.smooth import log1p_unit

from ..errors import InputTypeError, ValidationError

__all__ = [
    "Loss",
    "PiecewiseLinear",
    "MulticlassHinge",
    "ZeroOne",
    "SmoothLoss",
    "hinge",
    "absolute",
    "pinball",
    "epsilon_insensitive",
    "multiclass_hinge",
    "zero_one",
    "get_loss",
    "LOSS_NAMES",
]


class Loss:
    """Base class. ``target`` says which models the loss fits: ``"binary"`` (a margin loss of a
    binary classifier), ``"classifier"`` (any classifier), ``"regression"``."""

    name: str = "loss"
    target: str = "classifier"

    def values(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:  # pragma: no cover
        """Per-sample loss from model scores and internal labels."""
        raise NotImplementedError


@dataclass(frozen=True)
class PiecewiseLinear(Loss):
    """A convex piecewise-linear loss ``l(u) = max_k (slopes[k] * u + intercepts[k])``.

    Parameters
    ----------
    slopes, intercepts : sequences of floats of equal length K >= 1
    on : ``"margin"`` or ``"residual"``
        ``u`` is the margin ``y * score`` of a binary classifier (labels mapped to -1/+1) or the
        residual ``y - score`` of a regressor.
    name : str, optional

    The loss must be nonnegative (its minimum over u is checked) so that the risk threshold is
    meaningful; this is what the paper assumes.
    """

    slopes: tuple = field(default=())
    intercepts: tuple = field(default=())
    on: str = "margin"
    name: str = "piecewise_linear"

    def __post_init__(self):
        a = np.asarray(self.slopes, dtype=float).reshape(-1)
        b = np.asarray(self.intercepts, dtype=float).reshape(-1)
        if a.size == 0 or a.size != b.size:
            raise ValidationError(
                f"slopes and intercepts must be non-empty and of equal length, got {a.size} "
                f"and {b.size}"
            )
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise ValidationError("slopes and intercepts must be finite")
        if self.on not in ("margin", "residual"):
            raise ValidationError(f"on must be 'margin' or 'residual', got {self.on!r}")
        if a.max() < 0 or a.min() > 0:
            raise ValidationError(
                f"loss {self.name!r} is unbounded below (all slopes have one sign); "
                "a loss must be nonnegative"
            )
        # the minimum of a convex PWL function sits at a breakpoint (or anywhere on a flat piece)
        cand = [0.0]
        for j in range(a.size):
            for k in range(j + 1, a.size):
                if a[j] != a[k]:
                    cand.append((b[k] - b[j]) / (a[j] - a[k]))
        cand = np.asarray(cand)
        lmin = float(np.min(np.max(np.outer(cand, a) + b, axis=1)))
        if lmin < -1e-12:
            raise ValidationError(
                f"loss {self.name!r} takes negative values (minimum {lmin:g}); "
                "a loss must be nonnegative"
            )
        object.__setattr__(self, "slopes", tuple(float(x) for x in a))
        object.__setattr__(self, "intercepts", tuple(float(x) for x in b))
        object.__setattr__(self, "target", "binary" if self.on == "margin" else "regression")

    @property
    def a(self) -> np.ndarray:
        return np.asarray(self.slopes)

    @property
    def b(self) -> np.ndarray:
        return np.asarray(self.intercepts)

    def of_u(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        out = _affine(u, self.slopes[0], self.intercepts[0], np.empty_like(u))
        piece = np.empty_like(u) if len(self.slopes) > 1 else None
        for ak, bk in zip(self.slopes[1:], self.intercepts[1:]):
            # piece is an array whenever there is a second slope
            np.maximum(out, _affine(u, ak, bk, piece), out=out)  # type: ignore[arg-type]
        return out

    def values(self, scores, y):
        scores = np.asarray(scores, dtype=float)
        u = y * scores if self.on == "margin" else y - scores
        return self.of_u(u)


@dataclass(frozen=True)
class MulticlassHinge(Loss):
    """Crammer-Singer multiclass hinge ``max_k (1[k != y] + s_k - s_y)`` (labels 0..K-1)."""

    name: str = "multiclass_hinge"
    target: str = "classifier"

    def values(self, scores, y):
        S = np.ascontiguousarray(scores, dtype=float)
        y = np.asarray(y, dtype=np.intp)
        n, K = S.shape
        # flat positions of the labels; the largest over the columns one at a time (a
        # reduction along a short last axis, and take_along_axis, are slow in NumPy)
        flat = np.arange(0, n * K, K)
        flat += y
        M = np.add(1.0, S)
        M -= S.reshape(-1).take(flat)[:, None]
        M.reshape(-1)[flat] = 0.0
        out = M[:, 0].copy()
        for k in range(1, K):
            np.maximum(out, M[:, k], out=out)
        return out


@dataclass(frozen=True)
class ZeroOne(Loss):
    """Misclassification loss ``1[y != f(x)]``; the risk is the error rate."""

    name: str = "zero_one"
    target: str = "classifier"

    def values(self, scores, y):
        S = np.asarray(scores, dtype=float)
        if S.ndim == 1:  # binary: y in {-1, +1}, predict +1 iff score > 0 (scikit-learn's rule)
            return ((S > 0) != (np.asarray(y) > 0)).astype(float)
        return (np.argmax(S, axis=1) != np.asarray(y, dtype=np.intp)).astype(float)


@dataclass(frozen=True)
class SmoothLoss(Loss):
    """Marker for the smooth losses handled by the nonlinear path (``otstab.nonlinear``)."""

    name: str = "logistic"
    target: str = "classifier"

    def values(self, scores, y):
        S = np.asarray(scores, dtype=float)
        if self.name == "logistic":
            # log(1 + exp(-m)) = max(-m, 0) + log1p(exp(-|m|)) in vectorised passes, the
            # log1p from numpy's vectorised log (log1p_unit: to an ulp or two of numpy's
            # logaddexp(0, -m), in some half its time)
            m = y * S
            out = np.abs(m)
            np.negative(out, out=out)
            np.exp(out, out=out)
            out = log1p_unit(out)
            np.minimum(m, 0.0, out=m)
            out -= m  # (max(-m, 0) = -min(m, 0): the same bits, one operation fewer)
            return out
        if self.name == "cross_entropy":
            if S.ndim == 1:
                return np.logaddexp(0.0, -y * S)
            y = np.asarray(y, dtype=np.intp)
            lse = np.logaddexp.reduce(S, axis=1)
            return lse - np.take_along_axis(S, y[:, None], axis=1)[:, 0]
        if self.name == "squared":
            return (y - S) ** 2
        raise ValidationError(f"unknown smooth loss {self.name!r}")


hinge = PiecewiseLinear((0.0, -1.0), (0.0, 1.0), on="margin", name="hinge")
absolute = PiecewiseLinear((1.0, -1.0), (0.0, 0.0), on="residual", name="absolute")
multiclass_hinge = MulticlassHinge()
zero_one = ZeroOne()


def pinball(tau: float) -> PiecewiseLinear:
    """Pinball (quantile) loss at level ``tau`` in (0, 1): ``max(tau e, (tau - 1) e)``."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float, np.floating)) or not (
        0.0 < float(tau) < 1.0
    ):
        raise ValidationError(f"tau must be a number in (0, 1), got {tau!r}")
    tau = float(tau)
    return PiecewiseLinear((tau, tau - 1.0), (0.0, 0.0), on="residual", name=f"pinball({tau:g})")


def epsilon_insensitive(eps: float) -> PiecewiseLinear:
    """Vapnik's epsilon-insensitive loss ``max(0, |e| - eps)``, ``eps >= 0``."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not (
        float(eps) >= 0.0 and math.isfinite(float(eps))
    ):
        raise ValidationError(f"eps must be a finite number >= 0, got {eps!r}")
    eps = float(eps)
    return PiecewiseLinear(
        (0.0, 1.0, -1.0), (0.0, -eps, -eps), on="residual", name=f"epsilon_insensitive({eps:g})"
    )


_NAMED = {
    "hinge": hinge,
    "multiclass_hinge": multiclass_hinge,
    "absolute": absolute,
    "zero_one": zero_one,
    "logistic": SmoothLoss("logistic", "binary"),
    "cross_entropy": SmoothLoss("cross_entropy", "classifier"),
    "squared": SmoothLoss("squared", "regression"),
}
LOSS_NAMES = tuple(_NAMED)


def get_loss(loss) -> Loss:
    """Resolve a loss given by name or as a :class:`Loss` instance."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        key = loss.strip().lower().replace("-", "_").replace("0/1", "zero_one")
        if key in _NAMED:
            return _NAMED[key]
        raise ValidationError(
            f"unknown loss {loss!r}; expected one of {sorted(_NAMED)}, "
            "otstab.losses.pinball(tau), otstab.losses.epsilon_insensitive(eps) or a "
            "otstab.losses.PiecewiseLinear"
        )
    raise InputTypeError(
        f"loss must be a string or an otstab.losses.Loss, got {type(loss).__name__}")


def _affine(u: np.ndarray, a: float, b: float, out: np.ndarray) -> np.ndarray:
    """``a u + b`` in ``out``, in one pass for the slopes 0 and +-1 of most losses (the same
    numbers: the products by 0 and +-1 are exact, and ``-0.0 + b`` rounds as ``0.0 + b``)."""
    a, b = float(a), float(b)
    if a == 0.0:
        out.fill(b)
    elif a == 1.0:
        np.add(u, b, out=out)
    elif a == -1.0:
        np.subtract(b, u, out=out)
    else:
        np.multiply(u, a, out=out)
        out += b
    return out
