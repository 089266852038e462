"""icecrypt.parquet over pyarrow filesystems holding the stored (encrypted) bytes:
LocalFileSystem, SubTreeFileSystem, S3 (a moto server); EncryptedFileSystem refused."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from parquet_rows import sample_table

import icecrypt
from icecrypt import parquet as ip
from icecrypt.arrow import EncryptedFileSystem
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.kms.memory import MemoryKms

TABLE = sample_table(150)


def listing(fs: pafs.FileSystem, base: str) -> list[str]:
    return sorted(info.path for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)))


def roundtrip(fs: pafs.FileSystem, path: str) -> None:
    km = ip.write_table(TABLE, path, filesystem=fs, row_group_size=40)
    info = fs.get_file_info(path)
    assert info.type == pafs.FileType.File and info.size == km.file_length
    with fs.open_input_file(path) as f:
        assert f.read(4) == b"PARE"
    assert ip.read_table(path, km, filesystem=fs).equals(TABLE)
    assert ip.read_table(path, km, filesystem=fs, columns=["id"], filters=[("id", "<", 5)]).num_rows == 5
    with ip.open_file(path, km, filesystem=fs) as f:
        assert f.num_row_groups == 4
        assert f.read_row_group(3).equals(TABLE.slice(120, 30))
    with pytest.raises(icecrypt.AuthenticationError, match=path):
        ip.read_table(path, StandardKeyMetadata(km.encryption_key, bytes(16)), filesystem=fs)


def failed_writes_leave_nothing(fs: pafs.FileSystem, directory: str) -> None:
    before = listing(fs, directory)
    path = f"{directory}/failed.parquet"
    with pytest.raises(RuntimeError, match="boom"), ip.open_writer(path, TABLE.schema, filesystem=fs) as w:
        w.write_table(TABLE)
        assert fs.get_file_info(path).type == pafs.FileType.NotFound  # not visible yet
        raise RuntimeError("boom")
    w = ip.open_writer(path, TABLE.schema, filesystem=fs)
    w.write_table(TABLE)
    with pytest.raises(ValueError, match="schema does not match"):
        w.write_table(pa.table({"x": [1]}))
    assert listing(fs, directory) == before


def test_local_filesystem(tmp_path):
    fs = pafs.LocalFileSystem()
    roundtrip(fs, str(tmp_path / "t.parquet"))
    failed_writes_leave_nothing(fs, str(tmp_path))
    # a PathLike works with a local filesystem too
    km = ip.write_table(TABLE, tmp_path / "p.parquet", filesystem=fs)
    assert ip.read_table(tmp_path / "p.parquet", km, filesystem=fs).equals(TABLE)


def test_subtree_filesystem(tmp_path):
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    fs.create_dir("warehouse/db")
    roundtrip(fs, "warehouse/db/t.parquet")
    assert (tmp_path / "warehouse" / "db" / "t.parquet").read_bytes()[-4:] == b"PARE"
    failed_writes_leave_nothing(fs, "warehouse/db")


@pytest.mark.servers
def test_s3_filesystem(s3_bucket):
    fs, bucket = s3_bucket
    roundtrip(fs, f"{bucket}/data/t.parquet")
    failed_writes_leave_nothing(fs, bucket)
    assert listing(fs, bucket) == [f"{bucket}/data", f"{bucket}/data/t.parquet"]


@pytest.mark.servers
def test_s3_missing_object_is_not_a_decryption_error(s3_bucket):
    fs, bucket = s3_bucket
    km = ip.write_table(TABLE, f"{bucket}/t.parquet", filesystem=fs)
    with pytest.raises(FileNotFoundError):
        ip.read_table(f"{bucket}/nope.parquet", km, filesystem=fs)


def test_encrypted_filesystem_is_refused(tmp_path):
    """The formats encrypt natively; an AGS1-encrypting filesystem would encrypt twice."""
    efs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), EncryptionManager(MemoryKms.with_iceberg_test_keys(), "keyA"))
    km = ip.write_table(TABLE, tmp_path / "t.parquet")
    path = str(tmp_path / "t.parquet")
    for fs in (efs, pafs.SubTreeFileSystem(str(tmp_path), efs)):
        with pytest.raises(ValueError, match="EncryptedFileSystem"):
            ip.write_table(TABLE, str(tmp_path / "x.parquet"), filesystem=fs)
        with pytest.raises(ValueError, match="EncryptedFileSystem"):
            ip.open_writer(str(tmp_path / "x.parquet"), TABLE.schema, filesystem=fs)
        with pytest.raises(ValueError, match="EncryptedFileSystem"):
            ip.read_table(path, km, filesystem=fs)
        with pytest.raises(ValueError, match="EncryptedFileSystem"):
            ip.open_file(path, km, filesystem=fs)
    # its base filesystem is what to pass
    assert ip.read_table(path, km, filesystem=efs.handler.base).equals(TABLE)
    assert not (tmp_path / "x.parquet").exists()


def test_filesystem_must_be_a_pyarrow_filesystem(tmp_path):
    with pytest.raises(TypeError, match="pyarrow.fs.FileSystem"):
        ip.write_table(TABLE, str(tmp_path / "t.parquet"), filesystem="local")
