"""``file-discovery``: endpoints from a YAML file, read once or watched for changes.

Type        ``file-discovery`` (discovery; reference it from ``dataLayer.discovery.pluginRef``)
File        a list of ``{name?, address, port, rank?, labels?}`` (``{endpoints: [...]}`` works too;
            llm-d's ``namespace`` is accepted); ``address`` must be an IP, ``port`` an int or string
Behaviour   read at start (an unreadable file is an error); with ``watchFile: true``, re-read when
            the file's modification time or size changes (edits, atomic renames, ConfigMap symlink
            swaps): endpoints added, updated (e.g. a new rank) or deleted become endpoint events
            (KV-event subscribers, index clearing); a broken edit is logged and the previous list
            stays in force. Only a regular file of at most 4 MiB is read (a FIFO, a device such as
            /dev/zero, or a runaway file is refused, never read whole)
Parameters  ``path`` (required), ``watchFile`` [false, as llm-d], ``pollInterval`` ["1s"; how
            often a watched file is checked]

    plugins:
    - type: file-discovery
      parameters: {path: /etc/ppc-extproc/endpoints.yaml, watchFile: true}
    dataLayer:
      discovery: {pluginRef: file-discovery}

    # endpoints.yaml
    - {name: vllm-0, address: 10.0.0.5, port: 8000}
    - {name: vllm-1, address: 10.0.0.6, port: 8000, labels: {zone: a}}
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Discovery, Endpoint, EndpointRegistry
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services, register

__all__ = ["MAX_FILE_BYTES", "FileDiscovery", "parse_endpoints_document", "read_endpoints_file"]

log = structlog.get_logger(__name__)

#: The largest endpoints file read (~50,000 endpoints); a larger one is refused unread.
MAX_FILE_BYTES = 4 * 1024 * 1024


def read_endpoints_file(path: Path) -> str:
    """The text of ``path``, if it is a regular UTF-8 file of at most ``MAX_FILE_BYTES``. Opened
    non-blocking (a FIFO would block until a writer comes) and read no further than the bound."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(str(path), "not a regular file")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(str(path), f"larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"not UTF-8: {exc}") from None


def _endpoint(item: Any, path: str) -> Endpoint:
    spec = Section(item, path)
    address = spec.string("address", "")
    try:
        ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        raise ConfigError(f"{path}.address", f"expected an IP address, got {address!r}") from None
    port_raw = spec.raw("port")
    try:
        port = int(port_raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}.port", f"expected a port number, got {port_raw!r}") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{path}.port", f"port {port} is out of range")
    labels = spec.raw("labels", {})
    if not isinstance(labels, dict):
        raise ConfigError(f"{path}.labels", "expected a mapping of strings")
    endpoint = Endpoint(
        address.strip("[]"),
        port,
        name=spec.string("name", ""),
        rank=spec.integer("rank", 0, minimum=0),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )
    spec.string("namespace", "")
    spec.finish()
    return endpoint


def parse_endpoints_document(text: str, source: str = "<text>") -> list[Endpoint]:
    """Endpoints of a discovery file. Raises ConfigError naming the entry and field."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"not valid YAML: {exc}") from None
    if isinstance(document, dict):
        section = Section(document, "")
        items = list(section.items("endpoints"))
        section.finish()
    elif isinstance(document, list):
        items = [(f"[{i}]", item) for i, item in enumerate(document)]
    elif document is None:
        items = []
    else:
        raise ConfigError(source, "expected a list of endpoints")
    endpoints = [_endpoint(item, path) for path, item in items]
    seen: set[str] = set()
    for (path, _), endpoint in zip(items, endpoints):
        if endpoint.id in seen:
            raise ConfigError(path, f"duplicate endpoint {endpoint.id}")
        seen.add(endpoint.id)
    return endpoints


@dataclass(frozen=True, slots=True)
class FileDiscoveryConfig:
    """The plugin's parameters."""

    path: str = param("path", "")
    poll_interval_seconds: float = param("pollInterval", "1s", duration=True)
    watch_file: bool = param("watchFile", False)


@register("file-discovery")
class FileDiscovery(Discovery):
    def __init__(self, name: str, path: str, poll_interval_seconds: float = 1.0, *, watch: bool = False) -> None:
        self.name = name
        self.path = Path(path)
        self.poll_interval_seconds = poll_interval_seconds
        self.watch = watch
        self._stamp: tuple[int, int] | None = None

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> FileDiscovery:
        config = decode(params, FileDiscoveryConfig)
        if not config.path:
            raise ConfigError(params.child_path("path"), "file-discovery needs the path of the endpoints file")
        if config.poll_interval_seconds <= 0:
            raise ConfigError(params.child_path("pollInterval"), "must be positive")
        return cls(name, config.path, config.poll_interval_seconds, watch=config.watch_file)

    def load(self) -> list[Endpoint] | None:
        """The endpoints, if the file changed since the last load (None when unchanged)."""
        stat = os.stat(self.path)
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return None
        endpoints = parse_endpoints_document(read_endpoints_file(self.path), str(self.path))
        self._stamp = stamp
        return endpoints

    async def run(self, registry: EndpointRegistry, stop: asyncio.Event) -> None:
        """Load the file (errors propagate: the service cannot start without endpoints), then poll."""
        try:
            endpoints = self.load()
        except OSError as exc:
            raise ConfigError(f"{self.name}.path", f"cannot read {self.path}: {exc.strerror or exc}") from None
        registry.replace(endpoints or [])
        if not self.watch:
            await stop.wait()
            return
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.poll_interval_seconds)
                return
            except TimeoutError:
                pass
            try:
                changed = self.load()
            except (OSError, ConfigError) as exc:
                log.error("discovery_file_invalid", path=str(self.path), error=str(exc))
                continue
            if changed is not None:
                registry.replace(changed)
