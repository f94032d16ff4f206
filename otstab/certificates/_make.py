"""Making a certificate from a result: what was certified, what came out and how."""

from __future__ import annotations

import datetime as _dt
import math
import platform
import re
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from otstab_solvers.weights import dense

from .. import __version__
from .._validation import as_sample_weight
from ..errors import InputTypeError, ValidationError
from ..modeling._datacost import DataCost, _frame
from ..modeling._losses import (
    LOSS_NAMES,
    PiecewiseLinear,
    epsilon_insensitive,
    get_loss,
    pinball,
)
from ..solve._inference import check_level
from ..solve._results import StabilityResult
from ._hashing import (
    COST_HASH,
    DATA_HASH,
    MODEL_HASH,
    WEIGHTS_HASH,
    _datacost_spec,
    _effective_n,
    _qualname,
    _raw_weights,
    _strict,
    hash_cost,
    hash_data,
    hash_file,
    hash_model,
    hash_weights,
)
from ._schema import FORMAT, VERSION


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
    p = dense(as_sample_weight(sample_weight, n))
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


def _num(x) -> float:
    """A certificate number (float or "inf"/"-inf"/"nan" string) as a float."""
    if x is None:
        return math.nan
    if isinstance(x, str):
        return float(x)
    return float(x)


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
            "solver_options": _reproducing(solver_options, info),
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


def _reproducing(solver_options, info) -> dict:
    """The solver options as given, with the ``node_budget`` that reproduces a certified
    side the time budget stopped (``info["lower_bound"]``): the searches' points adopted by
    the found side depend on where it stopped, so :func:`verify_certificate` recomputes it
    at that node budget."""
    opts = dict(solver_options or {})
    lb = info.get("lower_bound") if isinstance(info, dict) else None
    if opts.get("time_budget") is not None and "node_budget" not in opts and \
            isinstance(lb, dict) and lb.get("stopped") == "time_budget" and \
            lb.get("node_budget") is not None:
        opts["node_budget"] = int(lb["node_budget"])
    return opts


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
