"""The JVM's cache of a native read's file keys (``org.icecrypt.spark.FileKeys``, issue 30).

The cache of parsed file keys was keyed by the read id plus the *length* of the key text:
another session of the JVM that knew a read id (read ids appear in plans) and sent any
text of that length got the read's keys, and the last 16 reads' keys stayed for the JVM's
life.  Now an entry is found only with the same key text (its SHA-256 digest), and it is
dropped (its bytes zeroed) when the last task of this JVM that used it ends."""

from __future__ import annotations

import os
import types

import pyarrow as pa
import pytest

import icecrypt.spark
from icecrypt.keys import StandardKeyMetadata
from icecrypt.kms.local import LocalKms
from icecrypt.spark import _native
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def nspark(spark):
    assert _native.native_available(spark)
    return spark


class _File:
    def __init__(self, km: StandardKeyMetadata):
        self.km = km

    def key(self) -> StandardKeyMetadata:
        return self.km


def test_same_read_id_other_key_text_gets_nothing_of_the_read(nspark, tmp_path):
    """Two configurations with one read id: the first caches the read's keys; the second,
    whose text has the same length but another DEK for the same file (what another
    session could send), gets its own key, never the cached one."""
    jvm = nspark.sparkContext._jvm
    factory = jvm.org.icecrypt.spark.FileDecryption()
    data = tmp_path / "a.parquet"
    data.write_bytes(b"x" * 40)
    path = f"file://{data}"
    read_id = "read-" + os.urandom(8).hex()
    victim, other = (StandardKeyMetadata(os.urandom(16), os.urandom(16), 40) for _ in range(2))

    def props(km):
        conf = jvm.org.apache.hadoop.conf.Configuration(False)
        conf.set(_native.KEYS_PROPERTY, _native._file_keys({path: _File(km)}))
        conf.set(_native.READ_ID_PROPERTY, read_id)
        return factory.getFileDecryptionProperties(conf, jvm.org.apache.hadoop.fs.Path(path))

    texts = [_native._file_keys({path: _File(km)}) for km in (victim, other)]
    assert len(texts[0]) == len(texts[1])  # what the old cache key told apart: nothing
    assert bytes(props(victim).getFooterKey()) == victim.encryption_key
    got = props(other)
    assert bytes(got.getFooterKey()) == other.encryption_key and bytes(got.getAADPrefix()) == other.aad_prefix
    assert bytes(props(victim).getFooterKey()) == victim.encryption_key  # each text its own entry
    assert jvm.org.icecrypt.spark.FileKeys.cachedReads(read_id) == 2


def test_a_finished_read_leaves_no_keys_in_the_cache(nspark, tmp_path, monkeypatch):
    """A native read of an encrypted table: its tasks cache the read's keys while they run;
    once the read's tasks are over (collect returned), the cache holds nothing of it,
    however often the DataFrame is read again."""
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=LocalKms(keystore), table_key_id="master")
    for part in range(3):
        ids = range(part * 10, part * 10 + 10)
        table.append(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]}))
    read_id = "read-" + os.urandom(8).hex()
    monkeypatch.setattr(_native, "uuid", types.SimpleNamespace(uuid4=lambda: types.SimpleNamespace(hex=read_id)))
    frame = icecrypt.spark.read_table(nspark, table.location, native="true", **{
        "encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)})
    keys = nspark.sparkContext._jvm.org.icecrypt.spark.FileKeys
    for _ in range(2):
        assert sorted(r.id for r in frame.collect()) == list(range(30))
        assert keys.cachedReads(read_id) == 0
