"""Options, file discovery and error reporting shared by the icecrypt Spark data sources.

Everything here runs in PySpark's Python worker processes (the planning worker on the
driver and the task workers on executors), so it only deals in picklable values: option
strings in, :class:`DataFile` records out.  Spark lower-cases option names; the names
below are lower-case.  Values are never echoed in messages for options that may hold
credentials (the KMS and storage properties).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow.fs as pafs

from icecrypt.errors import IcecryptError

__all__ = [
    "AGS1_BLOCK",
    "OPT_COLUMNS",
    "OPT_ENCRYPTION",
    "OPT_KEYS_MANIFEST",
    "OPT_KEYS_TRANSPORT",
    "OPT_KEYS_WRAPPED",
    "OPT_SPLIT_SIZE",
    "DataFile",
    "columns_option",
    "encrypted",
    "file_error",
    "key_transport",
    "kms_properties",
    "list_files",
    "output_location",
    "pack",
    "positive_int",
    "split_size",
]

#: plaintext bytes in one AGS1 block (SPEC.md §0): the smallest Avro split
AGS1_BLOCK = 1 << 20
DEFAULT_SPLIT_SIZE = 128 << 20

# --- option names (Spark passes them lower-cased) ---------------------------------------
OPT_PATH = "path"
OPT_PATHS = "paths"
#: ``none`` reads plaintext files (benchmarks, migrations); anything else is refused
OPT_ENCRYPTION = "encryption"
#: key-metadata manifest file (icecrypt.keys.manifest) holding every file's key metadata
OPT_KEYS_MANIFEST = "keys.manifest"
#: key metadata wrapped under a KMS master key, made by :func:`icecrypt.spark.wrap_keys`
OPT_KEYS_WRAPPED = "keys.wrapped"
#: how file keys reach the tasks: ``executor`` (default: every Python worker unwraps them
#: through the KMS) or ``task`` (the driver unwraps them; each task carries the DEKs of its
#: own files and executors never call the KMS); see :mod:`icecrypt.spark._keys`
OPT_KEYS_TRANSPORT = "keys.transport"
#: bytes per split (Avro: plaintext bytes; Parquet: stored file bytes, row groups by midpoint)
OPT_SPLIT_SIZE = "split-size"
#: comma-separated column names to read (projection; Spark does not push it to Python sources)
OPT_COLUMNS = "columns"

#: rows per Arrow batch a task yields
OPT_BATCH_SIZE = "batch-size"
#: writes: Avro codec (default deflate)
OPT_CODEC = "codec"
#: writes: Parquet compression codec (default zstd) and level
OPT_COMPRESSION = "compression"
OPT_COMPRESSION_LEVEL = "compression-level"
#: writes: rows per Parquet row group (default 1 Mi)
OPT_ROW_GROUP_SIZE = "row-group-size"
#: writes: names the job in its files' names (icecrypt.spark.write sets it to find them)
OPT_JOB_ID = "write.job-id"

#: every option the file data sources read themselves; the other options are KMS properties
#: (``icecrypt.iceberg`` strips its own table options before these)
SOURCE_OPTIONS = frozenset({
    OPT_PATH, OPT_PATHS, OPT_ENCRYPTION, OPT_KEYS_MANIFEST, OPT_KEYS_WRAPPED, OPT_KEYS_TRANSPORT, OPT_SPLIT_SIZE,
    OPT_COLUMNS,
    OPT_BATCH_SIZE, OPT_CODEC, OPT_COMPRESSION, OPT_COMPRESSION_LEVEL, OPT_ROW_GROUP_SIZE, OPT_JOB_ID,
})

ENCRYPTION_NONE = "none"
ENCRYPTION_STANDARD = "standard"

#: values of ``keys.transport``
TRANSPORT_EXECUTOR = "executor"
TRANSPORT_TASK = "task"

# Storage options (the names PyIceberg uses for its FileIO properties).
OPT_S3_ENDPOINT = "s3.endpoint"
OPT_S3_ACCESS_KEY_ID = "s3.access-key-id"
OPT_S3_SECRET_ACCESS_KEY = "s3.secret-access-key"
OPT_S3_SESSION_TOKEN = "s3.session-token"
OPT_S3_REGION = "s3.region"

# The memory KMS takes master keys as property values; as Spark options they would
# travel with every query, so they are refused (its public test keys are allowed).
_MEMORY_KEY_PREFIX = "encryption.kms.memory.key."

_SIZE = re.compile(r"\s*([0-9]+)\s*([kmgt]?)(i?b)?\s*\Z", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_GLOB = re.compile(r"[*?\[]")


def encrypted(options: Mapping[str, str]) -> bool:
    """Whether the files are encrypted: yes unless ``encryption=none`` is given explicitly."""
    mode = options.get(OPT_ENCRYPTION)
    if mode is None:
        return True
    mode = str(mode).strip().lower()
    if mode == ENCRYPTION_NONE:
        return False
    if mode == ENCRYPTION_STANDARD:
        return True
    raise ValueError(f"option {OPT_ENCRYPTION}={mode!r} is not supported (use {ENCRYPTION_STANDARD!r} or "
                     f"{ENCRYPTION_NONE!r})")


def key_transport(options: Mapping[str, str]) -> str:
    """Option ``keys.transport``: ``executor`` (the default) or ``task``."""
    raw = options.get(OPT_KEYS_TRANSPORT)
    if raw is None or not str(raw).strip():
        return TRANSPORT_EXECUTOR
    mode = str(raw).strip().lower()
    if mode not in (TRANSPORT_EXECUTOR, TRANSPORT_TASK):
        raise ValueError(f"option {OPT_KEYS_TRANSPORT}={raw!r} is not supported: use {TRANSPORT_EXECUTOR!r} (executors "
                         f"unwrap keys through the KMS) or {TRANSPORT_TASK!r} (the driver does; tasks carry data keys)")
    return mode


def kms_properties(options: Mapping[str, str]) -> dict[str, str]:
    """The options that are KMS properties (for :func:`icecrypt.kms.create_kms_client`).

    Every option the data sources do not read themselves is passed on: each KMS backend
    reads only its own names.  Master-key material of the memory KMS is refused (it
    would travel in every query's options).
    """
    props = {str(k).lower(): str(v) for k, v in options.items() if str(k).lower() not in SOURCE_OPTIONS}
    for name in props:
        if name.startswith(_MEMORY_KEY_PREFIX):
            raise ValueError(
                f"option {name!r} passes master-key material; Spark options travel with the query, so "
                "use a key service or a keystore file (encryption.kms-type=local) instead"
            )
    return props


def split_size(options: Mapping[str, str], default: int = DEFAULT_SPLIT_SIZE, minimum: int = AGS1_BLOCK) -> int:
    """``split-size`` in bytes (``134217728``, ``128m``, ``1GiB``); at least ``minimum``."""
    raw = options.get(OPT_SPLIT_SIZE)
    if raw is None or not str(raw).strip():
        return default
    match = _SIZE.match(str(raw))
    if not match:
        raise ValueError(f"option {OPT_SPLIT_SIZE}={raw!r} is not a size (e.g. 134217728, 128m, 1GiB)")
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if size < minimum:
        raise ValueError(f"option {OPT_SPLIT_SIZE}={raw!r} is below the minimum of {minimum} bytes")
    return size


def positive_int(options: Mapping[str, str], name: str, default: int) -> int:
    """Option ``name`` as a positive integer, ``default`` when unset."""
    raw = options.get(name)
    if raw is None or not str(raw).strip():
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"option {name}={raw!r} must be a positive integer")
    return value


def columns_option(options: Mapping[str, str]) -> list[str] | None:
    """The ``columns`` option as a list of names, or ``None`` (all columns)."""
    raw = options.get(OPT_COLUMNS)
    if raw is None:
        return None
    names = [name.strip() for name in str(raw).split(",")]
    if not all(names):
        raise ValueError(f"option {OPT_COLUMNS}={raw!r} has an empty column name")
    if len(set(names)) != len(names):
        raise ValueError(f"option {OPT_COLUMNS}={raw!r} names a column twice")
    return names


# --- file systems and paths -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One stored file: its pyarrow file system, path on it, URI and stored size."""

    filesystem: pafs.FileSystem
    path: str
    uri: str
    size: int

    def __repr__(self) -> str:
        return f"DataFile({self.uri!r}, size={self.size})"


def _s3_filesystem(options: Mapping[str, str]) -> pafs.FileSystem | None:
    """An S3FileSystem from the ``s3.*`` options, or None when none is set."""
    endpoint = options.get(OPT_S3_ENDPOINT)
    access = options.get(OPT_S3_ACCESS_KEY_ID)
    if endpoint is None and access is None and options.get(OPT_S3_REGION) is None:
        return None
    kwargs: dict[str, Any] = {}
    if endpoint:
        scheme, sep, rest = endpoint.partition("://")
        if sep:
            kwargs["scheme"] = scheme
            kwargs["endpoint_override"] = rest.rstrip("/")
        else:
            kwargs["endpoint_override"] = endpoint
    if access:
        kwargs["access_key"] = access
        kwargs["secret_key"] = options.get(OPT_S3_SECRET_ACCESS_KEY, "")
        if options.get(OPT_S3_SESSION_TOKEN):
            kwargs["session_token"] = options[OPT_S3_SESSION_TOKEN]
    kwargs["region"] = options.get(OPT_S3_REGION) or "us-east-1"
    return pafs.S3FileSystem(**kwargs)


def resolve(location: str, options: Mapping[str, str]) -> tuple[pafs.FileSystem, str, str]:
    """``(filesystem, path on it, uri prefix)`` for a path or URI given by the user.

    Plain paths and ``file://`` URIs are local (made absolute); ``s3://``/``s3a://`` use
    the ``s3.*`` options when given; any other URI goes to
    :meth:`pyarrow.fs.FileSystem.from_uri`.  The prefix turns a path back into a URI.
    """
    if not isinstance(location, str) or not location:
        raise ValueError(f"invalid path {location!r}")
    scheme, sep, rest = location.partition("://")
    if not sep or len(scheme) < 2 or scheme.lower() == "file":
        local = rest if sep else location
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(local)), ""
    scheme = scheme.lower()
    if scheme in ("s3", "s3a", "s3n"):
        s3 = _s3_filesystem(options)
        if s3 is not None:
            return s3, rest.rstrip("/"), "s3://"
        location = "s3://" + rest
    try:
        filesystem, path = pafs.FileSystem.from_uri(location)
    except (ValueError, OSError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise ValueError(f"cannot open a file system for {location!r}: {exc}") from None
    return filesystem, path.rstrip("/"), f"{scheme}://"


def _uri(prefix: str, path: str) -> str:
    return prefix + path if prefix else path


def _hidden(relative: str) -> bool:
    # Spark's convention: names starting with "_" or "." (metadata, temporary files) are
    # not data, at any depth below the directory that was given.
    return any(part.startswith(("_", ".")) for part in relative.split("/") if part)


def _expand_glob(filesystem: pafs.FileSystem, pattern: str) -> list[pafs.FileInfo]:
    parts = pattern.split("/")
    fixed = []
    for part in parts:
        if _GLOB.search(part):
            break
        fixed.append(part)
    base = "/".join(fixed) or "/"
    depth = len(parts) - len(fixed)
    infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=depth > 1, allow_not_found=True))
    return [info for info in infos
            if info.path.count("/") - base.rstrip("/").count("/") == depth and fnmatch.fnmatchcase(info.path, pattern)]


def _paths_option(options: Mapping[str, str]) -> list[str]:
    raw = options.get(OPT_PATHS)
    if raw is not None:
        try:
            paths = json.loads(raw)
        except ValueError:
            raise ValueError(f"option {OPT_PATHS} is not a JSON list of paths") from None
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ValueError(f"option {OPT_PATHS} is not a JSON list of paths")
    elif options.get(OPT_PATH):
        paths = [options[OPT_PATH]]
    else:
        paths = []
    if not paths:
        raise ValueError("no path given: use .load(path), .load([paths]) or .option('path', ...)")
    return paths


def list_files(options: Mapping[str, str], extension: str) -> list[DataFile]:
    """The files the ``path``/``paths`` options name, in a stable order.

    A file is taken as given; a directory contributes every file below it whose name
    ends with ``extension`` (hidden ``_``/``.`` names skipped); a glob pattern contributes
    what it matches (directories among the matches are listed the same way).  A path that
    does not exist, or a load that finds no file, is an error.
    """
    files: dict[tuple[int, str], DataFile] = {}
    for location in _paths_option(options):
        filesystem, path, prefix = resolve(location, options)
        if _GLOB.search(path):
            infos = _expand_glob(filesystem, path)
            if not infos:
                raise FileNotFoundError(f"no file matches {location!r}")
        else:
            infos = [filesystem.get_file_info(path)]
            if infos[0].type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"{location!r} does not exist")
        for info in infos:
            if info.type == pafs.FileType.Directory:
                below = filesystem.get_file_info(pafs.FileSelector(info.path, recursive=True))
                root = info.path.rstrip("/") + "/"
                chosen = sorted(
                    (entry for entry in below
                     if entry.type == pafs.FileType.File and entry.path.endswith(extension)
                     and not _hidden(entry.path[len(root):])),
                    key=lambda entry: entry.path,
                )
            elif info.type == pafs.FileType.File:
                chosen = [info]
            else:
                continue
            for entry in chosen:
                key = (id(filesystem), entry.path)
                if key not in files:
                    files[key] = DataFile(filesystem, entry.path, _uri(prefix, entry.path), int(entry.size))
    if not files:
        raise FileNotFoundError(f"no {extension} files found in {', '.join(map(repr, _paths_option(options)))}")
    return list(files.values())


def output_location(options: Mapping[str, str]) -> tuple[pafs.FileSystem, str, str]:
    """``(filesystem, directory, uri prefix)`` of a write's ``path`` option."""
    location = options.get(OPT_PATH)
    if not location:
        raise ValueError("no output path given: use .save(path)")
    return resolve(location, options)


# --- planning ----------------------------------------------------------------------------


def pack(pieces: Iterable[tuple[int, Any]], target: int) -> list[list[Any]]:
    """Group consecutive ``(size, piece)`` into lists of about ``target`` bytes each.

    A piece never spans groups; a group is closed as soon as it reaches ``target``, so a
    large piece forms its own group and small ones (small files, small row groups) share.
    """
    groups: list[list[Any]] = []
    current: list[Any] = []
    size = 0
    for piece_size, piece in pieces:
        if current and size + piece_size > target:
            groups.append(current)
            current, size = [], 0
        current.append(piece)
        size += piece_size
    if current:
        groups.append(current)
    return groups


# --- errors ---------------------------------------------------------------------------------


def file_error(exc: BaseException, context: str, name: str | None = None) -> BaseException:
    """An exception like ``exc`` whose message starts with ``context`` (file and task).

    A leading ``"<name>: "`` of the original message (the file's name, which the format
    modules put first) is dropped, since ``context`` names the file already.

    icecrypt's own exception classes, ``OSError`` subclasses and ``ValueError`` keep
    their class so that callers can tell a wrong key from a missing file; anything else
    becomes an :class:`icecrypt.IcecryptError`.  Messages of icecrypt and pyarrow never
    carry key bytes, and none are added here.
    """
    detail = str(exc)
    if name and detail.startswith(f"{name}: "):
        detail = detail[len(name) + 2:]
    message = f"{context}: {detail}"
    cls = type(exc)
    if issubclass(cls, (IcecryptError, OSError, ValueError, LookupError)):
        try:
            new = cls(message)
        except (TypeError, ValueError):  # a constructor that takes other arguments
            new = None
        if new is not None and str(new) == message:
            return new
    return IcecryptError(f"{message} ({cls.__name__})")
