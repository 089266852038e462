"""Planning after fork(): the shared manifest thread pool belongs to the parent; a forked
child (multiprocessing's fork start method, a forking server) must plan with its own.

Without that, a child inherits the pool's count of idle threads but none of the threads:
work it submits waits forever (seen as a hang in the fault-injection sweep)."""

from __future__ import annotations

import os
import sys
import time

import pyarrow.fs as pafs
import pytest
from test_write_roundtrip import SCHEMA, make_rows

from icecrypt.table import EncryptedTable


def _table(fs, name, kms, appends):
    table = EncryptedTable.create(name, SCHEMA, kms=kms, table_key_id="keyA", filesystem=fs)
    for i in range(appends):
        table.append(make_rows(i * 10, (i + 1) * 10))
    return table


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_plans_a_scan(tmp_path, kms):
    # A SubTreeFileSystem is not a LocalFileSystem: planning reads manifests on the pool.
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    many = _table(fs, "many", kms, 12)
    few = _table(fs, "few", kms, 2)
    assert len(many.scan().plan_files()) == 12  # the parent's pool now has idle threads
    pid = os.fork()
    if pid == 0:  # the child: fewer manifests than the parent's idle threads
        code = 1
        try:
            child = EncryptedTable.load("few", kms=kms, filesystem=fs)
            code = 0 if len(child.scan().plan_files()) == 2 else 2
        finally:
            sys.stdout.flush()
            os._exit(code)
    for _ in range(400):  # bounded wait: a hung child is killed and reported
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung planning a scan (it used the parent's thread pool)")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert len(few.scan().plan_files()) == 2
