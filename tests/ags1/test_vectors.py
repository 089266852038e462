"""AGS1 against the files Iceberg Java wrote (../shared/vectors)."""

from __future__ import annotations

import hashlib
import io

import pytest

import icecrypt
from icecrypt import _gcm, ags1
from vectorlib import NonceStream, apply_patch, load_manifest, plaintext, read_vector

MANIFEST = load_manifest()
AGS1 = {v["id"]: v for v in MANIFEST["ags1"]}


def _key(v):
    return bytes.fromhex(v["key_hex"])


def _aad(v, field="aad_prefix_hex"):
    return None if v[field] is None else bytes.fromhex(v[field])


def test_constants_match_java(vectors):
    c = vectors["constants"]
    assert ags1.PLAIN_BLOCK_SIZE == c["PLAIN_BLOCK_SIZE"]
    assert ags1.CIPHER_BLOCK_SIZE == c["CIPHER_BLOCK_SIZE"]
    assert ags1.HEADER_LENGTH == c["GCM_STREAM_HEADER_LENGTH"]
    assert ags1.MIN_STREAM_LENGTH == c["MIN_STREAM_LENGTH"]
    assert ags1.HEADER.hex() == c["header_hex"]


@pytest.mark.parametrize("vid", sorted(AGS1))
def test_java_file_decrypts(vectors, vid):
    v = AGS1[vid]
    data = read_vector(v)
    assert hashlib.sha256(data).hexdigest() == v["ciphertext_sha256"]
    assert len(data) == v["ciphertext_size"] == v["stored_length_reported"]
    pt = ags1.decrypt(data, _key(v), _aad(v), length=v["ciphertext_size"])
    assert hashlib.sha256(pt).hexdigest() == v["plaintext_sha256"]
    assert pt == plaintext(v["plaintext_size"])
    assert ags1.plaintext_length(len(data)) == v["aes_gcm_input_file_getLength"]
    assert ags1.ciphertext_length(v["plaintext_size"]) == len(data)
    assert data[8:20].hex() == v["block0_nonce_hex"]


@pytest.mark.parametrize("vid", sorted(AGS1))
def test_java_file_streams(vectors, vid, tmp_path):
    v = AGS1[vid]
    path = tmp_path / "f.ags1"
    path.write_bytes(read_vector(v))
    with ags1.open_reader(path, _key(v), _aad(v), length=v["ciphertext_size"]) as r:
        assert r.size == v["plaintext_size"]
        assert r.num_blocks == v["num_blocks"]
        assert r.read() == plaintext(v["plaintext_size"])


@pytest.mark.parametrize("vid", sorted(AGS1))
@pytest.mark.parametrize("chunk", [pytest.param(1, marks=pytest.mark.slow), 4096, 1048576, None])  # 1: a write per byte
def test_java_ciphertext_reproduced_byte_for_byte(vid, chunk):
    """With the vectors' nonce stream injected, our writer emits Java's exact bytes,
    however the plaintext is chunked (SPEC.md 1.3: chunking does not change output)."""
    v = AGS1[vid]
    pt = plaintext(v["plaintext_size"])
    nonces = NonceStream(v["rng_seed_hex"])
    sink = io.BytesIO()
    w = ags1.Ags1Writer(sink, _key(v), _aad(v))
    w._nonces = nonces  # test-only injection: no public argument reaches the nonce source
    step = chunk or max(1, len(pt))
    for i in range(0, len(pt), step):
        w.write(pt[i : i + step])
    w.close()
    assert sink.getvalue() == read_vector(v)
    assert w.ciphertext_length == v["stored_length_reported"]
    whole = _gcm.ags1_encrypt(_key(v), pt, _aad(v), _nonces=nonces(0, _gcm.run_blocks(len(pt))))
    assert whole == read_vector(v)


def test_worked_example_from_spec():
    v = AGS1["aes128_n1"]
    data = read_vector(v)
    assert data.hex() == (
        "4147533100001000" "070c5ad175e69710ef4743a2" "05" "8b32e1a002f615dc188bdcc0cd50060d"
    )


def test_null_and_empty_aad_prefix_are_the_same():
    v = AGS1["aes128_nullaad_n1"]
    data = read_vector(v)
    assert ags1.decrypt(data, _key(v), None) == ags1.decrypt(data, _key(v), b"") == plaintext(1)
    with pytest.raises(icecrypt.AuthenticationError):
        ags1.decrypt(data, _key(v), b"\x00")


@pytest.mark.parametrize("case", MANIFEST["ranges"], ids=lambda c: f"{c['vector']}@{c['offset']}")
def test_ranges(case, tmp_path):
    v = AGS1[case["vector"]]
    path = tmp_path / "f.ags1"
    path.write_bytes(read_vector(v))
    with ags1.open_reader(path, _key(v), _aad(v)) as r:
        assert r.seek(case["offset"]) == case["offset"]
        got = r.read(case["count"])
        assert got.hex() == case["hex"]
        assert len(got) == case["returned"]
        assert hashlib.sha256(got).hexdigest() == case["sha256"]
        assert r.tell() == case["pos_after"]
        assert r.read_at(case["offset"], case["count"]) == got


@pytest.mark.parametrize("case", MANIFEST["plain_length"], ids=lambda c: str(c["ciphertext_length"]))
def test_plain_length(case):
    """Java's formula on valid lengths; the lengths only a damaged file can have (SPEC.md
    1.4 quirks: shorter than 36, a trailing empty block, 1..27 stray bytes) raise."""
    n = case["ciphertext_length"]
    rem = (n - 8) % ags1.CIPHER_BLOCK_SIZE if n >= 8 else None
    full = (n - 8) // ags1.CIPHER_BLOCK_SIZE if n >= 8 else None
    damaged = n < 36 or (rem != 0 and rem < 28) or (rem == 28 and full > 0)
    if damaged:
        with pytest.raises(icecrypt.FormatError):
            ags1.plaintext_length(n)
    else:
        assert ags1.plaintext_length(n) == case["plaintext_length"]


NEGATIVE = MANIFEST["ags1_negative"]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c["id"])
@pytest.mark.parametrize("trusted", [False, True], ids=["length_from_file", "length_trusted"])
def test_negative(case, trusted, tmp_path):
    """Every damaged file raises, including those Java accepts (truncate_1_byte)."""
    base = AGS1[case["base"]]
    original = read_vector(base)
    damaged = apply_patch(original, case["patch"])
    assert hashlib.sha256(damaged).hexdigest() == case["patched_sha256"]
    key = bytes.fromhex(case["read_key_hex"])
    aad = _aad(case, "read_aad_prefix_hex")
    length = len(original) if trusted else None
    java = case["java_outcomes"]["length_from_file"]
    expected = icecrypt.AuthenticationError if java.get("error_kind") == "auth" else icecrypt.FormatError
    with pytest.raises(expected):
        ags1.decrypt(damaged, key, aad, length=length)
    path = tmp_path / "damaged.ags1"
    path.write_bytes(damaged)
    with pytest.raises(expected) as info:
        with ags1.open_reader(path, key, aad, length=length) as r:
            r.read()
    assert str(path) in str(info.value)
