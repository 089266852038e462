"""Where the read path touches storage: location mapping, encrypted and plaintext Avro
container files (manifest lists, manifests), small whole files (Puffin), and the errors
that name the file.

A table records absolute locations (``s3://bucket/table/data/...``).  :class:`Locations`
turns them into paths on the pyarrow filesystem the table is read through, after an
optional prefix rewrite (``location_map``) for tables that moved.

Every reader here takes the table's mode: in an encrypted table a file must come with key
metadata holding ``file_length`` (the trusted ciphertext length, SPEC.md §1.4) and must be
an AGS1 stream; a plaintext file there is a :class:`PlaintextFileError`, never read.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow.fs as pafs

from icecrypt import ags1
from icecrypt.errors import DecryptionError, FormatError
from icecrypt.keys import StandardKeyMetadata

__all__ = [
    "Locations",
    "PlaintextFileError",
    "file_key_metadata",
    "open_avro",
    "open_plain_avro",
    "read_small_file",
    "read_whole",
    "reading",
]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_AGS1_MAGIC = b"AGS1"

#: first bytes of files that are plaintext where an encrypted file is expected
_PLAINTEXT_MAGICS = {b"Obj\x01": "a plaintext Avro file", b"PAR1": "a plaintext Parquet file", b"PFA1": "a plaintext Puffin file"}


class PlaintextFileError(FormatError):
    """A file of an encrypted table is stored or referenced without encryption: no key
    metadata where the table needs it, or plaintext bytes where an encrypted file is
    expected.  Never read (fail closed)."""


class Locations:
    """Maps locations recorded in table metadata to paths on ``filesystem``.

    ``location_map`` rewrites prefixes (longest match first, on path boundaries), e.g.
    ``{"s3://icecrypt-golden/t": "/data/t"}``.  After that, ``file:`` URIs become local
    paths; other URIs (``s3://bucket/key``) lose their scheme (``bucket/key``, what
    pyarrow's S3/GCS filesystems expect), which the local filesystem refuses.
    Picklable (pyarrow filesystems pickle), so executors can resolve paths too.
    """

    def __init__(self, filesystem: pafs.FileSystem | None = None, location_map: Mapping[str, str] | None = None):
        if filesystem is not None and not isinstance(filesystem, pafs.FileSystem):
            raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem, not {type(filesystem).__name__}")
        self.filesystem: pafs.FileSystem = filesystem if filesystem is not None else pafs.LocalFileSystem()
        self.location_map: dict[str, str] = {}
        for prefix, target in (location_map or {}).items():
            if not isinstance(prefix, str) or not isinstance(target, str) or not prefix:
                raise TypeError("location_map must map non-empty str prefixes to str targets")
            self.location_map[prefix.rstrip("/") or prefix] = os.fspath(target).rstrip("/") or "/"
        # longest prefix first, so nested mappings pick the most specific one
        self._prefixes = sorted(self.location_map, key=len, reverse=True)
        self._local = isinstance(self.filesystem, pafs.LocalFileSystem)

    def map_location(self, location: str) -> str:
        """``location`` with the ``location_map`` applied (still a location, not a path)."""
        for prefix in self._prefixes:
            if location == prefix or location.startswith(prefix + "/"):
                return self.location_map[prefix] + location[len(prefix) :]
        return location

    def to_fs_path(self, location: str | os.PathLike[str]) -> str:
        """The path of ``location`` on ``filesystem``."""
        mapped = self.map_location(os.fspath(location))
        match = _SCHEME.match(mapped)
        if match is None or len(match.group(1)) == 1:  # no scheme (a Windows drive letter is none)
            return os.path.abspath(mapped) if self._local else mapped
        scheme = match.group(1).lower()
        rest = mapped[match.end() :]
        if scheme == "file":
            # file:///abs, file:/abs, file://localhost/abs
            if rest.startswith("//"):
                rest = rest[2:]
                rest = rest[rest.index("/") :] if "/" in rest else "/"
            return rest
        if self._local:
            raise ValueError(
                f"{location}: a {scheme}:// location cannot be read from the local filesystem; "
                "pass the filesystem that holds it, or a location_map to where it was copied"
            )
        return rest.removeprefix("//")

    def __getstate__(self) -> dict[str, Any]:
        return {"filesystem": self.filesystem, "location_map": self.location_map}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["filesystem"], state["location_map"])

    def __repr__(self) -> str:
        return f"<Locations filesystem={type(self.filesystem).__name__} location_map={self.location_map!r}>"


# --- errors -------------------------------------------------------------------------------


def _magic(filesystem: pafs.FileSystem, path: str) -> bytes:
    try:
        with filesystem.open_input_file(path) as f:
            return f.read(4)
    except OSError:
        return b""


@contextlib.contextmanager
def reading(what: str, location: str, filesystem: pafs.FileSystem, path: str, *, encrypted: bool) -> Iterator[None]:
    """Name the file in what goes wrong while reading it.

    A missing file becomes ``FileNotFoundError("<what> <location> is missing")``; a file
    that fails to decrypt in an encrypted table but starts like a plaintext file becomes
    :class:`PlaintextFileError`; other icecrypt errors get the location in front unless
    they already name the path.
    """
    try:
        yield
    except FileNotFoundError as exc:
        raise FileNotFoundError(exc.errno, f"{what} {location} is missing ({path})") from exc
    except PlaintextFileError:
        raise
    except DecryptionError as exc:
        if encrypted:
            kind = _PLAINTEXT_MAGICS.get(_magic(filesystem, path))
            if kind is not None:
                raise PlaintextFileError(
                    f"{what} {location} is {kind}, but the table is encrypted (refused)"
                ) from exc
        message = str(exc)
        if location in message or path in message:
            raise
        raise type(exc)(f"{what} {location}: {message}") from exc


def file_key_metadata(raw: Any, what: str, location: str, *, encrypted: bool, needs_length: bool) -> StandardKeyMetadata | None:
    """The key metadata of a file referenced by a manifest or manifest list.

    In an encrypted table it must be present (else :class:`PlaintextFileError`),
    decodable, and for AGS1 files carry ``file_length``; in a plaintext table it must be
    absent (an encrypted file in a table without a key could not be read anyway).
    """
    if raw is None:
        if encrypted:
            raise PlaintextFileError(f"{what} {location} has no key metadata, but the table is encrypted (refused)")
        return None
    if not encrypted:
        raise FormatError(f"{what} {location} has key metadata, but the table has no encryption.key-id")
    try:
        km = raw if isinstance(raw, StandardKeyMetadata) else StandardKeyMetadata.decode(raw)
    except FormatError as exc:
        raise FormatError(f"{what} {location}: malformed key metadata ({exc})") from None
    if needs_length and km.file_length is None:
        raise FormatError(f"{what} {location}: key metadata has no file_length (needed to authenticate an AGS1 file)")
    return km


# --- Avro container files -------------------------------------------------------------------


def open_plain_avro(what: str, location: str, filesystem: pafs.FileSystem, path: str, *, kind: str) -> Any:
    """The records of an Avro file of a plaintext table, read with the same checks as
    an encrypted table's (schema, per-block budgets: ``icecrypt._avro_guard``); an AGS1
    file is refused (the table has no key for it)."""
    from icecrypt.avro import _unencrypted_records

    try:
        return _unencrypted_records(path, filesystem, kind=kind)
    except FormatError as exc:
        if _magic(filesystem, path) == _AGS1_MAGIC:  # not an Avro header: say why
            raise FormatError(f"{what} {location} is encrypted (AGS1), but the table has no encryption.key-id") from exc
        raise


@contextlib.contextmanager
def open_avro(
    what: str,
    location: str,
    locations: Locations,
    key_metadata: StandardKeyMetadata | None,
    *,
    encrypted: bool,
) -> Iterator[Any]:
    """The records of an Avro container file (``.schema``, ``.metadata``, iterable).

    Encrypted tables read through :func:`icecrypt.avro.read_records` (AGS1, trusted
    length); plaintext tables read plain Avro and refuse an AGS1 file.  Either way the
    schema must be one Iceberg writes for manifests and manifest lists and every block
    is decoded under a budget (``icecrypt._avro_guard``).  Errors, also those raised
    while iterating inside the ``with`` block, name the file.
    """
    fs = locations.filesystem
    path = locations.to_fs_path(location)
    with reading(what, location, fs, path, encrypted=encrypted):
        if encrypted:
            from icecrypt.avro import _records

            if key_metadata is None:
                raise PlaintextFileError(f"{what} {location} has no key metadata, but the table is encrypted (refused)")
            records = _records(path, key_metadata, fs, kind="metadata")
        else:
            records = open_plain_avro(what, location, fs, path, kind="metadata")
        try:
            yield records
        finally:
            records.close()


def read_small_file(
    what: str, location: str, locations: Locations, key_metadata: StandardKeyMetadata | None, *, encrypted: bool
) -> bytes:
    """The whole (decrypted and authenticated) content of a small file such as a Puffin
    file of deletion vectors: AGS1 with the trusted length in an encrypted table."""
    fs = locations.filesystem
    path = locations.to_fs_path(location)
    with reading(what, location, fs, path, encrypted=encrypted):
        if encrypted and key_metadata is None:
            raise PlaintextFileError(f"{what} {location} has no key metadata, but the table is encrypted (refused)")
        with fs.open_input_file(path) as f:
            data = read_whole(f, f"{what} {location}", key_metadata.file_length if encrypted else None)  # type: ignore[union-attr]
        if not encrypted:
            if data[:4] == _AGS1_MAGIC:
                raise FormatError(f"{what} {location} is encrypted (AGS1), but the table has no encryption.key-id")
            return data
        return ags1.decrypt(data, key_metadata.encryption_key, key_metadata.aad_prefix, length=key_metadata.file_length)  # type: ignore[union-attr]


def read_whole(f: Any, name: str, length: int | None) -> bytes:
    """All bytes of the open file ``f``; with a trusted ``length`` (the ``file_length``
    of its key metadata) the stored size is compared with it first, so a file swapped
    for a larger one is refused before it is read into memory."""
    if length is not None:
        stored = f.size()
        if stored != length:
            what = "truncated" if stored < length else "longer than its key metadata says"
            raise FormatError(f"{name}: file is {what}: {stored} bytes, expected {length}")
    return f.read()
