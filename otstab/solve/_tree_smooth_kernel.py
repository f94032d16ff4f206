"""The smooth-loss tree branch and bound compiled (issue 29): logistic / cross-entropy shells.

The same search as :meth:`otstab.solve._tree_smooth.SmoothSearch.run` (the NumPy path, which
stays the reference and the fallback without numba), on the flat arrays of
:class:`otstab.solve._tree_kernel.KernelTable`, compiled with numba and run in parallel over the
samples of a batch (numba's ``nogil`` and a thread a sample, numba's thread count):

* the same boxes ``blo < c(x) <= bhi`` (with their float64 closures ``ea, eb``, tracked from
  the leaves' edges as in the 0/1 kernel), the same leaves per box, the same distances, the
  same shells (leaves by distance, ties by position; a running minimum per tree and class; a
  line at the last leaf of each run of equal distances once every tree is present; the same
  rounding allowance), the same key ``max_j h A_j - B_j``, the same split rule (the most
  damaging leaf of the most spread tree, the edge that moves its half farthest from x) and the
  same best-first order (ties by push order), so the same boxes are examined in the same order;
* a child box differs from its parent in one coordinate: only that coordinate's overlap is
  tested, and a leaf whose closure within the child is the parent's keeps its distance;
* a box keeps only the upper envelope (over ``h >= 0``) of its lines (its key is taken over all
  of them first): no line below the envelope can be on the envelope of all boxes, so the
  result, the envelope of the open boxes' lines merged to at most ``MAX_LINES``, is the NumPy
  path's up to the rounding of the lines (a few units in the last place, inside the
  allowance ``A_ROUND`` both paths add);
* the same cut of far leaves (``far``: a box keeps its leaves closer than it; one ``tail``
  line covers the inputs beyond) and the found side's points (the inputs nearest x of the
  top boxes) as in the NumPy path.

Sums run in another order than NumPy's (sequential here, pairwise there in places), so a line
may differ from the NumPy one in the last bits; both are sound (every allowance is relative,
1e-13 for ``A`` and 1e-12 for ``B``, far above those differences).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ._tree_kernel import (
    KernelTable,
    available,
    f32_above,
    f32_atmost,
    fixed_leaves,
    heap_less,
    leaf_cut,
    threads,
    worst_leaf,
)

try:
    import numba
except ImportError:  # pragma: no cover - numba is optional
    numba = None  # type: ignore[assignment]

__all__ = ["available", "KernelTable", "smooth_batch"]

_EPS = float(np.finfo(np.float64).eps)
_LOGE2 = 0.693147180559945309417232121458176568
#: the allowances of :mod:`otstab.solve._tree_smooth` (kept equal; checked by the tests)
A_ROUND = 1e-13
B_ROUND = 1e-12

if numba is not None:
    _jit = numba.njit(cache=True, nogil=True)
else:  # pragma: no cover - numba is optional: never called without it
    def _jit(f):
        return f


@_jit
def ce_bound(M, tol):  # pragma: no cover - compiled
    """``log(1 + sum_k exp(-(M_k - tol_k)))`` rounded up: NumPy's sequential
    ``logaddexp.reduce`` of ``[0, -(M - tol)]`` (the same operations)."""
    acc = 0.0
    for k in range(M.shape[0]):
        y = -(M[k] - tol[k])
        if acc == y:
            acc = acc + _LOGE2
        else:
            t = acc - y
            if t > 0:
                acc = acc + np.log1p(np.exp(-t))
            elif t <= 0:
                acc = y + np.log1p(np.exp(t))
            else:
                acc = t
    return acc * (1.0 + A_ROUND) + 1e-300


@_jit
def price(theta1, d):  # pragma: no cover - compiled
    """``theta1 d`` rounded down, 0 for no move."""
    return (theta1 * d if d > 0 else 0.0) * (1.0 - B_ROUND)


@_jit
def envelope(LA, LB, n, keep):  # pragma: no cover - compiled
    """:func:`otstab.solve._tree_smooth.envelope` of the lines ``LA[:n], LB[:n]``: their
    positions on the upper envelope over ``h >= 0`` go to ``keep``; returns how many."""
    if n == 0:
        return 0
    # by B, ties by the largest A (stable sorts: then by position)
    o1 = np.argsort(-LA[:n], kind="mergesort")
    o2 = np.argsort(LB[:n][o1], kind="mergesort")
    order = o1[o2]
    par = np.empty(n, dtype=np.int64)
    npar = 0
    best = -np.inf
    for q in range(n):
        a = LA[order[q]]
        if a > best:
            par[npar] = order[q]
            npar += 1
        if a > best:
            best = a
    # by slope, ties by the smallest B
    p1 = np.argsort(LB[par[:npar]], kind="mergesort")
    p2 = np.argsort(LA[par[:npar]][p1], kind="mergesort")
    srt = par[:npar][p1[p2]]
    nk = 0
    for q in range(npar):
        k = srt[q]
        if nk > 0 and LA[keep[nk - 1]] == LA[k]:
            continue
        while nk >= 2:
            i = keep[nk - 2]
            j = keep[nk - 1]
            if (LB[k] - LB[i]) * (LA[j] - LA[i]) <= (LB[j] - LB[i]) * (LA[k] - LA[i]):
                nk -= 1
            else:
                break
        keep[nk] = k
        nk += 1
    return nk


@_jit
def nearest_input(x, lo, hi, ea, eb, f32, out):  # pragma: no cover - compiled
    """:meth:`SmoothSearch.nearest_input`: an input with ``lo < c(z) <= hi`` near x (``ea,
    eb``: the closure's edges) into ``out``; False when the box holds none."""
    for j in range(x.shape[0]):
        if f32:
            c = np.float64(np.float32(x[j]))
            if c <= lo[j]:
                c = f32_above(lo[j])
            elif c > hi[j]:
                c = f32_atmost(hi[j])
        else:
            c = x[j]
            if c <= lo[j]:
                c = np.nextafter(lo[j], np.inf)
            elif c > hi[j]:
                c = hi[j]
        if not (c > lo[j] and c <= hi[j] and np.isfinite(c)):
            return False
        if f32:
            if x[j] < ea[j]:
                pt = np.nextafter(ea[j], np.inf)
            elif x[j] > eb[j]:
                pt = eb[j]
            else:
                pt = x[j]
            cp = np.float64(np.float32(pt))
            if cp > lo[j] and cp <= hi[j] and np.isfinite(pt):
                c = pt
        out[j] = c
    return True


@_jit
def radix_order(bits, m, order, tmp):  # pragma: no cover - compiled
    """The positions ``0..m-1`` sorted by ``bits`` (the int64 patterns of non-negative
    float64 distances, ordered as the distances), ties by position: a stable LSD radix
    sort, one byte a pass (passes where every key has the same byte are skipped); NumPy's
    stable order (``lexsort((idx, dist))``) without its ``m log m``."""
    cnt = np.zeros(256, dtype=np.int64)
    src = order
    dst = tmp
    flips = 0
    for q in range(m):
        src[q] = q
    for shift in range(0, 64, 8):
        cnt[:] = 0
        for q in range(m):
            cnt[(bits[src[q]] >> shift) & 255] += 1
        if m == 0 or cnt[(bits[src[0]] >> shift) & 255] == m:
            continue
        run = 0
        for b in range(256):
            c = cnt[b]
            cnt[b] = run
            run += c
        for q in range(m):
            b = (bits[src[q]] >> shift) & 255
            dst[cnt[b]] = src[q]
            cnt[b] += 1
        src, dst = dst, src
        flips += 1
    if flips % 2 == 1:
        for q in range(m):
            order[q] = src[q]


@_jit
def shell_envelope(LA, LB, n, keep):  # pragma: no cover - compiled
    """:func:`envelope` of a box's shell lines, which come sorted by ``B`` (non-decreasing)
    with ``A`` non-decreasing up to rounding: the same positions without sorting. The Pareto
    front (of lines with equal ``B`` the last with the largest ``A``; then those whose ``A``
    exceeds every earlier one), then the hull over it (in that order ``A`` and ``B`` grow)."""
    npar = 0
    best = -np.inf
    for k in range(n):
        if not LA[k] > best:
            continue
        if npar > 0 and LB[keep[npar - 1]] == LB[k]:
            npar -= 1  # the same B, a smaller A: below
        keep[npar] = k
        npar += 1
        best = LA[k]
    nk = 0
    for q in range(npar):
        k = keep[q]
        while nk >= 2:
            i = keep[nk - 2]
            j = keep[nk - 1]
            if (LB[k] - LB[i]) * (LA[j] - LA[i]) <= (LB[j] - LB[i]) * (LA[k] - LA[i]):
                nk -= 1
            else:
                break
        keep[nk] = k
        nk += 1
    return nk


@_jit
def evaluate(LO, HI, A, B, TREE, MARG, base, x, w, tol, f32, T, theta1, h, far,
             parent, pdist, pea, peb, blo, bhi, ea, eb, j, out, dist, tree_start, bound,
             ord_buf, cur, tot, okd, LA, LB, keep, pt):  # pragma: no cover - compiled
    """``SmoothSearch.evaluate`` of a box: the leaves of ``parent`` meeting it closer than
    ``far`` go to ``out`` (only coordinate ``j`` is tested; ``j < 0``: all), their distances
    to ``dist``; the box's
    envelope lines to ``LA, LB`` (positions ``keep``). Returns ``(m, key, single, nlines)``,
    ``m = -1``: the box holds no input."""
    dm = x.shape[0]
    K1 = MARG.shape[1]
    m = 0
    for q in range(parent.shape[0]):
        leaf = parent[q]
        if j >= 0:
            if not max(LO[leaf, j], blo[j]) < min(HI[leaf, j], bhi[j]):
                continue
        else:
            ok = True
            for jj in range(dm):
                if not max(LO[leaf, jj], blo[jj]) < min(HI[leaf, jj], bhi[jj]):
                    ok = False
                    break
            if not ok:
                continue
        if j >= 0 and max(A[leaf, j], ea[j]) == max(A[leaf, j], pea[j]) and \
                min(B[leaf, j], eb[j]) == min(B[leaf, j], peb[j]):
            s = pdist[q]
        else:
            # (a partial sum of nonnegative terms at or beyond far stays there: the leaf is
            # left out either way, so the sum stops)
            s = 0.0
            for jj in range(dm):
                a = max(A[leaf, jj], ea[jj])
                b = min(B[leaf, jj], eb[jj])
                g = max(max(a - x[jj], x[jj] - b), 0.0)
                s += g * g * w[jj]
                if not s < far:
                    break
        if s < far:
            out[m] = leaf
            dist[m] = s
            m += 1
    if m == 0:
        return -1, 0.0, False, 0
    nt = 0
    for q in range(m):
        if q == 0 or TREE[out[q]] != TREE[out[q - 1]]:
            if nt < T:
                tree_start[nt] = q
            nt += 1
    if nt < T:
        return -1, 0.0, False, 0
    tree_start[T] = m
    if m == T:  # one leaf per tree: the loss of every input of the box (rounding band)
        dmax = -np.inf
        for k in range(K1):
            bound[k] = 0.0
        for q in range(m):
            if dist[q] > dmax:
                dmax = dist[q]
            for k in range(K1):
                bound[k] += MARG[out[q], k]
        rdist = 0.0
        for jj in range(dm):
            rlo = blo[jj]
            rhi = bhi[jj]
            ra = ea[jj]
            rb = eb[jj]
            for q in range(m):
                leaf = out[q]
                rlo = max(rlo, LO[leaf, jj])
                rhi = min(rhi, HI[leaf, jj])
                ra = max(ra, A[leaf, jj])
                rb = min(rb, B[leaf, jj])
            # an input in rlo < c(p) <= rhi (the NumPy inner_point)
            if f32:
                c = np.float64(np.float32(x[jj]))
                if c <= rlo:
                    c = f32_above(rlo)
                elif c > rhi:
                    c = f32_atmost(rhi)
            else:
                c = x[jj]
                if c <= rlo:
                    c = np.nextafter(rlo, np.inf)
                elif c > rhi:
                    c = rhi
            if not (c > rlo and c <= rhi and np.isfinite(c)):
                return -1, 0.0, False, 0
            g = max(max(ra - x[jj], x[jj] - rb), 0.0)
            rdist += g * g * w[jj]
        for k in range(K1):
            bound[k] = base[k] + bound[k]
            pt[k] = tol
        LA[0] = ce_bound(bound, pt[:K1])
        LB[0] = price(theta1, max(dmax, rdist))
        keep[0] = 0
        return m, h * LA[0] - LB[0], True, 1
    # shells: every leaf by distance (ties: position), a running minimum per tree and class
    order = ord_buf[0]
    tree_of = ord_buf[2]
    radix_order(dist.view(np.int64), m, order, ord_buf[1])
    for t in range(T):
        for k in range(K1):
            cur[t, k] = np.inf
    for k in range(K1):
        bound[k] = 0.0  # the running sum of the deltas
        pt[k] = 0.0  # the sum of |delta|
    present = 0
    for t in range(T):
        for q in range(tree_start[t], tree_start[t + 1]):
            tree_of[q] = t
    nl = 0
    for q in range(m):
        p = order[q]
        t = tree_of[p]
        # a tree is new when none of its leaves came before (margins are finite)
        first = cur[t, 0] == np.inf
        for k in range(K1):
            v = MARG[out[p], k]
            if first:
                dl = v
                cur[t, k] = v
            else:
                nv = min(cur[t, k], v)
                dl = nv - cur[t, k]
                cur[t, k] = nv
            bound[k] += dl
            pt[k] += abs(dl)
        if first:
            present += 1
        last = q == m - 1 or dist[order[q + 1]] > dist[p]
        if last and present == T:
            # (a line whose total is the previous line's has its A and a larger B: below
            # it for every h >= 0, never the key, never on the envelope: not kept)
            new = nl == 0
            for k in range(K1):
                if not new and base[k] + bound[k] != tot[nl - 1, k]:
                    new = True
            if new:
                for k in range(K1):
                    tot[nl, k] = base[k] + bound[k]
                okd[nl] = dist[p]
                nl += 1
    key = -np.inf
    tolv = np.empty(K1)
    for k in range(K1):
        tolv[k] = tol + (m + 2) * _EPS * (abs(base[k]) + pt[k])
    for q in range(nl):
        LA[q] = ce_bound(tot[q], tolv)
        LB[q] = price(theta1, okd[q])
        v = h * LA[q] - LB[q]
        if v > key:
            key = v
    nk = shell_envelope(LA, LB, nl, keep)
    return m, key, False, nk


@_jit
def split(LO, HI, A, B, TREE, MARG, base, x, sqw, T, alive, blo, bhi, ea,
          eb):  # pragma: no cover - compiled
    """``SmoothSearch.split``: ``(j, cut, edge)`` (``j = -1``: none): the 0/1 kernel's rule
    (the most damaging leaf's edges), then, when that leaf covers the box, the edges of its
    tree's other leaves."""
    s, e, worst = worst_leaf(TREE, MARG, base, T, alive)
    for attempt in range(e - s + 1):
        leaf = worst if attempt == 0 else alive[s + attempt - 1]
        bj, bcut, bedge = leaf_cut(LO, HI, A, B, x, sqw, leaf, blo, bhi, ea, eb)
        if bj >= 0:
            return bj, bcut, bedge
    return -1, 0.0, 0.0


@_jit
def search_one(LO, HI, A, B, TREE, MARG, base, x, w, sqw, tol, f32, T, theta1, h, far, tail,
               root, budget, max_lines, top_points, outA, outB,
               outP):  # pragma: no cover - compiled
    """``SmoothSearch.run`` of one sample: ``(lines, points, exact, used)`` with the lines in
    ``outA, outB`` and the points in ``outP`` (``used = -1``: no split found); ``far``,
    ``tail``: as in ``SmoothSearch.run``."""
    dm = x.shape[0]
    K1 = MARG.shape[1]
    L = root.shape[0]
    cap = 64
    BLO = np.empty((cap, dm))
    BHI = np.empty((cap, dm))
    EA = np.empty((cap, dm))
    EB = np.empty((cap, dm))
    KEY = np.empty(cap)
    SINGLE = np.zeros(cap, dtype=np.bool_)
    OFF = np.empty(cap, dtype=np.int64)
    LEN = np.empty(cap, dtype=np.int64)
    LOFF = np.empty(cap, dtype=np.int64)
    LLEN = np.empty(cap, dtype=np.int64)
    pool = np.empty(max(4 * L, 1024), dtype=np.int32)
    pool_d = np.empty(pool.shape[0])
    lpool_a = np.empty(1024)
    lpool_b = np.empty(1024)
    out = np.empty(L, dtype=np.int32)
    dist = np.empty(L)
    tree_start = np.empty(T + 1, dtype=np.int64)
    bound = np.empty(K1)
    ord_buf = np.empty((3, L), dtype=np.int64)
    cur = np.empty((T, K1))
    tot = np.empty((L, K1))
    okd = np.empty(L)
    LA = np.empty(L + 1)
    LB = np.empty(L + 1)
    keep = np.empty(L + 1, dtype=np.int64)
    ptb = np.empty(max(K1, dm))
    heap = np.empty(cap, dtype=np.int64)
    blo = np.full(dm, -np.inf)
    bhi = np.full(dm, np.inf)
    m, key, single, nk = evaluate(LO, HI, A, B, TREE, MARG, base, x, w, tol, f32, T, theta1,
                                  h, far, root, dist, blo, bhi, blo, bhi, blo, bhi, -1, out, dist,
                                  tree_start, bound, ord_buf, cur, tot, okd, LA, LB, keep, ptb)
    if m < 0:  # the root holds x: never
        return 0, 0, False, -1
    # the root's leaves, copied together for a search beyond the root (local indices keep
    # the order and the tree groups: the rows a box reads lie close in memory)
    sel = out[:m].copy()
    if budget > 1 and not single:
        LO = LO[sel]
        HI = HI[sel]
        A = A[sel]
        B = B[sel]
        TREE = TREE[sel]
        MARG = MARG[sel]
        for q in range(m):
            pool[q] = q
    else:
        for q in range(m):
            pool[q] = sel[q]
    BLO[0], BHI[0], EA[0], EB[0] = blo, bhi, blo, bhi
    KEY[0], SINGLE[0] = key, single
    pool_d[:m] = dist[:m]
    OFF[0], LEN[0] = 0, m
    used = m
    if nk > lpool_a.shape[0]:
        lpool_a = np.empty(2 * nk)
        lpool_b = np.empty(2 * nk)
    for q in range(nk):
        lpool_a[q] = LA[keep[q]]
        lpool_b[q] = LB[keep[q]]
    LOFF[0], LLEN[0] = 0, nk
    lused = nk
    nb = 1
    heap[0] = 0
    hn = 1
    nodes = 1
    exact = False
    cb_lo = np.empty(dm)
    cb_hi = np.empty(dm)
    cb_ea = np.empty(dm)
    cb_eb = np.empty(dm)
    # (keys are maximised: the heap orders -key, ties by push order)
    NEG = np.empty(cap)
    NEG[0] = -key
    while hn > 0:
        top = heap[0]
        if SINGLE[top]:
            exact = True
            break
        if nodes >= budget:
            break
        hn -= 1
        if hn > 0:
            last = heap[hn]
            p = 0
            while True:
                c = 2 * p + 1
                if c >= hn:
                    break
                if c + 1 < hn and heap_less(NEG, heap[c + 1], heap[c]):
                    c += 1
                if heap_less(NEG, heap[c], last):
                    heap[p] = heap[c]
                    p = c
                else:
                    break
            heap[p] = last
        parent = pool[OFF[top]:OFF[top] + LEN[top]]
        pdist = pool_d[OFF[top]:OFF[top] + LEN[top]]
        j, cut, edge = split(LO, HI, A, B, TREE, MARG, base, x, sqw, T, parent,
                             BLO[top], BHI[top], EA[top], EB[top])
        if j < 0:
            return 0, 0, False, -1
        for side in range(2):
            cb_lo[:] = BLO[top]
            cb_hi[:] = BHI[top]
            cb_ea[:] = EA[top]
            cb_eb[:] = EB[top]
            if side == 0:
                cb_hi[j] = cut
                cb_eb[j] = edge
            else:
                cb_lo[j] = cut
                cb_ea[j] = edge
            nodes += 1
            m, ck, single, nk = evaluate(LO, HI, A, B, TREE, MARG, base, x, w, tol, f32, T,
                                         theta1, h, far, parent, pdist, EA[top], EB[top], cb_lo,
                                         cb_hi, cb_ea, cb_eb, j, out, dist, tree_start, bound,
                                         ord_buf, cur, tot, okd, LA, LB, keep, ptb)
            if m < 0:
                continue
            if nb == KEY.shape[0]:  # grow the box arrays
                cap2 = 2 * nb
                BLO2 = np.empty((cap2, dm))
                BHI2 = np.empty((cap2, dm))
                EA2 = np.empty((cap2, dm))
                EB2 = np.empty((cap2, dm))
                BLO2[:nb], BHI2[:nb], EA2[:nb], EB2[:nb] = BLO, BHI, EA, EB
                BLO, BHI, EA, EB = BLO2, BHI2, EA2, EB2
                K2 = np.empty(cap2)
                K2[:nb] = KEY
                KEY = K2
                N2 = np.empty(cap2)
                N2[:nb] = NEG
                NEG = N2
                S2 = np.zeros(cap2, dtype=np.bool_)
                S2[:nb] = SINGLE
                SINGLE = S2
                O2 = np.empty(cap2, dtype=np.int64)
                O2[:nb] = OFF
                OFF = O2
                L2 = np.empty(cap2, dtype=np.int64)
                L2[:nb] = LEN
                LEN = L2
                O3 = np.empty(cap2, dtype=np.int64)
                O3[:nb] = LOFF
                LOFF = O3
                L3 = np.empty(cap2, dtype=np.int64)
                L3[:nb] = LLEN
                LLEN = L3
                H2 = np.empty(cap2, dtype=np.int64)
                H2[:hn] = heap[:hn]
                heap = H2
            if used + m > pool.shape[0]:  # grow the pool (parent stays a view of the old)
                P2 = np.empty(max(2 * pool.shape[0], used + m), dtype=np.int32)
                P2[:used] = pool[:used]
                pool = P2
                D2 = np.empty(P2.shape[0])
                D2[:used] = pool_d[:used]
                pool_d = D2
            if lused + nk > lpool_a.shape[0]:
                A2 = np.empty(max(2 * lpool_a.shape[0], lused + nk))
                A2[:lused] = lpool_a[:lused]
                lpool_a = A2
                B2 = np.empty(A2.shape[0])
                B2[:lused] = lpool_b[:lused]
                lpool_b = B2
            BLO[nb], BHI[nb], EA[nb], EB[nb] = cb_lo, cb_hi, cb_ea, cb_eb
            KEY[nb] = ck
            NEG[nb] = -ck
            SINGLE[nb] = single
            pool[used:used + m] = out[:m]
            pool_d[used:used + m] = dist[:m]
            OFF[nb], LEN[nb] = used, m
            used += m
            for q in range(nk):
                lpool_a[lused + q] = LA[keep[q]]
                lpool_b[lused + q] = LB[keep[q]]
            LOFF[nb], LLEN[nb] = lused, nk
            lused += nk
            p = hn
            hn += 1
            while p > 0:
                q = (p - 1) // 2
                if heap_less(NEG, nb, heap[q]):
                    heap[p] = heap[q]
                    p = q
                else:
                    break
            heap[p] = nb
            nb += 1
    # the lines of the open boxes: their envelope, merged to at most max_lines
    tl = 1 if far < np.inf else 0
    for q in range(hn):
        tl += LLEN[heap[q]]
    GA = np.empty(tl)
    GB = np.empty(tl)
    c = 0
    if far < np.inf:  # the inputs at or beyond far
        GA[tl - 1] = tail
        GB[tl - 1] = price(theta1, far)
    for q in range(hn):
        b = heap[q]
        for r in range(LLEN[b]):
            GA[c] = lpool_a[LOFF[b] + r]
            GB[c] = lpool_b[LOFF[b] + r]
            c += 1
    gk = np.empty(tl, dtype=np.int64)
    ne = envelope(GA, GB, tl, gk)
    if ne <= max_lines:
        for q in range(ne):
            outA[q] = GA[gk[q]]
            outB[q] = GB[gk[q]]
        nl = ne
    else:  # np.array_split into max_lines groups: (largest A, smallest B) each
        base_size = ne // max_lines
        extra = ne % max_lines
        s = 0
        for g in range(max_lines):
            size = base_size + (1 if g < extra else 0)
            a_mx = -np.inf
            b_mn = np.inf
            for q in range(s, s + size):
                a_mx = max(a_mx, GA[gk[q]])
                b_mn = min(b_mn, GB[gk[q]])
            outA[g] = a_mx
            outB[g] = b_mn
            s += size
        nl = max_lines
    # the found side: the inputs nearest x of the top boxes (by key, ties by push order)
    taken = np.zeros(hn, dtype=np.bool_)
    npts = 0
    rlo = np.empty(dm)
    rhi = np.empty(dm)
    ra = np.empty(dm)
    rb = np.empty(dm)
    for _ in range(min(top_points, hn)):
        bi = -1
        for q in range(hn):
            if not taken[q] and (bi < 0 or heap_less(NEG, heap[q], heap[bi])):
                bi = q
        taken[bi] = True
        b = heap[bi]
        for jj in range(dm):
            rlo[jj] = BLO[b, jj]
            rhi[jj] = BHI[b, jj]
            ra[jj] = EA[b, jj]
            rb[jj] = EB[b, jj]
        if SINGLE[b]:  # the leaves' intersection
            for r in range(LEN[b]):
                leaf = pool[OFF[b] + r]
                for jj in range(dm):
                    rlo[jj] = max(rlo[jj], LO[leaf, jj])
                    rhi[jj] = min(rhi[jj], HI[leaf, jj])
                    ra[jj] = max(ra[jj], A[leaf, jj])
                    rb[jj] = min(rb[jj], B[leaf, jj])
        if nearest_input(x, rlo, rhi, ra, rb, f32, outP[npts]):
            npts += 1
    return nl, npts, exact, nodes


@_jit
def batch(LO, HI, A, B, TREE, MARG, BASE, FLO, FHI, XM, CF, Y, BUD, FAR, TAIL, w, sqw, tol,
          f32, T, theta1, h, max_lines, top_points, r0, r1, OA, OB, NL, OP, NP, EX,
          USED):  # pragma: no cover - compiled
    """The rows ``r0 <= i < r1`` of a batch, one after the other (without the GIL)."""
    keep = np.empty(LO.shape[0], dtype=np.int32)
    for i in range(r0, r1):
        c = fixed_leaves(FLO, FHI, CF[i], keep)
        y = Y[i]
        nl, npts, ex, used = search_one(LO, HI, A, B, TREE, MARG[y], BASE[y], XM[i], w, sqw,
                                        tol, f32, T, theta1, h, FAR[i], TAIL[i], keep[:c],
                                        BUD[i], max_lines,
                                        top_points, OA[i], OB[i], OP[i])
        NL[i] = nl
        NP[i] = npts
        EX[i] = ex
        USED[i] = used


def smooth_batch(kt: KernelTable, X, yi, idx, budgets, h: float, theta1: float,
                 max_lines: int, top_points: int, far=None, tail=None):
    """The smooth branch and bound at ``h`` of the samples ``idx`` (rows of X, labels yi),
    each with its box budget (and ``far``, ``tail`` as in ``SmoothSearch.run``; None: no
    cut), in parallel. Returns a list of ``(A, B, points, exact, used)`` in the order of
    ``idx`` (``points``: movable coordinates)."""
    idx = np.asarray(idx, dtype=np.intp)
    X = np.asarray(X, dtype=np.float64)
    XM = np.ascontiguousarray(X[idx][:, kt.mv])
    CF = np.ascontiguousarray(kt.table.comparable(X[idx])[:, kt.fixed])
    k, dm = idx.size, XM.shape[1]
    OA = np.empty((k, max_lines))
    OB = np.empty((k, max_lines))
    NL = np.zeros(k, dtype=np.int64)
    OP = np.empty((k, top_points, dm))
    NP = np.zeros(k, dtype=np.int64)
    EX = np.zeros(k, dtype=np.bool_)
    USED = np.zeros(k, dtype=np.int64)
    bud = np.ascontiguousarray(np.asarray(budgets, dtype=np.int64))
    FAR = np.full(k, np.inf) if far is None else \
        np.ascontiguousarray(np.asarray(far, dtype=np.float64))
    TAIL = np.full(k, np.inf) if tail is None else \
        np.ascontiguousarray(np.asarray(tail, dtype=np.float64))
    Y = np.ascontiguousarray(np.asarray(yi, dtype=np.int64)[idx])

    def run(i):
        batch(kt.LO, kt.HI, kt.A, kt.B, kt.TREE, kt.MARG, kt.BASE, kt.FLO, kt.FHI, XM, CF, Y,
              bud, FAR, TAIL, kt.w, kt.sqw, float(kt.tol), kt.f32, kt.T, float(theta1), float(h),
              int(max_lines), int(top_points), i, i + 1, OA, OB, NL, OP, NP, EX, USED)

    workers = threads()
    if workers <= 1 or k <= 1:
        for i in range(k):
            run(i)
    else:  # one sample a task, the largest budgets first
        order = np.argsort(-bud, kind="stable")
        with ThreadPoolExecutor(max_workers=min(workers, k)) as pool:
            list(pool.map(run, order.tolist()))
    if np.any(USED < 0):  # pragma: no cover - two leaves of a tree in a box differ somewhere
        raise AssertionError("no split found")
    return [(OA[q, :NL[q]].copy(), OB[q, :NL[q]].copy(), list(OP[q, :NP[q]].copy()),
             bool(EX[q]), int(USED[q])) for q in range(k)]
