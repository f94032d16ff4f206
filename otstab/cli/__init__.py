"""The ``otstab`` command line (``python -m otstab``): ``demo``, ``certify``, ``verify`` and
``monitor``.

Modules: ``_parser`` (the parser, exit codes), ``_loaders`` (models, data, prices, weights,
costs), ``_commands`` (the commands and :func:`main`), ``_monitor`` (``otstab monitor``). The
top of the stack: it may import every other subpackage.

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

from ._commands import gate, main
from ._loaders import auto_groups, load_data, load_model, parse_feature_costs, split_weights
from ._parser import (
    EXIT_BAD_INPUT,
    EXIT_BELOW,
    EXIT_INTERNAL,
    EXIT_MISMATCH,
    EXIT_NOT_CERTIFIED,
    EXIT_OK,
    EXIT_SOLVER,
    build_parser,
)

__all__ = ["main", "build_parser", "load_model", "load_data", "parse_feature_costs",
           "split_weights", "auto_groups", "gate", "EXIT_OK", "EXIT_MISMATCH", "EXIT_BAD_INPUT",
           "EXIT_SOLVER", "EXIT_INTERNAL", "EXIT_BELOW", "EXIT_NOT_CERTIFIED"]
