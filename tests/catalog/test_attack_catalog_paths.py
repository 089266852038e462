"""Catalog identifiers and locations under attack (issue 16, item 15, and item 2 through
``drop_table(purge=True)``): a tenant allowed one namespace must not get a table whose
location is, lies in, or holds another table's, and a purge never deletes outside the
dropped table."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from forgery import forget_recorded_digest, without_authenticator

from icecrypt.catalog import CatalogError, InvalidIdentifierError
from icecrypt.table.files.io import PathOutsideTableWarning

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
OLD = 1_000_000_000  # an mtime far older than any orphan cut-off


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "name": [f"r{i}" for i in range(start, start + n)]})


def snapshot_of(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``directory`` with its bytes and mtime (made old first, so an
    orphan sweep would take them)."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (OLD, OLD))
            files[str(path)] = (path.read_bytes(), path.stat().st_mtime_ns)
    return files


def assert_untouched(directory: Path, before: dict[str, tuple[bytes, int]]) -> None:
    after = {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink()}
    assert after == before


@pytest.mark.parametrize(
    "identifier",
    [("db", "../other/t"), ("db", "../../../x"), ("db", ".."), ("db", "."), ("db", "a/b"), ("db", "a\\b"),
     ("db", "t\x00"), ("db", "t\x1b[2J"), ("db", ""), ("db", "%2e%2e"), ("db", "x%2Fy"), ("a.b", "t"), ("db", "t.x")],
)
def test_identifier_levels_that_could_name_another_place_are_refused(sqlite_catalog, identifier):
    sqlite_catalog.create_namespace("db")
    with pytest.raises(InvalidIdentifierError, match="level|non-empty"):
        sqlite_catalog.create_table(identifier, SCHEMA, table_key_id=None)
    with pytest.raises(InvalidIdentifierError):
        sqlite_catalog.create_namespace(identifier)
    assert sqlite_catalog.list_tables("db") == []


def test_dotted_levels_never_share_a_row(sqlite_catalog):
    sqlite_catalog.create_namespace(("a", "b"))
    table = sqlite_catalog.create_table(("a", "b", "t"), SCHEMA, table_key_id=None)
    table.append(rows(0, 2))
    with pytest.raises(InvalidIdentifierError, match="'a.b'"):
        sqlite_catalog.load_table(("a.b", "t"))
    # the string form splits on dots: it is the three-level identifier
    assert sqlite_catalog.load_table("a.b.t").scan().to_arrow().num_rows == 2


def test_a_table_never_lands_inside_another_or_holds_one(sqlite_catalog, warehouse):
    sqlite_catalog.create_namespace("db")
    outer = sqlite_catalog.create_table("db.t", SCHEMA, table_key_id=None)
    # namespace db.t: its default table location <warehouse>/db/t/x is inside table db.t
    sqlite_catalog.create_namespace(("db", "t"))
    with pytest.raises(CatalogError, match="overlaps"):
        sqlite_catalog.create_table(("db", "t", "x"), SCHEMA, table_key_id=None)
    for location in (outer.location, outer.location + "/data", outer.location + "/../t/sub", warehouse + "/db"):
        with pytest.raises(CatalogError, match="overlaps"):
            sqlite_catalog.create_table("db.other", SCHEMA, table_key_id=None, location=location)
    assert sorted(sqlite_catalog.list_tables("db")) == [("db", "t")]


def test_tenant_cannot_sweep_another_tenants_table(sqlite_catalog, warehouse):
    """Item 15 as reported: a tenant of namespace ``db`` reached table ``other.t`` through
    ``("db", "../other/t")`` and its own ``remove_orphan_files``."""
    sqlite_catalog.create_namespace("other")
    victim = sqlite_catalog.create_table("other.t", SCHEMA, table_key_id=None)
    victim.append(rows(0, 5))
    victim_dir = Path(victim.location)
    before = snapshot_of(victim_dir)

    sqlite_catalog.create_namespace("db")
    for attempt in (("db", "../other/t"), ("db", "../other/t/data")):
        with pytest.raises(InvalidIdentifierError):
            sqlite_catalog.create_table(attempt, SCHEMA, table_key_id=None)
    with pytest.raises(CatalogError, match="overlaps"):
        sqlite_catalog.create_table("db.mine", SCHEMA, table_key_id=None, location=str(victim_dir / "data"))
    mine = sqlite_catalog.create_table("db.mine", SCHEMA, table_key_id=None)
    mine.append(rows(100, 2))
    # what storage access still allows: links from the tenant's table into the victim's
    os.symlink(victim_dir, Path(mine.location) / "data" / "victim")
    os.symlink(victim_dir / "metadata", Path(mine.location) / "metadata" / "victim-metadata")
    result = mine.remove_orphan_files(older_than=2**62)
    assert not any(str(victim_dir) in p or "victim" in p for p in result.orphan_files)
    assert_untouched(victim_dir, before)
    assert sqlite_catalog.load_table("other.t").verify().ok


def test_purge_never_deletes_outside_the_dropped_table(sqlite_catalog, tmp_path, kms):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victims = [elsewhere / "v9.metadata.json", elsewhere / "payroll.parquet"]
    for v in victims:
        v.write_text("victim")
    before = snapshot_of(elsewhere)
    sqlite_catalog.create_namespace("db")
    table = sqlite_catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 3))
    # the attacker edits the current metadata file in place: its log now names files elsewhere
    current = Path(table.metadata_location)
    metadata = without_authenticator(json.loads(current.read_text()))
    log = [f"file://{victims[0]}", str(victims[1]), f"{table.location}/metadata/../../../elsewhere/v9.metadata.json"]
    metadata["metadata-log"] = metadata.get("metadata-log", []) + [{"timestamp-ms": 1, "metadata-file": f} for f in log]
    current.write_text(json.dumps(metadata))
    forget_recorded_digest(table)  # (the digest refuses the edit first: the confinement is tested here)
    with pytest.warns(PathOutsideTableWarning, match="elsewhere"):
        sqlite_catalog.drop_table("db.t", purge=True)
    assert_untouched(elsewhere, before)
    assert not current.exists()  # the table's own files went


def test_a_catalog_tables_location_is_anchored_by_the_catalog(sqlite_catalog):
    """The tenant rewrites its own current metadata file in place (its storage), pointing
    ``location`` at the victim's directory: loading it is refused before anything is read,
    so its maintenance never walks the victim."""
    from icecrypt import PathOutsideTableError

    sqlite_catalog.create_namespace("other")
    victim = sqlite_catalog.create_table("other.t", SCHEMA, table_key_id=None)
    victim.append(rows(0, 5))
    victim_dir = Path(victim.location)
    before = snapshot_of(victim_dir)
    sqlite_catalog.create_namespace("db")
    mine = sqlite_catalog.create_table("db.mine", SCHEMA, table_key_id=None)
    mine.append(rows(100, 2))
    current = Path(mine.metadata_location)
    metadata = without_authenticator(json.loads(current.read_text()))
    metadata["location"] = str(victim_dir)
    current.write_text(json.dumps(metadata))
    forget_recorded_digest(mine)  # (the digest refuses the edit first: the pin is tested here)
    from icecrypt import TableIdentityError

    # the catalog recorded the table's roots: the pin says the location changed
    with pytest.raises(TableIdentityError, match="location") as caught:
        sqlite_catalog.load_table("db.mine").remove_orphan_files(older_than=2**62)
    assert str(current.name) in str(caught.value)
    # a table without a record (made by another engine): the metadata location the
    # database records anchors it
    sqlite_catalog._pin_set(("db",), "mine", None)
    with pytest.raises(PathOutsideTableError, match="anchors a catalog table") as caught:
        sqlite_catalog.load_table("db.mine").remove_orphan_files(older_than=2**62)
    assert str(current.name) in str(caught.value)
    assert_untouched(victim_dir, before)
    assert sqlite_catalog.load_table("other.t").verify().ok
