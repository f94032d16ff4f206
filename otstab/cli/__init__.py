"""The ``otstab`` command (``python -m otstab``): demo, certify, verify, with documented exit
codes. The top of the stack: it may import every other subpackage."""

from ._commands import (
    EXIT_BAD_INPUT,
    EXIT_BELOW,
    EXIT_INTERNAL,
    EXIT_MISMATCH,
    EXIT_NOT_CERTIFIED,
    EXIT_OK,
    EXIT_SOLVER,
    auto_groups,
    build_parser,
    gate,
    load_data,
    load_model,
    main,
    parse_feature_costs,
    split_weights,
)

__all__ = ["main", "build_parser", "load_model", "load_data", "parse_feature_costs",
           "split_weights", "auto_groups", "gate", "EXIT_OK", "EXIT_MISMATCH", "EXIT_BAD_INPUT",
           "EXIT_SOLVER", "EXIT_INTERNAL", "EXIT_BELOW", "EXIT_NOT_CERTIFIED"]
