"""``serve --workers N``: N full service processes sharing one gRPC port, one per core.

The supervisor (the process started as ``serve --workers N``) starts N copies of its own command
line with ``--worker-index i``; each is a complete service — its own configuration, index,
KV-event subscribers, metric polls and in-flight accounting, exactly like active-active replicas —
and binds the gRPC port with ``SO_REUSEPORT`` (grpc's ``grpc.so_reuseport``), so the kernel spreads
incoming *connections* over them. Envoy keeps one HTTP/2 connection per worker thread to the
service and multiplexes every request's stream on it: run Envoy with at least as many workers as
the service has (``--concurrency``), or several Envoys, so there are connections to spread.

Admin ports: worker ``i`` serves its admin API (``/metrics``, ``/debug/*``, ``/readyz``) on
``--admin-port + i`` (0: each picks a free port; -1: none). Each worker's readiness is its own;
gRPC health on the shared port answers for whichever worker the connection landed on.

Signals: SIGTERM/SIGINT go to every worker, which drain as a single service does; the supervisor
exits when all have, with the first non-zero status. A worker that exits on its own takes the
others down too (exit status 1 or its own): the orchestrator restarts the pod, as it would a
single-process service that died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

__all__ = ["cpu_count", "supervise", "worker_argv"]

#: Flags the supervisor rewrites per worker (with their value).
_REWRITTEN = ("--workers", "--admin-port", "--worker-index")


def worker_argv(argv: Sequence[str], index: int, admin_port: int) -> list[str]:
    """The ``serve`` command line of worker ``index``: ``argv`` without ``--workers``,
    ``--admin-port`` and ``--worker-index``, plus this worker's index and admin port."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _REWRITTEN:
            skip = True
            continue
        if any(arg.startswith(flag + "=") for flag in _REWRITTEN):
            continue
        out.append(arg)
    port = admin_port if admin_port <= 0 else admin_port + index
    return [*out, "--worker-index", str(index), "--admin-port", str(port)]


def supervise(argv: Sequence[str], workers: int, admin_port: int, *, stop_timeout: float = 30.0) -> int:
    """Run ``workers`` workers of ``serve`` (``argv`` = its arguments after the program name)
    until a signal or a worker's exit; return the exit status."""
    procs = [
        subprocess.Popen([sys.executable, "-m", "ppc_extproc", *worker_argv(argv, i, admin_port)],
                         preexec_fn=_die_with_parent)
        for i in range(workers)
    ]
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as the workers: ignored
    status = 0
    try:
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.1)
        unexpected = not stopping
        if unexpected:  # a worker exited by itself: stop the rest
            forward(signal.SIGTERM, None)
        deadline = time.monotonic() + stop_timeout
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        codes = [proc.returncode for proc in procs]
        status = next((c if c > 0 else 1 for c in codes if c != 0), 1 if unexpected else 0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return status


def _die_with_parent() -> None:
    """Linux: the kernel sends the worker SIGTERM if the supervisor dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def cpu_count() -> int:
    """Cores this process may run on (``--workers 0`` = one worker per core)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
