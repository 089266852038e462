"""Small test doubles shared by the key tests (real objects, no behaviour mocked)."""

from __future__ import annotations

import threading

from vectorlib import hash_stream

from icecrypt.kms.memory import MemoryKms


class Clock:
    """A settable millisecond clock."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now

    def advance_days(self, days: float) -> None:
        self.now += int(days * 24 * 3600 * 1000)


class SeededRandom:
    """The vectors' SecureRandom: successive draws from SHA256(seed || u64le(i)) || ..."""

    def __init__(self, seed: bytes) -> None:
        self._seed = seed
        self._used = 0

    def __call__(self, n: int) -> bytes:
        out = hash_stream(self._seed, self._used + n)[self._used :]
        self._used += n
        return out


class CountingKms(MemoryKms):
    """A real MemoryKms that counts wrap/unwrap calls (and can slow unwraps down)."""

    def __init__(self, *args, unwrap_delay: threading.Event | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.wraps = 0
        self.unwraps = 0
        self._count_lock = threading.Lock()
        self._gate = unwrap_delay

    def wrap_key(self, key, wrapping_key_id):
        with self._count_lock:
            self.wraps += 1
        return super().wrap_key(key, wrapping_key_id)

    def unwrap_key(self, wrapped_key, wrapping_key_id):
        with self._count_lock:
            self.unwraps += 1
        if self._gate is not None:
            self._gate.wait(10)
        return super().unwrap_key(wrapped_key, wrapping_key_id)
