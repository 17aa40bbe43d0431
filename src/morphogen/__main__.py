"""`python -m morphogen` runs the `morphogen` command."""

import sys

from morphogen.cli import main

sys.exit(main())
