"""ManagedProcess / ProcessGroup / readiness waits, with real (tiny) child processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ppc_extproc_lab.localcluster import (
    LocalClusterError,
    ManagedProcess,
    ProcessGroup,
    ReadinessError,
    free_port,
    wait_for_grpc_health,
    wait_for_http,
    wait_for_tcp,
)

pytestmark = pytest.mark.integration

PY = sys.executable
REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def _wait_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()).endswith("\n"):
            return text
        time.sleep(0.02)
    raise AssertionError(f"{path} not written")


def test_stop_terminates_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    proc = ManagedProcess(
        "tree",
        ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"],
        log_path=tmp_path / "tree.log",
    )
    proc.start()
    try:
        grandchild = int(_wait_file(pidfile))
        assert _alive(grandchild)
    finally:
        status = proc.stop(timeout=5)
    assert status is not None
    assert _wait_gone(grandchild), "the grandchild survived stop()"
    assert proc.stop() == status  # idempotent


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"import signal,time,pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path({str(ready)!r}).write_text('x\\n'); time.sleep(300)"
    proc = ManagedProcess("stubborn", [PY, "-c", code], log_path=tmp_path / "s.log")
    proc.start()
    try:
        _wait_file(ready)
        started = time.monotonic()
        status = proc.stop(timeout=0.3)
        assert status == -signal.SIGKILL
        assert time.monotonic() - started < 5
    finally:
        proc.stop()


def test_output_goes_to_the_log_and_restart_appends(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "echo", [PY, "-c", "print('hello-from-child')"], log_path=tmp_path / "echo.log"
    )
    proc.start()
    assert proc.wait(timeout=10) == 0
    proc.stop()
    proc.start()
    proc.wait(timeout=10)
    proc.stop()
    lines = proc.log_tail().splitlines()
    assert lines.count("hello-from-child") == 2
    assert sum(line.startswith("=== ") for line in lines) == 2  # one start banner per run


def test_readiness_fails_fast_with_log_tail_when_the_process_dies(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "crasher",
        [PY, "-c", "print('boom-marker', flush=True); raise SystemExit(3)"],
        log_path=tmp_path / "c.log",
    )
    proc.start()
    try:
        with pytest.raises(ReadinessError) as info:
            wait_for_http(f"http://127.0.0.1:{free_port()}/health", timeout=300, process=proc)
    finally:
        proc.stop()
    message = str(info.value)
    assert "exited with status 3" in message  # the exit ended the wait, not the timeout
    assert "boom-marker" in message


def test_readiness_timeout_names_the_last_error(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(ReadinessError, match=r"timed out after 0\.3s waiting for tcp 127\.0\.0\.1"):
        wait_for_tcp("127.0.0.1", port, timeout=0.3)
    with pytest.raises(ReadinessError, match="last error"):
        wait_for_grpc_health(f"127.0.0.1:{port}", "readiness", timeout=0.5)


def test_wait_for_http_and_tcp_succeed(tmp_path: Path) -> None:
    port = free_port()
    server = ManagedProcess(
        "http",
        [PY, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        log_path=tmp_path / "h.log",
    )
    server.start()
    try:
        wait_for_tcp("127.0.0.1", port, timeout=20, process=server)
        wait_for_http(f"http://127.0.0.1:{port}/", timeout=20, process=server)
        wait_for_http(
            f"http://127.0.0.1:{port}/missing", expect_status=404, timeout=5, process=server
        )
    finally:
        server.stop()


def test_grpc_health_wait_against_the_stub(tmp_path: Path) -> None:
    port = free_port()
    stub = ManagedProcess(
        "stub",
        [PY, str(Path(__file__).parent / "stub_extproc.py"), "--grpc-port", str(port)],
        log_path=tmp_path / "g.log",
    )
    stub.start()
    try:
        wait_for_grpc_health(f"127.0.0.1:{port}", "readiness", timeout=30, process=stub)
        with pytest.raises(ReadinessError, match="SERVICE_UNKNOWN|NOT_FOUND"):
            wait_for_grpc_health(f"127.0.0.1:{port}", "no-such-service", timeout=0.5)
    finally:
        stub.stop()


def test_group_stops_in_reverse_order_and_after_a_failed_start(tmp_path: Path) -> None:
    order = tmp_path / "order"
    code = textwrap.dedent(
        f"""
        import signal, sys, time, pathlib
        name = sys.argv[1]
        def bye(*_):
            with open({str(order)!r}, "a") as f:
                f.write(name + "\\n")
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, bye)
        pathlib.Path({str(tmp_path)!r}, name + ".up").write_text("up\\n")
        while True:
            time.sleep(1)
        """
    )
    group = ProcessGroup(tmp_path / "logs")
    with pytest.raises(LocalClusterError, match="cannot start broken"), group:
        for name in ("first", "second", "third"):
            group.spawn(name, [PY, "-c", code, name])
            _wait_file(tmp_path / f"{name}.up")
        group.spawn("broken", [str(tmp_path / "does-not-exist")])
    assert order.read_text().split() == ["third", "second", "first"]
    assert all(not p.running() for p in group.processes) and group.processes == []


def _run_parent(tmp_path: Path, body: str) -> tuple[subprocess.Popen[bytes], int]:
    """A Python parent that starts ``sleep 300`` as a ManagedProcess, prints its pid, then runs ``body``."""
    pidfile = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import os, pathlib, signal, sys, time
        from ppc_extproc_lab.localcluster import ManagedProcess
        p = ManagedProcess("sleeper", ["sleep", "300"], log_path={str(tmp_path / "sleeper.log")!r})
        p.start()
        pathlib.Path({str(pidfile)!r}).write_text(f"{{p.pid}}\\n")
        """
    ) + textwrap.dedent(body)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])
        ),
    }
    parent = subprocess.Popen([PY, "-c", script], env=env)
    return parent, int(_wait_file(pidfile))


def test_child_is_stopped_when_the_parent_exits_without_cleanup(tmp_path: Path) -> None:
    parent, child = _run_parent(tmp_path, "sys.exit(0)\n")
    assert parent.wait(timeout=20) == 0
    assert _wait_gone(child), "atexit did not stop the child"


def test_child_is_stopped_when_the_parent_gets_sigterm(tmp_path: Path) -> None:
    parent, child = _run_parent(tmp_path, "time.sleep(300)\n")
    try:
        _wait_gone_until_running(child)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=20) == 128 + signal.SIGTERM
        assert _wait_gone(child), "SIGTERM to the parent left the child running"
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_child_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    parent, child = _run_parent(tmp_path, "time.sleep(300)\n")
    try:
        _wait_gone_until_running(child)
        parent.kill()
        parent.wait(timeout=20)
        assert _wait_gone(child), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        try:
            os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_gone_until_running(pid: int, timeout: float = 10.0) -> None:
    """Wait until ``pid`` runs the real command (``sleep``), not the pdeathsig trampoline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                return
        except FileNotFoundError:
            break
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never became `sleep`")


def test_port_probe_sees_a_listener_on_every_address() -> None:
    from ppc_extproc_lab.localcluster import PortAllocator, is_port_free

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not is_port_free("127.0.0.1", port)
        assert not is_port_free("127.0.0.3", port)
    allocator = PortAllocator()
    ports = allocator.ports(5, ["127.0.0.2", "127.0.0.3", "0.0.0.0"])
    assert len(set(ports)) == 5
    assert all(is_port_free(h, p) for p in ports for h in ("127.0.0.2", "127.0.0.3"))
    assert allocator.allocated == frozenset(ports)


def test_check_loopback_ip() -> None:
    from ppc_extproc_lab.localcluster import check_loopback_ip

    check_loopback_ip("127.0.0.2")
    with pytest.raises(LocalClusterError, match="cannot bind 192.0.2.1"):
        check_loopback_ip("192.0.2.1")  # TEST-NET-1: never assigned to this host; nothing is sent
