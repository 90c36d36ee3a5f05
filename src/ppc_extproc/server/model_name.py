"""The response's ``model`` back to the name the client sent, when the router rewrote it.

llm-d replaces ``"model":"<target>"`` (and ``"model": "<target>"``) with the incoming name in
every response chunk (``llm-d/llm-d-router: pkg/epp/handlers/server.go`` ``rewriteModelName``).
Here the names are JSON-encoded (a name with a quote still matches), and a chunk that ends in the
middle of the pattern keeps that tail for the next chunk, so an SSE event split by the transport
is still rewritten. Only such a tail is held back: an event ending in ``\\n\\n`` goes out at once.
"""

from __future__ import annotations

import orjson

__all__ = ["ModelNameRewriter"]


class ModelNameRewriter:
    """Rewrites one response's body, chunk by chunk."""

    __slots__ = ("_longest", "_pairs", "_pending", "length_changes")

    def __init__(self, target: str, incoming: str) -> None:
        old, new = orjson.dumps(target), orjson.dumps(incoming)
        self._pairs = [(b'"model":' + old, b'"model":' + new), (b'"model": ' + old, b'"model": ' + new)]
        self._longest = max(len(p) for p, _ in self._pairs)
        self._pending = b""
        #: The rewrite changes the body's length (``content-length`` must go).
        self.length_changes = len(old) != len(new)

    def feed(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """The rewritten bytes to send for ``chunk`` (with any tail held from the last chunk)."""
        data = self._pending + chunk if self._pending else chunk
        self._pending = b""
        for old, new in self._pairs:
            if old in data:
                data = data.replace(old, new)
        if not end_of_stream:  # hold a tail that may be the start of the pattern
            i = data.find(b'"', max(0, len(data) - self._longest + 1))
            while i != -1:
                rest = data[i:]
                if any(old.startswith(rest) for old, _ in self._pairs):
                    self._pending = rest
                    return data[:i]
                i = data.find(b'"', i + 1)
        return data
