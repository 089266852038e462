"""AGS1 throughput: icecrypt against its ceiling and baselines, measured in one run.

    python benchmarks/throughput.py [--json] [--quick] [--dir DIR]

Rows (GB/s = 10^9 plaintext bytes per second, median of repetitions):
  (a) icecrypt            ags1.encrypt_into / decrypt_into, reused output buffer
  (b) openssl speed -evp  of the very OpenSSL build icecrypt links (the ceiling)
  (c) cryptography naive  AESGCM.encrypt per block returning bytes, then b"".join
  (d) cryptography best   AESGCM.encrypt_into per block into one reused buffer
  memcpy                  a plain copy of the same buffer (memory bandwidth)
for 256 MiB in memory and 8 MiB in cache, AES-128 and AES-256, one thread and all
cores; then 10,000 files of 8 KiB (a fresh key each, as Iceberg's per-file DEKs),
file-to-file 1 GiB against a plain copy, and peak RSS while streaming 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import icecrypt
from icecrypt import _gcm, ags1

BS = ags1.PLAIN_BLOCK_SIZE
CBS = ags1.CIPHER_BLOCK_SIZE
CORES = _gcm.get_default_threads()


def prefaulted(n: int) -> bytearray:
    """A buffer whose pages are touched with non-zero bytes (calloc'd zero pages would
    make the first pass measure page faults)."""
    buf = bytearray(n)
    buf[:] = b"\x5a" * n
    return buf


def best_rate(fn, nbytes: int, repeat: int) -> float:
    """Median GB/s of ``repeat`` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def interleaved(variants: dict, nbytes: int, repeat: int) -> dict:
    """Median GB/s of each variant, running every variant once per round so that the
    drift of a shared machine hits all of them alike (one warm-up round first)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rnd in range(repeat + 1):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            if rnd:
                times[name].append(time.perf_counter() - t0)
    return {name: nbytes / statistics.median(t) / 1e9 for name, t in times.items()}


def openssl_speed(bits: int, multi: int) -> float | None:
    """GB/s of ``openssl speed -evp aes-N-gcm -bytes 1048576`` of the linked build."""
    binary = os.path.join(_gcm.OPENSSL_PREFIX, "bin", "openssl") if _gcm.OPENSSL_PREFIX else shutil.which("openssl")
    if not binary or not os.path.exists(binary):
        return None
    args = [binary, "speed", "-evp", f"aes-{bits}-gcm", "-bytes", str(BS), "-seconds", "2"]
    if multi > 1:
        args[2:2] = ["-multi", str(multi)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    line = [ln for ln in out.splitlines() if ln.lower().startswith(f"aes-{bits}-gcm")][-1]
    value = re.findall(r"([\d.]+)k", line)[-1]  # thousands of bytes per second
    return float(value) * 1e3 / 1e9


class Baselines:
    """AGS1 written on cryptography's AESGCM, as a Python user would."""

    def __init__(self, key: bytes, aad: bytes):
        self.aesgcm = AESGCM(key)
        self.aad = aad

    def _aad(self, i: int) -> bytes:
        return self.aad + i.to_bytes(4, "little")

    def naive_encrypt(self, plain: memoryview, threads: int) -> bytes:
        n = (len(plain) + BS - 1) // BS

        def block(i):
            nonce = os.urandom(12)
            return nonce + self.aesgcm.encrypt(nonce, plain[i * BS : (i + 1) * BS], self._aad(i))

        parts = _map(block, range(n), threads)
        return ags1.HEADER + b"".join(parts)

    def naive_decrypt(self, blob: memoryview, threads: int) -> bytes:
        n = (len(blob) - 8 + CBS - 1) // CBS

        def block(i):
            c = blob[8 + i * CBS : 8 + (i + 1) * CBS]
            return self.aesgcm.decrypt(c[:12], c[12:], self._aad(i))

        return b"".join(_map(block, range(n), threads))

    def into_encrypt(self, plain: memoryview, out: memoryview, threads: int) -> None:
        n = (len(plain) + BS - 1) // BS
        out[:8] = ags1.HEADER

        def block(i):
            dst = out[8 + i * CBS :]
            p = plain[i * BS : (i + 1) * BS]
            nonce = os.urandom(12)
            dst[:12] = nonce
            self.aesgcm.encrypt_into(nonce, p, self._aad(i), dst[12 : 12 + len(p) + 16])

        _map(block, range(n), threads)

    def into_decrypt(self, blob: memoryview, out: memoryview, threads: int) -> None:
        n = (len(blob) - 8 + CBS - 1) // CBS

        def block(i):
            c = blob[8 + i * CBS : 8 + (i + 1) * CBS]
            self.aesgcm.decrypt_into(c[:12], c[12:], self._aad(i), out[i * BS : i * BS + len(c) - 28])

        _map(block, range(n), threads)


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _map(fn, items, threads: int):
    if threads <= 1:
        return [fn(i) for i in items]
    pool = _POOLS.setdefault(threads, ThreadPoolExecutor(threads))
    return list(pool.map(fn, items))


def bulk(size: int, bits: int, repeat: int, rows: list) -> None:
    key = os.urandom(bits // 8)
    aad = os.urandom(16)
    plain = memoryview(prefaulted(size))
    blob = memoryview(prefaulted(ags1.ciphertext_length(size)))
    out = memoryview(prefaulted(size))
    base = Baselines(key, aad)
    where = "in cache" if size <= 8 * BS else "in memory"
    label = f"{size // BS} MiB {where}, AES-{bits}"
    gkey = _gcm.GcmKey(key)
    for threads in (1, CORES):
        variants = {
            "icecrypt_enc": lambda: ags1.encrypt_into(plain, blob, gkey, aad, threads=threads),
            "icecrypt_dec": lambda: ags1.decrypt_into(blob, out, gkey, aad, threads=threads),
            "crypto_naive_enc": lambda: base.naive_encrypt(plain, threads),
            "crypto_naive_dec": lambda: base.naive_decrypt(blob, threads),
            "crypto_into_enc": lambda: base.into_encrypt(plain, blob, threads),
            "crypto_into_dec": lambda: base.into_decrypt(blob, out, threads),
            "memcpy": lambda: out.__setitem__(slice(None), plain),
        }
        r = {"case": label, "threads": threads, "openssl_enc": openssl_speed(bits, threads)}
        r.update(interleaved(variants, size, repeat))
        rows.append(r)
    gkey = None


def small_files(count: int, size: int) -> dict:
    """Encrypt then decrypt ``count`` files of ``size`` bytes, each under its own key."""
    keys = [os.urandom(16) for _ in range(count)]
    aads = [os.urandom(16) for _ in range(count)]
    plain = memoryview(os.urandom(size))
    blob = memoryview(bytearray(ags1.ciphertext_length(size)))
    out = memoryview(bytearray(size))

    def ours():
        for k, a in zip(keys, aads):
            n = ags1.encrypt_into(plain, blob, k, a)
            ags1.decrypt_into(blob[:n], out, k, a)

    def careful():
        for k, a in zip(keys, aads):
            g = AESGCM(k)
            nonce = os.urandom(12)
            blob[:8] = ags1.HEADER
            blob[8:20] = nonce
            g.encrypt_into(nonce, plain, a + b"\0\0\0\0", blob[20 : 20 + size + 16])
            g.decrypt_into(blob[8:20], blob[20 : 20 + size + 16], a + b"\0\0\0\0", out)

    result = {"files": count, "file_size": size}
    for name, fn in (("icecrypt", ours), ("crypto_into", careful)):
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        result[f"{name}_files_per_s"] = count / statistics.median(times)
    return result


def make_file(path: str, size: int) -> None:
    chunk = os.urandom(8 * BS)
    with open(path, "wb") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(chunk[: size % len(chunk)])


def file_to_file(directory: str, size: int) -> dict:
    """Encrypt and decrypt a file against a plain copy of it, all in the page cache.

    Every round writes a new file (the previous output is removed first), as the atomic
    writer always does, and two warm-up rounds come first: this VM's never-touched
    memory costs ~0.45 GB/s on first touch, which would otherwise decide the result.
    """
    src = os.path.join(directory, "plain.bin")
    enc = os.path.join(directory, "enc.ags1")
    dec = os.path.join(directory, "dec.bin")
    cpy = os.path.join(directory, "copy.bin")
    make_file(src, size)
    key, aad = os.urandom(16), os.urandom(16)
    buf = memoryview(bytearray(4 * BS))  # a few blocks: read, sealed and written while in cache

    def fresh(path):
        if os.path.exists(path):
            os.unlink(path)
        return path

    def plain_copy():
        shutil.copyfile(src, fresh(cpy))  # in-kernel copy (copy_file_range/sendfile)

    def encrypt():
        with open(src, "rb", buffering=0) as f, ags1.open_writer(fresh(enc), key, aad, fsync=False) as w:
            while n := f.readinto(buf):
                w.write(buf[:n])

    def decrypt():
        with ags1.open_reader(enc, key, aad) as r, open(fresh(dec), "wb", buffering=0) as g:
            while n := r.readinto(buf):
                g.write(buf[:n])

    result = {"file_size": size, "directory_fs": "tmpfs" if directory.startswith("/dev/shm") else "disk"}
    steps = (("copy", plain_copy), ("encrypt", encrypt), ("decrypt", decrypt))
    times: dict[str, list[float]] = {name: [] for name, _ in steps}
    for rnd in range(5):
        for name, fn in steps:  # interleaved, so drift hits all three alike
            t0 = time.perf_counter()
            fn()
            if rnd >= 2:
                times[name].append(time.perf_counter() - t0)
    for name, _ in steps:
        result[f"{name}_gbps"] = size / statistics.median(times[name]) / 1e9
    for p in (src, enc, dec, cpy):
        os.unlink(p)
    return result


def _peak_rss_kib() -> int:
    # VmHWM belongs to this address space; ru_maxrss would carry the parent's peak
    # across fork + exec.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _rss_child(path: str, size: int) -> None:
    """Runs in a child process: peak RSS growth while streaming ``size`` bytes."""
    key, aad = os.urandom(16), os.urandom(16)
    chunk = memoryview(os.urandom(4 * BS))
    buf = memoryview(bytearray(4 * BS))
    buf[:] = chunk
    base = _peak_rss_kib()
    with ags1.open_writer(path, key, aad, fsync=False) as w:
        for _ in range(size // len(chunk)):
            w.write(chunk)
    after_write = _peak_rss_kib()
    with ags1.open_reader(path, key, aad) as r:
        while r.readinto(buf):
            pass
    after_read = _peak_rss_kib()
    os.unlink(path)
    print(json.dumps({"stream_size": size, "rss_growth_write_mib": (after_write - base) / 1024,
                      "rss_growth_read_mib": (after_read - base) / 1024}))


def streaming_rss(directory: str, size: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", os.path.join(directory, "stream.ags1"), str(size)],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


def fmt(x):
    return "   -  " if x is None else f"{x:6.2f}"


def report(results: dict) -> str:
    lines = [
        f"icecrypt {icecrypt.__version__}, {icecrypt.openssl_version()} ({_gcm.OPENSSL_LINKAGE}), {CORES} cores",
        "",
        "GB/s of plaintext (median)                 enc: icecrypt openssl crypto-naive crypto-into | "
        "dec: icecrypt crypto-naive crypto-into | memcpy",
    ]
    for r in results["bulk"]:
        lines.append(
            f"{r['case']:<28} {r['threads']} thr  {fmt(r['icecrypt_enc'])}   {fmt(r['openssl_enc'])}    "
            f"{fmt(r['crypto_naive_enc'])}     {fmt(r['crypto_into_enc'])}   |     {fmt(r['icecrypt_dec'])}    "
            f"{fmt(r['crypto_naive_dec'])}      {fmt(r['crypto_into_dec'])}   | {fmt(r['memcpy'])}"
        )
    s = results["small_files"]
    lines += [
        "",
        f"{s['files']} files of {s['file_size'] // 1024} KiB, encrypt+decrypt, fresh key each: "
        f"icecrypt {s['icecrypt_files_per_s']:,.0f} files/s, cryptography encrypt_into "
        f"{s['crypto_into_files_per_s']:,.0f} files/s "
        f"(x{s['icecrypt_files_per_s'] / s['crypto_into_files_per_s']:.2f})",
    ]
    f = results["file_to_file"]
    lines.append(
        f"file to file {f['file_size'] >> 20} MiB ({f['directory_fs']}, page cache): copy {f['copy_gbps']:.2f} GB/s, "
        f"encrypt {f['encrypt_gbps']:.2f} (x{f['encrypt_gbps'] / f['copy_gbps']:.2f}), "
        f"decrypt {f['decrypt_gbps']:.2f} (x{f['decrypt_gbps'] / f['copy_gbps']:.2f})"
    )
    m = results["streaming_rss"]
    lines.append(
        f"streaming {m['stream_size'] >> 20} MiB: peak RSS growth {m['rss_growth_write_mib']:.1f} MiB writing, "
        f"{m['rss_growth_read_mib']:.1f} MiB reading"
    )
    lines += ["", "ratios against the targets of issue 2:"]
    for r in results["bulk"]:
        t = f"{r['case']}, {r['threads']} thr"
        if "cache" in r["case"] and r["threads"] == 1 and r["openssl_enc"]:
            lines.append(f"  {t}: enc/openssl {r['icecrypt_enc'] / r['openssl_enc']:.2f} (target >= 0.85)")
        if "memory" in r["case"] and r["threads"] == 1:
            lines.append(
                f"  {t}: enc/(d) {r['icecrypt_enc'] / r['crypto_into_enc']:.2f} dec/(d) "
                f"{r['icecrypt_dec'] / r['crypto_into_dec']:.2f} (>= 0.95); enc/(c) "
                f"{r['icecrypt_enc'] / r['crypto_naive_enc']:.1f} dec/(c) {r['icecrypt_dec'] / r['crypto_naive_dec']:.1f} (>= 5)"
            )
        if "memory" in r["case"] and r["threads"] > 1:
            lines.append(
                f"  {t}: enc/memcpy {r['icecrypt_enc'] / r['memcpy']:.2f} dec/memcpy "
                f"{r['icecrypt_dec'] / r['memcpy']:.2f} (>= 0.8)"
            )
    cache = {(r["case"], r["threads"]): r for r in results["bulk"] if "cache" in r["case"]}
    for (case, threads), r in cache.items():
        if threads > 1:
            one = cache[(case, 1)]
            lines.append(
                f"  {case}: {threads} cores / 1 core enc {r['icecrypt_enc'] / one['icecrypt_enc']:.2f} "
                f"dec {r['icecrypt_dec'] / one['icecrypt_dec']:.2f} (>= 1.6)"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--rss-child":
        _rss_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run, not for figures)")
    parser.add_argument("--dir", default=None, help="directory for the file benchmarks (default: a temp dir)")
    args = parser.parse_args()
    big = 32 * BS if args.quick else 256 * BS
    results: dict = {"openssl": icecrypt.openssl_version(), "linkage": _gcm.OPENSSL_LINKAGE, "cores": CORES, "bulk": []}
    for bits in (128, 256):
        bulk(8 * BS, bits, 30 if not args.quick else 5, results["bulk"])
        bulk(big, bits, 5 if not args.quick else 2, results["bulk"])
    results["small_files"] = small_files(1000 if args.quick else 10000, 8192)
    # Files in the page cache without disk writeback in the way: tmpfs when there is one.
    default_dir = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=args.dir or default_dir) as d:
        results["file_to_file"] = file_to_file(d, (64 if args.quick else 1024) * BS)
        results["streaming_rss"] = streaming_rss(d, (128 if args.quick else 2048) * BS)
    print(json.dumps(results, indent=2) if args.json else report(results))


if __name__ == "__main__":
    main()
