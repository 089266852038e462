"""pytest plugin: session-scoped local endpoints for the gcp and azure KMS backends.

Load it with ``pytest_plugins = ["kms_fixtures_cloud"]`` (or ``-p kms_fixtures_cloud``).
Each endpoint is a separate process on a free 127.0.0.1 port, stopped by its PID when the
session ends.
"""

from __future__ import annotations

import pytest

from servers import require_module
from servers.azure import AzureKeyVaultServer, azure_keyvault_server
from servers.gcp import GcpKmsServer, gcp_kms_server


@pytest.fixture(scope="session")
def gcp_kms_endpoint() -> GcpKmsServer:
    """A local Cloud KMS REST endpoint with keys ``key-a``, ``key-b`` (AES-256)."""
    require_module("google.cloud.kms_v1")
    with gcp_kms_server() as server:
        yield server


@pytest.fixture(scope="session")
def azure_keyvault_endpoint(tmp_path_factory) -> AzureKeyVaultServer:
    """A local Key Vault HTTPS endpoint with RSA keys ``key-a`` (2048) and ``key-b`` (3072)."""
    require_module("azure.keyvault.keys")
    with azure_keyvault_server(tmp_path_factory.mktemp("azure-keyvault")) as server:
        yield server
