"""Tests of otstab.report: a self-contained HTML page, rendered in headless Chromium."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")
from sklearn.linear_model import LogisticRegression  # noqa: E402

import otstab  # noqa: E402
from otstab import certificate as C  # noqa: E402
from otstab import report  # noqa: E402
from otstab.datasets import make_toy  # noqa: E402

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]

# Appended to a copy of the report (the report itself has no JavaScript): after the load
# event it writes into the DOM whether every image decoded.
IMAGE_PROBE = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  document.body.setAttribute("data-images",
    imgs.map(function (i) { return i.complete && i.naturalWidth > 0 ? "ok" : "broken"; })
        .join(","));
});
</script>"""


@pytest.fixture(scope="module")
def page():
    X, y = make_toy(60, random_state=2)
    X = pd.DataFrame(X, columns=["x <b>0</b>", "x1"])  # a name that needs escaping
    y = pd.Series(y)
    model = LogisticRegression().fit(X, y)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.3)
    fs = otstab.feature_stability(model, X, y, loss="zero_one", r=0.3).to_frame()
    cert = C.make_certificate(res, model, X, y, features=fs)
    from otstab import plot

    grid = plot.decomposition_grid(model, X, y, loss="zero_one", r=0.3,
                                   splits=[0.0, 0.5, 1.0])
    curve = plot.value_curve(model, X, y, loss="zero_one", r=[0.1, 0.2, 0.3])
    trace = {"h": [0.4, 0.2], "risk": [0.5, 0.3], "value": [0.0, 0.01]}
    text = report.render_html(cert, result=res, grid=grid, curve=curve, trace=trace, y=y,
                              verify_command="otstab verify c.json ...")
    return text, cert, res


def _images(text):
    return re.findall(r'<img[^>]*src="([^"]*)"', text)


def test_report_is_self_contained(page):
    text, cert, res = page
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    # no external resources, no scripts
    assert not re.search(r'(src|href)="(?!data:)', text)
    assert "<script" not in text.lower() and "<link" not in text.lower()
    imgs = _images(text)
    assert len(imgs) == 5  # decomposition, features, Q*, curve, trace
    for src in imgs:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_shows_the_certificate(page):
    text, cert, res = page
    assert 'id="value"' in text
    assert f"{res.value:.6g}" in text
    assert f"{res.primal_cost:.6g}" in text
    assert cert["inputs"]["data"]["sha256"] in text
    assert cert["inputs"]["model"]["sha256"] in text
    assert "Most sensitive features" in text and "Excess-risk decomposition" in text
    # names are escaped, and the embedded JSON is the certificate
    assert "x <b>0</b>" not in text and html.escape("x <b>0</b>") in text
    blob = re.search(r"<details open><summary>hide / show</summary><pre>(.*?)</pre>", text,
                     re.S).group(1)
    assert json.loads(html.unescape(blob)) == cert


def test_report_without_extras_and_edge_values(tmp_path):
    X, y = make_toy(30, random_state=0)
    model = LogisticRegression().fit(X, y)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.3, theta1=np.inf, theta2=np.inf)
    cert = C.make_certificate(res, model, X, y)
    path = report.write_report(tmp_path / "r.html", cert)
    text = path.read_text()
    assert "cannot be reached" in text and 'id="value"' in text
    assert not _images(text)
    res0 = otstab.certify(model, X, y, loss="zero_one", r=0.0)
    text0 = report.render_html(C.make_certificate(res0, model, X, y), result=res0)
    assert "already reaches" in text0 and len(_images(text0)) == 1


def test_write_report_computes_grids(tmp_path):
    X, y = make_toy(30, random_state=0)
    model = LogisticRegression().fit(X, y)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.3)
    cert = C.make_certificate(res, model, X, y)
    path = report.write_report(tmp_path / "r.html", cert, result=res, model=model, X=X, y=y,
                               theta_grid=True, r_grid=[0.1, 0.3])
    assert len(_images(path.read_text())) == 3
    with pytest.raises(ValueError, match="model, X and y"):
        report.write_report(tmp_path / "r2.html", cert, theta_grid=True)


def _chromium():
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed "
                    "(apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(page, tmp_path):
    text, cert, res = page
    probe = text.replace("</body>", IMAGE_PROBE + "</body>")
    path = tmp_path / "report.html"
    path.write_text(probe, encoding="utf-8")
    cmd = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
           path.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    # the page shows the certified value
    m = re.search(r'<span class="value" id="value">([^<]*)</span>', dom)
    assert m and m.group(1) == f"{res.value:.6g}"
    # every figure decoded
    status = re.search(r'data-images="([^"]*)"', dom)
    assert status, "the image probe did not run"
    assert status.group(1).split(",") == ["ok"] * len(_images(text))
    # no console messages (errors, uncaught exceptions) from the page
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]
    assert not console, console


# ------------------------------------------------------------------------------------------
# auditor-grade report: explanation, policy, raw Q*, print stylesheet (issue 15)

from otstab import report as _report  # noqa: E402

CHROMIUM = _report.find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")

#: runs in the page at A4 width: what is cut (content wider than its box) or collapsed
_PROBE = """<script>
const cut = [...document.querySelectorAll('pre, table, img, p, dd')]
  .filter(e => e.scrollWidth > e.clientWidth + 1
            || e.getBoundingClientRect().right > innerWidth + 1)
  .map(e => e.tagName + ':' + (e.id || e.textContent.slice(0, 40)));
const closed = [...document.querySelectorAll('details')].filter(d => !d.open).length;
document.body.setAttribute('data-probe', JSON.stringify({cut, closed}));
</script>"""


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from otstab.cli._commands import _verify_command

    df = otstab.datasets.load_german(raw=True)
    X, y = df.drop(columns="credit"), df["credit"]
    num = [c for c in X.columns if X[c].dtype.kind in "if"]
    cat = [c for c in X.columns if c not in num]
    ct = ColumnTransformer([("num", StandardScaler(), num), ("cat", OneHotEncoder(), cat)])
    model = Pipeline([("pre", ct), ("clf", LogisticRegression(max_iter=2000))]).fit(X, y)
    # the report of the encoded cost (the DataCost report: tests/test_datacost_cli.py)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.4, cost="encoded")
    policy = _report.policy_gate(res, res.value / 2)
    cert = otstab.certificate.make_certificate(res, model, X, y, target="credit",
                                               extra={"policy": policy})
    d = tmp_path_factory.mktemp("audit")
    long_dir = d / ("a-rather-long-folder-name-for-the-audit-trail-" * 3)
    cmd = _verify_command(long_dir / "certificate.json", long_dir / "model.joblib",
                          long_dir / "german credit evaluation.csv", "credit")
    page = _report.write_report(d / "report.html", cert, result=res, verify_command=cmd,
                                title="Model risk: German credit")
    return d, page, res, cert, cmd, X


def test_report_explains_and_gates(audited):
    d, page, res, cert, cmd, X = audited
    text = page.read_text()
    assert 'id="explanation"' in text and "squared Euclidean distance" in text
    assert "preprocessed feature space" in text
    assert 'id="policy"' in text and ">PASS<" in text
    assert html.escape(cmd) in text  # the whole command, in one block
    assert "<details open>" in text
    assert "<title>Model risk: German credit</title>" in text
    # Q* is drawn on raw columns: the most moved raw column is named in the caption
    frame, shares, changes = _report.raw_moves(res)
    assert set(shares.index) == set(X.columns)
    assert shares.sum() == pytest.approx(1.0)
    assert f"{shares.index[0]} and {shares.index[1]}" in text
    failing = _report.render_html(cert, policy=_report.policy_gate(res, res.value * 2))
    assert ">FAIL<" in failing


@needs_chromium
def test_report_prints_without_cuts(audited, tmp_path):
    d, page, res, cert, cmd, X = audited
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    dom = subprocess.run(
        [CHROMIUM, *_report.CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         "--window-size=794,1123", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120)
    m = re.search(r"data-probe=\"([^\"]*)\"", dom.stdout)
    assert m, dom.stderr[-500:]
    found = json.loads(html.unescape(m.group(1)))
    assert found == {"cut": [], "closed": 0}  # at A4 width nothing overflows or is collapsed
    shot = tmp_path / "page.png"
    _report.run_chromium(["--window-size=794,1123", f"--screenshot={shot}", page.as_uri()])
    assert shot.stat().st_size > 10_000
    pdf = _report.write_pdf(page, tmp_path / "report.pdf")
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF")
    pages = len(re.findall(rb"/Type\s*/Page[^s]", data))
    assert 2 <= pages <= 12   # the certificate JSON is not printed (it was 8 more pages)
    pdftotext = shutil.which("pdftotext")
    if pdftotext:  # the printed text, when poppler is installed
        txt = subprocess.run([pdftotext, "-layout", str(pdf), "-"], capture_output=True,
                             text=True, timeout=60).stdout
        assert "What this means" in txt and "PASS" in txt
        assert "german credit evaluation.csv" in " ".join(txt.split())
        assert '"format": "otstab-certificate"' not in txt and "is not printed" in txt
        printed = [p for p in txt.split("\f") if p.strip()]
        assert len(printed) == pages
        for k, one in enumerate(printed, 1):
            assert f"page {k} of {pages}" in one       # page numbers in the margin box
        # no heading (or lead-in line) ends a page: each is followed by its content
        text = page.read_text()
        heads = [html.unescape(re.sub(r"<[^>]+>", "", h)).strip() for h in re.findall(
            r"<(?:h2|h3|dt)[^>]*>(.*?)</(?:h2|h3|dt)>", text)]
        heads.append("The most moved samples (weighted squared move):")
        for one in printed:
            body = [ln.strip() for ln in one.splitlines() if ln.strip()
                    and not re.fullmatch(r"page \d+ of \d+", ln.strip())]
            assert body[-1] not in heads, body[-3:]


def test_model_card_and_report_show_public_class_paths(page):
    text, cert, res = page
    # the certificate keeps the full path (verify compares it); what people read is public
    assert cert["inputs"]["model"]["class"] == \
        "sklearn.linear_model._logistic.LogisticRegression"
    card = report.model_card(cert)
    assert card["model"]["class"] == "sklearn.linear_model.LogisticRegression"
    assert card["title"] == "OT stability of sklearn.linear_model.LogisticRegression"
    readable = text.split("<h2>Certificate JSON</h2>")[0]    # the JSON is the record
    assert "sklearn.linear_model.LogisticRegression" in readable
    assert "._logistic." not in readable
    import sklearn.linear_model as lm

    assert lm.LogisticRegression.__module__ == "sklearn.linear_model._logistic"
    assert report.public_name("sklearn.ensemble._forest.RandomForestClassifier") == \
        "sklearn.ensemble.RandomForestClassifier"
    # kept as written: not private, not importable, or not exported by the public parent
    for name in ("sklearn.pipeline.Pipeline", "nosuchpkg._mod.Thing",
                 "sklearn.utils._param_validation.Interval"):
        assert report.public_name(name) == name


def test_print_css_and_json_note(page):
    """In print, the certificate JSON gives way to a note, pages are numbered and headings
    keep their content (the printed result is checked in test_report_prints_without_cuts)."""
    text, cert, res = page
    css = text[text.index("<style>"):text.index("</style>")]
    printed = css[css.index("@media print"):]
    assert ".json{display:none}" in printed and ".print-only{display:block}" in printed
    assert "counter(page)" in css and "counter(pages)" in css
    assert "break-after:avoid" in printed and "break-inside:avoid" in printed
    note = re.search(r'<p class="print-only small">(.*?)</p>', text).group(1)
    n_lines = json.dumps(cert, indent=2).count("\n") + 1
    assert f"{n_lines:,} lines" in note and "not printed" in note


def test_raw_qstar_plot_keeps_categories_legible_and_caption_true():
    """A categorical column with many levels shows the most frequent ones and "(other)";
    the caption's arrows are the arrows drawn."""
    from matplotlib.figure import Figure

    rng = np.random.default_rng(0)
    n = 400
    countries = [f"country-{k:02d}" for k in range(40)]
    c0 = rng.choice(countries, n, p=np.r_[[0.5], np.full(39, 0.5 / 39)])
    c1 = c0.copy()
    c1[:25] = "country-01"                     # 25 samples change category
    num = rng.normal(size=n)
    frame = pd.DataFrame({"country": c0, "country*": c1, "hours": num, "hours*": num})
    wm = np.full(n, 1.0 / n)
    ax = Figure().add_subplot()
    drawn = []
    _report._raw_plot(ax, frame, "country", "hours", wm, drawn=drawn)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == _report.RAW_PLOT_LEVELS and labels[-1] == "(other)"
    assert "country-00" in labels and "country-01" in labels
    moved_shown = int(np.sum([(a != b) and (a in labels or b in labels)
                              for a, b in zip(c0[:25], c1[:25])]))
    assert drawn == [moved_shown] and 0 < moved_shown <= 25
    assert f"the {moved_shown} moves" in _report._arrow_caption(drawn[0])
    # nothing changes category: the caption says no arrows
    same = frame.assign(**{"country*": c0})
    drawn = []
    _report._raw_plot(Figure().add_subplot(), same, "country", "hours", wm, drawn=drawn)
    assert drawn == [0] and _report._arrow_caption(0).startswith("no arrows")


@pytest.mark.parametrize("theta1, arrows", [(1.0, True), (np.inf, False)])
@pytest.mark.parametrize("raw", [True, False])
def test_qstar_caption_matches_the_arrows(theta1, arrows, raw, monkeypatch):
    """Both Q* figures (on raw columns, and the fallback when the preprocessing cannot be
    mapped back) speak of arrows only when arrows are drawn."""
    X, y = make_toy(60, random_state=2)
    model = LogisticRegression().fit(X, y)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.3, theta1=theta1, theta2=0.25)
    if not raw:
        monkeypatch.setattr(report, "raw_moves", lambda *a, **k: None)
    text = report.render_html(C.make_certificate(res, model, X, y), result=res)
    start = text.index('<h2 id="raw-qstar">' if raw else "<h2>Most sensitive distribution Q*")
    section = text[start:text.index("</figure>", start)]
    assert ("arrows: " in section) is arrows
    assert ("no sample moves (reweighting only)" in section) is not arrows
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    otstab.plot.sensitive_distribution(res, ax=ax)
    assert (report._count_arrows(ax) > 0) is arrows


# ------------------------------------------------------------------------------------------
# a non-exact answer (status bounds) reads consistently (issue 29): the interval as the
# headline, the gate on the certified side, no confidence bound passed off for it, the wall
# time of the whole call, advice for the model at hand, CLI flags in a CLI report

def _text(page_html: str) -> str:
    """The rendered text of a report (tags dropped, the certificate JSON left out)."""
    body = re.sub(r"<details.*?</details>", "", page_html, flags=re.S)
    body = re.sub(r"</?(?:code|span|strong|em|sub|sup)\b[^>]*>", "", body)  # inline: no space
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def _forest():
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(13)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] * X[:, 1] + 0.5 * rng.normal(size=40) > 0).astype(int)
    model = RandomForestClassifier(n_estimators=5, max_depth=3, random_state=13).fit(X, y)
    return model, X, y, float(np.mean(model.predict(X) != y)) + 0.3


@pytest.fixture(scope="module")
def forest_bounds():
    import time

    model, X, y, r = _forest()
    t0 = time.perf_counter()
    # one box per sample leaves the search unfinished: an interval with a real gap (the
    # radius key certifies a positive distance from the root box alone; ratio about 0.83)
    res = otstab.certify(model, X, y, loss="zero_one", r=r, theta1=1.0, theta2=1.0,
                         max_nodes=1)
    took = time.perf_counter() - t0
    assert res.status == "bounds" and 0 < res.value_lower < 0.95 * res.value_upper
    return model, X, y, r, res, took


@pytest.fixture(scope="module")
def small_mlp():
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    _, X, y, _ = _forest()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = MLPClassifier((6,), max_iter=300, random_state=0).fit(X, y)
    return model, X, y, float(np.mean(model.predict(X) != y)) + 0.3


def _fmt6(v):
    return f"{v:.6g}"


def test_bounds_report_headline_gate_uncertainty_time(forest_bounds):
    model, X, y, r, res, took = forest_bounds
    lo, up = res.value_lower, res.value_upper
    thr = (lo + up) / 2  # between the ends: R may be on either side
    pol = report.policy_gate(res, thr)
    assert pol["outcome"] == "not_certified" and pol["gated_on"] == "value_lower"
    cert = C.make_certificate(res, model, X, y, extra={"policy": pol})
    page = report.render_html(cert, result=res)
    text = _text(page)
    # the headline is the interval, its ends are the result's
    m = re.search(r'id="interval">\[<span id="value_lower">([^<]*)</span>, '
                  r'<span id="value_upper">([^<]*)</span>\]', page)
    assert m and m.groups() == (_fmt6(lo), _fmt6(up))
    assert f"R lies in the interval [{_fmt6(lo)}, {_fmt6(up)}]" in text
    assert 'id="value"' not in page  # no single "R = value_upper"
    assert "R(beta, r) (dual value)" not in text
    # one gate sentence, on the certified side
    assert (f"decided on the certified lower end value_lower = {_fmt6(lo)} (no perturbation "
            f"cheaper than it reaches r), not on the found value_upper = {_fmt6(up)}") in text
    assert "FAIL (not certified" in text
    assert "R may be on either side (see Narrowing the interval)" in text
    assert "max_nodes=2000" in pol["reason"]  # the verdict itself carries the advice
    assert text.count("A larger budget narrows the interval") == 1  # said once on the page
    # the sampling SE is that of the found value: recorded so, and said so
    assert res.inference.value == up and cert["results"]["uncertainty"]["se"] == res.se
    assert "Confidence bound of the certified side (value_lower): not available" in text
    assert f"is that of the found value value_upper = {_fmt6(up)}" in text
    assert "the value to compare with a pass/fail threshold" not in text
    assert "lower bound for R" not in text
    # and a gate asked for confidence does not use the found value's bound
    with_conf = report.policy_gate(res, lo / 2, confidence=0.95)
    assert with_conf["outcome"] == "not_certified" and "value_lower" in with_conf["reason"]
    assert report.policy_gate(res, up * 2, confidence=0.95)["outcome"] == "below"
    assert report.policy_gate(res, lo / 2)["outcome"] == "pass"
    # the wall time of the whole call, measured around it, next to the solver's share
    wall = res.info["wall_time"]
    assert res.solve_time < wall <= took
    assert cert["timings"]["wall_s"] == wall
    assert f"wall time of certify [s] {_fmt6(wall)}" in text
    assert "solve time" not in text
    # advice for a tree ensemble in Python: a larger budget, no "exact path" to use
    assert "Narrowing the interval" in text and "otstab.certify(..., max_nodes=2000)" in text
    assert "use an exact path" not in text and "se='bootstrap'" not in text
    n_done = int(np.sum(res.info["lower_bound"]["exact"]))
    assert f"finished (exact distance) for {n_done} of {len(X)} samples" in text


def test_bounds_advice_follows_the_model(small_mlp):
    model, X, y, r = _forest()
    # stopped by rtol (the default, 0.01): the advice is a smaller rtol
    res = otstab.certify(model, X, y, loss="zero_one", r=r, theta1=1.0, theta2=1.0)
    if res.info["lower_bound"].get("stopped") == "rtol" \
            and res.value_lower < (1 - 1e-6) * res.value_upper:
        text = _text(report.render_html(C.make_certificate(res, model, X, y), result=res))
        assert "a smaller rtol narrows the interval: otstab.certify(..., rtol=0.001)" in text
    advice = report.tighten_advice("tree", "cli", stopped="rtol", options={"rtol": 0.05})
    assert "rtol = 0.05" in advice and "--rtol 0.005" in advice
    # the search runs to the end (rtol=None): value_lower is R, nothing to tighten
    full = otstab.certify(model, X, y, loss="zero_one", r=r, theta1=1.0, theta2=1.0, rtol=None)
    assert full.status == "bounds" and np.all(full.info["lower_bound"]["exact"])
    text = _text(report.render_html(C.make_certificate(full, model, X, y), result=full))
    assert "max_nodes=" not in text
    assert ("already tight" in text if full.value_lower >= (1 - 1e-6) * full.value_upper
            else "finished for every sample" in text)
    mlp, X, y, r = small_mlp
    res = otstab.certify(mlp, X, y, loss="zero_one", r=r, theta1=1.0, theta2=1.0)
    assert res.status == "bounds" and report.bounds_kind(res.message) == "mlp"
    text = _text(report.render_html(C.make_certificate(res, mlp, X, y), result=res))
    assert "max_nodes" not in text and "use an exact path" not in text
    if res.value_lower >= (1 - 1e-6) * res.value_upper:
        # one hidden ReLU layer: the activation regions close the interval
        assert "already tight" in text
    else:
        assert "no otstab setting closes this gap" in text and "local Lipschitz" in text
        reason = report.policy_gate(res, (res.value_lower + res.value_upper) / 2)["reason"]
        assert "no otstab setting closes this gap" in reason and "exact path:" not in reason
    # the advice for a network whose interval is open, with and without a time budget
    advice = report.tighten_advice("mlp")
    assert "no otstab setting closes this gap" in advice and "activation regions" in advice
    assert "time_budget=20" in report.tighten_advice("mlp", options={"time_budget": 2})


def test_exact_report_keeps_the_value_and_says_what_the_bound_is_for(page):
    text_html, cert, res = page
    text = _text(text_html)
    assert res.status == "optimal"
    assert re.search(r'<span class="value" id="value">([^<]*)</span>', text_html).group(1) \
        == _fmt6(res.value)
    assert "Narrowing the interval" not in text and "not available" not in text
    assert "the value to compare with a pass/fail threshold" not in text
    lcb = res.lower_confidence_bound(0.95)
    assert (f"is at least {_fmt6(lcb)} (a gate asked for 95% confidence, "
            "policy_gate(..., confidence=0.95), compares this bound with its threshold)") in text
    assert f"wall time of certify [s] {_fmt6(res.info['wall_time'])}" in text
    pol = report.policy_gate(res, res.value / 2)
    assert f"decided on R = {_fmt6(res.value)}" in _text(report.render_html(cert, policy=pol))


@pytest.fixture(scope="module")
def cli_bounds_report(tmp_path_factory, small_mlp):
    """A report made by ``otstab certify`` for an MLP under the logistic loss (status bounds,
    value_lower from the global Lipschitz over-estimate), gated between the ends."""
    import contextlib
    import io

    import joblib

    from otstab import cli

    model, X, y, _ = small_mlp
    d = tmp_path_factory.mktemp("cli_bounds")
    joblib.dump(model, d / "model.joblib")
    pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "t": y}).to_csv(d / "eval.csv", index=False)
    res = otstab.certify(model, X, y, loss="logistic", r=0.75)
    assert res.status == "bounds" and res.value_lower < res.value_upper
    err = io.StringIO()
    args = ["certify", "--model", str(d / "model.joblib"), "--data", str(d / "eval.csv"),
            "--target", "t", "--trust-model", "--loss", "logistic", "--r", "0.75",
            "--fail-under", repr((res.value_lower + res.value_upper) / 2),
            "--html", str(d / "report.html"), "--quiet"]
    with contextlib.redirect_stderr(err):
        code = cli.main(args)
    return d, code, err.getvalue()


def test_cli_report_of_bounds_names_cli_flags(cli_bounds_report, forest_bounds):
    from otstab.cli import EXIT_NOT_CERTIFIED

    d, code, err = cli_bounds_report
    text = _text((d / "report.html").read_text())
    assert "R lies in the interval" in text
    assert "decided on the certified lower end value_lower" in text
    assert "global Lipschitz over-estimate" in text
    assert "--loss zero_one" in text and "loss='zero_one'" not in text  # the CLI's flag
    assert code == EXIT_NOT_CERTIFIED and "--loss zero_one" in err
    assert "se='bootstrap'" not in text and "use an exact path" not in text
    assert "wall time of certify [s]" in text
    # a tree ensemble whose search stopped at its budget, in a CLI report
    model, X, y, r, res, _ = forest_bounds
    text = _text(report.render_html(C.make_certificate(res, model, X, y), result=res,
                                    interface="cli"))
    if "--max-nodes" in report._cli_certify_flags():
        assert "--max-nodes 2000" in text
    else:  # said plainly, with the Python call that has it
        assert ("otstab certify has no flag for max_nodes; from Python "
                "otstab.certify(..., max_nodes=2000)") in text


@needs_chromium
def test_bounds_report_prints_its_statements(forest_bounds, tmp_path):
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext (poppler) is not installed")
    model, X, y, r, res, _ = forest_bounds
    pol = report.policy_gate(res, (res.value_lower + res.value_upper) / 2, interface="cli")
    cert = C.make_certificate(res, model, X, y, extra={"policy": pol})
    page = report.write_report(tmp_path / "bounds.html", cert, result=res, interface="cli")
    pdf = report.write_pdf(page, tmp_path / "bounds.pdf")
    txt = " ".join(subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True,
                                  text=True, timeout=60).stdout.split())
    assert f"R lies in the interval [{_fmt6(res.value_lower)}, {_fmt6(res.value_upper)}]" in txt
    assert "decided on the certified lower end value_lower" in txt
    assert "Confidence bound of the certified side (value_lower): not available" in txt
    assert "wall time of certify [s]" in txt and "Narrowing the interval" in txt
    assert "the value to compare with a pass/fail threshold" not in txt


def test_first_order_on_a_linear_model_is_told_its_exact_path():
    X, y = make_toy(40, random_state=2)
    model = LogisticRegression().fit(X, y)
    res = otstab.certify(model, X, y, loss="logistic", r=0.8, solver="first_order")
    assert res.status == "bounds" and res.value_lower == 0
    cert = C.make_certificate(res, model, X, y, solver="first_order")
    text = _text(report.render_html(cert, interface="cli"))
    assert "this linear model has an exact path: --solver auto" in text
    exact = otstab.certify(model, X, y, loss="logistic", r=0.8)  # the path it names
    assert exact.status == "optimal" and exact.value <= res.value_upper * (1 + 1e-6)
    # from the result alone (the gate) the model is unknown: the advice is conditional
    reason = report.policy_gate(res, res.value_upper / 2, interface="cli")["reason"]
    assert "if the model is linear it has an exact path (--solver auto)" in reason
