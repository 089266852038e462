"""Adversarial tests of the C/Cython boundary (issue 11, section 2).

Overlapping buffers, buffers resized or released by another thread while the GIL is
released, integers at the 2^31 / 2^32 / 2^63 / 2^64 edges, a header claiming another
block size, and fork() while the worker pool is busy.  Every case must end in a clean
exception or a correct result: never a crash, a hang or wrong bytes.  scripts/sanitize.sh
runs this file under AddressSanitizer + UBSan and under ThreadSanitizer.
"""

from __future__ import annotations

import faulthandler
import gc
import hashlib
import mmap
import os
import random
import signal
import struct
import threading
import traceback

import pytest

import icecrypt
from icecrypt import _gcm, ags1
from icecrypt.errors import FormatError

BS = ags1.PLAIN_BLOCK_SIZE
CBS = ags1.CIPHER_BLOCK_SIZE
KEY = bytes(range(16))
AAD = bytes(range(16, 32))
DATA = os.urandom(3 * BS + 1000)
MAX_BLOCKS = _gcm.MAX_BLOCKS  # 2^31 - 1 blocks: indexes 0 .. 2^31-2, as Java writes them
MAX_PLAINTEXT = MAX_BLOCKS * BS
SANITIZED = os.environ.get("ICECRYPT_SANITIZED_BUILD")  # set by scripts/sanitize.sh


def test_the_module_under_test_is_the_one_meant():
    """scripts/sanitize.sh puts a sanitized build first on PYTHONPATH; make sure it, and
    not the tree's build, is what these tests exercise."""
    tree = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
    loaded = os.path.realpath(_gcm.__file__)
    if SANITIZED:
        assert not loaded.startswith(tree + os.sep), loaded
    print(f"icecrypt._gcm: {loaded} ({SANITIZED or 'normal build'})")


# --------------------------------------------------------------------------- overlap

def _regions(total: int, a_len: int, b_len: int):
    """(name, a_start, b_start) placements of two regions in a buffer of ``total`` bytes:
    disjoint neighbours, partial overlaps in both directions, one inside the other, and
    the same start."""
    return [
        ("a before b, touching", 0, a_len),
        ("b before a, touching", b_len, 0),
        ("a overlaps the start of b", 0, a_len - 1),
        ("b overlaps the start of a", b_len - 1, 0),
        ("same start", 0, 0),
        ("a inside b", 5, 0) if a_len + 5 <= b_len else ("b inside a", 0, 5),
        ("last byte of a is first of b", 0, a_len - 1),
        ("last byte of b is first of a", b_len - 1, 0),
    ]


def _disjoint(a0, a_len, b0, b_len):
    return a0 + a_len <= b0 or b0 + b_len <= a0


@pytest.mark.parametrize("size", [100, BS + 100])
def test_encrypt_into_refuses_overlap_and_accepts_neighbours(size):
    plain = DATA[:size]
    need = ags1.ciphertext_length(size)
    expected = ags1.decrypt(ags1.encrypt(plain, KEY, AAD), KEY, AAD)
    for name, p0, o0 in _regions(size + need + 8, size, need):
        buf = bytearray(size + need + 8)
        buf[p0 : p0 + size] = plain
        view = memoryview(buf)
        if _disjoint(p0, size, o0, need):
            n = ags1.encrypt_into(view[p0 : p0 + size], view[o0 : o0 + need], KEY, AAD, threads=2)
            assert ags1.decrypt(bytes(buf[o0 : o0 + n]), KEY, AAD) == expected, name
        else:
            before = bytes(buf)
            with pytest.raises(ValueError, match="overlap"):
                ags1.encrypt_into(view[p0 : p0 + size], view[o0 : o0 + need], KEY, AAD, threads=2)
            assert buf == before, f"{name}: a refused call wrote into the buffer"


@pytest.mark.parametrize("size", [100, BS + 100])
def test_decrypt_into_refuses_overlap_and_accepts_neighbours(size):
    plain = DATA[:size]
    blob = ags1.encrypt(plain, KEY, AAD)
    for name, c0, o0 in _regions(len(blob) + size + 8, len(blob), size):
        buf = bytearray(len(blob) + size + 8)
        buf[c0 : c0 + len(blob)] = blob
        view = memoryview(buf)
        ct, out = view[c0 : c0 + len(blob)], view[o0 : o0 + size]
        if _disjoint(c0, len(blob), o0, size):
            assert ags1.decrypt_into(ct, out, KEY, AAD, threads=2) == size
            assert bytes(out) == plain, name
        else:
            before = bytes(buf)
            with pytest.raises(ValueError, match="overlap"):
                ags1.decrypt_into(ct, out, KEY, AAD, threads=2)
            assert buf == before, name


def test_seal_and_open_blocks_refuse_overlap_of_every_input_with_out():
    key = _gcm.GcmKey(KEY)
    plain = DATA[: 2 * BS + 5]
    need = _gcm.sealed_length(len(plain))
    nonces = os.urandom(12 * _gcm.run_blocks(len(plain)))
    ref = bytearray(need)
    key.seal_blocks(plain, ref, 7, AAD, 2, _nonces=nonces)
    # plaintext / sealed input inside out, partially and exactly
    for shift in (0, 1, len(plain) - 1):  # input from out[shift:]: inside it, or over its end
        buf = bytearray(need + len(plain))
        buf[shift : shift + len(plain)] = plain
        with pytest.raises(ValueError, match="overlap"):
            key.seal_blocks(memoryview(buf)[shift : shift + len(plain)], memoryview(buf)[:need], 7, AAD, 2)
        buf[:] = bytes(len(buf))
        buf[shift : shift + need] = ref
        assert len(buf) == need + len(plain)
        with pytest.raises(ValueError, match="overlap"):
            key.open_blocks(memoryview(buf)[shift : shift + need], memoryview(buf)[: len(plain)], 7, AAD, 2)
        # and out over the start of the input
        buf[:] = bytes(len(buf))
        buf[len(plain) - shift - 1 :][:need] = ref
        with pytest.raises(ValueError, match="overlap"):
            key.open_blocks(memoryview(buf)[len(plain) - shift - 1 :][:need], memoryview(buf)[: len(plain)], 7, AAD, 2)
    # the AAD prefix or the nonces inside out: they are read for every block while out is
    # written, so they would change under the run (it sealed a stream that does not open
    # with the AAD prefix the caller passed, before the check existed)
    for where in (0, CBS, need - 16):
        out = bytearray(need)
        aad_view = memoryview(out)[where : where + 16]
        aad_view[:] = AAD
        with pytest.raises(ValueError, match="aad_prefix and out must not overlap"):
            key.seal_blocks(plain, out, 7, aad_view, 2, _nonces=nonces)
        with pytest.raises(ValueError, match="aad_prefix and out must not overlap"):
            key.open_blocks(bytes(ref), memoryview(out)[: len(plain)], 7, memoryview(out)[:16], 2)
        out = bytearray(need)
        nonce_view = memoryview(out)[where : where + len(nonces)] if where + len(nonces) <= need else None
        if nonce_view is not None:
            nonce_view[:] = nonces
            with pytest.raises(ValueError, match="nonces and out must not overlap"):
                key.seal_blocks(plain, out, 7, AAD, 2, _nonces=nonce_view)
    # neighbours in one buffer are fine, and give the reference bytes
    buf = bytearray(16 + len(nonces) + need)
    buf[:16], buf[16 : 16 + len(nonces)] = AAD, nonces
    mv = memoryview(buf)
    key.seal_blocks(plain, mv[16 + len(nonces) :], 7, mv[:16], 2, _nonces=mv[16 : 16 + len(nonces)])
    assert mv[16 + len(nonces) :] == ref
    out = bytearray(len(plain) + 16)
    out[len(plain) :] = AAD
    assert key.open_blocks(bytes(ref), memoryview(out)[: len(plain)], 7, memoryview(out)[len(plain) :], 2) == len(plain)
    assert out[: len(plain)] == plain


def test_aad_prefix_inside_the_output_of_the_whole_stream_calls():
    out = bytearray(ags1.ciphertext_length(len(DATA)))
    aad_in_out = memoryview(out)[8 + CBS : 8 + CBS + 16]
    aad_in_out[:] = AAD
    with pytest.raises(ValueError, match="aad_prefix and out must not overlap"):
        ags1.encrypt_into(DATA, out, KEY, aad_in_out, threads=2)
    blob = ags1.encrypt(DATA, KEY, AAD)
    plain = bytearray(len(DATA))
    memoryview(plain)[BS : BS + 16] = AAD
    with pytest.raises(ValueError, match="aad_prefix and out must not overlap"):
        ags1.decrypt_into(blob, plain, KEY, memoryview(plain)[BS : BS + 16], threads=2)


def test_single_gcm_calls_never_write_into_their_inputs():
    """GcmKey.seal/open allocate their output: an input that is a view of a larger buffer
    is left as it was."""
    key = _gcm.GcmKey(KEY)
    buf = bytearray(DATA[:4096])
    before = bytes(buf)
    sealed = key.seal(memoryview(buf)[10:3000], memoryview(buf)[:10])
    assert buf == before
    buf[3000 : 3000 + len(sealed)] = sealed[: len(buf) - 3000]
    whole = bytearray(sealed)
    assert key.open(memoryview(whole), memoryview(buf)[:10]) == before[10:3000]
    assert whole == sealed


def test_reading_a_memory_stream_into_its_own_ciphertext_never_releases_wrong_bytes():
    """Reader over a bytearray, read into that same bytearray: a clean error or the right
    bytes (whatever the caller's ciphertext looks like afterwards)."""
    blob = bytearray(ags1.encrypt(DATA[: 2 * BS], KEY, AAD))
    with ags1.open_reader(blob, KEY, AAD) as r:
        try:
            n = r.readinto_at(memoryview(blob)[:BS], 0)
        except (ValueError, BufferError):
            return
        assert n == BS
        assert blob[:BS] == DATA[:BS]


# --------------------------------------------------------------------------- buffers changing under a call

def _keep_trying(op, until: threading.Event, log: list):
    """Run op() until `until` is set; record "ok" or the BufferError of each attempt."""
    while not until.is_set():
        try:
            op()
            log.append("ok")
        except BufferError:
            log.append("BufferError")


def _during_long_calls(call, op, rounds=30):
    """Run `call` (a long native call that releases the GIL) repeatedly on this thread
    while another thread keeps trying `op`; stop once `op` has been refused with
    BufferError during a call at least once.  Returns the list of call results."""
    results, log = [], []
    for _ in range(rounds):
        done = threading.Event()
        t = threading.Thread(target=_keep_trying, args=(op, done, log))
        t.start()
        try:
            results.append(call())
        finally:
            done.set()
            t.join()
        if "BufferError" in log:
            break
    assert "BufferError" in log, "the buffer was never exported during the call"
    return results


SIZE = 8 * BS + 5  # a run long enough for the other thread to get the GIL many times


def _grow_then_shrink(buf: bytearray):
    """Grow buf by a byte and shrink it back: the first step is refused with BufferError
    while buf is exported; if a call takes the grown buffer in between, the second step
    is retried until it is released again."""
    buf.append(0)
    while True:
        try:
            del buf[-1]
            return
        except BufferError:
            pass


def test_plaintext_bytearray_cannot_be_resized_while_encrypting():
    plain = bytearray(DATA * 3)[:SIZE]
    original = bytes(plain)
    out = bytearray(ags1.ciphertext_length(SIZE + 1))

    def call():
        return bytes(out[: ags1.encrypt_into(plain, out, KEY, AAD, threads=2)])

    for blob in _during_long_calls(call, lambda: _grow_then_shrink(plain)):
        assert ags1.decrypt(blob, KEY, AAD) in (original, original + b"\0")
    assert plain == original


def test_output_bytearray_cannot_be_resized_while_decrypting():
    blob = ags1.encrypt((DATA * 3)[:SIZE], KEY, AAD)
    out = bytearray(SIZE)
    for n in _during_long_calls(lambda: ags1.decrypt_into(blob, out, KEY, AAD, threads=2),
                                lambda: _grow_then_shrink(out)):
        assert n == SIZE
    assert out == (DATA * 3)[:SIZE]


def test_memoryview_cannot_be_released_while_a_call_uses_it():
    plain = (DATA * 3)[:SIZE]
    key = _gcm.GcmKey(KEY)
    out = bytearray(_gcm.sealed_length(SIZE))
    slot = [memoryview(plain)]

    def call():
        view = slot[0] = memoryview(plain)
        try:
            return key.seal_blocks(view, out, 0, AAD, 2)
        except ValueError as exc:  # released before the call took it: a clean refusal
            assert "released" in str(exc)
            return None

    # release() is refused with BufferError while the call holds the view's buffer
    results = _during_long_calls(call, lambda: slot[0].release())
    assert SIZE + 28 * 9 in results
    back = bytearray(SIZE)
    assert key.open_blocks(bytes(out), back, 0, AAD, 2) == SIZE and back == plain


def test_reader_source_and_target_are_pinned_during_reads():
    blob = bytearray(ags1.encrypt((DATA * 3)[:SIZE], KEY, AAD))
    with ags1.open_reader(blob, KEY, AAD, threads=2) as r:
        with pytest.raises(BufferError):  # the reader holds a view of its source
            blob.append(0)
        target = bytearray(SIZE)
        for n in _during_long_calls(lambda: r.readinto_at(target, 0), lambda: _grow_then_shrink(target)):
            assert n == SIZE
        assert target == (DATA * 3)[:SIZE]


@pytest.mark.parametrize("which", ["decrypt", "encrypt"])
def test_input_resized_by_python_code_run_inside_the_call(which):
    """Python code can run inside ags1.encrypt/decrypt when the output is allocated (a GC
    pass: finalizers, gc callbacks).  A resize there used to succeed, and the call returned
    bytes sized for the old input with an uninitialised tail; now the input is pinned."""
    short_plain = b"s" * 10
    full_plain = DATA
    blob = ags1.encrypt(full_plain, KEY)
    for nth in range(1, 6):  # whichever GC pass of the call the resize lands in
        buf = bytearray(blob if which == "decrypt" else full_plain)
        replacement = ags1.encrypt(short_plain, KEY) if which == "decrypt" else short_plain
        countdown = [nth]

        def on_gc(phase, info):
            if phase == "start":
                countdown[0] -= 1
                if countdown[0] == 0:
                    try:
                        buf[:] = replacement
                    except BufferError:
                        pass

        gc.collect()
        threshold = gc.get_threshold()
        gc.set_threshold(1)
        gc.callbacks.append(on_gc)
        try:
            if which == "decrypt":
                got = _gcm.ags1_decrypt(KEY, buf)
                assert got in (full_plain, short_plain), nth
            else:
                got = ags1.decrypt(_gcm.ags1_encrypt(KEY, buf), KEY)
                assert got in (full_plain, short_plain), nth
        finally:
            gc.callbacks.remove(on_gc)
            gc.set_threshold(*threshold)


# --------------------------------------------------------------------------- integers at the edges

EDGES = [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**65]


def test_positions_past_the_end_read_nothing_and_negative_ones_are_refused():
    np = pytest.importorskip("numpy")
    blob = ags1.encrypt(DATA, KEY, AAD)
    with ags1.open_reader(blob, KEY, AAD) as r:
        for off in EDGES + [np.int64(2**63 - 1), np.uint64(2**63), np.uint64(2**64 - 1), np.int32(2**31 - 1)]:
            assert r.read_at(off, 10) == b"", off
            assert r.read_at(off, int(off)) == b"", off
            assert r.readinto_at(bytearray(10), off) == 0, off
            assert r.seek(off) == int(off)
            assert r.read(10) == b"" and r.read() == b""
            assert r.readinto(bytearray(10)) == 0
            assert r.seek(0, 1) == int(off)
        r.seek(np.uint64(2**64 - 1))
        assert r.seek(2**63, 1) == 2**64 - 1 + 2**63  # Python ints: no wrap
        for neg in (-1, -(2**31), -(2**32), -(2**63), -(2**64), np.int64(-1), np.int64(-(2**63))):
            with pytest.raises(ValueError, match="negative"):
                r.read_at(neg, 10)
            with pytest.raises(ValueError, match="negative"):
                r.readinto_at(bytearray(10), neg)
            with pytest.raises(ValueError, match="negative"):
                r.seek(neg)
            with pytest.raises(ValueError, match="negative"):
                r.read_at(0, neg)
        with pytest.raises(ValueError, match="negative"):
            r.seek(-(2**64), 2)
        r.seek(0)
        for n in EDGES:  # huge sizes read what there is, allocating only that
            assert r.read_at(BS - 3, n) == DATA[BS - 3 :]
        assert r.read_at(np.uint64(BS), np.int64(5)) == DATA[BS : BS + 5]
        for bad in (1.5, "1", None):
            with pytest.raises(TypeError):
                r.read_at(bad, 1)
            with pytest.raises(TypeError):
                r.readinto_at(bytearray(1), bad)
            with pytest.raises(TypeError):
                r.seek(bad)


def test_length_functions_at_the_edges():
    for n in (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, MAX_PLAINTEXT - 1, MAX_PLAINTEXT):
        c = ags1.ciphertext_length(n)
        assert c == 8 + n + 28 * max(1, -(-n // BS))
        assert ags1.plaintext_length(c) == n
        assert _gcm.geometry(c) == (n, max(1, -(-n // BS)), c - 8 - (max(1, -(-n // BS)) - 1) * CBS)
    # Past the largest stream (2^31-1 blocks) nothing is a stream; the native sums used to
    # wrap near 2^64 (2^64 - 2^20 gave the length of a valid ~450 TB stream).
    for n in (MAX_PLAINTEXT + 1, 2**63 - 1, 2**63, 2**64 - 2**20, 2**64 - 1):
        for f in (ags1.ciphertext_length, _gcm.ciphertext_length, _gcm.sealed_length, _gcm.run_blocks):
            with pytest.raises(OverflowError, match="largest AGS1 stream"):
                f(n)
    for n in (2**64, 2**65):
        for f in (ags1.ciphertext_length, _gcm.ciphertext_length, _gcm.sealed_length, _gcm.run_blocks):
            with pytest.raises(OverflowError):
                f(n)
    for n in (-1, -(2**31), -(2**63), -(2**64)):
        with pytest.raises(ValueError):
            ags1.ciphertext_length(n)
        with pytest.raises(OverflowError):
            _gcm.sealed_length(n)
        with pytest.raises(FormatError):
            ags1.plaintext_length(n)
    too_long = 8 + MAX_BLOCKS * CBS + 28 + 1  # one more (non-empty) block than a stream has
    # 1..27 bytes after the 2048th / 4096th block (at 2^31 / 2^32), an empty block after
    # them, lengths of more blocks than a stream has
    for c in (8 + 2048 * CBS + 27, 8 + 4096 * CBS + 1, 8 + 2048 * CBS + 28, 8 + 4096 * CBS + 28,
              too_long, 2**63 - 1, 2**63, 2**64 - 1):
        with pytest.raises(FormatError):
            ags1.plaintext_length(c)
    for c in (2**64, 2**65):
        with pytest.raises((FormatError, OverflowError)):
            ags1.plaintext_length(c)
    with pytest.raises((ValueError, OverflowError)):
        _gcm.fresh_bytes(-1)
    with pytest.raises((OverflowError, MemoryError)):
        _gcm.fresh_bytes(2**63)


def test_trusted_lengths_at_the_edges():
    blob = ags1.encrypt(DATA[:100], KEY, AAD)
    for length in [-1, -(2**63), 0, len(blob) + 2**32] + EDGES:
        with pytest.raises((FormatError, OverflowError)):
            ags1.open_reader(blob, KEY, AAD, length=length)
        with pytest.raises((FormatError, OverflowError)):
            ags1.decrypt(blob, KEY, AAD, length=length)
        with pytest.raises((FormatError, OverflowError)):
            ags1.decrypt_into(blob, bytearray(100), KEY, AAD, length=length)


def test_block_indexes_at_the_edges():
    key = _gcm.GcmKey(KEY)
    out = bytearray(_gcm.sealed_length(10))
    plain = bytearray(10)
    last = MAX_BLOCKS - 1  # 2^31 - 2, the last index Java writes
    assert key.seal_blocks(b"0123456789", out, last, AAD) == len(out)
    assert key.open_blocks(bytes(out), plain, last, AAD) == 10 and plain == b"0123456789"
    two = bytearray(_gcm.sealed_length(BS + 1))
    with pytest.raises(FormatError):  # block 2^31-2 and 2^31-1
        key.seal_blocks(DATA[: BS + 1], two, last, AAD)
    for index in (MAX_BLOCKS, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1):
        with pytest.raises(FormatError):
            key.seal_blocks(b"x", bytearray(29), index, AAD)
        with pytest.raises(FormatError):
            key.open_blocks(bytes(out), bytearray(10), index, AAD)
    for index in (-1, -(2**63), 2**64, 2**65):
        with pytest.raises(OverflowError):
            key.seal_blocks(b"x", bytearray(29), index, AAD)
        with pytest.raises(OverflowError):
            key.open_blocks(bytes(out), bytearray(10), index, AAD)
    # the int32 LE index in the AAD, checked against an independent GCM (pyca/cryptography)
    aesgcm = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead").AESGCM(KEY)
    assert aesgcm.decrypt(bytes(out[:12]), bytes(out[12:]), AAD + struct.pack("<i", last)) == b"0123456789"


def test_thread_counts_and_invocations_at_the_edges():
    key = _gcm.GcmKey(KEY)
    for threads in (2**31, 2**63, -(2**31) - 1):
        with pytest.raises(OverflowError):
            ags1.encrypt(b"x", KEY, threads=threads)
        with pytest.raises(OverflowError):
            icecrypt.set_default_threads(threads)
    blob = ags1.encrypt(DATA[: 2 * BS], KEY, threads=2**31 - 1)  # capped by blocks and the pool size
    assert ags1.decrypt(blob, KEY, threads=-(2**31)) == DATA[: 2 * BS]  # <= 0: the default
    for n in (-1, 2**64):
        with pytest.raises(OverflowError):
            key._set_invocations(n)
    key._set_invocations(2**32 - 1)
    key.seal(b"x")
    for n in (2**32, 2**63, 2**64 - 1):
        key._set_invocations(n)
        with pytest.raises(icecrypt.KeyUsageLimitError):
            key.seal(b"x")
        with pytest.raises(icecrypt.KeyUsageLimitError):
            key.seal_blocks(b"x", bytearray(29), 0)
        assert key.invocations == n  # nothing reserved by a refused call


class FakeLen(bytes):
    """pyca/cryptography's trick: an object whose __len__ claims a size it does not have.
    icecrypt must measure buffers by the buffer protocol, never by len()."""

    def __new__(cls, data, claimed):
        self = super().__new__(cls, data)
        self.claimed = claimed
        return self

    def __len__(self):
        return self.claimed


@pytest.mark.parametrize("claimed", [2**31, 2**32, 2**63 - 1, 0])
def test_a_lying_len_changes_nothing(claimed, tmp_path):
    plain = FakeLen(DATA[: BS + 3], claimed)
    aad = FakeLen(AAD, claimed)
    blob = ags1.encrypt(plain, KEY, aad)
    assert len(blob) == ags1.ciphertext_length(BS + 3)
    assert ags1.decrypt(FakeLen(blob, claimed), KEY, AAD) == DATA[: BS + 3]
    out = bytearray(ags1.ciphertext_length(BS + 3))
    assert ags1.encrypt_into(plain, out, KEY, AAD) == len(out)
    with ags1.open_reader(FakeLen(bytes(out), claimed), KEY, aad) as r:
        assert r.size == BS + 3 and r.read_at(BS, 10) == DATA[BS : BS + 3]
    with ags1.open_writer(tmp_path / "f.ags1", KEY, aad) as w:
        assert w.write(plain) == BS + 3
    assert ags1.decrypt((tmp_path / "f.ags1").read_bytes(), KEY, AAD) == DATA[: BS + 3]
    key = _gcm.GcmKey(FakeLen(KEY, claimed))
    assert key.open(key.seal(plain, aad), AAD) == DATA[: BS + 3]


def test_aad_longer_than_an_int_is_refused_without_reading_it():
    """AAD lengths go to OpenSSL as an int: 2^31 bytes must be refused, not truncated.  The
    AAD is a 2 GiB mapping that is never touched (MAP_NORESERVE: no memory is committed)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    try:
        huge = mmap.mmap(-1, 2**31, flags=flags)
    except (OSError, ValueError) as exc:
        pytest.skip(f"cannot map 2 GiB of address space: {exc}")
    try:
        key = _gcm.GcmKey(KEY)
        with pytest.raises(ValueError):
            key.seal(b"x", huge)
        with pytest.raises(ValueError):
            key.open(bytes(28), huge)
        with pytest.raises(ValueError):
            key.seal_blocks(b"x", bytearray(29), 0, huge)
        with pytest.raises(ValueError):
            ags1.encrypt(b"x", KEY, huge)
        with pytest.raises((ValueError, icecrypt.AuthenticationError)):
            ags1.decrypt(ags1.encrypt(b"x", KEY), KEY, huge)
        assert key.invocations == 0
    finally:
        huge.close()


class VirtualStream:
    """A read-only AGS1 stream of any length up to the format's limit, made up as it is
    read (pyarrow's ``read_at(nbytes, offset)`` interface): block i is random.Random(i)'s
    bytes sealed as block i with a nonce derived from i.  Offsets past 2^31, 2^32 and up
    to the last block index are read without allocating them."""

    def __init__(self, plain_length: int):
        self.key = _gcm.GcmKey(KEY)
        self.plain_length = plain_length
        self.length = ags1.ciphertext_length(plain_length)
        self.num_blocks = _gcm.run_blocks(plain_length)
        self.blocks: dict[int, bytes] = {}
        self.largest_read = 0

    def size(self) -> int:
        return self.length

    def plain_block(self, i: int) -> bytes:
        n = min(BS, self.plain_length - i * BS)
        return random.Random(i).randbytes(n)

    def sealed_block(self, i: int) -> bytes:
        if i not in self.blocks:
            plain = self.plain_block(i)
            out = bytearray(len(plain) + 28)
            nonce = hashlib.sha256(b"nonce %d" % i).digest()[:12]
            self.key.seal_blocks(plain, out, i, AAD, 1, _nonces=nonce)
            if len(self.blocks) > 16:
                self.blocks.clear()
            self.blocks[i] = bytes(out)
        return self.blocks[i]

    def read_at(self, nbytes: int, offset: int) -> bytes:
        self.largest_read = max(self.largest_read, nbytes)
        end = min(offset + nbytes, self.length)
        out = bytearray()
        pos = offset
        while pos < end:
            if pos < 8:
                piece = ags1.HEADER[pos:]
            else:
                i, within = divmod(pos - 8, CBS)
                piece = self.sealed_block(i)[within:]
            take = min(len(piece), end - pos)
            out += piece[:take]
            pos += take
        return bytes(out)

    def plaintext(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.plain_length - offset))
        out = bytearray()
        while n:
            i, within = divmod(offset, BS)
            piece = self.plain_block(i)[within : within + n]
            out += piece
            offset += len(piece)
            n -= len(piece)
        return bytes(out)


@pytest.mark.parametrize(
    "plain_length",
    [2**32 + 3 * BS + 17, MAX_PLAINTEXT, MAX_PLAINTEXT - BS + 1],
    ids=["4GiB", "largest", "largest-short-last"],
)
def test_reads_at_offsets_past_2_31_and_2_32(plain_length):
    vs = VirtualStream(plain_length)
    with ags1.open_reader(vs, KEY, AAD, length=vs.length, threads=2) as r:
        assert r.size == plain_length and r.num_blocks == vs.num_blocks
        end = plain_length
        for off, n in [
            (2**31 - 5, 10), (2**31, 3), (2**32 - 1, 2), (2**32 - 3, 2 * BS + 6), (2**32, BS),
            (end - 10, 10), (end - 10, 2**63), (end - BS - 7, BS + 7), (end, 5), (end + 2**32, 5),
        ]:
            assert r.read_at(off, n) == vs.plaintext(off, n), (off, n)
            buf = bytearray(min(n, 3 * BS))
            got = r.readinto_at(buf, off)
            assert bytes(buf[:got]) == vs.plaintext(off, len(buf)), (off, n)
        r.seek(-7, 2)
        assert r.read() == vs.plaintext(end - 7, 7)
        r.seek(2**32)
        assert r.read(5) == vs.plaintext(2**32, 5)
    assert vs.largest_read <= (2 * 2 + 4) * CBS  # fetched by runs, never by the whole stream


def test_a_stream_one_block_longer_than_the_format_allows_is_refused():
    for extra in (28 + 1, CBS):
        vs = VirtualStream(MAX_PLAINTEXT)
        vs.length += extra  # its size() says so too: only the geometry can refuse it
        with pytest.raises(FormatError, match="not a header followed by whole blocks"):
            ags1.open_reader(vs, KEY, AAD, length=vs.length)


# --------------------------------------------------------------------------- header block size

@pytest.mark.parametrize(
    "size_field",
    [0, 1, BS - 1, BS + 1, 2 * BS, 4096, 2**31 - 1, -1, -BS, struct.unpack("<i", BS.to_bytes(4, "big"))[0]],
)
def test_a_header_claiming_another_block_size_is_a_format_error(size_field, tmp_path):
    blob = bytearray(ags1.encrypt(DATA[: BS + 10], KEY, AAD))
    blob[4:8] = struct.pack("<i", size_field)
    out = bytearray(b"\xee" * (BS + 10))
    with pytest.raises(FormatError, match="block size"):
        ags1.decrypt(blob, KEY, AAD)
    with pytest.raises(FormatError, match="block size"):
        ags1.decrypt_into(blob, out, KEY, AAD)
    assert out == b"\xee" * (BS + 10)
    with pytest.raises(FormatError, match="block size"):
        ags1.open_reader(bytes(blob), KEY, AAD)
    path = tmp_path / "f.ags1"
    path.write_bytes(blob)
    with pytest.raises(FormatError, match="block size"):
        ags1.open_reader(path, KEY, AAD)
    with pytest.raises(FormatError, match="block size"):
        _gcm.check_header(blob)


def test_a_stream_really_written_in_other_blocks_is_refused():
    """What a writer with 64 KiB blocks would produce, blocks sealed with AGS1's AAD rule:
    refused by its header, and its blocks do not authenticate as 1 MiB ones either."""
    small = 65536
    key = _gcm.GcmKey(KEY)
    plain = DATA[: 3 * small + 5]
    parts = [b"AGS1" + struct.pack("<i", small)]
    for i in range(0, len(plain), small):
        piece = plain[i : i + small]
        out = bytearray(len(piece) + 28)
        key.seal_blocks(piece, out, i // small, AAD)
        parts.append(bytes(out))
    blob = b"".join(parts)
    with pytest.raises(FormatError):
        ags1.decrypt(blob, KEY, AAD)
    fixed = ags1.HEADER + blob[8:]  # the right header does not make it a valid stream
    with pytest.raises((FormatError, icecrypt.AuthenticationError)):
        ags1.decrypt(fixed, KEY, AAD)


# --------------------------------------------------------------------------- fork

def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _nonces_of(sealed_run: bytes) -> list[bytes]:
    return [sealed_run[i : i + 12] for i in range(0, len(sealed_run), CBS)]


def _fork_child(work) -> tuple[int, bytes]:
    """Fork; the child runs work() -> bytes, writes them to a pipe and exits 0 (or 1 if
    work raised; SIGALRM after 120 s turns a deadlock into a failure, not a hung suite)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # the default action: a Python handler (pytest-timeout's) never runs in a
            # thread blocked in C
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(120)
            # before that, where every thread of a hung child is (Python frames), on stderr
            faulthandler.dump_traceback_later(100, exit=True)
            os.close(r)
            data = work()
            while data:
                data = data[os.write(w, data) :]
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    data = _read_all(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
    return pid, data


@pytest.mark.timeout(300)
def test_fork_while_the_pool_is_sealing():
    """A child forked while a parent thread is in a multi-threaded seal (pool helpers
    busy): the child gets a pool of its own, seals and opens with the same key, and no
    nonce it draws equals one the parent drew (before or after the fork)."""
    key = _gcm.GcmKey(KEY)
    plain = (DATA * 3)[: 8 * BS]
    sealed_len = _gcm.sealed_length(len(plain))
    parent_nonces: list[bytes] = []
    stop = threading.Event()
    runs = [0]

    def busy():
        out = bytearray(sealed_len)
        while not stop.is_set():
            key.seal_blocks(plain, out, 0, AAD, 4)
            parent_nonces.extend(_nonces_of(bytes(out)))
            runs[0] += 1

    key.seal(b"fill this thread's nonce buffer")

    def child_work():
        nonces = [key.seal(b"c")[:12] for _ in range(70)]  # more than one batch of 64
        out = bytearray(sealed_len)
        for _ in range(2):
            key.seal_blocks(plain, out, 0, AAD, 3)
            nonces += _nonces_of(bytes(out))
            back = bytearray(len(plain))
            assert key.open_blocks(bytes(out), back, 0, AAD, 3) == len(plain) and back == plain
        return b"".join(nonces)

    t = threading.Thread(target=busy)
    t.start()
    children = []
    try:
        # the pool has started and each helper has sealed (drawn nonces): a helper's first
        # RAND_bytes sets up OpenSSL's per-thread state under OpenSSL's global locks, and a
        # child forked while a parent thread holds one of those hangs in OpenSSL, not here
        while runs[0] < 4:
            stop.wait(0.001)
        for _ in range(4 if SANITIZED else 8):
            children.append(_fork_child(child_work)[1])
            parent_nonces.extend(key.seal(b"p")[:12] for _ in range(70))
    finally:
        stop.set()
        t.join()
    parent = set(parent_nonces)
    assert len(parent) == len(parent_nonces)
    seen = set()
    for data in children:
        nonces = {data[i : i + 12] for i in range(0, len(data), 12)}
        assert len(nonces) == len(data) // 12 == 70 + 2 * 8
        assert not nonces & parent
        assert not nonces & seen  # nor another child's
        seen |= nonces


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fork_next_to_threads_using_the_same_key_never_hangs_the_child():
    """Threads seal and open with one key while the main thread forks: the child uses the
    key at once.  The key's context pool used a mutex, and a child forked while a parent
    thread held it waited forever (2 of 300 children hung before the pool became
    lock-free)."""
    key = _gcm.GcmKey(KEY)
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            key.open(key.seal(b"y"))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(30 if SANITIZED else 150):
            _, data = _fork_child(lambda: key.open(key.seal(b"child")))
            assert data == b"child"
    finally:
        stop.set()
        for t in threads:
            t.join()
