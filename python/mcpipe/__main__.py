"""``python -m mcpipe``: the same as the ``mcpipe`` command."""

import sys

from mcpipe.cli import main

sys.exit(main())
