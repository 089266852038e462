"""What icecrypt's encrypting filesystems share, whatever filesystem API they serve.

:mod:`icecrypt.arrow` (a pyarrow ``FileSystemHandler``) and :mod:`icecrypt.fsspec` (an
fsspec ``AbstractFileSystem``) store every file as an AGS1 stream under its own key.
Both hold their keys in a :class:`KeyRegistry` and write through an
:class:`EncryptingStream`, so the rules below exist once:

- reads look a path up in the known keys, then in the resolver; a file without a key is
  refused (:class:`~icecrypt.EncryptionKeyNotFoundError`) unless it lies under one of the
  plain prefixes, which pass through unencrypted;
- writes draw a fresh key from the manager (after unpickling, a random key of the
  manager's data-key length) and record it, with its ``file_length``, only once the
  stream has closed cleanly;
- a copy shares its source's key metadata, a move carries it, a delete forgets it;
  moving or copying across the plain/encrypted boundary is refused;
- sizes are plaintext sizes computed from the trusted ``file_length`` (or the AGS1
  geometry of the stored size), never by decrypting;
- a write that fails, or is dropped unclosed, leaves no file that looks valid.

Paths are matched in a canonical form that each wrapper supplies (``canonical``): the
pyarrow wrapper uses the path as given without trailing slashes, the fsspec one the base
filesystem's own normalized path.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import threading
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from icecrypt import ags1
from icecrypt._paths import check_location_text, normalize_path
from icecrypt.errors import EncryptionKeyNotFoundError, FormatError, PathOutsideTableError
from icecrypt.keys.manager import AAD_PREFIX_LENGTH, EncryptionManager
from icecrypt.keys.metadata import StandardKeyMetadata

KeyMetadataLike = StandardKeyMetadata | bytes | bytearray | memoryview
#: ``resolver(path) -> key metadata or None``: looks a file's key up on demand
KeyResolver = Callable[[str], KeyMetadataLike | None]


def as_key_metadata(value: Any, path: str) -> StandardKeyMetadata:
    """``value`` (StandardKeyMetadata or its encoded bytes) as StandardKeyMetadata."""
    if isinstance(value, StandardKeyMetadata):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return StandardKeyMetadata.decode(value)
        except FormatError as exc:
            raise FormatError(f"{path}: malformed key metadata: {exc}") from None
    raise TypeError(f"{path}: key metadata must be StandardKeyMetadata or bytes, not {type(value).__name__}")


def strip_slashes(path: Any) -> str:
    """``path`` as ``str`` without trailing slashes (``/`` stays ``/``)."""
    text = os.fsdecode(os.fspath(path))
    stripped = text.rstrip("/")
    return stripped or text


def plaintext_size(ciphertext_size: int | None) -> int | None:
    """Plaintext size of a stored file of this size, or None when no AGS1 stream has it."""
    if ciphertext_size is None:
        return None
    try:
        return ags1.plaintext_length(ciphertext_size)
    except FormatError:
        return None


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix.rstrip("/") + "/")


def plain_form(name: str) -> str | None:
    """``name`` as plain prefixes are compared: normalized as table locations are
    (``icecrypt._paths``: ``.``/``..`` segments applied, ``//`` collapsed), so that
    ``D/plain/../secret/b`` is ``D/secret/b``.  None for a name no plain prefix may
    cover (control characters, a backslash, an encoded dot segment): such a file is
    always encrypted."""
    try:
        check_location_text(name)
    except PathOutsideTableError:
        return None
    return normalize_path(name)


class KeyRegistry:
    """The keys of one encrypting filesystem: known read keys, an optional resolver, the
    keys of files written through it, the plain prefixes, and the manager new keys come
    from.  Thread-safe.  ``canonical(path) -> str`` is the form paths are keyed by."""

    def __init__(
        self,
        manager: EncryptionManager | None,
        keys: Mapping[Any, KeyMetadataLike] | KeyResolver | None,
        plain_prefixes: Iterable[str],
        canonical: Callable[[Any], str] = strip_slashes,
    ):
        if isinstance(plain_prefixes, (str, bytes)):
            raise TypeError("plain_prefixes must be a collection of paths, not a single string")
        self.canonical = canonical
        self.manager = manager
        self.data_key_length = manager.data_key_length if manager is not None else None
        self.resolver: KeyResolver | None = None
        self.keys: dict[str, StandardKeyMetadata] = {}
        if callable(keys) and not isinstance(keys, Mapping):
            self.resolver = keys
        elif keys is not None:
            for path, value in keys.items():
                name = canonical(path)
                self.keys[name] = as_key_metadata(value, name)
        self.written: dict[str, StandardKeyMetadata] = {}
        prefixes = {canonical(p) for p in plain_prefixes}
        refused = sorted(p for p in prefixes if plain_form(p) is None)
        if refused:
            raise ValueError(f"plain_prefixes: {refused[0]!r} holds control characters, a backslash or an encoded dot segment")
        self.plain_prefixes = tuple(sorted({plain_form(p) for p in prefixes}))
        self.lock = threading.Lock()
        #: ``on_written(path, key_metadata)``, called when a written file is published
        self.on_written: Callable[[str, StandardKeyMetadata], Any] | None = None

    # -- pickling: the manager (KMS clients hold connections and locks) stays behind
    def __getstate__(self) -> dict[str, Any]:
        with self.lock:
            return {
                "data_key_length": self.data_key_length,
                "resolver": self.resolver,
                "keys": dict(self.keys),
                "written": dict(self.written),
                "plain_prefixes": self.plain_prefixes,
            }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.canonical = strip_slashes  # the owner sets its own again
        self.manager = None
        self.data_key_length = state["data_key_length"]
        self.resolver = state["resolver"]
        self.keys = state["keys"]
        self.written = state["written"]
        self.plain_prefixes = state["plain_prefixes"]
        self.lock = threading.Lock()
        self.on_written = None  # a callback stays with its process

    def snapshot(self) -> tuple[Any, ...]:
        """What two equal registries have in common (for ``__eq__`` of the wrappers)."""
        with self.lock:
            return (self.plain_prefixes, self.resolver, dict(self.keys))

    def __repr__(self) -> str:
        return f"<KeyRegistry keys={len(self.keys)} written={len(self.written)}>"

    # -- lookups
    def is_plain(self, path: Any) -> bool:
        """Whether ``path`` lies under one of the plain prefixes (stored unencrypted)."""
        name = plain_form(self.canonical(path))
        return name is not None and any(_under(name, p) for p in self.plain_prefixes)

    def find(self, path: Any) -> StandardKeyMetadata | None:
        """The key metadata of ``path``, or None when no key is known for it."""
        name = self.canonical(path)
        with self.lock:
            found = self.keys.get(name)
        if found is None and self.resolver is not None:
            value = self.resolver(name)
            if value is not None:
                found = as_key_metadata(value, name)
        return found

    def require(self, path: Any) -> StandardKeyMetadata:
        """The key metadata of ``path``; EncryptionKeyNotFoundError when there is none."""
        found = self.find(path)
        if found is None:
            raise EncryptionKeyNotFoundError(
                f"{self.canonical(path)}: no key metadata for this file; the encrypted filesystem "
                "refuses to read it (pass its key in keys=, or list its prefix in plain_prefixes=)"
            )
        return found

    def for_reading(self, path: Any, exists: Callable[[], bool]) -> StandardKeyMetadata:
        """The key to read ``path`` with: FileNotFoundError when neither the key nor the
        file exists, EncryptionKeyNotFoundError when only the file does."""
        found = self.find(path)
        if found is None:
            if not exists():
                raise FileNotFoundError(f"{self.canonical(path)}: no such file")
            return self.require(path)
        return found

    def plaintext_size(self, path: Any, stored_size: int | None) -> int | None:
        """The plaintext size of the encrypted file ``path`` stored in ``stored_size``
        bytes: from its key's trusted ``file_length`` when known, else from the AGS1
        geometry of the stored size (None when no AGS1 stream has that size)."""
        key_metadata = self.find(path)
        if key_metadata is not None and key_metadata.file_length is not None:
            try:
                return ags1.plaintext_length(key_metadata.file_length)
            except FormatError as exc:
                raise FormatError(
                    f"{self.canonical(path)}: key metadata has an impossible file_length: {exc}"
                ) from None
        return plaintext_size(stored_size)

    def written_keys(self) -> dict[str, StandardKeyMetadata]:
        with self.lock:
            return dict(self.written)

    def all_keys(self) -> dict[str, StandardKeyMetadata]:
        with self.lock:
            return {**self.keys, **self.written}

    # -- changes
    def add(self, keys: Mapping[Any, KeyMetadataLike]) -> None:
        converted = {self.canonical(p): as_key_metadata(v, self.canonical(p)) for p, v in keys.items()}
        with self.lock:
            self.keys.update(converted)

    def new_file_key(self) -> StandardKeyMetadata:
        if self.manager is not None:
            return self.manager.new_file_key()
        if self.data_key_length is None:
            raise ValueError(
                "this EncryptedFileSystem has no EncryptionManager: it cannot write encrypted files "
                "(pass manager=)"
            )
        # Unpickled: the same draw as EncryptionManager.new_file_key.
        return StandardKeyMetadata(os.urandom(self.data_key_length), os.urandom(AAD_PREFIX_LENGTH))

    def record_written(self, path: Any, key_metadata: StandardKeyMetadata) -> None:
        name = self.canonical(path)
        with self.lock:
            self.keys[name] = key_metadata
            self.written[name] = key_metadata

    def publish(self, path: Any, key_metadata: StandardKeyMetadata) -> None:
        """Record the key of a file that was just written, and pass it to ``on_written``."""
        self.record_written(path, key_metadata)
        if self.on_written is not None:
            self.on_written(self.canonical(path), key_metadata)

    def forget(self, path: Any, *, tree: bool, itself: bool) -> None:
        """Drop the keys of deleted files: ``path`` itself and/or everything under it."""
        name = self.canonical(path)
        with self.lock:
            for table in (self.keys, self.written):
                gone = [k for k in table if (itself and k == name) or (tree and _under(k, name) and k != name)]
                for key in gone:
                    del table[key]

    def clear(self) -> None:
        with self.lock:
            self.keys.clear()
            self.written.clear()

    def carry(self, src: Any, dest: Any, *, move: bool) -> None:
        """Give ``dest`` (and, for a directory, every path under it) the keys of ``src``:
        a copy shares its source's key metadata, a move takes it along."""
        source, target = self.canonical(src), self.canonical(dest)
        with self.lock:
            found = {k: v for k, v in self.keys.items() if _under(k, source)}
            if move:
                for k in found:
                    self.keys.pop(k, None)
                    self.written.pop(k, None)
            for k, v in found.items():
                self.keys[target + k[len(source) :]] = v
                self.written[target + k[len(source) :]] = v
        if not found and self.resolver is not None:
            resolved = self.find(source)
            if resolved is not None:
                self.record_written(target, resolved)

    def check_same_side(self, src: Any, dest: Any) -> None:
        if self.is_plain(src) != self.is_plain(dest):
            raise ValueError(
                f"cannot move or copy {src!r} to {dest!r}: one is under plain_prefixes and the other "
                "is not, so its bytes would be misread"
            )

    def save_manifest(
        self,
        path: Any,
        filesystem: Any,
        manager: EncryptionManager | None,
        all_keys: bool,
    ) -> None:
        """Write a key manifest of the written keys (``all_keys``: of every known key)."""
        from icecrypt.keys.manifest import write_key_manifest

        manager = manager or self.manager
        if manager is None:
            raise ValueError("save_key_manifest needs an EncryptionManager (this filesystem has none)")
        keys = self.all_keys() if all_keys else self.written_keys()
        write_key_manifest(path, keys, manager, filesystem=filesystem)



class KeyAccess:
    """The key API both wrappers expose, over their ``_registry`` (a :class:`KeyRegistry`)."""

    _registry: KeyRegistry

    @property
    def manager(self) -> EncryptionManager | None:
        """The encryption manager (None when not given, and after unpickling)."""
        return self._registry.manager

    @property
    def plain_prefixes(self) -> tuple[str, ...]:
        return self._registry.plain_prefixes

    def is_plain(self, path: str) -> bool:
        """Whether ``path`` lies under one of the plain prefixes (stored unencrypted)."""
        return self._registry.is_plain(path)

    def find_key_metadata(self, path: str) -> StandardKeyMetadata | None:
        """The key metadata of ``path``, or None when no key is known for it."""
        return self._registry.find(path)

    def key_metadata(self, path: str) -> StandardKeyMetadata:
        """The key metadata of ``path``; EncryptionKeyNotFoundError when there is none.
        For a file written through this filesystem it carries ``file_length``."""
        return self._registry.require(path)

    def written_keys(self) -> dict[str, StandardKeyMetadata]:
        """Key metadata (with ``file_length``) of every file this filesystem created:
        files written, and the targets of copies and moves of files whose key it knew."""
        return self._registry.written_keys()

class EncryptingStream(io.RawIOBase):
    """An :class:`~icecrypt.ags1.Ags1Writer` into a file of a base filesystem, published
    by a clean :meth:`close` (which records its key metadata in the registry) and
    discarded on any failure, on :meth:`abort`, and when dropped unclosed.

    Subclasses say how to reach the base filesystem: :meth:`_open_base` (a binary
    stream for a path), :meth:`_move_base`, :meth:`_delete_base`; ``renames``: whether
    the base's move is a rename, in which case the data goes to a hidden temporary file
    beside the target, renamed over it on close.  Otherwise the target itself is written
    and, on failure, made impossible for AGS1 (one byte more than whole sealed blocks)
    before it is closed and deleted, because some object stores publish whatever a
    closed stream holds.  :meth:`_call` wraps every entry (the pyarrow wrapper counts
    calls in flight for its exit hook).
    """

    renames: bool = False
    #: errors of the base stream that invalidating a failed file may meet and ignore
    base_errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, registry: KeyRegistry, path: str, key_metadata: StandardKeyMetadata):
        super().__init__()
        self._registry = registry
        self._path = path
        self._key_metadata = key_metadata
        if self.renames:
            directory, name = posixpath.split(path)
            self._target = posixpath.join(directory, f".{name}.{uuid.uuid4().hex}.icecrypt-tmp")
        else:
            self._target = path
        self._base_stream = self._open_base(self._target)
        try:
            self._writer = ags1.Ags1Writer(self._base_stream, key_metadata.encryption_key, key_metadata.aad_prefix)
        except BaseException:
            self._discard_base()
            raise
        self.name = path

    # -- what subclasses provide
    def _open_base(self, path: str) -> Any:
        raise NotImplementedError

    def _move_base(self, src: str, dest: str) -> None:
        raise NotImplementedError

    def _delete_base(self, path: str) -> None:
        raise NotImplementedError

    def _call(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    # -- the stream
    @property
    def path(self) -> str:
        return self._path

    @property
    def key_metadata(self) -> StandardKeyMetadata:
        """The file's key metadata; ``file_length`` is set once the stream has closed."""
        length = self._writer.ciphertext_length if hasattr(self, "_writer") else None
        return self._key_metadata.with_file_length(length) if length is not None else self._key_metadata

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        """Plaintext bytes written."""
        self._checkClosed()
        return self._writer.tell()

    def write(self, data: Any) -> int:
        with self._call():
            self._checkClosed()
            try:
                return self._writer.write(data)
            except BaseException:
                self.abort()
                raise

    def close(self) -> None:
        """Finish the AGS1 stream, publish the file and record its key metadata."""
        with self._call():
            if self.closed:
                return
            try:
                self._writer.close()
                self._base_stream.close()
                if self._target != self._path:
                    self._move_base(self._target, self._path)
                length = self._writer.ciphertext_length
                self._registry.publish(self._path, self._key_metadata.with_file_length(length))
            except BaseException:
                self.abort()
                raise
            finally:
                super().close()

    def abort(self) -> None:
        """Leave nothing that looks like a valid file (idempotent)."""
        if self.closed:
            return
        try:
            self._writer.abort()
            self._discard_base()
        finally:
            super().close()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def _delete_quietly(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self._delete_base(path)

    def _discard_base(self) -> None:
        if self._target != self._path:
            try:
                if not self._base_stream.closed:
                    self._base_stream.close()
            finally:
                self._delete_quietly(self._target)
            return
        if self._base_stream.closed:
            return
        # Closing the stream may publish what was written (an object store completes the
        # upload): first make its length impossible for AGS1 (a last block shorter than
        # nonce + tag), then publish and delete.  When closing fails, nothing was published.
        with contextlib.suppress(*self.base_errors):
            self._base_stream.write(b"\0")
        try:
            self._base_stream.close()
        except self.base_errors:
            return
        self._delete_quietly(self._target)

    def __del__(self) -> None:
        if hasattr(self, "_writer") and not self.closed:
            warnings.warn(f"unclosed encrypted output stream {self._path!r}: output discarded", ResourceWarning)
            self.abort()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} path={self._path!r} closed={self.closed}>"
