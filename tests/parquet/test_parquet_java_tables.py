"""Parquet data and delete files written by Iceberg Java (../shared/tables) read here:
row counts, crypto layout, and the digests of the table states they make up."""

from __future__ import annotations

import json
from functools import cache

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from parquet_rows import canonical_rows, digest, file_crypto_metadata
from vectorlib import TABLES_DIR

import icecrypt
from icecrypt import parquet as ip
from icecrypt.keys import StandardKeyMetadata


@cache
def table_info(name: str) -> tuple[dict, dict]:
    folder = TABLES_DIR / name
    if not folder.is_dir():
        pytest.fail(f"Java-written tables not found at {TABLES_DIR}")
    with open(folder / "keys.json", encoding="utf-8") as f:
        keys = json.load(f)
    with open(folder / "expected.json", encoding="utf-8") as f:
        expected = json.load(f)
    return keys, expected


def parquet_entries(name: str) -> dict[str, dict]:
    """Every Parquet file any snapshot's manifests list, by relative path."""
    keys, _ = table_info(name)
    prefix = keys["table_location"].rstrip("/") + "/"
    out = {}
    for snapshot in keys["snapshots"]:
        for manifest in snapshot["manifests"]:
            for entry in manifest["entries"]:
                if entry["format"] == "PARQUET":
                    out[entry["path"][len(prefix):]] = entry
    return out


def local(name: str, relative: str):
    return TABLES_DIR / name / relative


def key_metadata(entry: dict) -> bytes:
    return bytes.fromhex(entry["key_metadata"]["key_metadata_hex"])


@pytest.mark.parametrize("name", ["enc_parquet_dek16", "enc_deletes_dek16"])
def test_every_java_parquet_file_reads(name):
    entries = parquet_entries(name)
    assert entries
    for relative, entry in entries.items():
        path = local(name, relative)
        km = key_metadata(entry)
        assert StandardKeyMetadata.decode(km).file_length == path.stat().st_size == entry["file_size_in_bytes"]
        table = ip.read_table(path, km)
        assert table.num_rows == entry["record_count"], relative
        with ip.open_file(path, km) as f:
            assert f.num_row_groups == len(entry["parquet"]["row_groups"])
            assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [
                rg["rows"] for rg in entry["parquet"]["row_groups"]
            ]
            assert pa.concat_tables(f.read_row_group(i) for i in range(f.num_row_groups)).equals(table)


@pytest.mark.parametrize("name", ["enc_parquet_dek16", "enc_deletes_dek16"])
def test_java_files_have_the_layout_we_write(name):
    for relative, entry in parquet_entries(name).items():
        data = local(name, relative).read_bytes()
        assert data[:4] == data[-4:] == b"PARE"
        ours = file_crypto_metadata(data)
        java = entry["parquet"]["file_crypto_metadata"]
        assert ours["algorithm"] == java["algorithm"] == "AES_GCM_V1"
        assert ours["aad_prefix"] is None and java["aad_prefix_stored"] is False
        assert ours["supply_aad_prefix"] is java["supply_aad_prefix"] is True
        assert ours["aad_file_unique"].hex() == java["aad_file_unique_hex"]
        assert ours["key_metadata"] is None and java["footer_key_metadata_set"] is False


def test_parquet_table_digests():
    """The rows of the data files of each snapshot hash to Java's expected digest."""
    name = "enc_parquet_dek16"
    _, expected = table_info(name)
    entries = parquet_entries(name)
    files: list[str] = []
    for snapshot in expected["snapshots"]:
        files += snapshot["added_files"]
        rows = []
        for relative in files:
            rows += canonical_rows(ip.read_table(local(name, relative), key_metadata(entries[relative])))
        assert len(rows) == snapshot["expected_row_count"]
        assert digest(rows) == snapshot["expected_digest_sha256"], snapshot["snapshot_id"]
    assert digest(rows) == expected["expected"]["digest_sha256"]


def test_deletes_table_state_from_its_parquet_files():
    """Rebuild enc_deletes_dek16's current state from its Parquet files: the DV on the
    alpha file deletes positions p % 10 == 3 (as its snapshot says), the equality delete
    file (read here) removes ids from the older beta file only."""
    name = "enc_deletes_dek16"
    _, expected = table_info(name)
    entries = parquet_entries(name)
    snaps = expected["snapshots"]
    alpha, beta = snaps[0]["added_files"]
    (eqdel,) = snaps[2]["added_files"]
    (gamma,) = snaps[3]["added_files"]
    assert "p % 10 == 3" in snaps[1]["description"] and "alpha" in alpha

    read = lambda rel: ip.read_table(local(name, rel), key_metadata(entries[rel]))
    deletes = read(eqdel)
    assert deletes.column_names == ["id"] and deletes.num_rows == 321
    assert all(i % 13 == 0 for i in deletes.column("id").to_pylist())

    first = canonical_rows(read(alpha)) + canonical_rows(read(beta))
    assert digest(first) == snaps[0]["expected_digest_sha256"]

    alpha_rows = [row for pos, row in enumerate(canonical_rows(read(alpha))) if pos % 10 != 3]
    beta_table = read(beta)
    beta_rows = canonical_rows(beta_table.filter(pc.invert(pc.is_in(beta_table.column("id"), deletes.column("id")))))
    current = alpha_rows + beta_rows + canonical_rows(read(gamma))
    assert len(current) == expected["expected"]["row_count"] == 9779
    assert digest(current) == expected["expected"]["digest_sha256"]


def test_java_file_columns_filters_and_wrong_keys():
    name = "enc_parquet_dek16"
    relative, entry = next(iter(parquet_entries(name).items()))
    path = local(name, relative)
    km = StandardKeyMetadata.decode(key_metadata(entry))
    table = ip.read_table(path, km, columns=["id", "price"], filters=[("qty", ">", 500)])
    assert table.column_names == ["id", "price"] and 0 < table.num_rows < entry["record_count"]
    with pytest.raises(icecrypt.AuthenticationError):
        ip.read_table(path, StandardKeyMetadata(km.encryption_key, bytes(16), km.file_length))
    with pytest.raises(icecrypt.AuthenticationError, match="key metadata has none"):
        ip.open_file(path, StandardKeyMetadata(km.encryption_key, None, km.file_length))
    with pytest.raises(icecrypt.AuthenticationError):
        ip.open_file(path, StandardKeyMetadata(bytes(16), km.aad_prefix, km.file_length))
