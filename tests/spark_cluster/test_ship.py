"""Shipping icecrypt to executors as a packed virtual environment, on the standalone cluster.

The executors' environment is not the driver's: a fresh venv holding icecrypt built from
this working tree and its runtime dependencies (``shipenv.py``), packed by
:func:`icecrypt.spark.pack_environment` and shipped with the settings of
:func:`icecrypt.spark.use_archive` (``spark.archives`` + ``PYSPARK_PYTHON``).  Every
step of the standalone run (``cluster_run``, test_standalone.py) runs on it; here the
executors report where their Python and icecrypt come from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import icecrypt.spark
import shipenv
from icecrypt.errors import IcecryptError

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_executors_import_icecrypt_from_the_archive(cluster_run, spark_standalone):
    probe = cluster_run.steps["probe"]
    assert probe["ok"], probe
    driver_prefix = str(Path(sys.prefix).resolve())
    for executor in probe["executors"]:
        prefix = executor["prefix"]
        # unpacked by Spark into the executor's directory under the worker's work dir
        assert prefix.startswith(str(spark_standalone.work_dir)) and prefix.endswith("/icecrypt-env"), executor
        assert executor["executable"] == prefix + "/bin/python", executor
        assert executor["icecrypt"].startswith(prefix + "/lib/"), executor
        assert "/site-packages/icecrypt/" in executor["icecrypt"], executor
        assert not prefix.startswith(driver_prefix) and not executor["icecrypt"].startswith(str(shipenv.ROOT))


def test_driver_workers_use_the_driver_environment(cluster_run):
    # the driver's own Python workers (schema, planning, commit) ran ./icecrypt-env/bin/python
    # in the driver's directory, which use_archive made a link to the driver's environment
    link = cluster_run.root / "icecrypt-env"
    assert link.is_symlink() and link.resolve() == Path(sys.prefix).resolve()
    assert cluster_run.steps["avro_write"]["ok"] and cluster_run.steps["ice_read"]["ok"]


def test_archive_contents(executor_archive):
    assert {"pyarrow", "fastavro", "pyiceberg"} <= set(executor_archive["distributions"])
    assert executor_archive["archive"].endswith(".tar.gz") and executor_archive["archive_bytes"] > 0
    print("executor environment:", {k: executor_archive[k] for k in ("archive_bytes", "files", "seconds")})


# --- the helpers' checks (no cluster) --------------------------------------------------------


def test_executor_conf(tmp_path):
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"not read")
    assert icecrypt.spark.executor_conf(archive) == {
        "spark.archives": f"{archive}#icecrypt-env", "spark.pyspark.python": "./icecrypt-env/bin/python"}
    assert icecrypt.spark.executor_conf("s3://bucket/env.zip", name="e")["spark.archives"] == "s3://bucket/env.zip#e"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        icecrypt.spark.executor_conf(tmp_path / "missing.tar.gz")
    with pytest.raises(ValueError, match="must end with"):
        icecrypt.spark.executor_conf("s3://bucket/env.tar")
    with pytest.raises(ValueError, match="plain directory name"):
        icecrypt.spark.executor_conf(archive, name="a/b")


def test_use_archive_links_the_driver_environment(tmp_path, monkeypatch):
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"not read")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    # use_archive sets PYSPARK_PYTHON itself: setenv first so that monkeypatch restores the
    # variable's state (delenv of an absent variable records nothing, and the value leaked into
    # later tests' subprocesses on this worker)
    monkeypatch.setenv("PYSPARK_PYTHON", "")
    monkeypatch.delenv("PYSPARK_PYTHON")
    conf = icecrypt.spark.use_archive(archive)
    assert os.environ["PYSPARK_PYTHON"] == "./icecrypt-env/bin/python" == conf["spark.pyspark.python"]
    assert (work / "icecrypt-env").resolve() == Path(sys.prefix).resolve()
    assert icecrypt.spark.use_archive(archive) == conf  # again: the link is kept
    (work / "other").mkdir()
    with pytest.raises(IcecryptError, match="has no bin/python"):
        icecrypt.spark.use_archive(archive, name="other")


def test_pack_environment_refuses(tmp_path):
    with pytest.raises(IcecryptError, match="is not a virtual environment"):
        icecrypt.spark.pack_environment(tmp_path / "x.tar.gz", prefix=tmp_path)
    # a venv without an installed icecrypt (as this checkout's, where it is editable)
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    with pytest.raises(IcecryptError, match="no installed icecrypt"):
        icecrypt.spark.pack_environment(tmp_path / "x.tar.gz", prefix=venv)
    (tmp_path / "exists.tar.gz").write_bytes(b"")
    with pytest.raises(FileExistsError, match="exists"):
        icecrypt.spark.pack_environment(tmp_path / "exists.tar.gz", prefix=venv)
    with pytest.raises(ValueError, match="must end with"):
        icecrypt.spark.pack_environment(tmp_path / "x.tar", prefix=sys.prefix)
