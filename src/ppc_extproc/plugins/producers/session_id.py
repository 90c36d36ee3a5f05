"""``session-id-producer``: the request's session id, from a header or a cookie.

Type        ``session-id-producer`` (producer)
Produces    ``SessionIDDataKey/<name>`` (a ``str``): the trimmed value of the ``headerName`` request
            header, or of the ``cookieName`` cookie in the ``cookie`` header; nothing when absent
            or empty (consumers read that as "no session preference").
            llm-d: ``pkg/epp/framework/plugins/requestcontrol/dataproducer/sessionid/producer.go``.
Consumes    nothing
Parameters  exactly one of ``headerName`` (matched case-insensitively: request header names are
            lowercased) or ``cookieName`` (``name=value`` pairs separated by ``;``)

Session-affinity plugins read it as a source:
``sessionIdConfig.sources: [{attribute: SessionIDDataKey, producer: session-id-producer}]``.

    plugins:
    - type: session-id-producer
      parameters:
        cookieName: llm-d-session
"""

from __future__ import annotations

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import DataProducer, DataType, SchedulingContext
from ppc_extproc.framework.datakeys import Consumes, DataKey
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["SESSION_ID", "SESSION_ID_PRODUCER", "SessionIdProducer", "cookie_value"]

SESSION_ID_PRODUCER = "session-id-producer"
#: The session id of the request (llm-d's ``SessionIDDataKey``).
SESSION_ID: DataType[str] = DataType("SessionIDDataKey")


def cookie_value(header: str, name: str) -> str:
    """The value of cookie ``name`` in a ``Cookie`` header, or "" (RFC 6265 ``name=value; …``)."""
    if not header or not name:
        return ""
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value
    return ""


@register(SESSION_ID_PRODUCER)
class SessionIdProducer(DataProducer):
    def __init__(self, name: str, *, header_name: str = "", cookie_name: str = "") -> None:
        if bool(header_name) == bool(cookie_name):
            raise ValueError("exactly one of header_name or cookie_name")
        self.name = name
        self.header_name = header_name.strip().lower()
        self.cookie_name = cookie_name.strip()
        self.key = SESSION_ID.of(name)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> SessionIdProducer:
        header = params.string("headerName", "").strip()
        cookie = params.string("cookieName", "").strip()
        if bool(header) == bool(cookie):
            raise ConfigError(params.child_path("headerName"),
                              "set exactly one of headerName or cookieName" + (", not both" if header else ""))
        return cls(name, header_name=header, cookie_name=cookie)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return ()

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({self.key})

    def extract(self, headers: dict[str, str]) -> str:
        if self.header_name:
            return headers.get(self.header_name, "").strip()
        return cookie_value(headers.get("cookie", ""), self.cookie_name).strip()

    def produce(self, ctx: SchedulingContext) -> None:
        session = self.extract(ctx.request.headers)
        if session:
            ctx.put(self.key, session)
