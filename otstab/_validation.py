"""Argument validation shared by every public function.

Each helper returns a fresh array (never a view the caller could see mutated) and raises an
``otstab.errors`` exception whose message names the argument.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
import pandas as pd

from .errors import InputTypeError, ValidationError

__all__ = [
    "as_float_matrix",
    "as_float_vector",
    "check_same_length",
    "check_positive_extended",
    "check_scalar",
    "check_probability",
    "feature_names_of",
]


def feature_names_of(X, model=None) -> list[str]:
    """Column names of a DataFrame, else ``model.feature_names_in_``, else ``x0, x1, ...``."""
    if isinstance(X, pd.DataFrame):
        return [str(c) for c in X.columns]
    names = getattr(model, "feature_names_in_", None) if model is not None else None
    d = np.shape(X)[1] if np.ndim(X) == 2 else 1
    if names is not None and len(names) == d:
        return [str(c) for c in names]
    return [f"x{j}" for j in range(d)]


def as_float_matrix(X, name: str = "X", *, allow_1d: bool = False, copy: bool = True,
                    check_finite: bool = True) -> np.ndarray:
    """A C-contiguous float64 2-D array, rejecting NaN/inf and non-numeric data.

    ``copy=False`` returns a read-only view when no conversion is needed (the caller's array is
    never written to either way); ``check_finite=False`` leaves the NaN/inf check to the caller
    (e.g. on the model scores, which propagate any NaN or inf of X) -- call
    :func:`check_finite_matrix` to raise the precise error.
    """
    if X is None:
        raise ValidationError(f"{name} is required, got None")
    if isinstance(X, pd.DataFrame):
        bad = non_numeric_columns(X)
        if bad:
            raise ValidationError(
                f"{name} has non-numeric column(s) {bad[:5]}; encode them first "
                "(e.g. one-hot) or pass a pipeline that does"
            )
    try:
        arr = np.array(X, dtype=np.float64, copy=True) if copy else np.asarray(
            X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{name} must be numeric, got {type(X).__name__}: {exc}") from exc
    if arr.ndim == 1 and allow_1d:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise ValidationError(f"{name} must be a 2-D array (n_samples, n_features), "
                              f"got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValidationError(f"{name} has no rows")
    if check_finite:
        check_finite_matrix(arr, name)
    arr = np.ascontiguousarray(arr)
    if not copy:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def check_finite_matrix(arr: np.ndarray, name: str = "X") -> None:
    """Raise a ValidationError naming the first NaN/inf entry of ``arr``."""
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValidationError(
            f"{name} contains NaN or inf (first at row {bad[0]}, column {bad[1]}); "
            "drop or impute those values first"
        )


def non_numeric_columns(df: pd.DataFrame) -> list:
    """The columns of ``df`` that are neither numeric nor boolean."""
    return [c for c in df.columns if not (pd.api.types.is_numeric_dtype(df[c])
                                          or pd.api.types.is_bool_dtype(df[c]))]


def as_one_dim(arr: np.ndarray, name: str) -> np.ndarray:
    """``arr`` as a non-empty 1-D array (a single row or column is flattened)."""
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise ValidationError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValidationError(f"{name} is empty")
    return arr


def as_float_vector(v, name: str, *, finite: bool = True, nonnegative: bool = False) -> np.ndarray:
    """A float64 1-D copy; rejects NaN/inf (if ``finite``) and negative values (if asked)."""
    if v is None:
        raise ValidationError(f"{name} is required, got None")
    try:
        arr = np.array(v, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{name} must be numeric: {exc}") from exc
    arr = as_one_dim(arr, name)
    if finite and not np.all(np.isfinite(arr)):
        i = int(np.argmax(~np.isfinite(arr)))
        raise ValidationError(f"{name} contains NaN or inf (first at index {i})")
    if nonnegative and np.any(arr < 0):
        i = int(np.argmax(arr < 0))
        raise ValidationError(f"{name} must be >= 0, got {arr[i]} at index {i}")
    return arr


def check_same_length(**arrays) -> int:
    """All arguments have the same first dimension; returns it."""
    lengths = {k: (len(v) if v is not None else None) for k, v in arrays.items()}
    vals = {v for v in lengths.values() if v is not None}
    if len(vals) > 1:
        desc = ", ".join(f"{k} has {v}" for k, v in lengths.items() if v is not None)
        raise ValidationError(f"inconsistent numbers of samples: {desc}")
    return vals.pop() if vals else 0


def check_scalar(x, name: str, *, low=None, high=None, low_inclusive=True,
                 high_inclusive=True, allow_inf=False) -> float:
    """A real scalar in the given range (bounds None = unbounded)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (Real, np.floating, np.integer)):
        raise InputTypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = float(x)
    if math.isnan(x) or (math.isinf(x) and not allow_inf):
        raise ValidationError(f"{name} must be finite, got {x}")
    if low is not None and (x < low or (x == low and not low_inclusive)):
        op = ">=" if low_inclusive else ">"
        raise ValidationError(f"{name} must be {op} {low}, got {x}")
    if high is not None and (x > high or (x == high and not high_inclusive)):
        op = "<=" if high_inclusive else "<"
        raise ValidationError(f"{name} must be {op} {high}, got {x}")
    return x


def check_positive_extended(x, name: str) -> float:
    """A value in (0, inf]; ``math.inf`` is allowed (the paper's theta = +inf cases)."""
    return check_scalar(x, name, low=0.0, low_inclusive=False, allow_inf=True)


def check_probability(p, name: str = "p") -> float:
    """A fraction in (0, 1]."""
    return check_scalar(p, name, low=0.0, high=1.0, low_inclusive=False)
