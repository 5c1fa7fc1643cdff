#!/usr/bin/python3
"""The E2B-compatible listener beside dsec's own SDK, at one harness's scale (docs/e2b.md): --count sandboxes
(default 200) created at once from one client process, one `echo hi` in each (all at once), then all destroyed;
through E2B's JS SDK (npm e2b, one Node process, bench/e2b-scale.mjs) against `dsec serve --e2b-listen`, and through
pydsec.aio (one Python process) against the same node, alternating over --rounds rounds. Reports creates per second
and the p50/p99 of a command's round trip for both, and their ratios; the last line of stdout is one JSON object.

The node runs with --memory-capacity so that admission takes --count sandboxes of the default 512M on this
machine (the sandboxes sit idle), and --max-connections above the connections both clients open. The busybox
layer (with /bin/bash: E2B's SDK runs commands with `/bin/bash -l -c`) is built in a temporary root; nothing is left
behind. E2B's SDK is installed with npm into --sdk (default build/e2b-sdk) when it is not there.

usage: bench/e2b-scale.py [--count 200] [--rounds 2] [--sdk DIR] [--dsec build/cli/dsec]
Run as root after the README's Quick start set-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "pydsec"))

import pydsec.aio  # noqa: E402

SDK_VERSION = "2.51.0"
IMAGE = "e2b-bench:1"


def say(message: str) -> None:
    print(f"e2b-scale: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-len(s) * p // 100) - 1))] if s else 0.0


def rootfs(path: str) -> None:
    busybox = shutil.which("busybox") or "/bin/busybox"
    for d in ("bin", "etc", "tmp", "root", "proc", "dev", "sys"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    shutil.copy2(busybox, os.path.join(path, "bin", "busybox"))
    for applet in ("sh", "echo", "cat", "true", "sleep"):
        os.symlink("busybox", os.path.join(path, "bin", applet))
    with open(os.path.join(path, "bin", "bash"), "w") as f:
        f.write('#!/bin/sh\nexec /bin/sh "$@"\n')
    os.chmod(os.path.join(path, "bin", "bash"), 0o755)
    with open(os.path.join(path, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")


def ensure_sdk(where: str) -> None:
    manifest = os.path.join(where, "node_modules", "e2b", "package.json")
    if not os.path.exists(manifest) or json.load(open(manifest)).get("version") != SDK_VERSION:
        say(f"installing e2b@{SDK_VERSION} into {where}")
        os.makedirs(where, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", where, "--no-audit", "--no-fund", f"e2b@{SDK_VERSION}"],
                       check=True, capture_output=True)
    shutil.copy(os.path.join(HERE, "e2b-scale.mjs"), os.path.join(where, "e2b-scale.mjs"))


def run_e2b(sdk: str, url: str, token: str, count: int) -> Dict[str, Any]:
    env = dict(os.environ, E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=token, COUNT=str(count))
    r = subprocess.run(["node", "e2b-scale.mjs"], cwd=sdk, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"e2b-scale: the E2B run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


async def run_pydsec(endpoint: str, token: str, count: int) -> Dict[str, Any]:
    async with pydsec.aio.Client(endpoint=endpoint, token=token, timeout=600) as c:
        t0 = time.monotonic()
        sandboxes = await asyncio.gather(*[c.create(image=IMAGE, timeout=600) for _ in range(count)])
        created = time.monotonic()

        async def one(sb):
            a = time.monotonic()
            r = await sb.exec("echo hi")
            assert r.stdout == "hi\n", r
            return (time.monotonic() - a) * 1000

        rtts = await asyncio.gather(*[one(sb) for sb in sandboxes])
        ran = time.monotonic()
        await asyncio.gather(*[sb.destroy() for sb in sandboxes])
        killed = time.monotonic()
    return {"count": count, "create_s": created - t0, "creates_per_s": count / (created - t0),
            "run_wall_s": ran - created, "run_p50_ms": percentile(rtts, 50), "run_p99_ms": percentile(rtts, 99),
            "kill_s": killed - ran}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sdk", default=os.path.join(SRC, "build", "e2b-sdk"))
    ap.add_argument("--dsec", default=os.path.join(SRC, "build", "cli", "dsec"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("e2b-scale: run as root (sandboxes need namespaces, mounts, cgroups)")
    ensure_sdk(args.sdk)
    base = tempfile.mkdtemp(prefix="dsec-e2b-scale-")
    root = os.path.join(base, "root")
    rootfs(os.path.join(base, "rootfs"))
    subprocess.run([args.dsec, "layer", "build", IMAGE, "--from-dir", os.path.join(base, "rootfs"), "--root", root],
                   check=True, capture_output=True)
    port, e2b_port = free_port(), free_port()
    log = open(os.path.join(base, "serve.log"), "wb")
    node = subprocess.Popen([args.dsec, "serve", "--root", root, "--listen", f"127.0.0.1:{port}", "--no-fleet-file",
                             "--fncall-workers", "0", "--max-sandboxes", str(args.count + 16),
                             "--memory-capacity", f"{(args.count + 16) // 2 + 8}G", "--max-connections", "4096",
                             "--e2b-listen", f"127.0.0.1:{e2b_port}", "--e2b-default-image", IMAGE],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint, url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{e2b_port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(endpoint + "/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        token = open(os.path.join(root, "token")).read().strip()
        e2b_runs, native_runs = [], []
        for r in range(args.rounds):
            say(f"round {r + 1}: E2B SDK, {args.count} sandboxes")
            e2b_runs.append(run_e2b(args.sdk, url, token, args.count))
            say(f"round {r + 1}: pydsec.aio, {args.count} sandboxes")
            native_runs.append(asyncio.run(run_pydsec(endpoint, token, args.count)))
            for name, run in (("e2b", e2b_runs[-1]), ("pydsec", native_runs[-1])):
                print(f"round {r + 1} {name:6}: {run['creates_per_s']:.1f} creates/s, command p50 "
                      f"{run['run_p50_ms']:.1f} ms p99 {run['run_p99_ms']:.1f} ms, kill {run['kill_s']:.2f} s")

        def med(runs, key):
            return percentile([x[key] for x in runs], 50)

        summary = {"bench": "e2b-scale", "count": args.count, "rounds": args.rounds,
                   "e2b_creates_per_s": med(e2b_runs, "creates_per_s"),
                   "pydsec_creates_per_s": med(native_runs, "creates_per_s"),
                   "e2b_run_p50_ms": med(e2b_runs, "run_p50_ms"), "pydsec_run_p50_ms": med(native_runs, "run_p50_ms"),
                   "e2b_run_p99_ms": med(e2b_runs, "run_p99_ms"), "pydsec_run_p99_ms": med(native_runs, "run_p99_ms")}
        summary["creates_ratio_e2b_over_pydsec"] = summary["e2b_creates_per_s"] / summary["pydsec_creates_per_s"]
        summary["run_p50_ratio_e2b_over_pydsec"] = summary["e2b_run_p50_ms"] / summary["pydsec_run_p50_ms"]
        print(f"e2b-scale: creates/s E2B {summary['e2b_creates_per_s']:.1f} vs pydsec "
              f"{summary['pydsec_creates_per_s']:.1f} ({summary['creates_ratio_e2b_over_pydsec']:.2f}x); command p50 "
              f"E2B {summary['e2b_run_p50_ms']:.1f} ms vs pydsec {summary['pydsec_run_p50_ms']:.1f} ms "
              f"({summary['run_p50_ratio_e2b_over_pydsec']:.2f}x)")
        print(json.dumps(summary))
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            node.kill()
        subprocess.run(["umount", "-R", "-l", os.path.join(root, "mnt")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
