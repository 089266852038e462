"""EncryptedFileSystem over the local filesystem: pyarrow's readers and writers through
it, keys, fail-closed reads, plain prefixes, atomic writes, file operations, pickling."""

from __future__ import annotations

import gc
import io
import os
import pickle
import random
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest

import icecrypt
from icecrypt import ags1
from icecrypt.arrow import (
    EncryptedFileSystem,
    EncryptedFileSystemHandler,
    is_encrypted_filesystem,
)
from icecrypt.keys import StandardKeyMetadata

N = 30_000
TABLE = pa.table(
    {
        "k": pa.array([i % 3 for i in range(N)], pa.int64()),
        "i": pa.array(range(N), pa.int64()),
        "x": pa.array([i * 0.5 for i in range(N)], pa.float64()),
        "s": pa.array([f"row-{i}" for i in range(N)], pa.string()),
    }
)


def stored(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def assert_ags1(path) -> None:
    data = stored(path)
    assert data[:4] == b"AGS1", f"{path} is not an AGS1 stream"
    assert b"PAR1" not in data[:8] + data[-8:]


def resolve_nothing(path: str) -> StandardKeyMetadata | None:
    """A picklable resolver that knows no key."""
    return None


# --------------------------------------------------------------------------- round trips


def test_parquet_round_trip(tmp_path, efs):
    path = str(tmp_path / "t.parquet")
    pq.write_table(TABLE, path, filesystem=efs)
    assert_ags1(path)
    assert pq.read_table(path, filesystem=efs).equals(TABLE)
    assert pq.read_table(path, filesystem=efs, columns=["s"]).column("s").equals(TABLE.column("s"))
    meta = pq.ParquetFile(path, filesystem=efs).metadata
    assert meta.num_rows == N
    km = efs.handler.key_metadata(path)
    assert km.file_length == os.path.getsize(path)
    assert efs.handler.written_keys() == {path: km}
    assert efs.get_file_info(path).size == ags1.plaintext_length(km.file_length)


def test_csv_round_trip(tmp_path, efs):
    path = str(tmp_path / "t.csv")
    with efs.open_output_stream(path) as out:
        pacsv.write_csv(TABLE, out)
    assert_ags1(path)
    with efs.open_input_stream(path) as src:
        assert pacsv.read_csv(src).equals(TABLE)
    # compression chosen from the extension is applied inside the encryption
    gz = str(tmp_path / "t.csv.gz")
    with efs.open_output_stream(gz) as out:
        pacsv.write_csv(TABLE, out)
    assert_ags1(gz)
    with efs.open_input_stream(gz) as src:
        assert pacsv.read_csv(src).equals(TABLE)


def test_json_round_trip(tmp_path, efs):
    path = str(tmp_path / "t.jsonl")
    rows = TABLE.slice(0, 5000).to_pylist()
    with efs.open_output_stream(path) as out:
        for row in rows:
            out.write(f'{{"k": {row["k"]}, "i": {row["i"]}, "x": {row["x"]}, "s": "{row["s"]}"}}\n'.encode())
    assert_ags1(path)
    with efs.open_input_stream(path) as src:
        table = pajson.read_json(src)
    assert table.to_pylist() == rows


@pytest.mark.parametrize("fmt", ["parquet", "ipc", "csv"])
def test_partitioned_dataset_round_trip(tmp_path, efs, fmt):
    root = str(tmp_path / "ds")
    ds.write_dataset(
        TABLE, root, filesystem=efs, format=fmt, partitioning=["k"], partitioning_flavor="hive",
        max_rows_per_file=4000, max_rows_per_group=4000,
    )
    files = sorted(str(p) for p in (tmp_path / "ds").rglob("*") if p.is_file())
    assert len(files) >= 6  # three partitions, several files each
    for f in files:
        assert_ags1(f)
    assert sorted(efs.handler.written_keys()) == files
    dataset = ds.dataset(root, filesystem=efs, format=fmt, partitioning="hive")
    got = dataset.to_table(use_threads=True).select(TABLE.column_names).sort_by("i")
    assert got.cast(TABLE.schema).equals(TABLE)
    filtered = dataset.to_table(filter=ds.field("k") == 1, columns=["i"]).column("i").to_pylist()
    assert sorted(filtered) == list(range(1, N, 3))


def test_random_access_reads(tmp_path, efs):
    path = str(tmp_path / "blob")
    data = random.Random(1).randbytes(3 * ags1.PLAIN_BLOCK_SIZE + 4321)
    with efs.open_output_stream(path) as out:
        out.write(data)
    rng = random.Random(2)
    with efs.open_input_file(path) as f:
        assert f.size() == len(data)
        for _ in range(50):
            offset = rng.randrange(0, len(data) + 10)
            n = rng.choice([0, 1, 100, ags1.PLAIN_BLOCK_SIZE, 2 * ags1.PLAIN_BLOCK_SIZE + 7])
            assert f.read_at(n, offset) == data[offset : offset + n]
        f.seek(len(data) - 5)
        assert f.read() == data[-5:]
    with efs.open_input_stream(path) as f:
        assert f.read() == data


def test_empty_file(tmp_path, efs):
    path = str(tmp_path / "empty")
    with efs.open_output_stream(path):
        pass
    assert os.path.getsize(path) == ags1.ciphertext_length(0)
    assert efs.get_file_info(path).size == 0
    with efs.open_input_file(path) as f:
        assert f.read() == b""


# --------------------------------------------------------------------------- keys


def test_keys_mapping_accepts_encoded_bytes_and_paths(tmp_path, efs, manager):
    path = tmp_path / "t.parquet"
    pq.write_table(TABLE, str(path), filesystem=efs)
    km = efs.handler.key_metadata(str(path))
    reader = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys={path: km.encode()})
    assert pq.read_table(str(path), filesystem=reader).equals(TABLE)
    assert reader.handler.key_metadata(str(path)) == km


def test_keys_resolver(tmp_path, efs):
    path = str(tmp_path / "t.parquet")
    pq.write_table(TABLE, path, filesystem=efs)
    asked = []

    def resolve(p: str):
        asked.append(p)
        return efs.handler.written_keys().get(p)

    reader = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys=resolve)
    assert pq.read_table(path, filesystem=reader).equals(TABLE)
    assert path in asked


def test_get_file_info_uses_trusted_length_not_decryption(tmp_path, efs):
    path = str(tmp_path / "blob")
    with efs.open_output_stream(path) as out:
        out.write(b"x" * 5000)
    km = efs.handler.key_metadata(path)
    wrong_key = StandardKeyMetadata(bytes(16), km.aad_prefix, km.file_length)
    other = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys={path: wrong_key})
    assert other.get_file_info(path).size == 5000  # from file_length: nothing decrypted
    [info] = other.get_file_info(pafs.FileSelector(str(tmp_path)))
    assert info.size == 5000 and info.path == path
    # key metadata without file_length: the plaintext size follows from the stored size
    legacy = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys={path: km.with_file_length(None)})
    assert legacy.get_file_info(path).size == 5000
    with legacy.open_input_file(path) as f:
        assert f.read() == b"x" * 5000
    with pytest.raises(icecrypt.AuthenticationError, match="blob"):
        other.open_input_file(path).read()


def test_no_manager_cannot_write(tmp_path):
    fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem())
    with pytest.raises(ValueError, match="no EncryptionManager"):
        fs.open_output_stream(str(tmp_path / "x"))
    assert list(tmp_path.iterdir()) == []


def test_wrapping_twice_is_refused(efs):
    assert is_encrypted_filesystem(efs) and not is_encrypted_filesystem(pafs.LocalFileSystem())
    view = pafs.SubTreeFileSystem("/tmp", efs)
    assert is_encrypted_filesystem(view)
    for base in (efs, view):
        with pytest.raises(ValueError, match="twice"):
            EncryptedFileSystem.wrap(base)


def test_no_key_material_in_reprs_or_errors(tmp_path, efs):
    path = str(tmp_path / "t.parquet")
    pq.write_table(TABLE, path, filesystem=efs)
    km = efs.handler.key_metadata(path)
    texts = [repr(efs.handler), repr(efs), str(efs.handler.written_keys())]
    bad = dict(efs.handler.written_keys())
    bad[path] = StandardKeyMetadata(os.urandom(16), km.aad_prefix, km.file_length)
    with pytest.raises(icecrypt.AuthenticationError) as err:
        pq.read_table(path, filesystem=EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys=bad))
    texts.append(str(err.value))
    for key in (km.encryption_key, bad[path].encryption_key):
        for text in texts:
            assert key.hex() not in text and repr(key) not in text


# --------------------------------------------------------------------------- fail closed


def test_file_without_key_is_refused(tmp_path, efs):
    plain = str(tmp_path / "plain.parquet")
    pq.write_table(TABLE, plain)  # a plaintext file where encrypted ones are expected
    for open_ in (efs.open_input_file, efs.open_input_stream):
        with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="plain.parquet"):
            open_(plain)
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="plain.parquet"):
        pq.read_table(plain, filesystem=efs)
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="plain.parquet"):
        ds.dataset(str(tmp_path), filesystem=efs, format="parquet").to_table()
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError):
        efs.handler.key_metadata(plain)
    with pytest.raises(FileNotFoundError):
        efs.open_input_file(str(tmp_path / "missing"))


def test_plaintext_file_with_a_key_is_refused(tmp_path, efs, manager):
    plain = str(tmp_path / "plain.parquet")
    pq.write_table(TABLE, plain)
    fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys={plain: manager.new_file_key()})
    with pytest.raises(icecrypt.FormatError, match="plain.parquet"):
        pq.read_table(plain, filesystem=fs)


def test_tampered_truncated_and_wrongly_keyed_files(tmp_path, efs, manager):
    root = tmp_path / "ds"
    ds.write_dataset(TABLE, str(root), filesystem=efs, format="parquet", max_rows_per_file=10_000,
                     max_rows_per_group=10_000)
    files = sorted(efs.handler.written_keys())
    victim = files[1]
    data = bytearray(stored(victim))
    data[len(data) // 2] ^= 1
    with open(victim, "wb") as f:
        f.write(data)
    with pytest.raises(icecrypt.AuthenticationError, match=os.path.basename(victim)):
        ds.dataset(str(root), filesystem=efs, format="parquet").to_table(use_threads=True)
    with open(victim, "wb") as f:
        f.write(data[:-100])
    with pytest.raises(icecrypt.FormatError, match="truncated"):
        pq.read_table(victim, filesystem=efs)
    keys = efs.handler.written_keys()
    keys[files[0]] = manager.new_file_key().with_file_length(keys[files[0]].file_length)
    fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys=keys)
    with pytest.raises(icecrypt.AuthenticationError, match=os.path.basename(files[0])):
        pq.read_table(files[0], filesystem=fs)


# --------------------------------------------------------------------------- plain prefixes


def test_plain_prefixes(tmp_path, manager):
    fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), manager, plain_prefixes=[str(tmp_path / "public")])
    (tmp_path / "public").mkdir()
    (tmp_path / "secret").mkdir()
    public, secret = str(tmp_path / "public" / "t.parquet"), str(tmp_path / "secret" / "t.parquet")
    pq.write_table(TABLE, public, filesystem=fs)
    pq.write_table(TABLE, secret, filesystem=fs)
    assert stored(public)[:4] == b"PAR1" and pq.read_table(public).equals(TABLE)
    assert_ags1(secret)
    assert pq.read_table(public, filesystem=fs).equals(TABLE)
    assert pq.read_table(secret, filesystem=fs).equals(TABLE)
    assert list(fs.handler.written_keys()) == [secret]
    assert fs.get_file_info(public).size == os.path.getsize(public)
    assert fs.handler.is_plain(str(tmp_path / "public")) and not fs.handler.is_plain(str(tmp_path / "publicity"))
    with fs.open_append_stream(str(tmp_path / "public" / "log")) as out:
        out.write(b"appended")
    assert stored(str(tmp_path / "public" / "log")) == b"appended"
    with pytest.raises(ValueError, match="plain_prefixes"):
        fs.move(public, str(tmp_path / "secret" / "moved.parquet"))
    with pytest.raises(ValueError, match="plain_prefixes"):
        fs.copy_file(secret, str(tmp_path / "public" / "copy.parquet"))


def test_append_is_refused(tmp_path, efs):
    path = str(tmp_path / "log")
    with efs.open_output_stream(path) as out:
        out.write(b"first")
    with pytest.raises(io.UnsupportedOperation, match="append"):
        efs.open_append_stream(path)
    with efs.open_input_stream(path) as f:
        assert f.read() == b"first"


# --------------------------------------------------------------------------- atomic writes


def test_dropped_stream_leaves_nothing_and_keeps_the_old_file(tmp_path, efs):
    path = str(tmp_path / "t.bin")
    with efs.open_output_stream(path) as out:
        out.write(b"version 1")
    old_key = efs.handler.key_metadata(path)
    out = efs.open_output_stream(path)
    out.write(os.urandom(3 * ags1.PLAIN_BLOCK_SIZE))
    with pytest.warns(ResourceWarning, match="t.bin"):
        del out
        gc.collect()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin"]  # no temporary file left
    assert efs.handler.key_metadata(path) == old_key
    with efs.open_input_stream(path) as f:
        assert f.read() == b"version 1"


def test_failed_publish_leaves_nothing(tmp_path, efs):
    target = tmp_path / "target"
    out = efs.open_output_stream(str(target))
    out.write(b"data")
    target.mkdir()  # the final rename cannot replace a directory
    with pytest.raises(OSError):
        out.close()
    assert [p.name for p in tmp_path.iterdir()] == ["target"]
    assert list(target.iterdir()) == []
    assert efs.handler.written_keys() == {}


_FULL_DISK_CHILD = """
import resource, signal, sys
import pyarrow.fs as pafs
from icecrypt.arrow import EncryptedFileSystem
from icecrypt.keys import EncryptionManager
from icecrypt.kms.memory import MemoryKms
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))
fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), EncryptionManager(MemoryKms.with_iceberg_test_keys(), "keyA"))
try:
    with fs.open_output_stream(sys.argv[1]) as out:
        for _ in range(8):
            out.write(bytes(1 << 20))
except OSError as exc:
    print("failed:", exc)
    sys.exit(0 if not fs.handler.written_keys() else 3)
sys.exit(2)
"""


def test_failed_base_write_leaves_nothing(tmp_path, efs):
    """A real write failure of the base filesystem (file size limit: EFBIG) mid-stream."""
    path = str(tmp_path / "big.bin")
    with efs.open_output_stream(path) as out:
        out.write(b"old")
    run = subprocess.run([sys.executable, "-c", _FULL_DISK_CHILD, path], check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "failed:" in run.stdout
    assert sorted(os.listdir(tmp_path)) == ["big.bin"]  # the temporary file is gone
    with efs.open_input_stream(path) as f:
        assert f.read() == b"old"


# --------------------------------------------------------------------------- file operations


def test_copy_move_delete_carry_keys(tmp_path, efs):
    (tmp_path / "a").mkdir()
    one, two = str(tmp_path / "a" / "1.parquet"), str(tmp_path / "a" / "2.parquet")
    pq.write_table(TABLE, one, filesystem=efs)
    pq.write_table(TABLE.slice(0, 10), two, filesystem=efs)

    copy = str(tmp_path / "copy.parquet")
    efs.copy_file(one, copy)
    assert pq.read_table(copy, filesystem=efs).equals(TABLE)
    assert efs.handler.key_metadata(copy) == efs.handler.key_metadata(one)

    moved = str(tmp_path / "moved.parquet")
    efs.move(copy, moved)
    assert pq.read_table(moved, filesystem=efs).equals(TABLE)
    assert copy not in efs.handler.written_keys() and moved in efs.handler.written_keys()
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError):
        efs.handler.key_metadata(copy)

    efs.move(str(tmp_path / "a"), str(tmp_path / "b"))  # a directory: every key follows
    assert pq.read_table(str(tmp_path / "b" / "2.parquet"), filesystem=efs).equals(TABLE.slice(0, 10))
    assert not any(k.startswith(str(tmp_path / "a") + "/") for k in efs.handler.written_keys())

    efs.delete_file(moved)
    assert moved not in efs.handler.written_keys() and not os.path.exists(moved)
    efs.create_dir(str(tmp_path / "b" / "sub" / "deeper"), recursive=True)
    assert (tmp_path / "b" / "sub" / "deeper").is_dir()
    efs.delete_dir_contents(str(tmp_path / "b"))
    assert list((tmp_path / "b").iterdir()) == []
    assert efs.handler.written_keys() == {}
    efs.delete_dir(str(tmp_path / "b"))
    assert not (tmp_path / "b").exists()


def test_subtree_base(tmp_path, manager):
    base = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    fs = EncryptedFileSystem.wrap(base, manager)
    pq.write_table(TABLE, "t.parquet", filesystem=fs)
    assert_ags1(tmp_path / "t.parquet")
    assert pq.read_table("t.parquet", filesystem=fs).equals(TABLE)
    assert list(fs.handler.written_keys()) == ["t.parquet"]


# --------------------------------------------------------------------------- pickling


def test_pickle_round_trip_carries_keys_not_the_manager(tmp_path, efs, manager):
    path = str(tmp_path / "t.parquet")
    pq.write_table(TABLE, path, filesystem=efs)
    clone = pickle.loads(pickle.dumps(efs))
    assert is_encrypted_filesystem(clone)
    assert clone.handler.manager is None
    assert clone.handler.written_keys() == efs.handler.written_keys()
    assert clone.equals(efs) and clone.handler == efs.handler
    assert pq.read_table(path, filesystem=clone).equals(TABLE)
    # an unpickled handler still writes, with fresh keys of the manager's length
    other = str(tmp_path / "u.parquet")
    pq.write_table(TABLE, other, filesystem=clone)
    assert clone.handler.key_metadata(other).key_length == manager.data_key_length
    assert other not in efs.handler.written_keys()
    with pytest.raises(ValueError, match="EncryptionManager"):
        clone.handler.save_key_manifest(str(tmp_path / "keys.json"))
    clone.handler.save_key_manifest(str(tmp_path / "keys.json"), manager=manager)
    assert (tmp_path / "keys.json").exists()


def test_pickle_with_a_resolver_and_plain_prefixes(tmp_path):
    fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys=resolve_nothing, plain_prefixes=[str(tmp_path)])
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.handler.plain_prefixes == (str(tmp_path),)
    assert clone.handler.find_key_metadata("/elsewhere") is None


def test_handler_type(efs):
    assert isinstance(efs.handler, EncryptedFileSystemHandler)
    assert efs.type_name == "py::icecrypt+local"
    assert isinstance(efs.handler.base, pafs.LocalFileSystem)
