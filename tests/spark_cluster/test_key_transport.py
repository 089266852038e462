"""The mechanics of option ``keys.transport`` of the file sources, without a cluster.

The reader and writer objects are used the way Spark uses them (built on the "driver",
pickled, used on an "executor"); the executor side runs after the keystore is gone, so
any KMS call there would fail.  test_standalone.py runs the same on a real cluster.
"""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from icecrypt import avro, parquet  # noqa: E402
from icecrypt.errors import EncryptionKeyNotFoundError, IcecryptError, KmsError  # noqa: E402
from icecrypt.keys import EncryptionManager  # noqa: E402
from icecrypt.keys.manifest import read_key_manifest, write_key_manifest  # noqa: E402
from icecrypt.kms.local import LocalKms  # noqa: E402
from icecrypt.spark import _keys  # noqa: E402
from icecrypt.spark._avro import AvroDataSource, AvroReader, AvroWriter  # noqa: E402
from icecrypt.spark._common import key_transport  # noqa: E402
from icecrypt.spark._parquet import ParquetDataSource, ParquetReader  # noqa: E402
from icecrypt.spark._write import TaskFiles, WrittenFile  # noqa: E402

MASTER_KEY = "master"
TABLE = pa.table({"id": pa.array(range(100), pa.int64()), "s": [f"r{i}" for i in range(100)]})


@pytest.fixture
def setup(tmp_path, monkeypatch):
    # fresh per-process caches: every test sees what a new Python worker would
    monkeypatch.setattr(_keys, "_CLIENTS", _keys._Lru(8))
    monkeypatch.setattr(_keys, "_KEYRINGS", _keys._Lru(8))
    monkeypatch.setattr(_keys, "_KEKS", _keys._Lru(8))
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, [MASTER_KEY])
    kms = LocalKms(keystore)
    data = tmp_path / "data"
    data.mkdir()
    keys = {}
    for i in range(3):
        keys[str(data / f"f{i}.avro")] = avro.write(TABLE.slice(i * 30, 30), data / f"f{i}.avro")
        keys[str(data / f"f{i}.parquet")] = parquet.write_table(TABLE.slice(i * 30, 30), data / f"f{i}.parquet")
    manifest = tmp_path / "keys.json"
    write_key_manifest(manifest, keys, EncryptionManager(kms, MASTER_KEY))
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
               "keys.manifest": str(manifest), "encryption.key-id": MASTER_KEY, "path": str(data),
               "split-size": "1m"}
    return tmp_path, keystore, kms, keys, options


def _reader(source, reader_cls, options):
    schema = source(options).schema()
    return reader_cls(options, schema)


def _forget_caches(monkeypatch):
    monkeypatch.setattr(_keys, "_CLIENTS", _keys._Lru(8))
    monkeypatch.setattr(_keys, "_KEYRINGS", _keys._Lru(8))


@pytest.mark.parametrize("source,reader_cls,ext", [(AvroDataSource, AvroReader, ".avro"),
                                                   (ParquetDataSource, ParquetReader, ".parquet")])
def test_task_keys_read_without_kms(setup, monkeypatch, source, reader_cls, ext):
    tmp_path, keystore, _, keys, options = setup
    options = {**options, "keys.transport": "task"}
    reader = _reader(source, reader_cls, options)
    shipped = pickle.dumps(reader)  # what Spark sends to the tasks: before partitions()
    partitions = reader.partitions()
    for partition in partitions:  # each carries the keys of its own files, and only those
        files = {piece[0].uri for piece in partition.pieces}
        assert set(partition.keys) == {_keys.canonical(f) for f in files}
        assert all(partition.keys[_keys.canonical(f)] == keys[f] for f in files)
        for km in partition.keys.values():  # the DEK never shows
            assert km.encryption_key.hex() not in repr(partition) and km.encryption_key not in shipped
    shipped_partitions = [pickle.dumps(p) for p in partitions]

    keystore.unlink()  # the "executors" have no KMS
    _forget_caches(monkeypatch)
    task_reader = pickle.loads(shipped)
    rows = sum(batch.num_rows for data in shipped_partitions for batch in task_reader.read(pickle.loads(data)))
    assert rows == 90

    # the default transport needs the KMS there
    options_default = {k: v for k, v in options.items() if k != "keys.transport"}
    default_reader = pickle.loads(shipped)
    default_reader.options, default_reader.transport = options_default, key_transport(options_default)
    with pytest.raises(KmsError, match="does not exist"):
        list(default_reader.read(pickle.loads(shipped_partitions[0])))


def test_task_keys_partition_without_keys_is_refused(setup):
    _, _, _, _, options = setup
    reader = _reader(AvroDataSource, AvroReader, {**options, "keys.transport": "task"})
    partition = reader.partitions()[0]
    partition.keys = None
    with pytest.raises(EncryptionKeyNotFoundError, match="carries no keys"):
        list(pickle.loads(pickle.dumps(reader)).read(partition))
    partition.keys = {}
    with pytest.raises(EncryptionKeyNotFoundError, match="no key metadata for"):
        list(pickle.loads(pickle.dumps(reader)).read(partition))


def test_task_keys_write_without_kms(setup, monkeypatch):
    tmp_path, keystore, kms, _, options = setup
    out = tmp_path / "out"
    write_options = {**options, "path": str(out), "keys.manifest": str(tmp_path / "out-keys.json"),
                     "encryption.key-id": MASTER_KEY, "keys.transport": "task"}
    writer = AvroWriter(write_options, None, False)
    assert writer.kek is None  # no job KEK: nothing to unwrap in the tasks
    shipped = pickle.dumps(writer)

    material = keystore.read_bytes()
    keystore.unlink()  # the "executor" has no KMS
    _forget_caches(monkeypatch)
    message = pickle.loads(shipped).write(iter(TABLE.to_batches(max_chunksize=40)))
    (written,) = message.files
    assert written.wrapped_key is None and written.key_metadata is not None
    assert written.key_metadata.encryption_key.hex() not in repr(message)

    keystore.write_bytes(material)  # the driver has it
    keystore.chmod(0o600)
    writer.commit([message])
    recorded = read_key_manifest(tmp_path / "out-keys.json", kms, table_key_id=MASTER_KEY)
    assert list(recorded) == [written.uri]
    assert avro.read(written.uri, recorded[written.uri]).num_rows == 100


def test_default_write_needs_kms_in_tasks(setup, monkeypatch):
    tmp_path, keystore, _, _, options = setup
    write_options = {**options, "path": str(tmp_path / "out"), "keys.manifest": str(tmp_path / "out-keys.json"),
                     "encryption.key-id": MASTER_KEY}
    writer = AvroWriter(write_options, None, False)
    assert writer.kek is not None
    shipped = pickle.dumps(writer)
    keystore.unlink()
    _forget_caches(monkeypatch)
    monkeypatch.setattr(_keys, "_KEKS", _keys._Lru(8))
    with pytest.raises(KmsError, match="does not exist"):
        pickle.loads(shipped).write(iter(TABLE.to_batches()))
    assert not list((tmp_path / "out").glob("part-*"))


def test_commit_refuses_a_key_in_the_wrong_form(setup):
    tmp_path, _, _, keys, options = setup
    write_options = {**options, "path": str(tmp_path / "out"), "keys.manifest": str(tmp_path / "out-keys.json"),
                     "encryption.key-id": MASTER_KEY, "keys.transport": "task"}
    writer = AvroWriter(write_options, None, False)
    with pytest.raises(IcecryptError, match="does not carry its key the way this job sends keys"):
        writer.commit([TaskFiles((WrittenFile(str(tmp_path / "out" / "x.avro"), wrapped_key=b"\0" * 40),))])


def test_transport_option_values():
    assert key_transport({}) == "executor"
    assert key_transport({"keys.transport": " TASK "}) == "task"
    with pytest.raises(ValueError, match="keys.transport='driver' is not supported"):
        key_transport({"keys.transport": "driver"})


def test_kms_client_is_created_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setattr(_keys, "_CLIENTS", _keys._Lru(8))
    monkeypatch.delenv("ICECRYPT_KEYSTORE", raising=False)
    client = _keys.kms_client({"encryption.kms-type": "local"})  # no keystore: fine until used
    assert "local" in repr(client)
    with pytest.raises(KmsError, match="local KMS needs a keystore"):
        client.unwrap_key(b"x" * 40, MASTER_KEY)
