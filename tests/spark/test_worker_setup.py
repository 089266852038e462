"""The shared session's Python workers (tests/spark_fixtures.py): they import pyspark from the
installed package, not from Spark's source zip, and are forks of a daemon that imported the
thread-free modules of tests/worker_preload once; that list must stay thread-free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spark_fixtures import WORKER_PRELOAD


def test_the_preloaded_modules_start_no_thread_and_import_no_pyarrow():
    """Spark's daemon forks after these imports: a thread alive then (pyarrow starts
    jemalloc's) would be missing in every fork, holding whatever lock it held."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyiceberg")
    probe = (
        "import importlib.util, json, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('preload', {os.path.join(WORKER_PRELOAD, 'sitecustomize.py')!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "module.preload()\n"
        "print(json.dumps({'threads': len(os.listdir('/proc/self/task')),\n"
        "                  'pyarrow': sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'pandas')),\n"
        "                  'loaded': all(m in sys.modules for m in module.PRELOAD)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"threads": 1, "pyarrow": [], "loaded": True}


def test_the_sitecustomize_it_hides_still_runs(tmp_path):
    """A distribution's ``sitecustomize`` later on the path runs as it would without the
    preload directory in front; outside Spark's daemon nothing is preloaded."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.icecrypt_next_ran = True\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([WORKER_PRELOAD, str(tmp_path)]))
    probe = "import sys; print(getattr(sys, 'icecrypt_next_ran', False), 'pyiceberg.table' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]


@pytest.mark.spark
def test_the_shared_sessions_workers_use_the_installed_pyspark_and_the_preload(spark):
    from pyspark.sql.functions import udf

    @udf("string")
    def where(_):
        import sys

        import pyspark

        return json.dumps({"pyspark": pyspark.__file__, "preloaded": "pyiceberg.table" in sys.modules})

    seen = json.loads(spark.range(1).select(where("id")).first()[0])
    import pyspark

    assert seen == {"pyspark": pyspark.__file__, "preloaded": True}
