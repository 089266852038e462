"""pytest plugin: one PySpark ``local[2]`` session for the whole test run.

A session costs ~7 s to start and ~3 s for its first job, so every test that needs Spark
shares this one.  The JVM is PySpark's own gateway process, started with loopback only and
no UI; ``spark.stop()`` and the gateway shutdown at the end of the run stop it.

Use the ``spark`` fixture (it marks nothing by itself; mark such tests ``@pytest.mark.spark``).
"""

from __future__ import annotations

import os
import sys

import pytest

from servers import require_module


def spark_conf() -> dict[str, str]:
    """The configuration of the shared session (also used by the benchmarks)."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1000000",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g",
        "spark.python.worker.reuse": "true",
    }


def start_spark(app_name: str = "icecrypt-tests", master: str = "local[2]"):
    """Start a local Spark session whose Python workers run this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in spark_conf().items():
        builder = builder.config(key, value)
    # icecrypt's jar and session extension, as users of the native path build their sessions:
    # once icecrypt.spark.register is called, icecrypt.iceberg reads take the native path
    import icecrypt.spark

    session = icecrypt.spark.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_spark(session) -> None:
    """Stop the session and its JVM gateway (nothing is left running)."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            # The gateway JVM exits when its stdin closes (PySpark's launcher protocol).
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except Exception:
                proc.kill()
                proc.wait(timeout=10)
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture(scope="session")
def spark():
    """The shared ``local[2]`` SparkSession (Java 17 and pyspark required)."""
    require_module("pyspark")
    session = start_spark()
    try:
        yield session
    finally:
        stop_spark(session)


@pytest.fixture(scope="session")
def jvm(spark):
    """The py4j view of the Spark driver JVM (parquet-mr, Hadoop classes)."""
    return spark.sparkContext._jvm
