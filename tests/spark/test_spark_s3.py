"""Remote storage and a remote KMS: files on S3 and the master key in AWS KMS, both served
by a local moto server, read and written by Spark tasks that reach both themselves."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from servers import require_module
from sparkhelpers import sample_table, table_lines

from icecrypt import avro, parquet
from icecrypt.kms import create_kms_client
from icecrypt.spark import wrap_keys

pytestmark = [pytest.mark.spark, pytest.mark.servers]

BUCKET = "icecrypt-spark"


@pytest.fixture(scope="module")
def moto():
    require_module("boto3")
    require_module("moto.server")
    from servers.moto import moto_server

    with moto_server() as server:
        server.boto3_client("s3").create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture(scope="module")
def remote(moto):
    """(S3 filesystem, options with the s3.* and AWS KMS properties, KMS client, key id)."""
    key_id = moto.boto3_client("kms").create_key(Description="icecrypt spark")["KeyMetadata"]["KeyId"]
    kms_properties = moto.kms_properties()
    options = {**kms_properties, "s3.endpoint": moto.endpoint, "s3.access-key-id": moto.access_key_id,
               "s3.secret-access-key": moto.secret_access_key, "s3.region": moto.region}
    s3 = pafs.S3FileSystem(endpoint_override=f"{moto.host}:{moto.port}", scheme="http", access_key=moto.access_key_id,
                           secret_key=moto.secret_access_key, region=moto.region)
    kms = create_kms_client(kms_properties)
    yield s3, options, kms, key_id
    kms.close()


def test_read_and_write_on_s3_with_aws_kms(icespark, remote):
    s3, options, kms, key_id = remote
    first, second = sample_table(1_500), sample_table(700, 1_500)
    keys = {f"s3://{BUCKET}/in/a.parquet": parquet.write_table(first, f"{BUCKET}/in/a.parquet", filesystem=s3),
            f"s3://{BUCKET}/in/b.avro": avro.write(second, f"{BUCKET}/in/b.avro", filesystem=s3)}
    wrapped = wrap_keys(keys, kms=kms, table_key_id=key_id)

    df = (icespark.read.format("icecrypt.parquet").options(**options).option("encryption.key-id", key_id)
          .option("keys.wrapped", wrapped)
          .load(f"s3://{BUCKET}/in/"))
    dfa = (icespark.read.format("icecrypt.avro").options(**options).option("encryption.key-id", key_id)
           .option("keys.wrapped", wrapped)
           .load(f"s3a://{BUCKET}/in/b.avro"))
    assert table_lines(df.unionByName(dfa).toArrow()) == table_lines(pa.concat_tables([first, second]))

    manifest = f"s3://{BUCKET}/keys/out.json"
    (df.write.format("icecrypt.avro").options(**options).option("encryption.key-id", key_id)
     .option("keys.manifest", manifest).mode("append").save(f"s3://{BUCKET}/out"))
    written = [info for info in s3.get_file_info(pafs.FileSelector(f"{BUCKET}/out")) if info.is_file]
    assert written and all(s3.open_input_file(info.path).read(4) == b"AGS1" for info in written)
    back = (icespark.read.format("icecrypt.avro").options(**options).option("encryption.key-id", key_id)
            .option("keys.manifest", manifest)
            .load(f"s3://{BUCKET}/out").toArrow())
    assert table_lines(back) == table_lines(first)
