"""A Spark job in a process of its own, for the tests of how sessions are built
(test_session_setup.py): ``python session_job.py MODE DIR``, printing one JSON line.

MODE ``plain``: a ``local[1]`` session built without ``icecrypt.spark.configure``; the
sources registered twice; prints the warnings raised.  MODE ``configured``: a session built
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
finally:
    spark.stop()
print(json.dumps(result))
