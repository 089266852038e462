"""The reaper: stops the test servers of a process that ended without stopping them.

A fixture stops its server by PID when the session ends (:func:`servers.stop_process`),
but a pytest process ended by a signal (SIGTERM from a CI runner, a timeout, SIGKILL, an
xdist worker killed by its controller) never gets there, and its servers ran on.  So every
server started by :func:`servers.start_process` is also announced to this process, one per
pytest process, started on first use in a session of its own::

    python reaper.py FD

It reads lines from the pipe ``FD``: ``+PGID`` (a process group to stop if the owner
dies), ``-PGID`` (stopped by the owner, forget it), ``+rm PATH`` / ``-rm PATH`` (a
directory to remove after the groups are gone).  The owner holds the only write end, so
the pipe reaches end-of-file exactly when the owner is gone, however it ended; the reaper
then sends SIGTERM to every group still announced, SIGKILL to the ones alive after a grace
period, removes the directories, and exits.  After an ordinary run nothing is announced
any more and it just exits.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

GRACE_SECONDS = 5.0


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to group ``pgid``, if it is there."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap(groups: set[int], paths: list[str], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM to ``groups``, SIGKILL to those alive after ``grace`` s; then remove ``paths``."""
    for pgid in groups:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pgid in groups:
        if group_alive(pgid):
            signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def main(fd: int) -> None:
    # The owner's terminal may send its group SIGINT/SIGHUP: the reaper lives in a session of
    # its own and must outlive the owner whatever it receives, so it ignores them.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    paths: list[str] = []
    with os.fdopen(fd, "r", encoding="utf-8") as pipe:
        for line in pipe:
            line = line.rstrip("\n")
            if line.startswith("+rm "):
                paths.append(line[4:])
            elif line.startswith("-rm "):
                if line[4:] in paths:
                    paths.remove(line[4:])
            elif line[:1] == "+":
                groups.add(int(line[1:]))
            elif line[:1] == "-":
                groups.discard(int(line[1:]))
    reap(groups, paths)


if __name__ == "__main__":
    main(int(sys.argv[1]))
