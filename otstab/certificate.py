"""Stability certificates as files: a versioned JSON format, its hashes, and verification.

A certificate records *what* was certified (a fingerprint of the evaluation data and of the
model, the loss and the parameters ``r``, ``theta1``, ``theta2``, the divergence), *what came
out* (the value ``R(beta, r)``, the dual multiplier ``h``, the audit of the most sensitive
distribution Q*: its cost, its risk, the primal-dual gap, the excess-risk decomposition, and
optionally the feature-stability scores), and *how* (solver, status, timings, package
versions). :func:`verify_certificate` recomputes everything from the model and the data and
reports every field that does not reproduce: each field is recomputed, checked for consistency
with the others, or informational (timestamps, timings, versions), as ``docs/guarantees.md``
lists. Duplicate keys and unknown keys are refused.

Format ``"otstab-certificate"``, version 1; JSON Schema in
``otstab/schema/certificate.schema.json`` (a copy is ``docs/certificate.schema.json``).
Non-finite numbers are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"`` so the file
is strict JSON.

Fingerprints
------------
``otstab-data-v1`` (:func:`hash_data`): SHA-256 of a byte stream built from length-prefixed
chunks (each chunk is its length as an 8-byte little-endian unsigned integer followed by its
bytes)::

    chunk("otstab-data-v1") chunk("<n>,<d>")
    for every column j of X, in order:  chunk(name_j) chunk(kind_j) chunk(payload_j)
    chunk("label") chunk(kind_y) chunk(payload_y)

``name_j`` is ``str(column)`` for a DataFrame and ``str(j)`` for an array. A column of numbers
or booleans has kind ``"f8"`` and its values as float64 little-endian bytes, with ``-0.0``
written as ``0.0`` and every NaN as the quiet NaN ``0x7ff8000000000000``; any other column has
kind ``"str"`` and the UTF-8 JSON list of ``str(value)``. The index of a DataFrame is not
part of the fingerprint; the column names and their order are. Integer labels 0/1 and float
labels 0.0/1.0 therefore hash alike, so a CSV round trip (read with
``float_precision="round_trip"``) keeps the fingerprint.

``otstab-model-v1`` (:func:`hash_model`): SHA-256 of a canonical, type-tagged serialisation of
the model's state: for an object, its class (``module.QualName``) and its public attributes
(``vars(obj)`` without names starting with ``_``, sorted), recursively; numpy arrays as dtype,
shape and little-endian bytes; lists, tuples, dicts (keys sorted) and scalars tagged by type;
functions and classes by qualified name; PyTorch modules by their ``state_dict()``. For a
scikit-learn estimator this covers the hyper-parameters and the fitted state (``coef_``,
``intercept_``, ``classes_``, a scaler's ``mean_``, a Pipeline's steps, ...), and it is the
same for a model in memory and the same model after a joblib round trip. The SHA-256 of a model
file's bytes is recorded as well (``file_sha256``) but only reported, since saving the same
model again may give other bytes.

``otstab-weights-v1`` (:func:`hash_weights`): the sample weights of a weighted certificate
(``certify(..., sample_weight=w)``), recorded like the data, by fingerprint: SHA-256 of
``chunk("otstab-weights-v1") chunk("<n>") chunk(payload)`` with the payload the caller's
weights (not normalised) as float64 little-endian bytes (``-0.0`` as ``0.0``). The
certificate's ``inputs.sample_weight`` holds the fingerprint, the number of rows, where the
weights came from (``source``, e.g. a column name) and their effective sample size
``(sum w)^2 / sum w^2``; :func:`verify_certificate` needs the same weights to recompute.

Per-feature prices (``certify(..., feature_costs=...)``, :mod:`otstab.costs`) are recorded as
they were solved with: ``inputs.feature_costs`` is the list of prices of the model's input
columns, in order (a raw Pipeline column priced per raw unit appears as its price per unit of
the model's input; ``inf``, immutable, as ``"inf"``), null when every price is 1.
:func:`verify_certificate` passes them to ``certify`` and ``feature_stability``.

A result certified under a :class:`otstab.DataCost` records ``inputs.cost``: the resolved spec
(``DataCost.to_dict()``, every inferred kind, scale, level and bound written out), its
description in plain words, and ``otstab-cost-v1`` (:func:`hash_cost`): SHA-256 of
``chunk("otstab-cost-v1") chunk(json)``, ``json`` the spec as compact UTF-8 JSON with sorted
keys. :func:`verify_certificate` re-certifies under the stored spec and audits Q*'s raw rows
(:func:`raw_qstar_mismatches`); the Q* side file is then the raw frame.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import struct
from dataclasses import dataclass, field
from importlib import resources
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from otstab_solvers.weights import phi

from . import __version__, datacost_linear
from ._results import jsonable
from ._validation import as_float_vector, as_sample_weight
from .audit import relative_gap
from .core import certify
from .datacost import DataCost, _frame, as_cost
from .errors import InputTypeError, OtstabError, SolverError, ValidationError
from .features import feature_stability
from .inference import Bootstrap, check_level
from .losses import LOSS_NAMES, PiecewiseLinear, ZeroOne, epsilon_insensitive, get_loss, pinball
from .models import resolve_model
from .reduction import feature_mask
from .results import StabilityResult

__all__ = [
    "FORMAT",
    "VERSION",
    "DATA_HASH",
    "MODEL_HASH",
    "DEFAULT_TOLERANCES",
    "make_certificate",
    "write_certificate",
    "read_certificate",
    "validate_certificate",
    "MAX_CERTIFICATE_BYTES",
    "MAX_CERTIFICATE_DEPTH",
    "load_schema",
    "verify_certificate",
    "VerificationReport",
    "Mismatch",
    "hash_data",
    "hash_model",
    "hash_weights",
    "hash_file",
    "write_qstar",
    "read_table",
    "audit_qstar",
]

FORMAT = "otstab-certificate"
#: 2: results gained value_lower / value_upper (certified interval) and uncertainty
VERSION = 2
DATA_HASH = "otstab-data-v1"
MODEL_HASH = "otstab-model-v1"
WEIGHTS_HASH = "otstab-weights-v1"

#: Default tolerances of :func:`verify_certificate`: a recomputed figure ``b`` reproduces the
#: certified ``a`` when ``|a - b| <= atol + rtol * max(|a|, |b|)`` (``h_rtol`` for the dual
#: multiplier ``h``, which is less well conditioned than the value); the recomputed audit must
#: have ``gap <= gap_tol`` and ``risk_star >= r - gap_tol * max(1, r)``.
DEFAULT_TOLERANCES = {"rtol": 1e-6, "atol": 1e-9, "h_rtol": 1e-5, "gap_tol": 1e-5}

#: The largest certificate file :func:`read_certificate` parses (bytes; a certificate is some
#: kilobytes, with Q* summaries and feature tables well under a megabyte): 64 MiB, overridable
#: per call (``max_bytes=``) or by the environment variable ``OTSTAB_CERT_MAX_BYTES``.
MAX_CERTIFICATE_BYTES = 64 << 20
#: The deepest nesting of JSON arrays and objects a certificate may have (the format's own is
#: below 10).
MAX_CERTIFICATE_DEPTH = 64
#: Characters of a certificate's content that an error message quotes (then an ellipsis).
ECHO_CHARS = 200

_RESULT_FIGURES = ("value", "risk_base", "risk_star", "total_mass", "primal_cost")
_QNAN = struct.pack("<Q", 0x7FF8000000000000)
_PANDAS_MAJOR = int(pd.__version__.split(".")[0])


# ----------------------------------------------------------------------------------------------
# fingerprints


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


def _weights_info(sample_weight, source, n: int, p_result) -> dict | None:
    """``inputs.sample_weight`` of a certificate: None for an unweighted result, else the
    fingerprint of ``sample_weight``, after checking that they are the weights the result was
    computed with (``p_result``: the result's probabilities, None when uniform)."""
    if sample_weight is None:
        if p_result is not None:
            raise ValidationError(
                "result was computed with sample_weight: pass the same sample_weight= to "
                "make_certificate (its fingerprint is recorded so that verify can recompute "
                "the weighted audit)")
        return None
    p = as_sample_weight(sample_weight, n)
    same = (p is None and p_result is None) or (
        p is not None and p_result is not None and p.shape == np.shape(p_result)
        and np.allclose(p, p_result, rtol=1e-12, atol=0.0))
    if not same:
        raise ValidationError("sample_weight differs from the weights the result was computed "
                              "with; pass the sample_weight given to certify")
    w = _raw_weights(sample_weight)
    if source is None and isinstance(sample_weight, pd.Series) and sample_weight.name is not None:
        source = sample_weight.name
    return {"hash_method": WEIGHTS_HASH, "sha256": hash_weights(w), "n_samples": int(w.size),
            "source": None if source is None else str(source),
            "effective_n": _effective_n(w)}


def _costs_info(info: dict) -> list | None:
    """``inputs.feature_costs`` of a certificate: the per-column prices the result was solved
    with (``info["feature_costs"]``, one per column of the model's input, set by
    :func:`otstab.costs.unscale_result`), or None when every price is 1."""
    costs = info.get("feature_costs")
    if costs is None:
        return None
    c = [float(v) for v in costs]
    if not c or not all(v > 0 for v in c):  # (0, inf]; nan fails too
        raise ValidationError("result.info['feature_costs'] must hold prices in (0, inf], got "
                              f"{costs!r}")
    return c


def _recorded_costs(inputs: dict) -> list | None:
    """The prices of ``inputs.feature_costs`` as floats (``"inf"``: inf), or None."""
    costs = inputs.get("feature_costs")
    return None if costs is None else [_num(v) for v in costs]


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


# ----------------------------------------------------------------------------------------------
# helpers


def _versions() -> dict:
    from importlib import metadata


    out = {"otstab": __version__, "python": platform.python_version()}
    for dist in ("numpy", "scipy", "pandas", "cvxpy", "clarabel", "mosek", "ecos", "scs",
                 "scikit-learn", "joblib", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _now() -> str:
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


def _loss_spec(loss) -> dict:

    obj = get_loss(loss)
    spec: dict[str, Any] = {"name": obj.name}
    if isinstance(obj, PiecewiseLinear):
        spec.update({"slopes": list(obj.slopes), "intercepts": list(obj.intercepts),
                     "on": obj.on})
    return spec


def loss_from_spec(spec):
    """The loss a certificate's ``inputs.loss`` names: a built-in loss by its name (also
    ``pinball(TAU)`` and ``epsilon_insensitive(EPS)``), else a custom
    :class:`~otstab.losses.PiecewiseLinear` from its slopes, intercepts and ``on``."""

    name = spec["name"]
    m = re.fullmatch(r"(pinball|epsilon_insensitive)\((.+)\)", name)
    if m:
        f = pinball if m.group(1) == "pinball" else epsilon_insensitive
        return f(float(m.group(2)))
    if "slopes" in spec and name not in LOSS_NAMES:
        return PiecewiseLinear(tuple(spec["slopes"]), tuple(spec["intercepts"]),
                               on=spec.get("on", "margin"), name=name)
    return get_loss(name)


def _model_info(model, model_file=None) -> dict:
    steps = getattr(model, "steps", None)
    final = model
    pipeline = None
    if steps and hasattr(model, "named_steps"):
        pipeline = [{"name": str(nm), "class": _qualname(st)} for nm, st in steps]
        final = steps[-1][1]
    info = {
        "class": _qualname(model),
        "estimator": _qualname(final),
        "pipeline": pipeline,
        "n_features_in": (int(model.n_features_in_) if isinstance(
            getattr(model, "n_features_in_", None), Integral) else None),
        "hash_method": MODEL_HASH,
        "sha256": hash_model(model),
        "file": None,
        "file_sha256": None,
    }
    if model_file is not None:
        info["file"] = Path(model_file).name
        info["file_sha256"] = hash_file(model_file)
    return info


def _data_info(X, y, target) -> dict:
    if isinstance(X, pd.DataFrame):
        columns = [str(c) for c in X.columns]
        n, d = X.shape
    else:
        arr = np.asarray(X)
        if arr.ndim != 2:
            raise ValidationError(f"X must be 2-D, got shape {arr.shape}")
        n, d = arr.shape
        columns = [str(j) for j in range(d)]
    return {
        "n_samples": int(n), "n_features": int(d), "columns": columns,
        "target": None if target is None else str(target), "label_counts": _label_counts(y),
        "hash_method": DATA_HASH, "sha256": hash_data(X, y),
    }


def _label_counts(y) -> dict | None:
    """``{label: count}`` of a vector of at most 50 distinct labels, else None.

    Labels are keyed by ``str``; float labels that are all whole numbers count as integers, so
    that ``1`` and ``1.0`` (which :func:`hash_data` fingerprints alike) give the same key.
    """
    yy = np.asarray(y).reshape(-1)
    if yy.dtype.kind == "f" and np.all(np.isfinite(yy)) and np.all(yy == np.round(yy)):
        yy = yy.astype(np.int64)
    if yy.dtype.kind not in "biuOU":
        return None
    vals, counts = np.unique(yy.astype(str), return_counts=True)
    if vals.size > 50:
        return None
    return {str(v): int(c) for v, c in zip(vals, counts)}


def _strict(obj):
    return jsonable(obj, strict=True)


def _num(x) -> float:
    """A certificate number (float or "inf"/"-inf"/"nan" string) as a float."""
    if x is None:
        return math.nan
    if isinstance(x, str):
        return float(x)
    return float(x)


# ----------------------------------------------------------------------------------------------
# making and writing


def make_certificate(result, model, X, y, *, features=None, groups=None, movable=None,
                     target=None, model_file=None, qstar=None, solver=None,
                     solver_options=None, loss=None, extra=None, level=0.95,
                     sample_weight=None, sample_weight_source=None) -> dict:
    """Build a version-1 certificate (a JSON-ready dict) for a :class:`~otstab.StabilityResult`.

    Parameters
    ----------
    result : StabilityResult
        The answer of :func:`otstab.certify` on ``(model, X, y)``.
    model : estimator
        The certified model (fingerprinted with :func:`hash_model`).
    X, y : the evaluation data passed to ``certify`` (fingerprinted with :func:`hash_data`).
    features : DataFrame, optional
        The table of :func:`otstab.feature_stability`, computed with the same loss, ``r``,
        thetas and divergence as ``result``; recorded under ``results.feature_stability``.
    groups : dict, optional
        The ``groups=`` passed to ``feature_stability`` (recorded so that the scores can be
        recomputed).
    movable : sequence, optional
        The ``features=`` mask passed to ``certify`` (the features allowed to move).
    target : str, optional
        Name of the label column (informational).
    model_file : path, optional
        File the model was loaded from; its SHA-256 is recorded.
    qstar : dict, optional
        What :func:`write_qstar` returned, to reference the side file holding Q*.
    solver : str, optional
        The ``solver=`` requested from ``certify`` (used again by :func:`verify_certificate`);
        default ``"first_order"`` for a first-order result, else ``"auto"``.
    solver_options : dict, optional
        Extra options passed to ``certify`` (recorded; must be JSON-serialisable).
    loss : str or Loss, optional
        The loss object passed to ``certify`` when ``result.loss`` (a name) is not enough to
        rebuild it (a custom :class:`~otstab.losses.PiecewiseLinear`).
    extra : dict, optional
        Free-form JSON-serialisable metadata stored under ``"extra"``.
    sample_weight : array-like of shape (n,), optional
        The ``sample_weight=`` passed to ``certify`` (required when ``result`` is weighted;
        checked against the weights the result was computed with). Its fingerprint
        (:func:`hash_weights`), row count and effective sample size are recorded under
        ``inputs.sample_weight``; :func:`verify_certificate` needs the same weights.
    sample_weight_source : str, optional
        Where the weights came from (e.g. the data column they were read from; default the
        name of a pandas Series), recorded as ``inputs.sample_weight.source``.
    level : float, default 0.95
        Confidence level of the recorded sampling uncertainty (``results.uncertainty``: the
        SE, the two-sided interval and the one-sided lower bound of R, from
        ``result.inference``; ``docs/inference.md``); null when R = inf or when certify ran
        with ``se=None``.

    The per-feature prices the result was solved with (``feature_costs=`` of ``certify``, as
    ``result.info["feature_costs"]`` holds them) are recorded under ``inputs.feature_costs``.

    Returns
    -------
    dict
        Strict-JSON-ready (non-finite numbers as strings); see ``docs/certificate.schema.json``.
    """

    if not isinstance(result, StabilityResult):
        raise InputTypeError(
            f"result must be an otstab.StabilityResult, got {type(result).__name__}")
    data = _data_info(X, y, target)
    if result.n and result.n != data["n_samples"]:
        raise ValidationError(
            f"result was computed on {result.n} samples but X has {data['n_samples']} rows")
    weights = _weights_info(sample_weight, sample_weight_source, data["n_samples"],
                            result.info.get("sample_weight")
                            if isinstance(result.info, dict) else None)
    loss_spec = _loss_spec(loss if loss is not None else result.loss)
    info = result.info or {}
    cost_block = _cost_info(result, model, X)
    if cost_block is not None and features is not None:
        raise ValidationError("features: the feature-stability table is computed under the "
                              "encoded cost and cannot be recorded with a result certified "
                              "under a DataCost")
    decomposition = {k: v for k, v in (result.decomposition or {}).items()
                     if isinstance(v, (Real, np.floating))}
    results = {
        "value": result.value,
        "h": result.h,
        "alpha": result.alpha,
        "risk_base": result.risk_base,
        "risk_star": result.risk_star,
        "excess_risk": result.risk_star - result.risk_base,
        "total_mass": result.total_mass,
        "primal_cost": result.primal_cost,
        "gap": result.gap,
        "dual_gap_bound": result.dual_gap_bound,
        "decomposition": decomposition,
        "n_atoms": result.n_atoms,
        "split": bool(result.split),
        "exact": bool(getattr(result, "exact", True)),
        # none when not computed, or when r is unreachable (R = inf: no interval to state)
        "uncertainty": (None if result.inference is None or not math.isfinite(result.value)
                        else result.inference.to_dict(check_level(level))),
        "value_lower": float(getattr(result, "value_lower", result.value)),
        "value_upper": float(getattr(result, "value_upper", result.value)),
        "feature_stability": None,
    }
    if features is not None:
        table = pd.DataFrame(features.to_frame() if hasattr(features, "to_frame") else features)
        if "feature" not in table.columns or "score" not in table.columns:
            raise ValidationError(
                "features must be the table of otstab.feature_stability (columns 'feature' "
                f"and 'score'), got columns {list(table.columns)}")
        results["feature_stability"] = {
            "groups": None if groups is None else {str(k): [str(c) for c in v]
                                                   for k, v in dict(groups).items()},
            "table": table.to_dict(orient="records"),
        }
    cert = {
        "format": FORMAT,
        "version": VERSION,
        "created": _now(),
        "inputs": {
            "data": data,
            "model": _model_info(model, model_file),
            "loss": loss_spec,
            "r": result.r,
            "theta1": result.theta1,
            "theta2": result.theta2,
            "divergence": result.divergence,
            "movable_features": None if movable is None else [
                m if isinstance(m, Integral) else str(m) for m in np.atleast_1d(movable).tolist()
            ],
            "solver_requested": solver or (
                "first_order" if result.solver == "first_order" else "auto"),
            "solver_options": dict(solver_options or {}),
            "sample_weight": weights,
            "feature_costs": _costs_info(info),
        },
        "results": results,
        "solver": {
            "name": result.solver,
            "status": result.status,
            "message": result.message or "",
            "iterations": int(result.iterations or 0),
            "log": list(result.solver_log or []),
        },
        "timings": {
            "solve_s": result.solve_time,
            "compile_s": result.compile_time,
            "wall_s": info.get("wall_time"),
        },
        "environment": _versions(),
        "qstar": qstar,
        "extra": extra,
    }
    if cost_block is not None:  # absent for the encoded cost (older certificates: same)
        cert["inputs"]["cost"] = cost_block
    return _strict(cert)


def write_certificate(cert: dict, path) -> Path:
    """Validate ``cert`` against the schema and write it as indented strict JSON.

    Returns
    -------
    pathlib.Path
    """
    validate_certificate(cert)
    path = Path(path)
    text = json.dumps(_strict(cert), indent=2, allow_nan=False, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _echo(value, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with an ellipsis (a
    hostile certificate's field may be hundreds of megabytes)."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # (no repr of the whole string)
        return repr(value) + f"... ({limit} characters shown)"
    text = repr(value) if not isinstance(value, (list, dict)) else _short_repr(value, limit)
    return text if len(text) <= limit else text[:limit] + "..."


def _short_repr(obj, limit: int) -> str:
    """The beginning of ``repr`` of a list or dict, built only up to ``limit`` characters."""
    items = obj.items() if isinstance(obj, dict) else obj
    parts, size = [], 0
    for item in items:
        part = (f"{_echo(item[0], limit)}: {_echo(item[1], limit)}" if isinstance(obj, dict)
                else _echo(item, limit))
        parts.append(part)
        size += len(part) + 2
        if size > limit:
            break
    text = ", ".join(parts)
    return ("{" + text + "}") if isinstance(obj, dict) else ("[" + text + "]")


def _clip(text: str, limit: int = 2 * ECHO_CHARS) -> str:
    """A message cut to ``limit`` characters with an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "..."


def _max_bytes(max_bytes) -> int:
    if max_bytes is not None:
        return int(max_bytes)
    env = os.environ.get("OTSTAB_CERT_MAX_BYTES")
    if env:
        try:
            return int(env)
        except ValueError:
            raise ValidationError("OTSTAB_CERT_MAX_BYTES must be an integer number of bytes, "
                                  f"got {_echo(env)}") from None
    return MAX_CERTIFICATE_BYTES


def read_certificate(path, *, max_bytes: int | None = None) -> dict:
    """Read a certificate file (JSON) and check its format and version.

    The file must be UTF-8 JSON of at most ``max_bytes`` bytes (default
    :data:`MAX_CERTIFICATE_BYTES`, 64 MiB, or the environment variable
    ``OTSTAB_CERT_MAX_BYTES``), nested at most :data:`MAX_CERTIFICATE_DEPTH` deep; anything else
    (including numbers Python will not convert, such as integers of thousands of digits) is a
    :class:`~otstab.errors.ValidationError` whose message quotes at most
    :data:`ECHO_CHARS` characters of the content.
    """
    path = Path(path)
    limit = _max_bytes(max_bytes)
    try:
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise ValidationError(f"cannot read certificate {str(path)!r}: {exc.strerror}") from exc
    if len(raw) > limit:
        raise ValidationError(
            f"certificate {str(path)!r} is larger than {limit} bytes (a certificate is some "
            "kilobytes); raise the limit with read_certificate(..., max_bytes=) or the "
            "environment variable OTSTAB_CERT_MAX_BYTES if the file is genuine")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            f"certificate {str(path)!r} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start})") from None
    del raw
    try:
        cert = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"certificate {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    except RecursionError:  # the parser's own guard, some 1,000 levels deep
        raise ValidationError(
            f"certificate {str(path)!r} nests arrays / objects too deep to parse; a "
            f"certificate has at most {MAX_CERTIFICATE_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer of 5,000 digits
        if isinstance(exc, ValidationError):
            raise
        why = " ".join(str(exc).split(";")[0].split())  # (not Python's advice on limits)
        raise ValidationError(f"certificate {str(path)!r} is not valid JSON: {_clip(why)}"
                              ) from None
    validate_certificate(cert)
    return cert


def _object_depth(obj) -> int:
    """Nesting depth of parsed JSON (iterative: no recursion on a hostile object)."""
    top = 0
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            top = max(top, d)
            if top > MAX_CERTIFICATE_DEPTH:
                return top
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return top


def _unique_keys(pairs) -> dict:
    """``object_pairs_hook`` of :func:`read_certificate`: a key stated twice is an error (plain
    JSON keeps the last one silently, so a reader and a checker could see different values)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValidationError(f"certificate has the key {_echo(key)} twice in one object; "
                                  "every field must be stated once")
        out[key] = value
    return out


def _no_constant(token: str):
    raise ValidationError(f"certificate contains the non-standard JSON number {token}; "
                          'non-finite numbers are written "inf", "-inf" or "nan"')


def load_schema() -> dict:
    """The JSON Schema of the certificate format (shipped as package data)."""
    text = resources.files("otstab").joinpath("schema/certificate.schema.json").read_text(
        encoding="utf-8")
    return json.loads(text)


def validate_certificate(cert) -> None:
    """Check the format marker, the version and (with jsonschema installed) the schema.

    Raises
    ------
    ValidationError
        Naming the first offending field.
    """
    if not isinstance(cert, dict):
        raise ValidationError(f"a certificate must be a JSON object, got {type(cert).__name__}")
    if cert.get("format") != FORMAT:
        raise ValidationError(
            f"not an otstab certificate: format is {_echo(cert.get('format'))}, expected "
            f"{FORMAT!r}")
    if cert.get("version") != VERSION:
        raise ValidationError(
            f"unsupported certificate version {_echo(cert.get('version'))}; this otstab reads "
            f"version {VERSION}")
    depth = _object_depth(cert)
    if depth > MAX_CERTIFICATE_DEPTH:
        raise ValidationError(f"certificate nests arrays / objects {depth} deep; a certificate "
                              f"has at most {MAX_CERTIFICATE_DEPTH} levels")
    schema = load_schema()
    _reject_unknown_keys(cert, schema, "")
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is optional
        return
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(_strict(cert)), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = _clip("/".join(str(p) for p in err.path) or "(top level)")
        raise ValidationError(f"certificate field {where}: {_clip(err.message)}")


def _reject_unknown_keys(obj, schema: dict, where: str) -> None:
    """Raise on a key the schema does not define, in every object whose schema is closed
    (``additionalProperties: false``); works without the optional jsonschema package."""
    props = schema.get("properties")
    if not isinstance(obj, dict) or props is None:
        return
    if schema.get("additionalProperties") is False:
        unknown = sorted(str(k) for k in obj if k not in props)
        if unknown:
            raise ValidationError(f"certificate field {_clip(where or '(top level)')}: unknown "
                                  f"key(s) {_echo(unknown)}; version {VERSION} defines "
                                  f"{sorted(props)}")
    for key, sub in props.items():
        if key in obj:
            _reject_unknown_keys(obj[key], sub, f"{where}/{key}" if where else key)


# ----------------------------------------------------------------------------------------------
# Q* side file


def read_table(path) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``, ``.txt``) or Parquet (``.parquet``, ``.pq``) file.

    CSV floats are parsed exactly (``float_precision="round_trip"`` before pandas 3, the
    default since), so floats written with ``repr`` precision come back bit for bit.
    """
    path = Path(path)
    name = path.name.lower()
    if not path.exists():
        raise ValidationError(f"file {str(path)!r} does not exist")
    try:
        if name.endswith((".parquet", ".pq")):
            return pd.read_parquet(path)
        if name.endswith((".csv", ".csv.gz", ".txt", ".tsv")):
            sep = "\t" if name.endswith(".tsv") else ","
            # pandas >= 3 parses floats exactly by default and deprecates the option
            extra = {} if _PANDAS_MAJOR >= 3 else {"float_precision": "round_trip"}
            return pd.read_csv(path, sep=sep, **extra)
    except ImportError as exc:
        raise ValidationError(
            f"reading {str(path)!r} needs pyarrow (pip install pyarrow): {exc}") from exc
    except Exception as exc:  # a malformed file is the user's input
        raise ValidationError(f"cannot read {str(path)!r} as a table: {exc}") from exc
    raise ValidationError(
        f"file {str(path)!r} has an unsupported type; expected .csv, .csv.gz, .tsv or .parquet")


def write_qstar(result, path) -> dict:
    """Write the atoms of Q* (:meth:`StabilityResult.to_frame`) to CSV or Parquet.

    Returns
    -------
    dict
        ``{"file", "format", "n_atoms", "sha256"}``, to pass as ``qstar=`` to
        :func:`make_certificate`.
    """
    path = Path(path)
    # under a DataCost, Q* is a data set in the data's own columns and units
    frame = result.to_frame(raw=_datacost_spec(result) is not None)
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        try:
            frame.to_parquet(path, index=False)
        except ImportError as exc:
            raise ValidationError(
                f"writing {str(path)!r} needs pyarrow (pip install pyarrow)") from exc
        fmt = "parquet"
    elif name.endswith((".csv", ".csv.gz")):
        frame.to_csv(path, index=False, float_format="%.17g")
        fmt = "csv"
    else:
        raise ValidationError(
            f"Q* file {str(path)!r} must end in .csv, .csv.gz or .parquet")
    return {"file": path.name, "format": fmt, "n_atoms": int(len(frame)),
            "sha256": hash_file(path)}


def _figure_mismatches(figures: dict, res: dict, r: float, tol: dict, where: str,
                       source: str, risk_message: str) -> list:
    """Cost, risk and mass of a Q* recomputed from ``source`` against the certificate's
    results, and the risk against r. When r is unreachable no Q* exists: ``source`` holds the
    data unperturbed (cost 0) while the certificate records the cost as nan."""
    out = []
    recorded = {key: _num(res[key]) for key in figures}
    if math.isinf(_num(res["value"])):
        recorded["primal_cost"] = 0.0
    for key, val in figures.items():
        if not _close(recorded[key], val, tol["rtol"], tol["atol"]):
            out.append(Mismatch(f"{where}:{key}", recorded[key], val,
                                f"{key} recomputed from {source} differs from the "
                                "certificate"))
    if not math.isinf(_num(res["value"])) and figures["risk_star"] < r - tol["gap_tol"] * max(
            1.0, r):
        out.append(Mismatch(f"{where}:risk_star", f">= r = {r:g}", figures["risk_star"],
                            risk_message))
    return out


def audit_qstar(qstar, model, X, y, cert, *, rtol=None, atol=None,
                gap_tol=None, sample_weight=None) -> list[Mismatch]:
    """Audit a stored Q* independently: every column of the side file from the model and data.

    Parameters
    ----------
    qstar : DataFrame or path
        The side file written by :func:`write_qstar`.
    model, X, y : the certified model and evaluation data.
    cert : dict
        The certificate (its inputs and results).
    rtol, atol, gap_tol : float, optional
        Tolerances (default ``DEFAULT_TOLERANCES``), as in :func:`verify_certificate`.
    sample_weight : array-like of shape (n,), optional
        The sample weights of a weighted certificate (their fingerprint must match
        ``inputs.sample_weight``): each atom then carries ``p[source] * mass`` of P0.

    Returns
    -------
    list of Mismatch
        Empty when the file has exactly the columns :meth:`StabilityResult.to_frame` writes
        and ``results.n_atoms`` rows; every atom's ``index`` and original ``x`` are those of
        its ``source`` sample, its ``loss`` and ``loss*`` are the model's loss at ``x`` and at
        ``x*``, its ``distance2`` is ``||x* - x||^2``; each sample's ``mass`` shares sum to 1;
        the cost of Q* equals ``results.primal_cost`` (moves priced by
        ``inputs.feature_costs``, ``theta1 sum_j c_j (x*_j - x_j)^2``, when the certificate
        has prices), its risk ``results.risk_star`` (and reaches ``r``), its mass
        ``results.total_mass``; and no atom moves a feature the certificate does not let move
        (not in ``movable_features``, or priced ``inf``).
    """


    tol = _tolerances(rtol=rtol, atol=atol, gap_tol=gap_tol)
    frame = read_table(qstar) if not isinstance(qstar, pd.DataFrame) else qstar
    inputs, res = cert["inputs"], cert["results"]
    recorded_w = inputs.get("sample_weight")
    if (recorded_w is None) != (sample_weight is None) or (
            recorded_w is not None and hash_weights(sample_weight) != recorded_w["sha256"]):
        return [Mismatch("qstar:sample_weight",
                         "no weights" if recorded_w is None else recorded_w["sha256"],
                         "no weights" if sample_weight is None else hash_weights(sample_weight),
                         "the Q* file can only be audited with the certified sample weights")]
    if inputs.get("cost"):  # a DataCost certificate: Q*'s raw rows (raw_qstar_mismatches)
        return raw_qstar_mismatches(frame, model, X, y, cert, rtol=tol["rtol"],
                                    atol=tol["atol"], gap_tol=tol["gap_tol"],
                                    sample_weight=sample_weight)
    prob = resolve_model(model, X, y, loss=loss_from_spec(inputs["loss"]),
                         sample_weight=sample_weight)
    names = [str(nm) for nm in prob.feature_names]
    star_cols = [f"{nm}*" for nm in names]
    needed = ["source", "mass", *names, *star_cols, "weight", "loss", "loss*", "distance2"]
    columns = [str(c) for c in frame.columns]
    missing = [c for c in needed if c not in columns]
    unknown = [c for c in columns if c not in needed and c != "index"]
    if missing or unknown:
        return [Mismatch("qstar:columns", "the columns written by write_qstar",
                         f"missing {missing[:5]}, unknown {unknown[:5]}",
                         "the Q* file does not have the columns of a Q* side file")]
    out = []
    if "n_atoms" in res and len(frame) != res["n_atoms"]:
        out.append(Mismatch("qstar:n_atoms", res["n_atoms"], len(frame),
                            "the Q* file has another number of atoms than results.n_atoms"))
    srcf = frame["source"].to_numpy(dtype=np.float64)
    n = prob.n
    if srcf.size == 0 or not np.all((srcf == np.round(srcf)) & (srcf >= 0) & (srcf < n)):
        return out + [Mismatch("qstar:source", f"whole numbers in [0, {n})",
                               "empty" if srcf.size == 0 else f"[{srcf.min()}, {srcf.max()}]",
                               "atom sources are not sample indices")]
    src = srcf.astype(np.intp)
    mass = frame["mass"].to_numpy(dtype=np.float64)
    w = frame["weight"].to_numpy(dtype=np.float64)
    X0 = prob.X[src]
    Xs = frame[star_cols].to_numpy(dtype=np.float64)
    diff = Xs - X0
    loss_star = prob.losses(Xs, prob.y[src])
    per_atom = [(nm, X0[:, j], "the original x of the atom's source sample")
                for j, nm in enumerate(names)]
    per_atom += [("loss", prob.losses(prob.X)[src], "the loss at the atom's source sample"),
                 ("loss*", loss_star, "the loss at the atom's moved point x*"),
                 ("distance2", np.sum(diff ** 2, axis=1), "||x* - x||^2 of the atom")]
    for col, expected, what in per_atom:
        recorded = frame[col].to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~_close_array(recorded, expected, tol["rtol"], tol["atol"]))
        if bad.size:
            i = int(bad[0])
            out.append(Mismatch(f"qstar:{col}", f"atom {i}: {recorded[i]:.10g}",
                                f"{expected[i]:.10g}",
                                f"column {col!r} is not {what} ({bad.size} atom(s))"))
    if "index" in columns:
        index = np.arange(n) if prob.index is None else np.asarray(prob.index)
        recorded = frame["index"].astype(str).to_numpy()
        bad = np.flatnonzero(recorded != index[src].astype(str))
        if bad.size:
            i = int(bad[0])
            out.append(Mismatch("qstar:index", f"atom {i}: {recorded[i]}", str(index[src[i]]),
                                f"column 'index' is not the data index of the atom's source "
                                f"sample ({bad.size} atom(s))"))
    costs = _recorded_costs(inputs)
    c = np.ones(prob.d) if costs is None else np.asarray(costs, dtype=np.float64)
    if c.shape != (prob.d,):
        return out + [Mismatch("qstar:feature_costs", f"{prob.d} prices", c.size,
                               "inputs.feature_costs does not price every model input column")]
    mv = inputs.get("movable_features")
    mask = np.isfinite(c)  # a feature priced inf is immutable
    if mv is not None:
        mask &= feature_mask(prob.d, mv, names)
    moved_fixed = np.abs(diff[:, ~mask]).max() if (~mask).any() and diff.size else 0.0
    if moved_fixed > tol["atol"]:
        out.append(Mismatch("qstar", "only movable features move",
                            f"a fixed feature moved by {moved_fixed:.3g}",
                            "Q* moves a feature that the certificate does not allow (not "
                            "movable, or priced inf)"))
    theta1, theta2 = _num(inputs["theta1"]), _num(inputs["theta2"])
    divergence, r = inputs["divergence"], _num(inputs["r"])
    pm = mass / n if prob.p is None else mass * prob.p[src]  # each atom's P0-mass
    # the priced squared move sum_j c_j (x*_j - x_j)^2 (immutable features left out)
    priced2 = (diff ** 2) @ np.where(np.isfinite(c), c, 0.0)
    move = 0.0 if math.isinf(theta1) else theta1 * float(np.sum(pm * w * priced2))
    rew = 0.0 if math.isinf(theta2) else theta2 * float(np.sum(pm * phi(w, divergence)))
    figures = {
        "primal_cost": move + rew,
        "risk_star": float(np.sum(pm * w * loss_star)),
        "total_mass": float(np.sum(pm * w)),
    }
    out.extend(_figure_mismatches(figures, res, r, tol, "qstar", "the Q* file",
                                  "the risk under the stored Q* does not reach r"))
    shares = np.bincount(src, weights=mass, minlength=n)
    if not np.allclose(shares, 1.0, rtol=0, atol=1e-9):
        i = int(np.argmax(np.abs(shares - 1.0)))
        out.append(Mismatch("qstar:mass", "each sample's shares sum to 1",
                            f"sample {i}: {shares[i]:.6g}",
                            "the atoms do not split every sample's mass exactly"))
    return out


# ----------------------------------------------------------------------------------------------
# verification


@dataclass
class Mismatch:
    """One figure or fingerprint that does not reproduce.

    Attributes
    ----------
    field : str
        Which entry differs, e.g. ``"results.value"``, ``"inputs.data.sha256"``.
    expected : object
        What the certificate says.
    actual : object
        What was recomputed.
    reason : str
        One sentence.
    """

    field: str
    expected: object
    actual: object
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason} (certificate {_fmt(self.expected)}, " \
               f"recomputed {_fmt(self.actual)})"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.10g}"
    if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v):
        return v[:12] + "..."
    return str(v)


@dataclass
class VerificationReport:
    """Outcome of :func:`verify_certificate`.

    Attributes
    ----------
    ok : bool
        True when every fingerprint matches and every figure reproduces.
    mismatches : list of Mismatch
    checked : list of str
        What was compared.
    notes : list of str
        Facts that do not fail the verification (e.g. a different model file with the same
        model state, the solver that answered).
    tolerances : dict
    recomputed : StabilityResult or None
    """

    ok: bool
    mismatches: list = field(default_factory=list)
    checked: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    tolerances: dict = field(default_factory=dict)
    recomputed: Any = field(default=None, repr=False)  # a StabilityResult

    def __bool__(self) -> bool:
        return self.ok

    @property
    def reasons(self) -> list[str]:
        return [str(m) for m in self.mismatches]

    def summary(self) -> str:
        """Human-readable verdict with one line per mismatch."""
        if self.ok:
            head = f"OK: the certificate reproduces ({len(self.checked)} checks"
            res = self.recomputed
            if res is not None:
                head += f"; value {res.value:.6g}, gap {res.gap:.2e}"
            lines = [head + ")"]
        else:
            lines = [f"FAILED: {len(self.mismatches)} mismatch(es)"]
            lines += [f"  - {m}" for m in self.mismatches]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def _close_array(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Element-wise :func:`_close` (NaN matches NaN, an infinity only itself)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.abs(a - b) <= atol + rtol * np.maximum(np.abs(a), np.abs(b))
    return ok | (a == b) | (np.isnan(a) & np.isnan(b))


def _tolerances(**given) -> dict:
    """``DEFAULT_TOLERANCES`` updated with the given ones, each a finite number >= 0."""
    tol = dict(DEFAULT_TOLERANCES)
    for key, val in given.items():
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, Real) or not (
                math.isfinite(float(val)) and float(val) >= 0):
            raise ValidationError(f"{key} must be a finite number >= 0, got {val!r}")
        tol[key] = float(val)
    return tol


def _expect(report, field_, ok, certified, recomputed, reason) -> None:
    """Record one check; a failed one becomes a :class:`Mismatch`."""
    report.checked.append(field_)
    if not ok:
        report.mismatches.append(Mismatch(field_, certified, recomputed, reason))


def _expect_close(report, field_, certified, recomputed, rtol, atol, reason) -> None:
    a = _num(certified)
    b = math.nan if recomputed is None else float(recomputed)
    _expect(report, field_, _close(a, b, rtol, atol), certified, b, reason)


def verify_certificate(cert_or_path, model, X, y, *, rtol=None, atol=None, h_rtol=None,
                       gap_tol=None, check_features=True, qstar=None, model_file=None,
                       solver=None, sample_weight=None, cost=None) -> VerificationReport:
    """Recompute a certificate from the model and the data and check every field.

    Every field of the certificate is recomputed, checked for consistency with the others,
    or informational (see ``docs/guarantees.md``). In order: the format, the schema, duplicate and
    unknown keys (reading the file); the data block (fingerprint, shape, column names, label counts,
    label column) and the model block (fingerprint, class, estimator, pipeline, ``n_features_in``)
    against ``X, y`` and ``model``; the results' own consistency (gap from value and primal cost,
    excess risk from the two risks, the feature ranks from the scores, the Q* reference's atom
    count); then :func:`otstab.certify` is run again with the recorded inputs (the prices
    ``inputs.feature_costs`` included) and every figure of ``results`` (value, h, alpha, the risks,
    mass, primal cost, dual gap bound, decomposition, atom count, split and exact flags), the solver
    and status are compared, and the recomputed audit must close; the feature table is recomputed
    with :func:`otstab.feature_stability` (if present and ``check_features``); the Q* side file (if
    given) is audited column by column with :func:`audit_qstar`.

    Parameters
    ----------
    cert_or_path : dict or path
    model, X, y : the model and evaluation data to check against.
    rtol, atol : float, optional
        Tolerance for figures: ``|a - b| <= atol + rtol * max(|a|, |b|)``
        (default ``DEFAULT_TOLERANCES``: 1e-6 and 1e-9). Finite and >= 0.
    h_rtol : float, optional
        Relative tolerance for the dual multipliers ``h`` and ``alpha`` and the features'
        ``h`` (default 1e-5).
    gap_tol : float, optional
        Largest accepted relative primal-dual gap and risk shortfall (default 1e-5, the
        tolerance :func:`otstab.certify` accepts answers with); also the tolerance of the
        recorded ``dual_gap_bound``.
    check_features : bool, default True
        Recompute the feature-stability scores when the certificate has them.
    qstar : DataFrame or path, optional
        The Q* side file, audited independently with :func:`audit_qstar`.
    model_file : path, optional
        The file the model came from; compared with ``inputs.model.file_sha256`` (a
        difference is only a note).
    solver : str, optional
        Solver for the recomputation (default: the one requested in the certificate). With
        another solver than the recorded one, the answering solver's name is not compared.
    sample_weight : array-like of shape (n,), optional
        The sample weights of a weighted certificate: their fingerprint, row count and
        effective sample size must match ``inputs.sample_weight``, and everything is
        recomputed with them (certify, the feature scores, the Q* audit). Weights given for an
        unweighted certificate, or none for a weighted one, are a mismatch (nothing is
        recomputed then).
    cost : DataCost, dict, "auto", "encoded" or path, optional
        The cost the caller expects the certificate to be made under (e.g. the spec file a
        risk team versions next to the model): resolved on the model and data, it must equal
        the stored ``inputs.cost.spec``. Without it, the stored spec is used as it is (its
        fingerprint ``inputs.cost.sha256`` must match it). Under a DataCost, certify is re-run
        under the stored spec and Q*'s raw rows are audited (:func:`raw_qstar_mismatches`).

    Returns
    -------
    VerificationReport

    Raises
    ------
    ValidationError
        The certificate itself is unreadable, not a version-1 certificate, has duplicate or
        unknown keys; or a tolerance is negative or not finite.
    SolverError
        The recomputation found no trustworthy solution.
    """

    tol = _tolerances(rtol=rtol, atol=atol, h_rtol=h_rtol, gap_tol=gap_tol)
    if isinstance(cert_or_path, dict):
        cert = cert_or_path
        validate_certificate(cert)
    else:
        cert = read_certificate(cert_or_path)
    report = VerificationReport(ok=True, tolerances=tol)
    inputs = cert["inputs"]
    _verify_data(report, inputs["data"], X, y)
    _verify_model(report, inputs["model"], model, model_file)
    _verify_consistency(report, cert, tol)
    if not _verify_weights(report, inputs.get("sample_weight"), sample_weight, tol):
        report.ok = False
        return report

    cost_block = inputs.get("cost")
    try:
        expected_cost = _expected_cost(cost, model, X, inputs.get("movable_features"))
    except (OtstabError, ValueError, TypeError) as exc:
        raise ValidationError(f"cost: {exc}") from exc
    data_cost = _verify_cost_block(report, cost_block, expected_cost, model, X)
    if data_cost is False:
        report.ok = False
        return report

    loss = loss_from_spec(inputs["loss"])
    spec = _strict(_loss_spec(loss))
    _expect(report, "inputs.loss", spec == inputs["loss"], inputs["loss"], spec,
            "the loss's slopes, intercepts or side are not those of the named loss")
    requested = inputs.get("solver_requested") or "auto"
    kwargs = dict(loss=loss, r=_num(inputs["r"]), theta1=_num(inputs["theta1"]),
                  theta2=_num(inputs["theta2"]), divergence=inputs["divergence"],
                  solver=solver or requested, features=inputs.get("movable_features"),
                  sample_weight=sample_weight, feature_costs=_recorded_costs(inputs))
    unc = cert["results"].get("uncertainty")
    se_spec = _uncertainty_spec(report, unc)
    options = dict(inputs.get("solver_options") or {})
    # a time budget stops the certified lower bound wherever the machine's speed had it: the
    # recomputation runs without it (max_nodes and node_budget, which are deterministic,
    # still apply), a search at least as thorough, so its bound must be at least the file's
    timed = options.pop("time_budget", None) is not None
    if timed:
        report.notes.append("the certificate's lower bound was computed under a time budget: "
                            "recomputed without it and checked to be at least the recorded "
                            "value_lower")
    try:
        new = certify(model, X, y, **kwargs, se=se_spec,
                      cost="encoded" if data_cost is None else data_cost, **options)
    except SolverError:
        raise
    except (OtstabError, ValueError, TypeError) as exc:
        report.mismatches.append(Mismatch("results", "a recomputable certificate",
                                          f"error: {exc}", "certify failed on these inputs"))
        report.ok = False
        return report
    report.recomputed = new
    report.notes.append(f"recomputed with solver {new.solver} ({new.status}) in "
                        f"{new.info.get('wall_time', new.solve_time):.3g} s")
    _verify_results(report, cert, new, tol, compare_solver=solver in (None, requested),
                    lower_at_least=timed)
    if cost_block is not None:  # the spec resolves to itself; Q*'s raw rows re-checked
        _verify_cost_after(report, cost_block, new)
        report.checked.append("Q*'s raw rows (valid, re-scored, re-priced)")
        try:
            report.mismatches.extend(raw_qstar_mismatches(
                new.to_frame(raw=True), model, X, y, cert, rtol=tol["rtol"],
                atol=tol["atol"], gap_tol=tol["gap_tol"], sample_weight=sample_weight,
                where="recomputed Q*"))
        except (OtstabError, ValueError, TypeError) as exc:
            report.mismatches.append(Mismatch("recomputed Q*", "auditable raw rows",
                                              f"error: {exc}", "Q*'s raw rows cannot be "
                                              "audited under the stored cost spec"))
    if unc:
        _verify_uncertainty(report, unc, new, tol)

    fs = cert["results"].get("feature_stability")
    if fs is not None and check_features:
        # the tree bound's deterministic budgets apply to each feature's score too
        budgets = {k: options[k] for k in ("max_nodes", "node_budget") if k in options}
        _verify_features(report, fs, model, X, y, kwargs, tol, budgets, lower_at_least=timed)
    elif fs is not None:
        report.notes.append("the feature scores were not recomputed (check_features=False)")
    if qstar is not None:
        _verify_qstar_file(report, cert, qstar, model, X, y, tol, sample_weight)
    elif cert.get("qstar"):
        report.notes.append("the Q* side file was not given: its hash and columns were not "
                            "audited")
    report.ok = not report.mismatches
    return report


def _verify_data(report, data: dict, X, y) -> None:
    """The data block against ``(X, y)``: fingerprint, shape, columns, labels."""
    try:
        got = _data_info(X, y, data.get("target"))
    except ValidationError as exc:
        report.mismatches.append(Mismatch("inputs.data", "data of the certified shape",
                                          str(exc), "the evaluation data cannot be "
                                                    "fingerprinted"))
        return
    shape_c = (data["n_samples"], data["n_features"])
    shape_g = (got["n_samples"], got["n_features"])
    _expect(report, "inputs.data.shape", shape_c == shape_g, f"{shape_c[0]} x {shape_c[1]}",
            f"{shape_g[0]} x {shape_g[1]}", "the evaluation data have another shape")
    _expect(report, "inputs.data.columns", got["columns"] == data["columns"],
            data["columns"][:5], got["columns"][:5], "the column names or their order differ")
    if "label_counts" in data:
        _expect(report, "inputs.data.label_counts", got["label_counts"] == data["label_counts"],
                data["label_counts"], got["label_counts"], "the label counts differ")
    target = data.get("target")
    if target is not None:
        name = y.name if isinstance(y, pd.Series) else None
        if name is None:
            report.notes.append(f"y has no name: the label column {target!r} was not checked")
        else:
            _expect(report, "inputs.data.target", str(name) == target, target, str(name),
                    "the label column has another name")
    detail = "the evaluation data differ from the certified data"
    if shape_c == shape_g:
        detail += (" (column names or order differ)" if got["columns"] != data["columns"]
                   else " (values or labels differ)")
    _expect(report, "inputs.data.sha256", got["sha256"] == data["sha256"], data["sha256"],
            got["sha256"], detail)


def _verify_weights(report, recorded: dict | None, sample_weight, tol: dict) -> bool:
    """``inputs.sample_weight`` against the given weights; False when the two do not say the
    same thing about whether the certificate is weighted (nothing can be recomputed)."""
    if recorded is None and sample_weight is None:
        return True
    if recorded is None or sample_weight is None:
        _expect(report, "inputs.sample_weight", False,
                "no weights" if recorded is None else recorded["sha256"],
                "no weights" if sample_weight is None else "weights given",
                "the certificate is unweighted but sample_weight was given" if recorded is None
                else "the certificate was made with sample weights: pass the same "
                     "sample_weight= to verify it")
        return False
    try:
        w = _raw_weights(sample_weight)
    except ValidationError as exc:
        _expect(report, "inputs.sample_weight", False, recorded["sha256"], f"error: {exc}",
                "the sample weights cannot be fingerprinted")
        return False
    _expect(report, "inputs.sample_weight.n_samples", w.size == recorded["n_samples"],
            recorded["n_samples"], w.size, "the sample weights have another length")
    got = hash_weights(w)
    _expect(report, "inputs.sample_weight.sha256", got == recorded["sha256"],
            recorded["sha256"], got, "the sample weights differ from the certified weights")
    if "effective_n" in recorded and w.size and np.max(w) > 0:
        _expect_close(report, "inputs.sample_weight.effective_n", recorded["effective_n"],
                      _effective_n(w), tol["rtol"], tol["atol"],
                      "the effective sample size of the weights does not reproduce")
    return True


def _verify_model(report, mc: dict, model, model_file) -> None:
    """The model block against ``model``: fingerprint, class, estimator, pipeline, width."""
    got = _model_info(model)
    for key in ("class", "estimator", "pipeline", "n_features_in"):
        if key in mc:
            _expect(report, f"inputs.model.{key}", got[key] == mc[key], mc[key], got[key],
                    f"the model's {key} differs from the certified one")
    why = "the model differs from the certified model" + (
        " (same class, other parameters or fitted state)" if got["class"] == mc["class"]
        else f" (class {got['class']}, certified {mc['class']})")
    _expect(report, "inputs.model.sha256", got["sha256"] == mc["sha256"], mc["sha256"],
            got["sha256"], why)
    if model_file is not None and mc.get("file_sha256"):
        if hash_file(model_file) != mc["file_sha256"]:
            report.notes.append("the model file's bytes differ from the certified file's "
                                "(the model state is what is compared)")


def _verify_consistency(report, cert: dict, tol: dict) -> None:
    """Fields that follow from other fields of the same certificate."""
    res = cert["results"]
    value, primal = _num(res["value"]), _num(res["primal_cost"])
    if math.isfinite(value) and math.isfinite(primal):
        gap = relative_gap(primal, value)
        _expect_close(report, "results.gap", res["gap"], gap, 1e-6, max(tol["atol"], 1e-12),
                      "the recorded gap does not match the recorded value and primal cost")
    _expect_close(report, "results.excess_risk", res["excess_risk"],
                  _num(res["risk_star"]) - _num(res["risk_base"]), tol["rtol"], tol["atol"],
                  "the recorded excess risk is not risk_star - risk_base")
    qi = cert.get("qstar")
    if qi and "n_atoms" in res:
        _expect(report, "qstar.n_atoms", qi["n_atoms"] == res["n_atoms"], qi["n_atoms"],
                res["n_atoms"], "the Q* reference has another number of atoms than the results")
    fs = res.get("feature_stability")
    if fs is not None and fs["table"]:
        table = pd.DataFrame(fs["table"])
        scores = pd.Series([_num(s) for s in table["score"]])
        # non-exact scores (score_lower present) are ranked by their certified lower side,
        # ties by score, as feature_stability ranks and sorts them
        by = "score_lower" if "score_lower" in table.columns else "score"
        keys = pd.Series([_num(s) for s in table[by]])
        if "rank" in table.columns:
            # as feature_stability ranks them (a nan score, never produced, ranks last)
            ranks = keys.rank(method="min", na_option="bottom").astype(int).tolist()
            recorded = table["rank"].tolist()
            _expect(report, "results.feature_stability.rank", recorded == ranks, recorded[:5],
                    ranks[:5], f"the ranks are not the ranks of the recorded {by}")
        pairs = list(zip(keys, scores))
        _expect(report, "results.feature_stability.order",
                all(a <= b for a, b in zip(pairs, pairs[1:])),
                list(table["feature"])[:5], f"sorted by {by}", f"the table is not sorted by {by}")


def _verify_results(report, cert: dict, new, tol: dict, *, compare_solver: bool,
                    lower_at_least: bool = False) -> None:
    """Every field of ``results`` and ``solver`` against the recomputed answer ``new``;
    ``lower_at_least``: the recorded ``value_lower`` need only be at most the recomputed one
    (a time-budgeted bound against a recomputation without the time limit)."""
    res, rtol, atol = cert["results"], tol["rtol"], tol["atol"]
    for key in _RESULT_FIGURES:
        _expect_close(report, f"results.{key}", res[key], getattr(new, key), rtol, atol,
                      f"{key} does not reproduce")
    _expect_close(report, "results.h", res["h"], new.h, tol["h_rtol"], atol,
                  "the dual multiplier h does not reproduce")
    _expect_close(report, "results.alpha", res["alpha"], new.alpha, tol["h_rtol"], atol,
                  "the dual multiplier alpha does not reproduce")
    if not (math.isfinite(_num(res["value"])) and math.isfinite(_num(res["primal_cost"]))):
        _expect_close(report, "results.gap", res["gap"], new.gap, rtol, atol,
                      "the gap does not reproduce")  # finite ones: _verify_consistency
    for key in ("value_lower", "value_upper"):  # the certified side is recomputed too
        if key == "value_lower" and key in res and lower_at_least:
            rec, got = _num(res[key]), float(new.value_lower)
            _expect(report, "results.value_lower", rec <= got + atol + rtol * abs(got),
                    res[key], f">= {got!r}", "the recorded lower bound exceeds the one "
                    "recomputed without the time budget")
        elif key in res:
            _expect_close(report, f"results.{key}", res[key], getattr(new, key), rtol, atol,
                          f"{key} (the certified interval) does not reproduce")
    if "dual_gap_bound" in res:
        scale = max(1.0, abs(new.value)) if math.isfinite(new.value) else 1.0
        _expect_close(report, "results.dual_gap_bound", res["dual_gap_bound"],
                      new.dual_gap_bound, rtol, max(atol, tol["gap_tol"] * scale),
                      "the dual gap bound does not reproduce")
    decomposition = {k: v for k, v in (new.decomposition or {}).items()
                     if isinstance(v, (Real, np.floating))}
    _expect(report, "results.decomposition (keys)", set(res["decomposition"]) ==
            set(decomposition), sorted(res["decomposition"]), sorted(decomposition),
            "the decomposition has other terms")
    for key, val in res["decomposition"].items():
        _expect_close(report, f"results.decomposition.{key}", val, decomposition.get(key),
                      rtol, atol, f"the decomposition's {key} does not reproduce")
    for key, got in (("n_atoms", new.n_atoms), ("split", bool(new.split)),
                     ("exact", bool(getattr(new, "exact", True)))):
        if key in res:
            _expect(report, f"results.{key}", res[key] == got, res[key], got,
                    f"{key} does not reproduce")
    _expect(report, "solver.status", cert["solver"]["status"] == new.status,
            cert["solver"]["status"], new.status, "the status differs")
    if compare_solver:
        _expect(report, "solver.name", cert["solver"]["name"] == new.solver,
                cert["solver"]["name"], new.solver, "another solver answered")
    elif cert["solver"]["name"] != new.solver:
        report.notes.append(f"recomputed with solver {new.solver}, certified by "
                            f"{cert['solver']['name']}")
    report.checked.append("audit of the recomputed Q*")
    if math.isfinite(new.value) and new.status != "unreachable":
        r = _num(cert["inputs"]["r"])
        if not new.gap <= tol["gap_tol"]:
            report.mismatches.append(Mismatch("audit.gap", f"<= {tol['gap_tol']:g}", new.gap,
                                              "the recomputed primal-dual gap is too large"))
        if new.risk_star < r - tol["gap_tol"] * max(1.0, r):
            report.mismatches.append(Mismatch(
                "audit.risk_star", f">= r = {r:g}", new.risk_star,
                "the risk under the recomputed Q* does not reach r"))


def _uncertainty_spec(report, unc: dict | None):
    """``se=`` of the recomputation: the recorded method (a bootstrap with the recorded seed,
    replicate count and interval); settings that are not valid are a mismatch."""
    if not unc or unc["method"] == "influence":
        return "analytic"
    try:
        return Bootstrap(n_resamples=unc.get("n_boot"), random_state=unc.get("seed"),
                         interval=unc.get("interval", "percentile"))
    except ValidationError as exc:
        report.mismatches.append(Mismatch("results.uncertainty", "valid bootstrap settings",
                                          str(exc), "the bootstrap cannot be re-run"))
        return "analytic"


def _verify_uncertainty(report, unc: dict, new, tol: dict) -> None:
    """The recorded SE, interval and lower bound against the recomputed estimate (the same
    method; a bootstrap re-run with the recorded seed and replicate count), and every other
    entry of the record."""
    got = _strict(new.inference.to_dict(float(unc["level"])))
    for key, val in unc.items():
        if key in ("se", "ci_low", "ci_high", "lower_bound"):
            _expect_close(report, f"results.uncertainty.{key}", val, _num(got[key]),
                          tol["rtol"], tol["atol"], f"the sampling {key} does not reproduce")
        else:
            _expect(report, f"results.uncertainty.{key}", val == got.get(key), val,
                    got.get(key), f"the sampling {key} does not reproduce")


def _verify_features(report, fs: dict, model, X, y, kwargs: dict, tol: dict, budgets=None,
                     lower_at_least=False) -> None:
    """Recompute the feature table and compare every cell of every recorded row (under the
    recorded ``max_nodes``/``node_budget``; a time-budgeted ``score_lower`` must be at most
    the one recomputed without the time limit)."""

    try:
        new = feature_stability(
            model, X, y, loss=kwargs["loss"], r=kwargs["r"], theta1=kwargs["theta1"],
            theta2=kwargs["theta2"], divergence=kwargs["divergence"],
            feature_groups=fs.get("groups"), sample_weight=kwargs.get("sample_weight"),
            feature_costs=kwargs.get("feature_costs"), cost="encoded",
            **(budgets or {})).to_frame()
    except SolverError:
        raise
    except (OtstabError, ValueError, TypeError) as exc:
        report.mismatches.append(Mismatch(
            "results.feature_stability", "recomputable scores", f"error: {exc}",
            "feature_stability failed on these inputs"))
        return
    report.checked.append("results.feature_stability")
    got = {str(row["feature"]): row for row in _strict(new.to_dict(orient="records"))}
    old = {str(row["feature"]): row for row in fs["table"]}
    if len(old) != len(fs["table"]) or set(old) != set(got):
        report.mismatches.append(Mismatch(
            "results.feature_stability.feature", sorted(old)[:5], sorted(got)[:5],
            "the scored features differ"))
        return
    for name, row in old.items():
        for col, val in row.items():
            if col in ("feature", "rank"):  # the key; ranks follow from the scores
                continue
            where = f"results.feature_stability[{name}].{col}"
            if col not in got[name]:
                _expect(report, where, False, val, None, "feature_stability has no such column")
            elif col == "score_lower" and lower_at_least and _is_number(val) \
                    and _is_number(got[name][col]):
                rec, new_lo = _num(val), _num(got[name][col])
                _expect(report, where, rec <= new_lo + tol["atol"] + tol["rtol"] * abs(new_lo),
                        val, f">= {new_lo!r}", f"the certified lower score of feature {name!r} "
                        "exceeds the one recomputed without the time budget")
            elif isinstance(val, (Real, str)) and not isinstance(val, bool) and _is_number(
                    val) and _is_number(got[name][col]):
                rt = tol["h_rtol"] if col == "h" else tol["rtol"]
                _expect_close(report, where, val, _num(got[name][col]), rt, tol["atol"],
                              f"the {col} of feature {name!r} does not reproduce")
            else:
                _expect(report, where, val == got[name][col], val, got[name][col],
                        f"the {col} of feature {name!r} does not reproduce")


def _is_number(v) -> bool:
    """A certificate number: a real, or one of the strings "inf", "-inf", "nan"."""
    if isinstance(v, bool):
        return False
    return isinstance(v, Real) or v in ("inf", "-inf", "nan")


def _verify_qstar_file(report, cert: dict, qstar, model, X, y, tol: dict,
                       sample_weight=None) -> None:
    """The Q* reference (hash, format) and the side file itself (:func:`audit_qstar`)."""
    report.checked.append("qstar (independent audit)")
    qi = cert.get("qstar")
    if isinstance(qstar, (str, Path)) and qi:
        name = str(qstar).lower()
        fmt = "parquet" if name.endswith((".parquet", ".pq")) else "csv"
        _expect(report, "qstar.format", fmt == qi["format"], qi["format"], fmt,
                "the Q* file has another format")
        got = hash_file(qstar)
        _expect(report, "qstar.sha256", got == qi["sha256"], qi["sha256"], got,
                "the Q* file differs from the certified one")
    try:
        report.mismatches.extend(audit_qstar(qstar, model, X, y, cert, rtol=tol["rtol"],
                                             atol=tol["atol"], gap_tol=tol["gap_tol"],
                                             sample_weight=sample_weight))
    except (OtstabError, ValueError, TypeError) as exc:
        report.mismatches.append(Mismatch("qstar", "an auditable Q* file", f"error: {exc}",
                                          "the Q* file cannot be audited"))


# ----------------------------------------------------------------------------------------------
# a transport cost on the data's own variables (otstab.DataCost, issue 28)

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


def _raw_frame_of(model, X):
    """The evaluation data as the DataFrame a DataCost is resolved on."""
    return _frame(model, X)


def _cost_info(result, model, X) -> dict | None:
    """``inputs.cost`` of a certificate: None for the encoded cost; else the resolved spec,
    its description (of the spec as stored, resolved again on ``model`` and ``X``: what
    :func:`verify_certificate` recomputes) and its fingerprint (:func:`hash_cost`)."""
    spec = _datacost_spec(result)
    if spec is None:
        return None
    rc = DataCost.from_dict(spec).resolve(model, _raw_frame_of(model, X))
    if _strict(rc.to_dict()) != spec:
        raise ValidationError("result.info['cost'] is not a resolved DataCost spec of this "
                              "model and data (resolving it again changes it)")
    return {"kind": "datacost", "spec": spec, "description": rc.describe(),
            "hash_method": COST_HASH, "sha256": hash_cost(spec)}


def _expected_cost(cost, model, X, movable=None) -> dict | None:
    """``verify_certificate(cost=...)``: the spec the caller expects (a DataCost, its
    ``to_dict()``, ``"auto"``, or a path to a JSON spec file), resolved on the model and
    data, with the variables outside ``movable`` (``inputs.movable_features``) immutable as
    certify makes them; None when not given."""
    if cost is None:
        return None
    if isinstance(cost, (str, Path)) and str(cost).lower() not in ("auto", "encoded"):
        cost = read_cost_file(cost)
    dc = as_cost(cost)
    if dc is None:  # "encoded"
        return {}
    frame = _raw_frame_of(model, X)
    if movable is not None:
        d = dc.to_dict()
        keep = {str(m) for m in movable}
        d["immutable"] = sorted(set(d["immutable"]) | {str(c) for c in frame.columns
                                                      if str(c) not in keep})
        dc = DataCost.from_dict(d)
    return _strict(dc.resolve(model, frame).to_dict())


def read_cost_file(path):
    """A DataCost spec file (``DataCost.to_dict()`` as JSON; e.g. the one a risk team
    versions next to the model). Errors name the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cost file {str(path)!r}: cannot read it ({exc.strerror})") \
            from exc
    try:
        spec = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"cost file {str(path)!r} is not valid JSON: {exc.msg} at line "
                              f"{exc.lineno}") from exc
    except ValidationError as exc:
        raise ValidationError(f"cost file {str(path)!r}: {exc}") from exc
    if isinstance(spec, dict) and spec.get("kind") == "datacost" and "spec" in spec:
        spec = spec["spec"]  # the inputs.cost block of a certificate
    try:
        return DataCost.from_dict(spec)
    except (ValidationError, TypeError, ValueError) as exc:
        raise ValidationError(f"cost file {str(path)!r}: {exc}") from exc


def _verify_cost_block(report, block, expected, model, X):
    """``inputs.cost`` before the recomputation: its fingerprint covers the stored spec, the
    spec is a valid DataCost, and it is the one the caller expects (``expected``: a resolved
    spec, ``{}`` for the encoded cost, None: not given). Returns the DataCost to recompute
    under (None: the encoded cost); False when nothing can be recomputed."""
    if block is None:
        if expected:
            _expect(report, "inputs.cost", False, "the encoded cost", "a DataCost",
                    "the certificate was made under the encoded cost, not the given DataCost")
        return None
    spec = block["spec"]
    got = hash_cost(spec)
    report.notes.append(f"recomputed under the certificate's DataCost ({COST_HASH} "
                        f"{block['sha256'][:12]}); Q*'s raw rows audited")
    _expect(report, "inputs.cost.sha256", got == block["sha256"], block["sha256"], got,
            "the stored cost spec does not match its fingerprint (the spec was edited)")
    try:
        dc = DataCost.from_dict(spec)
    except (ValidationError, TypeError, ValueError, KeyError) as exc:
        _expect(report, "inputs.cost.spec", False, "a valid DataCost spec", f"error: {exc}",
                "the stored cost spec cannot be read")
        return False
    if expected is not None:
        _expect(report, "inputs.cost.spec", _same_spec(expected, spec), hash_cost(spec),
                "the encoded cost" if expected == {} else hash_cost(expected),
                "the certificate's cost spec differs from the given one" + (
                    "" if expected == {} else ": " + _spec_diff(spec, expected)))
    return dc


def _same_spec(a, b) -> bool:
    """Two DataCost specs say the same (the order of the variable lists aside)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a == b
    lists = ("immutable", "increase_only", "decrease_only")
    return {k: v for k, v in a.items() if k not in lists} == \
        {k: v for k, v in b.items() if k not in lists} and \
        all(sorted(map(str, a.get(k) or [])) == sorted(map(str, b.get(k) or [])) for k in lists)


def _spec_diff(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return f"field(s) {keys[:5]} differ"


def _verify_cost_after(report, block, new) -> None:
    """After the recomputation under the stored spec: the spec resolves to itself and its
    description is the recomputed one."""
    info = new.info or {}
    got = _strict(info.get("cost"))
    _expect(report, "inputs.cost.spec (resolved)", _same_spec(got, block["spec"]),
            "the stored spec",
            _spec_diff(block["spec"], got or {}) if got else "no DataCost",
            "the stored cost spec does not resolve to itself on this model and data")
    desc = info.get("cost_description") or ""
    old = block["description"].splitlines()
    lines = [(a, b) for a, b in zip(old, desc.splitlines()) if a != b] or [
        (f"{len(old)} lines", f"{len(desc.splitlines())} lines")]
    _expect(report, "inputs.cost.description", desc == block["description"], lines[0][0],
            lines[0][1], "the description is not that of the stored cost spec")


def _level_keys(levels) -> dict:
    """``{str(level): level}`` (a level read back from a CSV file is matched by its text)."""
    return {str(lv): lv for lv in levels}


def raw_qstar_mismatches(frame, model, X, y, cert, *, rtol=None, atol=None, gap_tol=None,
                         sample_weight=None, where="qstar") -> list[Mismatch]:
    """Audit Q*'s raw rows under the certificate's DataCost (``inputs.cost``), from the model,
    the data and the cost spec alone.

    ``frame`` is ``result.to_frame(raw=True)`` (or the Q* file :func:`write_qstar` wrote):
    ``source``, ``mass``, optionally ``index``, each raw variable ``v`` and ``v*``,
    ``weight``, ``loss``, ``loss*``, ``cost``. Checked: every atom's ``v`` is its source
    sample's value; every ``v*`` is a valid value (a level of the variable, an integer for an
    integer variable, inside the bounds, unchanged for an immutable variable, the allowed way
    for one-way variables); ``loss*`` is the model's own loss of the moved raw row (0/1: its
    ``predict``); ``cost`` is the move's price under the resolved spec; each sample's mass
    shares sum to 1; and the cost, risk and mass of Q* recomputed from these rows equal
    ``results.primal_cost``, ``results.risk_star`` (which reaches r) and
    ``results.total_mass``.
    """
    tol = _tolerances(rtol=rtol, atol=atol, gap_tol=gap_tol)
    inputs, res = cert["inputs"], cert["results"]
    spec = inputs["cost"]["spec"]
    loss = loss_from_spec(inputs["loss"])
    prob = resolve_model(model, X, y, loss=loss, sample_weight=sample_weight)
    Xf = _raw_frame_of(model, X)
    rc = DataCost.from_dict(spec).resolve(model, Xf)
    names = [v.name for v in rc.variables]
    needed = ["source", "mass", *names, *[f"{nm}*" for nm in names], "weight", "loss",
              "loss*", "cost"]
    columns = [str(c) for c in frame.columns]
    missing = [c for c in needed if c not in columns]
    unknown = [c for c in columns if c not in needed and c != "index"]
    if missing or unknown:
        return [Mismatch(f"{where}:columns", "the columns of to_frame(raw=True)",
                         f"missing {missing[:5]}, unknown {unknown[:5]}",
                         "Q* does not have the columns of a raw Q* frame")]
    out = []
    if "n_atoms" in res and len(frame) != res["n_atoms"]:
        out.append(Mismatch(f"{where}:n_atoms", res["n_atoms"], len(frame),
                            "Q* has another number of atoms than results.n_atoms"))
    n = prob.n
    srcf = pd.to_numeric(frame["source"], errors="coerce").to_numpy(dtype=np.float64)
    if srcf.size == 0 or not np.all((srcf == np.round(srcf)) & (srcf >= 0) & (srcf < n)):
        return out + [Mismatch(f"{where}:source", f"whole numbers in [0, {n})",
                               "empty" if srcf.size == 0 else "other values",
                               "atom sources are not sample indices")]
    src = srcf.astype(np.intp)
    raw0 = Xf.iloc[src].reset_index(drop=True)
    raw1 = pd.DataFrame(index=range(len(frame)))
    for v in rc.variables:
        nm = v.name
        rec0 = frame[nm].reset_index(drop=True)
        rec1 = frame[f"{nm}*"].reset_index(drop=True)
        if v.kind in ("numeric", "integer"):
            a = pd.to_numeric(raw0[nm], errors="coerce").to_numpy(dtype=np.float64)
            b0 = pd.to_numeric(rec0, errors="coerce").to_numpy(dtype=np.float64)
            b = pd.to_numeric(rec1, errors="coerce").to_numpy(dtype=np.float64)
            bad0 = ~_close_array(b0, a, tol["rtol"], tol["atol"])
            checks = [(~np.isfinite(b) & np.isfinite(a), "is not a number")]
            if v.kind == "integer":
                checks.append((b != np.round(b), "is not an integer"))
            if v.immutable or not math.isfinite(v.price):
                checks.append((b != a, "moves an immutable variable"))
            lo, hi = np.minimum(v.lo, a), np.maximum(v.hi, a)
            checks.append(((b < lo) | (b > hi), f"is outside the bounds [{v.lo:g}, {v.hi:g}]"))
            if v.direction:
                checks.append(((b != a) & (np.sign(b - a) != v.direction),
                               "moves the forbidden way"))
            raw1[nm] = b if raw0[nm].dtype.kind == "f" or not np.all(b == np.round(b)) \
                else b.astype(raw0[nm].dtype)
        else:
            assert v.levels is not None  # a categorical variable has its levels
            keys = _level_keys(v.levels)
            a = raw0[nm].astype(str).to_numpy()
            bad0 = rec0.astype(str).to_numpy() != a
            b = rec1.astype(str).to_numpy()
            valid = np.array([t in keys for t in b], dtype=bool)
            checks = [(~valid, f"is not one of the {len(v.levels)} levels")]
            if v.immutable or not math.isfinite(v.price):
                checks.append((b != a, "moves an immutable variable"))
            if v.kind == "ordinal" and v.direction:
                rank = {str(lv): k for k, lv in enumerate(v.levels)}
                d = np.array([rank.get(t1, 0) - rank.get(t0, 0) for t0, t1 in zip(a, b)])
                checks.append(((d != 0) & (np.sign(d) != v.direction),
                               "moves the forbidden way"))
            raw1[nm] = pd.Series([keys.get(t, t) for t in b], dtype=object)
            if raw0[nm].dtype.kind != "O" and not isinstance(raw0[nm].dtype,
                                                             pd.CategoricalDtype):
                raw1[nm] = raw1[nm].infer_objects()
        if bad0.any():
            i = int(np.flatnonzero(bad0)[0])
            out.append(Mismatch(f"{where}:{nm}", f"atom {i}: {rec0.iloc[i]!r}",
                                repr(raw0[nm].iloc[i]), "the original value is not that of "
                                f"the atom's source sample ({int(bad0.sum())} atom(s))"))
        for bad, what in checks:
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                out.append(Mismatch(f"{where}:{nm}*", "a valid value",
                                    f"atom {i}: {rec1.iloc[i]!r}",
                                    f"the moved value {what} ({int(bad.sum())} atom(s))"))
    if out:
        return out
    raw1 = raw1[names]
    if isinstance(loss, ZeroOne):
        pred = datacost_linear.predict(model, raw1)
        loss_star = (pred != np.asarray(prob.y_original)[src]).astype(np.float64)
    else:
        loss_star = prob.losses(datacost_linear.encode(model, raw1), prob.y[src])
    price = rc.cost(raw0, raw1)
    per_atom = [("loss", prob.losses(prob.X)[src], "the model's loss at the source sample"),
                ("loss*", loss_star, "the model's loss at the moved raw row"),
                ("cost", price, "the move's cost under the stored cost spec")]
    for col, expected, what in per_atom:
        recorded = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~_close_array(recorded, expected, tol["rtol"], tol["atol"]))
        if bad.size:
            i = int(bad[0])
            out.append(Mismatch(f"{where}:{col}", f"atom {i}: {recorded[i]:.10g}",
                                f"{expected[i]:.10g}",
                                f"column {col!r} is not {what} ({bad.size} atom(s))"))
    mass = pd.to_numeric(frame["mass"], errors="coerce").to_numpy(dtype=np.float64)
    w = pd.to_numeric(frame["weight"], errors="coerce").to_numpy(dtype=np.float64)
    theta1, theta2 = _num(inputs["theta1"]), _num(inputs["theta2"])
    divergence, r = inputs["divergence"], _num(inputs["r"])
    pm = mass / n if prob.p is None else mass * prob.p[src]
    moved = price > 0
    move = 0.0 if math.isinf(theta1) or not moved.any() else \
        theta1 * float(np.sum(pm[moved] * w[moved] * price[moved]))
    rew = 0.0 if math.isinf(theta2) else theta2 * float(np.sum(pm * phi(w, divergence)))
    figures = {"primal_cost": move + rew, "risk_star": float(np.sum(pm * w * loss_star)),
               "total_mass": float(np.sum(pm * w))}
    out.extend(_figure_mismatches(
        figures, res, r, tol, where, "Q*'s raw rows",
        "the risk of Q*'s raw rows, re-scored by the model, does not reach r"))
    shares = np.bincount(src, weights=mass, minlength=n)
    if not np.allclose(shares, 1.0, rtol=0, atol=1e-9):
        i = int(np.argmax(np.abs(shares - 1.0)))
        out.append(Mismatch(f"{where}:mass", "each sample's shares sum to 1",
                            f"sample {i}: {shares[i]:.6g}",
                            "the atoms do not split every sample's mass exactly"))
    return out
