"""Fuzz harness: ``StandardKeyMetadata.decode`` (the key-metadata blob of every file).

Input: the blob.  Seeds: every ``key_metadata`` and ``key_metadata_decode`` vector of
``../shared/vectors`` (Java's encodings, valid and invalid), the manifest-list key
metadata of the Java table bundle, and blobs encoded here (1.10 two-field layout, no AAD
prefix, negative and extreme lengths).

Oracle:

* only ``icecrypt.FormatError`` may be raised (the decoder's documented error); never
  another exception, and no input runs longer than the time bound;
* what decodes is a well-formed value: ``encode()`` of it decodes to an equal value
  (varints need not be minimal, as in Java, so the bytes may differ), and a 1.10
  two-field blob (which ends right after ``aad_prefix``) decodes with no
  ``file_length``.
"""

from __future__ import annotations

import json

from fuzzlib import Finding

from icecrypt import FormatError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.keys.metadata import _decode
from vectorlib import VECTORS_DIR, load_manifest

ALLOWED = (FormatError,)


def seeds() -> list[bytes]:
    manifest = load_manifest()
    out = [bytes.fromhex(e["encoded_hex"]) for e in manifest["key_metadata"]]
    out += [bytes.fromhex(e["input_hex"]) for e in manifest["key_metadata_decode"]]
    bundle = json.loads((VECTORS_DIR / "table" / "dek16" / "bundle.json").read_text())
    secret = bundle.get("debug_plaintext_secrets", {}).get("manifest_list_key_metadata_hex")
    if secret:
        out.append(bytes.fromhex(secret))
    for km in (
        StandardKeyMetadata(bytes(16)),
        StandardKeyMetadata(bytes(32), b"", 0),
        StandardKeyMetadata(bytes(24), bytes(16), (1 << 63) - 1),
        StandardKeyMetadata(b"", None, -(1 << 63)),
    ):
        out.append(km.encode())
    out.append(StandardKeyMetadata(bytes(16), bytes(16)).encode()[:-1])  # 1.10 layout
    return out


def check(data: bytes) -> None:
    km, legacy = _decode(data)
    public = StandardKeyMetadata.decode(data)
    if public != km:
        raise Finding("decode() and _decode() disagree")
    encoded = km.encode()
    if StandardKeyMetadata.decode(encoded) != km:
        raise Finding("encode() of a decoded value does not decode back to it")
    if legacy and km.file_length is not None:
        raise Finding("a 1.10 two-field blob decoded with a file_length")
