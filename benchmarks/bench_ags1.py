"""pytest-benchmark microbenchmarks of the AGS1 codec.

    make bench-micro        (pytest benchmarks/ -o python_files='bench_*.py' --benchmark-enable)
"""

from __future__ import annotations

import os
import random

import pytest

from icecrypt import _gcm, ags1

BS = ags1.PLAIN_BLOCK_SIZE
KEY = os.urandom(16)
AAD = os.urandom(16)


@pytest.fixture(scope="module")
def one_mib():
    plain = os.urandom(BS)
    blob = ags1.encrypt(plain, KEY, AAD)
    return plain, blob


@pytest.mark.parametrize("threads", [1, 0], ids=["1thread", "allcores"])
def test_encrypt_into_16mib(benchmark, threads):
    plain = os.urandom(16 * BS)
    out = bytearray(ags1.ciphertext_length(len(plain)))
    key = _gcm.GcmKey(KEY)
    benchmark(ags1.encrypt_into, plain, out, key, AAD, threads=threads)


@pytest.mark.parametrize("threads", [1, 0], ids=["1thread", "allcores"])
def test_decrypt_into_16mib(benchmark, threads):
    plain = os.urandom(16 * BS)
    blob = ags1.encrypt(plain, KEY, AAD)
    out = bytearray(len(plain))
    key = _gcm.GcmKey(KEY)
    benchmark(ags1.decrypt_into, blob, out, key, AAD, threads=threads)


def test_small_file_roundtrip_fresh_key(benchmark):
    plain = os.urandom(8192)
    out = bytearray(ags1.ciphertext_length(8192))
    back = bytearray(8192)

    def roundtrip():
        key = os.urandom(16)
        n = ags1.encrypt_into(plain, out, key, AAD)
        ags1.decrypt_into(memoryview(out)[:n], back, key, AAD)

    benchmark(roundtrip)


def test_reader_random_4k(benchmark):
    plain = os.urandom(8 * BS)
    blob = ags1.encrypt(plain, KEY, AAD)
    reader = ags1.open_reader(blob, KEY, AAD)
    rng = random.Random(1)
    offsets = [rng.randrange(len(plain) - 4096) for _ in range(256)]
    it = iter(offsets * 1000)
    benchmark(lambda: reader.read_at(next(it), 4096))
    reader.close()


def test_writer_stream_16mib_in_64k_writes(benchmark):
    chunk = memoryview(os.urandom(64 * 1024))

    class Null:
        def write(self, b):
            return len(b)

        def flush(self):
            pass

    def stream():
        with ags1.open_writer(Null(), KEY, AAD) as w:
            for _ in range(256):
                w.write(chunk)

    benchmark(stream)
