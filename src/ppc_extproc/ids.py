"""Identifier types shared by every layer: block keys and endpoint ids."""

from __future__ import annotations

from typing import NewType

__all__ = ["MASK64", "EndpointId", "EngineKey", "RequestKey", "destination_host_port", "endpoint_id"]

#: The indexer's own 64-bit key of a block (llm-d's hash chain over request tokens).
RequestKey = NewType("RequestKey", int)
#: The engine's block hash from a KV event, normalised to an unsigned 64-bit int. Opaque.
EngineKey = NewType("EngineKey", int)
#: ``"<ip>:<port>"`` of a serving endpoint, IPv6 without brackets. Key of every index entry.
EndpointId = NewType("EndpointId", str)

MASK64 = (1 << 64) - 1


def endpoint_id(ip: str, port: int | str) -> EndpointId:
    """The index id of an endpoint: ``ip:port`` with IPv6 brackets stripped."""
    return EndpointId(f"{ip.strip('[]')}:{port}")


def destination_host_port(endpoint: str) -> str:
    """The form Envoy expects in ``x-gateway-destination-endpoint``: IPv6 gets brackets."""
    host, _, port = endpoint.rpartition(":")
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return endpoint
