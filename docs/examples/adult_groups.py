"""Adult, groups = race x sex: group metrics of the demo model next to its stability certificate.

Run: python docs/examples/adult_groups.py   (the output is pasted into docs/groups.md)
"""

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

import otstab
from otstab import datasets
from otstab.shift import summary_frame

df = datasets.load_adult()
raw = datasets.load_adult(raw=True)
X_tr, y_tr, X_ev, y_ev = datasets.train_eval_split(df, "income")
model = LogisticRegression(max_iter=2000).fit(X_tr, y_tr)
groups = raw.loc[X_ev.index, ["race", "sex"]]

gm = otstab.group_metrics(y_ev, model.predict(X_ev), groups,
                          y_prob=model.predict_proba(X_ev)[:, 1]).to_frame()
pd.set_option("display.width", 120)
print(gm[["n", "accuracy", "ece"]].sort_values("accuracy").round(3).to_string())
print()
print(summary_frame(gm).loc[["average_accuracy", "worst_group_accuracy",
                             "balanced_accuracy", "worst_class_accuracy"]].round(3).to_string())

res = otstab.certify(model, X_ev, y_ev, loss="zero_one", r=0.4)
print()
print(res.summary())
fs = otstab.feature_stability(model, X_ev, y_ev, loss="zero_one", r=0.4,
                              feature_groups=datasets.feature_groups(X_ev)).to_frame()
print()
print(fs.head(8)[["feature", "score", "rank", "share_moving"]].round(4).to_string(index=False))

# do the flagged features concern the worst groups? Under Q*, which groups gain the most mass
# and the most error?
q = res.to_frame()
q["group"] = [" / ".join(v) for v in groups.to_numpy()[q["source"]]]
q["w_mass"] = q["mass"] * q["weight"]
by = q.groupby("group").apply(
    lambda t: pd.Series({"share_P0": t["mass"].sum() / len(X_ev),
                         "share_Qstar": t["w_mass"].sum() / len(X_ev),
                         "error_Qstar": float(np.sum(t["w_mass"] * t["loss*"])
                                              / max(t["w_mass"].sum(), 1e-300))}),
    include_groups=False)
print()
print(by.sort_values("share_Qstar", ascending=False).round(3).to_string())
rk = fs.set_index("feature")["rank"]
print()
print("rank of race among", len(fs), "variables:", int(rk["race"]), "; sex:", int(rk["sex"]))
