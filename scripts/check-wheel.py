"""Check a built icecrypt wheel: platform tag, files, and the dynamic symbol table.

    python scripts/check-wheel.py dist/icecrypt-*.whl

The extension module links OpenSSL statically, so it must export nothing but its module
init function (no OpenSSL symbol may leak into the process's symbol namespace, where it
would clash with pyarrow's or the system's OpenSSL) and must not load a libcrypto.
The ELF reader is also used by tests/test_packaging.py on the installed module.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import tempfile
import zipfile

SHT_DYNAMIC, SHT_DYNSYM, DT_NEEDED = 6, 11, 1
STB_GLOBAL, STB_WEAK = 1, 2


def _sections(data: bytes):
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, ...
        yield struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize)


def _string(data: bytes, table_offset: int, index: int) -> str:
    end = data.index(b"\0", table_offset + index)
    return data[table_offset + index : end].decode()


def elf_dynamic(path: str) -> tuple[list[str], list[str]]:
    """(defined global/weak dynamic symbols, DT_NEEDED libraries) of an ELF64 shared object."""
    with open(path, "rb") as f:
        data = f.read()
    sections = list(_sections(data))
    exported, needed = [], []
    for _name, kind, _flags, _addr, offset, size, link, _info in sections:
        strtab = sections[link][4]
        if kind == SHT_DYNSYM:
            for pos in range(offset + 24, offset + size, 24):  # entry 0 is the null symbol
                st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, pos)
                if st_shndx != 0 and st_info >> 4 in (STB_GLOBAL, STB_WEAK):
                    exported.append(_string(data, strtab, st_name))
        elif kind == SHT_DYNAMIC:
            for pos in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == DT_NEEDED:
                    needed.append(_string(data, strtab, value))
    return exported, needed


def macho_exported(path: str) -> list[str]:
    out = subprocess.run(["nm", "-gU", path], check=True, capture_output=True, text=True).stdout
    return [line.split()[-1].lstrip("_") for line in out.splitlines() if line.strip()]


def module_problems(path: str) -> list[str]:
    """What is wrong with the symbol table of the extension module at `path` ([] if fine)."""
    if sys.platform == "darwin":
        exported, needed = macho_exported(path), []
    else:
        exported, needed = elf_dynamic(path)
    problems = []
    extra = sorted(set(exported) - {"PyInit__gcm"})
    if extra:
        openssl = [s for s in extra if re.match(r"(OPENSSL|EVP|CRYPTO|RAND|ERR|OSSL|BN|RSA|AES|ossl)_", s)]
        problems.append(
            f"{len(extra)} exported symbols besides PyInit__gcm ({len(openssl)} of OpenSSL), e.g. {extra[:5]}"
        )
    if "PyInit__gcm" not in exported:
        problems.append("PyInit__gcm is not exported")
    crypto = [lib for lib in needed if lib.startswith(("libcrypto", "libssl"))]
    if crypto:
        problems.append(f"loads {crypto}: OpenSSL is not linked statically")
    return problems


def check_wheel(wheel: str) -> list[str]:
    name = os.path.basename(wheel)
    problems = []
    if sys.platform.startswith("linux") and not re.search(r"-manylinux_\d+_\d+_\w+\.whl$", name):
        problems.append(f"{name}: not a manylinux wheel (was it repaired by auditwheel?)")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        for required in ("icecrypt/__init__.py", "icecrypt/py.typed", "icecrypt/_gcm.pyi",
                         "icecrypt/spark/icecrypt-spark.jar"):
            if required not in names:
                problems.append(f"{name}: {required} missing")
        licenses = [n for n in names if re.search(r"\.dist-info/licenses/(LICENSE|NOTICE)$", n)]
        if len(licenses) != 2:
            problems.append(f"{name}: LICENSE and NOTICE expected in dist-info/licenses, found {licenses}")
        modules = [n for n in names if re.match(r"icecrypt/_gcm\..*(so|pyd)$", n)]
        if len(modules) != 1:
            return problems + [f"{name}: expected one icecrypt/_gcm extension module, found {modules}"]
        with tempfile.TemporaryDirectory() as tmp:
            path = zf.extract(modules[0], tmp)
            problems += [f"{modules[0]}: {p}" for p in module_problems(path)]
    return problems


def main(argv: list[str]) -> int:
    status = 0
    for wheel in argv:
        problems = check_wheel(wheel)
        size = os.path.getsize(wheel) / 2**20
        if problems:
            status = 1
            print(f"check-wheel: {os.path.basename(wheel)} ({size:.1f} MiB): FAILED", file=sys.stderr)
            for problem in problems:
                print(f"  {problem}", file=sys.stderr)
        else:
            print(f"check-wheel: {os.path.basename(wheel)} ({size:.1f} MiB): exports only PyInit__gcm, "
                  "OpenSSL static, licenses present")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
