"""Helpers of the icecrypt.avro tests: the Java-written tables of ../shared/tables."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from vectorlib import TABLES_DIR

TABLES = ("enc_avro_dek16", "enc_parquet_dek16", "enc_deletes_dek16")


def local_path(table: str, uri: str) -> Path:
    """The file of ../shared/tables/<table> that a path recorded in its metadata names."""
    prefix = f"s3://icecrypt-golden/{table}/"
    assert uri.startswith(prefix), uri
    return TABLES_DIR / table / uri[len(prefix) :]


@cache
def keys_json(table: str) -> dict:
    """keys.json of a table (every key unwrapped, every file's key metadata decoded)."""
    return json.loads((TABLES_DIR / table / "keys.json").read_text(encoding="utf-8"))


@cache
def expected_json(table: str) -> dict:
    return json.loads((TABLES_DIR / table / "expected.json").read_text(encoding="utf-8"))


def avro_files(table: str) -> dict[str, dict]:
    """Every AGS1-encrypted Avro file of a table (manifest lists, manifests, Avro data
    files): uri -> {"kind", "key_metadata" (bytes), "info" (the keys.json entry)}."""
    out: dict[str, dict] = {}
    for snap in keys_json(table)["snapshots"]:
        km = snap["manifest_list_key_metadata"]
        out.setdefault(snap["manifest_list"], {"kind": "manifest_list", "key_metadata": bytes.fromhex(km["key_metadata_hex"]), "info": snap})
        for manifest in snap["manifests"]:
            km = manifest["key_metadata"]
            out.setdefault(manifest["path"], {"kind": "manifest", "key_metadata": bytes.fromhex(km["key_metadata_hex"]), "info": manifest})
            for entry in manifest["entries"]:
                if entry["format"] == "AVRO":
                    km = entry["key_metadata"]
                    out.setdefault(entry["path"], {"kind": "data", "key_metadata": bytes.fromhex(km["key_metadata_hex"]), "info": entry})
    return out
