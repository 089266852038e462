"""Time travel in reads: ``scan(snapshot_id= | as_of_timestamp= | branch= | tag=)``,
``snapshot_as_of_timestamp`` and ``snapshot_by_name``, on Java-written tables and on
icecrypt tables; refs and the snapshot log are storage input (damage is a FormatError
naming the metadata file).  icecrypt cannot make branches or tags yet, so the tests add
refs by editing the metadata document."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pyarrow as pa
import pytest
from tablelib import TABLE_NAMES, edit_metadata, expected, table_digest

from icecrypt.cli import main
from icecrypt.errors import FormatError, KeysLostError
from icecrypt.table import EncryptedTable

UTC = datetime.timezone.utc
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])


def _rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids]}, schema=SCHEMA)


def _commit_apart(table: EncryptedTable, write) -> int:
    """Run one write whose snapshot gets a timestamp later than the previous one's (the
    snapshot log is in milliseconds; two commits in one millisecond are legal but would
    make 'the snapshot current at t' ambiguous for these tests)."""
    previous = table.current_snapshot()
    while previous is not None and int(time.time() * 1000) <= previous.timestamp_ms:
        time.sleep(0.001)
    write()
    return table.current_snapshot_id


@pytest.fixture
def history(tmp_path, kms) -> tuple[EncryptedTable, list[tuple[int, int]]]:
    """An encrypted icecrypt table with append, append, delete, overwrite, append; and
    (snapshot id, live rows) of each snapshot, oldest first."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    steps = [
        (lambda: table.append(_rows(range(0, 100))), 100),
        (lambda: table.append(_rows(range(100, 150))), 150),
        (lambda: table.delete("id < 30"), 120),
        (lambda: table.overwrite(_rows(range(1000, 1010))), 10),
        (lambda: table.append(_rows(range(2000, 2007))), 17),
    ]
    return table, [(_commit_apart(table, write), rows) for write, rows in steps]


def _reload(table: EncryptedTable, *, check_keys: bool = True) -> EncryptedTable:
    return EncryptedTable.load(table.metadata_location, kms=table.kms, filesystem=table.filesystem,
                               location_map=table.location_map, check_keys=check_keys)


def _add_refs(table: EncryptedTable, **refs: tuple[int, str]) -> EncryptedTable:
    """The table with ``refs`` (name -> (snapshot id, type)) added to its metadata."""

    def change(metadata: dict) -> None:
        for name, (snapshot_id, kind) in refs.items():
            metadata.setdefault("refs", {})[name] = {"snapshot-id": snapshot_id, "type": kind}

    edit_metadata(Path(table.metadata_location), change)
    return _reload(table)


# --- by timestamp ---------------------------------------------------------------------------------


def test_as_of_timestamp_reads_what_was_current_then(history):
    table, snapshots = history
    log = [(e.snapshot_id, e.timestamp_ms) for e in table.model.snapshot_log]
    assert [s for s, _ in log] == [s for s, _ in snapshots]
    for i, ((snapshot_id, rows), (_, ts)) in enumerate(zip(snapshots, log)):
        last_ms_of_it = log[i + 1][1] - 1 if i + 1 < len(log) else ts + 86_400_000
        for moment in (ts, last_ms_of_it, datetime.datetime.fromtimestamp(ts / 1000, UTC)):
            scan = table.scan(as_of_timestamp=moment)
            assert scan.snapshot.snapshot_id == snapshot_id
            assert scan.count() == rows == scan.to_arrow().num_rows
            assert table.snapshot_as_of_timestamp(moment).snapshot_id == snapshot_id
        assert len(scan.plan_files()) == len(table.scan(snapshot_id=snapshot_id).plan_files())
    # strictly before: the previous snapshot, or none
    assert table.snapshot_as_of_timestamp(log[1][1], inclusive=False).snapshot_id == log[0][0]
    assert table.snapshot_as_of_timestamp(log[0][1], inclusive=False) is None


def test_before_the_first_snapshot_is_an_error(history):
    table, _ = history
    first = table.model.snapshot_log[0].timestamp_ms
    assert table.snapshot_as_of_timestamp(first - 1) is None
    with pytest.raises(ValueError, match="has no snapshot as of .*snapshot log starts later"):
        table.scan(as_of_timestamp=first - 1)


def test_bad_timestamps_and_combinations(history):
    table, snapshots = history
    naive = datetime.datetime(2030, 1, 1)
    with pytest.raises(ValueError, match="needs a time zone"):
        table.scan(as_of_timestamp=naive)
    for bad in (True, 1.5e12, "1700000000000"):
        with pytest.raises(TypeError, match="as_of_timestamp must be milliseconds"):
            table.scan(as_of_timestamp=bad)
    sid = snapshots[0][0]
    for kwargs in ({"snapshot_id": sid, "as_of_timestamp": 1}, {"branch": "main", "tag": "t"},
                   {"snapshot_id": sid, "branch": "main"}, {"as_of_timestamp": 1, "tag": "t"}):
        with pytest.raises(ValueError, match="at most one of snapshot_id, as_of_timestamp, branch and tag"):
            table.scan(**kwargs)
    with pytest.raises(KeyError, match="has no snapshot 12345"):
        table.scan(snapshot_id=12345)


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_table_by_timestamp(golden, name):
    """Iceberg Java's tables (enc_deletes_dek16: append, DV, equality delete, append):
    each moment reads the state Java recorded for the snapshot current then."""
    table = golden(name)
    states = {s["snapshot_id"]: s for s in expected(name)["snapshots"]}
    log = table.model.snapshot_log
    assert len(log) == len(states) >= 2
    for entry in log:
        for moment in (entry.timestamp_ms, datetime.datetime.fromtimestamp(entry.timestamp_ms / 1000, UTC)):
            scan = table.scan(as_of_timestamp=moment)
            assert scan.snapshot.snapshot_id == entry.snapshot_id
        rows = scan.to_arrow()
        assert rows.num_rows == states[entry.snapshot_id]["expected_row_count"]
        assert table_digest(rows) == states[entry.snapshot_id]["expected_digest_sha256"]
    with pytest.raises(ValueError, match="has no snapshot as of"):
        table.scan(as_of_timestamp=log[0].timestamp_ms - 1)
    # the Java table's own ref: main
    assert table.snapshot_by_name("main").snapshot_id == table.current_snapshot_id
    assert table.scan(branch="main").count() == states[table.current_snapshot_id]["expected_row_count"]


# --- by ref ------------------------------------------------------------------------------------


def test_tags_and_branches(history):
    table, snapshots = history
    (first, _), (second, rows_second), (third, rows_third) = snapshots[:3]
    table = _add_refs(table, audit=(second, "tag"), dev=(third, "branch"), first=(first, "tag"))
    assert table.scan(tag="audit").count() == rows_second
    assert table.scan(branch="dev").to_arrow().num_rows == rows_third
    assert table.scan(branch="main").count() == snapshots[-1][1]
    assert table.snapshot_by_name("audit").snapshot_id == second
    assert table.snapshot_by_name("dev").snapshot_id == third
    assert table.snapshot_by_name("main").snapshot_id == table.current_snapshot_id
    assert table.snapshot_by_name("nope") is None
    # a filtered count on a ref counts that ref's rows
    assert table.scan(tag="audit", row_filter="id >= 100").count() == 50


def test_ref_errors(history):
    table, snapshots = history
    table = _add_refs(table, audit=(snapshots[1][0], "tag"), dev=(snapshots[2][0], "branch"))
    with pytest.raises(KeyError, match=r"has no branch 'nope' \(its branches: 'dev', 'main'\)"):
        table.scan(branch="nope")
    with pytest.raises(KeyError, match=r"has no tag 'nope' \(its tags: 'audit'\)"):
        table.scan(tag="nope")
    with pytest.raises(ValueError, match="'audit' is a tag, not a branch: read it with tag='audit'"):
        table.scan(branch="audit")
    with pytest.raises(ValueError, match="'dev' is a branch, not a tag: read it with branch='dev'"):
        table.scan(tag="dev")
    with pytest.raises(ValueError, match="'main' is a branch, not a tag"):
        table.scan(tag="main")
    for bad in ("", 7):
        with pytest.raises(TypeError, match="a ref name must be a non-empty string"):
            table.scan(branch=bad)


def test_main_of_a_table_without_snapshots(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    assert table.snapshot_by_name("main") is None
    assert table.scan(branch="main").to_arrow().num_rows == 0
    with pytest.raises(KeyError, match="has no tag 'x'"):
        table.scan(tag="x")
    with pytest.raises(ValueError, match="has no snapshot as of"):
        table.scan(as_of_timestamp=datetime.datetime.now(UTC))


# --- what an attacker who writes metadata.json can do -----------------------------------------------


def test_dangling_ref_is_damage(history):
    # refs are checked when a version is loaded (as Java's TableMetadata does), so no read,
    # by ref or otherwise, ever runs on a version whose refs name snapshots it lacks
    table, _ = history
    for refs in ({"ghost": (424242, "tag")}, {"lost": (434343, "branch")}):
        with pytest.raises(FormatError, match=rf"{table.metadata_location}: ref '\w+' points at snapshot "
                                              "4[23]4[23]4[23], which is not in the table"):
            _add_refs(table, **refs)
        edit_metadata(Path(table.metadata_location), lambda metadata: metadata.pop("refs", None) and None)
    assert _reload(table).scan().count() == 17  # the repaired version reads as before


def test_main_ref_that_disagrees_with_the_current_snapshot(history):
    table, snapshots = history
    with pytest.raises(FormatError, match="ref 'main' points at snapshot .* but current-snapshot-id is"):
        _add_refs(table, main=(snapshots[0][0], "branch"))
    with pytest.raises(FormatError, match="ref 'main' is a tag"):
        _add_refs(table, main=(table.current_snapshot_id, "tag"))


def test_snapshot_log_naming_an_unknown_snapshot(history):
    table, snapshots = history
    log = [(e.snapshot_id, e.timestamp_ms) for e in table.model.snapshot_log]

    def forge(metadata: dict) -> None:
        metadata["snapshot-log"][1]["snapshot-id"] = 555555

    edit_metadata(Path(table.metadata_location), forge)
    table = _reload(table)
    # as Java: the entry chosen names a snapshot the table does not have -> an error, never another snapshot
    with pytest.raises(FormatError, match=rf"{table.metadata_location}: the snapshot-log entry at .* names "
                                          "snapshot 555555, which is not among the table's snapshots"):
        table.scan(as_of_timestamp=log[1][1])
    with pytest.raises(FormatError, match="555555"):
        table.snapshot_as_of_timestamp(log[2][1] - 1)
    # entries not chosen do not matter
    assert table.scan(as_of_timestamp=log[0][1]).count() == snapshots[0][1]
    assert table.scan(as_of_timestamp=log[2][1]).count() == snapshots[2][1]


def test_unknown_schema_of_a_snapshot_is_damage(history):
    table, snapshots = history

    def forge(metadata: dict) -> None:
        for snapshot in metadata["snapshots"]:
            if snapshot["snapshot-id"] == snapshots[1][0]:
                snapshot["schema-id"] = 77

    edit_metadata(Path(table.metadata_location), forge)
    table = _reload(table)
    with pytest.raises(FormatError, match="snapshot .* names schema 77, which is not among the table's schemas"):
        table.scan(snapshot_id=snapshots[1][0])
    table = _add_refs(table, old=(snapshots[1][0], "tag"), dev=(snapshots[1][0], "branch"))
    with pytest.raises(FormatError, match="names schema 77"):
        table.scan(tag="old")
    assert table.scan(branch="dev").count() == snapshots[1][1]  # a branch reads with the current schema


# --- which schema -----------------------------------------------------------------------------------


def test_tag_and_timestamp_read_with_the_snapshots_schema_a_branch_with_the_current(history):
    """As Iceberg's SnapshotUtil.schemaFor: a snapshot id, a moment or a tag reads with
    the schema its snapshot was written with; a branch with the table's current schema.
    (The new schema is added by editing the metadata: icecrypt has no schema evolution yet.)"""
    table, snapshots = history
    old = snapshots[1][0]

    def evolve(metadata: dict) -> None:
        current = next(s for s in metadata["schemas"] if s["schema-id"] == metadata["current-schema-id"])
        added = dict(current, **{"schema-id": 1})
        added["fields"] = [*current["fields"], {"id": 3, "name": "extra", "required": False, "type": "int"}]
        metadata["schemas"].append(added)
        metadata["current-schema-id"] = 1
        metadata["last-column-id"] = 3
        metadata.setdefault("refs", {}).update({"audit": {"snapshot-id": old, "type": "tag"},
                                                "dev": {"snapshot-id": old, "type": "branch"}})

    edit_metadata(Path(table.metadata_location), evolve)
    table = _reload(table)
    moment = next(e.timestamp_ms for e in table.model.snapshot_log if e.snapshot_id == old)
    for kwargs in ({"snapshot_id": old}, {"as_of_timestamp": moment}, {"tag": "audit"}):
        scan = table.scan(**kwargs)
        assert scan.arrow_schema.names == ["id", "s"], kwargs
        assert scan.count() == snapshots[1][1]
    scan = table.scan(branch="dev")
    assert scan.arrow_schema.names == ["id", "s", "extra"]
    rows = scan.to_arrow()
    assert rows.num_rows == snapshots[1][1] and rows.column("extra").null_count == rows.num_rows
    assert table.scan().arrow_schema.names == ["id", "s", "extra"]


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_scan_time_travel(history, capfd):
    table, snapshots = history
    table = _add_refs(table, audit=(snapshots[1][0], "tag"), dev=(snapshots[2][0], "branch"))
    where = table.metadata_location
    kms = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]

    def count(*options) -> tuple[int, str]:
        status = main(["table", "scan", where, "--count", *kms, *map(str, options)])
        out, err = capfd.readouterr()
        return status, out.strip() if status == 0 else err

    moment = table.model.snapshot_log[3].timestamp_ms
    iso = datetime.datetime.fromtimestamp(moment / 1000, UTC).isoformat(timespec="milliseconds")
    assert count("--snapshot-id", snapshots[0][0]) == (0, "100")
    assert count("--snapshot", snapshots[0][0]) == (0, "100")
    assert count("--as-of-timestamp", moment) == (0, "10")
    assert count("--as-of-timestamp", iso) == (0, "10")
    assert count("--tag", "audit") == (0, "150")
    assert count("--branch", "dev") == (0, "120")
    status, err = count("--branch", "audit")
    assert status != 0 and "'audit' is a tag, not a branch" in err
    status, err = count("--tag", "nope")
    assert status != 0 and "has no tag 'nope'" in err
    status, err = count("--tag", "audit", "--branch", "dev")
    assert status != 0 and "at most one of" in err
    status, err = count("--as-of-timestamp", "yesterday-ish")
    assert status != 0 and "--as-of-timestamp: not a date/time" in err
    status, err = count("--snapshot-id", 12345)
    assert status != 0 and "has no snapshot 12345" in err and "Traceback" not in err


def test_time_travel_does_not_bypass_encryption(history):
    """A forged snapshot without ``key-id`` (its manifest list would be plaintext),
    reachable by a tag or by the snapshot log, is refused like the current one would be."""
    from icecrypt.table import PlaintextFileError

    table, snapshots = history
    forged_id = 987654321

    def forge(metadata: dict) -> None:
        original = next(s for s in metadata["snapshots"] if s["snapshot-id"] == snapshots[0][0])
        forged = {k: v for k, v in original.items() if k != "key-id"}
        forged["snapshot-id"] = forged_id
        forged["timestamp-ms"] = original["timestamp-ms"] - 10
        metadata["snapshots"].append(forged)
        metadata["snapshot-log"].insert(0, {"snapshot-id": forged_id, "timestamp-ms": forged["timestamp-ms"]})
        metadata["refs"]["old"] = {"snapshot-id": forged_id, "type": "tag"}

    edit_metadata(Path(table.metadata_location), forge)
    with pytest.raises(KeysLostError, match=f"snapshot {forged_id} has no key-id"):
        _reload(table)  # refused at load already; opened for inspection, each read still refuses it
    table = _reload(table, check_keys=False)
    moment = table.model.snapshot_log[0].timestamp_ms
    for kwargs in ({"tag": "old"}, {"as_of_timestamp": moment}, {"snapshot_id": forged_id}):
        with pytest.raises(PlaintextFileError, match=f"snapshot {forged_id} of an encrypted table has no key-id"):
            table.scan(**kwargs).to_arrow()
    assert table.scan().count() == snapshots[-1][1]


def test_pyiceberg_agrees(history):
    """PyIceberg, reading the same metadata document, picks the same snapshot for every
    moment and ref."""
    from pyiceberg.table import StaticTable

    table, snapshots = history
    table = _add_refs(table, audit=(snapshots[1][0], "tag"), dev=(snapshots[3][0], "branch"))
    theirs = StaticTable.from_metadata(table.metadata_location)
    moments = [e.timestamp_ms + d for e in table.model.snapshot_log for d in (-1, 0, 1)]
    for moment in moments:
        for inclusive in (True, False):
            mine = table.snapshot_as_of_timestamp(moment, inclusive=inclusive)
            other = theirs.snapshot_as_of_timestamp(moment, inclusive=inclusive)
            assert (mine and mine.snapshot_id) == (other and other.snapshot_id), (moment, inclusive)
    for name in ("audit", "dev", "main", "nope"):
        mine, other = table.snapshot_by_name(name), theirs.snapshot_by_name(name)
        assert (mine and mine.snapshot_id) == (other and other.snapshot_id), name
