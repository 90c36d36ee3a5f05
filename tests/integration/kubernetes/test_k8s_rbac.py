"""The Role in deploy/kubernetes/ grants exactly what the client calls: the real client runs against
an API server fake that enforces that Role's rules (403 otherwise), through list, watch, a resumed
watch and a 410 relist, with leader election on its Lease (create, renew, release) and the CRD watch
(InferenceModelRewrite, InferenceObjective: from llm-d.ai, then with that group not installed from
the legacy inference.networking.x-k8s.io), and the calls it made are compared with the grants."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fake_apiserver import PODS, POOLS, Rule, inference_pool, pod
from k8s_harness import NAMESPACE, fake_api, served_pool, write_kubeconfig
from k8s_manifests import objects, render, role_grants

from ppc_extproc.discovery.kubernetes.auth import kubeconfig_access
from ppc_extproc.discovery.kubernetes.crds import CrdWatcher
from ppc_extproc.discovery.kubernetes.lease import LeaderElector, LeaseConfig
from ppc_extproc.discovery.kubernetes.reviews import MetricsAuthorizer
from ppc_extproc.scheduling.objectives import ModelRewrites, Objectives

pytestmark = pytest.mark.integration


def manifest_rules() -> list[Rule]:
    docs = render()
    rules = objects(docs, "Role")["ppc-extproc"]["rules"] + objects(docs, "ClusterRole")["ppc-extproc-metrics-auth"]["rules"]
    return [Rule(frozenset(r["apiGroups"]), frozenset(r["resources"]), frozenset(r["verbs"])) for r in rules]


def test_the_manifest_role_covers_exactly_the_calls_the_client_makes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with fake_api(rules=manifest_rules()) as fake:
            fake.put(POOLS, NAMESPACE, inference_pool("vllm-qwen", {"app": "vllm-qwen"}, [8000]))
            fake.put(PODS, NAMESPACE, pod("vllm-0", "127.0.30.1", labels={"app": "vllm-qwen"}))
            elector = LeaderElector(LeaseConfig(NAMESPACE, "epp-llm-vllm-qwen.llm-d.ai", "me", retry_period_seconds=0.05),
                                    access=await kubeconfig_access(write_kubeconfig(tmp_path, fake.url)))
            lease_stop = asyncio.Event()
            election = asyncio.create_task(elector.run(lease_stop))
            async with served_pool(tmp_path, fake, pool_name="vllm-qwen") as svc:
                await svc.expect({"127.0.30.1:8000": 0}, {"127.0.30.1:8000": svc.sub("127.0.30.1")}, "the first list")
                fake.end_watches()  # resumed watches
                fake.put(PODS, NAMESPACE, pod("vllm-1", "127.0.30.2", labels={"app": "vllm-qwen"}))
                await svc.until(lambda s: len(s["endpoints"]) == 2, "a watched pod")
                fake.compact()  # 410: relists
                await svc.until(lambda s: len(fake.calls("pods", "list")) == 2 and len(fake.calls("inferencepools", "list")) == 2,
                                "the relists")
                fake.put(PODS, NAMESPACE, pod("vllm-1", "127.0.30.2", labels={"app": "vllm-qwen"}, ready=False))
                await svc.expect({"127.0.30.1:8000": 0}, {"127.0.30.1:8000": svc.sub("127.0.30.1")}, "after the relist")
                await svc.until(lambda s: elector.is_leader and len(fake.calls("leases", "update")) >= 2, "renewals")
            lease_stop.set()
            await asyncio.wait_for(election, 10)
            lease = fake.lease(NAMESPACE, "epp-llm-vllm-qwen.llm-d.ai")
            assert lease is not None and lease["spec"]["holderIdentity"] == ""  # released
            for group in ("llm-d.ai", "inference.networking.x-k8s.io"):
                fake.put((group, "v1alpha2", "inferenceobjectives"), NAMESPACE, {
                    "metadata": {"name": "batch"}, "spec": {"poolRef": {"name": "vllm-qwen"}, "priority": -1}})
            for missing in (set(), {("llm-d.ai", "inferencemodelrewrites"), ("llm-d.ai", "inferenceobjectives")}):
                fake.missing = missing
                watches = len(fake.calls("inferenceobjectives", "watch"))
                watcher = CrdWatcher(NAMESPACE, "vllm-qwen", ModelRewrites(), Objectives(),
                                     access=await kubeconfig_access(write_kubeconfig(tmp_path, fake.url)))
                crd_stop = asyncio.Event()
                crd_task = asyncio.create_task(watcher.run(crd_stop))
                while len(fake.calls("inferenceobjectives", "watch")) == watches or \
                        len(fake.calls("inferencemodelrewrites", "watch")) == watches:
                    assert not crd_task.done(), crd_task
                    await asyncio.sleep(0.02)
                while watcher.objectives.priority("batch") != -1:
                    await asyncio.sleep(0.02)
                crd_stop.set()
                await asyncio.wait_for(crd_task, 10)
            authorizer = MetricsAuthorizer(access=await kubeconfig_access(write_kubeconfig(tmp_path, fake.url)))
            assert await authorizer.check("Bearer prometheus-token", "/metrics", "GET") == 200
            await authorizer.close()
        calls = {(r.group, r.resource, r.verb) for r in fake.requests}
        assert calls == role_grants() | {rule for rule in _cluster_grants()}

    asyncio.run(asyncio.wait_for(scenario(), 120))


def _cluster_grants() -> set[tuple[str, str, str]]:
    role = objects(render(), "ClusterRole")["ppc-extproc-metrics-auth"]
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
