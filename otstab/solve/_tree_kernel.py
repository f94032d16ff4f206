"""A compiled, parallel tree branch and bound (issue 29: speed of the certified side).

The same search as :class:`otstab.solve._bounds._Sample` and
:func:`otstab.solve._bounds._branch_and_bound` (the NumPy path, which stays the reference and
the fallback without numba), on flat arrays, compiled with numba and run in parallel over the
samples of a batch (``prange``, numba's default thread count):

* the same boxes ``blo < c(x) <= bhi`` (as their float64 closures, from the leaves' edges
  ``LeafTable.leaf_edges``: the box bounds are always leaf thresholds, and the edges are
  monotone, so the edge of a box bound is the edge of the leaf threshold it came from), the
  same filter of a box's leaves (those that meet the box, closer than ``U_i``), the same
  independent-trees bound and tie band ``tol``, the same plain key and radius key
  (:mod:`otstab.solve._radius_key`, same order of evaluation), the same split rule and the same
  best-first order (ties by push order, as the NumPy heap's counter);
* a child box differs from its parent in one coordinate, so only that coordinate's overlap is
  tested (the parent's leaves met the parent box in the others);
* per box, the leaves it meets are kept as an ``int32`` list in one growing pool per sample
  (no Python objects); the per-tree minima, the worst leaf and the cut are recomputed when a
  box is split.

**A box that meets one leaf per tree** within ``U_i`` has one prediction, that of the leaves'
intersection. When the margin of the intersection is below ``-tol`` the model's own sum agrees
that it is misclassified (as in the NumPy path). When it lies in the tie band (neither proved
right nor proved wrong), the NumPy path asks the model's ``predict``; the kernel cannot, so it
keeps the box with its exact distance as key (still a sound lower bound: the box holds no
closer input) and, if that box ever becomes the smallest open key (the point where the NumPy
path's answer could depend on the prediction), stops and reports it; the caller then reruns
that sample with the NumPy path at the same budget. So the kernel's bounds are the NumPy
path's (up to the order of float64 sums, and never less sound), and the model decides every
tie, as before. Such ties are rare for boosted trees (margins exactly in a band of width about
``1e-5``) and common only for forests voting exactly half and half.

**Merged trees** (:func:`merge_groups`, :func:`search_merged`; ``KernelTable(merge=cap)``,
off by default, the NumPy path has no counterpart): per sample, the trees' leaves within
``U_i`` are paired into groups whose leaves are the nonempty intersections of a leaf of
each (the larger lower threshold and edge, the smaller upper ones, the margins summed; the
distance to an intersection is exact for the separable costs), a pair left unmerged when it
would have more than ``cap`` intersections; the same search then runs with the groups in
place of the trees. Every input lies in exactly one leaf of every group, with the margin the
trees' sum, so the bounds stay sound and, at the root box, the margin bound is at least the
independent-trees one (a group's minimum is at least the sum of its trees' minima).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

try:  # the compiled search; the NumPy path otherwise
    import numba
except ImportError:  # pragma: no cover - numba is optional
    numba = None  # type: ignore[assignment]

__all__ = ["available", "KernelTable", "search_batch"]

_EPS = float(np.finfo(np.float64).eps)

#: kernel statuses per sample
DONE, FALLBACK = 0, 1

#: the default cap on the leaves of a merged group of trees (:func:`merge_groups`; 0: the
#: independent-trees bound of the NumPy path)
MERGE_CAP = 0


def available() -> bool:
    """True when numba is importable (the kernel compiles on first use)."""
    return numba is not None


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True)
else:  # pragma: no cover - numba is optional: plain Python (never run on large problems)
    def _jit(f):
        return f



@_jit
def f32_above(v):  # pragma: no cover - compiled
    c = np.float32(v)
    for _ in range(3):
        if np.float64(c) <= v:
            c = np.nextafter(c, np.float32(np.inf))
    return np.float64(c)

@_jit
def f32_atmost(v):  # pragma: no cover - compiled
    c = np.float32(v)
    for _ in range(3):
        if np.float64(c) > v:
            c = np.nextafter(c, np.float32(-np.inf))
    return np.float64(c)

@_jit
def radius_key(dist, leaves, MARG, tree_start, m, T, base, tol, size):  # pragma: no cover
    """:func:`otstab.solve._radius_key.radius_key` on ``dist[:m]`` (grouped by tree,
    groups at ``tree_start[:T]``, each in leaf order) and the margins ``MARG[leaves[:m]]``.

    The same quantities without the per-tree sort: ``key0`` is the largest over trees of the
    nearest leaf's distance; a tree's running minimum at ``key0`` is the minimum over its
    leaves within ``key0``; the leaves beyond (the events) are taken in the order of a stable
    sort by distance of their positions (tree, then leaf order), which is the NumPy order
    (by distance, then tree, then leaf), and each lowers its tree's running minimum."""
    K1 = MARG.shape[1]
    key0 = -np.inf
    for t in range(T):
        s = tree_start[t]
        e = tree_start[t + 1] if t + 1 < T else m
        dmin = np.inf
        for q in range(s, e):
            if dist[q] < dmin:
                dmin = dist[q]
        if dmin > key0:
            key0 = dmin
    cur = np.empty((T, K1))
    bound0 = np.zeros(K1)
    n_ev = 0
    for t in range(T):
        s = tree_start[t]
        e = tree_start[t + 1] if t + 1 < T else m
        for k in range(K1):
            v = np.inf
            for q in range(s, e):
                if dist[q] <= key0:
                    u = MARG[leaves[q], k]
                    if u < v:
                        v = u
            cur[t, k] = v
            bound0[k] += v
        for q in range(s, e):
            if not dist[q] <= key0:
                n_ev += 1
    for k in range(K1):
        bound0[k] = base[k] + bound0[k]
    thr = tol + 8.0 * (m + T + 2) * _EPS * size
    rho = np.empty(K1)
    allfin = True
    for k in range(K1):
        if bound0[k] <= thr:
            rho[k] = key0
        else:
            rho[k] = np.inf
            allfin = False
    if n_ev > 0 and not allfin:
        ev = np.empty(n_ev, dtype=np.int64)
        evt = np.empty(n_ev, dtype=np.int64)
        dev = np.empty(n_ev)
        c = 0
        for t in range(T):
            s = tree_start[t]
            e = tree_start[t + 1] if t + 1 < T else m
            for q in range(s, e):
                if not dist[q] <= key0:
                    ev[c] = q
                    evt[c] = t
                    dev[c] = dist[q]
                    c += 1
        o = np.argsort(dev, kind="mergesort")
        for k in range(K1):
            if rho[k] < np.inf:
                continue
            for t in range(T):
                cur[t, 0] = np.inf
            # the running minima again, restricted to the leaves within key0
            for t in range(T):
                s = tree_start[t]
                e = tree_start[t + 1] if t + 1 < T else m
                v = np.inf
                for q in range(s, e):
                    if dist[q] <= key0:
                        u = MARG[leaves[q], k]
                        if u < v:
                            v = u
                cur[t, 0] = v
            cum = 0.0
            for q in range(n_ev):
                p = ev[o[q]]
                t = evt[o[q]]
                u = MARG[leaves[p], k]
                if u < cur[t, 0]:
                    cum += u - cur[t, 0]
                    cur[t, 0] = u
                else:
                    cum += 0.0
                if bound0[k] + cum <= thr:
                    rho[k] = dev[o[q]]
                    break
    key = np.inf
    for k in range(K1):
        if rho[k] < key:
            key = rho[k]
    return key if key < np.inf else key0


@_jit
def evaluate(LO, HI, A, B, TREE, MARG, base, x, w, upper, tol, size, f32, T,
             parent, pdist, pea, peb, blo, bhi, ea, eb, j, out, dist, tree_start, mbuf,
             bound):
    """The NumPy ``_Sample.evaluate`` of a box: the leaves of ``parent`` that meet it
    (only coordinate ``j`` is tested; ``j < 0``: every coordinate) closer than ``upper``
    go to ``out`` and their distances to ``dist`` (a leaf whose closure within the box is the
    same as within the parent box ``pea, peb`` keeps its parent distance ``pdist``: the same
    sum of the same terms); returns ``(m, key, single, uncertain)`` with ``m = -1`` when the box
    is discarded."""
    dm = x.shape[0]
    K1 = MARG.shape[1]
    m = 0
    for q in range(parent.shape[0]):
        leaf = parent[q]
        if j >= 0:
            lo = max(LO[leaf, j], blo[j])
            hi = min(HI[leaf, j], bhi[j])
            if not lo < hi:
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
            s = pdist[q]  # the leaf's closure within the box is the parent's
        else:
            # (a partial sum of nonnegative terms at or above upper stays there: the leaf
            # is dropped either way, so the sum stops)
            s = 0.0
            for jj in range(dm):
                a = max(A[leaf, jj], ea[jj])
                b = min(B[leaf, jj], eb[jj])
                g = max(max(a - x[jj], x[jj] - b), 0.0)
                s += g * g * w[jj]
                if not s < upper:
                    break
        if s < upper:
            out[m] = leaf
            dist[m] = s
            m += 1
    if m == 0:
        return -1, 0.0, False, False
    # trees present (the leaves are grouped by tree, in order)
    nt = 0
    for q in range(m):
        if q == 0 or TREE[out[q]] != TREE[out[q - 1]]:
            tree_start[nt] = q
            nt += 1
    if nt < T:
        return -1, 0.0, False, False
    key = -np.inf
    for k in range(K1):
        bound[k] = 0.0
    for t in range(T):
        s = tree_start[t]
        e = tree_start[t + 1] if t + 1 < T else m
        dmin = np.inf
        for k in range(K1):
            mbuf[k] = np.inf
        for q in range(s, e):
            if dist[q] < dmin:
                dmin = dist[q]
            for k in range(K1):
                v = MARG[out[q], k]
                if v < mbuf[k]:
                    mbuf[k] = v
        if dmin > key:
            key = dmin
        for k in range(K1):
            bound[k] += mbuf[k]
    safe = True
    wrong = False
    for k in range(K1):
        bound[k] = base[k] + bound[k]
        if not bound[k] > tol:
            safe = False
        if bound[k] < -tol:
            wrong = True
    if safe:
        return -1, 0.0, False, False
    rk = radius_key(dist, out, MARG, tree_start, m, T, base, tol, size)
    if rk > key:
        key = rk
    single = m == T
    uncertain = False
    if single:
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
            # an input in rlo < c(p) <= rhi (LeafTable.inner_point)
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
                return -1, 0.0, False, False
            g = max(max(ra - x[jj], x[jj] - rb), 0.0)
            rdist += g * g * w[jj]
        if not rdist < upper:
            return -1, 0.0, False, False
        uncertain = not wrong  # a tie within rounding: the model's predict decides
        if rdist > key:
            key = rdist
    return m, key, single, uncertain

@_jit
def worst_leaf(TREE, MARG, base, T, alive):  # pragma: no cover - compiled
    """The split rule's leaf: ``(s, e, worst)``, the most damaging leaf ``worst`` (smallest
    margin on the class with the smallest independent-trees bound) of the most spread tree,
    whose alive leaves are ``alive[s:e]``."""
    K1 = MARG.shape[1]
    m = alive.shape[0]
    tree_start = np.empty(T + 1, dtype=np.int64)
    nt = 0
    for q in range(m):
        if q == 0 or TREE[alive[q]] != TREE[alive[q - 1]]:
            tree_start[nt] = q
            nt += 1
    tree_start[T] = m
    mins = np.empty((T, K1))
    bound = np.zeros(K1)
    for t in range(T):
        for k in range(K1):
            v = np.inf
            for q in range(tree_start[t], tree_start[t + 1]):
                u = MARG[alive[q], k]
                if u < v:
                    v = u
            mins[t, k] = v
            bound[k] += v
    kk = 0
    for k in range(K1):
        bound[k] = base[k] + bound[k]
        if bound[k] < bound[kk]:
            kk = k
    best_t = 0
    best_s = -np.inf
    for t in range(T):
        s, e = tree_start[t], tree_start[t + 1]
        if e - s > 1:
            mx = -np.inf
            for q in range(s, e):
                u = MARG[alive[q], kk]
                if u > mx:
                    mx = u
            sp = mx - mins[t, kk]
        else:
            sp = -1.0
        if sp > best_s:
            best_s = sp
            best_t = t
    s, e = tree_start[best_t], tree_start[best_t + 1]
    worst = alive[s]
    wv = MARG[worst, kk]
    for q in range(s + 1, e):
        u = MARG[alive[q], kk]
        if u < wv:
            wv = u
            worst = alive[q]
    return s, e, worst


@_jit
def leaf_cut(LO, HI, A, B, x, sqw, leaf, blo, bhi, ea, eb):  # pragma: no cover - compiled
    """``(j, cut, edge)``: the edge of ``leaf`` inside the box that moves its half farthest
    from ``x`` (``j = -1``: the leaf covers the box)."""
    dm = x.shape[0]
    bj, bcut, bedge, bg = -1, 0.0, 0.0, -np.inf
    for jj in range(dm):
        for side in range(2):
            if side == 0:  # the leaf's lower edge: the upper half (cut, bhi]
                cut = max(LO[leaf, jj], blo[jj])
                edge = max(A[leaf, jj], ea[jj])
                a, b = edge, eb[jj]
            else:  # its upper edge: the lower half (blo, cut]
                cut = min(HI[leaf, jj], bhi[jj])
                edge = min(B[leaf, jj], eb[jj])
                a, b = ea[jj], edge
            if not (blo[jj] < cut and cut < bhi[jj]):
                continue
            g = max(max(a - x[jj], x[jj] - b), 0.0) * sqw[jj]
            if g > bg:
                bj, bcut, bedge, bg = jj, cut, edge, g
    return bj, bcut, bedge


@_jit
def split(LO, HI, A, B, TREE, MARG, base, x, sqw, T, alive, blo, bhi, ea, eb):
    """The NumPy ``_Sample.split`` rule: ``(j, cut, edge)``: cut coordinate j at ``cut``
    (its float64 edge ``edge``)."""
    s, e, worst = worst_leaf(TREE, MARG, base, T, alive)
    return leaf_cut(LO, HI, A, B, x, sqw, worst, blo, bhi, ea, eb)

@_jit
def heap_less(keys, a, b):
    return keys[a] < keys[b] or (keys[a] == keys[b] and a < b)

@_jit
def search_one(LO, HI, A, B, TREE, MARG, base, x, w, sqw, upper, tol, size, f32, T,
               root, max_nodes, pbox):  # pragma: no cover - compiled
    """``(bound, exact, nodes, status)`` of one sample (the NumPy ``_branch_and_bound``);
    ``pbox``: where a search ends on a box with one leaf per tree, the intersection of the
    box with those leaves (its ``lo``, ``hi``)."""
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
    UNC = np.zeros(cap, dtype=np.bool_)
    OFF = np.empty(cap, dtype=np.int64)
    LEN = np.empty(cap, dtype=np.int64)
    pool = np.empty(max(4 * L, 1024), dtype=np.int32)
    pool_d = np.empty(pool.shape[0])
    used = 0
    out = np.empty(L, dtype=np.int32)
    dist = np.empty(L)
    tree_start = np.empty(T + 1, dtype=np.int64)
    mbuf = np.empty(K1)
    bound = np.empty(K1)
    heap = np.empty(cap, dtype=np.int64)
    hn = 0
    blo = np.full(dm, -np.inf)
    bhi = np.full(dm, np.inf)
    m, key, single, unc = evaluate(LO, HI, A, B, TREE, MARG, base, x, w, upper, tol, size,
                                   f32, T, root, dist, blo, bhi, blo, bhi, blo, bhi,
                                   -1, out, dist, tree_start, mbuf, bound)
    if m < 0:
        return upper, True, 1, DONE
    # the root's leaves (every later box's are among them), copied together: the rows a box
    # reads lie close in memory; local indices keep the leaf order (and so the tree groups)
    sel = out[:m].copy()
    LO = LO[sel]
    HI = HI[sel]
    A = A[sel]
    B = B[sel]
    TREE = TREE[sel]
    MARG = MARG[sel]
    nb = 0  # boxes pushed (the heap's counter)
    BLO[0], BHI[0], EA[0], EB[0] = blo, bhi, blo, bhi
    KEY[0], SINGLE[0], UNC[0] = key, single, unc
    for q in range(m):
        pool[q] = q
    pool_d[:m] = dist[:m]
    OFF[0], LEN[0] = 0, m
    used = m
    nb = 1
    heap[0] = 0
    hn = 1
    nodes = 1
    cb_lo = np.empty(dm)
    cb_hi = np.empty(dm)
    cb_ea = np.empty(dm)
    cb_eb = np.empty(dm)
    while hn > 0:
        top = heap[0]
        ktop = KEY[top]
        if SINGLE[top]:  # (pbox: the box within its leaves, one of each tree or group)
            pbox[0] = BLO[top]
            pbox[1] = BHI[top]
            for q in range(OFF[top], OFF[top] + LEN[top]):
                for jj in range(dm):
                    pbox[0, jj] = max(pbox[0, jj], LO[pool[q], jj])
                    pbox[1, jj] = min(pbox[1, jj], HI[pool[q], jj])
            return min(ktop, upper), True, nodes, FALLBACK if UNC[top] else DONE
        if nodes >= max_nodes:
            return min(ktop, upper), False, nodes, DONE
        # pop
        hn -= 1
        if hn > 0:
            last = heap[hn]
            p = 0
            while True:
                c = 2 * p + 1
                if c >= hn:
                    break
                if c + 1 < hn and heap_less(KEY, heap[c + 1], heap[c]):
                    c += 1
                if heap_less(KEY, heap[c], last):
                    heap[p] = heap[c]
                    p = c
                else:
                    break
            heap[p] = last
        parent = pool[OFF[top]:OFF[top] + LEN[top]]
        pdist = pool_d[OFF[top]:OFF[top] + LEN[top]]
        j, cut, edge = split(LO, HI, A, B, TREE, MARG, base, x, sqw, T, parent,
                             BLO[top], BHI[top], EA[top], EB[top])
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
            m, ck, single, unc = evaluate(LO, HI, A, B, TREE, MARG, base, x, w, upper,
                                          tol, size, f32, T, parent, pdist, EA[top],
                                          EB[top], cb_lo, cb_hi, cb_ea, cb_eb, j, out, dist,
                                          tree_start, mbuf, bound)
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
                KEY2 = np.empty(cap2)
                KEY2[:nb] = KEY
                KEY = KEY2
                S2 = np.zeros(cap2, dtype=np.bool_)
                S2[:nb] = SINGLE
                SINGLE = S2
                U2 = np.zeros(cap2, dtype=np.bool_)
                U2[:nb] = UNC
                UNC = U2
                O2 = np.empty(cap2, dtype=np.int64)
                O2[:nb] = OFF
                OFF = O2
                L2 = np.empty(cap2, dtype=np.int64)
                L2[:nb] = LEN
                LEN = L2
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
            BLO[nb], BHI[nb], EA[nb], EB[nb] = cb_lo, cb_hi, cb_ea, cb_eb
            KEY[nb] = max(ck, ktop)
            SINGLE[nb], UNC[nb] = single, unc
            pool[used:used + m] = out[:m]
            pool_d[used:used + m] = dist[:m]
            OFF[nb], LEN[nb] = used, m
            used += m
            # push
            p = hn
            hn += 1
            while p > 0:
                q = (p - 1) // 2
                if heap_less(KEY, nb, heap[q]):
                    heap[p] = heap[q]
                    p = q
                else:
                    break
            heap[p] = nb
            nb += 1
    return upper, True, nodes, DONE

@_jit
def _pair_count(LO, HI, A, B, x, w, upper, s1, e1, s2, e2, cap):  # pragma: no cover
    """The number of nonempty intersections of a leaf of ``s1:e1`` with one of ``s2:e2``
    closer than ``upper`` (counting stops above ``cap``)."""
    dm = x.shape[0]
    c = 0
    for p in range(s1, e1):
        for q in range(s2, e2):
            ok = True
            for jj in range(dm):
                if not max(LO[p, jj], LO[q, jj]) < min(HI[p, jj], HI[q, jj]):
                    ok = False
                    break
            if not ok:
                continue
            s = 0.0
            for jj in range(dm):
                a = max(A[p, jj], A[q, jj])
                b = min(B[p, jj], B[q, jj])
                g = max(max(a - x[jj], x[jj] - b), 0.0)
                s += g * g * w[jj]
                if not s < upper:
                    break
            if s < upper:
                c += 1
                if c > cap:
                    return c
    return c

@_jit
def merge_groups(LO, HI, A, B, MARG, x, w, upper, starts, cap):  # pragma: no cover
    """Trees merged into groups (the merged bound of the module doc).

    ``LO, HI, A, B, MARG``: the leaves of one sample (rows), grouped by tree, the groups
    starting at ``starts`` (``starts[-1]`` = rows). Rounds: the groups not yet frozen are
    paired in order of their number of leaves (the two smallest, the next two, ...: trees
    with one leaf within ``upper`` collapse into one constant group); a pair becomes one
    group whose leaves are the nonempty intersections of a leaf of each (boxes: the larger
    lower threshold and edge, the smaller upper threshold and edge; margin: the sum) closer
    than ``upper``, unless there would be more than ``cap`` of them: then both are frozen,
    unmerged. Every input lies in one leaf of each tree, so in exactly one leaf of each
    group, whose margin is the sum of the trees'. Returns ``(LO, HI, A, B, MARG, starts)``
    of the groups."""
    dm = x.shape[0]
    K1 = MARG.shape[1]
    frozen = np.zeros(starts.shape[0] - 1, dtype=np.bool_)
    while True:
        G = starts.shape[0] - 1
        # kind: 0 copied, 1 merged with partner[g], 2 merged into its partner (skipped)
        kind = np.zeros(G, dtype=np.int64)
        partner = np.full(G, -1, dtype=np.int64)
        counts = np.zeros(G, dtype=np.int64)
        prev = -1
        n_new = 0
        G2 = 0
        merged_any = False
        sizes = np.empty(G, dtype=np.int64)
        for g in range(G):
            sizes[g] = starts[g + 1] - starts[g]
        for g0 in np.argsort(sizes, kind="mergesort"):
            if frozen[g0]:
                continue
            if prev < 0:
                prev = g0
                continue
            g1, g2 = min(prev, g0), max(prev, g0)
            prev = -1
            c = _pair_count(LO, HI, A, B, x, w, upper, starts[g1], starts[g1 + 1],
                            starts[g2], starts[g2 + 1], cap)
            if c <= cap:
                kind[g1], kind[g2] = 1, 2
                partner[g1] = g2
                counts[g1] = c
                merged_any = True
            else:
                frozen[g1] = True
                frozen[g2] = True
        if not merged_any:
            return LO, HI, A, B, MARG, starts
        for g in range(G):
            if kind[g] == 0:
                n_new += starts[g + 1] - starts[g]
                G2 += 1
            elif kind[g] == 1:
                n_new += counts[g]
                G2 += 1
        LO2 = np.empty((n_new, dm))
        HI2 = np.empty((n_new, dm))
        A2 = np.empty((n_new, dm))
        B2 = np.empty((n_new, dm))
        M2 = np.empty((n_new, K1))
        st2 = np.empty(G2 + 1, dtype=np.int64)
        fr2 = np.zeros(G2, dtype=np.bool_)
        r = 0
        gg = 0
        for g in range(G):
            if kind[g] == 2:
                continue
            st2[gg] = r
            fr2[gg] = frozen[g]
            gg += 1
            if kind[g] == 0:
                for p in range(starts[g], starts[g + 1]):
                    LO2[r] = LO[p]
                    HI2[r] = HI[p]
                    A2[r] = A[p]
                    B2[r] = B[p]
                    M2[r] = MARG[p]
                    r += 1
                continue
            h = partner[g]
            for p in range(starts[g], starts[g + 1]):
                for q in range(starts[h], starts[h + 1]):
                    ok = True
                    for jj in range(dm):
                        if not max(LO[p, jj], LO[q, jj]) < min(HI[p, jj], HI[q, jj]):
                            ok = False
                            break
                    if not ok:
                        continue
                    s = 0.0
                    for jj in range(dm):
                        a = max(A[p, jj], A[q, jj])
                        b = min(B[p, jj], B[q, jj])
                        gap = max(max(a - x[jj], x[jj] - b), 0.0)
                        s += gap * gap * w[jj]
                        if not s < upper:
                            break
                    if not s < upper:
                        continue
                    for jj in range(dm):
                        LO2[r, jj] = max(LO[p, jj], LO[q, jj])
                        HI2[r, jj] = min(HI[p, jj], HI[q, jj])
                        A2[r, jj] = max(A[p, jj], A[q, jj])
                        B2[r, jj] = min(B[p, jj], B[q, jj])
                    for k in range(K1):
                        M2[r, k] = MARG[p, k] + MARG[q, k]
                    r += 1
        st2[G2] = r
        LO, HI, A, B, MARG, starts, frozen = LO2, HI2, A2, B2, M2, st2, fr2


@_jit
def search_merged(LO, HI, A, B, TREE, MARG, base, x, w, sqw, upper, tol, size, f32, T,
                  root, max_nodes, cap, pbox):  # pragma: no cover - compiled
    """:func:`search_one` on the sample's leaves within ``upper`` (those of ``root`` meeting
    the root box) with its trees merged into groups of at most ``cap`` leaves
    (:func:`merge_groups`); ``cap <= 0``: :func:`search_one` itself."""
    if cap <= 0:
        return search_one(LO, HI, A, B, TREE, MARG, base, x, w, sqw, upper, tol, size, f32,
                          T, root, max_nodes, pbox)
    dm = x.shape[0]
    K1 = MARG.shape[1]
    L = root.shape[0]
    out = np.empty(L, dtype=np.int32)
    dist = np.empty(L)
    tree_start = np.empty(T + 1, dtype=np.int64)
    mbuf = np.empty(K1)
    bound = np.empty(K1)
    blo = np.full(dm, -np.inf)
    bhi = np.full(dm, np.inf)
    m, key, single, unc = evaluate(LO, HI, A, B, TREE, MARG, base, x, w, upper, tol, size,
                                   f32, T, root, dist, blo, bhi, blo, bhi, blo, bhi,
                                   -1, out, dist, tree_start, mbuf, bound)
    if m < 0:
        return upper, True, 1, DONE
    if single:  # one leaf per tree: nothing to merge
        return search_one(LO, HI, A, B, TREE, MARG, base, x, w, sqw, upper, tol, size, f32,
                          T, root, max_nodes, pbox)
    sel = out[:m].copy()
    starts = np.empty(T + 1, dtype=np.int64)
    starts[:T] = tree_start[:T]
    starts[T] = m
    mLO, mHI, mA, mB, mM, st = merge_groups(LO[sel], HI[sel], A[sel], B[sel], MARG[sel], x,
                                            w, upper, starts, cap)
    G = st.shape[0] - 1
    n = mLO.shape[0]
    GT = np.empty(n, dtype=np.int64)
    for g in range(G):
        GT[st[g]:st[g + 1]] = g
    return search_one(mLO, mHI, mA, mB, GT, mM, base, x, w, sqw, upper, tol, size, f32, G,
                      np.arange(n).astype(np.int32), max_nodes, pbox)


@_jit
def fixed_leaves(FLO, FHI, cf, keep):  # pragma: no cover - compiled
    """The leaves holding a sample in its fixed features (``cf``: their comparable values),
    written to ``keep``; returns how many."""
    c = 0
    for leaf in range(FLO.shape[0]):
        ok = True
        for f in range(FLO.shape[1]):
            if not (FLO[leaf, f] < cf[f] and cf[f] <= FHI[leaf, f]):
                ok = False
                break
        if ok:
            keep[c] = leaf
            c += 1
    return c


@_jit
def batch_merged(LO, HI, A, B, TREE, MARG, BASE, FLO, FHI, XM, CF, Y, UP, BUD, w, sqw, tol,
                 size, f32, T, r0, r1, low, exact, used, status, PBOX,
                 cap):  # pragma: no cover
    """:func:`batch` with the trees merged (:func:`search_merged`, groups of at most
    ``cap`` leaves)."""
    keep = np.empty(LO.shape[0], dtype=np.int32)
    for i in range(r0, r1):
        c = fixed_leaves(FLO, FHI, CF[i], keep)
        y = Y[i]
        b, ex, nd, st = search_merged(LO, HI, A, B, TREE, MARG[y], BASE[y], XM[i], w, sqw,
                                      UP[i], tol, size, f32, T, keep[:c], BUD[i], cap,
                                      PBOX[i])
        low[i] = b
        exact[i] = ex
        used[i] = nd
        status[i] = st


@_jit
def batch(LO, HI, A, B, TREE, MARG, BASE, FLO, FHI, XM, CF, Y, UP, BUD, w, sqw, tol,
          size, f32, T, r0, r1, low, exact, used, status, PBOX):  # pragma: no cover
    """The rows ``r0 <= i < r1`` of a batch, one after the other (without the GIL)."""
    keep = np.empty(LO.shape[0], dtype=np.int32)
    for i in range(r0, r1):
        c = fixed_leaves(FLO, FHI, CF[i], keep)
        y = Y[i]
        b, ex, nd, st = search_one(LO, HI, A, B, TREE, MARG[y], BASE[y], XM[i], w, sqw,
                                   UP[i], tol, size, f32, T, keep[:c], BUD[i], PBOX[i])
        low[i] = b
        exact[i] = ex
        used[i] = nd
        status[i] = st


class KernelTable:
    """A :class:`~otstab.solve._bounds.LeafTable` laid out for the kernel: the movable
    columns of the leaf boxes and their edges, the fixed columns, and the margins
    ``F_y - F_k`` of every leaf for each label ``y``."""

    def __init__(self, table, mv, weights=None, merge=None):
        self.merge = MERGE_CAP if merge is None else int(merge)
        mv = np.asarray(mv, dtype=bool)
        fixed = ~mv
        a, b = table.leaf_edges()
        self.LO = np.ascontiguousarray(table.lo[:, mv])
        self.HI = np.ascontiguousarray(table.hi[:, mv])
        self.A = np.ascontiguousarray(a[:, mv])
        self.B = np.ascontiguousarray(b[:, mv])
        self.FLO = np.ascontiguousarray(table.lo[:, fixed])
        self.FHI = np.ascontiguousarray(table.hi[:, fixed])
        self.TREE = np.ascontiguousarray(table.tree, dtype=np.int64)
        K = table.value.shape[1]
        V = table.value
        self.MARG = np.empty((K, V.shape[0], K - 1))
        self.BASE = np.empty((K, K - 1))
        for y in range(K):
            others = [k for k in range(K) if k != y]
            self.MARG[y] = V[:, [y]] - V[:, others]
            self.BASE[y] = table.base[y] - table.base[others]
        self.w = (np.ones(int(mv.sum())) if weights is None
                  else np.ascontiguousarray(np.asarray(weights, dtype=np.float64)[mv]))
        self.sqw = np.sqrt(self.w)
        self.mv, self.fixed = mv, fixed
        size = float(np.max(np.abs(table.base), initial=0)) + table.scale
        self.size = size
        # the NumPy path's tie band (otstab.solve._bounds._Sample)
        self.tol = 4 * (table.n_trees + 2) * np.finfo(np.float64).eps * size + 1e-15 + table.tol
        self.f32 = bool(table.f32)
        self.T = int(table.n_trees)
        self.table = table


def search_batch(kt: KernelTable, X, yi, idx, budgets, upper, boxes=None):
    """The branch and bound of the samples ``idx`` (rows of X, labels yi), each with its
    box budget and known upper bound, in parallel. Returns ``(low, exact, used, status)``;
    ``status[i] == FALLBACK``: a tie the kernel cannot decide (module doc): rerun that sample
    with the NumPy path. ``boxes`` (k, 2, movable features), optional: where a search ended
    on a box with one leaf per tree, the box within those leaves (``lo``, ``hi``; rows of the
    others untouched)."""
    kern = batch
    idx = np.asarray(idx, dtype=np.intp)
    X = np.asarray(X, dtype=np.float64)
    XM = np.ascontiguousarray(X[idx][:, kt.mv])
    CF = np.ascontiguousarray(kt.table.comparable(X[idx])[:, kt.fixed])
    k = idx.size
    low = np.empty(k)
    exact = np.zeros(k, dtype=np.bool_)
    used = np.zeros(k, dtype=np.int64)
    status = np.zeros(k, dtype=np.int64)
    up = np.ascontiguousarray(np.asarray(upper, dtype=np.float64))
    bud = np.ascontiguousarray(np.asarray(budgets, dtype=np.int64))
    Y = np.ascontiguousarray(np.asarray(yi, dtype=np.int64)[idx])
    pbox = np.empty((k, 2, XM.shape[1])) if boxes is None else boxes

    cap = int(getattr(kt, "merge", 0))

    def run(i):
        if cap > 0:
            batch_merged(kt.LO, kt.HI, kt.A, kt.B, kt.TREE, kt.MARG, kt.BASE, kt.FLO, kt.FHI,
                         XM, CF, Y, up, bud, kt.w, kt.sqw, float(kt.tol), float(kt.size),
                         kt.f32, kt.T, i, i + 1, low, exact, used, status, pbox, cap)
            return
        kern(kt.LO, kt.HI, kt.A, kt.B, kt.TREE, kt.MARG, kt.BASE, kt.FLO, kt.FHI, XM, CF, Y,
             up, bud, kt.w, kt.sqw, float(kt.tol), float(kt.size), kt.f32, kt.T, i, i + 1,
             low, exact, used, status, pbox)

    workers = threads()
    if workers <= 1 or k <= 1:
        for i in range(k):
            run(i)
    else:  # one sample a task, the largest budgets first (the threads share the work)
        order = np.argsort(-bud, kind="stable")
        with ThreadPoolExecutor(max_workers=min(workers, k)) as pool:
            list(pool.map(run, order.tolist()))
    return low, exact, used, status


def threads() -> int:
    """Threads of the kernel: numba's thread count (``NUMBA_NUM_THREADS``, default every
    core)."""
    return int(getattr(numba.config, "NUMBA_NUM_THREADS", 1)) if numba is not None else 1

