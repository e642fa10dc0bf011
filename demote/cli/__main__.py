"""``python -m demote.cli``: the same as the ``demote`` script."""

import sys

from demote.cli.app import main

sys.exit(main())
