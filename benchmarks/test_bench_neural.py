"""Certified intervals of MLPs (issue 30): value_lower / value_upper and the time it takes.

- ``test_german_mlp_datacost_interval`` (full): an MLP pipeline on raw German credit rows under
  ``cost="auto"`` (a DataCost) and ``cost="encoded"``, 0/1 at r = 0.4, theta = (1, 0.25).
- ``test_toy_mlp_interval`` (quick): ``make_classification`` (1,000 training rows, 300
  evaluation rows, 6 features), ``MLPClassifier(16 relu)``; 0/1 at r = 0.3 and logistic at
  r = base + 0.3, theta = (1, 0.5), KL.
- ``test_paper_toy_mlp_interval`` (quick): the paper's toy (Sec. 3 and App. C,
  :func:`otstab.datasets.make_toy`, 100 rows per class to train its two-layer MLP,
  ``MLPClassifier(16 relu)``, another 100 per class to evaluate); 0/1 at r = 0.3 with
  theta = (1, 0.25) (App. C) and the cross-entropy at r = 0.5 with the three prices of Sec. 3
  (1/theta1 + 1/theta2 = 5), KL.
- ``test_adult_mlp_interval`` (full): the Adult MLP of the issue -- ``load_adult()``, a random
  10,000 rows (``default_rng(0).permutation``) to train ``MLPClassifier((32,), relu,
  random_state=0, max_iter=300)``, the next 500 to evaluate, theta = (1, 0.1), KL; 0/1 at
  r = 0.3 and logistic at r = base + 0.3. Recorded: the ratio, the total time of ``certify``
  and the time of the lower bound; ``test_adult_zero_one_ratio_against_time_budget``: the 0/1
  ratio under ``time_budget`` = 0, 1, 5, 20 s. The found side of the logistic loss: the
  paper's Adam loop (Algorithm 1, ``solver="first_order"``: the baseline columns
  ``adam_value_upper`` / ``adam_ratio``) and, by default, the better of it and the second search
  of ``otstab/solve/_neural_found.py`` (projected gradient with restarts from the certified
  side's hints); ``value_upper`` is the cost of the kept Q*.
  ``test_adult_logistic_found_side_against_effort``: that ratio and time with 0, 2 (default)
  and 8 Gaussian restarts per h in the second search.

Targets (docs/bounds.md): 0/1 ratio >= 0.9 and logistic ratio >= 0.5, each within 60 s.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
from _benchlib import _CACHE, full, quick, record

KW = dict(theta1=1.0, divergence="kl")


def _fit(X, y, hidden):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MLPClassifier(hidden, random_state=0, max_iter=300).fit(X, y)


def toy():
    if "toy_mlp" not in _CACHE:
        from sklearn.datasets import make_classification

        X, y = make_classification(1300, 6, n_informative=4, random_state=0)
        _CACHE["toy_mlp"] = (_fit(X[:1000], y[:1000], (16,)), X[1000:], y[1000:])
    return _CACHE["toy_mlp"]


def paper_toy():
    if "paper_toy_mlp" not in _CACHE:
        from otstab.datasets import make_toy

        Xtr, ytr = make_toy(100, random_state=0)
        X, y = make_toy(100, random_state=1)
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            m = MLPClassifier((16,), random_state=0, max_iter=1000).fit(Xtr, ytr)
        _CACHE["paper_toy_mlp"] = (m, X, y)
    return _CACHE["paper_toy_mlp"]


def adult():
    if "adult_mlp" not in _CACHE:
        from otstab.datasets import load_adult

        df = load_adult()
        X = df.drop(columns="income").to_numpy(float)
        y = df["income"].to_numpy()
        idx = np.random.default_rng(0).permutation(len(y))
        tr, ev = idx[:10_000], idx[10_000:10_500]
        _CACHE["adult_mlp"] = (_fit(X[tr], y[tr], (32,)), X[ev], y[ev])
    return _CACHE["adult_mlp"]


def base_logistic(m, X, y):
    from otstab.modeling._nonlinear import MLPModel

    ad = MLPModel(m).bind_loss("logistic")
    return float(np.mean(ad.loss_values(X, np.where(y == m.classes_[1], 1, -1))))


def run(m, X, y, loss, theta2, baseline=False, **opts):
    import otstab

    r = 0.3 if loss == "zero_one" else base_logistic(m, X, y) + 0.3
    t0 = time.perf_counter()
    res = otstab.certify(m, X, y, loss=loss, r=r, theta2=theta2, **KW, **opts)
    wall = time.perf_counter() - t0
    lb = res.info.get("lower_bound", {})
    extra = {}
    if baseline:  # the paper's Adam loop alone (solver="first_order")
        t1 = time.perf_counter()
        adam = otstab.certify(m, X, y, loss=loss, r=r, theta2=theta2, solver="first_order",
                              **KW, **opts)
        extra = {"adam_value_upper": adam.value_upper,
                 "adam_ratio": adam.value_lower / adam.value_upper,
                 "adam_time_s": time.perf_counter() - t1,
                 "found_costs": res.info.get("found_costs")}
    return {**extra, "loss": loss, "r": r, "value_lower": res.value_lower,
            "value_upper": res.value_upper, "ratio": res.value_lower / res.value_upper,
            "time_s": wall, "lower_time_s": lb.get("time"), "status": res.status,
            "method": lb.get("method", res.message)}


@quick
@pytest.mark.parametrize("loss", ["zero_one", "logistic"])
def test_toy_mlp_interval(benchmark, loss):
    m, X, y = toy()
    out = benchmark.pedantic(lambda: run(m, X, y, loss, 0.5), rounds=1, iterations=1)
    record(benchmark, **out)
    assert out["status"] == "bounds"
    assert 0 < out["value_lower"] <= out["value_upper"]
    assert out["ratio"] >= (0.9 if loss == "zero_one" else 0.5)


@quick
@pytest.mark.parametrize("loss, r, theta1, theta2", [
    ("zero_one", 0.3, 1.0, 0.25), ("logistic", 0.5, float("inf"), 0.2),
    ("logistic", 0.5, 0.2, float("inf")), ("logistic", 0.5, 0.4, 0.4)])
def test_paper_toy_mlp_interval(benchmark, loss, r, theta1, theta2):
    import otstab

    m, X, y = paper_toy()

    def go():
        t0 = time.perf_counter()
        res = otstab.certify(m, X, y, loss=loss, r=r, theta1=theta1, theta2=theta2,
                             divergence="kl")
        return res, time.perf_counter() - t0

    res, wall = benchmark.pedantic(go, rounds=1, iterations=1)
    ratio = res.value_lower / res.value_upper
    record(benchmark, loss=loss, r=r, theta1=theta1, theta2=theta2,
           value_lower=res.value_lower, value_upper=res.value_upper, ratio=ratio, time_s=wall,
           status=res.status)
    assert 0 < res.value_lower <= res.value_upper
    # the targets (0.9 for 0/1, 0.5 for smooth losses), less a margin for other BLAS
    assert ratio >= (0.85 if loss == "zero_one" else 0.45)


@pytest.mark.parametrize("loss", [pytest.param(v, marks=full) for v in ("zero_one", "logistic")])
def test_adult_mlp_interval(benchmark, loss):
    m, X, y = adult()
    out = benchmark.pedantic(lambda: run(m, X, y, loss, 0.1, baseline=loss == "logistic"),
                             rounds=1, iterations=1)
    record(benchmark, **out)
    assert out["status"] == "bounds"
    assert out["ratio"] >= (0.9 if loss == "zero_one" else 0.5)
    assert out["time_s"] <= 60.0


@pytest.mark.parametrize("budget", [pytest.param(b, marks=full) for b in (0.0, 1.0, 5.0, 20.0)])
def test_adult_zero_one_ratio_against_time_budget(benchmark, budget):
    m, X, y = adult()
    out = benchmark.pedantic(lambda: run(m, X, y, "zero_one", 0.1, time_budget=budget),
                             rounds=1, iterations=1)
    record(benchmark, time_budget=budget, **out)
    assert out["value_lower"] <= out["value_upper"]


@pytest.mark.parametrize("starts", [pytest.param(k, marks=full) for k in (0, 2, 8)])
def test_adult_logistic_found_side_against_effort(benchmark, starts, monkeypatch):
    from otstab.solve import _neural_found

    monkeypatch.setitem(_neural_found.STRONG_OPTIONS, "random_starts", starts)
    m, X, y = adult()
    out = benchmark.pedantic(lambda: run(m, X, y, "logistic", 0.1, baseline=True),
                             rounds=1, iterations=1)
    record(benchmark, random_starts=starts, **out)
    assert out["value_upper"] <= out["adam_value_upper"] * (1 + 1e-12)


def german_mlp():
    """German credit: standardised numeric and one-hot categorical columns (as
    ``tests/german.py``), ``MLPClassifier((16,), random_state=0, max_iter=500)`` on all 1,000
    rows; the first 100 raw rows evaluated."""
    if "german_mlp" not in _CACHE:
        from sklearn.compose import ColumnTransformer
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import OneHotEncoder, StandardScaler

        from otstab.datasets import load_german

        df = load_german(raw=True)
        X, y = df.drop(columns="credit"), df["credit"]
        num = [c for c in X.columns if X[c].dtype.kind in "if"]
        cat = [c for c in X.columns if c not in num]
        ct = ColumnTransformer([("num", StandardScaler(), num),
                                ("cat", OneHotEncoder(handle_unknown="ignore"), cat)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = Pipeline([("pre", ct), ("clf", MLPClassifier(
                (16,), random_state=0, max_iter=500))]).fit(X, y)
        _CACHE["german_mlp"] = (pipe, X.iloc[:100].reset_index(drop=True),
                                y.iloc[:100].reset_index(drop=True))
    return _CACHE["german_mlp"]


@pytest.mark.parametrize("cost", [pytest.param(c, marks=full) for c in ("auto", "encoded")])
def test_german_mlp_datacost_interval(benchmark, cost):
    """The 0/1 interval of an MLP pipeline under the DataCost (``cost="auto"``) and under the
    encoded cost; r = 0.4, theta = (1, 0.25), KL (docs/bounds.md)."""
    import otstab

    pipe, X, y = german_mlp()

    def go():
        t0 = time.perf_counter()
        res = otstab.certify(pipe, X, y, loss="zero_one", r=0.4, theta1=1.0, theta2=0.25,
                             cost=cost)
        return {"cost": cost, "value_lower": res.value_lower, "value_upper": res.value_upper,
                "ratio": res.value_lower / res.value_upper, "status": res.status,
                "time_s": time.perf_counter() - t0}

    out = benchmark.pedantic(go, rounds=1, iterations=1)
    record(benchmark, **out)
    assert 0 < out["value_lower"] <= out["value_upper"]
