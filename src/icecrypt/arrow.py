"""A pyarrow filesystem that stores every file as an AGS1 stream (Iceberg's "AES GCM Stream").

``EncryptedFileSystem.wrap(base_fs, manager, keys)`` returns a :class:`pyarrow.fs.PyFileSystem`
whose handler (:class:`EncryptedFileSystemHandler`) encrypts what is written and decrypts
what is read, over any pyarrow filesystem (local, S3, GCS, HDFS, SubTree...).  Everything
that takes a pyarrow filesystem — ``pyarrow.dataset``, ``pyarrow.parquet``,
``pyarrow.csv``, ``pyarrow.json`` — works through it unchanged.

Keys
    Each file has its own :class:`~icecrypt.keys.StandardKeyMetadata` (DEK, AAD prefix and
    ciphertext length).  Reads look the path up in ``keys`` (a mapping or a resolver
    callable); writes draw a fresh key from ``manager`` and, once the stream has closed
    cleanly, record it with its ``file_length`` (``handler.key_metadata(path)``,
    ``handler.written_keys()``, ``handler.save_key_manifest(...)``).  A file without a key
    is refused with :class:`~icecrypt.EncryptionKeyNotFoundError` (fail closed), unless it
    lies under one of ``plain_prefixes``, which pass through untouched.

Reading
    ``open_input_file`` returns a seekable file over an :class:`~icecrypt.ags1.Ags1Reader`
    that fetches, through the base file's own positional ``read_at``, only the AGS1
    blocks a read covers (plus block 0, which every reader authenticates first), so
    Parquet footers and column projections on S3 turn into small range requests.  The
    file is handed to Arrow as a :class:`pyarrow.PythonFile`: its ``ReadAt`` runs this
    module's Python code under the GIL and a per-file lock, but that code only stages the
    call — the base read and the AES-GCM work (in parallel over the cores) run with the
    GIL released — and decrypts into buffers of Arrow's memory pool.  Sizes reported by
    ``get_file_info`` are plaintext sizes computed from the trusted ``file_length`` (or
    the AGS1 geometry of the stored size), never by decrypting.

Writing
    ``open_output_stream`` encrypts block by block into the base filesystem.  On
    filesystems whose ``move`` is a rename (local, HDFS, and SubTree views of them) the
    data goes to a hidden temporary file beside the target that is renamed over it on a
    clean close, and removed otherwise.  Object stores publish an object only when its
    upload completes, but pyarrow offers no way to abort an upload from Python (its S3
    stream completes the multipart upload even when dropped), so there a failed stream is
    made invalid on purpose (its length becomes impossible for AGS1) before it is closed,
    and the object is then deleted.  ``open_append_stream`` is refused: an AGS1 stream
    cannot be extended without rewriting its last block and the key metadata.

Pickling
    The handler pickles (Spark ships it to executors) with its base filesystem, its plain
    prefixes, every key it knows (so the pickle holds data keys: send it only over an
    encrypted channel) and the key resolver if there is one (it must pickle too).  The
    :class:`~icecrypt.keys.EncryptionManager` does not travel — KMS clients hold
    connections and locks — only its data-key length does, so an unpickled handler still
    writes files with fresh keys but needs a manager passed explicitly to
    :meth:`EncryptedFileSystemHandler.save_key_manifest`.

Process exit
    Arrow's thread pools may still hold this module's Python objects (files, buffers, the
    handler) when the interpreter finalizes, and dropping one then aborts the process
    (apache/arrow#34314).  An :mod:`atexit` hook waits for them; see ``_ExitGuard``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from icecrypt import ags1
from icecrypt._atomic import renames_atomically
from icecrypt._encrypting import EncryptingHandler, is_encrypted_filesystem
from icecrypt._encfs import (
    EncryptingStream,
    KeyAccess,
    KeyMetadataLike,
    KeyRegistry,
    KeyResolver,
    strip_slashes as _canonical,
)
from icecrypt.keys.manager import EncryptionManager
from icecrypt.keys.metadata import StandardKeyMetadata

__all__ = [
    "EncryptedFileSystem",
    "EncryptedFileSystemHandler",
    "KeyResolver",
    "is_encrypted_filesystem",
]

# --------------------------------------------------------------------------- files


class _EncryptedInputFile:
    """What :class:`pyarrow.PythonFile` reads: the plaintext of one AGS1 file of the base
    filesystem, decrypted run of blocks by run of blocks as Arrow asks for ranges.

    Arrow calls ``seek`` + ``read_buffer`` (under its per-file lock) for each ``ReadAt``
    and keeps the buffer returned; the file and every buffer are registered with
    :data:`_guard`, for the exit hook.
    """

    def __init__(self, base_file: pa.NativeFile, key_metadata: StandardKeyMetadata, path: str):
        try:
            self._reader = ags1.Ags1Reader(
                base_file,  # read with its positional read_at, the GIL released
                key_metadata.encryption_key,
                key_metadata.aad_prefix,
                key_metadata.file_length,
                name=path,
            )
        except BaseException:
            base_file.close()
            raise
        self._base_file = base_file
        self._size = self._reader.size
        self._pos = 0
        self.name = path
        _guard.track(self)

    @property
    def closed(self) -> bool:
        return self._reader.closed

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with _guard.call():
            if self._reader.closed:
                raise ValueError(f"{self.name}: I/O operation on closed file")
            self._pos = ags1.seek_position(self._pos, self._size, offset, whence)
            return self._pos

    def tell(self) -> int:
        return self._pos

    def read_buffer(self, nbytes: int | None = -1) -> pa.Buffer:
        """Up to ``nbytes`` plaintext bytes from the position, in a new Arrow buffer."""
        with _guard.call():
            data = _read_pool_buffer(self._reader, self._pos, self._size, nbytes)
            self._pos += data.size
            return data

    read = read_buffer

    def close(self) -> None:
        with _guard.call():
            if not self._reader.closed:
                try:
                    self._reader.close()
                finally:
                    self._base_file.close()


class _EncryptedOutputStream(EncryptingStream):
    """What :class:`pyarrow.PythonFile` writes to: an Ags1Writer into the base
    filesystem whose file is published by a clean :meth:`close`, and discarded on any
    failure or when the stream is dropped unclosed (the shared rules of
    :class:`icecrypt._encfs.EncryptingStream`)."""

    base_errors = (OSError, pa.ArrowException)

    def __init__(
        self,
        handler: EncryptedFileSystemHandler,
        path: str,
        key_metadata: StandardKeyMetadata,
        metadata: Any,
    ):
        self._handler = handler
        self._metadata = metadata
        self.renames = renames_atomically(handler.base)
        super().__init__(handler._registry, path, key_metadata)
        _guard.track(self)

    def _open_base(self, path: str) -> pa.NativeFile:
        return self._handler.base.open_output_stream(path, compression=None, metadata=self._metadata)

    def _move_base(self, src: str, dest: str) -> None:
        self._handler.base.move(src, dest)

    def _delete_base(self, path: str) -> None:
        self._handler.base.delete_file(path)

    def _call(self) -> contextlib.AbstractContextManager[Any]:
        return _guard.call()


# --------------------------------------------------------------------------- handler


def _arrow_entry(method: Callable[..., Any]) -> Callable[..., Any]:
    """Count a handler call as in flight for the exit hook while it runs."""

    @functools.wraps(method)
    def entry(self: EncryptedFileSystemHandler, *args: Any, **kwargs: Any) -> Any:
        with _guard.call():
            return method(self, *args, **kwargs)

    return entry


class EncryptedFileSystemHandler(EncryptingHandler, KeyAccess, pafs.FileSystemHandler):
    """The :class:`pyarrow.fs.FileSystemHandler` behind :meth:`EncryptedFileSystem.wrap`.

    ``base``: the filesystem holding the stored (encrypted) bytes.  ``manager``: source of
    per-file keys for writes (``new_file_key()``), and of the KMS for key manifests.
    ``keys``: read keys, a mapping ``path -> StandardKeyMetadata`` (or its encoded bytes)
    or a resolver callable ``path -> key metadata | None``.  ``plain_prefixes``: paths
    (on ``base``) whose files are read and written unencrypted.

    Paths are those of the base filesystem; keys are matched on the path as ``str``
    without trailing slashes.  The handler is thread-safe.
    """

    def __init__(
        self,
        base: pafs.FileSystem,
        manager: EncryptionManager | None = None,
        keys: Mapping[Any, KeyMetadataLike] | KeyResolver | None = None,
        *,
        plain_prefixes: Iterable[str] = (),
    ):
        if not isinstance(base, pafs.FileSystem):
            raise TypeError(f"base must be a pyarrow.fs.FileSystem, not {type(base).__name__}")
        if is_encrypted_filesystem(base):
            raise ValueError("base is already an EncryptedFileSystem: files would be encrypted twice")
        self._base = base
        self._registry = KeyRegistry(manager, keys, plain_prefixes, _canonical)
        _guard.track(self)

    # -- pickling: the manager (KMS client) stays behind, its data-key length travels
    def __getstate__(self) -> dict[str, Any]:
        return {"base": self._base, **self._registry.__getstate__()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._base = state.pop("base")
        self._registry = KeyRegistry.__new__(KeyRegistry)
        self._registry.__setstate__(state)
        self._registry.canonical = _canonical
        _guard.track(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EncryptedFileSystemHandler):
            return NotImplemented
        if other is self:
            return True
        return self._registry.snapshot() == other._registry.snapshot() and self._base.equals(other._base)

    def __hash__(self) -> int:
        return hash((self._base.type_name, self._registry.plain_prefixes))

    def __repr__(self) -> str:
        registry = self._registry
        return (
            f"<EncryptedFileSystemHandler base={self._base.type_name!r} keys={len(registry.keys)} "
            f"written={len(registry.written)} plain_prefixes={list(registry.plain_prefixes)!r}>"
        )

    # -- public API
    @property
    def base(self) -> pafs.FileSystem:
        """The wrapped filesystem (stored, encrypted bytes)."""
        return self._base


    def add_keys(self, keys: Mapping[Any, KeyMetadataLike]) -> None:
        """Make more files readable (e.g. keys read from another manifest)."""
        self._registry.add(keys)

    def save_key_manifest(
        self,
        path: str | os.PathLike[str],
        *,
        filesystem: pafs.FileSystem | None = None,
        manager: EncryptionManager | None = None,
        all_keys: bool = False,
    ) -> None:
        """Write a key manifest (:func:`icecrypt.keys.manifest.write_key_manifest`) of the
        files written through this filesystem (``all_keys``: of every key it knows).

        ``filesystem``: where the manifest goes, default this handler's base filesystem
        (the manifest is JSON whose keys are all wrapped; it is never encrypted itself).
        ``manager``: default the handler's own (required after unpickling).
        """
        self._registry.save_manifest(path, self._base if filesystem is None else filesystem, manager, all_keys)

    # -- internals
    def _file_info(self, info: pafs.FileInfo) -> pafs.FileInfo:
        if info.type != pafs.FileType.File or self.is_plain(info.path):
            return info
        size = self._registry.plaintext_size(info.path, info.size)
        return pafs.FileInfo(info.path, pafs.FileType.File, mtime_ns=info.mtime_ns, size=size)

    def _open_reader(self, path: str) -> pa.NativeFile:
        key_metadata = self._registry.for_reading(
            path, lambda: self._base.get_file_info(path).type != pafs.FileType.NotFound
        )
        reader = _EncryptedInputFile(self._base.open_input_file(path), key_metadata, _canonical(path))
        return pa.PythonFile(reader, mode="r")

    # -- FileSystemHandler (called by Arrow, from any of its threads)
    @_arrow_entry
    def get_type_name(self) -> str:
        return f"icecrypt+{self._base.type_name}"

    @_arrow_entry
    def normalize_path(self, path: str) -> str:
        return self._base.normalize_path(path)

    @_arrow_entry
    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return [self._file_info(info) for info in self._base.get_file_info(paths)]

    @_arrow_entry
    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return [self._file_info(info) for info in self._base.get_file_info(selector)]

    @_arrow_entry
    def create_dir(self, path: str, recursive: bool) -> None:
        self._base.create_dir(path, recursive=recursive)

    @_arrow_entry
    def delete_dir(self, path: str) -> None:
        self._base.delete_dir(path)
        self._registry.forget(path, tree=True, itself=True)

    @_arrow_entry
    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._base.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)
        self._registry.forget(path, tree=True, itself=False)

    @_arrow_entry
    def delete_root_dir_contents(self) -> None:
        self._base.delete_dir_contents("/", accept_root_dir=True)
        self._registry.clear()

    @_arrow_entry
    def delete_file(self, path: str) -> None:
        self._base.delete_file(path)
        self._registry.forget(path, tree=False, itself=True)

    @_arrow_entry
    def move(self, src: str, dest: str) -> None:
        self._registry.check_same_side(src, dest)
        self._base.move(src, dest)
        self._registry.carry(src, dest, move=True)

    @_arrow_entry
    def copy_file(self, src: str, dest: str) -> None:
        self._registry.check_same_side(src, dest)
        self._base.copy_file(src, dest)
        self._registry.carry(src, dest, move=False)

    @_arrow_entry
    def open_input_stream(self, path: str) -> pa.NativeFile:
        if self.is_plain(path):
            return self._base.open_input_stream(path, compression=None)
        return self._open_reader(path)

    @_arrow_entry
    def open_input_file(self, path: str) -> pa.NativeFile:
        if self.is_plain(path):
            return self._base.open_input_file(path)
        return self._open_reader(path)

    @_arrow_entry
    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        if self.is_plain(path):
            return self._base.open_output_stream(path, compression=None, metadata=metadata)
        stream = _EncryptedOutputStream(self, path, self._registry.new_file_key(), metadata)
        return pa.PythonFile(stream, mode="w")

    @_arrow_entry
    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        if self.is_plain(path):
            return self._base.open_append_stream(path, compression=None, metadata=metadata)
        raise io.UnsupportedOperation(
            f"{path}: cannot append to an encrypted file (its last AGS1 block and its key "
            "metadata would have to be rewritten); write a new file instead"
        )


class EncryptedFileSystem:
    """Factory of AGS1-encrypting pyarrow filesystems (see the module docstring)."""

    @staticmethod
    def wrap(
        base_fs: pafs.FileSystem,
        manager: EncryptionManager | None = None,
        keys: Mapping[Any, KeyMetadataLike] | KeyResolver | None = None,
        *,
        plain_prefixes: Iterable[str] = (),
    ) -> pafs.PyFileSystem:
        """A :class:`pyarrow.fs.PyFileSystem` that encrypts ``base_fs``'s files; its
        ``handler`` is an :class:`EncryptedFileSystemHandler`."""
        return pafs.PyFileSystem(
            EncryptedFileSystemHandler(base_fs, manager, keys, plain_prefixes=plain_prefixes)
        )


# --------------------------------------------------------------------------- process exit


class _ExitGuard:
    """What Arrow's threads hold of this module, and the Python calls they are making.

    Arrow's C++ objects own Python objects of this module — the handler (held by the
    ``PyFileSystem``), the file objects behind each :class:`pyarrow.PythonFile`, every
    buffer their reads returned — and drop them from whichever pool thread finishes with
    them last, sometimes a few milliseconds *after* the call that started the work
    (``Dataset.to_table``...) has returned.  A drop needs the GIL.  If the interpreter is
    finalizing by then, CPython (< 3.14) ends that thread with ``pthread_exit``, whose
    forced unwinding runs into a ``noexcept`` C++ destructor (``~OwnedRefNoGIL``,
    ``~PyBuffer``): ``std::terminate``, and the process aborts with "terminate called
    without an active exception" (apache/arrow#34314; seen with gdb: the aborting thread
    is an Arrow pool worker in ``~OwnedRefNoGIL`` -> the file object's ``close`` ->
    ``PyEval_RestoreThread`` -> ``take_gil`` -> ``PyThread_exit_thread`` while the main
    thread is in ``Py_FinalizeEx``).  :func:`_quiesce_at_exit` waits, at exit and before
    finalization, until those objects are gone, or no call is in flight and nothing has
    changed for :data:`EXIT_QUIET` seconds (what is still held then belongs to Python
    objects, which finalization releases on the main thread).  Work Arrow still runs
    silently past that — a scan abandoned half-way, decoding for longer than that — is
    not covered.

    Bookkeeping uses only operations that are atomic under the GIL (set and dict item
    stores and removals, attribute stores), so it is safe from any thread and from
    weakref callbacks.
    """

    def __init__(self) -> None:
        self.objects: dict[int, weakref.ref] = {}  # keyed by id(ref): referents may be unhashable
        self.calls: set[object] = set()
        self.last_change = time.monotonic()

    def track(self, obj: Any) -> Any:
        ref = weakref.ref(obj, self._released)
        self.objects[id(ref)] = ref
        self.last_change = time.monotonic()
        return obj

    def _released(self, ref: weakref.ref) -> None:
        self.objects.pop(id(ref), None)
        self.last_change = time.monotonic()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        token = object()
        self.calls.add(token)
        try:
            yield
        finally:
            self.calls.discard(token)
            self.last_change = time.monotonic()


_guard = _ExitGuard()


def _read_pool_buffer(reader: Any, pos: int, size: int, nbytes: int | None) -> pa.Buffer:
    """Up to ``nbytes`` (all when None or negative) plaintext bytes of ``reader`` (an
    Ags1Reader of a ``size``-byte plaintext) from ``pos``, in a buffer of Arrow's memory
    pool, registered with the exit guard.  The pool reuses its pages: fresh bytes
    objects (as Ags1Reader.read returns) faulted in 5x more pages per scan."""
    want = max(0, size - pos)
    if nbytes is not None and nbytes >= 0:
        want = min(want, nbytes)
    data = pa.allocate_buffer(want)
    reader.readinto_at(data, pos)
    return _guard.track(data)

#: longest wait at exit for Arrow threads still inside this module's code
EXIT_TIMEOUT = 10.0
#: objects still held after this long without any change are held by Python code
#: (a table, a variable) and are released by the main thread during finalization
EXIT_QUIET = 0.1
#: the most a single look of the exit hook adds to the quiet time: a longer gap between two
#: looks means this process was not running (a loaded machine, a paused virtual CPU), and
#: Arrow's threads, which had work left, may not have run either (a CI run of
#: tests/arrow/test_exit.py on a loaded 2-core VM once saw 1 abort in 50 exits while the
#: quiet time was wall-clock time; a stall is the likely cause, not reproduced since).
EXIT_GAP = 0.01


def _quiesce_at_exit(timeout: float = EXIT_TIMEOUT, quiet: float = EXIT_QUIET, guard: _ExitGuard = _guard) -> None:
    """Wait (GIL released) until Arrow's threads have finished their calls into this
    module and dropped what they held of it, or until no call is in flight and nothing
    has changed for ``quiet`` seconds of time in which this process ran (each look adds at
    most :data:`EXIT_GAP`); give up after ``timeout``.  Registered with :mod:`atexit`."""
    now = time.monotonic()
    deadline = now + timeout
    change, still = guard.last_change, now - guard.last_change
    while guard.objects or guard.calls:
        if now >= deadline or (not guard.calls and still >= quiet):
            return
        time.sleep(0.002)
        look = time.monotonic()
        if guard.last_change != change:
            change, still = guard.last_change, look - guard.last_change
        else:
            still += min(look - now, EXIT_GAP)
        now = look


atexit.register(_quiesce_at_exit)
