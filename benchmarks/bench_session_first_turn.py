"""What a session's first turn pays for its binding being written before the routing answer:
decision time of a new session's request, then of the same session's next one, through one
router with a session-affinity-scorer whose bindings are shared through a real Valkey (16
endpoints, in process, no gRPC).

    PYTHONPATH=src python benchmarks/bench_session_first_turn.py
"""

import asyncio
import json
import platform
import time

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.framework import Endpoint, LLMRequest
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc_lab.localcluster.sessions import session_scorer_config
from ppc_extproc_lab.valkey import start_valkey

ENDPOINTS = [Endpoint(f"10.0.1.{i}", 8000) for i in range(1, 17)]


def q(values: list[float], fraction: float) -> float:
    return sorted(values)[int(fraction * len(values))] * 1000


async def main(url: str) -> None:
    loaded = load_config_text(json.dumps(session_scorer_config(url)))
    for plugin in loaded.roles.lifecycle:
        await plugin.start()
    pool = EndpointPool()
    pool.replace(ENDPOINTS)
    router = Router(pool, loaded.pipeline, loaded.services.inflight)
    for i in range(200):  # warm
        await router.route(LLMRequest(f"w{i}", "m", headers={"x-session-id": f"warm-{i}"}))
    for rnd in range(3):
        new: list[float] = []
        again: list[float] = []
        for i in range(500):
            h = {"x-session-id": f"s{rnd}-{i}"}
            for rid, samples in ((f"a{i}", new), (f"b{i}", again)):
                started = time.perf_counter()
                await router.route(LLMRequest(rid, "m", headers=h))
                samples.append(time.perf_counter() - started)
        print(f"round {rnd}: new session p50 {q(new, .5):.3f} p99 {q(new, .99):.3f} ms | "
              f"bound p50 {q(again, .5):.3f} p99 {q(again, .99):.3f} ms")
    for plugin in loaded.roles.lifecycle:
        await plugin.stop()


if __name__ == "__main__":
    print("command: PYTHONPATH=src python benchmarks/bench_session_first_turn.py")
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    with start_valkey() as v:
        asyncio.run(main(v.url))
