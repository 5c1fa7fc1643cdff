"""Packing directories and extracting untrusted tar streams safely."""

import io
import os
import stat
import tarfile

import pytest

import pydsec
from pydsec import _tar


class OneWay(io.RawIOBase):
    """A forward-only stream, like an HTTP response: no seek, no tell."""

    def __init__(self, data: bytes):
        self._buf = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, b):
        chunk = self._buf.read(min(len(b), 1000))
        b[:len(chunk)] = chunk
        return len(chunk)


def make_tar(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, payload, *rest in entries:
            info = tarfile.TarInfo(name)
            info.mode = rest[0] if rest else 0o644
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = rest[0] if rest else 0o755
                tar.addfile(info)
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                info.linkname = payload
                tar.addfile(info)
            elif kind == "hard":
                info.type = tarfile.LNKTYPE
                info.linkname = payload
                tar.addfile(info)
            elif kind == "dev":
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = 1, 3
                tar.addfile(info)
    return buf.getvalue()


def extract(data, dest):
    return _tar.extract_stream(OneWay(data), str(dest))


def test_round_trip(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "top.txt").write_text("top")
    (src / "a" / "b" / "deep.bin").write_bytes(os.urandom(300000))
    (src / "a" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "a" / "run.sh", 0o755)
    os.symlink("b/deep.bin", src / "a" / "ln")
    packed = _tar.pack_directory(str(src))
    dst = tmp_path / "dst"
    n = extract(packed.read(), dst)
    assert n == 6
    assert (dst / "top.txt").read_text() == "top"
    assert (dst / "a" / "b" / "deep.bin").read_bytes() == (src / "a" / "b" / "deep.bin").read_bytes()
    assert os.readlink(dst / "a" / "ln") == "b/deep.bin"
    assert stat.S_IMODE(os.stat(dst / "a" / "run.sh").st_mode) == 0o755


@pytest.mark.parametrize("entries,match", [
    ([("/etc/evil", "file", b"x")], "absolute"),
    ([("../evil", "file", b"x")], r"'\.\.'"),
    ([("a/../../evil", "file", b"x")], r"'\.\.'"),
    ([("ln", "sym", "/etc")], "absolute target"),
    ([("ln", "sym", "../..")], "points outside"),
    ([("d", "dir", None), ("d/ln", "sym", "../../x")], "points outside"),
    ([("hl", "hard", "/etc/passwd")], "absolute"),
    ([("hl", "hard", "../outside")], r"'\.\.'"),
])
def test_escapes_are_refused(tmp_path, entries, match):
    dst = tmp_path / "dst"
    with pytest.raises(pydsec.UnsafeArchiveError, match=match):
        extract(make_tar(entries), dst)
    assert not (tmp_path / "evil").exists()


def test_symlink_chain_cannot_redirect_later_members(tmp_path):
    # Lexically each link stays inside, but d1/l2 -> d2/l/.. really resolves to the parent of dst.
    outside = tmp_path / "outside"
    outside.mkdir()
    dst = tmp_path / "dst"
    entries = [("d1", "dir", None), ("d1/d2", "dir", None), ("d1/d2/l", "sym", "../.."),
               ("d1/l2", "sym", "d2/l/.."), ("d1/l2/outside/pwned", "file", b"x")]
    with pytest.raises(pydsec.UnsafeArchiveError):
        extract(make_tar(entries), dst)
    assert not (outside / "pwned").exists()


@pytest.mark.parametrize("replacement", [("p", "sym", "."), ("p", "dir", None)])
def test_a_later_member_cannot_turn_a_checked_symlink_outward(tmp_path, replacement):
    # x -> p/../.. stays inside while p -> a/b/c; once p is replaced by "." (or a plain directory) x leads above dst.
    dst = tmp_path / "dst"
    entries = [("p", "sym", "a/b/c"), ("x", "sym", "p/../.."), replacement]
    with pytest.raises(pydsec.UnsafeArchiveError, match="outside"):
        extract(make_tar(entries), dst)
    root = str(dst.resolve())
    for dirpath, dirnames, filenames in os.walk(dst):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                real = os.path.realpath(path)
                assert real == root or real.startswith(root + os.sep), (path, os.readlink(path), real)


def test_never_writes_through_existing_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(str(victim), dst / "f")
    extract(make_tar([("f", "file", b"new")]), dst)
    assert victim.read_text() == "keep"
    assert (dst / "f").read_bytes() == b"new" and not os.path.islink(dst / "f")


def test_setid_bits_dropped_and_devices_skipped(tmp_path):
    dst = tmp_path / "dst"
    n = extract(make_tar([("suid", "file", b"x", 0o4755), ("null", "dev", None)]), dst)
    assert n == 1
    assert stat.S_IMODE(os.stat(dst / "suid").st_mode) == 0o755
    assert not (dst / "null").exists()


def test_readonly_directory_still_filled(tmp_path):
    dst = tmp_path / "dst"
    extract(make_tar([("ro", "dir", None, 0o555), ("ro/f", "file", b"x")]), dst)
    assert (dst / "ro" / "f").read_bytes() == b"x"


def test_hard_link_inside_is_kept(tmp_path):
    dst = tmp_path / "dst"
    extract(make_tar([("a", "file", b"data"), ("b", "hard", "a")]), dst)
    assert os.stat(dst / "a").st_ino == os.stat(dst / "b").st_ino
