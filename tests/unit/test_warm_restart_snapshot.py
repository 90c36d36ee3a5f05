"""The warm-restart snapshot: an exact round trip of the index and the applier's tables, and a file
that is refused whole (one log line, nothing loaded) when it is corrupt or foreign."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.snapshot_format import MAGIC, SnapshotRefused, read_snapshot, write_snapshot
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.restore import RestoreTable
from ppc_extproc.events.transport.source import Source
from ppc_extproc.events.warm_restart import config_hash, load_snapshot, take_snapshot
from ppc_extproc.events.wire import BlockRemoved, BlockStored, EventBatch
from ppc_extproc.index import InMemoryIndex, PodEntry

HASH = config_hash(TokenProcessorConfig())
CAP = 1 << 20


def _applier() -> EventApplier:
    return EventApplier(InMemoryIndex(size=10_000), TokenProcessor(), IngestStats())


def _stored(hashes: list[int], first_token: int, parent: int | None = None, medium: str = "GPU",
            group: int = 0, kind: str = "full_attention") -> BlockStored:  # fmt: skip
    tokens = list(range(first_token, first_token + 16 * len(hashes)))
    return BlockStored(hashes, parent, tokens, 16, None, medium, None, [None] * len(hashes), group, kind)


def _filled() -> tuple[EventApplier, list[Source]]:
    applier = _applier()
    sources = []
    for n, endpoint in enumerate(["10.0.0.1:8000", "10.0.0.2:8000"]):
        events = [
            _stored([1, 2, 3], 100),
            _stored([4, 5], 1000, parent=3),
            _stored([1], 100),  # a duplicate store: reference-counted
            _stored([9], 5000, medium="CPU"),
            _stored([20], 7000, group=1, kind="sliding_window"),  # not indexable, but its group is kept
            BlockRemoved([5], "GPU", group_idx=0),
        ]
        applier.apply_batch(endpoint, "m", EventBatch(1.0, events[: 6 - n]))
        src = Source(endpoint, applier.stats.source(endpoint), f"tcp://{endpoint}", "")
        src.last_seq, src.last_payload, src.topic = 41 + n, b"payload", f"kv@{endpoint}@m".encode()
        sources.append(src)
    applier.index.add(None, [applier.processor.keys(list(range(100, 116)), "m")[0]],
                      [PodEntry("10.0.0.1:8000", "", speculative=True)])  # fmt: skip
    return applier, sources


def test_round_trip_rebuilds_the_index_and_tables_exactly(tmp_path: Path) -> None:
    applier, sources = _filled()
    path = tmp_path / "snap"
    write_snapshot(path, take_snapshot(applier, sources, HASH), CAP)
    loaded, restored = _applier(), RestoreTable()
    result = load_snapshot(path, CAP, HASH, loaded, loaded.stats, restored, 60.0)
    assert result is not None and result.endpoints == 2
    before, after = applier.index.snapshot(), loaded.index.snapshot()
    assert after.engine_keys == before.engine_keys
    without_speculative = {
        k: frozenset(e for e in v if "speculative" not in e) for k, v in before.request_keys.items()
    }
    assert after.request_keys == {k: v for k, v in without_speculative.items() if v}
    for src in sources:
        assert loaded.export_tables(src.endpoint) == applier.export_tables(src.endpoint)
        assert restored.parts[src.endpoint].last_seq == src.last_seq
        assert loaded.stats.block_sizes[src.endpoint] == 16
    assert loaded.stats.suspended == {s.endpoint for s in sources}
    # The duplicate count came back: removing block 1 once leaves it held.
    loaded.apply_batch("10.0.0.1:8000", "m", EventBatch(2.0, [BlockRemoved([1], "GPU", group_idx=0)]))
    key = loaded.processor.keys(list(range(100, 116)), "m")[0]
    assert loaded.index.lookup([key], ["10.0.0.1:8000"])


def test_an_endpoint_without_a_position_is_not_restored(tmp_path: Path) -> None:
    applier, sources = _filled()
    path = tmp_path / "snap"
    write_snapshot(path, take_snapshot(applier, sources[:1], HASH), CAP)
    loaded = _applier()
    load_snapshot(path, CAP, HASH, loaded, loaded.stats, RestoreTable(), 60.0)
    assert loaded.index.entries_per_endpoint().keys() == {"10.0.0.1:8000"}


def _corrupt(data: bytes) -> bytes:
    return data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:]


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (_corrupt, "bad_checksum"),
        (lambda d: d[:-1], "wrong_length"),
        (lambda d: d[:10], "truncated_header"),
        (lambda d: b"NOTASNAP" + d[8:], "not_a_snapshot"),
        (lambda d: MAGIC + struct.pack("<I", 99) + d[12:], "wrong_version"),
        (lambda d: d[:12] + struct.pack("<Q", 1 << 40) + d[20:], "too_large"),
    ],
)
def test_a_corrupt_file_is_refused_with_one_log_line_and_nothing_loaded(
    tmp_path: Path, mangle: object, reason: str
) -> None:
    applier, sources = _filled()
    path = tmp_path / "snap"
    write_snapshot(path, take_snapshot(applier, sources, HASH), CAP)
    path.write_bytes(mangle(path.read_bytes()))  # type: ignore[operator]
    loaded, restored = _applier(), RestoreTable()
    with capture_logs() as logs:
        assert load_snapshot(path, CAP, HASH, loaded, loaded.stats, restored, 60.0) is None
    refused = [e for e in logs if e["event"] == "warm_restart_snapshot_refused"]
    assert len(refused) == 1 and refused[0]["reason"] == reason, logs
    assert len(loaded.index) == 0 and not restored.parts and not loaded.stats.suspended


def test_a_snapshot_of_another_hashing_config_is_refused(tmp_path: Path) -> None:
    applier, sources = _filled()
    path = tmp_path / "snap"
    write_snapshot(path, take_snapshot(applier, sources, HASH), CAP)
    other = config_hash(TokenProcessorConfig(block_size_tokens=64))
    with pytest.raises(SnapshotRefused) as exc:
        read_snapshot(path, CAP, other)
    assert exc.value.reason == "foreign_config"


def test_a_snapshot_over_the_cap_is_not_written_and_the_old_file_stays(tmp_path: Path) -> None:
    applier, sources = _filled()
    path = tmp_path / "snap"
    write_snapshot(path, take_snapshot(applier, sources, HASH), CAP)
    before = path.read_bytes()
    with pytest.raises(SnapshotRefused):
        write_snapshot(path, take_snapshot(applier, sources, HASH), 100)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["snap"]  # no temporary file left


def test_warm_restart_config_is_off_by_default_and_parsed_strictly() -> None:
    from ppc_extproc.errors import ConfigError
    from ppc_extproc.framework.params import Section
    from ppc_extproc.plugins.producers.precise_prefix_cache_config import parse_producer_config

    assert parse_producer_config(Section({}, "parameters")).warm_restart.state_dir == ""
    warm = parse_producer_config(Section({"warmRestart": {
        "stateDir": "/var/lib/x", "snapshotInterval": "10s", "restoreTTL": "1m", "maxSnapshotBytes": 4096,
    }}, "parameters")).warm_restart  # fmt: skip
    assert (warm.state_dir, warm.interval_seconds, warm.restore_ttl_seconds, warm.max_bytes) == (
        "/var/lib/x", 10.0, 60.0, 4096,
    )
    with pytest.raises(ConfigError, match="stateDirectory"):
        parse_producer_config(Section({"warmRestart": {"stateDirectory": "/x"}}, "parameters"))
