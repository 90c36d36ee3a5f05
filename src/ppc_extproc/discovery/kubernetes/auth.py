"""How discovery reaches the API server: in-cluster service account, or a kubeconfig.

Order (controller-runtime's, ``kubernetes-sigs/controller-runtime: pkg/client/config/config.go``
``loadConfig``): ``--kubeconfig``, then ``$KUBECONFIG``, then the in-cluster service account when
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` are set, then ``~/.kube/config``.

In cluster: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the CA and bearer token
from ``/var/run/secrets/kubernetes.io/serviceaccount/``. The kubelet rotates the projected token, so
it is re-read at least every minute and after any 401 (client-go
``transport/token_source.go`` ``NewCachedFileTokenSource``). A kubeconfig is loaded by
``kubernetes_asyncio`` (tokens, client certificates, exec plugins) and reloaded after a 401.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppc_extproc.errors import ConfigError

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ClusterAccess",
    "in_cluster_access",
    "kubeconfig_access",
    "load_cluster_access",
    "namespace_default",
]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0
DEFAULT_NAMESPACE = "default"


def _join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class ClusterAccess:
    """A ``kubernetes_asyncio`` client configuration plus the means to renew its credentials."""

    #: ``kubernetes_asyncio.client.Configuration``.
    configuration: Any
    #: ``in-cluster`` or ``kubeconfig <path>``: logged at startup.
    source: str
    _refresh: Callable[[], Any] | None = field(default=None, repr=False)
    _stale: bool = field(default=False, repr=False)

    def invalidate(self) -> None:
        """The API server answered 401: reload credentials before the next request."""
        self._stale = True

    async def _hook(self, configuration: Any) -> None:
        if self._refresh is not None:
            result = self._refresh()
            if inspect.isawaitable(result):  # kubernetes_asyncio refresh hooks may be sync or async
                await result


class _TokenFile:
    """A bearer token file, re-read every ``period`` seconds and when invalidated."""

    def __init__(self, path: Path, access: ClusterAccess, period: float = TOKEN_REREAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.access, self.period, self.clock = path, access, period, clock
        self.read_at = -1e18

    def read(self) -> str:
        try:
            token = self.path.read_text().strip()
        except OSError as exc:
            raise ConfigError("kubernetes", f"cannot read the service-account token {self.path}: {exc.strerror or exc}") from None
        if not token:
            raise ConfigError("kubernetes", f"the service-account token file {self.path} is empty")
        self.read_at = self.clock()
        return token

    def refresh(self) -> None:
        if self.access._stale or self.clock() - self.read_at >= self.period:
            self.access._stale = False
            try:
                self.access.configuration.api_key["BearerToken"] = f"Bearer {self.read()}"
            except ConfigError:
                pass  # keep the last token; the request fails with 401 and is retried with backoff


def _client_configuration() -> Any:
    from kubernetes_asyncio.client import Configuration

    return Configuration()


def in_cluster_access(environ: Mapping[str, str], directory: Path = SERVICE_ACCOUNT_DIR) -> ClusterAccess:
    """The service account's access; raises ConfigError naming what is missing."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError("kubernetes", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set in cluster")
    ca = directory / "ca.crt"
    if not ca.is_file():
        raise ConfigError("kubernetes", f"the service-account CA {ca} does not exist")
    configuration = _client_configuration()
    configuration.host = "https://" + _join_host_port(host, port)
    configuration.ssl_ca_cert = str(ca)
    access = ClusterAccess(configuration, "in-cluster")
    token = _TokenFile(directory / "token", access)
    configuration.api_key["BearerToken"] = f"Bearer {token.read()}"
    access._refresh = token.refresh
    configuration.refresh_api_key_hook = access._hook
    return access


async def kubeconfig_access(paths: str, context: str | None = None) -> ClusterAccess:
    """Access from kubeconfig file(s) (``os.pathsep``-separated, as ``$KUBECONFIG``)."""
    from kubernetes_asyncio.config import load_kube_config
    from kubernetes_asyncio.config.config_exception import ConfigException

    configuration = _client_configuration()
    access = ClusterAccess(configuration, f"kubeconfig {paths}")

    async def load() -> None:
        await load_kube_config(config_file=paths, context=context, client_configuration=configuration,
                               persist_config=False)

    async def reload() -> None:
        if access._stale:
            access._stale = False
            try:
                await load()
            except (ConfigException, OSError, ValueError, KeyError):
                pass  # keep the last credentials; the request is retried with backoff

    try:
        await load()
    except (ConfigException, OSError, ValueError, KeyError) as exc:
        raise ConfigError("--kubeconfig", f"cannot load kubeconfig {paths}: {exc}") from None
    access._refresh = reload
    configuration.refresh_api_key_hook = access._hook
    return access


async def load_cluster_access(kubeconfig: str | None = None, environ: Mapping[str, str] | None = None,
                              service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> ClusterAccess:
    """``--kubeconfig``, ``$KUBECONFIG``, in-cluster, ``~/.kube/config``: the first that applies."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return await kubeconfig_access(kubeconfig)
    if env.get("KUBECONFIG"):
        return await kubeconfig_access(env["KUBECONFIG"])
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster_access(env, service_account_dir)
    home = Path(env.get("HOME", "~")).expanduser() / ".kube" / "config"
    if home.is_file():
        return await kubeconfig_access(str(home))
    raise ConfigError(
        "--kubeconfig",
        "no Kubernetes API access: not in a cluster (KUBERNETES_SERVICE_HOST unset), no $KUBECONFIG and no ~/.kube/config",
    )


def namespace_default(flag: str | None, environ: Mapping[str, str] | None = None,
                      service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> str:
    """``--pool-namespace``, else ``$NAMESPACE`` (llm-d's ``resolvePoolNamespace``), else the
    service account's namespace file when running in a pod, else ``default``."""
    env = os.environ if environ is None else environ
    if flag:
        return flag
    if env.get("NAMESPACE"):
        return env["NAMESPACE"]
    try:
        namespace = (service_account_dir / "namespace").read_text().strip()
    except OSError:
        namespace = ""
    return namespace or DEFAULT_NAMESPACE
