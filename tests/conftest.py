"""Suite-wide options: the tests marked ``real_vllm`` run only with ``--real-vllm``.

They start real vLLM engines (see ``tests/real_vllm/`` and ``scripts/setup_real_vllm.sh``), so the
default run deselects them; with the option they run, and skip with the reason when no vLLM install
is found.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-vllm",
        action="store_true",
        default=False,
        help="also run the tests marked real_vllm (real vLLM 0.32 on CPU; scripts/setup_real_vllm.sh installs it)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--real-vllm"):
        return
    deselected = [item for item in items if item.get_closest_marker("real_vllm") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker("real_vllm") is None]
