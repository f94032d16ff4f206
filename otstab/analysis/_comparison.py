"""``compare``: the stability of several models side by side, with resampling intervals.

One tidy table (model x (theta1, theta2) setting) of :func:`otstab.certify` values on the same
evaluation data, with their accuracy, and a picture like the paper's Figure 3 (grouped bars
with intervals). The uncertainty comes from resampling the evaluation set, as the paper does:
``n_resamples`` bootstrap draws of the rows (the same draws for every model and setting, so
differences between models are paired), each certified exactly; ``se`` is the standard deviation
of the resampled values and ``[ci_lower, ci_upper]`` their percentile interval.

(The module is ``otstab.comparison``, not ``otstab.compare``: a submodule of that name would
shadow the function ``otstab.compare`` once imported.)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import pandas as pd
from otstab_solvers.weights import dense

from .._progress import check_progress, progress_bar
from .._results import FrameResult
from .._validation import as_sample_weight, check_random_state, check_scalar
from ..errors import InputTypeError, ValidationError
from ..modeling._nonlinear import label_column
from ..modeling._params import check_common
from ..solve._core import certify

__all__ = ["compare", "plot_compare", "Comparison"]

log = logging.getLogger(__name__)


def _check_settings(settings):
    if not isinstance(settings, (list, tuple)) or not settings:
        raise ValidationError("settings must be a non-empty list of (theta1, theta2) pairs")
    out = []
    for s in settings:
        if not isinstance(s, (list, tuple)) or len(s) != 2:
            raise ValidationError(
                f"settings: each entry must be a (theta1, theta2) pair, got {s!r}")
        _, t1, t2, _ = check_common(0.0, s[0], s[1], "kl")
        out.append((t1, t2))
    return out


def _take(X, idx):
    return X.iloc[idx] if isinstance(X, (pd.DataFrame, pd.Series)) else np.asarray(X)[idx]


def _accuracy(model, X, y) -> float:
    if not hasattr(model, "classes_") or not hasattr(model, "predict"):
        return math.nan
    return float(np.mean(label_column(model.predict(X)) == np.asarray(y)))


def _interval(values: np.ndarray, level: float):
    """(se, lower, upper) of resampled values; inf values (unreachable in a resample) give an
    infinite se and are ordered last (no arithmetic on them)."""
    if values.size == 0:
        return math.nan, math.nan, math.nan
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(values, [a, 1.0 - a], method="inverted_cdf")
    se = float(np.std(values, ddof=1)) if np.all(np.isfinite(values)) and values.size > 1 \
        else (math.inf if values.size > 1 else math.nan)
    return se, float(lo), float(hi)


@dataclass(repr=False)
class Comparison(FrameResult):
    """The answer of :func:`compare`: one row per (model, setting).

    ``table`` (``to_frame()``): ``model``, ``theta1``, ``theta2``, ``value``, ``status``,
    ``se``, ``ci_lower``, ``ci_upper``, ``accuracy``, ``n_resamples``.
    """

    table: pd.DataFrame
    loss: str
    r: float
    level: float
    divergence: str
    n_resamples: int

    _function = "otstab.compare"

    def summary(self) -> str:
        head = (f"Model comparison ({self.loss} loss, r={self.r:g}, {self.divergence}): "
                f"{self.table['model'].nunique()} models, {self.n_resamples} resamples, "
                f"{100 * self.level:g}% percentile intervals")
        cols = ["model", "theta1", "theta2", "value", "status", "ci_lower", "ci_upper",
                "accuracy"]
        return head + "\n" + self.table[cols].head(40).to_string(index=False)

    def _headline(self):
        names = list(dict.fromkeys(self.table["model"]))
        return [("models", names) if len(names) <= 4 else ("n_models", len(names)),
                ("n_settings", len(self.table) // max(len(names), 1)),
                *[(k, getattr(self, k)) for k in ("loss", "r", "level", "divergence",
                                                    "n_resamples")]]


def compare(models: dict, X, y, *, loss, r, settings=((1.0, 0.25),), divergence: str = "kl",
            n_resamples: int = 200, level: float = 0.95, random_state=0, solver: str = "auto",
            features=None, feature_costs=None, sample_weight=None, cost=None, progress=None,
            **solver_options) -> Comparison:
    """Certify several models on the same data under several (theta1, theta2) settings.

    Parameters
    ----------
    models : dict {name: fitted model}
    X, y, loss, r, divergence, solver, features, feature_costs, sample_weight, cost :
        As in :func:`otstab.certify` (``features``: only these may move, e.g. one feature's
        stability score). With ``sample_weight`` the resampled rows keep their weights.
        Under a ``DataCost`` the bootstrap draws keep the cost resolved on the full data
        (each model's ``res.info["cost"]``: scales and levels are not re-estimated per draw).
    settings : list of (theta1, theta2) pairs
    n_resamples : int >= 0
        Bootstrap draws of the evaluation rows for ``se`` and the interval (0: none).
    level : float in (0, 1)
        Coverage of the percentile interval.
    random_state : None, int, numpy Generator or RandomState, default 0
        The bootstrap's random numbers (one set of draws shared by every model and setting).
    progress : None, True or False
        A progress bar on stderr over the certificates (None: only when stderr is a
        terminal).
    **solver_options
        Passed to every ``certify`` call (e.g. the tree ensemble bound's ``max_nodes``,
        ``time_budget``, ``node_budget``: per certificate, replicates included).

    Returns
    -------
    Comparison
        ``to_frame()``: one row per (model, setting): ``model``, ``theta1``, ``theta2``,
        ``value`` (R on the full data, exactly ``certify``'s), ``status``, ``se``,
        ``ci_lower``, ``ci_upper``, ``accuracy`` (of ``model.predict`` for classifiers, else
        NaN), ``n_resamples``.
    """
    if not isinstance(models, dict) or not models:
        raise InputTypeError("models must be a non-empty dict {name: fitted model}")
    settings = _check_settings(settings)
    if isinstance(n_resamples, (bool, np.bool_)) or not isinstance(n_resamples, Integral) \
            or n_resamples < 0:
        raise ValidationError(f"n_resamples must be an integer >= 0, got {n_resamples!r}")
    level = check_scalar(level, "level", low=0.0, high=1.0, low_inclusive=False,
                         high_inclusive=False)
    show = check_progress(progress)
    rng = check_random_state(random_state)
    n = len(y)
    # the weights are checked here (before any certify); each certify normalises them again
    p = None if sample_weight is None else dense(as_sample_weight(sample_weight, n))
    draws = [rng.integers(0, n, size=n) for _ in range(n_resamples)]
    rows = []
    total = len(models) * len(settings) * (1 + len(draws))
    log.info("compare: %d models x %d settings x (1 + %d resamples) = %d certificates",
             len(models), len(settings), len(draws), total)
    with progress_bar(total, "compare", show) as bar:
        for name, model in models.items():
            acc = _accuracy(model, X, y)
            for t1, t2 in settings:
                kw = dict(loss=loss, r=r, theta1=t1, theta2=t2, divergence=divergence,
                          solver=solver, features=features, feature_costs=feature_costs,
                          se=None, cost=cost, **solver_options)
                res = certify(model, X, y, sample_weight=sample_weight, **kw)
                if isinstance(res.info, dict) and res.info.get("cost") is not None:
                    kw["cost"] = res.info["cost"]  # the resolved spec, for every draw
                bar.update()
                boot = []
                for i in draws:
                    boot.append(certify(model, _take(X, i), _take(y, i),
                                        sample_weight=None if p is None else p[i], **kw).value)
                    bar.update()
                se, lo, hi = _interval(np.array(boot), level)
                rows.append({"model": str(name), "theta1": t1, "theta2": t2,
                             "value": res.value, "status": res.status, "se": se,
                             "ci_lower": lo, "ci_upper": hi, "accuracy": acc,
                             "n_resamples": int(n_resamples)})
    return Comparison(pd.DataFrame(rows), loss=str(getattr(loss, "name", loss)), r=r,
                      level=level, divergence=divergence, n_resamples=int(n_resamples))


def _theta(t) -> str:
    return "inf" if math.isinf(t) else f"{t:.3g}"


def plot_compare(table: pd.DataFrame, *, ax=None, title=None):
    """Grouped bars of ``value`` per (theta1, theta2) setting and model, with the resampling
    intervals as error bars (the paper's Figure 3 layout). ``table``: the result of
    :func:`compare` (or its ``to_frame()``). Needs matplotlib."""
    need = {"model", "theta1", "theta2", "value", "ci_lower", "ci_upper"}
    if isinstance(table, Comparison):
        table = table.table
    if not isinstance(table, pd.DataFrame) or not need <= set(table.columns):
        raise InputTypeError(
            f"table must be the DataFrame of otstab.compare (columns {sorted(need)})")
    import matplotlib.pyplot as plt  # optional dependency (the plot extra)

    if ax is None:
        _, ax = plt.subplots(figsize=(7.0, 4.2))
    keys = list(dict.fromkeys(zip(table["theta1"], table["theta2"])))
    names = list(dict.fromkeys(table["model"]))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        sub = table[table["model"] == name].set_index(["theta1", "theta2"]).loc[keys]
        v = sub["value"].to_numpy(float)
        lo, hi = sub["ci_lower"].to_numpy(float), sub["ci_upper"].to_numpy(float)
        err = None
        if np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)):
            err = np.vstack([np.maximum(v - lo, 0.0), np.maximum(hi - v, 0.0)])
        ax.bar(np.arange(len(keys)) + (k - (len(names) - 1) / 2) * width, v, width, yerr=err,
               capsize=3, label=name)
    ax.set_xticks(np.arange(len(keys)))
    ax.set_xticklabels([f"({_theta(a)}, {_theta(b)})" for a, b in keys])
    ax.set_xlabel("(theta1, theta2)")
    ax.set_ylabel("stability R(beta, r)")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax
