"""KV-event ingestion through real ZMQ sockets: sustained blocks/s and publish-to-visible latency.

Run by hand (not a test)::

    PYTHONPATH=src python benchmarks/bench_ingest_sockets.py [--publishers 16] [--messages 40000]
        [--rate 50000] [--seconds 10] [--transport-only] [--coalesce-ms 0.5] [--batch-window-ms 1000] [--no-pin]

A child process runs ``--publishers`` vLLM-like publishers (XPUB on 127.0.9.N, one port, like pods)
sending map-era (vLLM 0.26) batches: one BlockStored of 1–8 blocks × 16 tokens, chained to the
previous batch of that publisher (a new sequence every 16 batches). This process only ingests:
``ZmqTransport`` in per-endpoint mode feeding the real applier and index. By default this process
is pinned to CPU 0 (its ZMQ I/O thread too) and the publishers to the last CPU.

Phase 0: the same kind of batches decoded and applied in-process without sockets (the floor).
Phase 1 (saturation): every publisher sends its share of ``--messages`` pre-encoded batches as fast
as it can (HWMs large enough that nothing is dropped); we time first to last applied batch, and
the CPU time of this process (and of its ingestion thread) over the same window.
Phase 2 (latency): batches paced at ``--rate`` blocks/s for ``--seconds``, stamped with
``time.time()`` as vLLM does; the applier records ``now − ts`` right after each batch is applied
(visible to the request path), after a 1 s warm-up.
``--transport-only`` replaces decoding and applying with no-ops to measure the transport alone.
``--curve`` runs both phases twice in central mode (the publishers connect to one bound SUB):
without authentication, then with ZMQ CURVE (every publisher's key allowed), and prints the ratio
of the two (the machine is shared: compare within one run).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import platform
import random
import socket
import struct
import sys
import tempfile
import time
from array import array
from typing import Any, cast

import zmq

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import CurveConfig, KVEventsConfig, PodDiscoveryConfig
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport import TransportTuning, ZmqTransport
from ppc_extproc.events.wire import EventBatch
from ppc_extproc.framework import Endpoint
from ppc_extproc.index import InMemoryIndex
from ppc_extproc.server.process import configure_gc
from ppc_extproc_lab.mock_vllm.kv_events import MEDIUM_GPU, SPEC_KIND_FULL_ATTENTION, BlockStored, EventEncoder

MODEL = "bench-model"
BLOCK = 16


_ENCODER = EventEncoder("map")  # vLLM 0.26–0.28 bytes, pinned against the spec by the mock's tests


def events_bytes(rng: random.Random, state: dict[str, Any]) -> tuple[bytes, int]:
    """The msgpack ``events`` array of one batch (one BlockStored) and its block count."""
    n = rng.randint(1, 8)
    if state["batches"] % 16 == 0:
        state["parent"] = None
    hashes = [rng.getrandbits(64) for _ in range(n)]
    tokens = [rng.randrange(50_000) for _ in range(BLOCK * n)]
    event = BlockStored(
        hashes, state["parent"], tokens, BLOCK, None, MEDIUM_GPU, None,
        extra_keys=[None] * n, group_idx=0, kv_cache_spec_kind=SPEC_KIND_FULL_ATTENTION,
    )
    state["parent"] = hashes[-1]
    state["batches"] += 1
    encoded = _ENCODER.encode_events([event], ts=0.0, data_parallel_rank=0)
    return encoded[10:-1], n  # strip [ts, … , rank]: payload() re-stamps ts at send time


def payload(events: bytes, ts: float) -> bytes:
    """``[ts, events, 0]`` exactly as msgspec encodes vLLM's array-like KVEventBatch."""
    return b"\x93\xcb" + struct.pack(">d", ts) + events + b"\x00"


# --- publisher process -------------------------------------------------------------------------


def publisher_main(
    conn: Any,
    n_pubs: int,
    messages: int,
    seed: int,
    cpu: int | None,
    connect: str = "",
    curve: tuple[bytes, bytes, bytes] | None = None,
) -> None:
    """The publishers: bound per pod, or (``connect``) connecting to a central SUB, optionally as
    CURVE clients (server public key, own public key, own secret key)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    ctx = zmq.Context()
    socks = []
    port = 0
    for i in range(n_pubs):
        sock = ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.SNDHWM, 0)  # phase 1 must not drop
        sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            sock.setsockopt(zmq.CURVE_SERVERKEY, curve[0])
            sock.setsockopt(zmq.CURVE_PUBLICKEY, curve[1])
            sock.setsockopt(zmq.CURVE_SECRETKEY, curve[2])
        if connect:
            sock.connect(connect)
        elif i == 0:
            port = sock.bind_to_random_port("tcp://127.0.9.1")
        else:
            sock.bind(f"tcp://127.0.9.{i + 1}:{port}")
        socks.append(sock)
    conn.send(port)
    for sock in socks:
        sock.recv()  # the subscription: the ingest side is connected
    conn.send("subscribed")
    topics = [f"kv@127.0.9.{i + 1}:8000@{MODEL}".encode() for i in range(n_pubs)]
    seqs = [0] * n_pubs
    rng = random.Random(seed)
    states = [{"parent": None, "batches": 0} for _ in range(n_pubs)]

    # Phase 1: pre-encoded, as fast as possible.
    per_pub = messages // n_pubs
    plan = []
    blocks = 0
    now = time.time()
    for _ in range(per_pub):
        for i in range(n_pubs):
            ev, n = events_bytes(rng, states[i])
            plan.append((i, payload(ev, now)))
            blocks += n
    assert conn.recv() == "go"
    for i, body in plan:
        socks[i].send_multipart([topics[i], seqs[i].to_bytes(8, "big"), body])
        seqs[i] += 1
    conn.send(("sent", len(plan), blocks))

    # Phase 2: paced, stamped at send time.
    rate, seconds = conn.recv()
    # Fresh blocks throughout, as in phase 1 (re-storing known blocks is a different workload).
    need = int(rate * seconds / 4.5 * 1.2) // n_pubs + 1
    pool = [[events_bytes(rng, states[i]) for _ in range(need)] for i in range(n_pubs)]
    conn.send("pacing")
    start = time.perf_counter()
    sent_blocks = 0
    k = 0
    while True:
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
        due = rate * elapsed
        while sent_blocks < due:
            i = k % n_pubs
            ev, n = pool[i][(k // n_pubs) % need]
            socks[i].send_multipart([topics[i], seqs[i].to_bytes(8, "big"), payload(ev, time.time())])
            seqs[i] += 1
            sent_blocks += n
            k += 1
        time.sleep(0.0002)
    conn.send(("paced", k, sent_blocks))
    conn.recv()
    for sock in socks:
        sock.close(0)
    ctx.term()


# --- ingest side -------------------------------------------------------------------------------


class TimedApplier(EventApplier):
    """Records ``time.time() − batch.ts`` right after each batch becomes visible."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latencies = array("d")
        self.record = False

    def apply_batch(self, endpoint: str, model: str, batch: EventBatch) -> None:
        super().apply_batch(endpoint, model, batch)
        if self.record:
            self.latencies.append(time.time() - batch.ts)


class NullApplier(TimedApplier):
    """Applies nothing, still records latency (``--transport-only``)."""

    def apply_batch(self, endpoint: str, model: str, batch: EventBatch) -> None:
        if self.record:
            self.latencies.append(time.time() - batch.ts)


def ts_only(payload: bytes, engine_type: str = "vllm") -> EventBatch:
    """``--transport-only`` decoder: just the ``ts`` of this benchmark's fixed batch layout."""
    return EventBatch(struct.unpack_from(">d", payload, 2)[0], [])


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{model}, {mp.cpu_count()} cores; Python {platform.python_version()}, "
        f"pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}"
    )


def thread_cpu() -> dict[int, float]:
    """CPU seconds of every thread of this process (Linux ``/proc``; empty elsewhere)."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    except OSError:
        pass
    return out


def split(before: dict[int, float], after: dict[int, float], ingest_tid: int | None) -> str:
    ingest = after.get(ingest_tid or -1, 0.0) - before.get(ingest_tid or -1, 0.0)
    total = sum(after.values()) - sum(v for k, v in before.items() if k in after)
    return f"ingest thread {ingest:.2f} s, other threads (ZMQ I/O, main) {total - ingest:.2f} s"


def batches_applied(stats: IngestStats) -> int:
    return sum(n for (_, name), n in list(stats.transport.items()) if name == "batches")


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def phase0(seed: int) -> float:
    """Decode + apply of the same kind of batches in-process, without sockets; µs CPU per batch."""
    rng = random.Random(seed + 1)
    state: dict[str, Any] = {"parent": None, "batches": 0}
    sample = [events_bytes(rng, state) for _ in range(20_000)]
    bodies = [payload(ev, time.time()) for ev, _ in sample]
    reference = EventApplier(InMemoryIndex(size=1_000_000), TokenProcessor(), IngestStats())
    c0 = time.process_time()
    decoded = [decode_batch(body) for body in bodies]
    c1 = time.process_time()
    for batch in decoded:
        reference.apply_batch("10.0.0.1:8000", MODEL, batch)
    c2 = time.process_time()
    n = len(bodies)
    blocks = sum(k for _, k in sample) / n
    total = (c2 - c0) / n * 1e6
    print(
        f"phase 0 (decode + apply only, no sockets): decode {(c1 - c0) / n * 1e6:.1f} µs + apply "
        f"{(c2 - c1) / n * 1e6:.1f} µs CPU per batch of {blocks:.2f} blocks = "
        f"{blocks / total * 1e6:,.0f} blocks/s"
    )
    return total


def phase1(parent: Any, transport: ZmqTransport, stats: IngestStats, core_us: float) -> float:
    """Saturation: everything queued at once; first to last applied batch."""
    parent.send("go")
    sent: tuple[str, int, int] | None = None
    t_first = cpu_first = None
    first = 0
    threads_first: dict[int, float] = {}
    deadline = time.monotonic() + 600
    while True:
        done = batches_applied(stats)
        if t_first is None and done:
            t_first, cpu_first, first = time.perf_counter(), time.process_time(), done
            threads_first = thread_cpu()
        if sent is None and parent.poll(0):
            sent = parent.recv()
        if (sent is not None and done >= sent[1]) or time.monotonic() > deadline:
            break
        time.sleep(0.002)
    assert sent is not None
    _, n_msgs, n_blocks = sent
    t_last, cpu_last, threads_last = time.perf_counter(), time.process_time(), thread_cpu()
    assert t_first is not None and cpu_first is not None
    tid = cast(int, transport.diagnostics()["thread_id"])
    wall = t_last - t_first
    msgs = done - first
    cpu_us = (cpu_last - cpu_first) / msgs * 1e6
    print(
        f"phase 1 (saturation): {n_msgs} batches = {n_blocks} blocks from the publishers; "
        f"{msgs / wall * n_blocks / n_msgs:,.0f} blocks/s ({msgs / wall:,.0f} batches/s) over "
        f"{wall:.2f} s; CPU of the ingesting process {100 * (cpu_last - cpu_first) / wall:.0f}% "
        f"= {cpu_us:.1f} µs per batch (phase 0 {core_us:.1f} µs ⇒ sockets + transport ≈ "
        f"{cpu_us - core_us:.1f} µs); {split(threads_first, threads_last, tid)}"
    )
    return msgs / wall * n_blocks / n_msgs


def phase2(parent: Any, transport: ZmqTransport, applier: TimedApplier, rate: float, seconds: float) -> float:
    """Paced publishing; publish-to-visible latency of every batch after a 1 s warm-up."""
    transport.wait_idle(10)
    parent.send((rate, seconds + 1.0))
    assert parent.recv() == "pacing"
    time.sleep(1.0)  # warm-up at the target rate
    applier.record = True
    rounds1 = cast(int, transport.diagnostics()["rounds"])
    pauses1 = cast(int, transport.diagnostics()["pauses"])
    cpu1, t1, threads1 = time.process_time(), time.perf_counter(), thread_cpu()
    _, paced_msgs, paced_blocks = parent.recv()
    transport.wait_idle(10)
    applier.record = False
    cpu2, t2, threads2 = time.process_time(), time.perf_counter(), thread_cpu()
    tid = cast(int, transport.diagnostics()["thread_id"])
    rounds = cast(int, transport.diagnostics()["rounds"]) - rounds1
    pauses = cast(int, transport.diagnostics()["pauses"]) - pauses1
    lat = sorted(applier.latencies)
    print(
        f"phase 2 (paced {rate:,.0f} blocks/s for {seconds:.0f} s after a 1 s warm-up): "
        f"{paced_msgs} batches, {paced_blocks} blocks; {len(lat)} measured; publish-to-visible "
        f"p50 {pct(lat, 50) * 1e3:.2f} ms, p99 {pct(lat, 99) * 1e3:.2f} ms, "
        f"max {lat[-1] * 1e3:.2f} ms; CPU {100 * (cpu2 - cpu1) / (t2 - t1):.0f}% "
        f"({split(threads1, threads2, tid)}); {len(lat) / max(rounds, 1):.1f} batches per round, {pauses} batch-window pauses"
    )
    return pct(lat, 99)


def run(
    args: argparse.Namespace, applier: TimedApplier, stats: IngestStats, tuning: TransportTuning, core_us: float,
    central: str,
) -> tuple[float, float]:
    """One publisher process against one transport: per-endpoint mode, or ``central`` ("central",
    "central + CURVE"). Returns (saturation blocks/s, paced p99 seconds)."""
    pin = not args.no_pin and hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1
    spawn = mp.get_context("spawn")
    parent, child = spawn.Pipe()
    publisher_cpu = (os.cpu_count() or 1) - 1 if pin else None
    with tempfile.TemporaryDirectory() as keys:
        curve_config = None
        client = None
        address = ""
        if central:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
        if central.endswith("CURVE"):
            server_public, server_secret = zmq.curve_keypair()
            client_public, client_secret = zmq.curve_keypair()
            with open(os.path.join(keys, "server"), "wb") as f:
                f.write(server_secret)
            with open(os.path.join(keys, "publishers"), "wb") as f:
                f.write(client_public)
            curve_config = CurveConfig(os.path.join(keys, "server"), os.path.join(keys, "publishers"))
            client = (server_public, client_public, client_secret)
        if central:
            config = KVEventsConfig(
                zmq_endpoint=address, discover_pods=False, queue_size=10_000_000, curve=curve_config,
                batch_window_seconds=args.batch_window_s,
            )
        transport = ZmqTransport(config, applier, stats, tuning) if central else None
        if transport is not None:
            transport.start()
            for i in range(args.publishers):
                transport.add_endpoint(Endpoint(f"127.0.9.{i + 1}", 8000))
        proc = spawn.Process(
            target=publisher_main,
            args=(child, args.publishers, args.messages, args.seed, publisher_cpu, address, client),
        )
        proc.start()
        port = parent.recv()
        if transport is None:
            config = KVEventsConfig(
                pod_discovery=PodDiscoveryConfig(socket_port=port), queue_size=10_000_000,
                batch_window_seconds=args.batch_window_s,
            )
            transport = ZmqTransport(config, applier, stats, tuning)
            transport.start()
            for i in range(args.publishers):
                transport.add_endpoint(Endpoint(f"127.0.9.{i + 1}", 8000))
        try:
            assert parent.recv() == "subscribed"
            saturation = phase1(parent, transport, stats, core_us)
            p99 = phase2(parent, transport, applier, args.rate, args.seconds)
            gaps = sum(n for (_, name), n in stats.transport.items() if name == "gaps")
            drops = {reason: n for (_, reason), n in stats.dropped.items()}
            print(f"gaps {gaps}, drops {drops or 'none'}")
            parent.send("bye")
        finally:
            transport.stop(5)
            proc.join(10)
    return saturation, p99


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--publishers", type=int, default=16)
    ap.add_argument("--messages", type=int, default=40_000, help="phase 1 batches in total")
    ap.add_argument("--rate", type=float, default=50_000, help="phase 2 blocks/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="phase 2 duration")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--coalesce-ms",
        type=float,
        default=None,
        help="TransportTuning.coalesce_seconds in ms (default: the transport's)",
    )
    ap.add_argument(
        "--batch-window-ms",
        type=float,
        default=None,
        help="kvEventsConfig.batchWindow in ms (default: the service's, 1000)",
    )
    ap.add_argument(
        "--transport-only",
        action="store_true",
        help="no-op decode and apply: measures the sockets and the transport alone",
    )
    ap.add_argument(
        "--curve",
        action="store_true",
        help="central mode, once without and once with ZMQ CURVE, and the ratio",
    )
    ap.add_argument("--rounds", type=int, default=2, help="--curve: rounds of (plain, CURVE)")
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin this process to CPU 0 and the publishers to the last CPU",
    )
    args = ap.parse_args()
    default_window = KVEventsConfig().batch_window_seconds
    args.batch_window_s = default_window if args.batch_window_ms is None else args.batch_window_ms / 1000
    pin = not args.no_pin and hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1
    if pin:
        os.sched_setaffinity(0, {0})  # before any thread starts: ZMQ's I/O thread stays here too
    configure_gc()  # as `ppc-extproc serve` does
    print("command:", "PYTHONPATH=src python", " ".join(sys.argv))
    print("machine:", machine(), "| load average", load())
    print("pinning:", "ingest on CPU 0, publishers on the last CPU" if pin else "none")

    core_us = 0.0 if args.transport_only else phase0(args.seed)
    stats = IngestStats()
    applier_cls = NullApplier if args.transport_only else TimedApplier
    applier = applier_cls(InMemoryIndex(size=20_000_000), TokenProcessor(), stats)
    if args.transport_only:
        from ppc_extproc.events.transport import ingest

        vars(ingest)["decode_batch"] = ts_only  # the decoder the ingestor calls
    tuning = TransportTuning()
    if args.coalesce_ms is not None:
        tuning = dataclasses.replace(tuning, coalesce_seconds=args.coalesce_ms / 1000)
    print(
        f"transport tuning: coalesce {tuning.coalesce_seconds * 1e3:g} ms below "
        f"{tuning.coalesce_below} ready sockets, drain budget {tuning.drain_budget}; batch window "
        f"{args.batch_window_s * 1e3:g} ms below {tuning.dense_messages_per_second:g} messages a second"
    )
    if not args.curve:
        run(args, applier, stats, tuning, core_us, "")
    else:
        ratios = []
        for r in range(args.rounds):
            results = {}
            # Alternate the order, so a load change on the shared machine does not favour one.
            modes = ("central", "central + CURVE") if r % 2 == 0 else ("central + CURVE", "central")
            for mode in modes:
                stats = IngestStats()
                applier = applier_cls(InMemoryIndex(size=20_000_000), TokenProcessor(), stats)
                print(f"--- round {r + 1}: {mode} (load average {load()})")
                results[mode] = run(args, applier, stats, tuning, core_us, mode)
            (plain_bps, plain_p99), (curve_bps, curve_p99) = results["central"], results["central + CURVE"]
            ratios.append(curve_bps / plain_bps)
            print(
                f"round {r + 1}: CURVE / plain saturation {curve_bps / plain_bps:.2f}x "
                f"({curve_bps:,.0f} vs {plain_bps:,.0f} blocks/s); p99 at the paced rate "
                f"{curve_p99 * 1e3:.2f} vs {plain_p99 * 1e3:.2f} ms"
            )
        print(f"CURVE / plain saturation, per round: {', '.join(f'{x:.2f}x' for x in ratios)}")
    print("load average after:", load())


if __name__ == "__main__":
    main()
