"""A KMS that fails or hangs (until its timeout) at the Nth wrap/unwrap of a commit, a
read and a rotation: a clear KmsError, and nothing committed half."""

from __future__ import annotations

import pytest
from faultkms import FailingKms, SilentServer
from faultlib import MASTER, MASTER2, TABLE, digest, rows, version

from icecrypt.errors import KmsError, KmsUnavailableError
from icecrypt.table import EncryptedTable


@pytest.fixture(scope="module")
def silent():
    server = SilentServer()
    yield server
    server.close()


def _load(world, root, kms):
    from faultfs import failing_filesystem

    fs, _ = failing_filesystem(root)
    return EncryptedTable.load(TABLE, kms=kms, filesystem=fs)


def _fresh_empty(world, name):
    """A new encrypted table with no snapshot (its first append creates the first KEK)."""
    import os

    from faultfs import failing_filesystem

    root = os.path.join(world.base, name)
    os.makedirs(root)
    fs, _ = failing_filesystem(root)
    EncryptedTable.create(TABLE, rows(0, 1).schema, kms=world.kms(), table_key_id=MASTER, filesystem=fs)
    return root


SCENARIOS = {
    # name: (fresh root, operation on a table loaded with the failing KMS, commits?)
    "append, first commit (new KEK wrapped)": (_fresh_empty, lambda t: t.append(rows(0, 5)), True),
    "append (current KEK unwrapped)": (lambda w, n: w.fresh(n), lambda t: t.append(rows(100, 5)), True),
    "append after rotate_keys(new KEK)": (None, lambda t: t.append(rows(100, 5)), True),
    "load + scan": (lambda w, n: w.fresh(n), lambda t: t.scan().to_arrow(), False),
    "rotate_keys(new master key)": (lambda w, n: w.fresh(n), lambda t: t.rotate_keys(new_master_key_id=MASTER2), True),
}


def _root_for(world, scenario, name):
    make = SCENARIOS[scenario][0]
    if make is None:  # a new KEK committed, not yet used: the append wraps with it
        root = world.fresh(name)
        _load(world, root, world.kms()).rotate_keys(new_kek=True)
        return root
    return make(world, name)


@pytest.mark.parametrize("mode", ["fail", "hang"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_kms_fault_at_every_call(world, silent, scenario, mode):
    _, op, commits = SCENARIOS[scenario]
    slug = "".join(c if c.isalnum() else "-" for c in scenario)
    # census: the KMS calls of loading the table and running the operation
    root = _root_for(world, scenario, f"kms-census-{mode}-{slug}")
    before = _load(world, root, world.kms())
    old_v, old_d = version(before), digest(before.scan().to_arrow())
    counting = FailingKms(world.kms())
    op(_load(world, root, counting))
    after = _load(world, root, world.kms())
    new_v, new_d = version(after), digest(after.scan().to_arrow())
    assert counting.calls, f"{scenario}: no KMS call"
    results = {}
    for n in range(1, len(counting.calls) + 1):
        root = _root_for(world, scenario, f"kms-{mode}-{slug}-{n}")
        kms = FailingKms(world.kms(), at=n, mode=mode, server=silent)
        with pytest.raises(KmsError) as info:
            op(_load(world, root, kms))
        assert kms.fired is not None
        # a clear error: the KMS's own class and message, naming what failed
        assert isinstance(info.value, KmsUnavailableError), repr(info.value)
        text = str(info.value)
        assert ("timed out" in text) if mode == "hang" else ("unavailable" in text), text
        # nothing committed half: old or new version, its rows, verify clean
        t = _load(world, root, world.kms())
        v = version(t)
        assert v in (old_v, new_v), f"call {n}: third state {v}"
        assert digest(t.scan().to_arrow()) == (old_d if v == old_v else new_d)
        assert t.verify().ok, str(t.verify())
        if commits:
            assert v == old_v, f"call {n}: the operation raised but committed"
            op(t)  # the retry, with the KMS back
            assert t.verify().ok
        results[kms.fired] = results.get(kms.fired, 0) + 1
    print(f"\nKMS [{mode}] {scenario}: {len(counting.calls)} calls {counting.calls}; failed at each: {results}")
