"""The write side shared by the data sources: one encrypted file per task, keys recorded
in the key manifest at commit.

* ``writer()`` runs on the driver: it checks the options, refuses a write that has
  nowhere to record keys (option ``keys.manifest``) and makes the job's KEK (one KMS
  call).  Nothing secret is kept on the writer, which Spark pickles to the tasks.
* ``write()`` runs in each task: a fresh DEK and AAD prefix, one file named
  ``part-<partition>-<job id>-<task attempt>.<ext>`` (written atomically by the format
  module), and a commit message holding the file's key metadata wrapped under the job's
  KEK (the task unwraps the job KEK through the KMS, once per Python worker).  With
  option ``keys.transport=task`` there is no job KEK: the commit message carries the key
  metadata the task made for its file, as Iceberg's task commits do, and executors never
  call the KMS.
* ``commit()`` runs on the driver: it unwraps the tasks' key metadata, merges it into the
  key manifest (replacing the directory's previous files on overwrite) and removes files
  of this job that no committed task reported (attempts Spark discarded), with the hidden
  temporaries of attempts that died mid-write.
* ``abort()`` removes every file of the job, temporaries included.

Stragglers.  Spark calls ``abort()`` (or ``commit()``) as soon as the job's outcome is
known, while attempts it gave up on may still be running: a failed task's writer, a
speculative copy.  Such an attempt must not leave a file behind after the driver has
cleaned up.  Where ``move`` is a rename (local, HDFS), the tasks therefore write inside
the job's hidden staging directory ``.icecrypt-<job id>``, which only the driver creates
(with a marker file in it), and publish by renaming the finished file out of it once they
have seen the marker.  The driver first renames that directory away (the fence), then
lists the job's files and removes the discarded ones, then deletes the renamed directory:
an attempt that has not yet published can no longer create or publish anything (its paths
no longer exist; where creating a file creates its directory, as on HDFS, the new
directory has no marker), and one that has is in the listing.  Object stores have neither temporaries nor renames: a task's upload appears
whole when it completes, and one that completes after the driver listed the directory
stays as an unreferenced ``part-`` file, without a key.

Overwrite: the manifest first gains the new files' keys, then the directory's previous
data files are deleted, then their keys are dropped, so the directory is readable at
every step; only Spark's two save modes exist for Python data sources (append,
overwrite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from icecrypt._atomic import renames_atomically
from icecrypt.errors import IcecryptError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.spark import _keys
from icecrypt.spark._common import (
    OPT_JOB_ID,
    OPT_KEYS_MANIFEST,
    TRANSPORT_TASK,
    encrypted,
    file_error,
    key_transport,
    output_location,
    resolve,
)
from icecrypt.spark._schema import arrow_for_write

__all__ = ["EncryptedFileWriter", "TaskFiles", "read_manifest"]

_JOB_ID = re.compile(r"[0-9a-f]{32}\Z")
#: the job's hidden staging directory is this followed by the job id
_STAGING = ".icecrypt-"
#: the file the driver puts in it: a directory without it is not the job's (any more)
_STAGING_MARKER = "_open"


@dataclasses.dataclass(frozen=True)
class WrittenFile:
    """One file a task wrote: its URI and its key metadata, wrapped by the job's KEK
    (``wrapped_key``) or, with ``keys.transport=task``, as the task made it
    (``key_metadata``, never shown in the repr)."""

    uri: str
    wrapped_key: bytes | None = dataclasses.field(default=None, repr=False)
    key_metadata: StandardKeyMetadata | None = dataclasses.field(default=None, repr=False)


class TaskFiles(WriterCommitMessage):
    """A task's commit message: the files it wrote (no key bytes in clear)."""

    def __init__(self, files: tuple[WrittenFile, ...]) -> None:
        self.files = files

    def __repr__(self) -> str:
        return f"TaskFiles({[f.uri for f in self.files]!r})"


def read_manifest(options: Mapping[str, str]) -> tuple[pafs.FileSystem, str, dict[str, StandardKeyMetadata]]:
    """The manifest's file system, path, and keys (empty if it does not exist yet).

    Every entry is authenticated under the job's master key (option ``encryption.key-id``)
    or the whole read fails: the commit re-wraps what it read under that key, so an entry
    it could not authenticate would come out of it looking genuine."""
    from icecrypt.keys.manifest import read_key_manifest

    filesystem, path, _ = resolve(options[OPT_KEYS_MANIFEST], options)
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return filesystem, path, {}
    keys = read_key_manifest(path, _keys.kms_client(options), table_key_id=_keys.table_key_id(options),
                             filesystem=filesystem)
    return filesystem, path, dict(keys)


class EncryptedFileWriter(DataSourceArrowWriter):
    """Base of the Avro and Parquet writers; a subclass writes one file (:meth:`write_file`)."""

    #: file name extension, with the dot
    extension = ""
    #: data source name, for messages
    source = ""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        self.options = dict(options)
        self.overwrite = overwrite
        if not encrypted(self.options):
            raise ValueError(f"{self.source} always writes encrypted files (encryption=none is for reads only)")
        if not self.options.get(OPT_KEYS_MANIFEST):
            raise ValueError(
                f"{self.source}: option {OPT_KEYS_MANIFEST} is required to write: it is where the key metadata "
                "of the written files is recorded (without it the files could never be read)"
            )
        job_id = self.options.get(OPT_JOB_ID) or uuid.uuid4().hex
        if not _JOB_ID.match(job_id):
            raise ValueError(f"option {OPT_JOB_ID}={job_id!r} must be 32 lower-case hex digits")
        self.job_id = job_id
        filesystem, directory, prefix = output_location(self.options)
        self.filesystem = filesystem
        self.directory = directory
        self.prefix = prefix
        filesystem.create_dir(directory, recursive=True)
        # the tasks write here and rename out; the driver fences it off before cleaning up
        self.staging = f"{directory.rstrip('/')}/{_STAGING}{job_id}" if renames_atomically(filesystem) else None
        if self.staging is not None:
            # one left by a driver that died (a job id given again), or planted: not ours
            self._remove_fenced(self._fence())
            filesystem.create_dir(self.staging, recursive=False)
            with filesystem.open_output_stream(f"{self.staging}/{_STAGING_MARKER}"):
                pass
        self.transport = key_transport(self.options)
        # keys.transport=task: no job KEK, the tasks return their key metadata as made
        self.kek = None if self.transport == TRANSPORT_TASK else _keys.new_job_kek(self.options)

    # --- subclass hook ------------------------------------------------------------------

    def write_file(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, path: str,
                   key_metadata: StandardKeyMetadata) -> StandardKeyMetadata:
        """Write ``batches`` to ``path`` encrypted with ``key_metadata``; return it with file_length."""
        raise NotImplementedError

    # --- tasks ----------------------------------------------------------------------------

    def _task_path(self) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()  # the task attempt id keeps retried attempts' files apart
        partition, attempt = (context.partitionId(), context.taskAttemptId()) if context else (0, 0)
        return f"{self.directory.rstrip('/')}/part-{partition:05d}-{self.job_id}-{attempt}{self.extension}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskFiles:
        first = next(iterator, None)
        while first is not None and first.num_rows == 0:
            first = next(iterator, None)
        if first is None:
            return TaskFiles(())
        schema = arrow_for_write(first.schema)
        batches = (batch.cast(schema) for batch in _chain(first, iterator))

        path = self._task_path()
        uri = self.prefix + path
        staged = path if self.staging is None else f"{self.staging}/{posixpath.basename(path)}"
        try:
            key_metadata = self.write_file(batches, schema, staged, _keys.new_file_key(self.options))
            if self.kek is None:
                written = WrittenFile(uri, key_metadata=key_metadata)
            else:
                written = WrittenFile(uri, wrapped_key=_keys.seal_key(self.options, self.kek, key_metadata))
            if staged != path:
                if not self._open():
                    raise FileNotFoundError(f"{self.staging}/{_STAGING_MARKER}")
                self.filesystem.move(staged, path)  # publish
        except Exception as exc:
            _remove(self.filesystem, staged)
            if self.staging is not None and not self._open():
                # the driver fenced the job off: it ended without this attempt
                raise IcecryptError(f"{self.source}: job {self.job_id} ended (committed or aborted) before this "
                                    f"attempt published {uri}; nothing of it is kept") from exc
            raise file_error(exc, f"{self.source}: writing {uri}", path) from exc
        return TaskFiles((written,))

    def _open(self) -> bool:
        """Whether the staging directory is still the driver's (not fenced off)."""
        marker = f"{self.staging}/{_STAGING_MARKER}"
        return self.filesystem.get_file_info(marker).type == pafs.FileType.File

    # --- driver -----------------------------------------------------------------------------

    def _job_files(self) -> list[str]:
        """Paths of files of this job in the output directory (committed or not), and the
        hidden temporaries (``.part-...-<job id>-....tmp``) of its attempts that died
        before publishing their file (an executor killed mid-write runs no cleanup)."""
        infos = self.filesystem.get_file_info(pafs.FileSelector(self.directory, allow_not_found=True))
        marker = f"-{self.job_id}-"
        return [info.path for info in infos if info.type == pafs.FileType.File
                and _is_job_file(posixpath.basename(info.path), marker)]

    def _previous_files(self, keep: set[str]) -> list[str]:
        """Data files of the output directory that this job did not write (for overwrite)."""
        infos = self.filesystem.get_file_info(pafs.FileSelector(self.directory, recursive=True, allow_not_found=True))
        root = self.directory.rstrip("/") + "/"
        return [info.path for info in infos
                if info.type == pafs.FileType.File and info.path.endswith(self.extension)
                and info.path not in keep
                and not any(part.startswith(("_", ".")) for part in info.path[len(root):].split("/"))]

    def _fence(self) -> str | None:
        """Rename the staging directory away, so that no attempt still running can create
        or publish a file of this job any more; returns its new path (to delete once the
        job's files are listed), or None."""
        if self.staging is None:
            return None
        closed = f"{self.staging}.{uuid.uuid4().hex[:12]}.closed"
        try:
            self.filesystem.move(self.staging, closed)
        except FileNotFoundError:
            return None  # fenced already (an abort after a failed commit)
        return closed

    def _remove_fenced(self, closed: str | None) -> None:
        if closed is None:
            return
        try:
            self.filesystem.delete_dir(closed)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise IcecryptError(f"cannot remove the staging directory {self.prefix}{closed}: {exc}") from exc

    def commit(self, messages: list[TaskFiles | None]) -> None:
        from icecrypt.keys.manifest import write_key_manifest

        closed = self._fence()
        try:
            written = {f.uri: f for message in messages if message is not None for f in message.files}
            keys = {uri: self._key_of(f) for uri, f in written.items()}
            manager = _keys.manifest_manager(self.options)
            manifest_fs, manifest_path, existing = read_manifest(self.options)
            merged = {**existing, **keys}
            write_key_manifest(manifest_path, merged, manager, filesystem=manifest_fs)
        except BaseException:
            with contextlib.suppress(Exception):  # Spark aborts next; its error is the one to see
                self._remove_fenced(closed)
            raise
        committed = {uri[len(self.prefix):] for uri in written}
        for path in self._job_files():
            if path not in committed:  # an attempt Spark discarded
                _remove(self.filesystem, path)
        self._remove_fenced(closed)
        if self.overwrite:
            previous = self._previous_files(committed)
            for path in previous:
                _remove(self.filesystem, path)
            gone = {_keys.canonical(self.prefix + path) for path in previous}
            remaining = {name: km for name, km in merged.items() if _keys.canonical(name) not in gone}
            if len(remaining) != len(merged):
                write_key_manifest(manifest_path, remaining, manager, filesystem=manifest_fs)

    def _key_of(self, written: WrittenFile) -> StandardKeyMetadata:
        """The key metadata a task reported, unwrapped (refusing one in the wrong form)."""
        if self.kek is not None and written.wrapped_key is not None:
            return _keys.open_key(self.options, self.kek, written.wrapped_key)
        if self.kek is None and written.key_metadata is not None:
            return written.key_metadata
        raise IcecryptError(f"{self.source}: the commit message for {written.uri} does not carry its key the way "
                            f"this job sends keys (keys.transport={self.transport})")

    def abort(self, messages: list[TaskFiles | None]) -> None:
        closed = self._fence()
        for path in self._job_files():
            _remove(self.filesystem, path)
        self._remove_fenced(closed)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.prefix}{self.directory} job={self.job_id}>"


def _is_job_file(name: str, marker: str) -> bool:
    if name.startswith("part-"):
        return marker in name
    return name.startswith(".part-") and name.endswith(".tmp") and marker in name


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def _remove(filesystem: pafs.FileSystem, path: str) -> None:
    try:
        filesystem.delete_file(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
            raise IcecryptError(f"cannot remove {path}: {exc}") from exc
