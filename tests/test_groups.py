"""Tests of otstab.groups: group_metrics, diagnose_shift, select_model (SubpopBench)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import entropy as scipy_entropy
from scipy.stats.contingency import association
from sklearn import metrics as skm
from sklearn.preprocessing import label_binarize

import otstab
from otstab.errors import ValidationError
from otstab.shift import CRITERIA, per_class_frame, summary_frame

# ------------------------------------------------------------------------------------------
# reference count tables (GROUPS.md; training counts of Sagawa et al. 2020)
# ------------------------------------------------------------------------------------------

WATERBIRDS = pd.DataFrame([[3498, 184], [56, 1057]], index=["landbird", "waterbird"],
                          columns=["land", "water"])
CELEBA = pd.DataFrame([[71629, 66874], [22880, 1387]], index=["non-blond", "blond"],
                      columns=["F", "M"])

# The digits of the GROUPS.md reference table (recomputed there from SubpopBench Tables 2, 9-11):
# MI (nats), NMI, V = T, class H (bits), class spread, attr H (bits), attr spread.
REFERENCE = {
    "waterbirds": (WATERBIRDS, dict(mi=0.373, nmi=0.670, cramers_v=0.867, tschuprows_t=0.867,
                                    class_entropy=0.782, class_spread=0.536,
                                    attribute_entropy=0.825, attribute_spread=0.482)),
    "celeba": (CELEBA, dict(mi=0.058, nmi=0.106, cramers_v=0.307, tschuprows_t=0.307,
                            class_entropy=0.608, class_spread=0.702,
                            attribute_entropy=0.981, attribute_spread=0.161)),
}


@pytest.mark.parametrize("name", ["waterbirds", "celeba"])
def test_reference_tables_reproduce_groups_md(name):
    table, ref = REFERENCE[name]
    d = otstab.diagnose_shift(table)
    for key, value in ref.items():
        # three decimals as printed in GROUPS.md: the value must round to the printed digits
        assert getattr(d, key) == pytest.approx(value, abs=5e-4 + 1e-12), key
    # binary Y and A: entropy in bits equals the normalized entropy H / log 2
    assert d.class_normalized_entropy == pytest.approx(d.class_entropy)
    assert d.attribute_normalized_entropy == pytest.approx(d.attribute_entropy)
    assert d.n == table.to_numpy().sum()
    assert not d.attribute_generalization


def test_reference_shift_types_match_subpopbench_table2():
    # SubpopBench Table 2: Waterbirds is marked SC, AI, CI; CelebA SC, CI.
    wb = otstab.diagnose_shift(WATERBIRDS)
    ce = otstab.diagnose_shift(CELEBA)
    assert wb.shift_types == ("spurious_correlation", "attribute_imbalance", "class_imbalance")
    assert ce.shift_types == ("spurious_correlation", "class_imbalance")
    assert wb.dominant == ce.dominant == "spurious_correlation"
    assert wb.scores["spurious_correlation"] == wb.cramers_v
    assert wb.scores["class_imbalance"] == pytest.approx(1 - wb.class_normalized_entropy)


def _expand(table: np.ndarray):
    """Raw (y, a) columns with the given contingency table."""
    r, k = table.shape
    yy, aa = np.meshgrid(np.arange(r), np.arange(k), indexing="ij")
    reps = table.astype(int).ravel()
    return np.repeat(yy.ravel(), reps), np.repeat(aa.ravel(), reps)


def test_raw_columns_give_the_same_diagnosis():
    y, a = _expand(WATERBIRDS.to_numpy())
    names_y = np.array(["landbird", "waterbird"])[y]
    names_a = np.array(["land", "water"])[a]
    ref = otstab.diagnose_shift(WATERBIRDS)
    for arg in [(names_y, names_a), pd.DataFrame({"y": names_y, "a": names_a}),
                pd.DataFrame({"label": names_y, "place": names_a})]:
        kw = {"y": "label", "a": "place"} if "label" in getattr(arg, "columns", []) else {}
        d = otstab.diagnose_shift(arg, **kw)
        for key in ["mi", "nmi", "cramers_v", "tschuprows_t", "class_entropy",
                    "attribute_entropy", "class_spread", "attribute_spread"]:
            assert getattr(d, key) == pytest.approx(getattr(ref, key), rel=1e-12)
        assert d.counts.loc["waterbird", "land"] == 56


@pytest.mark.parametrize("seed", range(6))
def test_diagnosis_matches_sklearn_and_scipy(seed):
    rng = np.random.default_rng(seed)
    r, k = rng.integers(2, 6, size=2)
    table = rng.integers(1, 60, size=(r, k)).astype(float)
    y, a = _expand(table)
    d = otstab.diagnose_shift(table)
    assert d.mi == pytest.approx(skm.mutual_info_score(y, a), rel=1e-10)
    assert d.nmi == pytest.approx(
        skm.normalized_mutual_info_score(y, a, average_method="arithmetic"), rel=1e-10)
    assert d.cramers_v == pytest.approx(association(table.astype(int), method="cramer"),
                                        rel=1e-10)
    assert d.tschuprows_t == pytest.approx(association(table.astype(int), method="tschuprow"),
                                           rel=1e-10)
    py, pa = table.sum(1) / table.sum(), table.sum(0) / table.sum()
    assert d.class_entropy == pytest.approx(scipy_entropy(py, base=2), rel=1e-12)
    assert d.attribute_entropy == pytest.approx(scipy_entropy(pa, base=2), rel=1e-12)
    assert d.class_normalized_entropy == pytest.approx(scipy_entropy(py) / np.log(r))
    assert d.attribute_spread == pytest.approx(pa.max() - pa.min())


def test_attribute_generalization_flag():
    train = pd.DataFrame([[10, 5, 0], [4, 9, 0]], index=[0, 1], columns=["x", "y", "z"])
    # no test table: the empty cells of the training table are unseen groups
    d = otstab.diagnose_shift(train)
    assert d.attribute_generalization and d.dominant == "attribute_generalization"
    assert sorted(d.missing_groups) == [(0, "z"), (1, "z")]
    # with a test table only cells with test samples count; 'w' is a new attribute value
    test = pd.DataFrame([[3, 3, 0, 2], [3, 3, 0, 0]], index=[0, 1], columns=["x", "y", "z", "w"])
    d = otstab.diagnose_shift(train, test)
    assert d.attribute_generalization and d.missing_groups == [(0, "w")]
    assert d.scores["attribute_generalization"] == pytest.approx(2 / 14)
    test_seen = pd.DataFrame([[3, 3], [3, 3]], index=[0, 1], columns=["x", "y"])
    assert not otstab.diagnose_shift(train, test_seen).attribute_generalization
    # raw test columns are aligned by label
    d = otstab.diagnose_shift(train, (np.array([0, 1, 1]), np.array(["x", "z", "z"])))
    assert d.missing_groups == [(1, "z")]
    # a full training table has no unseen group
    assert not otstab.diagnose_shift(WATERBIRDS).attribute_generalization


def test_diagnosis_degenerate_inputs():
    # one attribute value (SubpopBench's "-" rows): association undefined -> NaN, MI = NMI = 0
    d = otstab.diagnose_shift(np.array([[30.0], [10.0]]))
    assert math.isnan(d.cramers_v) and math.isnan(d.tschuprows_t)
    assert d.mi == 0.0 and d.nmi == 0.0
    assert math.isnan(d.attribute_normalized_entropy) and d.attribute_spread == 0.0
    assert "spurious_correlation" not in d.shift_types
    # a declared but empty attribute level counts as imbalance and as an unseen group
    d = otstab.diagnose_shift(pd.DataFrame([[30, 0], [10, 0]]))
    assert math.isnan(d.cramers_v) and d.attribute_spread == 1.0
    assert d.attribute_generalization
    with pytest.raises(ValidationError, match="count table"):
        otstab.diagnose_shift(np.array([1, 2, 3]))
    with pytest.raises(ValidationError, match=">= 0"):
        otstab.diagnose_shift(np.array([[1, -2], [3, 4]]))
    with pytest.raises(ValidationError, match="no samples"):
        otstab.diagnose_shift(np.zeros((2, 2)))
    with pytest.raises(ValidationError, match="inconsistent"):
        otstab.diagnose_shift((np.array([0, 1, 1]), np.array([0, 1])))
    with pytest.raises(ValidationError, match="missing"):
        otstab.diagnose_shift((np.array([0, 1, None], dtype=object), np.array([0, 1, 1])))
    with pytest.raises(ValidationError, match="raw columns must be named 'y' and 'a'"):
        otstab.diagnose_shift(pd.DataFrame({"label": ["u", "v"], "place": ["p", "q"]}))
    with pytest.raises(ValidationError, match="thresholds"):
        otstab.diagnose_shift(WATERBIRDS, thresholds={"spurius": 0.1})


def test_diagnosis_result_serialises():
    d = otstab.diagnose_shift(CELEBA, thresholds={"spurious_correlation": 0.5})
    assert d.shift_types == ("class_imbalance",)
    row = d.to_frame()
    assert row.shape[0] == 1 and row.loc[0, "shift_types"] == "class_imbalance"
    data = d.to_dict()
    assert "counts" not in data and data["thresholds"]["spurious_correlation"] == 0.5
    assert '"nmi"' in d.to_json()


# ------------------------------------------------------------------------------------------
# group_metrics
# ------------------------------------------------------------------------------------------


def _random_binary(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(0.35 * y + 0.65 * rng.random(n), 0, 1)
    p = np.round(p, 2)  # ties, to exercise the tie handling of AUROC / AUPRC
    yp = (p >= 0.5).astype(int)
    g = rng.choice(["a", "b", "c"], n)
    return y, yp, p, g


def _random_multiclass(n, K, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    logits = rng.normal(size=(n, K)) + 1.5 * np.eye(K)[y]
    P = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    yp = P.argmax(1)
    g = rng.integers(0, 4, n)
    return y, yp, P, g


@pytest.mark.parametrize("seed", range(3))
def test_binary_metrics_match_sklearn(seed):
    y, yp, p, g = _random_binary(400, seed)
    df = otstab.group_metrics(y, yp, g, y_prob=p).to_frame()
    s = df.attrs["summary"]
    assert s["average_accuracy"] == pytest.approx(skm.accuracy_score(y, yp))
    assert s["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, yp))
    prec, rec, f1, _ = skm.precision_recall_fscore_support(y, yp, zero_division=0)
    assert s["macro_precision"] == pytest.approx(prec.mean())
    assert s["worst_precision"] == pytest.approx(prec.min())
    assert s["weighted_precision"] == pytest.approx(
        skm.precision_score(y, yp, average="weighted", zero_division=0))
    assert s["macro_f1"] == pytest.approx(f1.mean())
    assert s["worst_f1"] == pytest.approx(f1.min())
    assert s["worst_class_accuracy"] == pytest.approx(rec.min())
    assert s["auroc"] == pytest.approx(skm.roc_auc_score(y, p))
    assert s["auprc"] == pytest.approx(skm.average_precision_score(y, p))
    assert s["cross_entropy"] == pytest.approx(skm.log_loss(y, p))
    assert s["brier"] == pytest.approx(skm.brier_score_loss(y, p))
    # per-group accuracy = pandas groupby; worst / adjusted accuracy from it
    acc = pd.Series(y == yp).groupby(g).mean()
    assert df.loc[acc.index, "accuracy"].to_numpy() == pytest.approx(acc.to_numpy())
    assert s["worst_group_accuracy"] == pytest.approx(acc.min())
    assert s["adjusted_accuracy"] == pytest.approx(acc.mean())
    assert s["worst_group"] == acc.idxmin()
    assert df.loc["overall", "n"] == 400 and df["share"].iloc[:-1].sum() == pytest.approx(1)
    # per-group probabilistic metrics are the same functions on the group's rows
    m = g == "b"
    assert df.loc["b", "cross_entropy"] == pytest.approx(skm.log_loss(y[m], p[m]))
    assert df.loc["b", "brier"] == pytest.approx(skm.brier_score_loss(y[m], p[m]))
    pc = per_class_frame(df)
    assert pc["precision"].to_numpy() == pytest.approx(prec)
    assert pc["recall"].to_numpy() == pytest.approx(rec)


@pytest.mark.parametrize("seed", range(2))
def test_multiclass_metrics_match_sklearn(seed):
    K = 4
    y, yp, P, g = _random_multiclass(500, K, seed)
    s = otstab.group_metrics(y, yp, g, y_prob=P).to_frame().attrs["summary"]
    assert s["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, yp))
    assert s["macro_f1"] == pytest.approx(skm.f1_score(y, yp, average="macro"))
    assert s["worst_f1"] == pytest.approx(skm.f1_score(y, yp, average=None).min())
    assert s["auroc"] == pytest.approx(skm.roc_auc_score(y, P, multi_class="ovr"))
    assert s["auprc"] == pytest.approx(
        skm.average_precision_score(label_binarize(y, classes=range(K)), P, average="macro"))
    assert s["cross_entropy"] == pytest.approx(skm.log_loss(y, P))
    # the multiclass Brier score: mean over rows of the summed squared errors (what
    # sklearn >= 1.7's brier_score_loss computes; 1.6, the oldest allowed, is binary only)
    onehot = label_binarize(y, classes=range(K))
    assert s["brier"] == pytest.approx(np.mean(np.sum((P - onehot) ** 2, axis=1)))
    r = skm.recall_score(y, yp, average=None)
    assert s["class_accuracy_diff"] == pytest.approx(
        sum(abs(r[i] - r[j]) for i in range(K) for j in range(i + 1, K)))
    assert s["class_recall_std"] == pytest.approx(np.std(r))


def test_string_labels_and_two_column_probabilities():
    y, yp, p, g = _random_binary(200, 7)
    names = np.array(["cat", "dog"])
    a = otstab.group_metrics(names[y], names[yp], g, y_prob=np.column_stack([1 - p, p])).to_frame()
    b = otstab.group_metrics(y, yp, g, y_prob=p).to_frame()
    for key in ["auroc", "auprc", "cross_entropy", "brier", "ece", "worst_f1"]:
        assert a.attrs["summary"][key] == pytest.approx(b.attrs["summary"][key])
    assert a.attrs["per_class"]["label"] == ["cat", "dog"]


def test_integer_labels_index_probability_columns():
    # labels 0..K-1 name the columns of y_prob even when a class never occurs
    P = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.6, 0.3, 0.1]])
    df = otstab.group_metrics([0, 1, 0], [0, 1, 0], [0, 0, 0], y_prob=P).to_frame()
    assert df.attrs["summary"]["n_classes"] == 3
    assert df.attrs["summary"]["cross_entropy"] == pytest.approx(
        -np.mean(np.log([0.7, 0.8, 0.6])))


def test_ece_by_hand():
    # bins of width 0.1: {0.05, 0.15} and {0.95, 0.95} -> bin [0.0, 0.1): conf .05, freq 0;
    # [0.1, 0.2): conf .15, freq 1; [0.9, 1.0]: conf .95, freq 1/2.
    # ECE = 1/4 |0 - .05| + 1/4 |1 - .15| + 2/4 |.5 - .95| = .0125 + .2125 + .225 = .45
    y = np.array([0, 1, 1, 0])
    p = np.array([0.05, 0.15, 0.95, 0.95])
    df = otstab.group_metrics(y, (p >= 0.5).astype(int), np.zeros(4), y_prob=p).to_frame()
    assert df.attrs["summary"]["ece"] == pytest.approx(0.45)
    # p = 1.0 falls in the last bin, not in an 11th one
    df = otstab.group_metrics([1, 1], [1, 1], [0, 0], y_prob=[1.0, 1.0]).to_frame()
    assert df.attrs["summary"]["ece"] == 0.0


def test_adjusted_equals_balanced_on_attribute_balanced_classes():
    # Within each class the attribute groups have equal size, so the mean over the (y, a)
    # groups equals the mean over classes of their recall (each recall is the mean of its
    # groups' accuracies): adjusted = balanced (as Waterbirds' test set, 83.1 / 83.1).
    rng = np.random.default_rng(3)
    sizes = {0: 300, 1: 80}
    y = np.repeat([0, 0, 1, 1], [sizes[0], sizes[0], sizes[1], sizes[1]])
    a = np.repeat([0, 1, 0, 1], [sizes[0], sizes[0], sizes[1], sizes[1]])
    yp = np.where(rng.random(y.size) < np.where(a == y, 0.95, 0.6), y, 1 - y)
    df = otstab.group_metrics(y, yp, pd.DataFrame({"y": y, "a": a})).to_frame()
    s = df.attrs["summary"]
    assert s["adjusted_accuracy"] == pytest.approx(s["balanced_accuracy"])
    assert s["worst_group_accuracy"] <= s["worst_class_accuracy"]
    assert list(df.index) == ["y=0, a=0", "y=0, a=1", "y=1, a=0", "y=1, a=1", "overall"]
    assert list(df.columns[:2]) == ["y", "a"] and df.loc["y=1, a=0", "y"] == 1
    assert df["y"].tolist() == [0, 0, 1, 1, None]  # labels keep their type (object column)


def test_empty_categorical_group_is_a_nan_row():
    y = np.array([0, 1, 1, 0, 1])
    yp = np.array([0, 1, 0, 0, 1])
    g = pd.Categorical(["a", "a", "b", "b", "b"], categories=["a", "b", "never"])
    df = otstab.group_metrics(y, yp, g).to_frame()
    assert df.loc["never", "n"] == 0 and math.isnan(df.loc["never", "accuracy"])
    s = df.attrs["summary"]
    assert s["n_empty_groups"] == 1 and s["n_groups"] == 3
    assert s["worst_group_accuracy"] == pytest.approx(2 / 3)
    assert s["adjusted_accuracy"] == pytest.approx((1 + 2 / 3) / 2)
    # DataFrame of categorical attributes: every combination, empty ones as NaN rows
    attrs = pd.DataFrame({"sex": pd.Categorical(["F", "M", "F", "M", "F"]),
                          "race": pd.Categorical(["x", "x", "x", "x", "y"])})
    df = otstab.group_metrics(y, yp, attrs).to_frame()
    assert df.loc["sex=M, race=y", "n"] == 0
    assert df.loc["sex=F, race=x", "n"] == 2


def test_single_class_gives_documented_nans():
    y = np.ones(6, dtype=int)
    yp = np.array([1, 1, 1, 0, 1, 1])
    df = otstab.group_metrics(y, yp, [0, 0, 0, 1, 1, 1],
                              y_prob=[0.9, 0.8, 0.7, 0.4, 0.6, 0.9]).to_frame()
    s = df.attrs["summary"]
    assert math.isnan(s["auroc"])  # undefined with one class
    assert s["auprc"] == 1.0  # every positive ranked above no negative: precision is 1
    assert s["balanced_accuracy"] == s["worst_class_accuracy"] == pytest.approx(5 / 6)
    # class 0 occurs only as a prediction: precision 0, F1 0, recall NaN (zero_division)
    pc = per_class_frame(df)
    assert pc.loc[0, "precision"] == 0 and pc.loc[0, "f1"] == 0 and math.isnan(pc.loc[0, "recall"])
    # no positives at all: AUPRC undefined too
    s = otstab.group_metrics([0, 0], [0, 0], [0, 0], y_prob=[0.1, 0.2]).to_frame().attrs["summary"]
    assert math.isnan(s["auprc"]) and math.isnan(s["auroc"])
    with pytest.raises(ValidationError, match="labels="):
        otstab.group_metrics(["x", "x"], ["x", "x"], [0, 0], y_prob=[0.1, 0.2]).to_frame()


@pytest.mark.parametrize("kwargs, match", [
    (dict(y_pred=[0, 1, 1]), "inconsistent numbers of samples"),
    (dict(groups=[0, 1, 1]), "inconsistent numbers of samples"),
    (dict(y_prob=[0.1, 1.2, 0.5, 0.5]), r"\[0, 1\]"),
    (dict(y_prob=[-0.1, 0.2, 0.5, 0.5]), r"\[0, 1\]"),
    (dict(y_prob=[0.1, np.nan, 0.5, 0.5]), "NaN"),
    (dict(y_prob=[0.1, 0.2, 0.5]), "y_prob"),
    (dict(y_prob=[[0.2, 0.2], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]), "sum to 1"),
    (dict(y_true=list("uvvu"), y_pred=list("uvuu"), y_prob=np.full((4, 3), 1 / 3)),
     "3 columns"),
    (dict(y_true=[0, 1, None, 1]), "y_true contains a missing value"),
    (dict(groups=None), "groups is required"),
    (dict(groups=["overall", "a", "a", "a"]), "reserved"),
    (dict(n_resamples=2.5), "n_resamples"),
    (dict(n_resamples=-1), "n_resamples"),
    (dict(level=1.0), "level"),
    (dict(labels=[0, 1, 1]), "distinct"),
    (dict(labels=[0, 2]), "not one of the labels"),
    (dict(groups=pd.DataFrame({"n": [0, 0, 1, 1], "a": [0, 1, 0, 1]})), "clash"),
])
def test_group_metrics_errors(kwargs, match):
    args = dict(y_true=[0, 1, 1, 0], y_pred=[0, 1, 0, 0], groups=["a", "a", "b", "b"])
    args.update(kwargs)
    y_true, y_pred, groups = args.pop("y_true"), args.pop("y_pred"), args.pop("groups")
    with pytest.raises(ValidationError, match=match):
        otstab.group_metrics(y_true, y_pred, groups, **args).to_frame()


def test_bootstrap_intervals():
    y, yp, p, g = _random_binary(300, 11)
    kw = dict(y_prob=p, n_resamples=200, random_state=0)
    df = otstab.group_metrics(y, yp, g, **kw).to_frame()
    again = otstab.group_metrics(y, yp, g, **kw).to_frame()
    pd.testing.assert_frame_equal(df, again)
    assert df.attrs["summary_ci"] == again.attrs["summary_ci"]
    other = otstab.group_metrics(y, yp, g, **{**kw, "random_state": 1}).to_frame()
    assert other.attrs["summary_ci"] != df.attrs["summary_ci"]
    sf = summary_frame(df)
    assert list(sf.columns) == ["value", "lower", "upper"]
    assert (sf["lower"] <= sf["upper"]).all()
    for key in ["average_accuracy", "balanced_accuracy", "auroc", "brier", "cross_entropy"]:
        assert sf.loc[key, "lower"] < sf.loc[key, "value"] < sf.loc[key, "upper"], key
    # a wider level gives a wider interval (same replicates)
    wide = summary_frame(otstab.group_metrics(y, yp, g, level=0.99, **kw).to_frame())
    assert (wide["upper"] - wide["lower"] >= sf["upper"] - sf["lower"] - 1e-12).all()
    # the stratified bootstrap keeps group sizes: a perfectly classified group stays at 1
    yp2 = yp.copy()
    yp2[g == "a"] = y[g == "a"]
    df2 = otstab.group_metrics(y, yp2, g, n_resamples=50, random_state=0).to_frame()
    assert df2.loc["a", ["accuracy_lower", "accuracy_upper"]].tolist() == [1.0, 1.0]
    # the average-accuracy interval roughly matches the binomial standard error
    se = math.sqrt(sf.loc["average_accuracy", "value"] * (1 - sf.loc["average_accuracy", "value"])
                   / len(y))
    width = sf.loc["average_accuracy", "upper"] - sf.loc["average_accuracy", "lower"]
    assert 2 * 1.96 * se * 0.6 < width < 2 * 1.96 * se * 1.4


def test_inputs_not_mutated_and_frames_concatenate():
    y, yp, P, g = _random_multiclass(120, 3, 5)
    copies = [a.copy() for a in (y, yp, P, g)]
    groups = pd.DataFrame({"g": g, "h": g % 2})
    gcopy = groups.copy()
    a = otstab.group_metrics(y, yp, groups, y_prob=P, n_resamples=5, random_state=0).to_frame()
    for before, after in zip(copies, (y, yp, P, g)):
        np.testing.assert_array_equal(before, after)
    pd.testing.assert_frame_equal(groups, gcopy)
    b = otstab.group_metrics(y, yp, g).to_frame()
    both = pd.concat([a, b], keys=["model_a", "model_b"])  # attrs hold plain values only
    assert both.shape[0] == a.shape[0] + b.shape[0]


# ------------------------------------------------------------------------------------------
# select_model
# ------------------------------------------------------------------------------------------


def _records():
    # run r2 has the best validation worst-class accuracy, r3 the best test WGA (the oracle),
    # r1 the best validation average accuracy.
    return pd.DataFrame({
        "val_worst_class_accuracy": [0.60, 0.80, 0.70, np.nan],
        "val_average_accuracy": [0.95, 0.90, 0.85, 0.99],
        "val_ece": [0.02, 0.05, 0.04, 0.01],
        "test_worst_group_accuracy": [0.40, 0.70, 0.75, 0.50],
    }, index=["r1", "r2", "r3", "r4"])


def test_select_model_picks_and_reports_gap():
    res = otstab.select_model(_records())
    assert res.selected == "r2"
    assert res.gap == pytest.approx(0.70 - 0.75)
    row = res.report.iloc[0]
    assert row["oracle"] == 0.75 and row["validation_value"] == 0.80
    res = otstab.select_model(_records(), criterion="all")
    assert res.criteria == ["worst_class_accuracy", "average_accuracy", "ece"]
    gaps = res.criteria_table["mean_gap"]
    assert gaps["average_accuracy"] == pytest.approx(0.50 - 0.75)  # r4 (0.99)
    assert gaps["ece"] == pytest.approx(0.50 - 0.75)  # min ECE -> r4
    assert res.criteria_table.index[0] == "worst_class_accuracy"  # best criterion listed first
    assert CRITERIA["ece"] == "min"
    assert res.to_frame().shape[0] == 3 and "report" in res.to_dict()


def test_select_model_by_group_and_errors():
    recs = pd.concat([_records().assign(dataset="wb"),
                      _records().assign(dataset="celeba",
                                        test_worst_group_accuracy=[0.9, 0.1, 0.2, 0.3])])
    recs = recs.reset_index(drop=True)
    res = otstab.select_model(recs, by="dataset")
    gap = res.gap
    assert gap["wb"] == pytest.approx(-0.05) and gap["celeba"] == pytest.approx(0.1 - 0.9)
    assert res.criteria_table.loc["worst_class_accuracy", "mean_gap"] == \
        pytest.approx((-0.05 - 0.8) / 2)
    assert res.criteria_table.loc["worst_class_accuracy", "n_groups"] == 2
    with pytest.raises(ValidationError, match="criterion must be one of"):
        otstab.select_model(recs, criterion="accuracy_please")
    with pytest.raises(ValidationError, match="val_balanced_accuracy"):
        otstab.select_model(recs, criterion="balanced_accuracy")
    with pytest.raises(ValidationError, match="test_metric"):
        otstab.select_model(recs, test_metric="test_wga")
    with pytest.raises(ValidationError, match="no rows"):
        otstab.select_model(recs.iloc[:0])


def test_select_model_on_group_metrics_summaries():
    """Records built from group_metrics summaries: the documented workflow."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    a = rng.integers(0, 2, 400)
    groups = pd.DataFrame({"y": y, "a": a})
    rows = []
    for run, noise in enumerate([0.15, 0.3, 0.02]):
        yp = np.where(rng.random(400) < noise, 1 - y, y)
        val = otstab.group_metrics(y, yp, y).to_frame().attrs["summary"]  # attributes unknown
        test = otstab.group_metrics(y, yp, groups).to_frame().attrs["summary"]
        rows.append({**{f"val_{k}": v for k, v in val.items() if k in CRITERIA},
                     "test_worst_group_accuracy": test["worst_group_accuracy"], "run": run})
    res = otstab.select_model(rows, criterion="all")
    # without y_prob every criterion except the probabilistic ones is available
    assert set(res.criteria) == set(CRITERIA) - {"auroc", "auprc", "cross_entropy", "brier",
                                                 "ece"}
    # the least noisy run (index 2) wins on validation worst-class accuracy and on test WGA
    assert res.selected == 2 and res.gap == 0.0
    assert res.report["gap"].max() <= 0


def test_thresholds_given_keep_table_association():
    # diagnose_shift once reused the name of its thresholds loop key (a str) for the number of
    # table columns (an int; mypy: str/int mix). With thresholds passed, V and T must still be
    # scipy's association of the non-empty 3x2 table, and the threshold must decide the mark.
    table = pd.DataFrame([[30, 5], [4, 40], [10, 11]], index=["a", "b", "c"], columns=["u", "v"])
    O = table.to_numpy()
    v_ref = association(O, method="cramer")
    t_ref = association(O, method="tschuprow")
    for th in (v_ref - 0.01, v_ref + 0.01):
        d = otstab.diagnose_shift(table, thresholds={"spurious_correlation": th,
                                                     "class_imbalance": 0.5})
        assert d.cramers_v == pytest.approx(v_ref, rel=1e-12)
        assert d.tschuprows_t == pytest.approx(t_ref, rel=1e-12)
        assert d.thresholds["spurious_correlation"] == th
        assert ("spurious_correlation" in d.shift_types) == (th <= v_ref)
