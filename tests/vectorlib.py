"""Helpers to regenerate the inputs of ../shared/vectors (see its README)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VECTORS_DIR = Path(os.environ.get("ICECRYPT_VECTORS") or ROOT.parent / "shared" / "vectors")
TABLES_DIR = VECTORS_DIR.parent / "tables"


@lru_cache(maxsize=None)
def load_manifest() -> dict:
    with open(VECTORS_DIR / "manifest.json", encoding="utf-8") as f:
        return json.load(f)


def hash_stream(seed: bytes, n: int) -> bytes:
    """First n bytes of SHA256(seed || u64le(0)) || SHA256(seed || u64le(1)) || ..."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(seed + struct.pack("<Q", counter)).digest()
        counter += 1
    return bytes(out[:n])


@lru_cache(maxsize=4)
def plaintext(n: int) -> bytes:
    return hash_stream(b"iceberg-ags1-pt", n)


class NonceStream:
    """The vectors' deterministic SecureRandom: block i uses S[12*i : 12*i+12]."""

    def __init__(self, seed_hex: str):
        self.seed = bytes.fromhex(seed_hex)

    def __call__(self, first_block_index: int, count: int) -> bytes:
        stream = hash_stream(self.seed, 12 * (first_block_index + count))
        return stream[12 * first_block_index :]


def read_vector(entry: dict) -> bytes:
    return (VECTORS_DIR / entry["ciphertext_file"]).read_bytes()


def apply_patch(data: bytes, patches: list[dict]) -> bytes:
    """Apply an ags1_negative patch list (xor, set, truncate, append, swap, remove)."""
    buf = bytearray(data)
    for p in patches:
        op = p["op"]
        if op == "xor":
            buf[p["offset"]] ^= p["mask"]
        elif op == "set":
            raw = bytes.fromhex(p["hex"])
            buf[p["offset"] : p["offset"] + len(raw)] = raw
        elif op == "truncate":
            del buf[p["length"] :]
        elif op == "append":
            buf += bytes.fromhex(p["hex"])
        else:
            raise NotImplementedError(f"patch op {op!r}: extend vectorlib.apply_patch")
    return bytes(buf)
