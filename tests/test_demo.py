"""The quick start's main job (``make demo``) runs end to end on a small dataset."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servers import require_module


@pytest.mark.slow
@pytest.mark.spark
def test_demo_end_to_end(tmp_path):
    require_module("pyspark")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run(
        [sys.executable, "-m", "icecrypt.demo", "--dir", str(tmp_path / "demo"), "--rows", "30000"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "2b. PyIceberg's SqlCatalog on warehouse/catalog.db lists [('sales', 'orders')], at our current metadata file: True" in out, out
    for step in ("1. keystore", "2. 30,000 orders", "4. PySpark", "5. verify", "5b.", "6. new KEK", "7. after rotation", "8. one flipped byte"):
        assert step in out, out
    assert "all checks passed" in out and "found: " in out
    assert "{'PARE'" in out or "'PARE'" in out
    # the keystore never leaks: no base64 of its master key in the output
    import json

    keystore = json.loads((tmp_path / "demo" / "keystore.json").read_text())
    for entry in keystore["keys"].values():
        assert entry["material"] not in out + done.stderr
