"""encrypt_table / decrypt_table: a plaintext Iceberg table made encrypted (and back) in
one commit, every row kept, nothing plaintext reachable from the new version."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import BucketTransform, IdentityTransform

from icecrypt.errors import CommitConflictError, KmsKeyNotFoundError
from icecrypt.table import EncryptedTable, _committer, _model, decrypt_table, encrypt_table
from icecrypt.table._encrypt_table import CONVERTED_FROM
from icecrypt.table._write_schema import spec_to_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultfs import FaultPlan, InjectedFault, failing_filesystem  # noqa: E402

KEY = "keyA"


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({
        "id": pa.array(ids),
        "cat": pa.array([f"c{i % 5}" for i in ids]),
        "amount": pa.array(ids * 1.5),
    })  # fmt: skip


def add_spec(table: EncryptedTable, fields: list[PartitionField]) -> None:
    """A second partition spec, committed through the commit model (AddSpec + SetDefaultSpec)."""
    base = table.metadata
    spec_id = max(s["spec-id"] for s in base["partition-specs"]) + 1
    spec = spec_to_json(PartitionSpec(*fields, spec_id=spec_id))
    change = _model.Change.on(base, [_model.AddSpec(spec), _model.SetDefaultSpec(spec_id)], what="spec update")
    _committer.commit(table, change)


def sorted_rows(table: EncryptedTable, columns=None) -> pa.Table:
    return table.scan(columns=columns).to_arrow().sort_by("id")


def lineage(table: EncryptedTable) -> pa.Table:
    return table.scan(columns=["id", "_row_id", "_last_updated_sequence_number"]).to_arrow().sort_by("id")


def reachable_files(table: EncryptedTable) -> list[str]:
    """Every file reachable from every snapshot of the table (filesystem paths)."""
    from icecrypt.table._manifest import read_manifest

    found = []
    for snapshot in table.snapshots():
        found.append(table.fs_path(snapshot.manifest_list))
        for manifest in table.manifests(snapshot):
            found.append(table.fs_path(manifest.path))
            for entry in read_manifest(manifest, table.locations, table.specs, table.schema,
                                       encrypted=table.encrypted, include_deleted=True):  # fmt: skip
                found.append(table.fs_path(entry.file.file_path))
    return found


def magic(path: str) -> tuple[bytes, bytes]:
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(-4, os.SEEK_END)
        return head, f.read(4)


def assert_all_encrypted(table: EncryptedTable) -> None:
    files = reachable_files(table)
    assert files
    for path in files:
        head, tail = magic(path)
        assert head == b"AGS1" or (head == b"PARE" and tail == b"PARE"), f"{path} is not encrypted ({head!r})"


def assert_all_plaintext(table: EncryptedTable) -> None:
    for path in reachable_files(table):
        head, _ = magic(path)
        assert head in (b"Obj\x01", b"PAR1", b"PFA1"), f"{path} is not plaintext ({head!r})"


def pyiceberg_parses(table: EncryptedTable) -> None:
    from pyiceberg.table.metadata import TableMetadataUtil

    parsed = TableMetadataUtil.parse_raw(Path(table.metadata_location).read_text())
    assert parsed.format_version == 3
    assert parsed.current_snapshot_id == table.current_snapshot_id
    assert [s.spec_id for s in parsed.partition_specs] == [s["spec-id"] for s in table.metadata["partition-specs"]]


@pytest.fixture(scope="module")
def big_plain(tmp_path_factory):
    """A 100,000-row plaintext table with two partition specs and deletes (deletion
    vectors on files of both specs), as a template copied by each test."""
    root = tmp_path_factory.mktemp("plain") / "t"
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "cat"))
    table = EncryptedTable.create(str(root), rows(0, 1).schema, kms=None, table_key_id=None, partition_spec=spec)
    table.append(rows(0, 50_000))
    add_spec(table, [PartitionField(1, 1001, BucketTransform(4), "id_bucket")])
    table.append(rows(50_000, 50_000))
    table.delete("id < 300 or (id > 60000 and id < 60100)")
    table.delete("id = 70001")
    return root


@pytest.fixture
def plain(big_plain, tmp_path):
    import shutil

    dest = tmp_path / "t"
    shutil.copytree(big_plain, dest)
    # the copy's metadata records the template's location: map it
    return EncryptedTable.load(str(dest), location_map={str(big_plain): str(dest)}), dest


def test_encrypt_in_place_keeps_every_row(plain, kms):
    table, _ = plain
    before = sorted_rows(table)
    before_lineage = lineage(table)
    assert before.num_rows == 100_000 - 300 - 99 - 1
    specs = table.metadata["partition-specs"]
    result = encrypt_table(table, kms=kms, table_key_id=KEY)
    assert result.in_place and result.table is table
    assert table.encrypted and table.pin.encrypted and table.pin.table_key_id == KEY
    assert table.metadata["format-version"] == 3 and table.metadata["partition-specs"] == specs
    assert [s.snapshot_id for s in table.snapshots()] == [result.snapshot_id]
    assert result.rewritten_data_files >= 2 and result.rewritten_delete_files >= 1
    assert sorted_rows(table).equals(before)
    assert lineage(table).equals(before_lineage)  # row ids and their sequence numbers kept
    assert_all_encrypted(table)
    assert table.verify().ok
    pyiceberg_parses(table)
    # a fresh load (pinned from storage) agrees
    again = EncryptedTable.load(table.metadata_location, kms=kms, location_map=table.location_map)
    assert again.encrypted and sorted_rows(again).equals(before)
