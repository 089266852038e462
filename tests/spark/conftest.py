"""Fixtures of the icecrypt.spark tests: a local keystore KMS, encrypted Avro and Parquet
files with plaintext twins, and the shared Spark session with the data sources registered.

The data is small (a few MiB) and built once per session; tests that need Spark share
the ``spark`` fixture of tests/spark_fixtures.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparkhelpers import MASTER, plaintext_twin, sample_table

from icecrypt import avro, parquet
from icecrypt.keys import StandardKeyMetadata
from icecrypt.kms.local import LocalKms


@dataclasses.dataclass
class Dataset:
    """Encrypted files under ``enc``, their plaintext twins under ``plain`` (same
    relative paths), the key metadata of each encrypted file and the rows written."""

    enc: Path
    plain: Path
    keys: dict[str, StandardKeyMetadata]
    table: pa.Table

    def twin(self, path: str | Path) -> Path:
        return self.plain / Path(path).relative_to(self.enc)


@pytest.fixture(scope="session")
def keystore(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kms") / "keystore.json"
    LocalKms.create_keystore(path, [MASTER, "other"])
    return path


@pytest.fixture(scope="session")
def kms(keystore) -> LocalKms:
    return LocalKms(keystore)


@pytest.fixture(scope="session")
def kms_options(keystore) -> dict[str, str]:
    """KMS properties as Spark options (a local keystore file every worker can read), and
    the master key the file sources' key manifests must be wrapped under."""
    return {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
            "encryption.key-id": MASTER}


@pytest.fixture(scope="session")
def icespark(spark):
    """The shared session with icecrypt's data sources registered."""
    import icecrypt.spark

    icecrypt.spark.register(spark)
    return spark


@pytest.fixture(scope="session")
def avro_data(tmp_path_factory) -> Dataset:
    """``big.avro``: 12 000 rows, codec null, ~3.4 MiB of Avro (4 AGS1 blocks); two small
    deflate files in ``small/`` and a hidden file that directory loads skip."""
    root = tmp_path_factory.mktemp("avro")
    enc, plain = root / "enc", root / "plain"
    (enc / "small").mkdir(parents=True)
    parts = {"big.avro": (sample_table(12_000, 0, width=16), "null"),
             "small/s1.avro": (sample_table(700, 12_000, width=16), "deflate"),
             "small/s2.avro": (sample_table(300, 12_700, width=16), "deflate")}
    keys = {}
    for name, (table, codec) in parts.items():
        path = enc / name
        keys[str(path)] = km = avro.write(table, path, codec=codec)
        plaintext_twin(path, km, plain / name)
    avro.write(sample_table(5, 99_000, width=16), enc / "small" / "_hidden.avro")
    table = pa.concat_tables(table for table, _ in parts.values())
    return Dataset(enc, plain, keys, table)


@pytest.fixture(scope="session")
def parquet_data(tmp_path_factory) -> Dataset:
    """Three encrypted Parquet files (one in ``sub/``) of 5 000 rows in row groups of 1 500,
    and plaintext twins written by pyarrow with the same row groups."""
    root = tmp_path_factory.mktemp("parquet")
    enc, plain = root / "enc", root / "plain"
    keys, tables = {}, []
    for index, name in enumerate(["p0.parquet", "sub/p1.parquet", "p2.parquet"]):
        table = sample_table(5_000, index * 5_000).append_column("u", pa.array(range(5_000), pa.uint32()))
        tables.append(table)
        (enc / name).parent.mkdir(parents=True, exist_ok=True)
        (plain / name).parent.mkdir(parents=True, exist_ok=True)
        keys[str(enc / name)] = parquet.write_table(table, enc / name, row_group_size=1_500)
        pq.write_table(table, plain / name, row_group_size=1_500, compression="zstd")
    return Dataset(enc, plain, keys, pa.concat_tables(tables))
