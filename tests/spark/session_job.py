"""A Spark job in a process of its own, for the tests of how sessions are built
(test_session_setup.py): ``python session_job.py MODE DIR``, printing one JSON line.

MODE ``plain``: a ``local[1]`` session built without ``icecrypt.spark.configure``; the
sources registered twice; prints the warnings raised.  With ``ICECRYPT_JOB_S3`` (JSON: an S3
endpoint, its credentials and a bucket), icecrypt's jar is added (still no session
extension) and a SQL catalog on that bucket runs an ``UPDATE`` of a table there, which
must fail before anything is written; prints its error, the rows and the snapshot count.  MODE ``configured``: a session built
with ``configure`` on ``local[1]``, started as the test started this interpreter (its
environment has no PYSPARK_PYTHON, and its PATH may lack this interpreter's directory);
the sources registered, a Parquet file read through ``icecrypt.parquet`` by the Python
workers; prints the rows read, the warnings and ``spark.pyspark.python``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

import icecrypt.spark

mode, work = sys.argv[1], sys.argv[2]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
builder = (SparkSession.builder.master("local[1]").appName(f"icecrypt-{mode}")
           .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
           .config("spark.driver.bindAddress", "127.0.0.1"))
if mode == "configured":
    builder = icecrypt.spark.configure(builder)
s3 = json.loads(os.environ.get("ICECRYPT_JOB_S3") or "null")
if s3 is not None:
    from icecrypt.spark._native import jar_path

    builder = builder.config("spark.jars", jar_path())
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
result = {}
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        icecrypt.spark.register(spark)
        icecrypt.spark.register(spark)
    result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    if mode == "configured":
        path = os.path.join(work, "rows.parquet")
        pq.write_table(pa.table({"n": list(range(100))}), path)
        frame = spark.read.format("icecrypt.parquet").option("encryption", "none").load(path)
        result["rows"] = frame.count()
        result["python"] = spark.conf.get("spark.pyspark.python", None)
    if s3 is not None:
        spark.conf.set("spark.sql.catalog.lake", "org.icecrypt.spark.SparkCatalog")
        for key, value in {"type": "sql", "warehouse": f"s3://{s3['bucket']}/warehouse",
                           "uri": f"sqlite:///{os.path.join(work, 'catalog.db')}", "s3.endpoint": s3["endpoint"],
                           "s3.access-key-id": s3["key"], "s3.secret-access-key": s3["secret"],
                           "s3.region": s3["region"]}.items():
            spark.conf.set(f"spark.sql.catalog.lake.{key}", value)
        spark.sql("CREATE NAMESPACE lake.db")
        spark.sql("CREATE TABLE lake.db.t (id bigint, s string) USING iceberg")
        spark.sql("INSERT INTO lake.db.t VALUES (1, 'a'), (2, 'b')")
        try:
            spark.sql("UPDATE lake.db.t SET s = 'x' WHERE id = 1")
            result["update"] = None
        except Exception as exc:  # noqa: BLE001 - the error is what is checked
            result["update"] = str(exc)
        result["table"] = [list(r) for r in spark.sql("SELECT * FROM lake.db.t ORDER BY id").collect()]
        result["snapshots"] = spark.sql("SELECT count(*) FROM lake.db.t.snapshots").collect()[0][0]
finally:
    spark.stop()
print(json.dumps(result))
