"""(path, headers, body) → the ``LLMRequest`` the pipeline routes: the one place that decides it.

Both the ext_proc stream and ``POST /debug/score`` call :func:`assemble_request`, so a request
scored for debugging is the request that would be routed: the same parser check (a path no
configured parser claims gets 400, as llm-d's ``requestHandler.parsers``), the same model-rewrite
headers (``x-llm-d-model-name-rewrite``, then ``x-gateway-model-name-rewrite``, as llm-d's
``pkg/epp/handlers/request.go`` reads them), one parse of the body (its JSON object rides on the
request, so a token producer does not parse it again), and the body as the engine will get it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ppc_extproc.errors import BadRequestError
from ppc_extproc.framework import LLMRequest, StreamedKeys
from ppc_extproc.plugins.parsers import claims_path
from ppc_extproc.scheduling.objectives import ModelRewrites
from ppc_extproc.scheduling.router import Pipeline
from ppc_extproc.tokens import ParsedBody, parse_body, token_field_for_path
from ppc_extproc.tokens.streaming import StreamingPrompt

__all__ = ["REWRITE_HEADERS", "AssembledRequest", "assemble_request", "rewrite_target", "streaming_prompt"]

#: Headers naming the model the engine is asked for instead of the body's, first wins.
REWRITE_HEADERS = ("x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite")


@dataclass(frozen=True, slots=True)
class AssembledRequest:
    """The routed request and what the response path needs from its body."""

    request: LLMRequest
    #: The body asks for a streamed (SSE) response.
    stream: bool
    #: The body's own model (the client's name; empty for an empty body).
    body_model: str
    #: ``request.body`` differs from the body received (the model was rewritten).
    rewritten: bool


def rewrite_target(headers: Mapping[str, str]) -> str | None:
    """The model a rewrite header asks for (lower-case header names), or None."""
    return next((headers[h] for h in REWRITE_HEADERS if headers.get(h)), None)


def streaming_prompt(pipeline: Pipeline, path: str) -> StreamingPrompt | None:
    """Incremental token extraction (and block hashing, when the pipeline offers it) for a large
    body arriving on ``path``; None for a path whose bodies carry no token ids."""
    field = token_field_for_path(path)
    if field is None:
        return None
    hashing = pipeline.streaming_hasher()
    return StreamingPrompt(field, hashing.hasher if hashing is not None else None)


def assemble_request(
    pipeline: Pipeline,
    request_id: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    prompt: StreamingPrompt | None = None,
    rewrites: ModelRewrites | None = None,
) -> AssembledRequest:
    """The request ``pipeline`` routes for this HTTP request; ``prompt`` is the body's streamed
    extraction when it was fed while the body arrived; ``rewrites`` the pool's InferenceModelRewrites
    (a rewrite header wins over them). Raises ``BadRequestError`` naming the field."""
    if pipeline.parsers is not None and not claims_path(pipeline.parsers, path):
        raise BadRequestError(f"no configured parser handles the request path {path.split('?', 1)[0]}")
    rewrite = rewrite_target(headers)
    parsed: ParsedBody | None = None
    streamed_keys: StreamedKeys | None = None
    if prompt is not None:
        streamed = prompt.finish(body, rewrite)
        if streamed is not None:
            parsed, keys = streamed
            hashing = pipeline.streaming_hasher()
            if keys is not None and hashing is not None:
                streamed_keys = hashing.streamed_keys(parsed.model, keys)
    if parsed is None:
        if body:
            parsed = parse_body(path, body, model_override=rewrite)
        else:  # an empty body is routed like a header-only request, then echoed (as llm-d does)
            parsed = ParsedBody(rewrite or "", False, None, rewrite or "")
    if rewrite is None and rewrites and body:
        target = rewrites.target(parsed.body_model)
        if target is not None and target != parsed.model:  # the index and tokenizer are the target's
            parsed, streamed_keys = parse_body(path, body, model_override=target), None
    forwarded = body
    obj = parsed.obj
    if parsed.model != parsed.body_model:
        obj = _with_model(body, obj, parsed.model)
        forwarded = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    request = LLMRequest(
        request_id, parsed.model, parsed.tokenized, path, headers, body=forwarded, streamed_keys=streamed_keys,
        # Only a body without token ids is read again (by a token producer): a body that has them
        # does not keep its object (token lists) alive while the request is in flight.
        body_json=obj if parsed.tokenized is None else None,
    )
    return AssembledRequest(request, parsed.stream, parsed.body_model, forwarded is not body)


def _with_model(body: bytes, obj: dict[str, Any] | None, model: str) -> dict[str, Any]:
    """The body's object with ``model`` replaced (the parse's own object when it kept one)."""
    if obj is None:
        obj = orjson.loads(body)
        assert isinstance(obj, dict)  # the parse accepted it: a JSON object
    obj["model"] = model
    return obj
