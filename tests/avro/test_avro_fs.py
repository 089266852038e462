"""The ``filesystem`` argument: pyarrow LocalFileSystem and SubTreeFileSystem for every
entry point, atomic writes there, and EncryptedFileSystem refused (it would encrypt twice)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import icecrypt
from icecrypt import avro
from icecrypt.arrow import EncryptedFileSystem
from icecrypt.keys import StandardKeyMetadata

SCHEMA = {"type": "record", "name": "r", "fields": [{"name": "i", "type": "long", "field-id": 1}]}
TABLE = pa.table({"i": pa.array(range(50_000), pa.int64()), "s": pa.array([str(i) for i in range(50_000)])})


def filesystems(tmp_path):
    local = pafs.LocalFileSystem()
    yield "local", local, str(tmp_path / "data")
    yield "subtree", pafs.SubTreeFileSystem(str(tmp_path), local), "data"


@pytest.mark.parametrize("kind", ["local", "subtree"])
def test_every_entry_point_on_a_filesystem(tmp_path, kind):
    (tmp_path / "data").mkdir()
    _, fs, base = next(f for f in filesystems(tmp_path) if f[0] == kind)
    km = avro.write(TABLE, f"{base}/t.avro", filesystem=fs)
    assert km.file_length == (tmp_path / "data" / "t.avro").stat().st_size
    assert avro.read(f"{base}/t.avro", km, filesystem=fs).equals(TABLE)
    assert avro.read(tmp_path / "data" / "t.avro", km).equals(TABLE)  # the same bytes, read locally
    assert avro.read_schema(f"{base}/t.avro", km, filesystem=fs) == TABLE.schema
    size = avro.plaintext_size(km)
    parts = [b for start in range(0, size, 100_000)
             for b in avro.read_split(f"{base}/t.avro", km, start, 100_000, filesystem=fs)]
    assert pa.Table.from_batches(parts).equals(TABLE)
    km2 = avro.write_records(f"{base}/m.avro", SCHEMA, [{"i": 1}], filesystem=fs, metadata={"content": "data"})
    with avro.read_records(f"{base}/m.avro", km2, filesystem=fs) as records:
        assert list(records) == [{"i": 1}] and records.metadata["content"] == b"data"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["m.avro", "t.avro"]


@pytest.mark.parametrize("kind", ["local", "subtree"])
def test_failed_write_leaves_nothing(tmp_path, kind):
    (tmp_path / "data").mkdir()
    _, fs, base = next(f for f in filesystems(tmp_path) if f[0] == kind)

    def batches():
        yield from TABLE.to_batches(max_chunksize=10_000)
        raise RuntimeError("upstream failed")

    with pytest.raises(RuntimeError, match="upstream failed"):
        avro.write(pa.RecordBatchReader.from_batches(TABLE.schema, batches()), f"{base}/t.avro", filesystem=fs)
    assert list((tmp_path / "data").iterdir()) == []
    # an existing file is kept as it was
    km = avro.write_records(f"{base}/m.avro", SCHEMA, [{"i": 1}], filesystem=fs)
    with pytest.raises(ValueError, match="m.avro"):
        avro.write_records(f"{base}/m.avro", SCHEMA, [{"i": "x"}], filesystem=fs)
    assert [r["i"] for r in avro.read_records(f"{base}/m.avro", km, filesystem=fs)] == [1]
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["m.avro"]


def test_encrypted_filesystem_is_refused(tmp_path):
    encrypted = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys={})
    km = avro.write(TABLE, tmp_path / "t.avro")
    for fs in (encrypted, pafs.SubTreeFileSystem(str(tmp_path), encrypted)):
        with pytest.raises(ValueError, match="EncryptedFileSystem"):
            avro.write(TABLE, str(tmp_path / "x.avro"), filesystem=fs)
        with pytest.raises(ValueError, match="EncryptedFileSystem"):
            avro.write_records(str(tmp_path / "x.avro"), SCHEMA, [], filesystem=fs)
        for call in (avro.read, avro.read_schema, avro.read_records):
            with pytest.raises(ValueError, match="EncryptedFileSystem"):
                call(str(tmp_path / "t.avro"), km, filesystem=fs)
        with pytest.raises(ValueError, match="EncryptedFileSystem"):
            avro.read_split(str(tmp_path / "t.avro"), km, 0, 10, filesystem=fs)
    assert [p.name for p in tmp_path.iterdir()] == ["t.avro"]


def test_not_a_filesystem(tmp_path):
    with pytest.raises(TypeError):
        avro.read(tmp_path / "t.avro", StandardKeyMetadata(bytes(16)), filesystem=object())


def test_errors_name_the_filesystem_path(tmp_path):
    (tmp_path / "data").mkdir()
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    km = avro.write(TABLE, "data/t.avro", filesystem=fs)
    with pytest.raises(icecrypt.AuthenticationError, match="data/t.avro"):
        avro.read("data/t.avro", StandardKeyMetadata(bytes(16), km.aad_prefix, km.file_length), filesystem=fs)
