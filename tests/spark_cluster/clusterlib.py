"""Helpers of the multi-JVM Spark tests (fixtures in conftest.py): paths, environments,
the driver runner and the steps of the standalone run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servers import HOST

HERE = Path(__file__).resolve().parent
MASTER_KEY = "master"
ROWS = 3000
NATIVE_DELETED = 100  # rows the standalone run deletes from its native-read table
#: bound on a JVM's start (it takes ~3-8 s on the 2-core test machines)
START_TIMEOUT = 90.0
#: bound on one driver subprocess (a hang guard, never an assertion on time)
DRIVER_TIMEOUT = 400.0
#: variables the worker JVM does not inherit (see conftest.py)
_STRIPPED = ("ICECRYPT_KEYSTORE", "PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")


def spark_home() -> Path:
    """The pyspark package directory, which is SPARK_HOME for the pip-installed pyspark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Spark JVM started here (no KMS access, no checkout on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in _STRIPPED and not k.startswith("AWS_")}
    env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": HOST, "SPARK_DAEMON_MEMORY": "512m",
                "SPARK_NO_DAEMONIZE": "1", "AWS_EC2_METADATA_DISABLED": "true"})
    env.update(extra or {})
    return env


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running standalone cluster."""

    url: str  # spark://127.0.0.1:P
    master_ui: int
    work_dir: Path  # the worker's work directory (executors run in app-*/<n>/ below it)
    logs: Path


@dataclasses.dataclass(frozen=True)
class Connect:
    """A running Spark Connect server."""

    url: str  # sc://127.0.0.1:P
    log: Path


def log_tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def alive_workers(ui_port: int) -> list[dict]:
    with urllib.request.urlopen(f"http://{HOST}:{ui_port}/json/", timeout=2) as response:
        state = json.load(response)
    return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]


def run_driver(script: str, spec: Mapping, *, env: Mapping[str, str] | None = None, cwd: Path,
               python: str | None = None) -> dict:
    """Run ``tests/spark_cluster/<script>`` with ``spec`` (JSON, as its one argument) and
    return the JSON object on the last line of its stdout; fail with its stderr if it
    exits non-zero or prints no result."""
    spec_path = cwd / f"{Path(script).stem}-spec.json"
    spec_path.write_text(json.dumps(spec))
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    full_env.update({"SPARK_LOCAL_IP": HOST, "PYSPARK_DRIVER_PYTHON": sys.executable,
                     "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))})
    full_env.update(env or {})
    proc = subprocess.run([python or sys.executable, str(HERE / script), str(spec_path)], env=full_env, cwd=str(cwd),
                          capture_output=True, text=True, timeout=DRIVER_TIMEOUT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, (f"driver {script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                            f"{proc.stderr[-6000:]}")
    return json.loads(lines[-1])


# --- the standalone run ---------------------------------------------------------------------


def driver_conf() -> dict[str, str]:
    """The session settings of every cluster driver: small JVMs, loopback only, no UI."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.executor.cores": "2",
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.task.maxFailures": "1",  # a KMS failure is reported at once, not retried 4 times
        # as every test JVM: tests/conftest.py's TEST_JVM_OPTIONS, which the master and worker get
        "spark.executor.extraJavaOptions": os.environ.get("SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1"),
    }


def standalone_steps(root, kms_file: dict, kms_env: dict) -> list[dict]:
    def write(name, fmt, path, options, first=0, rows=ROWS, mode="append"):
        return {"name": name, "op": "write", "format": fmt, "path": str(root / path), "options": options,
                "first": first, "rows": rows, "mode": mode}

    def read(name, fmt, path, options):
        return {"name": name, "op": "read", "format": fmt, "path": str(root / path), "options": options}

    steps = [{"name": "probe", "op": "probe"}]
    for fmt in ("avro", "parquet"):
        source = f"icecrypt.{fmt}"
        manifest = {"keys.manifest": str(root / f"{fmt}-keys.json"), "encryption.key-id": MASTER_KEY}
        steps += [write(f"{fmt}_write", source, fmt, {**kms_file, "encryption.key-id": MASTER_KEY, **manifest}),
                  read(f"{fmt}_read", source, fmt, {**kms_file, **manifest})]
        # key transport, with the KMS only the driver can use
        task_manifest = {"keys.manifest": str(root / f"{fmt}-task-keys.json"), "encryption.key-id": MASTER_KEY}
        writing = {**kms_env, "encryption.key-id": MASTER_KEY}
        steps += [
            write(f"{fmt}_write_executor_keys", source, f"{fmt}-executor", {**writing, **task_manifest}),
            write(f"{fmt}_write_task_keys", source, f"{fmt}-task", {**writing, **task_manifest,
                                                                     "keys.transport": "task"}),
            read(f"{fmt}_read_executor_keys", source, f"{fmt}-task", {**kms_env, **task_manifest}),
            read(f"{fmt}_read_task_keys", source, f"{fmt}-task", {**kms_env, **task_manifest,
                                                                   "keys.transport": "task"}),
        ]
    table = "table"
    steps += [
        write("ice_create", "icecrypt.iceberg", table, {**kms_file, "table-key-id": MASTER_KEY}),
        # the Python source's write (the others take Spark's writer: the driver is registered)
        write("ice_append", "icecrypt.iceberg", table, {**kms_file, "native": "false"}, first=ROWS, rows=1000),
        read("ice_read", "icecrypt.iceberg", table, kms_file),
        # executors never call the KMS: the same table with the driver-only KMS
        write("ice_append_driver_kms", "icecrypt.iceberg", table, kms_env, first=ROWS + 1000, rows=500),
        read("ice_read_driver_kms", "icecrypt.iceberg", table, kms_env),
    ]
    # Spark's own Parquet reader in the executor's JVM (icecrypt.spark.read_table), keys from
    # the driver only; then a delete (its deletion vector applied on Spark's reader) and a tampered file
    native = "native-table"
    steps += [
        write("native_create", "icecrypt.iceberg", native, {**kms_file, "table-key-id": MASTER_KEY}),
        {**read("native_read", "icecrypt.iceberg", native, kms_env), "native": "true"},
        {"name": "native_delete", "op": "delete", "path": str(root / native), "where": f"id < {NATIVE_DELETED}"},
        {**read("native_read_deletes", "icecrypt.iceberg", native, kms_env), "native": "true"},
        # spark.read.format("icecrypt.iceberg"), routed to the native path by icecrypt's analyzer rule
        read("native_read_routed", "icecrypt.iceberg", native, kms_env),
        {"name": "native_tamper", "op": "tamper", "path": str(root / native)},
        {**read("native_read_tampered", "icecrypt.iceberg", native, kms_env), "native": "true"},
    ]
    # Spark SQL through icecrypt's catalog (SQL_CATALOG, set up by sql_catalog_conf): a MERGE
    # INTO's copy-on-write rewrite in the executors, keys from the driver only
    t = f"{SQL_CATALOG}.db.orders"
    steps += [
        {"name": "sql_namespace", "op": "sql", "statement": f"CREATE NAMESPACE {SQL_CATALOG}.db"},
        {"name": "sql_create", "op": "sql", "statement": f"CREATE TABLE {t} (id bigint, category string, "
         f"amount double) USING iceberg PARTITIONED BY (category) TBLPROPERTIES ('encryption.key-id'='{MASTER_KEY}')"},
        {"name": "sql_insert", "op": "sql", "statement": f"INSERT INTO {t} SELECT id, concat('c', id % 3), "
         f"id * 1.5 FROM range({SQL_ROWS})"},
        {"name": "sql_merge", "op": "sql", "statement": f"MERGE INTO {t} t USING (SELECT id * 10 AS id, "
         f"concat('c', id % 3) AS category, -1.0 AS amount FROM range({SQL_ROWS // 5})) s "
         "ON t.id = s.id AND t.category = s.category WHEN MATCHED THEN UPDATE SET t.amount = s.amount "
         "WHEN NOT MATCHED THEN INSERT *"},
        {"name": "sql_result", "op": "sql", "statement": f"SELECT count(*), sum(amount), "
         f"count_if(amount = -1.0) FROM {t}"},
    ]
    return steps


SQL_CATALOG = "enc"
SQL_ROWS = 1000


def sql_catalog_conf(root: Path, keystore: Path) -> dict[str, str]:
    """The session settings of the standalone run's SQL catalog (its KMS: the driver's keystore)."""
    prefix = f"spark.sql.catalog.{SQL_CATALOG}"
    return {prefix: "org.icecrypt.spark.SparkCatalog", f"{prefix}.type": "sql",
            f"{prefix}.warehouse": str(root / "sql-warehouse"), f"{prefix}.encryption.kms-type": "local",
            f"{prefix}.encryption.kms.local.keystore": str(keystore)}


@dataclasses.dataclass(frozen=True)
class ClusterRun:
    root: Path  # the driver's working directory, holding the data written
    kms: Any  # a LocalKms on the run's keystore (for checks outside Spark)
    steps: dict[str, dict]  # cluster_job.py's results by step name


