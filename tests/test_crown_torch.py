"""The torch path of otstab.solve._crown: the same numbers as the NumPy path on the same
weights, and sound on modules with LeakyReLU / GELU / mixed activations (checked with the
module itself)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from otstab import bounds  # noqa: E402
from otstab.modeling._nonlinear import TorchModel  # noqa: E402
from otstab.solve import _crown as crown  # noqa: E402


def _module(acts, seed=0, d=2, width=10, out=2):
    torch.manual_seed(seed)
    layers, prev = [], d
    for a in acts:
        layers += [torch.nn.Linear(prev, width), a()]
        prev = width
    layers.append(torch.nn.Linear(prev, out))
    return torch.nn.Sequential(*layers).double()


def _as_numpy_network(net):
    o = crown.Ops()
    return crown.Network([w.cpu().numpy() for w in net.W], [b.cpu().numpy() for b in net.b],
                         net.acts, net.task, o)


@pytest.mark.parametrize("acts", [[torch.nn.ReLU], [torch.nn.GELU, torch.nn.LeakyReLU],
                                  [torch.nn.Tanh, torch.nn.Sigmoid]])
def test_torch_and_numpy_paths_agree(acts):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    mod = _module(acts)
    tnet = crown.as_network(TorchModel(mod, task="binary", classes=[0, 1]))
    assert tnet is not None and tnet.ops.torch is not None
    nnet = _as_numpy_network(tnet)
    np.testing.assert_allclose(tnet.outputs(X), nnet.outputs(X), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        z = mod(torch.tensor(X)).numpy()
    np.testing.assert_allclose(tnet.outputs(X), z[:, 1] - z[:, 0], rtol=1e-12, atol=1e-12)
    yi = (z[:, 1] > z[:, 0]).astype(int)
    rt = crown.certified_radius(tnet, X, yi, steps=12)
    rn = crown.certified_radius(nnet, X, yi, steps=12)
    # the bisections may branch differently on rounding-level differences: both sound
    np.testing.assert_allclose(rt, rn, rtol=1e-5)
    assert np.median(rt) > 0


@pytest.mark.parametrize("acts", [[torch.nn.LeakyReLU], [torch.nn.GELU],
                                  [torch.nn.ReLU, torch.nn.GELU]])
def test_certified_balls_of_torch_modules_keep_the_prediction(acts):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 2))
    mod = _module(acts, seed=3, out=3)
    ad = TorchModel(mod, task="multiclass")
    with torch.no_grad():
        pred = mod(torch.tensor(X)).argmax(1).numpy()
    dlow, info = bounds.certified_distances(ad, X, pred)
    assert "CROWN" in info["method"]
    assert np.median(dlow) > 0
    for i in range(0, 60, 3):
        u = rng.normal(size=(300, 2))
        u *= np.sqrt(dlow[i]) * (1 - 1e-9) * np.sqrt(rng.uniform(size=(300, 1))) \
            / np.linalg.norm(u, axis=1, keepdims=True)
        with torch.no_grad():
            p = mod(torch.tensor(X[i] + u)).argmax(1).numpy()
        assert np.all(p == pred[i])


def test_unsupported_modules_are_refused():
    approx = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.GELU(approximate="tanh"),
                                 torch.nn.Linear(4, 2)).double()
    assert crown.as_network(TorchModel(approx, task="binary")) is None
    trailing = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(),
                                   torch.nn.Linear(4, 2), torch.nn.Softmax(dim=1)).double()
    assert crown.as_network(TorchModel(trailing, task="binary")) is None
