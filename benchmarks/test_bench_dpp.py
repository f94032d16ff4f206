"""Re-solving with cvxpy Parameters (DPP: compile once) versus rebuilding (issue 6).

Two sweeps on the hinge loss of a linear binary classifier (d = 5, KL, theta1 = 1,
theta2 = 0.25):

- an r-sweep over ``R_GRID`` x base risk:

  * ``conic DPP``: one :class:`ConicProgram` (``r`` is a Parameter), re-solved per r;
  * ``conic rebuild``: a fresh program (build + compile + solve) per r;
  * ``dual``: :func:`solve_dual` per r;
  * ``stability_curve`` with ``solver="clarabel"`` (DPP inside) and ``solver="dual"``
    (full audited certificates, Q* included);

- per-feature scores (feature j alone may move: ``c2 = a^2 w_j^2 / (4 theta1)``):

  * ``conic DPP``: one program with ``c2`` as a Parameter, re-solved per feature;
  * ``conic rebuild``: a fresh program per feature;
  * ``certify per feature``: ``otstab.certify(..., features=[j], solver="clarabel")``;
  * ``dual``: :func:`solve_dual` per feature;
  * ``feature_stability``: ``otstab.feature_stability`` (all features in one call).

Every method's values are checked against the reference per r / per feature; the largest
relative error over the sweep is recorded.
"""

from __future__ import annotations

import numpy as np
import pytest
from _benchlib import (
    CONIC_BACKENDS,
    THETA1,
    THETA2,
    check,
    fmt_n,
    instance,
    measure,
    reference_reduced,
    rel_error,
    require_api,
    sizes,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

R_GRID = (1.2, 1.4, 1.6, 1.8, 2.0)
DIV = "kl"
SWEEP_SIZES = sizes((1000,), (10_000,))
R_METHODS = ("conic DPP", "conic rebuild", "dual", "stability_curve clarabel",
             "stability_curve dual")
F_METHODS = ("conic DPP", "conic rebuild", "certify per feature clarabel", "dual",
             "feature_stability")
assert "clarabel" in CONIC_BACKENDS


def _worst(values, refs):
    errs = [rel_error(v, r) for v, r in zip(values, refs)]
    return max(errs) if errs else float("inf")


def _statuses(statuses):
    bad = [s for s in statuses if s != "optimal"]
    return "optimal" if not bad else f"{bad[0]} ({len(bad)}/{len(statuses)} not optimal)"


@pytest.mark.parametrize("n", SWEEP_SIZES)
@pytest.mark.parametrize("method", R_METHODS)
def test_r_sweep(benchmark, method, n):
    from otstab_solvers.conic import ConicProgram
    from otstab_solvers.dual import PiecewiseOracle, solve_dual

    inst = instance("hinge", n)
    grid = [f * inst.base for f in R_GRID]
    refs = [reference_reduced(inst.c1, inst.c2, r, DIV)["value"] for r in grid]
    benchmark.group = f"dpp r-sweep hinge {DIV} n={fmt_n(n)}"
    extra = {}

    if method == "conic DPP":
        def run():
            prog = ConicProgram(inst.c1, inst.c2, THETA2, DIV)
            sols = [prog.solve("clarabel", r) for r in grid]
            return [s.value for s in sols], [s.status for s in sols], sols
    elif method == "conic rebuild":
        def run():
            sols = [ConicProgram(inst.c1, inst.c2, THETA2, DIV).solve("clarabel", r)
                    for r in grid]
            return [s.value for s in sols], [s.status for s in sols], sols
    elif method == "dual":
        def run():
            sols = [solve_dual(PiecewiseOracle(inst.c1, inst.c2), r, THETA2, DIV) for r in grid]
            return [s.value for s in sols], [s.status for s in sols], sols
    else:
        require_api("stability_curve")
        import otstab

        solver = method.split()[-1]

        def run():
            df = otstab.stability_curve(inst.model, inst.X, inst.y, r=grid, loss="hinge",
                                        theta1=THETA1, theta2=THETA2, divergence=DIV,
                                        solver=solver).to_frame()
            return list(df["value"]), list(df["status"]), None

    values, statuses, sols = measure(benchmark, run, slow=n >= 10_000)
    if sols is not None and method.startswith("conic"):
        extra = {"compile_times": [s.compile_time for s in sols],
                 "solve_times": [s.solve_time for s in sols],
                 "build_time": sols[0].info.get("build_time")}
    check(benchmark, solver=method, status=_statuses(statuses),
          value=values[int(np.argmax([rel_error(v, r) for v, r in zip(values, refs)]))],
          reference=refs[int(np.argmax([rel_error(v, r) for v, r in zip(values, refs)]))],
          tol_kind="exact" if method in ("dual", "stability_curve dual") else "ipm",
          strict=True, suite="dpp_r", loss="hinge", divergence=DIV, n=n, d=inst.d, K=inst.K,
          theta1=THETA1, theta2=THETA2, r_grid=grid, count=len(grid), role="exact",
          max_rel_error=_worst(values, refs), **extra)


@pytest.mark.parametrize("n", SWEEP_SIZES)
@pytest.mark.parametrize("method", F_METHODS)
def test_feature_sweep(benchmark, method, n):
    from otstab_solvers.conic import ConicProgram
    from otstab_solvers.dual import PiecewiseOracle, solve_dual

    inst = instance("hinge", n)
    w = np.asarray(inst.model.coef_, dtype=float)
    d = w.size
    a2 = np.array([0.0, 1.0])  # hinge slopes squared: pieces (0, 0) and (-1, 1)
    c2s = [(a2 * w[j] ** 2 / (4.0 * THETA1))[None, :] for j in range(d)]
    refs = [reference_reduced(inst.c1, c2, inst.r, DIV)["value"] for c2 in c2s]
    benchmark.group = f"dpp features hinge {DIV} n={fmt_n(n)} d={d}"
    extra = {}

    if method == "conic DPP":
        def run():
            prog = ConicProgram(inst.c1, c2s[0], THETA2, DIV, c2_parameter=True)
            sols = [prog.solve("clarabel", inst.r, c2=c2) for c2 in c2s]
            return [s.value for s in sols], [s.status for s in sols], sols
    elif method == "conic rebuild":
        def run():
            sols = [ConicProgram(inst.c1, c2, THETA2, DIV).solve("clarabel", inst.r)
                    for c2 in c2s]
            return [s.value for s in sols], [s.status for s in sols], sols
    elif method == "dual":
        def run():
            sols = [solve_dual(PiecewiseOracle(inst.c1, c2), inst.r, THETA2, DIV) for c2 in c2s]
            return [s.value for s in sols], [s.status for s in sols], sols
    elif method == "certify per feature clarabel":
        import otstab

        def run():
            res = [otstab.certify(inst.model, inst.X, inst.y, loss="hinge", r=inst.r,
                                  theta1=THETA1, theta2=THETA2, divergence=DIV,
                                  solver="clarabel", features=[j]) for j in range(d)]
            return [x.value for x in res], [x.status for x in res], None
    else:
        require_api("feature_stability")
        import otstab

        def run():
            df = otstab.feature_stability(inst.model, inst.X, inst.y, loss="hinge", r=inst.r,
                                          theta1=THETA1, theta2=THETA2, divergence=DIV).to_frame()
            by = {str(f): s for f, s in zip(df["feature"], df["score"])}
            names = [f"x{j}" for j in range(d)]
            if not all(k in by for k in names):  # feature labels other than x0..x{d-1}
                names = sorted(by, key=lambda s: int("".join(ch for ch in s if ch.isdigit())
                                                     or 0))
            return [float(by[k]) for k in names], ["optimal"] * d, None

    values, statuses, sols = measure(benchmark, run, slow=n >= 10_000)
    if sols is not None and method.startswith("conic"):
        extra = {"compile_times": [s.compile_time for s in sols],
                 "solve_times": [s.solve_time for s in sols]}
    errs = [rel_error(v, r) for v, r in zip(values, refs)]
    i = int(np.argmax(errs))
    check(benchmark, solver=method, status=_statuses(statuses), value=values[i],
          reference=refs[i],
          tol_kind="exact" if method in ("dual", "feature_stability") else "ipm",
          strict=True, suite="dpp_features", loss="hinge", divergence=DIV, n=n, d=d, K=inst.K,
          theta1=THETA1, theta2=THETA2, r=inst.r, count=d, role="exact",
          max_rel_error=max(errs), **extra)
