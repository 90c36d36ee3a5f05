"""Endpoint-picker protocol conformance over a real gRPC channel (no Envoy): every row of the
test cases of llm-d's EPP handlers (llm-d/llm-d-router: pkg/epp/handlers/*_test.go), in
FULL_DUPLEX_STREAMED and BUFFERED."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest
from harness import (
    BUFFERED,
    FULL_DUPLEX,
    Client,
    body,
    headers,
    metadata_destination,
    response_body,
    response_headers,
    running_service,
    set_headers,
    streamed_bodies,
    subset_metadata,
    trailers,
)

from ppc_extproc.index import PodEntry
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc_lab.localcluster import wait_for

pytestmark = pytest.mark.integration

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSizeTokens: 16}
    speculativeIndexing: true
    kvEventsConfig: {discoverPods: false}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: active-request-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: active-request-scorer, weight: 2}
"""
PODS = ["192.168.1.1:8000", "192.168.1.2:8000", "192.168.1.3:8000"]
PROMPT = list(range(100, 164))  # 4 blocks of 16


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    with running_service(tmp_path_factory.mktemp("svc"), CONFIG) as svc:
        yield svc


@pytest.fixture
def client(service):
    c = Client(service.grpc_port)
    yield c
    c.close()


def producer(service):
    return service.loaded.roles.producers[0]


def cache_on(service, endpoint: str, tokens: list[int]) -> None:
    """Make ``endpoint`` hold the prompt's blocks on GPU, as a KV event would."""
    keys = producer(service).block_keys(TokenizedPrompt("m", (tokens_to_le32(tokens),)))[0]
    producer(service).index.add(None, keys, [PodEntry(endpoint, "gpu")])


def completion(prompt=PROMPT, **extra) -> bytes:
    return orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 4, **extra})


def immediate(reply) -> tuple[int, bytes, dict[str, str]]:
    imm = reply.immediate_response
    return imm.status.code, imm.body, {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}


# --- FULL_DUPLEX_STREAMED -------------------------------------------------------------------------


def test_body_split_across_chunks_routes_to_the_cached_pod(service, client) -> None:
    prompt = list(range(1000, 1064))
    cache_on(service, PODS[1], prompt)
    data = completion(prompt)
    replies = client.run([headers(), body(data[:20], eos=False), body(data[20:], eos=True)])
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    first = replies[0]
    assert first.request_headers.response.clear_route_cache
    hdrs = set_headers(first)
    assert hdrs["x-gateway-destination-endpoint"] == PODS[1]
    assert hdrs["Content-Length"] == str(len(data))
    assert metadata_destination(first) == PODS[1]  # T16: header and metadata identical
    assert streamed_bodies(replies) == [(data, True)]


def test_header_only_get_is_routed_at_once(client) -> None:
    replies = client.run([headers("/v1/models", "GET", eos=True)])
    assert len(replies) == 1
    hdrs = set_headers(replies[0])
    assert hdrs["x-gateway-destination-endpoint"] in PODS
    assert "Content-Length" not in hdrs
    assert replies[0].request_headers.response.clear_route_cache


@pytest.mark.parametrize(
    ("subset", "allowed"),
    [
        (["192.168.1.1:8000", "192.168.1.2:8000"], PODS[:2]),  # T5: select from the subset
        (["192.168.1.3:8000"], PODS[2:]),  # T6: partial match
        ("192.168.1.2:8000,192.168.1.3:8000", PODS[1:]),  # T21: one comma string
        (["192.168.1.1"], PODS[:1]),  # T20: no port matches every port of the IP
        (["192.168.1.2:9999"], PODS[1:2]),  # matched by IP, port stripped (llm-d candidates.go)
    ],
)
def test_subset_hint_restricts_candidates(service, client, subset, allowed) -> None:
    cache_on(service, PODS[0], PROMPT)  # the cached pod loses when it is outside the subset
    for _ in range(5):
        replies = client.run([headers(), body(completion(), metadata=subset_metadata(subset))])
        assert set_headers(replies[0])["x-gateway-destination-endpoint"] in allowed


@pytest.mark.parametrize("subset", [["192.168.1.99:8000"], []])
def test_subset_hint_without_match_is_503(client, subset) -> None:
    (reply,) = client.run([headers(), body(completion(), metadata=subset_metadata(subset))])
    code, text, hdrs = immediate(reply)
    assert code == 503
    assert hdrs["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
    assert text == b"inference error: ServiceUnavailable - failed to find endpoint candidates for serving the request"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"prompt":"hello world"}', b"inference error: BadRequest - model not found in request body"),
        (b"no healthy upstream", b"inference error: BadRequest - error unmarshaling request body"),
        (b'{"model":"m","prompt":[1,-2]}', b"inference error: BadRequest - prompt[1]: token id -2 is outside [0, 2^32)"),
    ],
)
def test_bad_bodies_get_400_naming_the_problem(client, data, message) -> None:
    (reply,) = client.run([headers(), body(data)])
    code, text, _ = immediate(reply)
    assert code == 400 and text.startswith(message)


def test_large_body_comes_back_in_62000_byte_chunks(client) -> None:
    data = completion(list(range(30000)))  # ~170 KB
    replies = client.run([headers(), body(data[:100000], eos=False), body(data[100000:])])
    chunks = streamed_bodies(replies)
    assert [len(c) for c, _ in chunks][:2] == [62000, 62000]
    assert all(len(c) <= 62000 for c, _ in chunks)
    assert [eos for _, eos in chunks] == [False] * (len(chunks) - 1) + [True]
    assert b"".join(c for c, _ in chunks) == data


def test_empty_body_is_one_empty_chunk_without_content_length(client) -> None:
    replies = client.run([headers(), body(b"")])
    assert "Content-Length" not in set_headers(replies[0])
    assert streamed_bodies(replies) == [(b"", True)]


def test_request_trailers_end_the_body(client) -> None:
    data = completion()
    replies = client.run([headers(), body(data, eos=False), trailers()])
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body", "request_trailers"]
    assert streamed_bodies(replies) == [(data, False)]


def test_model_rewrite_header_rewrites_the_body(client) -> None:
    data = orjson.dumps({"prompt": "x", "model": "model-to-be-rewritten", "max_tokens": 1})
    replies = client.run([headers(extra={"x-llm-d-model-name-rewrite": "rewritten-model"}), body(data)])
    forwarded = b"".join(c for c, _ in streamed_bodies(replies))
    assert orjson.loads(forwarded)["model"] == "rewritten-model"
    assert set_headers(replies[0])["Content-Length"] == str(len(forwarded))


def test_generated_request_id_is_set_on_the_request(client) -> None:
    replies = client.run([headers(), body(completion())])
    assert len(set_headers(replies[0])["x-request-id"]) == 36


def test_cached_prefix_wins_and_seeds_speculative_entries(service, client) -> None:
    """T27: prompt cached on pod B routes to B; B gains speculative entries for every block it
    does not hold yet (the blocks it holds on GPU already weigh as much)."""
    prompt = list(range(5000, 5064))
    cache_on(service, PODS[2], prompt[:32])
    replies = client.run([headers(extra={"x-request-id": "spec-1"}), body(completion(prompt))])
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] == PODS[2]
    keys = producer(service).block_keys(TokenizedPrompt("m", (tokens_to_le32(prompt),)))[0]
    found = producer(service).index.lookup(keys, [PODS[2]])
    assert [[e.speculative for e in found[k]] for k in keys] == [[False], [False], [True], [True]]


def test_string_prompt_routes_without_prefix_data(service, client) -> None:
    """T28: no tokens, no match info, no speculative entries; still routed."""
    before = len(producer(service).index)
    replies = client.run([headers(), body(completion("a string prompt"))])
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] in PODS
    assert len(producer(service).index) == before


# --- response path ----------------------------------------------------------------------------------


def routed_then(client, *response_messages):
    return client.run([headers(), body(completion()), *response_messages])


def test_response_json_over_several_chunks_is_echoed_and_usage_recorded(service, client) -> None:
    payload = orjson.dumps({"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 64, "completion_tokens": 4,
                            "total_tokens": 68, "prompt_tokens_details": {"cached_tokens": 48}}})
    before = service.metrics.usage_tokens.labels("cached")._value.get()
    replies = routed_then(client, response_headers(), response_body(payload[:30]), response_body(payload[30:], eos=True))
    assert streamed_bodies(replies, "response_body") == [(payload[:30], False), (payload[30:], True)]
    assert service.metrics.usage_tokens.labels("cached")._value.get() == before + 48


def test_invalid_json_response_passes_through_unchanged(client) -> None:
    replies = routed_then(client, response_headers(), response_body(b"no healthy upstream", eos=True))
    assert streamed_bodies(replies, "response_body") == [(b"no healthy upstream", True)]


def test_empty_end_of_stream_chunk(client) -> None:
    payload = b'{"usage":{"prompt_tokens":1}}'
    replies = routed_then(client, response_headers(), response_body(payload), response_body(b"", eos=True))
    assert streamed_bodies(replies, "response_body") == [(payload, False), (b"", True)]


def test_sse_usage_is_counted(service, client) -> None:
    before = service.metrics.usage_tokens.labels("prompt")._value.get()
    chunks = [b"data: {}\n\n",
              b'data: {"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10}}\n\ndata: [DONE]\n\n', b""]
    replies = routed_then(
        client, response_headers(content_type="text/event-stream"),
        *[response_body(c, eos=i == 2) for i, c in enumerate(chunks)],
    )
    assert streamed_bodies(replies, "response_body") == [(chunks[0], False), (chunks[1], False), (b"", True)]
    assert service.metrics.usage_tokens.labels("prompt")._value.get() == before + 7


def test_stream_may_start_with_response_headers(client) -> None:
    replies = client.run([response_headers(), response_body(b"x", eos=True)])
    assert [r.WhichOneof("response") for r in replies] == ["response_headers", "response_body"]


def test_in_flight_count_lasts_until_the_response_ends(service, client) -> None:
    respond = threading.Event()

    def messages():
        yield headers(extra={"x-request-id": "inflight-1"})
        yield body(completion())
        respond.wait(10)
        yield response_headers()
        yield response_body(b"{}", eos=True)

    replies = client.stub.Process(messages(), timeout=10)
    routed = [next(replies), next(replies)]
    endpoint = set_headers(routed[0])["x-gateway-destination-endpoint"]
    assert service.router.inflight.requests(endpoint) == 1
    respond.set()
    assert [r.WhichOneof("response") for r in replies] == ["response_headers", "response_body"]
    assert service.router.inflight.requests(endpoint) == 0


def test_prompt_tokens_are_released_at_the_first_response_byte(service, client) -> None:
    """llm-d's inflight-load producer: prompt tokens leave at StartOfStream (the prefill is done),
    the request count at the end of the response."""
    steps = [threading.Event() for _ in range(2)]

    def messages():
        yield headers(extra={"x-request-id": "inflight-tokens"})
        yield body(completion())
        steps[0].wait(10)
        yield response_headers(content_type="text/event-stream")
        steps[1].wait(10)
        yield response_body(b"data: [DONE]\n\n", eos=True)

    replies = client.stub.Process(messages(), timeout=10)
    routed = [next(replies), next(replies)]
    endpoint = set_headers(routed[0])["x-gateway-destination-endpoint"]
    inflight = service.router.inflight
    assert inflight.tokens(endpoint) > 0 and inflight.requests(endpoint) == 1
    steps[0].set()
    assert next(replies).WhichOneof("response") == "response_headers"
    assert inflight.tokens(endpoint) == 0 and inflight.requests(endpoint) == 1
    steps[1].set()
    assert [r.WhichOneof("response") for r in replies] == ["response_body"]
    assert inflight.tokens(endpoint) == 0 and inflight.requests(endpoint) == 0


def test_client_cancel_mid_stream_releases_state(service, client) -> None:
    release = threading.Event()

    def messages():
        yield headers(extra={"x-request-id": "cancel-me"})
        yield body(b'{"model":"m","prompt":[1,2', eos=False)
        release.wait(10)

    call = client.stub.Process(messages(), timeout=10)
    wait_for(lambda: service.extproc.active == 1, what="the stream to open", timeout=5)
    call.cancel()
    release.set()
    with pytest.raises(grpc.RpcError):
        list(call)
    wait_for(lambda: service.extproc.active == 0, what="the cancelled stream to be released", timeout=5)
    replies = client.run([headers(), body(completion())])  # the server still serves
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] in PODS


def test_messages_out_of_order_do_not_break_the_server(client) -> None:
    replies = client.run([body(completion()), headers(), headers()])
    assert replies[0].WhichOneof("response") == "request_headers"
    assert client.run([headers("/v1/models", "GET", eos=True)])


# --- BUFFERED ---------------------------------------------------------------------------------------


def test_buffered_mode_routes_on_the_body_reply(service, client) -> None:
    prompt = list(range(7000, 7064))
    cache_on(service, PODS[0], prompt)
    replies = client.run([headers(mode=BUFFERED, response_mode=1), body(completion(prompt))])
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    assert not replies[0].request_headers.response.HasField("header_mutation")
    common = replies[1].request_body.response
    assert common.clear_route_cache
    assert set_headers(replies[1], "request_body") == {"x-gateway-destination-endpoint": PODS[0], "x-request-id": set_headers(replies[1], "request_body")["x-request-id"]}
    assert not common.HasField("body_mutation")
    assert metadata_destination(replies[1]) == PODS[0]


def test_buffered_mode_rewrite_replaces_body_with_matching_length(client) -> None:
    data = orjson.dumps({"model": "old", "prompt": "x"})
    replies = client.run([headers(mode=BUFFERED, extra={"x-llm-d-model-name-rewrite": "new"}), body(data)])
    common = replies[1].request_body.response
    assert orjson.loads(common.body_mutation.body)["model"] == "new"
    assert set_headers(replies[1], "request_body")["Content-Length"] == str(len(common.body_mutation.body))


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED])
def test_errors_in_both_modes(client, mode) -> None:
    replies = client.run([headers(mode=mode), body(b'{"prompt":[1]}')])
    assert immediate(replies[-1])[0] == 400


def test_buffered_response_body_is_continued_not_echoed(client) -> None:
    replies = client.run([headers(mode=BUFFERED, response_mode=1), body(completion()), response_headers(),
                          response_body(b'{"usage":{}}', eos=True)])
    assert replies[-1].WhichOneof("response") == "response_body"
    assert not replies[-1].response_body.response.HasField("body_mutation")


# --- limits and pools -------------------------------------------------------------------------------


def test_oversized_body_is_413(tmp_path: Path) -> None:
    with running_service(tmp_path, CONFIG, max_body_bytes=1000) as svc:
        c = Client(svc.grpc_port)
        (reply,) = c.run([headers(), body(b"x" * 600, eos=False), body(b"x" * 600)])
        code, text, _ = immediate(reply)
        assert code == 413 and b"exceeds the limit of 1000 bytes" in text
        c.close()


@pytest.mark.parametrize("header_only", [True, False])
def test_no_endpoints_is_503(tmp_path: Path, header_only: bool) -> None:
    with running_service(tmp_path, CONFIG, endpoints="") as svc:
        c = Client(svc.grpc_port)
        msgs: list[ProcessingRequest] = [headers("/v1/models", "GET", eos=True)] if header_only else [headers(), body(completion())]
        code, _, hdrs = immediate(c.run(msgs)[-1])
        assert code == 503 and hdrs["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
        c.close()


def test_dp_rank_ports_are_distinct_endpoints(tmp_path: Path) -> None:
    """T22: ip:8000 and ip:8001 are separate candidates and index ids."""
    with running_service(tmp_path, CONFIG, endpoints="10.1.0.1:8000,10.1.0.1:8001") as svc:
        c = Client(svc.grpc_port)
        cache_on(svc, "10.1.0.1:8001", PROMPT)
        assert set_headers(c.run([headers(), body(completion())])[0])["x-gateway-destination-endpoint"] == "10.1.0.1:8001"
        c.close()


# --- BUFFERED: the same rows (Envoy answers: headers at once, one body message, STREAMED responses) --


def buffered_destination(replies) -> str:
    """In BUFFERED mode the destination rides on the request-body reply."""
    assert [r.WhichOneof("response") for r in replies[:2]] == ["request_headers", "request_body"]
    assert replies[1].request_body.response.clear_route_cache
    destination = set_headers(replies[1], "request_body")["x-gateway-destination-endpoint"]
    assert metadata_destination(replies[1]) == destination
    return destination


def buffered_headers(**kwargs) -> ProcessingRequest:
    return headers(mode=BUFFERED, response_mode=1, **kwargs)


def test_buffered_cached_prefix_wins(service, client) -> None:
    prompt = list(range(8000, 8064))
    cache_on(service, PODS[2], prompt)
    assert buffered_destination(client.run([buffered_headers(), body(completion(prompt))])) == PODS[2]


def test_buffered_header_only_get_is_routed_at_once(client) -> None:
    (reply,) = client.run([buffered_headers(path="/v1/models", method="GET", eos=True)])
    assert set_headers(reply)["x-gateway-destination-endpoint"] in PODS


@pytest.mark.parametrize(
    ("subset", "allowed"),
    [
        (["192.168.1.1:8000", "192.168.1.2:8000"], PODS[:2]),
        (["192.168.1.3:8000"], PODS[2:]),
        ("192.168.1.2:8000,192.168.1.3:8000", PODS[1:]),
        (["192.168.1.1"], PODS[:1]),
        (["192.168.1.2:9999"], PODS[1:2]),
    ],
)
def test_buffered_subset_hint_restricts_candidates(service, client, subset, allowed) -> None:
    cache_on(service, PODS[0], PROMPT)
    for _ in range(5):
        replies = client.run([buffered_headers(), body(completion(), metadata=subset_metadata(subset))])
        assert buffered_destination(replies) in allowed


@pytest.mark.parametrize("subset", [["192.168.1.99:8000"], []])
def test_buffered_subset_hint_without_match_is_503(client, subset) -> None:
    replies = client.run([buffered_headers(), body(completion(), metadata=subset_metadata(subset))])
    code, _, hdrs = immediate(replies[-1])
    assert code == 503 and hdrs["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"prompt":"hello world"}', b"inference error: BadRequest - model not found in request body"),
        (b"no healthy upstream", b"inference error: BadRequest - error unmarshaling request body"),
        (b'{"model":"m","prompt":[1,2.5]}', b"inference error: BadRequest - prompt[1]: token id must be an integer"),
    ],
)
def test_buffered_bad_bodies_get_400(client, data, message) -> None:
    replies = client.run([buffered_headers(), body(data)])
    assert replies[0].WhichOneof("response") == "request_headers"
    code, text, _ = immediate(replies[-1])
    assert code == 400 and text.startswith(message)


def test_buffered_response_path_continues_and_records_usage(service, client) -> None:
    before = service.metrics.usage_tokens.labels("cached")._value.get()
    payload = orjson.dumps({"usage": {"prompt_tokens": 64, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 32}}})
    replies = client.run([buffered_headers(), body(completion()), response_headers(),
                          response_body(payload[:20]), response_body(payload[20:]), response_body(b"", eos=True)])
    kinds = [r.WhichOneof("response") for r in replies[2:]]
    assert kinds == ["response_headers", "response_body", "response_body", "response_body"]
    assert all(not r.response_body.response.HasField("body_mutation") for r in replies[3:])  # unchanged
    assert service.metrics.usage_tokens.labels("cached")._value.get() == before + 32


def test_buffered_invalid_json_response_and_sse_usage(service, client) -> None:
    replies = client.run([buffered_headers(), body(completion()), response_headers(),
                          response_body(b"no healthy upstream", eos=True)])
    assert replies[-1].WhichOneof("response") == "response_body"
    before = service.metrics.usage_tokens.labels("prompt")._value.get()
    client.run([buffered_headers(), body(completion(stream=True)), response_headers(content_type="text/event-stream"),
                response_body(b"data: {}\n\n"), response_body(b'data: {"usage":{"prompt_tokens":7}}\n\ndata: [DONE]\n\n'),
                response_body(b"", eos=True)])
    assert service.metrics.usage_tokens.labels("prompt")._value.get() == before + 7


def test_buffered_client_cancel_releases_state(service, client) -> None:
    release = threading.Event()

    def messages():
        yield buffered_headers(extra={"x-request-id": "buffered-cancel"})
        release.wait(10)

    call = client.stub.Process(messages(), timeout=10)
    assert next(call).WhichOneof("response") == "request_headers"  # answered at once in BUFFERED
    call.cancel()
    release.set()
    wait_for(lambda: service.extproc.active == 0, what="the cancelled stream to be released", timeout=5)
    assert buffered_destination(client.run([buffered_headers(), body(completion())])) in PODS


def test_buffered_oversized_body_is_413(tmp_path: Path) -> None:
    with running_service(tmp_path, CONFIG, max_body_bytes=1000) as svc:
        c = Client(svc.grpc_port)
        replies = c.run([buffered_headers(), body(b"x" * 1200)])
        code, text, _ = immediate(replies[-1])
        assert code == 413 and b"exceeds the limit of 1000 bytes" in text
        c.close()


def test_buffered_no_endpoints_is_503(tmp_path: Path) -> None:
    with running_service(tmp_path, CONFIG, endpoints="") as svc:
        c = Client(svc.grpc_port)
        code, _, hdrs = immediate(c.run([buffered_headers(), body(completion())])[-1])
        assert code == 503 and hdrs["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
        c.close()


def test_an_unknown_protocol_config_mode_is_a_clean_error_naming_the_field(client) -> None:
    """A gateway announcing a body mode this service lacks gets an immediate 500 that says which,
    not a gRPC failure with an exception text."""
    (reply,) = client.run([headers(mode=99), body(completion())])
    assert reply.immediate_response.status.code == 500
    assert b"protocol_config.request_body_mode 99" in reply.immediate_response.body


def test_a_huge_request_id_is_cut_before_it_is_kept(service, client) -> None:
    huge = "r" * (1 << 20)
    client.run([headers(extra={"x-request-id": huge}), body(completion())])
    kept = [d["requestId"] for d in service.extproc.recent_decisions]
    assert kept and all(len(r) <= 256 for r in kept) and kept[-1] == huge[:256]
