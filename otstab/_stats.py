"""Small statistics helpers shared by the layers above (standard library only)."""

from __future__ import annotations

from statistics import NormalDist

__all__ = ["z_value"]


def z_value(level: float, two_sided: bool = True) -> float:
    """The standard normal quantile of a confidence ``level``: at ``0.5 + level / 2`` for a
    two-sided interval (1.96 at 0.95), at ``level`` for a one-sided bound (1.645)."""
    p = 0.5 + level / 2 if two_sided else level
    return NormalDist().inv_cdf(p)
