"""Faults injected into the filesystem calls of each table operation, with the invariants
of ``faultlib``: a raised OSError at every counted call, ENOSPC at every call site of the
calls that can run out of space (first and last call of each; see ``_sweep_points``), and
SIGKILL of a forked child at sampled calls."""

from __future__ import annotations

import collections
import errno
import os
import signal
import sys
import warnings

import pytest
from faultfs import FaultPlan
from faultlib import MULTI_COMMIT, OPERATIONS, _listing, check_retry, check_state, sample_points

#: every call of every operation: minutes of work, for `make test` (not `make test-quick`)
pytestmark = pytest.mark.slow

#: calls that allocate or change storage: where ENOSPC can happen
SPACE_CALLS = {"open_output_stream", "open_append_stream", "write", "close", "create_dir", "move", "copy_file"}
#: kill points per operation (first/last call and each call kind always included)
KILL_POINTS = int(os.environ.get("ICECRYPT_FAULT_KILL_POINTS", "24"))

SUMMARY: dict[tuple[str, str], str] = {}


def _sweep_points(ref, kind):
    """Every counted call for ``error``.  For ``enospc``, the first and the last call that
    can run out of space from each call site (the Python stack that made the call, as the
    fault-free reference run recorded it).

    Why that keeps what the ENOSPC sweep proves: both kinds raise the same ``OSError``
    subclass at call N and icecrypt's table code has no errno-dependent branch (its only
    errno checks are ELOOP/ENOTDIR in ``_paths`` and the FileNotFoundError of a missing
    file), so the state left after ENOSPC at call N is the state the ``error`` sweep
    checks at every call N.  What ENOSPC adds is that "no space left" still reaches the
    caller, which depends on the path the exception takes, i.e. on the call site; calls
    from one site (a Parquet file's Nth write from Arrow's native writer, the second file
    of a loop) take the same path and differ only in what was written before them."""
    if kind != "enospc":
        return list(range(1, len(ref.census) + 1))
    by_site: dict = {}
    for i, (op, _) in enumerate(ref.census, 1):
        if op in SPACE_CALLS:
            by_site.setdefault(ref.sites[i - 1], []).append(i)
    return sorted({calls[0] for calls in by_site.values()} | {calls[-1] for calls in by_site.values()})


@pytest.mark.parametrize("kind", ["error", "enospc"])
@pytest.mark.parametrize("name", list(OPERATIONS))
def test_fault_at_every_call(world, references, name, kind):
    ref = references[name]
    points = _sweep_points(ref, kind)
    if kind == "enospc" and not points:
        # Nothing it does allocates space (remove_orphan_files only reads and deletes).
        assert all(op not in SPACE_CALLS for op, _ in ref.census)
        SUMMARY[(name, kind)] = "no call that can run out of space"
        return
    assert points, f"{name}: no injection point"
    failures, outcomes = [], collections.Counter()
    for n in points:
        root = world.fresh(f"{kind}-{name}-{n}".replace(" ", "_").replace("(", "").replace(")", ""))
        old_files = set(_listing(root))
        table, handler = world.load(root)
        handler.plan = FaultPlan(at=n, kind=kind)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                OPERATIONS[name](table)
            raised = None
        except Exception as exc:  # noqa: BLE001 - any error is fine; the state is what is checked
            raised = exc
        fired = handler.plan.fired
        handler.plan = FaultPlan()
        try:
            assert fired is not None, f"call {n} never happened (census changed?)"
            if kind == "enospc":  # the sample was chosen by call site: it must be the call meant
                assert fired[0] == ref.census[n - 1][0], f"call {n} is {fired[0]}, not {ref.census[n - 1][0]} (census changed?)"
            if raised is not None and kind == "enospc":
                assert _has_errno(raised, errno.ENOSPC), f"ENOSPC lost: {type(raised).__name__}: {raised}"
            # strict after a raised fault: nothing of the failed operation may be left.
            # An operation that succeeded although a best-effort step failed (a delete
            # of files it replaced) may leave orphans, for remove_orphan_files.
            outcome = check_state(world, root, ref, strict=raised is not None, old_files=old_files)
            # An operation that raised committed nothing: a caller who retries it (as
            # any caller would) must not apply it twice.
            if name not in MULTI_COMMIT:
                assert raised is None or outcome.version == ref.old_version, "raised, yet committed"
            check_retry(world, table, root, name, ref, outcome.version)
            outcomes["new" if outcome.version == ref.new_version else "old"] += 1
            outcomes["raised" if raised is not None else "succeeded"] += 1
        except AssertionError as exc:
            failures.append(f"call {n} {fired}: {exc} (operation raised {type(raised).__name__}: {raised})")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"call {n} {fired}: {type(exc).__name__}: {exc} (operation raised {raised!r})")
    SUMMARY[(name, kind)] = f"{len(points)} points: {dict(outcomes)}"
    print(f"\n{name} [{kind}]: {len(points)} injection points of {len(ref.census)} counted calls "
          f"({sum(op in SPACE_CALLS for op, _ in ref.census)} that can run out of space, "
          f"{len(set(s for s, (op, _) in zip(ref.sites, ref.census) if op in SPACE_CALLS))} sites) "
          f"({dict(collections.Counter(op for op, _ in ref.census))}); {dict(outcomes)}")
    assert not failures, f"{name} [{kind}]: {len(failures)} of {len(points)} points failed:\n" + "\n".join(failures)


def _has_errno(exc: BaseException, number: int) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if getattr(exc, "errno", None) == number or os.strerror(number) in str(exc) or "no space left" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_kill_at_sampled_calls(world, references, name):
    """SIGKILL of a forked child at the Nth call; the parent checks what is on disk."""
    ref = references[name]
    points = sample_points(ref.census, KILL_POINTS)
    failures, outcomes = [], collections.Counter()
    for n in points:
        root = world.fresh(f"kill-{name}-{n}".replace(" ", "_").replace("(", "").replace(")", ""))
        pid = os.fork()
        if pid == 0:  # the child: run the operation, die at call n
            code = 3
            try:
                table, handler = world.load(root)
                handler.plan = FaultPlan(at=n, kind="kill")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    OPERATIONS[name](table)
                code = 0
            except BaseException:  # noqa: BLE001
                code = 4
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        try:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
                f"child was not killed at call {n} (status {status:#x})"
            outcome = check_state(world, root, ref, strict=False, old_files=set())
            table, _ = world.load(root)
            check_retry(world, table, root, name, ref, outcome.version)
            outcomes["new" if outcome.version == ref.new_version else "old"] += 1
            if outcome.orphans:
                outcomes["left orphans"] += 1
            if outcome.temporaries:
                outcomes["left temporaries"] += 1
        except AssertionError as exc:
            failures.append(f"call {n} {ref.census[n - 1]}: {exc}")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"call {n} {ref.census[n - 1]}: {type(exc).__name__}: {exc}")
    print(f"\n{name} [kill]: {len(points)} of {len(ref.census)} calls {points}; {dict(outcomes)}")
    assert not failures, f"{name} [kill]: {len(failures)} of {len(points)} points failed:\n" + "\n".join(failures)
