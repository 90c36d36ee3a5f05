"""ZMQ socket plumbing of the ingestion thread: SUB sockets with the options every subscriber
gets, their connection monitors, and reading one KV-event message off a SUB."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from ppc_extproc.events.transport.policy import TransportTuning

__all__ = [
    "HANDSHAKE_FAILED_EVENTS",
    "MONITOR_EVENTS",
    "close_socket",
    "open_sub",
    "read_message",
    "recv_monitor_event",
]

#: Connection events that matter: a completed handshake (connect or reconnect) and a drop.
MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
#: Handshakes a central CURVE server refused (wrong server key, no CURVE, key not allowed).
HANDSHAKE_FAILED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)

Socket = zmq.Socket[bytes]


def open_sub(
    context: zmq.Context[Socket],
    address: str,
    *,
    bind: bool,
    topic_filter: bytes,
    hwm: int,
    tuning: TransportTuning,
    monitor: bool = False,
    monitor_events: int = MONITOR_EVENTS,
    curve_secret_key: bytes | None = None,
    zap_domain: str = "",
) -> tuple[Socket, Socket | None]:
    """A SUB socket subscribed to ``topic_filter``, connected to (or bound at) ``address``, and
    optionally its monitor (attached before connecting, so the first handshake is reported).
    The receive high-water mark bounds what queues per publisher connection. With
    ``curve_secret_key`` the socket is a CURVE server (its ZAP handler must already be bound)."""
    sock = context.socket(zmq.SUB)
    mon: Socket | None = None
    try:
        if curve_secret_key is not None:
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, curve_secret_key)
            sock.setsockopt(zmq.ZAP_DOMAIN, zap_domain.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, tuning.max_frame_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL, int(tuning.reconnect_interval_seconds * 1000))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(tuning.reconnect_interval_max_seconds * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(tuning.heartbeat_interval_seconds * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(tuning.heartbeat_timeout_seconds * 1000))
        if "[" in address or "::" in address:
            sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.SUBSCRIBE, topic_filter)
        if monitor:
            mon = sock.get_monitor_socket(monitor_events)
        if bind:
            sock.bind(address)
        else:
            sock.connect(address)
    except BaseException:
        close_socket(sock, mon)
        raise
    return sock, mon


def recv_monitor_event(monitor: Socket) -> int | None:
    """The next pending monitor event id, or None when there is none."""
    try:
        message = recv_monitor_message(monitor, zmq.NOBLOCK)
    except zmq.Again:
        return None
    return int(cast(dict[str, int], message)["event"])


def close_socket(sock: Socket | None, monitor: Socket | None = None) -> None:
    """Close ``sock`` (and its monitor) immediately, discarding anything queued."""
    if sock is not None and monitor is not None:
        try:
            sock.disable_monitor()
        except zmq.ZMQError:
            pass
    if monitor is not None:
        monitor.close(0)
    if sock is not None:
        sock.close(0)


def read_message(recv: Callable[..., zmq.Frame], first: zmq.Frame) -> list[bytes]:
    """The frames of a message whose first frame is ``first``; a message of more than three frames
    comes back as its first three and one empty frame, the rest discarded uncopied
    (``split_message`` refuses any count but three). The remaining parts of a multipart message
    are always already there."""
    frames = [first.bytes]
    more = first.more
    while more and len(frames) < 3:
        frame = recv(copy=False)
        frames.append(frame.bytes)
        more = frame.more
    if more:
        frames.append(b"")
        while more:
            more = recv(copy=False).more
    return frames
