"""The history store (otstab.History), ``otstab monitor`` and its trend report (issue 32).

The store round-trips what the library computes; the command's numbers are those of
certify / shift_cost / budget_used called directly; the gate follows its definition; the
projection is checked on a series with a known rate; the report renders in headless
Chromium (skipped when none is installed)."""

import json
import math
import re
import subprocess

import joblib
import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

import otstab
from otstab import report as _report
from otstab.cli import main
from otstab.errors import ValidationError
from otstab.reporting import gate_share, projection, trend_html
from otstab.shift import History

IMAGE_PROBE = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  document.body.setAttribute("data-images",
    imgs.map(function (i) { return i.complete && i.naturalWidth > 0 ? "ok" : "broken"; })
        .join(","));
});
</script>"""


def _data(n, seed, drift=0.0):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"a": rng.normal(size=n) + drift, "b": rng.normal(size=n)})
    y = (X["a"] - 0.5 * X["b"] + rng.normal(size=n) * 0.8 > 0).astype(int)
    return X, y


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("monitor")
    Xt, yt = _data(200, 0)
    model = LogisticRegression().fit(Xt, yt)
    joblib.dump(model, d / "model.joblib")
    X, y = _data(24, 1)
    X.assign(label=y).to_csv(d / "reference.csv", index=False)
    windows = []
    for k, drift in enumerate([0.0, 0.05, 0.1]):
        Xc, yc = X.copy(), y.copy()
        Xc["a"] = Xc["a"] + drift
        Xc.assign(label=yc).to_csv(d / f"w{k}.csv", index=False)
        windows.append(d / f"w{k}.csv")
    return d, model, X, y, windows


def _monitor(d, current, *extra):
    return main(["monitor", "--model", str(d / "model.joblib"), "--trust-model",
                 "--reference", str(d / "reference.csv"), "--current", str(current),
                 "--target", "label", "--store", str(d / "history.db"), "--r", "0.45",
                 "--model-version", "v1", "--quiet", *extra])


def test_monitor_round_trips_through_the_store(setup, capsys):
    d, model, X, y, windows = setup
    codes = [_monitor(d, w, "--max-budget-used", "0.5") for w in windows]
    with History(d / "history.db") as h:
        frame = h.windows("v1")
        assert list(frame["window"]) == ["w0", "w1", "w2"]
        assert h.model_versions() == ["v1"]
        stored = h.shift("v1", "w2")
    # the numbers are the library's
    res = otstab.certify(model, X, y, loss="zero_one", r=0.45)
    for k, w in enumerate(windows):
        cur = pd.read_csv(w)
        S = otstab.shift_cost(X, y, cur[["a", "b"]], cur["label"], model=model)
        use = otstab.budget_used(res, S)
        row = frame.iloc[k]
        assert row["R"] == res.value and row["R_lower"] == res.value_lower
        assert row["S_upper"] == pytest.approx(S.value_upper, rel=1e-9, abs=1e-9)
        assert row["share"] == pytest.approx(use.share, rel=1e-9, abs=1e-6)  # window 0: S ~ 0
        assert row["outcome"] == use.outcome
        lo, hi = res.ci(0.95)
        assert row["R_ci_low"] == pytest.approx(lo, abs=1e-9) \
            and row["R_ci_high"] == pytest.approx(hi, abs=1e-9)  # (0 vs 5e-12 on old numpy)
        expect = 0 if S.value_upper <= 0.5 * res.value_lower else \
            (5 if S.value_lower > 0.5 * res.value_upper else 6)
        assert codes[k] == expect
    assert frame["S"].iloc[0] == 0.0            # the reference itself: no shift
    assert frame["S"].is_monotonic_increasing   # more drift, more cost
    assert stored["value"] == pytest.approx(frame["S"].iloc[2], abs=1e-9)
    # the same window again is refused (exit 2 naming --window) unless --replace
    capsys.readouterr()
    assert _monitor(d, windows[2]) == 2
    assert "--window" in capsys.readouterr().err
    assert _monitor(d, windows[2], "--replace") == 0
    page = (d / "history-trend.html").read_text()
    assert 'id="windows"' in page and page.count("<tr>") == 4
    assert 'id="projection"' in page


def test_monitor_gates_and_prints_json(setup, tmp_path, capsys):
    d, model, X, y, windows = setup
    store = tmp_path / "h.db"
    args = ["monitor", "--model", str(d / "model.joblib"), "--trust-model", "--reference",
            str(d / "reference.csv"), "--current", str(windows[2]), "--target", "label",
            "--store", str(store), "--r", "0.45", "--no-html", "--json"]
    capsys.readouterr()
    code = main([*args, "--max-budget-used", "1e-9", "--window", "a"])
    rec = json.loads(capsys.readouterr().out)
    assert code == 5 and rec["gate"]["outcome"] == "below"
    code = main([*args, "--max-budget-used", "1e6", "--window", "b"])
    rec = json.loads(capsys.readouterr().out)
    assert code == 0 and rec["window"] == "b" and rec["gate"]["outcome"] == "pass"
    assert not (tmp_path / "h-trend.html").exists()
    # bad input names the argument
    assert main([*args, "--store", "postgresql://x/y", "--window", "c"]) == 2
    assert "--store" in capsys.readouterr().err
    assert main([*args, "--current", str(tmp_path / "none.csv"), "--window", "c"]) == 2
    assert "--current" in capsys.readouterr().err
    assert main([*args, "--max-budget-used", "-1", "--window", "c"]) == 2


def test_history_api(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20, 2))
    y = np.where(rng.random(20) < 0.5, -1, 1)
    model = otstab.LinearModel([1.0, -0.5], 0.0)
    res = otstab.certify(model, X, y, loss="hinge", r=1.2, theta1=1.0, theta2=0.5)
    S0 = otstab.shift_cost(X, y, X + 0.01, y, theta1=1.0, theta2=0.5)
    S1 = otstab.shift_cost(X, y, X[:10], np.full(10, 7), theta1=1.0, theta2=0.5)
    assert math.isinf(S1.value)
    with History(f"sqlite:///{tmp_path / 'h.db'}") as h:
        h.record(model_version="m", window="2024Q1", result=res, shift=S0)
        h.record(model_version="m", window="2024Q2", result=res, shift=S1)
        with pytest.raises(ValidationError, match="already"):
            h.record(model_version="m", window="2024Q2", result=res, shift=S1)
        with pytest.raises(ValidationError, match="window"):
            h.record(model_version="m", window="", result=res, shift=S1)
        assert "windows=2" in repr(h)
    with History(tmp_path / "h.db") as h:  # reopened: the same rows
        f = h.windows()
        assert f["S"].iloc[0] == S0.value and math.isinf(f["S"].iloc[1])
        assert f["theta2"].iloc[0] == 0.5 and f["R"].iloc[0] == res.value
        cert = json.loads(f["certificate"].iloc[0])
        assert cert["value"] == res.value and cert["status"] == res.status
    with pytest.raises(ValidationError, match="SQLite"):
        History("mysql://host/db")
    (tmp_path / "junk.db").write_text("not a database" * 100)
    with pytest.raises(ValidationError, match="not an otstab history"):
        History(tmp_path / "junk.db")


def test_projection_and_gate():
    frame = pd.DataFrame({"window": list("abcd"), "S_upper": [0.1, 0.2, 0.3, 0.4],
                          "R_lower": [1.0] * 4})
    p = projection(frame)
    assert p["rate"] == pytest.approx(0.1) and p["windows_left"] == pytest.approx(6.0)
    assert projection(frame.iloc[:1])["windows_left"] != projection(frame.iloc[:1])[
        "windows_left"]  # nan: one window, no rate
    frame["S_upper"] = [0.4, 0.3, 0.3, 0.2]
    assert math.isnan(projection(frame)["windows_left"]) and "not growing" in \
        projection(frame)["text"]
    frame["S_upper"] = [0.4, 0.6, 0.9, 1.1]
    assert projection(frame)["windows_left"] == 0.0
    assert gate_share(0.1, 0.2, 1.0, 1.0, 0.5)["outcome"] == "pass"
    assert gate_share(0.6, 0.7, 1.0, 1.0, 0.5)["outcome"] == "below"
    assert gate_share(0.4, 0.6, 1.0, 1.0, 0.5)["outcome"] == "not_certified"
    assert gate_share(0.4, 0.45, 0.8, 1.0, 0.5)["outcome"] == "not_certified"


CHROMIUM = _report.find_chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")
def test_trend_report_renders_in_headless_chromium(setup, tmp_path):
    d, *_ = setup
    with History(d / "history.db") as h:
        frame = h.windows("v1")
    if len(frame) < 2:
        pytest.skip("needs the round-trip test's windows")
    text = trend_html(frame, max_share=0.5,
                      gate=gate_share(*frame.iloc[-1][["S_lower", "S_upper", "R_lower",
                                                       "R_upper"]], 0.5))
    path = tmp_path / "trend.html"
    path.write_text(text.replace("</body>", IMAGE_PROBE + "</body>"), encoding="utf-8")
    proc = subprocess.run(
        [CHROMIUM, *_report.CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
         path.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    m = re.search(r'id="share">([^<]*)<', dom)
    share = frame["share"].iloc[-1]
    assert m and m.group(1) == (f"{share:.1%}" if math.isfinite(share) else "n/a")
    status = re.search(r'data-images="([^"]*)"', dom)
    assert status and status.group(1) == "ok"  # the figure decoded
    assert len(re.findall(r"<tr>", dom)) == len(frame) + 1
    assert not [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]


def test_shift_solver_choices_are_the_libraries():
    from otstab.cli._monitor import SHIFT_SOLVERS
    from otstab.shift._shift_cost import SOLVERS

    assert SHIFT_SOLVERS == SOLVERS
