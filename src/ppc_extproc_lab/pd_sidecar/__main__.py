"""``python -m ppc_extproc_lab.pd_sidecar …``: see :mod:`ppc_extproc_lab.pd_sidecar.cli`."""

from __future__ import annotations

import sys

from ppc_extproc_lab.pd_sidecar.cli import main

if __name__ == "__main__":
    sys.exit(main())
