"""Tests of otstab.datasets: bundled Adult / German credit data, the split helper, the toy."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from otstab import datasets as ds
from otstab.errors import InputTypeError, ValidationError

PACKAGE_DIR = Path(ds.__file__).resolve().parent


# ------------------------------------------------------------------------------------------
# bundled files, provenance, no dependency on the shared data folder
# ------------------------------------------------------------------------------------------


def test_bundled_files_match_uci_originals():
    assert all(ds._verify_checksums().values()), ds._verify_checksums()
    for name in ["adult.data.gz", "adult.test.gz", "german.data.gz",
                 "german_values_maps.json", "adult.names"]:
        assert (PACKAGE_DIR / "data" / name).is_file()
    assert (PACKAGE_DIR / "LICENSE").is_file()
    assert (PACKAGE_DIR / "README.md").is_file()


def test_loaders_only_read_inside_the_package(monkeypatch):
    """Every file the loaders open lies under otstab/datasets/, none under /work/shared."""
    opened: list[str] = []
    real_open = io.open

    def recording_open(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)):
            opened.append(os.path.realpath(os.fsdecode(file)))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", recording_open)
    ds._clear_caches()
    try:
        ds.load_adult()
        ds.load_adult(raw=True, drop_missing=False)
        ds.load_german()
        ds.license_text()
    finally:
        monkeypatch.undo()
        ds._clear_caches()
    assert opened, "the recording hook saw no file being opened"
    for path in opened:
        assert Path(path).is_relative_to(PACKAGE_DIR), path
        assert "shared" not in Path(path).relative_to(PACKAGE_DIR).parts
    src = (PACKAGE_DIR / "__init__.py").read_text(encoding="utf-8")
    assert "/work/shared" not in src and "../shared" not in src


def test_citation_and_licence():
    assert "10.24432/C5XW20" in ds.citation("adult")
    assert "Kohavi" in ds.citation("adult") and "1996" in ds.citation("adult")
    assert "10.24432/C5NC77" in ds.citation("german") and "Hofmann" in ds.citation("german")
    assert "Blanchet" in ds.citation("toy")
    every = ds.citation()
    assert all(doi in every for doi in ["10.24432/C5XW20", "10.24432/C5NC77"])
    text = ds.license_text()
    assert "CC BY 4.0" in text or "Attribution 4.0" in text
    assert "10.24432/C5XW20" in text and "10.24432/C5NC77" in text
    with pytest.raises(ValidationError, match="name"):
        ds.citation("mnist")


# ------------------------------------------------------------------------------------------
# Adult
# ------------------------------------------------------------------------------------------


def test_adult_row_counts_and_target_balance():
    full = ds.load_adult(raw=True, drop_missing=False)
    assert len(full) == ds.ADULT_N_ROWS == 48_842
    assert full["workclass"].isna().sum() > 0  # the "?" became NaN
    clean = ds.load_adult(raw=True)
    assert len(clean) == ds.ADULT_N_ROWS_CLEAN == 45_222
    assert not clean.isna().any().any()
    enc = ds.load_adult()
    assert len(enc) == 45_222
    # adult.names: P(>50K) = 23.93 % for all rows, 24.78 % without unknowns
    assert full["income"].mean() == pytest.approx(0.2393, abs=5e-4)
    assert enc["income"].mean() == pytest.approx(0.2478, abs=5e-4)
    assert int(enc["income"].sum()) == 11_208  # computed from the data, matches the 24.78 %
    assert set(enc["income"].unique()) == {0, 1}
    assert enc["income"].dtype == np.int64
    # the original train/test sizes (adult.names) without unknowns: 30,162 + 15,060
    assert (clean.index < 32_561).sum() == 30_162


def test_adult_test_file_quirks_are_handled():
    full = ds.load_adult(raw=True, drop_missing=False)
    # the junk header line of adult.test is skipped: the first test row is a 25-year-old
    first_test = full.loc[32_561]
    assert first_test["age"] == 25 and first_test["education"] == "11th"
    assert first_test["income"] == 0  # "<=50K." with its trailing dot
    assert full.index.equals(pd.RangeIndex(48_842))
    assert not full["race"].str.startswith(" ").any()  # leading blanks stripped


def test_adult_encoded_columns():
    enc = ds.load_adult()
    cols = list(enc.columns)
    assert "race: Amer-Indian-Eskimo" in cols
    assert "sex: Female" in cols and "sex: Male" in cols
    assert cols[-1] == "income"
    assert "fnlwgt" not in cols and not any(c.startswith("education:") for c in cols)
    assert "education-num" in cols
    features = enc.drop(columns="income")
    assert all(features[c].dtype == np.float64 for c in features.columns)
    numeric = ["age", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
    assert [c for c in cols if ": " not in c and c != "income"] == numeric
    assert set(enc.attrs["standardization"]) == set(numeric)


def test_adult_standardisation():
    enc = ds.load_adult()
    raw = ds.load_adult(raw=True)
    for col in ["age", "education-num", "capital-gain", "capital-loss", "hours-per-week"]:
        assert enc[col].mean() == pytest.approx(0.0, abs=1e-10)
        assert enc[col].std(ddof=0) == pytest.approx(1.0, rel=1e-10)
        stats = enc.attrs["standardization"][col]
        np.testing.assert_allclose(enc[col] * stats["std"] + stats["mean"], raw[col],
                                   rtol=0, atol=1e-6)


def test_adult_raw_and_encoded_are_aligned():
    enc = ds.load_adult()
    raw = ds.load_adult(raw=True)
    assert enc.index.equals(raw.index)
    assert (enc["income"] == raw["income"]).all()
    for var in ["race", "sex", "workclass", "native-country"]:
        for level in raw[var].unique():
            np.testing.assert_array_equal(enc[f"{var}: {level}"].to_numpy() == 1.0,
                                          (raw[var] == level).to_numpy())
    # raw keeps every original attribute on its original scale
    assert {"fnlwgt", "education"} <= set(raw.columns)
    assert raw["age"].min() >= 17 and raw["age"].dtype == np.int64
    assert isinstance(raw["race"].iloc[0], str)


@pytest.mark.parametrize("loader", [ds.load_adult, ds.load_german])
def test_one_hot_blocks_sum_to_one(loader):
    enc = loader()
    groups = ds.feature_groups(enc)
    assert groups
    for cols in groups.values():
        np.testing.assert_array_equal(enc[cols].sum(axis=1).to_numpy(), 1.0)
        assert set(np.unique(enc[cols].to_numpy())) <= {0.0, 1.0}


def test_feature_groups():
    enc = ds.load_adult()
    groups = ds.feature_groups(enc)
    assert list(groups) == ["workclass", "marital-status", "occupation", "relationship", "race",
                            "sex", "native-country"]
    assert groups["race"] == ["race: Amer-Indian-Eskimo", "race: Asian-Pac-Islander",
                              "race: Black", "race: Other", "race: White"]
    assert groups["sex"] == ["sex: Female", "sex: Male"]
    assert ds.feature_groups(list(enc.columns)) == groups
    full = ds.feature_groups(enc.drop(columns="income"), include_numeric=True)
    assert sorted(c for cols in full.values() for c in cols) == sorted(enc.columns[:-1])
    assert full["age"] == ["age"]
    # German levels contain " : " themselves; the split is at the first ": "
    g = ds.feature_groups(ds.load_german())
    assert "personal_status_sex" in g
    assert "personal_status_sex: male : single" in g["personal_status_sex"]
    with pytest.raises(InputTypeError, match="df"):
        ds.feature_groups(42)


def test_copies_are_independent():
    a = ds.load_adult()
    a.iloc[0, 0] = 1e6
    a["race: White"] = -1.0
    a.attrs["standardization"]["age"]["mean"] = -5.0
    b = ds.load_adult()
    assert b.iloc[0, 0] != 1e6
    assert set(b["race: White"].unique()) == {0.0, 1.0}
    assert b.attrs["standardization"]["age"]["mean"] > 30
    r = ds.load_adult(raw=True)
    r.loc[r.index[0], "race"] = "changed"
    assert ds.load_adult(raw=True)["race"].iloc[0] != "changed"
    g = ds.load_german(raw=True)
    g["credit"] = 7
    assert set(ds.load_german(raw=True)["credit"].unique()) == {0, 1}


def test_adult_is_fast():
    ds._clear_caches()
    t0 = time.perf_counter()
    ds.load_adult()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds.load_adult()
    again = time.perf_counter() - t0
    assert first < 3.0  # < 1 s on a laptop; generous for slow CI machines
    assert again < 0.5


def test_adult_argument_errors():
    with pytest.raises(ValidationError, match="drop_missing"):
        ds.load_adult(drop_missing=False)
    with pytest.raises(ValidationError, match="raw"):
        ds.load_adult(raw="yes")


# ------------------------------------------------------------------------------------------
# German credit
# ------------------------------------------------------------------------------------------


def test_german_counts_and_target():
    enc = ds.load_german()
    raw = ds.load_german(raw=True)
    assert len(enc) == len(raw) == ds.GERMAN_N_ROWS == 1000
    assert enc.index.equals(raw.index)
    assert (enc["credit"] == 1).sum() == 700  # good
    assert (enc["credit"] == 0).sum() == 300  # bad
    assert enc["credit"].dtype == np.int64
    assert list(enc.columns)[-1] == "credit"


def test_german_readable_names_and_encoding():
    raw = ds.load_german(raw=True)
    assert list(raw.columns) == [
        "status", "duration", "credit_history", "purpose", "amount", "savings",
        "employment_duration", "installment_rate", "personal_status_sex", "other_debtors",
        "present_residence", "property", "age", "other_installment_plans", "housing",
        "number_credits", "job", "people_liable", "telephone", "foreign_worker", "credit",
    ]
    # first row of german.data: A11 6 A34 A43 1169 ... A192 A201 1
    first = raw.iloc[0]
    assert first["status"] == "... < 0 DM"
    assert first["purpose"] == "radio/television"
    assert first["amount"] == 1169 and first["duration"] == 6
    assert first["telephone"] == "yes" and first["foreign_worker"] == "yes"
    assert first["credit"] == 1
    for col in raw.columns:
        if raw[col].dtype != np.int64:
            assert not raw[col].str.match(r"^A\d+$").any(), col  # no raw codes left
            assert not raw[col].str.endswith(" ").any(), col
    enc = ds.load_german()
    assert "purpose: car (new)" in enc.columns
    assert "status: 0 <= ... < 200 DM" in enc.columns  # trailing blank of the map stripped
    assert not any("vacation" in c for c in enc.columns)  # level absent from the data
    features = enc.drop(columns="credit")
    assert all(features[c].dtype == np.float64 for c in features.columns)
    numeric = ["duration", "amount", "installment_rate", "present_residence", "age",
               "number_credits", "people_liable"]
    for col in numeric:
        assert enc[col].mean() == pytest.approx(0.0, abs=1e-10)
        assert enc[col].std(ddof=0) == pytest.approx(1.0, rel=1e-10)
    for col in ["purpose", "personal_status_sex", "housing"]:
        for level in raw[col].unique():
            np.testing.assert_array_equal(enc[f"{col}: {level}"].to_numpy() == 1.0,
                                          (raw[col] == level).to_numpy())


# ------------------------------------------------------------------------------------------
# train_eval_split
# ------------------------------------------------------------------------------------------


def test_split_deterministic_and_disjoint():
    df = ds.load_adult()
    X_tr, y_tr, X_ev, y_ev = ds.train_eval_split(df, "income")
    assert X_tr.shape == (2000, df.shape[1] - 1) and X_ev.shape == (2000, df.shape[1] - 1)
    assert isinstance(X_tr, pd.DataFrame) and isinstance(y_tr, pd.Series)
    assert "income" not in X_tr.columns and y_tr.name == "income"
    assert X_tr.index.intersection(X_ev.index).empty
    assert X_tr.index.equals(y_tr.index) and X_ev.index.equals(y_ev.index)
    again = ds.train_eval_split(df, "income")
    for a, b in zip((X_tr, y_tr, X_ev, y_ev), again):
        pd.testing.assert_index_equal(a.index, b.index)
    other = ds.train_eval_split(df, "income", random_state=1)
    assert not other[0].index.equals(X_tr.index)
    # index preserved: group labels come from the raw frame
    race = ds.load_adult(raw=True).loc[X_ev.index, "race"]
    np.testing.assert_array_equal((race == "Black").to_numpy(),
                                  X_ev["race: Black"].to_numpy() == 1.0)
    # rows are copies: mutating them does not touch df
    X_tr.iloc[0, 0] = 99.0
    assert df.loc[X_tr.index[0]].iloc[0] != 99.0


def test_split_sizes_and_errors():
    df = ds.load_german()
    X_tr, _, X_ev, _ = ds.train_eval_split(df, "credit", n_train=600, n_eval=None)
    assert len(X_tr) == 600 and len(X_ev) == 400
    X_tr2, _, X_ev2, _ = ds.train_eval_split(df, "credit", n_train=600, n_eval=100)
    assert X_tr2.index.equals(X_tr.index) and X_ev2.index.equals(X_ev.index[:100])
    with pytest.raises(ValidationError, match="n_train.*n_eval"):
        ds.train_eval_split(df, "credit")  # 2000 + 2000 > 1000
    with pytest.raises(ValidationError, match="n_train"):
        ds.train_eval_split(df, "credit", n_train=1000, n_eval=None)
    with pytest.raises(ValidationError, match="n_eval"):
        ds.train_eval_split(df, "credit", n_train=10, n_eval=0)
    with pytest.raises(InputTypeError, match="n_train"):
        ds.train_eval_split(df, "credit", n_train=10.5, n_eval=10)
    with pytest.raises(ValidationError, match="target"):
        ds.train_eval_split(df, "income", n_train=10, n_eval=10)
    with pytest.raises(InputTypeError, match="df"):
        ds.train_eval_split(df.to_numpy(), "credit", n_train=10, n_eval=10)
    rng_split = ds.train_eval_split(df, "credit", n_train=10, n_eval=10,
                                    random_state=np.random.default_rng(3))
    seed_split = ds.train_eval_split(df, "credit", n_train=10, n_eval=10, random_state=3)
    assert rng_split[0].index.equals(seed_split[0].index)


# ------------------------------------------------------------------------------------------
# toy
# ------------------------------------------------------------------------------------------


def test_toy_shapes_labels_and_determinism():
    X, y = ds.make_toy()
    assert X.shape == (200, 2) and y.shape == (200,)
    assert X.dtype == np.float64 and y.dtype == np.int64
    np.testing.assert_array_equal(y, np.repeat([0, 1], 100))
    X2, y2 = ds.make_toy()
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    X3, _ = ds.make_toy(random_state=1)
    assert not np.allclose(X, X3)
    Xs, ys = ds.make_toy(7)
    assert Xs.shape == (14, 2) and ys.sum() == 7
    with pytest.raises(ValidationError, match="n_per_class"):
        ds.make_toy(0)


def test_toy_distribution():
    X, y = ds.make_toy(20_000, random_state=5)
    for label, mean in enumerate(ds.TOY_MEANS):
        part = X[y == label]
        np.testing.assert_allclose(part.mean(axis=0), mean, atol=0.03)
        np.testing.assert_allclose(np.cov(part.T), ds.TOY_COV, atol=0.04)


def test_toy_is_nearly_separable_like_the_paper():
    """The paper reports ~1 % original error of logistic regression on the toy."""
    sklearn = pytest.importorskip("sklearn.linear_model")
    X, y = ds.make_toy()
    model = sklearn.LogisticRegression().fit(X, y)
    assert 1.0 - model.score(X, y) <= 0.05
