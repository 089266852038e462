"""Build of the native core (src/icecrypt/_native/gcm.c + the Cython module _gcm).

OpenSSL selection (see README "Building"):
  default                    the pinned OpenSSL 3.5 LTS, built once by
                             scripts/build-openssl.sh into a cache outside the
                             repository and linked statically with hidden symbols
  ICECRYPT_OPENSSL_DIR=P     link the OpenSSL installed under prefix P (statically if
                             P/lib/libcrypto.a exists and ICECRYPT_OPENSSL != system)
  ICECRYPT_OPENSSL=system    link the system libcrypto dynamically
"""

import os
import subprocess
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _c_string(value):
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _hide_static_symbols():
    """Linker flags that keep the static OpenSSL's symbols out of the module's dynamic symbol
    table (it must share processes with pyarrow's and the system's OpenSSL): the module
    exports only its init function."""
    if sys.platform == "darwin":
        return ["-Wl,-exported_symbol,_PyInit__gcm"]
    return ["-Wl,--exclude-libs,ALL"]


def openssl_options():
    mode = os.environ.get("ICECRYPT_OPENSSL", "static").strip().lower()
    if mode not in ("static", "system"):
        raise SystemExit(f"ICECRYPT_OPENSSL must be 'static' or 'system', not {mode!r}")
    prefix = os.environ.get("ICECRYPT_OPENSSL_DIR", "").strip()
    if mode == "system" and not prefix:
        return {"libraries": ["crypto"], "define_macros": [("ICECRYPT_OPENSSL_LINKAGE", _c_string("system"))]}
    if not prefix:
        script = os.path.join(ROOT, "scripts", "build-openssl.sh")
        out = subprocess.run(["bash", script], check=True, stdout=subprocess.PIPE, text=True).stdout
        prefix = out.strip().splitlines()[-1]
    libdir = next((os.path.join(prefix, d) for d in ("lib", "lib64") if os.path.isdir(os.path.join(prefix, d))), None)
    if libdir is None:
        raise SystemExit(f"no lib/ or lib64/ under OpenSSL prefix {prefix}")
    options = {"include_dirs": [os.path.join(prefix, "include")]}
    archive = os.path.join(libdir, "libcrypto.a")
    if mode == "static" and os.path.exists(archive):
        options.update(
            extra_objects=[archive],
            # Keep OpenSSL's symbols out of the module's dynamic symbol table, so it can
            # share a process with pyarrow's and the system's OpenSSL.
            extra_link_args=_hide_static_symbols(),
            libraries=["pthread", "dl"],
            define_macros=[("ICECRYPT_OPENSSL_LINKAGE", _c_string("static")), ("ICECRYPT_OPENSSL_PREFIX", _c_string(prefix))],
        )
    else:
        options.update(
            library_dirs=[libdir],
            runtime_library_dirs=[libdir],
            libraries=["crypto"],
            define_macros=[("ICECRYPT_OPENSSL_LINKAGE", _c_string("system")), ("ICECRYPT_OPENSSL_PREFIX", _c_string(prefix))],
        )
    return options


def extensions():
    options = openssl_options()
    include_dirs = [os.path.join(ROOT, "include")] + options.pop("include_dirs", [])
    ext = Extension(
        "icecrypt._gcm",
        sources=["src/icecrypt/_gcm.pyx", "src/icecrypt/_native/gcm.c"],
        include_dirs=include_dirs,
        extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"],
        **options,
    )
    return cythonize([ext], compiler_directives={"language_level": "3"})


setup(ext_modules=extensions())
