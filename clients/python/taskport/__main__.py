"""``python -m taskport COMMAND ...``: the client commands (see :mod:`taskport.cli`)."""

import sys

from taskport.cli import main

sys.exit(main())
