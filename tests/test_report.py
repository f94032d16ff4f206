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
    fs = otstab.feature_stability(model, X, y, loss="zero_one", r=0.3)
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
    blob = re.search(r"<details><summary>show</summary><pre>(.*?)</pre>", text, re.S).group(1)
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
