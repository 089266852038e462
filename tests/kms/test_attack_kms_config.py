"""KMS endpoints and keys are configuration, not metadata (issue 16, item 8 and the
transport part of item 11).

A table's master key id comes from ``metadata.json``, which a storage attacker can edit.
Each backend accepts only key ids its configuration allows, refusing the others before any
request leaves the process; an insecure transport needs an explicit opt-in and warns.
Everything runs against the real local servers of the suite (moto, OpenBao, the local
Key Vault and Cloud KMS endpoints).
"""

from __future__ import annotations

import os
import warnings

import pytest

from icecrypt.errors import InsecureTransportWarning, KmsError, KmsKeyNotFoundError
from icecrypt.kms import create_kms_client

pytestmark = [pytest.mark.servers, pytest.mark.timeout(60)]

KEY = os.urandom(32)


def _delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after) if after.get(k, 0) != before.get(k, 0)}


# --- Azure: a key id URL on another host ----------------------------------------------------------


def test_azure_key_id_on_another_host_is_refused_before_any_request(azure_keyvault_endpoint):
    """``https://localhost:<port>/keys/key-a`` is the same test server under another name (its
    certificate covers both), so the only thing that refuses it is the configuration."""
    full_id = azure_keyvault_endpoint.key_ids()["key-a"]
    elsewhere = full_id.replace("127.0.0.1", "localhost")
    assert elsewhere != full_id
    with create_kms_client(azure_keyvault_endpoint.kms_properties()) as kms:
        wrapped = kms.wrap_key(KEY, full_id)  # the configured vault: fine
        before = azure_keyvault_endpoint.stats()
        for call in (lambda: kms.wrap_key(KEY, elsewhere), lambda: kms.unwrap_key(wrapped, elsewhere)):
            with pytest.raises(KmsKeyNotFoundError, match="azure.keyvault.allowed-vault-urls") as err:
                call()
            assert "localhost" in str(err.value)
        assert _delta(before, azure_keyvault_endpoint.stats()) == {}
    allowed = azure_keyvault_endpoint.kms_properties(
        **{"azure.keyvault.allowed-vault-urls": azure_keyvault_endpoint.vault_url.replace("127.0.0.1", "localhost")})
    with create_kms_client(allowed) as kms:
        assert kms.unwrap_key(kms.wrap_key(KEY, elsewhere), elsewhere) == KEY


def test_azure_vault_url_properties_are_checked(azure_keyvault_endpoint):
    for bad in ("http://127.0.0.1:1", "https://127.0.0.1:1/keys/x", "not a url"):
        with pytest.raises(KmsError, match="invalid vault URL"):
            create_kms_client(azure_keyvault_endpoint.kms_properties(**{"azure.keyvault.allowed-vault-urls": bad}))


# --- AWS: another account's key ---------------------------------------------------------------------


def test_aws_cross_account_arn_is_refused_unless_allowed(moto_server, aws_key_ids):
    from servers.moto import MOTO_ACCOUNT_ID

    own_arn = aws_key_ids["arn_a"]
    foreign_arn = own_arn.replace(f":{MOTO_ACCOUNT_ID}:", ":999999999999:")
    properties = moto_server.kms_properties()
    with create_kms_client(properties) as kms:
        wrapped = kms.wrap_key(KEY, own_arn)
        assert kms.unwrap_key(wrapped, aws_key_ids["a"]) == KEY  # bare ids: the client's own account
        for call in (lambda: kms.wrap_key(KEY, foreign_arn), lambda: kms.unwrap_key(wrapped, foreign_arn)):
            with pytest.raises(KmsKeyNotFoundError, match="account 999999999999 is not in kms.allowed-account-ids"):
                call()
        with pytest.raises(KmsKeyNotFoundError, match="not a KMS key or alias ARN"):
            kms.wrap_key(KEY, "arn:aws:s3:::bucket")
    # an ARN needs its account configured (or the ARN itself listed)
    del properties["kms.allowed-account-ids"]
    with create_kms_client(properties) as kms:
        with pytest.raises(KmsKeyNotFoundError, match=MOTO_ACCOUNT_ID):
            kms.wrap_key(KEY, own_arn)
        assert kms.unwrap_key(kms.wrap_key(KEY, aws_key_ids["alias_a"]), aws_key_ids["a"]) == KEY
    with create_kms_client({**properties, "kms.allowed-key-ids": own_arn}) as kms:
        assert kms.unwrap_key(kms.wrap_key(KEY, own_arn), own_arn) == KEY


# --- GCP: a key outside the configured key rings -----------------------------------------------------


def test_gcp_key_outside_the_allowed_key_rings_is_refused(gcp_kms_endpoint):
    own = gcp_kms_endpoint.key_id("key-a")
    foreign = own.replace("projects/icecrypt-test/", "projects/attacker/")
    with create_kms_client(gcp_kms_endpoint.kms_properties()) as kms:
        wrapped = kms.wrap_key(KEY, own)
        before = gcp_kms_endpoint.stats()
        dotted = own.replace("/keyRings/icecrypt/cryptoKeys/key-a", "/keyRings/icecrypt/cryptoKeys/../../x/cryptoKeys/k")
        moved = own.rsplit("/", 1)[0] + "/.."  # would move the REST path out of the allowed key ring
        for bad in (foreign, own + "/cryptoKeyVersions/1/../../k", "projects/icecrypt-test", dotted, moved):
            with pytest.raises(KmsKeyNotFoundError, match="refused"):
                kms.unwrap_key(wrapped, bad)
        assert _delta(before, gcp_kms_endpoint.stats()) == {}
    # nothing configured: nothing accepted
    properties = gcp_kms_endpoint.kms_properties()
    del properties["gcp.kms.allowed-key-rings"]
    with create_kms_client(properties) as kms:
        with pytest.raises(KmsKeyNotFoundError, match="gcp.kms.allowed-key-rings"):
            kms.wrap_key(KEY, own)
    # a project-wide entry covers its key rings
    with create_kms_client({**properties, "gcp.kms.allowed-key-rings": "projects/icecrypt-test"}) as kms:
        assert kms.unwrap_key(kms.wrap_key(KEY, own), own) == KEY
    with pytest.raises(KmsError, match="invalid gcp.kms.allowed-key-rings"):
        create_kms_client({**properties, "gcp.kms.allowed-key-rings": "projects/p/cryptoKeys/x"})


# --- insecure transports need an opt-in and warn -------------------------------------------------------


@pytest.mark.parametrize("backend", ["vault-http", "vault-no-verify", "aws-http", "gcp-http"])
def test_insecure_transport_needs_an_explicit_opt_in(backend, request):
    if backend.startswith("vault"):
        server = request.getfixturevalue("openbao_server")
        properties, opt_in = server.kms_properties(), "vault.allow-insecure-transport"
        if backend == "vault-no-verify":
            properties.update({"vault.address": server.address.replace("http://", "https://"),
                               "vault.tls-verify": "false"})
    elif backend == "aws-http":
        properties, opt_in = request.getfixturevalue("moto_server").kms_properties(), "kms.allow-insecure-transport"
    else:
        properties, opt_in = request.getfixturevalue("gcp_kms_endpoint").kms_properties(), \
            "gcp.kms.allow-insecure-transport"
    del properties[opt_in]
    with pytest.raises(KmsError, match=opt_in):
        create_kms_client(properties)
    with pytest.raises(KmsError, match=opt_in):
        create_kms_client({**properties, opt_in: "false"})
    with pytest.warns(InsecureTransportWarning, match=opt_in):
        create_kms_client({**properties, opt_in: "true"}).close()


def test_secure_configurations_do_not_warn(azure_keyvault_endpoint):
    with warnings.catch_warnings():
        warnings.simplefilter("error", InsecureTransportWarning)
        create_kms_client(azure_keyvault_endpoint.kms_properties()).close()
        create_kms_client({"encryption.kms-type": "vault", "vault.address": "https://127.0.0.1:1",
                           "vault.token": "t"}).close()
