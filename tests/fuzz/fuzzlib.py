"""What every fuzz harness shares: the oracle runner, input slicing, seeds and mutations.

A harness module (``fuzz_<name>.py`` beside this file) defines

* ``ALLOWED``: the exception types its decoder documents (anything else is a finding);
* ``seeds()``: the seed inputs (read in place from ``../shared`` through
  ``vectorlib.VECTORS_DIR`` / ``TABLES_DIR``, plus inputs derived at start-up);
* ``check(data)``: feeds one input to the real decoder and raises :class:`Finding` on
  output the oracle refuses (unauthenticated, inconsistent).

:func:`one_input` runs ``check`` under the oracle: a documented exception is a pass, any
other exception or a :class:`Finding` is re-raised as a finding, and with a time bound a
slow input raises :class:`Hang` from a timer signal (a Python-level loop is interrupted;
libFuzzer's ``-timeout`` backs this up for a hang inside native code).

The same functions serve ``run.py`` (atheris, coverage-guided) and the pytest suite
(``test_harnesses.py``, ``test_regressions.py``: seeds, deterministic mutations, saved
crashes), so the oracles ``make test`` exercises are the ones the fuzzer uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import random
import signal
import struct
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for _p in (str(TESTS), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

#: every harness, by name (module ``fuzz_<name>``)
HARNESSES = (
    "ags1",
    "key_metadata",
    "encryption_keys",
    "table_metadata",
    "kms_wrapped",
    "avro",
    "manifests",
    "puffin",
    "key_manifest",
    "plain_avro",
    "parquet_modules",
)

#: saved crashing inputs: regressions/<harness>/<name>, replayed by test_regressions.py
REGRESSIONS = HERE / "regressions"


class Finding(AssertionError):
    """The oracle refused what the decoder did with an input."""


class Hang(BaseException):
    """An input took longer than the harness's time bound (BaseException: a decoder's
    ``except Exception`` must not swallow it)."""


def load(name: str) -> Any:
    """The harness module ``fuzz_<name>``."""
    return importlib.import_module(f"fuzz_{name}")


@contextlib.contextmanager
def time_bound(seconds: float | None) -> Iterator[None]:
    """Raise :class:`Hang` in this (main) thread after ``seconds`` (None: no bound)."""
    if not seconds:
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"input ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_input(
    check: Callable[[bytes], Any],
    allowed: tuple[type[BaseException], ...],
    data: bytes,
    *,
    timeout: float | None = None,
) -> str:
    """Run ``check(data)`` under the oracle; returns ``"ok"`` or the documented
    exception's class name.  Raises :class:`Finding` (or :class:`Hang`) otherwise."""
    try:
        with time_bound(timeout):
            check(data)
    except Finding:
        raise
    except Hang:
        raise
    except allowed as exc:
        return type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - the point of the oracle
        raise Finding(f"undocumented exception {type(exc).__module__}.{type(exc).__name__}: {exc}") from exc
    return "ok"


def run_harness(module: Any, data: bytes, *, timeout: float | None = None) -> str:
    """One input through a harness module's ``check`` under its oracle."""
    return one_input(module.check, module.ALLOWED, data, timeout=timeout)


# --- input slicing ---------------------------------------------------------------------


class Input:
    """Consumes a fuzz input from the front: small control values, then the payload.

    Missing bytes read as zero, so every input (even empty) is a valid program."""

    def __init__(self, data: bytes):
        self.data = bytes(data)
        self.pos = 0

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk.ljust(n, b"\0")

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def i64(self) -> int:
        return struct.unpack("<q", self.take(8))[0]

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


# --- derived files ---------------------------------------------------------------------


def fixed_bytes(label: str, n: int) -> bytes:
    """Deterministic test material (keys, AAD prefixes) derived from a label; never a
    real key, and never printed."""
    out = b""
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"icecrypt-fuzz/{label}/{counter}".encode()).digest()
        counter += 1
    return out[:n]


_WORKDIR: Path | None = None
_TMP: Any = None


def workdir() -> Path:
    """A private temporary directory for this process (files the harnesses write per
    input; removed at exit)."""
    global _WORKDIR, _TMP
    if _WORKDIR is None:
        # libFuzzer ends the process with _exit (no finalizers): scripts/fuzz.sh passes a
        # directory of its own in ICECRYPT_FUZZ_WORKDIR and removes it afterwards
        base = os.environ.get("ICECRYPT_FUZZ_WORKDIR") or None
        if base is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            base = "/dev/shm"
        _TMP = tempfile.TemporaryDirectory(prefix="icecrypt-fuzz-", dir=base)  # lives as long as the process
        _WORKDIR = Path(_TMP.name)
    return _WORKDIR


def write_file(name: str, data: bytes, mode: int = 0o600) -> str:
    path = workdir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return str(path)


# --- deterministic mutations (the pytest stand-in for libFuzzer's mutator) --------------


_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFE]
_INTERESTING_INTS = [0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, -0x80000000, 1 << 20, (1 << 63) - 1]


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """One random structural mutation of ``data`` (flip, set, insert, delete, splice,
    truncate, an interesting integer)."""
    buf = bytearray(data)
    op = rng.randrange(9)
    if not buf and op < 7:
        op = 7
    if op == 0:
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    elif op == 1:
        i = rng.randrange(len(buf))
        buf[i] = rng.choice(_INTERESTING) if rng.random() < 0.5 else rng.randrange(256)
    elif op == 2:
        i = rng.randrange(len(buf))
        del buf[i : i + rng.randint(1, 16)]
    elif op == 3:
        cut = rng.randrange(len(buf))
        del buf[cut:]
    elif op == 4:
        i = rng.randrange(len(buf))
        j = rng.randrange(len(buf))
        n = rng.randint(1, 32)
        buf[j:j] = buf[i : i + n]
    elif op == 5:
        i = rng.randrange(len(buf))
        value = rng.choice(_INTERESTING_INTS)
        size = rng.choice((1, 2, 4, 8))
        raw = (value & ((1 << (8 * size)) - 1)).to_bytes(size, rng.choice(("little", "big")))
        buf[i : i + size] = raw
    elif op == 6:
        # a byte of printable text where JSON or Avro text lives
        i = rng.randrange(len(buf))
        buf[i : i + 1] = rng.choice([b'"', b"{", b"}", b"[", b"]", b",", b":", b"-", b"9", b"null", b"\\", b"\xff"])
    elif op == 7:
        i = rng.randrange(len(buf) + 1)
        buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:
        other = rng.choice(pool) if pool else b""
        if other:
            i = rng.randrange(len(buf) + 1)
            j = rng.randrange(len(other))
            buf[i:] = other[j:]
    return bytes(buf)


def mutations(seeds: Iterable[bytes], count: int, seed: int, max_len: int = 1 << 16) -> Iterator[bytes]:
    """``count`` deterministic mutants (1-4 stacked mutations each) of the seeds no longer
    than ``max_len`` (large seeds are mutated by the fuzzer, not here)."""
    pool = [s for s in seeds if len(s) <= max_len]
    if not pool:
        return
    rng = random.Random(seed)
    for _ in range(count):
        data = rng.choice(pool)
        for _ in range(rng.randint(1, 4)):
            data = mutate(data, rng, pool)
        yield data


# --- keys the harnesses share --------------------------------------------------------------


def memory_kms() -> Any:
    """Iceberg's test KMS (keyA, keyB: what Java wrote ../shared with) plus a fuzz key."""
    from icecrypt.kms.memory import MemoryKms

    kms = MemoryKms.with_iceberg_test_keys()
    kms.add_key("fuzz-master", fixed_bytes("memory-master", 32))
    return kms


def local_keystore_document() -> dict:
    import base64

    return {
        "format": "icecrypt-local-keystore",
        "version": 1,
        "keys": {
            name: {"material": base64.b64encode(fixed_bytes(f"local-{name}", n)).decode(), "created-ms": 1795316508059}
            for name, n in (("master", 32), ("other", 16))
        },
    }


def local_kms() -> Any:
    """A LocalKms over a keystore with fixed material (in the private work directory)."""
    import json

    from icecrypt.kms.local import LocalKms

    path = write_file("keystore.json", json.dumps(local_keystore_document()).encode())
    return LocalKms(path)


def json_or_none(data: bytes) -> Any:
    """The JSON value of ``data``, or None when it is not JSON (the parser is Python's,
    not icecrypt's: such inputs are skipped)."""
    import json

    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def java_tables() -> list[Any]:
    """The Java tables of ../shared/tables, loaded in place (latest metadata)."""
    from vectorlib import TABLES_DIR

    from icecrypt.table import EncryptedTable

    tables = []
    for directory in sorted(p for p in TABLES_DIR.iterdir() if p.is_dir()):
        latest = sorted((directory / "metadata").glob("*.metadata.json"))[-1]
        tables.append(
            EncryptedTable.load(
                str(latest),
                kms=memory_kms(),
                location_map={f"s3://icecrypt-golden/{directory.name}": str(directory)},
            )
        )
    return tables


_PLAIN: dict | None = None


def table_plaintexts() -> dict[str, list]:
    """Decrypted files of the Java tables: ``manifest_lists``, ``manifests`` (plaintext
    Avro), ``avro_data`` (plaintext Avro data files), ``puffin`` ((plaintext, offset,
    size, record_count) per deletion vector), and ``tables`` (the loaded tables)."""
    global _PLAIN
    if _PLAIN is not None:
        return _PLAIN
    from icecrypt import ags1
    from icecrypt.table.files.manifest import read_manifest

    out: dict[str, list] = {"manifest_lists": [], "manifests": [], "avro_data": [], "puffin": [], "tables": []}
    seen: set[str] = set()

    def decrypt(location: str, table: Any, km: Any) -> bytes:
        with open(table.fs_path(location), "rb") as f:
            data = f.read()
        return ags1.decrypt(data, km.encryption_key, km.aad_prefix, length=km.file_length)

    for table in java_tables():
        out["tables"].append(table)
        for snapshot in table.snapshots():
            if snapshot.manifest_list in seen:
                continue
            seen.add(snapshot.manifest_list)
            out["manifest_lists"].append(decrypt(snapshot.manifest_list, table, table.manifest_list_key_metadata(snapshot)))
            for manifest in table.manifests(snapshot):
                if manifest.path in seen:
                    continue
                seen.add(manifest.path)
                out["manifests"].append(decrypt(manifest.path, table, manifest.key_metadata))
                for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=True):
                    f = entry.file
                    if f.file_path in seen:
                        continue
                    seen.add(f.file_path)
                    if f.file_format == "AVRO":
                        out["avro_data"].append(decrypt(f.file_path, table, f.key_metadata))
                    elif f.is_dv:
                        plain = decrypt(f.file_path, table, f.key_metadata)
                        out["puffin"].append((plain, f.content_offset, f.content_size_in_bytes, f.record_count))
    _PLAIN = out
    return out
