"""Attempts that outlive their job: a task attempt still writing when the driver commits or
aborts (a failed task's writer, a speculative copy) leaves nothing behind.

Spark's own timing decides when that happens, so these tests take the writer objects as
Spark uses them (built on the "driver", pickled to a "task") and put the driver's
``commit``/``abort`` at each point of a task's write: before it starts, while it writes,
between writing its file and publishing it.  No Spark session is needed.
"""

from __future__ import annotations

import pickle
import posixpath
from itertools import count

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from faults.faultfs import FailingHandler

pytest.importorskip("pyspark")

from icecrypt import avro, parquet  # noqa: E402
from icecrypt.errors import IcecryptError  # noqa: E402
from icecrypt.keys.manifest import read_key_manifest  # noqa: E402
from icecrypt.kms.local import LocalKms  # noqa: E402
from icecrypt.spark._avro import AvroWriter  # noqa: E402
from icecrypt.spark._parquet import ParquetWriter  # noqa: E402

MASTER_KEY = "master"
TABLE = pa.table({"id": pa.array(range(300), pa.int64()), "s": [f"r{i}" for i in range(300)]})
READERS = {".parquet": parquet.read_table, ".avro": avro.read}


_ATTEMPTS = count(1)


class _Attempts:
    """A new task attempt id per write (outside Spark every write is attempt 0)."""

    def _task_path(self) -> str:
        return f"{self.directory}/part-00000-{self.job_id}-{next(_ATTEMPTS)}{self.extension}"


class Parquet(_Attempts, ParquetWriter):
    pass


class Avro(_Attempts, AvroWriter):
    pass


@pytest.fixture(params=[Parquet, Avro], ids=["parquet", "avro"])
def job(request, tmp_path):
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, [MASTER_KEY])
    out = tmp_path / "out"
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
               "encryption.key-id": MASTER_KEY, "keys.manifest": str(tmp_path / "keys.json"), "path": str(out)}
    writer = request.param(options, None, False)
    return writer, out, LocalKms(keystore)


def _task(writer):
    """The writer as a task gets it."""
    return pickle.loads(pickle.dumps(writer))


def _everything(out):
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))


def test_the_staging_directory_is_hidden_and_gone_after_commit(job):
    writer, out, kms = job
    assert _everything(out) == [f".icecrypt-{writer.job_id}", f".icecrypt-{writer.job_id}/_open"]
    message = _task(writer).write(iter(TABLE.to_batches(max_chunksize=100)))
    (written,) = message.files
    writer.commit([message])
    name = written.uri.rsplit("/", 1)[1]
    assert _everything(out) == [name]
    keys = read_key_manifest(out.parent / "keys.json", kms)
    assert READERS[writer.extension](written.uri, keys[written.uri]).equals(TABLE)


def test_an_attempt_started_after_abort_writes_nothing(job):
    writer, out, _ = job
    task = _task(writer)
    writer.abort([])
    assert _everything(out) == []
    with pytest.raises(IcecryptError, match="before this attempt published .*part-00000"):
        task.write(iter(TABLE.to_batches(max_chunksize=100)))
    assert _everything(out) == []


def test_an_abort_while_an_attempt_writes_leaves_nothing(job):
    writer, out, _ = job
    task = _task(writer)

    def batches():
        yield from TABLE.slice(0, 100).to_batches()
        writer.abort([])  # the driver gives up on the job while the file is half written
        yield from TABLE.slice(100).to_batches(max_chunksize=100)

    with pytest.raises(IcecryptError, match="before this attempt published .*part-00000"):
        task.write(batches())
    assert _everything(out) == []


def test_an_abort_before_an_attempt_publishes_leaves_nothing(job, monkeypatch):
    writer, out, _ = job
    task = _task(writer)
    write_file = type(task).write_file

    def then_abort(self, *args, **kwargs):
        result = write_file(self, *args, **kwargs)
        writer.abort([])  # the file is complete in the staging directory, not yet published
        return result

    monkeypatch.setattr(type(task), "write_file", then_abort)
    with pytest.raises(IcecryptError, match="ended .committed or aborted. before this attempt published"):
        task.write(iter(TABLE.to_batches()))
    assert _everything(out) == []


def test_a_straggler_after_commit_is_refused_and_an_unreported_attempt_removed(job):
    writer, out, kms = job
    reported = _task(writer).write(iter(TABLE.to_batches()))
    unreported = _task(writer).write(iter(TABLE.to_batches()))  # a copy Spark discarded
    straggler = _task(writer)
    writer.commit([reported])
    with pytest.raises(IcecryptError, match="before this attempt published"):
        straggler.write(iter(TABLE.to_batches()))
    (kept,) = reported.files
    assert unreported.files[0].uri != kept.uri
    assert _everything(out) == [kept.uri.rsplit("/", 1)[1]]
    assert list(read_key_manifest(out.parent / "keys.json", kms)) == [kept.uri]


def test_a_failed_commit_then_abort_leaves_nothing(job, tmp_path):
    writer, out, _ = job
    message = _task(writer).write(iter(TABLE.to_batches()))
    (tmp_path / "keystore.json").unlink()  # the commit cannot reach the KMS
    with pytest.raises(Exception, match="keystore"):
        writer.commit([message])
    writer.abort([message])
    assert _everything(out) == []
    assert not (tmp_path / "keys.json").exists()


def test_cleanup_never_follows_a_link_planted_as_the_staging_directory(tmp_path):
    """Storage is input: a link planted where a job with a known id (option
    ``write.job-id``) will stage, to a directory of the attacker's choosing, is removed as
    a link before the job makes its own staging directory, and a link planted inside that
    directory is removed as a link; what they point to is left alone."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"keep")
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, [MASTER_KEY])
    out = tmp_path / "out"
    out.mkdir()
    job_id = "c" * 32
    (out / f".icecrypt-{job_id}").symlink_to(victim)
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
               "encryption.key-id": MASTER_KEY, "keys.manifest": str(tmp_path / "keys.json"), "path": str(out),
               "write.job-id": job_id}
    writer = Parquet(options, None, False)
    assert not (out / f".icecrypt-{job_id}").is_symlink() and sorted(p.name for p in victim.iterdir()) == ["precious"]
    (out / f".icecrypt-{job_id}" / "planted").symlink_to(victim)
    writer.abort([])
    assert _everything(out) == []
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert (victim / "precious").read_bytes() == b"keep"


class _HdfsLike(FailingHandler):
    """Local files with HDFS's two traits that matter here: ``move`` is a rename, and
    creating a file creates its missing parent directories."""

    def get_type_name(self) -> str:
        return "hdfs"

    def open_output_stream(self, path: str, metadata):
        self.base.create_dir(posixpath.dirname(path), recursive=True)
        return super().open_output_stream(path, metadata)


@pytest.mark.parametrize("writer_class", [Parquet, Avro], ids=["parquet", "avro"])
def test_a_late_attempt_on_a_filesystem_that_creates_directories_publishes_nothing(tmp_path, monkeypatch,
                                                                                  writer_class):
    """Where writing a file creates its directory (HDFS), a late attempt recreates the
    staging directory; without the driver's marker in it, the attempt does not publish."""
    from icecrypt.spark import _write

    filesystem = pafs.PyFileSystem(_HdfsLike(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())))
    monkeypatch.setattr(_write, "output_location", lambda options: (filesystem, "out", ""))
    # a Python-implemented filesystem's type is "py::hdfs": taken for HDFS itself here
    monkeypatch.setattr(_write, "renames_atomically", lambda fs: fs is filesystem)
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, [MASTER_KEY])
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
               "encryption.key-id": MASTER_KEY, "keys.manifest": str(tmp_path / "keys.json"), "path": "out"}
    writer = writer_class(options, None, False)
    before = _task(writer)
    kept = before.write(iter(TABLE.to_batches()))  # published before the job ended: listed, removed
    late = _task(writer)
    writer.abort([])
    with pytest.raises(IcecryptError, match="before this attempt published"):
        late.write(iter(TABLE.to_batches()))
    assert kept.files and not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
