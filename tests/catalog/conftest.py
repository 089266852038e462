"""Fixtures of the catalog tests: the test KMS, SQLite catalogs in temporary directories,
and a real PostgreSQL server.

PostgreSQL (Debian's ``postgresql`` package, ``/usr/lib/postgresql/<major>/bin``) runs
for the whole session: ``initdb`` of a temporary data directory and ``postgres``
listening on 127.0.0.1 only, at a free port, with its unix socket inside the temporary
directory, as an unprivileged user (PostgreSQL refuses to run as root: when the tests
run as root, the system user ``icecrypt-pg`` is created if missing).  It is stopped by
its PID (SIGINT, PostgreSQL's fast shutdown; SIGKILL of its process group if that
does not finish in time) and the directory removed.  Each test gets its own database.
Under ``ICECRYPT_REQUIRE_SERVERS=1`` a PostgreSQL that cannot run fails the tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
from servers import HOST, ServerStartError, free_port, unavailable, unwatch, wait_for_port, watch

from icecrypt.kms.memory import MemoryKms

PG_USER = "icecrypt-pg"


@pytest.fixture
def kms() -> MemoryKms:
    """Iceberg Java's test KMS (master keys keyA and keyB)."""
    return MemoryKms.with_iceberg_test_keys()


@pytest.fixture
def warehouse(tmp_path) -> str:
    path = tmp_path / "warehouse"
    path.mkdir()
    return str(path)


@pytest.fixture
def sqlite_catalog(warehouse, kms):
    """The embedded default: an SQL catalog in ``<warehouse>/catalog.db``."""
    from icecrypt.catalog import load_catalog

    return load_catalog("test", warehouse=warehouse, kms=kms)


# --- PostgreSQL ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    pid: int
    user: str  # the database superuser (trust authentication on 127.0.0.1)

    def uri(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg2

        name = f"t_{uuid.uuid4().hex[:16]}"
        conn = psycopg2.connect(host=self.host, port=self.port, user=self.user, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return name


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else None


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to run PostgreSQL as; None = as we are (not root)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        entry = pwd.getpwnam(PG_USER)
    return entry.pw_uid, entry.pw_gid


def _stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Fast shutdown (SIGINT) of the postmaster by its PID; its group killed if it hangs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)


def _wait_ready(server: PostgresServer, proc: subprocess.Popen, root: str, timeout: float = 60.0) -> None:
    """The port opens before PostgreSQL accepts sessions ("the database system is
    starting up"): wait until a connection succeeds."""
    import psycopg2

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg2.connect(host=server.host, port=server.port, user=server.user, dbname="postgres", connect_timeout=5).close()
            return
        except psycopg2.OperationalError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(root, "postgres.log"), "rb") as f:
                    log = f.read()[-2000:].decode(errors="replace")
                raise ServerStartError(f"PostgreSQL on {server.host}:{server.port} not ready: {exc}; log: {log}") from None
            time.sleep(0.1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the session (see the module docstring)."""
    bindir = _pg_bin()
    if bindir is None:
        unavailable("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/postgres)")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        unavailable("psycopg2 is not installed")
    try:
        ids = _run_as()
    except (OSError, subprocess.SubprocessError, KeyError) as exc:
        unavailable(f"no unprivileged user to run PostgreSQL as ({exc})")
    root = tempfile.mkdtemp(prefix="icecrypt-pg-")
    proc = None
    try:
        data, sockets = os.path.join(root, "data"), os.path.join(root, "run")
        os.mkdir(sockets)
        owner = {}
        if ids is not None:
            for path in (root, sockets):
                os.chown(path, *ids)
            owner = {"user": ids[0], "group": ids[1], "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        env.pop("PGDATA", None)
        log = os.path.join(root, "initdb.log")
        with open(log, "wb") as out:
            done = subprocess.run(
                [os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                 "--no-sync", "--no-instructions"],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, timeout=120, **owner,
            )  # fmt: skip
        if done.returncode != 0:
            with open(log, "rb") as f:
                raise ServerStartError(f"initdb failed: {f.read()[-2000:].decode(errors='replace')}")
        port = free_port()
        server_log = open(os.path.join(root, "postgres.log"), "wb")  # noqa: SIM115 (closed below)
        try:
            proc = subprocess.Popen(
                [os.path.join(bindir, "postgres"), "-D", data, "-h", HOST, "-p", str(port), "-k", sockets,
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=100", "-c", "shared_buffers=32MB"],
                stdin=subprocess.DEVNULL, stdout=server_log, stderr=subprocess.STDOUT, env=env, cwd=root,
                start_new_session=True, **owner,
            )  # fmt: skip
        finally:
            server_log.close()
        watch(proc.pid, remove=root)  # stopped and removed even if pytest is killed
        try:
            wait_for_port(HOST, port, timeout=30, proc=proc)
        except ServerStartError as exc:
            with open(os.path.join(root, "postgres.log"), "rb") as f:
                raise ServerStartError(f"{exc}: {f.read()[-2000:].decode(errors='replace')}") from None
        server = PostgresServer(HOST, port, proc.pid, "postgres")
        _wait_ready(server, proc, root)
        yield server
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
        if proc is not None:
            unwatch(proc.pid, remove=root)


@pytest.fixture
def postgres_uri(postgres_server) -> str:
    """The SQLAlchemy URI of a fresh database of the session's PostgreSQL server."""
    return postgres_server.uri(postgres_server.create_database())


@pytest.fixture
def postgres_catalog(postgres_uri, warehouse, kms):
    from icecrypt.catalog import load_catalog

    return load_catalog("test", uri=postgres_uri, warehouse=warehouse, kms=kms)


@pytest.fixture
def race_once(monkeypatch):
    """``race_once(other_commit)``: the next catalog swap finds that ``other_commit``
    committed just before it."""
    from icecrypt.table.commit import store as _commit

    original = _commit.commit_metadata_to_store
    state = {"raced": False}

    def arm(other_commit):
        def racing(*args, **kwargs):
            if not state["raced"]:
                state["raced"] = True
                other_commit()
            return original(*args, **kwargs)

        monkeypatch.setattr(_commit, "commit_metadata_to_store", racing)

    return arm
