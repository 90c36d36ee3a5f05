"""Inputs llm-d tolerates: replaced values, ignored parameters, the deprecated precise scorer.

Follows ``llm-d/llm-d-router``: ``pkg/epp/framework/plugins/scheduling/picker/*`` (``maxNumOfEndpoints``
≤ 0 becomes 1), ``…/scheduling/scorer/activerequest/`` (``requestTimeout`` ignored),
``pkg/epp/framework/plugins/datalayer/discovery/file/`` (``watchFile`` false reads once) and
``…/scheduling/scorer/preciseprefixcache/`` (the deprecated scorer's two modes).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from epp_helpers import config_error, epp, load, pipeline, router_for, until

from ppc_extproc.discovery.file import FileDiscovery
from ppc_extproc.events.wire import BlockStored, EventBatch
from ppc_extproc.framework import PREFIX_CACHE_MATCH_INFO, Endpoint, LLMRequest
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.scorers import PrefixCacheScorer
from ppc_extproc.plugins.scorers.precise_prefix_cache import PrecisePrefixCacheScorer
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

A, B = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)
DEPRECATED_SCORER = ("DEPRECATION: plugin type 'precise-prefix-cache-scorer' is deprecated; use "
                     "precise-prefix-cache-producer + prefix-cache-scorer")  # fmt: skip


@pytest.mark.parametrize("picker", ["max-score-picker", "random-picker", "weighted-random-picker"])
@pytest.mark.parametrize("value", [0, -3])
def test_max_num_of_endpoints_below_one_becomes_one_with_a_warning(picker: str, value: int) -> None:
    loaded = load(f"plugins: [{{type: {picker}, parameters: {{maxNumOfEndpoints: {value}}}}}]\n")
    assert loaded.plugins[picker].max_endpoints == 1  # type: ignore[attr-defined]
    assert loaded.warnings == [f"plugins[0].parameters.maxNumOfEndpoints: {value} is replaced by 1 (llm-d does the same silently)"]


@pytest.mark.parametrize("timeout", ["2m", "not-a-duration", ""])
def test_active_request_scorer_request_timeout_is_accepted_and_ignored(timeout: str) -> None:
    loaded = load(f"plugins: [{{type: active-request-scorer, parameters: {{requestTimeout: {timeout!r}}}}}]\n")
    assert pipeline(loaded)["profiles"]["default"]["scorers"] == [("active-request-scorer", 1.0)]
    assert loaded.warnings == [
        "plugins[0].parameters.requestTimeout: deprecated and ignored: in-flight tracking ends with each response"
    ]


# --- file-discovery.watchFile ------------------------------------------------------------------------


def _write(path: Path, text: str, bump: int) -> None:
    """Rewrite ``path`` with a modification time ``bump`` seconds ahead (a change any poll sees)."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + bump * 1_000_000_000))


def test_watch_file_false_reads_the_file_once(tmp_path: Path) -> None:
    """A watching discovery on the same file is the clock: once it has seen two later edits, the
    non-watching one, polling as often, would have seen them too."""
    path = tmp_path / "endpoints.yaml"
    _write(path, "- {address: 10.0.0.1, port: 8000}\n", 0)

    def discovery(watch: bool) -> FileDiscovery:
        loaded = load(f"""
plugins:
- {{type: file-discovery, parameters: {{path: {str(path)!r}, watchFile: {str(watch).lower()}, pollInterval: 10ms}}}}
- {{type: max-score-picker}}
dataLayer: {{discovery: {{pluginRef: file-discovery}}}}
""")
        assert isinstance(loaded.discovery, FileDiscovery) and loaded.discovery.watch is watch
        return loaded.discovery

    once, watching = discovery(False), discovery(True)

    async def scenario() -> None:
        once_pool, watched_pool = EndpointPool(), EndpointPool()
        replaced: list[int] = []
        once_pool.subscribe(lambda event: replaced.append(len(replaced)))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(once.run(once_pool, stop)), asyncio.create_task(watching.run(watched_pool, stop))]
        try:
            await until(lambda: len(once_pool) == 1 and len(watched_pool) == 1)
            for bump, address in ((1, "10.0.0.2"), (2, "10.0.0.3")):
                _write(path, f"- {{address: {address}, port: 8000}}\n", bump)
                await until(lambda: [e.address for e in watched_pool.endpoints()] == [address])
            assert [e.address for e in once_pool.endpoints()] == ["10.0.0.1"]
            assert replaced == [0]  # the first read's one ADDED event, nothing since
            assert not tasks[0].done()  # it waits for the stop, it does not exit
        finally:
            stop.set()
            await asyncio.gather(*tasks)

    asyncio.run(scenario())


# --- precise-prefix-cache-scorer ---------------------------------------------------------------------


def _store(producer: PrecisePrefixCacheProducer, endpoint: Endpoint, tokens: list[int]) -> None:
    event = BlockStored(list(range(1000, 1000 + len(tokens) // 16)), None, tokens, 16)
    producer.applier.apply_batch(endpoint.id, "m", EventBatch(0.0, [event]))


def _scores(loaded, scorer: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The scorer's scores for a 64-token prompt whose first two blocks B holds."""
    router = router_for(loaded, [A, B])
    request = LLMRequest("r", "m", TokenizedPrompt("m", (tokens_to_le32(range(64)),)))
    decision = asyncio.run(router.route(request, dry_run=True))
    return decision.result.primary.scores[scorer]


PRODUCER = "{type: precise-prefix-cache-producer, name: pp, parameters: {tokenProcessorConfig: {blockSizeTokens: 16}, kvEventsConfig: {discoverPods: false}}}"
LEGACY = "{type: precise-prefix-cache-scorer, parameters: {tokenProcessorConfig: {blockSizeTokens: 32}, bogus: 1}}"


@pytest.mark.parametrize("plugins", [f"[{LEGACY}, {PRODUCER}]", f"[{PRODUCER}, {LEGACY}]"], ids=["scorer-first", "producer-first"])
def test_with_one_precise_producer_the_deprecated_scorer_reads_it(plugins: str) -> None:
    loaded = load(f"plugins: {plugins}\n")
    scorer = loaded.plugins["precise-prefix-cache-scorer"]
    assert isinstance(scorer, PrefixCacheScorer) and scorer.match_key == PREFIX_CACHE_MATCH_INFO.of("pp")
    assert pipeline(loaded)["producers"] == ["pp"]  # its own parameters (and unknown keys) are ignored
    assert pipeline(loaded)["profiles"]["default"]["scorers"] == [("precise-prefix-cache-scorer", 1.0)]
    _store(loaded.plugins["pp"], B, list(range(32)))  # type: ignore[arg-type]
    assert _scores(loaded, "precise-prefix-cache-scorer") == {A.id: 0.0, B.id: 0.5}
    assert [w for w in loaded.warnings if "DEPRECATION" in w] == [f"{'plugins[0]' if plugins.startswith(f'[{LEGACY}') else 'plugins[1]'}.parameters: {DEPRECATED_SCORER}"]


def test_with_two_precise_producers_the_deprecated_scorer_is_an_error() -> None:
    error = config_error(epp(f"plugins: [{PRODUCER}, {LEGACY}, {{type: precise-prefix-cache-producer, name: pq}}]\n"))
    assert error.path == "plugins[1].type"
    assert "multiple precise-prefix-cache-producer instances configured (pp, pq)" in error.message


def test_without_a_precise_producer_the_deprecated_scorer_hosts_its_own() -> None:
    loaded = load("plugins: [{type: precise-prefix-cache-scorer, parameters: "
                  "{tokenProcessorConfig: {blockSizeTokens: 16}, kvEventsConfig: {discoverPods: false}}}]\n")
    scorer = loaded.plugins["precise-prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer) and scorer.block_size == 16
    assert pipeline(loaded)["producers"] == ["precise-prefix-cache-scorer"]
    assert pipeline(loaded)["profiles"]["default"]["scorers"] == [("precise-prefix-cache-scorer", 1.0)]
    _store(scorer, B, list(range(48)))
    assert _scores(loaded, "precise-prefix-cache-scorer") == {A.id: 0.0, B.id: 0.75}
    assert loaded.warnings == [f"plugins[0].parameters: {DEPRECATED_SCORER}"]  # it reads its own match info
