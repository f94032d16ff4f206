"""Exceptions raised by the numerical backends.

``otstab.errors`` re-exports these, so users catch one hierarchy.
"""


class SolverError(RuntimeError):
    """A backend failed or returned a status that cannot be trusted as an answer."""


class SolverNotAvailableError(ValueError):
    """A solver was requested by name but is not installed or not licensed."""
