"""Envoy overhead: requests/s and added latency through Envoy with ppc-extproc in the
path, against Envoy routing directly to the same upstream — and against a trivial Python ext_proc
(the floor any Python ext_proc pays) — all in one run on this machine.

Upstream: an Envoy ``direct_response`` returning a fixed completion (so the upstream costs ~0).
Load: ``wrk`` (Debian package ``wrk``) POSTing a /v1/completions body with a token-id prompt.

    python benchmarks/bench_envoy_overhead.py [--duration 10] [--prompt-tokens 1000]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _common import WRK_SCRIPT, header, run_wrk

from ppc_extproc_lab.localcluster import (
    ProcessGroup,
    find_envoy,
    free_port,
    render_envoy_config,
    wait_for_grpc_health,
    wait_for_http,
)

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_IP = "127.0.0.2"
def upstream_config(port: int, admin: int) -> dict:
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {"listeners": [{
            "name": "upstream",
            "address": {"socket_address": {"address": UPSTREAM_IP, "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "upstream",
                    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
                        "match": {"prefix": "/"},
                        "direct_response": {"status": 200, "body": {"inline_string":
                            '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],'
                            '"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001,"prompt_tokens_details":{"cached_tokens":0}}}'}},
                    }]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                },
            }]}],
        }]},
    }


def direct_config(port: int, admin: int, upstream: int) -> dict:
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "direct",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "direct",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "route": {"cluster": "upstream", "timeout": "60s"}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    },
                }]}],
            }],
            "clusters": [{
                "name": "upstream", "type": "STATIC", "connect_timeout": "5s",
                "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": UPSTREAM_IP, "port_value": upstream}}}}]}]},
            }],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=32, help="concurrency of the throughput runs")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is required: apt-get install wrk")
    header("Envoy overhead: direct vs trivial ext_proc vs ppc-extproc (one run)")
    work = Path(tempfile.mkdtemp(prefix="ppc-bench-envoy-"))
    rng = random.Random(1)
    body = work / "body.json"
    body.write_text(json.dumps({"model": "m", "prompt": [rng.randrange(150000) for _ in range(args.prompt_tokens)], "max_tokens": 1}))
    script = work / "post.lua"
    script.write_text(WRK_SCRIPT.format(body=body))
    envoy = find_envoy()
    group = ProcessGroup(work)
    try:
        up_port, up_admin = free_port(UPSTREAM_IP), free_port()
        (work / "upstream.yaml").write_text(yaml.safe_dump(upstream_config(up_port, up_admin)))
        group.spawn("upstream", [envoy, "-c", str(work / "upstream.yaml"), "--disable-hot-restart", "--log-level", "error", "--concurrency", "1"])
        wait_for_http(f"http://127.0.0.1:{up_admin}/ready")
        endpoint = f"{UPSTREAM_IP}:{up_port}"

        setups: dict[str, str] = {}
        d_port, d_admin = free_port(), free_port()
        (work / "direct.yaml").write_text(yaml.safe_dump(direct_config(d_port, d_admin, up_port)))
        group.spawn("envoy-direct", [envoy, "-c", str(work / "direct.yaml"), "--disable-hot-restart", "--log-level", "error", "--concurrency", "1"])
        wait_for_http(f"http://127.0.0.1:{d_admin}/ready")
        setups["Envoy → upstream"] = f"http://127.0.0.1:{d_port}/v1/completions"

        processors = {
            "Envoy + trivial ext_proc": [sys.executable, str(REPO / "tests/unit/localcluster/stub_extproc.py")],
            "Envoy + ppc-extproc": [sys.executable, "-m", "ppc_extproc", "serve", "--log-level", "warning"],
        }
        for name, command in processors.items():
            grpc_port, admin_port, port, envoy_admin = free_port(), free_port(), free_port(), free_port()
            group.spawn(name, [*command, "--grpc-port", str(grpc_port), "--admin-port", str(admin_port),
                               "--admin-address", "127.0.0.1", "--endpoints", endpoint])
            wait_for_grpc_health(f"127.0.0.1:{grpc_port}", "readiness")
            config = render_envoy_config("full-duplex", work, listener_port=port, admin_port=envoy_admin, ext_proc_port=grpc_port,
                                         file_name=f"envoy-{grpc_port}.yaml")
            group.spawn(f"envoy {name}", [envoy, "-c", str(config), "--disable-hot-restart", "--log-level", "error", "--concurrency", "1"])
            wait_for_http(f"http://127.0.0.1:{envoy_admin}/ready")
            setups[name] = f"http://127.0.0.1:{port}/v1/completions"

        print(f"body: /v1/completions, {args.prompt_tokens}-token prompt ({body.stat().st_size} bytes); wrk {args.duration}s per cell; "
              f"Envoy --concurrency 1 everywhere\n")
        results = {}
        for name, url in setups.items():
            run_wrk(url, script, 4, 2)  # warm up
            results[name] = (run_wrk(url, script, args.connections, args.duration), run_wrk(url, script, 1, args.duration))
        base_rps = results["Envoy → upstream"][0]["rps"]
        base_p50 = results["Envoy → upstream"][1]["p50"]
        trivial = results["Envoy + trivial ext_proc"]
        print(f"| setup | req/s (c={args.connections}) | vs direct | vs trivial ext_proc | p50 c=1 (ms) | p99 c=1 (ms) | added p50 (ms) | errors |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, (load, single) in results.items():
            print(f"| {name} | {load['rps']:.0f} | {load['rps'] / base_rps:.2f}× | {load['rps'] / trivial[0]['rps']:.2f}× | "
                  f"{single['p50'] / 1e3:.2f} | {single['p99'] / 1e3:.2f} | {(single['p50'] - base_p50) / 1e3:+.2f} | "
                  f"{load['errors'] + load['non2xx'] + single['errors'] + single['non2xx']} |")
    finally:
        group.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
