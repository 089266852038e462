"""Fuzz harness: key manifests of ``EncryptedFileSystem`` (``icecrypt.keys.read_key_manifest``).

Input: the manifest file (JSON), written to a private temporary directory and read
with a ``LocalKms`` over a fixed keystore, and with a ``MemoryKms`` when the local one
does not hold the manifest's master key; then again with each client and the master
key the caller expects (``table_key_id``).  Seeds: key manifests written here with
``write_key_manifest`` under both KMS clients (empty, one file, several files with
keys of every length, with and without AAD prefix and length), and one under ``keyA``,
another master key the memory client holds (a storage attacker's manifest).

Oracle:

* only ``icecrypt.DecryptionError`` (``FormatError`` for a file that is not a key
  manifest, ``AuthenticationError`` for an altered one), ``KmsError`` and
  ``EncryptionKeyNotFoundError`` may be raised; never another exception, no hang;
* no unauthenticated output: a manifest that reads yields exactly the ``path -> key
  metadata`` map of one seed (the digest binds every path to its key: entries cannot
  be swapped, dropped or added);
* a manifest read with ``table_key_id`` yields a map of a seed written under that master
  key, never the ``keyA`` seed's.
"""

from __future__ import annotations

from functools import lru_cache

from fuzzlib import Finding, fixed_bytes, local_kms, memory_kms, workdir, write_file

from icecrypt import DecryptionError, EncryptionKeyNotFoundError, KmsError, KmsKeyNotFoundError
from icecrypt.keys import EncryptionManager, StandardKeyMetadata, read_key_manifest, write_key_manifest

ALLOWED = (DecryptionError, EncryptionKeyNotFoundError, KmsError)


@lru_cache(maxsize=None)
def clients():
    return local_kms(), memory_kms()


#: a manifest under another master key the memory client can use
_FOREIGN = {"/lake/forged.parquet": StandardKeyMetadata(fixed_bytes("km-forged", 16), None, 99)}


@lru_cache(maxsize=None)
def _seeds() -> tuple[tuple[bytes, ...], tuple[dict, ...]]:
    local, memory = clients()
    maps = [
        {},
        {"/lake/a.parquet": StandardKeyMetadata(fixed_bytes("km-a", 16), fixed_bytes("aad-a", 16), 1234)},
        {
            f"s3://bucket/t/f{i}.avro": StandardKeyMetadata(fixed_bytes(f"km-{i}", n), None if i % 2 else b"x", i or None)
            for i, n in enumerate((16, 24, 32))
        },
    ]
    files = []
    for i, keys in enumerate(maps):
        for kms, master in ((local, "master"), (memory, "fuzz-master")):
            path = workdir() / f"seed-{i}-{master}.json"
            write_key_manifest(str(path), keys, EncryptionManager(kms, master))
            files.append(path.read_bytes())
    path = workdir() / "seed-foreign-keyA.json"
    write_key_manifest(str(path), _FOREIGN, EncryptionManager(memory, "keyA"))
    files.append(path.read_bytes())
    return tuple(files), tuple(maps)


def seeds() -> list[bytes]:
    return list(_seeds()[0])


def check(data: bytes) -> None:
    maps = _seeds()[1]
    path = write_file("fuzz-keys.json", data)
    local, memory = clients()
    try:
        keys = read_key_manifest(path, local)
    except KmsKeyNotFoundError:
        keys = read_key_manifest(path, memory)
    if keys not in maps and keys != _FOREIGN:
        raise Finding(f"a key manifest read as a map of {len(keys)} files that no seed holds")
    for kms, master in ((local, "master"), (memory, "fuzz-master")):
        try:
            keys = read_key_manifest(path, kms, table_key_id=master)
        except ALLOWED:
            continue
        if keys not in maps:
            raise Finding(f"a key manifest read under expected master key {master!r} as a map no seed under it holds")
