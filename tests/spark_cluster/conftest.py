"""Session fixtures of the multi-JVM Spark tests: a standalone cluster and a Spark Connect server.

* ``spark_standalone`` — a master and one worker (2 cores, 2 GiB for executors), separate
  JVMs started from the pyspark wheel (``$SPARK_HOME/bin/spark-class``), on 127.0.0.1 with
  free ports; yields a :class:`Cluster` (``url`` is ``spark://127.0.0.1:P``).
* ``executor_archive`` — the packed environment the executors run (``shipenv.py``), and
  ``cluster_run`` — one driver run of every standalone step on it (test_standalone.py
  and test_ship.py judge its results).
* ``spark_connect`` — a Spark Connect server (``spark-submit --class ...SparkConnectServer``,
  ``local[2]``, 1 GiB driver); yields a :class:`Connect` (``url`` is ``sc://127.0.0.1:P``).

Each starts once per pytest session and is stopped by its process id (the process group:
the worker's executors and their Python workers go with it).  The worker runs with an
environment stripped of everything that could reach a KMS or this checkout
(``ICECRYPT_KEYSTORE``, ``AWS_*``, ``PYTHONPATH``): what executors can do they get from the
application (``spark.executorEnv.*``, ``spark.archives``) or from the options, as on a real
cluster.

A process can hold one SparkContext and the suite already has its ``local[2]`` session,
so every driver runs in a subprocess: ``clusterlib.run_driver`` runs a script of this directory
with the venv's Python and returns the JSON object it prints last on stdout.

A JVM that does not start fails the test under ``ICECRYPT_REQUIRE_SERVERS=1`` and skips it
otherwise (:func:`servers.unavailable`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from clusterlib import (
    MASTER_KEY,
    START_TIMEOUT,
    Cluster,
    ClusterRun,
    Connect,
    alive_workers,
    log_tail,
    sql_catalog_conf,
    standalone_steps,
    driver_conf,
    run_driver,
    server_env,
    spark_home,
)
from servers import (
    HOST,
    ServerStartError,
    free_port,
    require_module,
    start_process,
    stop_process,
    unavailable,
    wait_for_port,
)


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory) -> Iterator[Cluster]:
    require_module("pyspark")
    root = tmp_path_factory.mktemp("spark-standalone")
    logs = root / "logs"
    logs.mkdir()
    work_dir = root / "work"
    work_dir.mkdir()
    spark_class = spark_home() / "bin" / "spark-class"
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = server_env()
    procs: list[subprocess.Popen] = []
    try:
        try:
            master = start_process([spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                                    "--port", str(port), "--webui-port", str(ui)],
                                   env=env, cwd=root, log_path=logs / "master.log")
            procs.append(master)
            wait_for_port(HOST, port, timeout=START_TIMEOUT, proc=master)
            worker = start_process([spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://{HOST}:{port}",
                                    "--host", HOST, "--cores", "2", "--memory", "2g", "--webui-port", str(worker_ui),
                                    "--work-dir", str(work_dir)],
                                   env=env, cwd=root, log_path=logs / "worker.log")
            procs.append(worker)
            deadline = time.monotonic() + START_TIMEOUT
            while True:  # registered with the master, not just listening
                if worker.poll() is not None:
                    raise ServerStartError(f"worker exited with {worker.returncode}")
                try:
                    if alive_workers(ui):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(f"no worker registered within {START_TIMEOUT:g} s")
                time.sleep(0.2)
        except (ServerStartError, OSError) as exc:
            unavailable(f"Spark standalone cluster did not start: {exc}\n{log_tail(logs / 'master.log')}\n"
                        f"{log_tail(logs / 'worker.log')}")
        yield Cluster(f"spark://{HOST}:{port}", ui, work_dir, logs)
    finally:
        for proc in reversed(procs):  # worker first: its executors are in its process group
            stop_process(proc, timeout=15)


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory) -> Iterator[Connect]:
    require_module("pyspark")
    require_module("grpc")  # the Connect client (the connect extra)
    root = tmp_path_factory.mktemp("spark-connect")
    log = root / "connect.log"
    port = free_port()
    # The server's Python workers (the data sources run there) use this venv's Python.
    env = server_env({"PYSPARK_PYTHON": sys.executable})
    args = [spark_home() / "bin" / "spark-submit", "--master", "local[2]", "--driver-memory", "1g",
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--conf", f"spark.connect.grpc.binding.address={HOST}", "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", f"spark.driver.host={HOST}", "--conf", f"spark.driver.bindAddress={HOST}",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.sql.session.timeZone=UTC", "--conf", "spark.python.worker.reuse=true",
            "spark-internal"]
    proc = start_process(args, env=env, cwd=root, log_path=log)
    try:
        try:
            wait_for_port(HOST, port, timeout=START_TIMEOUT, proc=proc)
        except ServerStartError as exc:
            unavailable(f"Spark Connect server did not start: {exc}\n{log_tail(log)}")
        yield Connect(f"sc://{HOST}:{port}", log)
    finally:
        stop_process(proc, timeout=15)


@pytest.fixture(scope="session")
def executor_archive(tmp_path_factory) -> dict:
    """The executors' environment, packed (``shipenv.build``; ~10-35 s here, once per session)."""
    import shipenv

    return shipenv.build(tmp_path_factory.mktemp("executor-env"))


@pytest.fixture(scope="session")
def cluster_run(spark_standalone, executor_archive, tmp_path_factory) -> ClusterRun:
    """Every standalone-cluster step in one driver run (a driver, its application and its
    executor cost ~15-30 s to start here), with the executors running the shipped archive."""
    from icecrypt.kms.local import LocalKms

    root = tmp_path_factory.mktemp("standalone-run")
    keystore = root / "keystore.json"
    LocalKms.create_keystore(keystore, [MASTER_KEY])
    kms_file = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    kms_env = {"encryption.kms-type": "local"}  # the keystore comes from $ICECRYPT_KEYSTORE: the driver's only
    (root / "events").mkdir()
    conf = {**driver_conf(), "spark.eventLog.enabled": "true", "spark.eventLog.dir": (root / "events").as_uri(),
            **sql_catalog_conf(root, keystore)}
    spec = {"master": spark_standalone.url, "conf": conf, "archive": executor_archive["archive"], "configure": True,
            "env": {"ICECRYPT_KEYSTORE": str(keystore)}, "steps": standalone_steps(root, kms_file, kms_env)}
    result = run_driver("cluster_job.py", spec, cwd=root)
    return ClusterRun(root, LocalKms(keystore), result["steps"])


