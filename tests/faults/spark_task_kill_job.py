"""Driver of tests/faults/test_spark_task_kill.py: Spark writes whose executor task dies.

Run as ``python spark_task_kill_job.py SPEC.json`` (the test does it, in a subprocess):
the shared test session is ``local[2]``, where Spark ignores ``spark.task.maxFailures``;
task retries need ``local[2,3]`` (3 attempts per task), so the scenarios run in a Spark
session of their own.  SPEC names the scenarios; the result (one entry per scenario:
succeeded or the error) is written as JSON to ``SPEC.result.json``.

The kill: the data sources registered here are icecrypt's own, under their own names
(``icecrypt.iceberg``, ``icecrypt.parquet``, ``icecrypt.avro``, so the public
``icecrypt.spark.write`` and ``df.write.format(...)`` reach them), with one difference:
the writer's input iterator is wrapped, and at batch ``test.kill-batch`` of partition
``test.kill-partition`` the Python worker writing that task calls ``os._exit(1)`` — on
attempt 0 only (``test.kill-attempts=first``) or on every attempt (``all``).  Nothing of
icecrypt's code is replaced: ``write`` runs unchanged on the wrapped iterator, so the
worker dies in the middle of icecrypt's write (after batches 1..N-1 went into it).
Every attempt and every kill leaves a marker file in ``test.log-dir`` so the test can
check that the kill happened and a retry ran.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from icecrypt.spark._avro import AvroDataSource, AvroWriter
from icecrypt.spark._iceberg import IcebergWriter
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.spark._parquet import ParquetDataSource, ParquetWriter

KILL_PARTITION = "test.kill-partition"
KILL_BATCH = "test.kill-batch"
KILL_ATTEMPTS = "test.kill-attempts"  # "first" or "all"
LOG_DIR = "test.log-dir"
TAG = "test.tag"
_TEST_OPTIONS = (KILL_PARTITION, KILL_BATCH, KILL_ATTEMPTS, LOG_DIR, TAG)


def _split(options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the options icecrypt sees, the kill settings)."""
    options = {k.lower(): v for k, v in dict(options).items()}
    kill = {name: options.pop(name) for name in _TEST_OPTIONS if name in options}
    return options, kill


def _mark(kill: Mapping[str, str], name: str) -> None:
    """Marker file ``<tag>-<name>`` holding the worker's pid (table data file names carry it)."""
    path = os.path.join(kill[LOG_DIR], f"{kill.get(TAG, 'job')}-{name}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def _killing(iterator: Iterator[Any], kill: Mapping[str, str]) -> Iterator[Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition, attempt = context.partitionId(), context.attemptNumber()
    if LOG_DIR in kill:
        _mark(kill, f"attempt-p{partition}-a{attempt}")
    target = partition == int(kill.get(KILL_PARTITION, -1)) and (kill.get(KILL_ATTEMPTS) == "all" or attempt == 0)
    for number, batch in enumerate(iterator, 1):
        if target and number == int(kill[KILL_BATCH]):
            _mark(kill, f"killed-p{partition}-a{attempt}")
            os._exit(1)  # the executor's Python worker dies mid-write: no exception, no cleanup
        yield batch


class _KillingWrites:
    """Mixin of a writer: ``write`` as icecrypt's, on an iterator that may kill the worker."""

    kill: dict[str, str] = {}

    def write(self, iterator: Iterator[Any]) -> Any:
        return super().write(_killing(iterator, self.kill))  # type: ignore[misc]


class KillingIcebergWriter(_KillingWrites, IcebergWriter):
    pass


class KillingParquetWriter(_KillingWrites, ParquetWriter):
    pass


class KillingAvroWriter(_KillingWrites, AvroWriter):
    pass


def _writer(cls: type, options: Mapping[str, str], schema: Any, overwrite: bool) -> Any:
    options, kill = _split(options)
    writer = cls(options, schema, overwrite)
    writer.kill = kill
    return writer


class KillingIceberg(IcebergDataSource):
    def writer(self, schema: Any, overwrite: bool) -> Any:
        return _writer(KillingIcebergWriter, self.options, schema, overwrite)


class KillingParquet(ParquetDataSource):
    def writer(self, schema: Any, overwrite: bool) -> Any:
        return _writer(KillingParquetWriter, self.options, schema, overwrite)


class KillingAvro(AvroDataSource):
    def writer(self, schema: Any, overwrite: bool) -> Any:
        return _writer(KillingAvroWriter, self.options, schema, overwrite)


SOURCES = (KillingIceberg, KillingParquet, KillingAvro)


def frame(spark: Any, rows: int, partitions: int) -> Any:
    """The written rows (deterministic, no shuffle: a retried task sees the same rows)."""
    return spark.range(0, rows, 1, partitions).selectExpr(
        "id", "concat('c', cast(id % 7 as string)) as category", "cast(id as double) * 0.5 as amount")


def expected_rows(rows: int) -> list[tuple[int, str, float]]:
    return [(i, f"c{i % 7}", i * 0.5) for i in range(rows)]


def _run(spark: Any, scenario: dict[str, Any], spec: dict[str, Any]) -> None:
    import icecrypt.spark

    kms = spec["kms"]
    df = frame(spark, scenario["rows"], scenario["partitions"])
    kill = {KILL_PARTITION: str(scenario["kill_partition"]), KILL_BATCH: str(scenario["kill_batch"]),
            KILL_ATTEMPTS: scenario["kill_attempts"], LOG_DIR: spec["log_dir"], TAG: scenario["name"]}
    how = scenario["how"]
    if how == "iceberg":
        (df.write.format("icecrypt.iceberg").options(**kms).options(**kill).options(**scenario.get("options", {}))
         .mode("append").save(scenario["path"]))
    elif how == "spark.write":  # README: icecrypt.spark.write(df, path, format=..., kms_properties=..., ...)
        icecrypt.spark.write(df, scenario["path"], format=scenario["format"], kms_properties=kms,
                             table_key_id=spec["master"], options={**kill, **scenario.get("options", {})})
    elif how == "df.write":  # README's module docstring form: df.write.format("icecrypt.avro")...
        (df.write.format(f"icecrypt.{scenario['format']}").options(**kms).options(**kill)
         .option("encryption.key-id", spec["master"]).option("keys.manifest", scenario["manifest"])
         .options(**scenario.get("options", {})).mode("append").save(scenario["path"]))
    else:
        raise ValueError(how)


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    sys.path.insert(0, spec["tests_dir"])
    from spark_fixtures import spark_conf, stop_spark
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spec["master_url"]).appName("icecrypt-task-kill")
    for key, value in {**spark_conf(), **spec["conf"]}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")  # the killed workers' stack traces are expected
    results = {}
    try:
        for source in SOURCES:  # under icecrypt's own names: replaces nothing else
            spark.dataSource.register(source)
        for scenario in spec["scenarios"]:
            try:
                _run(spark, scenario, spec)
                results[scenario["name"]] = {"ok": True}
            except Exception as exc:  # the job-level failure scenarios end here
                results[scenario["name"]] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    finally:
        stop_spark(spark)
    with open(spec_path + ".result.json", "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    # Import this file as its module (not __main__), so the data source classes pickle by
    # reference and the Python workers import them from PYTHONPATH.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import spark_task_kill_job

    sys.exit(spark_task_kill_job.main(sys.argv[1]))
