"""The lab's Valkey helper starts a real server, answers PING, and survives kill/restart on one port."""

from __future__ import annotations

import socket

import pytest

from ppc_extproc_lab.valkey import ValkeyServer, find_valkey_server, ping, start_valkey

pytestmark = pytest.mark.integration


def _command(server: ValkeyServer, *parts: bytes) -> bytes:
    payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection((server.host, server.port), timeout=2.0) as sock:
        sock.sendall(payload)
        return sock.recv(256)


def test_a_server_binary_is_installed() -> None:
    assert find_valkey_server() is not None


def test_fixture_server_stores_and_is_reaped(valkey_server: ValkeyServer) -> None:
    assert ping(valkey_server.host, valkey_server.port)
    assert _command(valkey_server, b"SET", b"k", b"v") == b"+OK\r\n"
    assert _command(valkey_server, b"GET", b"k") == b"$1\r\nv\r\n"
    assert valkey_server.url == f"redis://{valkey_server.host}:{valkey_server.port}"


def test_kill_then_restart_on_the_same_port_is_empty() -> None:
    with start_valkey() as server:
        port = server.port
        _command(server, b"SET", b"k", b"v")
        server.kill()
        assert not server.running()
        assert not ping(server.host, port)
        server.restart()
        assert server.port == port and ping(server.host, port)
        assert _command(server, b"GET", b"k") == b"$-1\r\n"
        process = server.process
    assert not process.running()
