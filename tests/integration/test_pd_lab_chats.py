"""Multi-turn chats through the P/D lab (real Envoy, the service, two prefill engines, two decode
pods): the follow-up turns (fewer new tokens than ``nonCachedTokens``) are decided decode-only and
land on the decode engine holding the conversation — and what llm-d's behaviour, a decode engine
never credited with the blocks it received, gives on the same workload.

llm-d's behaviour is the producer's ``creditDecodeEngine: false`` (with ``speculativeIndexing``
at llm-d's default, false): the decode engines publish their KV events as usual, and every one
after a transferred prompt has a parent the index never saw and is dropped as ``unknown_parent``.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.workload.pd import pd_config
from ppc_extproc_lab.workload.pd_chats import ChatPlan, ChatSummary, run_chats, summarize_chats

pytestmark = pytest.mark.integration

BLOCK = 16
NON_CACHED = 64
ROLES = ["prefill", "prefill", "decode", "decode"]
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]
#: Users think 250 ms between turns.
PLAN = ChatPlan(conversations=6, turns=4, context_tokens=20 * BLOCK, user_tokens=16, max_tokens=8, concurrency=3,
                think_s=0.25)


@functools.cache  # one run per arm for the module
def chats(*, credited: bool) -> ChatSummary:
    config = pd_config(non_cached_tokens=NON_CACHED, speculative_indexing=credited, credit_decode_engine=credited)
    with LocalCluster(num_engines=len(ROLES), roles=ROLES, block_size=BLOCK, num_blocks=2048,
                      engine_args=FAST_ENGINES, service_config=config) as cluster:
        records = asyncio.run(run_chats(cluster.listener_url, PLAN))
        decode_pods = {cluster.engine_endpoints[i] for i in cluster.indices("decode")}
    assert all(r.endpoint in decode_pods for r in records if r.ok)
    assert all(r.disaggregated for r in records if r.turn == 1)  # long, uncached: P/D
    return summarize_chats("credited" if credited else "never credited", records, NON_CACHED)


def test_followup_turns_stay_decode_only_on_the_conversations_decode_engine() -> None:
    assert PLAN.new_tokens_per_turn < NON_CACHED
    s = chats(credited=True)
    assert s.errors == 0 and s.followups == PLAN.conversations * (PLAN.turns - 1)
    assert s.followups_decode_only == s.followups  # 100 % decode-only
    assert s.followups_on_home == s.followups  # on the engine that holds the conversation


def test_never_crediting_the_decode_engine_disaggregates_the_followups_again() -> None:
    credited, uncredited = chats(credited=True), chats(credited=False)
    print(f"\nfollow-ups decode-only: credited {credited.decode_only_fraction:.0%}, "
          f"never credited {uncredited.decode_only_fraction:.0%}; P/D requests {credited.disaggregated_total} "
          f"vs {uncredited.disaggregated_total} of {credited.turns}")
    assert uncredited.errors == 0
    assert uncredited.decode_only_fraction < 0.5 < credited.decode_only_fraction
