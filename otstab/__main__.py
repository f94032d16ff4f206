"""``python -m otstab``: the ``otstab`` command line (see :mod:`otstab.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
