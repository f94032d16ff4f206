"""Blocked prefix sums of the sorted hinge / distance keys (otstab_solvers.sorted_oracle).

``_Keys.at(q)`` keeps one sum per block of ``PREFIX_BLOCK`` sorted keys and adds the keys of
the last, partial block when asked (n / 128 numbers instead of two n-vectors). Checked
against ``math.fsum`` of the sorted keys (exactly rounded) at every ``q``, for full views
with infinite keys and for windows with an unsorted front.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from otstab_solvers.sorted_oracle import PREFIX_BLOCK, SortedTwoPiece


def _exact(keys):
    """(sum, sum of squares) of every prefix, each exactly rounded."""
    return ([math.fsum(keys[:q]) for q in range(len(keys) + 1)],
            [math.fsum(k * k for k in keys[:q]) for q in range(len(keys) + 1)])


@pytest.mark.parametrize("seed", range(3))
def test_blocked_sums_match_exact_sums(seed):
    rng = np.random.default_rng(seed)
    n = 3 * PREFIX_BLOCK + 37
    u = rng.normal(size=n) * 10.0 ** rng.uniform(-2, 2)
    u[rng.random(n) < 0.05] = -math.inf
    view = SortedTwoPiece(u, "hinge", 0.5)
    fin = [float(x) for x in np.sort(u[np.isfinite(u)])[::-1]]
    s1, s2 = _exact(fin)
    scale = float(np.sum(np.abs(fin)))
    for q in range(len(fin) + 1):
        a1, a2 = view._sorted.at(q)
        assert abs(a1 - s1[q]) <= 1e-14 * scale
        assert abs(a2 - s2[q]) <= 1e-14 * max(s2[-1], 1e-300)
        assert view._sorted.at(q, squares=False) == (a1, 0.0)
    # past the finite keys: 0, as the full prefix arrays have it
    if len(fin) < n:
        assert view._sorted.at(n) == (0.0, 0.0)
    # the blocked sums keep n / 128 numbers, not 2 n
    c1, c2, _ = view._sorted.blocked()
    assert c1.size == c2.size == len(fin) // PREFIX_BLOCK + 1


def test_window_sums_include_its_front():
    """A window's sums over the first q keys: its unsorted front, then its sorted part."""
    rng = np.random.default_rng(7)
    n = 1500
    u = rng.normal(size=n)
    c, h_lo, h_hi = 0.5, 0.8, 1.2
    umax = float(np.max(np.abs(u)))
    view = SortedTwoPiece.window(lambda i, j, out: np.negative(u[i:j], out=out), n, c, h_lo,
                                 h_hi, umax)
    lo, n_fin = view.sorted_from, view.n_fin
    assert 0 < lo < n_fin
    keys = [-float(x) for x in view.nu[:n_fin]]  # the front (any order), then sorted
    s1, s2 = _exact(keys)
    scale = float(np.sum(np.abs(keys)))
    for q in range(lo, n_fin + 1):
        a1, a2 = view._sorted.at(q)
        assert abs(a1 - s1[q]) <= 1e-14 * scale
        assert abs(a2 - s2[q]) <= 1e-14 * s2[-1]
    with pytest.raises(ValueError, match="sorts from"):
        view._sorted.at(lo - 1)
