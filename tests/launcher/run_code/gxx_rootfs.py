"""A g++ layer for the /run_code tests, built from the host's Debian packages (no network): every file of g++ and
of the packages it depends on, as dpkg lists them (documentation left out), at the paths the host's merged /usr
gives them. It goes on top of the fncall test image (dsec-test-python-rootfs), which has the shell and the tools.

    gxx_rootfs.py DIR    exit 0: built; 3: this host has no g++ (the reason on stderr)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, List, Set

ROOTS = ["g++", "libc6-dev"]
# Packages g++ needs only to be installed by dpkg, not to compile and link.
SKIP = {"dpkg", "debconf", "perl-base", "install-info", "tar", "coreutils", "base-files", "debianutils"}
DROPPED = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/", "/usr/share/lintian/")


def installed(pkg: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return r.returncode == 0 and "install ok installed" in r.stdout


def depends(pkg: str) -> List[str]:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", pkg], capture_output=True, text=True,
                       check=True)
    out = []
    for group in r.stdout.split(","):
        group = group.strip()
        if not group:
            continue
        # "a (>= 1) | b": the first alternative that is installed.
        for alt in group.split("|"):
            name = alt.strip().split(" ")[0].split(":")[0]
            if name and installed(name):
                out.append(name)
                break
    return out


def closure() -> Set[str]:
    seen: Set[str] = set()
    todo = list(ROOTS)
    while todo:
        pkg = todo.pop()
        if pkg in seen or pkg in SKIP:
            continue
        seen.add(pkg)
        todo.extend(depends(pkg))
    return seen


def files_of(pkg: str) -> List[str]:
    r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=True)
    return [line for line in r.stdout.splitlines() if line.startswith("/") and not line.startswith(DROPPED)]


def merged(path: str) -> str:
    """The path as the host resolves its directory (/lib/x -> /usr/lib/x), the last component kept."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def build(root: str) -> None:
    os.makedirs(root, exist_ok=True)
    for top in ("bin", "lib", "lib64", "sbin"):
        link = "/" + top
        if os.path.islink(link):
            os.makedirs(os.path.join(root, os.readlink(link).lstrip("/")), exist_ok=True)
            os.symlink(os.readlink(link), os.path.join(root, top))
    copied: Dict[str, bool] = {}
    for pkg in sorted(closure()):
        for path in files_of(pkg):
            src = merged(path)
            if src in copied or not os.path.lexists(src) or (os.path.isdir(src) and not os.path.islink(src)):
                continue
            copied[src] = True
            dest = root + src
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.islink(src):
                if not os.path.lexists(dest):
                    os.symlink(os.readlink(src), dest)
            else:
                shutil.copy2(src, dest)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: gxx_rootfs.py DIR", file=sys.stderr)
        return 2
    if shutil.which("dpkg-query") is None or not installed("g++") or not installed("libc6-dev"):
        print("needs Debian's g++ and libc6-dev (apt-get install g++)", file=sys.stderr)
        return 3
    build(sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
