"""``icecrypt table schema``: prints the schema, evolves it in one commit; bad input
exits non-zero with a message naming the column and commits nothing; names from
storage are printed escaped."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.types import IntegerType, StringType

from icecrypt.cli import main
from icecrypt.kms.local import LocalKms
from icecrypt.table import EncryptedTable


def run(capfd, *argv) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return status, out, err


@pytest.fixture
def setup(tmp_path):
    keys = tmp_path / "keys.json"
    LocalKms.create_keystore(str(keys), ["master"])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("qty", pa.int32()),
                        pa.field("note", pa.string()), pa.field("address", pa.struct([pa.field("city", pa.string())]))])  # fmt: skip
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=LocalKms(str(keys)), table_key_id="master")
    table.append(pa.table({"id": [1], "qty": [5], "note": ["x"], "address": [{"city": "Oslo"}]}, schema=schema))
    kms = ["--kms-type", "local", "--kms-property", f"encryption.kms.local.keystore={keys}"]
    return str(tmp_path / "t"), kms, LocalKms(str(keys))


def test_schema_print_and_evolve(setup, capfd):
    location, kms, client = setup
    status, out, _ = run(capfd, "table", "schema", location, *kms)
    assert status == 0 and "1: id: required long" in out and "  5: city: optional string" in out
    status, out, err = run(capfd, "table", "schema", location, "--add", "region=string", "--add", "address.country=string",
                           "--add", "status=string", "--default", "status=active", "--required", "status",
                           "--rename", "qty=quantity", "--drop", "note", "--widen", "qty=long", "--make-optional", "id",
                           "--doc", "id=the key", *kms)  # fmt: skip
    assert status == 0, err
    assert "committed" in out
    status, out, _ = run(capfd, "table", "schema", location, "--json", *kms)
    names = [f["name"] for f in json.loads(out)["fields"]]
    assert names == ["id", "quantity", "address", "region", "status"]
    table = EncryptedTable.load(location, kms=client)
    assert table.schema.find_field("quantity").field_type.__class__.__name__ == "LongType"
    assert table.schema.find_field("id").doc == "the key" and not table.schema.find_field("id").required
    rows = table.scan().to_arrow()
    assert rows.column("status").to_pylist() == ["active"] and rows.column("quantity").to_pylist() == [5]
    assert rows.column("address").to_pylist() == [{"city": "Oslo", "country": None}]


@pytest.mark.parametrize("argv, message", [
    (["--drop", "missing"], "no column 'missing'"),
    (["--widen", "qty=string"], "cannot change column 'qty' from int to string"),
    (["--widen", "qty=notatype"], "not an Iceberg primitive type"),
    (["--add", "id=long"], "'id': a column of that name exists"),
    (["--add", "new=long", "--required", "new"], "required column 'new' without a default"),
    (["--rename", "qty"], "expected PATH=VALUE"),
    (["--default", "x=1"], "apply to columns added with --add"),
])  # fmt: skip
def test_schema_bad_input_commits_nothing(setup, capfd, argv, message):
    location, kms, client = setup
    before = EncryptedTable.load(location, kms=client).metadata_location
    status, _, err = run(capfd, "table", "schema", location, *argv, *kms)
    assert status != 0 and message in err
    assert EncryptedTable.load(location, kms=client).metadata_location == before


def test_schema_names_printed_escaped(setup, capfd):
    location, kms, client = setup
    EncryptedTable.load(location, kms=client).update_schema().add_column("evil\x1b[2J", IntegerType()).commit()
    status, out, _ = run(capfd, "table", "schema", location, *kms)
    assert status == 0 and "\x1b" not in out and "evil\\x1b[2J" in out


def test_cli_append_fills_write_defaults(setup, capfd, tmp_path):
    location, kms, client = setup
    table = EncryptedTable.load(location, kms=client)
    table.update_schema().add_column("status", StringType(), required=True, default_value="new").add_column(
        "score", IntegerType(), default_value=3).commit()
    csv = tmp_path / "rows.csv"
    csv.write_text("id,qty\n7,1\n", encoding="utf-8")
    status, _, err = run(capfd, "table", "append", location, csv, *kms)
    assert status == 0, err
    rows = EncryptedTable.load(location, kms=client).scan(row_filter="id = 7").to_arrow()
    assert rows.column("status").to_pylist() == ["new"] and rows.column("score").to_pylist() == [3]
