"""``python -m gradscope`` runs the CLI."""

import sys

from gradscope.cli import main

sys.exit(main())
