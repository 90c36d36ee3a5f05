"""Warm restart: the service is killed with SIGKILL while mock engines keep publishing, restarted
from its last snapshot, and its index compared with a reference service that was never killed
(both subscribe to the same engines; both write snapshots, which is how the test reads them).

Engine A's replay buffer holds what it published while the service was down but not everything
since it started (so only the snapshot plus a replay from ``last_seq + 1`` can make its part
exact); engine B's buffer is 3 batches, far below the gap (its part must be dropped: every entry
left for B must also be in the reference)."""

from __future__ import annotations

import json
import random
import signal
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ppc_extproc.blockkeys import TokenProcessorConfig
from ppc_extproc.events.snapshot_format import IndexState, SnapshotRefused, read_snapshot
from ppc_extproc.events.warm_restart import SNAPSHOT_FILE, config_hash
from ppc_extproc_lab.localcluster.ports import PortAllocator
from ppc_extproc_lab.localcluster.processes import ManagedProcess, ProcessGroup
from ppc_extproc_lab.localcluster.readiness import wait_for, wait_for_http
from ppc_extproc_lab.localcluster.service_config import default_service_config, patch_service_config

pytestmark = pytest.mark.integration

IPS = ["127.0.0.2", "127.0.0.3"]
BUFFER_A = 40
BUFFER_B = 3
MAX_BYTES = 1 << 30
HASH = config_hash(TokenProcessorConfig(16))


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _snapshot(path: Path) -> IndexState | None:
    try:
        return read_snapshot(path, MAX_BYTES, HASH)
    except (FileNotFoundError, SnapshotRefused):
        return None


def _keys_of(state: IndexState, endpoint: str) -> set[int]:
    """Request keys holding an entry of ``endpoint``."""
    import array

    positions = {i for i, (e, _, _) in enumerate(state.entries) if e == endpoint}
    masks = {m for m, members in enumerate(state.masks) if positions.intersection(members)}
    keys = array.array("Q")
    keys.frombytes(state.request_keys)
    ids = array.array("I")
    ids.frombytes(state.mask_ids)
    return {k for k, i in zip(keys, ids) if i in masks}


class Rig:
    def __init__(self, tmp: Path, group: ProcessGroup) -> None:
        self.tmp, self.group = tmp, group
        ports = PortAllocator()
        self.http, self.kv, self.replay = ports.ports(3, IPS)
        self.grpc = {name: ports.port() for name in ("ref", "warm")}
        self.admin = {name: ports.port() for name in ("ref", "warm")}
        self.endpoints = [f"{ip}:{self.http}" for ip in IPS]
        self.services: dict[str, ManagedProcess] = {}
        self.rng = random.Random(7)
        self.prefixes: list[list[int]] = []

    def start_engines(self) -> None:
        for ip, buffer in zip(IPS, (BUFFER_A, BUFFER_B)):
            proc = self.group.spawn(f"engine-{ip}", [
                sys.executable, "-m", "ppc_extproc_lab.mock_vllm", "--host", ip, "--port", str(self.http),
                "--block-size", "16", "--num-blocks", "600", "--buffer-steps", str(buffer),
                "--kv-events-endpoint", f"tcp://{ip}:{self.kv}", "--replay-endpoint", f"tcp://{ip}:{self.replay}",
                "--prefill-tokens-per-s", "1000000", "--decode-ms-per-token", "1",
            ])  # fmt: skip
            wait_for_http(f"http://{ip}:{self.http}/health", process=proc)

    def start_service(self, name: str, interval: str = "300ms") -> None:
        config = patch_service_config(default_service_config(block_size=16), socket_port=self.kv,
                                      replay_socket_port=self.replay)  # fmt: skip
        for plugin in config["plugins"]:
            if plugin.get("type") == "precise-prefix-cache-producer":
                plugin["parameters"]["warmRestart"] = {
                    "stateDir": str(self.tmp / name), "snapshotInterval": interval, "restoreTTL": "1m",
                }
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = self.group.spawn(f"service-{name}-{len(self.group.processes)}", [
            sys.executable, "-m", "ppc_extproc", "serve", "--config-file", str(path),
            "--grpc-port", str(self.grpc[name]), "--admin-port", str(self.admin[name]),
            "--endpoints", ",".join(self.endpoints), "--log-format", "console",
        ])  # fmt: skip
        wait_for_http(f"http://127.0.0.1:{self.admin[name]}/readyz", process=proc)
        self.services[name] = proc

    def traffic(self, requests: int) -> None:
        """Requests straight to the engines: new prefixes, and repeats of older ones."""
        for _ in range(requests):
            if self.prefixes and self.rng.random() < 0.4:
                prompt = self.rng.choice(self.prefixes) + [self.rng.randrange(1000, 30000) for _ in range(20)]
            else:
                prompt = [self.rng.randrange(1000, 30000) for _ in range(self.rng.randrange(40, 200))]
                self.prefixes.append(prompt[:32])
            for endpoint in self.endpoints:
                _post(f"http://{endpoint}/v1/completions", {"prompt": prompt, "max_tokens": 2})

    def engine_seq(self, endpoint: str) -> int:
        return int(_get(f"http://{endpoint}/mock/state")["seq"]) - 1

    def caught_up(self, name: str) -> IndexState | None:
        """The service's latest snapshot once it has applied everything each engine published."""
        state = _snapshot(self.tmp / name / SNAPSHOT_FILE)
        if state is None:
            return None
        seqs = {p.endpoint: p.last_seq for p in state.parts}
        if all(seqs.get(e) == self.engine_seq(e) for e in self.endpoints):
            return state
        return None


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with ProcessGroup(tmp_path / "logs") as group:
        yield Rig(tmp_path, group)


def test_kill_9_then_restart_restores_the_index_exactly_where_replay_covers_the_gap(rig: Rig) -> None:
    rig.start_engines()
    rig.start_service("ref")
    rig.start_service("warm")
    rig.traffic(90)
    wait_for(lambda: rig.caught_up("warm") is not None, what="warm snapshot caught up", timeout=60)
    a, b = rig.endpoints
    at_kill = {e: rig.engine_seq(e) for e in rig.endpoints}
    assert at_kill[a] > BUFFER_A, "engine A's buffer must not hold its whole history"
    rig.services["warm"].stop(sig=signal.SIGKILL)

    rig.traffic(15)  # the engines keep publishing while the service is down
    gap = {e: rig.engine_seq(e) - at_kill[e] for e in rig.endpoints}
    assert gap[a] < BUFFER_A and gap[b] > BUFFER_B, gap

    rig.start_service("warm")
    ref: list[IndexState] = []
    warm: list[IndexState] = []
    wait_for(lambda: bool((s := rig.caught_up("ref")) and not ref.append(s)), what="reference caught up", timeout=60)
    wait_for(lambda: bool((s := rig.caught_up("warm")) and not warm.append(s)), what="warm caught up", timeout=60)

    log = Path(rig.services["warm"].log_path).read_text()
    assert "warm_restart_snapshot_loaded" in log
    ref_a, warm_a = _keys_of(ref[-1], a), _keys_of(warm[-1], a)
    assert ref_a and warm_a == ref_a, (len(ref_a), len(warm_a), len(ref_a ^ warm_a))
    ref_b, warm_b = _keys_of(ref[-1], b), _keys_of(warm[-1], b)
    assert warm_b <= ref_b, f"{len(warm_b - ref_b)} stale entries for engine B"
    assert len(warm_b) < len(ref_b), "engine B's part should have been dropped and rebuilt from its buffer"


def test_sigterm_writes_a_last_snapshot_at_the_engines_position(rig: Rig) -> None:
    rig.start_engines()
    rig.start_service("warm", interval="0s")  # no periodic snapshot: only the one on shutdown
    rig.traffic(10)
    path = rig.tmp / "warm" / SNAPSHOT_FILE
    assert _snapshot(path) is None
    admin = f"http://127.0.0.1:{rig.admin['warm']}/metrics"

    def applied() -> bool:
        text = urllib.request.urlopen(admin, timeout=10).read().decode()
        return all(f'ppc_extproc_kv_source_last_seq{{endpoint="{e}"}} {rig.engine_seq(e)}.0' in text for e in rig.endpoints)

    wait_for(applied, what="events applied", timeout=30)
    assert rig.services["warm"].stop(sig=signal.SIGTERM) == 0
    state = _snapshot(path)
    assert state is not None
    assert {p.endpoint: p.last_seq for p in state.parts} == {e: rig.engine_seq(e) for e in rig.endpoints}
    assert all(_keys_of(state, e) for e in rig.endpoints)
