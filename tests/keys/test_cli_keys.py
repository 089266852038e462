"""``icecrypt keys ...`` and ``icecrypt key-metadata ...`` end to end (through register())."""

from __future__ import annotations

import argparse
import json
import shutil
import stat

import pytest

from icecrypt import FormatError, KmsKeyNotFoundError, ags1
from icecrypt.cli import _keys as _cli_keys
from icecrypt.keys import EncryptionManager, StandardKeyMetadata, read_encryption_keys
from icecrypt.kms.local import LocalKms
from icecrypt.kms.memory import MemoryKms

KEY = bytes.fromhex("deadbeefcafebabe0badf00d5eed1e55")
TEST_KEYS = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]


def run(argv):
    parser = argparse.ArgumentParser(prog="icecrypt")
    _cli_keys.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def table(tables_dir, tmp_path):
    """A copy of a Java table's newest metadata.json (and its manifest lists)."""
    source = tables_dir / "enc_avro_dek16"
    shutil.copytree(source / "metadata", tmp_path / "metadata")
    newest = sorted((tmp_path / "metadata").glob("*.metadata.json"))[-1]
    return newest


def test_key_metadata_encode_decode(capfd):
    assert run(["key-metadata", "encode", "--key-hex", KEY.hex(), "--aad-hex", "10" * 16,
                "--file-length", "1234567"]) == 0
    encoded = capfd.readouterr().out.strip()
    assert bytes.fromhex(encoded) == StandardKeyMetadata(KEY, bytes([0x10]) * 16, 1234567).encode()
    assert run(["key-metadata", "decode", encoded]) == 0
    out = capfd.readouterr().out
    assert KEY.hex() not in out
    assert json.loads(out) == {"layout": "iceberg-1.11", "key_length": 16, "aad_prefix_hex": "10" * 16,
                               "file_length": 1234567}
    assert run(["key-metadata", "decode", "--show-key", encoded]) == 0
    assert json.loads(capfd.readouterr().out)["key_hex"] == KEY.hex()


def test_key_metadata_decode_1_10_layout_and_errors(vectors, capfd):
    (v,) = [v for v in vectors["key_metadata_decode"] if v["id"] == "iceberg_1_10_two_field_layout"]
    assert run(["key-metadata", "decode", v["input_hex"]]) == 0
    result = json.loads(capfd.readouterr().out)
    assert result["layout"].startswith("iceberg-1.10") and result["file_length"] is None
    with pytest.raises(FormatError, match="version byte 0x02"):
        run(["key-metadata", "decode", "02" + KEY.hex()])
    with pytest.raises(ValueError, match="not valid hex") as info:
        run(["key-metadata", "encode", "--key-hex", KEY.hex() + "zz"])
    assert KEY.hex() not in str(info.value)


def test_keys_init(tmp_path, capfd):
    path = tmp_path / "ks.json"
    assert run(["keys", "init", str(path), "--key-id", "a", "--key-id", "b", "--key-length", "16"]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert LocalKms(path).key_ids == ["a", "b"]
    assert "a, b" in capfd.readouterr().out
    with pytest.raises(FileExistsError):
        run(["keys", "init", str(path)])


def test_keys_list(table, capfd):
    metadata = json.loads(table.read_text())
    assert run(["keys", "list", str(table), "--json"]) == 0
    listing = json.loads(capfd.readouterr().out)
    assert listing["table-key-id"] == "keyA"
    rows = {r["key-id"]: r for r in listing["encryption-keys"]}
    for snapshot in metadata["snapshots"]:
        ml = rows[snapshot["key-id"]]
        assert ml["role"] == "manifest-list key" and snapshot["snapshot-id"] in ml["snapshots"]
        kek = rows[ml["encrypted-by-id"]]
        assert kek["role"] == "KEK" and kek["encrypted-by-id"] == "keyA" and kek["key-timestamp"]
        assert snapshot["snapshot-id"] in kek["snapshots"]
    assert run(["keys", "list", str(table)]) == 0
    text = capfd.readouterr().out
    assert "KEK" in text and "manifest-list key" in text and "table key: keyA" in text
    for entry in metadata["encryption-keys"]:  # no wrapped material printed
        assert entry["encrypted-key-metadata"][:16] not in text


def _decrypt_all(metadata_path, kms, table_dir):
    metadata = json.loads(metadata_path.read_text())
    manager = EncryptionManager.from_table_metadata(kms, metadata)
    for snapshot in metadata["snapshots"]:
        km = manager.unwrap_manifest_list_key_metadata(snapshot["key-id"])
        name = snapshot["manifest-list"].rsplit("/", 1)[1]
        assert ags1.decrypt((table_dir / name).read_bytes(), km.encryption_key, km.aad_prefix,
                            km.file_length)[:4] == b"Obj\x01"
    return metadata


def test_keys_rotate_master(table, tmp_path, capfd):
    original = table.read_bytes()
    assert run(["keys", "rotate-master", str(table), "--new-key-id", "keyB", *TEST_KEYS]) == 0
    out = capfd.readouterr().out
    assert table.read_bytes() == original  # input untouched
    written = [p for p in table.parent.glob("*.metadata.json") if p.name.startswith("00003-")]
    assert len(written) == 1 and f"wrote {written[0]}" in out
    metadata = _decrypt_all(written[0], MemoryKms({"keyB": b"1123456789012345"}), table.parent)
    assert metadata["properties"]["encryption.key-id"] == "keyB"
    assert all(k.encrypted_by_id != "keyA" for k in read_encryption_keys(metadata))
    # --output refuses to overwrite; --in-place replaces the input
    with pytest.raises(FileExistsError):
        run(["keys", "rotate-master", str(table), "--new-key-id", "keyB", *TEST_KEYS, "--output", str(written[0])])
    assert run(["keys", "rotate-master", str(table), "--new-key-id", "keyB", *TEST_KEYS, "--in-place"]) == 0
    assert json.loads(table.read_text())["properties"]["encryption.key-id"] == "keyB"
    with pytest.raises(KmsKeyNotFoundError):
        run(["keys", "rotate-master", str(table), "--new-key-id", "keyC", *TEST_KEYS,
             "--output", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_keys_rotate_kek(table, tmp_path, capfd):
    target = tmp_path / "out.metadata.json"
    assert run(["keys", "rotate-kek", str(table), *TEST_KEYS, "--output", str(target)]) == 0
    before = read_encryption_keys(json.loads(table.read_text()))
    metadata = _decrypt_all(target, MemoryKms.with_iceberg_test_keys(), table.parent)
    after = read_encryption_keys(metadata)
    assert after[1:] == before and after[0].encrypted_by_id == "keyA" and after[0].key_timestamp
    assert f"new KEK {after[0].key_id}" in capfd.readouterr().out
    # everything but encryption-keys is as Java wrote it
    original = json.loads(table.read_text())
    assert {k: v for k, v in metadata.items() if k != "encryption-keys"} == \
        {k: v for k, v in original.items() if k != "encryption-keys"}
    assert list(metadata) == list(original)


def test_rewrite_argument_errors(table, tmp_path):
    with pytest.raises(ValueError, match="K=V"):
        run(["keys", "rotate-kek", str(table), "--kms-type", "memory", "--kms-property", "novalue"])
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"format-version": 2, "properties": {}}))
    with pytest.raises(ValueError, match="not encrypted"):
        run(["keys", "rotate-kek", str(plain), *TEST_KEYS])
    with pytest.raises(SystemExit):
        run(["keys", "rotate-kek", str(table), "--output", "x", "--in-place"])


def test_through_icecrypt_main(table, capfd):
    from icecrypt.cli import EXIT_FORMAT, EXIT_KMS, main

    assert main(["key-metadata", "decode", "02" + KEY.hex()]) == EXIT_FORMAT
    err = capfd.readouterr().err
    assert "version byte 0x02" in err and KEY.hex() not in err
    assert main(["keys", "rotate-kek", str(table), "--kms-type", "memory"]) == EXIT_KMS
    assert "no master key 'keyA'" in capfd.readouterr().err
    assert main(["keys", "list", str(table)]) == 0


@pytest.mark.parametrize("argv", [["--bogus"], ["keys"], ["keys", "list"], ["table", "verify", "t", "--no-such-option"],
                                  ["key-metadata", "decode"]])
def test_usage_errors_exit_64_not_the_authentication_status(argv, capfd):
    from icecrypt.cli import EXIT_AUTH, EXIT_USAGE, main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == EXIT_USAGE != EXIT_AUTH
    assert "usage: icecrypt" in capfd.readouterr().err
