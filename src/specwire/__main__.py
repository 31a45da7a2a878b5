"""`python -m specwire`: the same command line as the `specwire` script."""

import sys

from .cli import main

sys.exit(main())
