"""Fuzz harness: wrapped-key blobs of the local KMS formats and the local keystore file.

Input: ``mode | payload``.  Mode 0: ``MemoryKms.unwrap_key`` (Iceberg's test KMS format
``nonce || ct || tag``) under ``keyA`` / ``keyB`` / a fuzz master key (chosen by the
payload's first byte); mode 1: ``LocalKms.unwrap_key`` (``0x01 || nonce || ct || tag``,
AAD = version and key id) under ``master`` / ``other``; mode 2: the payload is a keystore
file (mode 0600) that ``LocalKms`` loads, then wraps and unwraps a key with each master
key it holds.  Seeds: the KEKs Java's test KMS wrapped (``encryption-keys`` of the Java
bundle and tables), blobs wrapped here by both clients, and keystore files.

Oracle:

* only ``icecrypt.KmsError`` (its subclasses ``KmsInvalidWrappedKeyError``,
  ``KmsKeyNotFoundError``, ...) may be raised; never another exception, no hang;
* no unauthenticated output: an unwrap returns only a key that was wrapped into a seed
  under that master key (the foreign-key case: nothing else unwraps);
* a keystore that loads is usable: every master key in it wraps and unwraps.
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache

from fuzzlib import Finding, Input, fixed_bytes, local_keystore_document, local_kms, memory_kms, write_file

from icecrypt import KmsError
from icecrypt.kms.local import LocalKms
from vectorlib import TABLES_DIR, VECTORS_DIR

ALLOWED = (KmsError,)
MEMORY_IDS = ("keyA", "keyB", "fuzz-master")
LOCAL_IDS = ("master", "other")


@lru_cache(maxsize=None)
def clients():
    return memory_kms(), local_kms()


@lru_cache(maxsize=None)
def _material() -> tuple[list[bytes], dict]:
    """(seed inputs, {(mode, key id): set of authentic keys})."""
    memory, local = clients()
    out: list[bytes] = []
    auth: dict = {}
    java = []
    bundle = json.loads((VECTORS_DIR / "table" / "dek16" / "bundle.json").read_text())
    java += bundle["encryption-keys"]
    for path in sorted(TABLES_DIR.glob("*/metadata/*.metadata.json")):
        java += json.loads(path.read_text()).get("encryption-keys", [])
    for entry in java:
        if entry.get("encrypted-by-id") in MEMORY_IDS:
            blob = base64.b64decode(entry["encrypted-key-metadata"])
            key_id = entry["encrypted-by-id"]
            auth.setdefault((0, key_id), set()).add(memory.unwrap_key(blob, key_id))
            out.append(bytes((0, MEMORY_IDS.index(key_id))) + blob)
    for n in (16, 24, 32, 0, 1):
        key = fixed_bytes(f"wrapped-{n}", n)
        for i, key_id in enumerate(MEMORY_IDS):
            out.append(bytes((0, i)) + memory.wrap_key(key, key_id))
            auth.setdefault((0, key_id), set()).add(key)
        for i, key_id in enumerate(LOCAL_IDS):
            out.append(bytes((1, i)) + local.wrap_key(key, key_id))
            auth.setdefault((1, key_id), set()).add(key)
    document = local_keystore_document()
    out.append(b"\x02" + json.dumps(document, indent=2).encode())
    document["keys"]["third"] = {"material": base64.b64encode(bytes(24)).decode()}
    out.append(b"\x02" + json.dumps(document).encode())
    return out, auth


def seeds() -> list[bytes]:
    return list(_material()[0])


def check(data: bytes) -> None:
    inp = Input(data)
    mode = inp.u8() % 3
    memory, local = clients()
    auth = _material()[1]
    if mode == 2:
        kms = LocalKms(write_file("fuzz-keystore.json", inp.rest()))
        for key_id in kms.key_ids:
            key = fixed_bytes("keystore-roundtrip", 16)
            if kms.unwrap_key(kms.wrap_key(key, key_id), key_id) != key:
                raise Finding(f"keystore master key {key_id!r} does not round-trip a key")
        return
    ids = MEMORY_IDS if mode == 0 else LOCAL_IDS
    key_id = ids[inp.u8() % len(ids)]
    client = memory if mode == 0 else local
    key = client.unwrap_key(inp.rest(), key_id)
    if key not in auth.get((mode, key_id), ()):
        raise Finding(f"{type(client).__name__} unwrapped a key no seed wrapped under {key_id!r}")
