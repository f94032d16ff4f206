"""Fingerprints of data, model, weights and cost: ``otstab-data-v1``, ``otstab-model-v1``,
``otstab-weights-v1``, ``otstab-cost-v1`` (the byte streams are described in
:mod:`otstab.certificates`)."""

from __future__ import annotations

import hashlib
import json
import struct
from numbers import Integral, Real

import numpy as np
import pandas as pd

from .._results import jsonable
from .._validation import as_float_vector
from ..errors import ValidationError

DATA_HASH = "otstab-data-v1"


MODEL_HASH = "otstab-model-v1"


WEIGHTS_HASH = "otstab-weights-v1"


_QNAN = struct.pack("<Q", 0x7FF8000000000000)


_PANDAS_MAJOR = int(pd.__version__.split(".")[0])


def _chunk(b: bytes) -> bytes:
    return len(b).to_bytes(8, "little") + b


def _float_bytes(values) -> bytes:
    a = np.array(values, dtype=np.float64, copy=True).reshape(-1)
    a += 0.0  # -0.0 -> 0.0
    nan = np.isnan(a)
    out = a.astype("<f8").tobytes()
    if nan.any():
        buf = bytearray(out)
        for i in np.flatnonzero(nan).tolist():
            buf[8 * i:8 * i + 8] = _QNAN
        out = bytes(buf)
    return out


def _column_payload(col) -> tuple[bytes, bytes]:
    """(kind, payload) of one column (a pandas Series or 1-D numpy array)."""
    if isinstance(col, pd.Series):
        dtype = col.dtype
        if (pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)) and \
                not pd.api.types.is_complex_dtype(dtype):
            return b"f8", _float_bytes(col.to_numpy(dtype=np.float64, na_value=np.nan))
        values = col.tolist()
    else:
        arr = np.asarray(col)
        if arr.dtype.kind in "biuf":
            return b"f8", _float_bytes(arr)
        values = arr.tolist()
    text = json.dumps([str(v) for v in values], ensure_ascii=False, separators=(",", ":"))
    return b"str", text.encode("utf-8")


def hash_data(X, y) -> str:
    """SHA-256 (hex) of the canonical serialisation ``otstab-data-v1`` of ``(X, y)``.

    Parameters
    ----------
    X : DataFrame or 2-D array-like, shape (n, d)
    y : Series or 1-D array-like, shape (n,)

    Returns
    -------
    str
        64 hexadecimal digits. See the module docstring for the byte layout.
    """
    if isinstance(X, pd.DataFrame):
        columns = [(str(c), X.iloc[:, j]) for j, c in enumerate(X.columns)]
        n, d = X.shape
    else:
        arr = np.asarray(X)
        if arr.ndim != 2:
            raise ValidationError(f"X must be 2-D to be fingerprinted, got shape {arr.shape}")
        n, d = arr.shape
        columns = [(str(j), arr[:, j]) for j in range(d)]
    yy = y if isinstance(y, pd.Series) else np.asarray(y)
    if isinstance(yy, pd.DataFrame) or np.ndim(yy) != 1:
        yy = np.asarray(yy).reshape(-1)
    if len(yy) != n:
        raise ValidationError(f"X has {n} rows but y has {len(yy)} entries")
    h = hashlib.sha256()
    h.update(_chunk(DATA_HASH.encode()))
    h.update(_chunk(f"{n},{d}".encode()))
    for name, col in columns:
        kind, payload = _column_payload(col)
        h.update(_chunk(name.encode("utf-8")))
        h.update(_chunk(kind))
        h.update(_chunk(payload))
    kind, payload = _column_payload(yy)
    h.update(_chunk(b"label"))
    h.update(_chunk(kind))
    h.update(_chunk(payload))
    return h.hexdigest()


def hash_weights(sample_weight) -> str:
    """SHA-256 (hex) of the canonical serialisation ``otstab-weights-v1`` of sample weights
    (a 1-D sequence of numbers; see the module docstring)."""
    w = _raw_weights(sample_weight)
    h = hashlib.sha256()
    for part in (WEIGHTS_HASH.encode(), str(w.size).encode(), _float_bytes(w)):
        h.update(_chunk(part))
    return h.hexdigest()


def _raw_weights(sample_weight) -> np.ndarray:
    """The caller's weights as float64 (checked by :func:`as_float_vector`)."""
    raw = sample_weight.to_numpy() if isinstance(sample_weight, pd.Series) else sample_weight
    return as_float_vector(raw, "sample_weight", nonnegative=True)


def _effective_n(w: np.ndarray) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` (scale-free)."""
    q = w / float(np.max(w))
    return float(np.sum(q)) ** 2 / float(np.dot(q, q))


def _qualname(obj) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _canon(obj, out: list, stack: set, depth: int) -> None:
    """Append the canonical token stream of ``obj`` to ``out`` (see :func:`hash_model`)."""
    if depth > 64:
        out.append(b"#deep")
        return
    if obj is None:
        out.append(b"N")
    elif isinstance(obj, (bool, np.bool_)):
        out.append(b"B1" if obj else b"B0")
    elif isinstance(obj, Integral):
        out.append(b"I" + _chunk(str(int(obj)).encode()))
    elif isinstance(obj, Real) and not isinstance(obj, np.ndarray):
        out.append(b"F" + _float_bytes([float(obj)]))
    elif isinstance(obj, str):
        out.append(b"S" + _chunk(obj.encode("utf-8")))
    elif isinstance(obj, bytes):
        out.append(b"Y" + _chunk(obj))
    elif isinstance(obj, np.dtype):
        out.append(b"S" + _chunk(str(obj).encode()))
    elif isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biuf":
            a = obj.astype(np.uint8) if obj.dtype.kind == "b" else obj
            a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<")))
            if a.dtype.kind == "f":
                a = a + 0.0
            out.append(b"A" + _chunk(a.dtype.str.encode()) + _chunk(str(a.shape).encode())
                       + _chunk(a.tobytes()))
        else:
            out.append(b"O" + _chunk(str(obj.shape).encode()))
            for v in obj.reshape(-1).tolist():
                _canon(v, out, stack, depth + 1)
    elif isinstance(obj, (pd.DataFrame, pd.Series, pd.Index)):
        out.append(b"P" + _chunk(_qualname(obj).encode()))
        _canon(np.asarray(obj.index if not isinstance(obj, pd.Index) else obj, dtype=object),
               out, stack, depth + 1)
        if isinstance(obj, pd.DataFrame):
            _canon([str(c) for c in obj.columns], out, stack, depth + 1)
        if not isinstance(obj, pd.Index):
            _canon(obj.to_numpy(), out, stack, depth + 1)
    elif isinstance(obj, slice):
        out.append(b"Z")
        for v in (obj.start, obj.stop, obj.step):
            _canon(v, out, stack, depth + 1)
    elif isinstance(obj, type) or _is_function(obj):
        name = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
        out.append(b"C" + _chunk(name.encode()))
    else:
        key = id(obj)
        if key in stack:
            out.append(b"R")
            return
        stack.add(key)
        try:
            if isinstance(obj, (list, tuple)):
                out.append((b"L" if isinstance(obj, list) else b"T") + _chunk(
                    str(len(obj)).encode()))
                for v in obj:
                    _canon(v, out, stack, depth + 1)
            elif isinstance(obj, dict):
                items = sorted(obj.items(), key=lambda kv: str(kv[0]))
                out.append(b"D" + _chunk(str(len(items)).encode()))
                for k, v in items:
                    _canon(str(k), out, stack, depth + 1)
                    _canon(v, out, stack, depth + 1)
            elif isinstance(obj, (set, frozenset)):
                out.append(b"E")
                _canon(sorted(obj, key=repr), out, stack, depth + 1)
            elif hasattr(obj, "detach") and hasattr(obj, "cpu") and hasattr(obj, "numpy"):
                _canon(obj.detach().cpu().numpy(), out, stack, depth + 1)  # a torch tensor
            elif callable(getattr(obj, "state_dict", None)) and hasattr(obj, "parameters"):
                out.append(b"M" + _chunk(_qualname(obj).encode()))
                _canon(dict(obj.state_dict()), out, stack, depth + 1)
            elif hasattr(obj, "__dict__"):
                out.append(b"O" + _chunk(_qualname(obj).encode()))
                public = {k: v for k, v in vars(obj).items() if not str(k).startswith("_")}
                _canon(public, out, stack, depth + 1)
            else:
                out.append(b"?" + _chunk(_qualname(obj).encode()))
        finally:
            stack.discard(key)


def _is_function(obj) -> bool:
    import types

    return isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                            types.ModuleType))


def hash_model(model) -> str:
    """SHA-256 (hex) of the canonical serialisation ``otstab-model-v1`` of a model's state.

    Parameters
    ----------
    model : object
        A fitted scikit-learn estimator or Pipeline, :class:`otstab.LinearModel`, a PyTorch
        module, or any object whose public attributes define it.

    Returns
    -------
    str
        64 hexadecimal digits. Equal for a model and its joblib round trip; different as soon
        as a coefficient, a hyper-parameter or a preprocessing statistic differs.
    """
    out: list[bytes] = [_chunk(MODEL_HASH.encode())]
    _canon(model, out, set(), 0)
    h = hashlib.sha256()
    for b in out:
        h.update(b)
    return h.hexdigest()


def hash_file(path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _strict(obj):
    return jsonable(obj, strict=True)


COST_HASH = "otstab-cost-v1"


def hash_cost(spec: dict) -> str:
    """SHA-256 (hex) of the canonical serialisation ``otstab-cost-v1`` of a DataCost spec
    (``DataCost.to_dict()``): ``chunk("otstab-cost-v1") chunk(json)`` with ``json`` the spec
    as compact UTF-8 JSON with sorted keys (non-finite numbers as strings)."""
    text = json.dumps(_strict(spec), sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False)
    h = hashlib.sha256()
    for part in (COST_HASH.encode(), text.encode("utf-8")):
        h.update(_chunk(part))
    return h.hexdigest()


def _datacost_spec(result) -> dict | None:
    """The resolved DataCost spec a result was certified under, or None (encoded cost)."""
    info = result.info if isinstance(getattr(result, "info", None), dict) else {}
    spec = info.get("cost")
    return None if spec is None else _strict(spec)
