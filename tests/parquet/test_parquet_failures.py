"""icecrypt.parquet fails closed: wrong keys, wrong or missing AAD prefixes, tampered,
truncated, extended, plaintext and foreign files, bad key metadata, failed writes."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_rows import file_crypto_metadata, sample_table

import icecrypt
from icecrypt import ags1
from icecrypt import parquet as ip
from icecrypt.keys import StandardKeyMetadata

TABLE = sample_table(200)
SMALL = pa.table({"id": pa.array(range(60), pa.int64()), "s": [f"v{i % 7}" for i in range(60)]})


@pytest.fixture()
def written(tmp_path):
    """An encrypted file with 4 row groups, its key metadata and its bytes."""
    path = tmp_path / "data.parquet"
    km = ip.write_table(TABLE, path, row_group_size=50)
    return path, km, path.read_bytes()


def assert_secret_free(exc: BaseException, km: StandardKeyMetadata) -> None:
    text = f"{exc} {exc!r}"
    for secret in (km.encryption_key, km.aad_prefix):
        if not secret:
            continue
        assert secret.hex() not in text
        assert secret.hex().upper() not in text
        assert repr(secret)[2:-1] not in text
        assert secret.decode("latin-1") not in text


def all_readers(path, km, **kw):
    """Every read entry point, each run to completion."""
    yield "read_table", lambda: ip.read_table(path, km, **kw)
    yield "open_file.read", lambda: ip.open_file(path, km, **kw).read()
    yield "iter_batches", lambda: list(ip.open_file(path, km, **kw).iter_batches())


# --- keys and AAD prefixes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "wrong",
    [
        lambda km: StandardKeyMetadata(os.urandom(16), km.aad_prefix, km.file_length),
        lambda km: StandardKeyMetadata(os.urandom(32), km.aad_prefix, km.file_length),
        lambda km: StandardKeyMetadata(km.encryption_key, os.urandom(16), km.file_length),
        lambda km: StandardKeyMetadata(km.encryption_key, km.aad_prefix[:-1], km.file_length),
        lambda km: StandardKeyMetadata(km.encryption_key, None, km.file_length),
        lambda km: StandardKeyMetadata(km.encryption_key, b"", km.file_length),
    ],
    ids=["other-key", "other-key-length", "other-aad", "short-aad", "no-aad", "empty-aad"],
)
def test_wrong_key_or_aad_is_authentication_error(written, wrong):
    path, km, _ = written
    bad = wrong(km)
    for name, read in all_readers(path, bad):
        with pytest.raises(icecrypt.AuthenticationError) as info:
            read()
        assert str(path) in str(info.value), name
        assert_secret_free(info.value, km)
        assert_secret_free(info.value, bad)


def test_missing_aad_prefix_message(written):
    path, km, _ = written
    with pytest.raises(icecrypt.AuthenticationError, match="encrypted with an AAD prefix and the key metadata has none"):
        ip.open_file(path, StandardKeyMetadata(km.encryption_key))


# --- damaged bytes -----------------------------------------------------------------------


def flip(data: bytes, offset: int, mask: int = 0x01) -> bytes:
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


def test_tamper_regions(tmp_path, written):
    """One flipped bit in a data page, a dictionary/header region, the footer ciphertext,
    the footer tag or the file-unique AAD is an AuthenticationError for whole-file reads."""
    _, km, data = written
    meta = file_crypto_metadata(data)
    start, end = meta["span"]
    unique_at = data.index(meta["aad_file_unique"], start)
    regions = {
        "first-page": 10,
        "middle": len(data) // 2,
        "footer-ciphertext": end + 40,
        "footer-tag": len(data) - 9,
        "aad-file-unique": unique_at + 3,
    }
    for region, offset in regions.items():
        bad = tmp_path / f"{region}.parquet"
        bad.write_bytes(flip(data, offset))
        for name, read in all_readers(bad, km):
            with pytest.raises(icecrypt.AuthenticationError) as info:
                read()
            assert str(bad) in str(info.value), (region, name)


def test_tampered_row_group_fails_only_when_read(tmp_path, written):
    """Row-group reads authenticate what they read: the damaged row group raises, the
    intact ones still read (Parquet modules are authenticated independently)."""
    path, km, data = written
    with ip.open_file(path, km) as f:
        column = f.metadata.row_group(2).column(1)
        start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
        offset = start + column.total_compressed_size - 20  # inside the last page's ciphertext
    bad = tmp_path / "rg2.parquet"
    bad.write_bytes(flip(data, offset))
    with ip.open_file(bad, km) as f:
        assert f.read_row_group(0).equals(TABLE.slice(0, 50))
        with pytest.raises(icecrypt.AuthenticationError, match="GCM tag check failed"):
            f.read_row_group(2)
        with pytest.raises(icecrypt.AuthenticationError):
            list(f.iter_batches(row_groups=[3, 2]))
        assert f.read_row_group(3, columns=["id"]).column(0).to_pylist() == list(range(150, 200))


def test_flipped_bytes_fail_or_change_nothing(tmp_path):
    """Flip bytes of a small file — every byte of the plaintext structure (magic, crypto
    metadata, footer length) and every 5th byte elsewhere: each read raises a
    DecryptionError, or returns exactly the original rows, which only happens for bytes
    no reader authenticates (the leading magic, parts of the FileCryptoMetaData)."""
    path = tmp_path / "small.parquet"
    km = ip.write_table(SMALL, path, row_group_size=30, compression="none", store_schema=False)
    data = path.read_bytes()
    start, end = file_crypto_metadata(data)["span"]
    structure = set(range(4)) | set(range(start, end)) | set(range(len(data) - 8, len(data)))
    offsets = sorted(structure | set(range(0, len(data), 5)))
    bad = tmp_path / "bad.parquet"
    harmless = []
    for offset in offsets:
        bad.write_bytes(flip(data, offset, 0x40))
        try:
            back = ip.read_table(bad, km.with_file_length(None), use_threads=False)
        except icecrypt.DecryptionError:
            continue
        assert back.equals(SMALL), offset
        harmless.append(offset)
    assert all(o < 4 or start <= o < end for o in harmless), (harmless, start, end)


@pytest.mark.parametrize("trusted_length", [True, False])
def test_truncated(tmp_path, written, trusted_length):
    _, km, data = written
    if not trusted_length:
        km = km.with_file_length(None)
    bad = tmp_path / "short.parquet"
    for cut in (0, 1, 4, 100, len(data) // 2, len(data) - 9, len(data) - 8, len(data) - 4, len(data) - 1):
        bad.write_bytes(data[:cut])
        for name, read in all_readers(bad, km):
            with pytest.raises(icecrypt.DecryptionError) as info:
                read()
            assert str(bad) in str(info.value), (cut, name)
            if trusted_length:
                assert isinstance(info.value, icecrypt.FormatError)
                assert "truncated" in str(info.value)


def test_extended(tmp_path, written):
    _, km, data = written
    bad = tmp_path / "long.parquet"
    bad.write_bytes(data + b"PARE")
    with pytest.raises(icecrypt.FormatError, match="longer than written"):
        ip.read_table(bad, km)
    with pytest.raises(icecrypt.FormatError, match="not an intact encrypted Parquet file"):
        ip.read_table(bad, km.with_file_length(None))


def test_plaintext_parquet_is_refused(tmp_path, written):
    """A PAR1 file read with a key must never be returned as if it were encrypted."""
    _, km, _ = written
    plain = tmp_path / "plain.parquet"
    pq.write_table(TABLE, plain)
    assert plain.read_bytes()[:4] == b"PAR1"
    for name, read in all_readers(plain, km.with_file_length(None)):
        with pytest.raises(icecrypt.FormatError, match="plaintext Parquet file") as info:
            read()
        assert str(plain) in str(info.value), name


def test_foreign_files_are_format_errors(tmp_path, written):
    _, km, _ = written
    km = km.with_file_length(None)
    cases = {
        "empty": b"",
        "random": os.urandom(5000),
        "ags1": ags1.encrypt(b"PAR1 not really", km.encryption_key, km.aad_prefix),
        "magic-only": b"PARE",
        "tiny": b"PAREPARE",
    }
    for case, content in cases.items():
        bad = tmp_path / f"{case}.parquet"
        bad.write_bytes(content)
        with pytest.raises(icecrypt.FormatError) as info:
            ip.read_table(bad, km)
        assert str(bad) in str(info.value), case


def test_unrelated_errors_are_not_translated(tmp_path, written):
    _, km, _ = written
    with pytest.raises(FileNotFoundError):
        ip.read_table(tmp_path / "missing.parquet", km)
    with pytest.raises(FileNotFoundError):
        ip.open_file(tmp_path / "missing.parquet", km)
    (tmp_path / "dir.parquet").mkdir()
    with pytest.raises(OSError) as info:
        ip.read_table(tmp_path / "dir.parquet", km)
    assert not isinstance(info.value, icecrypt.DecryptionError)
    # the mapping itself: only pyarrow's messages about the bytes are translated
    assert ip._translate(OSError("AWS Error NETWORK_CONNECTION during GetObject"), "f") is None
    assert ip._translate(PermissionError("Failed decryption finalization"), "f") is None
    assert isinstance(ip._translate(OSError("Failed decryption finalization"), "f"), icecrypt.AuthenticationError)


# --- key metadata ------------------------------------------------------------------------


def test_bad_key_metadata(written):
    path, km, _ = written
    with pytest.raises(ValueError, match="key metadata is required"):
        ip.read_table(path, None)
    with pytest.raises(TypeError, match="not str"):
        ip.read_table(path, km.encode().hex())
    with pytest.raises(icecrypt.FormatError, match="malformed key metadata") as info:
        ip.open_file(path, km.encode()[:10])
    assert str(path) in str(info.value)
    with pytest.raises(icecrypt.FormatError, match="malformed key metadata"):
        ip.read_table(path, b"\x02" + km.encode()[1:])
    short = StandardKeyMetadata(km.encryption_key[:15], km.aad_prefix)
    with pytest.raises(ValueError, match="invalid encryption key length in key metadata: 15") as info:
        ip.read_table(path, short)
    assert_secret_free(info.value, km)
    with pytest.raises(ValueError, match="must be 16, 24, or 32"):
        ip.write_table(TABLE, path.with_name("x.parquet"), key_metadata=short)
    with pytest.raises(TypeError, match="decryption_properties"):
        ip.read_table(path, km, decryption_properties=ip.decryption_properties(km))


# --- failed writes leave nothing ---------------------------------------------------------


def test_exception_inside_writer_leaves_nothing(tmp_path):
    path = tmp_path / "t.parquet"
    with pytest.raises(RuntimeError, match="boom"), ip.open_writer(path, TABLE.schema) as w:
        w.write_table(TABLE)
        listing = os.listdir(tmp_path)
        assert len(listing) == 1 and listing[0].startswith(".t.parquet.") and listing[0].endswith(".tmp")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    assert w.closed
    with pytest.raises(ValueError, match="aborted"):
        w.write_table(TABLE)
    with pytest.raises(ValueError, match="aborted"):
        w.close()


def test_failed_write_call_aborts(tmp_path):
    path = tmp_path / "t.parquet"
    w = ip.open_writer(path, TABLE.schema)
    w.write_table(TABLE)
    with pytest.raises(ValueError, match="schema does not match"):
        w.write_table(SMALL)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="aborted"):
        w.close()


def test_failed_write_keeps_existing_file(tmp_path):
    path = tmp_path / "t.parquet"
    km = ip.write_table(SMALL, path)
    before = path.read_bytes()
    with pytest.raises(pa.ArrowException, match="compression"):
        ip.write_table(TABLE, path, compression="no-such-codec")
    w = ip.open_writer(path, TABLE.schema)
    w.write_table(TABLE)
    with pytest.raises(ValueError, match="schema does not match"):
        w.write_table(SMALL)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["t.parquet"]
    assert ip.read_table(path, km).equals(SMALL)
    km2 = ip.write_table(TABLE, path)  # a successful write replaces it
    assert ip.read_table(path, km2).equals(TABLE)
    assert sorted(os.listdir(tmp_path)) == ["t.parquet"]


def test_dropped_writer_leaves_nothing(tmp_path):
    w = ip.open_writer(tmp_path / "t.parquet", TABLE.schema)
    w.write_table(TABLE)
    with pytest.warns(ResourceWarning, match="unclosed encrypted Parquet writer"):
        del w  # the last reference: CPython finalizes it here
    assert os.listdir(tmp_path) == []


def test_write_into_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        ip.write_table(TABLE, tmp_path / "no" / "such" / "t.parquet")
    assert os.listdir(tmp_path) == []


def test_writer_repr_and_errors_hold_no_key(tmp_path):
    km = StandardKeyMetadata(os.urandom(16), os.urandom(16))
    with ip.open_writer(tmp_path / "t.parquet", TABLE.schema, key_metadata=km) as w:
        assert km.encryption_key.hex() not in repr(w) and "open" in repr(w)
        w.write_table(TABLE)
    assert "closed" in repr(w) and "key_length=16" in repr(w.key_metadata)
