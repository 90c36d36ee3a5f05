"""Kubernetes discovery: an InferencePool (or a label selector) and its ready pods as endpoints.

    KubernetesDiscovery(KubernetesDiscoveryConfig(namespace="llm", pool_name="qwen-pool"))

is a discovery source (``async run(pool, stop)``), selected by ``serve --pool-name`` or
``serve --endpoint-selector … --endpoint-target-ports …`` (llm-d's flags; ``options.py``).
Importing this package imports no Kubernetes client: ``kubernetes_asyncio`` loads when ``run`` starts.
"""

from __future__ import annotations

from ppc_extproc.discovery.kubernetes.discovery import KubernetesDiscovery, KubernetesDiscoveryConfig
from ppc_extproc.discovery.kubernetes.options import KubernetesFlags, config_from_flags

__all__ = ["KubernetesDiscovery", "KubernetesDiscoveryConfig", "KubernetesFlags", "config_from_flags"]
