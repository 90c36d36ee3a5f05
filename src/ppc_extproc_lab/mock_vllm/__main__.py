"""``python -m ppc_extproc_lab.mock_vllm …``: see :mod:`ppc_extproc_lab.mock_vllm.cli`."""

from __future__ import annotations

import sys

from ppc_extproc_lab.mock_vllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
