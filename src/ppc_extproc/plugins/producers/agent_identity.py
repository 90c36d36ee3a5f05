"""``agent-identity``: the agent session a request belongs to, from agents' own session headers.

Type        ``agent-identity`` (producer; llm-d's is a request-header processor)
Produces    ``agent-identity`` (a ``str``, no producer name: any plugin resolving an agent
            identity may write it): the first non-empty header of ``additionalSessionHeaders``
            (in order), then the built-in ``x-claude-code-session-id`` (Claude Code),
            ``x-session-affinity`` (OpenCode), ``session-id`` (Codex ≥ 0.131) and ``session_id``
            (Codex 0.130); nothing when none is set.
            llm-d: ``pkg/epp/framework/plugins/requestcontrol/requestheader/agentidentity/``.
Consumes    nothing
Parameters  ``additionalSessionHeaders`` (list of header names, default none; lowercased)

llm-d also derives the flow-control fairness id from it; ppc-extproc has no flow control, so
its reader is session affinity: ``sessionIdConfig.sources: [{header: x-session-id},
{attribute: agent-identity}]``.

    plugins:
    - type: agent-identity
      parameters:
        additionalSessionHeaders: [x-my-agent-session]
"""

from __future__ import annotations

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import DataProducer, DataType, SchedulingContext
from ppc_extproc.framework.datakeys import Consumes, DataKey
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["AGENT_IDENTITY", "AGENT_IDENTITY_KEY", "DEFAULT_AGENT_HEADERS", "AgentIdentity"]

#: llm-d's ``AgentIdentityKey``: the attribute ``agent-identity``, written under no producer name.
AGENT_IDENTITY: DataType[str] = DataType("agent-identity")
AGENT_IDENTITY_KEY: DataKey[str] = AGENT_IDENTITY.of("")
DEFAULT_AGENT_HEADERS = ("x-claude-code-session-id", "x-session-affinity", "session-id", "session_id")
_MAX_HEADERS = 64


@register("agent-identity")
class AgentIdentity(DataProducer):
    def __init__(self, name: str, additional_headers: tuple[str, ...] = ()) -> None:
        self.name = name
        self.headers = tuple(h.strip().lower() for h in additional_headers) + DEFAULT_AGENT_HEADERS

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> AgentIdentity:
        extra: list[str] = []
        for path, item in params.items("additionalSessionHeaders"):
            if not isinstance(item, str):
                raise ConfigError(path, f"expected a header name, got {type(item).__name__}")
            extra.append(item)
        if len(extra) > _MAX_HEADERS:
            raise ConfigError(params.child_path("additionalSessionHeaders"), f"at most {_MAX_HEADERS} headers")
        return cls(name, tuple(extra))

    def consumes(self) -> tuple[Consumes[object], ...]:
        return ()

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({AGENT_IDENTITY_KEY})

    def identity(self, headers: dict[str, str]) -> str:
        for header in self.headers:
            value = headers.get(header)
            if value:
                return value
        return ""

    def produce(self, ctx: SchedulingContext) -> None:
        identity = self.identity(ctx.request.headers)
        if identity:
            ctx.put(AGENT_IDENTITY_KEY, identity)
