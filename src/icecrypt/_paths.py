"""Whether a location belongs to a table: one normalization and one containment rule.

Locations in Iceberg metadata (``metadata.json``, manifest lists, manifests) are not
authenticated: whoever can write a table's storage can name any path there.  A table
operation therefore reads, writes, lists and deletes only locations that lie under one of
the table's *pinned roots* (the table location and, when the table sets them,
``write.data.path`` / ``write.metadata.path``, as the table object pinned them; see
``icecrypt.table.commit.pin``), or under a location the caller allowed explicitly.

The rule, in one place (:func:`parse_location`, :meth:`ParsedLocation.within`):

- A location is refused outright (:class:`UnsafeLocationError`) if it holds a NUL,
  another control character or a backslash, or a path segment whose percent-decoding
  is ``.`` or ``..`` or holds NUL.  Percent-encoding is otherwise *not* decoded:
  Iceberg writes partition values percent-encoded into directory names
  (``category=N%2FA``, ``path=a%5Cb``), and every layer icecrypt opens files through
  takes those names literally (pyarrow's local and S3 filesystems, fsspec, Hadoop's
  ``Path(String)`` in Spark), so an encoded ``/`` or ``\\`` is a character of one
  name, never a separator, and ``%2e%2e`` can never be read as a parent directory by
  one layer and as a name by another (Java never writes one: its escaping keeps ``.``
  and every segment it writes holds ``=``).
- The scheme is compared case-insensitively (``s3a`` and ``s3n`` count as ``s3``); the
  authority (bucket, host) exactly.  ``file:/p``, ``file:///p``, ``file://localhost/p``
  and, on a local filesystem, a plain ``/p`` are one location; a relative plain path on
  a local filesystem is taken from the working directory.
- The path is normalized lexically: ``//`` collapses, ``.`` segments go, ``..`` removes
  the segment before it (never above the root), a trailing ``/`` goes.  Callers then
  touch storage through the normalized form, so what is checked is what is opened.
- A location is inside a root when scheme and authority are equal and its path is the
  root's path or continues it after a ``/`` (``/t`` does not contain ``/t2``).

A foreign scheme is never dropped: ``gs://other/x`` is not inside ``s3://bucket/t`` even
on a filesystem that would open both as ``bucket-or-other/key``.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
from collections.abc import Iterable, Iterator
from typing import NamedTuple
from urllib.parse import unquote

from icecrypt.errors import PathOutsideTableError

__all__ = [
    "Confinement",
    "ParsedLocation",
    "UnsafeLocationError",
    "check_location_text",
    "normalize_path",
    "parse_location",
    "open_directory_nofollow",
    "under_root",
    "unlink_beneath",
    "walk_files_beneath",
]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")
_SEPARATOR = re.compile(r"[/\\]")
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


class UnsafeLocationError(PathOutsideTableError):
    """A location that no table operation touches whatever its roots: control characters,
    a backslash, or an encoded dot segment or NUL."""


def check_location_text(location: str, *, encoded_separators: bool = False) -> None:
    """Refuse (:class:`UnsafeLocationError`) text no location may hold (see the module
    docstring).  ``encoded_separators``: whether a segment may hold ``%2F`` or ``%5C``
    (a table location may: Java's partition directories do; a name that becomes one
    segment of a location, such as a catalog identifier's level, may not)."""
    if not isinstance(location, str):
        raise TypeError(f"a location must be a str, not {type(location).__name__}")
    bad = _FORBIDDEN.search(location)
    if bad is not None:
        what = "a backslash" if bad.group() == "\\" else f"the control character {bad.group()!r}"
        raise UnsafeLocationError(f"location {location!r} holds {what} (refused)", location=location)
    if "%" in location:
        for segment in location.split("/"):
            if "%" not in segment:
                continue
            decoded = unquote(segment)
            # Other encoded characters stay: they are literal text in a name (Iceberg
            # percent-encodes partition values such as "N/A", "a\\b" or "a\x1bb" into
            # directory names) and no layer decodes them, so they cannot change which
            # directory a path names.  A segment that would decode to a dot segment, and
            # an encoded NUL, have no such use and are refused.
            if decoded != segment and (
                decoded in (".", "..") or "\x00" in decoded or (not encoded_separators and _SEPARATOR.search(decoded))
            ):
                what = "a dot segment or NUL" if encoded_separators else "a dot segment, separator or NUL"
                raise UnsafeLocationError(
                    f"location {location!r} holds the percent-encoded segment {segment!r} ({what} once decoded; "
                    "refused)",
                    location=location,
                )


def normalize_path(path: str) -> str:
    """``path`` normalized lexically: duplicate ``/`` collapsed, ``.`` segments removed,
    ``..`` applied (never above the root of an absolute path; kept at the front of a
    relative one), no trailing ``/`` (``/`` stays ``/``).  Nothing is decoded and no
    symlink is looked at."""
    if "//" not in path and "/." not in path and not path.startswith(".") and path and (path == "/" or path[-1] != "/"):
        return path  # already normal (the common case: no dot segment, no empty one)
    absolute = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not absolute:
                parts.append(part)
            continue
        parts.append(part)
    joined = "/".join(parts)
    if absolute:
        return "/" + joined
    return joined or "."


class ParsedLocation(NamedTuple):
    """A location in canonical form: ``scheme`` (lower case, ``""`` for a plain path on a
    non-local filesystem), ``authority`` (bucket or host, as written) and ``path``
    (normalized)."""

    scheme: str
    authority: str
    path: str

    def within(self, root: ParsedLocation) -> bool:
        """Whether this location is ``root`` or lies under it, on segment boundaries."""
        if self.scheme != root.scheme or self.authority != root.authority:
            return False
        if root.path == "/":
            return self.path.startswith("/")
        if root.path == ".":  # the root of a filesystem that takes relative paths
            return self.path != ".." and not self.path.startswith(("/", "../"))
        return self.path == root.path or self.path.startswith(root.path + "/")

    def __str__(self) -> str:
        if self.scheme == "":
            return self.path
        return f"{self.scheme}://{self.authority}{self.path}"


def parse_location(location: str, *, local: bool) -> ParsedLocation:
    """``location`` in canonical form; :class:`UnsafeLocationError` for what is refused
    whatever the roots (see the module docstring).  ``local``: the location is opened on
    a local filesystem (a plain path is then a ``file`` path, relative ones from the
    working directory)."""
    check_location_text(location, encoded_separators=True)
    match = _SCHEME.match(location)
    if match is None or len(match.group(1)) == 1:  # a plain path (a drive letter is none)
        if local:
            return ParsedLocation("file", "", normalize_path(os.path.join(os.getcwd(), location)))
        return ParsedLocation("", "", normalize_path(location))
    scheme = match.group(1).lower()
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    rest = location[match.end() :]
    authority = ""
    if rest.startswith("//"):
        rest = rest[2:]
        cut = rest.find("/")
        authority, rest = (rest, "/") if cut < 0 else (rest[:cut], rest[cut:])
    if scheme == "file":
        if authority.lower() == "localhost":
            authority = ""
        if not rest.startswith("/"):
            rest = os.path.join(os.getcwd(), rest) if local else rest
    elif not rest.startswith("/"):
        rest = "/" + rest
    return ParsedLocation(scheme, authority, normalize_path(rest))


class Confinement:
    """The roots a table's files may live under, and the check against them.

    ``roots`` and ``allowed`` are canonical locations as they will be compared (the
    location map already applied); ``allowed`` are extra locations the caller lets the
    table use (files a table legitimately references elsewhere).  ``table`` names the
    table in error messages."""

    def __init__(self, roots: Iterable[ParsedLocation], *, allowed: Iterable[ParsedLocation] = (), table: str):
        self.roots = tuple(roots)
        if not self.roots:
            raise ValueError("a confinement needs at least one root")
        self.allowed = tuple(allowed)
        self.table = table

    def contains(self, parsed: ParsedLocation, *, roots_only: bool = False) -> bool:
        """Whether ``parsed`` lies under a root (or an allowed location, unless
        ``roots_only``: deletes never reach beyond the table's own roots)."""
        return any(parsed.within(r) for r in (self.roots if roots_only else (*self.roots, *self.allowed)))

    def check(self, location: str, parsed: ParsedLocation, *, what: str = "file", roots_only: bool = False) -> ParsedLocation:
        """``parsed`` (the canonical, mapped form of ``location``) if it is inside;
        otherwise :class:`PathOutsideTableError` naming ``location`` and the table."""
        if not self.contains(parsed, roots_only=roots_only):
            raise PathOutsideTableError(
                f"{what} {location} lies outside table {self.table} (refused: a table's files lie under its "
                "location, write.data.path or write.metadata.path; EncryptedTable.load(allowed_locations=...) "
                "lets it read elsewhere)",
                location=location, table_location=self.table,
            )
        return parsed

    def __repr__(self) -> str:
        return f"<Confinement roots={[str(r) for r in self.roots]} allowed={[str(a) for a in self.allowed]}>"


def fs_path_of(parsed: ParsedLocation, *, local: bool, original: str) -> str:
    """The path on the filesystem of a canonical location (as ``Locations.to_fs_path``
    maps it: ``file`` paths as they are, other schemes without scheme on object stores)."""
    if parsed.scheme in ("", "file"):
        if parsed.scheme == "file" and parsed.authority:
            raise PathOutsideTableError(
                f"{original}: a file:// location on host {parsed.authority!r} cannot be opened here (refused)",
                location=original,
            )
        return parsed.path
    if local:
        raise ValueError(
            f"{original}: a {parsed.scheme}:// location cannot be read from the local filesystem; "
            "pass the filesystem that holds it, or a location_map to where it was copied"
        )
    return parsed.authority + parsed.path if parsed.path != "/" else parsed.authority


# --- deleting without following symbolic links ------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def under_root(path: str, roots: Iterable[str]) -> str | None:
    """The longest of ``roots`` (normalized filesystem paths) that ``path`` lies under."""
    found = None
    for root in roots:
        if (path == root or path.startswith(root.rstrip("/") + "/")) and (found is None or len(root) > len(found)):
            found = root
    return found


def open_directory_nofollow(path: str) -> int:
    """A file descriptor of the directory ``path`` opened with ``O_NOFOLLOW``: a symbolic
    link as its last component raises PathOutsideTableError (FileNotFoundError when it
    does not exist, NotADirectoryError when it is a file)."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise PathOutsideTableError(f"{path} is a symbolic link (refused)", location=path) from None
        raise


def unlink_beneath(root: str, path: str, *, root_fd: int | None = None) -> None:
    """Delete the local file ``path`` (normalized, under the directory ``root``) without
    following a symbolic link at or below ``root``: the root is opened with ``O_NOFOLLOW``
    (or is ``root_fd``, a descriptor the caller opened and checked, e.g.
    ``Locations.open_root``), every directory between it and the file is opened relative
    to its parent with ``O_NOFOLLOW`` and the file is unlinked relative to the last one, so
    a directory swapped for a link at any moment makes the call fail
    (PathOutsideTableError) instead of deleting elsewhere.  A symbolic link as the last
    component is itself removed, never its target.  FileNotFoundError when missing."""
    relative = path[len(root.rstrip("/")) + 1 :] if path != root else ""
    parts = relative.split("/") if relative else []
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise PathOutsideTableError(f"{path}: not a file below {root} (refused)", location=path, table_location=root)
    fd = os.dup(root_fd) if root_fd is not None else open_directory_nofollow(root)
    try:
        for depth, part in enumerate(parts[:-1], 1):
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                here = posixpath.join(root, *parts[:depth])
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(here):
                    raise PathOutsideTableError(
                        f"{path}: reached through the symbolic link {here} (not deleted: deletes never follow links)",
                        location=path, table_location=root,
                    ) from None
                raise
            os.close(fd)
            fd = next_fd
        os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def walk_files_beneath(root: str, root_fd: int) -> Iterator[tuple[str, int]]:
    """(path, modification time in ns) of every regular file below the local directory
    ``root``, whose descriptor the caller opened and checked (``root_fd``, not closed
    here).  Every directory is opened relative to its parent with ``O_NOFOLLOW``:
    symbolic links are neither followed nor listed, and a directory swapped for a link
    during the walk is skipped, never entered."""
    stack: list[tuple[str, int]] = [(root.rstrip("/") or "/", os.dup(root_fd))]
    try:
        while stack:
            directory, fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    listed = [(e.name, e.is_symlink(), e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                              for e in entries]  # fmt: skip
                for name, is_link, is_dir, is_file in listed:
                    if is_link:
                        continue
                    here = f"{directory}/{name}" if directory != "/" else f"/{name}"
                    if is_dir:
                        try:
                            stack.append((here, os.open(name, _DIR_FLAGS, dir_fd=fd)))
                        except OSError:
                            continue  # gone, or swapped for a link meanwhile: never entered
                    elif is_file:
                        try:
                            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        except OSError:
                            continue
                        if stat.S_ISREG(st.st_mode):
                            yield here, st.st_mtime_ns
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
