"""Finding and parsing table metadata (``metadata.json``), and the snapshot model.

A table is loaded from a metadata file (Java catalogs write
``<NNNNN>-<uuid>.metadata.json``, the Hadoop layout used here ``v<N>.metadata.json``) or
from a table directory, where ``metadata/version-hint.text`` names the version and newer
``v<N>.metadata.json`` files are probed for (the hint may lag behind a commit).

The raw JSON is kept as read, in order and with every field: PyIceberg's 0.12 model,
used for schemas and partition specs, drops ``encryption-keys`` and the snapshots'
``key-id``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import re
import zlib
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

from icecrypt._limits import MAX_METADATA_BYTES_ENV, max_metadata_bytes
from icecrypt.errors import FormatError

__all__ = [
    "AUTHENTICATOR_FIELD",
    "VERSION_HINT",
    "MetadataDocument",
    "Snapshot",
    "parse_metadata",
    "read_metadata_file",
    "resolve_metadata_file",
    "serialize_metadata",
]

VERSION_HINT = "version-hint.text"
_HADOOP_NAME = re.compile(r"v([0-9]+)\.metadata\.json\Z")


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One snapshot of the table (``snapshots`` of ``metadata.json``).

    ``key_id`` is the id of the ``encryption-keys`` entry holding the manifest list's
    wrapped key metadata (None in plaintext tables).
    """

    snapshot_id: int
    parent_snapshot_id: int | None
    sequence_number: int
    timestamp_ms: int
    manifest_list: str
    schema_id: int | None
    operation: str | None
    summary: Mapping[str, str] = dataclasses.field(repr=False)
    key_id: str | None
    first_row_id: int | None = dataclasses.field(default=None, repr=False)
    added_rows: int | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Snapshot:
        try:
            summary = dict(raw.get("summary") or {})
            manifest_list = raw.get("manifest-list")
            if manifest_list is None:
                raise FormatError(
                    f"snapshot {raw.get('snapshot-id')}: no manifest-list (format v1 inline manifests are not supported)"
                )
            key_id = raw.get("key-id")
            if key_id is not None and not isinstance(key_id, str):
                raise FormatError(f"snapshot {raw.get('snapshot-id')}: key-id must be a string")
            return cls(
                snapshot_id=int(raw["snapshot-id"]),
                parent_snapshot_id=raw.get("parent-snapshot-id"),
                sequence_number=int(raw.get("sequence-number", 0)),
                timestamp_ms=int(raw["timestamp-ms"]),
                manifest_list=manifest_list,
                schema_id=raw.get("schema-id"),
                operation=summary.get("operation"),
                summary=summary,
                key_id=key_id,
                first_row_id=raw.get("first-row-id"),
                added_rows=raw.get("added-rows"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"malformed snapshot in table metadata: {exc!r}") from None


def _exists(filesystem: pafs.FileSystem, path: str) -> bool:
    return filesystem.get_file_info(path).type == pafs.FileType.File


def _latest_version(filesystem: pafs.FileSystem, metadata_dir: str) -> int | None:
    """The newest ``v<N>.metadata.json`` in ``metadata_dir``: the hint, then probing."""
    version = None
    try:
        with filesystem.open_input_file(posixpath.join(metadata_dir, VERSION_HINT)) as f:
            text = f.read(4096).decode("ascii", "replace").strip()  # a number: a larger file is no hint
        if text.isdigit() and _exists(filesystem, posixpath.join(metadata_dir, f"v{int(text)}.metadata.json")):
            version = int(text)
    except FileNotFoundError:
        pass
    if version is None:
        versions = [
            int(m.group(1))
            for info in filesystem.get_file_info(pafs.FileSelector(metadata_dir, allow_not_found=True))
            if (m := _HADOOP_NAME.match(info.base_name))
        ]
        if not versions:
            return None
        version = max(versions)
    while _exists(filesystem, posixpath.join(metadata_dir, f"v{version + 1}.metadata.json")):
        version += 1
    return version


def resolve_metadata_file(filesystem: pafs.FileSystem, path: str) -> str:
    """The metadata file to load for ``path``: the file itself, or the newest version of
    the table in directory ``path`` (the table directory or its ``metadata/``)."""
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.File:
        return path
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"table metadata {path} does not exist")
    for metadata_dir in (posixpath.join(path, "metadata"), path):
        version = _latest_version(filesystem, metadata_dir)
        if version is not None:
            return posixpath.join(metadata_dir, f"v{version}.metadata.json")
    raise FileNotFoundError(
        f"{path}: no table metadata found (neither metadata/{VERSION_HINT} nor metadata/v<N>.metadata.json); "
        "pass the metadata.json file of a table written by another catalog"
    )


_GZIP_MAGIC = b"\x1f\x8b"
_INFLATE_CHUNK = 1 << 20


def _inflate(f: pafs.NativeFile, path: str, first: bytes, limit: int, digest: Any) -> bytes:
    """The gzip members of ``f`` (``first``: its first bytes, already read and added to
    ``digest``) inflated chunk by chunk, refused as soon as they pass ``limit`` bytes;
    every stored byte read is added to ``digest``."""
    out = bytearray()
    pending, inflater = first, None
    while True:
        if not pending:
            pending = f.read(_INFLATE_CHUNK)
            if not pending:
                break
            digest.update(pending)
        if inflater is None:  # a member starts (more than one, as gzip.decompress reads them)
            if pending[:2] != _GZIP_MAGIC:
                raise FormatError(f"{path}: damaged gzip-compressed table metadata (bytes after the last member)")
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += inflater.decompress(pending, limit + 1 - len(out))
        if len(out) > limit:
            raise FormatError(
                f"{path}: gzip-compressed table metadata inflates to more than {limit} bytes "
                f"(the limit; set {MAX_METADATA_BYTES_ENV} to raise it)"
            )
        if inflater.eof:
            pending, inflater = inflater.unused_data, None
        else:
            pending = inflater.unconsumed_tail
    if inflater is not None:
        raise FormatError(f"{path}: damaged gzip-compressed table metadata (truncated)")
    return bytes(out)


#: the top-level field of metadata.json holding icecrypt's authenticator
#: (``icecrypt.table.commit.authenticity``); icecrypt writes it last
AUTHENTICATOR_FIELD = "icecrypt-authenticator"
_AUTHENTICATOR_MEMBER = b',"' + AUTHENTICATOR_FIELD.encode("ascii") + b'":'


class MetadataDocument(dict):
    """A parsed ``metadata.json``: the JSON object (a dict, field order kept), and

    - ``sha256``: the SHA-256 digest (hex) of the bytes stored in the file it was read
      from (the compressed bytes of a gzip-compressed file): what a catalog records at a
      commit and compares at every load;
    - ``body``: for a document whose text ends with an authenticator member, as icecrypt
      writes it, (SHA-256 of the text before that member, closed by ``}``; the text of the
      member to the end): what the authenticator covers, taken from the bytes read
      instead of serializing the document again (``icecrypt.table.commit.authenticity``).

    Documents built in memory are plain dicts."""

    __slots__ = ("sha256", "body")

    def __init__(self, content: dict[str, Any], sha256: str, body: tuple[bytes, bytes] | None = None) -> None:
        super().__init__(content)
        self.sha256 = sha256
        self.body = body


def _authenticated_body(data: bytes) -> tuple[bytes, bytes] | None:
    """(SHA-256 of ``data`` up to its last authenticator member, closed by ``}``; the
    member and what follows it), or None when ``data`` holds no such member."""
    cut = data.rfind(_AUTHENTICATOR_MEMBER)
    if cut < 0:
        return None
    digest = hashlib.sha256(memoryview(data)[:cut])
    digest.update(b"}")
    return digest.digest(), bytes(data[cut:])


def serialize_metadata(metadata: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON, fields in the order of the mapping (as Java's Jackson writes):
    the bytes of a metadata file icecrypt writes, and what its authenticator covers."""
    return json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def stored_digest(document: Any) -> str | None:
    """The SHA-256 (hex) of the stored bytes ``document`` was parsed from; None for a
    document built in memory."""
    return getattr(document, "sha256", None)


def read_metadata_file(filesystem: pafs.FileSystem, path: str) -> MetadataDocument:
    """Parse a ``metadata.json`` (gzip-compressed ones too), keeping field order; the
    result carries the SHA-256 of the stored bytes (:class:`MetadataDocument`).

    A file (or its decompressed content) larger than :func:`max_metadata_bytes` is
    refused before it is read whole or parsed."""
    limit = max_metadata_bytes()
    digest = hashlib.sha256()
    try:
        with filesystem.open_input_file(path) as f:
            first = f.read(min(limit + 1, _INFLATE_CHUNK))
            digest.update(first)
            if first[:2] == _GZIP_MAGIC:
                try:
                    data = _inflate(f, path, first, limit, digest)
                except zlib.error as exc:  # a corrupt deflate stream
                    raise FormatError(f"{path}: damaged gzip-compressed table metadata ({exc})") from None
            else:
                size = f.size()
                if size > limit:
                    raise FormatError(
                        f"{path}: table metadata of {size} bytes is larger than the limit of {limit} bytes "
                        f"(set {MAX_METADATA_BYTES_ENV} to raise it)"
                    )
                rest = f.read(limit + 1 - len(first))
                digest.update(rest)
                data = first + rest
                if len(data) > limit:  # the file grew while it was read
                    raise FormatError(f"{path}: table metadata is larger than the limit of {limit} bytes")
    except FileNotFoundError as exc:
        raise FileNotFoundError(exc.errno, f"table metadata {path} is missing") from exc
    try:
        result = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep for the parser
        raise FormatError(f"{path}: table metadata is not valid JSON ({exc})") from None
    if not isinstance(result, dict):
        raise FormatError(f"{path}: table metadata is not a JSON object")
    body = _authenticated_body(data) if AUTHENTICATOR_FIELD in result else None
    return MetadataDocument(result, digest.hexdigest(), body)


def parse_metadata(raw: Mapping[str, Any], path: str) -> Any:
    """PyIceberg's model of ``raw`` (schemas, specs, sort orders, snapshots)."""
    from pydantic import ValidationError
    from pyiceberg.exceptions import ValidationError as IcebergValidationError
    from pyiceberg.table.metadata import TableMetadataUtil

    try:
        return TableMetadataUtil.parse_obj(dict(raw))
    except (ValidationError, IcebergValidationError, ValueError) as exc:  # PyIceberg's is no ValueError
        raise FormatError(f"{path}: invalid table metadata ({exc})") from None
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        # PyIceberg's model validators index the document before validating it (a v1
        # document without "schema" raises KeyError): the document is malformed
        raise FormatError(f"{path}: invalid table metadata ({type(exc).__name__}: {exc})") from None
