"""icecrypt._gcm built two ways (e.g. version-specific vs. limited API / abi3), measured
interleaved in one run.

    python bench_abi3.py --variant regular=/path/to/regular/src --variant abi3=/path/to/abi3/src \
        [--variant NAME=SRC ...] [--rounds 25] [--json results.json]

Every round starts one fresh worker process per variant (``PYTHONPATH=<src>``, so each
imports its own icecrypt._gcm; the worker prints the module file it loaded), and then
runs the cases one at a time, alternating the variants case by case (the order flips
from case to case and round to round), so the drift of a shared, noisy machine hits all
variants alike.  A worker times each case several times after one warm-up call and
reports the median; the table gives, per case, the median over rounds, the min/max over
rounds, the ratio of the medians, and the median (min/max) of the per-round ratios
(each variant / the first, a higher-is-better metric in every row but "key
creation", where the unit is microseconds and lower is better).

Cases (GB/s = 10^9 plaintext bytes/s; buffers prefaulted and reused; ``GcmKey`` reused):
  enc/dec 8 MiB in cache, AES-128 and AES-256, 1 and 2 threads   ags1.encrypt_into/decrypt_into
  enc/dec 256 MiB in memory, AES-128, 1 thread                  ags1.encrypt_into/decrypt_into
  10,000 files of 8 KiB, fresh key (bytes) each, enc+dec          files/s (per-call overhead)
  Ags1Reader.read_at, 4 KiB at random offsets of a 64 MiB stream  calls/s
  GcmKey creation (AES-128, from bytes; includes its dealloc)     microseconds
  extra: 64-byte encrypt_into+decrypt_into with a reused GcmKey   calls/s (pure call overhead)
  extra: GcmKey.seal + GcmKey.open of 64 bytes (fresh bytes out)  calls/s
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

MiB = 1 << 20


# --------------------------------------------------------------------------- worker


def _prefaulted(n: int) -> memoryview:
    buf = bytearray(n)
    buf[:] = b"\x5a" * n
    return memoryview(buf)


def _median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Worker:
    def __init__(self) -> None:
        from icecrypt import _gcm, ags1

        self.gcm, self.ags1 = _gcm, ags1
        self.bulk = {}
        for size in (8 * MiB, 256 * MiB):
            self.bulk[size] = (_prefaulted(size), _prefaulted(ags1.ciphertext_length(size)), _prefaulted(size))
        self.keys = {bits: _gcm.GcmKey(os.urandom(bits // 8)) for bits in (128, 256)}
        self.aad = os.urandom(16)
        # 64 MiB AGS1 stream in memory, for read_at.
        plain = os.urandom(64 * MiB)
        self.stream_key = os.urandom(16)
        self.stream = ags1.encrypt(plain, self.stream_key, self.aad)
        self.reader = ags1.Ags1Reader(self.stream, self.stream_key, self.aad, threads=1)
        self.stream_size = len(plain)
        del plain

    def gbps(self, op: str, size: int, bits: int, threads: int) -> float:
        plain, blob, out = self.bulk[size]
        key, aad, ags1 = self.keys[bits], self.aad, self.ags1
        ags1.encrypt_into(plain, blob, key, aad, threads=threads)
        if op == "enc":
            fn = lambda: ags1.encrypt_into(plain, blob, key, aad, threads=threads)  # noqa: E731
        else:
            fn = lambda: ags1.decrypt_into(blob, out, key, aad, threads=threads)  # noqa: E731
        reps = 40 if size <= 8 * MiB else 5
        return size / _median_time(fn, reps) / 1e9

    def small_files(self, count: int = 10000, size: int = 8192) -> float:
        ags1 = self.ags1
        keys = [os.urandom(16) for _ in range(count)]
        aads = [os.urandom(16) for _ in range(count)]
        plain = memoryview(os.urandom(size))
        blob = memoryview(bytearray(ags1.ciphertext_length(size)))
        out = memoryview(bytearray(size))

        def run():
            for k, a in zip(keys, aads):
                n = ags1.encrypt_into(plain, blob, k, a)
                ags1.decrypt_into(blob[:n], out, k, a)

        return count / _median_time(run, 3)

    def read_at(self, seed: int, calls: int = 1500) -> float:
        rng = random.Random(seed)
        offsets = [rng.randrange(0, self.stream_size - 4096) for _ in range(calls)]
        reader = self.reader

        def run():
            for off in offsets:
                reader.read_at(off, 4096)

        return calls / _median_time(run, 3)

    def key_creation(self, count: int = 10000) -> float:
        GcmKey = self.gcm.GcmKey
        keys = [os.urandom(16) for _ in range(count)]

        def run():
            for k in keys:
                GcmKey(k)

        return _median_time(run, 5) / count * 1e6

    def tiny_calls(self, count: int = 20000) -> float:
        ags1, key, aad = self.ags1, self.keys[128], self.aad
        plain = memoryview(os.urandom(64))
        blob = memoryview(bytearray(ags1.ciphertext_length(64)))
        out = memoryview(bytearray(64))

        def run():
            for _ in range(count):
                ags1.encrypt_into(plain, blob, key, aad)
                ags1.decrypt_into(blob, out, key, aad)

        return count / _median_time(run, 3)

    def seal_open(self, count: int = 20000) -> float:
        key, aad = self.keys[128], self.aad
        plain = os.urandom(64)

        def run():
            for _ in range(count):
                key.open(key.seal(plain, aad), aad)

        return count / _median_time(run, 3)

    def run(self, case: str, seed: int) -> float:
        name, *args = case.split(":")
        if name == "gbps":
            op, size, bits, threads = args
            return self.gbps(op, int(size), int(bits), int(threads))
        if name == "read_at":
            return self.read_at(seed)
        return getattr(self, name)()


def worker_main() -> None:
    w = Worker()
    print(json.dumps({"ready": w.gcm.__file__, "openssl": w.gcm.openssl_version()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        print(json.dumps({"value": w.run(cmd["case"], cmd["seed"])}), flush=True)


# --------------------------------------------------------------------------- driver

CASES = [
    # (case id, label, unit, higher is better)
    *[
        (f"gbps:{op}:{8 * MiB}:{bits}:{thr}", f"8 MiB in cache, AES-{bits}, {thr} thr, {op}", "GB/s", True)
        for bits in (128, 256)
        for thr in (1, 2)
        for op in ("enc", "dec")
    ],
    (f"gbps:enc:{256 * MiB}:128:1", "256 MiB in memory, AES-128, 1 thr, enc", "GB/s", True),
    (f"gbps:dec:{256 * MiB}:128:1", "256 MiB in memory, AES-128, 1 thr, dec", "GB/s", True),
    ("small_files", "10,000 files of 8 KiB, fresh key, enc+dec", "files/s", True),
    ("read_at", "Ags1Reader.read_at 4 KiB, random offsets, 64 MiB", "calls/s", True),
    ("key_creation", "GcmKey creation (AES-128, from bytes)", "us", False),
    ("tiny_calls", "extra: 64 B encrypt_into+decrypt_into, reused key", "pairs/s", True),
    ("seal_open", "extra: GcmKey.seal+open of 64 B", "pairs/s", True),
]


class Proc:
    def __init__(self, name: str, src: str):
        env = dict(os.environ, PYTHONPATH=src)
        env.pop("ICECRYPT_THREADS", None)
        self.name = name
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.p.stdout.readline())
        self.module = hello["ready"]
        self.openssl = hello["openssl"]
        if not os.path.realpath(self.module).startswith(os.path.realpath(src) + os.sep):
            raise SystemExit(f"{name}: imported {self.module}, not from {src}")

    def run(self, case: str, seed: int) -> float:
        self.p.stdin.write(json.dumps({"case": case, "seed": seed}) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())["value"]

    def close(self) -> None:
        self.p.stdin.write(json.dumps({"quit": True}) + "\n")
        self.p.stdin.close()
        self.p.wait()


def fmt(x: float, unit: str) -> str:
    if unit == "GB/s":
        return f"{x:.2f}"
    if unit == "us":
        return f"{x:.3f}"
    return f"{x:,.0f}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=SRC_DIR (two of them)")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--json", default=None, help="also write the raw per-round figures here")
    args = parser.parse_args()
    variants = [v.split("=", 1) for v in args.variant]
    if len(variants) < 2:
        raise SystemExit("give at least two --variant NAME=SRC (the first is the baseline)")
    names = [name for name, _ in variants]
    base = names[0]
    raw = {name: {c[0]: [] for c in CASES} for name in names}
    modules = {}
    t_start = time.time()
    for rnd in range(args.rounds):
        procs = [Proc(name, src) for name, src in variants]
        for p in procs:
            modules[p.name] = (p.module, p.openssl)
        for i, (case, *_rest) in enumerate(CASES):
            order = procs if (rnd + i) % 2 == 0 else procs[::-1]
            for p in order:
                raw[p.name][case].append(p.run(case, seed=rnd))
        for p in procs:
            p.close()
        print(f"round {rnd + 1}/{args.rounds} done ({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)

    lines = [f"{name}: {mod} ({ossl})" for name, (mod, ossl) in modules.items()]
    lines.append(f"{args.rounds} rounds, variants alternated case by case; "
                 f"cpus {len(os.sched_getaffinity(0))}, python {sys.version.split()[0]}")
    lines.append("")
    hdr = f"{'case':<52} {'unit':>7}"
    for name in names:
        hdr += f" | {name + ' median':>16} {'[min - max]':>24}"
    for name in names[1:]:
        hdr += f" | {name + '/' + base:>14} {'paired: median [min - max]':>29}"
    lines.append(hdr)
    lines.append("-" * len(hdr))
    summary = []
    for case, label, unit, higher in CASES:
        row = f"{label:<52} {unit:>7}"
        entry = {"case": case, "label": label, "unit": unit, "higher_is_better": higher}
        meds = {}
        for name in names:
            v = raw[name][case]
            meds[name] = statistics.median(v)
            row += f" | {fmt(meds[name], unit):>16} {'[' + fmt(min(v), unit) + ' - ' + fmt(max(v), unit) + ']':>24}"
            entry[name] = v
            entry["median_" + name] = meds[name]
        for name in names[1:]:
            paired = [y / x for x, y in zip(raw[base][case], raw[name][case])]
            pm = statistics.median(paired)
            row += f" | {meds[name] / meds[base]:14.3f} {pm:9.3f} [{min(paired):.3f} - {max(paired):.3f}]"
            entry[f"ratio_of_medians_{name}"] = meds[name] / meds[base]
            entry[f"paired_ratio_{name}"] = {"median": pm, "min": min(paired), "max": max(paired)}
        lines.append(row)
        summary.append(entry)
    lines.append("")
    lines.append(f"ratio = variant/{base} of the metric: above 1 means the variant is faster, except in the "
                 "'us' row (key creation time), where above 1 means it is slower.  'paired' = the ratio "
                 "within each round (same moment, same machine state), median and min/max over rounds.")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "modules": modules, "cases": summary}, f, indent=1)


if __name__ == "__main__":
    main()
