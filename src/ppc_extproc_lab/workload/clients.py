"""How one turn goes on the wire: the request forms a client can send, and reading the answer.

================  ===========================================================================
``token-ids``     ``/v1/completions`` with ``prompt`` = token ids, answers as token ids
                  (``return_token_ids``); the token workload of the demo
``tokens``        a :class:`~ppc_extproc_lab.workload.text.TextPrompt` sent as the token ids the
                  engine derives from its text (:class:`EngineTokens`), answers as text
``text``          the same prompt as a string: ``/v1/completions`` with ``prompt`` = text
``chat``          the same prompt as chat messages through the ``openai`` client
                  (``/v1/chat/completions``, streamed, ``stream_options.include_usage``)
================  ===========================================================================

Every client streams, records the first content chunk (TTFT), ``usage`` (prompt and cached
tokens) and the ``x-mock-vllm-endpoint`` header, and builds the ``/mock/match`` body the oracle
sends to ask an engine what it caches of the prompt in that form.

:class:`EngineTokens` is how the engines tokenise: a string as its UTF-8 bytes (the mock without
``--tokenizer``), or with the :class:`~ppc_extproc.tokenizer.LocalTokenizer` of the engines'
``--tokenizer`` directory (strings with BOS, chat through its template).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp
import numpy as np
import orjson

from ppc_extproc_lab.mock_vllm.http import ENDPOINT_HEADER
from ppc_extproc_lab.mock_vllm.kv_transfer import KV_TRANSFER_HEADER
from ppc_extproc_lab.mock_vllm.request import output_tokens
from ppc_extproc_lab.workload.report import RequestRecord
from ppc_extproc_lab.workload.text import TextPrompt

if TYPE_CHECKING:
    from ppc_extproc.tokenizer.local import LocalTokenizer

__all__ = [
    "ENDPOINT_HEADER",
    "FORMS",
    "ChatClient",
    "CompletionsClient",
    "Form",
    "RequestClient",
    "client_for",
    "mock_answer",
    "mock_text_answer",
]

Form = Literal["token-ids", "tokens", "text", "chat"]
FORMS: tuple[Form, ...] = ("token-ids", "tokens", "text", "chat")
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, ValueError)


def mock_answer(prompt: Sequence[int], max_tokens: int) -> list[int]:
    """The answer a mock engine (seed 0) gives to ``prompt``."""
    return output_tokens(prompt, max_tokens, 0)


class EngineTokens:
    """The token ids an engine computes for a prompt: UTF-8 bytes, or its ``--tokenizer``'s."""

    def __init__(self, tokenizer: LocalTokenizer | None = None) -> None:
        self.tokenizer = tokenizer

    def text(self, text: str) -> list[int]:
        """A string prompt (``add_special_tokens`` on, as vLLM's completions default)."""
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        return _ids(self.tokenizer.encode(text, add_special_tokens=True))

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """A chat body's messages through the template (needs a tokenizer)."""
        if self.tokenizer is None:
            raise ValueError("chat prompts need the engines' tokenizer")
        result = self.tokenizer.tokenize("chat", {"messages": messages})
        if not result.ok:
            raise ValueError(f"cannot tokenize the chat prompt: {result.reason}")
        return _ids(result.prompts[0])


def _ids(le32: bytes) -> list[int]:
    return np.frombuffer(le32, dtype="<u4").tolist()  # type: ignore[no-any-return]


def mock_text_answer(prompt: TextPrompt, max_tokens: int, engine_ids: Sequence[int] | None = None) -> str:
    """The answer text a mock engine (seed 0) streams for ``prompt`` whose engine ids are
    ``engine_ids`` (default: its UTF-8 bytes); the answer ids are printable ASCII."""
    return bytes(mock_answer(prompt.token_ids() if engine_ids is None else engine_ids, max_tokens)).decode("ascii")


class RequestClient(Protocol):
    """Sends one prompt to a base URL and fills its :class:`RequestRecord`."""

    form: Form

    def prompt_tokens(self, prompt: Any) -> int:
        """The prompt's length before ``usage`` reports it."""
        ...

    def match_body(self, prompt: Any) -> dict[str, Any]:
        """The ``/mock/match`` body asking an engine what it caches of ``prompt``."""
        ...

    def fallback(self, prompt: Any) -> Any:
        """The answer to use when the request failed (the engine's deterministic one)."""
        ...

    async def send(
        self, http: aiohttp.ClientSession, url: str, prompt: Any, rec: RequestRecord, now: Callable[[], float]
    ) -> Any | None:
        """Send, stream, fill ``rec``; the answer, or None on failure (``rec.error`` set)."""
        ...

    async def aclose(self) -> None: ...


class CompletionsClient:
    """``/v1/completions``, streamed, over aiohttp: ``token-ids``, ``tokens`` or ``text``."""

    def __init__(self, form: Form, *, model: str, max_tokens: int, tokens: EngineTokens | None = None) -> None:
        if form == "chat":
            raise ValueError("use ChatClient for the chat form")
        self.form: Form = form
        self.model = model
        self.max_tokens = max_tokens
        self.tokens = tokens or EngineTokens()

    def _prompt(self, prompt: Any) -> list[int] | str:
        if self.form == "token-ids":
            return list(prompt)
        return self.tokens.text(prompt.text) if self.form == "tokens" else prompt.text

    def prompt_tokens(self, prompt: Any) -> int:
        return len(prompt) if self.form == "token-ids" else len(prompt.text)

    def match_body(self, prompt: Any) -> dict[str, Any]:
        return {"prompt": self._prompt(prompt)}

    def fallback(self, prompt: Any) -> Any:
        if self.form == "token-ids":
            return mock_answer(prompt, self.max_tokens)
        return mock_text_answer(prompt, self.max_tokens, self.tokens.text(prompt.text))

    async def send(
        self, http: aiohttp.ClientSession, url: str, prompt: Any, rec: RequestRecord, now: Callable[[], float]
    ) -> Any | None:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": self._prompt(prompt),
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.form == "token-ids":
            body["return_token_ids"] = True
        ids: list[int] = []
        text: list[str] = []
        try:
            async with http.post(
                url + "/v1/completions", data=orjson.dumps(body), headers={"content-type": "application/json"}
            ) as resp:
                rec.status = resp.status
                rec.endpoint = resp.headers.get(ENDPOINT_HEADER)
                rec.kv_transfer = resp.headers.get(KV_TRANSFER_HEADER)
                if resp.status != 200:
                    rec.error = f"http {resp.status}: {(await resp.read())[:300].decode('utf-8', 'replace')}"
                    return None
                async for raw in resp.content:
                    if raw.startswith(b"data: ") and not _completion_chunk(raw[6:].strip(), rec, now, ids, text):
                        break
        except _TRANSPORT_ERRORS as exc:
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        if rec.cached_tokens is None and rec.error is None:
            rec.error = "no usage in stream"
        if rec.error is not None:
            return None
        return ids if self.form == "token-ids" else "".join(text)

    async def aclose(self) -> None:
        return None


def _completion_chunk(data: bytes, rec: RequestRecord, now: Callable[[], float], ids: list[int], text: list[str]) -> bool:
    """Apply one SSE ``data:`` payload to ``rec``; False at ``[DONE]``."""
    if data == b"[DONE]":
        return False
    chunk = orjson.loads(data)
    if "error" in chunk and "choices" not in chunk:
        rec.error = f"stream error: {str(chunk['error'])[:200]}"
        return True
    for choice in chunk.get("choices") or ():
        if rec.first_token_s is None:
            rec.first_token_s = now()
        ids.extend(choice.get("token_ids") or ())
        text.append(choice.get("text") or "")
    _usage(chunk.get("usage"), rec, len(ids))
    return True


def _usage(usage: Mapping[str, Any] | None, rec: RequestRecord, answered: int) -> None:
    if not usage:
        return
    rec.prompt_tokens = int(usage.get("prompt_tokens", rec.prompt_tokens))
    rec.output_tokens = int(usage.get("completion_tokens", answered))
    details = usage.get("prompt_tokens_details") or {}
    rec.cached_tokens = int(details.get("cached_tokens") or 0)


class ChatClient:
    """``/v1/chat/completions`` through the ``openai`` client (one per base URL), streamed."""

    form: Form = "chat"

    def __init__(self, *, model: str, max_tokens: int, tokens: EngineTokens | None = None, timeout_s: float = 120.0) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.tokens = tokens or EngineTokens()
        self.timeout_s = timeout_s
        self._clients: dict[str, Any] = {}

    def _client(self, url: str) -> Any:
        client = self._clients.get(url)
        if client is None:
            import openai

            # The openai package's own httpx client (its default connection limits), loopback
            # only: never an http_proxy from the environment.
            http = openai.DefaultAsyncHttpxClient(trust_env=False)
            # No retries: a failed request counts as failed, for every router alike.
            client = openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="unused", max_retries=0, timeout=self.timeout_s, http_client=http
            )
            self._clients[url] = client
        return client

    def prompt_tokens(self, prompt: Any) -> int:
        return sum(len(m["content"]) for m in prompt.messages())

    def match_body(self, prompt: Any) -> dict[str, Any]:
        # The engine tokenises the messages with its chat template (as /v1/chat/completions does).
        return {"messages": prompt.messages()}

    def fallback(self, prompt: Any) -> Any:
        ids = self.tokens.chat(prompt.messages()) if self.tokens.tokenizer is not None else None
        return mock_text_answer(prompt, self.max_tokens, ids)

    async def send(
        self, http: aiohttp.ClientSession, url: str, prompt: Any, rec: RequestRecord, now: Callable[[], float]
    ) -> Any | None:
        import openai

        text: list[str] = []
        try:
            async with self._client(url).chat.completions.with_streaming_response.create(
                model=self.model,
                messages=prompt.messages(),
                max_tokens=self.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            ) as resp:
                rec.status = resp.status_code
                rec.endpoint = resp.headers.get(ENDPOINT_HEADER)
                rec.kv_transfer = resp.headers.get(KV_TRANSFER_HEADER)
                async for chunk in await resp.parse():
                    for choice in chunk.choices:
                        if rec.first_token_s is None and choice.delta.content:
                            rec.first_token_s = now()
                        text.append(choice.delta.content or "")
                    if chunk.usage is not None:
                        _usage(chunk.usage.model_dump(), rec, len(text))
        except openai.APIStatusError as exc:
            rec.status = exc.status_code
            rec.endpoint = exc.response.headers.get(ENDPOINT_HEADER)
            rec.error = f"http {exc.status_code}: {str(exc.message)[:300]}"
            return None
        except (TimeoutError, openai.APIError, ValueError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        if rec.cached_tokens is None:
            rec.error = "no usage in stream"
            return None
        return "".join(text)

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)


def client_for(form: Form, *, model: str, max_tokens: int, tokens: EngineTokens | None = None) -> RequestClient:
    """The client sending ``form`` to engines that tokenise as ``tokens`` (default: UTF-8 bytes)."""
    if form == "chat":
        return ChatClient(model=model, max_tokens=max_tokens, tokens=tokens)
    if form not in FORMS:
        raise ValueError(f"unknown request form {form!r}; choose from {', '.join(FORMS)}")
    return CompletionsClient(form, model=model, max_tokens=max_tokens, tokens=tokens)
