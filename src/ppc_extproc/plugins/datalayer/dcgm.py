"""GPU telemetry from NVIDIA's DCGM exporter: ``dcgm-data-source`` polls it, ``dcgm-extractor``
reads GPU utilisation into an endpoint attribute (each class documents its type).

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/datalayer/source/dcgm/`` and
``…/extractor/dcgm/extractor.go``.
"""

from __future__ import annotations

import re

from ppc_extproc.enginemetrics import AttributeStore, MetricSpec, attribute_key, family_samples
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Consumes, Endpoint, MetricsExtractor, PluginState, StateReporter, plays
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.datalayer.metrics_data_source import MetricsDataSource, PollOptions
from ppc_extproc.plugins.datalayer.metrics_poll_config import round_interval
from ppc_extproc.plugins.registry import Services, SourceWiring, register

__all__ = ["DCGM_EXTRACTOR", "GPU_UTILIZATION", "GPU_UTIL_METRIC", "DCGMDataSource", "DCGMExtractor", "pod_name"]

DCGM_EXTRACTOR = "dcgm-extractor"
GPU_UTILIZATION = "GPUUtilization"
GPU_UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
DEFAULT_DCGM_PORT = 9400
_RANK_SUFFIX = re.compile(r"-rank-\d+$")


def pod_name(endpoint: Endpoint) -> str:
    """The pod an endpoint belongs to, as DCGM's ``pod`` label names it ("" when unnamed)."""
    return _RANK_SUFFIX.sub("", endpoint.name.rsplit("/", 1)[-1])


@register("dcgm-data-source")
class DCGMDataSource(MetricsDataSource):
    """``dcgm-data-source``: poll every endpoint's DCGM exporter and hand the body to its extractors.

    Type        ``dcgm-data-source`` (polling data source; wire it with ``dataLayer.sources``)
    Behaviour   polls ``<scheme>://<endpoint ip>:<port><path>`` of every endpoint (the exporter as a
                sidecar) as ``metrics-data-source`` does (timeouts, bounded concurrency, back-off on
                failures), at a fixed interval (no adaptive polling)
    Parameters  (llm-d's names and defaults) ``scheme`` [http|https], ``path`` ["/metrics"],
                ``port`` [9400], ``insecureSkipVerify`` [true], ``interval`` [every base tick,
                50 ms; rounded to a multiple of it], ``useNodeAddress`` [false]: true (the exporter
                as a DaemonSet on the node's address) is refused: ppc-extproc's endpoints carry no
                node address

        plugins:
        - {type: dcgm-data-source, name: dcgm-source, parameters: {port: 9400, interval: 1s}}
        - {type: dcgm-extractor}
        dataLayer:
          sources: [{pluginRef: dcgm-source, extractors: [{pluginRef: dcgm-extractor}]}]
    """

    source_consumes: tuple[Consumes[object], ...] = ()

    @classmethod
    def from_wiring(cls, name: str, params: Section, services: Services, wiring: SourceWiring) -> DCGMDataSource:
        scheme = params.string("scheme", "http")
        if scheme not in ("http", "https"):
            raise ConfigError(params.child_path("scheme"), f"unsupported scheme: {scheme}")
        port = params.integer("port", DEFAULT_DCGM_PORT)
        if not 1 <= port <= 65535:
            raise ConfigError(params.child_path("port"), f"invalid port {port}: must be between 1 and 65535")
        if params.boolean("useNodeAddress", False):
            raise ConfigError(
                params.child_path("useNodeAddress"),
                "true is not supported: ppc-extproc's endpoints carry no node address; run the DCGM exporter "
                "as a sidecar of the engine (useNodeAddress: false)",
            )
        # "" or unset: every base tick, as llm-d's ParseIntervalOption.
        interval = params.duration("interval", "50ms") if params.raw("interval", "") != "" else 0.05
        if interval <= 0:
            raise ConfigError(params.child_path("interval"), "must be positive")
        options = PollOptions(
            interval_seconds=round_interval(interval),
            scheme=scheme,
            path=params.string("path", "/metrics") or "/metrics",
            port=port,
            insecure_skip_verify=params.boolean("insecureSkipVerify", True),
        )
        services.attributes.expect_updates_every(options.interval_seconds)
        extractors = [e for e in wiring.extractors if plays(e, MetricsExtractor)]
        return cls(name, options, extractors=extractors, clock=services.clock)


@register(DCGM_EXTRACTOR)
class DCGMExtractor(MetricsExtractor, StateReporter):
    """``dcgm-extractor``: an endpoint's GPU utilisation (0..1) from its DCGM exporter's body.

    Type        ``dcgm-extractor`` (metrics extractor; list it under a ``dcgm-data-source``)
    Behaviour   ``DCGM_FI_DEV_GPU_UTIL`` (percent): the series whose ``pod`` label names the
                endpoint's pod and every series without a ``pod`` label, max over them (the busiest
                GPU), / 100 ⇒ the attribute ``GPUUtilization/dcgm-extractor`` (the key does not
                depend on the instance name, as in llm-d). No family, or no series for the pod, is
                an extract error and drops the old value. The pod is the endpoint's name without a
                ``<namespace>/`` prefix and ``-rank-<i>`` suffix (Kubernetes discovery names
                endpoints ``<namespace>/<pod>-rank-<i>``); an unnamed endpoint takes every series
    Parameters  none

        plugins:
        - {type: dcgm-extractor}
        - type: endpoint-attribute-scorer
          parameters: {attributeKey: GPUUtilization, producer: dcgm-extractor,
                       algorithm: {type: linear_lower_is_better}}
    """

    SPEC = MetricSpec(GPU_UTIL_METRIC)
    KEY = attribute_key(GPU_UTILIZATION, DCGM_EXTRACTOR)

    def __init__(self, name: str, store: AttributeStore) -> None:
        self.name = name
        self.store = store
        self.extract_errors = 0

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> DCGMExtractor:
        return cls(name, services.attributes)

    def extract_metrics(self, endpoint: Endpoint, payload: bytes, now: float) -> None:
        pod = pod_name(endpoint)
        values = [v for labels, v in family_samples(payload, self.SPEC) if not pod or labels.get("pod", pod) == pod]
        if not values:
            self.extract_errors += 1
            self.store.forget(endpoint.id, self.KEY)
            present = payload.startswith(GPU_UTIL_METRIC.encode()) or b"\n" + GPU_UTIL_METRIC.encode() in payload
            if present:
                raise ValueError(f"metric {GPU_UTIL_METRIC!r} present but has no samples for pod {pod!r}")
            raise ValueError(f"metric {GPU_UTIL_METRIC!r} not found in DCGM response")
        self.store.put(endpoint.id, self.KEY, max(values) / 100.0)

    def forget_endpoint(self, endpoint_id: str) -> None:
        self.store.forget(endpoint_id, self.KEY)

    def state(self, *, detailed: bool = False) -> PluginState:
        return PluginState(self.name, self.type_name, details={"extractErrors": self.extract_errors})
