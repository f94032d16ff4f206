"""Stability certificates as files: a versioned JSON format, its hashes, and verification.

Modules: ``_hashing`` (the fingerprints below), ``_schema`` (the JSON Schema, strict reading
and writing of certificate files, the Q* and cost side files), ``_make``
(:func:`make_certificate`), ``_verify`` (:func:`verify_certificate`, the Q* audit).

A certificate records *what* was certified (a fingerprint of the evaluation data and of the
model, the loss and the parameters ``r``, ``theta1``, ``theta2``, the divergence), *what came
out* (the value ``R(beta, r)``, the dual multiplier ``h``, the audit of the most sensitive
distribution Q*: its cost, its risk, the primal-dual gap, the excess-risk decomposition, and
optionally the feature-stability scores), and *how* (solver, status, timings, package
versions). :func:`verify_certificate` recomputes everything from the model and the data and
reports every field that does not reproduce: each field is recomputed, checked for consistency
with the others, or informational (timestamps, timings, versions), as ``docs/guarantees.md``
lists. Duplicate keys and unknown keys are refused.

Format ``"otstab-certificate"``, version 1; JSON Schema in
``otstab/certificates/schema/certificate.schema.json`` (a copy is ``docs/certificate.schema.json``).
Non-finite numbers are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"`` so the file
is strict JSON.

Fingerprints
------------
``otstab-data-v1`` (:func:`hash_data`): SHA-256 of a byte stream built from length-prefixed
chunks (each chunk is its length as an 8-byte little-endian unsigned integer followed by its
bytes)::

    chunk("otstab-data-v1") chunk("<n>,<d>")
    for every column j of X, in order:  chunk(name_j) chunk(kind_j) chunk(payload_j)
    chunk("label") chunk(kind_y) chunk(payload_y)

``name_j`` is ``str(column)`` for a DataFrame and ``str(j)`` for an array. A column of numbers
or booleans has kind ``"f8"`` and its values as float64 little-endian bytes, with ``-0.0``
written as ``0.0`` and every NaN as the quiet NaN ``0x7ff8000000000000``; any other column has
kind ``"str"`` and the UTF-8 JSON list of ``str(value)``. The index of a DataFrame is not
part of the fingerprint; the column names and their order are. Integer labels 0/1 and float
labels 0.0/1.0 therefore hash alike, so a CSV round trip (read with
``float_precision="round_trip"``) keeps the fingerprint.

``otstab-model-v1`` (:func:`hash_model`): SHA-256 of a canonical, type-tagged serialisation of
the model's state: for an object, its class (``module.QualName``) and its public attributes
(``vars(obj)`` without names starting with ``_``, sorted), recursively; numpy arrays as dtype,
shape and little-endian bytes; lists, tuples, dicts (keys sorted) and scalars tagged by type;
functions and classes by qualified name; PyTorch modules by their ``state_dict()``. For a
scikit-learn estimator this covers the hyper-parameters and the fitted state (``coef_``,
``intercept_``, ``classes_``, a scaler's ``mean_``, a Pipeline's steps, ...), and it is the
same for a model in memory and the same model after a joblib round trip. The SHA-256 of a model
file's bytes is recorded as well (``file_sha256``) but only reported, since saving the same
model again may give other bytes.

``otstab-weights-v1`` (:func:`hash_weights`): the sample weights of a weighted certificate
(``certify(..., sample_weight=w)``), recorded like the data, by fingerprint: SHA-256 of
``chunk("otstab-weights-v1") chunk("<n>") chunk(payload)`` with the payload the caller's
weights (not normalised) as float64 little-endian bytes (``-0.0`` as ``0.0``). The
certificate's ``inputs.sample_weight`` holds the fingerprint, the number of rows, where the
weights came from (``source``, e.g. a column name) and their effective sample size
``(sum w)^2 / sum w^2``; :func:`verify_certificate` needs the same weights to recompute.

Per-feature prices (``certify(..., feature_costs=...)``, :mod:`otstab.costs`) are recorded as
they were solved with: ``inputs.feature_costs`` is the list of prices of the model's input
columns, in order (a raw Pipeline column priced per raw unit appears as its price per unit of
the model's input; ``inf``, immutable, as ``"inf"``), null when every price is 1.
:func:`verify_certificate` passes them to ``certify`` and ``feature_stability``.

A result certified under a :class:`otstab.DataCost` records ``inputs.cost``: the resolved spec
(``DataCost.to_dict()``, every inferred kind, scale, level and bound written out), its
description in plain words, and ``otstab-cost-v1`` (:func:`hash_cost`): SHA-256 of
``chunk("otstab-cost-v1") chunk(json)``, ``json`` the spec as compact UTF-8 JSON with sorted
keys. :func:`verify_certificate` re-certifies under the stored spec and audits Q*'s raw rows
(:func:`raw_qstar_mismatches`); the Q* side file is then the raw frame.
"""

from ._hashing import (
    COST_HASH,
    DATA_HASH,
    MODEL_HASH,
    WEIGHTS_HASH,
    hash_cost,
    hash_data,
    hash_file,
    hash_model,
    hash_weights,
)
from ._make import (
    loss_from_spec,
    make_certificate,
)
from ._schema import (
    FORMAT,
    MAX_CERTIFICATE_BYTES,
    MAX_CERTIFICATE_DEPTH,
    VERSION,
    load_schema,
    read_certificate,
    read_cost_file,
    read_table,
    validate_certificate,
    write_certificate,
    write_qstar,
)
from ._verify import (
    DEFAULT_TOLERANCES,
    Mismatch,
    VerificationReport,
    audit_qstar,
    raw_qstar_mismatches,
    verify_certificate,
)

__all__ = [
    "DATA_HASH",
    "MODEL_HASH",
    "WEIGHTS_HASH",
    "COST_HASH",
    "hash_data",
    "hash_model",
    "hash_weights",
    "hash_file",
    "hash_cost",
    "FORMAT",
    "VERSION",
    "MAX_CERTIFICATE_BYTES",
    "MAX_CERTIFICATE_DEPTH",
    "load_schema",
    "validate_certificate",
    "write_certificate",
    "read_certificate",
    "read_table",
    "write_qstar",
    "read_cost_file",
    "make_certificate",
    "loss_from_spec",
    "DEFAULT_TOLERANCES",
    "verify_certificate",
    "VerificationReport",
    "Mismatch",
    "audit_qstar",
    "raw_qstar_mismatches",
]
