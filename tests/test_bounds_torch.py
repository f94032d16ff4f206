"""Certified lower bounds for PyTorch modules (issue 13): a Sequential of Linear layers and one
elementwise activation is read in the MLP layout of otstab.bounds."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import otstab  # noqa: E402
from otstab.modeling._nonlinear import TorchModel  # noqa: E402
from otstab.solve._bounds import as_mlp, certified_distances  # noqa: E402


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 2))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    return X, y


def _net(act, seed=0, out=2):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(2, 12), act(), torch.nn.Linear(12, 12), act(),
              torch.nn.Linear(12, out)]
    return torch.nn.Sequential(*layers).double()


@pytest.mark.parametrize("act", [torch.nn.ReLU, torch.nn.Tanh, torch.nn.Sigmoid])
def test_the_layout_reproduces_the_module(data, act):
    X, _ = data
    net = _net(act)
    mlp = as_mlp(TorchModel(net, task="binary", classes=[0, 1]))
    with torch.no_grad():
        logits = net(torch.tensor(X)).numpy()
    np.testing.assert_allclose(mlp.outputs(X), logits[:, 1] - logits[:, 0], rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("act", [torch.nn.ReLU, torch.nn.Tanh])
def test_zero_one_lower_distances_are_sound(data, act):
    """No point closer than sqrt(dlow_i) to x_i changes the module's prediction: 400 random
    points in that ball per sample, checked with the module itself."""
    X, y = data
    net = _net(act, seed=1)
    adapter = TorchModel(net, task="binary", classes=[0, 1])
    yi = np.where(y == 1, 1, -1)
    dlow, _ = certified_distances(adapter, X, yi)
    rng = np.random.default_rng(2)
    with torch.no_grad():
        pred0 = net(torch.tensor(X)).argmax(1).numpy()
    for i in range(0, len(y), 4):
        if not np.isfinite(dlow[i]) or dlow[i] == 0:
            continue
        u = rng.normal(size=(400, 2))
        u *= (np.sqrt(dlow[i]) * rng.uniform(0, 0.999, size=(400, 1)) ** 0.5
              / np.linalg.norm(u, axis=1, keepdims=True))
        with torch.no_grad():
            pred = net(torch.tensor(X[i] + u)).argmax(1).numpy()
        assert np.all(pred == pred0[i]), i
    assert np.mean(dlow[pred0 == y] > 0) > 0.9  # the bound is not trivial


def test_certify_states_a_nontrivial_interval(data):
    X, y = data
    net = _net(torch.nn.Tanh, seed=3)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    Xt, yt = torch.tensor(X), torch.tensor(y)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(Xt), yt).backward()
        opt.step()
    tm = TorchModel(net, task="binary", classes=[0, 1])
    for loss, r in [("zero_one", 0.3), ("logistic", 1.0)]:
        res = otstab.certify(tm, X, y, loss=loss, r=r)
        assert res.status == "bounds" and not res.exact
        assert 0 < res.value_lower <= res.value_upper
    assert res.value_lower / res.value_upper > 0  # logistic: a (loose) global bound


def test_other_modules_get_no_bound(data):
    X, y = data
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2),
                              torch.nn.Softmax(dim=1)).double()
    tm = TorchModel(net, task="binary", classes=[0, 1])
    assert as_mlp(tm) is None
    res = otstab.certify(tm, X, y, loss="zero_one", r=0.95)
    assert res.status == "bounds" and res.value_lower == 0.0
