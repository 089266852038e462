"""Fault-injection tests: a failing pyarrow filesystem, a failing KMS, killed writers."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from faultlib import OPERATIONS, make_world, reference  # noqa: E402


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """A keystore and the template table every case starts from."""
    return make_world(str(tmp_path_factory.mktemp("faults")))


@pytest.fixture(scope="session")
def references(world):
    """name -> fault-free reference run (versions, row digests, call census)."""
    return {name: reference(world, name) for name in OPERATIONS}
