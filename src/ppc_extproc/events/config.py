"""``kvEventsConfig``: where KV events come from and how they are consumed."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ENGINE_TYPES", "MAX_BATCH_WINDOW_SECONDS", "CurveConfig", "KVEventsConfig", "PodDiscoveryConfig"]

ENGINE_TYPES = ("vllm", "sglang")
#: Longest ``batch_window_seconds`` accepted.
MAX_BATCH_WINDOW_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class PodDiscoveryConfig:
    """Per-endpoint subscriber ports (``kvEventsConfig.podDiscoveryConfig``)."""

    #: Engine PUB port; DP rank ``r`` publishes on ``socketPort + r``.
    socket_port: int = 5557
    #: Engine replay ROUTER port (+ rank); 0 disables replay.
    replay_socket_port: int = 0
    #: Accepted for llm-d compatibility; endpoints come from discovery, not from a label selector.
    pod_label_selector: str = "llm-d.ai/inference-serving=true"
    pod_namespace: str = ""


@dataclass(frozen=True, slots=True)
class CurveConfig:
    """ZMQ CURVE of the central SUB (``kvEventsConfig.curveConfig``): key files, e.g. Kubernetes
    secrets mounted as files. ppc-extproc's own names: llm-d has no publisher authentication."""

    #: The server's secret key: a Z85 key (40 characters) or a ZMQ certificate file.
    server_secret_key_file: str = ""
    #: The publishers' public keys: a file (one Z85 key per line, or a certificate) or a directory
    #: of such files.
    allowed_publisher_keys: str = ""


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """How the service subscribes to engines' KV events."""

    #: Set ⇒ central mode: bind one SUB socket here (e.g. ``tcp://*:5557``) that engines connect to.
    zmq_endpoint: str = ""
    #: SUB prefix filter on the topic frame.
    topic_filter: str = "kv@"
    #: llm-d's worker shards. Accepted; ppc-extproc applies events on one thread in per-source order.
    concurrency: int = 4
    #: ``vllm`` or ``sglang`` (decoding differences).
    engine_type: str = "vllm"
    #: Per-endpoint subscribers for the endpoints discovery reports.
    discover_pods: bool = True
    pod_discovery: PodDiscoveryConfig = field(default_factory=PodDiscoveryConfig)
    #: Bound of each source's queue of undecoded messages (overflow ⇒ drop + resync).
    queue_size: int = 10000
    #: Central mode: authenticate publishers with ZMQ CURVE.
    curve: CurveConfig | None = None
    #: Central mode: allow a bind beyond loopback without ``curve`` (anyone reaching the port can
    #: then publish as any pool endpoint).
    allow_unauthenticated_publishers: bool = False
    #: While messages arrive closer together than this, the ingestion thread lets the next ones
    #: gather for this long before it reads again, so the decode-step messages of many streams
    #: (one block each) share a wake-up. A request's arrival ends the wait (``flush``), so
    #: decisions see the messages that came before them; between requests the index trails the
    #: engines by at most this much. A backlog, a replay, a command or a connection event is never
    #: kept waiting, and a stream denser than ``TransportTuning.dense_messages_per_second``, or of
    #: messages larger than ``small_message_bytes`` (prefill), is read as it comes. 0: apply each
    #: message as it arrives.
    batch_window_seconds: float = 1.0
