"""otstab's per-sample tree search side by side with dtai-veritas (issue 29).

What is comparable. otstab certifies the squared L2 distance ``d*_i`` from ``x_i`` to the
nearest input the model misclassifies (``otstab.bounds.tree_lower_distances``: a certified
lower bound, exact when the branch and bound completes; ``perturbation_search``: a found
point, the upper bound it starts from). veritas (``VeritasRobustnessSearch``) finds the
L-infinity distance ``r_i`` of the nearest adversarial example by a binary search over boxes
``[x - delta, x + delta]``, each step bounding the ensemble's output on the box: a certified
lower radius (no flip inside it) and an example. The two norms are related by
``||v||_inf <= ||v||_2 <= sqrt(d) ||v||_inf``, so, for every sample:

* a veritas example that the model's own ``predict`` misclassifies is a point whose squared
  L2 distance must be ``>= dlow_i``, otstab's certified lower bound (a violation refutes
  otstab's certificate: asserted);
* otstab's found point (misclassified, checked by ``predict``) has an L-inf distance that must
  be ``>=`` veritas' certified radius (a violation refutes veritas: counted and printed with
  its largest relative size);
* veritas' radius ``r_i`` is a certified lower bound on the L2 distance as well
  (``d*_i >= r_i^2``), and its example an upper bound: the benchmark reports how often
  each side is tighter than otstab's, and the time of otstab's branch and bound started from
  ``min(U_i, veritas example)`` (a smaller starting upper bound prunes more boxes).

``make_classification`` (20 features, 10 informative, 4,000 training rows), binary XGBoost /
LightGBM with ``n_jobs=1``, evaluation rows the model classifies correctly. veritas:
``start_delta`` = the L-inf distance of otstab's found point (an adversarial example lies
within it), ``max_time`` 2 s and 20 steps per sample. Quick: 20 trees of depth 4, 15 rows,
``max_nodes=5000``; full (``OTSTAB_BENCH=full``): 60 trees of depth 5, 30 rows,
``max_nodes=5000``. One line per case (``-s``); docs/benchmarks.md has the numbers.
"""

from __future__ import annotations

import contextlib
import io
import os
import time

import numpy as np
import pytest
from _benchlib import tree_case

from otstab import bounds
from otstab.modeling._perturbation import perturbation_search

veritas = pytest.importorskip("veritas")

FULL = os.environ.get("OTSTAB_BENCH") == "full"


def _case(lib, trees, depth, n_rows, seed=0):
    """The first ``n_rows`` correctly classified of 4 ``n_rows`` evaluation rows."""
    model, Xe, ye = tree_case(lib, trees, depth, 4 * n_rows, seed)
    right = np.flatnonzero(model.predict(Xe) == ye)[:n_rows]
    return model, Xe[right], ye[right]


def _veritas(model, X, y, start):
    """Per sample: (certified L-inf radius, L-inf upper, closest generated example, seconds)."""
    with contextlib.redirect_stdout(io.StringIO()):  # the converter prints its own check
        at = veritas.get_addtree(model)
    Z = X[:5]
    margin = model.predict(Z, output_margin=True) if hasattr(model, "get_booster") else \
        model.predict(Z, raw_score=True)
    np.testing.assert_allclose(np.ravel(at.eval(Z)), margin, rtol=0, atol=1e-4)
    out = []
    for x, yy, s in zip(X, y, start):
        t0 = time.perf_counter()
        # label 1 (margin > 0): minimise the margin; label 0: maximise it
        src, tgt = (at, None) if yy == 1 else (None, at)
        rs = veritas.VeritasRobustnessSearch(x, float(s), src, tgt, max_time=2, num_steps=20,
                                             silent=True)
        _, lo, up = rs.search()
        ex = [e for e in rs.generated_examples]
        best = min(ex, key=lambda e: float(np.abs(e - x).max())) if ex else None
        out.append((lo, up, best, time.perf_counter() - t0))
    return out


def _compare(lib, trees, depth, n_rows, max_nodes):
    model, X, y = _case(lib, trees, depth, n_rows)
    n, d = X.shape
    t0 = time.perf_counter()
    found = perturbation_search(model, X, y)
    t_search = time.perf_counter() - t0
    U = found.distances
    ok = np.isfinite(U)
    assert np.all(model.predict(found.points[ok]) != y[ok])
    t0 = time.perf_counter()
    dlow, info = bounds.tree_lower_distances(model, X, y, upper=U, max_nodes=max_nodes)
    t_bound = time.perf_counter() - t0

    linf_found = np.where(ok, np.abs(found.points - X).max(axis=1), np.inf)
    start = np.where(np.isfinite(linf_found), linf_found * 1.01 + 1e-9, 10.0)
    t0 = time.perf_counter()
    ver = _veritas(model, X, y, start)
    t_ver = time.perf_counter() - t0
    vlo = np.array([v[0] for v in ver])
    ex2 = np.full(n, np.inf)
    for i, (_, _, e, _) in enumerate(ver):
        if e is not None and model.predict(e[None, :])[0] != y[i]:
            ex2[i] = float(np.sum((e - X[i]) ** 2))
    # otstab's certificate against veritas' points: never refuted
    bad = ex2 < dlow * (1 - 1e-9)
    assert not bad.any(), np.c_[dlow, ex2][bad]
    # veritas' certified radius against otstab's found points (misclassified by predict):
    # strictly, and by how much (veritas stores thresholds in float32: LightGBM's float64
    # thresholds move by up to a float32 step)
    over = vlo / np.maximum(linf_found, 1e-300) - 1.0
    refuted_veritas = int(np.sum(linf_found < vlo))

    U2 = np.minimum(U, ex2)
    t0 = time.perf_counter()
    dlow2, info2 = bounds.tree_lower_distances(model, X, y, upper=U2, max_nodes=max_nodes)
    t_bound2 = time.perf_counter() - t0
    both = info["exact"] & info2["exact"]
    np.testing.assert_allclose(dlow2[both], dlow[both], rtol=1e-9, atol=0)
    assert np.all(dlow2 <= U2 * (1 + 1e-9))

    line = {
        "lib": lib, "trees": trees, "depth": depth, "rows": n,
        "otstab_search_s": t_search, "otstab_bound_s": t_bound,
        "otstab_exact": int(info["exact"].sum()), "otstab_nodes": info.get("nodes"),
        "veritas_s": t_ver, "veritas_median_s": float(np.median([v[3] for v in ver])),
        "veritas_exact": int(sum(abs(v[1] - v[0]) <= 1e-4 * max(v[1], 1e-12) for v in ver)),
        "veritas_example_tighter": int(np.sum(ex2 < U * (1 - 1e-9))),
        "veritas_radius_tighter": int(np.sum(vlo ** 2 > dlow * (1 + 1e-6))),
        "refuted_veritas": refuted_veritas,
        "refuted_by_at_most_rel": float(max(over.max(), 0.0)),
        "otstab_bound_from_veritas_upper_s": t_bound2, "nodes_from_veritas_upper":
            info2.get("nodes"),
        "median_linf_radius_over_l2": float(np.median(vlo[dlow > 0] / np.sqrt(dlow[dlow > 0]))),
    }
    print("\n" + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in line.items()))
    return line


@pytest.mark.quick
@pytest.mark.parametrize("lib", ["xgboost", "lightgbm"])
def test_veritas_quick(lib):
    _compare(lib, 20, 4, 15, 5000)


@pytest.mark.full
@pytest.mark.parametrize("lib", ["xgboost", "lightgbm"])
def test_veritas_full(lib):
    if not FULL:
        pytest.skip("full size: OTSTAB_BENCH=full")
    _compare(lib, 60, 5, 30, 5000)
