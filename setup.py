"""Build of the native core (src/icecrypt/_native/gcm.c + the Cython module _gcm).

OpenSSL selection (see README "Building"):
  default                    the pinned OpenSSL 3.5 LTS, built once by
                             scripts/build-openssl.sh into a cache outside the
                             repository and linked statically with hidden symbols
  ICECRYPT_OPENSSL_DIR=P     link the OpenSSL installed under prefix P (statically if
                             P/lib/libcrypto.a exists and ICECRYPT_OPENSSL != system)
  ICECRYPT_OPENSSL=system    link the system libcrypto dynamically

Stable ABI (opt-in): ICECRYPT_LIMITED_API=1 on CPython 3.11 and later builds the module
against the limited API (Py_LIMITED_API=0x030B0000, which also puts Cython in its
limited-API mode) as _gcm.abi3.so, and bdist_wheel tags the wheel cp311-abi3, which
installs on every CPython >= 3.11 (3.11 is the first limited API with Py_buffer and the
buffer slots of heap types).  It is off by default: measured interleaved, it costs 7-9 %
on the per-call path (10,000 files of 8 KiB) and 20-30 % on tiny calls, because Cython
drops vectorcall below a 3.12 limited API (README, "Building").  CPython 3.10 and
free-threaded builds are always version-specific.
"""

import os
import subprocess
import sys
import sysconfig

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIMITED_API_VERSION = (3, 11)


def limited_api():
    """Whether to build for the stable ABI (see the module docstring)."""
    setting = os.environ.get("ICECRYPT_LIMITED_API", "0").strip()
    if setting not in ("0", "1"):
        raise SystemExit(f"ICECRYPT_LIMITED_API must be 0 or 1, not {setting!r}")
    return (
        setting == "1"
        and sys.implementation.name == "cpython"
        and sys.version_info >= LIMITED_API_VERSION
        and not sysconfig.get_config_var("Py_GIL_DISABLED")
    )


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


def extensions(limited):
    include_dirs = [os.path.join(ROOT, "include")]
    define_macros = []
    if limited:
        major, minor = LIMITED_API_VERSION
        define_macros += [("Py_LIMITED_API", f"0x{major:02X}{minor:02X}0000"), ("CYTHON_LIMITED_API", "1")]
    ext = Extension(
        "icecrypt._gcm",
        sources=["src/icecrypt/_gcm.pyx", "src/icecrypt/_native/gcm.c"],
        include_dirs=include_dirs,
        define_macros=define_macros,
        # Under Py_LIMITED_API a call outside the limited API is an implicit declaration:
        # make it an error rather than a module that crashes or fails to load.
        extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", "-Wno-unused-function",
                            "-Werror=implicit-function-declaration"],
        py_limited_api=limited,
    )
    return cythonize([ext], compiler_directives={"language_level": "3"})


class build_ext_with_openssl(build_ext):
    """build_ext, with OpenSSL's options (openssl_options: the pinned build, fetched and
    built into the cache the first time) found when the extension is built, not when this
    file is read: pip reads the project's metadata before it installs the dependencies, and
    that should not wait for an OpenSSL build (`make -j2` runs one beside pip)."""

    def run(self):
        options = openssl_options()
        for ext in self.extensions:
            for key, values in options.items():
                getattr(ext, key).extend(values)
        super().run()


JAR = os.path.join("src", "icecrypt", "spark", "icecrypt-spark.jar")


class build_py_with_jar(build_py):
    """build_py, with icecrypt's Spark jar (package data) built first when it is missing:
    scripts/build-jar.sh compiles java/src with javac against the jars of an installed
    pyspark (or ICECRYPT_SPARK_JARS).  An sdist carries the jar, so building from one needs
    no JDK.  Without a JDK and pyspark the wheel has no jar (read_table then always takes
    the Python path), unless ICECRYPT_REQUIRE_JAR=1 makes that an error."""

    def run(self):
        if not os.path.exists(os.path.join(ROOT, JAR)):
            script = os.path.join(ROOT, "scripts", "build-jar.sh")
            result = subprocess.run(["bash", script, sys.executable], cwd=ROOT) if os.path.exists(script) else None
            if result is None or result.returncode != 0:
                if os.environ.get("ICECRYPT_REQUIRE_JAR") == "1":
                    raise SystemExit(f"{JAR} could not be built (scripts/build-jar.sh needs javac and pyspark)")
                print(f"warning: {JAR} not built: the wheel has no native Spark reads", file=sys.stderr)
        super().run()


LIMITED_API = limited_api()
setup(
    cmdclass={"build_py": build_py_with_jar, "build_ext": build_ext_with_openssl},
    ext_modules=extensions(LIMITED_API),
    options={"bdist_wheel": {"py_limited_api": "cp%d%d" % LIMITED_API_VERSION}} if LIMITED_API else {},
)
