"""Feature stability (Sec. 2.4 of the paper): which feature makes a model fragile?

To score feature j only coordinate j may move (the cost of moving any other coordinate is
infinite); reweighting is allowed as usual. The score is R_j(beta, r); a lower score means a
more sensitive feature. A one-hot block (all columns of one categorical variable) can be scored
as one feature by letting the whole block move (``groups=``).

For linear models every feature is scored from one pass over the data: the reduced form keeps
its ``c1`` and only ``c2`` changes (``c2_k = a_kj^2 / (4 theta1)``), and for the 0/1 loss
``d*_ij = m_i^2 / beta_j^2`` shares one sort of the margins across all features.

A feature the model ignores (zero coefficients) cannot change any loss by moving: its score is
reported as ``inf`` (infinitely stable), whatever reweighting alone could do; the
reweighting-only value is in ``df.attrs["reweighting_only_value"]``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from otstab_solvers.dual import oracle_for, solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.sorted_oracle import SortedTwoPiece
from otstab_solvers.weights import chi2_alpha, chi2_weights, kl_weights
from otstab_solvers.zero_one import solve_zero_one

from .errors import SolverError, ValidationError
from .losses import MulticlassHinge, PiecewiseLinear, ZeroOne, get_loss
from .models import resolve_model
from .params import check_common
from .reduction import reduce_problem
from .smooth import certify_smooth

__all__ = ["feature_stability"]

COLUMNS = ["feature", "score", "rank", "h", "share_moving", "share_reweighting", "columns"]


def _units(names, features, groups):
    """[(label, column indices)] for the features/groups to score."""
    index = {nm: j for j, nm in enumerate(names)}
    grouped = set()
    units = []
    if groups is not None:
        if not isinstance(groups, dict):
            raise ValidationError("groups must be a dict {name: [columns...]}")
        for g, cols in groups.items():
            idx = []
            for c in cols:
                if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
                    if not 0 <= int(c) < len(names):
                        raise ValidationError(f"groups[{g!r}]: column index {c} out of range")
                    idx.append(int(c))
                elif str(c) in index:
                    idx.append(index[str(c)])
                else:
                    raise ValidationError(f"groups[{g!r}]: unknown column {c!r}")
            if not idx:
                raise ValidationError(f"groups[{g!r}] is empty")
            grouped.update(idx)
            units.append((str(g), idx))
    if features is None:
        singles = [(names[j], [j]) for j in range(len(names)) if j not in grouped]
        units = singles + units
    else:
        chosen = []
        for f in np.atleast_1d(np.asarray(features, dtype=object)).tolist():
            if any(u[0] == str(f) for u in units):
                chosen.append(next(u for u in units if u[0] == str(f)))
            elif isinstance(f, (int, np.integer)) and not isinstance(f, bool):
                if not 0 <= int(f) < len(names):
                    raise ValidationError(f"features: index {f} out of range")
                chosen.append((names[int(f)], [int(f)]))
            elif str(f) in index:
                chosen.append((str(f), [index[str(f)]]))
            else:
                raise ValidationError(f"features: unknown feature {f!r}")
        units = chosen
    return units


def _dense_parts(w, d_lo, d_hi):
    """(lo, hi, moved_lo, moved_hi): the risk of Q* with weights ``w`` and the tied samples'
    loss at the low (lo) or high (hi) piece, and the same means without the weights."""
    n = w.size
    return (float(w @ d_lo) / n, float(w @ d_hi) / n, float(np.mean(d_lo)),
            float(np.mean(d_hi)))


def _risk_parts(oracle, h, theta2, divergence):
    """:func:`_dense_parts` of Q* at ``h`` (from prefix sums when the oracle is sorted)."""
    if oracle.prefix is not None:
        return oracle.prefix.risk_parts(h, theta2, divergence)
    lh, _, d_lo, _, d_hi = oracle.scan(h)
    return _dense_parts(_weights(lh, theta2, divergence), d_lo, d_hi)


def _shares(parts, base, r):
    """Share of the excess risk from moving vs reweighting, with ties mixed to reach r."""
    lo, hi, mlo, mhi = parts
    lam = 0.0 if hi <= lo else min(max((r - lo) / (hi - lo), 0.0), 1.0)
    moved = mlo + lam * (mhi - mlo)
    risk = lo + lam * (hi - lo)
    excess = risk - base
    if excess <= 0:
        return 0.0, 0.0
    return (moved - base) / excess, (risk - moved) / excess


def _weights(lh, theta2, divergence):
    if divergence == "kl" or math.isinf(theta2):
        return kl_weights(lh, theta2)
    return chi2_weights(lh, theta2, chi2_alpha(lh, theta2))


def feature_stability(model, X, y, *, loss, r, theta1=1.0, theta2=0.25, divergence="kl",
                      features=None, groups=None, solver="auto") -> pd.DataFrame:
    """Score each feature (or group of columns) by R_j(beta, r): lowest = most sensitive.

    Parameters
    ----------
    model, X, y, loss, r, theta1, theta2, divergence : as in :func:`otstab.certify`
    features : sequence of names or indices, optional
        Which features (or group names) to score; default all columns (grouped columns are
        scored as their group).
    groups : dict {name: [columns]}, optional
        Blocks scored as one feature (e.g. the one-hot columns of a categorical variable:
        ``otstab.datasets.feature_groups(df)``).
    solver : "auto" or "first_order"
        Linear models with piecewise-linear or 0/1 losses use the exact one-pass path.

    Returns
    -------
    pandas.DataFrame
        Columns ``feature``, ``score``, ``rank``, ``h``, ``share_moving``,
        ``share_reweighting``, ``columns`` (the columns that moved), sorted by score.
    """
    r, theta1, theta2, divergence = check_common(r, theta1, theta2, divergence)
    loss_obj = get_loss(loss)
    prob = resolve_model(model, X, y, loss=loss_obj)
    if isinstance(loss_obj, ZeroOne) and r > 1.0:
        raise ValidationError(f"r is an error rate for loss='zero_one' and must be in [0, 1], "
                              f"got {r}")
    units = _units(prob.feature_names, features, groups)
    linear_exact = prob.scorer is not None and isinstance(
        loss_obj, (PiecewiseLinear, MulticlassHinge, ZeroOne)) and solver != "first_order"
    rows = []
    if not linear_exact:
        rows = _nonlinear_rows(prob, units, r, theta1, theta2, divergence, solver)
    elif isinstance(loss_obj, ZeroOne):
        rows = _zero_one_rows(prob, units, r, theta1, theta2, divergence)
    else:
        red = reduce_problem(prob, theta1, None)
        c1 = red.c1
        base_losses = red.loss_values()
        base = float(np.mean(base_losses))
        shared = oracle_for(c1, red.c2)
        # c2 of every unit first; then solve in order of decreasing c2 so that each solve is
        # warm-started from the previous h (h moves smoothly with c2)
        c2s = []
        for _label, cols in units:
            mask = np.zeros(prob.d, dtype=bool)
            mask[cols] = True
            if red.kind == "multiclass":
                c2s.append(reduce_problem(prob, theta1, mask).c2)
            elif math.isfinite(theta1):
                v = red.v[cols]
                a = prob.loss.a
                c2s.append((a * a * float(v @ v) / (4.0 * theta1))[None, :])
            else:
                c2s.append(np.zeros((1, c1.shape[1])))
        order = sorted(range(len(units)), key=lambda i: -float(np.max(c2s[i])))
        out = {}
        h_prev = None
        for i in order:
            label, cols = units[i]
            c2 = c2s[i]
            if not np.any(c2 > 0):
                out[i] = (label, math.inf, math.nan, math.nan, math.nan, cols)
                continue
            if r <= base:
                out[i] = (label, 0.0, 0.0, 0.0, 0.0, cols)
                continue
            oracle = shared.with_c2(c2)
            sol = solve_dual(oracle, r, theta2, divergence, h_init=h_prev)
            if sol.status != OPTIMAL:
                raise SolverError(f"feature {label!r}: dual solver failed ({sol.native_status})")
            h_prev = sol.h if sol.h > 0 else h_prev
            sm, sr = _shares(_risk_parts(oracle, sol.h, theta2, divergence), base, r)
            out[i] = (label, sol.value, sol.h, sm, sr, cols)
        rows = [out[i] for i in range(len(units))]

    df = pd.DataFrame(rows, columns=["feature", "score", "h", "share_moving",
                                     "share_reweighting", "cols"])
    df["columns"] = [[prob.feature_names[j] for j in c] for c in df.pop("cols")]
    df = df.sort_values("score", kind="stable").reset_index(drop=True)
    df["rank"] = df["score"].rank(method="min").astype(int)
    df = df[COLUMNS]
    df.attrs.update({"r": r, "theta1": theta1, "theta2": theta2, "divergence": divergence,
                     "loss": loss_obj.name})
    return df


def _nonlinear_rows(prob, units, r, theta1, theta2, divergence, solver):
    """One certify per feature (exact 1-D duals for smooth losses of linear models, the
    first-order path otherwise) with the feature mask; no one-pass shortcut applies here."""
    rows = []
    for label, cols in units:
        mask = np.zeros(prob.d, dtype=bool)
        mask[cols] = True
        if prob.scorer is not None and not np.any(prob.scorer.W[:, cols]):
            rows.append((label, math.inf, math.nan, math.nan, math.nan, cols))
            continue
        res = certify_smooth(prob, r=r, theta1=theta1, theta2=theta2,
                             divergence=divergence, mask=mask, solver=solver)
        if not math.isfinite(res.value):
            rows.append((label, math.inf, math.nan, math.nan, math.nan, cols))
            continue
        exc = res.risk_star - res.risk_base
        dec = res.decomposition
        sm = dec["corruption"] / exc if exc > 0 else 0.0
        sr = dec["reweighting"] / exc if exc > 0 else 0.0
        rows.append((label, res.value, res.h, sm, sr, cols))
    return rows


def _zero_one_chi2_row(label, cols, prefix, r, theta2, base):
    """One 0/1 chi2 feature score from the shared sorted distances (O(log n) per evaluation)."""
    sol = solve_dual(prefix, r, theta2, "chi2")
    if sol.status != OPTIMAL:
        return (label, math.inf, math.nan, math.nan, math.nan, cols)
    sm, sr = _shares(prefix.risk_parts(sol.h, theta2, "chi2"), base, r)
    return (label, sol.value, sol.h, sm, sr, cols)


def _zero_one_rows(prob, units, r, theta1, theta2, divergence):
    from .zero_one import linear_distances

    sc = prob.scorer
    loss0 = prob.losses(prob.X)
    base = float(loss0.mean())
    rows = []
    binary = sc.task == "binary"
    shared = None
    if binary:
        m = prob.y * sc.scores(prob.X)
        m2 = np.where(loss0 > 0, 0.0, np.maximum(m, 0.0) ** 2)
        order = np.argsort(m2, kind="stable")
        m2_sorted = m2[order]  # misclassified samples have m2 = 0, hence a = 0
        loss_sorted_all = loss0[order]
        if divergence == "chi2" and math.isfinite(theta2) and math.isfinite(theta1) and r < 1:
            # the chi2 dual on one sorted oracle, rescaled per feature: a_ij = s_j m2_i
            shared = SortedTwoPiece(-m2_sorted, "distance", presorted=True)
    for label, cols in units:
        if r <= base:
            rows.append((label, 0.0, 0.0, 0.0, 0.0, cols))
            continue
        if binary:
            nb = float(np.sum(sc.W[0, cols] ** 2))
            if nb == 0.0:
                rows.append((label, math.inf, math.nan, math.nan, math.nan, cols))
                continue
            if shared is not None:
                rows.append(_zero_one_chi2_row(label, cols, shared.with_scale(theta1 / nb), r,
                                               theta2, base))
                continue
            if math.isfinite(theta1):
                a_sorted = theta1 * m2_sorted / nb
            else:
                a_sorted = np.where(m2_sorted > 0, np.inf, 0.0)
            loss_sorted = loss_sorted_all
        else:
            mask = np.zeros(prob.d, dtype=bool)
            mask[cols] = True
            d, _ = linear_distances(prob, mask)
            if not np.any(np.isfinite(d) & (d > 0)):
                rows.append((label, math.inf, math.nan, math.nan, math.nan, cols))
                continue
            a = theta1 * d if math.isfinite(theta1) else np.where(d > 0, np.inf, 0.0)
            o = np.argsort(a, kind="stable")
            a_sorted, loss_sorted = a[o], loss0[o]
        n_reach = float(np.sum(loss_sorted) + np.sum(np.isfinite(a_sorted) & (loss_sorted == 0)))
        if (math.isinf(theta2) and r * a_sorted.size > n_reach) or (
                r >= 1.0 and not np.all(np.isfinite(a_sorted))):
            rows.append((label, math.inf, math.nan, math.nan, math.nan, cols))
            continue
        sol = solve_zero_one(a_sorted, r, theta2, divergence, presorted=True)
        if sol.status != OPTIMAL:
            rows.append((label, math.inf, math.nan, math.nan, math.nan, cols))
            continue
        n = a_sorted.size
        if "n_moved" in sol.info:
            # KL closed form: Q* in O(1) from the solver's prefix sums. Moved samples (a < h)
            # carry weight mass `moved_weight`; tied ones (a = h, l_h = 0) have weight
            # `unit_weight` each and are moved in the share lam that brings the risk to r
            inf = sol.info
            extra = max(r - inf["moved_weight"], 0.0) * n / inf["unit_weight"]
            moved_frac = (inf["n_moved"] + min(extra, inf["n_tied"])) / n
            excess = r - base
            sm = (moved_frac - base) / excess if excess > 0 else 0.0
            rows.append((label, sol.value, sol.h, sm, 1.0 - sm, cols))
            continue
        if math.isinf(theta2):  # no reweighting: all of the excess risk is from moving
            rows.append((label, sol.value, sol.h, 1.0, 0.0, cols))
            continue
        lh = np.maximum(sol.h - a_sorted, 0.0)
        w = _weights(lh, theta2, divergence)
        tol = 1e-10 * max(1.0, sol.h)
        d_hi = np.where(a_sorted <= sol.h + tol, 1.0, loss_sorted)
        d_lo = np.where(a_sorted < sol.h - tol, 1.0, loss_sorted)
        sm, sr = _shares(_dense_parts(w, d_lo, d_hi), float(np.mean(loss_sorted)), r)
        rows.append((label, sol.value, sol.h, sm, sr, cols))
    return rows
