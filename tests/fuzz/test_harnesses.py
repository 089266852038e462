"""Every fuzz harness's one-input function over its seeds and deterministic mutations
(no atheris needed), and proof that each part of the oracle can fail.

This keeps the harnesses and their oracles working between fuzz runs (``make fuzz``):
a harness that breaks (a seed path moved, an API changed) or an oracle that stops
catching anything fails here, in ``make test``.  No time bounds are asserted: the
per-input bound is only checked on a decoder that never returns.
"""

from __future__ import annotations

import zlib

import pytest

import fuzzlib
from fuzzlib import Finding, Hang, one_input, run_harness

from icecrypt import FormatError

MUTANTS = 150  # per harness; a few seconds in total


@pytest.mark.slow
@pytest.mark.parametrize("name", fuzzlib.HARNESSES)
def test_harness_seeds_and_mutants(name):
    harness = fuzzlib.load(name)
    assert harness.__doc__ and "Oracle" in harness.__doc__, "each harness states its oracle"
    seeds = harness.seeds()
    assert seeds, f"{name}: no seeds"
    outcomes = [run_harness(harness, data) for data in seeds]
    assert "ok" in outcomes, f"{name}: no seed decodes cleanly: {outcomes}"
    for data in fuzzlib.mutations(seeds, MUTANTS, seed=zlib.crc32(name.encode())):
        run_harness(harness, data)  # raises Finding on an oracle failure


def test_every_harness_module_is_listed():
    found = sorted(p.stem.removeprefix("fuzz_") for p in fuzzlib.HERE.glob("fuzz_*.py"))
    assert found == sorted(fuzzlib.HARNESSES)


# --- the oracle can fail -----------------------------------------------------------------------


def test_oracle_refuses_an_undocumented_exception():
    def wrong_decoder(data: bytes) -> None:
        {}[data]  # a KeyError: not a documented error

    with pytest.raises(Finding, match="KeyError"):
        one_input(wrong_decoder, (FormatError,), b"x")


def test_oracle_accepts_a_documented_exception():
    def strict_decoder(data: bytes) -> None:
        raise FormatError("bad")

    assert one_input(strict_decoder, (FormatError,), b"x") == "FormatError"


def test_oracle_refuses_a_hang():
    def spinning_decoder(data: bytes) -> None:
        while True:
            pass

    with pytest.raises(Hang):
        one_input(spinning_decoder, (FormatError,), b"x", timeout=0.2)


def test_oracle_refuses_a_hang_that_catches_exceptions():
    def stubborn_decoder(data: bytes) -> None:
        while True:
            try:
                sum(range(1000))
            except Exception:  # noqa: BLE001 - what a careless decoder does
                pass

    with pytest.raises(Hang):
        one_input(stubborn_decoder, (FormatError,), b"x", timeout=0.2)


def test_ags1_oracle_refuses_unauthenticated_output(monkeypatch):
    """A "decrypt" that releases bytes no key sealed is caught."""
    harness = fuzzlib.load("ags1")
    from icecrypt import ags1

    seed = harness.seeds()[0]
    monkeypatch.setattr(ags1, "decrypt", lambda ct, key, aad=None, length=None, **kw: b"forged plaintext")
    with pytest.raises(Finding, match="unauthenticated"):
        run_harness(harness, seed)


def test_ags1_oracle_refuses_output_under_the_foreign_key(monkeypatch):
    harness = fuzzlib.load("ags1")
    pairs = harness.pairs()
    real = pairs[0]
    ct = real.ciphertexts[2]
    plain = max(real.blocks[0], key=len)
    monkeypatch.setattr(harness.ags1, "decrypt", lambda *a, **kw: plain)
    with pytest.raises(Finding, match="foreign"):
        run_harness(harness, harness.encode(len(pairs) - 1, 1, 0, [], ct))


@pytest.mark.parametrize("name", ["encryption_keys", "table_metadata", "key_manifest", "kms_wrapped"])
def test_unwrap_oracles_refuse_keys_no_seed_holds(name, monkeypatch):
    """Each key-unwrapping harness fails when the unwrapped value is not authentic."""
    harness = fuzzlib.load(name)
    if name == "kms_wrapped":
        inputs = harness._material()[0]
        monkeypatch.setattr(harness, "_material", lambda: (inputs, {}))
        seed = inputs[0]
    elif name == "key_manifest":
        inputs = harness._seeds()[0]
        monkeypatch.setattr(harness, "_seeds", lambda: (inputs, ({"other": 1},)))
        seed = inputs[2]
    else:
        monkeypatch.setattr(harness, "authentic", lambda: frozenset())
        seed = harness.seeds()[-2 if name == "table_metadata" else 0]
    with pytest.raises(Finding):
        run_harness(harness, seed)


def test_puffin_oracle_refuses_unsorted_positions():
    import numpy as np

    harness = fuzzlib.load("puffin")
    with pytest.raises(Finding, match="increasing"):
        harness._check_vector(np.array([5, 3], dtype=np.int64), None, "wrong decoder")


def test_manifest_oracle_refuses_a_manifest_without_key_metadata(monkeypatch):
    harness = fuzzlib.load("manifests")
    from icecrypt.table.files import manifest as _manifest

    seed = harness.seeds()[0]  # (built from Java's tables, which needs the real key metadata)
    real = _manifest.file_key_metadata
    monkeypatch.setattr(_manifest, "file_key_metadata", lambda *a, **kw: None)
    with pytest.raises(Finding, match="without key metadata"):
        run_harness(harness, seed)
    monkeypatch.setattr(_manifest, "file_key_metadata", real)
    assert run_harness(harness, seed) == "ok"
