"""Child processes that are always cleaned up.

* :class:`ManagedProcess` runs one command in its own process group (``start_new_session``) with
  stdout and stderr in a log file; :meth:`ManagedProcess.stop` sends SIGTERM to the whole group,
  SIGKILL after the timeout, and always reaps.
* :class:`ProcessGroup` owns several and stops them in reverse start order, also when a start
  fails halfway.
* Safety nets: every started process is stopped at interpreter exit (``atexit``); SIGTERM and
  SIGHUP become ``SystemExit`` (when no handler was installed) so ``finally`` blocks run; and on
  Linux a child started from the main thread gets SIGTERM from the kernel when its parent dies,
  even by SIGKILL (``PR_SET_PDEATHSIG``).

The readiness waits that watch these processes are in :mod:`~ppc_extproc_lab.localcluster.readiness`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Self

import structlog

from ppc_extproc_lab.localcluster._errors import LocalClusterError

__all__ = ["ManagedProcess", "ProcessGroup", "stop_all_processes"]

log = structlog.get_logger(__name__)

# Runs before the real command (then replaced by it via exec): ask the kernel to SIGTERM this
# process when the parent thread dies, and bail out if the parent is already gone.
_PDEATHSIG_TRAMPOLINE = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None).prctl(1,int(signal.SIGTERM))\n"
    "os.getppid()==int(sys.argv[1]) or os._exit(70)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)

_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()
_hooks_installed = False


class ManagedProcess:
    """One command in its own process group, logging to ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        if not argv:
            raise ValueError("argv must not be empty")
        self.name = name
        self.argv: list[str] = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self._popen: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def pid(self) -> int | None:
        """Process id (also the process group id) once started."""
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has exited and was reaped (negative: killed by signal)."""
        if self._popen is None:
            return None
        return self._popen.poll()

    def running(self) -> bool:
        """True between :meth:`start` and the process's exit."""
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        """Spawn the command. A stopped process may be started again (same log file, appended)."""
        if self.running():
            raise LocalClusterError(f"{self.name} is already running (pid {self.pid})")
        executable = shutil.which(
            self.argv[0], path=None if self.env is None else self.env.get("PATH")
        )
        if executable is None:
            raise LocalClusterError(
                f"cannot start {self.name}: {self.argv[0]!r} is not an executable file or on PATH"
            )
        _install_exit_hooks()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        log_file.write(f"=== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
        log_file.flush()
        argv = self.argv
        if self.die_with_parent and _pdeathsig_available():
            argv = [
                sys.executable,
                "-I",
                "-S",
                "-c",
                _PDEATHSIG_TRAMPOLINE,
                str(os.getpid()),
                *argv,
            ]
        env = None if self.env is None else {**os.environ, **self.env}
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            log_file.close()
            raise LocalClusterError(f"cannot start {self.name} ({self.argv[0]}): {exc}") from exc
        self._popen, self._log_file, self._stopped = popen, log_file, False
        with _live_lock:
            _live.add(self)
        log.debug("process_started", name=self.name, pid=popen.pid, log_path=str(self.log_path))

    def stop(self, timeout: float = 10.0, *, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """Send ``sig`` (SIGTERM; SIGKILL for a crash) to the process group, SIGKILL it after
        ``timeout`` seconds, reap; return the exit status.

        Safe to call more than once and on a process that already exited (its group is still
        signalled, so grandchildren it left behind go too).
        """
        popen = self._popen
        if popen is None:
            return None
        if self._stopped:  # never signal a group id that may have been recycled since
            return popen.returncode
        try:
            pgid = popen.pid
            _signal_group(pgid, sig)
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("process_kill", name=self.name, pid=pgid, after_seconds=timeout)
                _signal_group(pgid, signal.SIGKILL)
                popen.wait()
            # The leader is gone; give the rest of its group a moment, then kill what remains.
            deadline = time.monotonic() + min(timeout, 2.0)
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _group_alive(pgid):
                _signal_group(pgid, signal.SIGKILL)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            self._stopped = popen.returncode is not None
            with _live_lock:
                _live.discard(self)
        log.debug("process_stopped", name=self.name, pid=popen.pid, returncode=popen.returncode)
        return popen.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit by itself; raise ``subprocess.TimeoutExpired`` on timeout."""
        if self._popen is None:
            raise LocalClusterError(f"{self.name} was never started")
        return self._popen.wait(timeout=timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log file ('' if there is none)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 64 * 1024))
                data = f.read()
        except FileNotFoundError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class ProcessGroup:
    """Owns processes and stops them in reverse start order (``with`` or :meth:`stop_all`)."""

    def __init__(self, log_dir: str | os.PathLike[str], *, stop_timeout: float = 10.0) -> None:
        self.log_dir = Path(log_dir)
        self.stop_timeout = stop_timeout
        self._procs: list[ManagedProcess] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    @property
    def processes(self) -> list[ManagedProcess]:
        """Owned processes in start order."""
        return list(self._procs)

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        die_with_parent: bool = True,
    ) -> ManagedProcess:
        """Create, register and start a process logging to ``<log_dir>/<name>.log``."""
        proc = ManagedProcess(
            name,
            argv,
            log_path=self.log_dir / f"{name}.log",
            env=env,
            cwd=cwd,
            die_with_parent=die_with_parent,
        )
        self.add(proc)
        proc.start()
        return proc

    def add(self, proc: ManagedProcess) -> ManagedProcess:
        """Register a process (started or not) so that :meth:`stop_all` stops it."""
        if proc not in self._procs:
            self._procs.append(proc)
        return proc

    def stop_all(self, timeout: float | None = None) -> None:
        """Stop every process, newest first; one failing stop does not prevent the others."""
        errors: list[BaseException] = []
        for proc in reversed(self._procs):
            try:
                proc.stop(self.stop_timeout if timeout is None else timeout)
            except BaseException as exc:
                errors.append(exc)
        self._procs.clear()
        if errors:
            raise errors[0]


def stop_all_processes(timeout: float = 5.0) -> None:
    """Stop every :class:`ManagedProcess` of this interpreter that is still running (atexit hook)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        try:
            proc.stop(timeout)
        except Exception:  # best effort at exit
            log.exception("process_stop_failed", name=proc.name)


def _pdeathsig_available() -> bool:
    return (
        sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
    )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _raise_system_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _install_exit_hooks() -> None:
    """Once per interpreter: atexit cleanup, and SIGTERM/SIGHUP → SystemExit if unhandled."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop_all_processes)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _raise_system_exit)

