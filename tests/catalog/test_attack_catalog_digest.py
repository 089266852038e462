"""Catalog tables are authenticated by a digest the catalog records (issue "Trust, part 2").

SQL (SQLite, PostgreSQL) and Glue catalogs record, in the same update as each commit's
compare-and-swap, the SHA-256 of the metadata file the commit makes current; every load,
refresh and commit compares.  The attacker rewrites the current file in place: it cannot
touch the catalog database.  Another engine committing through the same database
(PyIceberg here) moves the pointer legitimately: admitted, and recorded."""

from __future__ import annotations

import hashlib
import json

import pyarrow.fs as pafs
import pytest
from forgery import hide_newest_snapshot, AUTHENTICATOR
from test_attack_catalog_pin import setup  # noqa: F401 - the fixture: (catalog, namespace, key A, key B)
from test_pyiceberg import catalogs  # noqa: F401 - the fixture: (ours, PyIceberg's) on one database
from test_sql import SCHEMA, rows

from icecrypt import TableIdentityError, TableIntegrityError
from icecrypt.catalog import load_catalog
from icecrypt.table.commit.pin import CATALOG_DIGEST, CATALOG_DIGEST_OF


def _read(table, path: str) -> bytes:
    with table.filesystem.open_input_file(path) as f:
        return f.read()


def _write(table, path: str, data: bytes) -> None:
    with table.filesystem.open_output_stream(path) as out:
        out.write(data)


def _files(table) -> dict[str, str]:
    root = table.fs_path(table.location)
    fs = table.filesystem
    return {i.path: hashlib.sha256(_read(table, i.path)).hexdigest()
            for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if i.is_file}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
@pytest.mark.parametrize("strip", [False, True], ids=["authenticator-kept", "authenticator-removed"])
def test_a_current_file_rewritten_in_place_is_refused(setup, encrypted, strip):  # noqa: F811
    """The identity kept (key id, UUID, roots: the pins see nothing), a snapshot hidden:
    readers would silently see fewer rows.  Refused at load, refresh and commit."""
    catalog, ns, key_a, _ = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a if encrypted else None)
    table.append(rows(0, 3))
    table.append(rows(3, 6))
    holder = catalog.load_table(f"{ns}.t")
    current = table.metadata_location
    recorded = catalog._pin_get((ns,), "t")
    assert recorded[CATALOG_DIGEST] == hashlib.sha256(_read(table, current)).hexdigest()
    assert recorded[CATALOG_DIGEST_OF] == holder.metadata_store.to_recorded(current)
    doc = json.loads(_read(table, current))
    hide_newest_snapshot(doc)
    if strip:
        doc.pop(AUTHENTICATOR, None)
    _write(table, current, json.dumps(doc).encode())
    before = _files(table)
    with pytest.raises(TableIntegrityError, match="changed in place") as caught:
        catalog.load_table(f"{ns}.t")
    assert caught.value.metadata_location == current
    # a holder loaded before the rewrite reads the file again at refresh; a writer holding
    # the version as written builds on it but commits through the catalog's digest too
    with pytest.raises(TableIntegrityError):
        holder.refresh()
    with pytest.raises(TableIntegrityError):
        catalog.load_table(f"{ns}.t", check_keys=False).append(rows(6, 9))
    assert _files(table) == before  # nothing written, nothing deleted
    with pytest.raises(TableIntegrityError):
        catalog.drop_table(f"{ns}.t", purge=True)
    assert catalog.table_exists(f"{ns}.t")


def test_even_a_change_that_parses_the_same_is_refused(setup):  # noqa: F811
    """The catalog hashes the stored bytes: whitespace, key order, a gzip-compressed copy."""
    catalog, ns, key_a, _ = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    table.append(rows(0, 3))
    current = table.metadata_location
    original = _read(table, current)
    for variant in (original + b"\n", json.dumps(json.loads(original), indent=1).encode()):
        _write(table, current, variant)
        with pytest.raises(TableIntegrityError):
            catalog.load_table(f"{ns}.t")
    _write(table, current, original)
    assert catalog.load_table(f"{ns}.t").scan().to_arrow().num_rows == 3


def test_a_table_recorded_before_digests_is_admitted_then_pinned(setup):  # noqa: F811
    """A record without a digest (an earlier icecrypt): the current file is admitted, its
    digest recorded; a later rewrite is refused.  A forgery the pins catch is refused
    (TableIdentityError) and its digest never recorded."""
    catalog, ns, key_a, key_b = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    table.append(rows(0, 3))
    record = catalog._pin_get((ns,), "t")
    old_style = {k: v for k, v in record.items() if k not in (CATALOG_DIGEST, CATALOG_DIGEST_OF)}
    catalog._pin_set((ns,), "t", old_style)
    current = table.metadata_location
    original = _read(table, current)
    forged = json.loads(original)
    forged["properties"]["encryption.key-id"] = key_b
    forged.pop(AUTHENTICATOR)
    _write(table, current, json.dumps(forged).encode())
    with pytest.raises(TableIdentityError):
        catalog.load_table(f"{ns}.t")
    assert CATALOG_DIGEST not in (catalog._pin_get((ns,), "t") or {})  # never recorded for a refused version
    _write(table, current, original)
    assert catalog.load_table(f"{ns}.t").scan().to_arrow().num_rows == 3
    assert catalog._pin_get((ns,), "t")[CATALOG_DIGEST] == hashlib.sha256(original).hexdigest()
    _write(table, current, original + b" ")
    with pytest.raises(TableIntegrityError):
        catalog.load_table(f"{ns}.t")


def test_a_commit_by_another_engine_is_admitted_and_recorded(catalogs):  # noqa: F811
    """PyIceberg commits through the same database (to a format-v2 table of its own:
    PyIceberg 0.12 writes no v3): each commit moves the pointer through the database, not
    through storage.  icecrypt reads every one, records its digest, and refuses that file
    changed in place."""
    import pyarrow as pa

    ours, theirs = catalogs
    theirs.create_namespace("db")
    data = pa.table({"id": pa.array([1, 2], pa.int64())})
    theirs.create_table("db.t", schema=data.schema).append(data)
    for expected in ([1, 2], [1, 1, 2, 2]):
        loaded = ours.load_table("db.t")
        assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == expected
        record = ours._pin_get(("db",), "t")
        assert record[CATALOG_DIGEST_OF] == loaded.metadata_store.to_recorded(loaded.metadata_location)
        assert record[CATALOG_DIGEST] == hashlib.sha256(_read(loaded, loaded.metadata_location)).hexdigest()
        theirs.load_table("db.t").append(data)
    loaded = ours.load_table("db.t")
    current = loaded.metadata_location
    _write(loaded, current, _read(loaded, current) + b" ")
    with pytest.raises(TableIntegrityError):
        loaded.refresh()
    with pytest.raises(TableIntegrityError):
        ours.load_table("db.t")


def test_the_catalog_can_require_authenticated_metadata(setup):  # noqa: F811
    catalog, ns, key_a, _ = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    table.append(rows(0, 3))
    strict = load_catalog(catalog.name, **{**catalog.properties, "icecrypt.require-authenticated-metadata": "true"},
                          kms=catalog.kms)  # fmt: skip
    loaded = strict.load_table(f"{ns}.t")
    assert loaded.require_authenticated_metadata and loaded.authenticator is not None
    catalog.create_table(f"{ns}.p", SCHEMA, table_key_id=None)
    with pytest.raises(Exception, match="not encrypted"):
        strict.load_table(f"{ns}.p")
