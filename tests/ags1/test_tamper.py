"""A tamper matrix over a 3-block file: every region, block swap/drop/duplicate,
truncation at every block edge +-1, appended bytes, with and without a trusted length.
Every damaged file must raise; none may release a byte."""

from __future__ import annotations

import os

import pytest

import icecrypt
from icecrypt import ags1

KEY = bytes(range(32))
AAD = b"tamper-matrix-16"
BS = ags1.PLAIN_BLOCK_SIZE
CBS = ags1.CIPHER_BLOCK_SIZE
PLAIN = os.urandom(2 * BS + 12345)  # blocks of 1 MiB, 1 MiB, 12345 bytes
GOOD = ags1.encrypt(PLAIN, KEY, AAD)
N = len(GOOD)


def block_start(i: int) -> int:
    return 8 + i * CBS


def regions():
    """(name, offset) of one byte in each region of the file."""
    yield "magic", 0
    yield "block-size", 5
    for i in range(3):
        start = block_start(i)
        end = min(start + CBS, N)
        yield f"nonce{i}-first", start
        yield f"nonce{i}-last", start + 11
        yield f"ct{i}-first", start + 12
        yield f"ct{i}-mid", (start + 12 + end - 16) // 2
        yield f"ct{i}-last", end - 17
        yield f"tag{i}-first", end - 16
        yield f"tag{i}-last", end - 1


def blocks(data: bytes):
    return [data[block_start(i) : block_start(i) + CBS] for i in range(3)]


def structural():
    b = blocks(GOOD)
    head = GOOD[:8]
    yield "swap-0-1", head + b[1] + b[0] + b[2]
    yield "drop-1", head + b[0] + b[2]
    yield "drop-last", head + b[0] + b[1]
    yield "duplicate-0", head + b[0] + b[0] + b[1] + b[2]
    yield "duplicate-1", head + b[0] + b[1] + b[1] + b[2]
    yield "append-1", GOOD + b"\x00"
    yield "append-28", GOOD + bytes(28)
    yield "append-block", GOOD + b[2]
    for i in range(1, 3):
        edge = block_start(i)
        for delta in (-1, 0, 1):
            yield f"truncate-edge{i}{delta:+d}", GOOD[: edge + delta]
    for cut in (N - 1, N - 16, N - 28, N - 29, 36, 35, 8, 7, 0):
        yield f"truncate-{cut}", GOOD[:cut]


CASES = [(f"flip-{name}", GOOD[:off] + bytes([GOOD[off] ^ 0x01]) + GOOD[off + 1 :]) for name, off in regions()]
CASES += list(structural())


def _expected(name: str):
    if name.startswith("flip-magic") or name.startswith("flip-block-size"):
        return icecrypt.FormatError
    if name.startswith("flip-"):
        return icecrypt.AuthenticationError
    return icecrypt.DecryptionError  # structural damage: format or authentication


# Whole trailing blocks dropped leave a valid shorter stream: only the trusted length
# from key metadata can tell (SPEC.md 1.4 quirk 3, gcm-stream-spec threat model).
UNDETECTABLE_WITHOUT_LENGTH = {"drop-last": 2, "truncate-edge2+0": 2, "truncate-edge1+0": 1}


@pytest.mark.parametrize("name", sorted(UNDETECTABLE_WITHOUT_LENGTH))
def test_dropped_tail_blocks_need_the_trusted_length(name):
    data = dict(CASES)[name]
    kept = UNDETECTABLE_WITHOUT_LENGTH[name]
    assert ags1.decrypt(data, KEY, AAD) == PLAIN[: kept * BS]
    with pytest.raises(icecrypt.FormatError, match="truncated"):
        ags1.decrypt(data, KEY, AAD, length=N)


DAMAGE = [
    pytest.param(name, data, trusted, id=f"{name}-{'trusted' if trusted else 'untrusted'}")
    for name, data in CASES
    for trusted in (False, True)
    if trusted or name not in UNDETECTABLE_WITHOUT_LENGTH
]


@pytest.mark.parametrize("name,data,trusted", DAMAGE)
def test_damage_is_caught(name, data, trusted, tmp_path):
    assert data != GOOD
    length = N if trusted else None
    with pytest.raises(_expected(name)):
        ags1.decrypt(data, KEY, AAD, length=length)
    path = tmp_path / "x.ags1"
    path.write_bytes(data)
    out = bytearray(b"\xaa" * len(PLAIN))
    with pytest.raises(_expected(name)) as info:
        with ags1.open_reader(path, KEY, AAD, length=length) as r:
            r.readinto(out)
    assert str(path) in str(info.value)
    # Nothing was released: the caller's buffer holds no plaintext byte runs.
    assert PLAIN[:4096] not in out and PLAIN[-4096:] not in out


@pytest.mark.parametrize("name,data", [c for c in CASES if c[0].startswith("flip-ct")], ids=lambda x: x if isinstance(x, str) else "")
def test_error_names_the_block(name, data):
    index = int(name[len("flip-ct")])
    with pytest.raises(icecrypt.AuthenticationError, match=f"block {index}") as info:
        ags1.decrypt(data, KEY, AAD)
    assert info.value.block_index == index


def test_random_access_does_not_skip_authentication(tmp_path):
    """Reading only block 2 of a file whose block 0 is damaged fails, as in Java, whose
    first read always decrypts block 0."""
    damaged = bytearray(GOOD)
    damaged[8 + 40] ^= 1
    path = tmp_path / "x.ags1"
    path.write_bytes(damaged)
    with ags1.open_reader(path, KEY, AAD) as r:
        with pytest.raises(icecrypt.AuthenticationError, match="block 0"):
            r.read_at(2 * BS + 5, 10)


def test_wrong_key_and_wrong_aad():
    with pytest.raises(icecrypt.AuthenticationError):
        ags1.decrypt(GOOD, bytes(32), AAD)
    with pytest.raises(icecrypt.AuthenticationError):
        ags1.decrypt(GOOD, KEY, b"other-prefix")
    with pytest.raises(icecrypt.AuthenticationError):
        ags1.decrypt(GOOD, KEY, None)


def test_foreign_file(tmp_path):
    path = tmp_path / "plain.parquet"
    path.write_bytes(b"PAR1" + os.urandom(5000) + b"PAR1")
    with pytest.raises(icecrypt.FormatError, match="magic does not match AGS1"):
        ags1.open_reader(path, KEY, AAD)
    with pytest.raises(icecrypt.FormatError):
        ags1.decrypt(b"", KEY)
