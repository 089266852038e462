"""A Spark driver for the cluster tests: runs the steps of a JSON spec, prints one JSON result.

Run as ``python cluster_job.py spec.json`` (see ``conftest.run_driver``).  The spec::

    {"master": "spark://127.0.0.1:P" | "sc://127.0.0.1:P" | "local[2]",
     "conf": {...},            # session configuration (ignored for sc://)
     "env": {...},             # set in os.environ before the session starts
     "archive": "/path/env.tar",  # optional: icecrypt.spark.use_archive(archive) first
     "configure": true,        # optional: icecrypt.spark.configure(builder) (the jar)
     "steps": [{"name": ..., "op": "probe" | "write" | "read", ...}, ...]}

Steps:

* ``probe`` — one task per partition (``partitions``, default 2) reports where its
  Python runs: ``sys.executable``, ``sys.prefix``, ``icecrypt.__file__`` (or the import
  error), the working directory and whether ``ICECRYPT_KEYSTORE`` is set.
* ``write`` — ``rows`` rows (``id``, ``category``, ``amount``; ids from ``first``) in
  ``partitions`` partitions written with ``format``/``options``/``mode`` to ``path``.
* ``delete`` / ``tamper`` — on the driver, with the table API and the keystore the
  driver's ``ICECRYPT_KEYSTORE`` names: rows matching ``where`` deleted from the table at
  ``path``, or one byte flipped in a data file of it that has no deletes (``victim``).
* ``sql`` — ``spark.sql(statement)`` collected: its rows (as lists).
* ``read`` — the rows at ``path`` read with ``format``/``options`` (with ``native``:
  ``icecrypt.spark.read_table`` with that option): count, id sum, a digest of the sorted
  rows and whether the plan scans with Spark's Parquet reader, applies deletes there
  (icecrypt's LiveRows format) and has Python tasks.

Every step also reports how long it took (``seconds``; for the report, never asserted).

A failing step records ``{"ok": false, "error": <message>}`` and the run goes on; the
result is ``{"steps": {name: {...}}, "spark_version": ...}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback


def rows_digest(rows: list[tuple]) -> str:
    """A digest of rows (id, category, amount), order-independent; the tests compute it too."""
    h = hashlib.sha256()
    for row in sorted(rows):
        h.update(repr(tuple(row)).encode())
    return h.hexdigest()


def expected_rows(first: int, count: int) -> list[tuple]:
    return [(i, str(i % 7), i * 0.5) for i in range(first, first + count)]


def _probe(_index, _iterator):
    import os
    import sys

    try:
        import icecrypt

        where = icecrypt.__file__
    except ImportError as exc:
        where = f"ImportError: {exc}"
    yield {"executable": sys.executable, "prefix": sys.prefix, "icecrypt": where, "cwd": os.getcwd(),
           "keystore_env": "ICECRYPT_KEYSTORE" in os.environ, "pid": os.getpid()}


def _frame(spark, step):
    from pyspark.sql import functions as F

    first, count = step.get("first", 0), step["rows"]
    df = spark.range(first, first + count, numPartitions=step.get("partitions", 2))
    return df.select(F.col("id"), (F.col("id") % 7).cast("string").alias("category"),
                     (F.col("id") * 0.5).alias("amount"))


def _spark_written(path: str) -> set[str]:
    data = os.path.join(path, "data")
    return {os.path.join(d, f) for d, _, files in os.walk(data) for f in files
            if f.startswith("part-") and f.endswith(".parquet")}


def run_step(spark, step: dict) -> dict:
    op = step["op"]
    if op == "probe":
        rdd = spark.sparkContext.parallelize(range(step.get("partitions", 2)), step.get("partitions", 2))
        return {"executors": rdd.mapPartitionsWithIndex(_probe).collect()}
    if op == "sql":
        return {"rows": [list(r) for r in spark.sql(step["statement"]).collect()]}
    if op == "write":
        before = _spark_written(step["path"])
        writer = _frame(spark, step).write.format(step["format"]).options(**step.get("options", {}))
        writer.mode(step.get("mode", "append")).save(step["path"])
        # the data files Spark's own Parquet writer added (the native write of icecrypt.iceberg)
        return {"spark_writer_files": len(_spark_written(step["path"]) - before)}
    if op == "read":
        if "native" in step:  # icecrypt.spark.read_table with option native=<step's value>
            import icecrypt.spark

            df = icecrypt.spark.read_table(spark, step["path"], **step.get("options", {}), native=step["native"])
        else:
            df = spark.read.format(step["format"]).options(**step.get("options", {})).load(step["path"])
        rows = [tuple(r) for r in df.select("id", "category", "amount").collect()]
        jdf = getattr(df, "_jdf", None)  # None through Spark Connect
        plan = jdf.queryExecution().executedPlan().toString() if jdf is not None else ""
        return {"count": len(rows), "id_sum": sum(r[0] for r in rows), "digest": rows_digest(rows),
                "partitions": step.get("report_partitions") and df.rdd.getNumPartitions(),
                "spark_parquet_scan": "FileScan parquet" in plan or "FileScan icecrypt-live-rows" in plan,
                "python_tasks": "MapInArrow" in plan, "deletes_filter": "FileScan icecrypt-live-rows" in plan}
    if op in ("delete", "tamper"):  # on the driver, with the table API and the driver's KMS
        from icecrypt.kms.local import LocalKms
        from icecrypt.table import EncryptedTable

        table = EncryptedTable.load(step["path"], kms=LocalKms(os.environ["ICECRYPT_KEYSTORE"]))
        if op == "delete":
            table.delete(step["where"])
            return {}
        # one byte flipped in the middle of a data file without deletes (one the native path reads)
        victim = next(t.file.fs_path for t in table.scan().plan_files() if not t.deletes)
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0x01]))
        return {"victim": victim}
    raise ValueError(f"unknown op {op!r}")


def session(spec: dict):
    from pyspark.sql import SparkSession

    import icecrypt.spark

    master = spec["master"]
    if master.startswith("sc://"):
        return SparkSession.builder.remote(master).getOrCreate()
    conf = dict(spec.get("conf", {}))
    if spec.get("archive"):
        conf.update(icecrypt.spark.use_archive(spec["archive"]))
    builder = SparkSession.builder.master(master).appName(spec.get("app", "icecrypt-cluster-test"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    if spec.get("configure"):  # icecrypt's jar in spark.jars: every executor has it from the start
        builder = icecrypt.spark.configure(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    os.environ.update(spec.get("env", {}))
    import icecrypt.spark

    spark = session(spec)
    results: dict[str, dict] = {}
    try:
        icecrypt.spark.register(spark)
        for step in spec["steps"]:
            started = time.monotonic()
            try:
                results[step["name"]] = {"ok": True, **run_step(spark, step)}
            except Exception as exc:  # recorded for the test to judge
                message = f"{type(exc).__name__}: {exc}"  # Spark's messages end in long JVM traces
                results[step["name"]] = {"ok": False, "error": message[:6000],
                                         "trace": traceback.format_exc()[-2000:]}
            results[step["name"]]["seconds"] = round(time.monotonic() - started, 2)  # reported, never asserted
        version = spark.version
    finally:
        spark.stop()
    print(json.dumps({"steps": results, "spark_version": version}))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
