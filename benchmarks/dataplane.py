"""Reading encrypted data through icecrypt against the same plaintext read by pyarrow.

    python benchmarks/dataplane.py [--mb 300] [--avro-mb 30] [--rounds 9] [--files 8] [--dir /dev/shm]
                                   [--presentations] [--json]

Every row compares two reads of the same rows, measured in one run with the variants
interleaved round by round (the host is shared and noisy); the files live in DIR
(default /dev/shm, so both sides read from the page cache):

  parquet   pyarrow.parquet.read_table(use_threads=True): a Parquet file stored as AGS1
            read through icecrypt.arrow.EncryptedFileSystem, against the plaintext file
            through pyarrow's LocalFileSystem
  projection  the same, reading two of the six columns
  dataset   pyarrow.dataset(...).to_table(use_threads=True) over FILES Parquet files,
            encrypted through EncryptedFileSystem against plaintext through LocalFileSystem
  avro      icecrypt.avro.read of an AGS1-encrypted Avro file against the same decoding
            of the plaintext Avro file (when icecrypt.avro is installed)

With --presentations, also the ways an encrypted file can be handed to Arrow, on the
Parquet file (full read and projection): icecrypt.arrow's (a PythonFile over a lazy
reader that decrypts into Arrow-pool buffers), the same returning fresh ``bytes``, and
decrypting the whole file up front into one buffer behind a native ``pa.BufferReader``;
with minor page faults, a figure the host's load does not move.

The ratio is plaintext time / encrypted time: 1.0 means encryption is free, the target
is at least 0.8.  Medians of ROUNDS rounds after one warm-up round, wall-clock and CPU
time (all threads of the process; steadier when other processes share the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import icecrypt
from icecrypt import ags1
from icecrypt.arrow import EncryptedFileSystem, EncryptedFileSystemHandler
from icecrypt.keys import EncryptionManager
from icecrypt.kms.memory import MemoryKms

#: the columns of the "projection" row
PROJECTION = ["id", "word"]


def make_table(rows: int, seed: int = 7) -> pa.Table:
    """Columns of the usual kinds, random enough that Parquet does not shrink them away."""
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)
    words = np.array([f"w{i:05d}-{i * 7919 % 100003}" for i in range(5000)], dtype=object)
    return pa.table(
        {
            "id": ids,
            "value": rng.standard_normal(rows),
            "count": rng.integers(0, 1 << 40, rows),
            "ratio": rng.random(rows).astype(np.float32),
            "word": pa.array(words[rng.integers(0, len(words), rows)], pa.string()),
            "flag": rng.random(rows) < 0.3,
        }
    )


def rows_for(megabytes: int) -> int:
    """Rows whose Parquet file is about ``megabytes`` MB (measured on a sample)."""
    sample = make_table(200_000)
    sink = pa.BufferOutputStream()
    pq.write_table(sample, sink)
    per_row = sink.getvalue().size / sample.num_rows
    return int(megabytes * 1e6 / per_row)


def interleaved(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float, float]]:
    """Median wall-clock seconds, CPU seconds (all threads of the process) and minor page
    faults of each variant; every round runs each variant once, in a new random order,
    after one warm-up round.  CPU time is the steadier figure on a shared host (it does
    not count waiting for a core another process holds); page faults do not depend on
    the host's load at all."""
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
    order = list(variants)
    for rnd in range(rounds + 1):
        random.shuffle(order)
        for name in order:
            f0, t0, c0 = _minor_faults(), time.perf_counter(), time.process_time()
            variants[name]()
            t1, c1, f1 = time.perf_counter(), time.process_time(), _minor_faults()
            if rnd:
                samples[name].append((t1 - t0, c1 - c0, f1 - f0))
    return {
        name: tuple(statistics.median(sample[i] for sample in runs) for i in range(3))
        for name, runs in samples.items()
    }


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def row(size: int, plain: tuple[float, ...], enc: tuple[float, ...]) -> dict[str, float]:
    return {
        "bytes": size,
        "plain_s": plain[0],
        "enc_s": enc[0],
        "ratio": plain[0] / enc[0],
        "plain_cpu_s": plain[1],
        "enc_cpu_s": enc[1],
        "cpu_ratio": plain[1] / enc[1],
    }


def setup_parquet(root: str, table: pa.Table, files: int, efs: pafs.FileSystem) -> dict[str, str]:
    local = pafs.LocalFileSystem()
    paths = {"plain": f"{root}/plain.parquet", "enc": f"{root}/enc.parquet"}
    pq.write_table(table, paths["plain"], filesystem=local)
    pq.write_table(table, paths["enc"], filesystem=efs)
    paths["plain_ds"], paths["enc_ds"] = f"{root}/plain_ds", f"{root}/enc_ds"
    per_file = -(-table.num_rows // files)
    for name, fs in (("plain_ds", local), ("enc_ds", efs)):
        fs.create_dir(paths[name])
        for i in range(files):
            pq.write_table(table.slice(i * per_file, per_file), f"{paths[name]}/part-{i:03d}.parquet", filesystem=fs)
    return paths


def setup_avro(root: str, table: pa.Table, manager: EncryptionManager) -> dict | None:
    """Encrypted and plaintext Avro files of ``table``, or None without icecrypt.avro."""
    try:
        from icecrypt import avro
    except ImportError:
        return None
    enc = f"{root}/enc.avro"
    key_metadata = avro.write(table, enc, key_metadata=manager.new_file_key())
    plain = f"{root}/plain.avro"
    with open(plain, "wb") as out:  # the same container, decrypted once
        from icecrypt import ags1

        with ags1.open_reader(enc, key_metadata.encryption_key, key_metadata.aad_prefix, key_metadata.file_length) as r:
            shutil.copyfileobj(r, out, 8 << 20)
    return {"enc": enc, "plain": plain, "key_metadata": key_metadata, "module": avro}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="size of the Parquet file (MB)")
    parser.add_argument("--avro-mb", type=int, default=30, help="size of the Avro table (MB of Parquet; Avro decoding is slow)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--files", type=int, default=8, help="files of the dataset scan")
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--presentations", action="store_true", help="compare ways to present files to Arrow")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    manager = EncryptionManager(MemoryKms.with_iceberg_test_keys(), "keyA")
    efs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), manager)
    local = pafs.LocalFileSystem()
    root = tempfile.mkdtemp(prefix="icecrypt-dataplane-", dir=args.dir)
    results: dict[str, dict] = {}
    presentations: dict[str, tuple[float, float, float]] = {}
    avro_skipped = ""
    try:
        table = make_table(rows_for(args.mb))
        paths = setup_parquet(root, table, args.files, efs)
        size = os.path.getsize(paths["plain"])

        rows = table.num_rows

        def check(result: pa.Table) -> None:
            assert result.num_rows == rows

        medians = interleaved(
            {
                "parquet/plain": lambda: check(pq.read_table(paths["plain"], filesystem=local, use_threads=True)),
                "parquet/enc": lambda: check(pq.read_table(paths["enc"], filesystem=efs, use_threads=True)),
                "projection/plain": lambda: check(pq.read_table(paths["plain"], filesystem=local, columns=PROJECTION)),
                "projection/enc": lambda: check(pq.read_table(paths["enc"], filesystem=efs, columns=PROJECTION)),
                "dataset/plain": lambda: check(
                    ds.dataset(paths["plain_ds"], filesystem=local, format="parquet").to_table(use_threads=True)
                ),
                "dataset/enc": lambda: check(
                    ds.dataset(paths["enc_ds"], filesystem=efs, format="parquet").to_table(use_threads=True)
                ),
            },
            args.rounds,
        )
        for name in ("parquet", "projection", "dataset"):
            results[name] = row(size, medians[f"{name}/plain"], medians[f"{name}/enc"])
        if args.presentations:
            presentations = compare_presentations(paths, efs, args.rounds, check)
        del table

        avro_table = make_table(rows_for(args.avro_mb))
        try:
            avro_files = setup_avro(root, avro_table, manager)
        except Exception as exc:  # icecrypt.avro is being built alongside: report, go on
            avro_files = None
            avro_skipped = f"icecrypt.avro failed: {type(exc).__name__}: {exc}"
        else:
            avro_skipped = "icecrypt.avro not available"
        if avro_files is not None:
            avro = avro_files["module"]
            plain_length = os.path.getsize(avro_files["plain"])
            # icecrypt.avro has no plaintext mode: the plaintext side runs the same
            # fastavro decoding and batch building over the plaintext file.
            decode_plain = _plain_avro_reader(avro)
            expected = avro.read(avro_files["enc"], avro_files["key_metadata"])
            assert decode_plain(avro_files["plain"]).equals(expected), "the two Avro decodings differ"
            del expected
            medians = interleaved(
                {
                    "avro/plain": lambda: decode_plain(avro_files["plain"]),
                    "avro/enc": lambda: avro.read(avro_files["enc"], avro_files["key_metadata"]),
                },
                args.rounds,
            )
            results["avro"] = row(plain_length, medians["avro/plain"], medians["avro/enc"])
    finally:
        shutil.rmtree(root, ignore_errors=True)

    if args.json:
        json.dump({"rows": results, "presentations": presentations}, sys.stdout, indent=2)
        print()
        return 0
    print(f"icecrypt {icecrypt.__version__}, pyarrow {pa.__version__}, OpenSSL {icecrypt.openssl_version()}, "
          f"{os.cpu_count()} CPUs, files in {args.dir}, {args.rounds} rounds (medians)")
    print(f"{'row':<11} {'MB':>7} {'plain s':>8} {'enc s':>8} {'ratio':>6}   {'plain cpu':>9} {'enc cpu':>8} {'ratio':>6}")
    for name, r in results.items():
        print(f"{name:<11} {r['bytes'] / 1e6:7.1f} {r['plain_s']:8.3f} {r['enc_s']:8.3f} {r['ratio']:6.2f}   "
              f"{r['plain_cpu_s']:9.3f} {r['enc_cpu_s']:8.3f} {r['cpu_ratio']:6.2f}")
    print("ratio = plaintext time / encrypted time (target >= 0.8)")
    if presentations:
        print("\npresenting the encrypted Parquet file to Arrow (medians):")
        print(f"  {'':<48} {'wall s':>8} {'cpu s':>8} {'page faults':>12}")
        for name, (wall, cpu, faults) in presentations.items():
            print(f"  {name:<48} {wall:8.3f} {cpu:8.3f} {faults:12.0f}")
    if "avro" not in results:
        print(f"avro: skipped ({avro_skipped})")
    return 0


class _BytesHandler(EncryptedFileSystemHandler):
    """icecrypt.arrow's lazy reader, but returning the fresh ``bytes`` objects that
    ``Ags1Reader.read`` makes."""

    def _open_reader(self, path: str) -> pa.NativeFile:
        km = self.key_metadata(path)
        base = self.base.open_input_file(path)
        return pa.PythonFile(ags1.Ags1Reader(base, km.encryption_key, km.aad_prefix, km.file_length, name=path), mode="r")


class _EagerHandler(EncryptedFileSystemHandler):
    """Decrypt the whole file when it is opened, into one Arrow buffer read natively."""

    def _open_reader(self, path: str) -> pa.NativeFile:
        km = self.key_metadata(path)
        with self.base.open_input_file(path) as base:
            ciphertext = base.read_buffer()
        plaintext = pa.allocate_buffer(ags1.plaintext_length(len(ciphertext)))
        ags1.decrypt_into(ciphertext, plaintext, km.encryption_key, km.aad_prefix, km.file_length)
        return pa.BufferReader(plaintext)


def compare_presentations(paths: dict[str, str], efs: pafs.FileSystem, rounds: int, check) -> dict:
    keys = efs.handler.written_keys()
    local = pafs.LocalFileSystem()
    variants = {
        "plaintext (LocalFileSystem)": local,
        "lazy, Arrow-pool buffers (icecrypt)": efs,
        "lazy, bytes": pafs.PyFileSystem(_BytesHandler(local, keys=keys)),
        "eager, BufferReader": pafs.PyFileSystem(_EagerHandler(local, keys=keys)),
    }
    runs = {}
    for name, fs in variants.items():
        path = paths["plain"] if fs is local else paths["enc"]
        runs[f"{name}"] = lambda fs=fs, path=path: check(pq.read_table(path, filesystem=fs))
        runs[f"{name}, projection"] = lambda fs=fs, path=path: check(pq.read_table(path, filesystem=fs, columns=PROJECTION))
    return interleaved(runs, rounds)


def _plain_avro_reader(avro_module) -> Callable[[str], pa.Table]:
    """The decoding ``icecrypt.avro.read`` does (fastavro records, then the module's own
    batch builder), applied to a plaintext Avro file read from disk."""
    import fastavro

    from icecrypt.avro._arrow import (
        BatchBuilder,
        expand,
        to_arrow_schema,
        top_level_fields,
    )

    def read(path: str) -> pa.Table:
        with open(path, "rb") as f:
            records = fastavro.reader(f)
            tree = expand(json.loads(records.metadata["avro.schema"]))
            schema = to_arrow_schema(tree)
            builder = BatchBuilder(top_level_fields(tree), schema)
            batches = list(builder.batches(records, avro_module.DEFAULT_BATCH_SIZE))
        return pa.Table.from_batches(batches, schema=schema)

    return read


if __name__ == "__main__":
    sys.exit(main())
