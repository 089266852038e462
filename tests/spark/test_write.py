"""Spark writes: every task file encrypted with its own key, the keys recorded in the key
manifest at commit, overwrite replacing the directory's files, failed jobs leaving none."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from sparkhelpers import MASTER, sample_table, table_lines

import icecrypt.spark
from icecrypt import avro, parquet
from icecrypt.keys.manifest import read_key_manifest

pytestmark = pytest.mark.spark


def _frame(spark, table: pa.Table, partitions: int):
    return spark.createDataFrame(table).repartition(partitions)


def test_parquet_append_and_overwrite(icespark, kms, kms_options, tmp_path):
    out, manifest = tmp_path / "out", tmp_path / "keys.json"
    options = {**kms_options, "encryption.key-id": MASTER, "keys.manifest": str(manifest)}
    first, second, third = sample_table(3_000), sample_table(1_000, 3_000), sample_table(500, 9_000)

    def save(table, partitions, mode):
        (_frame(icespark, table, partitions).write.format("icecrypt.parquet").options(**options)
         .option("row-group-size", "400").mode(mode).save(str(out)))

    save(first, 2, "append")
    save(second, 1, "append")
    keys = read_key_manifest(manifest, kms)
    files = sorted(out.glob("*.parquet"))
    assert sorted(keys) == [str(f) for f in files] and len(files) == 3
    assert len({km.encryption_key for km in keys.values()}) == 3  # a fresh DEK per file
    tables = []
    for f in files:
        assert f.read_bytes()[:4] == b"PARE" and keys[str(f)].file_length == f.stat().st_size
        tables.append(parquet.read_table(f, keys[str(f)]))
        assert parquet.open_file(f, keys[str(f)]).metadata.row_group(0).num_rows <= 400
    assert table_lines(pa.concat_tables(tables)) == table_lines(pa.concat_tables([first, second]))

    save(third, 2, "overwrite")
    keys = read_key_manifest(manifest, kms)
    files = sorted(out.glob("*.parquet"))
    assert sorted(keys) == [str(f) for f in files] and len(files) == 2
    back = (icespark.read.format("icecrypt.parquet").options(**kms_options).option("keys.manifest", str(manifest))
            .load(str(out)).toArrow())
    assert table_lines(back) == table_lines(third)


def test_avro_write_helper_returns_the_written_keys(icespark, kms, kms_options, tmp_path):
    out = tmp_path / "events"
    table = sample_table(2_000)
    keys = icecrypt.spark.write(_frame(icespark, table, 2), str(out), format="avro", kms_properties=kms_options,
                                table_key_id=MASTER)
    files = sorted(out.glob("*.avro"))
    assert sorted(keys) == [str(f) for f in files] and len(files) == 2
    manifest = out / icecrypt.spark.DEFAULT_MANIFEST_NAME
    assert read_key_manifest(manifest, kms) == keys
    for f in files:
        assert f.read_bytes()[:4] == b"AGS1"
    direct = pa.concat_tables(avro.read(f, keys[str(f)]) for f in files)
    assert table_lines(direct) == table_lines(table)
    # A second call appends; it returns only its own file.
    more = icecrypt.spark.write(_frame(icespark, sample_table(10, 2_000), 1), str(out), format="avro",
                                kms_properties=kms_options, table_key_id=MASTER)
    assert len(more) == 1 and not set(more) & set(keys)
    back = (icespark.read.format("icecrypt.avro").options(**kms_options).option("keys.manifest", str(manifest))
            .load(str(out)).toArrow())
    assert back.num_rows == 2_010
    assert table_lines(back) == table_lines(pa.concat_tables([table, sample_table(10, 2_000)]))


def test_failed_write_leaves_no_files_and_no_keys(icespark, kms_options, tmp_path):
    out, manifest = tmp_path / "out", tmp_path / "keys.json"

    @F.udf("long")
    def fail_on_row(value):
        if value == 1_234:
            raise ValueError("this task fails")
        return value

    df = _frame(icespark, sample_table(2_000), 2).withColumn("id", fail_on_row("id"))
    with pytest.raises(Exception, match="this task fails"):
        (df.write.format("icecrypt.parquet").options(**kms_options).option("encryption.key-id", MASTER)
         .option("keys.manifest", str(manifest)).mode("append").save(str(out)))
    assert not list(out.glob("*")) and not manifest.exists()
    with pytest.raises(Exception, match="keys.manifest is required"):
        df.write.format("icecrypt.avro").options(**kms_options).option("encryption.key-id", MASTER).mode(
            "append").save(str(out))
