"""No public function takes a nonce or random-source override (issue 16, item 11): the
hooks that reproduce Java's bytes in tests are attributes set after construction, which
no caller passing arguments (options, metadata, a wrapper's kwargs) can reach."""

from __future__ import annotations

import inspect
import io

import pytest

from icecrypt import ags1
from icecrypt.keys import EncryptionManager, StandardKeyMetadata, wrap_key_metadata
from icecrypt.kms.memory import MemoryKms

HOOKS = {"_nonce", "_nonces", "_random"}


@pytest.mark.parametrize("function", [ags1.encrypt, ags1.encrypt_into, ags1.Ags1Writer.__init__,
                                      wrap_key_metadata, EncryptionManager.__init__])
def test_public_signatures_have_no_test_hooks(function):
    assert not HOOKS & set(inspect.signature(function).parameters)


def test_hooks_passed_as_keywords_are_refused():
    kms = MemoryKms.with_iceberg_test_keys()
    fixed = bytes(12)
    with pytest.raises(TypeError):
        EncryptionManager(kms, "keyA", _nonce=lambda: fixed)
    with pytest.raises(TypeError):
        EncryptionManager(kms, "keyA", _random=lambda n: bytes(n))
    with pytest.raises(TypeError):
        wrap_key_metadata(bytes(16), "1", StandardKeyMetadata(bytes(16)), _nonce=fixed)
    with pytest.raises(TypeError):
        ags1.encrypt(b"x", bytes(16), _nonces=lambda first, count: fixed * count)
    with pytest.raises(TypeError):
        ags1.Ags1Writer(io.BytesIO(), bytes(16), _nonces=lambda first, count: fixed * count)
    # and the default nonces are fresh: two wraps of the same key metadata differ
    km = StandardKeyMetadata(bytes(16))
    assert wrap_key_metadata(bytes(16), "1", km) != wrap_key_metadata(bytes(16), "1", km)
