"""What the tests' storage attacker does to a table's metadata files, and what an engine
that does not know icecrypt's metadata authenticator (Iceberg Java, PyIceberg) leaves.

Every version icecrypt writes of an encrypted table carries an authenticator
(``icecrypt.table.commit.authenticity``): a forged version that keeps it is refused by any
reader.  An attacker who wants a fresh load without ``require_authenticated_metadata`` to
take the version therefore removes it, as a commit by another engine would; the tests of
the defences behind authentication (the pin, key checks, path confinement) forge that way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the top-level field of metadata.json holding icecrypt's authenticator
AUTHENTICATOR = "icecrypt-authenticator"


def without_authenticator(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` (a metadata.json document, changed in place) without icecrypt's
    authenticator, as Iceberg Java and PyIceberg write what they read."""
    metadata.pop(AUTHENTICATOR, None)
    return metadata


def strip_authenticators(root: Path) -> None:
    """Rewrite every metadata file of the table at ``root`` without its authenticator: the
    table as a version of icecrypt before authentication (or another engine) left it."""
    for path in sorted((Path(root) / "metadata").glob("*.metadata.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if AUTHENTICATOR in doc:
            path.write_text(json.dumps(without_authenticator(doc)), encoding="utf-8")


def legacy(table: Any) -> Any:
    """``table`` (an EncryptedTable of a path table) made a table whose versions carry no
    authenticator, as a version of icecrypt before authentication (or Iceberg Java) left
    it, and loaded again: its later icecrypt commits stay unauthenticated, so that tests
    reach the defences behind authentication (the pin, the KEK checks, confinement)."""
    from icecrypt.table import EncryptedTable

    root = Path(table.fs_path(table.location))
    strip_authenticators(root)
    return EncryptedTable.load(str(root), kms=table.kms, filesystem=table.filesystem,
                               location_map=table.location_map or None)  # fmt: skip


def forget_recorded_digest(table: Any) -> None:
    """Drop the SHA-256 a catalog recorded for ``table``'s current metadata file, as if the
    file had been made current by another engine's commit (or by icecrypt before digests):
    the catalog then admits what the file holds and the other defences -- the pins, the
    authenticator, the key checks -- are what stands against an in-place rewrite.  Tests of
    those defences on catalog tables call this after their attacker rewrote the file; the
    digest itself is tested in tests/catalog/test_attack_catalog_digest.py."""
    from icecrypt.table.commit.pin import CATALOG_DIGEST, CATALOG_DIGEST_OF

    store = table.metadata_store
    record = store.catalog._pin_get(store.namespace, store.name) or {}
    store.catalog._pin_set(store.namespace, store.name,
                           {k: v for k, v in record.items() if k not in (CATALOG_DIGEST, CATALOG_DIGEST_OF)})  # fmt: skip
    store._digests.clear()


def publish_next_version(root: Path, change, *, strip: bool = True) -> Path:
    """What storage's attacker writes into the path table at ``root``: the newest
    ``v<N>.metadata.json`` with ``change(doc)`` applied, as ``v<N+1>.metadata.json``, and
    the version hint pointed at it; ``strip``: without the authenticator (which would
    refuse the edit).  Returns the new file."""
    metadata_dir = Path(root) / "metadata"
    newest = max(metadata_dir.glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
    doc = json.loads(newest.read_text(encoding="utf-8"))
    if strip:
        without_authenticator(doc)
    change(doc)
    version = int(newest.name[1:].split(".")[0]) + 1
    path = metadata_dir / f"v{version}.metadata.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    (metadata_dir / "version-hint.text").write_text(str(version))
    return path


def hide_newest_snapshot(doc: dict[str, Any]) -> None:
    """A forged descendant that keeps the table's identity (key id, UUID, roots: nothing a
    pin sees) but hides its newest snapshot: readers would silently see fewer rows."""
    last = doc["snapshots"].pop()
    doc["current-snapshot-id"] = last["parent-snapshot-id"]
    doc["refs"]["main"]["snapshot-id"] = last["parent-snapshot-id"]
    doc["snapshot-log"] = doc["snapshot-log"][:-1]
