"""Build the class-data-sharing archive the suite's JVMs start from (``make test``).

Run as ``python tests/jvm_archive.py PATH``: starts a local Spark session as the suite does
(``spark_fixtures.start_spark``, icecrypt's jar and extension), runs a small workload through
what the tests use most (DataFrame Parquet I/O and a shuffle, a Python data source read,
the SQL catalog's DDL, INSERT, MERGE and SELECT), and lets the JVM write every class it loaded
from Spark's jars to PATH on exit (HotSpot's dynamic archive, ``-XX:ArchiveClassesAtExit``).

``tests/conftest.py`` then gives every JVM the suite starts ``-XX:SharedArchiveFile=PATH``:
those classes are mapped, already parsed and verified, instead of being read from ~280 jars.
Measured here (2 cores): a test session's start 9.8 s -> 4.9 s, its first job 4.8 s -> 1.8 s.
A JVM whose class path does not match the archive's (a changed jar: ``make`` rebuilds the
archive when the venv or the jar changes) runs without it, as before, and says nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _workload(spark, root: Path) -> None:
    import pyarrow as pa

    from icecrypt.kms.memory import MemoryKms
    from icecrypt.table import EncryptedTable

    df = spark.range(2000).selectExpr("id", "id % 7 AS k", "CAST(id AS STRING) AS s")
    df.write.parquet(str(root / "plain"))
    spark.read.parquet(str(root / "plain")).groupBy("k").count().collect()
    table = EncryptedTable.create(str(root / "enc"), pa.schema([pa.field("id", pa.int64())]),
                                  kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")
    table.append(pa.table({"id": pa.array(range(100), pa.int64())}))
    import icecrypt.spark

    icecrypt.spark.register(spark)
    (spark.read.format("icecrypt.iceberg").option("encryption.kms-type", "memory")
     .option("encryption.kms.memory.iceberg-test-keys", "true").load(str(root / "enc")).count())
    for statement in (
            "CREATE NAMESPACE cds.db",
            "CREATE TABLE cds.db.t (id BIGINT, s STRING) USING iceberg PARTITIONED BY (bucket(2, id))",
            "INSERT INTO cds.db.t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
            "MERGE INTO cds.db.t t USING (SELECT 2 AS id, 'z' AS s) u ON t.id = u.id "
            "WHEN MATCHED THEN UPDATE SET s = u.s WHEN NOT MATCHED THEN INSERT *",
            "DELETE FROM cds.db.t WHERE id = 1",
            "SELECT s, count(*) FROM cds.db.t GROUP BY s"):
        spark.sql(statement).collect()


def main(path: str) -> int:
    target = Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    # Only this run writes an archive; the suite's own options (conftest) are not wanted here.
    os.environ["SPARK_SUBMIT_OPTS"] = (f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial} "
                                      "-Xlog:cds=off -Xlog:cds+dynamic=off")  # (classes it skips)
    from pyspark import SparkContext

    from spark_fixtures import start_spark

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="icecrypt-jvm-archive-") as tmp:
        root = Path(tmp)
        prefix = "spark.sql.catalog.cds"
        conf = {prefix: "org.icecrypt.spark.SparkCatalog", f"{prefix}.type": "sql",
                f"{prefix}.warehouse": str(root / "warehouse"), f"{prefix}.encryption.kms-type": "memory",
                f"{prefix}.encryption.kms.memory.iceberg-test-keys": "true",
                f"{prefix}.encryption.table-key-id": "keyA"}
        spark = start_spark("icecrypt-jvm-archive")
        for key, value in conf.items():  # a catalog can be registered on a running session
            spark.conf.set(key, value)
        try:
            _workload(spark, root)
        finally:
            spark.stop()
            gateway = SparkContext._gateway
            gateway.shutdown()
            gateway.proc.stdin.close()  # the JVM exits when its stdin closes, writing the archive
            gateway.proc.wait(timeout=300)
    if not partial.is_file() or partial.stat().st_size == 0:
        print(f"jvm_archive: the JVM wrote no archive to {partial}", file=sys.stderr)
        return 1
    partial.replace(target)
    print(f"jvm_archive: {target} ({target.stat().st_size >> 20} MiB) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
