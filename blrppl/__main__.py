"""``python -m blrppl``: see :mod:`blrppl.cli`."""

import sys

from blrppl.cli import main

sys.exit(main())
