"""EncryptedKey JSON: Java's field names and order, strict parsing, short reprs."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from icecrypt import FormatError
from icecrypt.keys import EncryptedKey


def test_bundle_entries_round_trip_byte_for_byte(bundle):
    for obj in bundle["encryption-keys"]:
        entry = EncryptedKey.from_json(obj)
        assert entry.to_json() == obj
        assert list(entry.to_json()) == list(obj)  # same field order
        assert json.dumps(entry.to_json()) == json.dumps(obj)


def test_field_order_and_omissions():
    full = EncryptedKey("id", b"\x00\xff" * 3, "kek", {"KEY_TIMESTAMP": "1", "b": "2"})
    assert list(full.to_json()) == ["key-id", "encrypted-key-metadata", "encrypted-by-id", "properties"]
    assert full.to_json()["encrypted-key-metadata"] == base64.b64encode(b"\x00\xff" * 3).decode()
    bare = EncryptedKey("id", b"\xfb\xff")
    assert bare.to_json() == {"key-id": "id", "encrypted-key-metadata": "+/8="}  # standard alphabet, padded
    assert EncryptedKey("id", b"x", "k", {}).to_json() == {"key-id": "id", "encrypted-key-metadata": "eA==",
                                                           "encrypted-by-id": "k"}
    assert EncryptedKey("id", b"x", None, {}).properties is None


def test_from_json_accepts_missing_padding_and_ignores_unknown_fields():
    entry = EncryptedKey.from_json({"key-id": "a", "encrypted-key-metadata": "+/8", "future-field": 1})
    assert entry.encrypted_key_metadata == b"\xfb\xff"
    assert entry.encrypted_by_id is None and entry.properties is None
    assert EncryptedKey.from_json({"key-id": "a", "encrypted-key-metadata": "", "encrypted-by-id": None,
                                   "properties": None}) == EncryptedKey("a", b"")


@pytest.mark.parametrize(
    "obj, message",
    [
        ([], "must be a JSON object"),
        ({"encrypted-key-metadata": "AA=="}, "no string 'key-id'"),
        ({"key-id": 5, "encrypted-key-metadata": "AA=="}, "no string 'key-id'"),
        ({"key-id": "k1"}, "'k1' has no string 'encrypted-key-metadata'"),
        ({"key-id": "k1", "encrypted-key-metadata": "A*=="}, "'k1'.*not valid base64"),
        ({"key-id": "k1", "encrypted-key-metadata": "A"}, "not valid base64"),
        ({"key-id": "k1", "encrypted-key-metadata": "AA==\n"}, "not valid base64"),
        ({"key-id": "k1", "encrypted-key-metadata": "AA==", "encrypted-by-id": 3}, "'encrypted-by-id' must be"),
        ({"key-id": "k1", "encrypted-key-metadata": "AA==", "properties": {"a": 1}}, "'properties' must map"),
        ({"key-id": "k1", "encrypted-key-metadata": "AA==", "properties": ["a"]}, "'properties' must map"),
    ],
)
def test_from_json_errors(obj, message):
    with pytest.raises(FormatError, match=message):
        EncryptedKey.from_json(obj)


def test_immutable_hashable_picklable():
    entry = EncryptedKey("id", bytearray(b"abc"), "kek", {"KEY_TIMESTAMP": "5"})
    assert type(entry.encrypted_key_metadata) is bytes
    with pytest.raises(AttributeError):
        entry.key_id = "other"
    with pytest.raises(TypeError):
        entry.properties["KEY_TIMESTAMP"] = "6"
    same = EncryptedKey("id", b"abc", "kek", {"KEY_TIMESTAMP": "5"})
    assert entry == same and hash(entry) == hash(same) and len({entry, same}) == 1
    assert entry != same.replace(properties={"KEY_TIMESTAMP": "6"})
    assert pickle.loads(pickle.dumps(entry)) == entry
    assert entry.key_timestamp == "5" and EncryptedKey("x", b"").key_timestamp is None
    with pytest.raises(TypeError):
        entry.replace(nonsense=1)


def test_type_errors():
    with pytest.raises(TypeError):
        EncryptedKey(1, b"")
    with pytest.raises(TypeError):
        EncryptedKey("id", "AAAA")
    with pytest.raises(TypeError):
        EncryptedKey("id", b"", 5)
    with pytest.raises(TypeError):
        EncryptedKey("id", b"", None, {"a": 1})


def test_repr_is_short_and_has_no_bytes():
    wrapped = bytes.fromhex("deadbeef") * 17
    text = repr(EncryptedKey("kid==", wrapped, "kek==", {"KEY_TIMESTAMP": "17"}))
    assert text == ("EncryptedKey(key_id='kid==', encrypted_by_id='kek==', encrypted_key_metadata=<68 bytes>, "
                    "properties={'KEY_TIMESTAMP': '17'})")
    assert "deadbeef" not in text and base64.b64encode(wrapped).decode()[:8] not in text
