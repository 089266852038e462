"""Helpers for table tests: the shared Java tables, their canonical-row digest, and
damaging copies of them (shared with the write-path tests)."""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import shutil
import struct
import uuid
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from forgery import without_authenticator
from vectorlib import TABLES_DIR

from icecrypt import avro
from icecrypt.keys import KEY_TIMESTAMP, StandardKeyMetadata, wrap_key_metadata
from icecrypt.table import EncryptedTable

GOLDEN_PREFIX = "s3://icecrypt-golden/"
TABLE_NAMES = ("enc_parquet_dek16", "enc_avro_dek16", "enc_deletes_dek16")


@cache
def expected(name: str) -> dict:
    """``expected.json`` of a shared table."""
    return json.loads((TABLES_DIR / name / "expected.json").read_text(encoding="utf-8"))


def location_map(name: str, root: Path | None = None) -> dict[str, str]:
    """Maps the recorded ``s3://icecrypt-golden/<name>`` prefix to the table's folder
    (or to ``root``, e.g. a damaged copy in tmp_path)."""
    return {GOLDEN_PREFIX + name: str(root if root is not None else TABLES_DIR / name)}


def metadata_path(name: str, root: Path | None = None) -> Path:
    """The current ``metadata.json`` of a shared table (or of its copy at ``root``)."""
    return (root if root is not None else TABLES_DIR / name) / expected(name)["metadata_location"]


def copy_table(name: str, dest: Path) -> Path:
    """A private copy of a shared table (to damage it); returns its root."""
    root = dest / name
    shutil.copytree(TABLES_DIR / name, root)
    return root


# --- canonical rows (tables/README.md) ---------------------------------------------------------


def _canonical_column(column: pa.ChunkedArray) -> list[Any]:
    """One column as canonical JSON values."""
    t = column.type
    if pa.types.is_floating(t):
        return [None if v is None else struct.pack(">d", v).hex() for v in column.cast(pa.float64()).to_pylist()]
    if pa.types.is_decimal(t):
        return [None if v is None else format(v, "f") for v in column.to_pylist()]
    if pa.types.is_date(t):
        return column.cast(pa.int32()).to_pylist()
    if pa.types.is_timestamp(t) or pa.types.is_time(t):
        return column.cast(pa.int64()).to_pylist()
    if isinstance(t, pa.BaseExtensionType):  # uuid
        return [None if v is None else str(uuid.UUID(bytes=bytes(v))) for v in column.cast(t.storage_type).to_pylist()]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return [None if v is None else bytes(v).hex() for v in column.to_pylist()]
    return column.to_pylist()


def canonical_lines(table: pa.Table) -> list[str]:
    """The canonical JSON line of every row of ``table`` (columns in table order)."""
    columns = [_canonical_column(column) for column in table.columns]
    return [json.dumps(list(row), separators=(",", ":"), ensure_ascii=True, default=_strict) for row in zip(*columns)]


def _strict(value: Any) -> Any:
    if isinstance(value, (decimal.Decimal, datetime.date, bytes)):
        raise TypeError(f"value {value!r} was not canonicalised")
    raise TypeError(f"unexpected value {value!r}")


def digest_lines(lines: Iterable[str]) -> str:
    """sha256 of the sorted lines, each followed by a newline."""
    h = hashlib.sha256()
    for line in sorted(lines):
        h.update(line.encode("ascii") + b"\n")
    return h.hexdigest()


def table_digest(table: pa.Table) -> str:
    """The digest of the shared tables' README for the rows of ``table``."""
    return digest_lines(canonical_lines(table))


def sort_table(table: pa.Table, key: str = "id") -> pa.Table:
    """Rows ordered by ``key`` (scans return rows in file order)."""
    return table.take(pc.sort_indices(table, [(key, "ascending")]))


# --- damaging copies ---------------------------------------------------------------------------------


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def edit_metadata(path: Path, change) -> None:
    """Edit a metadata file in place, as storage's attacker (or another engine) can: the
    authenticator goes (it would refuse the edit; tests of authentication keep it)."""
    metadata = without_authenticator(json.loads(path.read_text(encoding="utf-8")))
    change(metadata)
    path.write_text(json.dumps(metadata), encoding="utf-8")


def reload(table: EncryptedTable, kms=None) -> EncryptedTable:
    # check_keys=False: damage tests read what is left of tables whose keys they removed
    # (loading them normally raises KeysLostError, tests/table/test_repair.py)
    return EncryptedTable.load(
        table.metadata_location, kms=kms or table.kms, filesystem=table.filesystem, location_map=table.location_map,
        check_keys=False,
    )


def current_manifests(table: EncryptedTable):
    return table.manifests(table.current_snapshot())


def rewrite_manifest_list(table: EncryptedTable, change_records) -> None:
    """Rewrite the current snapshot's manifest list with ``change_records(records)``
    applied, re-encrypted under its own key, and re-wrap its key metadata (new
    ``file_length``) into metadata.json with the snapshot's KEK, as a writer could."""
    snapshot = table.current_snapshot()
    list_km = table.manifest_list_key_metadata(snapshot)
    list_path = table.fs_path(snapshot.manifest_list)
    with avro.read_records(list_path, list_km, raw=True) as r:
        schema, meta, records = r.schema, r.metadata, list(r)
    records = change_records(records)
    new_km = avro.write_records(list_path, schema, records, key_metadata=list_km, metadata=_user_meta(meta))
    manager = table.encryption_manager
    kek_entry = manager.get_key(manager.get_key(snapshot.key_id).encrypted_by_id)
    kek = table.kms.unwrap_key(kek_entry.encrypted_key_metadata, manager.table_key_id)
    wrapped = wrap_key_metadata(kek, kek_entry.properties[KEY_TIMESTAMP], new_km)

    def rewrap(metadata: dict) -> None:
        for key in metadata["encryption-keys"]:
            if key["key-id"] == snapshot.key_id:
                key["encrypted-key-metadata"] = base64.b64encode(wrapped).decode("ascii")

    edit_metadata(Path(table.metadata_location), rewrap)


def rewrite_chain(table: EncryptedTable, manifest_index: int, change_entries, *, schema_change=None) -> None:
    """Rewrite one manifest of the current snapshot with ``change_entries(records)``
    applied (and its Avro schema with ``schema_change(schema)``, if given),
    re-encrypted under its own key, and carry its new length up the chain."""

    def change_list(records: list[dict]) -> list[dict]:
        target = records[manifest_index]
        manifest_km = StandardKeyMetadata.decode(target["key_metadata"])
        path = table.fs_path(target["manifest_path"])
        with avro.read_records(path, manifest_km, raw=True) as r:
            schema, meta, entries = r.schema, r.metadata, list(r)
        if schema_change is not None:
            schema = schema_change(schema)
        new_km = avro.write_records(path, schema, change_entries(entries), key_metadata=manifest_km, metadata=_user_meta(meta))
        target["manifest_length"] = new_km.file_length
        target["key_metadata"] = new_km.encode()
        return records

    rewrite_manifest_list(table, change_list)


def _user_meta(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if not k.startswith("avro.")}


def data_entry_index(entries: list[dict], suffix: str) -> int:
    return next(i for i, e in enumerate(entries) if e["data_file"]["file_path"].endswith(suffix))


def run_cli(capfd, *argv) -> tuple[int, str, str]:
    """``icecrypt`` with ``argv`` (str() of each): (exit status, stdout, stderr)."""
    from icecrypt.cli import main

    status = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return status, out, err
