"""A private SoftHSM2 token store for tests and benchmarks.

SoftHSM2 reads the file named by ``SOFTHSM2_CONF`` once, when the library is initialized
(the first ``pkcs11.lib(...)`` in the process), so :func:`softhsm_tokens` writes a private
configuration and token directory, initializes the tokens with ``softhsm2-util`` and sets
``SOFTHSM2_CONF`` in this process before anything loads the module.  Nothing here runs in
the background: there is no process to stop, only a directory to delete.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODULE_CANDIDATES", "SoftHsmToken", "find_softhsm_module", "softhsm_tokens"]

#: where distributions install the SoftHSM2 PKCS#11 module
MODULE_CANDIDATES = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/local/lib/softhsm/libsofthsm2.so",
    "/usr/lib64/pkcs11/libsofthsm2.so",
    "/opt/homebrew/lib/softhsm/libsofthsm2.so",
)


def find_softhsm_module() -> Path | None:
    """The SoftHSM2 module (``$SOFTHSM2_MODULE`` first), or None when it is not installed.

    The path is resolved: python-pkcs11 caches modules by path string, and loading one
    module under two names (a symlink) initializes it twice, which fails.
    """
    candidates = [os.environ.get("SOFTHSM2_MODULE", ""), *MODULE_CANDIDATES]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    return None


@dataclass(frozen=True)
class SoftHsmToken:
    """An initialized token: where its module is and how to log in."""

    module: Path
    conf: Path
    label: str
    pin: str
    so_pin: str

    def properties(self, **extra: str) -> dict[str, str]:
        """``encryption.kms-type=pkcs11`` client properties for this token."""
        props = {
            "encryption.kms-type": "pkcs11",
            "pkcs11.module": str(self.module),
            "pkcs11.token-label": self.label,
            "pkcs11.pin": self.pin,
        }
        props.update(extra)
        return props


def softhsm_tokens(
    directory: Path,
    labels: list[str],
    pin: str = "icecrypt-user-pin-4711",
    so_pin: str = "icecrypt-so-pin-0815",
) -> list[SoftHsmToken]:
    """Initialize one token per label in a private store under ``directory``.

    Sets ``SOFTHSM2_CONF`` in ``os.environ`` (SoftHSM2 reads it on first load; a process
    can use only one configuration).  Raises ``RuntimeError`` when SoftHSM2 is missing.
    """
    module = find_softhsm_module()
    util = shutil.which("softhsm2-util")
    if module is None or util is None:
        raise RuntimeError("SoftHSM2 is not installed (apt-get install softhsm2)")
    tokens_dir = directory / "tokens"
    tokens_dir.mkdir(parents=True, exist_ok=True)
    conf = directory / "softhsm2.conf"
    conf.write_text(
        textwrap.dedent(
            f"""\
            directories.tokendir = {tokens_dir}
            objectstore.backend = file
            log.level = ERROR
            slots.removable = false
            slots.mechanisms = ALL
            library.reset_on_fork = false
            """
        )
    )
    env = {**os.environ, "SOFTHSM2_CONF": str(conf)}
    for label in labels:
        subprocess.run(
            [util, "--init-token", "--free", "--label", label, "--pin", pin, "--so-pin", so_pin],
            env=env,
            check=True,
            capture_output=True,
            timeout=30,
        )
    os.environ["SOFTHSM2_CONF"] = str(conf)
    return [SoftHsmToken(module, conf, label, pin, so_pin) for label in labels]
