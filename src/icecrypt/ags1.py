"""AGS1, Apache Iceberg's "AES GCM Stream" file format, byte-compatible with Iceberg Java.

Layout (SPEC.md section 1): an 8-byte header ``"AGS1" || int32 LE 1048576``, then blocks
``nonce(12) || AES-GCM ciphertext || tag(16)`` of 1 MiB plaintext each (the last one
shorter; an empty stream is the header and one empty block), block ``i`` authenticated
with AAD ``aad_prefix || int32 LE(i)``.

Readers trust the ciphertext length from key metadata (``file_length``) when given one,
and otherwise the source's size.  They are stricter than Java's reader: every length the
block geometry cannot explain, a header that is not exactly Java's, and a source whose
size differs from the trusted length are :class:`~icecrypt.FormatError`; a tag that does
not verify is :class:`~icecrypt.AuthenticationError`.  No byte is released before its
block's tag has verified, and on failure the caller's buffer is wiped.

Writers encrypt each 1 MiB block as soon as it is complete, straight from the caller's
buffer, and write the final (partial) block on :meth:`Ags1Writer.close`.  Writing to a
path is atomic: the data goes to a temporary file in the same directory that is renamed
over the target only when the stream closed cleanly.
"""

from __future__ import annotations

import io
import operator
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, BinaryIO, Union

from icecrypt import _gcm
from icecrypt._atomic import AtomicFile
from icecrypt.errors import FormatError

__all__ = [
    "PLAIN_BLOCK_SIZE",
    "CIPHER_BLOCK_SIZE",
    "HEADER",
    "HEADER_LENGTH",
    "MIN_STREAM_LENGTH",
    "Ags1Reader",
    "Ags1Writer",
    "ciphertext_length",
    "decrypt",
    "decrypt_into",
    "encrypt",
    "encrypt_into",
    "open_reader",
    "open_writer",
    "plaintext_length",
]

PLAIN_BLOCK_SIZE: int = _gcm.PLAIN_BLOCK_SIZE
CIPHER_BLOCK_SIZE: int = _gcm.CIPHER_BLOCK_SIZE
HEADER_LENGTH: int = _gcm.HEADER_LENGTH
MIN_STREAM_LENGTH: int = _gcm.MIN_STREAM_LENGTH
HEADER: bytes = _gcm.header()

# Blocks handled per native call by streams: large enough to keep every core busy,
# small enough that scratch buffers stay a few MiB.
_MIN_RUN_BLOCKS = 4
#: the initial block buffer of a writer (it grows to PLAIN_BLOCK_SIZE as data comes)
_FIRST_WRITE_BLOCK = 1 << 16

KeyLike = Union[bytes, bytearray, memoryview, "_gcm.GcmKey"]
NonceSource = Callable[[int, int], bytes]  # (first_block_index, count) -> 12 * count bytes


def ciphertext_length(plaintext_length: int) -> int:
    """Length of the AGS1 stream that holds ``plaintext_length`` bytes."""
    if plaintext_length < 0:
        raise ValueError("plaintext_length must not be negative")
    return _gcm.ciphertext_length(plaintext_length)


def plaintext_length(ciphertext_length: int) -> int:
    """Plaintext length of an AGS1 stream of ``ciphertext_length`` bytes.

    Raises FormatError for lengths no valid stream has (Java's formula returns a number
    for some of them, SPEC.md 1.4 quirks 1-2).
    """
    return _gcm.geometry(ciphertext_length)[0]


def encrypt(
    plaintext: Any,
    key: KeyLike,
    aad_prefix: bytes | None = None,
    *,
    threads: int = 0,
) -> bytes:
    """Encrypt a whole buffer into AGS1 bytes (one native call, blocks in parallel)."""
    return _gcm.ags1_encrypt(key, plaintext, aad_prefix, threads)


def decrypt(
    ciphertext: Any,
    key: KeyLike,
    aad_prefix: bytes | None = None,
    length: int | None = None,
    *,
    threads: int = 0,
) -> bytes:
    """Decrypt a whole AGS1 buffer, verifying every block.

    ``length`` is the trusted ciphertext length (key metadata ``file_length``); when
    given, the buffer must hold exactly that many bytes.
    """
    return _gcm.ags1_decrypt(key, ciphertext, aad_prefix, length, threads)


def encrypt_into(
    plaintext: Any,
    out: Any,
    key: KeyLike,
    aad_prefix: bytes | None = None,
    *,
    threads: int = 0,
) -> int:
    """Encrypt a whole buffer as an AGS1 stream into the writable buffer ``out`` (at
    least ``ciphertext_length(len(plaintext))`` bytes); returns the bytes written."""
    return _gcm.ags1_encrypt_into(key, plaintext, out, aad_prefix, threads)


def decrypt_into(
    ciphertext: Any,
    out: Any,
    key: KeyLike,
    aad_prefix: bytes | None = None,
    length: int | None = None,
    *,
    threads: int = 0,
) -> int:
    """Verify and decrypt a whole AGS1 buffer into the writable buffer ``out``; returns
    the plaintext length.  On failure nothing of the plaintext is left in ``out``."""
    return _gcm.ags1_decrypt_into(key, ciphertext, out, aad_prefix, length, threads)


def open_writer(sink: Any, key: KeyLike, aad_prefix: bytes | None = None, **options: Any) -> Ags1Writer:
    """An :class:`Ags1Writer` onto ``sink`` (a path, or a binary file object)."""
    return Ags1Writer(sink, key, aad_prefix, **options)


def open_reader(
    source: Any, key: KeyLike, aad_prefix: bytes | None = None, length: int | None = None, **options: Any
) -> Ags1Reader:
    """An :class:`Ags1Reader` over ``source`` (a path, a bytes-like object, or a binary
    file object), with ``length`` the trusted ciphertext length."""
    return Ags1Reader(source, key, aad_prefix, length, **options)


def seek_position(current: int, size: int, offset: int, whence: int) -> int:
    """The position a ``seek(offset, whence)`` moves to in a stream of ``size`` bytes at
    ``current`` (io semantics: past the end is allowed, before the start is not)."""
    offset = operator.index(offset)  # a Python int: numpy's uint64 wraps on arithmetic
    if whence == io.SEEK_SET:
        pos = offset
    elif whence == io.SEEK_CUR:
        pos = current + offset
    elif whence == io.SEEK_END:
        pos = size + offset
    else:
        raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
    if pos < 0:
        raise ValueError(f"negative seek position {pos}")
    return pos


def _as_key(key: KeyLike) -> _gcm.GcmKey:
    return key if isinstance(key, _gcm.GcmKey) else _gcm.GcmKey(key)


def _as_aad(aad_prefix: Any) -> bytes | None:
    # A zero-length prefix and no prefix give the same AAD (SPEC.md 1.2).
    if aad_prefix is None:
        return None
    if isinstance(aad_prefix, str):
        raise TypeError("aad_prefix must be bytes-like, not str")
    aad = bytes(aad_prefix)
    return aad or None


def _byte_view(obj: Any) -> memoryview:
    view = memoryview(obj)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


# --------------------------------------------------------------------------- sources


class _Source:
    """Random access to ciphertext bytes.  ``fetch`` returns exactly ``n`` bytes at
    ``offset``: a view of the source's own memory, or ``scratch`` filled with them."""

    name: str = "<stream>"
    owned: bool = False

    def size(self) -> int | None:
        return None

    def fetch(self, offset: int, n: int, scratch: memoryview) -> memoryview:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _short(self, offset: int, n: int, got: int) -> FormatError:
        return FormatError(
            f"{self.name}: AGS1 stream is truncated: expected {n} bytes at offset {offset}, got {got}"
        )


class _MemorySource(_Source):
    def __init__(self, data: Any, name: str):
        self.view = _byte_view(data)
        self.name = name

    def size(self) -> int:
        return len(self.view)

    def fetch(self, offset: int, n: int, scratch: memoryview) -> memoryview:
        piece = self.view[offset : offset + n]
        if len(piece) != n:
            raise self._short(offset, n, len(piece))
        return piece


class _FdSource(_Source):
    """A file descriptor read with pread: no shared position, safe from many threads."""

    def __init__(self, fd: int, name: str, owned: bool):
        self.fd = fd
        self.name = name
        self.owned = owned

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def fetch(self, offset: int, n: int, scratch: memoryview) -> memoryview:
        buf = scratch[:n]
        got = 0
        while got < n:
            r = os.preadv(self.fd, [buf[got:]], offset + got)
            if r == 0:
                raise self._short(offset, n, got)
            got += r
        return buf

    def close(self) -> None:
        if self.owned and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _FileObjectSource(_Source):
    """Any seekable binary file object; reads are serialized by a lock."""

    def __init__(self, fileobj: Any, name: str):
        self.fileobj = fileobj
        self.name = name
        self.lock = threading.Lock()
        self.read_at = getattr(fileobj, "read_at", None)  # pyarrow.NativeFile: positional, zero copy

    def size(self) -> int | None:
        size = getattr(self.fileobj, "size", None)
        if callable(size):
            try:
                return int(size())
            except (OSError, TypeError, ValueError, io.UnsupportedOperation):
                pass
        try:
            with self.lock:
                here = self.fileobj.tell()
                end = self.fileobj.seek(0, io.SEEK_END)
                self.fileobj.seek(here)
            return end
        except (OSError, AttributeError, io.UnsupportedOperation):
            return None

    def fetch(self, offset: int, n: int, scratch: memoryview) -> memoryview:
        if self.read_at is not None:
            piece = _byte_view(self.read_at(n, offset))
            if len(piece) != n:
                raise self._short(offset, n, len(piece))
            return piece
        buf = scratch[:n]
        got = 0
        with self.lock:
            self.fileobj.seek(offset)
            readinto = getattr(self.fileobj, "readinto", None)
            while got < n:
                if readinto is not None:
                    r = readinto(buf[got:])
                else:
                    chunk = self.fileobj.read(n - got)
                    r = len(chunk)
                    buf[got : got + r] = chunk
                if not r:
                    raise self._short(offset, n, got)
                got += r
        return buf


def _source_name(obj: Any) -> str:
    name = getattr(obj, "name", None) or getattr(obj, "path", None)
    return os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else "<stream>"


def _open_source(source: Any, name: str | None) -> _Source:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return _FdSource(fd, name or os.fsdecode(path), owned=True)
    if isinstance(source, (bytes, bytearray, memoryview)) or (
        not hasattr(source, "read") and not hasattr(source, "read_at")
    ):
        try:
            return _MemorySource(source, name or "<memory>")
        except TypeError:
            raise TypeError(f"cannot read AGS1 from {type(source).__name__}") from None
    raw = source
    while isinstance(raw, (io.BufferedReader, io.BufferedRandom)):
        raw = raw.raw
    if isinstance(raw, io.FileIO) and hasattr(os, "preadv"):
        return _FdSource(raw.fileno(), name or _source_name(source), owned=False)
    return _FileObjectSource(source, name or _source_name(source))


# --------------------------------------------------------------------------- reader


class _PlainBlock(bytearray):
    """A buffer for decrypted bytes that zeroes itself before its memory is freed (when
    the thread that owned it ends, say)."""

    def wipe(self) -> None:
        self[:] = bytes(len(self))

    def __del__(self) -> None:
        self.wipe()


class _Scratch(threading.local):
    """Per-thread buffers of a reader: ciphertext staging and one cached plaintext block.

    Each thread's plaintext block is also listed (weakly) in ``blocks``, shared by all
    threads, so that the reader can wipe every one of them when it closes."""

    def __init__(self, block_size: int = PLAIN_BLOCK_SIZE, blocks: list[weakref.ref] | None = None) -> None:
        # Sized to the stream: a small file (a manifest of a few KB) must not cost a
        # 1 MiB block of fresh pages (zeroed on first touch) per open.
        self.ciphertext: memoryview | None = None
        plain = _PlainBlock(block_size)
        self.block = memoryview(plain)
        self.block_index = -1
        self.block_length = 0
        if blocks is not None:
            blocks.append(weakref.ref(plain))  # list.append is atomic: threads may start at once


class Ags1Reader(io.RawIOBase):
    """Random-access reader of an AGS1 stream.

    ``source``: a path, a bytes-like object (read without copying), or a seekable binary
    file object (or anything with pyarrow's ``read_at(nbytes, offset)``).  ``length``: the
    trusted ciphertext length; without it, the source's size.  ``threads``: threads per
    large read (0 = the process default, see :func:`icecrypt.set_default_threads`).

    ``read``/``readinto``/``seek``/``tell`` form the usual stream; ``read_at`` and
    ``readinto_at`` are positional and may be called from many threads at once.  Only
    the blocks a read touches are decrypted; whole blocks are decrypted straight into
    the caller's buffer, the partial ones at the edges through a per-thread block cache.
    As in Java, the first read of any kind also authenticates block 0.
    """

    def __init__(
        self,
        source: Any,
        key: KeyLike,
        aad_prefix: bytes | None = None,
        length: int | None = None,
        *,
        threads: int = 0,
        name: str | None = None,
    ):
        super().__init__()
        self._source = _open_source(source, name)
        self.name = self._source.name
        try:
            self._key = _as_key(key)
            self._aad = _as_aad(aad_prefix)
            self._threads = threads
            actual = self._source.size()
            if length is None:
                if actual is None:
                    raise ValueError(f"{self.name}: the source has no known size; pass length")
                length = actual
            elif actual is not None and actual != length:
                what = "truncated" if actual < length else "longer than its key metadata says"
                raise FormatError(f"{self.name}: AGS1 stream is {what}: {actual} bytes, expected {length}")
            self._length = int(length)
            self._size, self._num_blocks, self._last_cipher_block = _gcm.geometry(self._length, self.name)
            header = self._source.fetch(0, HEADER_LENGTH, memoryview(bytearray(HEADER_LENGTH)))
            _gcm.check_header(header, self.name)
        except BaseException:
            self._source.close()
            raise
        self._run_blocks = max(_MIN_RUN_BLOCKS, 2 * (threads or _gcm.get_default_threads()))
        # the largest plaintext block of this stream (one block for most small files)
        self._plain_blocks: list[weakref.ref] = []  # every thread's cached plaintext block
        self._scratch = _Scratch(min(PLAIN_BLOCK_SIZE, max(1, self._size)), self._plain_blocks)
        self._block0_lock = threading.Lock()
        self._block0_verified = False
        self._pos = 0

    # -- properties
    @property
    def size(self) -> int:
        """Plaintext length of the stream."""
        return self._size

    @property
    def ciphertext_length(self) -> int:
        return self._length

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    # -- positional reads
    def _block_plain_length(self, index: int) -> int:
        if index == self._num_blocks - 1:
            return self._last_cipher_block - _gcm.GCM_OVERHEAD
        return PLAIN_BLOCK_SIZE

    def _fetch_blocks(self, first: int, count: int, scratch: _Scratch) -> memoryview:
        start = HEADER_LENGTH + first * CIPHER_BLOCK_SIZE
        end = min(HEADER_LENGTH + (first + count) * CIPHER_BLOCK_SIZE, self._length)
        n = end - start
        if scratch.ciphertext is None or len(scratch.ciphertext) < n:
            size = min(min(self._run_blocks, self._num_blocks) * CIPHER_BLOCK_SIZE, self._length - HEADER_LENGTH)
            scratch.ciphertext = memoryview(bytearray(max(size, n)))
        return self._source.fetch(start, n, scratch.ciphertext)

    def _cached_block(self, index: int, scratch: _Scratch) -> memoryview:
        if scratch.block_index != index:
            scratch.block_index = -1
            sealed = self._fetch_blocks(index, 1, scratch)
            scratch.block_length = self._key.open_blocks(sealed, scratch.block, index, self._aad, 1, self.name)
            scratch.block_index = index
        return scratch.block[: scratch.block_length]

    def _verify_block0(self, scratch: _Scratch) -> None:
        with self._block0_lock:
            if not self._block0_verified:
                self._cached_block(0, scratch)
                self._block0_verified = True

    def readinto_at(self, buffer: Any, offset: int) -> int:
        """Fill ``buffer`` with plaintext from ``offset``; returns the bytes written
        (fewer only at the end of the stream).  Thread-safe."""
        self._checkClosed()
        offset = operator.index(offset)  # a Python int: numpy's uint64 wraps on arithmetic
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        out = _byte_view(buffer)
        if out.readonly:
            raise TypeError("buffer must be writable")
        scratch = self._scratch
        if not self._block0_verified:
            self._verify_block0(scratch)
        n = max(0, min(len(out), self._size - offset))
        done = 0
        try:
            while done < n:
                pos = offset + done
                index, within = divmod(pos, PLAIN_BLOCK_SIZE)
                block_length = self._block_plain_length(index)
                if within == 0 and n - done >= block_length:
                    # Whole blocks: decrypt straight into the caller's buffer.
                    count = min((n - done) // PLAIN_BLOCK_SIZE, self._num_blocks - index, self._run_blocks)
                    if count == 0:  # the short last block, wholly wanted
                        count = 1
                    sealed = self._fetch_blocks(index, count, scratch)
                    done += self._key.open_blocks(
                        sealed, out[done:], index, self._aad, self._threads, self.name
                    )
                else:
                    block = self._cached_block(index, scratch)
                    take = min(n - done, block_length - within)
                    out[done : done + take] = block[within : within + take]
                    done += take
        except BaseException:
            out[:n] = bytes(n)  # release nothing of a read that failed
            raise
        return n

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes of plaintext from ``offset``.  Thread-safe."""
        self._checkClosed()
        offset, n = operator.index(offset), operator.index(n)
        if n < 0:
            raise ValueError(f"negative size {n}")
        want = max(0, min(n, self._size - offset)) if offset >= 0 else 0
        data, target = _gcm.fresh_bytes(want)
        got = self.readinto_at(target, offset)
        assert got == want
        return data

    # -- stream interface
    def readinto(self, buffer: Any) -> int:
        n = self.readinto_at(buffer, self._pos)
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        if size is None or size < 0:
            size = max(0, self._size - self._pos)
        data = self.read_at(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        self._pos = seek_position(self._pos, self._size, offset, whence)
        return self._pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def close(self) -> None:
        if not self.closed:
            try:
                source = getattr(self, "_source", None)  # None if __init__ failed early
                if source is not None:
                    source.close()
            finally:
                self._wipe_scratch()
                super().close()

    def _wipe_scratch(self) -> None:
        """Zero the plaintext blocks cached for partial reads, in every thread's scratch:
        decrypted bytes do not outlive the reader in memory it owns."""
        for ref in getattr(self, "_plain_blocks", ()):  # absent if __init__ failed early
            block = ref()
            if block is not None:
                block.wipe()

    def __repr__(self) -> str:
        return f"<Ags1Reader name={getattr(self, 'name', None)!r} size={getattr(self, '_size', None)}>"


# --------------------------------------------------------------------------- writer


class Ags1Writer(io.RawIOBase):
    """Streaming AGS1 encryptor.

    ``sink``: a path (written atomically: a temporary file in the same directory is
    renamed over it on a clean close, and removed on failure or :meth:`abort`) or a
    binary file object (left open).  Each 1 MiB block is sealed as soon as it is full,
    whole blocks straight from the caller's buffer; :meth:`flush` never emits a partial
    block; :meth:`close` writes the last block.  ``tell()`` is the plaintext position,
    ``ciphertext_length`` the stream's length once closed (the key metadata's
    ``file_length``).  Leaving the ``with`` block by an exception, or dropping an
    unclosed writer, discards the output instead of completing it.
    """

    def __init__(
        self,
        sink: Any,
        key: KeyLike,
        aad_prefix: bytes | None = None,
        *,
        threads: int = 0,
        fsync: bool = True,
    ):
        super().__init__()
        self._key = _as_key(key)
        self._aad = _as_aad(aad_prefix)
        self._threads = threads
        self._fsync = fsync
        # GCM nonces come from the native core's random source; tests that reproduce
        # Java's bytes set this attribute to a NonceSource (no argument reaches it)
        self._nonces: NonceSource | None = None
        self._atomic: AtomicFile | None = None
        # Everything that can fail comes before the sink is opened (a temporary file is
        # created for a path), so a writer that exists has something to abort.  The
        # block buffer grows to a full block only as data comes: a small file (a
        # manifest) costs a few KB of buffer, not 1 MiB of fresh pages per writer.
        self._block = memoryview(bytearray(_FIRST_WRITE_BLOCK))
        self._fill = 0
        self._index = 0
        self._written = 0
        self._out: memoryview | None = None
        self._run_blocks = max(_MIN_RUN_BLOCKS, 2 * (threads or _gcm.get_default_threads()))
        self._failed = False
        self._finished = False  # the sink is done with (closed, or left to its owner)
        self._position = 0
        self._ciphertext_length: int | None = None
        if isinstance(sink, (str, os.PathLike)):
            self._atomic = AtomicFile(sink)
            self._sink: BinaryIO = self._atomic.file
            self.name = self._atomic.path
        elif hasattr(sink, "write"):
            self._sink = sink
            self.name = _source_name(sink)
        else:
            raise TypeError(f"cannot write AGS1 to {type(sink).__name__}")

    def writable(self) -> bool:
        return True

    @property
    def ciphertext_length(self) -> int | None:
        """Bytes of the finished stream (header included); None until closed."""
        return self._ciphertext_length

    def tell(self) -> int:
        """Plaintext bytes written (after close: the plaintext length, as Java's getPos)."""
        return self._position

    def _emit(self, data: memoryview) -> None:
        while data:
            n = self._sink.write(data)
            if n is None:
                raise BlockingIOError("AGS1 sink would block")
            data = data[n:]

    def _write_out(self, data: memoryview) -> None:
        self._emit(data)
        self._written += len(data)

    def _seal(self, plain: memoryview) -> None:
        blocks = _gcm.run_blocks(len(plain))
        need = _gcm.sealed_length(len(plain))
        if self._out is None or len(self._out) < need:
            run = need if len(plain) < PLAIN_BLOCK_SIZE else min(self._run_blocks, blocks) * CIPHER_BLOCK_SIZE
            self._out = memoryview(bytearray(max(need, run)))
        nonces = self._nonces(self._index, blocks) if self._nonces is not None else None
        sealed = self._out[:need]
        self._key.seal_blocks(plain, sealed, self._index, self._aad, self._threads, _nonces=nonces)
        self._write_out(sealed)
        self._index += blocks

    def _start(self) -> None:
        if self._written == 0:
            self._write_out(memoryview(HEADER))

    def write(self, data: Any) -> int:
        self._checkClosed()
        if self._failed:
            raise ValueError(f"{self.name}: an earlier write failed; the stream is discarded")
        view = _byte_view(data)
        n = len(view)
        try:
            self._start()
            pos = 0
            if self._fill + n > len(self._block) and len(self._block) < PLAIN_BLOCK_SIZE:
                self._grow(min(PLAIN_BLOCK_SIZE, max(2 * len(self._block), self._fill + n)))
            if self._fill:
                take = min(PLAIN_BLOCK_SIZE - self._fill, n)
                self._block[self._fill : self._fill + take] = view[:take]
                self._fill += take
                pos = take
                if self._fill == PLAIN_BLOCK_SIZE:
                    self._seal(self._block)
                    self._fill = 0
            whole = (n - pos) // PLAIN_BLOCK_SIZE
            while whole:
                count = min(whole, self._run_blocks)
                end = pos + count * PLAIN_BLOCK_SIZE
                self._seal(view[pos:end])
                pos = end
                whole -= count
            rest = n - pos
            if rest:
                if rest > len(self._block):
                    self._grow(PLAIN_BLOCK_SIZE)
                self._block[:rest] = view[pos:]
                self._fill = rest
        except BaseException:
            self._failed = True
            raise
        self._position += n
        return n

    def _grow(self, size: int) -> None:
        old = self._block
        block = memoryview(bytearray(size))
        block[: self._fill] = old[: self._fill]
        old[:] = bytes(len(old))
        self._block = block

    def flush(self) -> None:
        """Flush the sink.  A partial block is never emitted before close."""
        if not self.closed and not self._finished:
            self._sink.flush()

    def close(self) -> None:
        """Write the last block, flush, and (for a path) move the file into place."""
        if self.closed:
            return
        if self._failed:
            self.abort()
            return
        try:
            self._start()
            if self._fill or self._index == 0:
                self._seal(self._block[: self._fill])
                self._fill = 0
            self._sink.flush()
            if self._atomic is not None:
                self._atomic.commit(fsync=self._fsync)
            self._ciphertext_length = self._written
        except BaseException:
            self.abort()
            raise
        finally:
            self._finished = True
            self._block[:] = bytes(len(self._block))
            super().close()

    def abort(self) -> None:
        """Discard the stream: for a path, remove the temporary file; for a file object,
        stop without writing the last block.  Idempotent."""
        self._failed = True
        try:
            if self._atomic is not None:
                self._atomic.discard()
        finally:
            self._finished = True
            self._block[:] = bytes(len(self._block))
            super().close()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        if hasattr(self, "_sink") and not self.closed:  # not for a writer whose __init__ failed
            warnings.warn(f"unclosed Ags1Writer {self.name!r}: output discarded", ResourceWarning, stacklevel=2)
            self.abort()

    def __repr__(self) -> str:
        return f"<Ags1Writer name={self.name!r} position={self._position}>"
