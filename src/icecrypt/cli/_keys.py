"""``icecrypt keys ...`` and ``icecrypt key-metadata ...``: keystores, encryption-keys, key metadata.

Nothing here prints key bytes unless asked with ``--show-key``.  Commands that change a
table's keys write a new metadata file (atomically, never over an existing file unless
``--in-place``); committing it to a catalog is left to the user.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

from icecrypt._atomic import AtomicFile
from icecrypt.cli._text import safe

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``keys`` and ``key-metadata`` command groups to an argparse subparsers object."""
    keys = subparsers.add_parser("keys", help="master keys and a table's encryption-keys")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)

    p = keys_sub.add_parser("init", help="create a local keystore (mode 0600) for the 'local' KMS")
    p.add_argument("path", help="keystore file to create (refuses to overwrite)")
    p.add_argument("--key-id", action="append", dest="key_ids", metavar="ID",
                   help="master key id to create (repeatable; default: master)")
    p.add_argument("--key-length", type=int, choices=(16, 24, 32), default=32)
    p.set_defaults(func=_keys_init)

    p = keys_sub.add_parser("list", help="list a table's encryption-keys (no key material)")
    p.add_argument("metadata", help="table metadata.json")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_keys_list)

    p = keys_sub.add_parser("rotate-master", help="re-wrap every KEK under a new master key")
    _add_rewrite_arguments(p)
    p.add_argument("--new-key-id", required=True, help="id of the new master (table) key")
    p.set_defaults(func=_keys_rotate_master)

    p = keys_sub.add_parser("rotate-kek", help="add a new KEK that later snapshots use")
    _add_rewrite_arguments(p)
    p.set_defaults(func=_keys_rotate_kek)

    km = subparsers.add_parser("key-metadata", help="encode or decode StandardKeyMetadata")
    km_sub = km.add_subparsers(dest="key_metadata_command", metavar="COMMAND", required=True)

    p = km_sub.add_parser("encode", help="print the hex encoding of key metadata")
    p.add_argument("--key-hex", required=True, help="encryption key (hex)")
    p.add_argument("--aad-hex", help="AAD prefix (hex; omit for none)")
    p.add_argument("--file-length", type=int, help="ciphertext length of the file")
    p.set_defaults(func=_key_metadata_encode)

    p = km_sub.add_parser("decode", help="print key metadata (hex) as JSON")
    p.add_argument("hex", help="encoded key metadata (hex)")
    p.add_argument("--show-key", action="store_true", help="also print the key itself (secret!)")
    p.set_defaults(func=_key_metadata_decode)


def _add_rewrite_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("metadata", help="table metadata.json")
    p.add_argument("--kms-type", help="encryption.kms-type of the KMS holding the master key")
    p.add_argument("--kms-property", action="append", default=[], metavar="K=V",
                   help="KMS property (repeatable), e.g. encryption.kms.local.keystore=PATH")
    p.add_argument("--table-key-id", help="table key id (default: properties['encryption.key-id'])")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--output", help="where to write the new metadata (must not exist)")
    out.add_argument("--in-place", action="store_true", help="replace the input file")


# --- helpers ---------------------------------------------------------------------------


def _read_metadata(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    if not isinstance(document, dict):
        raise ValueError(f"{path}: table metadata must be a JSON object")
    return document


def _default_output(path: Path) -> Path:
    # Iceberg names metadata files NNNNN-<uuid>.metadata.json; take the next number.
    match = re.fullmatch(r"(\d+)-.*\.metadata\.json", path.name)
    if match:
        number = int(match.group(1)) + 1
        return path.with_name(f"{number:0{len(match.group(1))}d}-{uuid.uuid4()}.metadata.json")
    stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    return path.with_name(f"{stem}-{uuid.uuid4()}.json")


def _write_metadata(payload: bytes, target: Path, *, replace: bool) -> None:
    """Write the metadata file's bytes atomically; refuse an existing target unless ``replace``."""
    with AtomicFile(target) as out:
        out.file.write(payload)
        out.commit(overwrite=replace)


def _kms_from_args(args: argparse.Namespace):
    from icecrypt.kms.base import KMS_TYPE, create_kms_client

    properties: dict[str, str] = {}
    for item in args.kms_property:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--kms-property expects K=V, got {item!r}")
        properties[name] = value
    if args.kms_type:
        properties[KMS_TYPE] = args.kms_type
    return create_kms_client(properties)


def _rewrite(args: argparse.Namespace, change) -> int:
    """The metadata file with ``change(manager)`` applied to its keys.  An authenticated
    input is verified first and the output authenticated as its successor (under a new
    metadata key when the master key changed); an input without an authenticator gives an
    output without one (compact JSON, as Java writes it)."""
    from icecrypt.keys import EncryptionManager
    from icecrypt.table.commit import authenticity

    source = Path(args.metadata)
    document = _read_metadata(args.metadata)
    target = source if args.in_place else Path(args.output) if args.output else _default_output(source)
    with _kms_from_args(args) as kms:
        manager = EncryptionManager.from_table_metadata(kms, document, table_key_id=args.table_key_id)
        before = manager.table_key_id
        base = authenticity.verify(document, str(source), manager, table_key_id=before)
        message = change(manager)
        updated = manager.apply_to_metadata(authenticity.strip(document))
        sealer = None
        if base is not None:
            sealer = authenticity.sealer_for(manager, base, new_key=manager.table_key_id != before)
        payload = authenticity.seal_or_plain(updated, target.name, sealer)
    _write_metadata(payload, target, replace=args.in_place)
    print(safe(message))  # it names key ids from the metadata
    print(f"wrote {target}" + (" (authenticated)" if sealer is not None else ""))
    return 0


# --- handlers --------------------------------------------------------------------------


def _keys_init(args: argparse.Namespace) -> int:
    from icecrypt.kms.local import LocalKms

    kms = LocalKms.create_keystore(args.path, args.key_ids or ("master",), args.key_length)
    print(f"created keystore {kms.keystore_path} (mode 0600) with master keys: {', '.join(kms.key_ids)}")
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    from icecrypt.keys import read_encryption_keys, referenced_keys

    document = _read_metadata(args.metadata)
    keys = read_encryption_keys(document)
    table_key_id = (document.get("properties") or {}).get("encryption.key-id")
    refs = referenced_keys(document)
    rows = []
    for key in keys:
        if key.encrypted_by_id is not None and key.encrypted_by_id == table_key_id:
            role = "KEK"
        elif key.key_timestamp is not None:
            role = "KEK (other master key)"
        else:
            role = "manifest-list key"
        rows.append({
            "key-id": key.key_id,
            "role": role,
            "encrypted-by-id": key.encrypted_by_id,
            "key-timestamp": key.key_timestamp,
            "wrapped-length": len(key.encrypted_key_metadata),
            "snapshots": sorted(sid for sid, ids in refs.items() if key.key_id in ids),
        })
    if args.json:
        json.dump({"table-key-id": table_key_id, "encryption-keys": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"table key: {safe(table_key_id)}")
    header = ("KEY-ID", "ROLE", "ENCRYPTED-BY", "KEY-TIMESTAMP", "SNAPSHOTS")
    lines = [header] + [
        tuple(map(safe, (r["key-id"], r["role"], r["encrypted-by-id"] or "-", r["key-timestamp"] or "-",
                         ",".join(map(str, r["snapshots"])) or "-")))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1])
    return 0


def _keys_rotate_master(args: argparse.Namespace) -> int:
    def change(manager) -> str:
        old = manager.table_key_id
        rewrapped = manager.rotate_master_key(args.new_key_id)
        return (f"re-wrapped {len(rewrapped)} KEK(s) from master key {old!r} to {args.new_key_id!r} "
                "(encryption.key-id updated in the new metadata)")

    return _rewrite(args, change)


def _keys_rotate_kek(args: argparse.Namespace) -> int:
    def change(manager) -> str:
        entry = manager.rotate_kek()
        return f"new KEK {entry.key_id} (KEY_TIMESTAMP {entry.key_timestamp}) placed first"

    return _rewrite(args, change)


def _parse_hex(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{what} is not valid hex") from None  # never echo the (secret) input


def _key_metadata_encode(args: argparse.Namespace) -> int:
    from icecrypt.keys import StandardKeyMetadata

    key = _parse_hex(args.key_hex, "--key-hex")
    aad = None if args.aad_hex is None else _parse_hex(args.aad_hex, "--aad-hex")
    print(StandardKeyMetadata(key, aad, args.file_length).encode().hex())
    return 0


def _key_metadata_decode(args: argparse.Namespace) -> int:
    from icecrypt.keys.metadata import _decode

    metadata, two_field = _decode(_parse_hex(args.hex, "key metadata"))
    result: dict[str, Any] = {
        "layout": "iceberg-1.10 (no file_length field)" if two_field else "iceberg-1.11",
        "key_length": metadata.key_length,
    }
    if args.show_key:
        result["key_hex"] = metadata.encryption_key.hex()
    result["aad_prefix_hex"] = None if metadata.aad_prefix is None else metadata.aad_prefix.hex()
    result["file_length"] = metadata.file_length
    print(json.dumps(result, indent=2))
    return 0
