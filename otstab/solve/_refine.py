"""Tightness where it matters: which samples' tree searches to refine, and when to stop
(the ``rtol`` rule of the certified tree bounds, issue 29).

R depends on a sample's distance only through ``l_h = (h - theta1 d_i)_+``: a sample whose
certified ``theta1 dlow_i`` is at or above the dual's ``h`` (of the lower and of the upper
dual) does not enter the value at that h. So the searches run in rounds: every sample first
gets its root box (``first``, in order of its found distance), then, while
``value_lower < (1 - rtol) value_upper``, the samples that enter either dual
(``theta1 dlow_i < max(h_lower, h_upper)``) and are not solved get four times the boxes of
their last round (up to ``max_nodes``), the widest gap ``dup_i - dlow_i`` first. A round
re-runs a sample's search from its root with the larger budget: the examined boxes are a
function of the budget alone, so the bounds stay deterministic; ``node_budget`` counts every
box of every round, and more boxes never lower a bound (each round keeps the best of its
own and the previous bound).

With ``reach`` (the tree bounds pass 1.25) a round searches a sample only out to
``reach * h / theta1``: beyond, no sample enters either dual at that h.

``rtol=None`` gives every sample ``max_nodes`` boxes in one round, in order of its found
distance (the behaviour before the rule).
"""

from __future__ import annotations

import math
import time

import numpy as np
from otstab_solvers.zero_one import solve_zero_one

from ..errors import ValidationError

__all__ = ["refine", "ZeroOneDuals", "check_rtol", "FIRST_NODES", "RTOL"]

#: boxes per sample in the first round
FIRST_NODES = 1

#: the default stopping rule of certify: stop once value_lower >= (1 - RTOL) value_upper
RTOL = 0.01


def check_rtol(rtol):
    """``rtol`` as a float in [0, 1), or None."""
    if rtol is None:
        return None
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float, np.number)) or \
            not 0.0 <= float(rtol) < 1.0:
        raise ValidationError(f"rtol must be a number in [0, 1) (the relative gap "
                              f"1 - value_lower / value_upper at which the tree search stops), "
                              f"got {rtol!r}")
    return float(rtol)


class ZeroOneDuals:
    """The 0/1 duals on candidate distances: ``(value, h)`` of the exact dual on
    ``theta1 d`` (misclassified samples at 0). Used to decide which samples matter and when
    the interval is tight enough; the certified value itself is computed by the caller."""

    def __init__(self, loss0, r, theta1, theta2, divergence, p=None):
        self.wrong = np.asarray(loss0) > 0
        self.r, self.theta1, self.theta2 = float(r), float(theta1), float(theta2)
        self.divergence, self.p = divergence, p

    def __call__(self, d):
        d = np.where(self.wrong, 0.0, np.asarray(d, dtype=np.float64))
        a = d * self.theta1 if math.isfinite(self.theta1) else np.where(d > 0, np.inf, 0.0)
        base = float(np.mean(self.wrong)) if self.p is None else float(np.dot(self.p,
                                                                               self.wrong))
        if self.r <= base:
            return 0.0, 0.0
        if self.r >= 1.0:
            return math.inf, math.inf
        method = "closed_form" if self.divergence == "kl" or math.isinf(self.theta2) \
            else "dual"
        try:
            sol = solve_zero_one(a, self.r, self.theta2, self.divergence, method=method,
                                 p=self.p)
        except Exception:  # noqa: BLE001 - a failed solve: no stopping, refine everything
            return math.nan, math.inf
        h = float(sol.h) if math.isfinite(float(sol.h)) else math.inf
        return float(sol.value), h


#: boxes per chunk of a batched round: the deadline is checked between chunks
CHUNK_NODES = 16384


def _one_by_one(search):
    """A batched ``search_many`` from a per-sample ``search``: samples in order until one is
    stopped by the deadline (the prefix done is returned)."""

    def many(ids, budgets, deadline, uppers):
        out = []
        for i, b, u in zip(ids, budgets, uppers):
            res = search(int(i), int(b), deadline, float(u))
            out.append(res)
            if res[3]:
                break
        return out

    return many


def refine(n, search, up, duals, *, rtol, max_nodes, node_budget=None, deadline=math.inf,
           skip=None, first=FIRST_NODES, progress=None, search_many=None, reach=None):
    """Run ``search(i, budget, deadline, upper) -> (low, exact, used, timed_out, up_i)`` over
    the samples in rounds (module doc). ``up``: the found distances (improved in place by the
    searches); ``duals``: a :class:`ZeroOneDuals` (None with ``rtol=None``); ``skip``: samples
    not to search (``dlow = up``, e.g. misclassified ones at 0).

    ``search_many(ids, budgets, deadline, uppers)``: the same for several samples at once (a
    compiled, parallel search), returning the list of their results in order, possibly only a
    prefix (it stops after a sample the deadline stopped). A round is run in chunks of about
    :data:`CHUNK_NODES` boxes with the deadline checked between chunks; the result is the
    sequential one's: each sample's budget is ``max(1, min(budget, node_budget - total))``
    with ``total`` the boxes of the samples before it (a chunk that a node budget could cut
    runs one sample at a time), and once a budget is spent the samples not yet searched get
    their root box only. So a time-stopped run is reproduced by its ``node_budget``.

    ``reach`` (a factor >= 1, with ``duals`` and ``rtol``): a round searches each sample only
    out to ``reach * h / theta1`` (``h``: the larger of the two duals' thresholds before the
    round), the search's ``upper`` capped there: no sample beyond it enters either dual at
    that h, and the search examines only the leaves within the cap. A search that completes
    below the cap without a misclassified region proves ``d*_i >= cap`` (a bound, not the
    exact distance: the sample is searched again, from its root, if a later h passes it);
    one that finds a misclassified region closer than the cap has the exact distance.

    Returns ``(dlow, exact, info)``; ``info``: ``nodes``, ``rounds``, ``stopped``
    (``"rtol"``, ``"time_budget"``, ``"node_budget"`` or None), ``node_budget`` (the budget
    that reproduces a time-stopped run)."""
    many = search_many if search_many is not None else _one_by_one(search)
    up = np.asarray(up, dtype=np.float64)
    dlow = np.zeros(n)
    exact = np.zeros(n, dtype=bool)
    given = np.zeros(n, dtype=np.int64)
    if skip is not None:
        dlow[skip] = up[skip]
        exact[skip] = True
    st = {"total": 0, "stopped": None, "reproduce": None, "done": 0}
    rounds = 0
    budget = int(max_nodes) if rtol is None else min(int(first), int(max_nodes))
    todo = np.flatnonzero(~exact & (up > 0))
    exact[(up == 0) & ~exact] = True
    todo = todo[np.argsort(up[todo], kind="stable")]

    cap = {"at": math.inf}  # the search radius of this round (reach)
    use_reach = reach is not None and rtol is not None and duals is not None
    if use_reach:
        _, h0 = duals(up)
        t1r = duals.theta1 if math.isfinite(duals.theta1) else 1.0
        if math.isfinite(h0):
            cap["at"] = float(reach) * h0 / t1r

    def search_upper(ids):
        return np.minimum(up[ids], cap["at"])

    def take(ids, budgets, results):
        """Record the results of the samples ``ids`` (in order); False once a budget ran out
        (the rest of ``ids`` is then left to the stopped mode)."""
        for i, b, res in zip(ids, budgets, results):
            low, ex, used, timed_out, up_i = res
            if up[i] > cap["at"]:  # a capped search (reach): d*_i >= low; exact only when
                # a misclassified region closer than the cap was found
                ex = bool(ex) and low < cap["at"]
                up_i = up[i]
            up[i] = min(up[i], up_i)
            dlow[i] = max(dlow[i], min(low, up[i]))
            exact[i] = exact[i] or ex
            given[i] = b
            st["total"] += used
            st["done"] += 1
            if progress is not None:
                progress(st["done"])
            if st["stopped"] is None:
                if timed_out:
                    st["stopped"], st["reproduce"] = "time_budget", st["total"]
                elif node_budget is not None and st["total"] >= node_budget:
                    st["stopped"], st["reproduce"] = "node_budget", node_budget
                if st["stopped"] is not None:
                    return False
        return True

    while todo.size:
        rounds += 1
        pos = 0
        while pos < todo.size:
            if st["stopped"] is not None:
                # a budget ran out: the samples not yet searched get their root box only
                rest = todo[pos:]
                rest = rest[given[rest] == 0]
                if rest.size:
                    ones = np.ones(rest.size, dtype=np.int64)
                    take(rest, ones, many(rest, ones, math.inf, search_upper(rest)))
                break
            if time.perf_counter() > deadline and search_many is not None:
                # (before any box: every sample gets its root box, as node_budget=1 gives)
                st["stopped"], st["reproduce"] = "time_budget", max(st["total"], 1)
                continue
            size = max(1, CHUNK_NODES // max(budget, 1))
            ids = todo[pos:pos + size]
            if node_budget is not None and \
                    node_budget - st["total"] < ids.size * (budget + 1):
                ids = ids[:1]  # the node budget may cut this chunk: one at a time
                b = max(1, min(budget, node_budget - st["total"]))
            else:
                b = budget
            budgets = np.full(ids.size, b, dtype=np.int64)
            results = many(ids, budgets, deadline, search_upper(ids))
            take(ids[:len(results)], budgets, results)
            pos += len(results)
        if st["stopped"] is not None or rtol is None or budget >= max_nodes:
            break
        lower, hl = duals(dlow)
        upper, hu = duals(up)
        if math.isfinite(upper) and lower >= (1.0 - rtol) * upper:
            st["stopped"] = "rtol"
            break
        budget = min(4 * budget, int(max_nodes))
        h = max(hl, hu)
        theta1 = duals.theta1
        t1 = theta1 if math.isfinite(theta1) else 1.0
        matters = (t1 * dlow < h * (1 + 1e-9)) if math.isfinite(h) else np.ones(n, bool)
        todo = np.flatnonzero(matters & ~exact & (given < budget))
        todo = todo[np.argsort(-(up[todo] - dlow[todo]), kind="stable")]
        if use_reach:
            cap["at"] = float(reach) * h / t1 if math.isfinite(h) else math.inf
        if time.perf_counter() > deadline:
            st["stopped"], st["reproduce"] = "time_budget", st["total"]
            break
    np.minimum(dlow, up, out=dlow)
    return dlow, exact, {"nodes": st["total"], "rounds": rounds, "stopped": st["stopped"],
                         "node_budget": st["reproduce"]}
