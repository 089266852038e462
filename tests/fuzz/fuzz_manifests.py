"""Fuzz harness: manifests and manifest lists, as the table layer reads them
(``icecrypt.table.files.manifest.read_manifest_list`` / ``read_manifest``: the decrypted
Avro records turned into ``ManifestFile`` / ``ManifestEntry`` objects, with each file's
key metadata decoded and the encryption rules applied).

Input: ``kind | plaintext Avro``.  As for the Avro harness, the plaintext is sealed
under a fixed key and read back through the real decrypting reader (the key metadata
handed to the reader holds the true ``file_length``), so mutations reach the table
layer's decoding.  ``kind`` even: a manifest list; odd: a manifest of the Java table
``enc_deletes_dek16`` (whose partition specs and schema are used) or, every fourth,
of ``enc_parquet_dek16``.  Seeds: the decrypted manifest lists and manifests of the
Java tables in ``../shared/tables``.

Oracle: only ``icecrypt.DecryptionError`` (``FormatError``, ``PlaintextFileError``: a
malformed manifest, missing key metadata) may be raised; never another exception (a
``KeyError`` for a missing field, a ``TypeError`` for a field of the wrong type, ...),
no hang; and what reads is well-formed: every manifest and file of an encrypted table
has key metadata (``file_length`` for AGS1 files).
"""

from __future__ import annotations

from fuzzlib import Finding, Input, fixed_bytes, table_plaintexts, write_file

from icecrypt import DecryptionError, ags1
from icecrypt.keys import StandardKeyMetadata
from icecrypt.table import Locations
from icecrypt.table.files.manifest import ManifestFile, read_manifest, read_manifest_list

ALLOWED = (DecryptionError,)
KEY = fixed_bytes("manifest-key", 16)
AAD = fixed_bytes("manifest-aad", 16)


def seeds() -> list[bytes]:
    plain = table_plaintexts()
    return [b"\x00" + p for p in plain["manifest_lists"]] + [b"\x01" + p for p in plain["manifests"]] + [
        b"\x03" + p for p in plain["manifests"]
    ]


def _table(kind: int):
    tables = {t.location.rsplit("/", 1)[-1]: t for t in table_plaintexts()["tables"]}
    return tables["enc_parquet_dek16" if kind & 2 else "enc_deletes_dek16"]


def check(data: bytes) -> None:
    inp = Input(data)
    kind = inp.u8()
    plain = inp.rest()
    ciphertext = ags1.encrypt(plain, KEY, AAD)
    path = write_file("fuzz-manifest.avro", ciphertext)
    km = StandardKeyMetadata(KEY, AAD, len(ciphertext))
    locations = Locations()
    if kind % 2 == 0:
        for manifest in read_manifest_list(path, locations, km, encrypted=True):
            if manifest.key_metadata is None or manifest.key_metadata.file_length is None:
                raise Finding(f"manifest {manifest.path!r} read without key metadata / file_length")
        return
    table = _table(kind)
    manifest = ManifestFile(
        path=path, length=len(ciphertext), spec_id=table.spec.spec_id, content=(kind >> 2) & 1,
        sequence_number=(kind >> 3) & 3, min_sequence_number=0, added_snapshot_id=1, partitions=None,
        key_metadata=km, first_row_id=None, record={},
    )
    for entry in read_manifest(manifest, locations, table.specs, table.schema, encrypted=True):
        f = entry.file
        if f.key_metadata is None or (f.file_format != "PARQUET" and f.key_metadata.file_length is None):
            raise Finding(f"file {f.file_path!r} read without key metadata / file_length")
