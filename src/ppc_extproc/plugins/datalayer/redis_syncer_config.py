"""Parameters of ``redis-syncer``, decoded strictly; every error names the field's path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.datalayer.cross_replica_store import parse_address

__all__ = ["CHANGE_PUBLISH", "COLD_PLACEMENTS", "RedisSyncerConfig", "parse_syncer_config"]

COLD_PLACEMENTS = ("claim", "rendezvous")
CHANGE_PUBLISH = ("immediate", "coalesced")


@dataclass(frozen=True, slots=True)
class RedisSyncerConfig:
    """The decoded parameters (durations in seconds)."""

    host: str
    port: int
    db: int
    password: str | None
    state_ttl: float
    claim_ttl: float
    claim_timeout: float
    key_prefix: str
    claim_prefixes: bool
    producer: str
    #: ``coldPlacement``: claim | rendezvous.
    cold_placement: str
    #: ``traceSize``: 0 = off.
    trace_size: int
    #: ``changePublish``: immediate | coalesced.
    change_publish: str
    #: ``claimCounts``: the claim script reads and counts in-flight requests in the store.
    claim_counts: bool = True


def parse_syncer_config(params: Section) -> RedisSyncerConfig:
    address = params.string("address", "localhost:6379")
    try:
        host, port, url_db = parse_address(address)
    except ValueError as exc:
        raise ConfigError(params.child_path("address"), str(exc)) from None
    params.reject("password", "a plaintext password is refused: use passwordEnv or passwordFile")
    password_env = params.string("passwordEnv", "")
    password_file = params.string("passwordFile", "")
    if password_env and password_file:
        raise ConfigError(params.child_path("passwordFile"), "passwordEnv and passwordFile are mutually exclusive")
    password = _password(params, password_env, password_file)
    db = params.integer("db", url_db or 0, minimum=0)
    state_ttl = params.duration("stateTTL", "2s")
    params.duration("coordinationTTL", "180s")
    claim_ttl = params.duration("claimTTL", "2s")
    claim_timeout = params.duration("claimTimeout", "20ms")
    for key, value in (("stateTTL", state_ttl), ("claimTTL", claim_ttl), ("claimTimeout", claim_timeout)):
        if value < 0.001:
            raise ConfigError(params.child_path(key), f"must be at least 1ms, got {value}s")
    return RedisSyncerConfig(
        host, port, db, password, state_ttl, claim_ttl, claim_timeout,
        key_prefix=params.string("keyPrefix", "ppc-extproc"),
        claim_prefixes=params.boolean("claimPrefixes", True),
        producer=params.string("prefixMatchInfoProducerName", "precise-prefix-cache-producer"),
        cold_placement=params.string("coldPlacement", "claim", choices=COLD_PLACEMENTS),
        trace_size=params.integer("traceSize", 0, minimum=0, maximum=1_000_000),
        change_publish=params.string("changePublish", "immediate", choices=CHANGE_PUBLISH),
        claim_counts=params.boolean("claimCounts", True),
    )  # fmt: skip


def _password(params: Section, env: str, file: str) -> str | None:
    if env:
        value = os.environ.get(env)
        if value is None:
            raise ConfigError(params.child_path("passwordEnv"), f"the environment variable {env} is not set")
        return value
    if file:
        try:
            return Path(file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(params.child_path("passwordFile"), f"cannot read {file}: {exc.strerror or exc}") from None
    return None
