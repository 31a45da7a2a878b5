"""`python -m specwire`: the same command line as the `specwire` script."""

import sys

from specwire.cli import main

sys.exit(main())
