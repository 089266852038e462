"""StandardKeyMetadata against Iceberg Java's encodings and decoding behaviour."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icecrypt import FormatError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.keys.metadata import _decode, _decode_common, _decode_general

SECRET_KEY = bytes.fromhex("deadbeefcafebabe0badf00d5eed1e55")


def _hex_or_none(value):
    return None if value is None else bytes.fromhex(value)


def test_every_java_encoding_is_reproduced(vectors):
    entries = vectors["key_metadata"]
    assert len(entries) >= 10
    for v in entries:
        km = StandardKeyMetadata(bytes.fromhex(v["key_hex"]), _hex_or_none(v["aad_prefix_hex"]), v["file_length"])
        assert km.encode().hex() == v["encoded_hex"], v["id"]
        assert bytes(km) == km.encode()


def test_every_java_encoding_decodes_back(vectors):
    for v in vectors["key_metadata"]:
        km = StandardKeyMetadata.decode(bytes.fromhex(v["encoded_hex"]))
        back = v["decoded_back"]
        assert km.encryption_key.hex() == back["key"], v["id"]
        assert km.aad_prefix == _hex_or_none(back["aad_prefix"]), v["id"]
        assert km.file_length == back["file_length"], v["id"]


def test_java_decode_vectors(vectors):
    cases = {v["id"]: v for v in vectors["key_metadata_decode"]}
    expected_ids = {"valid", "version_0", "version_2", "empty", "truncated_in_key", "iceberg_1_10_two_field_layout"}
    assert expected_ids <= set(cases)
    for case_id, v in cases.items():
        data = bytes.fromhex(v["input_hex"])
        if case_id == "iceberg_1_10_two_field_layout":
            continue  # Java 1.11 fails; we read it on purpose (next test)
        if v["ok"]:
            km = StandardKeyMetadata.decode(data)
            assert km.encryption_key.hex() == v["decoded"]["key"]
            assert km.aad_prefix == _hex_or_none(v["decoded"]["aad_prefix"])
            assert km.file_length == v["decoded"]["file_length"]
        else:
            with pytest.raises(FormatError):
                StandardKeyMetadata.decode(data)


def test_iceberg_1_10_two_field_layout_is_read(vectors):
    (v,) = [v for v in vectors["key_metadata_decode"] if v["id"] == "iceberg_1_10_two_field_layout"]
    assert v["ok"] is False  # Java 1.11 rejects it
    km, two_field = _decode(bytes.fromhex(v["input_hex"]))
    assert two_field
    assert km == StandardKeyMetadata(bytes(range(16)), bytes(range(16, 32)), None)
    # re-encoding gives the 1.11 layout (one more byte: the null file_length)
    assert km.encode() == bytes.fromhex(v["input_hex"]) + b"\x00"
    # a two-field blob without an AAD prefix
    km, two_field = _decode(bytes.fromhex("0120") + bytes(16) + b"\x00")
    assert two_field and km.aad_prefix is None and km.file_length is None


def test_three_field_layout_is_not_taken_for_two_fields():
    _, two_field = _decode(StandardKeyMetadata(bytes(16), None, None).encode())
    assert not two_field


def test_version_messages():
    good = StandardKeyMetadata(bytes(16), bytes(16), 5).encode()
    with pytest.raises(FormatError, match="empty"):
        StandardKeyMetadata.decode(b"")
    for version in (0x00, 0x02, 0x7F, 0x80, 0x81, 0xFF):  # >= 0x80: Java's "end of stream"
        with pytest.raises(FormatError, match=f"version byte 0x{version:02x}"):
            StandardKeyMetadata.decode(bytes((version,)) + good[1:])


def test_trailing_bytes_are_ignored_like_java():
    km = StandardKeyMetadata(bytes(16), bytes(16), 1234567)
    assert StandardKeyMetadata.decode(km.encode() + b"\x99\x00junk") == km


@pytest.mark.parametrize(
    "blob, message",
    [
        ("01", "truncated in field encryption_key"),
        ("0120" + "00" * 15, "truncated in field encryption_key: 16 bytes declared, 15 present"),
        ("0120" + "00" * 16 + "02", "truncated in field aad_prefix"),
        ("0120" + "00" * 16 + "04", "union index 2 in field aad_prefix"),
        ("0120" + "00" * 16 + "01", "union index -1 in field aad_prefix"),
        ("0120" + "00" * 16 + "00" + "06", "union index 3 in field file_length"),
        ("0120" + "00" * 16 + "00" + "02", "truncated in field file_length"),
        ("0120" + "00" * 16 + "00" + "02" + "ff" * 9, "truncated in field file_length"),
        ("0101", "negative length"),
        ("0120" + "00" * 16 + "00" + "02" + "ff" * 9 + "02", "out-of-range varint"),
        ("0120" + "00" * 16 + "00" + "02" + "80" * 10 + "00", "over-long varint"),
        ("0120" + "00" * 16 + "8080808010", "out-of-range varint in field aad_prefix"),
    ],
)
def test_malformed_input_names_the_problem(blob, message):
    with pytest.raises(FormatError, match=message):
        StandardKeyMetadata.decode(bytes.fromhex(blob))


def test_long_extremes_and_non_minimal_varints():
    for n in (-(1 << 63), -1, 0, 63, 64, (1 << 63) - 1):
        km = StandardKeyMetadata(bytes(16), None, n)
        assert StandardKeyMetadata.decode(km.encode()).file_length == n
    # Java accepts a zero padded with continuation bytes; so do we
    assert StandardKeyMetadata.decode(bytes.fromhex("0120") + bytes(16) + bytes.fromhex("00028000")).file_length == 0


def test_accepts_bytes_like_and_stores_bytes():
    key = bytearray(range(16))
    km = StandardKeyMetadata(key, memoryview(bytes(range(16, 32))))
    key[0] = 0xFF  # the value object must not alias the caller's buffer
    assert type(km.encryption_key) is bytes and km.encryption_key == bytes(range(16))
    assert type(km.aad_prefix) is bytes
    assert StandardKeyMetadata.decode(bytearray(km.encode())) == km
    assert StandardKeyMetadata.decode(memoryview(km.encode())) == km


def test_type_and_range_checks():
    with pytest.raises(TypeError):
        StandardKeyMetadata("00" * 16)
    with pytest.raises(TypeError):
        StandardKeyMetadata(bytes(16), "aad")
    with pytest.raises(TypeError):
        StandardKeyMetadata(bytes(16), None, 1.5)
    with pytest.raises(TypeError):
        StandardKeyMetadata(bytes(16), None, True)
    with pytest.raises(ValueError, match="64-bit"):
        StandardKeyMetadata(bytes(16), None, 1 << 63)
    with pytest.raises(TypeError):
        StandardKeyMetadata.decode("0120")
    # with_file_length checks the length as the constructor does
    km = StandardKeyMetadata(bytes(16), None, 1)
    for bad in (1.5, True, "7"):
        with pytest.raises(TypeError):
            km.with_file_length(bad)
    for bad in (1 << 63, -(1 << 63) - 1):
        with pytest.raises(ValueError, match="64-bit"):
            km.with_file_length(bad)


def test_immutable_value_object():
    km = StandardKeyMetadata(bytes(16), bytes(16))
    with pytest.raises(dataclasses.FrozenInstanceError):
        km.file_length = 3
    longer = km.with_file_length(99)
    assert longer.file_length == 99 and km.file_length is None
    assert longer.with_file_length(None) == km
    assert type(longer) is StandardKeyMetadata and longer.encryption_key == km.encryption_key
    assert longer.encode() == StandardKeyMetadata(bytes(16), bytes(16), 99).encode()
    assert longer.with_file_length(99) is longer  # nothing to change: the same immutable object
    assert hash(km) == hash(StandardKeyMetadata(bytes(16), bytes(16)))
    assert km != StandardKeyMetadata(bytes(16), b"")  # empty AAD prefix differs from none


def test_repr_hides_key_bytes():
    km = StandardKeyMetadata(SECRET_KEY, SECRET_KEY, 42)
    for text in (repr(km), str(km), f"{km}"):
        assert SECRET_KEY.hex() not in text.lower()
        assert "deadbeef" not in text.lower() and "\\xde" not in text
        assert "key_length=16" in text and "file_length=42" in text
    assert "aad_prefix=None" in repr(StandardKeyMetadata(SECRET_KEY))


def test_errors_do_not_leak_key_bytes():
    blob = StandardKeyMetadata(SECRET_KEY, None, 7).encode()
    for bad in (blob[:-1], b"\x02" + blob[1:], blob[:-2] + b"\x08\x00"):
        with pytest.raises(FormatError) as info:
            StandardKeyMetadata.decode(bad)
        assert "deadbeef" not in str(info.value).lower()


@given(
    key=st.binary(max_size=64),
    aad=st.none() | st.binary(max_size=64),
    length=st.none() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
)
def test_round_trip(key, aad, length):
    km = StandardKeyMetadata(key, aad, length)
    encoded = km.encode()
    assert encoded[0] == 1
    assert StandardKeyMetadata.decode(encoded) == km


@given(st.binary(max_size=80))
def test_decoding_arbitrary_bytes_never_crashes(data):
    try:
        km = StandardKeyMetadata.decode(data)
    except FormatError:
        return
    # whatever is accepted re-encodes canonically and decodes to the same value
    assert StandardKeyMetadata.decode(km.encode()) == km


def _general_or_error(data: bytes):
    try:
        return _decode_general(data)
    except FormatError as exc:
        return exc


def _agrees(data: bytes) -> bool:
    fast = _decode_common(data)
    if fast is None:
        return False
    general = _general_or_error(data)
    assert not isinstance(general, Exception), (data.hex(), general)
    assert general == (fast, False)
    assert type(fast.encryption_key) is bytes and (fast.aad_prefix is None or type(fast.aad_prefix) is bytes)
    return True


@given(
    key=st.binary(max_size=70),
    aad=st.none() | st.binary(max_size=70),
    length=st.none() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    cut=st.integers(min_value=0, max_value=200),
    tail=st.binary(max_size=3),
)
def test_fast_decoder_agrees_with_the_general_one(key, aad, length, cut, tail):
    encoded = StandardKeyMetadata(key, aad, length).encode()
    _agrees(encoded + tail)
    _agrees(encoded[:cut])  # truncations: never accepted by the fast path unless complete


@given(st.binary(max_size=80))
def test_fast_decoder_agrees_on_arbitrary_bytes(data):
    _agrees(data)
    _agrees(b"\x01" + data)


def test_fast_decoder_takes_the_common_shapes():
    for km in (StandardKeyMetadata(b"k" * 16), StandardKeyMetadata(b"k" * 32, b"a" * 16, 123_456_789),
               StandardKeyMetadata(b"k" * 24, b"", 0)):
        assert _agrees(km.encode())
    # 1.10's two-field layout and 10-byte lengths go the general way
    assert _decode_common(StandardKeyMetadata(b"k" * 16, b"a").encode()[:-1]) is None
    assert _decode_common(StandardKeyMetadata(b"k" * 16, None, 1 << 62).encode()) is None
