"""Run one fuzz harness under atheris (libFuzzer): ``python run.py NAME [libFuzzer args]``.

icecrypt is imported inside ``atheris.instrument_imports`` so its Python code gets
coverage feedback (the native module is instrumented only in a clang
``-fsanitize=fuzzer-no-link`` build; see scripts/fuzz.sh).  The harness's seeds are
written into the first corpus directory given (a temporary one: the shared vectors are
never written to).  Environment: ``ICECRYPT_FUZZ_TIMEOUT`` (seconds per input, default
10) is the time bound the oracle checks.
"""

from __future__ import annotations

import hashlib
import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["icecrypt"]):
    import fuzzlib

    name = sys.argv[1]
    harness = fuzzlib.load(name)
    seeds = harness.seeds()
    import icecrypt  # noqa: F401

TIMEOUT = float(os.environ.get("ICECRYPT_FUZZ_TIMEOUT", "10"))


def test_one_input(data: bytes) -> None:
    fuzzlib.run_harness(harness, data, timeout=TIMEOUT)


def main() -> None:
    args = [sys.argv[0]] + sys.argv[2:]
    corpus = next((a for a in args[1:] if not a.startswith("-")), None)
    if corpus:
        os.makedirs(corpus, exist_ok=True)
        for seed in seeds:
            with open(os.path.join(corpus, "seed-" + hashlib.sha1(seed).hexdigest()), "wb") as f:
                f.write(seed)
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
