"""Stability certificates as files: a versioned JSON format, its hashes, and verification.

A certificate records *what* was certified (a fingerprint of the evaluation data and of the
model, the loss and the parameters ``r``, ``theta1``, ``theta2``, the divergence), *what came
out* (the value ``R(beta, r)``, the dual multiplier ``h``, the audit of the most sensitive
distribution Q*: its cost, its risk, the primal-dual gap, the excess-risk decomposition, and
optionally the feature-stability scores), and *how* (solver, status, timings, package
versions). :func:`verify_certificate` recomputes everything from the model and the data and
reports every figure that does not reproduce.

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
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import platform
import re
import struct
from dataclasses import dataclass, field
from importlib import resources
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import pandas as pd

from ._results import jsonable
from .errors import InputTypeError, OtstabError, SolverError, ValidationError

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
    "load_schema",
    "verify_certificate",
    "VerificationReport",
    "Mismatch",
    "hash_data",
    "hash_model",
    "hash_file",
    "write_qstar",
    "read_table",
    "audit_qstar",
]

FORMAT = "otstab-certificate"
VERSION = 1
DATA_HASH = "otstab-data-v1"
MODEL_HASH = "otstab-model-v1"

#: Default tolerances of :func:`verify_certificate`: a recomputed figure ``b`` reproduces the
#: certified ``a`` when ``|a - b| <= atol + rtol * max(|a|, |b|)`` (``h_rtol`` for the dual
#: multiplier ``h``, which is less well conditioned than the value); the recomputed audit must
#: have ``gap <= gap_tol`` and ``risk_star >= r - gap_tol * max(1, r)``.
DEFAULT_TOLERANCES = {"rtol": 1e-6, "atol": 1e-9, "h_rtol": 1e-5, "gap_tol": 1e-5}

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

    from . import __version__

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
    from .losses import PiecewiseLinear, get_loss

    obj = get_loss(loss)
    spec = {"name": obj.name}
    if isinstance(obj, PiecewiseLinear):
        spec.update({"slopes": list(obj.slopes), "intercepts": list(obj.intercepts),
                     "on": obj.on})
    return spec


def _loss_from_spec(spec):
    from .losses import PiecewiseLinear, epsilon_insensitive, get_loss, pinball

    name = spec["name"]
    m = re.fullmatch(r"(pinball|epsilon_insensitive)\((.+)\)", name)
    if m:
        f = pinball if m.group(1) == "pinball" else epsilon_insensitive
        return f(float(m.group(2)))
    if "slopes" in spec and name not in ("hinge", "absolute"):
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
    yy = np.asarray(y).reshape(-1)
    labels = None
    if yy.dtype.kind in "biu" or yy.dtype.kind in "OU":
        vals, counts = np.unique(yy.astype(str), return_counts=True)
        if vals.size <= 50:
            labels = {str(v): int(c) for v, c in zip(vals, counts)}
    return {
        "n_samples": int(n), "n_features": int(d), "columns": columns,
        "target": None if target is None else str(target), "label_counts": labels,
        "hash_method": DATA_HASH, "sha256": hash_data(X, y),
    }


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
                     solver_options=None, loss=None, extra=None) -> dict:
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

    Returns
    -------
    dict
        Strict-JSON-ready (non-finite numbers as strings); see ``docs/certificate.schema.json``.
    """
    from .results import StabilityResult

    if not isinstance(result, StabilityResult):
        raise InputTypeError(
            f"result must be an otstab.StabilityResult, got {type(result).__name__}")
    data = _data_info(X, y, target)
    if result.n and result.n != data["n_samples"]:
        raise ValidationError(
            f"result was computed on {result.n} samples but X has {data['n_samples']} rows")
    loss_spec = _loss_spec(loss if loss is not None else result.loss)
    info = result.info or {}
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
        "feature_stability": None,
    }
    if features is not None:
        table = pd.DataFrame(features)
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


def read_certificate(path) -> dict:
    """Read a certificate file (JSON) and check its format and version."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cannot read certificate {str(path)!r}: {exc.strerror}") from exc
    try:
        cert = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"certificate {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from exc
    validate_certificate(cert)
    return cert


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
            f"not an otstab certificate: format is {cert.get('format')!r}, expected {FORMAT!r}")
    if cert.get("version") != VERSION:
        raise ValidationError(
            f"unsupported certificate version {cert.get('version')!r}; this otstab reads "
            f"version {VERSION}")
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is optional
        return
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(_strict(cert)), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.path) or "(top level)"
        raise ValidationError(f"certificate field {where}: {err.message}")


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
    frame = result.to_frame()
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


def audit_qstar(qstar, model, X, y, cert, *, rtol=None, atol=None) -> list[Mismatch]:
    """Audit a stored Q* independently: its cost, risk and mass from the model and the data.

    Parameters
    ----------
    qstar : DataFrame or path
        The side file written by :func:`write_qstar`.
    model, X, y : the certified model and evaluation data.
    cert : dict
        The certificate (its inputs and results).

    Returns
    -------
    list of Mismatch
        Empty when the cost of Q* equals ``results.primal_cost``, its risk
        ``results.risk_star``, its mass 1, and no atom moved a feature it may not move.
    """
    from otstab_solvers.weights import phi

    from .models import resolve_model
    from .reduction import feature_mask

    tol = dict(DEFAULT_TOLERANCES)
    if rtol is not None:
        tol["rtol"] = rtol
    if atol is not None:
        tol["atol"] = atol
    frame = read_table(qstar) if not isinstance(qstar, pd.DataFrame) else qstar
    inputs = cert["inputs"]
    loss = _loss_from_spec(inputs["loss"])
    prob = resolve_model(model, X, y, loss=loss)
    names = list(prob.feature_names)
    star_cols = [f"{nm}*" for nm in names]
    missing = [c for c in ["source", "mass", "weight", *star_cols] if c not in frame.columns]
    if missing:
        return [Mismatch("qstar", "columns", f"missing {missing[:5]}",
                         "the Q* file lacks columns needed for the audit")]
    src = frame["source"].to_numpy(dtype=np.intp)
    if src.size == 0 or src.min() < 0 or src.max() >= prob.n:
        return [Mismatch("qstar.source", f"indices in [0, {prob.n})",
                         f"[{src.min()}, {src.max()}]", "atom sources out of range")]
    mass = frame["mass"].to_numpy(dtype=np.float64)
    w = frame["weight"].to_numpy(dtype=np.float64)
    Xs = frame[star_cols].to_numpy(dtype=np.float64)
    theta1, theta2 = _num(inputs["theta1"]), _num(inputs["theta2"])
    divergence, r = inputs["divergence"], _num(inputs["r"])
    n = prob.n
    diff = Xs - prob.X[src]
    out = []
    mv = inputs.get("movable_features")
    if mv is not None:
        mask = feature_mask(prob.d, mv, names)
        moved_fixed = np.abs(diff[:, ~mask]).max() if (~mask).any() else 0.0
        if moved_fixed > tol["atol"]:
            out.append(Mismatch("qstar", "only movable features move",
                                f"a fixed feature moved by {moved_fixed:.3g}",
                                "Q* moves a feature that the certificate does not allow"))
    loss_star = prob.losses(Xs, prob.y[src])
    move = 0.0 if math.isinf(theta1) else theta1 * float(
        np.sum(mass * w * np.sum(diff ** 2, axis=1))) / n
    rew = 0.0 if math.isinf(theta2) else theta2 * float(np.sum(mass * phi(w, divergence))) / n
    figures = {
        "primal_cost": move + rew,
        "risk_star": float(np.sum(mass * w * loss_star)) / n,
        "total_mass": float(np.sum(mass * w)) / n,
    }
    res = cert["results"]
    for key, val in figures.items():
        if not _close(_num(res[key]), val, tol["rtol"], tol["atol"]):
            out.append(Mismatch(f"qstar:{key}", res[key], val,
                                f"{key} recomputed from the Q* file differs from the "
                                "certificate"))
    if not math.isinf(_num(res["value"])) and figures["risk_star"] < r - tol["gap_tol"] * max(
            1.0, r):
        out.append(Mismatch("qstar:risk_star", f">= r = {r:g}", figures["risk_star"],
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
    recomputed: object = field(default=None, repr=False)

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


def verify_certificate(cert_or_path, model, X, y, *, rtol=None, atol=None, h_rtol=None,
                       gap_tol=None, check_features=True, qstar=None, model_file=None,
                       solver=None) -> VerificationReport:
    """Recompute a certificate from the model and the data and compare every figure.

    Checks, in order: the format (and schema); the data fingerprint; the model fingerprint;
    the certificate's own consistency (its gap from its value and primal cost); then
    :func:`otstab.certify` is run again with the recorded inputs and the value, ``h``, the
    base risk, the risk under Q*, the cost of Q*, its mass and the decomposition are compared,
    and the recomputed audit must close (gap and risk within ``gap_tol``); the feature scores
    (if the certificate has them and ``check_features``); the Q* side file (if given).

    Parameters
    ----------
    cert_or_path : dict or path
    model, X, y : the model and evaluation data to check against.
    rtol, atol : float, optional
        Tolerance for figures: ``|a - b| <= atol + rtol * max(|a|, |b|)``
        (default ``DEFAULT_TOLERANCES``: 1e-6 and 1e-9).
    h_rtol : float, optional
        Relative tolerance for ``h`` (default 1e-5).
    gap_tol : float, optional
        Largest accepted relative primal-dual gap and risk shortfall (default 1e-5, the
        tolerance :func:`otstab.certify` accepts answers with).
    check_features : bool, default True
        Recompute the feature-stability scores when the certificate has them.
    qstar : DataFrame or path, optional
        The Q* side file, audited independently with :func:`audit_qstar`.
    model_file : path, optional
        The file the model came from; compared with ``inputs.model.file_sha256`` (a
        difference is only a note).
    solver : str, optional
        Solver for the recomputation (default: the one requested in the certificate).

    Returns
    -------
    VerificationReport

    Raises
    ------
    ValidationError
        The certificate itself is unreadable or not a version-1 certificate.
    SolverError
        The recomputation found no trustworthy solution.
    """
    from . import certify

    tol = dict(DEFAULT_TOLERANCES)
    for key, val in (("rtol", rtol), ("atol", atol), ("h_rtol", h_rtol),
                     ("gap_tol", gap_tol)):
        if val is not None:
            tol[key] = float(val)
    if isinstance(cert_or_path, dict):
        cert = cert_or_path
        validate_certificate(cert)
    else:
        cert = read_certificate(cert_or_path)
    report = VerificationReport(ok=True, tolerances=tol)
    mism, checked, notes = report.mismatches, report.checked, report.notes
    inputs, res = cert["inputs"], cert["results"]

    # fingerprints
    data = inputs["data"]
    try:
        got = _data_info(X, y, data.get("target"))
    except ValidationError as exc:
        mism.append(Mismatch("inputs.data", "data of the certified shape", str(exc),
                             "the evaluation data cannot be fingerprinted"))
        got = None
    checked.append("inputs.data.sha256")
    if got is not None:
        shape_c = (data["n_samples"], data["n_features"])
        shape_g = (got["n_samples"], got["n_features"])
        if shape_c != shape_g:
            mism.append(Mismatch("inputs.data.shape", f"{shape_c[0]} x {shape_c[1]}",
                                 f"{shape_g[0]} x {shape_g[1]}",
                                 "the evaluation data have another shape"))
        if got["sha256"] != data["sha256"]:
            detail = "the evaluation data differ from the certified data"
            if shape_c == shape_g and got["columns"] != data["columns"]:
                detail += " (column names or order differ)"
            elif shape_c == shape_g:
                detail += " (values or labels differ)"
            mism.append(Mismatch("inputs.data.sha256", data["sha256"], got["sha256"], detail))
    mc = inputs["model"]
    checked.append("inputs.model.sha256")
    mh = hash_model(model)
    if mh != mc["sha256"]:
        cls = _qualname(model)
        why = "the model differs from the certified model"
        if cls != mc["class"]:
            why += f" (class {cls}, certified {mc['class']})"
        else:
            why += " (same class, other parameters or fitted state)"
        mism.append(Mismatch("inputs.model.sha256", mc["sha256"], mh, why))
    if model_file is not None and mc.get("file_sha256"):
        fh = hash_file(model_file)
        if fh != mc["file_sha256"]:
            notes.append("the model file's bytes differ from the certified file's "
                         "(the model state is what is compared)")

    # the certificate's own consistency
    value_c, primal_c, gap_c = _num(res["value"]), _num(res["primal_cost"]), _num(res["gap"])
    checked.append("results.gap (internal)")
    if math.isfinite(value_c) and math.isfinite(primal_c):
        gap_self = abs(primal_c - value_c) / max(1.0, abs(value_c))
        if not _close(gap_self, gap_c, 1e-6, tol["atol"]) and abs(gap_self - gap_c) > 1e-12:
            mism.append(Mismatch("results.gap", gap_c, gap_self,
                                 "the recorded gap does not match the recorded value and "
                                 "primal cost"))

    # recompute
    loss = _loss_from_spec(inputs["loss"])
    kwargs = dict(loss=loss, r=_num(inputs["r"]), theta1=_num(inputs["theta1"]),
                  theta2=_num(inputs["theta2"]), divergence=inputs["divergence"],
                  solver=solver or inputs.get("solver_requested") or "auto",
                  features=inputs.get("movable_features"))
    try:
        new = certify(model, X, y, **kwargs, **(inputs.get("solver_options") or {}))
    except SolverError:
        raise
    except (OtstabError, ValueError, TypeError) as exc:
        mism.append(Mismatch("results", "a recomputable certificate", f"error: {exc}",
                             "certify failed on these inputs"))
        report.ok = False
        return report
    report.recomputed = new
    notes.append(f"recomputed with solver {new.solver} ({new.status}) in "
                 f"{new.info.get('wall_time', new.solve_time):.3g} s")
    for key in _RESULT_FIGURES:
        checked.append(f"results.{key}")
        a, b = _num(res[key]), float(getattr(new, key))
        if not _close(a, b, tol["rtol"], tol["atol"]):
            mism.append(Mismatch(f"results.{key}", a, b, f"{key} does not reproduce"))
    checked.append("results.h")
    a, b = _num(res["h"]), float(new.h)
    if not _close(a, b, tol["h_rtol"], tol["atol"]):
        mism.append(Mismatch("results.h", a, b, "the dual multiplier h does not reproduce"))
    for key, val in (res.get("decomposition") or {}).items():
        checked.append(f"results.decomposition.{key}")
        a = _num(val)
        b = float(new.decomposition.get(key, math.nan))
        if not _close(a, b, tol["rtol"], tol["atol"]):
            mism.append(Mismatch(f"results.decomposition.{key}", a, b,
                                 f"the decomposition's {key} does not reproduce"))
    checked.append("solver.status")
    if cert["solver"]["status"] != new.status:
        mism.append(Mismatch("solver.status", cert["solver"]["status"], new.status,
                             "the status differs"))
    checked.append("audit of the recomputed Q*")
    if math.isfinite(new.value) and new.status != "unreachable":
        r = kwargs["r"]
        if not new.gap <= tol["gap_tol"]:
            mism.append(Mismatch("audit.gap", f"<= {tol['gap_tol']:g}", new.gap,
                                 "the recomputed primal-dual gap is too large"))
        if new.risk_star < r - tol["gap_tol"] * max(1.0, r):
            mism.append(Mismatch("audit.risk_star", f">= r = {r:g}", new.risk_star,
                                 "the risk under the recomputed Q* does not reach r"))

    fs = res.get("feature_stability")
    if fs is not None and check_features:
        _verify_features(fs, model, X, y, kwargs, tol, mism, checked)
    if qstar is not None:
        checked.append("qstar (independent audit)")
        qi = cert.get("qstar")
        if isinstance(qstar, (str, Path)) and qi and qi.get("sha256"):
            if hash_file(qstar) != qi["sha256"]:
                mism.append(Mismatch("qstar.sha256", qi["sha256"], hash_file(qstar),
                                     "the Q* file differs from the certified one"))
        try:
            mism.extend(audit_qstar(qstar, model, X, y, cert, rtol=tol["rtol"],
                                    atol=tol["atol"]))
        except (OtstabError, ValueError, TypeError) as exc:
            mism.append(Mismatch("qstar", "an auditable Q* file", f"error: {exc}",
                                 "the Q* file cannot be audited"))
    report.ok = not mism
    return report


def _verify_features(fs, model, X, y, kwargs, tol, mism, checked) -> None:
    from . import feature_stability

    table = pd.DataFrame(fs["table"])
    try:
        new = feature_stability(
            model, X, y, loss=kwargs["loss"], r=kwargs["r"], theta1=kwargs["theta1"],
            theta2=kwargs["theta2"], divergence=kwargs["divergence"],
            groups=fs.get("groups"))
    except SolverError:
        raise
    except (OtstabError, ValueError, TypeError) as exc:
        mism.append(Mismatch("results.feature_stability", "recomputable scores",
                             f"error: {exc}", "feature_stability failed on these inputs"))
        return
    checked.append("results.feature_stability")
    old = {str(f): _num(s) for f, s in zip(table["feature"], table["score"])}
    got = {str(f): float(s) for f, s in zip(new["feature"], new["score"])}
    if set(old) != set(got):
        mism.append(Mismatch("results.feature_stability.feature", sorted(old)[:5],
                             sorted(got)[:5], "the scored features differ"))
        return
    for name, a in old.items():
        if not _close(a, got[name], tol["rtol"], tol["atol"]):
            mism.append(Mismatch(f"results.feature_stability[{name}].score", a, got[name],
                                 f"the stability score of feature {name!r} does not "
                                 "reproduce"))
