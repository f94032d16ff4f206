"""Tests of the ``otstab`` command line (otstab.cli): demo, certify, verify, exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("jsonschema")

import otstab  # noqa: E402
from otstab import certificate as C  # noqa: E402
from otstab.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
try:
    import pyarrow  # noqa: F401

    HAS_PYARROW = True
except ImportError:  # Parquet is optional
    HAS_PYARROW = False


def run(argv):
    """main(argv) in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def run_subprocess(argv, cwd):
    proc = subprocess.run([sys.executable, "-m", "otstab", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "otstab-demo"
    code, stdout, stderr = run(["demo", "--out", out])
    assert code == 0, stderr
    return out, stdout


def verify_args(d: Path, cert=None, model=None, data=None):
    return ["verify", cert or d / "certificate.json", "--model", model or d / "model.joblib",
            "--data", data or d / "eval.csv", "--target", "income", "--trust-model"]


# ------------------------------------------------------------------------------------------
# demo


def test_demo_writes_everything_and_prints_the_certificate(demo):
    out, stdout = demo
    for name in ("certificate.json", "report.html", "model.joblib", "eval.csv"):
        assert (out / name).is_file(), name
    cert = json.loads((out / "certificate.json").read_text())
    C.validate_certificate(cert)
    inp, res = cert["inputs"], cert["results"]
    assert inp["loss"]["name"] == "zero_one"
    assert (inp["r"], inp["theta1"], inp["theta2"]) == (0.4, 1.0, 0.25)
    assert inp["data"]["n_samples"] == 2000 and inp["data"]["target"] == "income"
    assert cert["solver"]["status"] == "optimal"
    assert res["risk_star"] == pytest.approx(0.4, abs=1e-9)
    assert res["gap"] < 1e-6
    # the printed summary shows the certified value, and the top feature
    assert f"{res['value']:.6g}" in stdout
    top = res["feature_stability"]["table"][0]["feature"]
    assert top in stdout
    # one-hot blocks are scored as one variable (groups from datasets.feature_groups)
    groups = res["feature_stability"]["groups"]
    assert "race" in groups and all(c.startswith("race: ") for c in groups["race"])
    assert "race" in [row["feature"] for row in res["feature_stability"]["table"]]
    # eval.csv holds the evaluation data with the target column
    df = pd.read_csv(out / "eval.csv")
    assert df.shape == (2000, inp["data"]["n_features"] + 1) and "income" in df.columns
    assert "otstab verify" in stdout


def test_demo_value_matches_the_library(demo):
    """The demo's certificate is the library's answer on the same model and data."""
    out, _ = demo
    cert = json.loads((out / "certificate.json").read_text())
    model = joblib.load(out / "model.joblib")
    df = pd.read_csv(out / "eval.csv")
    res = otstab.certify(model, df.drop(columns="income"), df["income"], loss="zero_one",
                         r=0.4, theta1=1.0, theta2=0.25)
    assert cert["results"]["value"] == pytest.approx(res.value, rel=1e-12)


def test_demo_verifies_in_a_subprocess(demo):
    out, _ = demo
    code, stdout, stderr = run_subprocess(verify_args(out), cwd=out.parent)
    assert code == 0, stderr
    assert stdout.startswith("OK")


def test_demo_verifies_in_process(demo):
    out, _ = demo
    code, stdout, stderr = run(verify_args(out))
    assert code == 0, stderr
    assert "OK: the certificate reproduces" in stdout
    # --target defaults to the certificate's
    code, _, _ = run(["verify", out / "certificate.json", "--model", out / "model.joblib",
                      "--data", out / "eval.csv", "--trust-model"])
    assert code == 0


# ------------------------------------------------------------------------------------------
# tampering


def test_tampered_number_fails(demo, tmp_path):
    out, _ = demo
    cert = json.loads((out / "certificate.json").read_text())
    cert["results"]["risk_base"] = cert["results"]["risk_base"] + 0.001
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps(cert))
    code, stdout, stderr = run(verify_args(out, cert=bad))
    assert code == 1
    assert "FAILED" in stderr and "results.risk_base" in stderr
    assert "Traceback" not in stderr


def test_tampered_data_row_fails(demo, tmp_path):
    out, _ = demo
    df = pd.read_csv(out / "eval.csv")
    df.loc[17, "age"] += 1.0
    bad = tmp_path / "eval.csv"
    df.to_csv(bad, index=False)
    code, _, stderr = run(verify_args(out, data=bad))
    assert code == 1
    assert "inputs.data.sha256" in stderr and "evaluation data differ" in stderr


def test_tampered_model_fails(demo, tmp_path):
    out, _ = demo
    model = joblib.load(out / "model.joblib")
    model.coef_ = model.coef_.copy()
    model.coef_[0, 0] *= 1.1
    bad = tmp_path / "model.joblib"
    joblib.dump(model, bad)
    code, _, stderr = run(verify_args(out, model=bad))
    assert code == 1
    assert "inputs.model.sha256" in stderr and "model differs" in stderr


def test_verify_bad_certificate_is_bad_input(demo, tmp_path):
    out, _ = demo
    bad = tmp_path / "c.json"
    bad.write_text('{"format": "otstab-certificate", "version": 7}')
    code, _, stderr = run(verify_args(out, cert=bad))
    assert code == 2
    assert stderr.count("\n") == 1 and "argument CERT" in stderr and "version" in stderr


# ------------------------------------------------------------------------------------------
# bad input: exit 2, one line naming the argument, no traceback


def _one_line(stderr: str, arg: str):
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert f"argument {arg}" in lines[0], lines[0]


def test_missing_target_column(demo):
    out, _ = demo
    code, _, stderr = run(["certify", "--trust-model", "--model", out / "model.joblib", "--data",
                           out / "eval.csv", "--target", "salary", "--r", "0.3"])
    assert code == 2
    _one_line(stderr, "--target")
    assert "'salary'" in stderr and "did you mean" not in stderr
    # a misspelt column gets the close names, as features= does
    code, _, stderr = run(["certify", "--trust-model", "--model", out / "model.joblib", "--data",
                           out / "eval.csv", "--target", "incomee", "--r", "0.3"])
    assert code == 2
    _one_line(stderr, "--target")
    assert "did you mean 'income'?" in stderr


def test_non_numeric_features(demo, tmp_path):
    out, _ = demo
    df = pd.read_csv(out / "eval.csv")
    df["age"] = np.where(df["age"] > 0, "old", "young")
    path = tmp_path / "strings.csv"
    df.to_csv(path, index=False)
    code, _, stderr = run(["certify",
                           "--trust-model", "--model", out / "model.joblib", "--data", path,
                           "--target", "income", "--r", "0.3"])
    assert code == 2
    _one_line(stderr, "--data")
    assert "non-numeric" in stderr and "age" in stderr


def test_model_file_that_is_not_a_model(demo, tmp_path):
    out, _ = demo
    code, _, stderr = run(["certify",
                           "--trust-model", "--model", out / "eval.csv", "--data", out / "eval.csv",
                           "--target", "income", "--r", "0.3"])
    assert code == 2
    _one_line(stderr, "--model")
    joblib.dump({"coef": [1, 2]}, tmp_path / "dict.joblib")
    code, _, stderr = run(["certify",
                           "--trust-model", "--model", tmp_path / "dict.joblib", "--data",
                           out / "eval.csv", "--target", "income", "--r", "0.3"])
    assert code == 2
    _one_line(stderr, "--model")
    assert "not a fitted model" in stderr
    code, _, stderr = run(["certify",
                           "--trust-model", "--model", tmp_path / "nothing.joblib", "--data",
                           out / "eval.csv", "--target", "income", "--r", "0.3"])
    assert code == 2
    _one_line(stderr, "--model")


@pytest.mark.parametrize("r", ["1.5", "-0.1"])
def test_r_outside_unit_interval_for_zero_one(demo, r):
    out, _ = demo
    code, _, stderr = run(["certify", "--trust-model", "--model", out / "model.joblib", "--data",
                           out / "eval.csv", "--target", "income", "--r", r])
    assert code == 2
    _one_line(stderr, "--r")


def test_bad_input_in_a_subprocess_has_no_traceback(demo):
    out, _ = demo
    code, stdout, stderr = run_subprocess(
        ["certify",
         "--trust-model", "--model", out / "model.joblib", "--data", out / "eval.csv", "--target",
         "income", "--r", "1.5"], cwd=out.parent)
    assert code == 2
    _one_line(stderr, "--r")
    assert stderr.startswith("otstab certify: error:")


@pytest.mark.parametrize("argv, arg", [
    (["--theta1", "abc"], "--theta1"),
    (["--theta2", "0"], "--theta2"),
    (["--loss", "nonsense"], "--loss"),
    (["--loss", "absolute"], "--loss"),
    (["--divergence", "tv"], "--divergence"),
    (["--movable", "no-such-column"], "--movable"),
])
def test_other_bad_arguments(demo, argv, arg):
    out, _ = demo
    code, _, stderr = run(["certify", "--trust-model", "--model", out / "model.joblib", "--data",
                           out / "eval.csv", "--target", "income", "--r", "0.3", *argv])
    assert code == 2
    _one_line(stderr, arg)


def test_missing_required_argument():
    code, _, stderr = run(["certify", "--model", "m", "--data", "d", "--target", "t"])
    assert code == 2
    assert stderr.strip().splitlines() == [
        "otstab certify: error: the following arguments are required: --r "
        "(see otstab certify --help)"]


def test_solver_failure_exits_3(demo, monkeypatch):
    out, _ = demo
    from otstab.errors import SolverError

    def failing(*args, **kwargs):
        raise SolverError("no solver produced a trustworthy answer")

    monkeypatch.setattr(otstab, "certify", failing)
    code, _, stderr = run(["certify", "--trust-model", "--model", out / "model.joblib", "--data",
                           out / "eval.csv", "--target", "income", "--r", "0.3"])
    assert code == 3
    assert "solver failure" in stderr and "Traceback" not in stderr


# ------------------------------------------------------------------------------------------
# certify


QSTAR_FORMATS = [
    "csv",
    pytest.param("parquet", marks=pytest.mark.skipif(
        not HAS_PYARROW, reason="Parquet files need pyarrow (pip install pyarrow)")),
]


@pytest.mark.parametrize("fmt", QSTAR_FORMATS)
def test_certify_writes_json_html_qstar_and_verifies(demo, tmp_path, fmt):
    out, _ = demo
    qfile = tmp_path / f"q.{fmt}"
    argv = ["certify", "--trust-model", "--model", out / "model.joblib", "--data", out / "eval.csv",
            "--target", "income", "--loss", "hinge", "--r", "0.6", "--theta1", "2",
            "--theta2", "inf", "--json", tmp_path / "c.json", "--html", tmp_path / "r.html",
            "--qstar", qfile, "--features", "--top", "3"]
    code, stdout, stderr = run(argv)
    assert code == 0, stderr
    cert = json.loads((tmp_path / "c.json").read_text())
    C.validate_certificate(cert)
    assert cert["inputs"]["theta2"] == "inf" and cert["inputs"]["theta1"] == 2.0
    assert cert["inputs"]["loss"]["name"] == "hinge"
    assert cert["qstar"]["file"] == qfile.name and cert["qstar"]["format"] == fmt
    assert cert["results"]["feature_stability"] is not None
    assert (tmp_path / "r.html").stat().st_size > 1000
    assert "Most sensitive features" in stdout
    code, stdout, stderr = run(verify_args(out, cert=tmp_path / "c.json") +
                               ["--qstar", qfile])
    assert code == 0, stderr
    assert "qstar (independent audit)" in C.verify_certificate(
        cert, joblib.load(out / "model.joblib"), *_xy(out), qstar=qfile
    ).checked


def _xy(out):
    df = pd.read_csv(out / "eval.csv")
    return df.drop(columns="income"), df["income"]


def test_certify_unreachable_threshold_is_an_answer(demo, tmp_path):
    out, _ = demo
    code, stdout, _ = run(["certify", "--trust-model", "--model", out / "model.joblib", "--data",
                           out / "eval.csv", "--target", "income", "--r", "0.3",
                           "--theta1", "inf", "--theta2", "inf", "--json", tmp_path / "c.json"])
    assert code == 0
    cert = json.loads((tmp_path / "c.json").read_text())
    assert cert["results"]["value"] == "inf" and cert["solver"]["status"] == "unreachable"
    assert math.isinf(float(cert["results"]["value"]))


def test_certify_movable_subset(demo, tmp_path):
    out, _ = demo
    code, _, stderr = run(["certify", "--trust-model", "--model", out / "model.joblib", "--data",
                           out / "eval.csv", "--target", "income", "--r", "0.3", "--movable",
                           "age", "hours-per-week", "--json", tmp_path / "c.json", "--quiet"])
    assert code == 0, stderr
    cert = json.loads((tmp_path / "c.json").read_text())
    assert cert["inputs"]["movable_features"] == ["age", "hours-per-week"]
    code, _, stderr = run(verify_args(out, cert=tmp_path / "c.json"))
    assert code == 0, stderr


# ------------------------------------------------------------------------------------------
# help


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["certify", "--help"],
                                  ["verify", "--help"]])
def test_help(argv):
    code, stdout, _ = run(argv)
    assert code == 0
    assert "usage: otstab" in stdout


def test_version_and_module_entry_point():
    code, stdout, _ = run(["--version"])
    assert code == 0 and otstab.__version__ in stdout
    assert (ROOT / "otstab" / "__main__.py").is_file()


def test_console_script_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'otstab = "otstab.cli:main"' in text
    if shutil.which("otstab"):
        proc = subprocess.run(["otstab", "--version"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and otstab.__version__ in proc.stdout


def test_pipeline_with_one_hot_encoder_groups_its_columns(tmp_path):
    from sklearn.compose import make_column_transformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rng = np.random.default_rng(0)
    n = 300
    df = pd.DataFrame({"color": rng.choice(["red", "green", "blue"], n),
                       "size_x": rng.normal(size=n), "weight": rng.normal(size=n)})
    df["label"] = ((df["color"] == "red") + df["size_x"] + 0.5 * rng.normal(size=n) > 0.5)
    df["label"] = df["label"].astype(int)
    pipe = make_pipeline(
        make_column_transformer((OneHotEncoder(sparse_output=False), ["color"]),
                                (StandardScaler(), ["size_x", "weight"])),
        LogisticRegression()).fit(df.drop(columns="label"), df["label"])
    joblib.dump(pipe, tmp_path / "pipe.joblib")
    df.to_csv(tmp_path / "data.csv", index=False)
    code, stdout, stderr = run(["certify",
                                "--trust-model", "--model", tmp_path / "pipe.joblib", "--data",
                                tmp_path / "data.csv", "--target", "label", "--r", "0.4",
                                "--features", "--json", tmp_path / "c.json"])
    assert code == 0, stderr
    cert = json.loads((tmp_path / "c.json").read_text())
    assert cert["inputs"]["model"]["pipeline"][-1]["class"].endswith("LogisticRegression")
    groups = cert["results"]["feature_stability"]["groups"]
    # every raw column is one feature, named as in the data (one-hot block grouped)
    assert groups == {"color": ["onehotencoder__color_blue", "onehotencoder__color_green",
                                "onehotencoder__color_red"],
                      "size_x": ["standardscaler__size_x"],
                      "weight": ["standardscaler__weight"]}
    scored = {row["feature"] for row in cert["results"]["feature_stability"]["table"]}
    assert scored == {"color", "size_x", "weight"}
    # the raw data (strings included) verify against the certificate
    code, _, stderr = run(["verify", tmp_path / "c.json", "--model", tmp_path / "pipe.joblib",
                           "--data", tmp_path / "data.csv", "--trust-model"])
    assert code == 0, stderr
    # --groups none scores every column alone
    code, _, _ = run(["certify", "--trust-model", "--model", tmp_path / "pipe.joblib", "--data",
                      tmp_path / "data.csv", "--target", "label", "--r", "0.4",
                      "--features", "--groups", "none", "--json", tmp_path / "c2.json"])
    assert code == 0
    cert2 = json.loads((tmp_path / "c2.json").read_text())
    assert cert2["results"]["feature_stability"]["groups"] is None
    assert len(cert2["results"]["feature_stability"]["table"]) == 5


# ------------------------------------------------------------------------------------------
# untrusted model files and tolerances


class _WritesAFile:
    """Unpickling this calls open(path, "w"): a stand-in for arbitrary code in a model file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("suffix", [".joblib", ".pkl", ".pickle", ".bin"])
@pytest.mark.parametrize("command", ["verify", "certify"])
def test_pickle_is_never_loaded_without_trust_model(demo, tmp_path, suffix, command):
    out, _ = demo
    planted = tmp_path / "planted.txt"
    evil = tmp_path / f"evil{suffix}"
    joblib.dump(_WritesAFile(planted), evil)
    argv = ([*verify_args(out, model=evil)[:-1]] if command == "verify" else
            ["certify", "--model", evil, "--data", out / "eval.csv", "--target", "income",
             "--r", "0.3"])
    assert "--trust-model" not in map(str, argv)
    code, _, stderr = run(argv)
    assert code == 2
    _one_line(stderr, "--model")
    assert "--trust-model" in stderr
    assert not planted.exists()
    # the control: with the flag the same file does run its code (so the test can fail)
    code, _, stderr = run([*argv, "--trust-model"])
    assert planted.exists()
    assert code == 2 and "not a fitted model" in stderr


def test_skops_model_loads_without_trust_model(demo, tmp_path):
    sio = pytest.importorskip("skops.io", reason="skops is optional (pip install skops)")
    out, _ = demo
    model = joblib.load(out / "model.joblib")
    sio.dump(model, tmp_path / "model.skops")
    code, stdout, stderr = run(verify_args(out, model=tmp_path / "model.skops")[:-1])
    assert code == 0, stderr
    assert "OK" in stdout


@pytest.mark.parametrize("option", ["--rtol", "--atol", "--h-rtol", "--gap-tol"])
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc"])
def test_verify_rejects_bad_tolerances(demo, option, value):
    out, _ = demo
    code, _, stderr = run([*verify_args(out), option, value])
    assert code == 2
    _one_line(stderr, option)


def test_demo_suggests_trust_model_for_its_own_file(demo):
    out, stdout = demo
    line = next(ln for ln in stdout.splitlines() if ln.startswith("reproduce with:"))
    assert line.endswith("--trust-model")
    assert "the model file this demo has just written" in stdout
    assert "--trust-model" in (out / "report.html").read_text()
    # the suggested command, run as printed, reproduces the certificate
    code, stdout, stderr = run(line.split()[3:])
    assert code == 0, stderr


def test_tampered_fields_a_reader_sees_fail_in_the_cli(demo, tmp_path):
    """Fields that verified OK before (excess risk, model class, label counts, a feature's
    share) and a duplicated key now fail; exit 1 for a mismatch, 2 for a malformed file."""
    out, _ = demo
    cert = json.loads((out / "certificate.json").read_text())
    edits = {
        "results.excess_risk": lambda c: c["results"].update(excess_risk=0.5),
        "inputs.model.class": lambda c: c["inputs"]["model"].update({"class": "a.B"}),
        "inputs.data.label_counts": lambda c: c["inputs"]["data"]["label_counts"].update(
            {"0": 1}),
        "share_moving": lambda c: c["results"]["feature_stability"]["table"][0].update(
            share_moving=0.5),
    }
    for field_, edit in edits.items():
        bad = json.loads(json.dumps(cert))
        edit(bad)
        (tmp_path / "c.json").write_text(json.dumps(bad))
        code, _, stderr = run(verify_args(out, cert=tmp_path / "c.json"))
        assert code == 1 and field_ in stderr, (field_, stderr)
    text = (out / "certificate.json").read_text()
    (tmp_path / "c.json").write_text(text.replace('"format"', '"exact": false,\n  "format"', 1)
                                     .replace('"exact"', '"created"', 1))
    code, _, stderr = run(verify_args(out, cert=tmp_path / "c.json"))
    assert code == 2 and "twice" in stderr


# ------------------------------------------------------------------------------------------
# pipelines on raw data and the CI gate (issue 15)


@pytest.fixture(scope="module")
def german_files(tmp_path_factory):
    """A ColumnTransformer Pipeline fitted on the raw German credit file, saved with joblib."""
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    d = tmp_path_factory.mktemp("german")
    df = otstab.datasets.load_german(raw=True)
    X, y = df.drop(columns="credit"), df["credit"]
    num = [c for c in X.columns if X[c].dtype.kind in "if"]
    cat = [c for c in X.columns if c not in num]
    ct = ColumnTransformer([("num", StandardScaler(), num),
                            ("cat", OneHotEncoder(handle_unknown="ignore"), cat)])
    model = Pipeline([("pre", ct), ("clf", LogisticRegression(max_iter=2000))]).fit(X, y)
    joblib.dump(model, d / "model.joblib")
    df.to_csv(d / "german.csv", index=False)
    res = otstab.certify(model, X, y, loss="zero_one", cost="encoded", r=0.4)
    base = ["certify", "--model", d / "model.joblib", "--data", d / "german.csv", "--target",
            "credit", "--trust-model", "--r", "0.4", "--cost", "encoded"]
    return d, base, res, list(X.columns)


def test_default_cost_is_the_librarys(german_files):
    """Without --cost the CLI certifies under the cost otstab.certify(cost=None) chooses (a
    DataCost for this encoded Pipeline on raw columns), names it, and keeps the encoded cost
    for --features, which is computed under it."""
    d, base, res, _ = german_files
    model = joblib.load(d / "model.joblib")
    df = otstab.datasets.load_german(raw=True)
    lib = otstab.certify(model, df.drop(columns="credit"), df["credit"], loss="zero_one",
                         r=0.4)
    assert lib.info["cost_used"].startswith("auto")
    assert abs(lib.value - res.value) > 1e-3 * res.value  # (the two costs differ here)
    plain = base[:base.index("--cost")]
    code, out, err = run([*plain, "--json", "-"])
    assert code == 0, err
    cert = json.loads(out)
    assert cert["results"]["value"] == pytest.approx(lib.value, rel=1e-9)
    assert cert["inputs"]["cost"] is not None
    code, out, err = run(plain)
    assert code == 0 and "transport cost       auto" in out and "DataCost" in out, out
    code, out, err = run([*plain, "--json", "-", "--features"])
    assert code == 0, err
    assert json.loads(out)["results"]["value"] == pytest.approx(res.value, rel=1e-12)


def test_fail_under_gates_on_the_value(german_files):
    d, base, res, _ = german_files
    assert res.status == "optimal"
    code, out, err = run([*base, "--fail-under", res.value * 0.5, "--quiet"])
    assert (code, out, err) == (0, "", "")  # --quiet: nothing on success
    code, out, err = run([*base, "--fail-under", res.value * 2, "--quiet"])
    assert code == 5 and out == "" and "gate failed" in err
    # with --confidence the gate is on the lower confidence bound (below the value)
    lcb = res.lower_confidence_bound(0.95)
    assert lcb < res.value
    mid = (lcb + res.value) / 2
    assert run([*base, "--fail-under", mid, "--quiet"])[0] == 0
    code, _, err = run([*base, "--fail-under", mid, "--confidence", "0.95", "--quiet"])
    assert code == 5 and "lower_confidence_bound" in err


def test_gate_on_non_exact_answers():
    """bounds answers: gate on value_lower; straddling the threshold is 'not certified'."""
    from otstab.cli import EXIT_BELOW, EXIT_NOT_CERTIFIED, gate

    class R:  # the fields the gate reads (an answer with status bounds)
        status, value, value_lower, value_upper = "bounds", 2.0, 1.0, 2.0

        def lower_confidence_bound(self, level):
            return math.nan

    assert gate(R(), 0.5)["exit_code"] == 0
    assert gate(R(), 1.5)["exit_code"] == EXIT_NOT_CERTIFIED  # 1 <= R <= 2: unknown
    assert gate(R(), 3.0)["exit_code"] == EXIT_BELOW  # R <= 2 < 3: proven below
    assert gate(R(), 0.5, require_exact=True)["exit_code"] == EXIT_NOT_CERTIFIED
    assert gate(R(), 0.5, confidence=0.9)["exit_code"] == EXIT_NOT_CERTIFIED  # no bound


def test_json_to_stdout_card_and_verify_json(german_files):
    d, base, res, raw_cols = german_files
    code, out, err = run([*base, "--json", "-", "--features"])
    assert code == 0, err
    cert = json.loads(out)  # stdout holds the certificate only
    C.validate_certificate(cert)
    assert cert["results"]["value"] == pytest.approx(res.value, rel=1e-12)
    assert not (Path.cwd() / "-").exists()
    # auto groups: the feature table is named by the raw columns
    table = cert["results"]["feature_stability"]["table"]
    assert sorted(r["feature"] for r in table) == sorted(raw_cols)
    (d / "cert.json").write_text(out)
    code, out, err = run(["verify", d / "cert.json", "--model", d / "model.joblib", "--data",
                          d / "german.csv", "--trust-model", "--json"])
    rep = json.loads(out)
    assert code == 0 and rep["ok"] is True and rep["mismatches"] == []
    assert rep["recomputed"]["value"] == pytest.approx(res.value, rel=1e-9)
    # a tampered value: verify --json still parses, with the mismatch and exit 1
    bad = dict(cert, results=dict(cert["results"], value=cert["results"]["value"] * 1.5))
    (d / "bad.json").write_text(json.dumps(bad))
    code, out, _ = run(["verify", d / "bad.json", "--model", d / "model.joblib", "--data",
                        d / "german.csv", "--trust-model", "--json", "--no-features"])
    rep = json.loads(out)
    assert code == 1 and not rep["ok"]
    assert "results.value" in {m["field"] for m in rep["mismatches"]}
    code, out, err = run([*base, "--fail-under", "0", "--card", "-"])
    card = json.loads(out)
    assert card["result"]["R"] == pytest.approx(res.value, rel=1e-12)
    assert card["policy"]["passed"] is True and card["policy"]["threshold"] == 0
    code, _, _ = run([*base, "--card", d / "card.md"])
    assert code == 0 and "| R |" in (d / "card.md").read_text()


def test_qstar_raw_file_is_in_the_data_units(german_files):
    d, base, res, raw_cols = german_files
    code, _, err = run([*base, "--qstar-raw", d / "q.csv", "--quiet"])
    assert code == 0, err
    q = pd.read_csv(d / "q.csv")
    raw = pd.read_csv(d / "german.csv")
    for c in raw_cols:
        assert f"{c}*" in q.columns
    assert set(q["purpose*"]) <= set(raw["purpose"])
    # unmoved atoms keep the file's numbers exactly
    still = q["distance2"] == 0
    np.testing.assert_array_equal(q.loc[still, "amount*"],
                                  raw["amount"].to_numpy()[q.loc[still, "source"]])


def test_unknown_raw_feature_suggests_the_encoded_name(german_files):
    d, base, res, _ = german_files
    code, _, err = run([*base, "--movable", "durration"])
    assert code == 2 and "num__duration" in err and "--movable" in err


# ------------------------------------------------------------------------------------------
# --feature-costs and --sample-weight (issue 15)


def _gate_brackets(base, value, *extra):
    """The CLI's R, read through the gate: above value (1 - 1e-9), below value (1 + 1e-9)."""
    lo = run([*base, *extra, "--fail-under", value * (1 - 1e-9), "--quiet"])
    hi = run([*base, *extra, "--fail-under", value * (1 + 1e-9), "--quiet"])
    assert lo[0] == 0, lo[2]
    assert hi[0] == 5, hi[2]


def _german_xy(d):
    df = pd.read_csv(d / "german.csv")
    return df.drop(columns="credit"), df["credit"]


@pytest.mark.parametrize("form", ["pairs", "json", "file"])
def test_feature_costs_by_raw_name_equal_the_library(german_files, form):
    d, base, res, _ = german_files
    model = joblib.load(d / "model.joblib")
    X, y = _german_xy(d)
    costs = {"age": math.inf, "duration": 2.0, "purpose": 0.5}
    ref = otstab.certify(model, X, y, loss="zero_one", r=0.4, feature_costs=costs)
    assert ref.value != pytest.approx(res.value, rel=1e-3)  # the prices matter
    text = {"pairs": "age=inf, duration=2,purpose=0.5",
            "json": '{"age": Infinity, "duration": 2, "purpose": "0.5"}'}.get(form)
    if form == "file":
        (d / "costs.json").write_text('{"age": "inf", "duration": 2.0, "purpose": 0.5}')
        text = d / "costs.json"
    _gate_brackets(base, ref.value, "--feature-costs", text)


def test_feature_costs_reach_the_feature_table(german_files):
    d, base, _, _ = german_files
    model = joblib.load(d / "model.joblib")
    X, y = _german_xy(d)
    costs = {"age": math.inf, "duration": 2.0}
    table = otstab.feature_stability(model, X, y, loss="zero_one", r=0.4, feature_groups="auto",
                                     feature_costs=costs).to_frame()
    code, out, err = run([*base, "--feature-costs", "age=inf,duration=2", "--features",
                          "--top", "3"])
    assert code == 0, err
    lines = out.split("Most sensitive features")[1].strip().splitlines()[2:5]
    assert [ln.split()[1] for ln in lines] == list(table["feature"][:3])
    assert [float(ln.split()[2]) for ln in lines] == pytest.approx(
        list(table["score"][:3]), rel=1e-3)  # printed with 4 significant digits


@pytest.mark.parametrize("text, match", [
    ("durration=2", "did you mean 'duration'"),
    ("duration=0", r"\(0, inf\]"),
    ("duration=abc", "expected a number"),
    ("duration", "cannot read"),
    ("{not json", "JSON"),
    ("duration=1,duration=2", "twice"),
])
def test_bad_feature_costs_are_one_line_naming_the_flag(german_files, text, match):
    _, base, _, _ = german_files
    code, _, err = run([*base, "--feature-costs", text])
    assert code == 2
    _one_line(err, "--feature-costs")
    assert re.search(match, err), err


def test_verify_reproduces_the_priced_certificate(german_files, tmp_path):
    """The certificate records the prices it was solved with (per model input column: a raw
    numeric column priced per raw unit is c s^2 per unit of its StandardScaler output) and
    verify recomputes with them, the feature table included; a tampered price fails."""
    d, base, _, _ = german_files
    model = joblib.load(d / "model.joblib")
    X, y = _german_xy(d)
    costs = {"age": math.inf, "duration": 2.0}
    ref = otstab.certify(model, X, y, loss="zero_one", r=0.4, feature_costs=costs)
    code, _, err = run([*base, "--feature-costs", "age=inf,duration=2", "--features",
                        "--json", tmp_path / "c.json", "--qstar", tmp_path / "q.csv", "--quiet"])
    assert code == 0, err
    cert = json.loads((tmp_path / "c.json").read_text())
    assert cert["results"]["value"] == pytest.approx(ref.value, rel=1e-12)
    names = [str(c) for c in ref.feature_names]
    prices = dict(zip(names, cert["inputs"]["feature_costs"]))
    scaler = model.named_steps["pre"].named_transformers_["num"]
    num = list(scaler.feature_names_in_)
    s_duration = scaler.scale_[num.index("duration")]
    assert prices["num__age"] == "inf"
    assert prices["num__duration"] == pytest.approx(2.0 * s_duration**2, rel=1e-12)
    assert all(v == 1.0 for k, v in prices.items() if k not in ("num__age", "num__duration"))
    verify = ["verify", tmp_path / "c.json", "--model", d / "model.joblib", "--data",
              d / "german.csv", "--trust-model"]
    code, out, err = run([*verify, "--qstar", tmp_path / "q.csv"])
    assert code == 0, out + err
    assert "inputs.feature_costs" not in out + err
    # a tampered price: the recomputed value (and the feature table) no longer reproduce
    j = names.index("num__duration")
    bad = json.loads((tmp_path / "c.json").read_text())
    bad["inputs"]["feature_costs"][j] = 1.0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, _, err = run(["verify", tmp_path / "bad.json", *verify[2:]])
    assert code == 1 and "results.value" in err
    # an immutable feature made movable: the Q* file moves nothing it may not, but the value
    # and the priced cost of the stored Q* differ
    bad["inputs"]["feature_costs"][j] = cert["inputs"]["feature_costs"][j]
    bad["inputs"]["feature_costs"][names.index("num__age")] = 1.0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, _, err = run(["verify", tmp_path / "bad.json", *verify[2:], "--no-features"])
    assert code == 1 and "results.value" in err


@pytest.fixture(scope="module")
def weighted_file(german_files):
    d, base, _, _ = german_files
    df = pd.read_csv(d / "german.csv")
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(df))
    df.insert(2, "w", w)
    df.to_csv(d / "weighted.csv", index=False, float_format="%.17g")
    i = base.index("--data")
    wbase = [*base[:i + 1], d / "weighted.csv", *base[i + 2:]]
    return d, wbase, df


def test_sample_weight_column_equals_the_library(weighted_file):
    d, wbase, df = weighted_file
    model = joblib.load(d / "model.joblib")
    X, y = df.drop(columns=["credit", "w"]), df["credit"]
    ref = otstab.certify(model, X, y, loss="zero_one", cost="encoded", r=0.4, sample_weight=df["w"])
    unweighted = otstab.certify(model, X, y, loss="zero_one", cost="encoded", r=0.4)
    assert ref.value != pytest.approx(unweighted.value, rel=1e-4)  # the weights matter
    _gate_brackets(wbase, ref.value, "--sample-weight", "w")
    # with prices too
    both = otstab.certify(model, X, y, loss="zero_one", cost="encoded", r=0.4,
                          sample_weight=df["w"], feature_costs={"age": math.inf})
    _gate_brackets(wbase, both.value, "--sample-weight", "w", "--feature-costs", "age=inf")


def test_bad_sample_weight_column(weighted_file, tmp_path):
    d, wbase, df = weighted_file
    code, _, err = run([*wbase, "--sample-weight", "weight"])
    assert code == 2 and "'weight'" in err
    _one_line(err, "--sample-weight")
    bad = df.copy()
    bad.loc[7, "w"] = np.nan
    bad.to_csv(tmp_path / "nan.csv", index=False)
    i = wbase.index("--data")
    code, _, err = run([*wbase[:i + 1], tmp_path / "nan.csv", *wbase[i + 2:],
                        "--sample-weight", "w"])
    assert code == 2 and "row 7" in err
    _one_line(err, "--sample-weight")
    bad.loc[7, "w"] = -1.0
    bad.to_csv(tmp_path / "neg.csv", index=False)
    code, _, err = run([*wbase[:i + 1], tmp_path / "neg.csv", *wbase[i + 2:],
                        "--sample-weight", "w"])
    assert code == 2
    _one_line(err, "--sample-weight")


def test_weighted_certificate_verifies(weighted_file, tmp_path):
    d, wbase, df = weighted_file
    code, _, err = run([*wbase, "--sample-weight", "w", "--json", tmp_path / "c.json",
                        "--card", tmp_path / "card.json", "--qstar", tmp_path / "q.csv"])
    assert code == 0, err
    cert = json.loads((tmp_path / "c.json").read_text())
    sw = cert["inputs"]["sample_weight"]
    assert sw["source"] == "w" and sw["n_samples"] == len(df)
    assert sw["sha256"] == C.hash_weights(df["w"].to_numpy())
    # the weighted value, from the library on the same columns
    model = joblib.load(d / "model.joblib")
    ref = otstab.certify(model, df.drop(columns=["credit", "w"]), df["credit"], loss="zero_one",
                         cost="encoded", r=0.4, sample_weight=df["w"])
    assert cert["results"]["value"] == pytest.approx(ref.value, rel=1e-12)
    # verify reads the recorded weight column by default
    code, out, err = run(["verify", tmp_path / "c.json", "--model", d / "model.joblib",
                          "--data", d / "weighted.csv", "--trust-model",
                          "--qstar", tmp_path / "q.csv"])
    assert code == 0, out + err
    # the printed reproduce command names the weight column, and it runs
    cmd = json.loads((tmp_path / "card.json").read_text())["reproduce"]
    assert "--sample-weight w" in cmd
    argv = shlex.split(cmd)
    assert argv[:2] == ["otstab", "verify"]
    code, out, err = run(argv[1:])
    assert code == 0, out + err


def test_weighted_certificate_with_changed_weights_fails(weighted_file, tmp_path):
    """Another weight column (one weight changed), or the weights left out of the features
    under another name: exit 1 (a mismatch), naming the weights' fingerprint."""
    d, wbase, df = weighted_file
    code, _, err = run([*wbase, "--sample-weight", "w", "--json", tmp_path / "c.json"])
    assert code == 0, err
    changed = df.copy()
    changed.loc[3, "w"] = changed.loc[3, "w"] * 2
    changed.to_csv(tmp_path / "changed.csv", index=False, float_format="%.17g")
    verify = ["verify", tmp_path / "c.json", "--model", d / "model.joblib", "--trust-model"]
    code, out, err = run([*verify, "--data", tmp_path / "changed.csv"])
    assert code == 1 and "inputs.sample_weight.sha256" in err, out + err
    assert "inputs.data.sha256" not in err  # the features and labels are the certified ones
    # the same weights under another column name: --sample-weight names it
    renamed = df.rename(columns={"w": "weight"})
    renamed.to_csv(tmp_path / "renamed.csv", index=False, float_format="%.17g")
    code, _, err = run([*verify, "--data", tmp_path / "renamed.csv"])
    assert code == 2 and "'w'" in err
    _one_line(err, "--sample-weight")
    code, out, err = run([*verify, "--data", tmp_path / "renamed.csv", "--sample-weight",
                          "weight"])
    assert code == 0, out + err
    # weights given for an unweighted certificate are a mismatch too
    i = wbase.index("--data")
    code, _, err = run([*wbase[:i + 1], d / "german.csv", *wbase[i + 2:], "--json",
                        tmp_path / "u.json", "--quiet"])
    assert code == 0, err
    code, _, err = run(["verify", tmp_path / "u.json", *verify[2:], "--data",
                        d / "weighted.csv", "--sample-weight", "w"])
    assert code == 1 and "inputs.sample_weight" in err


def test_weighted_priced_certificate_with_features_verifies(weighted_file, tmp_path):
    """Both at once, as docs/guide.md shows them: the value and the feature table are the
    library's with the same weights and prices, and verify reproduces all of it."""
    d, wbase, df = weighted_file
    code, _, err = run([*wbase, "--sample-weight", "w", "--feature-costs", "age=inf,duration=2",
                        "--features", "--json", tmp_path / "c.json", "--quiet"])
    assert code == 0, err
    cert = json.loads((tmp_path / "c.json").read_text())
    model = joblib.load(d / "model.joblib")
    X, y = df.drop(columns=["credit", "w"]), df["credit"]
    kw = dict(loss="zero_one", r=0.4, sample_weight=df["w"],
              feature_costs={"age": math.inf, "duration": 2.0})
    ref = otstab.certify(model, X, y, **kw)
    assert cert["results"]["value"] == pytest.approx(ref.value, rel=1e-12)
    table = otstab.feature_stability(model, X, y, feature_groups="auto", **kw).to_frame()
    got = {r["feature"]: r["score"] for r in cert["results"]["feature_stability"]["table"]}
    assert got == pytest.approx(dict(zip(table["feature"], table["score"])), rel=1e-12)
    code, out, err = run(["verify", tmp_path / "c.json", "--model", d / "model.joblib",
                          "--data", d / "weighted.csv", "--trust-model"])
    assert code == 0, out + err
    assert "results.feature_stability" in C.verify_certificate(
        cert, model, X, y, sample_weight=df["w"]).checked


def _forest_files(tmp_path):
    # a small random forest on four features: the perturbation search is not exact there,
    # so the certificate's value_lower comes from the tree bound that the budgets cut
    from sklearn.ensemble import RandomForestClassifier  # noqa: PLC0415

    rng = np.random.default_rng(3)
    X = pd.DataFrame(rng.normal(size=(40, 4)).round(2), columns=["a", "b", "c", "e"])
    y = (X["a"] + X["b"] - 0.5 * X["c"] + 0.3 * rng.normal(size=40) > 0).astype(int)
    model = RandomForestClassifier(n_estimators=8, max_depth=3, random_state=0).fit(X, y)
    joblib.dump(model, tmp_path / "forest.joblib")
    X.assign(label=y).to_csv(tmp_path / "forest.csv", index=False)
    return model, X, y


def _forest_cmd(tmp_path):
    base = ["--trust-model", "--model", tmp_path / "forest.joblib", "--data",
            tmp_path / "forest.csv", "--target", "label"]
    return base, ["certify", *base, "--loss", "zero_one", "--r", "0.4", "--theta2", "0.5"]


def test_certify_node_budget_is_recorded_and_verified(tmp_path):
    model, X, y = _forest_files(tmp_path)
    base, cmd = _forest_cmd(tmp_path)
    # rtol=None: the node budget, not rtol, stops the search (the radius key makes the
    # bound tight within rtol long before 60 boxes on this forest)
    budgeted = otstab.certify(model, X, y, loss="zero_one", r=0.4, theta1=1.0, theta2=0.5,
                              node_budget=60, max_nodes=50, rtol=None)
    assert budgeted.info["lower_bound"]["stopped"] == "node_budget"
    assert budgeted.value_lower > 0
    code, _, stderr = run([*cmd, "--node-budget", "60", "--max-nodes", "50", "--rtol", "none",
                           "--json", tmp_path / "nb.json", "--quiet"])
    assert code == 0, stderr
    cert = json.loads((tmp_path / "nb.json").read_text())
    assert cert["inputs"]["solver_options"] == {"max_nodes": 50, "node_budget": 60,
                                                "rtol": None}
    assert cert["results"]["value_lower"] == budgeted.value_lower
    code, stdout, stderr = run(["verify", tmp_path / "nb.json", *base])
    assert code == 0, stdout + stderr
    # verify applies the recorded budgets: without them the bound (a real cut) differs
    cert["inputs"]["solver_options"] = {}
    (tmp_path / "none.json").write_text(json.dumps(cert))
    code, stdout, stderr = run(["verify", tmp_path / "none.json", *base])
    assert code == 1 and "results.value_lower" in stdout + stderr, stdout + stderr
    for flag in ("--node-budget", "--max-nodes", "--time-budget"):
        code, _, stderr = run([*cmd, flag, "-1"])
        assert code == 2 and flag in stderr


def test_certify_time_budget_is_recorded_and_verified_as_at_most(tmp_path):
    _forest_files(tmp_path)
    base, cmd = _forest_cmd(tmp_path)
    code, _, stderr = run([*cmd, "--time-budget", "0", "--json", tmp_path / "tb.json",
                           "--quiet"])
    assert code == 0, stderr
    cert = json.loads((tmp_path / "tb.json").read_text())
    # the budget cut the bound: the node budget that reproduces the cut is recorded too
    # (how many boxes ran before the deadline was seen depends on the search: the compiled
    # one checks it per batch, the NumPy one per sample)
    opts = cert["inputs"]["solver_options"]
    assert set(opts) == {"time_budget", "node_budget"} and opts["time_budget"] == 0.0
    assert isinstance(opts["node_budget"], int) and opts["node_budget"] >= 1
    assert f"node_budget={opts['node_budget']}" in cert["solver"]["message"]
    code, stdout, stderr = run(["verify", tmp_path / "tb.json", *base])
    assert code == 0, stdout + stderr
    assert "at least the recorded value_lower" in stdout + stderr


def test_certify_rtol_is_recorded_and_verified(tmp_path):
    model, X, y = _forest_files(tmp_path)
    base, cmd = _forest_cmd(tmp_path)
    loose = otstab.certify(model, X, y, loss="zero_one", r=0.4, theta1=1.0, theta2=0.5,
                           rtol=0.5)
    code, _, stderr = run([*cmd, "--rtol", "0.5", "--json", tmp_path / "rt.json", "--quiet"])
    assert code == 0, stderr
    cert = json.loads((tmp_path / "rt.json").read_text())
    assert cert["inputs"]["solver_options"] == {"rtol": 0.5}
    assert cert["results"]["value_lower"] == loose.value_lower
    assert loose.value_lower >= 0.5 * loose.value_upper
    code, stdout, stderr = run(["verify", tmp_path / "rt.json", *base])
    assert code == 0, stdout + stderr
    code, _, stderr = run([*cmd, "--rtol", "1.5"])
    assert code == 2 and "--rtol" in stderr, stderr
    # --rtol none: rtol=None (every sample gets max_nodes boxes), recorded as null
    full = otstab.certify(model, X, y, loss="zero_one", r=0.4, theta1=1.0, theta2=0.5,
                          rtol=None)
    code, _, stderr = run([*cmd, "--rtol", "None", "--json", tmp_path / "rn.json", "--quiet"])
    assert code == 0, stderr
    cert = json.loads((tmp_path / "rn.json").read_text())
    assert cert["inputs"]["solver_options"] == {"rtol": None}
    assert cert["results"]["value_lower"] == full.value_lower
    code, stdout, stderr = run(["verify", tmp_path / "rn.json", *base])
    assert code == 0, stdout + stderr
    code, _, stderr = run([*cmd, "--rtol", "nan"])
    assert code == 2 and "--rtol" in stderr, stderr


def test_tree_budget_flags_on_a_model_without_that_bound_name_the_flag(demo):
    out, _ = demo
    for flag, val in (("--time-budget", "5"), ("--node-budget", "10"), ("--max-nodes", "10"),
                      ("--rtol", "0.1")):
        code, _, stderr = run(["certify", "--trust-model", "--model", out / "model.joblib",
                               "--data", out / "eval.csv", "--target", "income", "--r", "0.3",
                               flag, val])
        assert code == 2 and f"argument {flag}:" in stderr, stderr
