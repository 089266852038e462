"""Suite-wide fixtures: Java vectors, hypothesis profiles, and no swallowed exceptions."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from vectorlib import VECTORS_DIR, load_manifest

# Fixtures of the key servers and devices (tests/servers/*), shared by tests and benchmarks.
pytest_plugins = ["kms_fixtures_devices", "kms_fixtures_cloud", "kms_fixtures_services", "spark_fixtures"]

settings.register_profile("default", deadline=None, max_examples=60)
settings.register_profile(
    "ci", deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("expensive", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the shared Spark session (directly or through another fixture) is a
    Spark test, marked or not: ``-m "not spark"`` (``make test-quick``) leaves it out."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def vectors():
    """manifest.json of ../shared/vectors (Iceberg Java's ground truth); never copied."""
    if not VECTORS_DIR.is_dir():
        pytest.fail(f"Java vectors not found at {VECTORS_DIR} (set ICECRYPT_VECTORS)")
    return load_manifest()


@pytest.fixture(autouse=True)
def _no_ignored_exceptions(capfd):
    """Fail any test during which Python printed "Exception ignored" (an error swallowed
    in __del__, a callback or a thread) to stderr."""
    yield
    captured = capfd.readouterr()
    sys.stdout.write(captured.out)
    sys.stderr.write(captured.err)
    assert "Exception ignored" not in captured.err, captured.err
