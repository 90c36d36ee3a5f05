"""``decode-filter``: keep endpoints that can decode, by their ``llm-d.ai/role`` label.

Ports ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/filter/bylabel/roles_test.go``
(``TestRoleFilterDecodeRole``, ``TestRoleFilterEmptyEndpoints``), plus the filter in a profile.
"""

from __future__ import annotations

import asyncio

import pytest
from epp_helpers import extproc_request, load, router_for
from integration.extproc.harness import set_headers

from ppc_extproc.errors import SaturatedError
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.filters.role import ROLE_LABEL, DecodeFilter


def pod(i: int, role: str | None, **labels: str) -> Endpoint:
    all_labels = dict(labels)
    if role is not None:
        all_labels[ROLE_LABEL] = role
    return Endpoint(f"10.0.0.{i}", 8000, name=f"pod-{i}", labels=tuple(sorted(all_labels.items())))


ROLES = {
    "decode": pod(1, "decode"),
    "prefill": pod(2, "prefill"),
    "prefill-decode": pod(3, "prefill-decode"),
    "both": pod(4, "both"),
    "encode-prefill-decode": pod(5, "encode-prefill-decode"),
    "encode": pod(6, "encode"),
    "encode-prefill": pod(7, "encode-prefill"),
    "other labels only": pod(8, None, app="vllm"),
    "no labels": pod(9, None),
}


def kept(endpoints: list[Endpoint]) -> list[Endpoint]:
    ctx = SchedulingContext(LLMRequest("r", "m"), list(endpoints))
    return DecodeFilter().filter(ctx, endpoints)


def test_decode_keeps_decoding_roles_and_unlabelled_endpoints() -> None:
    names = {e.name for e in kept(list(ROLES.values()))}
    assert names == {ROLES[k].name for k in ("decode", "prefill-decode", "both", "encode-prefill-decode",
                                              "other labels only", "no labels")}  # fmt: skip


@pytest.mark.parametrize("role", ["Decode", " decode", "decode ", "decoder", ""])
def test_roles_match_exactly(role: str) -> None:
    assert kept([pod(1, role)]) == []


def test_no_endpoints_in_no_endpoints_out() -> None:
    assert kept([]) == []


def test_in_a_profile_the_filter_leaving_nothing_is_a_429() -> None:
    loaded = load("plugins: [{type: decode-filter}, {type: random-picker}]\n")
    router = router_for(loaded, [ROLES["prefill"], ROLES["encode"]])
    with pytest.raises(SaturatedError) as info:
        asyncio.run(router.route(LLMRequest("r", "m", None)))
    assert info.value.status == 429 and info.value.dropped_reason == "rejected-saturated"
    assert info.value.message.startswith("no endpoints available for the given request")
    replies = asyncio.run(extproc_request(router, "/v1/completions", b'{"model": "m", "prompt": [1, 2, 3]}'))
    (reply,) = replies
    assert reply.immediate_response.status.code == 429
    headers = {h.header.key: h.header.raw_value.decode() for h in reply.immediate_response.headers.set_headers}
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"


def test_in_a_profile_only_decoders_are_picked() -> None:
    loaded = load("plugins: [{type: decode-filter}, {type: random-picker}]\n")
    router = router_for(loaded, [ROLES["prefill"], ROLES["decode"], ROLES["encode"]])
    prompt = LLMRequest("r", "m", None)
    for _ in range(20):
        assert asyncio.run(router.route(prompt, dry_run=True)).primary == ROLES["decode"]
    reply = asyncio.run(extproc_request(router, "/v1/completions", b'{"model": "m", "prompt": [1, 2, 3]}'))[0]
    assert set_headers(reply)["x-gateway-destination-endpoint"] == ROLES["decode"].id
