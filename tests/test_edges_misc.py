"""Edge cases of issue 27 (items 4-8): exact fits of the squared loss, chi2 at large r,
malformed certificates, the bootstrap at tiny n, backend chatter and the ``level`` argument.

Every value is compared with an independent computation: a closed form derived below, or the
dual written out in 50-digit decimal arithmetic (no otstab code)."""

from __future__ import annotations

import math
from decimal import Decimal, getcontext

import numpy as np
import pytest

import otstab

# ---------------------------------------------------------------------------------------------
# item 4: the squared loss of a regressor that fits the data (nearly) exactly


def _dec_dual(resid, a, theta1, r, theta2, divergence, iters=130):
    """sup over 0 <= h < h_max of the dual of the squared loss, in 50-digit decimals.

    l_h(e) = max_s h (e + s)^2 - theta1 s^2 / a = h e^2 / (1 - h a / theta1) (a = ||beta||^2),
    the dual h r - T(l_h) (T: mean, KL log-mean-exp, chi2 with its alpha from the sorted
    values), concave in h: a golden-section search on [0, h_max), h_max = theta1 / a (130
    steps: a bracket of 1e-27 h_max), written with no otstab code."""
    getcontext().prec = 50
    e2 = [Decimal(float(v)) ** 2 for v in resid]
    n = Decimal(len(e2))
    r, a, t1 = Decimal(r), Decimal(a), Decimal(theta1)
    h_max = t1 / a

    def T(lh):
        if math.isinf(theta2):
            return sum(lh) / n
        t2 = Decimal(theta2)
        if divergence == "kl":
            m = max(lh)
            return m + t2 * (sum(((v - m) / t2).exp() for v in lh) / n).ln()
        # alpha: mean_i ((l_i + alpha) / (2 t2) + 1)_+ = 1 over the k largest l (active set)
        srt = sorted(lh, reverse=True)
        for k in range(1, len(srt) + 1):
            alpha = (2 * t2 * (n - k) - sum(srt[:k])) / k
            if k == len(srt) or srt[k] + alpha + 2 * t2 <= 0:
                break
        w = [max((v + alpha) / (2 * t2) + 1, Decimal(0)) for v in lh]
        return -alpha - t2 + t2 * sum(x * x for x in w) / n

    def F(h):
        q = 1 - h / h_max
        return h * r - T([h * v / q for v in e2])

    g = (Decimal(5).sqrt() - 1) / 2
    lo, hi = Decimal(0), h_max
    m1, m2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = F(m1), F(m2)
    for _ in range(iters):
        if f1 < f2:
            lo, m1, f1 = m1, m2, f2
            m2 = lo + g * (hi - lo)
            f2 = F(m2)
        else:
            hi, m2, f2 = m2, m1, f1
            m1 = hi - g * (hi - lo)
            f1 = F(m1)
    return float(max(f1, f2, F(lo)))


def _exact_fit(eps):
    X = np.random.default_rng(1).normal(size=(5, 4))
    w = np.array([1.0, -1.0, 0.5, 2.0])
    m = otstab.LinearModel(w, 0.3, task="regression")
    return m, X, m.predict(X) + eps, w


def _model_audit(m, X, y, res):
    """Risk and cost of res's Q* from the model's own predictions at X_star."""
    Xs, src = np.asarray(res.X_star), np.asarray(res.source)
    w, mass = np.asarray(res.weights), np.asarray(res.mass)
    n = X.shape[0]
    risk = float(np.sum(mass * w * (y[src] - m.predict(Xs)) ** 2)) / n
    cost = res.theta1 * float(np.sum(mass * w * np.sum((Xs - X[src]) ** 2, axis=1))) / n
    if math.isfinite(res.theta2):
        phi = (w * np.log(w) - w + 1) if res.divergence == "kl" else (w - 1) ** 2
        cost += res.theta2 * float(np.sum(mass * phi)) / n
    return risk, cost


@pytest.mark.parametrize("theta2,divergence", [(math.inf, "kl"), (1.0, "kl"), (1.0, "chi2"),
                                               (1e-3, "kl"), (1e-3, "chi2")])
def test_squared_loss_of_an_exact_fit_is_the_w2_ball(theta2, divergence):
    """Every residual 0: l_h = 0 for h <= h_max = theta1 / ||w||^2 (at h_max any move s is a
    maximiser of (h - theta1 / ||w||^2) s^2 = 0) and +inf beyond, so the dual's supremum is
    h_max r; moving every residual by sqrt(r) (weights 1) reaches r at that cost. So
    R = theta1 r / ||w||^2 = 0.01 / 6.25 = 0.0016 for every divergence and theta2."""
    m, X, y, w = _exact_fit(0.0)
    res = otstab.certify(m, X, y, loss="squared", r=0.01, theta1=1.0, theta2=theta2,
                         divergence=divergence)
    assert res.status == "optimal"
    assert res.value == pytest.approx(0.01 / float(w @ w), rel=1e-12)
    assert res.value == pytest.approx(_dec_dual(y - m.predict(X), w @ w, 1.0, 0.01, theta2,
                                                divergence), rel=1e-9)
    risk, cost = _model_audit(m, X, y, res)
    assert risk >= 0.01 * (1 - 1e-9)
    assert cost == pytest.approx(res.value, rel=1e-9)


@pytest.mark.parametrize("eps", [1e-8, 1e-12, 1e-16])
@pytest.mark.parametrize("theta2,divergence", [(math.inf, "kl"), (1.0, "kl"), (1.0, "chi2")])
def test_squared_loss_of_a_near_exact_fit(eps, theta2, divergence):
    """Residuals of 1e-8 .. 1e-16 (the optimum at 1 - h a / theta1 ~ |e| / sqrt(r), which h
    itself cannot resolve below ~1e-8): against the 50-digit dual, and for theta2 = inf the
    closed form theta1 (sqrt(r) - sqrt(E))^2 / ||w||^2 (E the mean squared residual: the
    stationarity r = E / (1 - h a / theta1)^2 of h r - h E / (1 - h a / theta1))."""
    m, X, y0, w = _exact_fit(0.0)
    y = y0 + eps * np.array([1.0, -2.0, 0.5, 3.0, 0.0])
    e = y - m.predict(X)
    res = otstab.certify(m, X, y, loss="squared", r=0.01, theta1=1.0, theta2=theta2,
                         divergence=divergence)
    assert res.status == "optimal"
    ref = _dec_dual(e, float(w @ w), 1.0, 0.01, theta2, divergence)
    assert res.value == pytest.approx(ref, rel=1e-9)
    if math.isinf(theta2):
        E = float(np.mean(e ** 2))
        assert res.value == pytest.approx((0.1 - math.sqrt(E)) ** 2 / float(w @ w), rel=1e-12)
    risk, cost = _model_audit(m, X, y, res)
    assert risk >= 0.01 * (1 - 1e-8)
    assert cost == pytest.approx(res.value, rel=1e-7)


# ---------------------------------------------------------------------------------------------
# item 7: the sampling error of one or two rows


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("se", ["bootstrap", "analytic"])
def test_one_or_two_rows_have_no_sampling_error_estimate(n, se):
    """Every bootstrap resample of one row is that row (two rows: three distinct resamples),
    and sd(IF) of one row is 0: a zero-width interval would be a false promise. se = inf,
    interval (0, inf), lower bound 0, reliable False with the reason."""
    X = np.arange(1.0, n + 1)[:, None]
    y = np.where(np.arange(n) % 2 == 0, 1, -1)
    m = otstab.LinearModel([0.3], 0.2)
    base = float(np.mean(np.maximum(0, 1 - y * m.decision_function(X))))
    res = otstab.certify(m, X, y, loss="hinge", r=base + 0.5, theta1=1.0, theta2=1.0, se=se)
    assert res.status == "optimal" and res.value > 0
    inf_ = res.inference
    assert not inf_.reliable
    assert f"only {n} evaluation row" in inf_.note and "se = inf" in inf_.note
    assert math.isinf(res.se)
    assert res.ci(0.9) == (0.0, math.inf)
    assert res.lower_confidence_bound(0.9) == 0.0
    assert inf_.to_dict()["ci_high"] == math.inf


def test_bootstrap_flags_few_rows_like_the_analytic_se():
    """Three rows: the bootstrap interval is kept, but flagged as the analytic one is."""
    X = np.arange(1.0, 4.0)[:, None]
    y = np.array([1, -1, 1])
    m = otstab.LinearModel([0.3], 0.2)
    base = float(np.mean(np.maximum(0, 1 - y * m.decision_function(X))))
    res = otstab.certify(m, X, y, loss="hinge", r=base + 0.5, theta1=1.0, theta2=1.0,
                         se="bootstrap")
    assert not res.inference.reliable and "only 3 evaluation rows" in res.inference.note
    lo, hi = res.ci(0.9)
    assert lo < hi and math.isfinite(hi)


# ---------------------------------------------------------------------------------------------
# item 6: malformed certificates are bad input (exit 2, one short line)


def _verify_cli(tmp_path, cert_path, env=None, monkeypatch=None):
    import contextlib
    import io

    from otstab.cli import main

    if env and monkeypatch is not None:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["verify", str(cert_path), "--model", str(tmp_path / "m.joblib"),
                     "--data", str(tmp_path / "d.csv"), "--target", "y"])
    return code, err.getvalue()


_HEAD = '{"format": "otstab-certificate", "version": 2, '


_MALFORMED = {
    "digits": (_HEAD + '"x": ' + "9" * 5000 + "}").encode(),
    "nested": ("[" * 100_000 + "]" * 100_000).encode(),
    "nested_objects": ('{"a": ' * 100_000 + "1" + "}" * 100_000).encode(),
    "nested_100": (_HEAD + '"x": ' + "[" * 100 + "]" * 100 + "}").encode(),
    "latin1": (_HEAD + '"note": "caf\u00e9"}').encode("latin-1"),
    "long_format": ('{"format": "' + "A" * 1_000_000 + '", "version": 2}').encode(),
    "long_key": (_HEAD + '"' + "k" * 1_000_000 + '": 1}').encode(),
    "long_version": ('{"format": "otstab-certificate", "version": ['
                     + ", ".join(["123456789"] * 200_000) + "]}").encode(),
}


@pytest.mark.parametrize("name", list(_MALFORMED))
def test_malformed_certificate_is_one_short_line_exit_2(tmp_path, name):
    p = tmp_path / "c.json"
    p.write_bytes(_MALFORMED[name])
    code, err = _verify_cli(tmp_path, p)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "argument CERT" in lines[0] and "Traceback" not in err
    assert len(lines[0]) < 1000, lines[0][:300]


def test_certificate_size_limit_is_documented_and_overridable(tmp_path, monkeypatch):
    from otstab.certificates import MAX_CERTIFICATE_BYTES, read_certificate
    from otstab.errors import ValidationError

    assert MAX_CERTIFICATE_BYTES == 64 << 20
    p = tmp_path / "c.json"
    p.write_bytes(('{"format": "' + "A" * 5000 + '", "version": 2}').encode())
    with pytest.raises(ValidationError, match="larger than 1000 bytes"):
        read_certificate(p, max_bytes=1000)
    code, err = _verify_cli(tmp_path, p, env={"OTSTAB_CERT_MAX_BYTES": "1000"},
                            monkeypatch=monkeypatch)
    assert code == 2 and "larger than 1000 bytes" in err and "AAAA" not in err
    # under the limit the file is read, and the offending field quoted in 200 characters
    monkeypatch.delenv("OTSTAB_CERT_MAX_BYTES")
    with pytest.raises(ValidationError) as exc:
        read_certificate(p)
    assert "format is 'AAAA" in str(exc.value) and len(str(exc.value)) < 400


# ---------------------------------------------------------------------------------------------
# item 8: a backend's chatter is kept, not shown; levels are numbers


def _hinge_instance():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = np.sign(X[:, 0] + 0.3 * rng.normal(size=30))
    m = otstab.LinearModel([1.0, 0.5], 0.1)
    base = float(np.mean(np.maximum(0, 1 - y * m.decision_function(X))))
    return m, X, y, base


def test_backend_output_and_warnings_are_recorded_not_shown(capfd, monkeypatch):
    """SCS prints "ERROR: could not determine problem status." from C (file descriptor 1,
    through the C library's buffered stdout) and cvxpy warns "Solution may be inaccurate":
    simulated here around a real Clarabel solve, both end up in the result, not the terminal."""
    import ctypes
    import warnings

    import cvxpy as cp

    solve = cp.Problem.solve

    def chatty(self, *a, **k):
        out = solve(self, *a, **k)
        ctypes.CDLL(None).printf(b"ERROR: could not determine problem status.\n")
        warnings.warn("Solution may be inaccurate.", UserWarning, stacklevel=1)
        return out

    monkeypatch.setattr(cp.Problem, "solve", chatty)
    m, X, y, base = _hinge_instance()
    with warnings.catch_warnings(record=True) as leaked:
        warnings.simplefilter("always")
        res = otstab.certify(m, X, y, loss="hinge", r=2 * base, theta1=1.0, theta2=1.0,
                             solver="clarabel", se=None)
    assert res.status == "optimal"
    assert not [w for w in leaked if "inaccurate" in str(w.message)]
    out, err = capfd.readouterr()
    assert "could not determine" not in out + err
    assert "could not determine problem status" in res.info["backend_output"]
    assert any("Solution may be inaccurate" in w for w in res.info["backend_warnings"])


def test_failed_backend_says_why_in_the_solver_log(capfd):
    """A real SCS run stopped at 2 iterations: its cvxpy warning is in the error (the log of
    the tries), not on stderr."""
    import warnings

    m, X, y, base = _hinge_instance()
    with warnings.catch_warnings(record=True) as leaked:
        warnings.simplefilter("always")
        with pytest.raises(otstab.errors.SolverError, match="Solution may be inaccurate"):
            otstab.certify(m, X, y, loss="hinge", r=2 * base, theta1=1.0, theta2=1.0,
                           solver="scs", max_iters=2, se=None)
    assert not [w for w in leaked if "inaccurate" in str(w.message)]
    out, err = capfd.readouterr()
    assert "inaccurate" not in out + err


@pytest.mark.parametrize("bad", ["0.9", b"0.9", True, None, [0.9]])
def test_level_must_be_a_number(bad):
    from otstab.certificates import make_certificate
    from otstab.reporting._report import policy_gate

    m, X, y, base = _hinge_instance()
    res = otstab.certify(m, X, y, loss="hinge", r=2 * base, theta1=1.0, theta2=1.0)
    calls = [lambda: res.ci(bad), lambda: res.lower_confidence_bound(bad),
             lambda: res.inference.ci(bad), lambda: res.inference.lower_confidence_bound(bad),
             lambda: res.inference.to_dict(bad), lambda: make_certificate(res, m, X, y,
                                                                          level=bad)]
    for call in calls:
        with pytest.raises(otstab.errors.ValidationError, match="level must be a number"):
            call()
    if bad is not None:  # (level=None means "no interval")
        with pytest.raises(otstab.errors.ValidationError, match="level must be a number"):
            otstab.stability_curve(m, X, y, loss="hinge", r=[2 * base], theta1=1.0,
                                   theta2=1.0, level=bad)
        with pytest.raises(otstab.errors.ValidationError, match="level must be a number"):
            policy_gate(res, fail_under=0.1, confidence=bad)
    # numbers of every kind still work
    for good in (0.9, np.float32(0.9), np.float64(0.9)):
        lo, hi = res.ci(good)
        assert 0 <= lo <= res.value <= hi


# ---------------------------------------------------------------------------------------------
# item 5: chi2 at a large threshold


def _dec_chi2_term(lh, theta2):
    """chi2's subtracted term in decimals: alpha from the sorted values (active set)."""
    n = Decimal(len(lh))
    srt = sorted(lh, reverse=True)
    for k in range(1, len(srt) + 1):
        alpha = (2 * theta2 * (n - k) - sum(srt[:k])) / k
        if k == len(srt) or srt[k] + alpha + 2 * theta2 <= 0:
            break
    w = [max((v + alpha) / (2 * theta2) + 1, Decimal(0)) for v in lh]
    return -alpha - theta2 + theta2 * sum(x * x for x in w) / n


@pytest.mark.parametrize("theta2", [0.25, 1e-6])
@pytest.mark.parametrize("dup", [False, True])
@pytest.mark.parametrize("r", [1e4, 1e6, 1e7, 1e8])
def test_chi2_hinge_at_a_large_threshold(r, dup, theta2):
    """l_h = u h + c h^2 with c h^2 ~ 1e13..1e16 against 2 theta2 = 0.5: chi2's sums must not
    cancel c h^2 (they lost 4 digits of the derivative at r = 1e7 and the audit refused).
    Checked against the dual at otstab's h in 60-digit decimals (a lower bound on R), the
    cost of Q* re-scored by the model (an upper bound), the weighted path (sample weights of
    one: another code path) and, with one active sample, the closed form
    theta1 (r - u_max)^2 / ||beta||^2 + theta2 (n - 1) (all mass on the sample of largest
    loss, moved by (r - u_max) / ||beta||). ``dup``: the top sample three more times, one of
    them moved by 1e-7, so that four samples are active (theta2 = 0.25). theta2 = 1e-6: the
    weights' alpha (2 theta2 (n - 1) = 2e-4) was computed as a correction of a first alpha of
    some 1e4 and kept its rounding (a mass of 1 - 3e-8)."""
    getcontext().prec = 60
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 2))
    y = np.sign(X[:, 0] + 0.3 * rng.normal(size=100))
    beta = np.array([1.0, 0.5])
    m = otstab.LinearModel(beta, 0.1)
    if dup:
        i = int(np.argmax(1 - y * m.decision_function(X)))
        X = np.vstack([X, X[i], X[i], X[i] - 1e-7 * y[i] * np.array([1.0, 0.0])])
        y = np.concatenate([y, [y[i]] * 3])
    u = 1 - y * m.decision_function(X)
    n, b2 = u.size, float(beta @ beta)
    kw = dict(loss="hinge", r=r, theta1=1.0, theta2=theta2, divergence="chi2", se=None)
    res = otstab.certify(m, X, y, **kw)
    assert res.status == "optimal"
    c, h = Decimal(b2) / 4, Decimal(res.h)
    lh = [max(Decimal(0), Decimal(float(v)) * h + c * h * h) for v in u]
    lower = float(h * Decimal(r) - _dec_chi2_term(lh, Decimal(theta2)))
    assert res.value == pytest.approx(lower, rel=1e-9)
    risk, cost = _hinge_audit(m, X, y, res)
    assert risk >= r * (1 - 1e-8)
    assert cost == pytest.approx(res.value, rel=1e-7)
    assert otstab.certify(m, X, y, sample_weight=np.ones(n), **kw).value == \
        pytest.approx(res.value, rel=1e-9)
    if not dup:
        assert res.value == pytest.approx((r - u.max()) ** 2 / b2 + theta2 * (n - 1),
                                          rel=1e-12)


def _hinge_audit(m, X, y, res):
    """Risk and cost of res's Q* from the model's decision function at X_star."""
    Xs, src = np.asarray(res.X_star), np.asarray(res.source)
    w, mass = np.asarray(res.weights), np.asarray(res.mass)
    n = X.shape[0]
    risk = float(np.sum(mass * w * np.maximum(0, 1 - y[src] * m.decision_function(Xs)))) / n
    cost = res.theta1 * float(np.sum(mass * w * np.sum((Xs - X[src]) ** 2, axis=1))) / n
    cost += res.theta2 * float(np.sum(mass * (w - 1) ** 2)) / n
    return risk, cost


@pytest.mark.parametrize("theta2", [0.25, 1e-6])
@pytest.mark.parametrize("r", [1e6, 1e8])
def test_chi2_absolute_loss_at_a_large_threshold(r, theta2):
    """The dense reduced form (absolute loss of a regressor, l_h = |e| h + ||beta||^2 h^2 / 4
    at theta1 = 1): all mass on the largest residual, moved by (r - max|e|) / ||beta||, so
    R = (r - max|e|)^2 / ||beta||^2 + theta2 (n - 1) (the dual at otstab's h in decimals
    agrees: a lower bound equal to this feasible cost)."""
    getcontext().prec = 60
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 2))
    beta = np.array([1.0, 0.5])
    m = otstab.LinearModel(beta, 0.1, task="regression")
    y = m.predict(X) + rng.normal(size=100)
    e = np.abs(y - m.predict(X))
    b2 = float(beta @ beta)
    res = otstab.certify(m, X, y, loss="absolute", r=r, theta1=1.0, theta2=theta2,
                         divergence="chi2", se=None)
    assert res.status == "optimal"
    closed = (r - e.max()) ** 2 / b2 + theta2 * (e.size - 1)
    assert res.value == pytest.approx(closed, rel=1e-12)
    h = Decimal(res.h)
    lh = [Decimal(float(v)) * h + Decimal(b2) / 4 * h * h for v in e]
    assert res.value == pytest.approx(float(h * Decimal(r) - _dec_chi2_term(
        lh, Decimal(theta2))), rel=1e-9)
