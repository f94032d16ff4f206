"""Figure 3-style and Section 4.2-style results (docs/reproduction.md) and the worst-case risk
example of docs/dro.md, on bundled Adult (and German credit).

    python docs/examples/dro_adult.py            # a few minutes; rewrites docs/figures/*_fig3.png
    python docs/examples/dro_adult.py --quick    # 20 resamples instead of 200, figures to a
                                                 # temporary folder (printed at the end)
    python docs/examples/dro_adult.py --out DIR  # figures to DIR

Everything is seeded; the numbers printed by the full run are the ones quoted in the docs.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402

import otstab  # noqa: E402
from otstab import datasets  # noqa: E402
from otstab.analysis import compare, plot_compare  # noqa: E402
from otstab.training import (  # noqa: E402
    AdversarialLogisticRegression,
    TiltedLogisticRegression,
    select_by_validation,
)

FIG = Path(__file__).resolve().parents[1] / "figures"   # the figures the docs show
INF = math.inf
SETTINGS = [(0.2, INF), (INF, 0.2)]
GAMMAS = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
TILTS = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0]


def fmt(t):
    return "inf" if math.isinf(t) else f"{t:.3g}"


def table(df, cols):
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rec in df.to_dict(orient="records"):
        out.append("| " + " | ".join(fmt(rec[c]) if isinstance(rec[c], float) else str(rec[c])
                                     for c in cols) + " |")
    return "\n".join(out)


def fit_models(Xtr, ytr, n_val):
    """ERM, AT and tilted ERM; the robust hyperparameter chosen by validation accuracy on the
    last n_val training rows, then refitted on all training rows (App. D.3)."""
    Xa, ya, Xv, yv = Xtr.iloc[:-n_val], ytr.iloc[:-n_val], Xtr.iloc[-n_val:], ytr.iloc[-n_val:]
    _, at_tab = select_by_validation(AdversarialLogisticRegression(), {"gamma": GAMMAS},
                                     Xa, ya, Xv, yv)
    _, ti_tab = select_by_validation(TiltedLogisticRegression(), {"t": TILTS}, Xa, ya, Xv, yv)
    gamma = float(at_tab.loc[at_tab["val_accuracy"].idxmax(), "gamma"])
    t = float(ti_tab.loc[ti_tab["val_accuracy"].idxmax(), "t"])
    print("AT validation accuracy:", dict(zip(at_tab["gamma"], at_tab["val_accuracy"])))
    print("Tilted validation accuracy:", dict(zip(ti_tab["t"], ti_tab["val_accuracy"])))
    models = {"ERM": AdversarialLogisticRegression(gamma=INF).fit(Xtr, ytr),
              f"AT (gamma={gamma:g})": AdversarialLogisticRegression(gamma=gamma).fit(Xtr, ytr),
              f"Tilted (t={t:g})": TiltedLogisticRegression(t=t).fit(Xtr, ytr)}
    return models


def figure3(name, models, Xev, yev, n_resamples, r_ce, path):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for ax, (loss, r) in zip(axes, [("logistic", r_ce), ("zero_one", 0.4)]):
        df = compare(models, Xev, yev, loss=loss, r=r, settings=SETTINGS,
                     n_resamples=n_resamples, random_state=0).to_frame()
        plot_compare(df, ax=ax, title=f"{name}: {loss} loss, r = {r:g} (95% bootstrap CI)")
        print(f"\n### {name}, {loss} loss, r = {r:g}")
        print(table(df, ["model", "theta1", "theta2", "value", "ci_lower", "ci_upper", "se",
                         "accuracy"]))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section42(name, Xtr, ytr, Xev, yev, n_resamples, n_val):
    """Targeted AT on the most fragile feature of ERM (0/1 loss, r = 0.4, theta = (1, 0.25))."""
    erm = AdversarialLogisticRegression(gamma=INF).fit(Xtr, ytr)
    ranking = otstab.feature_stability(erm, Xev, yev, loss="zero_one", r=0.4).to_frame()
    feat = ranking["feature"].iloc[0]
    print(f"\n### {name}: most fragile feature of ERM: {feat!r} "
          f"(score {ranking['score'].iloc[0]:.4g})")
    Xa, ya, Xv, yv = Xtr.iloc[:-n_val], ytr.iloc[:-n_val], Xtr.iloc[-n_val:], ytr.iloc[-n_val:]
    _, tab = select_by_validation(AdversarialLogisticRegression(features=[feat]),
                                  {"gamma": GAMMAS}, Xa, ya, Xv, yv)
    gamma = float(tab.loc[tab["val_accuracy"].idxmax(), "gamma"])
    print("targeted AT validation accuracy:", dict(zip(tab["gamma"], tab["val_accuracy"])))
    models = {"ERM": erm}
    for g in dict.fromkeys([gamma, 0.1]):  # the selected price and a strong adversary
        models[f"targeted AT (gamma={g:g})"] = AdversarialLogisticRegression(
            gamma=g, features=[feat]).fit(Xtr, ytr)
    rows = []
    for label, feats in [(f"score of {feat}", [feat]), ("all features", None)]:
        df = compare(models, Xev, yev, loss="zero_one", r=0.4, settings=[(1.0, 0.25)],
                     n_resamples=n_resamples, random_state=0, features=feats).to_frame()
        rows.append(df.assign(what=label))
        print(f"\n{label}:")
        print(table(df, ["model", "value", "ci_lower", "ci_upper", "se", "accuracy"]))
    after = otstab.feature_stability(models[f"targeted AT (gamma={gamma:g})"], Xev, yev,
                                     loss="zero_one", r=0.4).to_frame()
    rank = int(np.flatnonzero(after["feature"].to_numpy() == feat)[0]) + 1
    print(f"rank of {feat!r} after targeted AT: {rank} of {len(after)} "
          f"(most fragile now: {after['feature'].iloc[0]!r})")


def dro_example(Xev, yev, lr):
    print("\n### worst_case_risk on Adult (ERM, logistic loss)")
    for eps in [0.01, 0.05, 0.1]:
        for t1, t2 in [(1.0, 0.25), (0.2, INF), (INF, 0.2)]:
            w = otstab.worst_case_risk(lr, Xev, yev, loss="logistic", eps=eps, theta1=t1,
                                       theta2=t2)
            back = otstab.certify(lr, Xev, yev, loss="logistic", r=w.risk, theta1=t1,
                                  theta2=t2)
            print(f"| {eps:g} | {fmt(t1)} | {fmt(t2)} | {w.risk:.5g} | {w.risk_base:.4g} | "
                  f"{abs(back.value - eps) / eps:.1e} | {w.solve_time:.2f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="20 bootstrap resamples instead of 200; figures to a temporary folder "
                         "unless --out is given (the docs' figures are left alone)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the figures (default: docs/figures for the full run)")
    args = ap.parse_args(argv)
    n_res = 20 if args.quick else 200
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="otstab-dro-")) if args.quick else FIG
    out.mkdir(parents=True, exist_ok=True)
    df = datasets.load_adult()
    Xtr, ytr, Xev, yev = datasets.train_eval_split(df, "income", n_train=2000, n_eval=2000,
                                                   random_state=0)
    print("## Adult (2,000 + 2,000, seed 0)")
    models = fit_models(Xtr, ytr, n_val=500)
    figure3("Adult", models, Xev, yev, n_res, 1.0, out / "adult_compare_fig3.png")
    section42("Adult", Xtr, ytr, Xev, yev, n_res, n_val=500)
    dro_example(Xev, yev, LogisticRegression(max_iter=1000).fit(Xtr, ytr))

    g = datasets.load_german()
    Xtr, ytr, Xev, yev = datasets.train_eval_split(g, "credit", n_train=500, n_eval=500,
                                                   random_state=0)
    print("\n## German credit (500 + 500, seed 0)")
    models = fit_models(Xtr, ytr, n_val=125)
    figure3("German credit", models, Xev, yev, n_res, 1.0, out / "german_compare_fig3.png")
    section42("German credit", Xtr, ytr, Xev, yev, n_res, n_val=125)
    print(f"\nfigures written to {out}")
    return out


if __name__ == "__main__":
    main()
