"""Regenerate the figures under docs/figures/ and print the numbers quoted in the docs.

Usage::

    python docs/make_figures.py            # all figures (about a minute)
    python docs/make_figures.py --quick    # skip the first-order traces on Adult

Everything is seeded (``make_toy(100, random_state=0)``, ``train_eval_split(..., random_state=0)``)
so the numbers printed here are the ones in docs/reproduction.md, docs/guide.md and
docs/adult.md.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402

import otstab  # noqa: E402
from otstab import datasets, plot  # noqa: E402

FIG = Path(__file__).resolve().parent / "figures"
INF = math.inf
# the paper's theta pairs of Figure 3(a): 1/theta1 + 1/theta2 = 5
PAPER_PAIRS = [(0.25, 1.0), (0.5, 1 / 3), (1.0, 0.25), (5.0, 1 / (5 - 1 / 5)),
               (50.0, 1 / (5 - 1 / 50))]


def fmt_theta(t):
    return "inf" if math.isinf(t) else f"{t:.3g}"


def boundary(ax, model, X):
    """Decision boundary w.x + b = 0 of a 2-D linear classifier."""
    w, b = model.coef_[0], model.intercept_[0]
    xs = np.linspace(X[:, 0].min() - 1, X[:, 0].max() + 1, 50)
    ax.plot(xs, -(w[0] * xs + b) / w[1], "k-", lw=1)
    ax.set_xlim(X[:, 0].min() - 1.5, X[:, 0].max() + 1.5)
    ax.set_ylim(X[:, 1].min() - 1.5, X[:, 1].max() + 1.5)


def md_table(df: pd.DataFrame, floatfmt="{:.4g}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rec in df.to_dict(orient="records"):
        cells = []
        for c in cols:
            v = rec[c]
            if isinstance(v, float):
                cells.append("inf" if math.isinf(v) else floatfmt.format(v))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def toy_panels(model, X, y, loss, r, settings, fname, title):
    fig, axes = plt.subplots(1, len(settings) + 1, figsize=(4.2 * (len(settings) + 1), 4.2))
    axes[0].scatter(X[:, 0], X[:, 1], c=[plot.CLASS_COLORS[k] for k in y], s=15,
                    edgecolors="k", linewidths=0.3)
    boundary(axes[0], model, X)
    axes[0].set_title("(a) original data", fontsize=10)
    rows = []
    for k, (t1, t2) in enumerate(settings, start=1):
        res = otstab.certify(model, X, y, loss=loss, r=r, theta1=t1, theta2=t2)
        plot.sensitive_distribution(res, ax=axes[k], y=y, coords=(0, 1), legend=k == 1,
                                    title=f"({chr(97 + k)}) theta1 = {fmt_theta(t1)}, "
                                          f"theta2 = {fmt_theta(t2)}")
        boundary(axes[k], model, X)
        rows.append({"theta1": fmt_theta(t1), "theta2": fmt_theta(t2), "R": res.value,
                     "base": res.risk_base, "risk under Q*": res.risk_star,
                     "I corruption": res.decomposition["corruption"],
                     "II reweighting": res.decomposition["reweighting"],
                     "max weight": float(np.max(res.weights)), "gap": res.gap,
                     "solver": res.solver})
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(FIG / fname, dpi=110)
    plt.close(fig)
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="skip the first-order traces")
    args = ap.parse_args()
    FIG.mkdir(exist_ok=True)
    t0 = time.perf_counter()

    # ------------------------------------------------------------------ toy (Section 3)
    X, y = datasets.make_toy(100, random_state=0)
    toy = LogisticRegression().fit(X, y)
    base_ce = otstab.certify(toy, X, y, loss="logistic", r=0.0).risk_base
    base_01 = otstab.certify(toy, X, y, loss="zero_one", r=0.0).risk_base
    print(f"toy: logistic regression, cross-entropy on the data {base_ce:.4f}, "
          f"error rate {base_01:.4f}")

    print("\n## Figure 2 (cross-entropy, r = 0.5, 1/theta1 + 1/theta2 = 5)")
    t2 = toy_panels(toy, X, y, "logistic", 0.5, [(INF, 0.2), (0.2, INF), (0.4, 0.4)],
                    "toy_figure2.png",
                    "Most sensitive distribution, cross-entropy loss, r = 0.5")
    print(md_table(t2))

    print("\n## Figure 6 (0/1 loss, r = 0.3)")
    t6 = toy_panels(toy, X, y, "zero_one", 0.3, [(1.0, 0.25), (0.2, INF), (INF, 0.2)],
                    "toy_figure6.png", "Most sensitive distribution, 0/1 loss, r = 0.3")
    print(md_table(t6))

    print("\n## Figure 7 (0/1 loss, theta1 = 1, theta2 = 0.25, r = 0.2 ... 0.8)")
    fig, axes = plt.subplots(1, 4, figsize=(16.8, 4.2))
    rows = []
    for ax, r in zip(axes, (0.2, 0.4, 0.6, 0.8)):
        res = otstab.certify(toy, X, y, loss="zero_one", r=r)
        plot.sensitive_distribution(res, ax=ax, y=y, coords=(0, 1), legend=False,
                                    title=f"error rate r = {r:g}")
        boundary(ax, toy, X)
        rows.append({"r": r, "R": res.value, "I corruption": res.decomposition["corruption"],
                     "II reweighting": res.decomposition["reweighting"], "gap": res.gap})
    fig.tight_layout()
    fig.savefig(FIG / "toy_figure7.png", dpi=110)
    plt.close(fig)
    print(md_table(pd.DataFrame(rows)))

    # guide picture: moving vs reweighting
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 4.3))
    for ax, (t1, t2_, ttl) in zip(axes, [(0.2, INF, "moving only (theta2 = inf)"),
                                         (INF, 0.2, "reweighting only (theta1 = inf)")]):
        res = otstab.certify(toy, X, y, loss="logistic", r=0.5, theta1=t1, theta2=t2_)
        plot.sensitive_distribution(res, ax=ax, y=y, coords=(0, 1), legend=ax is axes[0],
                                    title=f"{ttl}: R = {res.value:.3g}")
        boundary(ax, toy, X)
    fig.tight_layout()
    fig.savefig(FIG / "moving_vs_reweighting.png", dpi=110)
    plt.close(fig)

    # ------------------------------------------------------------------ Adult
    df = datasets.load_adult()
    Xtr, ytr, Xev, yev = datasets.train_eval_split(df, "income", n_train=2000, n_eval=2000,
                                                   random_state=0)
    lr = LogisticRegression(max_iter=1000).fit(Xtr, ytr)
    acc = float((lr.predict(Xev) == yev).mean())
    print(f"\nAdult: logistic regression, evaluation accuracy {acc:.4f}")

    print("\n## Figure 3(a)-style decomposition (theta pairs of the paper)")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, (loss, r) in zip(axes, [("logistic", 1.0), ("zero_one", 0.4)]):
        splits = [0.0] + [(1 / t1) / 5 for t1, _ in PAPER_PAIRS] + [1.0]
        grid = plot.decomposition_grid(lr, Xev, yev, loss=loss, r=r, total=5.0,
                                       splits=sorted(splits))
        plot.decomposition(grid, ax=ax, title=f"{loss} loss, r = {r:g}")
        show = grid.assign(theta1=grid["theta1"].map(fmt_theta),
                           theta2=grid["theta2"].map(fmt_theta))
        print(f"\n{loss}, r = {r:g}:")
        print(md_table(show[["split", "theta1", "theta2", "value", "risk_base", "corruption",
                             "reweighting"]]))
    fig.tight_layout()
    fig.savefig(FIG / "adult_figure3a.png", dpi=110)
    plt.close(fig)

    if not args.quick:
        print("\n## Figure 3(b)-style first-order traces (cross-entropy, r = 1.0)")
        fig, axes = plt.subplots(1, len(PAPER_PAIRS), figsize=(4.0 * len(PAPER_PAIRS), 3.6))
        rows = []
        for ax, (t1, t2_) in zip(axes, PAPER_PAIRS):
            t = time.perf_counter()
            res = otstab.certify(lr, Xev, yev, loss="logistic", r=1.0, theta1=t1, theta2=t2_,
                                 solver="first_order")
            exact = otstab.certify(lr, Xev, yev, loss="logistic", r=1.0, theta1=t1,
                                   theta2=t2_)
            plot.convergence_trace(res, ax=ax, title=f"theta1 = {t1:.3g}, theta2 = {t2_:.3g}")
            tr = res.info["trace"]
            rows.append({"theta1": t1, "theta2": t2_, "outer iterations": len(tr["risk"]),
                         "final risk": tr["risk"][-1], "R first-order": res.value,
                         "R exact (dual)": exact.value, "time [s]": time.perf_counter() - t})
        fig.tight_layout()
        fig.savefig(FIG / "adult_figure3b.png", dpi=100)
        plt.close(fig)
        print(md_table(pd.DataFrame(rows)))

    print("\n## Figure 4-style feature stability (0/1 loss, r = 0.4, theta1 = 1, "
          "theta2 = 0.25)")
    fig, axes = plt.subplots(1, 2, figsize=(13, 3.6))
    single = otstab.feature_stability(lr, Xev, yev, loss="zero_one", r=0.4).to_frame()
    grouped = otstab.feature_stability(lr, Xev, yev, loss="zero_one", r=0.4,
                                       feature_groups=datasets.feature_groups(Xev)).to_frame()
    plot.feature_stability(single, ax=axes[0], top=5, title="(a) one column at a time")
    plot.feature_stability(grouped, ax=axes[1], top=5,
                           title="(b) one-hot blocks scored as one variable")
    fig.tight_layout()
    fig.savefig(FIG / "adult_figure4.png", dpi=110)
    plt.close(fig)
    print("\nsingle columns:")
    print(md_table(single.head(8)[["rank", "feature", "score", "share_moving"]]))
    print("\ngrouped:")
    print(md_table(grouped.head(8)[["rank", "feature", "score", "share_moving"]]))
    amer = single[single["feature"] == "race: Amer-Indian-Eskimo"]
    print(f"\nrace: Amer-Indian-Eskimo: rank {int(amer['rank'].iloc[0])} of {len(single)}, "
          f"score {float(amer['score'].iloc[0]):.4g}")

    print("\n## R against r (0/1 loss)")
    curve = plot.value_curve(lr, Xev, yev, loss="zero_one",
                             r=[0.16, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5])
    fig, ax = plt.subplots(figsize=(6, 4))
    plot.stability_curve(curve, ax=ax, highlight=0.4)
    fig.tight_layout()
    fig.savefig(FIG / "adult_curve.png", dpi=110)
    plt.close(fig)
    print(md_table(curve[["r", "value", "h", "status"]]))

    res = otstab.certify(lr, Xev, yev, loss="zero_one", r=0.4)
    fig, ax = plt.subplots(figsize=(7, 5))
    plot.sensitive_distribution(res, ax=ax, y=yev)
    fig.tight_layout()
    fig.savefig(FIG / "adult_qstar.png", dpi=110)
    plt.close(fig)
    print(f"\ndone in {time.perf_counter() - t0:.1f} s; figures in {FIG}")


if __name__ == "__main__":
    main()
