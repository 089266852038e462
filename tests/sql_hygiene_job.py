"""A Spark application for tests/test_secrets_hygiene.py: Spark SQL through icecrypt's
catalog (``org.icecrypt.spark.SparkCatalog``) on an encrypted table -- CREATE, INSERT,
SELECT, UPDATE, MERGE INTO, a DELETE, each copy-on-write and merge-on-read, CALL
rewrite_data_files, the files metadata table -- with the UI on, an uncompressed event log and the JVM's log at DEBUG.
Writes what Spark shows to OUT/: ``explain.txt`` (every explain mode of a query, and
EXPLAIN of an UPDATE and a MERGE), ``rest.json`` (the UI's REST answers) and
``control.txt`` (every value the driver handed the JVM's ``Keys``: the scans' file keys
and the writes' secrets, one per line: the search must find the DEKs there).  Its stdout
and stderr (driver and local executors' logs) are captured by the test.

    python tests/sql_hygiene_job.py WAREHOUSE KEYSTORE OUT
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from native_hygiene_job import save_outputs  # noqa: E402
from spark_fixtures import spark_conf  # noqa: E402

import icecrypt.spark  # noqa: E402
from icecrypt.spark._sql import scan as _scan  # noqa: E402

STATEMENTS = [
    "CREATE NAMESPACE enc.db",
    "CREATE TABLE enc.db.t (id bigint, s string) USING iceberg PARTITIONED BY (s) "
    "TBLPROPERTIES ('encryption.key-id'='master')",
    "INSERT INTO enc.db.t SELECT id, concat('v', id % 3) FROM range(100)",
    "SELECT s, count(*), sum(id) FROM enc.db.t GROUP BY s ORDER BY s",
    "UPDATE enc.db.t SET id = id + 1000 WHERE id < 5",
    "MERGE INTO enc.db.t t USING (SELECT id, 'v9' AS s FROM range(95, 105)) src ON t.id = src.id "
    "WHEN MATCHED THEN UPDATE SET t.s = src.s WHEN NOT MATCHED THEN INSERT *",
    "DELETE FROM enc.db.t WHERE id IN (SELECT id FROM range(10, 12))",
    # the changelog (copy-on-write changes only: it refuses deletion vectors)
    "SELECT _change_type, count(*) FROM enc.db.t.changes GROUP BY _change_type ORDER BY _change_type",
    "CALL enc.system.create_changelog_view(table => 'db.t', net_changes => true)",
    "SELECT _change_type, count(*) FROM t_changes GROUP BY _change_type ORDER BY _change_type",
    # merge-on-read from here (the EXPLAINs below too): row ids in the plans, deletion vectors
    "ALTER TABLE enc.db.t SET TBLPROPERTIES ('write.update.mode'='merge-on-read', "
    "'write.merge.mode'='merge-on-read', 'write.delete.mode'='merge-on-read')",
    "UPDATE enc.db.t SET id = id + 2000 WHERE id IN (SELECT id FROM range(20, 23))",
    "MERGE INTO enc.db.t t USING (SELECT id, 'v8' AS s FROM range(30, 33)) src ON t.id = src.id "
    "WHEN MATCHED THEN UPDATE SET t.s = src.s",
    "DELETE FROM enc.db.t WHERE id IN (SELECT id FROM range(40, 42))",
    "CALL enc.system.rewrite_data_files(table => 'db.t')",
    "SELECT file_path, key_metadata FROM enc.db.t.files",
    "SELECT count(*), sum(id) FROM enc.db.t",
]


def main(warehouse: str, keystore: str, out: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("icecrypt-sql-hygiene")
    catalog = {"": "org.icecrypt.spark.SparkCatalog", ".type": "sql", ".warehouse": warehouse,
               ".encryption.kms-type": "local", ".encryption.kms.local.keystore": keystore}
    for key, value in {**spark_conf(), **{f"spark.sql.catalog.enc{k}": v for k, v in catalog.items()}}.items():
        builder = builder.config(key, value)
    builder = (icecrypt.spark.configure(builder).config("spark.ui.enabled", "true").config("spark.ui.port", "0")
               .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", os.path.join(out, "events"))
               .config("spark.eventLog.compress", "false"))
    os.makedirs(os.path.join(out, "events"), exist_ok=True)
    spark = builder.getOrCreate()
    icecrypt.spark.register(spark)
    control: list[str] = []
    original = _scan.push_keys

    def recording(bridge):  # what the scans and writes hand the JVM, kept for the test's self-check
        put = original(bridge)

        def put_and_keep(name: str, value: str) -> None:
            control.append(value)
            put(name, value)

        return put_and_keep

    _scan.push_keys = recording
    spark.sparkContext.setLogLevel("DEBUG")
    text = io.StringIO()
    try:
        for statement in STATEMENTS:
            print(statement.split()[0], [tuple(r) for r in spark.sql(statement).collect()])
        with contextlib.redirect_stdout(text):
            frame = spark.sql("SELECT s, count(*) FROM enc.db.t WHERE id > 20 GROUP BY s")
            for mode in ("simple", "extended", "codegen", "cost", "formatted"):
                frame.explain(mode)
        text.write(frame._jdf.queryExecution().toString())
        for statement in ("EXPLAIN EXTENDED UPDATE enc.db.t SET s = 'x' WHERE id = 50",
                          "EXPLAIN EXTENDED " + STATEMENTS[5]):
            text.write("\n".join(r[0] for r in spark.sql(statement).collect()))
    finally:
        spark.sparkContext.setLogLevel("ERROR")
    save_outputs(spark, out, text.getvalue(), control)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
