"""Dask support: certificates on evaluation data kept in a distributed engine.

``certify``, ``feature_stability``, ``stability_curve`` and the confidence intervals accept a
``dask.array.Array`` (n, d) or a ``dask.dataframe.DataFrame`` as ``X`` (and a Dask or NumPy
``y``) for linear models (``docs/scale.md``). The package comes to the data:

* one blockwise pass over X computes the model's scores (the only per-row quantity the reduced
  form of a margin, residual or multiclass loss needs: 8 bytes a row for binary models and
  regressors, 8 K for multiclass), checks X for NaN/inf and fingerprints every block
  (``blake2b``); the scores and labels come to the client and the solver runs on them in
  memory, as on a NumPy input;
* X itself stays distributed: :class:`DaskRows` stands in for it in :class:`otstab.models.Problem`
  and gathers only the rows a step asks for (the audit's random sample of atoms, the moved
  rows of a 0/1 certificate), verifying the fingerprint of every block it reads, so that a
  result never silently describes data that changed under it (:class:`DataChangedError`);
* Q* comes back lazily: :func:`qstar` builds it as a Dask DataFrame (moved x, weight, mass and
  source per atom) blockwise from X, :func:`write_qstar` writes it with ``to_parquet``;
  nothing is gathered on the client unless asked (``res.X_star``, ``res.to_frame()`` gather);
* for the distributed path (:mod:`otstab.dask_path`), :func:`prepare_distributed` makes the
  same pass but persists the scores, labels and sample probabilities on the workers instead of
  bringing them to the client.

Dask is imported lazily (``pip install otstab[dask]``); this module sits in the models layer
(it imports only the bottom layer).
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from ..errors import DataChangedError, InputTypeError, ValidationError

__all__ = ["is_dask", "DaskRows", "DataChangedError", "prepare", "prepare_distributed",
           "qstar", "write_qstar", "read_parquet_dir", "block_fingerprint"]

_log = logging.getLogger(__name__)


def is_dask(obj) -> bool:
    """Whether ``obj`` is a Dask collection (checked without importing Dask)."""
    mod = type(obj).__module__ or ""
    return mod.startswith("dask.") or mod.startswith("dask_expr")


def _dask():
    try:
        import dask
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - only without the extra
        raise InputTypeError("Dask input needs the dask extra: pip install 'otstab[dask]'") \
            from exc
    return dask, da


def block_fingerprint(block: np.ndarray) -> str:
    """The blake2b fingerprint of one block of X (float64)."""
    return hashlib.blake2b(np.ascontiguousarray(block).data, digest_size=16).hexdigest()


def _score_block(block, W, b):
    """Scores, fingerprint and first row with NaN/inf, counted within the block (-1: none;
    -2: finite X, scores not) of one block."""
    block = np.asarray(block, dtype=np.float64)
    S = block @ W.T + b
    bad = -1
    if not np.all(np.isfinite(S)):
        rows = np.flatnonzero(~np.all(np.isfinite(block), axis=1))
        bad = int(rows[0]) if rows.size else -2
    return S, block_fingerprint(block), bad


def _raise_bad(bad, lengths):
    """The ValidationError for the blocks' ``bad`` codes of :func:`_score_block` (blocks of
    ``lengths`` rows), naming the first row with NaN or inf; nothing when all are -1."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = [int(starts[k]) + r for k, r in enumerate(bad) if r >= 0]
    if rows:
        raise ValidationError(f"X contains NaN or inf (first in row {min(rows)})")
    if any(r != -1 for r in bad):
        raise ValidationError("the model's scores on X are not finite (overflow?)")


def _true_rows(Xd, lengths):
    """``Xd`` with the row counts its blocks were read with: a Dask array's chunk sizes are
    metadata (``to_dask_array(lengths=...)`` does not validate them, nor can Dask for every
    source), while the rows that offsets, gathers and labels are matched against must be the
    blocks' own."""
    _, da = _dask()
    lengths = tuple(int(m) for m in lengths)
    if lengths == tuple(int(c) for c in Xd.chunks[0]):
        return Xd
    _log.warning(
        "X's chunk sizes %s did not match its blocks' rows %s; the blocks' are used",
        Xd.chunks[0], lengths)
    d = Xd.shape[1]
    return da.concatenate([da.from_delayed(blk, (m, d), dtype=Xd.dtype)
                           for blk, m in zip(Xd.to_delayed().ravel(), lengths)], axis=0)


class DaskRows:
    """A distributed (n, d) float64 matrix standing in for X in a Problem.

    Indexing (a slice or an integer array of rows) gathers those rows to the client and checks
    the fingerprints of the blocks read; ``np.asarray`` gathers everything (only paths that
    need X in memory do this: the bootstrap). ``X @ w`` is a
    blockwise pass.
    """

    def __init__(self, array, fingerprints):
        self.array = array
        self.fingerprints = list(fingerprints)
        self.offsets = np.concatenate([[0], np.cumsum(array.chunks[0])]).astype(np.int64)

    shape = property(lambda self: tuple(int(s) for s in self.array.shape))
    ndim = 2
    dtype = np.dtype(np.float64)
    size = property(lambda self: self.shape[0] * self.shape[1])

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, rows) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed) as a NumPy array, fingerprints checked."""
        dask, _ = _dask()
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = self.shape[0]
        if rows.size and (rows.min() < -n or rows.max() >= n):
            raise IndexError("row index out of range")
        rows = np.where(rows < 0, rows + n, rows)
        blk = np.searchsorted(self.offsets, rows, side="right") - 1
        blocks = np.unique(blk)
        tasks = [dask.delayed(_take_rows)(self.array.blocks[int(k)],
                                          rows[blk == k] - self.offsets[k]) for k in blocks]
        parts = dask.compute(*tasks)
        out = np.empty((rows.size, self.shape[1]))
        for k, (vals, fp) in zip(blocks, parts):
            if fp != self.fingerprints[int(k)]:
                raise DataChangedError(
                    f"the data of block {int(k)} (rows {self.offsets[k]}..."
                    f"{self.offsets[k + 1] - 1}) changed since it was certified; certify again")
            out[blk == k] = vals
        return out

    def __getitem__(self, key):
        if isinstance(key, tuple):
            if len(key) == 2 and key[1] == slice(None):
                key = key[0]
            else:
                raise InputTypeError("DaskRows supports row indexing only")
        if isinstance(key, slice):
            return self.take(np.arange(self.shape[0])[key])
        if isinstance(key, (int, np.integer)):
            return self.take([key])[0]
        key = np.asarray(key)
        if key.dtype == bool:
            key = np.flatnonzero(key)
        return self.take(key)

    def __array__(self, dtype=None, copy=None):
        out = self.take(np.arange(self.shape[0]))
        return out if dtype is None else out.astype(dtype)

    def __matmul__(self, other):
        other = np.asarray(other, dtype=np.float64)
        out = self.array @ other
        return np.asarray(out.compute())

    def __repr__(self) -> str:
        return f"DaskRows(shape={self.shape}, blocks={len(self.fingerprints)})"


def _take_rows(block, local):
    block = np.asarray(block, dtype=np.float64)
    return block[local], block_fingerprint(block)


def as_dask_matrix(X, names_expected=None):
    """A Dask (n, d) float64 array with known chunk sizes and the feature names.

    A Dask DataFrame is matched by column name to ``names_expected`` (the model's
    ``feature_names_in_``) when given, else taken in column order."""
    _, da = _dask()
    if isinstance(X, da.Array):
        if X.ndim != 2:
            raise ValidationError(f"X must be 2-D, got a Dask array of shape {X.shape}")
        if X.dtype.kind not in "biuf":
            raise ValidationError(f"X must be numeric, got dtype {X.dtype}")
        if any(np.isnan(c) for c in X.chunks[0]):
            X = X.compute_chunk_sizes()
        if X.numblocks[1] != 1:
            X = X.rechunk({1: -1})
        names = names_expected or [f"x{j}" for j in range(X.shape[1])]
        if len(names) != X.shape[1]:
            names = [f"x{j}" for j in range(X.shape[1])]
        return X.astype(np.float64), names
    if not hasattr(X, "to_dask_array"):
        raise InputTypeError(f"X of type {type(X).__name__} is not a Dask array or DataFrame")
    cols = [str(c) for c in X.columns]
    if len(set(cols)) != len(cols):
        raise ValidationError("X has duplicate column names")
    if names_expected is not None:
        missing = [c for c in names_expected if c not in cols]
        extra = [c for c in cols if c not in names_expected]
        if missing or extra:
            raise ValidationError(
                f"X's columns do not match the model's features: missing {missing[:10]}, "
                f"unexpected {extra[:10]}")
        X = X[[X.columns[cols.index(c)] for c in names_expected]]
        cols = list(names_expected)
    bad = [c for c, t in zip(cols, X.dtypes) if getattr(t, "kind", "O") not in "biuf"]
    if bad:
        raise ValidationError(f"X has non-numeric columns: {bad[:10]}")
    arr = X.to_dask_array()
    if any(np.isnan(c) for c in arr.chunks[0]):
        arr = arr.compute_chunk_sizes()  # partition lengths: a pass over one column's metadata
    return arr.astype(np.float64), cols


def prepare(X, W, b, names_expected=None):
    """One blockwise pass: ``(DaskRows, feature names, scores)``, scores ``X @ W.T + b`` of
    shape (n,) for one row of ``W`` and (n, K) otherwise. Raises ValidationError naming the
    first row with NaN or inf."""
    dask, da = _dask()
    Xd, names = as_dask_matrix(X, names_expected)
    if Xd.shape[1] != W.shape[1]:
        raise ValidationError(f"X has {Xd.shape[1]} features but the model expects {W.shape[1]}")
    results = dask.compute(*[dask.delayed(_score_block)(blk, W, b)
                             for blk in Xd.to_delayed().ravel()])
    lengths = [p[0].shape[0] for p in results]
    _raise_bad([p[2] for p in results], lengths)
    Xd = _true_rows(Xd, lengths)
    S = np.concatenate([p[0] for p in results]) if results else np.empty((0, W.shape[0]))
    scores = S[:, 0] if W.shape[0] == 1 else S
    return DaskRows(Xd, [p[1] for p in results]), names, np.ascontiguousarray(scores)


def _score_part(block, W, b):
    """(scores of one block as a 1-D array, fingerprint, first bad row within the block, its
    number of rows) for one-row ``W``."""
    S, fp, bad = _score_block(block, W, b)
    return S[:, 0], fp, bad, S.shape[0]


def _part(t, i):
    return t[i]


def _aligned(v, X, name):
    """``v`` (a Dask array or Series, or array-like) as a 1-D Dask array chunked like X's
    rows."""
    _, da = _dask()
    n = X.shape[0]
    if is_dask(v):
        arr = v.to_dask_array(lengths=True) if hasattr(v, "to_dask_array") else v
    else:
        raw = v.to_numpy() if hasattr(v, "to_numpy") else v
        arr = da.from_array(np.asarray(raw), chunks=-1)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise ValidationError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValidationError(f"{name} has {arr.shape[0]} entries but X has {n} rows")
    return arr.rechunk((X.chunks[0],))


def _encode_block(yb, task, classes):
    """Internal labels of one block: +-1 for a binary classifier (NaN for a label unknown to
    the model), the float targets of a regressor (NaN stays NaN)."""
    yb = np.asarray(yb)
    if task == "regression":
        return yb.astype(np.float64)
    pos, neg = yb == classes[1], yb == classes[0]
    return np.where(pos, 1.0, np.where(neg, -1.0, np.nan))


def prepare_distributed(X, y, sample_weight, scorer, names_expected=None):
    """One blockwise pass for the distributed path: ``(DaskRows, names, data)``; ``data`` is a
    (2, n) or (3, n) Dask array chunked like X's rows and **persisted** on the workers, one
    chunk per block of X (so that a block's columns live together): the scores ``X @ w + b``
    (one-row scorers: binary classifiers and regressors), the internal labels (+-1 or targets)
    and, when the rows are weighted (not all equal), the sample probabilities; 8 bytes a row
    each. Nothing of length n comes to the client. Raises ValidationError for NaN/inf in X
    (naming the first row), labels unknown to the model, and bad weights."""
    dask, da = _dask()
    W, b = scorer.W, scorer.b
    if W.shape[0] != 1:
        raise InputTypeError("the distributed path needs a binary classifier or a regressor")
    Xd, names = as_dask_matrix(X, names_expected)
    if Xd.shape[1] != W.shape[1]:
        raise ValidationError(f"X has {Xd.shape[1]} features but the model expects {W.shape[1]}")
    parts = dask.persist(*[dask.delayed(_score_part)(blk, W, b)
                           for blk in Xd.to_delayed().ravel()])
    meta = dask.compute(*[dask.delayed(_part)(p, slice(1, 4)) for p in parts])
    chunks = [m[2] for m in meta]
    _raise_bad([m[1] for m in meta], chunks)
    Xd = _true_rows(Xd, chunks)
    scores = da.concatenate([da.from_delayed(dask.delayed(_part)(p, 0), (m,), dtype=np.float64)
                             for p, m in zip(parts, chunks)]).persist()
    labels = _aligned(y, Xd, "y").map_blocks(_encode_block, scorer.task, scorer.classes,
                                             dtype=np.float64).persist()
    n_bad = int(da.isnan(labels).sum().compute())
    if n_bad:
        known = "" if scorer.task == "regression" else \
            f" or labels unknown to the model (its classes are {list(scorer.classes)})"
        raise ValidationError(f"y contains {n_bad} NaN value(s){known}")
    probs = None
    if sample_weight is not None:
        sw = _aligned(sample_weight, Xd, "sample_weight")
        if sw.dtype.kind not in "iuf":
            raise ValidationError(f"sample_weight must hold numbers, got dtype {sw.dtype}")
        sw = sw.astype(np.float64).persist()
        lo, hi, total, finite = dask.compute(sw.min(), sw.max(), sw.sum(),
                                             da.isfinite(sw).all())
        if not finite:
            raise ValidationError("sample_weight contains NaN or inf")
        if lo < 0:
            raise ValidationError(f"sample_weight must be nonnegative, got {lo}")
        if not total > 0 or not np.isfinite(total):
            raise ValidationError(f"sample_weight must have a positive finite sum, got {total}")
        if lo != hi:
            probs = sw / total
    cols = [scores, labels] + ([] if probs is None else [probs])
    data = da.stack(cols, axis=0).rechunk({0: -1}).persist()
    return DaskRows(Xd, [m[0] for m in meta]), names, data


def as_numpy_labels(y):
    """``y`` (labels, or sample weights) as a NumPy array (a Dask array or Series is
    computed: one n-vector)."""
    if is_dask(y):
        y = y.compute()
    return y


# ---------------------------------------------------------------------------------------------
# Q* as a lazy Dask collection


def qstar(res, *, include_x: bool = False):
    """Q* of a certificate on Dask data as a lazy Dask DataFrame, one row per atom: the moved
    point (columns named as the features), ``weight``, ``mass`` and ``source``; with
    ``include_x`` the original point as well (columns ``<name>_0``).

    Main atoms (one per evaluation row) are built blockwise from X and the result's
    displacement; the few split atoms (a sample whose mass is divided) form one extra
    partition. Nothing is computed until asked (``.compute()``, ``to_parquet``)."""
    import dask.dataframe as dd
    import pandas as pd

    built = res.info.get("qstar")
    if built is not None:  # a distributed result builds Q* from its persisted blocks
        return built(include_x)
    X = res.X
    if not isinstance(X, DaskRows):
        raise InputTypeError("qstar needs a result certified on Dask data")
    move = res.info.get("displacement")
    if move is None:
        raise InputTypeError("this result's path does not describe its moves blockwise")
    dask, _ = _dask()
    n = X.shape[0]
    src = np.asarray(res.source)
    w = np.asarray(res.weights)
    mass = np.asarray(res.mass)
    names = [str(c) for c in res.feature_names]
    cols = names + ([f"{c}_0" for c in names] if include_x else []) + ["weight", "mass",
                                                                        "source"]

    def frame(xblock, atoms):
        delta = move(atoms)
        xs = xblock if delta is None else xblock + delta
        data = {c: xs[:, j] for j, c in enumerate(names)}
        if include_x:
            data.update({f"{c}_0": xblock[:, j] for j, c in enumerate(names)})
        data.update({"weight": w[atoms], "mass": mass[atoms], "source": src[atoms]})
        return pd.DataFrame(data, columns=cols, index=pd.RangeIndex(atoms[0], atoms[-1] + 1)
                            if atoms.size else None)

    parts = []
    for k in range(len(X.fingerprints)):
        s, e = int(X.offsets[k]), int(X.offsets[k + 1])
        parts.append(dask.delayed(_checked_frame)(X.array.blocks[k], X.fingerprints[k], k,
                                                  frame, np.arange(s, e)))
    if src.size > n:  # split atoms
        extra = np.arange(n, src.size)
        parts.append(dask.delayed(frame)(X.take(src[extra]), extra))
    meta = pd.DataFrame({c: pd.Series(dtype=np.float64) for c in cols[:-1]} | {
        "source": pd.Series(dtype=np.int64)}, columns=cols)
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


def _checked_frame(block, fp, k, frame, atoms):
    block = np.asarray(block, dtype=np.float64)
    if block_fingerprint(block) != fp:
        raise DataChangedError(f"the data of block {k} changed since it was certified")
    return frame(block, atoms)


def write_qstar(res, path, **to_parquet_options):
    """Write Q* (see :func:`qstar`) to a directory of Parquet files."""
    include_x = to_parquet_options.pop("include_x", False)
    qstar(res, include_x=include_x).to_parquet(path, **to_parquet_options)
    return path


def read_parquet_dir(path, target, *, columns=None, **read_options):
    """``(X, y)`` from a directory of Parquet files for the CLI's ``--dask``: ``X`` the Dask
    DataFrame of every column but ``target`` (or ``columns``), ``y`` the target column."""
    import dask.dataframe as dd

    df = dd.read_parquet(path, **read_options)
    if target not in df.columns:
        raise ValidationError(f"target column {target!r} is not in {path} "
                              f"(columns: {list(df.columns)[:20]})")
    feats = [c for c in df.columns if c != target] if columns is None else list(columns)
    return df[feats], df[target]
