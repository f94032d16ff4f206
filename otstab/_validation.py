"""Argument validation shared by every public function.

Each helper returns a fresh array (never a view the caller could see mutated) and raises an
``otstab.errors`` exception whose message names the argument.
"""

from __future__ import annotations

import functools
import math
import warnings
from numbers import Integral, Real

import numpy as np
import pandas as pd
from otstab_solvers.weights import ScaledWeights

from .errors import InputTypeError, ValidationError

__all__ = [
    "align_columns",
    "as_bool_vector",
    "as_float_matrix",
    "as_float_vector",
    "as_sample_weight",
    "check_same_length",
    "check_positive_extended",
    "check_scalar",
    "check_probability",
    "check_random_state",
    "column_names",
    "positional_deprecated",
    "renamed_kwargs",
    "fitted_feature_names",
]


def column_names(df: pd.DataFrame, name: str = "X") -> list:
    """The column labels of ``df`` (original objects), checked distinct, also as text.

    Two labels that differ as objects but read the same as text (``0`` and ``"0"``) would
    collide in otstab's feature names (which are text), so they are refused as well.
    """
    cols = list(df.columns)
    dup = list(pd.unique(np.asarray(df.columns[df.columns.duplicated()], dtype=object)))
    if dup:
        raise ValidationError(f"{name} has duplicate column names: {dup[:10]}")
    first: dict[str, object] = {}
    clash = []
    for c in cols:
        other = first.setdefault(str(c), c)
        if other is not c:
            clash.append((other, c))
    if clash:
        shown = ", ".join(f"{a!r} and {b!r}" for a, b in clash[:5])
        raise ValidationError(f"{name} has column names that differ but read the same as "
                              f"text ({shown}); rename them")
    return cols


def fitted_feature_names(model) -> list[str] | None:
    """``model.feature_names_in_`` (a Pipeline's: its first step's), or of the model an
    ``otstab.nonlinear`` adapter wraps; None when the model was fitted without names."""
    for obj in (model, getattr(model, "model", None)):
        names = getattr(obj, "feature_names_in_", None) if obj is not None else None
        if names is not None:
            return [str(c) for c in names]
    return None


def align_columns(X, model, name: str = "X"):
    """``(X, feature_names)``: the columns of a DataFrame ``X`` matched by name to the model's.

    For a model fitted with feature names (scikit-learn's ``feature_names_in_``), a DataFrame
    with the same columns in another order is reordered to the model's order (a new frame; the
    caller's is untouched) and missing or unexpected columns raise, naming them. Column labels
    are compared as text (unambiguous: :func:`column_names` refuses labels that collide as
    text). As in scikit-learn, an array, or a frame without any string column label, is taken
    by position. ``feature_names`` are the model's names when it has them, else the frame's
    column labels as text, else ``x0, x1, ...``.
    """
    expected = fitted_feature_names(model)
    if not isinstance(X, pd.DataFrame):
        d = np.shape(X)[1] if np.ndim(X) == 2 else 1
        if expected is not None and len(expected) == d:
            return X, expected
        return X, [f"x{j}" for j in range(d)]
    cols = column_names(X, name)
    text = [str(c) for c in cols]
    if expected is None:
        return X, text
    if text == expected:
        return X, expected
    if set(text) == set(expected):
        pos = {t: j for j, t in enumerate(text)}
        return X.iloc[:, [pos[t] for t in expected]], expected
    if not any(isinstance(c, str) for c in cols):  # e.g. a RangeIndex: by position
        return X, expected if len(expected) == len(cols) else text
    have, want = set(text), set(expected)
    missing = [t for t in expected if t not in have]
    unexpected = [c for c, t in zip(cols, text) if t not in want]
    raise ValidationError(
        f"{name} columns do not match the model's features (feature_names_in_): "
        f"missing {missing[:10]}{' ...' if len(missing) > 10 else ''}, unexpected "
        f"{unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}"
    )


def _real_array(v, name: str, *, copy: bool = True, float32: bool = False) -> np.ndarray:
    """``v`` as float64, refusing complex numbers and text (numpy would cast them silently);
    ``float32``: a float32 NumPy array stays float32 (no conversion copy).

    A DataFrame's columns are checked by dtype (its non-numeric columns are refused earlier by
    :func:`as_float_matrix`); other input is scanned.
    """
    if isinstance(v, pd.DataFrame):
        cplx = [c for c, t in zip(v.columns, v.dtypes) if getattr(t, "kind", "") == "c"]
        if cplx:
            raise ValidationError(f"{name} has complex column(s) {cplx[:5]}; pass real numbers")
        raw = v
    else:
        try:
            raw = np.asarray(v)
        except (TypeError, ValueError) as exc:
            raise ValidationError(
                f"{name} must be numeric, got {type(v).__name__}: {exc}") from exc
        check_real(raw, name)
        if raw.dtype.kind in "USO":
            text = next((x for x in raw.ravel().tolist() if isinstance(x, (str, bytes))), None)
            if text is not None:
                raise ValidationError(f"{name} must be numeric, got text such as {text!r}")
    dtype = np.float32 if float32 and isinstance(raw, np.ndarray) and \
        raw.dtype == np.float32 else np.float64
    try:
        return np.array(raw, dtype=dtype, copy=True) if copy else np.asarray(raw, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{name} must be numeric, got {type(v).__name__}: {exc}") from exc


def check_real(arr: np.ndarray, name: str) -> None:
    """Raise a ValidationError when ``arr`` holds complex numbers (not silently dropping the
    imaginary part)."""
    kind = arr.dtype.kind
    if kind == "c" or (kind == "O" and any(isinstance(x, complex) for x in arr.flat)):
        raise ValidationError(f"{name} holds complex numbers; pass real numbers (e.g. "
                              f"{name}.real if the imaginary parts are meant to be dropped)")


def as_float_matrix(X, name: str = "X", *, allow_1d: bool = False, copy: bool = True,
                    check_finite: bool = True, float32: bool = False,
                    fortran: bool = False) -> np.ndarray:
    """A C-contiguous float64 2-D array, rejecting NaN/inf, complex and non-numeric data.

    ``copy=False`` returns a read-only view when no conversion is needed (the caller's array is
    never written to either way); ``check_finite=False`` leaves the NaN/inf check to the caller
    (e.g. on the model scores, which propagate any NaN or inf of X) -- call
    :func:`check_finite_matrix` to raise the precise error. ``float32``: a float32 NumPy array
    is kept in float32 (for callers that compute in float64 from it, e.g. linear scores).
    ``fortran`` (with ``copy=False``): a Fortran-ordered array (a pandas DataFrame's values,
    one column after the other) is kept as it is instead of transposed into a C-ordered copy
    (which costs several times a pass over X).
    """
    if X is None:
        raise ValidationError(f"{name} is required, got None")
    if isinstance(X, pd.DataFrame):
        column_names(X, name)
        bad = non_numeric_columns(X)
        if bad:
            raise ValidationError(
                f"{name} has non-numeric column(s) {bad[:5]}; encode them first "
                "(e.g. one-hot) or pass a pipeline that does"
            )
    arr = _real_array(X, name, copy=copy, float32=float32)
    if arr.ndim == 1 and allow_1d:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise ValidationError(f"{name} must be a 2-D array (n_samples, n_features), "
                              f"got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValidationError(f"{name} has no rows")
    if check_finite:
        check_finite_matrix(arr, name)
    if not (fortran and not copy and arr.flags.f_contiguous):
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
    return [c for c, t in zip(df.columns, df.dtypes)
            if not (pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t))]


def is_categorical(v) -> bool:
    """A pandas Categorical, or a Series / Index of categorical dtype."""
    return isinstance(v, pd.Categorical) or (
        isinstance(v, (pd.Series, pd.Index)) and isinstance(v.dtype, pd.CategoricalDtype)
    )


def as_one_dim(arr: np.ndarray, name: str) -> np.ndarray:
    """``arr`` as a non-empty 1-D array (a single row or column is flattened)."""
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise ValidationError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValidationError(f"{name} is empty")
    return arr


def as_float_vector(v, name: str, *, finite: bool = True, nonnegative: bool = False,
                    copy: bool = True) -> np.ndarray:
    """A float64 1-D copy (``copy=False``: the caller's float64 array itself where it is one,
    for a caller that only reads it); rejects NaN/inf (if ``finite``) and negative values
    (if asked)."""
    if v is None:
        raise ValidationError(f"{name} is required, got None")
    arr = as_one_dim(_real_array(v, name, copy=copy), name)
    if finite and not np.all(np.isfinite(arr)):
        i = int(np.argmax(~np.isfinite(arr)))
        raise ValidationError(f"{name} contains NaN or inf (first at index {i})")
    if nonnegative and np.any(arr < 0):
        i = int(np.argmax(arr < 0))
        raise ValidationError(f"{name} must be >= 0, got {arr[i]} at index {i}")
    return arr


def as_sample_weight(v, n: int, name: str = "sample_weight") -> ScaledWeights | None:
    """Survey weights as probabilities ``p = w / sum(w)``: length ``n``, finite, nonnegative,
    not all zero (None when absent or all equal: the unweighted problem). Booleans and text
    are refused (a boolean mask is not a weight: select the rows instead).

    A :class:`~otstab_solvers.weights.ScaledWeights`: the caller's contiguous float64 array
    is read through a read-only view, not copied (``p[rows]`` is ``w[rows] / sum(w)``, the
    same bits as the n-vector ``w / sum(w)``; ``owned`` False: its caller fingerprints it);
    other input (integers, a list, a strided view) is converted into an array of its own,
    normalised in place (``owned``)."""
    if v is None:
        return None
    raw = v.to_numpy() if isinstance(v, (pd.Series, pd.DataFrame)) else v
    if np.asarray(raw).dtype.kind == "b":
        raise ValidationError(f"{name} must hold numbers, got booleans (to keep some rows, "
                              "select them instead)")
    # (no copy: only read here)
    arr = as_float_vector(raw, name, nonnegative=True, copy=False)
    if arr.size != n:
        raise ValidationError(f"{name} has {arr.size} entries but X has {n} rows")
    total = float(np.sum(arr))
    if not total > 0.0:
        raise ValidationError(f"{name} must have a positive sum, got all zeros")
    if not math.isfinite(total):
        raise ValidationError(f"{name} sums to {total} (overflow); rescale the weights")
    if np.all(arr == arr[0]):
        return None  # uniform: the unweighted problem (bit-identical results)
    callers = isinstance(raw, np.ndarray) and np.may_share_memory(arr, raw)
    if callers and arr.flags.c_contiguous:
        view = arr.view()
        view.setflags(write=False)
        return ScaledWeights(view, total)
    own = np.array(arr, dtype=np.float64, order="C") if callers else arr
    own /= total  # (the same bits as arr / total)
    return ScaledWeights(own, 1.0, owned=True)


def as_bool_vector(v, name: str) -> np.ndarray:
    """A bool 1-D copy of flags given as booleans or the numbers 0 and 1.

    Text (``"False"`` is a non-empty string, hence truthy), NaN, None and any other number
    raise a ValidationError naming ``name`` instead of being read by truthiness.
    """
    if v is None:
        raise ValidationError(f"{name} is required, got None")
    try:
        raw = as_one_dim(np.asarray(v), name)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{name} must be a 1-D array of booleans: {exc}") from exc
    if raw.dtype.kind == "b":
        return raw.copy()
    bad_type = raw.dtype.kind not in "iufO" or (raw.dtype.kind == "O" and any(
        isinstance(x, (str, bytes, complex)) for x in raw))
    vals = None
    if not bad_type:
        try:
            vals = raw.astype(np.float64)
        except (TypeError, ValueError):
            bad_type = True
    if bad_type:
        items = raw.tolist()
        i = next((j for j, x in enumerate(items) if not isinstance(x, (bool, Real))), 0)
        raise ValidationError(f"{name} must hold booleans or 0/1, got {items[i]!r} "
                              f"({type(items[i]).__name__}) at index {i}")
    bad = ~((vals == 0.0) | (vals == 1.0))  # NaN is bad too
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValidationError(f"{name} must hold booleans or 0/1, got {raw.tolist()[i]!r} at "
                              f"index {i}")
    return np.asarray(vals == 1.0)


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


def check_random_state(random_state, name: str = "random_state") -> np.random.Generator:
    """The one check of ``random_state`` for every function that draws random numbers.

    Accepts None (fresh entropy), a non-negative int (a seed: ``np.random.default_rng(seed)``,
    so the draws match ``default_rng`` exactly), a ``numpy.random.Generator`` (used as is; its
    state advances) or, for scikit-learn compatibility, a legacy ``numpy.random.RandomState``
    (a seed is drawn from it, so it advances too and the result is reproducible from its
    state). Booleans are refused: ``True`` is not a seed.
    """
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be None, an int, a numpy Generator or RandomState, "
                             f"got the boolean {random_state!r} (a boolean is not a seed)")
    if random_state is None:
        return np.random.default_rng()
    if isinstance(random_state, (Integral, np.integer)):
        if int(random_state) < 0:
            raise ValidationError(f"{name} must be a non-negative int, got {random_state}")
        return np.random.default_rng(int(random_state))
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(int(random_state.randint(0, 2**31 - 1)))
    raise InputTypeError(f"{name} must be None, an int, a numpy Generator or RandomState, "
                         f"got {type(random_state).__name__}")


def renamed_kwargs(**renames):
    """Decorator: old keyword names that keep working for one release.

    ``renamed_kwargs(old="new")`` maps ``old=value`` to ``new=value``;
    ``renamed_kwargs(old=("new", convert))`` to ``new=convert(value)`` (e.g. ``delta`` ->
    ``level = 1 - delta``). Each use of an old name emits a ``FutureWarning`` naming the new
    one; passing both raises a TypeError. The old names are listed in the wrapper's
    ``__deprecated_kwargs__`` (``{old: new}``); ``inspect.signature`` shows the new ones only.
    """
    table = {old: (new, None) if isinstance(new, str) else (new[0], new[1])
             for old, new in renames.items()}

    def decorate(func):
        qual = getattr(func, "__qualname__", getattr(func, "__name__", "function"))
        where = qual[:-len(".__init__")] if qual.endswith(".__init__") else qual

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for old, (new, convert) in table.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{where}() got both {old!r} (deprecated) and {new!r}; "
                                    f"pass {new!r} only")
                value = kwargs.pop(old)
                hint = f"{new}=1 - {old}" if convert is not None else f"{new}"
                warnings.warn(f"{where}(): {old!r} is deprecated and will be removed in the "
                              f"next release; use {hint!r}", FutureWarning, stacklevel=2)
                kwargs[new] = value if convert is None or value is None else convert(value)
            return func(*args, **kwargs)

        wrapper.__deprecated_kwargs__ = {**getattr(func, "__deprecated_kwargs__", {}),
                                         **{old: new for old, (new, _) in table.items()}}
        return wrapper

    return decorate


def positional_deprecated(n: int, *names: str):
    """Decorator: arguments after the first ``n`` became keyword-only; for one release the
    old positional use still works (``names`` are the former positional parameters after the
    ``n``-th, in order) with a ``FutureWarning``."""

    def decorate(func):
        where = getattr(func, "__qualname__", "function")

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if len(args) > n:
                extra = args[n:]
                if len(extra) > len(names):
                    raise TypeError(f"{where}() takes {n} positional arguments but "
                                    f"{len(args)} were given")
                moved = names[:len(extra)]
                for nm, v in zip(moved, extra):
                    if nm in kwargs:
                        raise TypeError(f"{where}() got multiple values for argument {nm!r}")
                    kwargs[nm] = v
                warnings.warn(f"{where}(): passing {', '.join(moved)} by position is deprecated "
                              f"and will be an error in the next release; pass "
                              f"{', '.join(f'{m}=...' for m in moved)}", FutureWarning,
                              stacklevel=2)
                args = args[:n]
            return func(*args, **kwargs)

        wrapper.__positional_deprecated__ = names
        return wrapper

    return decorate


def check_level(level, name: str = "level") -> float:
    """A confidence level in (0, 1): a real number (not a string such as "0.9", not a bool)."""
    if isinstance(level, (bool, np.bool_)) or not isinstance(level, (Real, np.floating,
                                                                     np.integer)):
        shown = repr(level) if len(repr(level)) <= 60 else repr(level)[:60] + "..."
        raise ValidationError(f"{name} must be a number in (0, 1) such as 0.95, got "
                              f"{type(level).__name__} {shown}")
    lv = float(level)
    if not 0.0 < lv < 1.0:
        raise ValidationError(f"{name} must be in (0, 1), got {level!r}")
    return lv
