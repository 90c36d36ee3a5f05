"""``python -m ppc_extproc.mock_vllm …``: see :mod:`ppc_extproc.mock_vllm.cli`."""

from __future__ import annotations

import sys

from ppc_extproc.mock_vllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
