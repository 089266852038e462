"""pytest plugin: one PySpark ``local[2]`` session for the whole test run.

A session costs ~7 s to start and ~3 s for its first job, so every test that needs Spark
shares this one.  The JVM is PySpark's own gateway process, started with loopback only and
no UI; ``spark.stop()`` and the gateway shutdown at the end of the run stop it.

Use the ``spark`` fixture (it marks nothing by itself; mark such tests ``@pytest.mark.spark``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

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


#: first on the path of the shared session's Python workers: its ``sitecustomize`` has Spark's
#: worker daemon import, once, the thread-free modules every fork of it used to import again
WORKER_PRELOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_preload")

#: the directories :func:`compiled_spark_home` made, removed by :func:`stop_spark`
_HOMES: list[str] = []


def compiled_spark_home() -> str:
    """A SPARK_HOME for a local session whose Python workers import pyspark compiled.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's source zip first on every
    Python worker's path, and a zip holds sources only: each worker (the UDF workers, and the
    ones each data source call of planning, writing and streaming starts) compiles the pyspark
    modules it imports again.  Measured here: ``pyspark.worker`` and a data source worker's
    modules take 2.0 s of CPU from the zips, 0.6 s from the installed package; a ``make
    test`` starts several hundred workers (Spark stops one left idle for a minute).

    This home is the pip-installed pyspark's (its ``bin``, ``jars``, ``conf`` ... linked),
    without ``python/``: the zips' paths then name nothing, and the workers import the same
    release from the installed package (this interpreter's, as ``PYSPARK_PYTHON`` says), with
    its bytecode.  For the suite's local sessions only: an executor elsewhere has no
    installed pyspark and needs the zip (the cluster tests keep the real home)."""
    import pyspark

    real = os.path.dirname(os.path.realpath(pyspark.__file__))
    home = tempfile.mkdtemp(prefix="icecrypt-spark-home-")
    _HOMES.append(home)
    for name in os.listdir(real):
        if name != "python":
            os.symlink(os.path.join(real, name), os.path.join(home, name))
    return home


def start_spark(app_name: str = "icecrypt-tests", master: str = "local[2]", *, compiled_pyspark: bool = False):
    """Start a local Spark session whose Python workers run this interpreter.

    ``compiled_pyspark``: those workers import pyspark compiled, not from Spark's zip
    (:func:`compiled_spark_home`), and are forks of a daemon that imported pyspark's worker
    modules and pyiceberg's models once (:data:`WORKER_PRELOAD`).  The suite's shared
    session sets it; the benchmarks keep Spark's own layout."""
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

    saved = {name: os.environ.get(name) for name in ("SPARK_HOME", "PYTHONPATH")}
    if compiled_pyspark:
        # The JVM keeps the environment it starts with (its Python workers' paths are made
        # from its SPARK_HOME and PYTHONPATH); this process's own is given back once the
        # JVM runs.
        os.environ["SPARK_HOME"] = compiled_spark_home()
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (WORKER_PRELOAD, saved["PYTHONPATH"])))
    try:
        session = icecrypt.spark.configure(builder).getOrCreate()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
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
    while _HOMES:
        shutil.rmtree(_HOMES.pop(), ignore_errors=True)  # links only: their targets stay


@pytest.fixture(scope="session")
def spark():
    """The shared ``local[2]`` SparkSession (Java 17 and pyspark required)."""
    require_module("pyspark")
    session = start_spark(compiled_pyspark=True)
    try:
        yield session
    finally:
        stop_spark(session)


@pytest.fixture(scope="session")
def jvm(spark):
    """The py4j view of the Spark driver JVM (parquet-mr, Hadoop classes)."""
    return spark.sparkContext._jvm
