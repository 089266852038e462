"""How a session is built decides icecrypt's path: a classic session without icecrypt's
extension is told so once when the sources are registered, and ``configure`` on a local
master runs the Python workers on the driver's interpreter (a job started as
``venv/bin/python job.py``, the venv not on the PATH, used to fail in every worker with
"No module named 'icecrypt'").  Each case runs a job in a fresh process (session_job.py):
a session's extensions and its workers' interpreter are fixed when it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servers import require_module

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = Path(__file__).resolve().parent / "session_job.py"


def _run(mode: str, tmp_path: Path, env: dict[str, str]) -> dict:
    require_module("pyspark")
    proc = subprocess.run([sys.executable, str(JOB), mode, str(tmp_path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_register_on_a_session_without_the_extension_warns_once(tmp_path, moto_server):
    """... and, icecrypt's jar there but not its extension, an UPDATE of a table on S3 fails
    before anything is written (a Python source's writer cannot take Spark's own plan of it)."""
    bucket = f"plain-{tmp_path.name[-12:].lower().replace('_', '-')}"
    client = moto_server.boto3_client("s3")
    client.create_bucket(Bucket=bucket)
    s3 = {"endpoint": moto_server.endpoint, "key": moto_server.access_key_id,
          "secret": moto_server.secret_access_key, "region": moto_server.region, "bucket": bucket}
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "ICECRYPT_JOB_S3": json.dumps(s3)}
    result = _run("plain", tmp_path, env)
    assert len(result["warnings"]) == 1, result
    warning = result["warnings"][0]
    assert warning.startswith("RuntimeWarning: "), warning
    assert "icecrypt.spark.configure" in warning and "without icecrypt's session extension" in warning, warning
    assert result["update"] is not None and "session extension" in result["update"], result
    assert "nothing was written" in result["update"], result
    assert result["table"] == [[1, "a"], [2, "b"]] and result["snapshots"] == 1, result
    data = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])
            if "/data/" in o["Key"] and not o["Key"].endswith("/")]
    assert len(data) == 1, data  # the INSERT's file only


def test_configure_runs_workers_on_the_drivers_interpreter(tmp_path):
    """No PYSPARK_PYTHON, and the interpreter's directory not on the PATH: ``python3`` from the
    PATH is another interpreter, without pyarrow and the rest of this environment."""
    here = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and os.path.realpath(p) != os.path.realpath(here))
    result = _run("configured", tmp_path, env)
    assert result["rows"] == 100, result
    assert result["python"] == sys.executable, result
    assert result["warnings"] == [], result
