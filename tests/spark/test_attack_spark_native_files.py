"""The native path reads exactly the planned data files (issue 30, Spark native read).

An attacker who can write a plaintext table's storage replaces a planned data file with a
directory of the same name holding a link to a file outside the table (another table's
payroll it cannot read itself).  Spark's file index lists the link as a leaf file of the
"directory" it was given, so the read used to hold as many files as were planned and
returned the outside file's rows.  Now the set of files Spark lists must equal the planned
set: a listed file that was not planned fails the read, naming the planned path and what
Spark found in it; the routed read's fallback (the Python path) refuses the directory too."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import icecrypt.spark
from icecrypt import FormatError
from icecrypt.spark import _native
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


@pytest.fixture(scope="module")
def rspark(spark):
    """The shared session, reads of icecrypt.iceberg routed to the native path."""
    icecrypt.spark.register(spark)
    assert _native.native_available(spark)
    return spark


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "name": [f"r{i}" for i in range(start, start + n)]})


def _payroll(tmp_path: Path) -> Path:
    """A data file of another plaintext table (field ids as the victim's: Spark reads it)."""
    other = EncryptedTable.create(str(tmp_path / "elsewhere" / "payroll"), SCHEMA, kms=None, table_key_id=None)
    other.append(pa.table({"id": pa.array([666], pa.int64()), "name": ["SECRET"]}))
    return Path(next(iter(other.scan().plan_files())).file.fs_path)


@pytest.mark.parametrize("how", ["link", "copy"])
def test_a_data_file_replaced_by_a_directory_is_never_read(rspark, tmp_path, how):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None)
    table.append(_rows(0, 3))
    table.append(_rows(3, 3))
    payroll = _payroll(tmp_path)
    victim = Path(sorted(t.file.fs_path for t in table.scan().plan_files())[0])
    victim.unlink()
    victim.mkdir()
    if how == "link":
        os.symlink(payroll, victim / "x.parquet")
    else:
        shutil.copy(payroll, victim / "x.parquet")
    with pytest.raises(FormatError) as caught:
        icecrypt.spark.read_table(rspark, table.location, encryption="none").collect()
    text = str(caught.value)
    assert f"planned data file file:{victim} is not a file: it is a directory" in text
    assert f"{victim}/x.parquet" in text and table.location in text
    # a routed read: the planner's refusal sends it to the Python path, which refuses the
    # directory itself; with native=true the analysis fails naming the file
    for native in ("auto", "true"):
        frame = None
        with pytest.raises(Exception) as caught:
            frame = rspark.read.format("icecrypt.iceberg").options(encryption="none", native=native).load(table.location)
            frame.collect()
        assert victim.name in str(caught.value) and "SECRET" not in str(caught.value)
        assert frame is None or native == "auto"
    # the attacker's directory and link are still there, the outside file untouched
    assert (victim / "x.parquet").exists() and payroll.exists()


def test_listed_files_are_compared_as_spark_qualifies_them(rspark, tmp_path):
    """The planned set is compared path for path with what Spark lists, however the path is
    spelled (a space, non-ASCII letters, ``file://`` or ``file:/``): such a table reads
    natively, all rows once."""
    table = EncryptedTable.create(str(tmp_path / "dir with space ünï" / "t"), SCHEMA, kms=None, table_key_id=None)
    for part in range(3):
        table.append(_rows(part * 10, 10))
    frame = icecrypt.spark.read_table(rspark, table.location, encryption="none", native="true")
    assert sorted(r.id for r in frame.collect()) == list(range(30))
    assert "FileScan parquet" in frame._jdf.queryExecution().executedPlan().toString()
    routing = rspark.sparkContext._jvm.org.icecrypt.spark.NativeRouting
    paths = [f"file://{t.file.fs_path}" for t in table.scan().plan_files()]
    listed = routing.listedFiles(rspark.read.parquet(*paths, paths[0])._jdf)
    assert listed.size() == 3 and sorted(str(p) for p in listed) == sorted(f"file:{t.file.fs_path}" for t in table.scan().plan_files())
