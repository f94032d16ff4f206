"""Dask input (otstab.scale): results equal the NumPy path, Q* written to Parquet audits.

Every check compares against something computed independently of the Dask path: the NumPy
path on the same numbers (computed from the same Dask array), or the model's own decision
function on the points read back from Parquet.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import otstab
from otstab.errors import InputTypeError, ValidationError

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

from otstab_solvers import blockwise  # noqa: E402
from otstab_solvers.dual import PiecewiseOracle, solve_dual  # noqa: E402
from otstab_solvers.weights import phi  # noqa: E402
from reference import assert_same_measure  # noqa: E402

from otstab import dask_path, scale  # noqa: E402

RTOL = 1e-10


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    cl = distributed.Client(cluster)
    yield cl
    cl.close()
    cluster.close()


def _data(n, d, seed, K=2, chunks=None):
    """Dask X generated blockwise, its NumPy copy, a linear model and labels."""
    Xd = da.random.default_rng(seed).standard_normal((n, d), chunks=(chunks or n // 5 + 1, d))
    X = Xd.compute()
    rng = np.random.default_rng(seed)
    if K == 2:
        coef = rng.standard_normal(d)
        y = np.where(X @ coef + 0.7 * rng.standard_normal(n) > 0, 1, -1)
        return Xd, X, otstab.LinearModel(coef, 0.2), y
    W = rng.standard_normal((K, d))
    y = np.argmax(X @ W.T + rng.gumbel(size=(n, K)), axis=1)
    return Xd, X, otstab.LinearModel(W, np.zeros(K)), y


def _close(a, b, rtol=RTOL):
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-300)


def _same(res_np, res_dk):
    assert res_dk.status == res_np.status
    for key in ("value", "h", "risk_star", "primal_cost", "total_mass"):
        assert _close(getattr(res_np, key), getattr(res_dk, key)), key


CASES = [("hinge", 0.8), ("zero_one", 0.3), ("logistic", 0.75)]


@pytest.mark.parametrize("n", [3000, 240_000])  # direct audit; sampled audit (> 200k)
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("loss,r", CASES)
def test_equals_numpy(client, n, divergence, loss, r):
    Xd, X, model, y = _data(n, 4, seed=n % 7 + len(loss))
    res_np = otstab.certify(model, X, y, loss=loss, r=r, divergence=divergence)
    res_dk = otstab.certify(model, Xd, y, loss=loss, r=r, divergence=divergence)
    assert res_np.status == "optimal"
    _same(res_np, res_dk)
    assert isinstance(res_dk.X, scale.DaskRows)
    assert _close(res_np.se, res_dk.se, 1e-8)  # the analytic confidence interval


@pytest.mark.parametrize("loss", ["logistic", "squared",
                                  pytest.param("cross_entropy", marks=pytest.mark.slow)])
def test_smooth_losses_do_not_gather_x(client, monkeypatch, loss):
    """Logistic, squared and (multiclass) cross-entropy certificates on Dask data work on the
    gathered scores: X itself is never gathered (only the audited rows)."""
    Xd, X, model, y = _data(240_000, 3, seed=13, K=3 if loss == "cross_entropy" else 2)
    if loss == "squared":
        model = otstab.LinearModel(model.coef_, 0.0, task="regression")
        y = X @ model.coef_ + 0.3 * np.random.default_rng(1).standard_normal(X.shape[0])
    r = {"logistic": 0.75, "cross_entropy": 1.2}.get(loss) or \
        float(np.mean((y - model.predict(X)) ** 2)) * 1.5
    res_np = otstab.certify(model, X, y, loss=loss, r=r)

    def refuse(self, dtype=None, copy=None):
        raise AssertionError("X was gathered")

    monkeypatch.setattr(scale.DaskRows, "__array__", refuse)
    res_dk = otstab.certify(model, Xd, y, loss=loss, r=r)
    _same(res_np, res_dk)
    assert res_dk.info["audit"]["method"] == "sampled"


@pytest.mark.parametrize("loss,r", [("multiclass_hinge", 1.3), ("zero_one", 0.6)])
def test_multiclass_equals_numpy(client, loss, r):
    Xd, X, model, y = _data(5000, 3, seed=3, K=3)
    _same(otstab.certify(model, X, y, loss=loss, r=r),
          otstab.certify(model, Xd, y, loss=loss, r=r))


def test_dataframe_by_name_and_dask_labels(client):
    sklearn = pytest.importorskip("sklearn.linear_model")
    Xd, X, _, y = _data(4000, 3, seed=5)
    cols = ["a", "b", "c"]
    fitted = sklearn.LogisticRegression().fit(pd.DataFrame(X, columns=cols), y)
    ddf = dd.from_dask_array(Xd, columns=cols)[["c", "a", "b"]]  # other order: matched by name
    ys = dd.from_dask_array(da.from_array(y, chunks=1000))
    res_np = otstab.certify(fitted, pd.DataFrame(X, columns=cols), y, loss="hinge", r=0.9)
    res_dk = otstab.certify(fitted, ddf, ys, loss="hinge", r=0.9)
    _same(res_np, res_dk)
    assert list(res_dk.feature_names) == cols
    with pytest.raises(ValidationError, match="missing"):
        otstab.certify(fitted, ddf[["a", "b"]], ys, loss="hinge", r=0.9)


@pytest.mark.parametrize("lengths", [(800,) * 5, (800,) * 4 + (795,)])
@pytest.mark.parametrize("certify", [otstab.certify, dask_path.certify_distributed])
def test_chunk_sizes_that_lie(client, lengths, certify):
    """Chunk sizes are metadata that Dask does not validate (``to_dask_array(lengths=...)``):
    the blocks hold 801, 801, 801, 801 and 796 rows. Rows, offsets and gathers follow the
    blocks' own rows, so the certificate, its audit and any row gathered are NumPy's."""
    Xd, X, model, y = _data(4000, 3, seed=5)
    lying = dd.from_dask_array(Xd, columns=["a", "b", "c"]).to_dask_array(lengths=lengths)
    assert lying.chunks[0] == lengths
    res_np = otstab.certify(model, X, y, loss="zero_one", r=0.3)
    res_dk = certify(model, lying, y, loss="zero_one", r=0.3)
    _same(res_np, res_dk)
    rows = np.array([0, 800, 801, 3203, 3204, 3999])
    np.testing.assert_array_equal(res_dk.X[rows], X[rows])
    np.testing.assert_allclose(np.asarray(res_dk.X_star), res_np.X_star, rtol=0, atol=1e-9)


def test_features_and_curve_equal_numpy(client):
    Xd, X, model, y = _data(3000, 4, seed=9)
    fs_np = otstab.feature_stability(model, X, y, loss="hinge", r=0.8).to_frame()
    fs_dk = otstab.feature_stability(model, Xd, y, loss="hinge", r=0.8).to_frame()
    num = fs_np.select_dtypes("number").columns
    np.testing.assert_allclose(fs_dk[num].to_numpy(float), fs_np[num].to_numpy(float),
                               rtol=RTOL, atol=0)
    c_np = otstab.stability_curve(model, X, y, loss="zero_one", r=[0.25, 0.3]).to_frame()
    c_dk = otstab.stability_curve(model, Xd, y, loss="zero_one", r=[0.25, 0.3]).to_frame()
    for col in ("value", "h", "risk_star", "primal_cost"):
        np.testing.assert_allclose(c_dk[col].to_numpy(float), c_np[col].to_numpy(float),
                                   rtol=RTOL)


@pytest.mark.parametrize("certify,loss,r", [
    (otstab.certify, "hinge", 0.8), (otstab.certify, "zero_one", 0.3),
    (otstab.certify, "logistic", 0.75),
    (dask_path.certify_distributed, "hinge", 0.8),
    (dask_path.certify_distributed, "zero_one", 0.3)])
def test_qstar_parquet_audits(client, tmp_path, loss, r, certify):
    """Q* read back from Parquet: its risk (the model's own decision function at x*) reaches r
    and its cost (moves from x, weights through phi) equals the value."""
    n = 6000
    Xd, X, model, y = _data(n, 3, seed=11)
    res = certify(model, Xd, y, loss=loss, r=r)
    q = scale.qstar(res)
    assert isinstance(q, dd.DataFrame)  # lazy
    scale.write_qstar(res, str(tmp_path / "q"))
    df = pd.read_parquet(tmp_path / "q").sort_values("source", kind="stable")
    assert len(df) == np.asarray(res.source).size
    Xs = df[list(res.feature_names)].to_numpy()
    src, w, mass = df["source"].to_numpy(), df["weight"].to_numpy(), df["mass"].to_numpy()
    score = model.decision_function(Xs)
    ys = y[src]
    loss_star = {"hinge": lambda: np.maximum(1 - ys * score, 0),
                 "logistic": lambda: np.logaddexp(0.0, -ys * score),
                 "zero_one": lambda: (np.where(score > 0, 1, -1) != ys).astype(float)}[loss]()
    moved2 = np.sum((Xs - X[src]) ** 2, axis=1)
    risk = np.sum(mass * w * loss_star) / n
    cost = (res.theta1 * np.sum(mass * w * moved2) + res.theta2 * np.sum(mass * phi(w, "kl"))) / n
    assert risk >= r * (1 - 1e-8)
    assert abs(cost - res.value) <= 1e-6 * res.value
    assert abs(np.sum(mass * w) / n - 1) <= 1e-9
    np.testing.assert_allclose(Xs, res.X_star[np.argsort(np.asarray(res.source),
                                                         kind="stable")], rtol=0, atol=1e-12)


def test_changed_data_is_detected(client, tmp_path):
    """Q* and X are read again lazily: a result whose Parquet source changed refuses to
    describe it."""
    Xd, X, model, y = _data(1500, 2, seed=4)
    path = tmp_path / "data"
    path.mkdir()
    for k in range(3):
        pd.DataFrame(X[500 * k:500 * (k + 1)], columns=["x0", "x1"]).assign(
            label=y[500 * k:500 * (k + 1)]).to_parquet(path / f"part.{k}.parquet")
    Xr, yr = scale.read_parquet_dir(str(path), "label")
    res = otstab.certify(model, Xr, yr, loss="hinge", r=0.8)
    X2 = X[1000:].copy()
    X2[7, 0] += 1.0
    pd.DataFrame(X2, columns=["x0", "x1"]).assign(label=y[1000:]).to_parquet(
        path / "part.2.parquet")
    with pytest.raises(scale.DataChangedError, match="block 2"):
        res.X_star  # noqa: B018  (gathering re-reads the blocks)


def test_bad_input(client):
    Xd, X, model, y = _data(1000, 3, seed=1)
    bad = da.where(da.arange(1000)[:, None] == 617, np.nan, Xd)
    with pytest.raises(ValidationError, match="row 617"):
        otstab.certify(model, bad, y, loss="hinge", r=0.8)
    sklearn = pytest.importorskip("sklearn.pipeline")
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    pipe = sklearn.make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    with pytest.raises(InputTypeError, match="linear model"):
        otstab.certify(pipe, Xd, y, loss="hinge", r=0.8)
    with pytest.raises(ValidationError, match="features"):
        otstab.certify(otstab.LinearModel([1.0, 2.0]), Xd, y, loss="hinge", r=0.8)


def test_read_parquet_dir(client, tmp_path):
    Xd, X, model, y = _data(1500, 2, seed=4)
    pdf = pd.DataFrame({"x0": X[:, 0], "x1": X[:, 1], "label": y})
    dd.from_pandas(pdf, npartitions=3).to_parquet(str(tmp_path / "data"))
    Xr, yr = scale.read_parquet_dir(str(tmp_path / "data"), "label")
    _same(otstab.certify(model, X, y, loss="hinge", r=0.8),
          otstab.certify(model, Xr, yr, loss="hinge", r=0.8))
    with pytest.raises(ValidationError, match="target column"):
        scale.read_parquet_dir(str(tmp_path / "data"), "nope")


def test_read_only_and_writable_x_are_kept_by_reference():
    """One machine: a read-only X and a writable one are both kept by reference (no copy) and
    give the same answer; a Q* built before the caller changes X stays as it was, and a read of
    X after the change raises DataChangedError (the fingerprint, tests/test_no_copy.py)."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((500, 3))
    model = otstab.LinearModel([1.0, -0.5, 0.25])
    y = np.where(X @ model.coef_ + 0.5 * rng.standard_normal(500) > 0, 1, -1)
    frozen = X.copy()
    frozen.flags.writeable = False
    res_w = otstab.certify(model, X, y, loss="zero_one", r=0.3)
    res_f = otstab.certify(model, frozen, y, loss="zero_one", r=0.3)
    assert np.shares_memory(res_f.X, frozen) and np.shares_memory(res_w.X, X)
    assert not res_w.X.flags.writeable  # a read-only view: otstab never writes to it
    assert res_w.value == res_f.value
    before = np.array(res_w.X_star)
    X[:] = 0.0
    np.testing.assert_array_equal(res_w.X_star, before)  # built before the change: kept
    with pytest.raises(scale.DataChangedError):
        res_w.to_frame()
    res_f.to_frame()  # the other array did not change


def test_cli_reads_a_parquet_directory_with_dask(tmp_path):
    """``otstab certify --dask`` on a directory of Parquet files gives the value that the
    same rows give from one CSV file."""
    import contextlib
    import io
    import json

    import joblib
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    from otstab.cli import main

    pytest.importorskip("pyarrow")
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(900, 3)), columns=["a", "b", "c"])
    y = (X["a"] + 0.5 * rng.normal(size=900) > 0).astype(int)
    joblib.dump(LogisticRegression().fit(X, y), tmp_path / "m.joblib")
    (tmp_path / "pq").mkdir()
    frame = X.assign(label=y)
    for i in range(3):
        frame.iloc[300 * i:300 * (i + 1)].to_parquet(tmp_path / "pq" / f"part{i}.parquet")
    frame.to_csv(tmp_path / "all.csv", index=False)
    values = []
    for data, extra in [(tmp_path / "pq", ["--dask"]), (tmp_path / "all.csv", [])]:
        out = tmp_path / f"cert{len(values)}.json"
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["certify", "--model", str(tmp_path / "m.joblib"), "--trust-model",
                         "--data", str(data), "--target", "label", "--loss", "hinge",
                         "--r", "0.6", "--json", str(out), *extra])
        assert code == 0
        values.append(json.loads(out.read_text())["results"]["value"])
    assert values[0] == pytest.approx(values[1], rel=1e-10)


# ---------------------------------------------------------------------------------------------
# the distributed path (otstab.dask_path): scores persisted on the workers, the dual's sums,
# Q* and the audit as blockwise reductions


PRICES = [(1.0, 0.25), (float("inf"), 0.25), (1.0, float("inf"))]


@pytest.mark.parametrize("theta1,theta2", PRICES)
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("loss,r", [("hinge", 0.8), ("zero_one", 0.3001)])
def test_distributed_equals_numpy(client, loss, r, divergence, theta1, theta2):
    """Same value, h, risk, cost and mass of Q*, and SE, as the NumPy path (which sorts and
    solves in memory). For the 0/1 loss with theta2 = inf the dual is flat between two kinks
    when r n is an integer (any h there is optimal), hence r = 0.3001 with n = 3000."""
    Xd, X, model, y = _data(3000, 4, seed=7 + len(loss))
    kw = dict(loss=loss, r=r, divergence=divergence, theta1=theta1, theta2=theta2)
    res_np = otstab.certify(model, X, y, **kw)
    res_dk = dask_path.certify_distributed(model, Xd, y, **kw)
    assert res_np.status == "optimal"
    _same(res_np, res_dk)
    assert res_dk.info["distributed"] and res_dk.solver == "dual_blockwise"
    assert _close(res_np.se, res_dk.se, 1e-8)
    assert res_dk.info["audit"]["sample"] == 3000  # n <= AUDIT_SAMPLE: every row re-scored


@pytest.mark.parametrize("loss,r", [("hinge", 0.8), ("zero_one", 0.3)])
def test_distributed_atoms_equal_numpy(client, loss, r):
    """Q* gathered from the blocks (X_star, weights, source, mass, losses) is the NumPy
    path's, as a measure: the two paths sum in different orders, so a tied row may be split by
    one and not the other; per source row the mass, weighted mass, weighted x* and weighted loss
    agree (the 0/1 case at r = 0.3 splits one row)."""
    Xd, X, model, y = _data(3000, 4, seed=3)
    res_np = otstab.certify(model, X, y, loss=loss, r=r)
    res_dk = dask_path.certify_distributed(model, Xd, y, loss=loss, r=r)
    # (loss_star from the moved scores here, from the model at the moved points there)
    assert_same_measure(res_dk, res_np, X.shape[0], rtol=1e-9, atol=1e-9)
    assert len(res_dk.to_frame()) == np.asarray(res_dk.source).size


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("loss,r", [("hinge", 0.8), ("zero_one", 0.3)])
def test_sample_weight_with_dask(client, loss, r, divergence):
    """sample_weight given as a Dask array (other chunks than X's) on the gathered path and
    on the distributed path: the NumPy weighted answer."""
    Xd, X, model, y = _data(3000, 4, seed=5)
    sw = np.random.default_rng(1).random(3000) * 3
    kw = dict(loss=loss, r=r, divergence=divergence)
    res_np = otstab.certify(model, X, y, sample_weight=sw, **kw)
    sw_d = da.from_array(sw, chunks=1100)
    _same(res_np, otstab.certify(model, Xd, y, sample_weight=sw_d, **kw))
    res_dk = dask_path.certify_distributed(model, Xd, y, sample_weight=sw_d, **kw)
    _same(res_np, res_dk)
    assert _close(res_np.se, res_dk.se, 1e-8)


def test_distributed_regression_and_series(client):
    """A residual loss of a regressor, labels as a Dask Series."""
    Xd, X, model, _ = _data(2000, 3, seed=2)
    reg = otstab.LinearModel(model.coef_, 0.1, task="regression")
    yr = X @ model.coef_ + np.random.default_rng(0).standard_normal(2000)
    ys = dd.from_dask_array(da.from_array(yr, chunks=500))
    for loss, r in [("absolute", 1.5), (otstab.losses.pinball(0.3), 0.9)]:
        _same(otstab.certify(reg, X, yr, loss=loss, r=r),
              dask_path.certify_distributed(reg, Xd, ys, loss=loss, r=r))


def test_distributed_edge_cases(client):
    """r below the base risk (zero), and thresholds nothing can reach (unreachable): a zero
    model cannot move its hinge losses (all 1) above 1; with theta2 = inf only moving counts."""
    Xd, X, model, y = _data(2000, 3, seed=4)
    flat = otstab.LinearModel(np.zeros(3), 0.0)
    cases = [(model, dict(loss="hinge", r=0.01), "zero"),
             (model, dict(loss="zero_one", r=0.01), "zero"),
             (flat, dict(loss="hinge", r=1.5), "unreachable"),
             (flat, dict(loss="zero_one", r=0.8, theta2=float("inf")), "unreachable")]
    for m, kw, status in cases:
        res_np = otstab.certify(m, X, y, **kw)
        res_dk = dask_path.certify_distributed(m, Xd, y, **kw)
        assert res_dk.status == res_np.status == status
        assert res_dk.value == res_np.value
        assert _close(res_dk.risk_base, res_np.risk_base)


def test_distributed_bad_input(client):
    Xd, X, model, y = _data(1000, 3, seed=1)
    bad = da.where(da.arange(1000)[:, None] == 617, np.nan, Xd)
    with pytest.raises(ValidationError, match="row 617"):
        dask_path.certify_distributed(model, bad, y, loss="hinge", r=0.8)
    with pytest.raises(ValidationError, match="unknown to the model"):
        dask_path.certify_distributed(model, Xd, np.where(y > 0, 1, 5), loss="hinge", r=0.8)
    with pytest.raises(ValidationError, match="y has 999 entries"):
        dask_path.certify_distributed(model, Xd, y[:-1], loss="hinge", r=0.8)
    with pytest.raises(ValidationError, match="nonnegative"):
        dask_path.certify_distributed(model, Xd, y, loss="hinge", r=0.8,
                                      sample_weight=-np.ones(1000))
    with pytest.raises(ValidationError, match="sample_weight has 10 entries"):
        dask_path.certify_distributed(model, Xd, y, loss="hinge", r=0.8,
                                      sample_weight=np.ones(10))
    with pytest.raises(InputTypeError, match="not 'logistic'"):
        dask_path.certify_distributed(model, Xd, y, loss="logistic", r=0.8)
    with pytest.raises(InputTypeError, match="Dask X"):
        dask_path.certify_distributed(model, X, y, loss="hinge", r=0.8)


def test_wants_distributed(monkeypatch):
    Xd = da.zeros((5000, 2), chunks=(1000, 2))
    assert not dask_path.wants_distributed(Xd, "hinge")
    monkeypatch.setattr(dask_path, "DISTRIBUTED_MIN_ROWS", 4000)
    assert dask_path.wants_distributed(Xd, "hinge") and dask_path.wants_distributed(Xd,
                                                                                    "zero_one")
    assert not dask_path.wants_distributed(Xd, "logistic")
    assert not dask_path.wants_distributed(np.zeros((5000, 2)), "hinge")


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.3), ("chi2", 0.3), ("kl", np.inf),
                                               ("kl", 1e6), ("chi2", 1e-3)])
def test_blockwise_dual_equals_dense_dual(divergence, theta2):
    """otstab_solvers.blockwise without Dask (blocks in a list): the dual solved from
    per-block sums equals solve_dual on the dense oracle of all rows (random three-piece
    reduced form with one zero piece, uneven blocks, one empty)."""
    rng = np.random.default_rng(0)
    n = 2000
    c1 = np.column_stack([np.zeros(n), rng.standard_normal(n), 0.5 * rng.standard_normal(n)])
    c2 = np.array([[0.0, 0.3, 0.7]])
    cuts = [0, 300, 300, 1100, 2000]
    c1abs = float(np.max(np.abs(c1)))
    blocks = [blockwise.piecewise_block(c1[a:b], c2, c1abs) for a, b in zip(cuts, cuts[1:])]
    oracle = blockwise.BlockwiseDual(lambda f, *args: [f(b, *args) for b in blocks], n, n)
    r = 0.9
    dense = solve_dual(PiecewiseOracle(c1, c2), r, theta2, divergence)
    blk = solve_dual(oracle, r, theta2, divergence)
    assert blk.status == dense.status == "optimal"
    assert _close(blk.value, dense.value, 1e-12)
    assert _close(blk.h, dense.h, 1e-9)
    if divergence == "chi2":
        assert _close(blk.alpha, dense.alpha, 1e-9)
    assert oracle.passes > 0


def test_certify_dispatches_large_dask_input(client, monkeypatch):
    """``otstab.certify`` itself takes the distributed path above DISTRIBUTED_MIN_ROWS (for the
    losses, models and options it supports) and the gathered path otherwise; both answer as the
    NumPy path does. An edge the distributed path leaves alone (0/1 at r = 1) falls back."""
    Xd, X, model, y = _data(3000, 4, seed=11)
    monkeypatch.setattr(dask_path, "DISTRIBUTED_MIN_ROWS", 1000)
    for kw in (dict(loss="hinge", r=0.8), dict(loss="zero_one", r=0.3001, divergence="chi2")):
        res = otstab.certify(model, Xd, y, **kw)
        ref = otstab.certify(model, X, y, **kw)
        assert res.info.get("distributed") is True
        _same(ref, res)
        assert _close(ref.se, res.se, 1e-8)
    # not supported there: the gathered path answers
    for kw in (dict(loss="logistic", r=0.8), dict(loss="hinge", r=0.8, se="bootstrap"),
               dict(loss="hinge", r=0.8, feature_costs=[1.0, 2.0, 1.0, 1.0]),
               dict(loss="zero_one", r=1.0)):
        res = otstab.certify(model, Xd, y, **kw)
        assert not res.info.get("distributed")
        assert res.status in ("optimal", "unreachable")
    assert otstab.certify(model, Xd, y, loss="hinge", r=0.8, se=None).se != \
        otstab.certify(model, Xd, y, loss="hinge", r=0.8).se
