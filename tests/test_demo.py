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
    # the table is read natively (a session built with icecrypt.spark.configure), and the
    # Python path's figure is shown beside it
    assert "with Spark's own Parquet reader;" in out and "NOT TAKEN" not in out, out
    assert "the same through Python tasks" in out and "(through Python tasks " in out, out
    assert "{'PARE'" in out or "'PARE'" in out
    # the keystore never leaks: no base64 of its master key in the output
    import json

    keystore = json.loads((tmp_path / "demo" / "keystore.json").read_text())
    for entry in keystore["keys"].values():
        assert entry["material"] not in out + done.stderr


def _demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "icecrypt.demo", *args], capture_output=True, text=True, timeout=120)


def test_demo_refuses_to_remove_a_directory_it_did_not_make(tmp_path):
    """``--dir`` pointing at the user's own files: nothing is removed, the message says
    why and what to do."""
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    done = _demo("--dir", str(mine), "--rows", "10")
    assert done.returncode == 2
    assert "not made by the demo" in done.stderr and "--force" in done.stderr and str(mine) in done.stderr
    assert (mine / "thesis.tex").read_text() == "years of work" and (mine / "sub").is_dir()


def test_demo_never_removes_a_symlink_or_a_file(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    plain = tmp_path / "file"
    plain.write_text("y")
    for where in (link, plain):
        done = _demo("--dir", str(where), "--force")
        assert done.returncode == 2 and "not a directory" in done.stderr
    assert (target / "keep").read_text() == "x" and link.is_symlink() and plain.read_text() == "y"


def test_demo_work_directory_is_recreated_only_when_it_is_the_demos(tmp_path):
    from icecrypt.demo import MARKER, prepare_work_dir

    work = tmp_path / "demo"
    prepare_work_dir(str(work))  # new
    assert sorted(p.name for p in work.iterdir()) == [MARKER]
    (work / "warehouse").mkdir()
    (work / "keystore.json").write_text("{}")
    prepare_work_dir(str(work))  # the demo's own: emptied again
    assert sorted(p.name for p in work.iterdir()) == [MARKER]

    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_work_dir(str(empty))
    assert sorted(p.name for p in empty.iterdir()) == [MARKER]

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data").write_text("z")
    with pytest.raises(ValueError, match="not made by the demo"):
        prepare_work_dir(str(foreign))
    assert (foreign / "data").read_text() == "z"
    prepare_work_dir(str(foreign), force=True)  # asked for explicitly
    assert sorted(p.name for p in foreign.iterdir()) == [MARKER]
