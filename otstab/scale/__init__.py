"""Dask input: X and y as Dask collections, fingerprinted blockwise, and Q* written to Parquet.

The bottom of the stack above :mod:`otstab.errors`: the model adapters
(:mod:`otstab.modeling`) read Dask data through it; the distributed dual itself is a solving
path (``otstab/solve/_dask_path.py``). See docs/scale.md.
"""

from ..errors import DataChangedError
from ._data import (
    DaskRows,
    as_dask_matrix,
    as_numpy_labels,
    block_fingerprint,
    is_dask,
    prepare,
    prepare_distributed,
    qstar,
    read_parquet_dir,
    write_qstar,
)

__all__ = ["is_dask", "DaskRows", "DataChangedError", "prepare", "prepare_distributed",
           "qstar", "write_qstar", "read_parquet_dir", "block_fingerprint", "as_dask_matrix",
           "as_numpy_labels"]
