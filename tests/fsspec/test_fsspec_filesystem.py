"""icecrypt.fsspec.EncryptedFileSystem over fsspec's real local and memory filesystems:
round trips, plaintext sizes, random access, fail-closed reads, atomic writes, file
operations and their keys, interoperability with icecrypt.ags1 and icecrypt.arrow,
key manifests, the fsspec protocol, caching, pickling and key hygiene."""

from __future__ import annotations

import base64
import gc
import io
import logging
import os
import pickle
import warnings

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fsspechelpers import CountingMemoryFileSystem

import icecrypt
from icecrypt import ags1
from icecrypt.arrow import EncryptedFileSystem as ArrowEncryptedFileSystem
from icecrypt.fsspec import EncryptedFile, EncryptedFileSystem, read_key_manifest
from icecrypt.keys import StandardKeyMetadata
from icecrypt.kms.memory import ICEBERG_TEST_MASTER_KEYS

BLOCK = ags1.PLAIN_BLOCK_SIZE
CIPHER_BLOCK = ags1.CIPHER_BLOCK_SIZE
HEADER = ags1.HEADER_LENGTH
DATA = os.urandom(5 * BLOCK + 12_345)  # six AGS1 blocks, the last one short


def write(fs, path, data=DATA) -> StandardKeyMetadata:
    with fs.open(path, "wb") as f:
        f.write(data)
    return fs.key_metadata(path)


def encodings(secret: bytes) -> list[bytes]:
    """``secret`` raw, in hex (both cases) and in base64 (standard and URL-safe, unpadded)."""
    out = [secret, secret.hex().encode(), secret.hex().upper().encode()]
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        out.append(encode(secret).rstrip(b"="))
    return out


def key_material(*kms: StandardKeyMetadata) -> list[bytes]:
    """Every secret of these key metadata, in every encoding (none may ever leak)."""
    secrets = [secret for km in kms for secret in (km.encryption_key, km.aad_prefix, km.encode())]
    return [form for secret in secrets for form in encodings(secret)]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("size", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7])
def test_round_trip_and_plaintext_sizes_local(tmp_path, local_fs, size):
    path = str(tmp_path / "f.bin")
    data = DATA[:size]
    km = write(local_fs, path, data)
    stored = (tmp_path / "f.bin").read_bytes()
    assert stored[:4] == b"AGS1" and len(stored) == ags1.ciphertext_length(size) == km.file_length
    assert ags1.decrypt(stored, km.encryption_key, km.aad_prefix, length=km.file_length) == data
    assert local_fs.cat_file(path) == data
    assert local_fs.info(path)["size"] == local_fs.size(path) == size
    assert [e["size"] for e in local_fs.ls(str(tmp_path))] == [size]
    assert local_fs.ls(str(tmp_path), detail=False) == [path]
    assert local_fs.du(str(tmp_path)) == size


def test_round_trip_memory_and_urls(memory_root, memory_fs):
    path = f"{memory_root}/d/f.bin"
    memory_fs.makedirs(f"{memory_root}/d", exist_ok=True)
    km = write(memory_fs, f"icecrypt://{path}")  # the protocol prefix is optional
    assert memory_fs.key_metadata(path) == km
    assert list(memory_fs.written_keys()) == [path]
    base = fsspec.filesystem("memory")
    assert base.cat_file(path)[:4] == b"AGS1" and base.size(path) == km.file_length
    assert memory_fs.cat_file(path) == DATA
    assert memory_fs.info(path)["size"] == len(DATA)
    assert memory_fs.find(memory_root) == [path]
    assert memory_fs.isfile(path) and memory_fs.isdir(f"{memory_root}/d")
    # text mode goes through the same stream
    with memory_fs.open(f"{memory_root}/t.txt", "w", encoding="utf-8") as f:
        f.write("héllo\n" * 1000)
    with memory_fs.open(f"{memory_root}/t.txt", "r", encoding="utf-8") as f:
        assert f.read() == "héllo\n" * 1000
    memory_fs.pipe_file(f"{memory_root}/p.bin", b"piped")
    assert memory_fs.cat(f"{memory_root}/p.bin") == b"piped"


@pytest.mark.parametrize(
    ("start", "end"),
    [(None, None), (0, 10), (BLOCK - 3, BLOCK + 3), (-100, None), (None, -5), (-10, -2), (7, 7), (9, 3), (0, 10**12)],
)
def test_cat_file_ranges(memory_root, memory_fs, start, end):
    path = f"{memory_root}/f.bin"
    write(memory_fs, path)
    assert memory_fs.cat_file(path, start=start, end=end) == DATA[start:end]


def test_seekable_reads(memory_root, memory_fs):
    path = f"{memory_root}/f.bin"
    write(memory_fs, path)
    with memory_fs.open(path, "rb") as f:
        assert isinstance(f, EncryptedFile) and f.seekable() and f.size == len(DATA)
        assert f.seek(-20, io.SEEK_END) == len(DATA) - 20
        assert f.read() == DATA[-20:]
        assert f.read(5) == b""
        f.seek(BLOCK - 2)
        buf = bytearray(4)
        assert f.readinto(buf) == 4 and bytes(buf) == DATA[BLOCK - 2 : BLOCK + 2]
        assert f.tell() == BLOCK + 2
        f.seek(3, io.SEEK_CUR)
        assert f.read(2) == DATA[BLOCK + 5 : BLOCK + 7]
        assert f.read_at(10, 5) == DATA[10:15]
        f.seek(BLOCK - 1)
        assert f.read_buffer(3).to_pybytes() == DATA[BLOCK - 1 : BLOCK + 2]  # what pyarrow reads with
        assert f.read_buffer().size == len(DATA) - BLOCK - 2
    with pytest.raises(ValueError):
        f.read(1)


# --------------------------------------------------------------------------- random access


def test_random_access_decrypts_only_covering_blocks(counting, manager):
    fs = EncryptedFileSystem(counting, manager)
    counting.mkdir("/data")
    write(fs, "/data/f.bin")
    counting.reset()

    def fetched(i: int) -> tuple[int, int]:
        return (HEADER + i * CIPHER_BLOCK, HEADER + (i + 1) * CIPHER_BLOCK)

    with fs.open("/data/f.bin", "rb") as f:
        assert counting.ranges == [(0, HEADER)]  # the header is checked at open
        assert counting.opens == 0  # no buffered base file: each fetch is one ranged read
        counting.reset()
        f.seek(3 * BLOCK + 100)
        assert f.read(50) == DATA[3 * BLOCK + 100 : 3 * BLOCK + 150]
        assert counting.ranges == [fetched(0), fetched(3)]  # block 0 authenticates first
        counting.reset()
        f.seek(3 * BLOCK + 500)
        assert f.read(10) == DATA[3 * BLOCK + 500 : 3 * BLOCK + 510]
        assert counting.ranges == []  # the cached block
        assert f.read_at(BLOCK - 5, 10) == DATA[BLOCK - 5 : BLOCK + 5]
        assert counting.ranges == [fetched(0), fetched(1)]
        counting.reset()
        f.seek(-10, io.SEEK_END)
        assert f.read() == DATA[-10:]
        assert counting.ranges == [(HEADER + 5 * CIPHER_BLOCK, counting.size("/data/f.bin"))]
    counting.reset()
    # a Parquet footer read through pyarrow touches the last block(s) and block 0 only
    table = pa.table({"x": pa.array(range(1_500_000), pa.int64())})
    with fs.open("/data/t.parquet", "wb") as f:
        pq.write_table(table, f, compression=None)
    size = counting.size("/data/t.parquet")
    counting.reset()
    with fs.open("/data/t.parquet", "rb") as f:
        assert pq.ParquetFile(f).metadata.num_rows == 1_500_000
    assert counting.bytes_read <= 3 * CIPHER_BLOCK < size


# --------------------------------------------------------------------------- fail closed


def test_file_without_key_is_refused(tmp_path, memory_root, local_fs, manager):
    (tmp_path / "plain.csv").write_bytes(b"a,b\n1,2\n")
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="plain.csv: no key metadata"):
        local_fs.open(str(tmp_path / "plain.csv"), "rb")
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="plain.csv"):
        local_fs.cat_file(str(tmp_path / "plain.csv"))
    with pytest.raises(FileNotFoundError, match="missing"):
        local_fs.open(str(tmp_path / "missing"), "rb")
    reader = EncryptedFileSystem("memory")  # keys-only, and here none: nothing opens
    fsspec.filesystem("memory").pipe_file(f"{memory_root}/x", b"AGS1\x00\x00\x10\x00")
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="x: no key"):
        reader.open(f"{memory_root}/x", "rb")


def test_keys_only_reader_cannot_write(memory_root, memory_fs):
    km = write(memory_fs, f"{memory_root}/f.bin")
    reader = EncryptedFileSystem("memory", keys={f"memory://{memory_root}/f.bin": km.encode()})
    assert reader.cat_file(f"{memory_root}/f.bin") == DATA  # paths are normalized by the base
    with pytest.raises(ValueError, match="no EncryptionManager"):
        reader.open(f"{memory_root}/g.bin", "wb")
    resolver = EncryptedFileSystem("memory", keys=lambda p: km if p.endswith("/f.bin") else None)
    assert resolver.cat_file(f"{memory_root}/f.bin", 0, 5) == DATA[:5]


def _flip(base, path: str, offset: int) -> None:
    data = bytearray(base.cat_file(path))
    data[offset] ^= 0x01
    base.pipe_file(path, bytes(data))


def test_damaged_files_return_nothing(memory_root, memory_fs):
    base = fsspec.filesystem("memory")
    path = f"{memory_root}/f.bin"
    write(memory_fs, path)
    _flip(base, path, HEADER + 2 * CIPHER_BLOCK + 100)  # inside block 2
    with memory_fs.open(path, "rb") as f:
        assert f.read(100) == DATA[:100]  # blocks 0 and 1 are intact
        f.seek(2 * BLOCK)
        with pytest.raises(icecrypt.AuthenticationError, match=f"{path}.*block 2"):
            f.read(10)
        buf = bytearray(b"\xff" * (3 * BLOCK))
        f.seek(0)
        with pytest.raises(icecrypt.AuthenticationError, match=path):
            f.readinto(buf)
        assert buf == bytes(len(buf))  # nothing of a failed read is released
    with pytest.raises(icecrypt.AuthenticationError, match=path):
        memory_fs.cat_file(path)

    write(memory_fs, path)
    stored = base.cat_file(path)
    base.pipe_file(path, stored[:-1])  # truncated: the trusted file_length disagrees
    with pytest.raises(icecrypt.FormatError, match=f"{path}.*truncated"):
        memory_fs.open(path, "rb")
    base.pipe_file(path, stored + b"\0")
    with pytest.raises(icecrypt.FormatError, match=path):
        memory_fs.open(path, "rb")
    base.pipe_file(path, stored[:HEADER + CIPHER_BLOCK + 10])  # no trusted length: a torn last block
    reader = EncryptedFileSystem("memory", keys={path: memory_fs.key_metadata(path).with_file_length(None)})
    with pytest.raises(icecrypt.DecryptionError, match=path):
        reader.cat_file(path)
    other = write(memory_fs, f"{memory_root}/other.bin")
    base.pipe_file(path, stored)
    wrong = EncryptedFileSystem("memory", keys={path: other.with_file_length(len(stored))})
    with pytest.raises(icecrypt.AuthenticationError, match=path):
        wrong.cat_file(path, 0, 1)


def test_damaged_local_file(tmp_path, local_fs):
    path = tmp_path / "f.bin"
    write(local_fs, str(path))
    with open(path, "r+b") as f:
        f.seek(HEADER + 5)
        f.write(b"\x00\x00")
    with pytest.raises(icecrypt.AuthenticationError, match="f.bin"):
        local_fs.cat_file(str(path), 2 * BLOCK, 2 * BLOCK + 1)  # block 0 is checked first


def test_plain_prefixes(tmp_path, manager):
    fs = EncryptedFileSystem("file", manager, plain_prefixes=[str(tmp_path / "plain")])
    fs.makedirs(str(tmp_path / "plain"))
    with fs.open(str(tmp_path / "plain" / "x.json"), "wb") as f:
        f.write(b"{}")
    assert (tmp_path / "plain" / "x.json").read_bytes() == b"{}"
    assert fs.cat_file(str(tmp_path / "plain" / "x.json")) == b"{}"
    assert fs.info(str(tmp_path / "plain" / "x.json"))["size"] == 2
    assert fs.written_keys() == {}
    write(fs, str(tmp_path / "enc.bin"), b"secret")
    with pytest.raises(ValueError, match="plain_prefixes"):
        fs.cp_file(str(tmp_path / "enc.bin"), str(tmp_path / "plain" / "enc.bin"))


def test_unsupported_modes(memory_root, memory_fs):
    path = f"{memory_root}/f.bin"
    write(memory_fs, path, b"first")
    with pytest.raises(io.UnsupportedOperation, match="append"):
        memory_fs.open(path, "ab")
    with pytest.raises(io.UnsupportedOperation, match="r\\+b"):
        memory_fs.open(path, "r+b")
    with pytest.raises(FileExistsError):
        memory_fs.open(path, "xb")
    with pytest.raises(io.UnsupportedOperation, match="transactions"), memory_fs.transaction:
        memory_fs.open(f"{memory_root}/g.bin", "wb")
    assert memory_fs.cat_file(path) == b"first"


# --------------------------------------------------------------------------- atomic writes


def test_exception_in_with_block_keeps_the_old_file_local(tmp_path, local_fs):
    path = str(tmp_path / "f.bin")
    old = write(local_fs, path, b"version 1")
    with pytest.raises(RuntimeError), local_fs.open(path, "wb") as f:
        f.write(os.urandom(2 * BLOCK + 5))
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == ["f.bin"]  # no temporary file left
    assert local_fs.key_metadata(path) == old
    assert local_fs.cat_file(path) == b"version 1"


def test_failed_write_leaves_nothing_on_a_non_renaming_store(memory_root, memory_fs):
    path = f"{memory_root}/f.bin"
    base = fsspec.filesystem("memory")
    with pytest.raises(RuntimeError), memory_fs.open(path, "wb") as f:
        f.write(os.urandom(2 * BLOCK + 5))
        assert base.exists(path)  # written in place, as on an object store
        raise RuntimeError("boom")
    assert not base.exists(path) and memory_fs.written_keys() == {}
    f = memory_fs.open(path, "wb")
    f.write(b"x" * 10)
    with pytest.warns(ResourceWarning, match="f.bin"):
        del f
        gc.collect()
    assert not base.exists(path) and memory_fs.written_keys() == {}


def test_dropped_file_leaves_nothing_local(tmp_path, local_fs):
    path = str(tmp_path / "f.bin")
    f = local_fs.open(path, "wb")
    f.write(os.urandom(BLOCK + 1))
    with pytest.warns(ResourceWarning, match="f.bin"):
        del f
        gc.collect()
    assert os.listdir(tmp_path) == [] and local_fs.written_keys() == {}


def test_failed_publish_leaves_nothing(tmp_path, local_fs):
    target = tmp_path / "target"
    f = local_fs.open(str(target), "wb")
    f.write(b"data")
    target.mkdir()  # the final rename cannot replace a directory
    with pytest.raises(OSError):
        f.close()
    assert os.listdir(tmp_path) == ["target"] and list(target.iterdir()) == []
    assert local_fs.written_keys() == {}


def test_dir_view_of_the_local_filesystem(tmp_path, manager, kms):
    """A ``dir`` filesystem over the local one: relative paths as keys, local renames and reads."""
    fs = EncryptedFileSystem(fsspec.filesystem("dir", path=str(tmp_path)), manager)
    fs.makedirs("sub", exist_ok=True)
    write(fs, "sub/f.bin")
    assert list(fs.written_keys()) == ["sub/f.bin"]
    assert (tmp_path / "sub" / "f.bin").read_bytes()[:4] == b"AGS1"
    assert fs.cat_file("sub/f.bin", BLOCK, BLOCK + 4) == DATA[BLOCK : BLOCK + 4]
    assert fs.cat_file("/sub/f.bin", 0, 4) == DATA[:4]  # one file, one key, with or without the slash
    with pytest.raises(RuntimeError), fs.open("sub/f.bin", "wb") as f:
        f.write(b"new")
        assert len(os.listdir(tmp_path / "sub")) == 2  # a hidden temporary file beside it
        raise RuntimeError("boom")
    assert os.listdir(tmp_path / "sub") == ["f.bin"] and fs.cat_file("sub/f.bin") == DATA
    fs.save_key_manifest("keys.json")
    assert read_key_manifest(str(tmp_path / "keys.json"), kms) == fs.written_keys()


# --------------------------------------------------------------------------- file operations


def test_copy_move_delete_carry_keys(tmp_path, local_fs):
    a = tmp_path / "a"
    local_fs.makedirs(str(a))
    one, two = str(a / "1.bin"), str(a / "2.bin")
    write(local_fs, one)
    write(local_fs, two, b"two")
    copy = str(tmp_path / "copy.bin")
    local_fs.copy(one, copy)
    assert local_fs.key_metadata(copy) == local_fs.key_metadata(one)  # as icecrypt.arrow: same key
    assert local_fs.cat_file(copy) == DATA
    moved = str(tmp_path / "moved.bin")
    local_fs.mv(copy, moved)
    assert local_fs.cat_file(moved) == DATA
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError):
        local_fs.key_metadata(copy)
    local_fs.mv(str(a), str(tmp_path / "b"), recursive=True)  # a directory: every key follows
    assert local_fs.cat_file(str(tmp_path / "b" / "2.bin")) == b"two"
    assert not any(k.startswith(str(a) + "/") for k in local_fs.written_keys())
    local_fs.rm(moved)
    assert moved not in local_fs.written_keys() and not os.path.exists(moved)
    local_fs.rm(str(tmp_path / "b"), recursive=True)
    assert local_fs.written_keys() == {} and os.listdir(tmp_path) == []


def test_memory_copy_move_delete(memory_root, memory_fs):
    path = f"{memory_root}/f.bin"
    write(memory_fs, path, b"hello")
    memory_fs.cp_file(path, f"{memory_root}/g.bin")
    memory_fs.mv(f"{memory_root}/g.bin", f"{memory_root}/h.bin")
    assert memory_fs.cat_file(f"{memory_root}/h.bin") == b"hello"
    memory_fs.rm_file(path)
    assert sorted(memory_fs.written_keys()) == [f"{memory_root}/h.bin"]


def test_put_and_get_encrypt_and_decrypt(tmp_path, memory_root, memory_fs):
    (tmp_path / "plain.bin").write_bytes(DATA)
    memory_fs.put_file(str(tmp_path / "plain.bin"), f"{memory_root}/up.bin")
    assert fsspec.filesystem("memory").cat_file(f"{memory_root}/up.bin")[:4] == b"AGS1"
    memory_fs.get_file(f"{memory_root}/up.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == DATA


def test_on_written_sees_each_published_file(memory_root, manager):
    seen: list = []
    fs = EncryptedFileSystem("memory", manager, on_written=lambda path, km: seen.append((path, km)))
    write(fs, f"memory://{memory_root}/a.bin", b"a")
    with pytest.raises(RuntimeError), fs.open(f"{memory_root}/b.bin", "wb") as f:
        f.write(b"b")
        raise RuntimeError("discarded: not published, not reported")
    assert seen == [(f"{memory_root}/a.bin", fs.key_metadata(f"{memory_root}/a.bin"))]
    assert pickle.loads(pickle.dumps(fs))._registry.on_written is None  # the callback stays here


# --------------------------------------------------------------------------- interoperability


def test_fsspec_written_files_open_in_ags1_and_arrow(tmp_path, local_fs):
    path = str(tmp_path / "t.parquet")
    table = pa.table({"i": list(range(200_000)), "s": [f"r{i}" for i in range(200_000)]})
    with local_fs.open(path, "wb") as f:
        pq.write_table(table, f)
    km = local_fs.key_metadata(path)
    plain = ags1.decrypt((tmp_path / "t.parquet").read_bytes(), km.encryption_key, km.aad_prefix, length=km.file_length)
    assert pq.read_table(pa.BufferReader(plain)).equals(table)
    arrow_fs = ArrowEncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys=local_fs.written_keys())
    assert pq.read_table(path, filesystem=arrow_fs).equals(table)
    assert arrow_fs.get_file_info(path).size == local_fs.size(path) == len(plain)


def test_arrow_written_files_open_here(tmp_path, manager):
    arrow_fs = ArrowEncryptedFileSystem.wrap(pafs.LocalFileSystem(), manager)
    path = str(tmp_path / "t.parquet")
    table = pa.table({"x": [1.5, 2.5, None]})
    pq.write_table(table, path, filesystem=arrow_fs)
    reader = EncryptedFileSystem("file", keys=arrow_fs.handler.written_keys())
    with reader.open(path, "rb") as f:
        assert pq.read_table(f).equals(table)
    assert pq.read_table(path, filesystem=reader).equals(table)  # pyarrow wraps it in FSSpecHandler


def test_key_manifest_round_trip(tmp_path, memory_root, memory_fs, kms, manager):
    write(memory_fs, f"{memory_root}/a.bin", b"aaa")
    write(memory_fs, f"{memory_root}/b.bin", b"bbb")
    memory_fs.save_key_manifest(f"{memory_root}/_keys.json")  # on the base: JSON, every key wrapped
    raw = fsspec.filesystem("memory").cat_file(f"{memory_root}/_keys.json")
    assert b"icecrypt-key-manifest" in raw
    for secret in key_material(*memory_fs.written_keys().values()):
        assert secret not in raw
    keys = read_key_manifest(f"{memory_root}/_keys.json", kms, filesystem=fsspec.filesystem("memory"))
    assert keys == memory_fs.written_keys()
    reader = EncryptedFileSystem("memory", keys=keys)
    assert reader.cat_file(f"{memory_root}/b.bin") == b"bbb"
    local_manifest = str(tmp_path / "keys.json")
    memory_fs.save_key_manifest(local_manifest, filesystem=fsspec.filesystem("file"))
    assert read_key_manifest(local_manifest, kms) == keys
    with pytest.raises(ValueError, match="through an EncryptedFileSystem"):
        memory_fs.save_key_manifest(f"{memory_root}/k.json", filesystem=memory_fs)
    with pytest.raises(ValueError, match="EncryptionManager"):
        reader.save_key_manifest(f"{memory_root}/k.json")


# --------------------------------------------------------------------------- fsspec protocol, caching, pickling


def test_protocol_urls_and_chaining(memory_root, memory_fs):
    path = f"{memory_root}/f.bin"
    km = write(memory_fs, path, b"chained")
    fs, url_path = fsspec.core.url_to_fs(f"icecrypt://{path}", fs="memory", keys={path: km})
    assert isinstance(fs, EncryptedFileSystem) and url_path == path
    with fsspec.open(f"icecrypt::memory://{path}", "rb", icecrypt={"keys": {path: km}}) as f:
        assert f.read() == b"chained"
    with fsspec.open(f"icecrypt://{path}", "rb", target_protocol="memory", keys={path: km}) as f:
        assert f.read() == b"chained"
    assert fsspec.get_filesystem_class("icecrypt") is EncryptedFileSystem


def test_instances_are_never_shared(memory_root, memory_fs):
    path = f"{memory_root}/f.bin"
    km = write(memory_fs, path)
    one = fsspec.filesystem("icecrypt", fs="memory", keys={path: km})
    two = fsspec.filesystem("icecrypt", fs="memory", keys={path: km})
    empty = fsspec.filesystem("icecrypt", fs="memory")
    assert one is not two and one != two and one._fs_token != two._fs_token
    assert one.cat_file(path, 0, 3) == DATA[:3]
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError):
        empty.cat_file(path)  # no key leaked from another instance
    assert one.storage_args == () and one.storage_options == {}
    from dask.base import tokenize

    assert tokenize(one) == tokenize(one) != tokenize(two)


def test_wrapping_twice_and_bad_bases(memory_fs):
    with pytest.raises(ValueError, match="encrypted twice"):
        EncryptedFileSystem(memory_fs)
    with pytest.raises(TypeError, match="fsspec filesystem"):
        EncryptedFileSystem(pafs.LocalFileSystem())


def test_pickle_carries_keys_not_the_manager(memory_root, memory_fs, manager):
    path = f"{memory_root}/f.bin"
    km = write(memory_fs, path)
    dumped = pickle.dumps(memory_fs)
    assert km.encryption_key in dumped  # documented: a pickle carries the data keys it knows
    for master in ICEBERG_TEST_MASTER_KEYS.values():  # ... never the manager's KMS keys
        assert not any(form in dumped for form in encodings(master))
    clone = pickle.loads(dumped)
    assert isinstance(clone, EncryptedFileSystem) and clone.manager is None
    assert clone.written_keys() == memory_fs.written_keys()
    assert clone.cat_file(path) == DATA
    km = write(clone, f"{memory_root}/g.bin", b"g")  # fresh keys of the manager's length
    assert km.key_length == manager.data_key_length and f"{memory_root}/g.bin" not in memory_fs.written_keys()
    with pytest.raises(ValueError, match="EncryptionManager"):
        clone.save_key_manifest(f"{memory_root}/k.json")
    clone.save_key_manifest(f"{memory_root}/k.json", manager=manager)
    # open files never pickle (they hold their key)
    with memory_fs.open(path, "rb") as f, pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(f)
    with memory_fs.open(f"{memory_root}/h.bin", "wb") as f, pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(f)
    # a filesystem that has written nothing pickles without any key material
    fresh = EncryptedFileSystem("memory", manager)
    dumped = pickle.dumps(fresh)
    assert b"keyA" not in dumped and pickle.loads(dumped).written_keys() == {}


def test_no_key_material_in_reprs_tokens_errors_or_logs(memory_root, memory_fs, caplog, tmp_path):
    path = f"{memory_root}/f.bin"
    with caplog.at_level(logging.DEBUG):
        km = write(memory_fs, path)
        reader = EncryptedFileSystem("memory", keys={path: km.encode()})
        with reader.open(path, "rb") as f:
            f.read(10)
            file_repr = repr(f)
        fsspec.filesystem("memory").pipe_file(f"{memory_root}/g.bin", b"\0" * 100)
        reader.add_keys({f"{memory_root}/g.bin": km.with_file_length(100)})
        with pytest.raises(icecrypt.DecryptionError) as failure:
            reader.cat_file(f"{memory_root}/g.bin")
    texts = [
        repr(memory_fs), repr(reader), str(reader), file_repr, str(failure.value), caplog.text,
        str(reader.storage_options), str(reader.storage_args), reader._fs_token,
    ]
    with pytest.raises(TypeError, match="holds data keys"):
        reader.to_json()
    blob = "\n".join(texts).encode()
    for secret in key_material(km):
        assert secret not in blob
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left unclosed above
        gc.collect()


def test_counting_filesystem_is_a_real_fsspec_filesystem(counting):
    """The helper under the random-access test behaves as fsspec's memory filesystem."""
    assert isinstance(counting, CountingMemoryFileSystem)
    counting.pipe_file("/x/y", b"abc")
    assert counting.cat_file("/x/y", 1, 2) == b"b" and counting.ranges[-1] == (1, 2)
