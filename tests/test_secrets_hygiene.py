"""Secrets hygiene, proven: every key in play (DEKs, KEKs, the keystore's master keys)
is searched for, as raw bytes, hex (lower/upper) and base64 (standard and URL-safe, with
and without padding, at each of the three byte alignments inside a longer base64 text),
in everything the library, the CLI, a Spark job and the failure drills print or log at
DEBUG: log records (icecrypt, pyarrow, boto, py4j/pyspark, the JVM's log on stderr),
stdout/stderr, exception texts, reprs and tracebacks, ``explain()`` output, and pickled
plans and tasks.

Pickles of planned ``icecrypt.iceberg`` tasks carry the DEKs of their files (documented:
the keys travel inside the task, as in Iceberg Java, so ship them over encrypted
channels); for pickles the test asserts that no master key and no KEK appears, and that
the DEKs do (so the search is known to work on them).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import pickle
import subprocess
import sys
import traceback

import pyarrow as pa
import pytest

from icecrypt import ags1

from icecrypt.errors import IcecryptError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.kms.local import LocalKms
from icecrypt.table import EncryptedTable

LOGGERS = ["", "icecrypt", "pyarrow", "boto", "boto3", "botocore", "urllib3", "py4j", "pyspark", "fsspec"]


def encodings(key: bytes) -> set[bytes]:
    """The forms a key could leak in."""
    forms = {key, key.hex().encode(), key.hex().upper().encode()}
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        full = enc(key)
        forms |= {full, full.rstrip(b"=")}
        for shift in (1, 2):  # the key inside a longer base64 text, at another alignment
            shifted = enc(b"\0" * shift + key)
            start = (shift * 4 + 2) // 3 + 1  # skip the characters that mix in the prefix
            forms.add(shifted[start : len(shifted) - 3])
    return {f for f in forms if len(f) >= 12}


def find(keys: dict[str, bytes], haystacks: dict[str, bytes]) -> list[str]:
    hits = []
    for name, key in keys.items():
        for form in encodings(key):
            for where, blob in haystacks.items():
                if form in blob:
                    hits.append(f"{name} as {form[:12]!r}... in {where}")
    return hits


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = logging.Formatter("%(name)s %(levelname)s %(message)s").format(record)
        except Exception as exc:  # noqa: BLE001
            text = f"unformattable record {record.msg!r} {record.args!r}: {exc}"
        self.lines.append(text + repr(record.args) + repr(getattr(record, "__dict__", {})))


@contextlib.contextmanager
def debug_logging():
    handler = Capture()
    saved = {}
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = logger.level
        logger.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


class Evidence:
    """Everything captured, by where it came from."""

    def __init__(self) -> None:
        self.text: dict[str, bytes] = {}
        self.pickles: dict[str, bytes] = {}

    def add(self, where: str, value) -> None:
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "backslashreplace")
        self.text[where] = self.text.get(where, b"") + data + b"\n"

    def drill(self, where: str, fn) -> BaseException:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            self.add(where, _exception_text(exc))
            return exc
        raise AssertionError(f"{where}: the drill did not fail")


def table_keys(table: EncryptedTable, kms) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(DEKs, KEKs) of a table, through the real objects: the manifest-list keys unwrapped
    by the KEKs, the manifests' and files' key metadata, and the KEKs unwrapped by the KMS."""
    from icecrypt.table.ops import write as _write

    deks, keks = {}, {}
    manager = table.encryption_manager
    for entry in manager.encryption_keys:
        if manager.is_kek(entry) or entry.encrypted_by_id in ("master", "master-2"):
            keks[f"KEK {entry.key_id}"] = kms.unwrap_key(entry.encrypted_key_metadata, entry.encrypted_by_id)
    target = _write._Target.of(table)
    io_ = target.io(manager)
    for snapshot in table.snapshots():
        km = table.manifest_list_key_metadata(snapshot)
        deks[f"DEK of manifest list {snapshot.snapshot_id}"] = km.encryption_key
        for raw in _write._read_manifest_list(io_, manager, table.metadata["snapshots"][[s.snapshot_id for s in table.snapshots()].index(snapshot.snapshot_id)]):
            m = StandardKeyMetadata.decode(raw["key_metadata"])
            deks[f"DEK of manifest {raw['manifest_path']}"] = m.encryption_key
            for entry in _write._read_entries(io_, raw):
                blob = entry["data_file"].get("key_metadata")
                if blob:
                    deks[f"DEK of {entry['data_file']['file_path']}"] = StandardKeyMetadata.decode(blob).encryption_key
    return deks, keks


def master_keys(keystore: str) -> dict[str, bytes]:
    with open(keystore) as f:
        document = json.load(f)
    return {f"master key {kid}": base64.b64decode(e["material"]) for kid, e in document["keys"].items()}


def _cli(evidence: Evidence, where: str, *args: str, cwd: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "icecrypt", *args], cwd=cwd, capture_output=True, env=env, timeout=300)
    evidence.add(f"cli {where} stdout", proc.stdout)
    evidence.add(f"cli {where} stderr", proc.stderr)
    assert (proc.returncode == 0) == ok, (where, proc.returncode, proc.stderr[-2000:])
    return proc


def test_encodings_self_check():
    """The scan finds a key planted in a log line, in every encoding (the test can fail)."""
    key = os.urandom(16)
    for form in encodings(key):
        assert find({"k": key}, {"log": b"INFO something " + form + b" else"})
    inside = base64.b64encode(b"xy" + key + b"tail")  # inside a longer base64 text
    assert find({"k": key}, {"log": inside})
    assert not find({"k": key}, {"log": b"nothing here"})


def test_kek_cache_ttl_property(tmp_path):
    """``encryption.kek-cache-ttl-ms`` shortens how long an unwrapped KEK stays cached
    (0: the KMS is asked at every unwrap; the default caches it for an hour)."""
    LocalKms.create_keystore(tmp_path / "ks.json", ["master"])
    calls = []

    class Counting(LocalKms):
        def unwrap_key(self, wrapped_key, wrapping_key_id):
            calls.append(wrapping_key_id)
            return super().unwrap_key(wrapped_key, wrapping_key_id)

    data = pa.table({"id": pa.array([1, 2], pa.int64())})
    for ttl, expected in ((None, 1), ("0", 3)):
        props = {} if ttl is None else {"encryption.kek-cache-ttl-ms": ttl}
        t = EncryptedTable.create(str(tmp_path / f"t{ttl}"), data.schema, kms=LocalKms(tmp_path / "ks.json"),
                                  table_key_id="master", properties=props)
        t.append(data)
        t = EncryptedTable.load(str(tmp_path / f"t{ttl}"), kms=Counting(tmp_path / "ks.json"))
        calls.clear()
        for _ in range(3):
            t.scan().to_arrow()
        assert len(calls) == expected, (ttl, calls)
    with pytest.raises(ValueError, match="kek-cache-ttl-ms"):
        EncryptedTable.create(str(tmp_path / "bad"), data.schema, kms=LocalKms(tmp_path / "ks.json"),
                              table_key_id="master", properties={"encryption.kek-cache-ttl-ms": "-1"}).append(data)


def _run_library(tmp: str, evidence: Evidence, kms) -> EncryptedTable:
    t = EncryptedTable.create(os.path.join(tmp, "wh", "orders"), pa.schema([("id", pa.int64()), ("s", pa.string())]),
                              kms=kms, table_key_id="master")
    data = pa.table({"id": pa.array(range(20), pa.int64()), "s": [f"v{i % 4}" for i in range(20)]})
    t.append(data)
    t.delete("id < 3")
    t.append(data.slice(0, 5))
    evidence.add("scan", t.scan().to_arrow())
    report = t.verify()
    evidence.add("verify", report)
    evidence.add("repr", [repr(t), repr(t.encryption_manager), repr(kms), t.snapshots(), t.manifests(t.current_snapshot())])
    evidence.add("repr key metadata", [repr(t.manifest_list_key_metadata(s)) for s in t.snapshots()])
    evidence.add("repr encryption-keys", [repr(e) for e in t.encryption_manager.encryption_keys])
    tasks = list(t.scan().plan_files())
    evidence.add("repr tasks", [repr(x) for x in tasks])
    evidence.pickles["planned FileScanTasks"] = pickle.dumps(tasks)
    evidence.add("rotate", t.rotate_keys(new_kek=True))
    evidence.add("rotate master", t.rotate_keys(new_kek=False, new_master_key_id="master-2"))
    evidence.add("metadata location", t.metadata_location)
    return t


@pytest.mark.spark
def test_no_key_in_logs_outputs_errors_and_plans(tmp_path, capfd, spark):
    tmp = str(tmp_path)
    keystore = os.path.join(tmp, "keystore.json")
    LocalKms.create_keystore(keystore, ["master", "master-2"])
    kms = LocalKms(keystore)
    evidence = Evidence()
    spark_options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": keystore}
    with debug_logging() as logs:
        spark.sparkContext.setLogLevel("DEBUG")
        try:
            # --- the demo path's building blocks: table, Spark read/write, rotation, verify
            t = _run_library(tmp, evidence, kms)
            import icecrypt.spark

            icecrypt.spark.register(spark)
            df = spark.read.format("icecrypt.iceberg").options(**spark_options).load(t.location)
            evidence.add("spark rows", df.collect())
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                df.explain(True)
            evidence.add("explain", buf.getvalue() + df._jdf.queryExecution().toString())
            df.limit(3).write.format("icecrypt.iceberg").options(**spark_options).mode("append").save(t.location)
            from icecrypt.spark._iceberg import IcebergReader

            reader = IcebergReader(spark_options | {"path": t.location}, df.schema)
            parts = reader.partitions()
            evidence.add("repr partitions", [repr(p) for p in parts] + [repr(reader)])
            evidence.pickles["pickled reader"] = pickle.dumps(reader)
            evidence.pickles["pickled planned partitions"] = pickle.dumps(parts)
            t = EncryptedTable.load(t.location, kms=kms)
            evidence.add("verify after spark", t.verify())

            # --- failure drills
            from icecrypt.errors import KmsError

            # a file the Python writer wrote first: the middle of a small file of Spark's
            # writer is its page index, which verify() authenticates but a scan never reads,
            # and the scan drill below must fail
            files = sorted((tk.file.path for tk in t.scan().plan_files()), key=lambda p: "/part-" in p)
            evidence.drill("wrong key", lambda: ags1.decrypt(ags1.encrypt(b"x" * 100, os.urandom(16)), os.urandom(16)))
            blob = bytearray(open(files[0], "rb").read())
            blob[len(blob) // 2] ^= 1
            open(files[0], "wb").write(bytes(blob))
            report = t.verify()
            assert not report.ok
            evidence.add("tampered verify", report)
            evidence.drill("tampered scan", lambda: EncryptedTable.load(t.location, kms=kms).scan().to_arrow())
            os.rename(keystore, keystore + ".away")
            evidence.drill("kms down", lambda: EncryptedTable.load(t.location, kms=LocalKms(keystore)).scan().to_arrow())
            os.rename(keystore + ".away", keystore)
            wrong = os.path.join(tmp, "other.json")
            LocalKms.create_keystore(wrong, ["master", "master-2"])
            exc = evidence.drill("wrong master key", lambda: EncryptedTable.load(t.location, kms=LocalKms(wrong)).scan().to_arrow())
            assert isinstance(exc, (KmsError, IcecryptError)), repr(exc)
        finally:
            spark.sparkContext.setLogLevel("ERROR")

        # --- the CLI
        cli_keys = {}
        _cli(evidence, "keys init", "keys", "init", "ks.json", cwd=tmp)
        cli_keys.update({f"cli {k}": v for k, v in master_keys(os.path.join(tmp, "ks.json")).items()})
        k = ["--kms-type", "local", "--kms-property", "encryption.kms.local.keystore=ks.json"]
        open(os.path.join(tmp, "day1.csv"), "w").write("id,name\n1,ann\n2,bob\n")
        _cli(evidence, "table create", "table", "create", "wh/c", "--schema", "id long, name string", "--table-key-id", "master", *k, cwd=tmp)
        _cli(evidence, "table append", "table", "append", "wh/c", "day1.csv", *k, cwd=tmp)
        _cli(evidence, "table scan", "table", "scan", "wh/c", *k, cwd=tmp)
        _cli(evidence, "table verify", "table", "verify", "wh/c", *k, cwd=tmp)
        _cli(evidence, "keys list", "keys", "list", "wh/c/metadata/v2.metadata.json", cwd=tmp)
        dek = os.urandom(16)
        open(os.path.join(tmp, "dek.key"), "wb").write(dek)
        cli_keys["cli DEK (key file)"] = dek
        open(os.path.join(tmp, "plain.bin"), "wb").write(os.urandom(5000))
        aad = ["--aad-hex", "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"]
        _cli(evidence, "encrypt", "encrypt", "plain.bin", "data.ags1", "--key-file", "dek.key", *aad, cwd=tmp)
        length = str(ags1.ciphertext_length(5000))
        _cli(evidence, "decrypt", "decrypt", "data.ags1", "copy.bin", "--key-file", "dek.key", *aad, "--length", length, cwd=tmp)
        open(os.path.join(tmp, "wrong.key"), "wb").write(os.urandom(16))
        _cli(evidence, "decrypt wrong key", "decrypt", "data.ags1", "x.bin", "--key-file", "wrong.key", *aad, "--length", length, cwd=tmp, ok=False)
        km = StandardKeyMetadata(os.urandom(16), os.urandom(16), 1234)
        cli_keys["cli DEK (key metadata)"] = km.encryption_key
        proc = _cli(evidence, "key-metadata decode", "key-metadata", "decode", km.encode().hex(), cwd=tmp)
        assert b"aad" in proc.stdout.lower() or proc.stdout
        ct = t_cli = EncryptedTable.load(os.path.join(tmp, "wh", "c"), kms=LocalKms(os.path.join(tmp, "ks.json")))
        cli_deks, cli_keks = table_keys(t_cli, LocalKms(os.path.join(tmp, "ks.json")))
        cli_keys.update({f"cli {n}": v for n, v in {**cli_deks, **cli_keks}.items()})
        evidence.add("repr cli table", repr(ct))

    out, err = capfd.readouterr()
    evidence.add("captured stdout (incl. JVM)", out)
    evidence.add("captured stderr (incl. JVM log)", err)
    evidence.add("log records", "\n".join(logs.lines))

    t = EncryptedTable.load(t.location, kms=kms)
    deks, keks = table_keys(t, kms)
    masters = master_keys(keystore)
    not_deks = {**keks, **masters, **{n: v for n, v in cli_keys.items() if "DEK" not in n}}
    all_keys = {**deks, **not_deks, **cli_keys}
    assert len(deks) >= 8 and len(keks) >= 2 and len(masters) == 2, (len(deks), len(keks), len(masters))
    assert len(logs.lines) > 0

    hits = find(all_keys, evidence.text)
    assert not hits, "\n".join(hits[:20])
    hits = find(not_deks, evidence.pickles)
    assert not hits, "\n".join(hits[:20])
    # documented: the planned tasks carry their files' DEKs (found, so the search works)
    carried = find(deks, {"pickled planned partitions": evidence.pickles["pickled planned partitions"]})
    assert carried, "pickled tasks were expected to carry their DEKs"
    sizes = {k: len(v) for k, v in evidence.text.items()}
    print(f"\nsecrets scan: {len(all_keys)} keys ({len(deks)} DEKs, {len(keks)} KEKs, {len(masters)} master keys, "
          f"{len(cli_keys)} of the CLI run) x {sum(len(encodings(k)) for k in all_keys.values())} encoded forms; "
          f"{len(evidence.text)} text sources ({sum(sizes.values())} bytes, {len(logs.lines)} log records), "
          f"{len(evidence.pickles)} pickles; DEK hits in task pickles (expected): {len(carried)}")


def _job_evidence(proc: subprocess.CompletedProcess, out) -> tuple[Evidence, str, dict, list]:
    """What a hygiene job (native_hygiene_job.py, sql_hygiene_job.py) showed, gathered:
    its output and DEBUG logs, OUT/explain.txt, the UI's REST answers and the event log
    (each checked to hold something); (evidence, explain text, REST answers, event logs)."""
    evidence = Evidence()
    evidence.add("job stdout", proc.stdout)
    evidence.add("job stderr (driver and executor logs, DEBUG)", proc.stderr)
    assert proc.stderr.count(b"DEBUG") > 100  # the JVM did log at DEBUG
    explain = (out / "explain.txt").read_text()
    evidence.add("explain", explain)
    rest = json.loads((out / "rest.json").read_text())
    for endpoint, answer in rest.items():
        evidence.add(f"UI REST {endpoint}", answer)
    logs = [p for p in (out / "events").rglob("*") if p.is_file()]
    assert logs and sum(p.stat().st_size for p in logs) > 10_000
    for path in logs:
        evidence.add(f"event log {path.name}", path.read_bytes())
    return evidence, explain, rest, logs


@pytest.mark.spark  # its own Spark application (a JVM): not in make test-quick
@pytest.mark.slow
def test_native_read_keys_never_in_plans_ui_event_log_or_logs(tmp_path):
    """``icecrypt.spark.read_table`` hands Spark's Parquet reader each file's DEK and AAD
    prefix in the read's options: a Spark application (tests/native_hygiene_job.py, its
    own JVM with the UI, an event log and DEBUG logs) reads a table natively (with a
    deletion vector's filter) and through the Python part, with ``read_table`` and with
    ``spark.read.format("icecrypt.iceberg")`` routed by the analyzer rule, and appends
    through the native write (Spark's Parquet writer, the write's secret in its options); no
    DEK, write secret, KEK or master key shows in any explain mode, the UI's REST
    answers (SQL plans, environment, stages, jobs, executors), the event log, or the
    driver's and executors' logs and output.  The DEKs are found in the option's value
    (the search works on what travels)."""
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = LocalKms(keystore)
    t = EncryptedTable.create(str(tmp_path / "t"), pa.schema([("id", pa.int64()), ("s", pa.string())]),
                              kms=kms, table_key_id="master")
    for start in (0, 50):
        t.append(pa.table({"id": pa.array(range(start, start + 50), pa.int64()), "s": [f"v{i % 3}" for i in range(50)]}))
    t.delete("id < 3")  # the first file's deletion vector: applied on Spark's reader
    # an Avro data file: read by the Python part, whose tasks carry its key metadata
    t.append(pa.table({"id": pa.array([100, 101], pa.int64()), "s": ["v0", "v1"]}), file_format="avro")
    out = tmp_path / "out"
    out.mkdir()
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_hygiene_job.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, job, t.location, str(keystore), str(out)], capture_output=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert b"rows 99" in proc.stdout and b"routed 99" in proc.stdout and b"written 159" in proc.stdout
    evidence, explain, rest, logs = _job_evidence(proc, out)
    assert "FileScan parquet" in explain and "icecrypt-live-rows" in explain and "MapInArrow" in explain
    assert explain.count("icecrypt-live-rows") >= 10  # both reads, every explain mode
    assert "FileScan parquet" in rest["sql?details=true&planDescription=true"]
    assert b"SparkListenerSQLExecutionStart" in b"".join(p.read_bytes() for p in logs)

    deks, keks = table_keys(t.refresh(), kms)
    masters = master_keys(str(keystore))
    written = {k: v for k, v in deks.items() if "/data/" in k and k.endswith("c000.zstd.parquet")}
    assert len(deks) >= 5 and keks and masters and len(written) >= 1  # the native write's files too
    lines = (out / "control.txt").read_text().splitlines()
    secrets = {f"write secret {i}": bytes.fromhex(line) for i, line in enumerate(lines) if len(line) == 64}
    assert len(secrets) == 1
    hits = find({**deks, **keks, **masters, **secrets}, evidence.text)
    assert not hits, "\n".join(hits[:20])
    control = {"file-keys option": "\n".join(line for line in lines if len(line) != 64).encode()}
    assert find(deks, control), "the DEKs were expected in the option's value"
    assert not find({**keks, **masters}, control)


@pytest.mark.spark  # its own Spark application (a JVM): not in make test-quick
@pytest.mark.slow
def test_sql_catalog_keys_never_in_plans_ui_event_log_or_logs(tmp_path):
    """Spark SQL through icecrypt's catalog hands the JVM each scan's file keys and each
    write's secret (a key per file is derived from it in the executors): a Spark
    application (tests/sql_hygiene_job.py, its own JVM with the UI, an event log and DEBUG
    logs) creates an encrypted table, inserts, queries, UPDATEs, MERGEs, DELETEs with a
    subquery (copy-on-write, then merge-on-read), compacts with CALL and reads the files
    metadata table; no
    DEK, write secret, KEK or master key shows in any explain mode (EXPLAIN of the UPDATE
    and MERGE too), the UI's REST answers, the event log, or the driver's and executors'
    logs and output.  The DEKs are found in what the scans handed over (the search works
    on what travels)."""
    from icecrypt.spark._sql.catalogs import open_catalog

    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = LocalKms(keystore)
    warehouse = tmp_path / "warehouse"
    out = tmp_path / "out"
    out.mkdir()
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sql_hygiene_job.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, job, str(warehouse), str(keystore), str(out)], capture_output=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 100 rows; UPDATE moved 0-4 to 1000-1004; MERGE: 95-99 moved to v9, 100-104 inserted; DELETE 10, 11;
    # merge-on-read: UPDATE moved 20-22, MERGE changed 30-32, DELETE 40, 41
    assert b"SELECT [(101, " in proc.stdout, proc.stdout[-2000:]
    evidence, explain, rest, _ = _job_evidence(proc, out)
    assert "icecrypt" in explain and "WriteDelta" in explain  # the EXPLAINs ran on the merge-on-read table
    assert "BatchScan" in rest["sql?details=true&planDescription=true"]  # the catalog's scans, with their plans

    table = open_catalog("enc", {"type": "sql", "warehouse": str(warehouse), "encryption.kms-type": "local",
                                 "encryption.kms.local.keystore": str(keystore)}).load_table(("db", "t"))
    deks, keks = table_keys(table, kms)
    masters = master_keys(str(keystore))
    lines = (out / "control.txt").read_text().splitlines()
    secrets = {f"write secret {i}": base64.b64decode(line) for i, line in enumerate(lines) if len(line) == 44}
    assert len(secrets) >= 6 and len(deks) >= 10 and keks and masters  # INSERT, UPDATEs, MERGEs, DELETE at least
    hits = find({**deks, **keks, **masters, **secrets}, evidence.text)
    assert not hits, "\n".join(hits[:20])
    handed = {"scans' file keys": "\n".join(line for line in lines if len(line) != 44).encode()}
    assert find(deks, handed), "the DEKs were expected in what the scans handed over"
    assert not find({**keks, **masters}, handed)
