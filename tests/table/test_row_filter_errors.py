"""A row filter the parser cannot read is one short ValueError naming the filter and the
forms a filter may take, from every API that takes one; nothing is committed."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
BAD = ("id % 97 = 0", "id >>> 1", "lower(name) = 'a'", "id = ", "name like '%a'")


@pytest.fixture
def table(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    table.append(pa.table({"id": list(range(200)), "name": [f"n{i}" for i in range(200)]}, schema=SCHEMA))
    table.append(pa.table({"id": [500], "name": ["x"]}, schema=SCHEMA))
    return table


CALLS = {
    "delete": lambda t, f: t.delete(f),
    "scan": lambda t, f: t.scan(row_filter=f).to_arrow(),
    "rewrite_data_files": lambda t, f: t.rewrite_data_files(row_filter=f, options={"rewrite-all": "true"}),
    "inspect.partitions": lambda t, f: t.inspect.partitions(row_filter=f),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("row_filter", BAD)
def test_unparsable_filter_is_one_clear_value_error(table, call, row_filter):
    before = (table.current_snapshot_id, table.metadata_location)
    with pytest.raises(ValueError) as caught:
        call(table, row_filter)
    message = str(caught.value)
    assert type(caught.value) is ValueError and caught.value.__cause__ is None
    assert message.startswith(f"cannot parse row filter {row_filter!r}")
    assert "supported: <column> <op> <literal>" in message and "IS [NOT] NULL" in message
    assert len(message) < 600  # not pyparsing's 2,400-character dump of the grammar
    table.refresh()
    assert (table.current_snapshot_id, table.metadata_location) == before


def test_good_filters_still_work(table):
    assert table.scan(row_filter="id between 10 and 19 and name like 'n1%'").count() == 10
    table.delete("id in (1, 2, 3) or name is null")
    assert table.scan().count() == 198
    with pytest.raises(TypeError, match="not None"):
        table.delete(None)


@pytest.mark.parametrize("row_filter", BAD)
def test_spark_filter_option(table, row_filter):
    """The Spark source's ``filter`` option (checked at load(), on the driver: no JVM needed
    to see the error)."""
    pytest.importorskip("pyspark")
    from pyspark.sql.datasource import CaseInsensitiveDict

    from icecrypt.spark._iceberg_source import IcebergDataSource

    options = CaseInsensitiveDict({"path": table.metadata_location, "encryption.kms-type": "memory",
                                   "encryption.kms.memory.iceberg-test-keys": "true", "filter": row_filter})  # fmt: skip
    with pytest.raises(ValueError, match="supported: <column> <op> <literal>") as caught:
        IcebergDataSource(options).schema()
    assert f"cannot parse row filter {row_filter!r}" in str(caught.value) and len(str(caught.value)) < 700
