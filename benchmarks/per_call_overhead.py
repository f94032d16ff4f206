"""Per-call overhead of ``otstab.certify`` on a tiny instance (what the test suite pays).

100 certificates of a 40 x 3 ``LinearModel`` instance after one warm-up, per loss (hinge, 0/1,
logistic; r halfway between the base risk and the largest loss, theta1 = 1, KL with
theta2 = 0.25), the best of 5 repetitions in process time (CPU time of this process, less
disturbed than wall time on a shared machine)::

    python benchmarks/per_call_overhead.py [LOSS ...]
"""

from __future__ import annotations

import sys
import time

import numpy as np
from otstab.models import per_sample_losses

import otstab


def main(losses) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    coef = np.array([1.0, -0.5, 0.3])
    y = np.where(X @ coef + 0.3 * rng.standard_normal(40) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    for loss in losses:
        lo = per_sample_losses(model, X, y, loss)
        r = float(lo.mean() + 0.5 * (lo.max() - lo.mean()))
        kw = dict(loss=loss, r=r, theta1=1.0, theta2=0.25)
        res = otstab.certify(model, X, y, **kw)
        best = float("inf")
        for _ in range(5):
            t = time.process_time()
            for _ in range(100):
                otstab.certify(model, X, y, **kw)
            best = min(best, (time.process_time() - t) / 100)
        print(f"{loss}: {best * 1e3:.2f} ms per call (status {res.status}, "
              f"value {res.value:.6g})")


if __name__ == "__main__":
    main(sys.argv[1:] or ["hinge", "zero_one", "logistic"])
