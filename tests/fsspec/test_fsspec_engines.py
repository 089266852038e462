"""pandas, Polars, DuckDB and Dask reading and writing through icecrypt.fsspec: by
``filesystem=``, by file objects opened on the wrapper, by ``icecrypt://`` URLs with
``storage_options``, and DuckDB's ``register_filesystem``.  Every file they write is
checked to be AGS1 on the base filesystem and readable back with the keys alone."""

from __future__ import annotations

import dask
import dask.dataframe as dd
import duckdb
import fsspec
import pandas as pd
import polars as pl
import pytest

import icecrypt
from icecrypt import ags1
from icecrypt.fsspec import EncryptedFileSystem

N = 20_000
FRAME = pd.DataFrame(
    {
        "id": range(N),
        "amount": [i * 0.25 for i in range(N)],
        "status": (["paid", "open", "cancelled", "paid"] * (N // 4)),
    }
)


def assert_encrypted(fs: EncryptedFileSystem, path: str) -> None:
    """``path`` is stored as AGS1 with the key the wrapper recorded, and decrypts alone."""
    stored = fs.fs.cat_file(path)
    km = fs.key_metadata(path)
    assert stored[:4] == b"AGS1" and len(stored) == km.file_length, path
    ags1.decrypt(stored, km.encryption_key, km.aad_prefix, length=km.file_length)


@pytest.fixture(params=["local", "memory"])
def where(request, tmp_path, memory_root, manager):
    """``(fs, root)``: an encrypting filesystem over fsspec's local or memory one."""
    if request.param == "local":
        return EncryptedFileSystem(fsspec.filesystem("file"), manager), str(tmp_path)
    return EncryptedFileSystem("memory", manager), memory_root


# --------------------------------------------------------------------------- pandas


def test_pandas_parquet_with_filesystem(where):
    fs, root = where
    path = f"{root}/orders.parquet"
    FRAME.to_parquet(path, filesystem=fs, index=False)
    assert_encrypted(fs, path)
    reader = EncryptedFileSystem(fs.fs, keys=fs.written_keys())  # keys only
    back = pd.read_parquet(path, filesystem=reader, columns=["id", "status"], filters=[("status", "=", "paid")])
    assert len(back) == N // 2 and list(back.columns) == ["id", "status"]
    pd.testing.assert_frame_equal(pd.read_parquet(path, filesystem=reader), FRAME)


def test_pandas_csv_through_file_objects(where):
    fs, root = where
    path = f"{root}/orders.csv"
    with fs.open(path, "w", encoding="utf-8", newline="") as f:
        FRAME.to_csv(f, index=False)
    assert_encrypted(fs, path)
    with fs.open(path, "rb") as f:
        pd.testing.assert_frame_equal(pd.read_csv(f), FRAME)


def test_pandas_urls_with_storage_options(memory_root, manager):
    """URLs build their own filesystem: keys go in through ``keys``, out through ``on_written``."""
    keys: dict = {}
    written = {"fs": "memory", "manager": manager, "on_written": keys.__setitem__}
    FRAME.to_parquet(f"icecrypt://{memory_root}/o.parquet", storage_options=written, index=False)
    FRAME.to_csv(f"icecrypt://{memory_root}/o.csv", storage_options=written, index=False)
    assert sorted(keys) == [f"{memory_root}/o.csv", f"{memory_root}/o.parquet"]
    assert fsspec.filesystem("memory").cat_file(f"{memory_root}/o.csv")[:4] == b"AGS1"
    read = {"fs": "memory", "keys": keys}
    pd.testing.assert_frame_equal(pd.read_parquet(f"icecrypt://{memory_root}/o.parquet", storage_options=read), FRAME)
    pd.testing.assert_frame_equal(pd.read_csv(f"icecrypt://{memory_root}/o.csv", storage_options=read), FRAME)
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="o.csv"):
        pd.read_csv(f"icecrypt://{memory_root}/o.csv", storage_options={"fs": "memory"})


# --------------------------------------------------------------------------- Polars


def test_polars_through_file_objects(where):
    fs, root = where
    frame = pl.from_pandas(FRAME)
    with fs.open(f"{root}/o.parquet", "wb") as f:
        frame.write_parquet(f, row_group_size=5_000)
    with fs.open(f"{root}/o.csv", "wb") as f:
        frame.write_csv(f)
    for name in ("o.parquet", "o.csv"):
        assert_encrypted(fs, f"{root}/{name}")
    with fs.open(f"{root}/o.parquet", "rb") as f:
        assert pl.read_parquet(f).equals(frame)
    with fs.open(f"{root}/o.parquet", "rb") as f:
        paid = pl.scan_parquet(f).filter(pl.col("status") == "paid").select("id").collect()
    assert paid.height == N // 2
    with fs.open(f"{root}/o.csv", "rb") as f:
        assert pl.read_csv(f).equals(frame)


def test_polars_urls_through_pyarrow(memory_root, manager):
    """Polars' own readers know only their object stores; with ``use_pyarrow`` a URL goes
    through fsspec and so through this filesystem."""
    fs = EncryptedFileSystem("memory", manager)
    with fs.open(f"{memory_root}/o.parquet", "wb") as f:
        pl.from_pandas(FRAME).write_parquet(f)
    options = {"fs": "memory", "keys": fs.written_keys()}
    back = pl.read_parquet(f"icecrypt://{memory_root}/o.parquet", use_pyarrow=True, storage_options=options)
    assert back.equals(pl.from_pandas(FRAME))


# --------------------------------------------------------------------------- DuckDB


def test_duckdb_register_filesystem(where):
    fs, root = where
    FRAME.to_parquet(f"{root}/a.parquet", filesystem=fs, index=False)
    con = duckdb.connect()
    try:
        con.register_filesystem(fs)
        url = f"icecrypt://{root}"
        source = f"read_parquet('{url}/a.parquet')"
        assert con.execute(f"SELECT count(*), sum(id) FROM {source}").fetchone() == (N, N * (N - 1) // 2)
        con.execute(f"COPY (SELECT * FROM {source} WHERE status = 'open') TO '{url}/b.parquet' (FORMAT parquet)")
        con.execute(f"COPY (SELECT id, status FROM {source}) TO '{url}/c.csv' (FORMAT csv, HEADER)")
        for name in ("b.parquet", "c.csv"):
            assert_encrypted(fs, f"{root}/{name}")
        assert con.execute(f"SELECT count(*) FROM read_parquet('{url}/*.parquet')").fetchone() == (N + N // 4,)
        assert con.execute(f"SELECT count(*) FROM read_csv('{url}/c.csv')").fetchone() == (N,)
    finally:
        con.close()
    # what DuckDB wrote opens with pandas through a keys-only wrapper
    reader = EncryptedFileSystem(fs.fs, keys=fs.written_keys())
    assert len(pd.read_parquet(f"{root}/b.parquet", filesystem=reader)) == N // 4


def test_duckdb_refuses_a_file_without_a_key(tmp_path, manager):
    (tmp_path / "plain.csv").write_text("a\n1\n")
    con = duckdb.connect()
    try:
        con.register_filesystem(EncryptedFileSystem("file", manager))
        with pytest.raises(duckdb.Error, match="no key metadata"):
            con.execute(f"SELECT * FROM read_csv('icecrypt://{tmp_path}/plain.csv')").fetchall()
    finally:
        con.close()


# --------------------------------------------------------------------------- Dask


def test_dask_parquet_with_filesystem(where):
    fs, root = where
    with dask.config.set(scheduler="threads", num_workers=2):
        dd.from_pandas(FRAME, npartitions=2).to_parquet(f"{root}/dask", filesystem=fs, write_index=False)
        parts = sorted(p for p in fs.written_keys() if p.endswith(".parquet"))
        assert len(parts) == 2
        for part in parts:
            assert_encrypted(fs, part)
        reader = EncryptedFileSystem(fs.fs, keys=fs.written_keys())
        back = dd.read_parquet(f"{root}/dask", filesystem=reader)
        assert back.npartitions == 2
        pd.testing.assert_frame_equal(back.compute().reset_index(drop=True), FRAME, check_dtype=False)


def test_dask_urls_with_storage_options(memory_root, manager):
    keys: dict = {}
    with dask.config.set(scheduler="threads", num_workers=2):
        dd.from_pandas(FRAME, npartitions=2).to_parquet(
            f"icecrypt://{memory_root}/dask",
            storage_options={"fs": "memory", "manager": manager, "on_written": keys.__setitem__},
            write_index=False,
        )
        assert len([p for p in keys if p.endswith(".parquet")]) == 2
        back = dd.read_parquet(f"icecrypt://{memory_root}/dask", storage_options={"fs": "memory", "keys": keys})
        assert back.npartitions == 2
        assert back["id"].sum().compute() == N * (N - 1) // 2
        with fsspec.filesystem("icecrypt", fs="memory", keys=keys).open(f"{memory_root}/dask/part.0.parquet") as f:
            assert len(pd.read_parquet(f)) == N // 2
