"""Faults in ``Ags1Writer``: to a stream of the failing pyarrow filesystem (every open,
write and close), and to a local path (a write cut short by RLIMIT_FSIZE at many sizes,
and each OS call of the atomic publish failing or killing the writer).  Each case runs in
a forked child, so the limits and the OS-call hooks never reach the test process.

After every fault: the target name holds nothing, or (only when the fault came after the
publish) the complete stream, which decrypts to the data; after a raised fault no
temporary file is left; after a kill at most a hidden temporary (``.<name>.*.tmp``).
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import tempfile

import pytest
from faultfs import FaultPlan, failing_filesystem

from icecrypt import ags1

KEY, AAD = bytes(range(16)), bytes(range(16, 32))
DATA = os.urandom(3 * (1 << 20) + 12345)  # 4 AGS1 blocks
FULL = ags1.ciphertext_length(len(DATA))


def _write_path(path: str) -> None:
    with ags1.open_writer(path, KEY, AAD) as w:
        for i in range(0, len(DATA), 300_000):
            w.write(DATA[i : i + 300_000])


def _in_child(fn) -> int:
    """Run ``fn`` in a forked child: 0 = returned, 1 = raised, -signal = killed."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _check(directory: str, name: str, result: int) -> str:
    entries = sorted(os.listdir(directory))
    others = [e for e in entries if e != name]
    if result >= 0:
        assert not others, f"left after a raised fault: {others}"
    else:
        assert all(e.startswith(f".{name}.") and e.endswith(".tmp") for e in others), others
    if name in entries:
        blob = open(os.path.join(directory, name), "rb").read()
        assert ags1.decrypt(blob, KEY, AAD, length=FULL) == DATA  # complete or absent
        return "published"
    return "absent"


def test_ags1_writer_path_short_writes(tmp_path):
    """The file size limit cuts a write at many offsets (EFBIG, as a full disk would)."""
    limits = sorted({0, 1, 27, 28, 100, FULL - 1} | {k * 262_144 + d for k in range(1, 13) for d in (0, 29)})
    limits = [n for n in limits if n < FULL]
    for limit in limits:
        d = tempfile.mkdtemp(dir=tmp_path)

        def run(limit=limit, d=d):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            _write_path(os.path.join(d, "part.avro"))

        result = _in_child(run)
        assert result == 1, f"limit {limit}: the writer did not fail ({result})"
        assert _check(d, "part.avro", result) == "absent"
    print(f"\nAgs1Writer to a path: {len(limits)} short-write points")


OS_CALLS = ["fsync", "close", "link", "replace", "unlink", "open"]


@pytest.mark.parametrize("mode", ["error", "enospc", "kill"])
def test_ags1_writer_path_os_calls(tmp_path, mode):
    """Each OS call of the writer's publish (fsync, close, rename/link, unlink, the
    directory open and fsync) fails or kills the writer, at its 1st..Nth occurrence."""
    census = []

    def hooked(plan_at):
        import os as _os

        counter = {"n": 0}

        def wrap(name, real):
            def call(*args, **kwargs):
                counter["n"] += 1
                census.append(name)
                if counter["n"] == plan_at:
                    if mode == "kill":
                        _os.kill(_os.getpid(), signal.SIGKILL)
                    raise OSError(errno.ENOSPC if mode == "enospc" else errno.EIO, f"injected at {name}")
                return real(*args, **kwargs)
            return call

        for name in ("fsync", "link", "replace", "unlink", "open", "close"):
            setattr(_os, name, wrap(name, getattr(_os, name)))

    # count the calls once (in a child, whose hooks never fail)
    d0 = tempfile.mkdtemp(dir=tmp_path)
    r, w = os.pipe()

    def count():
        hooked(None)
        _write_path(os.path.join(d0, "part.avro"))
        os.write(w, ",".join(census).encode())

    assert _in_child(count) == 0
    os.close(w)
    census_names = os.read(r, 1000).decode().split(",")
    total = len(census_names)
    os.close(r)
    assert total >= 3
    outcomes = {}
    for n in range(1, total + 1):
        d = tempfile.mkdtemp(dir=tmp_path)
        result = _in_child(lambda n=n, d=d: (hooked(n), _write_path(os.path.join(d, "part.avro"))))
        if mode == "kill":
            assert result == -signal.SIGKILL, (n, result)
        state = _check(d, "part.avro", result)
        assert not (result == 1 and state == "published"), \
            f"{census_names[n - 1]} (call {n}): the writer reported a failure, but the file was published"
        key = f"{state} ({census_names[n - 1]}, {'killed' if result < 0 else 'raised' if result else 'returned'})"
        outcomes[key] = outcomes.get(key, 0) + 1
    print(f"\nAgs1Writer to a path [{mode}]: {total} OS-call points; {outcomes}")


@pytest.mark.parametrize("kind", ["error", "enospc", "kill"])
def test_ags1_writer_to_failing_stream(tmp_path, kind):
    """A stream of the failing filesystem: the open, every write and the close fail."""
    fs, handler = failing_filesystem(tmp_path)
    with fs.open_output_stream("census.ags1") as out:
        with ags1.Ags1Writer(out, KEY, AAD) as w:
            w.write(DATA)
    total = handler.plan.count
    for n in range(1, total + 1):
        name = f"part-{n}.ags1"

        def run(n=n, name=name):
            handler.plan = FaultPlan(at=n, kind=kind)
            with fs.open_output_stream(name) as out:
                with ags1.Ags1Writer(out, KEY, AAD) as w:
                    w.write(DATA)

        result = _in_child(run)
        assert result == (-signal.SIGKILL if kind == "kill" else 1), (n, result)
        # a stream sink is the caller's to discard: what is there is never mistaken for
        # the whole stream (a reader with the trusted length refuses it)
        if (tmp_path / name).exists():
            blob = (tmp_path / name).read_bytes()
            assert len(blob) < FULL or n == total
            if len(blob) != FULL:
                with pytest.raises(ValueError):
                    ags1.decrypt(blob, KEY, AAD, length=FULL)
    print(f"\nAgs1Writer to a failing-filesystem stream [{kind}]: {total} points")
