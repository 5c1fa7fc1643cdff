#!/usr/bin/python3
"""pydsec.aio at trainer scale: one Python process against an embedded single-node fleet (`dsec serve`).

  execs    one `sleep 3` exec in each of --sandboxes sandboxes (default 400), all at once: the wall time through
           pydsec.aio (its own asyncio transport) and, in the same run and on the same sandboxes, through the
           synchronous client on a pool of --threads threads (64: what pydsec.aio did before it had a transport
           of its own), and their ratio. The two alternate over --rounds rounds.
  streams  --streams exec streams (default 5,000) open at once over those sandboxes: each is started, reads its
           first line and is held until all are open; the client's RSS before and with all of them open.

The node runs with --max-connections above --streams (one HTTP connection, and one node thread, per open
stream; the default of 1024 would answer the rest 503) and the client with max_in_flight above it (its default
of 1024 would hold the rest back). The busybox test layer is built into a temporary root; nothing is left
behind. Progress goes to stderr, one line per step; the last line of stdout is one JSON object.

usage: bench/aio-scale.py [--sandboxes N] [--sleep S] [--streams N] [--threads N] [--rounds N] [--build DIR]
                          [--stall S] [--open-within S]
Run as root (sandboxes need namespaces, mounts, cgroups), after the README's Quick start set-up.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "pydsec"))  # this checkout's pydsec, before an installed one

import pydsec  # noqa: E402
import pydsec.aio  # noqa: E402

APPLETS = ["sh", "sleep", "echo", "true", "cat"]
LAYER = "aio-bench:1"


def say(message: str) -> None:
    print(f"aio-scale: {message}", file=sys.stderr, flush=True)


def find_dsec(build: Optional[str]) -> str:
    candidates = [os.environ.get("DSEC_BIN")]
    candidates += [os.path.join(d, "cli", "dsec") for d in ([build] if build else []) + [os.path.join(SRC, "build")]]
    candidates.append(shutil.which("dsec"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise SystemExit("aio-scale: cannot find the dsec binary: build it (tests/build.sh), pass --build DIR or set "
                     "DSEC_BIN")


def busybox_rootfs(path: str) -> None:
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        raise SystemExit("aio-scale: busybox not found (apt-get install busybox-static; tests/install-deps.sh)")
    for d in ("bin", "etc", "tmp", "root", "work", "proc", "dev", "sys"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    shutil.copy2(busybox, os.path.join(path, "bin", "busybox"))
    for applet in APPLETS:
        os.symlink("busybox", os.path.join(path, "bin", applet))
    with open(os.path.join(path, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(os.path.join(path, "etc", "group"), "w") as f:
        f.write("root:x:0:\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metric(text: str, name: str) -> Optional[float]:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class Node:
    """`dsec serve` on a free port with a temporary root and HOME; stop() leaves nothing behind."""

    def __init__(self, dsec: str, max_connections: int):
        self.base = tempfile.mkdtemp(prefix="dsec-aio-scale-")
        self.root = os.path.join(self.base, "root")
        home = os.path.join(self.base, "home")
        rootfs = os.path.join(self.base, "rootfs")
        os.makedirs(home)
        busybox_rootfs(rootfs)
        env = dict(os.environ, HOME=home)
        say(f"building layer {LAYER} into {self.root}")
        subprocess.run([dsec, "layer", "build", LAYER, "--from-dir", rootfs, "--root", self.root], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.log = open(os.path.join(self.base, "serve.log"), "wb")
        say(f"starting dsec serve on {self.endpoint} --max-connections {max_connections}")
        self.proc = subprocess.Popen([dsec, "serve", "--listen", f"127.0.0.1:{port}", "--root", self.root,
                                      "--fleet-name", "aio-scale", "--max-connections", str(max_connections)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        fleet_file = os.path.join(home, ".dsec", "fleets", "aio-scale.json")
        deadline = time.monotonic() + 60
        self.token = None
        while self.token is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"aio-scale: dsec serve did not start; its log: {self.log.name}")
            try:
                with urllib.request.urlopen(self.endpoint + "/healthz", timeout=1):
                    with open(fleet_file) as f:
                        self.token = json.load(f)["token"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        with open("/proc/self/mountinfo") as f:
            left = [line.split()[4] for line in f if line.split()[4].startswith(self.base)]
        if left:
            say(f"mounts left under {self.base}, not removing it: {left[:3]}")
        else:
            shutil.rmtree(self.base, ignore_errors=True)


async def create_all(client: pydsec.aio.Client, count: int) -> List[pydsec.aio.Sandbox]:
    """Up to count sandboxes, created at once; a create the node refuses for room is retried as it asks, and
    given up after a minute of refusals (the bench then runs on the sandboxes it got)."""

    async def one(i: int) -> Optional[pydsec.aio.Sandbox]:
        deadline = time.monotonic() + 60
        while True:
            try:
                return await client.create(image=LAYER, memory="64M", labels={"bench": "aio-scale"}, timeout=3600)
            except pydsec.CapacityError as e:
                if time.monotonic() > deadline:
                    say(f"create {i} refused: {e}")
                    return None
                await asyncio.sleep(e.retry_after or 1.0)

    made = await asyncio.gather(*(one(i) for i in range(count)))
    return [sb for sb in made if sb is not None]


async def aio_execs(sandboxes: List[pydsec.aio.Sandbox], seconds: float) -> float:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(sb.exec(["sleep", str(seconds)], timeout=seconds + 60) for sb in sandboxes))
    wall = time.perf_counter() - t0
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"aio-scale: {len(bad)} execs failed, e.g. {bad[0]!r}")
    return wall


def thread_execs(sync: pydsec.Client, ids: List[str], seconds: float, threads: int) -> float:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        t0 = time.perf_counter()
        results = list(pool.map(lambda sid: sync.sandbox(sid).exec(["sleep", str(seconds)], timeout=seconds + 60),
                                ids))
        wall = time.perf_counter() - t0
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"aio-scale: {len(bad)} execs failed, e.g. {bad[0]!r}")
    return wall


def node_fds(pid: int) -> Dict[str, Any]:
    """The node's open files and its limit on them."""
    out: Dict[str, Any] = {}
    try:
        out["node_open_fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    out["node_rlimit_nofile"] = int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return out


async def hold_streams(client: pydsec.aio.Client, sandboxes: List[pydsec.aio.Sandbox], count: int,
                       stall: float, within: float, node_pid: int) -> Dict[str, Any]:
    """Up to count streams open at once (each has read its first line), measured, then closed.

    The node needs a few open files per stream (its socket, the command's pipes) and, at its RLIMIT_NOFILE, can
    no longer accept a connection, not even the destroys that would free them: the first streams measure what
    one costs, and the bench opens no more than fit with 2,048 files to spare (reported as a node limit).
    Opening also stops when none more opened for `stall` seconds, or after `within` seconds."""
    opened = 0
    refused = 0
    reasons: Dict[str, int] = {}
    release = asyncio.Event()
    tasks: List["asyncio.Task[None]"] = []

    async def one(i: int) -> None:
        nonlocal opened, refused
        s = sandboxes[i % len(sandboxes)].exec_stream(["sh", "-c", "echo ready; exec sleep 600"], timeout=660)
        try:
            await s.__anext__()
        except (pydsec.CapacityError, pydsec.UnavailableError) as e:  # a node limit: counted and reported
            refused += 1
            reason = f"{e.code}: {e.message}"
            reasons[reason] = reasons.get(reason, 0) + 1
            return
        opened += 1
        await release.wait()
        await s.aclose()

    async def open_up_to(target: int, t0: float) -> None:
        tasks.extend(asyncio.ensure_future(one(i)) for i in range(len(tasks), target))
        last, last_change = -1, time.perf_counter()
        while opened + refused + sum(1 for t in tasks if t.done() and t.exception() is not None) < target:
            await asyncio.sleep(0.2)
            if opened != last:
                last, last_change = opened, time.perf_counter()
            elif time.perf_counter() - last_change > stall:
                say(f"no stream opened for {stall:.0f} s: holding {opened}")
                return
            if time.perf_counter() - t0 > within:
                say(f"not all open after {within:.0f} s: holding {opened}")
                return

    gc.collect()
    before = rss_kib()
    fds_before = node_fds(node_pid)
    t0 = time.perf_counter()
    probe = min(200, count)
    await open_up_to(probe, t0)
    fds_probe = node_fds(node_pid)
    per_stream = (fds_probe.get("node_open_fds", 0) - fds_before.get("node_open_fds", 0)) / max(opened, 1)
    target = count
    limit = fds_probe.get("node_rlimit_nofile")
    if limit and per_stream > 0:
        room = int((limit - fds_probe["node_open_fds"] - 2048) / per_stream)
        target = max(probe, min(count, opened + room))
        if target < count:
            say(f"the node's RLIMIT_NOFILE {limit} holds about {target} streams at {per_stream:.1f} open files each "
                f"(raise its hard limit, or run it with CAP_SYS_RESOURCE so that it raises it to fs.nr_open)")
    await open_up_to(target, t0)
    open_s = time.perf_counter() - t0
    failed = [t for t in tasks if t.done() and t.exception() is not None]
    gc.collect()
    peak = rss_kib()
    try:
        response = await client._transport.request("GET", "/metrics", timeout=10)
        node_connections = metric((await response.read()).decode(), "dsec_http_connections")
    except pydsec.DsecError:
        node_connections = None
    result = {"streams": count, "streams_target": target, "streams_open": opened, "streams_open_s": round(open_s, 2),
              "streams_refused": refused, "streams_failed": len(failed),
              "refusals": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:3]),
              "node_fds_per_stream": round(per_stream, 2), "node_http_connections_at_peak": node_connections,
              "client_in_flight_at_peak": client.in_flight, **node_fds(node_pid),
              "rss_before_mib": round(before / 1024, 1), "rss_open_mib": round(peak / 1024, 1),
              "rss_growth_mib": round((peak - before) / 1024, 1),
              "rss_per_stream_kib": round((peak - before) / max(opened, 1), 1)}
    release.set()
    await asyncio.wait(tasks, timeout=30)
    for t in tasks:  # any still waiting for the node to take them
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if failed:
        result["stream_error"] = repr(failed[0].exception())
    return result


async def main_async(args: argparse.Namespace, node: Node) -> Dict[str, Any]:
    out: Dict[str, Any] = {"bench": "aio-scale", "sleep_s": args.sleep, "threads": args.threads}
    max_in_flight = max(pydsec.aio.DEFAULT_MAX_IN_FLIGHT, args.streams + 64)
    async with pydsec.aio.Client(endpoint=node.endpoint, token=node.token, max_in_flight=max_in_flight,
                                 timeout=120) as client:
        out["max_in_flight"] = max_in_flight
        t0 = time.perf_counter()
        sandboxes = await create_all(client, args.sandboxes)
        out["sandboxes_asked"] = args.sandboxes
        out["sandboxes"] = len(sandboxes)
        say(f"{len(sandboxes)} of {args.sandboxes} sandboxes created in {time.perf_counter() - t0:.1f} s")
        try:
            if not sandboxes:
                raise SystemExit("aio-scale: the node admitted no sandbox")
            await asyncio.gather(*(sb.exec(["true"]) for sb in sandboxes))  # first exec of each, off the clock
            sync = client.sync
            ids = [sb.id for sb in sandboxes]
            loop = asyncio.get_running_loop()
            aio_walls, thread_walls = [], []
            for r in range(args.rounds):
                aio_walls.append(await aio_execs(sandboxes, args.sleep))
                say(f"round {r + 1}: {len(sandboxes)} concurrent `sleep {args.sleep}` execs through pydsec.aio: "
                    f"{aio_walls[-1]:.2f} s")
                thread_walls.append(await loop.run_in_executor(None, thread_execs, sync, ids, args.sleep,
                                                               args.threads))
                say(f"round {r + 1}: the same through the sync client on {args.threads} threads: "
                    f"{thread_walls[-1]:.2f} s")
            out["aio_wall_s"] = round(min(aio_walls), 2)
            out["threads_wall_s"] = round(min(thread_walls), 2)
            out["aio_walls_s"] = [round(w, 2) for w in aio_walls]
            out["threads_walls_s"] = [round(w, 2) for w in thread_walls]
            out["speedup"] = round(out["threads_wall_s"] / out["aio_wall_s"], 2)
            out["aio_within_5s"] = out["aio_wall_s"] <= 5.0
            if args.streams > 0:
                say(f"opening {args.streams} exec streams over {len(sandboxes)} sandboxes")
                streams = await hold_streams(client, sandboxes, args.streams, args.stall, args.open_within,
                                             node.proc.pid)
                say(f"{streams['streams_open']} streams open at once after {streams['streams_open_s']} s; client RSS "
                    f"{streams['rss_before_mib']} -> {streams['rss_open_mib']} MiB")
                out.update(streams)
        finally:
            t0 = time.perf_counter()
            await asyncio.gather(*(sb.destroy() for sb in sandboxes), return_exceptions=True)
            say(f"destroyed {len(sandboxes)} sandboxes in {time.perf_counter() - t0:.1f} s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandboxes", type=int, default=400)
    ap.add_argument("--sleep", type=float, default=3.0, help="seconds each exec sleeps (default 3)")
    ap.add_argument("--streams", type=int, default=5000, help="exec streams held open at once (0: skip)")
    ap.add_argument("--stall", type=float, default=20.0,
                    help="stop opening streams when none opened for this long (seconds; default 20)")
    ap.add_argument("--open-within", type=float, default=120.0,
                    help="stop opening streams after this long (seconds; default 120)")
    ap.add_argument("--threads", type=int, default=64, help="threads of the sync client's pool (default 64)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--build", default=os.environ.get("DSEC_BUILD"), help="build directory (default ./build)")
    args = ap.parse_args()
    if args.sandboxes < 1 or args.threads < 1 or args.rounds < 1 or args.streams < 0:
        ap.error("--sandboxes, --threads and --rounds must be >= 1, --streams >= 0")
    if os.geteuid() != 0:
        raise SystemExit("aio-scale: run as root (sandboxes need namespaces, mounts and cgroups)")
    # One socket per open stream, plus the pool's: raise the soft limit on open files to the hard one.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.streams + args.sandboxes + 256 > hard:
        raise SystemExit(f"aio-scale: RLIMIT_NOFILE {hard} is too low for {args.streams} streams")
    node = Node(find_dsec(args.build), max_connections=max(1024, args.streams + 512))
    try:
        out = asyncio.run(main_async(args, node))
    finally:
        node.stop()
    out["node_max_connections"] = max(1024, args.streams + 512)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
