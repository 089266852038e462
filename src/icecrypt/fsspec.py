"""An fsspec filesystem that stores every file as an AGS1 stream (Iceberg's "AES GCM Stream").

``EncryptedFileSystem(fs, manager=None, keys=None)`` wraps any fsspec filesystem (an
instance, or a protocol name with ``target_options``) and encrypts what is written,
decrypts what is read.  pandas, Polars, DuckDB and Dask read and write through it as
through any fsspec filesystem.  The rules are those of :mod:`icecrypt.arrow`, from the
same code (``icecrypt._encfs``):

Keys
    Each file has its own :class:`~icecrypt.keys.StandardKeyMetadata`.  Reads look the
    path up in ``keys`` (a mapping or a resolver callable); writes draw a fresh key from
    ``manager`` and record it, with its ``file_length``, once the file has closed
    cleanly (``key_metadata(path)``, ``written_keys()``,
    ``save_key_manifest()``).  A file without a key is refused with
    :class:`~icecrypt.EncryptionKeyNotFoundError` unless it lies under one of
    ``plain_prefixes``.  Paths are the base filesystem's, keyed in its normalized form
    (``fs._strip_protocol``), so the keys of a local file are those the pyarrow wrapper
    uses for the same absolute path.

Reading
    ``open(path, "rb")`` returns a seekable file over an
    :class:`~icecrypt.ags1.Ags1Reader` that fetches only the AGS1 blocks a read covers
    (plus block 0): on the local filesystem (or a ``dir`` view of it) with ``pread``, on
    fsspec's wrapper of a pyarrow filesystem with its ``read_at``, elsewhere with one
    ranged ``cat_file`` of the base filesystem per run of blocks.  ``info``/``ls``/``size``
    report plaintext sizes computed from the trusted ``file_length``, never by
    decrypting.

Writing
    ``open(path, "wb")`` encrypts block by block.  On the local filesystem (or a ``dir``
    view of it) the data goes
    to a hidden temporary file beside the target, renamed over it on a clean close;
    elsewhere a failed file is made impossible for AGS1 before it is closed, then
    deleted.  Leaving a ``with`` block by an exception discards the file.  Appending and
    fsspec transactions (``autocommit=False``) are refused.

Protocol and caching
    Importing this module registers the protocol ``icecrypt`` with fsspec (as
    ``dir``/``simplecache`` are), so ``"icecrypt://"`` URLs and chained URLs
    (``"icecrypt::s3://bucket/x.parquet"``) work with ``storage_options`` carrying
    ``manager``/``keys``.  Instances are never cached or shared: every construction is a
    new filesystem with its own keys, identified by a random token (``__eq__``,
    ``__hash__``, dask tokenization), and no key material enters a token, a repr,
    ``storage_options`` or ``to_dict()``.

Pickling
    As the pyarrow wrapper: the base filesystem, the plain prefixes, the resolver and
    every known key travel (a pickle holds data keys: send it only over an encrypted
    channel); the manager does not, only its data-key length.
"""

from __future__ import annotations

import io
import os
import posixpath
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import fsspec
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from icecrypt import ags1
from icecrypt._encfs import EncryptingStream, KeyAccess, KeyMetadataLike, KeyRegistry, KeyResolver
from icecrypt.keys.manager import EncryptionManager
from icecrypt.keys.metadata import StandardKeyMetadata
from icecrypt.kms.base import KeyManagementClient

__all__ = ["PROTOCOL", "EncryptedFile", "EncryptedFileSystem", "read_key_manifest"]

#: the fsspec protocol name of :class:`EncryptedFileSystem`
PROTOCOL = "icecrypt"
_PREFIXES = (f"{PROTOCOL}://", f"{PROTOCOL}::")


def _is_local(fs: AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def _local_path(fs: AbstractFileSystem, path: str) -> str | None:
    """The operating system's path of ``path`` on ``fs`` when ``fs`` is the local
    filesystem or a ``dir`` view of it (read with pread, renamed with os.replace)."""
    if isinstance(fs, DirFileSystem) and _is_local(fs.fs):
        return fs.fs._strip_protocol(fs._join(path))
    if _is_local(fs):
        return path
    return None


# --------------------------------------------------------------------------- files


class _RangeSource:
    """Ciphertext of one base file, fetched by ranged ``cat_file`` calls (what
    :class:`~icecrypt.ags1.Ags1Reader` takes as a ``read_at`` source)."""

    def __init__(self, fs: AbstractFileSystem, path: str, size: int | None):
        self._fs = fs
        self._path = path
        self._size = size
        self.name = path

    def size(self) -> int | None:
        return self._size

    def read_at(self, nbytes: int, offset: int) -> bytes:
        return self._fs.cat_file(self._path, start=offset, end=offset + nbytes)


class EncryptedFile(io.RawIOBase):
    """A decrypting, seekable, read-only file of an :class:`EncryptedFileSystem`.

    Reads decrypt only the AGS1 blocks they cover (the first read also authenticates
    block 0); a failed read raises and returns nothing.  ``size`` is the plaintext size.
    ``read_at``/``readinto_at`` are positional and thread-safe.
    """

    def __init__(self, fs: EncryptedFileSystem, path: str, key_metadata: StandardKeyMetadata):
        super().__init__()
        base = fs.fs
        self._owned: Any = None
        source: Any = _local_path(base, path)  # read with pread, no shared position
        if source is None and isinstance(base, ArrowFSWrapper):
            # a pyarrow filesystem: its random-access file reads ranges with read_at (its
            # fsspec wrapper's cat_file cannot read a range that starts at 0)
            source = self._owned = base.fs.open_input_file(base._strip_protocol(path))
        elif source is None:
            source = _RangeSource(base, path, base.size(path))
        try:
            self._reader = ags1.Ags1Reader(
                source, key_metadata.encryption_key, key_metadata.aad_prefix, key_metadata.file_length, name=path
            )
        except BaseException:
            if self._owned is not None:
                self._owned.close()
            raise
        self.fs = fs
        self.path = path
        self.name = path
        self.mode = "rb"
        self.size = self._reader.size
        self._pos = 0
        self._arrow_tracked = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        self._pos = ags1.seek_position(self._pos, self.size, offset, whence)
        return self._pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    @property
    def loc(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        if size is None or size < 0:
            size = max(0, self.size - self._pos)
        data = self._reader.read_at(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def read_buffer(self, nbytes: int | None = -1) -> Any:
        """Like ``read()``, into a buffer of Arrow's memory pool (a
        :class:`pyarrow.Buffer`): what :class:`pyarrow.PythonFile` asks for when
        pyarrow reads through this file; the pool reuses its pages, where a fresh
        ``bytes`` per read costs page faults.

        The file and its buffers are then held by Arrow's threads, which must not drop
        them while the interpreter finalizes (apache/arrow#34314): they are registered
        with :mod:`icecrypt.arrow`'s exit hook, as that module's own files are."""
        from icecrypt.arrow import _guard, _read_pool_buffer

        if not self._arrow_tracked:
            _guard.track(self)
            self._arrow_tracked = True
        self._checkClosed()
        data = _read_pool_buffer(self._reader, self._pos, self.size, nbytes)
        self._pos += data.size
        return data

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        n = self._reader.readinto_at(buffer, self._pos)
        self._pos += n
        return n

    def read_at(self, offset: int, n: int) -> bytes:
        return self._reader.read_at(offset, n)

    def readinto_at(self, buffer: Any, offset: int) -> int:
        return self._reader.readinto_at(buffer, offset)

    def info(self) -> dict[str, Any]:
        return self.fs.info(self.path)

    def close(self) -> None:
        if not self.closed:
            try:
                self._reader.close()
                if self._owned is not None:
                    self._owned.close()
            finally:
                super().close()

    def __reduce__(self) -> Any:
        raise TypeError(f"{self.path}: an open encrypted file cannot be pickled (it holds its key)")

    def __repr__(self) -> str:
        return f"<icecrypt.fsspec.EncryptedFile path={self.path!r} size={self.size}>"


class _EncryptingFile(EncryptingStream):
    """A file written through an :class:`EncryptedFileSystem` (see
    ``icecrypt._encfs.EncryptingStream`` for when it is published)."""

    def __init__(self, fs: EncryptedFileSystem, path: str, key_metadata: StandardKeyMetadata):
        self.fs = fs
        self.renames = _local_path(fs.fs, path) is not None
        self.mode = "wb"
        super().__init__(fs._registry, path, key_metadata)

    def _open_base(self, path: str) -> Any:
        return self.fs.fs.open(path, "wb")

    def _move_base(self, src: str, dest: str) -> None:
        # os.replace, not fsspec's local mv (shutil.move), which would move the file
        # *into* a directory that has the target's name instead of failing
        base = self.fs.fs
        os.replace(_local_path(base, src), _local_path(base, dest))

    def _delete_base(self, path: str) -> None:
        self.fs.fs.rm_file(path)

    def __reduce__(self) -> Any:
        raise TypeError(f"{self.path}: an encrypted file being written cannot be pickled (it holds its key)")


# --------------------------------------------------------------------------- filesystem


class _Uncached(type(AbstractFileSystem)):  # type: ignore[misc]
    """Construction without fsspec's instance cache and argument tokenizing: every
    instance is new, its token random, and no argument (keys!) is hashed or kept."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        from fsspec.config import apply_config

        kwargs = apply_config(cls, kwargs)
        kwargs.pop("skip_instance_cache", None)
        obj = type.__call__(cls, *args, **kwargs)
        obj._fs_token_ = uuid.uuid4().hex
        obj.storage_args = ()
        obj.storage_options = {}
        return obj


class EncryptedFileSystem(KeyAccess, ChainedFileSystem, metaclass=_Uncached):
    """An fsspec filesystem storing every file of ``fs`` as an AGS1 stream.

    ``fs``: the base filesystem (an fsspec instance, or a protocol name; then
    ``target_options`` are its storage options).  ``manager``: source of per-file keys
    for writes and of the KMS for key manifests.  ``keys``: read keys, a mapping
    ``path -> StandardKeyMetadata`` (or encoded bytes) or a resolver callable.
    ``plain_prefixes``: paths of ``fs`` whose files are stored unencrypted.
    ``on_written(path, key_metadata)``: called as each written file is published — how
    keys get out of an instance that fsspec builds from a URL and ``storage_options``
    (``on_written=keys.__setitem__``), which the caller never sees.
    ``target_protocol``/``target_options``/``fo`` are the names fsspec's URL chaining
    passes (``"icecrypt::memory://..."``).
    """

    protocol = PROTOCOL
    cachable = False
    root_marker = ""

    def __init__(
        self,
        fs: AbstractFileSystem | str | None = None,
        manager: EncryptionManager | None = None,
        keys: Mapping[Any, KeyMetadataLike] | KeyResolver | None = None,
        *,
        plain_prefixes: Iterable[str] = (),
        on_written: Callable[[str, StandardKeyMetadata], Any] | None = None,
        target_protocol: str | None = None,
        target_options: Mapping[str, Any] | None = None,
        fo: str | None = None,
        **storage_options: Any,
    ):
        super().__init__(**storage_options)
        if isinstance(fs, str):
            if target_protocol is not None and target_protocol != fs:
                raise ValueError(f"fs={fs!r} and target_protocol={target_protocol!r} disagree")
            target_protocol, fs = fs, None
        if fs is None:
            fs = fsspec.filesystem(target_protocol or "file", **dict(target_options or {}))
        elif target_options:
            raise ValueError("target_options apply only when fs is a protocol name")
        if not isinstance(fs, AbstractFileSystem):
            raise TypeError(f"fs must be an fsspec filesystem or a protocol name, not {type(fs).__name__}")
        if isinstance(fs, EncryptedFileSystem):
            raise ValueError("fs is already an EncryptedFileSystem: files would be encrypted twice")
        if fs.async_impl and getattr(fs, "asynchronous", False):
            raise ValueError("fs must be usable synchronously (asynchronous=False)")
        self.fs = fs
        self._registry = KeyRegistry(manager, keys, plain_prefixes, self._canonical)
        self._registry.on_written = on_written

    # -- identity, pickling, serialization
    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.fs, self._registry.__getstate__())

    def to_dict(self, *, include_password: bool = True) -> dict[str, Any]:
        raise TypeError(
            "an icecrypt EncryptedFileSystem is not serialized to JSON/dict (it holds data keys); "
            "pickle it over an encrypted channel, or rebuild it from a key manifest"
        )

    def __repr__(self) -> str:
        registry = self._registry
        return (
            f"<icecrypt.fsspec.EncryptedFileSystem base={_protocol_name(self.fs)!r} "
            f"keys={len(registry.keys)} written={len(registry.written)} "
            f"plain_prefixes={list(registry.plain_prefixes)!r}>"
        )

    # -- paths
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = os.fsdecode(os.fspath(path))
        for prefix in _PREFIXES:
            if text.startswith(prefix):
                text = text[len(prefix) :]
                break
        stripped = text.rstrip("/")
        return stripped or text

    def unstrip_protocol(self, name: str) -> str:
        return f"{PROTOCOL}://{name}"

    def _base_path(self, path: Any) -> str:
        return self.fs._strip_protocol(self._strip_protocol(path))

    def _canonical(self, path: Any) -> str:
        """The form keys are recorded under: the base's normalized path, without trailing
        slashes (and, under a ``dir`` view, without leading ones: ``x`` and ``/x`` are
        one file there, and pyarrow's fsspec adapter passes the second)."""
        name = self._base_path(path)
        if isinstance(self.fs, DirFileSystem) and self.fs.path:
            name = name.lstrip("/")
        stripped = name.rstrip("/")
        return stripped or name

    # -- keys (the public API of icecrypt.arrow's handler)

    def add_keys(self, keys: Mapping[Any, KeyMetadataLike]) -> None:
        """Make more files readable (e.g. keys read from a key manifest)."""
        self._registry.add(keys)

    def save_key_manifest(
        self,
        path: str,
        *,
        filesystem: AbstractFileSystem | None = None,
        manager: EncryptionManager | None = None,
        all_keys: bool = False,
    ) -> None:
        """Write a key manifest (:func:`icecrypt.keys.manifest.write_key_manifest`) of the files
        written through this filesystem (``all_keys``: of every key it knows) to ``path``
        on ``filesystem`` (an fsspec filesystem, default the base one; never this
        encrypting one).  ``manager``: default this filesystem's own."""
        target = self.fs if filesystem is None else filesystem
        self._registry.save_manifest(*_manifest_location(target, path), manager, all_keys)

    # -- AbstractFileSystem: listing
    def _plain_info(self, info: dict[str, Any]) -> dict[str, Any]:
        if info.get("type") != "file" or self.is_plain(info["name"]):
            return info
        out = dict(info)
        out["size"] = self._registry.plaintext_size(info["name"], info.get("size"))
        return out

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        entries = self.fs.ls(self._base_path(path), detail=True, **kwargs)
        if not detail:
            return [entry["name"] for entry in entries]
        return [self._plain_info(entry) for entry in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._plain_info(self.fs.info(self._base_path(path), **kwargs))

    def created(self, path: str) -> Any:
        return self.fs.created(self._base_path(path))

    def modified(self, path: str) -> Any:
        return self.fs.modified(self._base_path(path))

    # -- directories
    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.fs.mkdir(self._base_path(path), create_parents=create_parents, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(self._base_path(path), exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        self.fs.rmdir(self._base_path(path))

    # -- file operations that keep keys consistent
    def rm_file(self, path: str) -> None:
        self.fs.rm_file(self._base_path(path))
        self._registry.forget(path, tree=False, itself=True)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = path if isinstance(path, list) else [path]
        self.fs.rm([self._base_path(p) for p in paths], recursive=recursive, maxdepth=maxdepth)
        for p in paths:
            self._registry.forget(p, tree=recursive and maxdepth is None, itself=True)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        self._registry.check_same_side(path1, path2)
        self.fs.cp_file(self._base_path(path1), self._base_path(path2), **kwargs)
        self._registry.carry(path1, path2, move=False)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        if isinstance(path1, list) or isinstance(path2, list):
            raise NotImplementedError(f"{PROTOCOL}: mv of several paths at once; move them one by one")
        self._registry.check_same_side(path1, path2)
        src, dest = self._canonical(path1), self._canonical(path2)
        if src == dest:
            return
        landing = dest
        if self.fs.isdir(dest):  # fsspec moves into an existing directory (as mv(1) does)
            landing = posixpath.join(dest, posixpath.basename(src))
        self.fs.mv(src, dest, recursive=recursive, maxdepth=maxdepth, **kwargs)
        self._registry.carry(src, landing, move=True)

    # -- files
    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        name = self._base_path(path)
        if self.is_plain(name):
            return self.fs.open(
                name, mode, block_size=block_size, cache_options=cache_options, autocommit=autocommit, **kwargs
            )
        if mode == "rb":
            key_metadata = self._registry.for_reading(name, lambda: self.fs.exists(name))
            return EncryptedFile(self, name, key_metadata)
        if mode in ("wb", "xb"):
            if not autocommit:
                raise io.UnsupportedOperation(
                    f"{name}: an encrypted file is published when it closes; fsspec transactions "
                    "(autocommit=False) are not supported"
                )
            if mode == "xb" and self.fs.exists(name):
                raise FileExistsError(f"{name}: file exists")
            return _EncryptingFile(self, name, self._registry.new_file_key())
        if "a" in mode:
            raise io.UnsupportedOperation(
                f"{name}: cannot append to an encrypted file (its last AGS1 block and its key "
                "metadata would have to be rewritten); write a new file instead"
            )
        raise io.UnsupportedOperation(f"{name}: mode {mode!r} is not supported by an encrypted filesystem")

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        name = self._base_path(path)
        if self.is_plain(name):
            return self.fs.cat_file(name, start=start, end=end, **kwargs)
        with self._open(name, "rb") as f:
            size = f.size
            first = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
            last = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
            return f.read_at(first, max(0, last - first))


def _protocol_name(fs: AbstractFileSystem) -> str:
    protocol = fs.protocol
    return protocol if isinstance(protocol, str) else protocol[0]


def _rebuild(base: AbstractFileSystem, state: dict[str, Any]) -> EncryptedFileSystem:
    fs = EncryptedFileSystem(base)
    registry = KeyRegistry.__new__(KeyRegistry)
    registry.__setstate__(state)
    registry.canonical = fs._canonical
    fs._registry = registry
    return fs


def _manifest_location(filesystem: Any, path: str) -> tuple[Any, Any]:
    """``(path, filesystem)`` as :mod:`icecrypt.keys.manifest` takes them: a local path
    with no filesystem (written atomically), or a pyarrow view of an fsspec filesystem."""
    if isinstance(filesystem, EncryptedFileSystem):
        raise ValueError(
            "a key manifest must not be written through an EncryptedFileSystem (its keys are "
            "already wrapped, and it could not be read back without a key); pass its base filesystem"
        )
    if not isinstance(filesystem, AbstractFileSystem):
        return path, filesystem  # a pyarrow filesystem, or None
    name = filesystem._strip_protocol(path)
    local = _local_path(filesystem, name)
    if local is not None:
        return local, None  # written atomically, mode 0600
    import pyarrow.fs as pafs

    return name, pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))


def read_key_manifest(
    path: str,
    kms: KeyManagementClient,
    *,
    table_key_id: str | None = None,
    filesystem: AbstractFileSystem | None = None,
) -> dict[str, StandardKeyMetadata]:
    """:func:`icecrypt.keys.manifest.read_key_manifest` of a manifest on an fsspec filesystem
    (default: the local one); ``table_key_id`` is the master key the manifest must be
    wrapped under (pass it: see there)."""
    from icecrypt.keys.manifest import read_key_manifest as read

    name, target = _manifest_location(filesystem if filesystem is not None else LocalFileSystem(), path)
    return read(name, kms, table_key_id=table_key_id, filesystem=target)


fsspec.register_implementation(PROTOCOL, EncryptedFileSystem, clobber=True)
