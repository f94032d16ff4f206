"""Plots of stability certificates (needs matplotlib: ``pip install otstab[plot]``).

Every plotting function accepts ``ax=`` (a matplotlib Axes to draw on; a new figure is made
with :func:`matplotlib.pyplot.subplots` when omitted) and returns the Axes it drew on.
matplotlib is imported inside the functions, so ``import otstab.plot`` works without it; the
computing helpers (:func:`decomposition_grid`, :func:`value_curve`) do not need it at all.

- :func:`sensitive_distribution`: the most sensitive distribution Q* (paper, Figure 2):
  original points, moved points sized by their weight, arrows from ``x`` to ``x*``;
- :func:`feature_stability`: feature-stability scores as bars (paper, Figure 4);
- :func:`decomposition`: excess risk split into corruption (moving samples) and reweighting
  over a theta grid with ``1/theta1 + 1/theta2`` fixed (paper, Figure 3a);
- :func:`stability_curve`: ``R(beta, r)`` against ``r``;
- :func:`convergence_trace`: the first-order solver's trace (paper, Figures 3b and 8).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..analysis._sweeps import stability_curve as _sc
from ..errors import InputTypeError, ValidationError
from ..shift._conditional_shift import ConditionalShiftResult
from ..shift._inputs import _pct
from ..shift._worst_subpopulation import WorstCaseResult
from ..solve._core import certify
from ..solve._results import StabilityResult

__all__ = [
    "plot_worst_case",
    "plot_conditional_shift",
    "sensitive_distribution",
    "feature_stability",
    "decomposition",
    "decomposition_grid",
    "stability_curve",
    "value_curve",
    "convergence_trace",
    "projection",
]

#: colours: moving samples (data corruption) and reweighting (sub-population shift)
MOVE_COLOR = "#d95f02"
REWEIGHT_COLOR = "#1b9e77"
BASE_COLOR = "#7f7f7f"
ARROW_COLOR = "#444444"
#: colours of the classes when Q* is drawn with labels (matplotlib's tab10, minus orange)
CLASS_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                "#bcbd22", "#7f7f7f", "#ff7f0e")


def _require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without matplotlib
        raise ImportError(
            "otstab.plot needs matplotlib; install it with: pip install otstab[plot]"
        ) from exc


def _axes(ax, figsize=(6.0, 4.5)):
    _require_matplotlib()
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax


def _check_result(result):
    if not isinstance(result, StabilityResult):
        raise InputTypeError(
            f"result must be an otstab.StabilityResult, got {type(result).__name__}")
    if result.X is None or result.X_star is None:
        raise ValidationError("result carries no data (X, X_star); it cannot be drawn")


# ----------------------------------------------------------------------------------------------
# most sensitive distribution


def projection(result, coords="auto"):
    """The 2-D view used by :func:`sensitive_distribution`.

    Parameters
    ----------
    result : StabilityResult
    coords : "auto", "moved", "pca" or a pair of feature indices / names
        ``"auto"``: the data themselves when they are 2-D, else ``"moved"``. ``"moved"``: the
        two coordinates along which Q* moves the most mass (sum over atoms of
        ``mass * weight * (x*_j - x_j)^2``), falling back to ``"pca"`` when nothing moves.
        ``"pca"``: the first two principal components of the evaluation data.

    Returns
    -------
    P, P_star : arrays of shape (n, 2) and (n_atoms, 2)
        Projected evaluation points and atoms.
    labels : tuple of str
        Axis labels.
    """
    _check_result(result)
    X = np.asarray(result.X, dtype=float)
    Xs = np.asarray(result.X_star, dtype=float)
    d = X.shape[1]
    names = list(result.feature_names) or [f"x{j}" for j in range(d)]
    if d == 1:
        return (np.column_stack([X[:, 0], np.zeros(len(X))]),
                np.column_stack([Xs[:, 0], np.zeros(len(Xs))]), (names[0], ""))
    if isinstance(coords, str):
        mode = coords.lower()
        if mode not in ("auto", "moved", "pca"):
            raise ValidationError(
                f"coords must be 'auto', 'moved', 'pca' or two features, got {coords!r}")
        if mode == "auto":
            mode = "moved" if d > 2 else "pair"
        if mode == "moved":
            src = np.asarray(result.source)
            w = np.asarray(result.weights) * np.asarray(result.mass)
            moved = (w[:, None] * (Xs - X[src]) ** 2).sum(axis=0)
            if np.all(moved <= 0):
                mode = "pca"
            else:
                order = np.argsort(-moved, kind="stable")[:2]
                pair = tuple(sorted(order.tolist()))
        if mode == "pair":
            pair = (0, 1)
        if mode == "pca":
            mu = X.mean(axis=0)
            _, _, vt = np.linalg.svd(X - mu, full_matrices=False)
            V = vt[:2].T
            return (X - mu) @ V, (Xs - mu) @ V, ("PC1", "PC2")
    else:
        pair = tuple(coords)
        if len(pair) != 2:
            raise ValidationError(f"coords must name two features, got {coords!r}")
        idx = []
        for c in pair:
            if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
                if not -d <= c < d:
                    raise ValidationError(f"coords: index {c} out of range for {d} features")
                idx.append(int(c) % d)
            elif str(c) in names:
                idx.append(names.index(str(c)))
            else:
                raise ValidationError(f"coords: unknown feature {c!r}")
        pair = tuple(idx)
    j, k = pair
    return X[:, [j, k]], Xs[:, [j, k]], (names[j], names[k])


def sensitive_distribution(result, *, ax=None, coords="auto", y=None, max_arrows=300,
                           size=30.0, show_original=True, legend=True, title=None):
    """Draw the most sensitive distribution Q*: moved points sized by weight, arrows x -> x*.

    Parameters
    ----------
    result : StabilityResult
    ax : matplotlib Axes, optional
    coords : see :func:`projection`
    y : array-like of shape (n,), optional
        Labels of the evaluation samples; atoms are coloured by their sample's label
        (:data:`CLASS_COLORS`). Default: coloured by their loss under Q* (with a colour bar).
    max_arrows : int
        At most this many arrows (those of the atoms with the largest weighted moves).
    size : float
        Marker area of an atom of weight 1 (area is proportional to ``mass * weight``).
    show_original : bool
        Draw the evaluation points (grey crosses) under Q*.
    legend, title : optional decorations.

    Returns
    -------
    matplotlib Axes
    """
    P, Ps, (lx, ly) = projection(result, coords)
    ax = _axes(ax)
    src = np.asarray(result.source)
    w = np.asarray(result.weights, dtype=float) * np.asarray(result.mass, dtype=float)
    if show_original:
        ax.scatter(P[:, 0], P[:, 1], s=8, marker="x", color=BASE_COLOR, alpha=0.4,
                   linewidths=0.7, label="evaluation data P0")
    if y is not None:
        yy = np.asarray(y).reshape(-1)
        if yy.shape[0] != P.shape[0]:
            raise ValidationError(f"y has {yy.shape[0]} entries but the data have {P.shape[0]}")
        classes, codes = np.unique(yy, return_inverse=True)
        palette = np.array(CLASS_COLORS, dtype=object)
        sc = ax.scatter(Ps[:, 0], Ps[:, 1], s=size * w,
                        c=list(palette[codes[src] % len(palette)]), alpha=0.75,
                        edgecolors="k", linewidths=0.3, label="Q* (size = weight)")
        if legend:
            for k, c in enumerate(classes):
                ax.scatter([], [], color=palette[k % len(palette)], s=size, label=f"y = {c}")
    else:
        loss_star = result.loss_star
        colors = np.asarray(loss_star, dtype=float) if loss_star is not None else None
        sc = ax.scatter(Ps[:, 0], Ps[:, 1], s=size * w, c=colors, cmap="viridis", alpha=0.75,
                        edgecolors="k", linewidths=0.3, label="Q* (size = weight)")
        if colors is not None:
            cb = ax.figure.colorbar(sc, ax=ax, fraction=0.046, pad=0.02)
            cb.set_label("loss under Q*")
    dist = np.sqrt(np.sum((Ps - P[src]) ** 2, axis=1))
    scale = max(float(np.ptp(P[:, 0])), float(np.ptp(P[:, 1])), 1e-12)
    moving = np.flatnonzero(dist > 1e-9 * scale)
    if moving.size and max_arrows > 0:
        keep = moving[np.argsort(-(w[moving] * dist[moving]), kind="stable")[:max_arrows]]
        start = P[src[keep]]
        delta = Ps[keep] - start
        ax.quiver(start[:, 0], start[:, 1], delta[:, 0], delta[:, 1], angles="xy",
                  scale_units="xy", scale=1.0, width=0.003, color=ARROW_COLOR, alpha=0.6)
    ax.set_xlabel(lx)
    ax.set_ylabel(ly)
    if title is None:
        title = (f"Most sensitive distribution Q* (r = {result.r:g}, theta1 = "
                 f"{result.theta1:g}, theta2 = {result.theta2:g})")
    if title:
        ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(loc="best", fontsize=8, framealpha=0.8)
    return ax


# ----------------------------------------------------------------------------------------------
# feature stability (Figure 4)


def feature_stability(table, *, ax=None, top=15, annotate=True, title=None):
    """Bar chart of feature-stability scores (lower = more sensitive), most sensitive on top.

    Parameters
    ----------
    table : FeatureStability or DataFrame
        The result of :func:`otstab.feature_stability` (or a frame with columns ``feature``
        and ``score``).
    ax : matplotlib Axes, optional
    top : int
        Show the ``top`` most sensitive features.
    annotate : bool
        Write the score at the end of each bar.

    Returns
    -------
    matplotlib Axes
    """
    if isinstance(table, dict):
        table = pd.DataFrame(table)
    if hasattr(table, "to_frame") and not isinstance(table, pd.DataFrame):
        table = table.to_frame()  # otstab.feature_stability's FeatureStability
    if not isinstance(table, pd.DataFrame) or not {"feature", "score"} <= set(table.columns):
        raise ValidationError("table must be a DataFrame with columns 'feature' and 'score' "
                              "(the output of otstab.feature_stability)")
    t = table.copy()
    t["score"] = pd.to_numeric(t["score"], errors="coerce").astype(float)
    t = t.sort_values("score", kind="stable").head(int(top))
    ax = _axes(ax, figsize=(6.5, max(2.5, 0.35 * len(t) + 1.2)))
    pos = np.arange(len(t))[::-1]
    finite = np.isfinite(t["score"].to_numpy())
    scores = np.where(finite, t["score"].to_numpy(), 0.0)
    ax.barh(pos, scores, color=MOVE_COLOR)
    ax.set_yticks(pos)
    ax.set_yticklabels([str(f) for f in t["feature"]], fontsize=8)
    xmax = float(scores.max()) if scores.size else 1.0
    if annotate:
        for p, s, ok in zip(pos, t["score"].to_numpy(), finite):
            ax.text((s if ok else 0.0) + 0.01 * max(xmax, 1e-12), p, f"{s:.3g}" if ok else "inf",
                    va="center", fontsize=7)
    ax.set_xlim(0, max(xmax, 1e-12) * 1.15)
    ax.set_xlabel("stability score R_j (lower = more sensitive)")
    ax.set_title(title or "Feature stability", fontsize=10)
    return ax


# ----------------------------------------------------------------------------------------------
# corruption vs reweighting over theta (Figure 3a)


def decomposition_grid(model, X, y, *, loss, r, total=5.0, splits=None, divergence="kl",
                       solver="auto", cost=None) -> pd.DataFrame:
    """Certify over a theta grid with ``1/theta1 + 1/theta2 = total`` fixed.

    The split ``s = (1/theta1) / total`` runs over ``splits`` (default 11 points from 0 to
    1): ``s = 0`` is ``theta1 = inf`` (only reweighting), ``s = 1`` is ``theta2 = inf`` (only
    moving samples), and in between ``theta1 = 1 / (s total)``, ``theta2 = 1 / ((1 - s)
    total)``. The paper ties the thetas this way with ``total = 5`` (its Section 4.1).

    Parameters
    ----------
    model, X, y, loss, r, divergence, solver : as for :func:`otstab.certify`
    total : float > 0
    splits : sequence of floats in [0, 1], optional

    Returns
    -------
    DataFrame
        Columns ``split``, ``theta1``, ``theta2``, ``value``, ``risk_base``, ``corruption``,
        ``reweighting``, ``risk_star``, ``status``; one row per split.
    """
    if not (isinstance(total, (int, float, np.floating)) and math.isfinite(total)
            and total > 0):
        raise ValidationError(f"total must be a finite number > 0, got {total!r}")
    splits = np.linspace(0.0, 1.0, 11) if splits is None else np.asarray(splits, dtype=float)
    if splits.ndim != 1 or splits.size == 0 or np.any((splits < 0) | (splits > 1)):
        raise ValidationError("splits must be a non-empty 1-D sequence of numbers in [0, 1]")
    rows = []
    for s in splits.tolist():
        theta1 = math.inf if s == 0 else 1.0 / (s * total)
        theta2 = math.inf if s == 1 else 1.0 / ((1.0 - s) * total)
        res = certify(model, X, y, loss=loss, r=r, theta1=theta1, theta2=theta2,
                      divergence=divergence, solver=solver, cost=cost)
        dec = res.decomposition
        rows.append({"split": s, "theta1": theta1, "theta2": theta2, "value": res.value,
                     "risk_base": res.risk_base, "corruption": dec.get("corruption", 0.0),
                     "reweighting": dec.get("reweighting", 0.0), "risk_star": res.risk_star,
                     "status": res.status})
    return pd.DataFrame(rows)


def _theta_txt(t) -> str:
    t = float(t)
    return "inf" if math.isinf(t) else f"{t:.3g}"


def decomposition(grid, *, ax=None, show_value=True, title=None):
    """Stacked excess risk (corruption + reweighting) over the split of the theta budget.

    One bar per row of ``grid`` (ordered by ``split``: reweighting-heavy settings on the
    left, moving-heavy ones on the right), labelled with its ``theta1`` and ``theta2``.

    Parameters
    ----------
    grid : DataFrame
        The output of :func:`decomposition_grid`.
    ax : matplotlib Axes, optional
    show_value : bool
        Also draw ``R(beta, r)`` (right axis).

    Returns
    -------
    matplotlib Axes
    """
    g = pd.DataFrame(grid)
    need = {"split", "corruption", "reweighting"}
    if not need <= set(g.columns):
        raise ValidationError(f"grid must have columns {sorted(need)} (see decomposition_grid)")
    g = g.sort_values("split")
    ax = _axes(ax, figsize=(7.0, 4.5))
    x = np.arange(len(g))  # one bar per setting, evenly spaced (the splits need not be)
    c = g["corruption"].to_numpy(float)
    rw = g["reweighting"].to_numpy(float)
    ax.bar(x, c, width=0.7, color=MOVE_COLOR, label="I: corruption (moving samples)")
    ax.bar(x, rw, width=0.7, bottom=c, color=REWEIGHT_COLOR,
           label="II: reweighting (sub-population shift)")
    ax.set_xticks(x)
    if {"theta1", "theta2"} <= set(g.columns):
        ticks = [f"{_theta_txt(a)}\n{_theta_txt(b)}" for a, b in zip(g["theta1"], g["theta2"])]
        ax.set_xticklabels(ticks, fontsize=7)
        ax.set_xlabel("theta1 (top) / theta2 (bottom): more reweighting <-> more moving")
    else:
        ax.set_xticklabels([f"{v:.3g}" for v in g["split"]], fontsize=8)
        ax.set_xlabel("share of moving in the budget, (1/theta1) / (1/theta1 + 1/theta2)")
    ax.set_ylabel("excess risk under Q*")
    handles, labels = ax.get_legend_handles_labels()
    if show_value and "value" in g.columns:
        ax2 = ax.twinx()
        v = pd.to_numeric(g["value"], errors="coerce").to_numpy(float)
        ok = np.isfinite(v)
        ax2.plot(x[ok], v[ok], "k.-", label="R(beta, r) (right axis)")
        ax2.set_ylabel("R(beta, r)")
        ax2.set_ylim(bottom=0)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    top = float(np.nanmax(c + rw)) if c.size else 1.0
    ax.set_ylim(0, 1.3 * top if top > 0 else 1.0)
    ax.legend(handles, labels, loc="upper center", ncol=2, fontsize=7, framealpha=0.9)
    ax.set_title(title or "Excess-risk decomposition", fontsize=10)
    return ax


# ----------------------------------------------------------------------------------------------
# value against r


def value_curve(model, X, y, *, loss, r, theta1=1.0, theta2=0.25, divergence="kl",
                solver="auto", cost=None) -> pd.DataFrame:
    """``R(beta, r)`` over a grid of thresholds: :func:`otstab.stability_curve` (columns
    ``r``, ``value``, ``h``, ``status``, ...; ``cost`` as in :func:`otstab.certify`)."""
    grid = np.asarray(r, dtype=float).reshape(-1)
    if grid.size == 0:
        raise ValidationError("r must be a non-empty sequence of thresholds")
    return _sc(model, X, y, r=grid, loss=loss, theta1=theta1, theta2=theta2,
               divergence=divergence, solver=solver, cost=cost).to_frame()


def _curve_frame(curve) -> pd.DataFrame:
    if hasattr(curve, "to_frame") and not isinstance(curve, (pd.DataFrame, StabilityResult)):
        return curve.to_frame()  # otstab.stability_curve's StabilityCurve
    if isinstance(curve, pd.DataFrame):
        return curve
    if isinstance(curve, dict):
        return pd.DataFrame(curve)
    items = list(curve)
    if items and isinstance(items[0], StabilityResult):
        return pd.DataFrame([{"r": c.r, "value": c.value, "risk_base": c.risk_base}
                             for c in items])
    return pd.DataFrame(items)


def stability_curve(curve, *, ax=None, label=None, highlight=None, title=None):
    """Plot ``R(beta, r)`` against the threshold ``r``.

    Parameters
    ----------
    curve : StabilityCurve, DataFrame, dict, list of dicts or list of StabilityResult
        Columns ``r`` and ``value`` (the result of :func:`otstab.stability_curve` or
        :func:`value_curve`; with columns ``ci_low`` and ``ci_high``, from
        ``stability_curve(..., level=)``, the interval is drawn as a band); the base
        risk (``curve.attrs["risk_base"]`` or a ``risk_base`` column), when present, is marked
        by a dotted line.
    ax : matplotlib Axes, optional
    label : str, optional
        Legend label of the curve (to overlay several models on one Axes).
    highlight : float, optional
        A threshold to mark with a dashed line (e.g. the certified ``r``).

    Returns
    -------
    matplotlib Axes
    """
    c = _curve_frame(curve)
    if not {"r", "value"} <= set(c.columns):
        raise ValidationError("curve must have columns 'r' and 'value'")
    c = c.sort_values("r")
    ax = _axes(ax)
    rr = c["r"].to_numpy(float)
    v = pd.to_numeric(c["value"], errors="coerce").to_numpy(float)
    ok = np.isfinite(v)
    line = ax.plot(rr[ok], v[ok], ".-", label=label)[0]
    if {"ci_low", "ci_high"} <= set(c.columns):  # sampling band (stability_curve(level=))
        lo = pd.to_numeric(c["ci_low"], errors="coerce").to_numpy(float)
        hi = pd.to_numeric(c["ci_high"], errors="coerce").to_numpy(float)
        band = ok & np.isfinite(lo) & np.isfinite(hi)
        level = c.attrs.get("level", c.attrs.get("confidence"))
        ax.fill_between(rr[band], lo[band], hi[band], color=line.get_color(), alpha=0.2,
                        label=f"{100 * level:g}% interval" if level else "interval")
    if (~ok).any():
        ax.plot(rr[~ok], np.full((~ok).sum(), np.nanmax(v[ok]) if ok.any() else 0.0), "rx",
                label="unreachable")
    base = c.attrs.get("risk_base")
    if base is None and "risk_base" in c.columns:
        col = pd.to_numeric(c["risk_base"], errors="coerce").dropna()
        base = float(col.iloc[0]) if len(col) else None
    if base is not None:
        ax.axvline(float(base), color=BASE_COLOR, ls=":", lw=1, label="base risk")
    if highlight is not None:
        ax.axvline(float(highlight), color="k", ls="--", lw=1,
                   label=f"r = {float(highlight):g}")
    ax.set_xlabel("risk threshold r")
    ax.set_ylabel("R(beta, r)  (higher = more stable)")
    ax.set_title(title or "Stability against the risk threshold", fontsize=10)
    if label is not None or (~ok).any() or base is not None or highlight is not None \
            or "ci_low" in c.columns:
        ax.legend(loc="upper left", fontsize=8)
    return ax


# ----------------------------------------------------------------------------------------------
# first-order convergence trace


def _trace_frame(trace) -> pd.DataFrame:
    if isinstance(trace, StabilityResult):
        tr = (trace.info or {}).get("trace")
        if tr is None:
            raise ValidationError(
                "this result has no convergence trace (only the first-order solver records "
                "one: certify(..., solver='first_order'))")
        trace = tr
    if isinstance(trace, pd.DataFrame):
        t = trace.copy()
    elif isinstance(trace, dict):
        t = pd.DataFrame({k: v for k, v in trace.items() if np.ndim(v) == 1})
    else:
        t = pd.DataFrame(list(trace))
    if "iteration" not in t.columns:
        t.insert(0, "iteration", np.arange(len(t)))
    if not {"risk", "value"} & set(t.columns):
        raise ValidationError("trace must have a 'risk' or 'value' column")
    return t


def convergence_trace(trace, *, ax=None, r=None, show_h=False, title=None):
    """The first-order solver's trace: risk under Q(t) (left axis, with ``r``) and the value.

    Parameters
    ----------
    trace : StabilityResult, DataFrame, dict of lists or list of dicts
        Columns ``iteration`` (default: 0, 1, ...), ``risk``, ``value`` and optionally ``h``.
    ax : matplotlib Axes, optional
    r : float, optional
        The threshold, drawn as a dashed line (taken from the result when one is given).
    show_h : bool
        Also draw ``h`` (dotted, right axis).

    Returns
    -------
    matplotlib Axes
        The left axes; the right one is ``ax.figure.axes[-1]``.
    """
    if r is None and isinstance(trace, StabilityResult):
        r = trace.r
    t = _trace_frame(trace)
    ax = _axes(ax)
    it = t["iteration"].to_numpy(float)
    if "risk" in t.columns:
        ax.plot(it, t["risk"].to_numpy(float), "o-", ms=3, color=MOVE_COLOR,
                label="risk E_Q(t)[W l]")
    if r is not None:
        ax.axhline(float(r), color="k", ls="--", lw=1, label=f"r = {float(r):g}")
    ax.set_xlabel("outer iteration")
    ax.set_ylabel("risk")
    handles, labels = ax.get_legend_handles_labels()
    if "value" in t.columns or (show_h and "h" in t.columns):
        ax2 = ax.twinx()
        if "value" in t.columns:
            ax2.plot(it, t["value"].to_numpy(float), "s-", ms=3, color=REWEIGHT_COLOR,
                     label="dual value (right)")
        if show_h and "h" in t.columns:
            ax2.plot(it, t["h"].to_numpy(float), ":", color="k", label="h (right)")
        ax2.set_ylabel("value" + (" / h" if show_h else ""))
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
        ax2.legend(handles, labels, loc="lower right", fontsize=7, framealpha=0.9)
    else:
        ax.legend(handles, labels, loc="lower right", fontsize=7, framealpha=0.9)
    ax.set_title(title or "First-order solver: convergence", fontsize=10)
    return ax


# ------------------------------------------------------------------------------------------
# worst-case subpopulation and conditional shift (otstab.shift)


def _plot_band(ax, df, col: str, band_cols: tuple[str, str], other_col: str, *, band: str,
               curve: str, point: str, other: str):
    """``df[col]`` against ``df["p"]`` with its band ``df[band_cols]`` (NaN: not drawn) and
    ``df[other_col]`` for comparison; a single p is drawn as a point with error bars."""
    # float arrays: a column holding None is of object dtype, which matplotlib < 3.8 refuses
    p, v = df["p"].to_numpy(float), df[col].to_numpy(float)
    lo, hi = df[band_cols[0]].to_numpy(float), df[band_cols[1]].to_numpy(float)
    if len(df) > 1:
        ax.fill_between(p, lo, hi, alpha=0.2, label=band)
        ax.plot(p, v, label=curve)
        ax.plot(p, df[other_col].to_numpy(float), "--", label=other)
    else:
        ax.errorbar(p, v, yerr=[v - lo, hi - v], fmt="o", capsize=3, label=point)
        ax.plot(p, df[other_col], "x", label=other)


def plot_worst_case(result: WorstCaseResult, ax=None):
    """Plot the estimated ``W_p`` against ``p`` with the dimension-free band (not drawn where
    it is vacuous), the raw-loss CVaR and, when a threshold was given, the threshold, the
    estimated ``p_star`` and, when certified, the guaranteed ``p_star_upper``. Returns the
    matplotlib Axes."""
    import matplotlib.pyplot as plt

    if not isinstance(result, WorstCaseResult):
        raise InputTypeError(f"result must be a WorstCaseResult, got {type(result).__name__}")
    if ax is None:
        _, ax = plt.subplots()
    kind = "guaranteed" if result.loss_bound_source == "given" else "plug-in"
    band = f"{_pct(result.level)} {kind} band (dimension-free)"
    if result.vacuous_note:
        band += ", vacuous where not drawn"
    _plot_band(ax, result.to_frame(), "W_p", ("lower", "upper"), "raw_cvar", band=band,
               curve="W_p estimate (worst-case subpopulation)", point="W_p estimate",
               other="CVaR_p of raw losses")
    if result.threshold is not None:
        ax.axhline(result.threshold, color="grey", lw=0.8, ls=":", label="threshold")
        if result.estimate == "estimated":
            ax.axvline(result.p_star, color="C3", lw=0.8, ls="--",
                       label=f"estimated p* = {result.p_star:.3g} (not a guarantee)")
        if result.certificate == "certified":
            ax.axvline(result.p_star_upper, color="C2", lw=1.2,
                       label=f"certified p >= {result.p_star_upper:.3g} "
                             f"({_pct(result.level)})")
    ax.set_xlabel("subpopulation fraction p")
    ax.set_ylabel("worst-case risk")
    ax.legend()
    return ax


def plot_conditional_shift(result: ConditionalShiftResult, ax=None):
    """Plot ``R_p`` against ``p`` with its confidence band and the joint-shift value.
    Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if not isinstance(result, ConditionalShiftResult):
        raise InputTypeError(f"result must be a ConditionalShiftResult, "
                             f"got {type(result).__name__}")
    if ax is None:
        _, ax = plt.subplots()
    ci = f"{_pct(result.level)} asymptotic CI (not a guarantee)"
    _plot_band(ax, result.to_frame(), "R_p", ("ci_lower", "ci_upper"), "joint", band=ci,
               curve="R_p estimate (conditional shift)", point=f"R_p estimate, {ci}",
               other="joint shift of (W, Z), estimate")
    ax.set_xlabel("subpopulation fraction p")
    ax.set_ylabel("worst-case risk")
    ax.legend()
    return ax
