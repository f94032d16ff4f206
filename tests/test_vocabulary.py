"""One public vocabulary, result objects, docs/api.md, progress and logging (issue 26).

Every public entry point (``otstab._LAZY``'s functions and ``Bootstrap``) is inspected: the
same word for the same thing, keyword-only after the data; the former names keep working for
one release with a FutureWarning and give the same answers; every result has a short repr,
``to_frame``, ``to_dict``, ``summary`` and ``_repr_html_``; docs/api.md shows the signatures
as they are; long calls show progress on stderr and the library never prints.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import logging
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression, LogisticRegression

import otstab
from otstab._results import REPR_LIMIT
from otstab._validation import check_random_state
from otstab.errors import InputTypeError, ValidationError
from otstab.solve._inference import Bootstrap

ROOT = Path(__file__).resolve().parents[1]


def _make_api():
    spec = importlib.util.spec_from_file_location("make_api", ROOT / "docs" / "make_api.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MAKE_API = _make_api()
ENTRY = MAKE_API.entry_points()

#: the former names: none may be a parameter of a public entry point
OLD_NAMES = {"confidence", "ci", "delta", "n_boot", "seed", "feature"}
#: how many leading parameters are the data (positional); everything after is keyword-only
DATA_ARGS = {"worst_subpopulation": 2, "conditional_shift": 3, "group_metrics": 3,
             "diagnose_shift": 2, "select_model": 1, "subset_distances": 1,
             # r is the one setting of the low-level distance form (dstar, r)
             "certify_distances": 2,
             # two samples (reference, current); a certificate and a shift cost
             "shift_cost": 4, "budget_used": 2}


def _data(n=500, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(rng.normal(size=(n, d)), columns=[f"x{j}" for j in range(d)])
    y = (X["x0"] + 0.5 * X["x1"] + rng.normal(size=n) > 0).astype(int).to_numpy()
    return LogisticRegression().fit(X, y), X, y


MODEL, X, Y = _data()
SMALL = dict(loss="hinge", r=0.9)


# ------------------------------------------------------------------------------------------
# signatures


def test_every_entry_point_is_inspected():
    assert {"certify", "feature_stability", "stability_curve", "compare", "harden",
            "group_metrics", "worst_subpopulation", "worst_subpopulation_of_model",
            "conditional_shift", "conditional_shift_of_model", "worst_case_risk",
            "diagnose_shift", "select_model", "subset_distances", "certify_distances",
            "shift_cost", "budget_used", "Bootstrap"} == set(ENTRY)


@pytest.mark.parametrize("name", sorted(ENTRY))
def test_one_vocabulary(name):
    params = inspect.signature(ENTRY[name]).parameters
    assert not OLD_NAMES & set(params), f"{name} uses a former name"
    if "groups" in params:  # groups are groups of samples; blocks of features are not
        assert name == "group_metrics"
    aliases = getattr(ENTRY[name] if not inspect.isclass(ENTRY[name])
                      else ENTRY[name].__init__, "__deprecated_kwargs__", {})
    for old, new in aliases.items():
        assert old not in params and new in params, (name, old, new)


@pytest.mark.parametrize("name", sorted(set(ENTRY) - {"Bootstrap"}))  # a settings record
def test_keyword_only_after_the_data(name):
    params = list(inspect.signature(ENTRY[name]).parameters.values())
    k = DATA_ARGS.get(name, 3)  # model, X, y (compare: models, X, y)
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:k]), name
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[k:]), name


def test_model_x_y_come_first():
    for name, fn in ENTRY.items():
        names = list(inspect.signature(fn).parameters)
        if ("model" in names and name != "shift_cost") or name == "compare":
            assert names[1:3] == ["X", "y"], name


def test_loss_before_r_as_in_certify():
    for name, fn in ENTRY.items():
        names = list(inspect.signature(fn).parameters)
        if "loss" in names and "r" in names:
            assert names.index("loss") < names.index("r"), name


@pytest.mark.parametrize("name", ["compare", "worst_case_risk", "stability_curve"])
def test_solver_settings_as_in_certify(name):
    params = inspect.signature(ENTRY[name]).parameters
    for p in ("solver", "features", "sample_weight", "solver_options"):
        assert p in params, (name, p)
    if name != "stability_curve":
        assert "feature_costs" in params


def test_api_md_matches_the_signatures():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert MAKE_API.render(text) == text, "docs/api.md is stale: run python docs/make_api.py"
    for name, fn in ENTRY.items():  # every parameter appears in the reference
        block = MAKE_API.signature_text(name, fn)
        assert block in text, name
        for p in inspect.signature(fn).parameters:
            assert p in block


# ------------------------------------------------------------------------------------------
# the former names


def _warns_new_name(new):
    return pytest.warns(FutureWarning, match=repr(new).replace("(", r"\("))


def test_feature_stability_former_names_give_the_same_table():
    groups = {"first": ["x0", "x1"]}
    kw = dict(loss="hinge", r=0.9)
    new = otstab.feature_stability(MODEL, X, Y, feature_groups=groups, level=0.9,
                                   n_resamples=3, random_state=1, **kw)
    with _warns_new_name("feature_groups"), _warns_new_name("level"), \
            _warns_new_name("n_resamples"), _warns_new_name("random_state"):
        old = otstab.feature_stability(MODEL, X, Y, groups=groups, confidence=0.9, n_boot=3,
                                       seed=1, **kw)
    pd.testing.assert_frame_equal(old.to_frame(), new.to_frame())
    assert new.level == 0.9 and new.n_resamples == 3 and new.random_state == 1


def test_stability_curve_and_group_metrics_former_names():
    with _warns_new_name("level"):
        old = otstab.stability_curve(MODEL, X, Y, loss="hinge", r=[0.8, 0.9], confidence=0.8)
    new = otstab.stability_curve(MODEL, X, Y, loss="hinge", r=[0.8, 0.9], level=0.8)
    pd.testing.assert_frame_equal(old.to_frame().drop(columns="solve_time"),
                                  new.to_frame().drop(columns="solve_time"))
    g = np.arange(len(Y)) % 3
    with _warns_new_name("n_resamples"), _warns_new_name("level"):
        old = otstab.group_metrics(Y, MODEL.predict(X), g, n_boot=20, ci=0.8, random_state=0)
    new = otstab.group_metrics(Y, MODEL.predict(X), g, n_resamples=20, level=0.8,
                               random_state=0)
    pd.testing.assert_frame_equal(old.to_frame(), new.to_frame())
    assert old.intervals == new.intervals and new.level == 0.8


def test_delta_is_one_minus_level():
    rng = np.random.default_rng(3)
    z = rng.normal(size=400)
    losses = (z + rng.normal(size=400) > 1).astype(float)
    kw = dict(p=0.2, regressor=LinearRegression(), bound=1.0, random_state=0)
    with pytest.warns(FutureWarning, match="level=1 - delta"):
        old = otstab.worst_subpopulation(losses, z, delta=0.1, **kw)
    new = otstab.worst_subpopulation(losses, z, level=0.9, **kw)
    assert old.level == new.level == 0.9
    assert old.halfwidth == new.halfwidth
    assert new.delta == pytest.approx(0.1)
    # the band widens with the level (a larger level is a smaller failure probability)
    wider = otstab.worst_subpopulation(losses, z, level=0.99, **kw)
    assert wider.halfwidth > new.halfwidth
    with pytest.warns(FutureWarning):
        m_old = otstab.worst_subpopulation_of_model(MODEL, X, Y, loss="zero_one", Z=["x2"],
                                                    delta=0.1, p=0.3,
                                                    regressor=LinearRegression(),
                                                    random_state=0)
    m_new = otstab.worst_subpopulation_of_model(MODEL, X, Y, loss="zero_one", Z=["x2"],
                                                level=0.9, p=0.3,
                                                regressor=LinearRegression(), random_state=0)
    assert m_old.halfwidth == m_new.halfwidth and m_old.value == m_new.value


def test_bootstrap_former_names():
    with _warns_new_name("n_resamples"), _warns_new_name("random_state"):
        old = Bootstrap(n_boot=5, seed=2)
    assert old == Bootstrap(n_resamples=5, random_state=2) == Bootstrap(5, 2)
    assert (old.n_boot, old.seed) == (5, 2)  # the former attribute names still read
    a = otstab.certify(MODEL, X, Y, se=old, **SMALL)
    b = otstab.certify(MODEL, X, Y, se=Bootstrap(n_resamples=5, random_state=2), **SMALL)
    np.testing.assert_array_equal(a.inference.replicates, b.inference.replicates)


def test_both_names_is_an_error():
    with pytest.raises(TypeError, match="'confidence' .*and 'level'"):
        otstab.stability_curve(MODEL, X, Y, loss="hinge", r=[0.9], confidence=0.9, level=0.9)


def test_select_model_criterion_by_position():
    records = pd.DataFrame({"val_worst_class_accuracy": [0.6, 0.8],
                            "test_worst_group_accuracy": [0.4, 0.7]})
    with pytest.warns(FutureWarning, match="criterion=..."):
        old = otstab.select_model(records, "worst_class_accuracy")
    new = otstab.select_model(records, criterion="worst_class_accuracy")
    pd.testing.assert_frame_equal(old.report, new.report)
    with pytest.warns(FutureWarning, match="criteria_table"):
        gaps = new.summary["mean_gap"]  # the former DataFrame attribute
    pd.testing.assert_series_equal(gaps, new.criteria_table["mean_gap"])
    assert "Model selection" in new.summary()


def test_frame_results_answer_the_former_dataframe_for_one_release():
    res = otstab.feature_stability(MODEL, X, Y, **SMALL)
    frame = res.to_frame()
    with pytest.warns(FutureWarning, match=r"to_frame\(\)"):
        pd.testing.assert_series_equal(res["score"], frame["score"])
    with pytest.warns(FutureWarning):
        assert res.iloc[0]["feature"] == frame.iloc[0]["feature"]
    with pytest.warns(FutureWarning):
        assert res.attrs["reweighting_only_value"] == res.reweighting_only_value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(res) == len(frame) == 4
        assert res.most_sensitive == frame["feature"].iloc[0]
    with pytest.raises(AttributeError):
        res.no_such_attribute  # noqa: B018


def test_harden_features_and_no_printing(capsys):
    kw = dict(loss="zero_one", r=0.4, gamma=1.0)
    with _warns_new_name("features"):
        old = otstab.harden(MODEL, X, Y, feature="x1", **kw)
    new = otstab.harden(MODEL, X, Y, features="x1", **kw)
    assert old.before == new.before and old.after == new.after and new.columns == ["x1"]
    # the targeted score is certify's with only that column moving
    assert new.before["score"] == otstab.certify(MODEL, X, Y, loss="zero_one", r=0.4,
                                                 features=["x1"]).value
    with pytest.warns(FutureWarning, match="verbose"):
        otstab.harden(MODEL, X, Y, features=["x1"], verbose=True, **kw)
    out = capsys.readouterr()
    assert out.out == ""  # the library never prints


# ------------------------------------------------------------------------------------------
# one random_state check


def test_check_random_state():
    assert isinstance(check_random_state(None), np.random.Generator)
    np.testing.assert_array_equal(check_random_state(7).integers(0, 100, 5),
                                  np.random.default_rng(7).integers(0, 100, 5))
    g = np.random.default_rng(1)
    assert check_random_state(g) is g
    a = check_random_state(np.random.RandomState(5)).integers(0, 100, 5)
    b = check_random_state(np.random.RandomState(5)).integers(0, 100, 5)
    np.testing.assert_array_equal(a, b)
    assert check_random_state(np.int64(3)).integers(0, 9) == \
        np.random.default_rng(3).integers(0, 9)
    with pytest.raises(InputTypeError, match="boolean"):
        check_random_state(True)
    with pytest.raises(ValidationError, match="non-negative"):
        check_random_state(-1)
    with pytest.raises(InputTypeError, match="str"):
        check_random_state("0")


@pytest.mark.parametrize("call", [
    lambda rs: otstab.compare({"m": MODEL}, X, Y, n_resamples=2, random_state=rs, **SMALL),
    lambda rs: otstab.feature_stability(MODEL, X, Y, level=0.9, n_resamples=2,
                                        random_state=rs, **SMALL),
    lambda rs: otstab.group_metrics(Y, Y, Y, n_resamples=2, random_state=rs),
    lambda rs: otstab.worst_subpopulation(np.ones(50), np.arange(50.0), p=0.5,
                                          random_state=rs),
    lambda rs: otstab.conditional_shift(np.arange(50.0), np.arange(50.0), None, p=0.5,
                                        random_state=rs),
    lambda rs: Bootstrap(random_state=rs),
], ids=["compare", "feature_stability", "group_metrics", "worst_subpopulation",
        "conditional_shift", "Bootstrap"])
def test_every_random_state_refuses_booleans(call):
    with pytest.raises((InputTypeError, ValidationError), match="random_state"):
        call(True)


def test_a_generator_or_randomstate_is_accepted():
    kw = dict(n_resamples=3, **SMALL)
    a = otstab.compare({"m": MODEL}, X, Y, random_state=4, **kw).to_frame()
    b = otstab.compare({"m": MODEL}, X, Y, random_state=np.random.default_rng(4),
                       **kw).to_frame()
    pd.testing.assert_frame_equal(a, b)  # an int seed is default_rng(seed)
    c = otstab.compare({"m": MODEL}, X, Y, random_state=np.random.RandomState(4), **kw)
    d = otstab.compare({"m": MODEL}, X, Y, random_state=np.random.RandomState(4), **kw)
    pd.testing.assert_frame_equal(c.to_frame(), d.to_frame())


# ------------------------------------------------------------------------------------------
# compare and worst_case_risk take certify's settings


def test_compare_passes_weights_costs_and_solver_options_to_certify():
    Xs, ys = X.iloc[:200], Y[:200]  # 200 rows: a conic backend solves each
    rng = np.random.default_rng(5)
    w = rng.uniform(0.1, 3.0, len(ys))
    costs = {"x0": 2.0, "x3": math.inf}
    kw = dict(loss="hinge", r=0.9, divergence="chi2")
    res = otstab.compare({"m": MODEL}, Xs, ys, settings=[(1.0, 0.25)], n_resamples=2,
                         random_state=3, sample_weight=w, feature_costs=costs,
                         solver="clarabel", **kw)
    row = res.to_frame().iloc[0]
    ref = otstab.certify(MODEL, Xs, ys, sample_weight=w, feature_costs=costs,
                         solver="clarabel", **kw)
    assert row["value"] == ref.value and row["status"] == ref.status
    # the resamples: the same draws, each row with its weight, certified independently here
    g = np.random.default_rng(3)
    draws = [g.integers(0, len(ys), size=len(ys)) for _ in range(2)]
    boot = sorted(otstab.certify(MODEL, Xs.iloc[i], ys[i], sample_weight=w[i],
                                 feature_costs=costs, solver="clarabel", **kw).value
                  for i in draws)
    # (the same numbers up to the rounding of normalising the weights in another order)
    assert (row["ci_lower"], row["ci_upper"]) == pytest.approx((boot[0], boot[1]), rel=1e-9)
    # unweighted and unpriced it differs: the settings were used
    plain = otstab.compare({"m": MODEL}, Xs, ys, n_resamples=0, **kw).to_frame().iloc[0]
    assert abs(plain["value"] - row["value"]) > 1e-6
    # solver options reach certify (which refuses the unknown one)
    with pytest.raises(ValidationError, match="bogus"):
        otstab.compare({"m": MODEL}, Xs, ys, n_resamples=0, bogus=1, **kw)


@pytest.mark.parametrize("loss", ["hinge", "logistic", "zero_one"])
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_worst_case_risk_with_weights_and_costs_inverts_certify(loss, divergence):
    rng = np.random.default_rng(11)
    k = rng.integers(1, 4, len(Y))  # integer weights: the same as the rows repeated
    costs = [1.0, 4.0, 0.5, math.inf]
    kw = dict(loss=loss, eps=0.05, divergence=divergence, feature_costs=costs)
    res = otstab.worst_case_risk(MODEL, X, Y, sample_weight=k, **kw)
    assert res.status == "optimal"
    # certify at the answer costs eps, with the same weights and prices
    back = otstab.certify(MODEL, X, Y, loss=loss, r=res.risk, divergence=divergence,
                          sample_weight=k, feature_costs=costs)
    assert back.value == pytest.approx(0.05, rel=1e-6)
    # integer weights: the same problem as the rows repeated (an independent data set)
    idx = np.repeat(np.arange(len(Y)), k)
    rep = otstab.worst_case_risk(MODEL, X.iloc[idx], Y[idx], **kw)
    assert res.risk == pytest.approx(rep.risk, rel=1e-7)
    plain = otstab.worst_case_risk(MODEL, X, Y, loss=loss, eps=0.05, divergence=divergence)
    assert abs(plain.risk - res.risk) > 1e-4


# ------------------------------------------------------------------------------------------
# result objects


def _results():
    rng = np.random.default_rng(2)
    z = rng.normal(size=len(Y))
    losses = (MODEL.predict(X) != Y).astype(float)
    records = pd.DataFrame({"val_worst_class_accuracy": [0.6, 0.8, 0.7],
                            "val_ece": [0.02, 0.05, 0.04],
                            "test_worst_group_accuracy": [0.4, 0.7, 0.75]})
    u = rng.random(400)
    tags = pd.DataFrame({"a": u < 0.5, "b": u >= 0.4, "c": np.arange(400) % 2 == 0,
                         "d": u > 0.8})
    yield "certify", otstab.certify(MODEL, X, Y, **SMALL)
    yield "stability_curve", otstab.stability_curve(MODEL, X, Y, loss="hinge",
                                                    r=np.linspace(0.7, 1.2, 40), level=0.9)
    yield "feature_stability", otstab.feature_stability(MODEL, X, Y, **SMALL)
    yield "compare", otstab.compare({f"m{i}": MODEL for i in range(12)}, X, Y,
                                    settings=[(1.0, 0.25), (math.inf, 0.25)], n_resamples=0,
                                    **SMALL)
    yield "group_metrics", otstab.group_metrics(Y, MODEL.predict(X), (z > 0).astype(int),
                                                y_prob=MODEL.predict_proba(X)[:, 1],
                                                n_resamples=5, random_state=0)
    yield "worst_subpopulation", otstab.worst_subpopulation(
        losses, z, p=[0.1, 0.5], regressor=LinearRegression(), bound=1.0, random_state=0)
    yield "worst_subpopulation_scalar", otstab.worst_subpopulation(
        losses, z, p=0.2, regressor=LinearRegression(), bound=1.0, random_state=0)
    yield "conditional_shift", otstab.conditional_shift(
        losses, X[["x0"]], X[["x1"]], p=0.3, folds=2, regressor=LinearRegression(),
        quantile_regressor=lambda Z, q: np.full(len(Z), q), random_state=0)
    yield "diagnose_shift", otstab.diagnose_shift(pd.DataFrame({"y": Y, "a": z > 0}))
    yield "select_model", otstab.select_model(records, criterion="all")
    yield "subset_distances", otstab.subset_distances(tags, min_size=10, dim=2)
    yield "worst_case_risk", otstab.worst_case_risk(MODEL, X, Y, loss="hinge", eps=0.05)
    yield "harden", otstab.harden(MODEL, X, Y, features=["x1"], loss="zero_one", r=0.4)


@pytest.fixture(scope="module")
def results():
    return dict(_results())


@pytest.mark.parametrize("name", ["certify", "stability_curve", "feature_stability", "compare",
                                  "group_metrics", "worst_subpopulation",
                                  "worst_subpopulation_scalar", "conditional_shift",
                                  "diagnose_shift", "select_model", "subset_distances",
                                  "worst_case_risk", "harden"])
def test_result_interface(results, name):
    res = results[name]
    text = repr(res)
    assert len(text) < REPR_LIMIT, (name, len(text))
    assert text.startswith(type(res).__name__ + "(")
    assert "\n" not in text  # one line: shapes and headline numbers, never whole arrays
    assert isinstance(res.summary(), str) and res.summary()
    assert str(res)
    html = res._repr_html_()
    assert html.startswith("<pre>") and len(html) < 100_000
    assert isinstance(res.to_frame(), pd.DataFrame)
    json.dumps(res.to_dict())  # plain Python


def test_certificate_repr_was_weights_and_is_headline_numbers(results):
    res = results["certify"]
    assert res.n == 500 and res.n_atoms >= 500
    text = repr(res)
    assert f"value={res.value:.6g}" in text and "n_atoms=" in text
    assert "array(" not in text and len(text) < 400


def test_frame_results_keep_the_former_frame(results):
    fs = results["feature_stability"]
    frame = fs.to_frame()
    assert list(frame.columns[:8]) == ["feature", "score", "rank", "h", "share_moving",
                                       "share_reweighting", "ignored", "columns"]
    assert frame.attrs["reweighting_only_value"] == fs.reweighting_only_value
    assert frame.attrs["r"] == 0.9
    curve = results["stability_curve"].to_frame()
    assert curve.attrs["risk_base"] == results["certify"].risk_base
    assert {"se", "ci_low", "ci_high"} <= set(curve.columns) and curve.attrs["level"] == 0.9
    gm = results["group_metrics"]
    assert gm.to_frame().attrs["summary"] == gm.metrics
    from otstab.shift import summary_frame
    pd.testing.assert_frame_equal(summary_frame(gm), summary_frame(gm.to_frame()))


# ------------------------------------------------------------------------------------------
# progress and logging


def test_progress_bar_on_stderr_when_asked(capsys):
    otstab.compare({"m": MODEL}, X, Y, n_resamples=2, progress=True, **SMALL)
    err = capsys.readouterr().err
    assert "compare" in err and "3/3" in err
    otstab.compare({"m": MODEL}, X, Y, n_resamples=2, progress=False, **SMALL)
    otstab.compare({"m": MODEL}, X, Y, n_resamples=2, **SMALL)  # stderr is not a terminal
    assert capsys.readouterr().err == ""
    with pytest.raises(InputTypeError, match="progress"):
        otstab.compare({"m": MODEL}, X, Y, n_resamples=0, progress="yes", **SMALL)


def test_plain_progress_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    otstab.feature_stability(MODEL, X, Y, level=0.9, n_resamples=2, progress=True, **SMALL)
    err = capsys.readouterr().err
    assert "feature_stability bootstrap: 2/2" in err and err.endswith("\n")


@pytest.mark.parametrize("call", [
    lambda: otstab.stability_curve(MODEL, X, Y, loss="hinge", r=[0.8, 0.9], progress=True),
    lambda: otstab.worst_subpopulation(np.arange(60.0) % 2, np.arange(60.0), p=0.5,
                                       regressor=LinearRegression(), progress=True),
    lambda: otstab.conditional_shift(np.arange(60.0) % 2, np.arange(60.0), None, p=0.5,
                                     folds=2, regressor=LinearRegression(), progress=True),
    lambda: otstab.certify(MODEL, X, Y, se=Bootstrap(n_resamples=2, progress=True), **SMALL),
], ids=["stability_curve", "worst_subpopulation", "conditional_shift", "bootstrap"])
def test_long_calls_show_progress(capsys, call):
    call()
    assert "/" in capsys.readouterr().err


def test_messages_go_to_the_otstab_logger(caplog):
    with caplog.at_level(logging.INFO, logger="otstab"):
        otstab.compare({"m": MODEL}, X, Y, n_resamples=1, **SMALL)
    assert any(r.name.startswith("otstab.") and "certificates" in r.getMessage()
               for r in caplog.records)


def test_no_print_in_library_code():
    allowed = {"cli", "reporting/_report.py"}  # the command line and the printed report
    offenders = []
    for path in sorted((ROOT / "otstab").rglob("*.py")):
        rel = path.relative_to(ROOT / "otstab").as_posix()
        if rel in allowed or rel.split("/")[0] in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "print":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
