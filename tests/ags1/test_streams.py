"""Round trips, stream semantics, concurrency, buffers and failure behaviour of AGS1."""

from __future__ import annotations

import gc
import io
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

import icecrypt
from icecrypt import _gcm, ags1

BS = ags1.PLAIN_BLOCK_SIZE
KEY = bytes(range(16))
AAD = bytes(range(16, 32))
DATA = os.urandom(5 * BS + 777)


def sizes():
    """0..5 MiB, weighted towards block edges."""
    edges = st.sampled_from([0, 1, 27, 28, BS - 1, BS, BS + 1, 2 * BS - 1, 2 * BS, 2 * BS + 1, 5 * BS])
    near = st.builds(lambda k, d: max(0, k * BS + d), st.integers(0, 5), st.integers(-64, 64))
    return st.one_of(edges, near, st.integers(0, 5 * BS))


@given(size=sizes(), data=st.data())
def test_round_trip_with_random_write_chunks(size, data):
    plain = DATA[:size]
    sink = io.BytesIO()
    with ags1.open_writer(sink, KEY, AAD) as w:
        pos = 0
        while pos < size:
            step = data.draw(st.one_of(st.integers(1, 4096), st.integers(1, 3 * BS)), label="chunk")
            assert w.write(memoryview(plain)[pos : pos + step]) == min(step, size - pos)
            pos += step
            assert w.tell() == min(pos, size)
    blob = sink.getvalue()
    assert len(blob) == ags1.ciphertext_length(size) == w.ciphertext_length
    assert ags1.plaintext_length(len(blob)) == size
    assert ags1.decrypt(blob, KEY, AAD, length=len(blob)) == plain


@given(size=sizes(), data=st.data())
def test_random_seek_and_read_sequences(size, data):
    plain = DATA[:size]
    blob = ags1.encrypt(plain, KEY, AAD)
    ref = io.BytesIO(plain)
    with ags1.open_reader(blob, KEY, AAD, length=len(blob)) as r:
        assert r.size == size
        for _ in range(data.draw(st.integers(1, 8), label="ops")):
            op = data.draw(st.sampled_from(["seek", "read", "readinto", "read_at"]), label="op")
            if op == "seek":
                whence = data.draw(st.sampled_from([0, 1, 2]), label="whence")
                base = {0: 0, 1: ref.tell(), 2: size}[whence]
                offset = data.draw(st.integers(-base, size + 10 - base), label="offset")
                assert r.seek(offset, whence) == ref.seek(offset, whence)
            elif op == "read":
                n = data.draw(st.one_of(st.integers(-1, 64), st.integers(0, 3 * BS)), label="n")
                assert r.read(n) == ref.read(n)
            elif op == "readinto":
                buf = bytearray(data.draw(st.integers(0, 2 * BS + 10), label="n"))
                ref_buf = bytearray(len(buf))
                assert r.readinto(buf) == ref.readinto(ref_buf)
                assert buf == ref_buf
            else:
                off = data.draw(st.integers(0, size + 5), label="off")
                n = data.draw(st.integers(0, 2 * BS + 3), label="n")
                assert r.read_at(off, n) == plain[off : off + n]
            assert r.tell() == ref.tell()


def test_empty_stream_is_36_bytes_and_authenticated():
    blob = ags1.encrypt(b"", KEY, AAD)
    assert len(blob) == 36 and blob[:8] == ags1.HEADER
    assert ags1.decrypt(blob, KEY, AAD) == b""
    with ags1.open_reader(blob, KEY, AAD) as r:
        assert r.read() == b""
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    with ags1.open_reader(tampered, KEY, AAD) as r:
        with pytest.raises(icecrypt.AuthenticationError):
            r.read()  # as in Java, the first read authenticates block 0


def test_exact_block_multiple_has_no_trailing_block():
    assert len(ags1.encrypt(DATA[: 2 * BS], KEY)) == 8 + 2 * ags1.CIPHER_BLOCK_SIZE


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_thread_count_does_not_change_plaintext(threads):
    blob = ags1.encrypt(DATA, KEY, AAD, threads=threads)
    assert ags1.decrypt(blob, KEY, AAD, threads=threads) == DATA
    with ags1.open_reader(blob, KEY, AAD, threads=threads) as r:
        out = bytearray(len(DATA))
        assert r.readinto(out) == len(DATA) and out == DATA


def test_concurrent_read_at_from_8_threads(tmp_path):
    path = tmp_path / "big.ags1"
    path.write_bytes(ags1.encrypt(DATA, KEY, AAD))
    rng = __import__("random").Random(7)
    jobs = [(rng.randrange(len(DATA)), rng.choice([1, 100, 65536, BS, 2 * BS + 3])) for _ in range(400)]
    with ags1.open_reader(path, KEY, AAD) as r:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda j: r.read_at(*j), jobs))
            intos = list(pool.map(lambda j: _readinto_at(r, *j), jobs))
    for (off, n), got, got2 in zip(jobs, results, intos):
        assert got == DATA[off : off + n] == got2


def _readinto_at(r, off, n):
    buf = bytearray(n)
    return bytes(buf[: r.readinto_at(buf, off)])


def test_concurrent_readers_see_tampering(tmp_path):
    blob = bytearray(ags1.encrypt(DATA, KEY, AAD))
    blob[8 + 3 * ags1.CIPHER_BLOCK_SIZE + 100] ^= 1  # block 3
    with ags1.open_reader(bytes(blob), KEY, AAD) as r:
        def read(off):
            try:
                return r.read_at(off, BS)
            except icecrypt.AuthenticationError as exc:
                return exc
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read, [i * BS // 2 for i in range(11)]))
    for i, res in enumerate(results):
        touches_block3 = (i * BS // 2) // BS <= 3 <= (i * BS // 2 + BS - 1) // BS
        assert isinstance(res, icecrypt.AuthenticationError) == touches_block3, i


def test_buffers_of_every_kind():
    np = pytest.importorskip("numpy")
    pa = pytest.importorskip("pyarrow")
    plain = DATA[: BS + 5]
    expected = ags1.decrypt(ags1.encrypt(plain, KEY, AAD), KEY, AAD)
    for source in (plain, bytearray(plain), memoryview(plain), np.frombuffer(plain, np.uint8),
                   np.frombuffer(plain[: BS + 4], np.uint32),
                   pa.py_buffer(plain)):
        blob = ags1.encrypt(source, KEY, AAD)
        n = memoryview(source).nbytes
        assert ags1.decrypt(blob, KEY, AAD) == expected[:n]
        for holder in (blob, bytearray(blob), pa.py_buffer(blob), np.frombuffer(blob, np.uint8)):
            assert ags1.decrypt(holder, KEY, AAD) == expected[:n]
    with ags1.open_reader(blob, KEY, AAD) as r:
        target = np.zeros(len(plain), np.uint8)
        assert r.readinto(target) == len(plain)
        assert target.tobytes() == plain
    with pytest.raises((TypeError, BufferError, ValueError)):
        ags1.encrypt(np.frombuffer(plain, np.uint8)[::2], KEY)  # not contiguous


def test_keys_and_types():
    for bad in (b"", bytes(15), bytes(33)):
        with pytest.raises(ValueError, match=f"Invalid key length: {len(bad)}"):
            ags1.encrypt(b"x", bad)
    with pytest.raises(TypeError):
        ags1.encrypt(b"x", "0123456789abcdef")
    with pytest.raises(TypeError):
        ags1.encrypt("text", KEY)
    for n in (16, 24, 32):
        assert ags1.decrypt(ags1.encrypt(b"abc", bytes(n)), bytes(n)) == b"abc"
    k = _gcm.GcmKey(b"S3CRET-KEY-BYTES")
    assert "S3CRET" not in repr(k) and "S3CRET" not in str(k)
    with pytest.raises(TypeError):
        __import__("pickle").dumps(k)


def test_key_usage_limit():
    """NIST SP 800-38D 8.3: at most 2**32 GCM invocations with one random-nonce key."""
    key = _gcm.GcmKey(KEY)
    key._set_invocations(_gcm.MAX_INVOCATIONS - 2)
    out = bytearray(_gcm.sealed_length(3 * BS))
    with pytest.raises(icecrypt.KeyUsageLimitError):
        key.seal_blocks(DATA[: 3 * BS], out, 0)
    assert key.invocations == _gcm.MAX_INVOCATIONS - 2  # nothing reserved by the refusal
    key.seal_blocks(DATA[: 2 * BS], out, 0)
    assert key.invocations == _gcm.MAX_INVOCATIONS
    with pytest.raises(icecrypt.KeyUsageLimitError):
        key.seal(b"one more")
    with pytest.raises(icecrypt.KeyUsageLimitError):
        ags1.Ags1Writer(io.BytesIO(), key).close()
    # Decryption is not limited.
    assert key.open(_gcm.GcmKey(KEY).seal(b"abc")) == b"abc"


def test_single_shot_gcm_layout():
    key = _gcm.GcmKey(KEY)
    sealed = key.seal(b"hello", b"aad", _nonce=bytes(12))
    assert len(sealed) == 5 + 28 and sealed[:12] == bytes(12)
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    assert AESGCM(KEY).decrypt(bytes(12), sealed[12:], b"aad") == b"hello"
    assert key.open(sealed, b"aad") == b"hello"
    with pytest.raises(icecrypt.AuthenticationError):
        key.open(sealed, b"other")
    with pytest.raises(icecrypt.FormatError, match="length 27"):
        key.open(bytes(27))


def test_writer_to_path_is_atomic(tmp_path):
    target = tmp_path / "out.ags1"
    w = ags1.open_writer(target, KEY, AAD)
    w.write(DATA[: BS + 10])
    assert not target.exists()  # nothing under the final name before close
    w.flush()
    assert not target.exists()
    w.close()
    assert target.read_bytes()[:8] == ags1.HEADER
    assert ags1.decrypt(target.read_bytes(), KEY, AAD) == DATA[: BS + 10]
    assert sorted(os.listdir(tmp_path)) == ["out.ags1"]


def test_writer_failure_leaves_nothing(tmp_path):
    target = tmp_path / "out.ags1"
    target.write_bytes(b"previous content")
    with pytest.raises(RuntimeError):
        with ags1.open_writer(target, KEY, AAD) as w:
            w.write(DATA[:100])
            raise RuntimeError("crash in the producer")
    assert target.read_bytes() == b"previous content"
    assert sorted(os.listdir(tmp_path)) == ["out.ags1"]


def test_unclosed_writer_is_discarded_not_completed(tmp_path):
    target = tmp_path / "out.ags1"
    w = ags1.open_writer(target, KEY, AAD)
    w.write(b"partial")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del w
        gc.collect()
    assert any(issubclass(c.category, ResourceWarning) for c in caught)
    assert os.listdir(tmp_path) == []


class FailingSink(io.RawIOBase):
    def __init__(self, fail_after):
        self.buf = bytearray()
        self.fail_after = fail_after

    def writable(self):
        return True

    def write(self, b):
        if len(self.buf) + len(b) > self.fail_after:
            raise OSError(28, "No space left on device")
        self.buf += b
        return len(b)


def test_sink_error_discards_stream():
    sink = FailingSink(3 * ags1.CIPHER_BLOCK_SIZE)
    w = ags1.open_writer(sink, KEY, AAD)
    with pytest.raises(OSError):
        w.write(DATA)
    with pytest.raises(ValueError, match="discarded"):
        w.write(b"more")
    w.close()  # does not complete the stream
    assert w.ciphertext_length is None
    with pytest.raises(icecrypt.DecryptionError):
        ags1.decrypt(bytes(sink.buf), KEY, AAD, length=ags1.ciphertext_length(len(DATA)))


def test_writer_semantics():
    sink = io.BytesIO()
    w = ags1.open_writer(sink, KEY, AAD)
    assert w.writable() and not w.seekable() and not w.readable()
    w.write(b"x" * 10)
    w.flush()
    assert len(sink.getvalue()) == 8  # header only: a partial block is never flushed
    w.write(b"y" * (BS - 10))
    assert len(sink.getvalue()) == 8 + ags1.CIPHER_BLOCK_SIZE  # sealed as soon as full
    w.close()
    assert len(sink.getvalue()) == 8 + ags1.CIPHER_BLOCK_SIZE  # no trailing empty block
    assert w.ciphertext_length == len(sink.getvalue())
    with pytest.raises(ValueError):
        w.write(b"after close")
    w.close()  # idempotent
    assert not sink.closed  # a file object sink is left open


def test_reader_semantics(tmp_path):
    blob = ags1.encrypt(DATA[:1000], KEY, AAD)
    path = tmp_path / "f.ags1"
    path.write_bytes(blob)
    with open(path, "rb") as f, ags1.open_reader(f, KEY, AAD) as r:
        assert r.readable() and r.seekable() and not r.writable()
        assert r.seek(0, io.SEEK_END) == 1000
        assert r.read(10) == b""
        assert r.seek(-10, io.SEEK_END) == 990 and r.read() == DATA[990:1000]
        with pytest.raises(ValueError):
            r.seek(-1)
        with pytest.raises(io.UnsupportedOperation):
            r.fileno()
        buffered = io.BufferedReader(r)
        buffered.seek(0)
        assert buffered.read() == DATA[:1000]
    assert r.closed and f.closed
    with pytest.raises(ValueError):
        r.read()
    with pytest.raises(icecrypt.FormatError, match="longer than"):
        ags1.open_reader(blob + b"junk", KEY, AAD, length=len(blob))
    with pytest.raises(icecrypt.FormatError, match="truncated"):
        ags1.open_reader(blob[:-1], KEY, AAD, length=len(blob))


class PlainStream:
    """A file object without fileno or readinto (like many remote-storage streams)."""

    def __init__(self, data):
        self._f = io.BytesIO(data)
        self.name = "remote://bucket/key"

    def read(self, n=-1):
        return self._f.read(n)

    def seek(self, pos, whence=0):
        return self._f.seek(pos, whence)

    def tell(self):
        return self._f.tell()


def test_generic_file_object_source():
    blob = ags1.encrypt(DATA[: 2 * BS + 1], KEY, AAD)
    with ags1.open_reader(PlainStream(blob), KEY, AAD) as r:
        assert r.read_at(BS - 5, 10) == DATA[BS - 5 : BS + 5]
        assert r.read() == DATA[: 2 * BS + 1]
    damaged = bytearray(blob)
    damaged[-3] ^= 4
    with ags1.open_reader(PlainStream(bytes(damaged)), KEY, AAD) as r:
        with pytest.raises(icecrypt.AuthenticationError, match="remote://bucket/key: .*block 2"):
            r.read()


def test_pyarrow_native_file_source(tmp_path):
    pa = pytest.importorskip("pyarrow")
    blob = ags1.encrypt(DATA[: BS + 3], KEY, AAD)
    path = tmp_path / "f.ags1"
    path.write_bytes(blob)
    with pa.OSFile(str(path)) as f, ags1.open_reader(f, KEY, AAD) as r:
        assert r.read() == DATA[: BS + 3]
    with pa.BufferReader(blob) as f, ags1.open_reader(f, KEY, AAD) as r:
        assert r.read_at(BS, 3) == DATA[BS : BS + 3]


def test_threads_setting():
    before = icecrypt.get_default_threads()
    try:
        icecrypt.set_default_threads(3)
        assert icecrypt.get_default_threads() == 3
        with pytest.raises(ValueError):
            icecrypt.set_default_threads(0)
    finally:
        icecrypt.set_default_threads(before)


def test_openssl_version_reports_the_linked_build():
    version = icecrypt.openssl_version()
    assert version.startswith("OpenSSL ")
    if _gcm.OPENSSL_LINKAGE == "static":
        assert version.startswith("OpenSSL 3.5.")


def test_encrypt_into_and_decrypt_into_reuse_buffers():
    out = bytearray(ags1.ciphertext_length(BS + 9) + 5)
    n = ags1.encrypt_into(DATA[: BS + 9], out, KEY, AAD)
    assert n == ags1.ciphertext_length(BS + 9)
    blob = bytes(out[:n])
    assert ags1.decrypt(blob, KEY, AAD) == DATA[: BS + 9]
    plain = bytearray(BS + 9)
    assert ags1.decrypt_into(blob, plain, KEY, AAD, length=n) == BS + 9 and plain == DATA[: BS + 9]
    with pytest.raises(ValueError, match="needed"):
        ags1.encrypt_into(DATA[:10], bytearray(10), KEY)
    with pytest.raises(ValueError, match="overlap"):
        buf = bytearray(ags1.ciphertext_length(100) + 100)
        ags1.encrypt_into(memoryview(buf)[:100], buf, KEY)
    damaged = bytearray(blob)
    damaged[-1] ^= 1
    plain[:] = b"\xee" * len(plain)
    with pytest.raises(icecrypt.AuthenticationError, match="block 1"):
        ags1.decrypt_into(damaged, plain, KEY, AAD)
    assert DATA[:64] not in plain  # block 0 verified, but the failed call released nothing


def test_no_nonce_is_reused_across_fork():
    """Nonces are drawn from the DRBG in batches per thread; a forked child must not
    hand out the nonces its parent had buffered but not yet used."""
    key = _gcm.GcmKey(KEY)
    key.seal(b"fill the buffer")  # the parent now holds buffered nonces
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.write(w, b"".join(key.seal(b"x")[:12] for _ in range(8)))
        finally:
            os._exit(0)
    os.close(w)
    child = b""
    while chunk := os.read(r, 4096):
        child += chunk
    os.close(r)
    os.waitpid(pid, 0)
    parent = b"".join(key.seal(b"x")[:12] for _ in range(8))
    assert len(child) == 96
    child_nonces = {child[i : i + 12] for i in range(0, 96, 12)}
    parent_nonces = {parent[i : i + 12] for i in range(0, 96, 12)}
    assert len(child_nonces) == 8 and not child_nonces & parent_nonces


@pytest.mark.timeout(60)
def test_parallel_runs_work_in_a_forked_child():
    """PySpark's Python workers are forked: the child must get working threads, not the
    parent's (absent) ones, and must not deadlock."""
    plain = DATA[: 4 * BS]
    ags1.encrypt(plain, KEY, AAD, threads=2)  # the parent's worker pool is running
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            blob = ags1.encrypt(plain, KEY, AAD, threads=2)
            ok = ags1.decrypt(blob, KEY, AAD, threads=2) == plain
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_failed_construction_leaves_nothing_behind(tmp_path):
    """A reader or writer whose constructor raised is collected quietly (the autouse
    fixture fails the test on any "Exception ignored") and leaves no file."""
    with pytest.raises(ValueError, match="Invalid key length"):
        ags1.open_writer(tmp_path / "out.ags1", b"short")
    with pytest.raises(ValueError, match="Invalid key length"):
        ags1.open_writer(io.BytesIO(), b"short")
    with pytest.raises(TypeError):
        ags1.open_writer(12345, KEY)
    with pytest.raises(FileNotFoundError):
        ags1.open_reader(tmp_path / "missing.ags1", KEY)
    with pytest.raises(ValueError, match="Invalid key length"):
        ags1.open_reader(ags1.encrypt(b"x", KEY), b"short")
    gc.collect()
    assert os.listdir(tmp_path) == []
