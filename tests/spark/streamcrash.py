"""The driver of a streaming query that test_streaming.py kills with SIGKILL (and the
streaming tests' table helpers).

Run as ``python streamcrash.py SOURCE SINK CHECKPOINT FLAGS``: streams the appended rows
of table SOURCE (one snapshot per micro-batch) into table SINK with ``icecrypt.iceberg``
and ``trigger(availableNow=True)``.  Environment ``ICECRYPT_TEST_PAUSE`` = ``before:N``
or ``after:N`` makes the sink's commit of epoch N stop before (data files written, nothing
committed) or after (table committed, Spark's commit log not yet written) the table
commit: it writes ``FLAGS/<when>-<N>.json`` (the epoch's data files) and waits there to
be killed.  The sink is the real one; only this subclass waits (in the driver's sink
worker, a process of the driver's process group).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa

from icecrypt.kms.memory import MemoryKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.spark._stream import IcebergStreamWriter
from icecrypt.table import EncryptedTable

KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}


SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])


def rows(ids) -> pa.Table:
    """Rows ``id``, ``s`` = "row-<id>" of the streaming tests' tables."""
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids]}, schema=SCHEMA)


def new_table(path: Path) -> EncryptedTable:
    """An empty encrypted table of SCHEMA at ``path`` (Iceberg's test KMS, key keyA)."""
    return EncryptedTable.create(str(path), SCHEMA, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")


def _pause(when: str, batch_id: int, messages) -> None:
    spec = os.environ.get("ICECRYPT_TEST_PAUSE", "")
    flags = os.environ.get("ICECRYPT_TEST_FLAGS")
    if not flags or spec != f"{when}:{batch_id}":
        return
    files = [f["file_path"] for m in messages if m is not None for f in m.data_files]
    flag = Path(flags) / f"{when}-{batch_id}.json"
    flag.with_suffix(".tmp").write_text(json.dumps(files))
    flag.with_suffix(".tmp").rename(flag)
    while True:  # until SIGKILL
        time.sleep(1)


class PausingWriter(IcebergStreamWriter):
    def commit(self, messages, batchId):
        _pause("before", batchId, messages)
        super().commit(messages, batchId)
        _pause("after", batchId, messages)


class PausingSource(IcebergDataSource):
    def streamWriter(self, schema, overwrite):
        return PausingWriter(self.options, schema, overwrite)


def main(source: str, sink: str, checkpoint: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from spark_fixtures import start_spark, stop_spark

    spark = start_spark("icecrypt-stream-crash", compiled_pyspark=True)
    try:
        spark.dataSource.register(PausingSource)
        stream = (spark.readStream.format("icecrypt.iceberg").options(**KMS)
                  .option("streaming-max-files-per-micro-batch", "1").load(source))
        query = (stream.writeStream.format("icecrypt.iceberg").options(**KMS)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(sink))
        query.awaitTermination()
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    main(*sys.argv[1:4])
