"""Fuzz harness: the AGS1 reader (``ags1.decrypt`` and ``Ags1Reader``).

Input: ``key selector | flags | length delta | op count | ops (9 bytes each) | ciphertext``.
The selector picks a (key, AAD prefix) pair: icecrypt's fixed fuzz keys (AES-128 with a
prefix, AES-256 without), each Java vector's own key from ``../shared/vectors``, or a
*foreign* key that sealed nothing.  The flags pick the trusted length (none, the input's
length, the length plus a small delta, or plus whole cipher blocks: trusted-length
mismatches) and the source kind (bytes, a file object, a path, a bytearray); the ops are
``read_at`` / ``seek`` + ``read`` / ``readinto_at`` / sequential ``read`` at offsets
and sizes taken from the input.

Oracle:

* only ``icecrypt.DecryptionError`` (``FormatError``, ``AuthenticationError``) may be
  raised, by ``decrypt``, by opening the reader, or by any read; nothing else, and no
  input runs longer than the time bound;
* no unauthenticated output: every plaintext byte returned (whole-buffer or any range
  read) equals the byte at the same position of an authentic plaintext block with the
  same block index that was sealed under that key and prefix (blocks can be swapped
  between files of one key, never forged); under the foreign key nothing ever decrypts;
* consistency: when ``decrypt`` accepts the input, the reader accepts it too and every
  read returns exactly the matching slice; when ``decrypt`` refuses it, a whole read
  through the reader refuses it too; a failed ``readinto_at`` leaves the caller's
  buffer zeroed.
"""

from __future__ import annotations

import io
import struct
from functools import lru_cache

from fuzzlib import Finding, Input, fixed_bytes, write_file

from icecrypt import DecryptionError, ags1
from vectorlib import VECTORS_DIR, load_manifest, plaintext

ALLOWED = (DecryptionError,)

B = ags1.PLAIN_BLOCK_SIZE
CB = ags1.CIPHER_BLOCK_SIZE
#: plaintext sizes sealed under the fuzz keys at start-up (two span two blocks)
FUZZ_SIZES = (0, 1, 15, 16, 17, 100, 4096, B - 1, B, B + 1)


class Pair:
    """A key and AAD prefix, the ciphertexts sealed under them, and their blocks."""

    def __init__(self, label: str, key: bytes, aad: bytes | None):
        self.label, self.key, self.aad = label, key, aad
        self.ciphertexts: list[bytes] = []
        self.blocks: dict[int, set[bytes]] = {}

    def add(self, plain: bytes, ciphertext: bytes) -> None:
        self.ciphertexts.append(ciphertext)
        n = max(1, -(-len(plain) // B))
        for i in range(n):
            self.blocks.setdefault(i, set()).add(plain[i * B : (i + 1) * B])


@lru_cache(maxsize=None)
def pairs() -> tuple[Pair, ...]:
    out = []
    p128 = Pair("fuzz-aes128", fixed_bytes("ags1-key-128", 16), fixed_bytes("ags1-aad", 16))
    p256 = Pair("fuzz-aes256", fixed_bytes("ags1-key-256", 32), None)
    for pair in (p128, p256):
        for n in FUZZ_SIZES:
            plain = fixed_bytes(f"ags1-plain-{n}", n)
            pair.add(plain, ags1.encrypt(plain, pair.key, pair.aad))
        out.append(pair)
    by_key: dict[tuple[bytes, bytes | None], Pair] = {}
    for entry in load_manifest()["ags1"]:
        key = bytes.fromhex(entry["key_hex"])
        aad = bytes.fromhex(entry["aad_prefix_hex"]) if entry.get("aad_prefix_hex") else None
        pair = by_key.get((key, aad))
        if pair is None:
            pair = by_key[(key, aad)] = Pair(f"java-{entry['id']}", key, aad)
            out.append(pair)
        pair.add(plaintext(entry["plaintext_size"]), (VECTORS_DIR / entry["ciphertext_file"]).read_bytes())
    out.append(Pair("foreign", fixed_bytes("ags1-foreign", 16), fixed_bytes("ags1-aad", 16)))
    return tuple(out)


def encode(selector: int, flags: int, delta: int, ops: list[tuple[int, int, int]], ciphertext: bytes) -> bytes:
    head = bytes((selector, flags, delta & 0xFF, len(ops)))
    return head + b"".join(struct.pack("<BII", *op) for op in ops) + ciphertext


def seeds() -> list[bytes]:
    out = []
    ops = [(0, 0, 64), (1, 5, 100), (2, B - 3, 10), (3, 0, 1 << 21)]
    for index, pair in enumerate(pairs()):
        for ct in pair.ciphertexts:
            out.append(encode(index, 1, 0, ops, ct))
            if len(ct) < 5000:
                out.append(encode(index, 0b0101, 0, [(2, 1, 3)], ct))
                out.append(encode(index, 0b1110, -1, [], ct))
    out.append(encode(len(pairs()) - 1, 1, 0, ops, pairs()[0].ciphertexts[3]))
    return out


def _block_length(i: int, size: int, num_blocks: int) -> int:
    return size - i * B if i == num_blocks - 1 else B


def _check_range(pair: Pair, offset: int, data: bytes, size: int, what: str) -> None:
    """Every byte of ``data`` (plaintext at ``offset``) comes from an authentic block."""
    if not data:
        return
    num_blocks = max(1, -(-size // B))
    first, last = offset // B, (offset + len(data) - 1) // B
    for i in range(first, last + 1):
        lo, hi = max(offset, i * B), min(offset + len(data), (i + 1) * B)
        piece = data[lo - offset : hi - offset]
        length = _block_length(i, size, num_blocks)
        if not any(
            len(c) == length and c[lo - i * B : hi - i * B] == piece for c in pair.blocks.get(i, ())
        ):
            raise Finding(
                f"{what}: unauthenticated output under key {pair.label}: bytes {lo}..{hi} of block {i} "
                "match no block sealed under this key"
            )


def _source(kind: int, ciphertext: bytes):
    if kind == 0:
        return ciphertext
    if kind == 1:
        return io.BytesIO(ciphertext)
    if kind == 2:
        return write_file("ags1-input", ciphertext)
    return bytearray(ciphertext)


def check(data: bytes) -> None:
    inp = Input(data)
    all_pairs = pairs()
    pair = all_pairs[inp.u8() % len(all_pairs)]
    flags = inp.u8()
    delta = struct.unpack("b", inp.take(1))[0]
    ops = [struct.unpack("<BII", inp.take(9)) for _ in range(inp.u8() % 9)]
    ct = inp.rest()
    mode = flags & 3
    length = [None, len(ct), len(ct) + delta, len(ct) + delta * CB][mode]
    if length is not None and length < 0:
        length = len(ct)

    # the whole-buffer decrypt
    whole = None
    try:
        whole = ags1.decrypt(ct, pair.key, pair.aad, length=length)
    except DecryptionError:
        pass
    if whole is not None:
        if length is not None and length != len(ct):
            raise Finding(f"decrypt accepted a trusted length {length} for {len(ct)} bytes")
        _check_range(pair, 0, whole, len(whole), "decrypt")

    # the reader, on the source kind the flags pick
    try:
        reader = ags1.open_reader(_source((flags >> 2) & 3, ct), pair.key, pair.aad, length)
    except DecryptionError:
        if whole is not None:
            raise Finding("the reader refuses a stream that decrypt accepts") from None
        return
    with reader:
        size = reader.size
        if whole is not None and size != len(whole):
            raise Finding(f"reader size {size} != decrypted length {len(whole)}")
        for code, a, b in ops:
            kind = code & 3
            offset = a % (size + 2 * B + 1)
            n = b % (3 * B)
            buffer = None
            try:
                if kind == 0:
                    got = reader.read_at(offset, n)
                elif kind == 1:
                    whence = (code >> 2) % 3
                    target = offset if whence != 2 else max(0, size - (a % (size + 1)))
                    pos = reader.seek(target if whence == 0 else (target - reader.tell() if whence == 1 else target - size), whence)
                    if pos != target:
                        raise Finding(f"seek landed at {pos}, expected {target}")
                    offset = pos
                    got = reader.read(n)
                elif kind == 2:
                    buffer = bytearray(n)
                    count = reader.readinto_at(buffer, offset)
                    got = bytes(buffer[:count])
                else:
                    offset = reader.tell()
                    got = reader.read(n)
            except DecryptionError:
                if whole is not None:
                    raise Finding("a read fails on a stream that decrypt accepts") from None
                if buffer is not None and any(buffer):
                    raise Finding("a failed readinto_at left plaintext in the caller's buffer") from None
                continue
            expected_len = max(0, min(n, size - offset))
            if len(got) != expected_len:
                raise Finding(f"read of {n} at {offset} returned {len(got)} bytes, expected {expected_len}")
            if whole is not None:
                if got != whole[offset : offset + n]:
                    raise Finding(f"read of {n} at {offset} differs from the decrypted stream")
            else:
                _check_range(pair, offset, got, size, f"read of {n} at {offset}")
        if whole is None:
            try:
                everything = reader.read_at(0, size)
            except DecryptionError:
                return
            raise Finding(f"the reader returned all {len(everything)} bytes of a stream decrypt refuses")
