"""A tiny PEP 517 build backend for pydsec, standard library only.

pydsec has no dependencies and no compiled code, so building a wheel is zipping the package with its
metadata. Doing it here, instead of through setuptools, makes `pip install --no-build-isolation ./pydsec`
work with any pip, offline, whether or not setuptools or wheel are installed next to it.
"""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME = "pydsec"
VERSION = "0.1.0"
SUMMARY = "Python SDK for dsec, the elastic sandbox platform for agentic RL (standard library only)"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_INFO = f"{NAME}-{VERSION}.dist-info"


def _metadata():
    readme = ""
    path = os.path.join(HERE, "README.md")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            readme = f.read()
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\nVersion: {VERSION}\nSummary: {SUMMARY}\n"
        "Requires-Python: >=3.9\nLicense: Apache-2.0\n"
        "Description-Content-Type: text/markdown\n\n" + readme
    )


def _package_files():
    root = os.path.join(HERE, NAME)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(dirpath, name)
            yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, files):
    wheel_name = f"{NAME}-{VERSION}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            zf.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        meta = {
            f"{DIST_INFO}/METADATA": _metadata().encode(),
            f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nGenerator: pydsec_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        }
        for arcname, data in meta.items():
            zf.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        records.append(f"{DIST_INFO}/RECORD,,")
        zf.writestr(f"{DIST_INFO}/RECORD", "\n".join(records) + "\n")
    return wheel_name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for full, arcname in _package_files():
        with open(full, "rb") as f:
            files.append((arcname, f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file that puts the source tree on sys.path.
    return _write_wheel(wheel_directory, [(f"__editable__.{NAME}.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    sdist_name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, sdist_name), "w:gz") as tf:
        for rel in ("pyproject.toml", "README.md"):
            if os.path.exists(os.path.join(HERE, rel)):
                tf.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        tf.add(os.path.join(HERE, "_build", "pydsec_build.py"), arcname=f"{base}/_build/pydsec_build.py")
        for full, arcname in _package_files():
            tf.add(full, arcname=f"{base}/{arcname}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return sdist_name
