"""otstab.compare: values equal certify, intervals equal a hand-made bootstrap."""

import math

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402

import otstab  # noqa: E402
from otstab.analysis._comparison import compare, plot_compare  # noqa: E402
from otstab.errors import InputTypeError, ValidationError  # noqa: E402

INF = math.inf
SETTINGS = [(0.2, INF), (INF, 0.2)]


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(7)
    X = pd.DataFrame(rng.normal(size=(120, 3)), columns=["a", "b", "c"])
    y = (X["a"] - X["b"] + 0.7 * rng.normal(size=120) > 0).astype(int).to_numpy()
    models = {"lr": LogisticRegression().fit(X, y),
              "lr_C0.05": LogisticRegression(C=0.05).fit(X, y)}
    return models, X, y


def test_values_match_certify_and_bootstrap(setup):
    models, X, y = setup
    df = compare(models, X, y, loss="zero_one", r=0.4, settings=SETTINGS, n_resamples=20,
                 random_state=1).to_frame()
    assert list(df.columns) == ["model", "theta1", "theta2", "value", "status", "se",
                                "ci_lower", "ci_upper", "accuracy", "n_resamples"]
    assert len(df) == 4
    rng = np.random.default_rng(1)
    draws = [rng.integers(0, len(y), size=len(y)) for _ in range(20)]
    for rec in df.to_dict(orient="records"):
        m = models[rec["model"]]
        kw = dict(loss="zero_one", r=0.4, theta1=rec["theta1"], theta2=rec["theta2"])
        assert rec["value"] == otstab.certify(m, X, y, **kw).value
        boot = np.array([otstab.certify(m, X.iloc[i], y[i], **kw).value for i in draws])
        assert rec["se"] == pytest.approx(np.std(boot, ddof=1))
        # percentile interval, inverted-cdf: the ceil(20 * 0.025) = 1st and ceil(20 * 0.975)
        # = 20th order statistics
        s = np.sort(boot)
        assert rec["ci_lower"] == s[0] and rec["ci_upper"] == s[-1]
        assert rec["accuracy"] == pytest.approx(np.mean(m.predict(X) == y))


def test_no_resamples_and_regression(setup):
    _, X, y = setup
    yr = X["a"].to_numpy() * 2 + np.linspace(-1, 1, len(X))
    df = compare({"ols": LinearRegression().fit(X, yr)}, X, yr, loss="absolute", r=1.0,
                 settings=[(1.0, 0.25)], n_resamples=0).to_frame()
    assert np.isnan(df["se"].iloc[0]) and np.isnan(df["accuracy"].iloc[0])
    assert df["value"].iloc[0] > 0


def test_unreachable_resamples_give_infinite_se(setup):
    models, X, y = setup
    # theta1 = theta2 = inf is refused by nothing but reaches nothing above the base risk
    df = compare({"lr": models["lr"]}, X, y, loss="hinge", r=5.0, settings=[(INF, INF)],
                 n_resamples=3).to_frame()
    assert df["value"].iloc[0] == INF and df["se"].iloc[0] == INF
    assert df["status"].iloc[0] == "unreachable"


@pytest.mark.parametrize("kw,err,match", [
    ({"models": {}}, InputTypeError, "models"),
    ({"settings": [(1.0,)]}, ValidationError, "settings"),
    ({"settings": [(0.0, 1.0)]}, ValidationError, "theta1"),
    ({"n_resamples": -1}, ValidationError, "n_resamples"),
    ({"level": 1.0}, ValidationError, "level"),
])
def test_bad_arguments(setup, kw, err, match):
    models, X, y = setup
    args = dict(models=models, loss="hinge", r=1.0, n_resamples=0)
    args.update(kw)
    with pytest.raises(err, match=match):
        compare(args.pop("models"), X, y, **args).to_frame()


def test_plot(setup):
    models, X, y = setup
    df = compare(models, X, y, loss="zero_one", r=0.4, settings=SETTINGS, n_resamples=5).to_frame()
    ax = plot_compare(df, title="t")
    assert len(ax.patches) == 4
    assert [t.get_text() for t in ax.get_xticklabels()] == ["(0.2, inf)", "(inf, 0.2)"]
    with pytest.raises(InputTypeError):
        plot_compare(pd.DataFrame({"x": [1]}))
    import matplotlib.pyplot as plt
    plt.close("all")


def test_features_are_passed_to_certify(setup):
    models, X, y = setup
    df = compare({"lr": models["lr"]}, X, y, loss="zero_one", r=0.4, settings=[(1.0, 0.25)],
                 n_resamples=0, features=["b"]).to_frame()
    assert df["value"].iloc[0] == otstab.certify(models["lr"], X, y, loss="zero_one", r=0.4,
                                                 features=["b"]).value


def test_lazy_public_names():
    assert otstab.compare is compare
    assert otstab.worst_case_risk is otstab.dro.worst_case_risk
    assert otstab.harden is otstab.train.harden
    assert {"compare", "worst_case_risk", "train", "harden"} <= set(dir(otstab))
