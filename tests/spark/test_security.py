"""Keys stay out of plans and error messages; wrong, missing and tampered inputs fail
closed with a message that names the file and what is wrong."""

from __future__ import annotations

import shutil

import pytest
from sparkhelpers import MASTER, key_strings

from icecrypt.spark import wrap_keys

pytestmark = pytest.mark.spark


def _assert_no_keys(text: str, *key_sets) -> None:
    for keys in key_sets:
        for leak in key_strings(keys.values()):
            assert leak not in text


def _error_text(action) -> str:
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def test_explain_shows_no_key_material(icespark, kms, kms_options, avro_data, parquet_data, capfd):
    avro_keys = wrap_keys(avro_data.keys, kms=kms, table_key_id=MASTER)
    parquet_keys = wrap_keys(parquet_data.keys, kms=kms, table_key_id=MASTER)
    frames = [
        icespark.read.format("icecrypt.avro").options(**kms_options).option("keys.wrapped", avro_keys)
        .load(str(avro_data.enc)),
        icespark.read.format("icecrypt.parquet").options(**kms_options).option("keys.wrapped", parquet_keys)
        .option("columns", "id,s").load(str(parquet_data.enc)),
    ]
    for df in frames:
        df.filter("id > 10").groupBy("s").count().explain(True)
        df.explain("formatted")
    plans = capfd.readouterr().out
    assert "BatchScan icecrypt.avro" in plans and "BatchScan icecrypt.parquet" in plans
    _assert_no_keys(plans, avro_data.keys, parquet_data.keys)


def test_wrong_and_missing_keys(icespark, kms, kms_options, avro_data):
    enc = avro_data.enc
    big, s1, s2 = (str(enc / name) for name in ("big.avro", "small/s1.avro", "small/s2.avro"))
    keys = avro_data.keys

    def read(mapping, path=str(enc)):
        wrapped = wrap_keys(mapping, kms=kms, table_key_id=MASTER)
        return (icespark.read.format("icecrypt.avro").options(**kms_options).option("keys.wrapped", wrapped)
                .load(path))

    # s1 gets s2's key (with s1's length): planning needs only big.avro's header, so the
    # task reading s1 fails; with s2's length too, the length check fails first.
    wrong = keys[s2].with_file_length(keys[s1].file_length)
    text = _error_text(lambda: read({big: keys[big], s1: wrong, s2: keys[s2]}).collect())
    assert "AuthenticationError" in text and "icecrypt.avro: split [0, " in text and f"of {s1}: " in text
    _assert_no_keys(text, keys)
    text = _error_text(lambda: read({big: keys[big], s1: keys[s2], s2: keys[s2]}).collect())
    assert "FormatError" in text and f"of {s1}: AGS1 stream is longer than its key metadata says" in text

    # No key for s2: the planner refuses before any task runs.
    text = _error_text(lambda: read({big: keys[big], s1: keys[s1]}).collect())
    assert "EncryptionKeyNotFoundError" in text and f"no key metadata for {s2} in option keys.wrapped" in text
    _assert_no_keys(text, keys)

    # The plaintext twin read with the encrypted file's key: not AGS1, refused at load().
    twin = str(avro_data.twin(big))
    text = _error_text(lambda: read({twin: keys[big]}, twin))
    assert "FormatError" in text and twin in text
    _assert_no_keys(text, keys)


def test_tampered_parquet_page_fails_in_the_task(icespark, kms, kms_options, parquet_data, tmp_path):
    source = parquet_data.enc / "p2.parquet"
    tampered = tmp_path / "tampered.parquet"
    shutil.copyfile(source, tampered)
    data = bytearray(tampered.read_bytes())
    data[len(data) // 3] ^= 0x01  # inside a data page: the footer still authenticates
    tampered.write_bytes(bytes(data))
    km = parquet_data.keys[str(source)]
    wrapped = wrap_keys({str(tampered): km}, kms=kms, table_key_id=MASTER)
    df = (icespark.read.format("icecrypt.parquet").options(**kms_options).option("keys.wrapped", wrapped)
          .option("split-size", "1").load(str(tampered)))
    assert df.rdd.getNumPartitions() == 1  # planned by size: one file below the smallest byte range
    text = _error_text(df.collect)
    assert "AuthenticationError" in text and f"of {tampered}" in text and "row groups" in text
    _assert_no_keys(text, parquet_data.keys)
