"""Directory trees to and from tar streams.

Packing writes to an anonymous temporary file (so the upload has a Content-Length and can be retried on a stale
connection) without holding file contents in memory. Unpacking reads the HTTP response as a forward-only stream
and extracts member by member with our own checks, because the tarfile extraction filters only arrived in
Python 3.11.4 and a sandbox's tar stream is untrusted: absolute names, '..' escapes, links pointing outside the
destination, device nodes and set-id bits are refused or dropped, and nothing is ever written through a symlink.
"""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile
from typing import IO, Any, List, Tuple

from .errors import InvalidRequestError

_COPY_BUFSIZE = 256 * 1024


def pack_directory(local_dir: str) -> IO[bytes]:
    """Tar the contents of local_dir (names relative to it) into a temporary file, rewound to its start."""
    if not os.path.isdir(local_dir):
        raise InvalidRequestError(f"upload source {local_dir!r} is not a directory")
    tmp = tempfile.TemporaryFile(prefix="pydsec-upload-")
    try:
        with tarfile.open(fileobj=tmp, mode="w|", format=tarfile.PAX_FORMAT, bufsize=_COPY_BUFSIZE) as tar:
            for name in sorted(os.listdir(local_dir)):
                tar.add(os.path.join(local_dir, name), arcname=name, recursive=True)
        tmp.flush()
        tmp.seek(0)
        return tmp
    except BaseException:
        tmp.close()
        raise


class UnsafeArchiveError(InvalidRequestError):
    """A tar member would land outside the destination directory."""


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _member_path(root: str, name: str) -> str:
    """The destination for a member name, refusing absolute names and '..' components."""
    if name.startswith("/") or "\0" in name:
        raise UnsafeArchiveError(f"refusing tar member with absolute name {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafeArchiveError(f"refusing tar member with '..' in its name {name!r}")
    return os.path.join(root, *parts) if parts else root


def _check_parent(root: str, target: str, name: str) -> None:
    """The real location of the member's parent must be inside root (an earlier symlink must not redirect it)."""
    parent = os.path.realpath(os.path.dirname(target))
    if not _inside(root, parent):
        raise UnsafeArchiveError(f"refusing tar member {name!r}: its directory resolves outside the destination")


def _clear(target: str) -> None:
    """Remove a non-directory in the way so that we never write through an existing symlink."""
    if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
        os.unlink(target)


def _safe_mode(mode: int) -> int:
    return mode & 0o777


def extract_stream(fileobj: Any, local_dir: str) -> int:
    """Extract a forward-only tar stream into local_dir. Returns the number of members extracted."""
    os.makedirs(local_dir, exist_ok=True)
    root = os.path.realpath(local_dir)
    dir_times: List[Tuple[str, int, float]] = []
    symlinks: List[Tuple[str, str]] = []
    count = 0
    with tarfile.open(fileobj=fileobj, mode="r|*", bufsize=_COPY_BUFSIZE) as tar:
        for member in tar:
            target = _member_path(root, member.name)
            if target == root:
                continue
            _check_parent(root, target, member.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            _check_parent(root, target, member.name)
            if member.isdir():
                if os.path.islink(target):
                    os.unlink(target)
                os.makedirs(target, exist_ok=True)
                dir_times.append((target, _safe_mode(member.mode) | stat.S_IRWXU, member.mtime))
            elif member.isreg():
                if os.path.isdir(target) and not os.path.islink(target):
                    raise UnsafeArchiveError(f"tar member {member.name!r} would replace a directory")
                _clear(target)
                src = tar.extractfile(member)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    while True:
                        chunk = src.read(_COPY_BUFSIZE) if src is not None else b""
                        if not chunk:
                            break
                        out.write(chunk)
                os.chmod(target, _safe_mode(member.mode))
                os.utime(target, (member.mtime, member.mtime))
            elif member.issym():
                link = member.linkname
                if link.startswith("/"):
                    raise UnsafeArchiveError(f"refusing symlink {member.name!r} -> {link!r}: absolute target")
                resolved = os.path.realpath(os.path.join(os.path.dirname(target), link))
                if not _inside(root, resolved):
                    raise UnsafeArchiveError(f"refusing symlink {member.name!r} -> {link!r}: points outside")
                _clear(target)
                os.symlink(link, target)
                symlinks.append((target, member.name))
            elif member.islnk():
                source = _member_path(root, member.linkname)
                if not _inside(root, os.path.realpath(source)) or os.path.islink(source):
                    raise UnsafeArchiveError(f"refusing hard link {member.name!r} -> {member.linkname!r}")
                _clear(target)
                os.link(source, target)
            else:
                continue  # device nodes, fifos: never needed on the client side
            count += 1
    # A link checked when it was made can point elsewhere once a later member replaced a link or directory its target
    # goes through (p -> a/b/c, then x -> p/../.., then p -> . leaves x pointing above the destination): check them
    # all again against the finished tree, and take away any that now leads outside.
    escaped = [(path, name) for path, name in symlinks
               if os.path.islink(path) and not _inside(root, os.path.realpath(path))]
    for path, _ in escaped:
        os.unlink(path)
    if escaped:
        raise UnsafeArchiveError(f"refusing symlink {escaped[0][1]!r}: a later member made it point outside")
    # Directory modes and times last: extracting into a directory changes its mtime and may need write access.
    for path, mode, mtime in reversed(dir_times):
        os.chmod(path, mode)
        os.utime(path, (mtime, mtime))
    return count
