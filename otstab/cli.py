"""The ``otstab`` command line: ``demo``, ``certify`` and ``verify``.

Exit codes: 0 success (and, with ``certify --fail-under``, the gate passed); 1 ``verify`` found
a mismatch (the reasons are printed); 2 bad input (a one-line message naming the argument, no
traceback); 3 the solvers found no trustworthy answer (:class:`otstab.errors.SolverError`); 4
an unexpected internal error (run with ``--debug`` for the traceback); 5 below the threshold of
``--fail-under`` (the gated value is proven below it); 6 not certified (the answer is not exact
and cannot prove the gate either way, or ``--require-exact`` and the answer is not exact, or
the confidence bound asked for is not available). See :func:`gate` and docs/ci_gating.md.

``certify --feature-costs 'age=inf,duration=2'`` (or a JSON object or file;
:func:`parse_feature_costs`) passes per-feature move prices to ``certify`` and
``feature_stability``; ``--sample-weight COL`` takes the rows' weights from a column of DATA
(:func:`split_weights`). Both reach the certificate: the prices as ``inputs.feature_costs``,
the weights by fingerprint as ``inputs.sample_weight`` (with ``source`` = COL). ``verify``
reads the prices from the certificate and the weights from the column of DATA that
``--sample-weight`` names (default: the certificate's ``inputs.sample_weight.source``).

``certify --cost auto|encoded``, ``--cost-file SPEC.json`` (a ``DataCost.to_dict()`` as JSON;
:func:`otstab.certificate.read_cost_file`) and ``--immutable a,b`` (:func:`data_cost`) certify
under a cost on the data's own variables; the certificate stores the resolved spec
(``inputs.cost``) and ``verify`` recomputes under it (``verify --cost-file`` also requires it to
be that file's).

Models are loaded with skops (``.skops`` files, when skops is installed: only the types skops
trusts, unless ``--trust-model``) or with joblib/pickle (any other file). Unpickling runs code
stored in the file, so ``certify`` and ``verify`` load a pickle or joblib file only with
``--trust-model``: pass it for a model you saved yourself, never for someone else's file.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .scale import read_parquet_dir

__all__ = ["main", "build_parser", "load_model", "load_data", "parse_feature_costs",
           "split_weights", "auto_groups", "gate", "EXIT_OK",
           "EXIT_MISMATCH", "EXIT_BAD_INPUT", "EXIT_SOLVER", "EXIT_INTERNAL", "EXIT_BELOW",
           "EXIT_NOT_CERTIFIED"]

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_SOLVER = 3
EXIT_INTERNAL = 4
EXIT_BELOW = 5
EXIT_NOT_CERTIFIED = 6

DEMO_R = 0.4
DEMO_THETA1 = 1.0
DEMO_THETA2 = 0.25


class BadInput(Exception):
    """A user mistake; ``arg`` names the command-line argument at fault."""

    def __init__(self, arg: str | None, message: str, prog: str | None = None):
        super().__init__(message)
        self.arg = arg
        self.message = message
        self.prog = prog

    def line(self, prog: str) -> str:
        where = f"argument {self.arg}: " if self.arg else ""
        return f"{self.prog or prog}: error: {where}{_one_line(self.message)}"


#: characters of an error message printed (then an ellipsis): a message may quote a hostile
#: input, which must not be echoed whole
MESSAGE_CHARS = 4000


def _one_line(message) -> str:
    """``message`` on one line, cut to :data:`MESSAGE_CHARS` characters."""
    text = str(message)
    cut = len(text) > MESSAGE_CHARS
    text = " ".join(text[:MESSAGE_CHARS].split())
    return text + "..." if cut else text


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors become :class:`BadInput` (one line, exit 2)."""

    def error(self, message):  # noqa: D401 - argparse API
        raise BadInput(None, f"{message} (see {self.prog} --help)", prog=self.prog)


def _number(allow_inf: bool):
    def parse(text: str) -> float:
        t = text.strip().lower()
        if t in ("inf", "+inf", "infinity", "+infinity"):
            if allow_inf:
                return math.inf
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        try:
            v = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number{' or inf' if allow_inf else ''}, got {text!r}") from None
        if math.isnan(v) or (math.isinf(v) and not allow_inf):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return v

    parse.__name__ = "number"
    return parse


def _level(text: str) -> float:
    v = _number(False)(text)
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"expected a confidence level in (0, 1), got {text!r}")
    return v


def _tolerance(text: str) -> float:
    """A verification tolerance: a finite number >= 0."""
    v = _number(False)(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


_tolerance.__name__ = "tolerance"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


# ----------------------------------------------------------------------------------------------
# parser


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``otstab`` command."""
    from . import __version__
    from .core import DIVERGENCES, SOLVERS
    from .losses import LOSS_NAMES

    p = _Parser(
        prog="otstab",
        description="OT stability certificates for ML models (Blanchet, Cui, Li, Liu, ICML "
                    "2024): how much must the data change (moving samples, priced by theta1, "
                    "and reweighting them, priced by theta2) before the model's risk reaches "
                    "r?",
        epilog="Exit codes: 0 ok (gate passed), 1 verification mismatch, 2 bad input, 3 solver "
               "failure, 4 internal error, 5 below the --fail-under threshold, 6 not certified "
               "(not exact and the gate cannot be proven, or --require-exact).",
    )
    p.add_argument("--version", action="version", version=f"otstab {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="show the Python traceback of unexpected errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser(
        "demo", help="certify a logistic regression on the bundled Adult data",
        description="Fit a logistic regression on the bundled UCI Adult data (2,000 training "
                    "and 2,000 evaluation rows, seed 0), certify it for the 0/1 loss at "
                    f"r = {DEMO_R} (theta1 = {DEMO_THETA1:g}, theta2 = {DEMO_THETA2:g}), score "
                    "the features (one-hot blocks scored as one variable) and write "
                    "certificate.json, report.html, model.joblib and eval.csv to DIR.")
    demo.add_argument("--out", metavar="DIR", default="otstab-demo",
                      help="output folder (default: ./otstab-demo)")
    demo.add_argument("--r", type=_number(False), default=DEMO_R,
                      help=f"error-rate threshold (default {DEMO_R})")
    demo.add_argument("--top", type=_positive_int, default=10,
                      help="number of features to print (default 10)")
    demo.add_argument("--no-html", action="store_true", help="skip the HTML report")
    demo.add_argument("--quiet", action="store_true", help="print only the output paths")
    _add_debug(demo)

    cert = sub.add_parser(
        "certify", help="certify a saved model on a data file",
        description="Compute the stability criterion R(beta, r) of a saved scikit-learn model "
                    "(or Pipeline) on evaluation data and write a certificate. A pickle/joblib "
                    "MODEL is loaded only with --trust-model (unpickling runs code from the "
                    "file); a .skops MODEL loads safely without it.")
    _add_inputs(cert)
    cert.add_argument("--dask", nargs="?", const="local", default=None, metavar="ADDRESS",
                      help="read DATA (a directory of Parquet files) with Dask, computing "
                           "blockwise; with ADDRESS connect to that distributed scheduler "
                           "(docs/scale.md)")
    cert.add_argument("--loss", default="zero_one",
                      help=f"loss: one of {', '.join(LOSS_NAMES)}, pinball(TAU) or "
                           "epsilon_insensitive(EPS) (default zero_one)")
    cert.add_argument("--r", type=_number(False), required=True,
                      help="risk threshold (for zero_one an error rate in [0, 1])")
    cert.add_argument("--theta1", type=_number(True), default=1.0,
                      help="price of moving samples, > 0 or inf (default 1)")
    cert.add_argument("--theta2", type=_number(True), default=0.25,
                      help="price of reweighting, > 0 or inf (default 0.25)")
    cert.add_argument("--divergence", choices=DIVERGENCES, default="kl",
                      help="reweighting divergence (default kl)")
    cert.add_argument("--solver", choices=SOLVERS, default="auto", help="solver (default auto)")
    cert.add_argument("--movable", nargs="+", metavar="COL", default=None,
                      help="only these features may move (names after the model's "
                           "preprocessing, or indices)")
    cert.add_argument("--feature-costs", metavar="PRICES", default=None,
                      help="per-feature move prices in (0, inf] (inf: immutable): "
                           "'age=inf,duration=2', a JSON object or a JSON file; names are "
                           "the data's raw columns (priced per raw unit) or the model's input "
                           "columns, integers are column indices")
    cert.add_argument("--sample-weight", metavar="COL", default=None,
                      help="column of DATA holding the rows' weights (survey weights); it is "
                           "removed from the features")
    cert.add_argument("--time-budget", type=_tolerance, default=None, metavar="SECONDS",
                      help="tree ensembles (zero_one): stop the certified lower bound's "
                           "branch and bound after SECONDS (the certificate records it; "
                           "verify recomputes without it and checks recorded <= recomputed)")
    cert.add_argument("--node-budget", type=_positive_int, default=None, metavar="N",
                      help="tree ensembles (zero_one): at most N boxes in all for the "
                           "certified lower bound (deterministic: verify reproduces it)")
    cert.add_argument("--max-nodes", type=_positive_int, default=None, metavar="N",
                      help="tree ensembles (zero_one): at most N boxes per sample for the "
                           "certified lower bound (default 200)")
    cert.add_argument("--cost", choices=("auto", "encoded"), default=None,
                      help="transport cost: 'encoded' (the default: squared distance in the "
                           "model's input space, the paper's cost) or 'auto' (a DataCost on "
                           "the data's own variables, every kind, scale and level inferred; "
                           "Q* is then a valid data set)")
    cert.add_argument("--cost-file", metavar="SPEC.json", default=None,
                      help="a DataCost spec (otstab.DataCost(...).to_dict() as JSON, e.g. "
                           "versioned next to the model): the cost on the data's own variables")
    cert.add_argument("--immutable", metavar="COLS", default=None,
                      help="comma-separated raw columns that cannot move (e.g. 'age,sex'), "
                           "added to the DataCost (--cost auto unless --cost-file)")
    cert.add_argument("--confidence", type=_level, default=None, metavar="LEVEL",
                      help="confidence level of the sampling interval of R and of its "
                           "one-sided lower bound, recorded in the certificate (default "
                           "0.95); when given, --fail-under gates on that lower confidence "
                           "bound")
    cert.add_argument("--fail-under", type=_number(False), default=None, metavar="VALUE",
                      help="policy threshold: exit 5 when R is proven below VALUE, 6 when "
                           "not certified (a non-exact answer whose certified lower end "
                           "value_lower is below VALUE while its upper end is not); gates on "
                           "value_lower for non-exact answers and on the lower confidence "
                           "bound with --confidence")
    cert.add_argument("--require-exact", action="store_true",
                      help="exit 6 (not certified) unless the answer is exact (status "
                           "optimal, zero or unreachable; not 'bounds')")
    cert.add_argument("--title", default=None, help="title of the HTML report")
    cert.add_argument("--pdf", metavar="OUT",
                      help="also print the HTML report to PDF with headless Chromium")
    cert.add_argument("--card", metavar="OUT",
                      help="write a model-card summary for governance tooling (.json or .md; "
                           "'-' for JSON on stdout)")
    cert.add_argument("--qstar-raw", metavar="OUT",
                      help="write Q* in the data's raw columns and units (.csv or .parquet; "
                           "res.to_frame(raw=True))")
    cert.add_argument("--bootstrap", type=_positive_int, default=None, metavar="N",
                      help="estimate the sampling uncertainty with N bootstrap replicates "
                           "(seed 0) instead of the influence function")
    cert.add_argument("--features", action="store_true",
                      help="also score every feature's stability (feature_stability)")
    cert.add_argument("--groups", choices=("auto", "none"), default="auto",
                      help="with --features: score each one-hot block (columns named "
                           "'variable: level', or a Pipeline's OneHotEncoder outputs) as one "
                           "feature (auto, the default) or every column alone (none)")
    cert.add_argument("--top", type=_positive_int, default=10,
                      help="number of features to print (default 10)")
    cert.add_argument("--json", metavar="OUT",
                      help="write the certificate (JSON) here; '-' prints it on stdout (the "
                           "other messages then go to stderr)")
    cert.add_argument("--html", metavar="OUT", help="write an HTML report here")
    cert.add_argument("--grid", action="store_true",
                      help="with --html: add the corruption/reweighting split over theta and "
                           "R against r (about 18 more certifications)")
    cert.add_argument("--qstar", metavar="OUT",
                      help="write the most sensitive distribution Q* (.csv or .parquet)")
    cert.add_argument("--quiet", action="store_true",
                      help="print nothing on success (errors and a failed gate still go to "
                           "stderr)")
    _add_debug(cert)

    ver = sub.add_parser(
        "verify", help="recompute a certificate and compare",
        description="Recompute a certificate from the model and the data and check every "
                    "field: the data and model blocks against DATA and MODEL, every figure of "
                    "the results against a new certify run (and the feature table against a "
                    "new feature_stability run) within the tolerances, the fields that follow "
                    "from others (gap, excess risk, ranks) for consistency, and with --qstar "
                    "every column of the Q* file; timings, versions and the creation time are "
                    "informational (docs/guarantees.md). Exit 0 when everything reproduces, 1 "
                    "with the reasons when not. A pickle/joblib MODEL is loaded only with "
                    "--trust-model (unpickling runs code from the file).")
    ver.add_argument("certificate", metavar="CERT.json", help="the certificate file")
    _add_inputs(ver, target_required=False)
    ver.add_argument("--qstar", metavar="FILE",
                     help="also audit this Q* file (cost, risk and mass recomputed)")
    ver.add_argument("--sample-weight", metavar="COL", default=None,
                     help="column of DATA holding the rows' weights of a weighted certificate "
                          "(default: the column it records, inputs.sample_weight.source); it "
                          "is removed from the features")
    ver.add_argument("--cost-file", metavar="SPEC.json", default=None,
                     help="also require the certificate's cost spec (inputs.cost, which verify "
                          "always recomputes under) to be this DataCost spec file's, resolved "
                          "on MODEL and DATA")
    ver.add_argument("--rtol", type=_tolerance, default=None,
                     help="relative tolerance for the figures, >= 0 (default 1e-6)")
    ver.add_argument("--atol", type=_tolerance, default=None,
                     help="absolute tolerance for the figures, >= 0 (default 1e-9)")
    ver.add_argument("--h-rtol", type=_tolerance, default=None,
                     help="relative tolerance for the dual multipliers, >= 0 (default 1e-5)")
    ver.add_argument("--gap-tol", type=_tolerance, default=None,
                     help="largest accepted primal-dual gap, >= 0 (default 1e-5)")
    ver.add_argument("--no-features", action="store_true",
                     help="do not recompute the feature-stability scores")
    ver.add_argument("--json", action="store_true",
                     help="print the verification report as JSON on stdout (ok, checked, "
                          "mismatches, notes, tolerances); the exit code is unchanged")
    _add_debug(ver)
    return p


def _add_debug(p) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the Python traceback of unexpected errors")


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


def _add_inputs(p, *, target_required=True) -> None:
    p.add_argument("--model", required=True, metavar="MODEL",
                   help="fitted scikit-learn estimator or Pipeline saved with skops (.skops, "
                        "loaded safely) or joblib/pickle (.joblib, .pkl: needs "
                        "--trust-model)")
    p.add_argument("--data", required=True, metavar="DATA",
                   help="evaluation data: .csv, .csv.gz, .tsv or .parquet with a header row")
    p.add_argument("--target", required=target_required, metavar="COL",
                   help="label column of DATA" + (
                       "" if target_required else " (default: the certificate's)"))
    p.add_argument("--trust-model", action="store_true",
                   help="allow loading a pickle/joblib MODEL, which runs code stored in the "
                        "file: pass it only for a file you trust (e.g. a model you saved "
                        "yourself); for a .skops MODEL, also trust the types skops does not "
                        "know")


# ----------------------------------------------------------------------------------------------
# inputs


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


def _verify_command(cert, model, data, target, sample_weight=None) -> str:
    """The ``otstab verify`` command line that reproduces a certificate (``sample_weight``:
    the weight column of DATA, for a weighted certificate)."""
    import shlex

    trust = "" if Path(str(model)).suffix.lower() in SKOPS_SUFFIXES else " --trust-model"
    q = [shlex.quote(str(v)) for v in (cert, model, data, target)]
    weights = "" if sample_weight is None else f" --sample-weight {shlex.quote(sample_weight)}"
    return (f"otstab verify {q[0]} --model {q[1]} --data {q[2]} --target {q[3]}{weights}"
            f"{trust}")


def load_data(path, target):
    """Read DATA and split off the target column; raise BadInput naming --data / --target.

    The feature columns are returned in the file's order; they are matched by name to the
    model's ``feature_names_in_`` when certifying (as in the Python API), so a file with the
    model's columns in another order gives the same answer and a missing or unexpected column
    is refused. Duplicate header names, which pandas would silently rename (``a``, ``a.1``),
    are refused here.
    """
    import pandas as pd

    from .certificate import read_table
    from .errors import ValidationError

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
    from .certificate import read_cost_file
    from .datacost import DataCost
    from .errors import ValidationError

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
    from .errors import OtstabError

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
    from .pipeline import auto_groups as _auto

    return _auto(model, [str(n) for n in names])


#: exit code of each outcome of :func:`otstab.report.policy_gate`
GATE_EXIT = {"pass": EXIT_OK, "below": EXIT_BELOW, "not_certified": EXIT_NOT_CERTIFIED}


def gate(result, fail_under=None, *, require_exact=False, confidence=None) -> dict:
    """:func:`otstab.report.policy_gate` with the exit code of its outcome (``exit_code``)."""
    from .report import policy_gate

    verdict = policy_gate(result, fail_under, require_exact=require_exact,
                          confidence=confidence, interface="cli")
    return {**verdict, "exit_code": GATE_EXIT[verdict["outcome"]]}


def _run_library(fn, *args, **kwargs):
    """Call into the library, turning user mistakes into BadInput."""
    from .errors import SolverError

    try:
        return fn(*args, **kwargs)
    except SolverError:
        raise
    except (ValueError, TypeError) as exc:
        from .errors import OtstabError, SolverNotAvailableError

        if isinstance(exc, (OtstabError, SolverNotAvailableError)):
            raise BadInput(_arg_for(str(exc)), str(exc)) from None
        raise


# ----------------------------------------------------------------------------------------------
# commands


def _print_features(table, top, out) -> None:
    t = table.head(top)
    width = max([len(str(f)) for f in t["feature"]] + [7])
    print(f"  {'rank':>4}  {'feature':<{width}}  {'score':>10}  {'moving':>6}", file=out)
    for rec in t.to_dict(orient="records"):
        sm = rec.get("share_moving", math.nan)
        sm_txt = f"{sm:6.0%}" if isinstance(sm, float) and math.isfinite(sm) else "     -"
        print(f"  {rec.get('rank', ''):>4}  {str(rec['feature']):<{width}}  "
              f"{float(rec['score']):10.4g}  {sm_txt}", file=out)


def _report_grids(model, X, y, result):
    """Theta-split grid and R-against-r curve for the report (zero_one / fast paths), under
    the result's own cost (its resolved DataCost spec, else the encoded cost)."""
    from . import plot as _plot

    cost = (result.info.get("cost") if isinstance(result.info, dict) else None) or "encoded"
    total = (0.0 if math.isinf(result.theta1) else 1 / result.theta1) + (
        0.0 if math.isinf(result.theta2) else 1 / result.theta2)
    grid = None
    if total > 0:
        grid = _plot.decomposition_grid(model, X, y, loss=result.loss, r=result.r, total=total,
                                        divergence=result.divergence, cost=cost)
    base, r = result.risk_base, result.r
    steps = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    r_grid = [base + (r - base) * s for s in steps] if r > base else [r]
    if result.loss == "zero_one":
        r_grid = [v for v in r_grid if v <= 1.0]
    curve = _plot.value_curve(model, X, y, loss=result.loss, r=r_grid, theta1=result.theta1,
                              theta2=result.theta2, divergence=result.divergence, cost=cost)
    return grid, curve


def _cmd_demo(args) -> int:
    import joblib
    from sklearn.linear_model import LogisticRegression

    from . import certify, feature_stability
    from .certificate import make_certificate, write_certificate
    from .datasets import feature_groups, load_adult, train_eval_split
    from .report import write_report

    t0 = time.perf_counter()
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput("--out", f"cannot create folder {str(out)!r}: {exc.strerror}") from None
    say = (lambda *a: None) if args.quiet else print
    df = load_adult()
    X_train, y_train, X_eval, y_eval = train_eval_split(df, "income", n_train=2000,
                                                        n_eval=2000, random_state=0)
    model = LogisticRegression(max_iter=1000).fit(X_train, y_train)
    model_path, data_path = out / "model.joblib", out / "eval.csv"
    joblib.dump(model, model_path)
    X_eval.assign(income=y_eval).to_csv(data_path, index=False)
    # certify the data exactly as `otstab verify` will read them back
    X, y = load_data(data_path, "income")
    say(f"Adult: logistic regression fitted on {len(X_train)} rows; evaluating on {len(X)} "
        f"rows x {X.shape[1]} features.")
    result = _run_library(certify, model, X, y, loss="zero_one", r=args.r, theta1=DEMO_THETA1,
                          theta2=DEMO_THETA2, cost="encoded")
    groups = feature_groups(X)
    table = _run_library(feature_stability, model, X, y, loss="zero_one", r=args.r,
                         theta1=DEMO_THETA1, theta2=DEMO_THETA2,
                         feature_groups=groups, cost="encoded").to_frame()
    cert = make_certificate(result, model, X, y, features=table, groups=groups,
                            target="income", model_file=model_path)
    cert_path = write_certificate(cert, out / "certificate.json")
    verify_cmd = _verify_command(cert_path, model_path, data_path, "income")
    say("")
    say(result.summary())
    say("")
    say(f"Most sensitive features (of {len(table)}; one-hot blocks scored as one variable; "
        "lower score = more sensitive):")
    if not args.quiet:
        _print_features(table, args.top, sys.stdout)
    written = [cert_path, model_path, data_path]
    if not args.no_html:
        grid, curve = _report_grids(model, X, y, result)
        html_path = write_report(out / "report.html", cert, result=result, features=table,
                                 grid=grid, curve=curve, y=y, verify_command=verify_cmd,
                                 title="otstab demo: logistic regression on Adult",
                                 interface="cli")
        written.insert(1, html_path)
    say("")
    for pth in written:
        print(f"wrote {pth}")
    say(f"reproduce with: {verify_cmd}")
    say(f"  (--trust-model lets verify unpickle {model_path}, the model file this demo has just "
        "written; never pass it for a model file from someone else)")
    say(f"done in {time.perf_counter() - t0:.1f} s")
    return EXIT_OK


def _write_frame(frame, path) -> Path:
    path = Path(path)
    if path.name.lower().endswith((".parquet", ".pq")):
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False, float_format="%.17g")
    return path


def _cmd_certify(args) -> int:
    import json

    from . import certify, feature_stability
    from .certificate import make_certificate, validate_certificate, write_certificate, write_qstar
    from .inference import Bootstrap
    from .losses import epsilon_insensitive, pinball
    from .report import _for_interface, model_card, model_card_markdown, write_pdf, write_report

    loss = args.loss
    m = re.fullmatch(r"\s*(pinball|epsilon_insensitive)\(\s*([^)]+)\)\s*", loss)
    if m:
        try:
            val = float(m.group(2))
        except ValueError:
            raise BadInput("--loss", f"cannot read the parameter of {loss!r}") from None
        loss = _run_library(pinball if m.group(1) == "pinball" else epsilon_insensitive, val)
    for opt in ("json", "html", "qstar", "pdf", "card", "qstar_raw"):
        dest = getattr(args, opt)
        if dest is not None and dest != "-" and not Path(dest).parent.exists():
            raise BadInput(f"--{opt.replace('_', '-')}",
                           f"folder {str(Path(dest).parent)!r} does not exist")
    for opt in ("qstar", "qstar_raw"):
        dest = getattr(args, opt)
        if dest and not dest.lower().endswith((".csv", ".csv.gz", ".parquet", ".pq")):
            raise BadInput(f"--{opt.replace('_', '-')}",
                           f"{dest!r} must end in .csv, .csv.gz or .parquet")
    if args.card and args.card != "-" and not args.card.lower().endswith((".json", ".md")):
        raise BadInput("--card", f"{args.card!r} must end in .json or .md (or be '-')")
    if args.json == "-" and args.card == "-":
        raise BadInput("--card", "only one of --json and --card can write to stdout ('-')")
    if args.dask is not None:  # DATA is a directory of Parquet files, read lazily
        _dask_client(args.dask)
        X, y = read_parquet_dir(args.data, args.target)
    else:
        X, y = load_data(args.data, args.target)
    weights = None
    if args.sample_weight is not None:
        if args.dask is not None:
            raise BadInput("--sample-weight", "sample weights are not supported with --dask")
        X, weights = split_weights(X, args.sample_weight)
    costs = None if args.feature_costs is None else parse_feature_costs(args.feature_costs)
    cost, cost_arg = data_cost(args)
    if cost is not None:
        for flag, given in (("--features", args.features), ("--grid", args.grid),
                            ("--dask", args.dask is not None)):
            if given:
                raise BadInput(flag, f"{flag} is computed under the encoded cost and is not "
                                     f"available with a DataCost ({cost_arg}) yet")
    model = load_model(args.model, trust_model=args.trust_model)
    _check_cost(cost, cost_arg, args, model, X)
    movable = None
    if args.movable:
        movable = [int(c) if re.fullmatch(r"-?\d+", c) else c for c in args.movable]
    level = 0.95 if args.confidence is None else args.confidence
    se = "analytic" if args.bootstrap is None else Bootstrap(n_resamples=max(args.bootstrap, 2))
    # the tree bound's budgets: recorded in the certificate's solver_options for verify
    options = {k: getattr(args, k) for k in ("max_nodes", "time_budget", "node_budget")
               if getattr(args, k) is not None}
    result = _run_library(certify, model, X, y, loss=loss, r=args.r, theta1=args.theta1,
                          theta2=args.theta2, divergence=args.divergence, solver=args.solver,
                          features=movable, se=se, feature_costs=costs,
                          sample_weight=weights, cost="encoded" if cost is None else cost,
                          **options)
    # with --json - / --card - stdout carries only that document
    out = sys.stderr if "-" in (args.json, args.card) else sys.stdout
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=out))
    say(_for_interface(result.summary(), "cli"))
    if cost is not None:
        from .certificate import hash_cost

        say(f"  cost on the data's own variables (DataCost, spec fingerprint "
            f"{hash_cost(result.info['cost'])[:12]}):")
        for line in str(result.info.get("cost_description", "")).splitlines():
            say(f"    {line}")
    if math.isfinite(result.value) and result.status == "bounds":
        say(f"  no {level:.0%} confidence bound for the certified side value_lower (the "
            "sampling SE of a non-exact answer is that of the found value value_upper)")
    elif math.isfinite(result.value):
        lcb = result.lower_confidence_bound(level)
        say(f"  with {level:.0%} confidence over evaluation samples, R >= {lcb:.6g}")
    verdict = gate(result, args.fail_under, require_exact=args.require_exact,
                   confidence=args.confidence)
    table, groups = None, None
    if args.features:
        if args.groups == "auto":
            groups = auto_groups(model, result.feature_names)
        table = _run_library(feature_stability, model, X, y, loss=loss, r=args.r,
                             theta1=args.theta1, theta2=args.theta2,
                             divergence=args.divergence, feature_groups=groups,
                             feature_costs=costs, sample_weight=weights, cost="encoded",
                             **options).to_frame()
        say(f"\nMost sensitive features (of {len(table)}; lower score = more sensitive):")
        if not args.quiet:
            _print_features(table, args.top, out)
    qinfo = write_qstar(result, args.qstar) if args.qstar else None
    written = []
    if args.qstar:
        written.append(Path(args.qstar))
    if args.qstar_raw:
        written.append(_write_frame(_run_library(result.to_frame, raw=True), args.qstar_raw))
    policy = None if args.fail_under is None and not args.require_exact else verdict
    cert: Any = None  # made when one of the outputs below needs it
    if args.json or args.html or args.pdf or args.card:
        cert = _run_library(make_certificate, result, model, X, y, features=table,
                            groups=groups, movable=movable, target=args.target,
                            model_file=args.model, qstar=qinfo, solver=args.solver, loss=loss,
                            solver_options=options or None, level=level,
                            extra=None if policy is None else {"policy": policy},
                            sample_weight=weights, sample_weight_source=args.sample_weight)
    if args.json == "-":
        validate_certificate(cert)
        print(json.dumps(cert, indent=2, allow_nan=False, ensure_ascii=False))
    elif args.json:
        written.append(write_certificate(cert, args.json))
    if args.html or args.pdf:
        grid = curve = None
        if args.grid:
            grid, curve = _report_grids(model, X, y, result)
        cmd = None
        if args.json and args.json != "-":
            cmd = _verify_command(args.json, args.model, args.data, args.target,
                                  args.sample_weight)
        html_path = Path(args.html) if args.html else Path(args.pdf).with_suffix(".html")
        write_report(html_path, cert, result=result, features=table, grid=grid, curve=curve,
                     verify_command=cmd, title=args.title, y=y, interface="cli")
        if args.html:
            written.append(html_path)
        if args.pdf:
            try:
                written.append(write_pdf(html_path, args.pdf))
            except RuntimeError as exc:
                raise BadInput("--pdf", str(exc)) from None
            finally:
                if not args.html:
                    html_path.unlink(missing_ok=True)
    if args.card:
        card = model_card(cert, verify_command=_verify_command(
            args.json, args.model, args.data, args.target, args.sample_weight)
            if args.json not in (None, "-") else None)
        if args.card == "-":
            print(json.dumps(card, indent=2, allow_nan=False, ensure_ascii=False))
        else:
            path = Path(args.card)
            text = model_card_markdown(card) if path.suffix.lower() == ".md" else \
                json.dumps(card, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
            path.write_text(text, encoding="utf-8")
            written.append(path)
    for pth in written:
        say(f"wrote {pth}")
    if policy is not None:
        if verdict["passed"]:
            say(f"gate passed: {verdict['reason']}")
        else:
            print(f"otstab certify: gate failed (exit {verdict['exit_code']}): "
                  f"{verdict['reason']}", file=sys.stderr)
    return verdict["exit_code"]


def _cmd_verify(args) -> int:
    import json

    from .certificate import read_certificate, verify_certificate
    from .errors import ValidationError

    try:
        cert = read_certificate(args.certificate)
    except ValidationError as exc:
        raise BadInput("CERT", str(exc)) from None
    target = args.target or cert["inputs"]["data"].get("target")
    if not target:
        raise BadInput("--target", "the certificate does not name the label column; pass "
                                   "--target")
    X, y = load_data(args.data, target)
    recorded = cert["inputs"].get("sample_weight")
    column = args.sample_weight or (recorded or {}).get("source")
    if recorded is not None and column is None:
        raise BadInput("--sample-weight", "the certificate was made with sample weights but "
                                          "does not name their column; pass --sample-weight COL")
    weights = None
    if column is not None:
        X, weights = split_weights(X, column)
    model = load_model(args.model, trust_model=args.trust_model)
    if args.qstar is not None and not Path(args.qstar).is_file():
        raise BadInput("--qstar", f"file {args.qstar!r} does not exist")
    expected = None
    if args.cost_file is not None:
        from .certificate import read_cost_file

        try:
            expected = read_cost_file(args.cost_file)
        except ValidationError as exc:
            raise BadInput("--cost-file", str(exc)) from None
    try:
        report = _run_library(
            verify_certificate, cert, model, X, y, rtol=args.rtol, atol=args.atol,
            h_rtol=args.h_rtol, gap_tol=args.gap_tol, check_features=not args.no_features,
            qstar=args.qstar, model_file=args.model, sample_weight=weights, cost=expected)
    except BadInput as exc:
        if expected is not None and str(exc.message).startswith("cost:"):
            raise BadInput("--cost-file", f"{args.cost_file!r}: {exc.message}") from None
        raise
    if args.json:
        print(json.dumps(_report_dict(report, args.certificate), indent=2, allow_nan=False,
                         default=str))
        return EXIT_OK if report.ok else EXIT_MISMATCH
    if report.ok:
        print(report.summary())
        return EXIT_OK
    print(report.summary(), file=sys.stderr)
    return EXIT_MISMATCH


def _report_dict(report, certificate) -> dict:
    """``verify --json``: the verification report as strict JSON."""
    from ._results import jsonable

    res = report.recomputed
    return jsonable({
        "certificate": str(certificate), "ok": bool(report.ok),
        "exit_code": EXIT_OK if report.ok else EXIT_MISMATCH,
        "checked": list(report.checked), "notes": list(report.notes),
        "mismatches": [{"field": m.field, "expected": m.expected, "actual": m.actual,
                        "reason": m.reason} for m in report.mismatches],
        "tolerances": dict(report.tolerances),
        "recomputed": None if res is None else {"value": res.value, "status": res.status,
                                                "gap": res.gap},
    }, strict=True)


_COMMANDS = {"demo": _cmd_demo, "certify": _cmd_certify, "verify": _cmd_verify}


def main(argv=None) -> int:
    """Entry point of the ``otstab`` command; returns the exit code.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name (default ``sys.argv[1:]``).
    """
    from .errors import SolverError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "otstab"
    debug = "--debug" in argv
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_BAD_INPUT
        prog = f"otstab {args.command}"
        return _COMMANDS[args.command](args)
    except BadInput as exc:
        print(exc.line(prog), file=sys.stderr)
        return EXIT_BAD_INPUT
    except SolverError as exc:
        print(f"{prog}: solver failure: {_one_line(exc)}", file=sys.stderr)
        return EXIT_SOLVER
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so in one line unless --debug
        if debug:
            traceback.print_exc()
        else:
            print(f"{prog}: internal error: {type(exc).__name__}: "
                  f"{_one_line(exc)} (run with --debug for the traceback)",
                  file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
