"""The blockwise certificate builder (issue 17) against the direct one and against the model.

``otstab.piecewise.build_result`` works over row blocks (``AUDIT_BLOCK``); above
``AUDIT_DIRECT_MAX`` rows it sums the audit from the reduced form, applies the tied samples that
move as mass corrections and re-scores a random sample of atoms with the model
(``AUDIT_SAMPLE`` atoms in blocks of ``SAMPLE_BLOCK``). Forcing that path on small data with
tiny blocks must give the answer of the direct path (which re-scores every atom with the
model), and both must pass an audit recomputed here from the model's own ``decision_function``
and ``predict``, without otstab's reduction.

Ties and a split sample are forced: a row is duplicated across the block boundaries 7 and 64,
the kink h_j where two of its pieces tie is computed here from the scores, and r is put
strictly between the left and right derivatives of the dual's subtracted term at h_j
(``E_P0[w d_lo]`` and ``E_P0[w d_hi]``, the envelope theorem for KL and chi2), so the dual's
maximiser is h_j and the copies of the row share the risk still needed: some move to the high
piece, one is split.
"""

from __future__ import annotations

import functools
import math
import pickle

import numpy as np
import otstab_solvers.dual as sd
import otstab_solvers.weights as ws
import pytest
from otstab_solvers.sorted_oracle import KeyRule
from scipy.optimize import brentq
from scipy.special import logsumexp, softmax

import otstab
import otstab.solve._piecewise as pw
import otstab.solve._zero_one as zo
from otstab.errors import SolverError
from otstab.modeling._losses import epsilon_insensitive, pinball
from otstab.modeling._reduction import Reduced

LOSSES = ("hinge", "absolute", "pinball", "eps", "multiclass")
DIVERGENCES = (("kl", 0.5), ("chi2", 2.0), ("kl", math.inf))
#: rows of the duplicated (split) sample: across the block boundaries 7 and 64
SPLIT_AT = (5, 6, 7, 8, 62, 63, 64, 65)
#: share of the copies' total gain that r asks for: 8 * 0.37 = 2.96 copies move, so two move
#: whole and one is split (0.96 of it on the high piece)
SHARE = 0.37
#: random rows of each instance (the first rows)
N_RANDOM = 300


# --- instances ---------------------------------------------------------------------------------

def _loss_obj(name):
    return {"hinge": "hinge", "absolute": "absolute", "pinball": pinball(0.3),
            "eps": epsilon_insensitive(0.1), "multiclass": "multiclass_hinge"}[name]


def _slopes(name):
    """(slopes, intercepts, on) of the piecewise-linear losses, written out here."""
    return {"hinge": ((0.0, -1.0), (0.0, 1.0), "margin"),
            "absolute": ((1.0, -1.0), (0.0, 0.0), "residual"),
            "pinball": ((0.3, -0.7), (0.0, 0.0), "residual"),
            "eps": ((0.0, 1.0, -1.0), (0.0, -0.1, -0.1), "residual")}[name]


def model_losses(name, model, X, y):
    """The loss of every row, from the model's own decision_function."""
    s = model.decision_function(X)
    if name == "multiclass":
        y = np.asarray(y, dtype=np.intp)
        sy = s[np.arange(y.size), y]
        M = 1.0 + s - sy[:, None]
        M[np.arange(y.size), y] = 0.0
        return M.max(axis=1)
    a, b, on = _slopes(name)
    u = y * s if on == "margin" else y - s
    return np.max(np.outer(u, a) + np.asarray(b), axis=1)


def pieces(name, model, X, y, theta1):
    """(c1, c2), both (n, K): piece k of l_h is c1 h + c2 h^2 (the loss's k-th linear piece at
    the sample, and its squared gradient in x over 4 theta1: the best move along it)."""
    s = model.decision_function(X)
    W = np.atleast_2d(model.coef_)
    if name == "multiclass":
        y = np.asarray(y, dtype=np.intp)
        K = W.shape[0]
        c1 = 1.0 + s - s[np.arange(y.size), y][:, None]
        c1[np.arange(y.size), y] = 0.0
        dW = W[None, :, :] - W[y][:, None, :]  # (n, K, d): w_k - w_y
        g2 = np.einsum("nkd,nkd->nk", dW, dW)
        assert g2.shape[1] == K
    else:
        a, b, on = _slopes(name)
        a = np.asarray(a)
        u = y * s if on == "margin" else y - s
        c1 = np.outer(u, a) + np.asarray(b)
        g2 = np.broadcast_to(a * a * float(W[0] @ W[0]), c1.shape)
    return c1, g2 / (4.0 * theta1)


@functools.cache
def base_instance(name, seed=3):
    """(model, X, y): 300 random rows, 40 of them duplicated once more, plus rows exactly at a
    kink of the loss (margin 1, residual 0 or eps). Dyadic coefficients: the kink rows are
    exact in floating point."""
    rng = np.random.default_rng(seed)
    n0, d = N_RANDOM, 3
    X = rng.normal(size=(n0, d))
    if name == "multiclass":
        model = otstab.LinearModel(np.array([[1.0, -0.5, 0.25], [-0.5, 1.0, 0.5],
                                             [0.25, 0.5, -1.0]]), [0.25, 0.0, -0.25])
        y = model.predict(X)
        flip = rng.random(n0) < 0.25
        y = np.where(flip, (y + 1) % 3, y)
    elif name == "hinge":
        model = otstab.LinearModel([1.0, -0.5, 0.25], 0.5)
        y = np.where(rng.random(n0) < 0.8, model.predict(X), -model.predict(X))
        # scores exactly +1 and -1: margins exactly 1 with these labels
        Xk = np.array([[0.5, 0.0, 0.0], [-1.5, 0.0, 0.0]] * 2)
        X = np.vstack([X, Xk])
        y = np.concatenate([y, [1, -1, 1, -1]])
    else:
        model = otstab.LinearModel([1.0, -0.5, 0.25], 0.5, task="regression")
        y = model.decision_function(X) + rng.normal(scale=0.5, size=n0)
        Xk = np.array([[0.5, 0.0, 0.0], [-1.5, 0.25, 1.0]] * 2)
        sk = model.decision_function(Xk)  # dyadic: exact
        X = np.vstack([X, Xk])
        y = np.concatenate([y, sk + np.array([0.0, 0.0, 0.125, -0.125])])
    X = np.vstack([X, X[100:140]])
    y = np.concatenate([y, y[100:140]])
    return model, X, y


def with_split_row(name, theta1):
    """The base instance with one row copied to SPLIT_AT, and the kink h_j > 0 of that row
    where its two top pieces (of different derivatives) tie; None when no row has one."""
    model, X, y = base_instance(name)
    c1, c2 = pieces(name, model, X, y, theta1)
    best = None  # (|log hj|, j, hj): the kink closest to h = 1
    for j in range(N_RANDOM):  # not the exact kink rows: their kinks in h may coincide
        K = c1.shape[1]
        for k in range(K):
            for kk in range(K):
                dc2 = c2[j, kk] - c2[j, k]
                if dc2 <= 0:
                    continue
                hj = (c1[j, k] - c1[j, kk]) / dc2
                if not hj > 0:
                    continue
                v = c1[j] * hj + c2[j] * hj * hj
                if v.max() - v[k] <= 1e-12 * (1 + abs(v.max())) and (
                        best is None or abs(math.log(hj)) < best[0]):
                    best = (abs(math.log(hj)), j, float(hj))
    if best is not None:
        _, j, hj = best
        # the row moves to SPLIT_AT (its original place is dropped: it would be one more copy)
        Xs, ys = np.delete(X, j, axis=0), np.delete(y, j)
        for at in SPLIT_AT:
            Xs = np.insert(Xs, at, X[j], axis=0)
            ys = np.insert(ys, at, y[j])
        return model, Xs, ys, hj
    return model, X, y, None


def ref_weights(lh, theta2, divergence, p):
    """Q*'s weights at l_h by their closed forms (p: sample probabilities): KL
    exp(lh / theta2) / E_p exp(lh / theta2); chi2 ((lh + alpha) / (2 theta2) + 1)_+ with alpha
    from brentq on E_p[w] = 1; all ones when theta2 = inf."""
    if math.isinf(theta2):
        return np.ones_like(lh)
    if divergence == "kl":
        a = lh / theta2
        return np.exp(a - (logsumexp(a, b=p)))
    m = lh.max()

    def excess(al):
        return float(np.dot(p, np.maximum((lh - m + al) / (2 * theta2) + 1, 0))) - 1.0

    al = brentq(excess, -2 * theta2 - 1.0, 1.0 + (lh.max() - lh.min()), xtol=1e-15,
                rtol=1e-15)
    return np.maximum((lh - m + al) / (2 * theta2) + 1, 0)


def split_threshold(name, model, X, y, theta1, theta2, divergence, hj, p):
    """r for which the dual's maximiser is the kink hj (see the module docstring)."""
    c1, c2 = pieces(name, model, X, y, theta1)
    v = c1 * hj + c2 * hj * hj
    lh = v.max(axis=1)
    top = v >= lh[:, None] - 1e-12 * (1 + np.abs(lh[:, None]))
    d = c1 + 2 * hj * c2  # derivative of each piece in h: the loss at the moved point
    d_lo = np.where(top, d, np.inf).min(axis=1)
    d_hi = np.where(top, d, -np.inf).max(axis=1)
    tied = np.flatnonzero(d_hi > d_lo)
    assert set(tied.tolist()) == set(SPLIT_AT)
    w = ref_weights(lh, theta2, divergence, p)
    lo, hi = float(np.dot(p * w, d_lo)), float(np.dot(p * w, d_hi))
    return lo + SHARE * (hi - lo)


def sample_weight_for(n, weighted):
    if not weighted:
        return None
    return np.random.default_rng(7).uniform(0.2, 3.0, size=n)


def config(name, div, theta1, weighted):
    """(model, X, y, sample_weight, r, hj) of one case; hj is None when no split is forced
    (theta1 = inf: l_h is linear in h, there are no kinks in h)."""
    divergence, theta2 = div
    if math.isfinite(theta1):
        model, X, y, hj = with_split_row(name, theta1)
    else:
        (model, X, y), hj = base_instance(name), None
    sw = sample_weight_for(X.shape[0], weighted)
    p = np.full(X.shape[0], 1.0 / X.shape[0]) if sw is None else sw / sw.sum()
    if hj is not None:
        r = split_threshold(name, model, X, y, theta1, theta2, divergence, hj, p)
    else:
        loss = model_losses(name, model, X, y)
        base = float(np.dot(p, loss))
        r = base + 0.3 * (float(loss.max()) - base)
    return model, X, y, sw, r, hj


# --- the independent audit ---------------------------------------------------------------------

def phi_ref(w, divergence):
    if divergence == "chi2":
        return (w - 1.0) ** 2
    safe = np.where(w > 0, w, 1.0)
    return np.where(w > 0, w * np.log(safe) - w + 1.0, 1.0)


def independent_audit(name, model, X, y, sw, res, losses=None):
    """(cost, risk, mass) of Q* from its atoms: cost = theta1 E[mass w |x* - x|^2] +
    theta2 E[mass phi(w)], risk = E[mass w loss(x*)], mass = E[mass w] (E over P0: the atom
    carries its sample's probability), the loss from the model's decision_function."""
    n = X.shape[0]
    p = np.full(n, 1.0 / n) if sw is None else sw / np.sum(sw)
    src, mass, w, Xs = np.asarray(res.source), res.mass, res.weights, res.X_star
    pm = mass * p[src]
    diff = Xs - X[src]
    move = np.einsum("ij,ij->i", diff, diff)
    loss = (losses or model_losses)(name, model, Xs, y[src])
    cost = 0.0 if math.isinf(res.theta1) else res.theta1 * float(np.sum(pm * w * move))
    cost += 0.0 if math.isinf(res.theta2) else res.theta2 * float(
        np.sum(pm * phi_ref(w, res.divergence)))
    return cost, float(np.sum(pm * w * loss)), float(np.sum(pm * w))


def check_against_model(name, model, X, y, sw, res, r, losses=None):
    cost, risk, mass = independent_audit(name, model, X, y, sw, res, losses)
    assert res.status == "optimal"
    assert cost == pytest.approx(res.value, rel=1e-6)
    assert risk >= r * (1 - 1e-8)
    assert risk == pytest.approx(r, rel=1e-6)
    assert risk == pytest.approx(res.risk_star, rel=1e-6)
    assert mass == pytest.approx(1.0, abs=1e-9)
    # every sample's mass is split among its atoms and sums to 1
    np.testing.assert_allclose(np.bincount(res.source, res.mass, minlength=X.shape[0]), 1.0,
                               rtol=0, atol=1e-12)


# --- 1. blockwise and sampled audit vs the direct one ----------------------------------------

def run(monkeypatch, args, *, block=None, sample_block=None, sample=None, direct=True,
        window=False, **kw):
    model, X, y, sw, r, _ = args
    with monkeypatch.context() as m:
        if not direct:
            m.setattr(pw, "AUDIT_DIRECT_MAX", 0)
        if window:  # the hinge dual on a window of sorted keys (otherwise above 2^17 rows)
            m.setattr(sd, "WINDOW_MIN_N", 0)
        if block is not None:
            m.setattr(pw, "AUDIT_BLOCK", block)
            m.setattr(ws, "BLOCK", block)
        if sample_block is not None:
            m.setattr(pw, "SAMPLE_BLOCK", sample_block)
        if sample is not None:
            m.setattr(pw, "AUDIT_SAMPLE", sample)
        return otstab.certify(model, X, y, loss=_loss_obj(kw.pop("name")), r=r,
                              sample_weight=sw, se=None, **kw)


def check_same_mass(res, direct, sw):
    """The atoms' masses agree: exactly where whole, and on the split sample to the resolution
    of the risk it adjusts. (Its share is (n r - low risk - moved gains) / gain: the low risk
    sums n terms, in blocks of AUDIT_BLOCK on one path and at once on the other, so the share
    carries a rounding of about n eps r / gain, 1e-11 for a gain of 0.02; what it moves of the
    risk is share * p w (loss_hi - loss_lo), bounded here by 1e-12 r.)"""
    whole = direct.mass == 1.0
    np.testing.assert_array_equal(res.mass[whole], direct.mass[whole])
    n = direct.source.size if sw is None else sw.size
    p = np.full(n, 1.0 / n) if sw is None else sw / np.sum(sw)
    moved_risk = np.abs(res.mass - direct.mass) * p[direct.source] * direct.weights * \
        direct.loss_star
    assert float(np.sum(moved_risk)) <= 1e-12 * direct.r


CASES = [(name, div, t1, wt) for name in LOSSES for div in DIVERGENCES for t1 in (1.0, math.inf)
         for wt in (False, True) if not (math.isinf(t1) and math.isinf(div[1]))]


def _id(c):
    name, (dv, t2), t1, wt = c
    return f"{name}-{dv}-t2={t2:g}-t1={t1:g}-{'sw' if wt else 'unif'}"


#: the hinge cases again with the dual on a window of sorted keys (solve_two_piece): the
#: keyed builder then sums Q* from the window's keys
WINDOWED = [c + (True,) for c in CASES if c[0] == "hinge"]


@pytest.mark.parametrize("case", [c + (False,) for c in CASES] + WINDOWED,
                         ids=[_id(c[:4]) for c in CASES] + [_id(c[:4]) + "-window"
                                                            for c in WINDOWED])
def test_blockwise_sampled_audit_matches_direct(monkeypatch, case):
    name, div, theta1, weighted, window = case
    args = config(name, div, theta1, weighted)
    model, X, y, sw, r, hj = args
    X0, y0 = X.copy(), y.copy()
    kw = dict(name=name, theta1=theta1, theta2=div[1], divergence=div[0], window=window)
    direct = run(monkeypatch, args, **kw)
    assert direct.info["audit"]["method"] == "direct"
    if hj is not None:  # the forced kink was found and the copies of the row share the risk
        assert direct.h == pytest.approx(hj, rel=1e-9)
        assert direct.split
    check_against_model(name, model, X, y, sw, direct, r)
    for block, sblock, sample in ((7, 5, 97), (64, 5, None), (X.shape[0] + 1, 5, None)):
        res = run(monkeypatch, args, block=block, sample_block=sblock, sample=sample,
                  direct=False, **kw)
        audit_info = res.info["audit"]
        assert audit_info["method"] == "sampled"
        if window and sw is None and math.isfinite(theta1):  # (chi2 too)
            assert res.info["window"]["tries"][-1]["status"] == "optimal"
        assert audit_info["sample"] == min(sample or X.shape[0] + 1, res.n_atoms)
        assert audit_info["max_rel_error"] <= 1e-12
        assert res.status == direct.status
        assert res.split == direct.split
        assert res.value == pytest.approx(direct.value, rel=1e-12)
        assert res.h == pytest.approx(direct.h, rel=1e-12)
        for f in ("risk_star", "total_mass", "primal_cost", "risk_base"):
            assert getattr(res, f) == pytest.approx(getattr(direct, f), rel=1e-9, abs=1e-13), f
        for key, v in direct.decomposition.items():
            assert res.decomposition[key] == pytest.approx(v, rel=1e-9, abs=1e-12), key
        # the lazily built atoms are the direct path's
        np.testing.assert_array_equal(res.source, direct.source)
        check_same_mass(res, direct, sw)
        np.testing.assert_allclose(res.weights, direct.weights, rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(res.X_star, direct.X_star, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(res.loss_star, direct.loss_star, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(res.info["moved2"](), direct.info["moved2"], rtol=1e-9,
                                   atol=1e-13)
        check_against_model(name, model, X, y, sw, res, r)
    np.testing.assert_array_equal(X, X0)  # the caller's arrays are left alone
    np.testing.assert_array_equal(y, y0)


# --- 2. the split sample ------------------------------------------------------------------------

SPLIT_CASES = [c for c in CASES if math.isfinite(c[2]) and c[0] != "absolute"]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[_id(c) for c in SPLIT_CASES])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sampled"])
def test_forced_split(monkeypatch, case, direct):
    name, div, theta1, weighted = case
    args = config(name, div, theta1, weighted)
    model, X, y, sw, r, hj = args
    n = X.shape[0]
    res = run(monkeypatch, args, block=None if direct else 7, sample_block=5, direct=direct,
              name=name, theta1=theta1, theta2=div[1], divergence=div[0])
    assert res.split
    assert res.n_atoms == n + 1  # one extra atom: the split sample's share on its high piece
    src, mass = np.asarray(res.source), res.mass
    np.testing.assert_array_equal(src[:n], np.arange(n))
    j = int(src[n])
    assert j in SPLIT_AT
    assert 0.0 < mass[n] < 1.0 and mass[j] == pytest.approx(1.0 - mass[n], abs=1e-15)
    assert res.weights[n] == res.weights[j]
    np.testing.assert_allclose(np.bincount(src, mass, minlength=n), 1.0, rtol=0, atol=1e-15)
    # the copies: two whole on the high piece, five on the low one, the split one in both
    Xs = res.X_star
    hi = [at for at in SPLIT_AT if np.array_equal(Xs[at], Xs[n])]
    lo = [at for at in SPLIT_AT if np.array_equal(Xs[at], Xs[j])]
    assert len(hi) == 2 and len(lo) == 6 and j in lo
    assert not np.array_equal(Xs[n], Xs[j])
    # with uniform P0 every copy has the same gain, so 8 * SHARE = 2.96 copies move. The
    # solver's h is the kink to ~1e-11 relative, and the share need / gain amplifies the error
    # of need (n r less a sum of n terms) by n r / gain (~1e5 with a weight of 0.02): 1e-4
    if not weighted:
        assert mass[n] == pytest.approx(len(SPLIT_AT) * SHARE - 2, abs=1e-4)


# --- 3. the weight map ------------------------------------------------------------------------

def _lh_cases():
    rng = np.random.default_rng(11)
    lh = rng.gamma(2.0, size=1001)
    lh[:40] = lh.max()  # ties at the top
    return lh


@pytest.mark.parametrize("theta2", [1e-6, 0.3, 4.0, 1e8])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("block", [7, 1000, 1 << 15])
def test_weight_map_kl_closed_form(monkeypatch, theta2, weighted, block):
    monkeypatch.setattr(ws, "BLOCK", block)
    lh = _lh_cases()
    n = lh.size
    p = None if not weighted else np.random.default_rng(5).uniform(0.1, 2.0, n)
    if p is not None:
        p = p / p.sum()
    wm = ws.weight_map(lh, theta2, "kl", p)
    if p is None:  # n softmax(lh / theta2)
        ref = n * softmax(lh / theta2)
        pr = np.full(n, 1.0 / n)
    else:
        ref = np.exp(lh / theta2 - logsumexp(lh / theta2, b=p))
        pr = p
    # lh / theta2 is rounded to eps |lh| / theta2 before exp: the weights' own conditioning
    rtol = 1e-12 + 4 * np.finfo(float).eps * float(np.max(lh)) / theta2
    np.testing.assert_allclose(wm(lh), ref, rtol=rtol, atol=1e-300)
    # a block of rows gets the weights of the whole vector
    np.testing.assert_allclose(wm(lh[13:29]), ref[13:29], rtol=rtol, atol=1e-300)
    assert float(np.dot(pr, wm(lh))) == pytest.approx(1.0, abs=1e-12)
    # term = theta2 log E_p exp(lh / theta2). For theta2 = 1e8 log-sum-exp keeps only the
    # rounding of a mean close to 1; there the cumulant series of log E exp(t lh) with
    # t = 1 / theta2, kappa1 + kappa2 t / 2 + kappa3 t^2 / 6 (next term O(t^3) ~ 1e-24), is
    # exact to rounding
    if theta2 > 1e6:
        k1 = float(np.dot(pr, lh))
        c = lh - k1
        k2, k3 = float(np.dot(pr, c * c)), float(np.dot(pr, c ** 3))
        term = k1 + k2 / (2 * theta2) + k3 / (6 * theta2 ** 2)
        # the expm1 branch resolves term - mean (about k2 / (2 theta2)) to a few percent at least
        assert wm.term - k1 == pytest.approx(term - k1, rel=1e-3)
    else:
        term = theta2 * float(logsumexp(lh / theta2, b=pr))
    assert wm.term == pytest.approx(term, rel=1e-13, abs=1e-300)
    assert wm.alpha is None


@pytest.mark.parametrize("theta2", [1e-6, 0.3, 4.0, 1e8])
@pytest.mark.parametrize("weighted", [False, True])
def test_weight_map_chi2_closed_form(monkeypatch, theta2, weighted):
    monkeypatch.setattr(ws, "BLOCK", 7)
    lh = _lh_cases()
    n = lh.size
    p = np.full(n, 1.0 / n) if not weighted else np.random.default_rng(5).uniform(0.1, 2.0, n)
    p = p / p.sum()
    wm = ws.weight_map(lh, theta2, "chi2", None if not weighted else p)
    ref = ref_weights(lh, theta2, "chi2", p)
    w = wm(lh)
    np.testing.assert_allclose(w, ref, rtol=1e-9, atol=1e-9)
    assert float(np.dot(p, w)) == pytest.approx(1.0, abs=1e-12)
    # alpha in closed form on the active set A of the reference weights: E_p[w] = 1 reads
    # sum_A p ((lh + alpha) / (2 theta2) + 1) = 1, alpha = (2 theta2 (1 - P_A) - S_A) / P_A,
    # with 1 - P_A summed over the inactive samples (not 1 - P_A: its rounding times theta2)
    act = ref > 0
    P_A, S_A = float(np.sum(p[act])), float(np.dot(p[act], lh[act]))
    alpha = (2 * theta2 * float(np.sum(p[~act])) - S_A) / P_A
    assert wm.alpha == pytest.approx(alpha, rel=1e-9, abs=1e-12 * (1 + abs(alpha)))
    # the dual's term -alpha - theta2 + theta2 E_p[w^2], written without cancellation: an
    # active sample (v = (lh + alpha) / (2 theta2) > -1) gives lh + alpha + theta2 v^2, an
    # inactive one -theta2; then minus alpha
    sft = lh + alpha
    v = sft / (2 * theta2)
    term = float(np.dot(p, np.where(v > -1, sft + theta2 * v * v, -theta2))) - alpha
    assert wm.term == pytest.approx(term, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_weight_map_theta2_inf_is_ones(divergence):
    lh = _lh_cases()
    wm = ws.weight_map(lh, math.inf, divergence)
    np.testing.assert_array_equal(wm(lh), np.ones(lh.size))
    assert wm.term == pytest.approx(float(np.mean(lh)), rel=1e-14)


# --- 4. 0/1 loss: the moved rows in blocks --------------------------------------------------

def zero_one_losses(name, model, X, y):
    return (model.predict(X) != y).astype(float)


ZO_CASES = [(name, div, wt) for name in ("hinge", "multiclass") for div in DIVERGENCES
            for wt in (False, True)]


@pytest.mark.parametrize("case", ZO_CASES, ids=[f"{c[0]}-{c[1][0]}-{c[1][1]:g}-{c[2]}"
                                                 for c in ZO_CASES])
def test_zero_one_moved_blocks(monkeypatch, case):
    name, (divergence, theta2), weighted = case
    model, X, y = base_instance(name)
    sw = sample_weight_for(X.shape[0], weighted)
    p = np.full(X.shape[0], 1.0 / X.shape[0]) if sw is None else sw / sw.sum()
    base = float(np.dot(p, zero_one_losses(name, model, X, y)))
    r = base + 0.15
    kw = dict(loss="zero_one", r=r, theta1=1.0, theta2=theta2, divergence=divergence,
              sample_weight=sw, se=None)
    ref = otstab.certify(model, X, y, **kw)
    with monkeypatch.context() as m:
        m.setattr(zo, "MOVED_BLOCK", 3)
        res = otstab.certify(model, X, y, **kw)
    for f in ("value", "h", "status", "split", "risk_star", "total_mass", "primal_cost"):
        assert getattr(res, f) == getattr(ref, f), f
    assert res.decomposition == ref.decomposition
    for f in ("X_star", "weights", "source", "mass", "loss_star"):
        np.testing.assert_array_equal(getattr(res, f), getattr(ref, f))
    # the displacement of any atoms is X_star - X at their source
    atoms = np.concatenate([np.arange(res.n_atoms)[::-1], [0, res.n_atoms - 1]])
    disp = res.info["displacement"](atoms)
    np.testing.assert_array_equal(disp, res.X_star[atoms] - X[res.source[atoms]])
    assert np.any(disp != 0)
    check_against_model(name, model, X, y, sw, res, r, zero_one_losses)


# --- 5. pickling a lazy result ----------------------------------------------------------------

def _lazy_result(monkeypatch):
    args = config("hinge", ("kl", 0.5), 1.0, False)
    return run(monkeypatch, args, block=7, sample_block=5, direct=False, name="hinge",
               theta1=1.0, theta2=0.5, divergence="kl")


def _roundtrip_equal(res, dumps, access_first):
    fields = ("X_star", "weights", "source", "mass", "loss_star")
    if access_first:
        [getattr(res, f) for f in fields]
    back = pickle.loads(dumps(res))
    for f in fields:
        np.testing.assert_array_equal(getattr(back, f), getattr(res, f))
    def moved2(r):  # built on first access, or already built (pickled results hold it)
        m2 = r.info["moved2"]
        return m2() if callable(m2) else m2

    np.testing.assert_array_equal(moved2(back), moved2(res))
    # the blockwise displacement (for Dask's Q*) is a closure over the live result: a pickled
    # result leaves it out, and its atoms say the same
    assert "displacement" not in back.info
    atoms = np.arange(res.n_atoms)
    np.testing.assert_allclose(np.asarray(back.X_star) - back.X[np.asarray(back.source)],
                               res.info["displacement"](atoms), rtol=0, atol=1e-14)
    assert (back.value, back.h, back.status) == (res.value, res.h, res.status)


@pytest.mark.parametrize("access_first", [False, True])
def test_cloudpickle_roundtrip_of_lazy_result(monkeypatch, access_first):
    cloudpickle = pytest.importorskip("cloudpickle")
    _roundtrip_equal(_lazy_result(monkeypatch), cloudpickle.dumps, access_first)


@pytest.mark.parametrize("access_first", [False, True])
def test_plain_pickle_roundtrip_of_lazy_result(monkeypatch, access_first):
    _roundtrip_equal(_lazy_result(monkeypatch), pickle.dumps, access_first)


# --- 6. a reduced form that disagrees with the model ---------------------------------------

@pytest.mark.parametrize("solver", ["dual", pytest.param("auto", marks=pytest.mark.slow)])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["margin_up", "margin_down"])
@pytest.mark.parametrize("threads", [1, 2])
def test_sampled_audit_refuses_a_corrupted_reduced_form(monkeypatch, solver, sign, threads):
    """The moved scores of the reduced form shifted by 1e-3 y (y the +-1 label, so every margin
    moves by sign 1e-3): margin_up lowers the risk the sums report (the audit's own risk check
    refuses that), margin_down raises it above r, and then only the sampled check against the
    model stands between the corrupted sums and an answer. The hinge's builder from the sorted
    keys (``piecewise._build_keyed``) sums the loss at the moved points from the keys
    (``KeyRule.loss_moved``): that is corrupted the same way. ``threads``: the sampled
    check's blocks spread over two threads (as at 1e6 rows)."""
    if threads == 2:
        from otstab.modeling import _fingerprint

        monkeypatch.setattr(_fingerprint, "PARALLEL_MIN", 1)
        monkeypatch.setattr(_fingerprint, "blas_threads", lambda: 2)
    name, div = "hinge", ("kl", 0.5)
    args = config(name, div, 1.0, False)
    model, X, y, sw, r, _ = args
    honest = Reduced.moves
    honest_keyed = KeyRule.loss_moved

    def corrupted(self, W, src, piece, h):
        shift, moved2 = honest(self, W, src, piece, h)
        return (None if shift is None else shift + sign * 1e-3 * self.g_rows[src]), moved2

    monkeypatch.setattr(Reduced, "moves", corrupted)
    monkeypatch.setattr(KeyRule, "loss_moved",
                        lambda self, nu: honest_keyed(self, nu) - sign * 1e-3)
    try:
        res = run(monkeypatch, args, block=7, sample_block=5, direct=False, name=name,
                  theta1=1.0, theta2=div[1], divergence=div[0], solver=solver)
    except SolverError as exc:
        assert "audit" in str(exc)
        return
    # a fallback may answer only when its own audit holds against the model
    assert solver != "dual", "the corrupted dual answer was returned"
    assert res.solver != "dual"
    check_against_model(name, model, X, y, sw, res, r)


# --- found while testing: a zero-weight row above the support --------------------------------

def test_zero_weight_row_of_largest_loss_is_the_dropped_row():
    """A row of sample weight 0 is not part of P0: R is that of the data without it. Here
    the dropped row has the largest loss and r needs moves (h ~ 580), so its l_h / theta2
    exceeds the support's by far more than 709."""
    model, X, y = base_instance("hinge")
    loss = model_losses("hinge", model, X, y)
    sw = np.ones(X.shape[0])
    sw[int(np.argmax(loss))] = 0.0
    keep = sw > 0
    base = float(np.mean(loss[keep]))
    r = base + 0.99 * (float(loss.max()) - base)
    kw = dict(loss="hinge", r=r, theta1=1e3, theta2=1e-3, divergence="kl", se=None)
    dropped = otstab.certify(model, X[keep], y[keep], **kw)
    res = otstab.certify(model, X, y, sample_weight=sw, **kw)
    assert res.value == pytest.approx(dropped.value, rel=1e-9)
    check_against_model("hinge", model, X, y, sw, res, r)


FC_CASES = [("hinge", "hinge"), ("hinge", "zero_one"), ("multiclass", "multiclass_hinge"),
            ("multiclass", "zero_one")]
#: per-feature prices: x~ = sqrt(c) x differs from x by the factors 1, 2, 3
FEATURE_COSTS = [1.0, 4.0, 9.0]


def _fc_threshold(name, loss, model, X, y):
    if loss == "zero_one":
        return float(np.mean(zero_one_losses(name, model, X, y))) + 0.15
    lv = model_losses(name, model, X, y)
    return float(lv.mean() + 0.3 * (lv.max() - lv.mean()))


@pytest.mark.parametrize("name, loss", FC_CASES)
def test_displacement_without_feature_costs_is_x_star_minus_x(name, loss):
    """The control of the xfail below: without prices the displacement is x* - x."""
    model, X, y = base_instance(name)
    res = otstab.certify(model, X, y, loss=loss, r=_fc_threshold(name, loss, model, X, y),
                         se=None)
    atoms = np.arange(res.n_atoms)
    np.testing.assert_allclose(res.info["displacement"](atoms),
                               res.X_star - X[res.source], rtol=0, atol=1e-14)


@pytest.mark.parametrize("name, loss", FC_CASES)
def test_displacement_with_feature_costs_is_x_star_minus_x(name, loss):
    model, X, y = base_instance(name)
    res = otstab.certify(model, X, y, loss=loss, r=_fc_threshold(name, loss, model, X, y),
                         feature_costs=FEATURE_COSTS, se=None)
    atoms = np.arange(res.n_atoms)
    np.testing.assert_allclose(res.info["displacement"](atoms),
                               res.X_star - X[res.source], rtol=0, atol=1e-14)


def test_dask_qstar_with_feature_costs_is_the_numpy_x_star():
    da = pytest.importorskip("dask.array")
    from otstab.scale import qstar

    model, X, y = base_instance("hinge")
    r = _fc_threshold("hinge", "hinge", model, X, y)
    kw = dict(loss="hinge", r=r, feature_costs=FEATURE_COSTS, se=None)
    ref = otstab.certify(model, X, y, **kw)
    res = otstab.certify(model, da.from_array(X, chunks=100), y, **kw)
    q = qstar(res).compute()
    np.testing.assert_allclose(q[list(res.feature_names)].to_numpy(), ref.X_star, rtol=0,
                               atol=1e-12)


# --- the 0/1 loss above AUDIT_DIRECT_MAX: the moved rows audited from the scores ------------

ZO_CASES = [("hinge", None, None), ("hinge", [0, 2], None), ("hinge", None, "weights"),
            ("hinge", None, "costs"), ("multiclass", None, None), ("multiclass", [1], None)]


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("name, features, extra", ZO_CASES)
def test_zero_one_sampled_audit_equals_direct(monkeypatch, name, features, extra, divergence):
    """Above AUDIT_DIRECT_MAX the 0/1 path takes the loss and squared move of every moved row
    from the scores (the reduced form) and re-scores only a sample with the model: the
    certificate must be the direct one (same value, Q*, risk, cost to rounding)."""
    import otstab.solve._audit as oa

    model, X, y = base_instance(name)
    kw = dict(loss="zero_one", r=_fc_threshold(name, "zero_one", model, X, y), se=None,
              divergence=divergence, features=features)
    if extra == "weights":
        kw["sample_weight"] = np.random.default_rng(5).uniform(0.2, 3.0, X.shape[0])
    if extra == "costs":
        kw["feature_costs"] = FEATURE_COSTS
    direct = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(oa, "AUDIT_DIRECT_MAX", 0)
    monkeypatch.setattr(oa, "AUDIT_SAMPLE", 37)
    sampled = otstab.certify(model, X, y, **kw)
    assert direct.info["audit"]["method"] == "direct"
    assert sampled.info["audit"]["method"] == "sampled"
    assert sampled.info["audit"]["max_rel_error"] <= 1e-12
    assert (sampled.status, sampled.value, sampled.h) == (direct.status, direct.value, direct.h)
    for f in ("risk_star", "total_mass", "primal_cost"):
        assert getattr(sampled, f) == pytest.approx(getattr(direct, f), rel=1e-12, abs=1e-15)
    np.testing.assert_array_equal(sampled.X_star, direct.X_star)
    np.testing.assert_array_equal(sampled.loss_star, direct.loss_star)


def test_zero_one_sampled_audit_refuses_a_wrong_reduced_form(monkeypatch):
    """Moved points that disagree with the scores the audit sums (here: Q*'s points are built
    halfway, so the model sees them correctly classified, while the reduced form says they
    cross the boundary) must not be passed off: the sampled check fails the audit."""
    import otstab.solve._audit as oa
    import otstab.solve._zero_one as oz

    model, X, y = base_instance("hinge")
    r = _fc_threshold("hinge", "zero_one", model, X, y)
    monkeypatch.setattr(oa, "AUDIT_DIRECT_MAX", 0)
    honest = oz.NearPoints.displacement
    monkeypatch.setattr(oz.NearPoints, "displacement",
                        lambda self, rows: 0.5 * honest(self, rows))
    honest_pr = oz.NearPoints.points_and_reduced  # (the sampled audit's points: built there)

    def halfway(self, X, rows):
        Xr, Xm, loss, sq = honest_pr(self, X, rows)
        return Xr, Xr + 0.5 * (Xm - Xr), loss, sq

    monkeypatch.setattr(oz.NearPoints, "points_and_reduced", halfway)
    with pytest.raises(SolverError, match="audit"):
        otstab.certify(model, X, y, loss="zero_one", r=r, se=None)
    # what stopped it is the sampled check: the reduced sums alone pass
    monkeypatch.setattr(oa, "SAMPLED_RTOL", math.inf)
    res = otstab.certify(model, X, y, loss="zero_one", r=r, se=None)
    assert res.info["audit"]["max_rel_error"] >= 1.0 / 2.0


@pytest.mark.parametrize("seed", range(6))
def test_values_max_is_the_largest_value(seed):
    """PiecewiseOracle.values_max (O(K), from each piece's largest c1) equals the largest of
    PiecewiseOracle.values over all rows, exactly, for shared and row-wise c2 and h from 0 to
    large; the weight map built from it is the one built from the full values."""
    from otstab_solvers.dual import PiecewiseOracle
    from otstab_solvers.weights import kl_weight_map_blocks, weight_map

    rng = np.random.default_rng(seed)
    n, K = 997, 3
    c1 = rng.standard_normal((n, K)) * 10.0 ** rng.uniform(-3, 3)
    c1[:, 0] = 0.0  # a zero piece, as the hinge's
    c2 = (np.abs(rng.standard_normal((1, K))) if seed % 2 else
          np.abs(rng.standard_normal((n, K))))
    c2[:, 0] = 0.0
    oracle = PiecewiseOracle(c1, c2)
    for h in (0.0, 1e-6, 0.37, 5.0, 1e4):
        lh = oracle.values(h)
        assert oracle.values_max(h) == float(np.max(lh))
        if h > 0:
            a = kl_weight_map_blocks(lambda s, e, lh=lh: lh[s:e], n, 0.3,
                                     top=oracle.values_max(h))
            b = weight_map(lh, 0.3, "kl")
            np.testing.assert_array_equal(a(lh), b(lh))
            assert a.term == b.term
