"""Tests of otstab.certificate: fingerprints, the JSON format and its schema, verification."""

from __future__ import annotations

import copy
import io
import json
import math
import re
import sys
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest

jsonschema = pytest.importorskip("jsonschema")
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402

import otstab  # noqa: E402
from otstab import certificate as C  # noqa: E402
from otstab.certificates._make import _label_counts  # noqa: E402
from otstab.datasets import make_toy  # noqa: E402
from otstab.errors import ValidationError  # noqa: E402
from otstab.modeling._losses import PiecewiseLinear, pinball  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads(
    (ROOT / "otstab" / "certificates" / "schema" / "certificate.schema.json").read_text())


def _validate(cert):
    """Validate against the schema file directly (not through the package's own helper)."""
    jsonschema.Draft202012Validator(SCHEMA).validate(cert)
    # and the emitted text is strict JSON: no NaN / Infinity tokens
    text = json.dumps(cert, allow_nan=False)

    def forbid(token):
        raise AssertionError(f"non-strict JSON token {token}")

    json.loads(text, parse_constant=forbid)


@pytest.fixture(scope="module")
def toy():
    X, y = make_toy(60, random_state=1)
    X = pd.DataFrame(X, columns=["a", "b"])
    y = pd.Series(y, name="label")
    model = LogisticRegression().fit(X, y)
    return model, X, y


@pytest.fixture(scope="module")
def toy_cert(toy):
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="zero_one", r=0.3)
    fs = otstab.feature_stability(model, X, y, loss="zero_one", r=0.3).to_frame()
    return C.make_certificate(res, model, X, y, features=fs, target="label"), res, fs


# ------------------------------------------------------------------------------------------
# schema


def test_schema_copies_are_identical_and_valid():
    docs = json.loads((ROOT / "docs" / "certificate.schema.json").read_text())
    assert docs == SCHEMA
    assert C.load_schema() == SCHEMA
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


CASES = [
    dict(loss="zero_one", r=0.3),
    dict(loss="hinge", r=0.6),
    dict(loss="hinge", r=0.6, divergence="chi2"),
    dict(loss="zero_one", r=0.3, theta1=math.inf),            # only reweighting
    dict(loss="zero_one", r=0.3, theta2=math.inf),            # only moving
    dict(loss="zero_one", r=0.0),                             # r <= base risk: value 0
    dict(loss="zero_one", r=0.3, theta1=math.inf, theta2=math.inf),  # unreachable: inf
    dict(loss="logistic", r=0.5),
]


@pytest.mark.parametrize("kw", CASES, ids=[str(k) for k in CASES])
def test_every_certificate_validates(toy, kw, tmp_path):
    model, X, y = toy
    res = otstab.certify(model, X, y, **kw)
    cert = C.make_certificate(res, model, X, y, target="label")
    _validate(cert)
    assert cert["format"] == "otstab-certificate" and cert["version"] == 2
    # non-finite figures are strings
    if math.isinf(res.value):
        assert cert["results"]["value"] == "inf"
    for key in ("theta1", "theta2"):
        if math.isinf(kw.get(key, 1.0)):
            assert cert["inputs"][key] == "inf"
    # write/read round trip, and the certificate reproduces
    path = C.write_certificate(cert, tmp_path / "c.json")
    back = C.read_certificate(path)
    assert back == json.loads(json.dumps(cert))
    rep = C.verify_certificate(path, model, X, y)
    assert rep.ok, rep.summary()


def test_certificate_with_features_and_qstar_validates(toy, toy_cert, tmp_path):
    model, X, y = toy
    cert, res, fs = toy_cert
    _validate(cert)
    table = cert["results"]["feature_stability"]["table"]
    assert [row["feature"] for row in table] == list(fs["feature"])
    q = C.write_qstar(res, tmp_path / "q.csv")
    cert2 = C.make_certificate(res, model, X, y, qstar=q, movable=["a", "b"])
    _validate(cert2)
    assert cert2["qstar"]["n_atoms"] == res.n_atoms
    assert cert2["inputs"]["movable_features"] == ["a", "b"]


def test_certificate_contents(toy, toy_cert):
    model, X, y = toy
    cert, res, _ = toy_cert
    inp, out = cert["inputs"], cert["results"]
    assert inp["data"]["n_samples"] == len(X) and inp["data"]["n_features"] == 2
    assert inp["data"]["columns"] == ["a", "b"]
    assert inp["data"]["label_counts"] == {"0": 60, "1": 60}
    assert inp["data"]["sha256"] == C.hash_data(X, y)
    assert inp["model"]["sha256"] == C.hash_model(model)
    assert inp["model"]["estimator"].endswith("LogisticRegression")
    assert inp["loss"] == {"name": "zero_one"}
    assert (inp["r"], inp["theta1"], inp["theta2"], inp["divergence"]) == (0.3, 1.0, 0.25, "kl")
    assert out["value"] == res.value and out["h"] == res.h
    assert out["primal_cost"] == res.primal_cost and out["gap"] == res.gap
    assert out["excess_risk"] == pytest.approx(res.risk_star - res.risk_base)
    assert set(out["decomposition"]) >= {"base", "corruption", "reweighting"}
    assert cert["solver"]["status"] == res.status
    assert cert["environment"]["otstab"] == otstab.__version__
    for pkg in ("numpy", "scipy", "cvxpy", "clarabel"):
        assert pkg in cert["environment"]


def test_make_certificate_rejects_wrong_inputs(toy):
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="zero_one", r=0.3)
    with pytest.raises(ValidationError, match="120 samples but X has 10"):
        C.make_certificate(res, model, X.iloc[:10], y.iloc[:10])
    with pytest.raises(TypeError, match="StabilityResult"):
        C.make_certificate({"value": 1}, model, X, y)
    with pytest.raises(ValidationError, match="feature_stability"):
        C.make_certificate(res, model, X, y, features=pd.DataFrame({"x": [1]}))


def test_make_certificate_does_not_mutate(toy):
    model, X, y = toy
    X0, y0 = X.copy(deep=True), y.copy(deep=True)
    coef = model.coef_.copy()
    res = otstab.certify(model, X, y, loss="hinge", r=0.6)
    C.make_certificate(res, model, X, y)
    pd.testing.assert_frame_equal(X, X0)
    pd.testing.assert_series_equal(y, y0)
    np.testing.assert_array_equal(model.coef_, coef)


# ------------------------------------------------------------------------------------------
# fingerprints


def test_data_hash_is_canonical(tmp_path):
    rng = np.random.default_rng(0)
    A = rng.normal(size=(30, 3))
    y = rng.integers(0, 2, 30)
    h = C.hash_data(A, y)
    assert len(h) == 64
    # an array and a frame with default column labels 0..d-1 hash alike
    assert C.hash_data(pd.DataFrame(A), y) == h
    # integer and float labels hash alike; so do -0.0 and 0.0
    assert C.hash_data(A, y.astype(float)) == h
    B = A.copy()
    B[0, 0] = 0.0
    assert C.hash_data(B, y) == C.hash_data(np.where(B == 0, -0.0, B), y)
    # the index is not part of the fingerprint
    df = pd.DataFrame(A, columns=["p", "q", "r"], index=np.arange(100, 130))
    assert C.hash_data(df, y) == C.hash_data(df.reset_index(drop=True), y)
    # a CSV round trip (read back with round-trip precision) keeps it
    df.assign(t=y).to_csv(tmp_path / "d.csv", index=False)
    back = C.read_table(tmp_path / "d.csv")
    assert C.hash_data(back.drop(columns="t"), back["t"]) == C.hash_data(df, y)


def test_data_hash_survives_parquet(tmp_path):
    pytest.importorskip("pyarrow", reason="Parquet files need pyarrow")
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(30, 3)), columns=["p", "q", "r"])
    df["s"] = rng.choice(["a", "b"], 30)
    y = rng.integers(0, 2, 30)
    df.assign(t=y).to_parquet(tmp_path / "d.parquet", index=False)
    back = C.read_table(tmp_path / "d.parquet")
    assert C.hash_data(back.drop(columns="t"), back["t"]) == C.hash_data(df, y)


def test_data_hash_sees_every_change():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(20, 2))
    y = rng.integers(0, 2, 20)
    h = C.hash_data(A, y)
    B = A.copy()
    B[7, 1] = np.nextafter(B[7, 1], np.inf)  # one ulp
    assert C.hash_data(B, y) != h
    y2 = y.copy()
    y2[3] = 1 - y2[3]
    assert C.hash_data(A, y2) != h
    assert C.hash_data(A[:, ::-1], y) != h                  # column order
    assert C.hash_data(pd.DataFrame(A, columns=["u", "v"]), y) != C.hash_data(
        pd.DataFrame(A, columns=["u", "w"]), y)               # column names
    assert C.hash_data(A[:-1], y[:-1]) != h                 # a row less
    # strings are hashed as strings
    s = pd.DataFrame({"c": ["x", "y"], "n": [1.0, 2.0]})
    assert C.hash_data(s, [0, 1]) != C.hash_data(s.assign(c=["x", "z"]), [0, 1])
    with pytest.raises(ValidationError, match="rows"):
        C.hash_data(A, y[:5])


def test_model_hash_survives_joblib_and_sees_refits(toy):
    model, X, y = toy
    buf = io.BytesIO()
    joblib.dump(model, buf)
    buf.seek(0)
    assert C.hash_model(joblib.load(buf)) == C.hash_model(model)
    other = LogisticRegression(C=0.5).fit(X, y)
    assert C.hash_model(other) != C.hash_model(model)
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    pipe2 = make_pipeline(StandardScaler(), LogisticRegression()).fit(X.iloc[:100], y.iloc[:100])
    assert C.hash_model(pipe) != C.hash_model(pipe2)
    buf = io.BytesIO()
    joblib.dump(pipe, buf)
    buf.seek(0)
    assert C.hash_model(joblib.load(buf)) == C.hash_model(pipe)
    lm = otstab.LinearModel([1.0, 2.0], 0.5)
    assert C.hash_model(lm) == C.hash_model(otstab.LinearModel([1.0, 2.0], 0.5))
    assert C.hash_model(lm) != C.hash_model(otstab.LinearModel([1.0, 2.0], 0.25))


def test_model_hash_handles_cycles():
    class Node:
        pass

    a = Node()
    a.other = Node()
    a.other.back = a
    assert len(C.hash_model(a)) == 64


# ------------------------------------------------------------------------------------------
# verification and tampering


def _fields(report):
    return [m.field for m in report.mismatches]


def test_verify_roundtrip(toy, toy_cert):
    model, X, y = toy
    cert, _, _ = toy_cert
    rep = C.verify_certificate(cert, model, X, y)
    assert rep.ok and bool(rep) and not rep.mismatches
    assert "results.value" in rep.checked and "results.feature_stability" in rep.checked
    assert "OK" in rep.summary()


def test_tampered_number_fails(toy, toy_cert):
    model, X, y = toy
    cert = json.loads(json.dumps(toy_cert[0]))
    cert["results"]["value"] = cert["results"]["value"] * (1 + 1e-4)
    rep = C.verify_certificate(cert, model, X, y)
    assert not rep.ok
    assert "results.value" in _fields(rep)
    assert "results.gap" in _fields(rep)  # value no longer matches the recorded primal cost
    assert "results.value" in rep.summary()


def test_tampered_feature_score_fails(toy, toy_cert):
    model, X, y = toy
    cert = json.loads(json.dumps(toy_cert[0]))
    # lower the best score: the table stays sorted and ranked, only the recomputation sees it
    cert["results"]["feature_stability"]["table"][0]["score"] *= 0.99
    name = cert["results"]["feature_stability"]["table"][0]["feature"]
    rep = C.verify_certificate(cert, model, X, y)
    assert _fields(rep) == [f"results.feature_stability[{name}].score"]
    assert C.verify_certificate(cert, model, X, y, check_features=False).ok
    cert["results"]["feature_stability"]["table"][0]["score"] = "nan"  # fails, no crash
    rep = C.verify_certificate(cert, model, X, y, check_features=False)
    assert "results.feature_stability.order" in _fields(rep)


def test_tampered_data_fails(toy, toy_cert):
    model, X, y = toy
    cert = toy_cert[0]
    X2 = X.copy()
    X2.iloc[5, 0] += 0.5
    rep = C.verify_certificate(cert, model, X2, y)
    assert not rep.ok and "inputs.data.sha256" in _fields(rep)
    assert "evaluation data differ" in rep.summary()
    y2 = y.copy()
    y2.iloc[0] = 1 - y2.iloc[0]
    assert "inputs.data.sha256" in _fields(C.verify_certificate(cert, model, X, y2))
    rep = C.verify_certificate(cert, model, X.iloc[:-1], y.iloc[:-1])
    assert {"inputs.data.shape", "inputs.data.sha256"} <= set(_fields(rep))


def test_tampered_model_fails(toy, toy_cert):
    model, X, y = toy
    other = LogisticRegression(C=0.01).fit(X, y)
    rep = C.verify_certificate(toy_cert[0], other, X, y)
    assert not rep.ok and "inputs.model.sha256" in _fields(rep)
    assert "model differs" in rep.summary()


def test_bad_certificates_are_rejected(toy, toy_cert, tmp_path):
    model, X, y = toy
    cert = json.loads(json.dumps(toy_cert[0]))
    cert["format"] = "something-else"
    with pytest.raises(ValidationError, match="not an otstab certificate"):
        C.verify_certificate(cert, model, X, y)
    cert = json.loads(json.dumps(toy_cert[0]))
    cert["version"] = 1  # version 1 certificates (no certified interval) are refused
    with pytest.raises(ValidationError, match="version"):
        C.verify_certificate(cert, model, X, y)
    cert = json.loads(json.dumps(toy_cert[0]))
    cert["results"]["value"] = "lots"
    with pytest.raises(ValidationError, match="results/value"):
        C.validate_certificate(cert)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValidationError, match="not valid JSON"):
        C.read_certificate(tmp_path / "bad.json")
    with pytest.raises(ValidationError, match="cannot read"):
        C.read_certificate(tmp_path / "missing.json")


def test_verify_audits_qstar_file(toy, tmp_path):
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="hinge", r=0.6)
    names = ["q.csv"]
    try:
        import pyarrow  # noqa: F401

        names.append("q.parquet")
    except ImportError:  # Parquet is optional
        pass
    for name in names:
        q = C.write_qstar(res, tmp_path / name)
        cert = C.make_certificate(res, model, X, y, qstar=q)
        rep = C.verify_certificate(cert, model, X, y, qstar=tmp_path / name)
        assert rep.ok, rep.summary()
    # tamper one weight of Q*: its cost, risk and mass no longer match
    frame = C.read_table(tmp_path / "q.csv")
    i = int(frame["loss*"].to_numpy().argmax())  # an atom with positive loss under Q*
    assert frame.loc[i, "loss*"] > 0
    frame.loc[i, "weight"] *= 1.5
    frame.to_csv(tmp_path / "q2.csv", index=False)
    rep = C.verify_certificate(cert, model, X, y, qstar=tmp_path / "q2.csv")
    assert {"qstar.sha256", "qstar:primal_cost", "qstar:risk_star",
            "qstar:total_mass"} <= set(_fields(rep))
    # an audit from the frame alone (no file hash) still catches it
    assert C.audit_qstar(frame, model, X, y, cert)


def test_loss_specs_round_trip(toy):
    model, X, y = toy
    custom = PiecewiseLinear((0.0, -2.0), (0.0, 1.0), on="margin", name="steep_hinge")
    res = otstab.certify(model, X, y, loss=custom, r=0.8)
    cert = C.make_certificate(res, model, X, y, loss=custom)
    assert cert["inputs"]["loss"]["slopes"] == [0.0, -2.0]
    assert C.verify_certificate(cert, model, X, y).ok
    assert C.loss_from_spec({"name": "pinball(0.3)"}) == pinball(0.3)


# ------------------------------------------------------------------------------------------
# every field: a tamper test per leaf of a real certificate and per Q* column

#: leaves a reader sees that verify deliberately does not check (docs/guarantees.md): when the
#: certificate was made, how long it took, the package versions, the solver's narrative of the
#: run, the provenance of the model file's bytes and the Q* file's name, the user's metadata
INFORMATIONAL = (r"created", r"environment\..*", r"timings\..*", r"solver\.message",
                 r"solver\.iterations", r"solver\.log\..*", r"inputs\.model\.file",
                 r"inputs\.model\.file_sha256", r"qstar\.file", r"extra\..*",
                 r"inputs\.sample_weight\.source")
#: enumerated strings are swapped for another valid value (a loss name for another built-in
#: loss), so that the recomputation, not only the schema, has to notice
_SWAP = {"kl": "chi2", "chi2": "kl", "csv": "parquet", "parquet": "csv",
         "margin": "residual", "residual": "margin", "zero_one": "hinge", "hinge": "absolute"}


def _leaves(obj, path=""):
    """(dotted path, value) of every leaf of a JSON object (list items by position)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}.{i}")
    else:
        yield path, obj


def _set(obj, path, value):
    keys = path.split(".")
    for k in keys[:-1]:
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    last = keys[-1]
    if isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value


def _perturb(v):
    """Another value of the same kind (None when a leaf has no natural other value)."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v + 0.01 * max(1.0, abs(v))
    if isinstance(v, str):
        if v in ("inf", "-inf", "nan"):
            return {"inf": 2.0, "-inf": -2.0, "nan": 0.5}[v]
        if v in _SWAP:
            return _SWAP[v]
        if re.fullmatch(r"[0-9a-f]{64}", v):
            return v[:-1] + ("0" if v[-1] != "0" else "1")  # still a valid hash
        if re.fullmatch(r"\d{4}-.*Z", v):
            return "1999" + v[4:]  # still a valid timestamp
        return v + "x"
    return None


KINDS = ("zero_one-kl-features", "hinge-chi2-pipeline", "zero_one-unreachable",
         "hinge-kl-weighted", "zero_one-datacost")
#: inputs are checked through the recomputation; these edits leave a certificate that is still
#: true (0.31 is as unreachable as 0.3 with theta1 = theta2 = inf, where the divergence prices
#: nothing), so verify rightly accepts them
STILL_TRUE = {"zero_one-unreachable": ("inputs.r", "inputs.divergence")}


def _datacost_data(n=40):
    """A float, an integer and a categorical raw column (for a DataCost certificate)."""
    rng = np.random.default_rng(5)
    X = pd.DataFrame({"a": rng.normal(size=n), "k": rng.integers(0, 6, n),
                      "colour": rng.choice(["red", "green", "blue"], n)})
    s = X["a"] + 0.5 * X["k"] - 1.5 + (X["colour"] == "red") * 1.0
    return X, pd.Series((s + rng.normal(size=n) > 0).astype(int), name="label")


@pytest.fixture(scope="module")
def tamper_cases(tmp_path_factory):
    """Real certificates whose leaves together are every field of the format: a 0/1-loss KL
    certificate with grouped feature scores, a movable subset and a label column; a hinge chi2
    certificate (alpha set) of a Pipeline with per-feature prices; an unreachable threshold
    (value "inf", gap "nan"); a hinge KL certificate with sample weights (a named Series) and
    feature scores. All with a model file, a Q* file and extra metadata; the last entry of each
    case is its weights."""
    d = tmp_path_factory.mktemp("tamper")
    X, y = make_toy(40, random_state=2)
    noise = np.random.default_rng(3).normal(size=len(y))  # a third, weakly useful feature
    X = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": noise - y})
    y = pd.Series(y, name="label")
    cases = {}
    for kind in KINDS:
        if kind == "zero_one-datacost":  # a cost on raw variables: inputs.cost, raw Q*
            Xd, yd = _datacost_data()
            model = make_pipeline(ColumnTransformer([
                ("num", StandardScaler(), ["a", "k"]), ("cat", OneHotEncoder(), ["colour"])]),
                LogisticRegression()).fit(Xd, yd)
            kw = dict(loss="zero_one", r=0.4, theta2=1.0, cost=otstab.DataCost(
                bounds={"k": (0, 8)}, switch={"colour": 0.5}, decrease_only=["a"]))
            joblib.dump(model, d / f"{kind}.joblib")
            res = otstab.certify(model, Xd, yd, **kw)
            qfile = d / f"{kind}.csv"
            cert = C.make_certificate(res, model, Xd, yd, target="label",
                                      model_file=d / f"{kind}.joblib",
                                      qstar=C.write_qstar(res, qfile), extra={"reviewer": "x"})
            cases[kind] = (cert, model, Xd, yd, qfile, d / f"{kind}.joblib", None)
            continue
        elif kind == "zero_one-unreachable":
            model = LogisticRegression().fit(X, y)
            kw = dict(loss="zero_one", r=0.3, theta1=math.inf, theta2=math.inf)
        elif kind.startswith("zero_one"):
            model = LogisticRegression().fit(X, y)
            kw = dict(loss="zero_one", r=0.3, features=["a", "b", "c"])
        elif kind == "hinge-kl-weighted":
            model = LogisticRegression().fit(X, y)
            kw = dict(loss="hinge", r=0.8)
        else:
            model = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
            # prices by raw name: "a" per raw unit (4 s_a^2 per scaled unit), "c" immutable
            kw = dict(loss="hinge", r=0.8, divergence="chi2",
                      feature_costs={"a": 4.0, "c": math.inf})
        sw = None
        if kind.endswith("weighted"):
            sw = pd.Series(np.random.default_rng(4).uniform(0.2, 3.0, size=len(y)),
                           name="survey_weight")
        joblib.dump(model, d / f"{kind}.joblib")
        res = otstab.certify(model, X, y, sample_weight=sw, **kw)
        fs, groups = None, None
        if kind.endswith("features"):
            groups = {"ab": ["a", "b"]}
            fs = otstab.feature_stability(model, X, y, loss="zero_one", r=0.3,
                                          feature_groups=groups).to_frame()
        elif kind.endswith("weighted"):
            fs = otstab.feature_stability(model, X, y, sample_weight=sw, **kw).to_frame()
        qfile = d / f"{kind}.csv"
        cert = C.make_certificate(res, model, X, y, features=fs, groups=groups,
                                  movable=kw.get("features"), target="label",
                                  model_file=d / f"{kind}.joblib", qstar=C.write_qstar(res, qfile),
                                  extra={"reviewer": "someone"}, sample_weight=sw)
        cases[kind] = (cert, model, X, y, qfile, d / f"{kind}.joblib", sw)
    return cases


def _verify_tampered(cert, model, X, y, qfile, model_file, sw):
    """True when verify accepts the certificate."""
    try:
        return C.verify_certificate(cert, model, X, y, qstar=qfile, model_file=model_file,
                                    sample_weight=sw).ok
    except ValidationError:
        return False


@pytest.mark.parametrize("kind", KINDS)
def test_every_leaf_is_checked_or_informational(tamper_cases, kind):
    cert, model, X, y, qfile, model_file, sw = tamper_cases[kind]
    assert _verify_tampered(cert, model, X, y, qfile, model_file, sw)
    leaves = [(p, v) for p, v in _leaves(cert) if _perturb(v) is not None]
    assert len(leaves) > 50  # the walk really covers the certificate
    undetected, broken = [], []
    for path, value in leaves:
        bad = copy.deepcopy(cert)
        _set(bad, path, _perturb(value))
        accepted = _verify_tampered(bad, model, X, y, qfile, model_file, sw)
        informational = any(re.fullmatch(p, path) for p in INFORMATIONAL) or path in \
            STILL_TRUE.get(kind, ())
        if informational and not accepted:
            broken.append(path)
        elif not informational and accepted:
            undetected.append(f"{path}={value!r}")
    assert not undetected, f"tampering these fields went unnoticed: {undetected}"
    assert not broken, f"informational fields failed verification: {broken}"


def test_every_kind_of_field_is_walked(tamper_cases):
    """The two certificates leave no field of the schema null in both (so none is skipped)."""
    seen = set()
    for cert, *_ in tamper_cases.values():
        seen |= {re.sub(r"\.\d+", "", p) for p, v in _leaves(cert) if v is not None}
    schema_fields = set()

    def walk(s, path):
        for k, sub in s.get("properties", {}).items():
            q = f"{path}.{k}" if path else k
            schema_fields.add(q)
            walk(sub, q)
    walk(SCHEMA, "")
    for opt in (SCHEMA["properties"]["qstar"]["anyOf"][1],):
        walk(opt, "qstar")
    walk(SCHEMA["properties"]["results"]["properties"]["feature_stability"]["anyOf"][1],
         "results.feature_stability")
    leaves = {f for f in schema_fields if not any(g.startswith(f + ".") for g in schema_fields)}
    # solver_options (none by default, passed to certify again) is the only field left out
    optional = {"inputs.solver_options"}
    missing = {f for f in leaves - optional
               if not any(s == f or s.startswith(f + ".") for s in seen)}
    assert not missing, missing


def _qstar_frame(tamper_cases):
    cert, model, X, y, qfile, _, _ = tamper_cases["zero_one-kl-features"]
    return cert, model, X, y, C.read_table(qfile)


def test_qstar_audit_of_the_written_file_passes(tamper_cases):
    cert, model, X, y, frame = _qstar_frame(tamper_cases)
    assert C.audit_qstar(frame, model, X, y, cert) == []
    assert list(frame.columns) == ["source", "mass", "index", "a", "b", "c", "a*", "b*", "c*",
                                   "weight", "loss", "loss*", "distance2"]


@pytest.mark.parametrize("column", ["source", "mass", "index", "a", "b", "c", "a*", "b*", "c*",
                                    "weight", "loss", "loss*", "distance2"])
def test_tampered_qstar_column_fails(tamper_cases, column):
    cert, model, X, y, frame = _qstar_frame(tamper_cases)
    frame = frame.copy()
    i = 0
    if column == "source":  # atom 0 now claims sample 1: sample 1 has mass 2, sample 0 none
        frame.loc[i, column] = (frame.loc[i, column] + 1) % len(X)
    else:
        frame[column] = frame[column].astype(float)
        if column in ("mass", "weight"):
            frame.loc[i, column] = frame.loc[i, column] * 0.5
        else:
            frame.loc[i, column] = frame.loc[i, column] + 0.5
    expected = {"source": "qstar:mass", "mass": "qstar:mass", "weight": "qstar:total_mass"}
    for star in ("a*", "b*", "c*"):
        expected[star] = "qstar:distance2"  # the moved point is no longer ||x* - x||^2 away
    fields = {m.field for m in C.audit_qstar(frame, model, X, y, cert)}
    assert expected.get(column, f"qstar:{column}") in fields, fields


def test_qstar_file_with_other_columns_or_rows_fails(tamper_cases, tmp_path):
    cert, model, X, y, frame = _qstar_frame(tamper_cases)
    fields = {m.field for m in C.audit_qstar(frame.assign(note=1), model, X, y, cert)}
    assert fields == {"qstar:columns"}
    fields = {m.field for m in C.audit_qstar(frame.drop(columns="loss*"), model, X, y, cert)}
    assert fields == {"qstar:columns"}
    short = frame.iloc[:-1]
    fields = {m.field for m in C.audit_qstar(short, model, X, y, cert)}
    assert {"qstar:n_atoms", "qstar:mass"} <= fields


def test_duplicate_keys_are_rejected(toy_cert, tmp_path):
    cert = toy_cert[0]
    text = json.dumps(cert, indent=1)
    # state results.value twice: plain JSON would keep the second, tampered one
    value = json.dumps(cert["results"]["value"])
    dup = text.replace(f'"value": {value},', f'"value": {value},\n "value": 0.5,', 1)
    assert dup != text
    (tmp_path / "dup.json").write_text(dup)
    with pytest.raises(ValidationError, match="'value' twice"):
        C.read_certificate(tmp_path / "dup.json")
    (tmp_path / "nan.json").write_text(text.replace(value, "NaN", 1))
    with pytest.raises(ValidationError, match="NaN"):
        C.read_certificate(tmp_path / "nan.json")


@pytest.mark.parametrize("where", ["", "inputs", "results", "inputs.data", "solver"])
def test_unknown_keys_are_rejected_with_or_without_jsonschema(toy_cert, where, monkeypatch):
    cert = json.loads(json.dumps(toy_cert[0]))
    block = cert
    for k in filter(None, where.split(".")):
        block = block[k]
    block["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        C.validate_certificate(cert)
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema -> ImportError
    with pytest.raises(ValidationError, match="unknown key.*surprise"):
        C.validate_certificate(cert)


@pytest.mark.parametrize("name", ["rtol", "atol", "h_rtol", "gap_tol"])
@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "1e-6", True])
def test_bad_tolerances_are_rejected(toy, toy_cert, name, bad):
    model, X, y = toy
    with pytest.raises(ValidationError, match=f"{name} must be a finite number >= 0"):
        C.verify_certificate(toy_cert[0], model, X, y, **{name: bad})


def test_label_counts_treat_whole_float_labels_as_integers(toy, toy_cert):
    model, X, y = toy
    assert _label_counts(y) == _label_counts(y.astype(float)) == {"0": 60, "1": 60}
    assert C.verify_certificate(toy_cert[0], model, X, y.astype(float)).ok


def test_loss_spec_must_describe_the_named_loss(toy):
    """A built-in name with other slopes (the hinge relabelled "absolute", or given other
    slopes) is caught; a custom PiecewiseLinear is defined by its slopes, its name a label."""
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="hinge", r=0.6)
    cert = C.make_certificate(res, model, X, y)
    assert cert["inputs"]["loss"]["slopes"] == [0.0, -1.0]  # hinge: max(0, 1 - margin)
    for edit in ({"name": "absolute"}, {"slopes": [0.0, -2.0]}):
        bad = copy.deepcopy(cert)
        bad["inputs"]["loss"].update(edit)
        assert "inputs.loss" in _fields(C.verify_certificate(bad, model, X, y))
    custom = PiecewiseLinear((0.0, -1.0), (0.0, 1.0), on="margin", name="my_hinge")
    cert = C.make_certificate(otstab.certify(model, X, y, loss=custom, r=0.6), model, X, y,
                              loss=custom)
    assert C.verify_certificate(cert, model, X, y).ok


# ------------------------------------------------------------------------------------------
# sample weights


def test_weighted_certificate_verifies_and_a_tampered_weight_fails(tamper_cases, tmp_path):
    cert, model, X, y, qfile, _, sw = tamper_cases["hinge-kl-weighted"]
    recorded = cert["inputs"]["sample_weight"]
    assert recorded["source"] == "survey_weight"
    assert recorded["sha256"] == C.hash_weights(sw.to_numpy())
    # Kish's effective sample size, from its definition
    assert recorded["effective_n"] == pytest.approx(sw.sum() ** 2 / (sw ** 2).sum(), rel=1e-12)
    rep = C.verify_certificate(cert, model, X, y, qstar=qfile, sample_weight=sw)
    assert rep.ok, rep.summary()
    assert rep.recomputed.value == pytest.approx(cert["results"]["value"], rel=1e-9)
    # one weight changed: the fingerprint and the recomputed weighted figures both differ
    bad = sw.copy()
    i = int(np.argmax(np.asarray(rep.recomputed.weights)[:len(sw)]))  # a row Q* upweights
    bad.iloc[i] *= 2.0
    rep = C.verify_certificate(cert, model, X, y, qstar=qfile, sample_weight=bad)
    assert not rep.ok
    fields = set(_fields(rep))
    assert {"inputs.sample_weight.sha256", "results.value", "qstar:sample_weight"} <= fields
    # a weighted certificate cannot be verified without its weights, nor an unweighted one with
    rep = C.verify_certificate(cert, model, X, y)
    assert not rep.ok and _fields(rep)[-1] == "inputs.sample_weight"
    plain, model2, X2, y2, *_ = tamper_cases["hinge-chi2-pipeline"]
    rep = C.verify_certificate(plain, model2, X2, y2, sample_weight=np.ones(len(y2)))
    assert not rep.ok and "inputs.sample_weight" in _fields(rep)


def test_weighted_qstar_audit_uses_the_weights(tamper_cases):
    # the Q* side file of a weighted certificate: its cost, risk and mass are sums over atoms
    # weighted by p[source] * mass; with uniform 1/n instead they do not match the certificate
    cert, model, X, y, qfile, _, sw = tamper_cases["hinge-kl-weighted"]
    frame = C.read_table(qfile)
    assert not C.audit_qstar(frame, model, X, y, cert, sample_weight=sw)
    unweighted = copy.deepcopy(cert)
    unweighted["inputs"]["sample_weight"] = None
    fields = {m.field for m in C.audit_qstar(frame, model, X, y, unweighted)}
    assert "qstar:total_mass" in fields or "qstar:primal_cost" in fields


def test_make_certificate_checks_the_weights(toy):
    model, X, y = toy
    sw = np.random.default_rng(5).uniform(0.5, 2.0, size=len(y))
    res = otstab.certify(model, X, y, loss="hinge", r=0.6, sample_weight=sw)
    with pytest.raises(ValidationError, match="sample_weight"):
        C.make_certificate(res, model, X, y)
    other = sw.copy()
    other[0] *= 1.1
    with pytest.raises(ValidationError, match="sample_weight differs"):
        C.make_certificate(res, model, X, y, sample_weight=other)
    # scaling the weights changes nothing in the result: accepted, fingerprinted as given
    cert = C.make_certificate(res, model, X, y, sample_weight=3 * sw, sample_weight_source="w")
    _validate(cert)
    assert cert["inputs"]["sample_weight"]["sha256"] == C.hash_weights(3 * sw)
    assert C.hash_weights(3 * sw) != C.hash_weights(sw)
    plain = otstab.certify(model, X, y, loss="hinge", r=0.6)
    assert C.make_certificate(plain, model, X, y)["inputs"]["sample_weight"] is None


def test_priced_certificate_records_the_prices_and_verifies(tamper_cases):
    # the prices are those of the model's input (the scaled columns): "a" at 4 per raw unit is
    # 4 s_a^2 per unit of the StandardScaler's output (dz = dx / s_a), "c" immutable
    cert, model, X, y, qfile, _, _ = tamper_cases["hinge-chi2-pipeline"]
    s = model.named_steps["standardscaler"].scale_
    assert cert["inputs"]["feature_costs"] == [pytest.approx(4.0 * s[0] ** 2, rel=1e-12),
                                               1.0, "inf"]
    _validate(cert)
    rep = C.verify_certificate(cert, model, X, y, qstar=qfile)
    assert rep.ok, rep.summary()
    # the certificate without its prices: the unpriced value is another one
    bare = copy.deepcopy(cert)
    bare["inputs"]["feature_costs"] = None
    rep = C.verify_certificate(bare, model, X, y)
    assert not rep.ok and "results.value" in _fields(rep)
    unpriced = otstab.certify(model, X, y, loss="hinge", r=0.8, divergence="chi2")
    assert rep.recomputed.value == pytest.approx(unpriced.value, rel=1e-12)
    assert not C.make_certificate(unpriced, model, X, y)["inputs"]["feature_costs"]


def test_priced_qstar_audit_prices_the_moves(tamper_cases):
    # the cost of the stored Q*, recomputed here from its own columns with the prices of the
    # certificate: theta1 E[W sum_j c_j (x*_j - x_j)^2] + theta2 E[phi(W)] (chi2: (W - 1)^2)
    cert, model, X, y, qfile, _, _ = tamper_cases["hinge-chi2-pipeline"]
    frame = C.read_table(qfile)
    assert C.audit_qstar(frame, model, X, y, cert) == []
    c = np.array([float(v) for v in cert["inputs"]["feature_costs"]])
    diff = frame[["a*", "b*", "c*"]].to_numpy() - frame[["a", "b", "c"]].to_numpy()
    assert np.all(diff[:, 2] == 0)  # "c" is immutable
    pm, w = frame["mass"].to_numpy() / len(y), frame["weight"].to_numpy()
    cost = float(cert["inputs"]["theta1"]) * np.sum(pm * w * (diff[:, :2] ** 2 @ c[:2])) \
        + float(cert["inputs"]["theta2"]) * np.sum(pm * (w - 1.0) ** 2)
    assert cost == pytest.approx(cert["results"]["primal_cost"], rel=1e-9)
    assert np.any(diff[:, 0] != 0)  # the priced feature moves: its price matters below
    unit = copy.deepcopy(cert)
    unit["inputs"]["feature_costs"] = [1.0, 1.0, "inf"]
    assert "qstar:primal_cost" in {m.field for m in C.audit_qstar(frame, model, X, y, unit)}
    # a stored Q* that moves the immutable feature is refused
    moved = frame.copy()
    moved.loc[0, "c*"] += 0.5
    assert "qstar" in {m.field for m in C.audit_qstar(moved, model, X, y, cert)}
