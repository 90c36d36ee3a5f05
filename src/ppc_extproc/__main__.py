"""``python -m ppc_extproc`` runs the CLI."""

from __future__ import annotations

import sys

from ppc_extproc.cli import main

sys.exit(main())
