"""Suite-wide options: the tests marked ``real_vllm`` run only with ``--real-vllm``.

They start real vLLM engines (see ``tests/real_vllm/`` and ``scripts/setup_real_vllm.sh``), so the
default run deselects them; with the option they run, and skip with the reason when no vLLM install
is found.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ppc_extproc_lab.valkey import ValkeyServer, start_valkey


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


@pytest.fixture
def valkey_server() -> Iterator[ValkeyServer]:
    """A real Valkey (or Redis) server on a free loopback port (``ppc_extproc_lab.valkey``), killed
    after the test. Its ``host``, ``port`` and ``url`` address it; ``kill()``/``restart()`` take it
    away and bring it back, empty, on the same port."""
    with start_valkey() as server:
        yield server
