"""Schema evolution against storage an attacker can write: ids, defaults and schemas
read from ``metadata.json`` are input.  A lowered ``last-column-id`` cannot make a new
column reuse a dropped column's id (its old values would come back under the new
name); a forged default that does not fit its column is refused naming the file and column
(FormatError, no value made up); a
forged concurrent schema change is detected by the commit's requirements."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.types import IntegerType, StringType
from tablelib import edit_metadata

from icecrypt.errors import CommitConflictError, FormatError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("qty", pa.int32()),
                    pa.field("secret", pa.string())])  # fmt: skip


@pytest.fixture
def table(tmp_path):
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")
    t.append(pa.table({"id": [1, 2], "qty": [3, 4], "secret": ["s1", "s2"]}, schema=SCHEMA))
    return t


def test_lowered_last_column_id_does_not_reuse_a_dropped_id(table):
    table.update_schema().delete_column("secret").commit()
    assert table.metadata["last-column-id"] == 3
    edit_metadata(Path(table.metadata_location), lambda m: m.__setitem__("last-column-id", 2))
    fresh = EncryptedTable.load(table.metadata_location, kms=table.kms)
    fresh.update_schema().add_column("public", StringType()).commit()
    assert fresh.schema.find_field("public").field_id == 4
    assert fresh.metadata["last-column-id"] == 4
    rows = EncryptedTable.load(fresh.metadata_location, kms=table.kms).scan().to_arrow()
    assert rows.column("public").to_pylist() == [None, None]  # never the dropped column's "s1", "s2"


def test_forged_default_that_does_not_fit_is_refused(table):
    table.update_schema().add_column("n", IntegerType(), default_value=5).commit()

    def forge(metadata: dict) -> None:
        for field in metadata["schemas"][-1]["fields"]:
            if field["name"] == "n":
                field["initial-default"] = "not a number"

    edit_metadata(Path(table.metadata_location), forge)
    with pytest.raises(FormatError, match=r"value 'not a number' of column 'n' \(field id 4\) does not fit int"):
        EncryptedTable.load(table.metadata_location, kms=table.kms).scan().to_arrow()


def test_schema_changed_behind_an_update_is_detected(table):
    update = table.update_schema().add_column("a", StringType())
    # another writer (here: a forged next version) changes the current schema first
    other = EncryptedTable.load(table.metadata_location, kms=table.kms)
    other.update_schema().rename_column("qty", "q").commit()
    with pytest.raises(CommitConflictError, match="schema"):
        update.commit()
    current = EncryptedTable.load(other.metadata_location, kms=table.kms)
    assert [f.name for f in current.schema.fields] == ["id", "q", "secret"]
    assert json.loads(Path(current.metadata_location).read_text())["current-schema-id"] == 1
