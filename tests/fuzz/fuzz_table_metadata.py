"""Fuzz harness: the table loader's metadata parser (``EncryptedTable.load`` of a
``metadata.json``: JSON or gzip, PyIceberg's model, the encryption manager, snapshots)
and the unwrapping of each snapshot's manifest-list key metadata.

Input: the bytes of the metadata file (written to a private temporary directory and
loaded from there, as a table would be).  KMS: Iceberg's test KMS (``keyA``, ``keyB``).
Seeds: every ``metadata.json`` of the Java tables in ``../shared/tables`` (read in
place), and a gzip-compressed copy of one.

Oracle:

* only ``icecrypt.DecryptionError`` (``FormatError``, including
  ``PlaintextFileError``, and ``AuthenticationError``), ``EncryptionKeyNotFoundError``
  and ``KmsError`` may be raised, by the load or by unwrapping a snapshot's key
  metadata; never another exception, no hang;
* no unauthenticated output: every manifest-list key metadata that unwraps is one Java
  wrapped into a seed table.
"""

from __future__ import annotations

import gzip
from functools import lru_cache

from fuzzlib import Finding, memory_kms, write_file

from icecrypt import DecryptionError, EncryptionKeyNotFoundError, KmsError
from icecrypt.table import EncryptedTable
from vectorlib import TABLES_DIR

ALLOWED = (DecryptionError, EncryptionKeyNotFoundError, KmsError)


@lru_cache(maxsize=None)
def _seed_files() -> tuple[bytes, ...]:
    files = [p.read_bytes() for p in sorted(TABLES_DIR.glob("*/metadata/*.metadata.json"))]
    return tuple(files + [gzip.compress(files[-1], mtime=0)])


def seeds() -> list[bytes]:
    return list(_seed_files())


def _keys(data: bytes) -> list:
    table = EncryptedTable.load(write_file("v1.metadata.json", data), kms=memory_kms())
    table.current_snapshot()
    out = []
    for snapshot in table.snapshots():
        try:
            out.append(table.manifest_list_key_metadata(snapshot))
        except ALLOWED:
            pass
    return out


@lru_cache(maxsize=None)
def authentic() -> frozenset:
    found = set()
    for data in _seed_files():
        found.update(km for km in _keys(data) if km is not None)
    return frozenset(found)


def check(data: bytes) -> None:
    keys = authentic()
    for km in _keys(data):
        if km is not None and km not in keys:
            raise Finding("a snapshot's manifest-list key metadata unwrapped to one no seed table holds")
