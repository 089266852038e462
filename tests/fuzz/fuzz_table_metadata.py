"""Fuzz harness: the table loader's metadata parser (``EncryptedTable.load`` of a
``metadata.json``: JSON or gzip, PyIceberg's model, the encryption manager, snapshots)
and the unwrapping of each snapshot's manifest-list key metadata.

Input: the bytes of the metadata file (written to ``t/metadata/v1.metadata.json`` in a
private temporary directory and loaded from there, as a table would be, with the seed
tables' ``s3://icecrypt-golden/<name>`` locations mapped onto ``t``).  KMS: Iceberg's test KMS (``keyA``, ``keyB``).
Seeds: every ``metadata.json`` of the Java tables in ``../shared/tables`` (read in
place), a gzip-compressed copy of one, the same in two gzip members, and a gzip file
inflating past the size cap (set low while loading, ``CAP``, so that such inputs stay cheap).

Oracle:

* only ``icecrypt.DecryptionError`` (``FormatError``, including
  ``PlaintextFileError``, and ``AuthenticationError``), ``EncryptionKeyNotFoundError``,
  ``KmsError``, and the refusals of a version that is not the table loaded or not
  authentic (``TableIdentityError``, ``TableIntegrityError``) may be raised, by the load
  or by unwrapping a snapshot's key metadata; never another exception, no hang;
* no unauthenticated output: every manifest-list key metadata that unwraps is one Java
  wrapped into a seed table.
"""

from __future__ import annotations

import contextlib
import gzip
import os
from functools import lru_cache

from fuzzlib import Finding, memory_kms, write_file

from icecrypt import DecryptionError, EncryptionKeyNotFoundError, KmsError, TableIdentityError, TableIntegrityError
from icecrypt.table import EncryptedTable
from icecrypt.table.files.metadata import MAX_METADATA_BYTES_ENV
from vectorlib import TABLES_DIR

ALLOWED = (DecryptionError, EncryptionKeyNotFoundError, KmsError, TableIdentityError, TableIntegrityError)


#: the size cap of metadata.json in this process (``ICECRYPT_MAX_METADATA_BYTES``): low,
#: so that a seed inflating past it costs milliseconds per input
CAP = 4 << 20


@contextlib.contextmanager
def _low_cap():
    previous = os.environ.get(MAX_METADATA_BYTES_ENV)
    os.environ[MAX_METADATA_BYTES_ENV] = str(CAP)
    try:
        yield
    finally:
        if previous is None:
            del os.environ[MAX_METADATA_BYTES_ENV]
        else:
            os.environ[MAX_METADATA_BYTES_ENV] = previous


@lru_cache(maxsize=None)
def _seed_files() -> tuple[bytes, ...]:
    files = [p.read_bytes() for p in sorted(TABLES_DIR.glob("*/metadata/*.metadata.json"))]
    half = len(files[-1]) // 2
    two_members = gzip.compress(files[-1][:half], mtime=0) + gzip.compress(files[-1][half:], mtime=0)
    bomb = gzip.compress(files[-1][:-1] + b' , "pad": "' + b" " * CAP + b'"}', mtime=0)  # inflates past the cap
    return tuple(files + [gzip.compress(files[-1], mtime=0), two_members, bomb])


def seeds() -> list[bytes]:
    return list(_seed_files())


def _keys(data: bytes) -> list:
    path = write_file("t/metadata/v1.metadata.json", data)
    table_dir = os.path.dirname(os.path.dirname(path))
    location_map = {f"s3://icecrypt-golden/{p.name}": table_dir for p in TABLES_DIR.iterdir() if p.is_dir()}
    with _low_cap():
        table = EncryptedTable.load(path, kms=memory_kms(), location_map=location_map)
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
        try:
            found.update(km for km in _keys(data) if km is not None)
        except ALLOWED:  # the seed made to pass the size cap
            continue
    return frozenset(found)


def check(data: bytes) -> None:
    keys = authentic()
    for km in _keys(data):
        if km is not None and km not in keys:
            raise Finding("a snapshot's manifest-list key metadata unwrapped to one no seed table holds")
