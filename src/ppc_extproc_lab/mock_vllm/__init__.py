"""A mock vLLM engine speaking vLLM's HTTP and KV-event protocols byte for byte.

Used by integration tests, the demo and the routing benchmark. Importing this package starts
nothing; :func:`ppc_extproc_lab.mock_vllm.server.start_fleet` (or the ``mock-vllm`` CLI) does.

Modules: ``kv_events`` (structs and encodings), ``hashing`` (vLLM block hashes), ``cache``
(block pool), ``engine`` (scheduler and time model), ``publisher`` (ZMQ PUB + replay),
``protocol`` / ``http`` / ``text`` / ``streaming`` (OpenAI surface), ``metrics``, ``server`` (N engines), ``cli``.
"""

from __future__ import annotations

from ppc_extproc_lab.mock_vllm.engine import EngineConfig, MockEngine
from ppc_extproc_lab.mock_vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventEncoder,
    KVEventBatch,
)
from ppc_extproc_lab.mock_vllm.server import MockVllmFleet, MockVllmOptions, serve, start_fleet

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EngineConfig",
    "EventEncoder",
    "KVEventBatch",
    "MockEngine",
    "MockVllmFleet",
    "MockVllmOptions",
    "serve",
    "start_fleet",
]
