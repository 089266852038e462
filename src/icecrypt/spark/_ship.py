"""Shipping icecrypt to Spark executors as a packed virtual environment.

Executors run the data sources in Python workers, which must import icecrypt (and
pyarrow, fastavro, pyiceberg for ``icecrypt.iceberg``).  On a cluster whose nodes do not
have it installed, the usual Spark way is an archive of a virtual environment given as
``spark.archives`` (``--archives``), which Spark unpacks in every executor's working
directory under the name after ``#``, plus the environment's interpreter as the Python of
the workers.

What decides the workers' interpreter (measured with PySpark 4.3 on a standalone
cluster, driver started as ``python driver.py``): the *driver process's* ``PYSPARK_PYTHON``
environment variable when the SparkContext starts.  PySpark reads it into every Python
function it sends, and executors run exactly that command.  Setting
``spark.pyspark.python`` on ``SparkSession.builder`` did not change it (the executors ran
``python3``); that setting is for ``spark-submit``, whose Python runner exports it as
``PYSPARK_PYTHON`` for the driver program it launches.  ``spark.executorEnv.PYSPARK_PYTHON``
is not needed.

A relative path such as ``./icecrypt-env/bin/python`` resolves in each process's working
directory: an executor's is where Spark unpacked the archive, and the driver's is the
driver program's own -- and the driver runs Python workers too (a data source's
``schema()``, its planning and its commit).  :func:`use_archive` therefore also makes
``./<name>`` in the driver's working directory point at an environment that has icecrypt
(by default the driver's own).

::

    archive = icecrypt.spark.pack_environment("/shared/icecrypt-env.tar.gz")   # once
    conf = icecrypt.spark.use_archive(archive)     # before the SparkSession starts
    builder = SparkSession.builder.master("spark://host:7077")
    for key, value in conf.items():
        builder = builder.config(key, value)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from icecrypt.errors import IcecryptError

__all__ = ["DEFAULT_ENV_NAME", "executor_conf", "pack_environment", "use_archive"]

#: the directory name the archive is unpacked under in executors (after ``#`` in spark.archives)
DEFAULT_ENV_NAME = "icecrypt-env"

# Not ".tar": Spark 4.3 unpacks a plain .tar in Java, which fails on the venv's symbolic
# links (measured: NoSuchFileException for bin/python3); .tar.gz/.tgz go through tar(1).
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip")


def pack_environment(output: str | os.PathLike[str] | None = None, *, prefix: str | os.PathLike[str] | None = None,
                     force: bool = False, compress_level: int = 4) -> str:
    """Pack the virtual environment ``prefix`` (default: the running one) into the
    archive ``output`` (default ``./icecrypt-env.tar.gz``) with ``venv-pack``; return the
    archive's absolute path.

    The format follows the name: ``.tar.gz``/``.tgz`` (``compress_level`` 1 packs a
    ~360 MB environment in ~7 s on two cores, 4 in about twice that) or ``.zip``.  The environment must hold icecrypt with the extras
    the executors need (``pip install "icecrypt[spark,iceberg]"``) and no editable
    installs; its Python stays a link to the base interpreter, which must exist at the
    same path on every node (``venv-pack``'s rule).  An existing archive is an error
    unless ``force``.
    """
    try:
        import venv_pack
    except ModuleNotFoundError:
        raise ModuleNotFoundError("pack_environment needs venv-pack (pip install venv-pack)", name="venv_pack") from None
    env = Path(prefix if prefix is not None else sys.prefix).resolve()
    if not (env / "pyvenv.cfg").is_file():
        raise IcecryptError(f"{env} is not a virtual environment (no pyvenv.cfg); create one with python -m venv and "
                            "pip install 'icecrypt[spark,iceberg]' into it")
    target = Path(output if output is not None else f"{DEFAULT_ENV_NAME}.tar.gz").absolute()
    if not target.name.endswith(_ARCHIVE_SUFFIXES):
        raise ValueError(f"archive name {target.name!r} must end with one of {', '.join(_ARCHIVE_SUFFIXES)} "
                         "(formats Spark unpacks)")
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists (pass force=True to replace it)")
    site = _site_packages(env)
    if site is not None and not (site / "icecrypt").is_dir():
        raise IcecryptError(f"environment {env} has no installed icecrypt package under {site} (an editable install "
                            "cannot be packed: pip install a wheel or sdist of icecrypt)")
    try:
        venv_pack.pack(prefix=str(env), output=str(target), force=force, compress_level=compress_level)
    except venv_pack.VenvPackException as exc:
        raise IcecryptError(f"cannot pack environment {env}: {exc}") from None
    return str(target)


def _site_packages(env: Path) -> Path | None:
    found = sorted(env.glob("lib/python*/site-packages"))
    return found[0] if len(found) == 1 else None


def executor_conf(archive: str | os.PathLike[str], *, name: str = DEFAULT_ENV_NAME) -> dict[str, str]:
    """The Spark settings that ship ``archive`` to the executors as ``./<name>``.

    ``spark.archives`` ships and unpacks it; ``spark.pyspark.python`` names its Python
    for ``spark-submit`` (which passes it on as ``PYSPARK_PYTHON``).  A driver started as
    a plain Python program must also have ``PYSPARK_PYTHON`` set before the session
    starts: :func:`use_archive` does both.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"environment name {name!r} must be a plain directory name")
    location = os.fspath(archive)
    if "://" not in location:
        location = os.path.abspath(location)
        if not os.path.isfile(location):
            raise FileNotFoundError(f"archive {location} does not exist")
    if not location.endswith(_ARCHIVE_SUFFIXES):
        raise ValueError(f"archive {location!r} must end with one of {', '.join(_ARCHIVE_SUFFIXES)}")
    return {"spark.archives": f"{location}#{name}", "spark.pyspark.python": f"./{name}/bin/python"}


def use_archive(archive: str | os.PathLike[str], *, name: str = DEFAULT_ENV_NAME,
                driver_prefix: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Prepare this driver process to run its workers from ``archive``; return the
    session settings (:func:`executor_conf`) to pass to ``SparkSession.builder``.

    Call it before the SparkSession starts, in the working directory the driver keeps.
    It sets ``PYSPARK_PYTHON`` to ``./<name>/bin/python`` and, unless ``./<name>``
    exists already, makes it a symbolic link to ``driver_prefix`` (default: the running
    environment), the interpreter of the Python workers the driver itself starts.
    """
    conf = executor_conf(archive, name=name)
    link = Path(name)
    if not link.exists() and not link.is_symlink():
        env = Path(driver_prefix if driver_prefix is not None else sys.prefix).resolve()
        if not (env / "bin" / "python").exists():
            raise IcecryptError(f"driver environment {env} has no bin/python")
        link.symlink_to(env, target_is_directory=True)
    elif not (link / "bin" / "python").exists():
        raise IcecryptError(f"./{name} exists in {Path.cwd()} but has no bin/python: remove it or choose another name")
    os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    return conf
