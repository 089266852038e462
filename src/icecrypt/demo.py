"""The main job of the quick start (``make demo``), on the embedded default.

A local keystore KMS holds the master key; an encryption manager makes a per-file data
key (DEK + AAD prefix), the file is encrypted as AGS1, its key metadata (with the
trusted ``file_length``) is wrapped by a key-encryption key exactly as Iceberg wraps a
manifest list's key, and everything is then read back the way a reader would: from the
keystore and the saved ``encryption-keys`` list alone.

    python -m icecrypt.demo [--dir demo-output] [--rows 2000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import time

from icecrypt import AuthenticationError, ags1, cli, openssl_version
from icecrypt.keys import EncryptedKey, EncryptionManager
from icecrypt.kms.local import LocalKms

MASTER_KEY_ID = "demo-master"
CHUNK = 4 * ags1.PLAIN_BLOCK_SIZE  # a few blocks: the data stays in cache between read and write


def generate_csv(path: str, rows: int, seed: int = 7) -> int:
    """Orders as CSV: id, timestamp, customer, country, amount, status."""
    rng = random.Random(seed)
    countries = ["DE", "FR", "US", "JP", "BR", "IN", "NG", "SE", "CA", "AU"]
    statuses = ["paid", "shipped", "returned", "cancelled"]
    start = 1_700_000_000_000
    with open(path, "w", encoding="ascii") as f:
        f.write("order_id,ts_ms,customer,country,amount,status\n")
        for base in range(0, rows, 50_000):
            lines = [
                f"{i},{start + i * 37},cust-{rng.randrange(1_000_000):06d},{rng.choice(countries)},"
                f"{rng.randrange(100, 500_000) / 100:.2f},{rng.choice(statuses)}\n"
                for i in range(base, min(base + 50_000, rows))
            ]
            f.write("".join(lines))
    return os.path.getsize(path)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="demo-output", help="work directory (recreated)")
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of generated data")
    args = parser.parse_args(argv)

    work = os.path.abspath(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    keystore = os.path.join(work, "keystore.json")
    plain = os.path.join(work, "orders.csv")
    encrypted = os.path.join(work, "orders.csv.ags1")
    keys_json = os.path.join(work, "encryption-keys.json")
    restored = os.path.join(work, "orders.restored.csv")
    print(f"icecrypt demo in {work} ({openssl_version()})")

    # 1. The embedded KMS: a 0600 keystore file holding the master key.
    kms = LocalKms.create_keystore(keystore, key_ids=(MASTER_KEY_ID,))
    print(f"1. keystore {os.path.basename(keystore)} (mode {oct(os.stat(keystore).st_mode & 0o777)}), master key {MASTER_KEY_ID!r}")

    size = generate_csv(plain, args.rows)
    print(f"2. generated {args.rows:,} orders: {size / 1e6:,.1f} MB of CSV")

    # 3. A fresh data key for the file, and the file encrypted as AGS1.
    manager = EncryptionManager(kms, MASTER_KEY_ID)
    file_key = manager.new_file_key()
    buf = memoryview(bytearray(CHUNK))
    t0 = time.perf_counter()
    with open(plain, "rb", buffering=0) as src, ags1.open_writer(
        encrypted, file_key.encryption_key, file_key.aad_prefix
    ) as writer:
        while n := src.readinto(buf):
            writer.write(buf[:n])
    enc_seconds = time.perf_counter() - t0
    file_key = file_key.with_file_length(writer.ciphertext_length)
    print(f"3. encrypted with a per-file {len(file_key.encryption_key) * 8}-bit DEK: "
          f"{writer.ciphertext_length:,} bytes, {size / enc_seconds / 1e9:.2f} GB/s file to file (fsync'ed)")

    # 4. The key metadata wrapped by a KEK, the KEK by the master key (Iceberg's envelope).
    entry = manager.wrap_manifest_list_key_metadata(file_key)
    with open(keys_json, "w", encoding="utf-8") as f:
        json.dump({"encryption-keys": [k.to_json() for k in manager.encryption_keys], "key-id": entry.key_id}, f, indent=1)
    print(f"4. key metadata wrapped: entry {entry.key_id} -> KEK {entry.encrypted_by_id} -> KMS key {MASTER_KEY_ID!r}")

    # 5. Inspect the file from the command line: no key needed.
    print("5. icecrypt inspect:")
    cli.main(["inspect", encrypted])

    # 6. Read it back as a reader would: keystore + encryption-keys list only.
    with open(keys_json, encoding="utf-8") as f:
        saved = json.load(f)
    reader_kms = LocalKms(keystore)
    reader_manager = EncryptionManager(reader_kms, MASTER_KEY_ID, [EncryptedKey.from_json(k) for k in saved["encryption-keys"]])
    key_metadata = reader_manager.unwrap_manifest_list_key_metadata(saved["key-id"])
    t0 = time.perf_counter()
    with ags1.open_reader(
        encrypted, key_metadata.encryption_key, key_metadata.aad_prefix, key_metadata.file_length
    ) as reader, open(restored, "wb", buffering=0) as out:
        while n := reader.readinto(buf):
            out.write(buf[:n])
    dec_seconds = time.perf_counter() - t0
    same = sha256_file(plain) == sha256_file(restored)
    print(f"6. decrypted through KMS -> KEK -> key metadata: {size / dec_seconds / 1e9:.2f} GB/s file to file, "
          f"round trip {'verified (sha256 equal)' if same else 'FAILED'}")

    # 7. Tampering is caught: one flipped bit in the middle of the file.
    damaged = bytearray(open(encrypted, "rb").read())
    damaged[len(damaged) // 2] ^= 0x01
    try:
        ags1.decrypt(bytes(damaged), key_metadata.encryption_key, key_metadata.aad_prefix, key_metadata.file_length)
        caught = "NOT DETECTED"
    except AuthenticationError as exc:
        caught = f"rejected ({exc})"
    print(f"7. one flipped bit: {caught}")
    print(f"summary: {args.rows:,} rows, {size / 1e6:,.1f} MB, encrypt {args.rows / enc_seconds:,.0f} rows/s, "
          f"decrypt {args.rows / dec_seconds:,.0f} rows/s")
    return 0 if same and caught.startswith("rejected") else 1


if __name__ == "__main__":
    raise SystemExit(main())
