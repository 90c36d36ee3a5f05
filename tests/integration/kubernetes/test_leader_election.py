"""Two replicas of the installed entrypoint, each given the argument list llm-d's chart renders for
several replicas (``--ha-enable-leader-election``), against the fake API server's Leases: exactly one
is ready on the health port; when it is killed (SIGKILL, so it cannot release the Lease) the other
takes over once the Lease expires (llm-d's 15 s lease duration) and becomes ready. Liveness serves
on both throughout. A clean stop (SIGTERM) releases the Lease, so the successor does not wait."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from fake_apiserver import PODS, POOLS, inference_pool, pod
from k8s_harness import NAMESPACE, fake_api, write_kubeconfig
from test_llmd_chart_args import CONFIG, SERVING, chart_args, free_port, health_status, until

pytestmark = pytest.mark.integration

LEASE = f"epp-{NAMESPACE}-qwen.llm-d.ai"


def _start(tmp_path: Path, index: int, env: dict[str, str], config: Path) -> tuple[subprocess.Popen[bytes], int]:
    health_port = free_port()
    args = chart_args(replicas=3, config_file=config, grpc_port=free_port(), health_port=health_port,
                      metrics_port=free_port(), extra_flags={"drain-timeout": "0s"})
    with (tmp_path / f"epp-{index}.log").open("wb") as log_file:
        process = subprocess.Popen(["ppc-extproc", *args], env={**env, "POD_NAME": f"qwen-epp-{index}"},
                                   stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True)
    return process, health_port


async def _ready(port: int) -> bool:
    return await health_status(port, "readiness") == SERVING


@pytest.mark.skipif(shutil.which("ppc-extproc") is None, reason="needs the installed ppc-extproc entrypoint")
@pytest.mark.parametrize("stop", ["kill", "term"])
def test_one_leader_is_ready_and_the_other_takes_over(tmp_path: Path, stop: str) -> None:
    config = tmp_path / "default-plugins.yaml"
    config.write_text(CONFIG.format(kv_port=free_port()))

    async def scenario() -> None:
        replicas: list[tuple[subprocess.Popen[bytes], int]] = []
        try:
            async with fake_api() as fake:
                fake.put(POOLS, NAMESPACE, inference_pool("qwen", {"app": "qwen"}, [8000]))
                fake.put(PODS, NAMESPACE, pod("qwen-0", "127.0.77.1"))
                env = {**os.environ, "KUBECONFIG": write_kubeconfig(tmp_path, fake.url), "NAMESPACE": NAMESPACE}
                replicas = [_start(tmp_path, i, env, config) for i in range(2)]
                ports = [port for _, port in replicas]

                async def one_ready() -> tuple[int] | None:
                    states = [await _ready(p) for p in ports]
                    return (states.index(True),) if states.count(True) == 1 else None

                (leader,) = await until(one_ready, "one replica ready", timeout=60)
                follower = 1 - leader
                lease = fake.lease(NAMESPACE, LEASE)
                assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 15
                holder = lease["spec"]["holderIdentity"]
                # The follower stays unready while the leader renews: several retry periods.
                await until(lambda: _renewed_since(fake, lease["metadata"]["resourceVersion"], times=3), "renewals",
                            timeout=30)
                assert not await _ready(ports[follower])
                assert fake.lease(NAMESPACE, LEASE)["spec"]["holderIdentity"] == holder
                for port in ports:
                    assert await health_status(port, "liveness") == SERVING

                process = replicas[leader][0]
                if stop == "kill":
                    process.kill()
                else:
                    process.send_signal(signal.SIGTERM)
                    assert await asyncio.to_thread(process.wait, 30) == 0
                    # Released on the way out: empty, or already taken by the follower (its next retry
                    # can come before this read), never still the old holder's for the lease's 15 s.
                    released = fake.lease(NAMESPACE, LEASE)["spec"]
                    assert released["holderIdentity"] != holder, released
                    if released["holderIdentity"] == "":
                        assert released["leaseDurationSeconds"] == 1
                await until(lambda: _ready(ports[follower]), "the follower takes over", timeout=60)
                taken = fake.lease(NAMESPACE, LEASE)["spec"]
                assert taken["holderIdentity"] not in ("", holder)
                assert taken["leaseTransitions"] == 1
                assert replicas[follower][0].poll() is None
        finally:
            for process, _ in replicas:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)

    asyncio.run(asyncio.wait_for(scenario(), 170))


async def _renewed_since(fake: object, version: str, *, times: int) -> bool:
    updates = [r for r in fake.requests if r.resource == "leases" and r.verb == "update"]  # type: ignore[attr-defined]
    return len(updates) >= times and fake.lease(NAMESPACE, LEASE)["metadata"]["resourceVersion"] != version  # type: ignore[attr-defined]
