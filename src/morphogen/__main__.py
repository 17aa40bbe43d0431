"""`python -m morphogen`: the same command as the `morphogen` script."""

import sys

from morphogen.cli import main

sys.exit(main())
