"""`python -m specwire`: the same command line as the `specwire` script."""

import sys

from specwire.cli import run

sys.exit(run())
