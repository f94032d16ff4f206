"""Verification: every field of a certificate recomputed from the model and the data, and
the audit of a Q* side file."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from otstab_solvers.weights import phi

from ..analysis._features import feature_stability
from ..errors import OtstabError, SolverError, ValidationError
from ..modeling._datacost import DataCost, as_cost
from ..modeling._losses import (
    ZeroOne,
)
from ..modeling._models import resolve_model
from ..modeling._reduction import feature_mask
from ..solve import _datacost_linear as datacost_linear
from ..solve._audit import relative_gap
from ..solve._core import certify
from ..solve._inference import Bootstrap
from ._hashing import (
    COST_HASH,
    _effective_n,
    _raw_weights,
    _strict,
    hash_cost,
    hash_file,
    hash_weights,
)
from ._make import _data_info, _loss_spec, _model_info, _num, _raw_frame_of, loss_from_spec
from ._schema import read_certificate, read_cost_file, read_table, validate_certificate

#: Default tolerances of :func:`verify_certificate`: a recomputed figure ``b`` reproduces the
#: certified ``a`` when ``|a - b| <= atol + rtol * max(|a|, |b|)`` (``h_rtol`` for the dual
#: multiplier ``h``, which is less well conditioned than the value); the recomputed audit must
#: have ``gap <= gap_tol`` and ``risk_star >= r - gap_tol * max(1, r)``.
DEFAULT_TOLERANCES = {"rtol": 1e-6, "atol": 1e-9, "h_rtol": 1e-5, "gap_tol": 1e-5}


_RESULT_FIGURES = ("value", "risk_base", "risk_star", "total_mass", "primal_cost")


def _recorded_costs(inputs: dict) -> list | None:
    """The prices of ``inputs.feature_costs`` as floats (``"inf"``: inf), or None."""
    costs = inputs.get("feature_costs")
    return None if costs is None else [_num(v) for v in costs]


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
    pm = mass / n if prob.weights is None else mass * prob.weights[src]  # each atom's P0-mass
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
    # still apply), a search at least as thorough, so its bound must be at least the file's;
    # where the time budget stopped the search, make_certificate records the node_budget
    # that reproduces it (and the points the search met, adopted by the found side)
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
        # the tree bound's deterministic budgets apply to each feature's score too; under a
        # time budget the scores are recomputed with an unlimited one (no search point is
        # adopted under a time budget: otstab.analysis._features), not with the node budget
        # that reproduces the main result
        budgets = {k: options[k] for k in ("max_nodes", "node_budget", "rtol") if k in options}
        if timed:
            budgets.pop("node_budget", None)
            budgets["time_budget"] = math.inf
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
    pm = mass / n if prob.weights is None else mass * prob.weights[src]
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
