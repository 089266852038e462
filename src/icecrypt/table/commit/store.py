"""Atomic commits of table metadata, Hadoop-catalog style.

Layout (Iceberg Java's ``HadoopTableOperations``)::

    <location>/metadata/v1.metadata.json, v2.metadata.json, ...
    <location>/metadata/version-hint.text          the latest version number, as text

A commit of version ``N+1`` creates ``v<N+1>.metadata.json`` **exclusively**: if the file
already exists another writer committed first, and the commit is retried on top of that
version or refused with :class:`~icecrypt.CommitConflictError` — it is never silently
overwritten.  The hint is updated afterwards; it is only a starting point, since readers
probe forward from it (a hint that lags after a crash or race is harmless).

How exclusive the creation is depends on the filesystem:

* local files (``LocalFileSystem``, or a ``SubTreeFileSystem`` over one): the metadata
  is written to a temporary file and hard-linked to its final name, which fails if the
  name exists (``icecrypt._atomic.AtomicFile`` with ``overwrite=False``).  Atomic.
* every other pyarrow filesystem (S3, GCS, HDFS, ...): pyarrow offers no create-if-absent
  call, so the commit checks that the name is free, writes a hidden temporary file,
  checks again and moves it into place (a failed or killed write never leaves a partial
  version under its final name), and reads the file back, once right away and once after
  updating the hint.  Two writers can still both pass
  the check within a few milliseconds; the read-back detects the loser whenever the
  winner's write lands before the loser's checks, but not always.  **Concurrent writers
  to one table on an object store must be serialized by the caller** (one committing
  process, or an external lock).

Tables in a catalog (``icecrypt.catalog``) commit differently, as Iceberg Java's
metastore tables do: the new version is written under a fresh name
``<NNNNN>-<uuid>.metadata.json`` (:func:`new_metadata_file_name`, which no other writer
can pick) and the catalog then swaps the table's metadata location from the base version
to it, compare-and-swap (a :class:`MetadataStore`).  Only the swap decides who won, so
catalog tables are safe with concurrent writers on any filesystem, object stores
included (:func:`commit_metadata_to_store`).
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import re
import secrets
import sys
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pyarrow.fs as pafs

from icecrypt._atomic import AtomicFile
from icecrypt.errors import CommitConflictError, NoSuchTableError
from icecrypt.table.commit.authenticity import Sealer, seal_or_plain
from icecrypt.table.files.metadata import serialize_metadata

__all__ = [
    "VERSION_HINT",
    "MetadataStore",
    "VersionExistsError",
    "commit_metadata",
    "commit_metadata_to_store",
    "create_table_metadata",
    "is_atomic",
    "check_not_ancestor",
    "check_unambiguous",
    "latest_metadata_location",
    "next_version",
    "metadata_file_name",
    "new_metadata_file_name",
    "read_metadata",
    "serialize_metadata",
    "version_of",
]

VERSION_HINT = "version-hint.text"

_HADOOP_NAME = re.compile(r"v([0-9]+)\.metadata\.json\Z")
_JAVA_NAME = re.compile(r"([0-9]+)-[0-9a-fA-F-]+\.metadata\.json\Z")


class VersionExistsError(Exception):
    """Internal: the version to be created exists (another writer committed it)."""


def metadata_file_name(version: int) -> str:
    return f"v{version}.metadata.json"


def new_metadata_file_name(version: int) -> str:
    """``<NNNNN>-<uuid>.metadata.json``: the name Iceberg Java's metastore catalogs (and
    PyIceberg) give version ``version`` of a catalog table's metadata."""
    return f"{version:05d}-{uuid.uuid4()}.metadata.json"


class MetadataStore(Protocol):
    """Where a catalog keeps a table's current metadata location (paths on the table's
    filesystem).  ``icecrypt.catalog`` implements it per table."""

    def current(self) -> str:
        """The current metadata file (NoSuchTableError if the table is gone)."""
        ...

    def swap(
        self, expected: str, new: str, *, metadata: Mapping[str, Any], rotate_to: str | None = None,
        retired: Sequence[tuple[str, str | None]] | None = None, digest: str | None = None,
    ) -> None:
        """Make ``new`` (whose content is ``metadata``) current if ``expected`` still is;
        CommitConflictError otherwise.  ``rotate_to``: the commit is the explicit
        master-key rotation to that key id (a change of ``encryption.key-id`` that the
        catalog refuses otherwise).  ``retired``: (KEK id, wrapped-bytes digest) of KEKs
        this commit's key rotation retired, for the catalog to remember.  ``digest``: the
        SHA-256 (hex) of the bytes of ``new``, recorded with the swap and checked at every
        load."""
        ...

    def create(self, new: str, *, metadata: Mapping[str, Any], digest: str | None = None) -> None:
        """Register a new table whose first metadata file is ``new`` (content ``metadata``,
        bytes of SHA-256 ``digest``)."""
        ...


def version_of(metadata_location: str) -> int:
    """The version number in a metadata file name: ``v<N>.metadata.json`` (Hadoop
    catalog) or ``<NNNNN>-<uuid>.metadata.json`` (Java's other catalogs; the first
    commit from here continues such a table with ``v<N+1>``)."""
    name = posixpath.basename(metadata_location)
    for pattern in (_HADOOP_NAME, _JAVA_NAME):
        match = pattern.match(name)
        if match:
            return int(match.group(1))
    raise ValueError(f"{metadata_location}: not a table metadata file name (v<N>.metadata.json)")


def read_metadata(filesystem: pafs.FileSystem, path: str) -> dict[str, Any]:
    """Parse a ``metadata.json``, keeping field order (the reader's parser, one for both)."""
    from icecrypt.table.files.metadata import read_metadata_file

    return read_metadata_file(filesystem, path)


def _local_path(filesystem: pafs.FileSystem, path: str) -> str | None:
    """The OS path behind ``path`` when ``filesystem`` is the local one, else None."""
    if isinstance(filesystem, pafs.LocalFileSystem):
        return path
    if isinstance(filesystem, pafs.SubTreeFileSystem) and isinstance(filesystem.base_fs, pafs.LocalFileSystem):
        return posixpath.join(filesystem.base_path, path.lstrip("/"))
    return None


def is_atomic(filesystem: pafs.FileSystem) -> bool:
    """Whether commits on ``filesystem`` are atomic (see the module docstring)."""
    return _local_path(filesystem, "/") is not None


def _exists(filesystem: pafs.FileSystem, path: str) -> bool:
    return filesystem.get_file_info(path).type != pafs.FileType.NotFound


def _read_all(filesystem: pafs.FileSystem, path: str, limit: int) -> bytes | None:
    """The bytes of ``path`` (None when it does not exist), at most ``limit + 1`` of them:
    a caller that knows how long the file should be never reads a larger one whole."""
    try:
        with filesystem.open_input_file(path) as f:
            return f.read(limit + 1)
    except FileNotFoundError:
        return None


def _landed(filesystem: pafs.FileSystem, path: str, payload: bytes) -> bool:
    """Whether ``path`` holds ``payload``; a failed read is tried again (twice), since a
    wrong answer either way loses a commit or deletes the files of a committed one."""
    for attempt in range(3):
        try:
            return _read_all(filesystem, path, len(payload)) == payload
        except OSError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _create_exclusive(filesystem: pafs.FileSystem, path: str, payload: bytes) -> None:
    local = _local_path(filesystem, path)
    if local is not None:
        with AtomicFile(local) as out:
            out.file.write(payload)
            try:
                out.commit(overwrite=False)
            except FileExistsError:
                raise VersionExistsError(path) from None
        return
    if _exists(filesystem, path):
        raise VersionExistsError(path)
    # Written under a hidden temporary name and moved into place, so that a write that
    # fails (or a writer killed) mid-way never leaves a partial version under its final
    # name, where readers probing forward would find it.
    tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{secrets.token_hex(8)}.tmp")
    try:
        with filesystem.open_output_stream(tmp) as out:
            out.write(payload)
        if _exists(filesystem, path):
            raise VersionExistsError(path)
        filesystem.move(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            if _exists(filesystem, tmp):
                filesystem.delete_file(tmp)
        raise
    if _read_all(filesystem, path, len(payload)) != payload:
        raise VersionExistsError(path)


#: a version hint is a decimal number; a longer file is not one (the listing decides)
_MAX_HINT_BYTES = 64


def _write_hint(filesystem: pafs.FileSystem, metadata_dir: str, version: int) -> None:
    path = posixpath.join(metadata_dir, VERSION_HINT)
    local = _local_path(filesystem, path)
    if local is not None:
        with AtomicFile(local) as out:
            out.file.write(str(version).encode("ascii"))
        return
    with filesystem.open_output_stream(path) as out:
        out.write(str(version).encode("ascii"))


def _hinted_version(filesystem: pafs.FileSystem, metadata_dir: str) -> int | None:
    raw = _read_all(filesystem, posixpath.join(metadata_dir, VERSION_HINT), _MAX_HINT_BYTES)
    if raw is not None and len(raw) <= _MAX_HINT_BYTES:
        text = raw.decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
    versions = []
    for info in filesystem.get_file_info(pafs.FileSelector(metadata_dir, allow_not_found=True)):
        match = _HADOOP_NAME.match(info.base_name)
        if match:
            versions.append(int(match.group(1)))
    return max(versions) if versions else None


def _logged_names(metadata: Mapping[str, Any]) -> set[str]:
    """File names of the versions ``metadata`` lists in its ``metadata-log`` (its
    ancestors; versions of one table share a metadata directory, so names suffice)."""
    names = set()
    for entry in metadata.get("metadata-log") or ():
        if isinstance(entry, Mapping) and isinstance(entry.get("metadata-file"), str):
            names.add(posixpath.basename(entry["metadata-file"].rstrip("/")))
    return names


def _version_error(message: str, *locations: str) -> Exception:
    from icecrypt.errors import TableVersionError

    return TableVersionError(message, metadata_locations=locations)


def _foreign_descendants(
    filesystem: pafs.FileSystem, metadata_location: str, metadata: Mapping[str, Any], *, forks: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """The ``<NNNNN>-<uuid>.metadata.json`` files beside ``metadata_location`` that
    descend from it (list it in their ``metadata-log``): versions a writer that names
    its files as a metastore catalog does (Iceberg Java committing to a path table)
    built on it, which the version hint does not name.  With ``forks``, also those that
    descend from one of its ancestors without being one (a branch beside it)."""
    metadata_dir, name = posixpath.split(metadata_location)
    logged = _logged_names(metadata)
    lineage = logged | {name} if forks else {name}
    own = _JAVA_NAME.match(name)
    # such a writer numbers a version one past its base; only after a v<N> (a number it
    # cannot parse) does it start again at 00000
    floor = int(own.group(1)) if own and not forks else -1
    found = []
    for info in filesystem.get_file_info(pafs.FileSelector(metadata_dir, allow_not_found=True)):
        other = info.base_name
        match = _JAVA_NAME.match(other)
        if other == name or other in logged or info.type != pafs.FileType.File or not match:
            continue
        if int(match.group(1)) <= floor:
            continue
        try:
            document = read_metadata(filesystem, info.path)
        except (OSError, ValueError):
            continue  # unreadable or damaged: no version anyone can build on
        if lineage & _logged_names(document):
            found.append((info.path, document))
    return found


def _newest_in_lineage(candidates: list[tuple[str, dict[str, Any]]], held: str) -> str:
    """Of versions that all descend from ``held``, the one that descends from all others;
    TableVersionError naming them when they fork."""
    for path, document in candidates:
        logged = _logged_names(document)
        if all(other == path or posixpath.basename(other) in logged for other, _ in candidates):
            return path
    names = ", ".join(sorted(path for path, _ in candidates))
    raise _version_error(
        f"{held}: several newer versions follow it and none follows the others ({names}); "
        "the current version is ambiguous: load the intended metadata file explicitly",
        held, *sorted(path for path, _ in candidates),
    )


def latest_metadata_location(
    filesystem: pafs.FileSystem, metadata_location: str, metadata: Mapping[str, Any] | None = None
) -> str:
    """The newest committed metadata file of the table ``metadata_location`` belongs to:
    the version hint, then forward probing for newer ``v<N>.metadata.json`` files.
    ``metadata_location`` itself when nothing newer exists.  ``metadata``: its content,
    when the caller holds it (read otherwise, when needed).

    Never an ancestor of ``metadata_location``: when that is a file named otherwise
    (``<NNNNN>-<uuid>.metadata.json``, as Iceberg Java's metastore catalogs name them, or
    any foreign name), the hinted ``v<N>`` counts only if it follows it (lists it in its
    metadata-log); one it lists as an ancestor is passed over, and one that forked from
    it is an ambiguity (TableVersionError naming both).  Newer ``<NNNNN>-<uuid>`` files
    that follow it are found by listing the metadata directory."""
    metadata_dir, name = posixpath.split(metadata_location)
    hinted = _hinted_version(filesystem, metadata_dir)
    match = _HADOOP_NAME.match(name)
    if match:
        own = int(match.group(1))
        version = own
        if hinted is not None and hinted > own and _exists(filesystem, posixpath.join(metadata_dir, metadata_file_name(hinted))):
            version = hinted
        while _exists(filesystem, posixpath.join(metadata_dir, metadata_file_name(version + 1))):
            version += 1
        if version == own:
            return metadata_location
        newest = metadata_file_name(version)
        if metadata is not None and newest in _logged_names(metadata):
            raise _version_error(
                f"{metadata_location}: the newest version by the version hint, {newest}, is an ancestor of it "
                "(listed in its metadata-log); refusing to go back",
                metadata_location, posixpath.join(metadata_dir, newest),
            )  # fmt: skip
        return posixpath.join(metadata_dir, newest)
    if metadata is None:
        metadata = read_metadata(filesystem, metadata_location)
    logged = _logged_names(metadata)
    candidates = _foreign_descendants(filesystem, metadata_location, metadata)
    if hinted is not None:
        version = hinted
        while _exists(filesystem, posixpath.join(metadata_dir, metadata_file_name(version + 1))):
            version += 1
        hinted_path = posixpath.join(metadata_dir, metadata_file_name(version))
        if metadata_file_name(version) not in logged and _exists(filesystem, hinted_path):
            document = read_metadata(filesystem, hinted_path)
            if name not in _logged_names(document):
                raise _version_error(
                    f"{metadata_location} and {hinted_path} (the newest by the version hint) both claim to be the "
                    "current version and neither lists the other in its metadata-log; load the intended one "
                    "explicitly",
                    metadata_location, hinted_path,
                )  # fmt: skip
            candidates.append((hinted_path, document))
    if not candidates:
        return metadata_location
    return _newest_in_lineage(candidates, metadata_location)


def check_not_ancestor(held_location: str, held: Mapping[str, Any], current: str) -> str:
    """``current`` (what a catalog says is current), unless it is an ancestor of the version
    held (listed in its metadata-log): TableVersionError naming both then, never going back."""
    if current != held_location and posixpath.basename(current) in _logged_names(held):
        raise _version_error(
            f"{held_location}: the catalog's current version {current} is an ancestor of it (listed in its "
            "metadata-log); refusing to go back (load the table again to accept the catalog's version)",
            held_location, current,
        )  # fmt: skip
    return current


def check_unambiguous(filesystem: pafs.FileSystem, metadata_location: str, metadata: Mapping[str, Any]) -> None:
    """Refuse (TableVersionError) while a version exists that the layout does not resolve
    to: a ``<NNNNN>-<uuid>.metadata.json`` that lists ``metadata_location`` or one of its
    ancestors in its metadata-log without being one of them (a newer version, or a branch
    beside the current one).  Maintenance that deletes files calls this first: what such a
    version references would otherwise look unreferenced."""
    newer = _foreign_descendants(filesystem, metadata_location, metadata, forks=True)
    if newer:
        others = ", ".join(sorted(path for path, _ in newer))
        raise _version_error(
            f"{metadata_location}: version(s) follow it, or branch off its history, that the version hint does "
            f"not name ({others}); the current version is ambiguous, nothing deleted: load the intended "
            "metadata file explicitly (and commit from it), or remove the stray one, first",
            metadata_location, *sorted(path for path, _ in newer),
        )  # fmt: skip


def next_version(base_location: str, base: Mapping[str, Any] | None) -> int:
    """The version number a path-table commit after ``base_location`` creates: ``N+1``
    after ``v<N>.metadata.json``; after a file named otherwise, one past both its own
    number and the newest ``v<N>`` in its metadata-log (its ancestors)."""
    name = posixpath.basename(base_location)
    match = _HADOOP_NAME.match(name)
    if match:
        return int(match.group(1)) + 1
    try:
        version = version_of(base_location)
    except ValueError:
        version = 0
    for logged in _logged_names(base or {}):
        found = _HADOOP_NAME.match(logged)
        if found:
            version = max(version, int(found.group(1)))
    return version + 1


def _still_ours(filesystem: pafs.FileSystem, path: str, payload: bytes) -> bool:
    """The second read-back of a non-atomic commit (a concurrent writer may have replaced
    the file).  The first one already found this commit in place, so a read that keeps
    failing leaves the commit standing (with a warning) rather than reporting a failure
    whose cleanup would delete the committed snapshot's files."""
    try:
        return _landed(filesystem, path, payload)
    except OSError as exc:
        warnings.warn(f"{path}: commit not re-checked for a concurrent replacement ({exc}); it stands", stacklevel=3)
        return True


def commit_metadata(
    filesystem: pafs.FileSystem, base_location: str, metadata: dict[str, Any], *, base: Mapping[str, Any] | None = None,
    sealer: Sealer | None = None,
) -> str:
    """Commit ``metadata`` as the version after ``base_location``; returns its path.
    ``base``: the content of ``base_location`` when the caller has it (else housekeeping
    reads it again if it needs it).  ``sealer``: authenticates the version
    (``authenticity``; ``metadata`` gets its authenticator).

    Raising means the commit did not happen: ``VersionExistsError`` when that version
    was created by someone else, and
    :class:`CommitConflictError` when, on a non-atomic filesystem, a concurrent writer
    replaced this commit's file after it was written (the table then holds the other
    commit; this one is not in it)."""
    metadata_dir = posixpath.dirname(base_location)
    if base is None and not _HADOOP_NAME.match(posixpath.basename(base_location)):
        base = read_metadata(filesystem, base_location)
    version = next_version(base_location, base)
    path = posixpath.join(metadata_dir, metadata_file_name(version))
    payload = seal_or_plain(metadata, posixpath.basename(path), sealer)
    try:
        _create_exclusive(filesystem, path, payload)
    except VersionExistsError:
        raise
    except BaseException:
        # a failure after the file landed (e.g. syncing its directory, or reading it
        # back) is a commit
        if not _landed(filesystem, path, payload):
            raise
    try:
        _write_hint(filesystem, metadata_dir, version)
    except Exception as exc:  # the hint is only where readers start probing
        warnings.warn(f"{metadata_dir}: version hint not updated ({exc}); the commit stands", stacklevel=2)
    if _local_path(filesystem, path) is None and not _still_ours(filesystem, path, payload):
        raise CommitConflictError(
            f"{path}: a concurrent writer replaced this commit (filesystem without atomic create); "
            "the table holds the other commit, this one was not applied"
        )
    _after_commit(filesystem, base_location, metadata, base)
    return path


def _after_commit(
    filesystem: pafs.FileSystem, base_location: str, metadata: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> None:
    """Metadata housekeeping (``write.metadata.delete-after-commit.enabled``); the commit
    stands whatever happens here."""
    from icecrypt.table.commit.housekeeping import delete_removed_metadata_files

    try:
        delete_removed_metadata_files(filesystem, base_location, base, metadata)
    except Exception as exc:
        warnings.warn(f"{base_location}: old metadata files not cleaned up after the commit ({exc})", stacklevel=3)


def create_table_metadata(
    filesystem: pafs.FileSystem, metadata_dir: str, metadata: dict[str, Any], *, sealer: Sealer | None = None
) -> str:
    """Write ``v1.metadata.json`` of a new table; FileExistsError if the table exists.
    ``sealer``: authenticates it (a new encrypted table's first version)."""
    filesystem.create_dir(metadata_dir, recursive=True)
    path = posixpath.join(metadata_dir, metadata_file_name(1))
    if _hinted_version(filesystem, metadata_dir) is not None:
        raise FileExistsError(f"{metadata_dir}: a table already exists here")
    try:
        _create_exclusive(filesystem, path, seal_or_plain(metadata, posixpath.basename(path), sealer))
    except VersionExistsError:
        raise FileExistsError(f"{path}: a table already exists here") from None
    _write_hint(filesystem, metadata_dir, 1)
    return path


def commit_metadata_to_store(
    filesystem: pafs.FileSystem,
    store: MetadataStore,
    base_location: str | None,
    metadata: Mapping[str, Any],
    *,
    metadata_dir: str | None = None,
    base: Mapping[str, Any] | None = None,
    rotate_to: str | None = None,
    retired: Sequence[tuple[str, str | None]] | None = None,
    sealer: Sealer | None = None,
) -> str:
    """Commit ``metadata`` of a catalog table as the version after ``base_location``
    (None: a new table, registered in ``store`` with ``store.create``); returns its path.
    The SHA-256 of the file's bytes goes to the store with the swap (the catalog records
    it; a file changed in place is refused at load).  ``sealer``: authenticates it.

    The file ``<NNNNN>-<uuid>.metadata.json`` is written in ``metadata_dir`` (default:
    beside ``base_location``), then ``store.swap(base_location, path)``.  A lost swap
    deletes the file and raises ``VersionExistsError`` (retryable, as when a Hadoop
    version exists).  When the swap fails otherwise, the store is asked again: a swap
    that landed anyway stands; one that surely did not is cleaned up; when the store
    cannot tell, the file is kept (it may be the table's current version) and the error
    propagates."""
    if metadata_dir is None:
        if base_location is None:
            raise ValueError("commit_metadata_to_store: a new table needs metadata_dir")
        metadata_dir = posixpath.dirname(base_location)
    try:
        version = version_of(base_location) + 1 if base_location is not None else 0
    except ValueError:  # a metadata file name of no known kind: count from its log
        version = len(metadata.get("metadata-log") or ())
    path = posixpath.join(metadata_dir, new_metadata_file_name(version))
    payload = seal_or_plain(metadata, posixpath.basename(path), sealer)
    digest = hashlib.sha256(payload).hexdigest()
    if base_location is None:
        filesystem.create_dir(metadata_dir, recursive=True)
    _create_exclusive(filesystem, path, payload)
    try:
        if base_location is None:
            store.create(path, metadata=metadata, digest=digest)
        else:
            extra = {"retired": retired} if retired else {}
            store.swap(base_location, path, metadata=metadata, rotate_to=rotate_to, digest=digest, **extra)
    except CommitConflictError as exc:
        _remove_quietly(filesystem, path)
        raise VersionExistsError(path) from exc
    except BaseException:
        landed = _is_current(store, path)
        if landed:
            if base_location is not None:
                _after_commit(filesystem, base_location, metadata, base)
            return path
        if landed is False:
            _remove_quietly(filesystem, path)
            raise
        # landed None: the outcome is unknown, the file is kept (it may be current), and
        # so is every file the commit references (outcome_unknown tells the committer)
        exc = sys.exc_info()[1]
        with contextlib.suppress(AttributeError):
            exc.icecrypt_commit_outcome_unknown = True  # type: ignore[union-attr]
        raise
    if base_location is not None:
        _after_commit(filesystem, base_location, metadata, base)
    return path


def outcome_unknown(exc: BaseException) -> bool:
    """Whether ``exc`` left a commit whose outcome nobody can tell (a catalog that could
    not say whether its swap landed): the files it references must then be kept."""
    return bool(getattr(exc, "icecrypt_commit_outcome_unknown", False))


def mark_files_needed(exc: BaseException) -> None:
    """Record on ``exc`` that the commit it interrupted landed, or may have (the
    committer found its version current, or could not tell): whoever handles it keeps
    the files that commit references."""
    with contextlib.suppress(AttributeError):
        exc.icecrypt_commit_files_needed = True  # type: ignore[attr-defined]


def files_needed(exc: BaseException) -> bool:
    """Whether the files of the commit ``exc`` interrupted must be kept: its outcome is
    unknown (:func:`outcome_unknown`) or it landed (:func:`mark_files_needed`)."""
    return outcome_unknown(exc) or bool(getattr(exc, "icecrypt_commit_files_needed", False))


def _is_current(store: MetadataStore, path: str) -> bool | None:
    try:
        return store.current() == path
    except NoSuchTableError:
        return False
    except Exception:
        return None


def _remove_quietly(filesystem: pafs.FileSystem, path: str) -> None:
    with contextlib.suppress(OSError):
        filesystem.delete_file(path)
