"""Text requests → the token ids vLLM computes for them.

Backends (the ``token-producer`` plugin picks one):

* :class:`LocalTokenizer` (``local.py``) — in-process, exact: a HF model directory's
  ``tokenizer.json`` and chat template rendered as vLLM 0.32 + transformers 5.19 do, with a
  per-piece :class:`SegmentCache` (``segments.py``);
* :class:`RenderClient` (``render_client.py``) — vLLM's ``/v1/*/render`` endpoints over HTTP, with
  a bounded pool, timeouts, a concurrency cap and a :class:`CircuitBreaker` (``breaker.py``);
* :func:`estimate_body` (``estimate.py``) — llm-d's byte packing (content locality only).

Every backend returns a :class:`TokenizeResult` whose ``reason`` says why there are no tokens.
Importing this package starts nothing.
"""

from __future__ import annotations

from ppc_extproc.tokenizer.local import LocalTokenizer
from ppc_extproc.tokenizer.requests import Api, api_for_path
from ppc_extproc.tokenizer.result import TokenizeResult
from ppc_extproc.tokenizer.segments import SegmentCache

__all__ = ["Api", "LocalTokenizer", "SegmentCache", "TokenizeResult", "api_for_path"]
