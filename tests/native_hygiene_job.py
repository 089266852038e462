"""A Spark application for tests/test_secrets_hygiene.py: reads an encrypted table through
``icecrypt.spark.read_table`` (native path and Python part) and appends to it through the
native write path, with the UI on, an uncompressed
event log and the JVM's log at DEBUG, and writes what Spark shows to OUT/:
``explain.txt`` (every explain mode and the query execution), ``rest.json`` (the UI's
REST answers), ``control.txt`` (the value of the read's file-keys option and the write's
secret in hex: the search must find the DEKs in it).  Its stdout and stderr (driver and local executors' logs) are
captured by the test.

    python tests/native_hygiene_job.py TABLE_DIR KEYSTORE OUT
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from spark_fixtures import spark_conf  # noqa: E402

import icecrypt.spark  # noqa: E402
from icecrypt.spark import _native, _native_write  # noqa: E402


def main(table_dir: str, keystore: str, out: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    builder = SparkSession.builder.master("local[2]").appName("icecrypt-hygiene")
    for key, value in spark_conf().items():
        builder = builder.config(key, value)
    builder = (icecrypt.spark.configure(builder).config("spark.ui.enabled", "true").config("spark.ui.port", "0")
               .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", os.path.join(out, "events"))
               .config("spark.eventLog.compress", "false"))
    os.makedirs(os.path.join(out, "events"), exist_ok=True)
    spark = builder.getOrCreate()
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": keystore}
    control = []
    original = _native._file_keys
    _native._file_keys = lambda files: control.append(original(files)) or control[-1]
    new_secret = _native_write._new_secret
    _native_write._new_secret = lambda: control.append(new_secret().hex()) or bytes.fromhex(control[-1])
    spark.sparkContext.setLogLevel("DEBUG")
    try:
        df = icecrypt.spark.read_table(spark, table_dir, **options, native="true")
        print("rows", df.count(), sorted(df.groupBy("s").agg(F.count("*"), F.sum("id")).collect()))
        print("filtered", df.where("id < 5").select("id").collect())
        # the same read through spark.read.format("icecrypt.iceberg"), routed by the analyzer rule
        icecrypt.spark.register(spark)
        routed = spark.read.format("icecrypt.iceberg").options(**options).option("native", "true").load(table_dir)
        print("routed", routed.count(), sorted(routed.groupBy("s").agg(F.count("*"), F.sum("id")).collect()))
        # a routed append by Spark's Parquet writer (the write's secret in its options)
        more = spark.range(200, 260).selectExpr("id", "concat('w', id % 3) AS s")
        more.write.format("icecrypt.iceberg").options(**options).option("native", "true").mode("append").save(table_dir)
        print("written", icecrypt.spark.read_table(spark, table_dir, **options).count())
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            for frame in (df, routed):
                for mode in ("simple", "extended", "codegen", "cost", "formatted"):
                    frame.groupBy("s").count().explain(mode)
        text.write(df._jdf.queryExecution().toString())
        text.write(routed._jdf.queryExecution().toString())
    finally:
        spark.sparkContext.setLogLevel("ERROR")
    save_outputs(spark, out, text.getvalue(), control)
    spark.stop()


def save_outputs(spark, out: str, explain: str, control: list[str]) -> None:
    """OUT/explain.txt, OUT/control.txt and OUT/rest.json (the UI's REST answers) of a job
    (also tests/sql_hygiene_job.py's)."""
    with open(os.path.join(out, "explain.txt"), "w") as f:
        f.write(explain)
    with open(os.path.join(out, "control.txt"), "w") as f:
        f.write("\n".join(control))
    base = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"
    rest = {}
    for endpoint in ("sql?details=true&planDescription=true", "environment", "stages?details=true", "jobs",
                     "executors", "allexecutors", "storage/rdd"):
        with urllib.request.urlopen(f"{base}/{endpoint}") as answer:
            rest[endpoint] = answer.read().decode()
    with open(os.path.join(out, "rest.json"), "w") as f:
        json.dump(rest, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
