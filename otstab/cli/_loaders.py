"""What the ``otstab`` command reads: models (skops, or joblib/pickle with --trust-model),
data files, feature prices, sample weights, DataCost specs, a Dask scheduler."""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path

from ._parser import BadInput, _number


def _dask_client(address: str):
    """A ``distributed.Client`` for ``--dask ADDRESS``; ``--dask`` alone (``"local"``) uses
    Dask's default scheduler in this process."""
    if address == "local":
        return None
    try:
        from distributed import Client
    except ImportError as exc:  # optional dependency (the dask extra)
        raise BadInput("--dask", "a scheduler address needs distributed: "
                                 "pip install 'otstab[dask]'") from exc
    try:
        return Client(address)
    except (OSError, TimeoutError, ValueError) as exc:
        raise BadInput("--dask", f"cannot connect to the Dask scheduler {address!r}: "
                                 f"{exc}") from exc


#: file names loaded with skops; anything else is unpickled (joblib or pickle)
SKOPS_SUFFIXES = (".skops",)


def load_model(path, *, trust_model: bool = False):
    """Load a fitted model; raise BadInput naming --model (or --trust-model).

    A ``.skops`` file is loaded with ``skops.io``, which refuses types it does not trust
    unless ``trust_model``. Any other file is a pickle (joblib or plain): unpickling runs code
    stored in the file, so it is only opened with ``trust_model``.
    """
    p = Path(path)
    if not p.is_file():
        raise BadInput("--model", f"file {str(path)!r} does not exist")
    if p.suffix.lower() in SKOPS_SUFFIXES:
        model = _load_skops(p, trust_model)
    elif not trust_model:
        raise BadInput("--model", f"{str(path)!r} would be unpickled (joblib/pickle), which "
                                  "runs any code stored in the file; pass --trust-model if "
                                  "you trust it (e.g. a model you saved yourself), or save "
                                  "the model with skops (.skops) to load it safely")
    else:
        model = _unpickle(p)
    if not any(hasattr(model, a) for a in ("predict", "decision_function", "coef_",
                                            "forward")):
        raise BadInput("--model", f"{str(path)!r} holds a {type(model).__name__}, not a "
                                  "fitted model")
    return model


def _load_skops(p: Path, trust_model: bool):
    try:
        import skops.io as sio
    except ImportError:
        raise BadInput("--model", f"{str(p)!r} is a skops file; install skops "
                                  "(pip install skops) to read it") from None
    try:
        untrusted = sio.get_untrusted_types(file=p)
    except Exception as exc:
        raise BadInput("--model", f"cannot load {str(p)!r} with skops: {exc}") from None
    if untrusted and not trust_model:
        raise BadInput("--model", f"{str(p)!r} contains types skops does not trust: "
                                  f"{untrusted[:5]}; pass --trust-model if you trust the file")
    try:
        return sio.load(p, trusted=untrusted or None)
    except Exception as exc:
        raise BadInput("--model", f"cannot load {str(p)!r} with skops: {exc}") from None


def _unpickle(p: Path):
    try:
        import joblib

        load = joblib.load
    except ImportError:
        import pickle

        def load(path):
            with open(path, "rb") as fh:
                return pickle.load(fh)
    try:
        return load(p)
    except Exception as exc:
        raise BadInput("--model", f"{str(p)!r} is not a joblib/pickle file of a model "
                                  f"({type(exc).__name__}: {exc})") from None


def load_data(path, target):
    """Read DATA and split off the target column; raise BadInput naming --data / --target.

    The feature columns are returned in the file's order; they are matched by name to the
    model's ``feature_names_in_`` when certifying (as in the Python API), so a file with the
    model's columns in another order gives the same answer and a missing or unexpected column
    is refused. Duplicate header names, which pandas would silently rename (``a``, ``a.1``),
    are refused here.
    """
    import pandas as pd

    from ..certificates import read_table
    from ..errors import ValidationError

    try:
        df = read_table(path)
    except ValidationError as exc:
        raise BadInput("--data", str(exc)) from None
    lower = str(path).lower()
    if lower.endswith((".csv", ".csv.gz", ".txt", ".tsv")):
        header = pd.read_csv(path, sep="\t" if lower.endswith(".tsv") else ",", header=None,
                             nrows=1, dtype=str, keep_default_na=False)
        names = header.iloc[0].tolist() if len(header) else []
        dup = sorted({c for c in names if names.count(c) > 1})
        if dup:
            raise BadInput("--data", f"{str(path)!r} has duplicate column names: {dup[:10]}")
    if df.shape[0] == 0:
        raise BadInput("--data", f"{str(path)!r} has no rows")
    if target not in df.columns:
        cols = ", ".join(map(str, list(df.columns)[:8]))
        more = ", ..." if df.shape[1] > 8 else ""
        close = difflib.get_close_matches(str(target), [str(c) for c in df.columns], n=3,
                                          cutoff=0.6)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise BadInput("--target", f"column {target!r} is not in {str(path)!r}{hint} "
                                   f"(columns: {cols}{more})")
    if df.shape[1] < 2:
        raise BadInput("--data", f"{str(path)!r} has no feature columns besides {target!r}")
    y = df[target]
    if y.isna().any():
        raise BadInput("--target", f"column {target!r} has missing values (first at row "
                                   f"{int(y.isna().to_numpy().argmax())})")
    return df.drop(columns=[target]), y


_ARG_PATTERNS = [
    (r"^(r |r$|r is|r must|r =|r:|threshold)", "--r"),
    (r"^theta1", "--theta1"),
    (r"^theta2", "--theta2"),
    (r"^divergence", "--divergence"),
    (r"^solver|not installed|not licensed|licen[cs]e", "--solver"),
    (r"^(unknown )?loss|^tau|^eps", "--loss"),
    (r"^features", "--movable"),
    (r"^groups", "--groups"),
    (r"^feature_costs", "--feature-costs"),
    (r"^sample_weight|computed with sample_weight", "--sample-weight"),
    (r"^unknown solver option\(s\) \['max_nodes'", "--max-nodes"),
    (r"^unknown solver option\(s\) \['node_budget'", "--node-budget"),
    (r"^unknown solver option\(s\) \['time_budget'", "--time-budget"),
    (r"^X and y|^X |^X$|^X \(|pipeline's preprocessing", "--data"),
    (r"^y ", "--target"),
    (r"^model|^coef|not supported|is not fitted|^binary classifier|^multi-output", "--model"),
]


def parse_feature_costs(text: str) -> dict:
    """``--feature-costs``: ``'name=price,...'``, a JSON object, or a JSON file holding one.
    Prices are numbers or ``inf``; integer keys are column indices (as ``--movable``)."""
    import json

    text = text.strip()
    if not text.startswith("{") and "=" not in text:
        try:
            text = Path(text).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise BadInput("--feature-costs", f"expected 'name=price,...', a JSON object or "
                                              f"a JSON file; cannot read {text!r}: "
                                              f"{exc.strerror}") from None
    if text.startswith("{"):
        try:
            pairs = json.loads(text)
        except ValueError as exc:
            raise BadInput("--feature-costs", f"not a JSON object: {exc}") from None
        if not isinstance(pairs, dict):
            raise BadInput("--feature-costs", "expected a JSON object {name: price}")
        pairs = list(pairs.items())
    else:
        pairs = []
        for item in filter(None, (t.strip() for t in text.split(","))):
            name, eq, price = item.rpartition("=")
            if not eq or not name.strip():
                raise BadInput("--feature-costs", f"expected name=price, got {item!r}")
            pairs.append((name.strip(), price.strip()))
    out = {}
    for name, price in pairs:
        if isinstance(price, str):
            try:
                price = _number(True)(price)
            except argparse.ArgumentTypeError as exc:
                raise BadInput("--feature-costs", f"{name}: {exc}") from None
        key = int(name) if re.fullmatch(r"-?\d+", str(name)) else str(name)
        if key in out:
            raise BadInput("--feature-costs", f"{name!r} is given twice")
        out[key] = price
    if not out:
        raise BadInput("--feature-costs", "no prices given")
    return out


def split_weights(X, column: str):
    """``--sample-weight``: ``(X without the column, weights)``, the weights a float Series
    named ``column``; rows with a missing weight are refused naming the first."""
    import pandas as pd

    if column not in X.columns:
        cols = ", ".join(map(str, list(X.columns)[:8]))
        raise BadInput("--sample-weight", f"column {column!r} is not in DATA (columns: "
                                          f"{cols}{', ...' if X.shape[1] > 8 else ''})")
    w = pd.to_numeric(X[column], errors="coerce")
    bad = w.isna().to_numpy()
    if bad.any():
        row = int(bad.argmax())
        raise BadInput("--sample-weight", f"column {column!r} has a missing or non-numeric "
                                          f"weight at row {row} ({X[column].iloc[row]!r})")
    if X.shape[1] < 2:
        raise BadInput("--data", f"no feature columns besides {column!r}")
    return X.drop(columns=[column]), w.astype(float)


def data_cost(args):
    """``--cost``, ``--cost-file`` and ``--immutable`` of ``certify``: the ``cost=`` to pass
    (None: the encoded cost, or an :class:`otstab.DataCost`) and the argument it came from.
    A bad spec file is refused naming the file and the field."""
    from ..certificates import read_cost_file
    from ..errors import ValidationError
    from ..modeling._datacost import DataCost

    if args.cost_file is not None and args.cost == "encoded":
        raise BadInput("--cost-file", "a DataCost spec file and --cost encoded contradict each "
                                      "other; give one")
    cost, arg = None, "--cost"
    if args.cost_file is not None:
        try:
            cost = read_cost_file(args.cost_file)
        except ValidationError as exc:
            raise BadInput("--cost-file", str(exc)) from None
        arg = "--cost-file"
    elif args.cost == "auto":
        cost = DataCost()
    if args.immutable is not None:
        names = [c.strip() for c in args.immutable.split(",") if c.strip()]
        if not names:
            raise BadInput("--immutable", "expected comma-separated column names, e.g. "
                                          "'age,sex'")
        if args.cost == "encoded":
            raise BadInput("--immutable", "immutable raw columns need a DataCost (--cost auto "
                                          "or --cost-file); with the encoded cost use "
                                          "--feature-costs 'age=inf'")
        d = (cost or DataCost()).to_dict()
        d["immutable"] = list(dict.fromkeys([*d["immutable"], *names]))
        try:
            cost = DataCost.from_dict(d)
        except ValidationError as exc:
            raise BadInput("--immutable", str(exc)) from None
        arg = arg if args.cost_file is not None else "--immutable"
    return cost, arg


def _check_cost(cost, arg, args, model, X) -> None:
    """Resolve the DataCost on the model and data before any heavy work: an unknown column
    or a field that does not fit a variable is refused naming the argument (and the file)."""
    from ..errors import OtstabError

    if cost is None:
        return
    try:
        cost.resolve(model, X)
    except (OtstabError, ValueError, TypeError) as exc:
        imm = [c.strip() for c in (args.immutable or "").split(",") if c.strip()]
        if imm and str(exc).startswith("immutable") and any(repr(c) in str(exc) for c in imm):
            arg = "--immutable"
        where = f"cost file {args.cost_file!r}: " if arg == "--cost-file" else ""
        raise BadInput(arg, f"{where}{exc}") from None


def _arg_for(message: str) -> str | None:
    for pattern, arg in _ARG_PATTERNS:
        if re.search(pattern, message):
            return arg
    return None


def auto_groups(model, names) -> dict | None:
    """The raw variables of the model's input, to score each as one feature.

    :func:`otstab.pipeline.auto_groups`: a Pipeline's preprocessing (ColumnTransformer,
    OneHotEncoder, OrdinalEncoder, scalers, passthrough) read back to the user's columns,
    named exactly as those columns; without preprocessing, columns named ``"variable:
    level"`` form one variable each.

    Returns
    -------
    dict or None
        ``{variable: [columns]}``, or None when the preprocessing cannot be mapped back.
    """
    from ..modeling._pipeline import auto_groups as _auto

    return _auto(model, [str(n) for n in names])
