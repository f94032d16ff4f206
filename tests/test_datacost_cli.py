"""The DataCost carried through certificates, the CLI and the report (issue 28, item 5): the
resolved spec is stored (fingerprinted) in the certificate, verify re-certifies under it and
re-checks Q*'s raw rows against the model and the data; a tampered spec is caught; the CLI's
--cost / --cost-file / --immutable; the report's plain-words cost and moves in data units."""

import copy
import json

import joblib
import numpy as np
import pandas as pd
import pytest
from german import german_pipeline
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import otstab
from otstab import certificate as C
from otstab import report as R
from otstab.cli import main
from otstab.errors import ValidationError
from otstab.modeling._datacost import DataCost

N = 200
SPEC = DataCost(bounds={"age": (18, 75)}, switch={"purpose": 0.5}, immutable=["foreign_worker"])


@pytest.fixture(scope="module")
def german():
    pipe, X, y, _, _, df = german_pipeline(rows=N)
    return pipe, X, y, df


@pytest.fixture(scope="module")
def certified(german, tmp_path_factory):
    pipe, X, y, _ = german
    d = tmp_path_factory.mktemp("dccert")
    res = otstab.certify(pipe, X, y, loss="zero_one", r=0.4, cost=SPEC)
    qinfo = C.write_qstar(res, d / "q.csv")
    cert = C.make_certificate(res, pipe, X, y, target="credit", qstar=qinfo)
    path = C.write_certificate(cert, d / "c.json")
    return res, cert, path, d / "q.csv"


def test_certificate_stores_the_resolved_spec(german, certified):
    pipe, X, y, _ = german
    res, cert, path, _ = certified
    block = C.read_certificate(path)["inputs"]["cost"]
    assert block["kind"] == "datacost" and block["hash_method"] == "otstab-cost-v1"
    assert block["spec"] == json.loads(json.dumps(res.info["cost"]))
    assert block["sha256"] == C.hash_cost(block["spec"])
    # explicit: every variable's kind, and the given choices, are in the stored spec
    assert set(block["spec"]["kinds"]) == set(X.columns)
    assert block["spec"]["bounds"]["age"] == [18.0, 75.0]
    assert "foreign_worker" in block["spec"]["immutable"]
    # the description is that of the stored spec resolved again
    rc = DataCost.from_dict(block["spec"]).resolve(pipe, X)
    assert block["description"] == rc.describe()
    assert "purpose: categorical over" in block["description"]
    assert "foreign_worker: categorical, immutable" in block["description"]
    # an encoded-cost certificate has no cost block (older certificates look the same)
    plain = otstab.certify(pipe, X, y, loss="zero_one", r=0.4, cost="encoded")
    assert "cost" not in C.make_certificate(plain, pipe, X, y)["inputs"]


def test_round_trip_verifies_and_audits_raw_rows(german, certified):
    pipe, X, y, _ = german
    res, cert, path, qfile = certified
    rep = C.verify_certificate(path, pipe, X, y, qstar=qfile)
    assert rep.ok, rep.summary()
    for field in ("inputs.cost.sha256", "inputs.cost.description",
                  "Q*'s raw rows (valid, re-scored, re-priced)", "qstar (independent audit)"):
        assert field in rep.checked
    # the expected spec, given by the caller, must be the stored one
    assert C.verify_certificate(path, pipe, X, y, cost=SPEC).ok
    other = C.verify_certificate(path, pipe, X, y, cost="auto")
    assert not other.ok and [m.field for m in other.mismatches] == ["inputs.cost.spec"]
    # the side file is the raw frame: data units, valid rows
    frame = C.read_table(qfile)
    assert "amount*" in frame.columns and "purpose*" in frame.columns
    assert (frame["foreign_worker*"] == frame["foreign_worker"]).all()
    assert ((frame["age*"] == frame["age"]) | frame["age*"].between(18, 75)).all()
    assert (frame["amount*"] == np.round(frame["amount*"])).all()


def test_tampered_spec_is_caught(german, certified):
    pipe, X, y, _ = german
    _, cert, _, _ = certified
    # an edit that leaves the answer unchanged (another immutable variable nobody moves in Q*)
    # is caught by the fingerprint alone
    frame = otstab.certify(pipe, X, y, loss="zero_one", r=0.4, cost=SPEC).to_frame(raw=True)
    still = [c for c in X.columns if c != "foreign_worker" and frame[c].astype(str).equals(
        frame[f"{c}*"].astype(str))]
    bad = copy.deepcopy(cert)
    bad["inputs"]["cost"]["spec"]["immutable"].append(still[0])
    rep = C.verify_certificate(bad, pipe, X, y)
    # (the description of the edited spec says the variable is immutable: recomputed too)
    assert [m.field for m in rep.mismatches] == ["inputs.cost.sha256",
                                                 "inputs.cost.description"], rep.summary()
    # re-fingerprinted, a price change is refuted by the recomputation
    bad = copy.deepcopy(cert)
    bad["inputs"]["cost"]["spec"]["price"]["amount"] = 4.0
    bad["inputs"]["cost"]["sha256"] = C.hash_cost(bad["inputs"]["cost"]["spec"])
    fields = {m.field for m in C.verify_certificate(bad, pipe, X, y).mismatches}
    assert "results.value" in fields and "inputs.cost.sha256" not in fields
    # a description that says something else
    bad = copy.deepcopy(cert)
    bad["inputs"]["cost"]["description"] = bad["inputs"]["cost"]["description"].replace(
        "foreign_worker: categorical, immutable", "foreign_worker: categorical over 2 levels")
    assert [m.field for m in C.verify_certificate(bad, pipe, X, y).mismatches] == [
        "inputs.cost.description"]
    # a spec that is no DataCost
    bad = copy.deepcopy(cert)
    bad["inputs"]["cost"]["spec"]["kinds"]["age"] = "fractional"
    fields = [m.field for m in C.verify_certificate(bad, pipe, X, y).mismatches]
    assert fields == ["inputs.cost.sha256", "inputs.cost.spec"]


def test_raw_qstar_audit_refutes_invalid_rows(german, certified):
    pipe, X, y, _ = german
    res, cert, _, qfile = certified
    frame = C.read_table(qfile)
    assert C.audit_qstar(frame, pipe, X, y, cert) == []
    moved = np.flatnonzero(frame["cost"].to_numpy() > 0)
    assert moved.size
    i = int(moved[0])
    cases = {
        "qstar:purpose*": ("purpose*", "time machine"),        # not a level
        "qstar:age*": ("age*", 17),                            # below its bound
        "qstar:foreign_worker*": ("foreign_worker*", "no" if frame["foreign_worker"].iloc[i]
                                  == "yes" else "yes"),        # immutable
        "qstar:amount": ("amount", frame["amount"].iloc[i] + 1),   # not the source's value
        "qstar:cost": ("cost", frame["cost"].iloc[i] * 1.5),   # mispriced
        "qstar:loss*": ("loss*", 1.0 - frame["loss*"].iloc[i]),   # mis-scored
    }
    for field, (col, val) in cases.items():
        bad = frame.copy()
        bad[col] = bad[col].astype(object)
        bad.loc[i, col] = val
        got = [m.field for m in C.audit_qstar(bad, pipe, X, y, cert)]
        assert field in got, (field, got)
    bad = frame.copy()
    bad["duration*"] = bad["duration*"].astype(float)
    bad.loc[i, "duration*"] = bad.loc[i, "duration*"] + 0.5
    assert "qstar:duration*" in [m.field for m in C.audit_qstar(bad, pipe, X, y, cert)]


def test_a_feature_table_is_refused_under_a_datacost(german, certified):
    pipe, X, y, _ = german
    res = certified[0]
    table = pd.DataFrame({"feature": ["age"], "score": [1.0]})
    with pytest.raises(ValidationError, match="features"):
        C.make_certificate(res, pipe, X, y, features=table)


def test_report_states_the_cost_and_moves_in_data_units(german, certified):
    res, cert, _, _ = certified
    text = R.cost_text(cert)
    assert "DataCost" in text and cert["inputs"]["cost"]["description"] in text
    page = R.render_html(cert, result=res)
    assert 'id="cost-description"' in page
    assert "purpose: categorical over 10 levels, a change costs 0.5" in page
    frame, shares, changes = R.datacost_changes(res, top=5)
    assert changes and abs(shares.sum() - 1.0) < 1e-9
    # every change line is the raw frame's move, in the data's units
    for label, _, line in changes:
        row = frame[frame["index"].astype(str) == label].iloc[0]
        for part in line.split("; "):
            name = part.split(":")[0].split(" ")[0]
            assert str(row[name]) != str(row[f"{name}*"])
            if pd.api.types.is_numeric_dtype(frame[name]):
                assert part == f"{name} {int(row[name]):,} -> {int(row[name + '*']):,}"
            else:
                assert part == f"{name}: {row[name]} -> {row[name + '*']}"
    assert "&rarr;" in page and 'id="raw-changes"' in page
    card = R.model_card(cert)
    assert cert["inputs"]["cost"]["sha256"][:12] in card["criterion"]["cost"]
    assert "DataCost" in R.model_card_markdown(card)


# ------------------------------------------------------------------------------------------
# CLI


@pytest.fixture(scope="module")
def files(german, tmp_path_factory):
    pipe, X, y, df = german
    d = tmp_path_factory.mktemp("dccli")
    joblib.dump(pipe, d / "m.joblib")
    df.to_csv(d / "data.csv", index=False)
    (d / "spec.json").write_text(json.dumps(SPEC.to_dict()))
    return d


def _certify(d, *extra):
    return main(["certify", "--model", str(d / "m.joblib"), "--trust-model", "--data",
                 str(d / "data.csv"), "--target", "credit", "--r", "0.4", "--quiet", *extra])


def _verify(d, cert, *extra):
    return main(["verify", str(cert), "--model", str(d / "m.joblib"), "--trust-model",
                 "--data", str(d / "data.csv"), *extra])


def test_cli_cost_file_round_trip(files, german, capsys):
    d = files
    assert _certify(d, "--cost-file", str(d / "spec.json"), "--json", str(d / "c.json"),
                    "--qstar", str(d / "q.csv"), "--html", str(d / "r.html")) == 0
    cert = json.loads((d / "c.json").read_text())
    pipe, X, *_ = german
    assert cert["inputs"]["cost"]["spec"] == json.loads(json.dumps(
        SPEC.resolve(pipe, X).to_dict()))
    assert "purpose: categorical over 10 levels" in (d / "r.html").read_text()
    assert "purpose*" in C.read_table(d / "q.csv").columns  # the raw frame
    capsys.readouterr()
    assert _verify(d, d / "c.json", "--qstar", str(d / "q.csv")) == 0
    assert _verify(d, d / "c.json", "--cost-file", str(d / "spec.json")) == 0
    # a spec file the certificate was not made under
    (d / "other.json").write_text(json.dumps(DataCost(switch={"purpose": 2.0}).to_dict()))
    capsys.readouterr()
    assert _verify(d, d / "c.json", "--cost-file", str(d / "other.json")) == 1
    assert "inputs.cost.spec" in capsys.readouterr().err
    # a tampered spec in the file
    bad = copy.deepcopy(cert)
    bad["inputs"]["cost"]["spec"]["switch"]["purpose"] = 0.25
    (d / "bad.json").write_text(json.dumps(bad))
    assert _verify(d, d / "bad.json") == 1
    assert "inputs.cost.sha256" in capsys.readouterr().err
    # a spec file that cannot be read: bad input naming the argument and the file
    (d / "broken.json").write_text('{"switch": {"purpose": "cheap"}}')
    assert _verify(d, d / "c.json", "--cost-file", str(d / "broken.json")) == 2
    err = capsys.readouterr().err
    assert "argument --cost-file:" in err and "broken.json" in err and "switch" in err, err


def test_cli_auto_and_immutable(files, capsys):
    d = files
    assert _certify(d, "--cost", "auto", "--immutable", "age, personal_status_sex",
                    "--json", str(d / "ci.json"), "--qstar-raw", str(d / "qr.csv")) == 0
    spec = json.loads((d / "ci.json").read_text())["inputs"]["cost"]["spec"]
    assert {"age", "personal_status_sex"} <= set(spec["immutable"])
    frame = C.read_table(d / "qr.csv")
    assert (frame["age*"] == frame["age"]).all()
    assert (frame["personal_status_sex*"] == frame["personal_status_sex"]).all()
    assert _verify(d, d / "ci.json") == 0
    # --cost-file and --immutable merge
    assert _certify(d, "--cost-file", str(d / "spec.json"), "--immutable", "age", "--json",
                    str(d / "cm.json")) == 0
    spec = json.loads((d / "cm.json").read_text())["inputs"]["cost"]["spec"]
    assert {"age", "foreign_worker"} <= set(spec["immutable"])
    assert spec["switch"]["purpose"] == 0.5


@pytest.mark.parametrize("content, args, arg, words", [
    ('{"immutable": ["agee"]}', (), "--cost-file", ["bad.json", "immutable", "'age'"]),
    ('{"scale": {"age": -1}}', (), "--cost-file", ["bad.json", "scale['age']"]),
    ('{"scale": {"age": 1,}}', (), "--cost-file", ["bad.json", "not valid JSON"]),
    ('{"colour": 1}', (), "--cost-file", ["bad.json", "unknown DataCost field", "colour"]),
    ('[1, 2]', (), "--cost-file", ["bad.json", "must be a dict"]),
    ('{"switch": {"purpose": "cheap"}}', (), "--cost-file", ["bad.json", "switch['purpose']"]),
    ('{"switch": {"purpose": {"matrix": [[1, 2]]}}}', (), "--cost-file",
     ["bad.json", "switch['purpose']", "triples"]),
    ('{"price": {"amount": "x"}}', (), "--cost-file", ["bad.json", "price['amount']"]),
    ('{"bounds": {"purpose": [0, 1]}}', (), "--cost-file", ["bad.json", "bounds['purpose']"]),
    (None, ("--cost", "encoded", "--immutable", "age"), "--immutable", ["DataCost"]),
    (None, ("--cost", "auto", "--immutable", "agee"), "--immutable", ["'age'"]),
    (None, ("--cost", "auto", "--features"), "--features", ["DataCost"]),
    ('{}', ("--cost", "encoded"), "--cost-file", ["contradict"]),
])
def test_cli_bad_cost_input_names_the_argument(files, capsys, content, args, arg, words):
    d = files
    extra = list(args)
    if content is not None:
        (d / "bad.json").write_text(content)
        extra = ["--cost-file", str(d / "bad.json"), *extra]
    capsys.readouterr()
    assert _certify(d, *extra) == 2
    err = capsys.readouterr().err
    assert f"argument {arg}:" in err and err.count("\n") == 1, err
    for w in words:
        assert w in err, (w, err)


def _small(n=60, classes=2):
    rng = np.random.default_rng(5)
    X = pd.DataFrame({"a": rng.normal(size=n), "k": rng.integers(0, 6, n),
                      "colour": rng.choice(["red", "green", "blue"], n)})
    s = X["a"] + 0.5 * X["k"] - 1.5 + (X["colour"] == "red") * 1.0
    y = (s + rng.normal(size=n) > 0).astype(int) if classes == 2 else \
        pd.Series(rng.integers(0, classes, n))
    pipe = Pipeline([("pre", ColumnTransformer([("num", StandardScaler(), ["a", "k"]),
                                                ("cat", OneHotEncoder(), ["colour"])])),
                     ("clf", LogisticRegression())]).fit(X, y)
    return pipe, X, y


@pytest.mark.parametrize("case", ["hinge", "hinge-chi2", "weighted", "multiclass", "movable",
                                  "unreachable"])
def test_round_trip_of_every_datacost_path(case, tmp_path):
    """Each DataCost path gives a certificate that verifies, Q* file included (the weighted
    0/1 result records its weights, as certify's other paths do)."""
    pipe, X, y = _small(classes=3 if case == "multiclass" else 2)
    kw = {"hinge": dict(loss="hinge", r=0.8),
          "hinge-chi2": dict(loss="hinge", r=0.8, divergence="chi2"),
          "weighted": dict(loss="zero_one", r=0.4),
          "multiclass": dict(loss="zero_one", r=0.8),
          "movable": dict(loss="zero_one", r=0.4, features=["a", "colour"]),
          "unreachable": dict(loss="zero_one", r=0.4, theta1=np.inf, theta2=np.inf)}[case]
    sw = np.random.default_rng(1).uniform(0.5, 2.0, len(y)) if case == "weighted" else None
    cost = DataCost(bounds={"k": (0, 8)}, switch={"colour": 0.5})
    res = otstab.certify(pipe, X, y, cost=cost, sample_weight=sw, **kw)
    q = C.write_qstar(res, tmp_path / "q.csv")
    cert = C.make_certificate(res, pipe, X, y, qstar=q, sample_weight=sw,
                              movable=kw.get("features"))
    rep = C.verify_certificate(cert, pipe, X, y, qstar=tmp_path / "q.csv", sample_weight=sw,
                               cost=cost)
    assert rep.ok, rep.summary()
    if case == "weighted":
        assert res.info["sample_weight"] is not None
    if case == "movable":  # the variables left out are immutable in the stored spec
        assert "k" in cert["inputs"]["cost"]["spec"]["immutable"]
