"""Bundled real data sets and the paper's toy example.

Two small tabular data sets from the UCI Machine Learning Repository ship inside the package
(gzip-compressed, under ``otstab/datasets/data/``), so nothing is downloaded:

* **Adult** (Becker & Kohavi 1996, doi:10.24432/C5XW20): predict ``income`` > 50K from 1994
  census records; 48,842 rows (``adult.data`` + ``adult.test``), 45,222 after dropping rows with
  a missing value.  Includes ``race`` and ``sex``.
* **German credit** (Statlog, Hofmann 1994, doi:10.24432/C5NC77): predict good/bad ``credit``;
  1,000 rows, no missing values.

Both are licensed CC BY 4.0 (see ``LICENSE`` next to this file and :func:`citation`).

Preprocessing of the default (``raw=False``) frames:

* rows with a missing value (``"?"`` in Adult) are dropped;
* every categorical variable is one-hot encoded with **all** its levels kept (no reference
  level is dropped: the stability scoring treats a one-hot block as one feature, see
  :func:`feature_groups`); the columns are named ``"<variable>: <level>"``, e.g.
  ``"race: Amer-Indian-Eskimo"``; only levels that occur in the cleaned data get a column;
* every numeric variable is standardised to zero mean and unit variance (population standard
  deviation, ``ddof=0``, as scikit-learn's ``StandardScaler``) over the cleaned data, i.e. over
  all rows returned, not over a training split; the means and standard deviations used are in
  ``df.attrs["standardization"]``;
* all feature columns are ``float64``; the target is the last column, ``int64`` 0/1.

``raw=True`` gives the same rows (same order, same index) before encoding: categorical columns
as strings, numeric columns on their original scales, same 0/1 target.  Use it to take group
labels such as ``race`` and ``sex`` that line up with the encoded frame.

The index of every frame is the row's position in the original data (for Adult: in
``adult.data`` followed by ``adult.test``, header line excluded), so rows can be traced back.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
from collections.abc import Iterable
from importlib import resources
from numbers import Integral
from typing import overload

import numpy as np
import pandas as pd

from ..errors import InputTypeError, ValidationError

__all__ = [
    "load_adult",
    "load_german",
    "feature_groups",
    "train_eval_split",
    "make_toy",
    "citation",
    "license_text",
    "ADULT_CITATION",
    "GERMAN_CITATION",
    "PAPER_CITATION",
    "LICENSE_NOTICE",
    "TOY_MEANS",
    "TOY_COV",
    "ADULT_N_ROWS",
    "ADULT_N_ROWS_CLEAN",
    "GERMAN_N_ROWS",
]

# --------------------------------------------------------------------------------------------
# citations and licence
# --------------------------------------------------------------------------------------------

ADULT_CITATION = """\
@misc{becker1996adult,
  author       = {Becker, Barry and Kohavi, Ronny},
  title        = {{Adult}},
  year         = {1996},
  howpublished = {UCI Machine Learning Repository},
  doi          = {10.24432/C5XW20},
  note         = {Licensed under CC BY 4.0}
}"""

GERMAN_CITATION = """\
@misc{hofmann1994statlog,
  author       = {Hofmann, Hans},
  title        = {{Statlog (German Credit Data)}},
  year         = {1994},
  howpublished = {UCI Machine Learning Repository},
  doi          = {10.24432/C5NC77},
  note         = {Licensed under CC BY 4.0}
}"""

PAPER_CITATION = """\
@inproceedings{blanchet2024stability,
  author    = {Blanchet, Jose and Cui, Peng and Li, Jiajin and Liu, Jiashuo},
  title     = {Stability Evaluation through Distributional Perturbation Analysis},
  booktitle = {Proceedings of the 41st International Conference on Machine Learning (ICML)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {235},
  year      = {2024}
}"""

LICENSE_NOTICE = (
    "The Adult data set (Becker & Kohavi 1996, https://doi.org/10.24432/C5XW20) and the "
    "Statlog (German Credit Data) data set (Hofmann 1994, https://doi.org/10.24432/C5NC77) "
    "are from the UCI Machine Learning Repository and are licensed under the Creative Commons "
    "Attribution 4.0 International licence (CC BY 4.0, "
    "https://creativecommons.org/licenses/by/4.0/). The files bundled with otstab are the "
    "original UCI files, gzip-compressed; the loaders' preprocessing (dropping rows with "
    "missing values, one-hot encoding, standardisation, relabelling German credit codes with "
    "readable names) is a modification of the data."
)


def citation(name: str | None = None) -> str:
    """BibTeX to cite for a data set.

    Parameters
    ----------
    name : {"adult", "german", "toy", "paper"} or None
        ``None`` returns all entries (the two data sets and the paper), separated by blank
        lines.  ``"toy"`` and ``"paper"`` give the paper (Blanchet, Cui, Li & Liu, ICML 2024),
        whose Section 3 defines the toy example of :func:`make_toy`.
    """
    entries = {
        "adult": ADULT_CITATION,
        "german": GERMAN_CITATION,
        "toy": PAPER_CITATION,
        "paper": PAPER_CITATION,
    }
    if name is None:
        return "\n\n".join([ADULT_CITATION, GERMAN_CITATION, PAPER_CITATION])
    if not isinstance(name, str) or name.lower() not in entries:
        raise ValidationError(
            f"name must be one of {sorted(entries)} or None, got {name!r}"
        )
    return entries[name.lower()]


def license_text() -> str:
    """The full licence notice bundled with the data (``otstab/datasets/LICENSE``)."""
    return resources.files(__name__).joinpath("LICENSE").read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# bundled files
# --------------------------------------------------------------------------------------------

#: SHA-256 of the *uncompressed* bundled files; equal to the UCI originals.
_SHA256 = {
    "adult.data.gz": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult.test.gz": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    "german.data.gz": "b21f3d81db8071257d5ff1deaeba1fd4303b62712e6fcc9715c7a86202cb5871",
    "german_values_maps.json": "73a48f120cdb8019fb9f0ad84078ef1ba109f1100bbcc6cbcf925d60e6adcd4e",
}


def _data_file(name: str):
    """The bundled file ``data/<name>`` as an importlib.resources Traversable (in the package)."""
    return resources.files(__name__).joinpath("data").joinpath(name)


def _read_bytes(name: str) -> bytes:
    """Uncompressed content of a bundled data file (every loader reads through here)."""
    raw = _data_file(name).read_bytes()
    return gzip.decompress(raw) if name.endswith(".gz") else raw


def _verify_checksums() -> dict[str, bool]:
    """Whether each bundled file still matches the UCI original (used by the tests)."""
    return {
        name: hashlib.sha256(_read_bytes(name)).hexdigest() == digest
        for name, digest in _SHA256.items()
    }


def _clear_caches() -> None:
    """Forget the parsed tables (the next load reads the bundled files again)."""
    for fn in (_adult_table, _adult_encoded, _german_table, _german_encoded):
        fn.cache_clear()


# --------------------------------------------------------------------------------------------
# shared encoding
# --------------------------------------------------------------------------------------------

_SEP = ": "


def _encode(
    raw: pd.DataFrame, target: str, categorical: dict[str, list[str]], numeric: list[str]
) -> pd.DataFrame:
    """One-hot (all levels, given order) + standardise (ddof=0), in the raw column order."""
    blocks: dict[str, np.ndarray] = {}
    stats: dict[str, dict[str, float]] = {}
    for col in raw.columns:
        if col == target:
            continue
        if col in numeric:
            x = raw[col].to_numpy(dtype=np.float64)
            mean, std = float(x.mean()), float(x.std())
            if std == 0.0:  # pragma: no cover - not the case for the bundled data
                std = 1.0
            blocks[col] = (x - mean) / std
            stats[col] = {"mean": mean, "std": std}
        elif col in categorical:
            values = raw[col].to_numpy(dtype=object)
            for level in categorical[col]:
                blocks[f"{col}{_SEP}{level}"] = (values == level).astype(np.float64)
    out = pd.DataFrame(blocks, index=raw.index)
    out[target] = raw[target].to_numpy(dtype=np.int64)
    out.attrs["standardization"] = stats
    return out


# --------------------------------------------------------------------------------------------
# Adult
# --------------------------------------------------------------------------------------------

ADULT_N_ROWS = 48_842  #: rows of adult.data + adult.test
ADULT_N_ROWS_CLEAN = 45_222  #: rows without a missing value

_ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
]
_ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss",
                  "hours-per-week"]
_ADULT_DROPPED = ["fnlwgt", "education"]  # from the encoded frame only; see load_adult


def _read_adult_file(name: str, skiprows: int) -> pd.DataFrame:
    return pd.read_csv(
        io.BytesIO(_read_bytes(name)),
        header=None,
        names=_ADULT_COLUMNS,
        skiprows=skiprows,
        skipinitialspace=True,
        na_values=["?"],
        keep_default_na=False,
        dtype={c: "int64" for c in _ADULT_NUMERIC},
        engine="c",
    )


@functools.lru_cache(maxsize=2)
def _adult_table(drop_missing: bool) -> pd.DataFrame:
    train = _read_adult_file("adult.data.gz", skiprows=0)
    # adult.test starts with a junk line ("|1x3 Cross validator") and its labels end in "."
    test = _read_adult_file("adult.test.gz", skiprows=1)
    df = pd.concat([train, test], ignore_index=True)
    if len(df) != ADULT_N_ROWS:  # pragma: no cover - guards against a corrupted install
        raise RuntimeError(f"bundled Adult data has {len(df)} rows, expected {ADULT_N_ROWS}")
    label = df["income"].astype(str).str.strip().str.rstrip(".")
    unknown = set(label.unique()) - {">50K", "<=50K"}
    if unknown:  # pragma: no cover
        raise RuntimeError(f"unexpected income labels in bundled Adult data: {unknown}")
    df["income"] = (label == ">50K").astype(np.int64)
    if drop_missing:
        df = df.dropna(axis=0, how="any")
    return df


@functools.lru_cache(maxsize=1)
def _adult_encoded() -> pd.DataFrame:
    raw = _adult_table(True).drop(columns=_ADULT_DROPPED)
    numeric = [c for c in _ADULT_NUMERIC if c in raw.columns]
    categorical = {
        c: sorted(raw[c].unique().tolist())
        for c in raw.columns
        if c not in numeric and c != "income"
    }
    return _encode(raw, "income", categorical, numeric)


def load_adult(*, raw: bool = False, drop_missing: bool = True) -> pd.DataFrame:
    """The UCI Adult census-income data (``adult.data`` + ``adult.test``), bundled.

    Parameters
    ----------
    raw : bool, default False
        ``False``: the model-ready frame (one-hot categoricals, standardised numerics, all
        features ``float64``).  ``True``: the cleaned but unencoded frame with every original
        attribute (strings for categoricals, numbers on their original scales), same rows,
        row order and index as the encoded frame -- take group labels such as ``race`` and
        ``sex`` from it.
    drop_missing : bool, default True
        Drop the rows with a missing value (``"?"`` in workclass, occupation or
        native-country): 48,842 rows become 45,222.  ``False`` (only with ``raw=True``)
        keeps all 48,842 rows with ``NaN`` for the missing values.

    Returns
    -------
    pandas.DataFrame
        Target column ``income`` (last, ``int64``): 1 if income > 50K, else 0; about 24.8 %
        of the cleaned rows are 1 (23.9 % before dropping missing values).  The index is the
        row's position in ``adult.data`` followed by ``adult.test`` (0..48,841; rows
        0..32,560 come from ``adult.data``), so it has gaps after dropping missing values.

        With ``raw=False``:

        * ``fnlwgt`` is dropped: it is the Census Bureau's sampling weight (how many people the
          record stands for), not an attribute of the person; use ``raw=True`` to get it, e.g.
          as sample weights;
        * ``education`` (16 strings) is dropped and ``education-num`` (its 1..16 ordinal code,
          one-to-one with it) is kept as a numeric feature;
        * numerics (``age``, ``education-num``, ``capital-gain``, ``capital-loss``,
          ``hours-per-week``) are standardised over the returned rows (``ddof=0``); the means
          and standard deviations are in ``df.attrs["standardization"]``;
        * categoricals (``workclass``, ``marital-status``, ``occupation``, ``relationship``,
          ``race``, ``sex``, ``native-country``) are one-hot encoded with all levels kept,
          levels in alphabetical order, columns named like ``"race: Amer-Indian-Eskimo"``
          and ``"sex: Female"``; :func:`feature_groups` maps each variable to its block.

    Notes
    -----
    The frames are parsed once and cached; each call returns a fresh copy, so mutating it does
    not affect later calls.  Cite with ``citation("adult")``; licence CC BY 4.0.
    """
    if drop_missing not in (True, False):
        raise ValidationError(f"drop_missing must be True or False, got {drop_missing!r}")
    if raw not in (True, False):
        raise ValidationError(f"raw must be True or False, got {raw!r}")
    if raw:
        return _adult_table(bool(drop_missing)).copy(deep=True)
    if not drop_missing:
        raise ValidationError(
            "drop_missing=False is only supported with raw=True (the encoded frame is defined "
            "on the rows without missing values)"
        )
    return _copy(_adult_encoded())


# --------------------------------------------------------------------------------------------
# German credit
# --------------------------------------------------------------------------------------------

GERMAN_N_ROWS = 1_000

# Column names follow the UCI documentation (german.doc) attribute order, in the snake_case
# conventions of Groemping (2019); the second element is the key of the code in the bundled
# values_maps.json (None for numeric attributes).
_GERMAN_COLUMNS: list[tuple[str, str | None]] = [
    ("status", "status"),  # status of existing checking account
    ("duration", None),  # months
    ("credit_history", "credit_history"),
    ("purpose", "purpose"),
    ("amount", None),  # credit amount, DM
    ("savings", "savings"),  # savings account / bonds
    ("employment_duration", "present_employment"),  # present employment since
    ("installment_rate", None),  # instalment in % of disposable income, 1..4
    ("personal_status_sex", "status_sex"),
    ("other_debtors", "other_debtors"),  # other debtors / guarantors
    ("present_residence", None),  # present residence since, 1..4
    ("property", "property"),
    ("age", None),  # years
    ("other_installment_plans", "installment_plans"),
    ("housing", "housing"),
    ("number_credits", None),  # existing credits at this bank, 1..4
    ("job", "job"),
    ("people_liable", None),  # people liable to provide maintenance for, 1..2
    ("telephone", "telephone"),
    ("foreign_worker", "foreign_worker"),
    ("credit", "credit"),  # 1 = good, 2 = bad in the file
]
_GERMAN_NUMERIC = [name for name, key in _GERMAN_COLUMNS if key is None]


def _german_value_maps() -> dict[str, dict[str, str]]:
    """Code -> readable level for each categorical column (booleans become "yes"/"no")."""
    maps = json.loads(_read_bytes("german_values_maps.json").decode("utf-8"))
    out: dict[str, dict[str, str]] = {}
    for name, key in _GERMAN_COLUMNS:
        if key is None or name == "credit":
            continue
        out[name] = {
            code: ("yes" if value else "no") if isinstance(value, bool) else str(value).strip()
            for code, value in maps[key].items()
        }
    return out


@functools.lru_cache(maxsize=1)
def _german_table() -> pd.DataFrame:
    names = [name for name, _ in _GERMAN_COLUMNS]
    df = pd.read_csv(
        io.BytesIO(_read_bytes("german.data.gz")),
        sep=" ",
        header=None,
        names=names,
        dtype={c: "int64" for c in [*_GERMAN_NUMERIC, "credit"]},
        keep_default_na=False,
        engine="c",
    )
    if len(df) != GERMAN_N_ROWS:  # pragma: no cover
        raise RuntimeError(f"bundled German data has {len(df)} rows, expected {GERMAN_N_ROWS}")
    for col, mapping in _german_value_maps().items():
        unknown = set(df[col].unique()) - set(mapping)
        if unknown:  # pragma: no cover
            raise RuntimeError(f"unexpected codes in German column {col!r}: {unknown}")
        df[col] = df[col].map(mapping)
    df["credit"] = (df["credit"] == 1).astype(np.int64)  # 1 = good, 0 = bad
    return df


@functools.lru_cache(maxsize=1)
def _german_encoded() -> pd.DataFrame:
    raw = _german_table()
    categorical = {}
    for col, mapping in _german_value_maps().items():
        present = set(raw[col].unique())
        # documented (code) order, which is ordinal for status, savings, employment_duration
        categorical[col] = [level for level in mapping.values() if level in present]
    return _encode(raw, "credit", categorical, list(_GERMAN_NUMERIC))


def load_german(*, raw: bool = False) -> pd.DataFrame:
    """The UCI Statlog German credit data (1,000 applicants), bundled.

    Parameters
    ----------
    raw : bool, default False
        ``False``: the model-ready frame (one-hot categoricals, standardised numerics, all
        features ``float64``).  ``True``: the unencoded frame with readable strings for the
        categorical attributes and numbers on their original scales, same rows and index.

    Returns
    -------
    pandas.DataFrame
        1,000 rows (there are no missing values), index 0..999 (row of ``german.data``).  The
        20 attributes are named after the UCI documentation: ``status`` (checking account),
        ``duration`` (months), ``credit_history``, ``purpose``, ``amount`` (DM), ``savings``,
        ``employment_duration``, ``installment_rate``, ``personal_status_sex``,
        ``other_debtors``, ``present_residence``, ``property``, ``age``,
        ``other_installment_plans``, ``housing``, ``number_credits``, ``job``,
        ``people_liable``, ``telephone``, ``foreign_worker``.  Target ``credit`` (last,
        ``int64``): **1 = good, 0 = bad** (the file codes them 1 and 2); 700 good, 300 bad.

        The codes of the file (``A11``, ...) are replaced by the readable levels of the UCI
        documentation, e.g. ``"purpose: car (new)"``, ``"personal_status_sex: female :
        divorced/separated/married"``; ``telephone`` and ``foreign_worker`` are ``"yes"`` /
        ``"no"``.  With ``raw=False`` the seven numeric attributes (``duration``, ``amount``,
        ``installment_rate``, ``present_residence``, ``age``, ``number_credits``,
        ``people_liable``; the ordinal 1..4 ones included) are standardised (``ddof=0``) and
        the 13 categoricals one-hot encoded with all levels kept, in the documented code order
        (levels that never occur -- ``purpose`` "vacation", ``personal_status_sex`` "female :
        single" -- get no column).

    Notes
    -----
    Cached and copied like :func:`load_adult`.  Cite with ``citation("german")``; licence
    CC BY 4.0.
    """
    if raw not in (True, False):
        raise ValidationError(f"raw must be True or False, got {raw!r}")
    if raw:
        return _german_table().copy(deep=True)
    return _copy(_german_encoded())


def _copy(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy(deep=True)
    # attrs are shallow-copied by some pandas versions: give each caller its own dict
    out.attrs = json.loads(json.dumps(df.attrs))
    return out


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def feature_groups(df, *, include_numeric: bool = False) -> dict[str, list[str]]:
    """Map each one-hot encoded variable to its columns.

    A column named ``"<variable>: <level>"`` belongs to group ``<variable>`` (split at the
    first ``": "``), e.g. ``{"race": ["race: Amer-Indian-Eskimo", ..., "race: White"], ...}``.
    Pass the result as ``groups=`` to :func:`otstab.feature_stability` so that a categorical
    variable is scored as one feature.

    Parameters
    ----------
    df : pandas.DataFrame or iterable of str
        A frame from :func:`load_adult` / :func:`load_german` (or its feature part), or its
        column names.
    include_numeric : bool, default False
        Also map every other column (numeric features -- and the target, if present, so pass
        the features only) to a one-element list of itself, giving a partition of the columns.

    Returns
    -------
    dict[str, list[str]]
        Groups in order of first appearance; columns in frame order.
    """
    if isinstance(df, pd.DataFrame):
        columns = list(df.columns)
    elif isinstance(df, (str, bytes)) or not isinstance(df, Iterable):
        raise InputTypeError(
            f"df must be a pandas DataFrame or an iterable of column names, got "
            f"{type(df).__name__}"
        )
    else:
        columns = list(df)
    groups: dict[str, list[str]] = {}
    for col in columns:
        name = str(col)
        if _SEP in name:
            groups.setdefault(name.split(_SEP, 1)[0], []).append(col)
        elif include_numeric:
            if name in groups:
                raise ValidationError(
                    f"df has a column {name!r} that is also the name of a one-hot group"
                )
            groups[name] = [col]
    return groups


@overload
def _check_count(value, name: str) -> int: ...
@overload
def _check_count(value, name: str, *, allow_none: bool) -> int | None: ...
def _check_count(value, name: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InputTypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < 1:
        raise ValidationError(f"{name} must be >= 1, got {value}")
    return int(value)


def train_eval_split(
    df: pd.DataFrame,
    target: str,
    *,
    n_train: int = 2000,
    n_eval: int | None = 2000,
    random_state=0,
):
    """Fixed-seed disjoint training and evaluation samples (the paper's 2,000 + 2,000).

    The rows are permuted with ``numpy.random.default_rng(random_state)``; the first
    ``n_train`` rows of the permutation form the training sample and the next ``n_eval`` the
    evaluation sample, so the two never share a row and the same seed always gives the same
    split (and a larger ``n_eval`` only appends rows).

    Parameters
    ----------
    df : pandas.DataFrame
        E.g. ``load_adult()``.
    target : str
        Name of the label column (``"income"`` for Adult, ``"credit"`` for German).
    n_train, n_eval : int
        Sample sizes; ``n_eval=None`` takes every row not in the training sample.
        ``n_train + n_eval`` must not exceed ``len(df)``.
    random_state : int, numpy.random.Generator or None, default 0
        Seed of the permutation (``None``: fresh entropy, not reproducible).

    Returns
    -------
    X_train, y_train, X_eval, y_eval
        ``X_*`` are DataFrames of every column but ``target``; ``y_*`` are Series.  They keep
        ``df``'s index (so ``load_adult(raw=True).loc[X_eval.index, "race"]`` gives the group
        labels of the evaluation rows), in sampled order.
    """
    if not isinstance(df, pd.DataFrame):
        raise InputTypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    if target not in df.columns:
        raise ValidationError(
            f"target {target!r} is not a column of df (columns: {list(df.columns)[:8]}...)"
        )
    n_train = _check_count(n_train, "n_train")
    n_eval = _check_count(n_eval, "n_eval", allow_none=True)
    n = len(df)
    if n_eval is None:
        if n_train >= n:
            raise ValidationError(
                f"n_train={n_train} leaves no rows for evaluation: df has {n} rows"
            )
        n_eval = n - n_train
    elif n_train + n_eval > n:
        raise ValidationError(
            f"n_train + n_eval = {n_train} + {n_eval} = {n_train + n_eval} exceeds the "
            f"{n} rows of df; lower n_train or n_eval"
        )
    try:
        rng = np.random.default_rng(random_state)
    except (TypeError, ValueError) as exc:
        raise InputTypeError(
            f"random_state must be an int, a numpy Generator or None, got {random_state!r}"
        ) from exc
    order = rng.permutation(n)
    train_pos, eval_pos = order[:n_train], order[n_train:n_train + n_eval]
    X = df.drop(columns=[target])
    y = df[target]
    return (
        X.iloc[train_pos].copy(),
        y.iloc[train_pos].copy(),
        X.iloc[eval_pos].copy(),
        y.iloc[eval_pos].copy(),
    )


# --------------------------------------------------------------------------------------------
# toy example (paper, Section 3)
# --------------------------------------------------------------------------------------------

#: Class means of the toy example: Y = 0 ~ N([2, 2], I), Y = 1 ~ N([-1, -1], I).
TOY_MEANS = ((2.0, 2.0), (-1.0, -1.0))
#: Common covariance of both classes (the identity I_2).
TOY_COV = ((1.0, 0.0), (0.0, 1.0))


def make_toy(n_per_class: int = 100, *, random_state=0):
    """The 2-D Gaussian toy of the paper's Section 3 (two classes, logistic-regression demo).

    ``n_per_class`` samples with label 0 from ``N([2, 2], I_2)`` followed by ``n_per_class``
    samples with label 1 from ``N([-1, -1], I_2)`` (the paper uses 100 per class).

    Parameters
    ----------
    n_per_class : int, default 100
    random_state : int, numpy.random.Generator or None, default 0
        Seed of ``numpy.random.default_rng``; the same seed gives the same data.

    Returns
    -------
    X : numpy.ndarray, shape (2 * n_per_class, 2), float64
    y : numpy.ndarray, shape (2 * n_per_class,), int64
        Labels in {0, 1} (scikit-learn convention; use ``2 * y - 1`` for {-1, +1}); the first
        ``n_per_class`` rows are class 0.

    Notes
    -----
    The class-1 mean is taken as ``[-1, -1]``.  Plain-text extractions of the paper lose the
    minus signs (``N([ 1, 1]T, I2)``); ``[-1, -1]`` is the reading consistent with the
    paper's reported original error rate of 1 % for logistic regression on these data (it
    gives about 1.7 % in-sample on average, whereas ``[-1, 1]`` would give about 6 %).
    """
    n = _check_count(n_per_class, "n_per_class")
    try:
        rng = np.random.default_rng(random_state)
    except (TypeError, ValueError) as exc:
        raise InputTypeError(
            f"random_state must be an int, a numpy Generator or None, got {random_state!r}"
        ) from exc
    chol = np.linalg.cholesky(np.asarray(TOY_COV, dtype=np.float64))
    X = np.vstack([np.asarray(mean) + rng.standard_normal((n, 2)) @ chol.T for mean in TOY_MEANS])
    y = np.repeat(np.arange(len(TOY_MEANS), dtype=np.int64), n)
    return X.astype(np.float64, copy=False), y
