"""Helpers of the icecrypt.spark tests: sample data, plaintext twins, canonical rows."""

from __future__ import annotations

import datetime
import decimal
import functools
import gzip
import hashlib
import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
from vectorlib import TABLES_DIR

from icecrypt import ags1
from icecrypt.keys import StandardKeyMetadata

MASTER = "master"
_UTC = datetime.timezone.utc


def sample_table(n: int, start: int = 0, seed: int = 7, width: int = 3) -> pa.Table:
    """Rows of many Spark-relevant types; ``s`` is ``16 * width`` random hex digits, so
    files barely compress."""
    rng = np.random.default_rng(seed + start)
    ids = np.arange(start, start + n, dtype=np.int64)
    noise = rng.integers(0, 2**63, size=(n, width), dtype=np.int64)
    return pa.table({
        "id": pa.array(ids),
        "x": pa.array(rng.random(n)),
        "s": pa.array(["".join(f"{v:016x}" for v in row) for row in noise.tolist()]),
        "n": pa.array([None if i % 7 == 0 else int(i % 1000) for i in ids], pa.int32()),
        "ts": pa.array(1_700_000_000_000_000 + ids * 1_000_003, pa.timestamp("us", tz="UTC")),
        "d": pa.array((ids % 20000).astype(np.int32), pa.date32()),
        "dec": pa.array([decimal.Decimal(int(i) * 7 - 5000).scaleb(-2) for i in ids], pa.decimal128(10, 2)),
        "tags": pa.array([[f"t{i % 3}"] * int(i % 3) for i in ids], pa.list_(pa.string())),
    })


def plaintext_twin(ciphertext_path: Path, key_metadata: StandardKeyMetadata, target: Path) -> None:
    """Write the decrypted bytes of an AGS1 file (the exact Avro file inside) to ``target``."""
    data = ciphertext_path.read_bytes()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(ags1.decrypt(data, key_metadata.encryption_key, key_metadata.aad_prefix,
                                    key_metadata.file_length))


def sync_positions(avro_bytes: bytes) -> list[int]:
    """Offsets where the container's sync marker starts (the header's one first); every
    block ends with the marker, so the file's last 16 bytes are it."""
    marker = avro_bytes[-16:]
    positions, pos = [], avro_bytes.find(marker)
    while pos >= 0:
        positions.append(pos)
        pos = avro_bytes.find(marker, pos + 1)
    return positions


def fastavro_rows(path: Path) -> list[dict]:
    """Every record of a plaintext Avro file, decoded by fastavro (the reference reader)."""
    import fastavro

    with open(path, "rb") as f:
        return list(fastavro.reader(f))


# --- canonical rows (../shared/tables/README.md) -------------------------------------------


def canonical_value(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return struct.pack(">d", value).hex()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_UTC)
        delta = value - datetime.datetime(1970, 1, 1, tzinfo=_UTC)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, datetime.date):
        return (value - datetime.date(1970, 1, 1)).days
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):  # a tuple: a map's (key, value) entry
        return [canonical_value(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical_value(v) for k, v in value.items()}
    raise TypeError(f"no canonical form for {type(value).__name__}")


def canonical_lines(rows: Iterable[Mapping], columns: list[str]) -> list[str]:
    """Sorted canonical JSON lines of ``rows`` (dicts) over ``columns``."""
    return sorted(json.dumps([canonical_value(row[c]) for c in columns], separators=(",", ":"), ensure_ascii=True)
                  for row in rows)


def table_lines(table: pa.Table, columns: list[str] | None = None) -> list[str]:
    columns = columns or table.column_names
    return canonical_lines(table.select(columns).to_pylist(), columns)


def union_variants(frames: list):
    """One DataFrame of ``frames`` (same schema), each tagged with its index in column
    ``variant``: a test reads all its variants in one Spark job."""
    from pyspark.sql import functions as F

    tagged = [df.withColumn("variant", F.lit(i)) for i, df in enumerate(frames)]
    return functools.reduce(lambda a, b: a.unionByName(b), tagged)


def digest(lines: list[str]) -> str:
    return hashlib.sha256("".join(line + "\n" for line in sorted(lines)).encode()).hexdigest()


# --- the Java-written tables ------------------------------------------------------------------


def java_data_files(table: str) -> dict[Path, StandardKeyMetadata]:
    """Local path -> key metadata of every data file of ../shared/tables/<table>."""
    keys = json.loads((TABLES_DIR / table / "keys.json").read_text(encoding="utf-8"))
    prefix = f"s3://icecrypt-golden/{table}/"
    out = {}
    for snapshot in keys["snapshots"]:
        for manifest in snapshot["manifests"]:
            for entry in manifest["entries"]:
                assert entry["path"].startswith(prefix)
                km = StandardKeyMetadata.decode(bytes.fromhex(entry["key_metadata"]["key_metadata_hex"]))
                out[TABLES_DIR / table / entry["path"][len(prefix):]] = km
    return out


def java_expected(table: str) -> dict:
    expected = json.loads((TABLES_DIR / table / "expected.json").read_text(encoding="utf-8"))
    with gzip.open(TABLES_DIR / table / "expected_rows.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    return {"digest": expected["expected"]["digest_sha256"], "rows": expected["expected"]["row_count"],
            "columns": [f["name"] for f in expected["schema"]["fields"]], "lines": lines}


def key_strings(key_metadata: Iterable[StandardKeyMetadata]) -> list[str]:
    """Every textual form a DEK or AAD prefix could leak in (hex, base64, repr of bytes)."""
    import base64

    out = []
    for km in key_metadata:
        for secret in (km.encryption_key, km.aad_prefix or b""):
            if secret:
                out += [secret.hex(), secret.hex().upper(), base64.b64encode(secret).decode(), repr(secret)[2:-1]]
        out += [km.encode().hex(), base64.b64encode(km.encode()).decode()]
    return out

