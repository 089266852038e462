"""Process exit after threaded reads through EncryptedFileSystem (apache/arrow#34314).

A process that read through a ``PyFileSystem`` with ``use_threads=True`` could abort at
exit with "terminate called without an active exception": an Arrow pool thread dropped
the last reference to one of the handler's Python objects while the interpreter was
finalizing, CPython ended that thread with ``pthread_exit``, and the forced unwind hit a
``noexcept`` destructor.  ``icecrypt.arrow`` waits for Arrow's threads at exit (see
``_ExitGuard``).  The test runs a child process that reads a multi-file dataset 50 times
in a row and requires every run to exit cleanly.

The children are forked from a server process that has imported pyarrow and
icecrypt.arrow and read nothing (fork copies only the calling thread; Arrow's thread pools
start in the child, at its read).  Each child loads the pickled filesystem, reads, and
leaves through the interpreter's own exit (``SystemExit`` unwinding to the top, then
finalization, as a script ends): the path the abort was on.  The imports, about two thirds
of a fresh interpreter's run, are paid once.  Forked children are as sensitive as fresh
ones: with the hook unregistered, 14 of 20 aborted either way on a 2-core machine
(``--spawn`` runs each child as a fresh interpreter).

Run as a script to count outcomes, with or without the exit hook::

    python tests/arrow/test_exit.py --runs 50            # with the hook
    python tests/arrow/test_exit.py --runs 50 --no-guard # the hook unregistered
"""

from __future__ import annotations

import argparse
import collections
import pickle
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

from icecrypt.arrow import EncryptedFileSystem, _ExitGuard, _quiesce_at_exit
from icecrypt.keys import EncryptionManager
from icecrypt.kms.memory import MemoryKms

RUNS = 50
ROWS = 400_000

# What a child does: unregister the exit hook when asked, load the pickled filesystem (as a
# Spark executor would), read the whole dataset with threads.  Its end is the exit.
IMPORTS = "import atexit, os, pickle, sys\nimport pyarrow.dataset as ds\nimport icecrypt.arrow\n"
READ = f"""
if guard == "no-guard":
    atexit.unregister(icecrypt.arrow._quiesce_at_exit)
with open(root + "/fs.pickle", "rb") as f:
    fs = pickle.load(f)
table = ds.dataset(root + "/ds", filesystem=fs, format="parquet", partitioning="hive").to_table(use_threads=True)
assert table.num_rows == {ROWS}, table.num_rows
"""
CHILD = IMPORTS + "root, guard = sys.argv[1], sys.argv[2]\n" + READ

def make_dataset(root: Path) -> None:
    """A hive-partitioned Parquet dataset of several files, and the pickled filesystem."""
    fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), EncryptionManager(MemoryKms.with_iceberg_test_keys(), "keyA"))
    table = pa.table({"k": [i % 7 for i in range(ROWS)], "i": range(ROWS), "s": [f"v{i}" for i in range(ROWS)]})
    ds.write_dataset(table, str(root / "ds"), filesystem=fs, format="parquet", partitioning=["k"],
                     partitioning_flavor="hive", max_rows_per_group=20_000)
    (root / "fs.pickle").write_bytes(pickle.dumps(fs))


# The forking server: imports what the child imports, then forks a child per line read.  The
# child runs the read as the spawned child does and raises SystemExit, which unwinds to the
# top level: the interpreter then finalizes and exits as a script does at its end.
SERVER = IMPORTS + """
root = sys.argv[1]
print("ready", flush=True)
for line in sys.stdin:
    guard, err = line.split()
    pid = os.fork()
    if pid == 0:
        fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
""" + textwrap.indent(READ, " " * 8) + """
        del table, fs
        raise SystemExit(0)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""

def _outcome(returncode: int, stderr: str) -> str:
    if returncode == 0 and not stderr.strip():
        return "ok"
    if "terminate called" in stderr:
        return "abort"
    return f"rc={returncode}: {stderr.strip()[-300:]}"


def run_children(root: Path, runs: int, guard: bool = True, timeout: float = 60.0, *,
                 spawn: bool = False) -> collections.Counter:
    """Run the child ``runs`` times in a row; count outcomes ("ok", "abort", "rc=N").
    ``spawn``: each child a fresh interpreter (else forked from the server above)."""
    mode = "guard" if guard else "no-guard"
    outcomes: collections.Counter = collections.Counter()
    if spawn:
        for _ in range(runs):
            proc = subprocess.run([sys.executable, "-c", CHILD, str(root), mode],
                                  check=False, capture_output=True, text=True, timeout=timeout)
            outcomes[_outcome(proc.returncode, proc.stderr)] += 1
        return outcomes
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready", server.stderr.read()
        err = root / "child.err"
        for _ in range(runs):
            server.stdin.write(f"{mode} {err}\n")
            server.stdin.flush()
            line = server.stdout.readline()
            assert line, f"the forking server ended: {server.stderr.read()[-2000:]}"
            outcomes[_outcome(int(line), err.read_text(errors="replace"))] += 1
    finally:
        server.stdin.close()
        server.wait(timeout=timeout)
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_threaded_reads_then_exit_never_abort(tmp_path):
    make_dataset(tmp_path)
    outcomes = run_children(tmp_path, RUNS)
    assert outcomes == {"ok": RUNS}, dict(outcomes)


def test_exit_hook_waits_for_calls_in_flight_and_releases():
    guard = _ExitGuard()
    done = []

    class Held:
        pass

    held = guard.track(Held())

    def arrow_thread():
        with guard.call():
            time.sleep(0.3)  # longer than the quiet period: only the call keeps the hook waiting
            done.append("call")
        time.sleep(0.1)
        done.append("release")
        del held_refs[:]

    held_refs = [held]
    del held
    worker = threading.Thread(target=arrow_thread)
    worker.start()
    time.sleep(0.05)  # the call is in flight
    _quiesce_at_exit(timeout=30, quiet=1.0, guard=guard)
    assert done == ["call", "release"] and not guard.objects and not guard.calls
    worker.join()
    # objects that stay held (by Python code) do not keep it waiting past the quiet period
    kept = guard.track(Held())
    _quiesce_at_exit(timeout=30, quiet=0.05, guard=guard)
    assert guard.objects and kept is not None


def test_a_stall_does_not_count_as_quiet(monkeypatch):
    """Time in which the process did not run (a loaded machine, a paused virtual CPU) is not
    quiet time: Arrow's threads may not have run either.  A fake clock: the hook's first
    sleep stalls for 0.5 s (longer than the quiet period); the object is dropped, as by an
    Arrow thread that ran late, during its third sleep, and the hook must still be waiting."""
    import icecrypt.arrow as module

    guard = _ExitGuard()

    class Held:
        pass

    held = [guard.track(Held())]
    clock = {"now": guard.last_change + 0.001, "sleeps": 0}

    class FakeTime:
        @staticmethod
        def monotonic():
            return clock["now"]

        @staticmethod
        def sleep(seconds):
            clock["sleeps"] += 1
            clock["now"] += 0.5 if clock["sleeps"] == 1 else seconds
            if clock["sleeps"] == 3:
                held.clear()  # the late Arrow thread drops what it held

    monkeypatch.setattr(module, "time", FakeTime)
    _quiesce_at_exit(timeout=30, quiet=0.1, guard=guard)
    assert not guard.objects, "the hook returned while an Arrow thread still held an object"
    assert clock["sleeps"] == 3


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="count clean exits and aborts of the child")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--no-guard", action="store_true", help="unregister icecrypt.arrow's exit hook")
    parser.add_argument("--spawn", action="store_true", help="each child a fresh interpreter (not forked)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make_dataset(Path(tmp))
        start = time.monotonic()
        counts = run_children(Path(tmp), args.runs, guard=not args.no_guard, spawn=args.spawn)
        print(dict(counts), f"{time.monotonic() - start:.1f} s")
