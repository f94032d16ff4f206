"""The multinomial cross-entropy d-transform, row by row, as one compiled loop (numba).

:class:`otstab_solvers.smooth.CrossEntropyOracle` maximises, for every sample,
``f(c) = h CE(s + A c) - theta1 ||c||^2`` over the ``q <= K - 1`` reduced coordinates ``c``
(damped Newton from ``c = 0`` and, above ``h_concave``, from one start per class). In NumPy it
runs on blocks of rows: each Newton step is some twenty operations over (m, K) and (m, q, q)
arrays and a batched solve, which at K = 4 costs about 25 s for a certificate of 10^6 rows.
:func:`solve_rows` runs the same algorithm one row at a time in a compiled loop: the same
starts, the same convergence test, the same Newton step (a solve of the Hessian, or the
Levenberg-shifted eigen-step where the objective may not be concave), the same backtracking
and the same choice among the starts. Only the order of the floating-point operations
differs, so the maximisers and ``l_h`` agree with the NumPy blocks to the rounding of the
Newton iteration (``tests/test_cross_entropy_kernels.py``). The small solves are Gaussian
elimination with partial pivoting (a pivot of exactly 0 is a singular matrix, as LAPACK's).
Compiled on first use (or loaded from numba's cache) for at least :data:`KERNEL_MIN_ROWS`
rows. This module does not import otstab.
"""

from __future__ import annotations

import math

import numpy as np

from . import sorted_kernels

__all__ = ["USE_KERNEL", "KERNEL_MIN_ROWS", "use_kernel", "load", "solve_rows"]

#: use the compiled loop (False: NumPy's blocks; set to compare the two)
USE_KERNEL = sorted_kernels.HAVE_NUMBA
#: the fewest rows of a certificate that runs the compiled loop
KERNEL_MIN_ROWS = 1 << 12
#: the fewest rows of a call split into two halves (two threads where there are two CPUs)
PAIR_MIN_ROWS = 256

_COMPILED: dict = {}
_LOADED: dict = {"ok": None}


def use_kernel(size: int) -> bool:
    """Whether the rows of a certificate of ``size`` rows are solved compiled (numba loaded
    them: on the first such call; where that fails, the NumPy blocks from then on with a
    warning on the "otstab" logger)."""
    if not (USE_KERNEL and sorted_kernels.USE_KERNEL and size >= KERNEL_MIN_ROWS):
        return False
    return sorted_kernels.load_once(_LOADED, load, "the cross-entropy rows")


def _fgh_py(s, y, A, C, h, theta1, Sb, pb, pa, g_ce, grad, H):  # pragma: no cover
    """``(f, ce)`` at ``c = C`` of one row (scores ``s``, label ``y``), its gradient into
    ``grad``, the gradient of CE into ``g_ce`` and the Hessian of ``f`` into ``H``."""
    K, q = A.shape
    mx = -np.inf
    for k in range(K):
        v = s[k]
        for j in range(q):
            v += A[k, j] * C[j]
        Sb[k] = v
        mx = max(mx, v)
    tot = 0.0
    for k in range(K):
        e = math.exp(Sb[k] - mx)
        pb[k] = e
        tot += e
    ce = mx + math.log(tot) - Sb[y]
    for k in range(K):
        pb[k] = pb[k] / tot
    cc = 0.0
    for j in range(q):
        g = 0.0
        a = 0.0
        for k in range(K):
            g += (pb[k] - (1.0 if k == y else 0.0)) * A[k, j]
            a += pb[k] * A[k, j]
        g_ce[j] = g
        pa[j] = a
        cc += C[j] * C[j]
        grad[j] = h * g - 2.0 * theta1 * C[j]
    for j in range(q):
        for m in range(q):
            v = 0.0
            for k in range(K):
                v += pb[k] * A[k, j] * A[k, m]
            H[j, m] = h * (v - pa[j] * pa[m]) - (2.0 * theta1 if j == m else 0.0)
    return h * ce - theta1 * cc, ce


def _solve_small_py(M, b, out, work):  # pragma: no cover - compiled
    """``out = M^{-1} b`` by Gaussian elimination with partial pivoting (``work``: q x (q + 1)
    scratch); False where a pivot is exactly 0 (a singular matrix)."""
    q = b.size
    for i in range(q):
        for j in range(q):
            work[i, j] = M[i, j]
        work[i, q] = b[i]
    for c in range(q):
        piv = c
        big = abs(work[c, c])
        for i in range(c + 1, q):
            if abs(work[i, c]) > big:
                big = abs(work[i, c])
                piv = i
        if big == 0.0:
            return False
        if piv != c:
            for j in range(q + 1):
                t = work[c, j]
                work[c, j] = work[piv, j]
                work[piv, j] = t
        for i in range(c + 1, q):
            f = work[i, c] / work[c, c]
            for j in range(c, q + 1):
                work[i, j] -= f * work[c, j]
    for i in range(q - 1, -1, -1):
        v = work[i, q]
        for j in range(i + 1, q):
            v -= work[i, j] * out[j]
        out[i] = v / work[i, i]
    return True


def _eigh_py(H, evals, V, work):  # pragma: no cover - compiled
    """Eigenvalues (ascending, into ``evals``) and eigenvectors (the columns of ``V``) of the
    small symmetric ``H`` by cyclic Jacobi rotations (no allocation; to the rounding of the
    matrix, as LAPACK's)."""
    q = evals.size
    for i in range(q):
        for j in range(q):
            work[i, j] = H[i, j]
            V[i, j] = 1.0 if i == j else 0.0
    for _ in range(60):
        off = 0.0
        scale = 0.0
        for i in range(q):
            scale += work[i, i] * work[i, i]
            for j in range(i + 1, q):
                off += work[i, j] * work[i, j]
        if off <= 1e-34 * scale or off == 0.0:
            break
        for p in range(q - 1):
            for r in range(p + 1, q):
                apr = work[p, r]
                if apr == 0.0:
                    continue
                theta = (work[r, r] - work[p, p]) / (2.0 * apr)
                t = (1.0 if theta >= 0.0 else -1.0) / (abs(theta) + math.sqrt(theta * theta + 1.0))
                c = 1.0 / math.sqrt(t * t + 1.0)
                sn = t * c
                for k in range(q):  # columns p and r
                    akp, akr = work[k, p], work[k, r]
                    work[k, p] = c * akp - sn * akr
                    work[k, r] = sn * akp + c * akr
                for k in range(q):  # rows p and r
                    apk, ark = work[p, k], work[r, k]
                    work[p, k] = c * apk - sn * ark
                    work[r, k] = sn * apk + c * ark
                for k in range(q):
                    vkp, vkr = V[k, p], V[k, r]
                    V[k, p] = c * vkp - sn * vkr
                    V[k, r] = sn * vkp + c * vkr
    for i in range(q):
        evals[i] = work[i, i]
    for i in range(1, q):  # ascending, with their vectors (insertion sort: q is small)
        j = i
        while j > 0 and evals[j - 1] > evals[j]:
            t = evals[j - 1]
            evals[j - 1] = evals[j]
            evals[j] = t
            for k in range(q):
                t = V[k, j - 1]
                V[k, j - 1] = V[k, j]
                V[k, j] = t
            j -= 1


def _norm_py(x):  # pragma: no cover - compiled
    v = 0.0
    for j in range(x.size):
        v += x[j] * x[j]
    return math.sqrt(v)


def _newton_py(s, y, A, C, h, theta1, h_concave, tol, max_iter, gscale, Sb, pb, pa, g_ce,
               grad, H, gc2, gn, Hn, newC, step, rhs, work, evals,
               evecs):  # pragma: no cover - compiled
    """Damped (Levenberg) Newton ascent of one row from ``C`` (updated in place) to a local
    maximum; returns ``f`` there (the NumPy blocks' steps, row by row)."""
    q = C.size
    f, _ = _fgh(s, y, A, C, h, theta1, Sb, pb, pa, g_ce, grad, H)
    plain = h < h_concave * (1.0 - 5e-4)
    for _ in range(max_iter):
        if _norm(grad) <= tol * gscale * (1.0 + _norm(C)):
            break
        solved = False
        if plain:
            for j in range(q):
                rhs[j] = -grad[j]
            solved = _solve_small(H, rhs, step, work)
        if not solved:
            _eigh(H, evals, evecs, work)
            lam_max = evals[q - 1]
            mu = lam_max + theta1 if lam_max >= -1e-3 * theta1 else 0.0
            for r in range(q):
                proj = 0.0
                for j in range(q):
                    proj += evecs[j, r] * grad[j]
                rhs[r] = proj / (evals[r] - mu)
            for j in range(q):
                v = 0.0
                for r in range(q):
                    v += evecs[j, r] * rhs[r]
                step[j] = -v
        t = 1.0
        for j in range(q):
            newC[j] = C[j] + step[j]
        ok = False
        fn = f
        for _ in range(60):
            fn, _ = _fgh(s, y, A, newC, h, theta1, Sb, pb, pa, gc2, gn, Hn)
            ok = fn >= f - 1e-15 * (1.0 + abs(f))
            if ok:
                break
            t = 0.5 * t
            for j in range(q):
                newC[j] = C[j] + t * step[j]
        if not ok:
            break
        for j in range(q):
            C[j] = newC[j]
            grad[j] = gn[j]
            for m in range(q):
                H[j, m] = Hn[j, m]
        f = fn
        if t * _norm(step) <= 1e-15 * (1.0 + _norm(C)):
            break
    return f


def _solve_rows_py(S, labels, rows, A, theta1, h, h_concave, tol, max_iter, lh, d1, d2,
                   Cout):  # pragma: no cover - compiled
    """``CrossEntropyOracle._solve_rows`` of the rows ``rows`` (K > 2, q > 0, theta1 finite,
    h > 0) into ``lh``, ``d1``, ``d2`` and ``Cout``."""
    K, q = A.shape
    Sb, pb, pa, g_ce = np.empty(K), np.empty(K), np.empty(q), np.empty(q)
    grad, gn, newC, step, rhs, gc2 = (np.empty(q), np.empty(q), np.empty(q), np.empty(q),
                                      np.empty(q), np.empty(q))
    H, Hn, work = np.empty((q, q)), np.empty((q, q)), np.empty((q, q + 1))
    evals, evecs = np.empty(q), np.empty((q, q))
    C, best, G = np.empty(q), np.empty(q), np.empty(q)
    amax = 0.0
    for k in range(K):
        for j in range(q):
            amax = max(amax, abs(A[k, j]))
    gscale = h * (1.0 + amax) + 2.0 * theta1
    for i in range(rows.size):
        r = rows[i]
        s = S[r]
        y = labels[r]
        best_f = -np.inf
        for start in range(-1, K if h > h_concave else 0):
            if start < 0:
                for j in range(q):
                    C[j] = 0.0
            else:  # the far stationary point along the direction raising s_k - s_y
                for j in range(q):
                    G[j] = A[start, j] - A[y, j]
                g = _norm(G)
                tau = h * g / (2.0 * theta1)
                for j in range(q):
                    C[j] = (G[j] / g if g > 0 else 0.0) * tau
            f = _newton(s, y, A, C, h, theta1, h_concave, tol, max_iter, gscale, Sb, pb, pa,
                        g_ce, grad, H, gc2, gn, Hn, newC, step, rhs, work, evals, evecs)
            if start < 0 or f > best_f:
                best_f = f
                for j in range(q):
                    best[j] = C[j]
        f, ce = _fgh(s, y, A, best, h, theta1, Sb, pb, pa, g_ce, grad, H)
        for j in range(q):
            for m in range(q):
                Hn[j, m] = -H[j, m]
        if _solve_small(Hn, g_ce, rhs, work):
            v = 0.0
            for j in range(q):
                v += g_ce[j] * rhs[j]
            d2[i] = v
        else:
            d2[i] = np.nan
        lh[i] = f
        d1[i] = ce
        for j in range(q):
            Cout[i, j] = best[j]


_fgh = _fgh_py
_solve_small = _solve_small_py
_norm = _norm_py
_newton = _newton_py
_eigh = _eigh_py


def _kernel():
    return sorted_kernels.compile_with(_solve_rows_py, _COMPILED, globals(), (
        ("_fgh", _fgh_py), ("_solve_small", _solve_small_py), ("_norm", _norm_py),
        ("_eigh", _eigh_py), ("_newton", _newton_py)), {})


def solve_rows(S, labels, rows, A, theta1: float, h: float, h_concave: float, tol: float,
               max_iter: int):
    """``(l_h, dl_h/dh, d2l_h/dh2, C)`` of the rows ``rows`` (int64) of the scores ``S``
    (n x K, float64) with labels ``labels`` (int64), for ``A`` (K x q, q >= 1), finite
    ``theta1`` and ``h > 0``: :meth:`CrossEntropyOracle._solve_rows` in one compiled loop."""
    m, q = rows.size, A.shape[1]
    lh, d1, d2, C = np.empty(m), np.empty(m), np.empty(m), np.empty((m, q))
    A = np.ascontiguousarray(A, dtype=np.float64)
    kern = _kernel()

    def run(i, j):  # (rows are independent: two halves give the same numbers as one pass)
        kern(S, labels, rows[i:j], A, float(theta1), float(h), float(h_concave), float(tol),
             int(max_iter), lh[i:j], d1[i:j], d2[i:j], C[i:j])

    half = m // 2 if m >= PAIR_MIN_ROWS else 0
    sorted_kernels.pair(lambda: run(0, half), lambda: run(half, m))
    return lh, d1, d2, C


def load() -> None:
    """Compile the loop, or load it from numba's cache (once per process). Nothing without
    numba."""
    if not sorted_kernels.HAVE_NUMBA:
        return
    S = np.array([[0.0, 1.0, -1.0], [2.0, 0.5, 0.0]])
    A = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    solve_rows(S, np.array([0, 2], dtype=np.int64), np.arange(2, dtype=np.int64), A, 1.0, 1.0,
               0.5, 1e-12, 100)
