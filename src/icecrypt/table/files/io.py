"""Where the read path touches storage: location mapping, encrypted and plaintext Avro
container files (manifest lists, manifests), small whole files (Puffin), and the errors
that name the file.

A table records absolute locations (``s3://bucket/table/data/...``).  :class:`Locations`
turns them into paths on the pyarrow filesystem the table is read through, after an
optional prefix rewrite (``location_map``) for tables that moved.

Every reader here takes the table's mode: in an encrypted table a file must come with key
metadata holding ``file_length`` (the trusted ciphertext length, SPEC.md §1.4) and must be
an AGS1 stream; a plaintext file there is a :class:`PlaintextFileError`, never read.
"""

from __future__ import annotations

import contextlib
import os
import hashlib
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs

from icecrypt import ags1
from icecrypt._paths import (
    Confinement,
    ParsedLocation,
    UnsafeLocationError,
    check_location_text,
    fs_path_of,
    normalize_path,
    parse_location,
    under_root,
    unlink_beneath,
)
from icecrypt.errors import DecryptionError, FormatError, PathOutsideTableError
from icecrypt.keys import StandardKeyMetadata

__all__ = [
    "Deletions",
    "Locations",
    "PathOutsideTableWarning",
    "delete_file",
    "PlaintextFileError",
    "file_key_metadata",
    "fingerprint",
    "open_avro",
    "open_plain_avro",
    "read_small_file",
    "read_whole",
    "reading",
]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_AGS1_MAGIC = b"AGS1"

#: first bytes of files that are plaintext where an encrypted file is expected
_PLAINTEXT_MAGICS = {b"Obj\x01": "a plaintext Avro file", b"PAR1": "a plaintext Parquet file", b"PFA1": "a plaintext Puffin file"}


class PlaintextFileError(FormatError):
    """A file of an encrypted table is stored or referenced without encryption: no key
    metadata where the table needs it, or plaintext bytes where an encrypted file is
    expected.  Never read (fail closed)."""


class Locations:
    """Maps locations recorded in table metadata to paths on ``filesystem``.

    ``location_map`` rewrites prefixes (longest match first, on path boundaries), e.g.
    ``{"s3://icecrypt-golden/t": "/data/t"}``.  After that, ``file:`` URIs become local
    paths; other URIs (``s3://bucket/key``) lose their scheme (``bucket/key``, what
    pyarrow's S3/GCS filesystems expect), which the local filesystem refuses.
    Picklable (pyarrow filesystems pickle), so executors can resolve paths too.

    A table's own ``Locations`` is *confined* (:meth:`confined`): :meth:`to_fs_path` then
    maps only locations under the table's pinned roots (or the caller's allowed
    locations), normalized as ``icecrypt._paths`` says, and raises
    :class:`~icecrypt.errors.PathOutsideTableError` for any other; :meth:`is_inside`
    asks without raising (deletes skip what is outside).  :meth:`unconfined` is the
    same mapping without the check, for locations from a trusted source (the caller,
    the catalog database).
    """

    def __init__(self, filesystem: pafs.FileSystem | None = None, location_map: Mapping[str, str] | None = None):
        if filesystem is not None and not isinstance(filesystem, pafs.FileSystem):
            raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem, not {type(filesystem).__name__}")
        self.filesystem: pafs.FileSystem = filesystem if filesystem is not None else pafs.LocalFileSystem()
        self.location_map: dict[str, str] = {}
        for prefix, target in (location_map or {}).items():
            if not isinstance(prefix, str) or not isinstance(target, str) or not prefix:
                raise TypeError("location_map must map non-empty str prefixes to str targets")
            self.location_map[prefix.rstrip("/") or prefix] = os.fspath(target).rstrip("/") or "/"
        # longest prefix first, so nested mappings pick the most specific one
        self._prefixes = sorted(self.location_map, key=len, reverse=True)
        self._local = isinstance(self.filesystem, pafs.LocalFileSystem)
        # (roots, allowed) as given, and the check built from them (None = unconfined)
        self._confine: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._confinement: Confinement | None = None

    def confined(self, roots: Sequence[str], *, allowed_locations: Sequence[str] = ()) -> Locations:
        """A copy that maps only locations under ``roots`` (the table's pinned locations,
        as recorded) or ``allowed_locations`` (extra locations the caller lets the table
        use), each with the location map applied.

        On the local filesystem the roots are resolved here, once: their real paths (what
        reads through a symbolic link are compared with), and the identity (device and
        inode) of each root directory that exists, which every delete and listing under
        it checks again (:meth:`open_root`); :meth:`check_roots` refuses a root that is
        itself a symbolic link."""
        roots = tuple(r for r in roots if r)
        copy = Locations(self.filesystem, self.location_map)
        copy._confine = (roots, tuple(allowed_locations))
        copy._confinement = Confinement(
            [copy.canonical(r) for r in roots], allowed=[copy.canonical(a) for a in allowed_locations],
            table=roots[0] if roots else "?",
        )
        if copy._local:
            copy._real_roots()
            copy._root_identities()
        return copy

    def normalized_fs_path(self, location: str) -> str:
        """The normalized path on ``filesystem`` of ``location`` (a recorded location or a
        path), with the location map applied and no confinement: for comparing a
        location from a trusted source with one read from storage."""
        return fs_path_of(self.canonical(os.fspath(location)), local=self._local, original=os.fspath(location))

    def _root_identities(self) -> dict[str, tuple[tuple[int, int] | None, str]]:
        """For each pinned root on the local filesystem: ((device, inode) of the directory
        when it exists and is not a symbolic link, None when it does not exist yet, the
        marker (-1, -1) when it is a link), and its real path.  Taken once (the pin's
        moment)."""
        cached = self.__dict__.get("_root_ids")
        if cached is None:
            cached = {}
            for root in self.fs_roots() if self._local else ():  # object stores have no links
                real = os.path.realpath(root)
                try:
                    st = os.lstat(root)
                except FileNotFoundError:
                    cached[root] = (None, real)
                    continue
                except OSError:
                    cached[root] = ((-1, -1), real)
                    continue
                cached[root] = ((-1, -1) if stat.S_ISLNK(st.st_mode) else (st.st_dev, st.st_ino), real)
            self.__dict__["_root_ids"] = cached
        return cached

    def check_roots(self, what: str) -> None:
        """Refuse (PathOutsideTableError) a pinned root that is a symbolic link on the local
        filesystem: whoever planted it would steer every listing and delete of the table
        (orphan removal, expiry) into its target.  Directories above a root are the
        operator's and are resolved once, here."""
        for root, (identity, _) in self._root_identities().items():
            if identity == (-1, -1):
                raise PathOutsideTableError(
                    f"{what}: the table root {root} is a symbolic link (or cannot be examined); refused: a table's "
                    "location, write.data.path and write.metadata.path must be directories, never links to them",
                    location=root, table_location=root,
                )  # fmt: skip

    def open_root(self, root: str) -> int:
        """A file descriptor of the pinned local root ``root`` (a path :meth:`fs_roots`
        returned), opened without following a link and checked to be the directory the
        pin resolved: the same device and inode, or, for a root that did not exist then,
        the same real path.  PathOutsideTableError when it changed (a directory swapped
        for a link, or replaced)."""
        from icecrypt._paths import open_directory_nofollow

        table = self._confinement.table if self._confinement is not None else root
        identity, real = self._root_identities().get(root) or (None, os.path.realpath(root))
        try:
            fd = open_directory_nofollow(root)
        except PathOutsideTableError:
            raise PathOutsideTableError(
                f"{root}: the table root is now a symbolic link (refused: nothing is listed or deleted through it)",
                location=root, table_location=table,
            ) from None
        st = os.fstat(fd)
        if identity is None:
            changed = os.path.realpath(root) != real
        else:
            changed = (st.st_dev, st.st_ino) != identity
        if changed:
            os.close(fd)
            raise PathOutsideTableError(
                f"{root}: the table root is not the directory it was when the table was loaded (replaced or moved; "
                "refused: nothing is listed or deleted under it)",
                location=root, table_location=table,
            )  # fmt: skip
        return fd

    @property
    def unconfined(self) -> Locations:
        """The same mapping without the confinement (for trusted locations only)."""
        return self if self._confinement is None else Locations(self.filesystem, self.location_map)

    @property
    def confinement(self) -> Confinement | None:
        return self._confinement

    def canonical(self, location: str) -> ParsedLocation:
        """``location`` normalized (``icecrypt._paths.parse_location``), then mapped by
        the location map (whose prefixes are compared normalized too)."""
        parsed = parse_location(location, local=self._local)
        for prefix, target in self._canonical_prefixes():
            if parsed.scheme == prefix.scheme and parsed.authority == prefix.authority:
                rest = _below(parsed.path, prefix.path)
                if rest is not None:  # the normalized remainder, "" or "/..."
                    if target.path == "/":
                        return ParsedLocation(target.scheme, target.authority, rest or "/")
                    return ParsedLocation(target.scheme, target.authority, target.path + rest)
        return parsed

    def _canonical_prefixes(self) -> list[tuple[ParsedLocation, ParsedLocation]]:
        """The location map with both sides normalized, longest prefix first."""
        cached = self.__dict__.get("_canonical_map")
        if cached is None:
            cached = []
            for prefix in self._prefixes:
                try:
                    cached.append((parse_location(prefix, local=self._local),
                                   parse_location(self.location_map[prefix], local=self._local)))
                except (PathOutsideTableError, ValueError):
                    continue
            cached.sort(key=lambda item: len(item[0].path), reverse=True)
            self.__dict__["_canonical_map"] = cached
        return cached

    def map_location(self, location: str) -> str:
        """``location`` with the ``location_map`` applied (still a location, not a path)."""
        for prefix in self._prefixes:
            if location == prefix or location.startswith(prefix + "/"):
                return self.location_map[prefix] + location[len(prefix) :]
        return location

    def to_fs_path(self, location: str | os.PathLike[str], *, what: str = "file",
                   verified: set[str] | None = None) -> str:
        """The path of ``location`` on ``filesystem``; in a confined ``Locations``, only
        for a location inside the table (else PathOutsideTableError naming ``what``),
        and then the normalized path: what was checked is what is opened.

        ``verified``: a set the caller keeps for one batch of lookups (the files of one
        scan plan): directories found free of symbolic links below a root are added to
        it and not looked at again in that batch (the file itself always is)."""
        path = self._confined_path(os.fspath(location), what=what)
        if self._local and self._confinement is not None:
            self._check_real_path(os.fspath(location), path, what=what, verified=verified)
        return path

    def _confined_path(self, location: str, *, what: str) -> str:
        """:meth:`to_fs_path` without the symbolic-link check (deletes never follow links)."""
        confinement = self._confinement
        if confinement is None:
            return self._fs_path(self.map_location(location), location)
        inside = self._in_checked_directory(location)
        if inside is not None:
            return fs_path_of(inside, local=self._local, original=location)
        try:
            parsed = self.canonical(location)
        except UnsafeLocationError as exc:
            raise UnsafeLocationError(
                f"{what} {location!r} of table {confinement.table}: {exc}", location=location,
                table_location=confinement.table,
            ) from None
        confinement.check(location, parsed, what=what)
        return fs_path_of(parsed, local=self._local, original=location)

    def _in_checked_directory(self, location: str) -> ParsedLocation | None:
        """The canonical form of ``location`` when it names a plain file in a directory
        already found inside the table, from that directory's canonical form (kept per
        directory: the lexical rule is a function of the text alone, and the files of a
        table share a few directories); None when the full rule must run.  Exactly what
        :meth:`canonical` and the confinement check would give: the name is checked as
        ``parse_location`` checks each segment, and directories under which a location
        map prefix begins, or that lie outside every root, are never kept."""
        head, _, name = location.rpartition("/")
        if not head or name in ("", ".", "..") or not (head[0] == "/" or _DIRECTORY_URI.match(head)):
            return None
        memo = self.__dict__.setdefault("_directories", {})
        parsed = memo.get(head, False)
        if parsed is False:
            parsed = self._checked_directory(head)
            if len(memo) >= 4096:
                memo.clear()
            memo[head] = parsed
        if parsed is None:
            return None
        try:
            check_location_text(name)
        except UnsafeLocationError:
            return None  # the full rule raises, naming the whole location
        return ParsedLocation(parsed.scheme, parsed.authority, f"{parsed.path}/{name}" if parsed.path != "/" else f"/{name}")

    def _checked_directory(self, head: str) -> ParsedLocation | None:
        """``head`` in canonical form if every file directly in it is inside the table by
        the same rule as the directory (see :meth:`_in_checked_directory`), else None."""
        try:
            raw = parse_location(head, local=self._local)
            parsed = self.canonical(head)
        except (PathOutsideTableError, ValueError):
            return None
        for prefix, _ in self._canonical_prefixes():  # a map prefix below it: a file may match it
            if prefix.scheme == raw.scheme and prefix.authority == raw.authority and prefix.path != raw.path \
                    and _below(prefix.path, raw.path) is not None:
                return None
        if self._confinement is None or not self._confinement.contains(parsed):
            return None
        return parsed

    def _check_real_path(self, location: str, path: str, *, what: str, verified: set[str] | None = None) -> None:
        """On the local filesystem, refuse (PathOutsideTableError) a path that a symbolic
        link in one of its components takes out of the table: its real path must lie under
        the real path of a root or an allowed location.  Lexical confinement alone would
        let ``data/x.parquet -> /elsewhere/payroll.parquet`` be read (and copied into the
        table by a rewrite).  Cheap for the usual path without links (one ``realpath``).
        What remains is a race: a component swapped for a link between this check and the
        open is followed (readers do not open with O_NOFOLLOW on every component)."""
        if self._no_link_below_a_root(path, verified):
            return  # the usual case: a few lstat calls below the root, no full realpath
        real = os.path.realpath(path)
        if real == path:
            return
        if any(_below(real, root) is not None for root in self._real_roots()):
            return
        table = self._confinement.table if self._confinement is not None else "?"
        raise PathOutsideTableError(
            f"{what} {location} lies outside table {table}: a symbolic link leads to {real} (refused: a table's "
            "files are read only under its location, write.data.path or write.metadata.path, or allowed_locations)",
            location=location, table_location=table,
        )  # fmt: skip

    def _no_link_below_a_root(self, path: str, verified: set[str] | None = None) -> bool:
        """Whether ``path`` lies lexically under a root (or allowed location) and neither
        that root's last component nor any component below it is a symbolic link (a
        component that does not exist yet has no link below it).  Components above a root
        are resolved once, with the root (``_real_roots``).  Directories in ``verified``
        (this batch found them free of links) are not looked at again; the ones found
        now are added."""
        if verified is not None and path.rpartition("/")[0] in verified:
            try:  # the usual case in a plan: the directory is known, only the file is looked at
                return not stat.S_ISLNK(os.lstat(path).st_mode)
            except FileNotFoundError:
                return True
            except OSError:
                return False
        for root in self._lexical_roots():
            rest = _below(path, root)
            if rest is None:
                continue
            current = root
            seen = []
            try:
                if verified is None or current not in verified:
                    if stat.S_ISLNK(os.lstat(current).st_mode):
                        return False
                    seen.append(current)
                parts = [part for part in rest.split("/") if part]
                for i, part in enumerate(parts):
                    current = f"{current.rstrip('/')}/{part}"
                    directory = i < len(parts) - 1
                    if directory and verified is not None and current in verified:
                        continue
                    if stat.S_ISLNK(os.lstat(current).st_mode):
                        return False
                    if directory:
                        seen.append(current)
            except FileNotFoundError:
                return True
            except OSError:
                return False
            if verified is not None:
                verified.update(seen)
            return True
        return False

    def _lexical_roots(self) -> tuple[str, ...]:
        """The filesystem paths (links not resolved) of the roots and allowed locations."""
        cached = self.__dict__.get("_lexical_roots_cache")
        if cached is None:
            confinement = self._confinement
            paths = []
            for root in (*confinement.roots, *confinement.allowed) if confinement is not None else ():
                try:
                    paths.append(fs_path_of(root, local=True, original=str(root)))
                except ValueError:  # not a local location
                    continue
            cached = self.__dict__["_lexical_roots_cache"] = tuple(paths)
        return cached

    def _real_roots(self) -> tuple[str, ...]:
        """The real paths (symbolic links resolved) of the roots and allowed locations,
        computed once per ``Locations`` (they come from the pin and the caller)."""
        cached = self.__dict__.get("_real_roots_cache")
        if cached is None:
            cached = self.__dict__["_real_roots_cache"] = tuple(os.path.realpath(p) for p in self._lexical_roots())
        return cached

    def fs_roots(self) -> list[str]:
        """The filesystem paths of the pinned roots (not of the allowed locations):
        what listings walk and deletes stay under.  Empty when unconfined."""
        if self._confinement is None:
            return []
        roots = []
        for root in self._confinement.roots:
            try:
                roots.append(fs_path_of(root, local=self._local, original=str(root)))
            except ValueError:  # a root this filesystem cannot open holds nothing here
                continue
        return roots

    def delete_path(self, location: str, *, what: str = "file") -> str:
        """The filesystem path to delete for ``location``: under the pinned roots only
        (an allowed location is read, never deleted), else PathOutsideTableError."""
        location = os.fspath(location)
        if self._confinement is None:
            return self.to_fs_path(location)
        path = self._confined_path(location, what=what)  # the link itself, never its target
        self._confinement.check(location, self.canonical(location), what=what, roots_only=True)
        return path

    def is_inside(self, location: str | os.PathLike[str]) -> bool:
        """Whether a confined ``Locations`` maps ``location`` (always True unconfined)."""
        if self._confinement is None:
            return True
        try:
            self.to_fs_path(location)
        except (PathOutsideTableError, ValueError):
            return False
        return True

    def _fs_path(self, mapped: str, location: str) -> str:
        match = _SCHEME.match(mapped)
        if match is None or len(match.group(1)) == 1:  # no scheme (a Windows drive letter is none)
            return os.path.abspath(mapped) if self._local else mapped
        scheme = match.group(1).lower()
        rest = mapped[match.end() :]
        if scheme == "file":
            # file:///abs, file:/abs, file://localhost/abs
            if rest.startswith("//"):
                rest = rest[2:]
                rest = rest[rest.index("/") :] if "/" in rest else "/"
            return rest
        if self._local:
            raise ValueError(
                f"{location}: a {scheme}:// location cannot be read from the local filesystem; "
                "pass the filesystem that holds it, or a location_map to where it was copied"
            )
        return rest.removeprefix("//")

    def __getstate__(self) -> dict[str, Any]:
        return {"filesystem": self.filesystem, "location_map": self.location_map, "confine": self._confine}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["filesystem"], state["location_map"])
        confine = state.get("confine")
        if confine is not None:
            roots, allowed = confine
            self._confine = confine
            self._confinement = self.confined(roots, allowed_locations=allowed)._confinement

    def __repr__(self) -> str:
        confined = "" if self._confinement is None else f" roots={list(self._confine[0])!r}"
        return f"<Locations filesystem={type(self.filesystem).__name__} location_map={self.location_map!r}{confined}>"


#: a location whose scheme and authority are followed by a path (``s3://bucket/...``)
_DIRECTORY_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://[^/]*/")


def _below(path: str, prefix: str) -> str | None:
    """What follows ``prefix`` in ``path`` (both normalized): "" when equal, "/rest" when
    below it on a segment boundary, None otherwise."""
    if path == prefix:
        return ""
    if prefix == "/":
        return path if path.startswith("/") else None
    if path.startswith(prefix) and path[len(prefix)] == "/":
        return path[len(prefix) :]
    return None


# --- deletes ---------------------------------------------------------------------------------


class Deletions:
    """Deletes of one table operation, confined to the table: what went, and what was
    skipped because it lies outside the pinned roots or behind a symbolic link
    (``skipped``: (location, reason)).  :meth:`warn` reports the skipped ones once."""

    def __init__(self, locations: Locations, operation: str):
        self.locations = locations
        self.operation = operation
        self.deleted: list[str] = []
        self.skipped: list[tuple[str, str]] = []

    def location(self, location: str, *, what: str = "file") -> bool:
        """Delete the file of a recorded ``location``; False when it is missing or was
        skipped.  Other OSErrors propagate."""
        try:
            path = self.locations.delete_path(location, what=what)
        except (PathOutsideTableError, ValueError) as exc:
            self.skipped.append((location, str(exc)))
            return False
        return self.path(path, location)

    def path(self, path: str, shown: str | None = None) -> bool:
        """Delete the file at filesystem ``path`` (a path under the pinned roots)."""
        try:
            delete_file(self.locations, path)
        except FileNotFoundError:
            return False
        except PathOutsideTableError as exc:
            self.skipped.append((shown or path, str(exc)))
            return False
        self.deleted.append(path)
        return True

    @property
    def skipped_locations(self) -> list[str]:
        return [location for location, _ in self.skipped]

    def warn(self, stacklevel: int = 3) -> None:
        if not self.skipped:
            return
        import warnings

        shown = "; ".join(reason for _, reason in self.skipped[:5])
        more = f" (and {len(self.skipped) - 5} more)" if len(self.skipped) > 5 else ""
        warnings.warn(
            f"{self.operation}: {len(self.skipped)} file(s) not deleted because they are not the table's: {shown}{more}",
            PathOutsideTableWarning,
            stacklevel=stacklevel,
        )


class PathOutsideTableWarning(UserWarning):
    """A table operation skipped deleting files its metadata named outside the table."""


def delete_file(locations: Locations, path: str) -> None:
    """Delete the file at filesystem ``path`` of a confined table: under one of its pinned
    roots, and on a local filesystem without following a symbolic link below the root
    (``icecrypt._paths.unlink_beneath``).  PathOutsideTableError otherwise;
    FileNotFoundError when missing."""
    fs = locations.filesystem
    if locations.confinement is None:
        fs.delete_file(path)
        return
    path = normalize_path(path) if path.startswith("/") or not locations._local else path
    root = under_root(path, locations.fs_roots())
    if root is None:
        raise PathOutsideTableError(
            f"{path} lies outside table {locations.confinement.table} (not deleted)",
            location=path, table_location=locations.confinement.table,
        )
    if isinstance(fs, pafs.LocalFileSystem):
        fd = locations.open_root(root)
        try:
            unlink_beneath(root, path, root_fd=fd)
        finally:
            os.close(fd)
    else:
        fs.delete_file(path)


# --- errors -------------------------------------------------------------------------------


def _magic(filesystem: pafs.FileSystem, path: str) -> bytes:
    try:
        with filesystem.open_input_file(path) as f:
            return f.read(4)
    except OSError:
        return b""


@contextlib.contextmanager
def reading(what: str, location: str, filesystem: pafs.FileSystem, path: str, *, encrypted: bool) -> Iterator[None]:
    """Name the file in what goes wrong while reading it.

    A missing file becomes ``FileNotFoundError("<what> <location> is missing")``; a file
    that fails to decrypt in an encrypted table but starts like a plaintext file becomes
    :class:`PlaintextFileError`; other icecrypt errors get the location in front unless
    they already name the path.
    """
    try:
        yield
    except FileNotFoundError as exc:
        raise FileNotFoundError(exc.errno, f"{what} {location} is missing ({path})") from exc
    except PlaintextFileError:
        raise
    except DecryptionError as exc:
        if encrypted:
            kind = _PLAINTEXT_MAGICS.get(_magic(filesystem, path))
            if kind is not None:
                raise PlaintextFileError(
                    f"{what} {location} is {kind}, but the table is encrypted (refused)"
                ) from exc
        message = str(exc)
        if location in message or path in message:
            raise
        raise type(exc)(f"{what} {location}: {message}") from exc


def file_key_metadata(raw: Any, what: str, location: str, *, encrypted: bool, needs_length: bool) -> StandardKeyMetadata | None:
    """The key metadata of a file referenced by a manifest or manifest list.

    In an encrypted table it must be present (else :class:`PlaintextFileError`),
    decodable, and for AGS1 files carry ``file_length``; in a plaintext table it must be
    absent (an encrypted file in a table without a key could not be read anyway).
    """
    if raw is None:
        if encrypted:
            raise PlaintextFileError(f"{what} {location} has no key metadata, but the table is encrypted (refused)")
        return None
    if not encrypted:
        raise FormatError(f"{what} {location} has key metadata, but the table has no encryption.key-id")
    try:
        km = raw if isinstance(raw, StandardKeyMetadata) else StandardKeyMetadata.decode(raw)
    except FormatError as exc:
        raise FormatError(f"{what} {location}: malformed key metadata ({exc})") from None
    if needs_length and km.file_length is None:
        raise FormatError(f"{what} {location}: key metadata has no file_length (needed to authenticate an AGS1 file)")
    return km


# --- Avro container files -------------------------------------------------------------------


def open_plain_avro(what: str, location: str, filesystem: pafs.FileSystem, path: str, *, kind: str) -> Any:
    """The records of an Avro file of a plaintext table, read with the same checks as
    an encrypted table's (schema, per-block budgets: ``icecrypt.avro._guard``); an AGS1
    file is refused (the table has no key for it)."""
    from icecrypt.avro import _unencrypted_records

    try:
        return _unencrypted_records(path, filesystem, kind=kind)
    except FormatError as exc:
        if _magic(filesystem, path) == _AGS1_MAGIC:  # not an Avro header: say why
            raise FormatError(f"{what} {location} is encrypted (AGS1), but the table has no encryption.key-id") from exc
        raise


@contextlib.contextmanager
def open_avro(
    what: str,
    location: str,
    locations: Locations,
    key_metadata: StandardKeyMetadata | None,
    *,
    encrypted: bool,
) -> Iterator[Any]:
    """The records of an Avro container file (``.schema``, ``.metadata``, iterable).

    Encrypted tables read through :func:`icecrypt.avro.read_records` (AGS1, trusted
    length); plaintext tables read plain Avro and refuse an AGS1 file.  Either way the
    schema must be one Iceberg writes for manifests and manifest lists and every block
    is decoded under a budget (``icecrypt.avro._guard``).  Errors, also those raised
    while iterating inside the ``with`` block, name the file.
    """
    fs = locations.filesystem
    path = locations.to_fs_path(location, what=what)
    with reading(what, location, fs, path, encrypted=encrypted):
        if encrypted:
            from icecrypt.avro import _records

            if key_metadata is None:
                raise PlaintextFileError(f"{what} {location} has no key metadata, but the table is encrypted (refused)")
            records = _records(path, key_metadata, fs, kind="metadata")
        else:
            records = open_plain_avro(what, location, fs, path, kind="metadata")
        try:
            yield records
        finally:
            records.close()


def read_small_file(
    what: str, location: str, locations: Locations, key_metadata: StandardKeyMetadata | None, *, encrypted: bool
) -> bytes:
    """The whole (decrypted and authenticated) content of a small file such as a Puffin
    file of deletion vectors: AGS1 with the trusted length in an encrypted table."""
    fs = locations.filesystem
    path = locations.to_fs_path(location, what=what)
    with reading(what, location, fs, path, encrypted=encrypted):
        if encrypted and key_metadata is None:
            raise PlaintextFileError(f"{what} {location} has no key metadata, but the table is encrypted (refused)")
        with fs.open_input_file(path) as f:
            data = read_whole(f, f"{what} {location}", key_metadata.file_length if encrypted else None)  # type: ignore[union-attr]
        if not encrypted:
            if data[:4] == _AGS1_MAGIC:
                raise FormatError(f"{what} {location} is encrypted (AGS1), but the table has no encryption.key-id")
            return data
        return ags1.decrypt(data, key_metadata.encryption_key, key_metadata.aad_prefix, length=key_metadata.file_length)  # type: ignore[union-attr]


def read_whole(f: Any, name: str, length: int | None) -> bytes:
    """All bytes of the open file ``f``; with a trusted ``length`` (the ``file_length``
    of its key metadata) the stored size is compared with it first, so a file swapped
    for a larger one is refused before it is read into memory."""
    if length is not None:
        stored = f.size()
        if stored != length:
            what = "truncated" if stored < length else "longer than its key metadata says"
            raise FormatError(f"{name}: file is {what}: {stored} bytes, expected {length}")
    return f.read()


def fingerprint(key: StandardKeyMetadata | bytes | None) -> str | None:
    """A non-secret name for a DEK (SHA-256 of the key bytes, 16 hex digits); never the key."""
    if key is None:
        return None
    if not isinstance(key, StandardKeyMetadata):
        key = StandardKeyMetadata.decode(key)
    return hashlib.sha256(b"icecrypt-key-fingerprint\0" + bytes(key.encryption_key)).hexdigest()[:16]
