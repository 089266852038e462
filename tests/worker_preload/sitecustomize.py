"""Imported at start-up by every Python process the suite's shared Spark JVM starts (this
directory is first on their ``PYTHONPATH``: tests/spark_fixtures.py); acts only in Spark's
worker daemon (``python -m pyspark.daemon MODULE``).

The daemon forks one process per worker Spark asks for, and each fork imports the worker
module and what the task unpickles.  Spark's own daemon imports nothing beforehand: a module
that starts a thread (pyarrow starts jemalloc's) must not be imported before a fork.  The
modules below start none and import no pyarrow (tests/spark/test_worker_preload.py checks
both in a fresh interpreter), and they are most of what each fork imported: pyspark's
worker modules and pyiceberg's table and expression models (pydantic classes, slow to
build).  Measured here: a data source worker's imports 1.4-1.5 s of CPU, 0.25 s after this;
a ``make test`` forks several hundred workers (Spark stops one left idle for a minute).

What a fork imports beyond these (pyarrow, icecrypt, and anything a task needs) it still
imports itself, as in any Spark job.
"""

import sys

PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.datasource",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.python_streaming_sink_runner",
    "pyiceberg.expressions",
    "pyiceberg.table",
)


def _in_daemon() -> bool:
    argv = getattr(sys, "orig_argv", ())
    return "-m" in argv and "pyspark.daemon" in argv


def preload() -> None:
    import gc
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # what is loaded now lives as long as the daemon: the collector of each fork leaves it
    # alone, so the pages stay shared with the daemon instead of being copied on first write
    gc.freeze()


def _next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this one hides (a distribution's, later on the path), as
    the interpreter would have without this directory in front."""
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_next_sitecustomize()
if _in_daemon():
    preload()
