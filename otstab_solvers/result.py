"""The solution record every backend returns."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DualSolution", "OPTIMAL", "INACCURATE", "FAILED", "INFEASIBLE", "UNBOUNDED",
           "TRUSTED"]

OPTIMAL = "optimal"
INACCURATE = "inaccurate"
FAILED = "failed"
INFEASIBLE = "infeasible"
UNBOUNDED = "unbounded"
TRUSTED = frozenset({OPTIMAL})


@dataclass
class DualSolution:
    """A dual solution ``(h, alpha, value, status)``.

    ``value`` is the dual objective (a lower bound on R for any feasible h, alpha);
    ``gap_bound`` bounds the distance to the optimum where the method can tell;
    ``native_status`` is what the underlying solver said.
    """

    h: float
    alpha: float | None
    value: float
    status: str
    solver: str
    native_status: str = ""
    iterations: int = 0
    gap_bound: float = float("nan")
    solve_time: float = 0.0
    compile_time: float = 0.0
    info: dict = field(default_factory=dict)
