"""Client-side argument checks: InvalidRequestError before any request is sent."""

import os

import pytest

import pydsec
import pydsec.aio
from pydsec import ExecResult


@pytest.fixture
def offline():
    # Port 1 is never contacted: every call below must fail validation first.
    c = pydsec.Client(endpoint="http://127.0.0.1:1", token="t", timeout=2)
    yield c
    c.close()


@pytest.mark.parametrize("kwargs,match", [
    (dict(image=""), "image"),
    (dict(image=None), "image"),
    (dict(image="x", memory="lots"), "memory"),
    (dict(image="x", memory=-1), "memory"),
    (dict(image="x", memory=1.5), "memory"),
    (dict(image="x", disk="1Q"), "disk"),
    (dict(image="x", cpus=0), "cpus"),
    (dict(image="x", cpus="2"), "cpus"),
    (dict(image="x", pids=True), "pids"),
    (dict(image="x", timeout=-5), "timeout"),
    (dict(image="x", idle_timeout="1h"), "idle_timeout"),
    (dict(image="x", env={"A": 1}), "env"),
    (dict(image="x", env={"A=B": "1"}), "env"),
    (dict(image="x", labels=["a"]), "labels"),
    (dict(image="x", network=1), "network"),
    (dict(image="x", network="host"), "network"),
])
def test_create_rejects(offline, kwargs, match):
    with pytest.raises(pydsec.InvalidRequestError, match=match):
        offline.create(**kwargs)


@pytest.mark.parametrize("args,kwargs,match", [
    ((42,), {}, "cmd must be a str"),
    (("",), {}, "empty"),
    (([],), {}, "empty list"),
    ((["echo", 1],), {}, "argv element"),
    (("true",), dict(cwd="relative"), "absolute"),
    (("true",), dict(timeout="10"), "timeout"),
    (("true",), dict(stdin=123), "stdin"),
    (("true",), dict(env={"K": None}), "env"),
])
def test_exec_rejects(offline, args, kwargs, match):
    sb = offline.sandbox("n0-abc")
    with pytest.raises(pydsec.InvalidRequestError, match=match):
        sb.exec(*args, **kwargs)
    with pytest.raises(pydsec.InvalidRequestError, match=match):
        sb.exec_stream(*args, **kwargs)


def test_paths_must_be_absolute(offline):
    sb = offline.sandbox("n0-abc")
    for call in (lambda: sb.read_file("etc/hostname"), lambda: sb.write_file("a.txt", b"x"),
                 lambda: sb.list_dir("."), lambda: sb.stat("~"), lambda: sb.remove("x"),
                 lambda: sb.upload("/tmp", "work"), lambda: sb.download("work", "/tmp/x")):
        with pytest.raises(pydsec.InvalidRequestError, match="absolute path"):
            call()


def test_write_file_checks_data_and_mode(offline):
    sb = offline.sandbox("n0-abc")
    with pytest.raises(pydsec.InvalidRequestError, match="data must be bytes or str"):
        sb.write_file("/a", 12)
    with pytest.raises(pydsec.InvalidRequestError, match="mode"):
        sb.write_file("/a", b"", mode="rwx")
    with pytest.raises(pydsec.InvalidRequestError, match="mode"):
        sb.write_file("/a", b"", mode=0o17777)


def test_upload_needs_a_directory(offline, tmp_path):
    sb = offline.sandbox("n0-abc")
    with pytest.raises(pydsec.InvalidRequestError, match="not a directory"):
        sb.upload(str(tmp_path / "missing"), "/work")


def test_bad_sandbox_ids(offline):
    for bad in ("", "a/b", "x?y", None):
        with pytest.raises(pydsec.InvalidRequestError):
            offline.sandbox(bad)


def test_list_label_keys(offline):
    with pytest.raises(pydsec.InvalidRequestError, match="label key"):
        offline.list(labels={"a=b": "c"})


def test_aio_validates_at_call_time(offline):
    c = pydsec.aio.Client(endpoint="http://127.0.0.1:1", token="t")
    try:
        with pytest.raises(pydsec.InvalidRequestError, match="memory"):
            c.create(image="x", memory="huge")
        with pytest.raises(pydsec.InvalidRequestError, match="cmd"):
            c.sandbox("n0-abc").exec_stream(None)
    finally:
        c.close()


def test_exec_result_repr_and_ok():
    r = ExecResult(exit_code=0, stdout="x" * 1000, stderr="", duration=0.5)
    text = repr(r)
    assert "exit_code=0" in text and "+940 chars" in text and len(text) < 300
    assert r.ok
    t = ExecResult.from_json({"exit_code": 137, "timed_out": True, "signal": 9, "duration": 1.0})
    assert not t.ok and "timed_out=True" in repr(t) and "signal=9" in repr(t)


def _pips():
    import shutil
    import sys
    found = [("this-python", [sys.executable, "-m", "pip"])]
    on_path = shutil.which("pip") or shutil.which("pip3")
    if on_path:
        found.append(("pip-on-path", [on_path]))
    return found


@pytest.mark.parametrize("pip", [p[1] for p in _pips()], ids=[p[0] for p in _pips()])
def test_pip_install_offline(tmp_path, pip):
    """`pip install --no-build-isolation ./pydsec` works without a network and with any pip (the package has
    its own standard-library build backend), from a copy so the tree stays clean."""
    import shutil
    import subprocess
    import sys

    if subprocess.run(pip + ["--version"], capture_output=True).returncode != 0:
        pytest.skip("pip is not installed for this Python (Debian: apt-get install python3-pip)")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pydsec")
    copy = tmp_path / "pydsec"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    proc = subprocess.run(pip + ["install", "--no-build-isolation", "--no-index", "--quiet",
                                 "--target", str(target), str(copy)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = subprocess.run([sys.executable, "-c", "import pydsec, pydsec.aio; print(pydsec.__file__)"],
                           env=dict(os.environ, PYTHONPATH=str(target)), capture_output=True, text=True, cwd="/")
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == str(target / "pydsec" / "__init__.py")
