"""Helpers to run local key servers for tests and benchmarks.

Every server listens on 127.0.0.1 only, on a port picked here, and runs in its own
session (process group) so that stopping it stops its children too.  A server is always
stopped by its own process id: :func:`stop_process` sends SIGTERM to the group, waits a
bounded time, then SIGKILLs the group and reaps the process.  Every group started here is
also announced to a reaper process (``servers/reaper.py``) that stops it if the process
that started it ends without doing so (pytest stopped by SIGTERM, SIGKILL, a timeout).

The signatures of :func:`free_port`, :func:`wait_for_port`, :func:`start_process` and
:func:`stop_process` are shared by all the server modules in this package; keep them stable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from servers.reaper import group_alive as _group_alive
from servers.reaper import signal_group as _signal_group

__all__ = [
    "HOST",
    "ServerStartError",
    "free_port",
    "free_port_pair",
    "wait_for_port",
    "port_is_open",
    "start_process",
    "stop_process",
    "running_process",
    "silent_listener",
    "closed_port",
    "venv_bin",
    "unavailable",
    "require_module",
    "watch",
    "unwatch",
]

#: the only address local servers listen on
HOST = "127.0.0.1"


def unavailable(reason: str):
    """Skip a test whose server or device cannot run here, or fail it when the run
    requires every server: ``make test`` (and so CI) sets ICECRYPT_REQUIRE_SERVERS=1,
    so a missing install can never turn into a green run."""
    import pytest

    if os.environ.get("ICECRYPT_REQUIRE_SERVERS") == "1":
        pytest.fail(f"required test server or device unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def require_module(name: str) -> None:
    """:func:`unavailable` unless the module ``name`` can be imported."""
    import importlib.util

    if importlib.util.find_spec(name.split(".")[0]) is None or importlib.util.find_spec(name) is None:
        unavailable(f"{name} is not installed")


class ServerStartError(RuntimeError):
    """A local server did not start (or did not open its port) in time."""


def free_port(host: str = HOST) -> int:
    """Return a TCP port on ``host`` that is free right now.

    The port is found by binding port 0 and closing the socket again, so another process
    could take it before the caller binds it; the window is tiny and tests tolerate it.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port_pair(host: str = HOST, attempts: int = 50) -> int:
    """Return a port ``p`` such that both ``p`` and ``p + 1`` are free on ``host``.

    For servers that open a second listener on the next port (the OpenBao dev server).
    """
    for _ in range(attempts):
        port = free_port(host)
        if port < 65535 and _port_free(host, port + 1):
            return port
    raise ServerStartError(f"no pair of adjacent free ports on {host} after {attempts} attempts")


def port_is_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port`` right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(
    host: str,
    port: int,
    timeout: float = 10.0,
    proc: subprocess.Popen | None = None,
) -> None:
    """Wait until ``host:port`` accepts TCP connections, at most ``timeout`` seconds.

    If ``proc`` is given and exits first, fail at once instead of waiting out the timeout.
    Raises :class:`ServerStartError` on failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        if port_is_open(host, port, timeout=0.2):
            return
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"process {proc.pid} ({_name(proc)}) exited with {proc.returncode} before {host}:{port} opened")
        if time.monotonic() >= deadline:
            raise ServerStartError(f"{host}:{port} did not open within {timeout:g} s")
        time.sleep(0.05)


def _name(proc: subprocess.Popen) -> str:
    args = proc.args
    if isinstance(args, (list, tuple)) and args:
        return os.path.basename(str(args[0]))
    return str(args)


_reaper: tuple[int, int, subprocess.Popen] | None = None  # (owner pid, pipe write end, reaper)


def _announce(line: str, *, start: bool = True) -> None:
    """Send one line to this process's reaper, starting it on first use (with ``start``)."""
    global _reaper
    if _reaper is None or _reaper[0] != os.getpid():  # none yet, or a forked child's copy
        if not start:
            return
        read_end, write_end = os.pipe()  # not inherited by other children: only the reaper holds it
        try:
            proc = subprocess.Popen(
                [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py"), str(read_end)],
                pass_fds=(read_end,), stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        finally:
            os.close(read_end)
        _reaper = (os.getpid(), write_end, proc)
    os.write(_reaper[1], (line + "\n").encode())


def watch(pgid: int, *, remove: str | os.PathLike[str] | None = None) -> None:
    """Have the reaper stop process group ``pgid`` (and remove the directory ``remove``) if
    this process ends before :func:`unwatch` is called for it."""
    _announce(f"+{pgid}")
    if remove is not None:
        _announce(f"+rm {os.fspath(remove)}")


def unwatch(pgid: int, *, remove: str | os.PathLike[str] | None = None) -> None:
    """``pgid`` was stopped (and ``remove`` removed) by its owner: the reaper forgets them."""
    _announce(f"-{pgid}", start=False)
    if remove is not None:
        _announce(f"-rm {os.fspath(remove)}", start=False)


def start_process(
    args: Sequence[str | os.PathLike[str]],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    **popen_kwargs,
) -> subprocess.Popen:
    """Start ``args`` in a new session (its own process group) and return the process.

    Standard input is closed; stdout and stderr go to ``log_path`` (appended) or are
    discarded.  ``env`` is merged over the current environment.  Extra keyword arguments
    go to :class:`subprocess.Popen`.  Stop it with :func:`stop_process`; the reaper stops
    it if this process ends first.
    """
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with contextlib.ExitStack() as stack:
        if log_path is not None:
            out = stack.enter_context(open(log_path, "ab"))  # the child keeps its own copy
        else:
            out = subprocess.DEVNULL
        proc = subprocess.Popen(
            [os.fspath(a) for a in args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            **popen_kwargs,
        )
    watch(proc.pid)
    return proc


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """Stop a process started by :func:`start_process`, and everything in its group.

    Sends SIGTERM to the process group, waits up to ``timeout`` seconds for the process to
    exit, then SIGKILLs the group.  Leftover members of the group (children that ignored
    SIGTERM) are killed too.  Idempotent.
    """
    pgid = proc.pid  # start_new_session=True: the process leads its own group
    if proc.poll() is None:
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    # The leader is gone; make sure no child of it survives in the group.
    if _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
    if not _group_alive(pgid):  # else the reaper still has it
        unwatch(pgid)


@contextlib.contextmanager
def running_process(
    args: Sequence[str | os.PathLike[str]],
    *,
    port: int | None = None,
    host: str = HOST,
    start_timeout: float = 15.0,
    stop_timeout: float = 5.0,
    **kwargs,
) -> Iterator[subprocess.Popen]:
    """Context manager: start ``args``, optionally wait for ``host:port``, stop on exit."""
    proc = start_process(args, **kwargs)
    try:
        if port is not None:
            wait_for_port(host, port, timeout=start_timeout, proc=proc)
        yield proc
    finally:
        stop_process(proc, timeout=stop_timeout)


def venv_bin(name: str) -> Path:
    """Path of the console script ``name`` installed beside the running interpreter."""
    return Path(sys.executable).parent / name


@contextlib.contextmanager
def silent_listener(host: str = HOST) -> Iterator[int]:
    """A port that accepts TCP connections but never answers: a hung server.

    The kernel completes the handshake (listen backlog) and nothing ever reads or replies,
    so a client times out reading.  Yields the port; closes the socket on exit.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def closed_port(host: str = HOST) -> int:
    """A port on ``host`` where nothing listens (connections are refused)."""
    return free_port(host)
