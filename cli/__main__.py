"""`python -m ampflow.cli`: the `ampflow` console script without its installed wrapper."""

import sys

from ampflow.cli import main

sys.exit(main())
