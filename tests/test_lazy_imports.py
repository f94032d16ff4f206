"""Optional heavy dependencies load only on the paths that use them.

numba alone takes about 1.4 s to import; a linear certificate (the common case, and every CLI
call on one) must not pay for it, nor for torch, dask, the tree libraries or POT.
"""

from __future__ import annotations

import subprocess
import sys

HEAVY = ["numba", "torch", "dask", "distributed", "xgboost", "lightgbm", "catboost", "ot",
         "matplotlib"]


def test_linear_certificates_import_no_optional_dependency():
    code = f"""
import sys
import numpy as np
import otstab
rng = np.random.default_rng(0)
X = rng.standard_normal((300, 3))
W = rng.standard_normal((3, 3))
y = np.argmax(X @ W.T + rng.gumbel(size=(300, 3)), axis=1)
otstab.certify(otstab.LinearModel(W, np.zeros(3)), X, y, loss="multiclass_hinge", r=1.5)
yb = np.where(X[:, 0] > 0, 1, -1)
model = otstab.LinearModel(np.ones(3), 0.0)
for loss, r in [("hinge", 1.0), ("logistic", 1.0), ("zero_one", 0.9)]:
    otstab.certify(model, X, yb, loss=loss, r=r)
otstab.feature_stability(model, X, yb, loss="logistic", r=1.0)
loaded = [m for m in {HEAVY!r} if m in sys.modules]
assert not loaded, loaded
"""
    subprocess.run([sys.executable, "-c", code], check=True)
