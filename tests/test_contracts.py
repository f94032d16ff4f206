"""Model and data contracts, as in scikit-learn (issue 12): columns matched by name, one-vs-one
coefficient layouts refused, complex / text / duplicate-named input refused, label-type
mismatches in group_metrics refused.

Every expected value is recomputed from the model's own ``predict`` / ``decision_function`` or
from otstab on data the model already accepts (the correctly ordered frame).
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn")

from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.svm import SVC, NuSVC  # noqa: E402

import otstab  # noqa: E402
from otstab._validation import as_bool_vector, as_float_matrix, as_float_vector  # noqa: E402
from otstab.errors import InputTypeError, ValidationError  # noqa: E402
from otstab.modeling._models import per_sample_losses  # noqa: E402

COLS = ["age", "income", "debt", "score"]
KW = dict(r=0.45, theta1=1.0, theta2=0.5)


def _data(n=240, k=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, len(COLS))) * [10.0, 3.0, 1.0, 0.3] + [40.0, 5.0, 0.0, 0.0]
    w = rng.normal(size=(k, len(COLS))) / [10.0, 3.0, 1.0, 0.3]
    y = np.argmax((X - X.mean(0)) @ w.T + rng.normal(scale=2.0, size=(n, k)), axis=1)
    return pd.DataFrame(X, columns=COLS), y


def _same(a, b):
    """Bit-identical certificates."""
    assert a.value == b.value and a.risk_base == b.risk_base and a.risk_star == b.risk_star
    np.testing.assert_array_equal(a.X_star, b.X_star)
    np.testing.assert_array_equal(a.weights, b.weights)


# ------------------------------------------------------------------------------------------
# columns matched by name


@pytest.mark.parametrize("loss", ["zero_one", "multiclass_hinge"])
def test_reordered_frame_certifies_as_the_ordered_one(loss):
    df, y = _data()
    model = LogisticRegression(max_iter=5000).fit(df, y)
    shuffled = df[["score", "debt", "age", "income"]]
    before = shuffled.copy()
    with pytest.raises(ValueError, match="feature names"):  # scikit-learn refuses the order
        model.predict(shuffled)
    a = otstab.certify(model, df, y, loss=loss, **KW)
    b = otstab.certify(model, shuffled, y, loss=loss, **KW)
    _same(a, b)
    assert b.feature_names == list(model.feature_names_in_) == COLS
    pd.testing.assert_frame_equal(shuffled, before)  # the caller's frame is untouched
    if loss == "zero_one":
        assert b.risk_base == pytest.approx(1.0 - model.score(shuffled[COLS], y), abs=1e-12)


def test_reordered_frame_in_every_entry_point():
    df, y = _data(k=2)
    model = LogisticRegression(max_iter=5000).fit(df, y)
    shuffled = df[COLS[::-1]]
    kw = dict(loss="hinge", theta1=1.0, theta2=0.5)
    t1 = otstab.feature_stability(model, df, y, r=0.9, **kw).to_frame()
    t2 = otstab.feature_stability(model, shuffled, y, r=0.9, **kw).to_frame()
    pd.testing.assert_frame_equal(t1, t2)
    c1 = otstab.stability_curve(model, df, y, r=[0.8, 0.9], **kw).to_frame()
    c2 = otstab.stability_curve(model, shuffled, y, r=[0.8, 0.9], **kw).to_frame()
    timing = [c for c in c1.columns if "time" in c]
    pd.testing.assert_frame_equal(c1.drop(columns=timing), c2.drop(columns=timing))
    # per-sample hinge losses = max(0, 1 - y s) with s the model's own decision function
    # (positive for classes_[1]), on the frame in the model's order
    s = model.decision_function(df)
    ypm = np.where(y == model.classes_[1], 1.0, -1.0)
    np.testing.assert_allclose(per_sample_losses(model, shuffled, y, "hinge"),
                               np.maximum(0.0, 1.0 - ypm * s), rtol=1e-12, atol=1e-12)


def test_missing_and_unexpected_columns_are_named():
    df, y = _data()
    model = LogisticRegression(max_iter=5000).fit(df, y)
    bad = df.drop(columns=["debt"]).assign(extra=1.0)
    with pytest.raises(ValueError):  # scikit-learn refuses it too
        model.predict(bad)
    with pytest.raises(ValidationError, match=r"missing \['debt'\].*unexpected \['extra'\]"):
        otstab.certify(model, bad, y, loss="zero_one", **KW)
    with pytest.raises(ValidationError, match=r"unexpected \['extra'\]"):
        otstab.certify(model, df.assign(extra=1.0), y, loss="zero_one", **KW)


def test_arrays_and_unnamed_frames_go_by_position():
    df, y = _data()
    named = LogisticRegression(max_iter=5000).fit(df, y)
    # an array for a model fitted on names: by position (as scikit-learn), the model's names
    a = otstab.certify(named, df, y, loss="zero_one", **KW)
    b = otstab.certify(named, df.to_numpy(), y, loss="zero_one", **KW)
    _same(a, b)
    assert b.feature_names == COLS
    # a frame without string column labels (a RangeIndex) is positional too
    _same(a, otstab.certify(named, pd.DataFrame(df.to_numpy()), y, loss="zero_one", **KW))
    # a frame for a model fitted without names: by position, whatever the labels say
    unnamed = LogisticRegression(max_iter=5000).fit(df.to_numpy(), y)
    shuffled = df[COLS[::-1]]
    c = otstab.certify(unnamed, shuffled, y, loss="zero_one", **KW)
    _same(c, otstab.certify(unnamed, shuffled.to_numpy(), y, loss="zero_one", **KW))
    assert c.feature_names == COLS[::-1]
    assert c.risk_base == pytest.approx(1.0 - unnamed.score(shuffled.to_numpy(), y), abs=1e-12)


def test_pipelines_see_the_reordered_frame():
    df, y = _data()
    ct = ColumnTransformer([("num", StandardScaler(), ["age", "income"])],
                           remainder="passthrough")
    for pipe in (make_pipeline(StandardScaler(), LogisticRegression()).fit(df, y),
                 make_pipeline(ct, LogisticRegression()).fit(df, y)):
        shuffled = df[["debt", "score", "income", "age"]]
        a = otstab.certify(pipe, df, y, loss="zero_one", **KW)
        b = otstab.certify(pipe, shuffled, y, loss="zero_one", **KW)
        _same(a, b)
        assert b.risk_base == pytest.approx(1.0 - pipe.score(df, y), abs=1e-12)
        with pytest.raises(ValidationError, match=r"missing \['age'\]"):
            otstab.certify(pipe, df.drop(columns=["age"]), y, loss="zero_one", **KW)


def test_nonlinear_model_gets_the_reordered_frame():
    df, y = _data(n=120)
    mlp = MLPClassifier(hidden_layer_sizes=(5,), max_iter=300, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence
        mlp.fit(df, y)
    shuffled = df[COLS[::-1]]
    kw = dict(loss="cross_entropy", r=1.5, theta1=1.0, theta2=0.5)
    a = otstab.certify(mlp, df, y, **kw)
    b = otstab.certify(mlp, shuffled, y, **kw)
    assert a.value == b.value and a.risk_base == b.risk_base
    # base risk = mean cross-entropy of the model's own probabilities
    p = mlp.predict_proba(df)[np.arange(len(y)), np.searchsorted(mlp.classes_, y)]
    assert b.risk_base == pytest.approx(float(np.mean(-np.log(p))), rel=1e-9)


# ------------------------------------------------------------------------------------------
# column labels


def test_duplicate_column_names_are_named():
    X = pd.DataFrame(np.ones((3, 3)), columns=["a", "b", "a"])
    with pytest.raises(ValidationError, match=r"duplicate column names: \['a'\]"):
        as_float_matrix(X)
    with pytest.raises(ValidationError, match=r"duplicate column names: \['a'\]"):
        otstab.certify(otstab.LinearModel([1.0, 0.0, 0.0]), X, [1, -1, 1], loss="hinge",
                       r=1.0)


def test_labels_equal_as_text_do_not_collide():
    rng = np.random.default_rng(1)
    X = pd.DataFrame(rng.normal(size=(30, 2)), columns=[0, "0"])
    y = np.where(X.iloc[:, 0] > 0, 1, -1)
    with pytest.raises(ValidationError, match=r"0 and '0'"):
        otstab.certify(otstab.LinearModel([1.0, 0.5]), X, y, loss="hinge", r=1.0)
    # distinct labels of mixed types are fine: text names, values by position
    X2 = X.set_axis([0, "b"], axis=1)
    res = otstab.certify(otstab.LinearModel([1.0, 0.5]), X2, y, loss="hinge", r=1.0)
    assert res.feature_names == ["0", "b"]
    ref = otstab.certify(otstab.LinearModel([1.0, 0.5]), X2.to_numpy(), y, loss="hinge", r=1.0)
    assert res.value == ref.value


# ------------------------------------------------------------------------------------------
# one-vs-one SVMs


@pytest.mark.parametrize("cls", [SVC, NuSVC])
@pytest.mark.parametrize("k", [3, 4])
def test_one_vs_one_svm_is_refused(cls, k):
    df, y = _data(k=k)
    X = df.to_numpy()
    model = (cls(kernel="linear", nu=0.2) if cls is NuSVC else cls(kernel="linear")).fit(X, y)
    # the trap: K(K-1)/2 pairwise rows, which is K rows when K = 3
    assert model.coef_.shape[0] == k * (k - 1) // 2
    with pytest.raises(InputTypeError, match="one-vs-one.*LinearSVC.*predictions.*adapt"):
        otstab.certify(model, X, y, loss="zero_one", **KW)
    # the suggested route certifies the model's own predictions
    # (r above the base risk: with nothing to move, otstab asks predict on 0 rows, which
    # scikit-learn's SVC refuses -- a separate bug in the 0/1 audit of Q*)
    res = otstab.certify(otstab.nonlinear.adapt(model), X, y, loss="zero_one",
                         r=0.95, theta1=1.0, theta2=0.5)
    assert res.risk_base == pytest.approx(1.0 - model.score(X, y), abs=1e-12)


def test_binary_linear_svc_keeps_its_sign_convention():
    df, y = _data(k=2)
    X = df.to_numpy()
    model = SVC(kernel="linear").fit(X, y)
    res = otstab.certify(model, X, y, loss="zero_one", **KW)
    assert res.risk_base == pytest.approx(1.0 - model.score(X, y), abs=1e-12)
    s = model.decision_function(X)  # > 0 predicts classes_[1]
    ypm = np.where(y == model.classes_[1], 1.0, -1.0)
    np.testing.assert_allclose(per_sample_losses(model, X, y, "hinge"),
                               np.maximum(0.0, 1.0 - ypm * s), rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------------
# complex, text and boolean input


def test_complex_input_is_refused():
    df, y = _data(k=2)
    model = LogisticRegression(max_iter=5000).fit(df.to_numpy(), y)
    Xc = df.to_numpy() + 0j
    with pytest.raises(ValidationError, match="X holds complex"):
        otstab.certify(model, Xc, y, loss="zero_one", **KW)
    with pytest.raises(ValidationError, match=r"X has complex column\(s\) \['debt'\]"):
        otstab.certify(model, df.assign(debt=df["debt"] + 1j), y, loss="zero_one", **KW)
    with pytest.raises(ValidationError, match="y holds complex"):
        otstab.certify(model, df.to_numpy(), y + 0j, loss="zero_one", **KW)
    with pytest.raises(ValidationError, match="w holds complex"):
        as_float_vector([1.0, 2j], "w")
    with pytest.raises(ValidationError, match="X holds complex"):
        as_float_matrix(np.array([[1.0, 2j]], dtype=object))


def test_text_is_not_parsed_as_numbers():
    # numpy would read "1.5" as 1.5 without a word
    with pytest.raises(ValidationError, match="X must be numeric, got text such as '1.5'"):
        as_float_matrix(np.array([["1.5", "2"]]))
    with pytest.raises(ValidationError, match="w must be numeric, got text"):
        as_float_vector(np.array(["1.5"], dtype=object), "w")


def test_as_bool_vector():
    for ok, want in [([True, False], [True, False]), ([1, 0, 1], [True, False, True]),
                     (np.array([0.0, 1.0]), [False, True]),
                     (np.array([True, 0], dtype=object), [True, False])]:
        got = as_bool_vector(ok, "misclassified")
        assert got.dtype == bool and got.tolist() == want
    src = np.array([True, False])
    as_bool_vector(src, "m")[0] = False
    assert src[0]  # a copy
    for bad, shown in [(["False", "True"], "'False'"), ([0.0, np.nan], "nan"),
                       ([0, 2], "2"), ([1, None], "None"), ([0.5], "0.5")]:
        with pytest.raises(ValidationError, match=f"misclassified must hold booleans or 0/1, "
                                                  f"got {shown}"):
            as_bool_vector(bad, "misclassified")


# ------------------------------------------------------------------------------------------
# group_metrics


def test_group_metrics_refuses_label_types_that_cannot_match():
    with pytest.raises(ValidationError, match="y_true and y_pred hold labels of different "
                                              "types"):
        otstab.group_metrics(["0", "1", "1"], [0, 1, 1], ["a", "b", "a"]).to_frame()
    # same kind, all wrong: a genuine accuracy of 0 (as sklearn.metrics.accuracy_score)
    from sklearn.metrics import accuracy_score

    df = otstab.group_metrics(["x", "y"], ["y", "x"], ["a", "a"]).to_frame()
    assert df.loc["overall", "accuracy"] == accuracy_score(["x", "y"], ["y", "x"]) == 0.0
    # ints against floats compare as numbers
    df = otstab.group_metrics([0, 1, 1], [0.0, 1.0, 0.0], ["a", "a", "b"]).to_frame()
    assert df.loc["overall", "accuracy"] == accuracy_score([0, 1, 1], [0.0, 1.0, 0.0])


# ------------------------------------------------------------------------------------------
# command line


def _cli(argv):
    from otstab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_cli_matches_csv_columns_by_name(tmp_path):
    import joblib

    df, y = _data(k=2)
    model = LogisticRegression(max_iter=5000).fit(df, y)
    joblib.dump(model, tmp_path / "m.joblib")
    args = ["--model", tmp_path / "m.joblib", "--trust-model", "--target", "label",
            "--loss", "zero_one", "--r", "0.45", "--theta1", "1", "--theta2", "0.5", "--quiet"]
    results = []
    for name, frame in [("ordered", df), ("shuffled", df[COLS[::-1]])]:
        frame.assign(label=y).to_csv(tmp_path / f"{name}.csv", index=False)
        code, _, err = _cli(["certify", "--data", tmp_path / f"{name}.csv", *args,
                             "--json", tmp_path / f"{name}.json"])
        assert code == 0, err
        results.append(json.loads((tmp_path / f"{name}.json").read_text())["results"])
    assert results[0]["value"] == results[1]["value"]
    assert results[0]["risk_base"] == pytest.approx(1.0 - model.score(df, y), abs=1e-12)

    df.drop(columns=["debt"]).assign(label=y).to_csv(tmp_path / "missing.csv", index=False)
    code, _, err = _cli(["certify", "--data", tmp_path / "missing.csv", *args])
    assert code != 0 and "--data" in err and "missing ['debt']" in err

    text = (tmp_path / "ordered.csv").read_text().replace("income", "age", 1)
    (tmp_path / "dup.csv").write_text(text)
    code, _, err = _cli(["certify", "--data", tmp_path / "dup.csv", *args])
    assert code != 0 and "--data" in err and "duplicate column names: ['age']" in err


# ------------------------------------------------------------------------------------------
# the perturbation search matches columns by name too


def test_perturbation_distances_match_columns_by_name():
    df, y = _data(k=2, n=60)
    model = LogisticRegression(max_iter=5000).fit(df, y)
    a = otstab.perturbation.min_perturbation_distances(model, df, y)
    b = otstab.perturbation.min_perturbation_distances(model, df[COLS[::-1]], y)
    np.testing.assert_array_equal(a, b)


def test_messages_name_the_users_model_not_the_adapter():
    """A classifier used through its predictions is named by its own class in messages."""
    from sklearn.tree import DecisionTreeClassifier

    df, y = _data(k=2)
    X = df.to_numpy()
    tree = DecisionTreeClassifier(max_depth=2, random_state=0).fit(X, y)
    with pytest.raises(otstab.errors.IncompatibleLossError) as info:
        otstab.certify(tree, X, y, loss="logistic", r=0.9)
    msg = str(info.value)
    assert "DecisionTreeClassifier" in msg and "zero_one" in msg
    assert "PredictOnlyModel" not in msg


def test_bounds_message_reads_once():
    """The note of a predict-only model's bounds names its search once ("a search", not
    "a search search")."""
    from sklearn.svm import SVC

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] + 0.3 * X[:, 1] ** 2 > 0).astype(int)
    res = otstab.certify(SVC(kernel="rbf").fit(X, y), X, y, loss="zero_one", r=0.6)
    assert res.status == "bounds"
    assert "found by a search are upper bounds" in res.message
    assert "search search" not in res.message
