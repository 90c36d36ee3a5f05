"""Kubernetes discovery end to end: the real service, the real client library, a fake API server
speaking the wire protocol over a socket. Each case ends with the endpoint set and the KV-event
subscribers the running service holds (``/debug/state``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import PODS, POOLS, FakeApiServer, inference_pool, pod
from k8s_harness import (
    NAMESPACE,
    NOT_SERVING,
    SERVING,
    Running,
    fake_api,
    pool_discovery,
    running_service,
    served_pool,
    write_kubeconfig,
)

from ppc_extproc.index import PodEntry
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

pytestmark = pytest.mark.integration

A, B, C = "127.0.30.1", "127.0.30.2", "127.0.30.3"


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 120))


async def until_true(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def seed_index(svc: Running, endpoint: str) -> None:
    """Index entries for ``endpoint`` as if its engine had published them."""
    producer = svc.service.loaded.roles.producers[0]
    keys = producer.block_keys(TokenizedPrompt("m", (tokens_to_le32(list(range(64))),)))[0]
    producer.index.add(None, keys, [PodEntry(endpoint, "gpu")])


def index_entries(state: dict[str, Any]) -> dict[str, int]:
    return dict(state["plugins"]["precise-prefix-cache-producer"]["index"]["entriesPerEndpoint"])


def test_pods_becoming_ready_unready_deleted_and_changing_ip(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fake_api() as fake:
            fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
            fake.put(PODS, NAMESPACE, pod("qwen-0", A))
            fake.put(PODS, NAMESPACE, pod("qwen-1", B, ready=False))
            fake.put(PODS, NAMESPACE, pod("llama-0", "127.0.30.9", labels={"app": "llama"}))
            async with served_pool(tmp_path, fake) as svc:
                await svc.expect({f"{A}:8000": 0}, {f"{A}:8000": svc.sub(A)}, "only the ready, selected pod")
                # readiness follows the first complete list: the endpoint can be visible a moment before
                await until_true(svc.ready.is_set, "readiness after the first complete list")
                assert await svc.health() == SERVING

                fake.put(PODS, NAMESPACE, pod("qwen-1", B))
                await svc.expect({f"{A}:8000": 0, f"{B}:8000": 0},
                                 {f"{A}:8000": svc.sub(A), f"{B}:8000": svc.sub(B)}, "qwen-1 became ready")

                fake.put(PODS, NAMESPACE, pod("qwen-0", A, ready=False))
                await svc.expect({f"{B}:8000": 0}, {f"{B}:8000": svc.sub(B)}, "qwen-0 turned unready")

                seed_index(svc, f"{B}:8000")
                assert index_entries(await svc.state())[f"{B}:8000"] == 4
                fake.put(PODS, NAMESPACE, pod("qwen-1", C))  # the pod's IP changed
                await svc.expect({f"{C}:8000": 0}, {f"{C}:8000": svc.sub(C)}, "qwen-1's new IP")
                state = await svc.until(lambda s: f"{B}:8000" not in index_entries(s), "the old IP's index entries to go")
                assert svc.events[-2:] == [("DELETED", f"{B}:8000"), ("ADDED", f"{C}:8000")]

                fake.put(PODS, NAMESPACE, pod("qwen-1", C, deleting=True))  # terminating, still Ready
                await svc.expect({}, {}, "the terminating pod")
                fake.put(PODS, NAMESPACE, pod("qwen-1", C))
                await svc.expect({f"{C}:8000": 0}, {f"{C}:8000": svc.sub(C)}, "qwen-1 back")
                fake.put(PODS, NAMESPACE, pod("qwen-1", C, labels={"app": "other"}))  # leaves the selector
                await svc.expect({}, {}, "qwen-1 left the selector (a DELETED event on the watch)")

                fake.put(PODS, NAMESPACE, pod("qwen-0", A))
                await svc.expect({f"{A}:8000": 0}, {f"{A}:8000": svc.sub(A)}, "qwen-0 ready again")
                seed_index(svc, f"{A}:8000")
                del svc.events[:]
                fake.delete(PODS, NAMESPACE, "qwen-0", notify=True)
                fake.put(PODS, NAMESPACE, pod("qwen-0", A, uid="recreated"))  # same name and IP, new pod
                await until_true(lambda: ("ADDED", f"{A}:8000") in svc.events, "the recreated pod's endpoint")
                assert svc.events == [("DELETED", f"{A}:8000"), ("ADDED", f"{A}:8000")]
                state = await svc.until(lambda s: f"{A}:8000" not in index_entries(s), "the dead pod's entries to go")
                assert state["endpoints"][0]["name"] == "llm/qwen-0-rank-0"

                fake.delete(PODS, NAMESPACE, "qwen-0")
                await svc.expect({}, {}, "qwen-0 deleted")

    run(scenario)


def test_pool_selector_and_target_ports_changing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fake_api() as fake:
            fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000, 8001]))
            fake.put(PODS, NAMESPACE, pod("qwen-0", A))
            fake.put(PODS, NAMESPACE, pod("llama-0", B, labels={"app": "llama"}))
            async with served_pool(tmp_path, fake) as svc:
                await svc.expect({f"{A}:8000": 0, f"{A}:8001": 1},
                                 {f"{A}:8000": svc.sub(A, 0), f"{A}:8001": svc.sub(A, 1)}, "two DP ranks")
                pod_lists = len(fake.calls("pods", "list"))

                fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
                await svc.expect({f"{A}:8000": 0}, {f"{A}:8000": svc.sub(A, 0)}, "rank 1 removed with its port")
                assert len(fake.calls("pods", "list")) == pod_lists  # the cache has every pod: no relist

                fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "llama"}, [8001, 8000]))
                await svc.expect({f"{B}:8001": 0, f"{B}:8000": 1},
                                 {f"{B}:8001": svc.sub(B, 0), f"{B}:8000": svc.sub(B, 1)}, "the new selector's pods")
                assert [c.query.get("labelSelector") for c in fake.calls("pods")][-2:] == ["app=llama", "app=llama"]

                fake.delete(POOLS, NAMESPACE, "qwen-pool")
                await svc.expect({}, {}, "the pool deleted: every endpoint released")
                fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "llama"}, [8000]))
                await svc.expect({f"{B}:8000": 0}, {f"{B}:8000": svc.sub(B)}, "the pool recreated")
                fake.put(POOLS, NAMESPACE, inference_pool("other-pool", {"app": "qwen"}, [8000]))
                fake.put(PODS, NAMESPACE, pod("llama-1", C, labels={"app": "llama"}))
                await svc.expect({f"{B}:8000": 0, f"{C}:8000": 0},
                                 {f"{B}:8000": svc.sub(B), f"{C}:8000": svc.sub(C)}, "other pools ignored")
                assert {c.query.get("fieldSelector") for c in fake.calls("inferencepools")} == {"metadata.name=qwen-pool"}

    run(scenario)


def test_watch_that_expires_resumes_from_the_last_version_without_a_relist(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fake_api() as fake:
            fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
            fake.put(PODS, NAMESPACE, pod("qwen-0", A))
            async with served_pool(tmp_path, fake) as svc:
                await svc.expect({f"{A}:8000": 0}, {f"{A}:8000": svc.sub(A)}, "the first list")
                first = fake.calls("pods", "watch")[0].query
                assert first["allowWatchBookmarks"] == "true" and 300 <= int(first["timeoutSeconds"]) < 600
                fake.put(PODS, NAMESPACE, pod("qwen-1", B))
                await svc.expect({f"{A}:8000": 0, f"{B}:8000": 0},
                                 {f"{A}:8000": svc.sub(A), f"{B}:8000": svc.sub(B)}, "a watched add")
                fake.bookmark()
                bookmark_rv = str(fake.rv)
                fake.end_watches()  # the server's timeoutSeconds ran out
                await until_true(lambda: len(fake.calls("pods", "watch")) == 2, "the watch to resume")
                assert fake.calls("pods", "watch")[1].query["resourceVersion"] == bookmark_rv
                assert len(fake.calls("pods", "list")) == 1 and len(fake.calls("inferencepools", "list")) == 1
                fake.delete(PODS, NAMESPACE, "qwen-0")
                await svc.expect({f"{B}:8000": 0}, {f"{B}:8000": svc.sub(B)}, "an event on the resumed watch")
                assert len(fake.calls("pods", "list")) == 1

    run(scenario)


@pytest.mark.parametrize("gone", ["error-event", "http-410", "list-410-paginated"])
def test_410_relist_neither_drops_nor_duplicates_endpoints(tmp_path: Path, gone: str) -> None:
    async def scenario() -> None:
        async with fake_api(gone_as="http" if gone == "http-410" else "event",
                            list_gone_below_compaction=gone == "list-410-paginated",
                            page_size=1 if gone == "list-410-paginated" else None) as fake:
            fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
            fake.put(PODS, NAMESPACE, pod("qwen-0", A))
            fake.put(PODS, NAMESPACE, pod("qwen-1", B))
            async with served_pool(tmp_path, fake) as svc:
                await svc.expect({f"{A}:8000": 0, f"{B}:8000": 0},
                                 {f"{A}:8000": svc.sub(A), f"{B}:8000": svc.sub(B)}, "the first list")
                seen_rv = str(fake.rv)
                del svc.events[:]
                # Changes the watch never delivers (a gap), then the history is compacted.
                fake.delete(PODS, NAMESPACE, "qwen-1", notify=False)
                fake.put(PODS, NAMESPACE, pod("qwen-2", C), notify=False)
                fake.put(PODS, NAMESPACE, pod("qwen-0", A, labels={"app": "qwen", "rev": "2"}), notify=False)
                if gone == "http-410":
                    fake.compact(error_open_watches=False)
                    fake.end_watches()  # the rewatch from the old version gets HTTP 410
                else:
                    fake.compact()  # open watches get an ERROR event with a 410 Status
                await svc.expect({f"{A}:8000": 0, f"{C}:8000": 0},
                                 {f"{A}:8000": svc.sub(A), f"{C}:8000": svc.sub(C)}, "the relisted state")
                assert sorted(svc.events) == [("ADDED", f"{C}:8000"), ("DELETED", f"{B}:8000"), ("UPDATED", f"{A}:8000")]
                relists = fake.calls("pods", "list")[1:]
                assert relists[0].query.get("resourceVersion") == seen_rv  # last seen version, not "0"
                if gone == "list-410-paginated":  # that version is gone too: latest, in pages
                    assert [r.query.get("resourceVersion") for r in relists[1:]] == [None, None]
                    assert "continue" in relists[2].query and relists[1].query["limit"] == "500"
                else:
                    assert len(relists) == 1

    run(scenario)


def test_api_server_down_at_start(tmp_path: Path) -> None:
    async def scenario() -> None:
        fake = FakeApiServer()
        api_port = FakeApiServer.free_port()
        discovery = pool_discovery(write_kubeconfig(tmp_path, f"http://127.0.0.1:{api_port}"))
        try:
            fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
            fake.put(PODS, NAMESPACE, pod("qwen-0", A))
            async with running_service(tmp_path, discovery, FakeApiServer.free_port()) as svc:
                await until_true(lambda: any("Connect" in r.last_error for r in discovery.reflectors),
                                 "a refused connection to the API server")
                assert await svc.health() == NOT_SERVING and await svc.health("liveness") == SERVING
                assert not svc.ready.is_set()
                await fake.start(api_port)
                await svc.expect({f"{A}:8000": 0}, {f"{A}:8000": svc.sub(A)}, "the first list once the server is up")
                await until_true(svc.ready.is_set, "readiness")
                assert await svc.health() == SERVING
                await fake.stop()  # an outage after the first sync keeps the last endpoint set
                await until_true(lambda: any(r.last_error and "Connect" in r.last_error for r in discovery.reflectors[1:]),
                                 "the pods watch to notice the outage")
                state = await svc.state()
                assert [e["endpoint"] for e in state["endpoints"]] == [f"{A}:8000"] and await svc.health() == SERVING
        finally:
            await fake.stop()

    run(scenario)


def test_ready_only_after_the_pool_and_a_complete_pod_list(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fake_api() as fake:
            fake.put(PODS, NAMESPACE, pod("qwen-0", A))
            release = fake.hold_lists[("", "pods")] = asyncio.Event()
            async with served_pool(tmp_path, fake) as svc:
                await until_true(lambda: len(fake.calls("inferencepools", "watch")) == 1, "the pool watch (no pool yet)")
                assert await svc.health() == NOT_SERVING and not fake.calls("pods")
                fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
                await until_true(lambda: len(fake.calls("pods", "list")) == 1, "the pod list to be asked for")
                assert await svc.health() == NOT_SERVING and not svc.ready.is_set()
                release.set()
                await until_true(svc.ready.is_set, "readiness after the pod list")
                assert await svc.health() == SERVING
                await svc.expect({f"{A}:8000": 0}, {f"{A}:8000": svc.sub(A)}, "the listed pod")

    run(scenario)


def test_endpoint_selector_mode_watches_pods_without_a_pool(tmp_path: Path) -> None:
    from ppc_extproc.discovery.kubernetes import KubernetesDiscovery, KubernetesFlags, config_from_flags

    async def scenario() -> None:
        async with fake_api() as fake:
            fake.put(PODS, NAMESPACE, pod("vllm-0", A, labels={"app": "vllm", "env": "prod"}))
            fake.put(PODS, NAMESPACE, pod("vllm-1", B, labels={"app": "vllm", "env": "dev"}))
            fake.put(PODS, NAMESPACE, pod("vllm-2", C, labels={"app": "vllm", "env": "staging"}))
            flags = KubernetesFlags(endpoint_selector="app=vllm,env in (prod,staging)", endpoint_target_ports="8000,8001",
                                    pool_namespace=NAMESPACE, kubeconfig=write_kubeconfig(tmp_path, fake.url))
            config = config_from_flags(flags, environ={})
            assert config is not None
            discovery = KubernetesDiscovery(config, environ={})
            async with running_service(tmp_path, discovery, FakeApiServer.free_port()) as svc:
                expected = {f"{ip}:{p}": r for ip in (A, C) for r, p in enumerate((8000, 8001))}
                await svc.expect(expected, {e: svc.sub(e.split(":")[0], r) for e, r in expected.items()}, "selected pods")
                assert not fake.calls("inferencepools")
                assert {c.query["labelSelector"] for c in fake.calls("pods")} == {"app=vllm,env in (prod,staging)"}

    run(scenario)


def test_forbidden_watch_is_fatal_at_startup_naming_resource_and_verb(tmp_path: Path) -> None:
    from fake_apiserver import Rule

    from ppc_extproc.errors import ConfigError

    async def scenario() -> None:
        rules = [Rule(frozenset({"inference.networking.k8s.io"}), frozenset({"inferencepools"}), frozenset({"list", "watch"})),
                 Rule(frozenset({""}), frozenset({"pods"}), frozenset({"list"}))]
        async with fake_api(rules=rules) as fake:
            fake.put(POOLS, NAMESPACE, inference_pool("qwen-pool", {"app": "qwen"}, [8000]))
            fake.put(PODS, NAMESPACE, pod("qwen-0", A))
            with pytest.raises(ConfigError) as info:
                async with served_pool(tmp_path, fake) as svc:
                    await asyncio.wait_for(svc.task, 15)
            assert info.value.path == "rbac" and "forbidden to watch pods in namespace llm" in info.value.message

    run(scenario)
