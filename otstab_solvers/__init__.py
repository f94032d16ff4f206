"""Numerical backends of otstab (import name ``otstab_solvers``).

Works on arrays only and never imports ``otstab``. The reduced form of every exact problem is
an n x K matrix ``c1`` and a matrix ``c2`` broadcastable to it, with
``l_h(z_i) = max_k c1[i, k] * h + c2[i, k] * h**2`` (see docs/math.md).
"""

from .errors import SolverError, SolverNotAvailableError

__all__ = ["SolverError", "SolverNotAvailableError"]
