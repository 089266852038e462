"""Commits: concurrent writers (table objects in turn, threads, processes, S3), and
failures at every stage of an append leaving the table exactly as it was."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from test_write_roundtrip import CATEGORY, SCHEMA, digest, make_rows, stored_files

from icecrypt import CommitConflictError, KmsError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.commit import store as _commit
from icecrypt.table.ops import write as _write


@pytest.fixture
def kms():
    return MemoryKms.with_iceberg_test_keys()


def _versions(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "metadata").glob("v*.metadata.json"))


def _snapshot_chain(table: EncryptedTable) -> None:
    """Snapshots form one line: sequence numbers 1..n, each the child of the previous,
    row ids handed out without gaps or overlaps."""
    snapshots = table.metadata["snapshots"]
    assert [s["sequence-number"] for s in snapshots] == list(range(1, len(snapshots) + 1))
    assert [s.get("parent-snapshot-id") for s in snapshots] == [None] + [s["snapshot-id"] for s in snapshots[:-1]]
    next_row = 0
    for s in snapshots:
        assert s["first-row-id"] == next_row
        next_row += s["added-rows"]
    assert table.metadata["next-row-id"] == next_row


# --- concurrent commits ------------------------------------------------------------------------------


def test_two_table_objects_appending_in_turn(tmp_path, kms):
    root = tmp_path / "t"
    EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    a = EncryptedTable.load(str(root), kms=kms)
    b = EncryptedTable.load(str(root), kms=kms)
    chunks = [make_rows(i * 100, i * 100 + 100) for i in range(4)]
    a.append(chunks[0])
    b.append(chunks[1])  # b still holds v1: its commit finds v2 taken and is re-applied on top
    a.append(chunks[2])
    b.append(chunks[3])
    assert _versions(root) == [f"v{n}.metadata.json" for n in range(1, 6)]
    assert a.current_snapshot_id != b.current_snapshot_id  # a still shows what it committed
    for table in (a.refresh(), b, EncryptedTable.load(str(root), kms=kms)):
        assert digest(table.scan().to_arrow()) == digest(pa.concat_tables(chunks))
    _snapshot_chain(a)
    # a single KEK serves every snapshot, even though the first two commits raced for it
    keks = [k for k in a.metadata["encryption-keys"] if k["encrypted-by-id"] == "keyA"]
    assert len(keks) == 1


def _race(monkeypatch, rival) -> None:
    """Let ``rival()`` commit at the worst moment: after the next operation has read the
    table and written its files, right before it commits (a real concurrent commit)."""
    original = _write._commit_change

    def racing(*args, **kwargs):
        monkeypatch.setattr(_write, "_commit_change", original)
        rival()
        return original(*args, **kwargs)

    monkeypatch.setattr(_write, "_commit_change", racing)


def test_append_losing_a_race_is_reapplied(tmp_path, kms, monkeypatch):
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(make_rows(0, 100))
    rival = EncryptedTable.load(str(root), kms=kms)
    _race(monkeypatch, lambda: rival.append(make_rows(100, 200)))
    table.append(make_rows(200, 300))
    assert digest(table.scan().to_arrow()) == digest(pa.concat_tables([make_rows(0, 100), make_rows(100, 200), make_rows(200, 300)]))
    _snapshot_chain(table)
    assert table.metadata["snapshots"][-1]["summary"]["manifests-kept"] == "2"
    # the manifest list of the lost first attempt was removed; the second one is the snapshot's
    lists = sorted(p.name for p in (root / "metadata").glob("snap-*.avro"))
    assert len(lists) == 3 and Path(table.metadata["snapshots"][-1]["manifest-list"]).name in lists


@pytest.mark.parametrize("operation", ["overwrite", "delete"])
def test_overwrite_or_delete_losing_a_race_is_refused(tmp_path, kms, monkeypatch, operation):
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(make_rows(0, 300))
    rival = EncryptedTable.load(str(root), kms=kms)
    # the rival's rows would survive an overwrite / escape a delete planned without them
    _race(monkeypatch, lambda: rival.append(make_rows(300, 400)))
    with pytest.raises(CommitConflictError, match="another writer committed first"):
        if operation == "overwrite":
            table.overwrite(make_rows(1000, 1010))
        else:
            table.delete("id >= 250")
    after = EncryptedTable.load(str(root), kms=kms)
    assert len(after.snapshots()) == 2 and after.metadata["snapshots"][-1]["summary"]["operation"] == "append"
    assert digest(after.scan().to_arrow()) == digest(pa.concat_tables([make_rows(0, 300), make_rows(300, 400)]))
    assert after.verify().ok
    _assert_no_orphans(after, root)


def _assert_no_orphans(table: EncryptedTable, root: Path) -> None:
    """Nothing of a refused commit is left: every data, delete, manifest and manifest
    list file on disk is referenced by some snapshot of the table."""
    target = _write._Target.of(table)
    manager = target.manager(table.metadata)
    io = target.io(manager)
    referenced: set[Path] = set()
    for snapshot in table.metadata["snapshots"]:
        referenced |= {Path(table.fs_path(p)) for p in _write._referenced_files(io, manager, snapshot, {}, live_only=False)}
    on_disk = {p for p in stored_files(root) if p.suffix in (".avro", ".parquet", ".puffin")}
    assert on_disk - referenced == set()


def test_delete_and_overwrite_work_from_the_newest_version(tmp_path, kms):
    """A stale object is not a conflict by itself: operations start from the newest
    committed version."""
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA")
    stale = EncryptedTable.load(str(root), kms=kms)
    table.append(make_rows(0, 300))
    stale.delete("id < 100")
    assert digest(table.refresh().scan().to_arrow()) == digest(make_rows(0, 300).slice(100))
    table.overwrite(make_rows(0, 10))
    stale.append(make_rows(10, 20))
    assert digest(table.refresh().scan().to_arrow()) == digest(pa.concat_tables([make_rows(0, 10), make_rows(10, 20)]))
    _snapshot_chain(table)


def test_threads_racing(tmp_path, kms):
    root = tmp_path / "t"
    EncryptedTable.create(
        str(root), SCHEMA, kms=kms, table_key_id="keyA", properties={"commit.retry.num-retries": "100"}
    )
    threads, appends = 4, 3
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            table = EncryptedTable.load(str(root), kms=kms)
            barrier.wait()
            for k in range(appends):
                lo = (n * appends + k) * 50
                table.append(make_rows(lo, lo + 50))
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    table = EncryptedTable.load(str(root), kms=kms)
    expected = pa.concat_tables([make_rows(i * 50, i * 50 + 50) for i in range(threads * appends)])
    assert digest(table.scan().to_arrow()) == digest(expected)
    assert len(table.snapshots()) == threads * appends
    assert _versions(root) == sorted(f"v{n}.metadata.json" for n in range(1, threads * appends + 2))
    _snapshot_chain(table)
    assert not [p for p in stored_files(root) if p.name.startswith(".")]


_PROCESS_APPEND = textwrap.dedent(
    """
    import sys
    sys.path[:0] = sys.argv[3].split("|")
    from test_write_roundtrip import make_rows
    from icecrypt.kms.memory import MemoryKms
    from icecrypt.table import EncryptedTable
    root, worker = sys.argv[1], int(sys.argv[2])
    table = EncryptedTable.load(root, kms=MemoryKms.with_iceberg_test_keys())
    for k in range(2):
        lo = (worker * 2 + k) * 40
        table.append(make_rows(lo, lo + 40))
    """
)


@pytest.mark.slow
def test_processes_racing(tmp_path, kms):
    root = tmp_path / "t"
    EncryptedTable.create(
        str(root), SCHEMA, kms=kms, table_key_id="keyA", properties={"commit.retry.num-retries": "100"}
    )
    path = "|".join([str(Path(__file__).parent), str(Path(__file__).parents[1])])
    workers = [
        subprocess.Popen([sys.executable, "-c", _PROCESS_APPEND, str(root), str(n), path]) for n in range(3)
    ]
    assert [w.wait(timeout=300) for w in workers] == [0, 0, 0]
    table = EncryptedTable.load(str(root), kms=kms)
    expected = pa.concat_tables([make_rows(i * 40, i * 40 + 40) for i in range(6)])
    assert digest(table.scan().to_arrow()) == digest(expected)
    _snapshot_chain(table)


def test_retries_run_out(tmp_path, kms, monkeypatch):
    """An append cannot conflict: commit.retry.num-retries does not stop it (it is
    re-applied on the newer version), commit.retry.total-timeout-ms does."""
    root = tmp_path / "t"
    table = EncryptedTable.create(
        str(root), SCHEMA, kms=kms, table_key_id="keyA", properties={"commit.retry.num-retries": "0"}
    )
    rival = EncryptedTable.load(str(root), kms=kms)
    _race(monkeypatch, lambda: rival.append(make_rows(0, 10)))
    table.append(make_rows(10, 20))  # num-retries 0, yet re-applied on top of the rival's commit
    assert _versions(root) == ["v1.metadata.json", "v2.metadata.json", "v3.metadata.json"]
    _snapshot_chain(table)
    table.update_properties().set("commit.retry.total-timeout-ms", "0").commit()
    rival.refresh()
    _race(monkeypatch, lambda: rival.append(make_rows(20, 30)))
    # with no time to retry in, the append gives up, leaving no trace
    with pytest.raises(CommitConflictError, match="retries exhausted"):
        table.append(make_rows(30, 40))
    assert _versions(root)[-1] == "v5.metadata.json" and len(_versions(root)) == 5
    _assert_no_orphans(EncryptedTable.load(str(root), kms=kms), root)


# --- failures leave the table as it was ---------------------------------------------------------------


def _snapshot_state(root: Path) -> tuple[set[Path], bytes, list[str]]:
    versions = _versions(root)
    return set(stored_files(root)), (root / "metadata" / versions[-1]).read_bytes(), versions


@pytest.fixture
def populated(tmp_path, kms):
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(make_rows(0, 500))
    return table, root


def test_failure_while_reading_the_input(populated, kms):
    table, root = populated
    state = _snapshot_state(root)

    def batches():
        yield from make_rows(500, 900).to_batches(max_chunksize=100)
        raise RuntimeError("source went away")

    with pytest.raises(RuntimeError, match="source went away"):
        table.append(batches(), target_file_size=1)  # several files finished before the failure
    assert _snapshot_state(root) == state
    assert digest(table.scan().to_arrow()) == digest(make_rows(0, 500))


def test_failure_with_bad_rows(populated):
    table, root = populated
    state = _snapshot_state(root)
    bad = make_rows(500, 600).set_column(0, pa.field("id", pa.int64()), pa.array([None] * 100, pa.int64()))
    good = make_rows(600, 700).cast(bad.schema)
    with pytest.raises(ValueError, match="required column 'id'"):
        table.append([*good.to_batches(), *bad.to_batches()], target_file_size=1)
    assert _snapshot_state(root) == state
    with pytest.raises(ValueError, match="not in the table schema"):
        table.append(make_rows(0, 5).append_column("extra", pa.array(range(5))))
    assert _snapshot_state(root) == state


def test_kms_failure_when_creating_the_kek(tmp_path, kms):
    root = tmp_path / "t"
    EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA")
    state = _snapshot_state(root)
    # the first commit creates the KEK; a KMS without the master key refuses to wrap it
    # (the load already asks it to unwrap the key of the version's authenticator)
    with pytest.raises(KmsError):
        table = EncryptedTable.load(str(root), kms=MemoryKms({"keyB": b"1123456789012345"}))
        table.append(make_rows(0, 100))
    assert _snapshot_state(root) == state


def test_failure_creating_the_version_file(populated, monkeypatch):
    table, root = populated
    state = _snapshot_state(root)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(_commit, "_create_exclusive", broken)
    with pytest.raises(OSError, match="disk full"):
        table.append(make_rows(500, 600))
    assert _snapshot_state(root) == state


def test_a_lost_version_hint_does_not_undo_a_commit(populated, monkeypatch, kms):
    table, root = populated

    def broken(*args, **kwargs):
        raise OSError("hint not writable")

    monkeypatch.setattr(_commit, "_write_hint", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        snapshot_id = table.append(make_rows(500, 600))
    assert any("version hint not updated" in str(w.message) for w in caught)
    assert (root / "metadata" / "version-hint.text").read_text() == "2"
    fresh = EncryptedTable.load(str(root), kms=kms)
    assert fresh.current_snapshot_id == snapshot_id
    assert digest(fresh.scan().to_arrow()) == digest(pa.concat_tables([make_rows(0, 500), make_rows(500, 600)]))


def test_create_refuses_an_existing_table_and_a_bad_key(tmp_path, kms):
    EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    with pytest.raises(FileExistsError):
        EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    with pytest.raises(KmsError):
        EncryptedTable.create(str(tmp_path / "u"), SCHEMA, kms=kms, table_key_id="no-such-key")
    assert not (tmp_path / "u").exists()
    with pytest.raises(ValueError, match="data key length"):
        EncryptedTable.create(
            str(tmp_path / "v"), SCHEMA, kms=kms, table_key_id="keyA", properties={"encryption.data-key-length": "20"}
        )


# --- a filesystem without atomic create: S3 (moto) ---------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("boto3")
    from servers.moto import moto_server

    with moto_server() as server:
        server.boto3_client("s3").create_bucket(Bucket="warehouse")
        yield server


def _s3_filesystem(server):
    return pafs.S3FileSystem(
        endpoint_override=f"{server.host}:{server.port}", scheme="http", access_key=server.access_key_id,
        secret_key=server.secret_access_key, region=server.region,
    )  # fmt: skip


@pytest.mark.servers
def test_tables_on_s3(s3, kms):
    fs = _s3_filesystem(s3)
    assert not _commit.is_atomic(fs)
    table = EncryptedTable.create("s3://warehouse/db/t", SCHEMA, kms=kms, table_key_id="keyA",
                                  partition_spec=CATEGORY, filesystem=fs)  # fmt: skip
    assert table.metadata["location"] == "s3://warehouse/db/t"
    stale = EncryptedTable.load("warehouse/db/t", kms=kms, filesystem=fs)
    table.append(make_rows(0, 200))
    stale.append(make_rows(200, 300), file_format="avro")  # v2 exists: detected, re-applied as v3
    table.delete("id < 20")
    fresh = EncryptedTable.load("warehouse/db/t", kms=kms, filesystem=fs)
    assert digest(fresh.scan().to_arrow()) == digest(pa.concat_tables([make_rows(0, 200), make_rows(200, 300)]).slice(20))
    _snapshot_chain(fresh)
    infos = fs.get_file_info(pafs.FileSelector("warehouse/db/t", recursive=True))
    names = [i.path for i in infos if i.type == pafs.FileType.File]
    assert sorted(n.rsplit("/", 1)[1] for n in names if n.endswith(".metadata.json")) == [
        f"v{n}.metadata.json" for n in range(1, 5)
    ]
    for name in names:
        if name.endswith((".parquet", ".avro", ".puffin")):
            with fs.open_input_file(name) as f:
                assert f.read(4) in (b"PARE", b"AGS1"), name


def test_job_leftovers_are_found_by_operation_id(tmp_path, kms):
    """A distributed job names its data files with one operation id: after committing what
    its tasks reported, remove_job_leftovers deletes what a dead attempt wrote (same id,
    not reported), and nothing else — not the committed files, not another job's."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    job, other = "11111111-2222-3333-4444-555555555555", "99999999-2222-3333-4444-555555555555"
    dead = _write.write_files(table, make_rows(0, 50), operation_id=job, task_id=7)       # never reported
    retried = _write.write_files(table, make_rows(0, 50), operation_id=job, task_id=8)
    foreign = _write.write_files(table, make_rows(50, 60), operation_id=other, task_id=1)
    assert all(f"-{job}-" in f["file_path"] and "/00007-" in f["file_path"] for f in dead)
    _write.append_files(table, retried)
    removed = _write.remove_job_leftovers(table, job, [f["file_path"] for f in retried])
    assert sorted(removed) == sorted(table.locations.to_fs_path(f["file_path"]) for f in dead)
    for f in retried + foreign:
        assert Path(table.locations.to_fs_path(f["file_path"])).exists()
    assert EncryptedTable.load(table.metadata_location, kms=kms).scan().to_arrow().num_rows == 50
