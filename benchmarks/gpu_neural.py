"""The torch path of the MLP bounds (otstab/solve/_crown.py) on a GPU, if there is one.

Run from the repository root::

    PYTHONPATH=. python benchmarks/gpu_neural.py [--rows 100000] [--device cuda]

(with the package installed, or ``PYTHONPATH`` pointing at the checkout and at the folder
holding ``otstab_solvers``). An ``nn.Sequential`` (d = 20 -> 64 ReLU -> 64 ReLU -> 2) with
random weights in float64 on the device, ``rows`` Gaussian rows; it times the forward pass,
the certified radii (0/1 loss, CROWN with bisection) and the nested-ball d-transform
over-estimate (logistic loss, 8 radii), on the device and on the CPU for the first
``--cpu-rows`` rows, checks a sample of certified balls with the module itself (points drawn
inside each ball must keep their prediction), and prints one JSON object to stdout. Finishes
in well under 3 minutes on one GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cpu-rows", type=int, default=2_000)
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args(argv)

    import torch

    from otstab.modeling._nonlinear import TorchModel
    from otstab.solve import _crown as crown

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(0)
    d = 20
    net = torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 2)).double().to(device)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.rows, d))
    out = {"device": str(device), "rows": args.rows, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None}

    ad = TorchModel(net, task="binary", classes=[0, 1], batch_size=65536)
    t0 = time.perf_counter()
    logits = ad.outputs(X)
    out["forward_s"] = time.perf_counter() - t0
    yi = (logits > 0).astype(np.intp)  # labels = the module's own predictions
    yint = np.where(yi == 1, 1, -1)

    def radii(model, rows):
        nw = crown.as_network(model)
        _sync(torch, nw.ops.device or torch.device("cpu"))
        t = time.perf_counter()
        rho = crown.certified_radius(nw, X[:rows], yi[:rows], steps=args.steps, optimize=0)
        _sync(torch, nw.ops.device or torch.device("cpu"))
        return rho, time.perf_counter() - t

    rho, out["radius_s"] = radii(ad, args.rows)
    out["radius_rows_per_s"] = args.rows / out["radius_s"]
    out["median_radius"] = float(np.median(rho))

    t0 = time.perf_counter()
    orc = crown.smooth_oracle(ad, "logistic", X, yint, 1.0, h_ref=0.05, n_radii=8)
    _sync(torch, device)
    out["transform_s"] = time.perf_counter() - t0
    out["transform_mean_at_h"] = float(np.mean(orc.evaluate(0.05)[0]))

    # the same on the CPU for the first cpu_rows rows (the torch path on the CPU)
    cpu = TorchModel(net.to("cpu"), task="binary", classes=[0, 1])
    rho_cpu, out["radius_cpu_s"] = radii(cpu, args.cpu_rows)
    out["radius_cpu_rows_per_s"] = args.cpu_rows / out["radius_cpu_s"]
    out["cpu_gpu_max_rel_diff"] = float(np.max(np.abs(rho_cpu - rho[:args.cpu_rows])
                                               / np.maximum(rho[:args.cpu_rows], 1e-300)))
    net.to(device)

    # soundness: 200 points inside each of 200 certified balls keep the prediction
    bad = 0
    idx = rng.choice(args.rows, size=200, replace=False)
    with torch.no_grad():
        for i in idx:
            u = rng.normal(size=(200, d))
            u *= rho[i] * rng.uniform(0, 1, size=(200, 1)) ** (1 / d) * (1 - 1e-9) \
                / np.linalg.norm(u, axis=1, keepdims=True)
            z = net(torch.as_tensor(X[i] + u, device=device)).cpu().numpy()
            bad += int(np.sum((z[:, 1] - z[:, 0] > 0).astype(int) != yi[i]))
    out["sampled_violations"] = bad
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
