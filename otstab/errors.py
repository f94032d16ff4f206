"""Exception hierarchy of otstab.

Every error caused by a bad argument is a subclass of ``ValueError`` or ``TypeError`` and its
message names the argument and what was expected, so callers can catch either the builtin or
the otstab class.
"""

from otstab_solvers.errors import SolverError, SolverNotAvailableError

__all__ = [
    "OtstabError",
    "ValidationError",
    "InputTypeError",
    "NotFittedError",
    "IncompatibleLossError",
    "DataChangedError",
    "SolverError",
    "SolverNotAvailableError",
]


class OtstabError(Exception):
    """Base class of the errors raised by otstab itself."""


class ValidationError(OtstabError, ValueError):
    """An argument has a bad value (NaN, wrong shape, out of range, unknown label, ...)."""


class InputTypeError(OtstabError, TypeError):
    """An argument has the wrong type (e.g. a model that is not a linear model)."""


class NotFittedError(ValidationError):
    """The model has not been fitted (no ``coef_``)."""


class IncompatibleLossError(ValidationError):
    """The loss does not fit the model (e.g. hinge on a regressor)."""


class DataChangedError(ValidationError):
    """The data behind a result no longer matches the fingerprint taken when it was certified
    (the caller's array, or the Dask source files or arrays, changed)."""
