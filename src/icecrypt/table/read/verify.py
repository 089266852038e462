"""``table.verify()``: read and authenticate every file a table's snapshots reach.

For each snapshot (or one): unwrap the manifest list's key through the KEK, decrypt the
manifest list, every manifest, and every data and delete file in full — Parquet files
row group by row group (every page of every column is decrypted and its GCM tag
checked; so are the page indexes and bloom filters, which Arrow does not read but
parquet-java does), Avro and Puffin files block by block (deletion vectors are decoded
and their CRC and cardinality checked).  Files shared by several snapshots are checked
once.

Nothing raises for damage: each problem becomes a :class:`VerifyProblem` with the file's
recorded location and one of the kinds

* ``missing`` — the file does not exist;
* ``damaged`` — it fails authentication or is malformed (wrong length, bad header,
  bad CRC, row count different from the manifest's);
* ``unencrypted`` — in an encrypted table: plaintext bytes, no key metadata, or a
  snapshot without ``key-id``;
* ``key-missing`` — an ``encryption-keys`` entry is missing or the KMS cannot unwrap
  the KEK (wrong or unavailable master key);
* ``error`` — anything else (I/O errors, permissions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from icecrypt.errors import (
    DecryptionError,
    EncryptionKeyNotFoundError,
    FormatError,
    KmsError,
)
from icecrypt.table.files.deletes import decode_deletion_vector, read_dv_blob
from icecrypt.table.files.io import PlaintextFileError, reading
from icecrypt.table.files.manifest import DATA, ContentFile, ManifestFile, read_manifest

if TYPE_CHECKING:
    from icecrypt.table.commit.state import TableView

__all__ = ["VerifyProblem", "VerifyReport", "verify"]

KINDS = ("missing", "damaged", "unencrypted", "key-missing", "error")


@dataclasses.dataclass(frozen=True)
class VerifyProblem:
    """One problem: the file (recorded location), its kind, and what is wrong."""

    path: str
    kind: str
    message: str
    snapshot_id: int | None = None

    def __str__(self) -> str:
        where = f" (snapshot {self.snapshot_id})" if self.snapshot_id is not None else ""
        return f"{self.kind}: {self.path}{where}: {self.message}"


@dataclasses.dataclass
class VerifyReport:
    """What :meth:`EncryptedTable.verify` checked and found."""

    table: str
    snapshots: list[int] = dataclasses.field(default_factory=list)
    files_checked: int = 0
    bytes_checked: int = 0
    rows_checked: int = 0
    problems: list[VerifyProblem] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        state = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        return (
            f"{self.table}: {state}; {len(self.snapshots)} snapshot(s), {self.files_checked} file(s), "
            f"{self.bytes_checked} bytes, {self.rows_checked} data/delete rows checked"
        )

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(f"  {p}" for p in self.problems)])


def _kind(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, PlaintextFileError):
        return "unencrypted"
    if isinstance(exc, (EncryptionKeyNotFoundError, KmsError)):
        return "key-missing"
    if isinstance(exc, DecryptionError):
        return "damaged"
    return "error"


class _Verifier:
    def __init__(self, table: TableView, report: VerifyReport):
        self.table = table
        self.report = report
        self.fs: pafs.FileSystem = table.filesystem
        self.encrypted = table.encrypted
        self.done: dict[str, bool] = {}  # location -> verified without problems
        self.sized: set[str] = set()

    def problem(self, path: str, exc: BaseException, snapshot_id: int | None) -> None:
        self.report.problems.append(VerifyProblem(path, _kind(exc), str(exc) or type(exc).__name__, snapshot_id))

    def check(self, key: str, snapshot_id: int, action: Callable[[], Any], *, path: str | None = None) -> Any:
        """Run ``action`` once per ``key`` (a file, or a blob in one); record a problem
        about ``path`` (default: the key) instead of raising."""
        if key in self.done:
            return None
        try:
            result = action()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none raised
            self.done[key] = False
            self.problem(path or key, exc, snapshot_id)
            return None
        self.done[key] = True
        self.report.files_checked += 1
        return result

    # --- files ---------------------------------------------------------------------------------

    def _stored_size(self, file: ContentFile) -> int:
        fs_path = self.table.fs_path(file.file_path)
        info = self.fs.get_file_info(fs_path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{file.file_path} is missing ({fs_path})")
        if info.size != file.file_size_in_bytes:
            raise FormatError(
                f"{file.file_path}: {info.size} bytes stored, the manifest says {file.file_size_in_bytes}"
            )
        return info.size

    def content_file(self, file: ContentFile) -> int:
        size = self._stored_size(file)
        if self.encrypted and file.key_metadata is None:
            raise PlaintextFileError(f"{file.file_path} has no key metadata, but the table is encrypted")
        fs_path = self.table.fs_path(file.file_path)
        what = "data file" if file.content == DATA else "delete file"
        with reading(what, file.file_path, self.fs, fs_path, encrypted=self.encrypted):
            if file.file_format == "PARQUET":
                rows = self._parquet(file, fs_path)
            elif file.file_format == "AVRO":
                rows = self._avro(file, fs_path)
            elif file.file_format == "PUFFIN":
                rows = self._puffin(file, fs_path)
            else:
                raise FormatError(f"{file.file_path}: unsupported file format {file.file_format}")
        if rows != file.record_count:
            raise FormatError(f"{file.file_path}: {rows} rows, the manifest says {file.record_count}")
        if file.file_path not in self.sized:  # a Puffin file holding several vectors counts once
            self.sized.add(file.file_path)
            self.report.bytes_checked += size
        self.report.rows_checked += rows
        return size

    def _parquet(self, file: ContentFile, fs_path: str) -> int:
        base = None if isinstance(self.fs, pafs.LocalFileSystem) else self.fs
        if self.encrypted:
            from icecrypt import parquet

            pf = parquet.open_file(fs_path, file.key_metadata, filesystem=base)
        else:
            import pyarrow.parquet as pq

            source = self.fs.open_input_file(fs_path)
            if source.read_at(4, 0) == b"PARE":
                source.close()
                raise FormatError(f"{file.file_path} is encrypted, but the table has no encryption.key-id")
            pf = pq.ParquetFile(source)
        rows = 0
        try:
            for index in range(pf.metadata.num_row_groups):
                rows += pf.read_row_group(index, use_threads=True).num_rows
        finally:
            pf.close()
        if self.encrypted:  # what Arrow does not read: page indexes, bloom filters, leading magic
            from icecrypt._parquet_modules import authenticate_modules

            with self.fs.open_input_file(fs_path) as source:
                authenticate_modules(source, file.key_metadata, file.file_path)
        return rows

    def _avro(self, file: ContentFile, fs_path: str) -> int:
        base = None if isinstance(self.fs, pafs.LocalFileSystem) else self.fs
        if self.encrypted:
            from icecrypt import avro

            with avro.read_records(fs_path, file.key_metadata, filesystem=base, raw=True) as records:
                return sum(1 for _ in records)
        from icecrypt.table.files.io import open_plain_avro

        with open_plain_avro("data file", file.file_path, self.fs, fs_path, kind="data") as records:
            return sum(1 for _ in records)

    def _puffin(self, file: ContentFile, fs_path: str) -> int:
        with self.fs.open_input_file(fs_path) as source:
            km = file.key_metadata if self.encrypted else None
            if km is not None:
                from icecrypt import ags1

                with ags1.open_reader(source, km.encryption_key, km.aad_prefix, km.file_length, name=file.file_path) as r:
                    r.read_at(0, r.size)  # authenticates every block
            elif source.read_at(4, 0) == b"AGS1":
                raise FormatError(f"{file.file_path} is encrypted, but the table has no encryption.key-id")
            if file.content_offset is None or file.content_size_in_bytes is None:
                raise FormatError(f"{file.file_path}: deletion vector entry lacks content_offset/content_size_in_bytes")
            blob = read_dv_blob(source, file.content_offset, file.content_size_in_bytes, key=km, name=file.file_path)
        return len(decode_deletion_vector(blob, file.file_path, expected_cardinality=file.record_count))

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot_files(self, snapshot: Any) -> list[tuple[ContentFile, int]]:
        """Check a snapshot's manifest list and manifests; the content files they list."""
        sid = snapshot.snapshot_id
        table = self.table
        manifests: list[ManifestFile] | None = None
        if snapshot.manifest_list in self.done:
            return []
        try:
            manifests = table.manifests(snapshot)
        except Exception as exc:  # noqa: BLE001 - reported
            self.done[snapshot.manifest_list] = False
            self.problem(snapshot.manifest_list, exc, sid)
            return []
        self.done[snapshot.manifest_list] = True
        self.report.files_checked += 1
        schema = table.schema_for(snapshot)
        files: list[tuple[ContentFile, int]] = []
        for manifest in manifests:
            entries = self.check(
                manifest.path,
                sid,
                lambda m=manifest: list(
                    read_manifest(m, table.locations, table.specs, schema, encrypted=self.encrypted, require_keys=False)
                ),
            )
            for entry in entries or ():
                files.append((entry.file, sid))
        return files


def _file_key(file: ContentFile) -> str:
    return file.file_path if file.content_offset is None else f"{file.file_path}@{file.content_offset}"


def verify(table: TableView, snapshot_id: int | None = None, *, progress: Any = None) -> VerifyReport:
    """Verify ``table`` (see the module docstring).  ``progress``: a callable taking the
    total number of bytes of data and delete files to check and returning an object
    with ``update(n)`` and ``close()`` (such as :class:`icecrypt._progress.Progress`)."""
    report = VerifyReport(table=table.metadata_location)
    verifier = _Verifier(table, report)
    snapshots = table.snapshots() if snapshot_id is None else [table.snapshot(snapshot_id)]
    pending: list[tuple[ContentFile, int]] = []
    for snapshot in snapshots:
        report.snapshots.append(snapshot.snapshot_id)
        pending.extend(verifier.snapshot_files(snapshot))
    unique: dict[str, tuple[ContentFile, int]] = {}
    for file, sid in pending:  # a Puffin file holds one deletion vector per data file
        unique.setdefault(_file_key(file), (file, sid))
    bar = progress(sum(f.file_size_in_bytes for f, _ in unique.values())) if progress is not None else None
    try:
        for key, (file, sid) in unique.items():
            verifier.check(key, sid, lambda file=file: verifier.content_file(file), path=file.file_path)
            if bar is not None:
                bar.update(file.file_size_in_bytes)
    finally:
        if bar is not None:
            bar.close()
    return report
