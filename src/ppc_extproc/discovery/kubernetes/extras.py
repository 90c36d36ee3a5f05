"""What llm-d's EPP does through the Kubernetes API besides discovery, built from the serve flags:
leader election (``lease.py``), the pool's InferenceModelRewrite/InferenceObjective watch
(``crds.py``) and ``/metrics`` token reviews (``reviews.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ppc_extproc.discovery.kubernetes.crds import CrdWatcher
from ppc_extproc.discovery.kubernetes.discovery import KubernetesDiscovery
from ppc_extproc.discovery.kubernetes.lease import LeaderElector, LeaseConfig, default_identity, lease_name
from ppc_extproc.discovery.kubernetes.reviews import MetricsAuthorizer
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Discovery
from ppc_extproc.scheduling.objectives import ModelRewrites, Objectives

__all__ = ["KubernetesExtras", "kubernetes_extras"]

_NEEDS = "needs Kubernetes discovery (--pool-name or --endpoint-selector)"


@dataclass(frozen=True, slots=True)
class KubernetesExtras:
    leader_elector: LeaderElector | None = None
    #: Pool mode only (the objects name their pool).
    crd_watch: CrdWatcher | None = None
    metrics_auth: MetricsAuthorizer | None = None


def kubernetes_extras(discovery: Discovery | None, *, leader_election: bool, metrics_auth: bool) -> KubernetesExtras:
    """The parts the flags ask for; ConfigError naming the flag when they need Kubernetes and it is off."""
    if not isinstance(discovery, KubernetesDiscovery):
        if leader_election:
            raise ConfigError("--ha-enable-leader-election", _NEEDS)
        if metrics_auth:
            raise ConfigError("--metrics-endpoint-auth", f"{_NEEDS}; or set --metrics-endpoint-auth=false")
        return KubernetesExtras()
    config = discovery.config
    elector = None
    if leader_election:
        # Selector mode has no pool name: the lease is named ``standalone`` there.
        name = lease_name(config.namespace, config.pool_name or "standalone")
        elector = LeaderElector(LeaseConfig(config.namespace, name, default_identity()), kubeconfig=config.kubeconfig)
    crds = None
    if config.pool_name:
        crds = CrdWatcher(config.namespace, config.pool_name, ModelRewrites(), Objectives(), kubeconfig=config.kubeconfig)
    auth = MetricsAuthorizer(kubeconfig=config.kubeconfig) if metrics_auth else None
    return KubernetesExtras(elector, crds, auth)
