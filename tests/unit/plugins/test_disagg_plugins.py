"""The other P/D plugins: role filters, the deprecated handlers, topology affinity, the P2P source
producer, and the headers as the ext_proc reply carries them.

Ports ``llm-d/llm-d-router``'s ``filter/bylabel/roles_test.go`` (prefill drops unlabelled, ``both``
accepted), ``disagg/pd_profile_handler_test.go``, ``disagg/disagg_headers_handler_test.go``,
``filter/topologyaffinity/filter_test.go``, ``scorer/topologyaffinity/scorer_test.go`` and
``dataproducer/p2psource/producer_test.go``.
"""

from __future__ import annotations

import asyncio

from epp_helpers import config_error, epp, extproc_request, load
from integration.extproc.harness import set_headers
from pd_helpers import DECODERS, PREFILLERS, decide, pod, prompt, router

from ppc_extproc.framework import DISAGG_PEER, Endpoint, LLMRequest, SchedulingContext, SchedulingResult
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.filters.role import EncodeFilter, PrefillFilter
from ppc_extproc.plugins.filters.topology_affinity import TopologyAffinityFilter
from ppc_extproc.plugins.producers.p2p_source import KV_CACHE_SOURCE_HEADER, P2PSourceProducer, fnv32a
from ppc_extproc.plugins.producers.topology_extractor import Level, TopologyExtractor
from ppc_extproc.plugins.profile_handlers.data_parallel import DATA_PARALLEL_HEADER
from ppc_extproc.plugins.profile_handlers.disagg_stages import PREFILL_HEADER
from ppc_extproc.plugins.scorers.topology_affinity import TopologyAffinityScorer

PREFILL_IDS = {e.id for e in PREFILLERS}


def ctx_for(endpoints: list[Endpoint], n_tokens: int = 100) -> SchedulingContext:
    return SchedulingContext(LLMRequest("req-1", "m", prompt(n_tokens)), list(endpoints))


def test_prefill_and_encode_filters_keep_their_roles_and_drop_unlabelled() -> None:
    roles = ["prefill", "decode", "both", "prefill-decode", "encode", "encode-prefill", "encode-prefill-decode", None]
    endpoints = [pod(i, role) for i, role in enumerate(roles, 1)]
    kept = [e.label("llm-d.ai/role") for e in PrefillFilter().filter(ctx_for(endpoints), endpoints)]
    assert kept == ["prefill", "both", "prefill-decode", "encode-prefill", "encode-prefill-decode"]
    kept = [e.label("llm-d.ai/role") for e in EncodeFilter().filter(ctx_for(endpoints), endpoints)]
    assert kept == ["encode", "encode-prefill", "encode-prefill-decode"]
    assert PrefillFilter().name == "prefill-filter"


LEGACY = """
plugins:
- {{type: prefill-filter}}
- {{type: decode-filter}}
- {{type: prefix-based-pd-decider, parameters: {{nonCachedTokens: 16}}}}
- {{type: pd-profile-handler, parameters: {handler}}}
{extra}
schedulingProfiles:
- {{name: prefill, plugins: [{{pluginRef: prefill-filter}}]}}
- {{name: decode, plugins: [{{pluginRef: decode-filter}}]}}
"""


def test_pd_profile_handler_needs_the_headers_handler_for_the_header() -> None:
    alone = load(LEGACY.format(handler="{}", extra=""))
    assert any("pd-profile-handler is deprecated" in w for w in alone.warnings)
    decision = decide(router(alone), prompt(300))
    assert PREFILL_HEADER not in dict(decision.result.headers)
    assert decision.result.kv_source is not None and decision.result.kv_source.id in PREFILL_IDS
    assert alone.handler.counters.counts == {("pd", "m", "prefill-decode"): 1}  # type: ignore[attr-defined]
    for headers_type in ("disagg-headers-handler", "prefill-header-handler"):
        paired = load(LEGACY.format(handler="{}", extra=f"- {{type: {headers_type}}}"))
        assert any(f"{headers_type} is deprecated" in w for w in paired.warnings)
        assert dict(decide(router(paired), prompt(300)).result.headers)[PREFILL_HEADER] in PREFILL_IDS


def test_pd_profile_handler_primary_port_and_bad_decider() -> None:
    loaded = load(LEGACY.format(handler="{primaryPort: 9000}", extra=""))
    decision = decide(router(loaded), prompt(300))
    assert decision.destination == f"{decision.primary.address}:9000"
    assert dict(decision.result.headers)[DATA_PARALLEL_HEADER] == decision.primary.id
    error = config_error(epp(LEGACY.format(handler="{primaryPort: 70000}", extra="")))
    assert error.path == "plugins[3].parameters.primaryPort" and "invalid primaryPort" in error.message
    error = config_error(epp(LEGACY.format(handler="{deciderPluginName: nope}", extra="")))
    assert "invalid decider plugin type: nope" in error.message


def test_topology_filter_keeps_same_host_prefillers_and_fails_open() -> None:
    host = "kubernetes.io/hostname"
    decode = pod(1, "decode", **{host: "h1", "topology.kubernetes.io/zone": "z1"})
    same_host = pod(2, "prefill", **{host: "h1"})
    same_zone = pod(3, "prefill", **{host: "h2", "topology.kubernetes.io/zone": "z1"})
    elsewhere = pod(4, "prefill", **{host: "h3", "topology.kubernetes.io/zone": "z2"})
    endpoints = [decode, same_host, same_zone, elsewhere]
    ctx = ctx_for(endpoints)
    TopologyExtractor().produce(ctx)
    flt = TopologyAffinityFilter()
    candidates = [same_host, same_zone, elsewhere]
    assert flt.filter(ctx, candidates) == candidates  # no peer yet: fails open
    ctx.put(DISAGG_PEER, decode)
    assert flt.filter(ctx, candidates) == [same_host]
    assert TopologyAffinityFilter(min_affinity=Level.ZONE).filter(ctx, candidates) == [same_host, same_zone]
    assert flt.filter(ctx, [elsewhere]) == [elsewhere]  # nothing close enough: fails open
    scores = TopologyAffinityScorer().score(ctx, candidates)
    assert scores == {same_host.id: 1.0, same_zone.id: 0.05, elsewhere.id: 0.0}
    error = config_error(epp("plugins:\n- {type: topology-affinity-filter, parameters: {minAffinity: galaxy}}\n"))
    assert error.path == "plugins[0].parameters.minAffinity"


def test_p2p_source_names_the_peer_caching_more_than_the_computing_endpoint() -> None:
    a, b, c = pod(1, "decode"), pod(2, "decode"), pod(3, "decode")
    ctx = ctx_for([a, b, c], 512)
    key = P2PSourceProducer().match_key
    for endpoint, blocks in ((a, 0), (b, 8), (c, 2)):
        ctx.put_endpoint_value(endpoint.id, key, PrefixCacheMatchInfo(blocks, 8, 64, blocks))
    producer = P2PSourceProducer()
    producer.produce(ctx)
    result = SchedulingResult.of([a])
    producer.pre_request(ctx, result)
    assert dict(result.headers)[KV_CACHE_SOURCE_HEADER] == b.id
    onto_b = SchedulingResult.of([b])
    producer.pre_request(ctx, onto_b)
    assert KV_CACHE_SOURCE_HEADER not in dict(onto_b.headers)  # already the computing endpoint
    assert KV_CACHE_SOURCE_HEADER in onto_b.remove_headers
    assert fnv32a(b"") == 0x811C9DC5 and fnv32a(b"a") == 0xE40C292C  # Go hash/fnv New32a vectors


def test_the_ext_proc_reply_sets_the_prefill_header_and_drops_inbound_values() -> None:
    from pd_helpers import pd_config

    r = router(pd_config())
    body = b'{"model": "m", "prompt": [' + b",".join(str(i).encode() for i in range(300)) + b'], "max_tokens": 4}'
    replies = asyncio.run(extproc_request(r, "/v1/completions", body))
    mutation = replies[0].request_headers.response.header_mutation
    assert set_headers(replies[0])[PREFILL_HEADER] in PREFILL_IDS
    assert set(mutation.remove_headers) >= {PREFILL_HEADER, "x-encoder-hosts-ports"}
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] in {e.id for e in DECODERS}


def test_role_labels_from_file_discovery_reach_the_filters() -> None:
    from pd_helpers import pd_config

    from ppc_extproc.discovery import parse_endpoints_document

    endpoints = parse_endpoints_document("""
- {name: decode-0, address: 10.1.0.1, port: 8000, labels: {llm-d.ai/role: decode}}
- {name: prefill-0, address: 10.1.0.2, port: 8000, labels: {llm-d.ai/role: prefill, kubernetes.io/hostname: h1}}
- {name: plain, address: 10.1.0.3, port: 8000}
""")
    decision = decide(router(pd_config(), endpoints), prompt(300))
    assert decision.primary.id in {"10.1.0.1:8000", "10.1.0.3:8000"}  # an unlabelled pod may decode
    assert dict(decision.result.headers)[PREFILL_HEADER] == "10.1.0.2:8000"  # only the labelled prefiller


def test_role_and_topology_labels_of_kubernetes_pods_reach_the_plugins() -> None:
    from ppc_extproc.discovery.kubernetes.pods import parse_pod, pod_endpoints

    def k8s_pod(name: str, ip: str, labels: dict[str, str]) -> Endpoint:
        obj = {"kind": "Pod", "metadata": {"name": name, "namespace": "llm", "labels": labels},
               "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}
        return pod_endpoints(parse_pod(obj), (8000,))[0]

    decode = k8s_pod("d", "10.3.0.1", {"llm-d.ai/role": "decode", "kubernetes.io/hostname": "n1"})
    near = k8s_pod("p1", "10.3.0.2", {"llm-d.ai/role": "prefill", "kubernetes.io/hostname": "n1"})
    far = k8s_pod("p2", "10.3.0.3", {"llm-d.ai/role": "prefill", "kubernetes.io/hostname": "n2"})
    ctx = ctx_for([decode, near, far])
    assert PrefillFilter().filter(ctx, [decode, near, far]) == [near, far]
    TopologyExtractor().produce(ctx)
    ctx.put(DISAGG_PEER, decode)
    assert TopologyAffinityFilter().filter(ctx, [near, far]) == [near]
