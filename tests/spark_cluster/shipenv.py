"""Build an executor environment that is not the driver's, for the shipping test.

A fresh virtual environment (``python -m venv --without-pip`` on the base interpreter)
gets:

* icecrypt, from a wheel built from this working tree (tracked and new, not ignored,
  files copied to a temporary directory, ``pip wheel --no-deps --no-build-isolation``;
  the static OpenSSL comes from the build cache), unpacked into the new site-packages
  (never ``pip install --prefix`` from this venv: pip would uninstall this venv's own
  icecrypt first);
* the runtime dependencies the Python workers import (pyarrow, fastavro, pyiceberg,
  pandas and what they require), copied file by file from this venv's installed
  distributions (their ``RECORD``), since the machine has no package index to install
  them from offline.  pyspark itself is not needed: Spark puts its own ``pyspark.zip``
  on the workers' ``PYTHONPATH``.

Then :func:`icecrypt.spark.pack_environment` packs it as ``.tar.gz`` with gzip level 1
(~360 MB of files, ~120 MB packed; higher levels double the time on 2 cores).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: what the executors' Python workers import, beyond icecrypt
RUNTIME = ("pyarrow", "fastavro", "pyiceberg", "pandas", "numpy")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions ``names`` need, recursively (markers honoured; extras not)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed
        seen[key] = dist
        for requirement in dist.requires or ():
            spec, _, marker = requirement.partition(";")
            if "extra" in marker:
                continue
            if marker.strip():
                from packaging.markers import Marker

                if not Marker(marker.strip()).evaluate():
                    continue
            match = _NAME.match(spec)
            if match:
                todo.append(match.group(1))
    return list(seen.values())


def _copy_distribution(dist: metadata.Distribution, site: Path) -> int:
    copied = 0
    base = Path(dist.locate_file(""))
    for file in dist.files or ():
        if ".." in file.parts or file.suffix == ".pyc":
            continue  # scripts outside site-packages; bytecode is rebuilt
        source = base / file
        if not source.is_file():
            continue
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
        copied += 1
    return copied


def _sources(dest: Path) -> None:
    """Copy the working tree's files git knows or would add (tracked + untracked, not ignored)."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listing):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def build(root: Path) -> dict:
    """Build ``root/exec-venv`` and pack it as ``root/icecrypt-env.tar.gz``; return paths and timings."""
    import icecrypt.spark

    started = time.monotonic()
    venv = root / "exec-venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    src, wheels = root / "src-copy", root / "wheels"
    _sources(src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(src)],
                   check=True, capture_output=True, cwd=root)
    wheel = next(wheels.glob("icecrypt-*.whl"))
    site = next(venv.glob("lib/python*/site-packages"))
    with zipfile.ZipFile(wheel) as archive:  # a wheel is installed by unpacking it (no scripts needed)
        members = [m for m in archive.namelist() if ".data/" not in m.split("/", 1)[0] + "/"]
        archive.extractall(site, members)
    built = time.monotonic()
    dists = _closure(RUNTIME)
    files = sum(_copy_distribution(dist, site) for dist in dists)
    copied = time.monotonic()
    archive = icecrypt.spark.pack_environment(root / "icecrypt-env.tar.gz", prefix=venv, compress_level=1)
    packed = time.monotonic()
    return {"venv": str(venv), "archive": archive, "archive_bytes": os.path.getsize(archive),
            "distributions": sorted(d.metadata["Name"] for d in dists), "files": files,
            "seconds": {"venv+wheel": round(built - started, 1), "copy": round(copied - built, 1),
                        "pack": round(packed - copied, 1)}}
