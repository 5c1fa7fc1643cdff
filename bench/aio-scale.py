#!/usr/bin/python3
"""pydsec.aio at trainer scale: one Python process against a local fleet of node agents (`dsec-launch --no-mpi`,
and `dsec-launch --join` for the others), the client reaching each sandbox's node directly.

  execs    one `sleep 3` exec in each of --sandboxes sandboxes (default 400), all at once: the wall time through
           pydsec.aio (its own asyncio transport) and, in the same run and on the same sandboxes, through the
           synchronous client on a pool of --threads threads (64: what pydsec.aio did before it had a transport
           of its own), and their ratio. The two alternate over --rounds rounds.
  streams  --streams exec streams (default 5,000) open at once over those sandboxes, spread evenly over the
           nodes: each is started, reads its first line (the command prints one, then sleeps silently) and is
           held until all are open; the client's RSS before and with all of them open, and any refused.

The claim under test is the client's; a node agent needs about four open files per open stream (its socket, the
command's pipes) and cannot hold more streams than its RLIMIT_NOFILE allows (its hard limit is raised only with
CAP_SYS_RESOURCE). So the fleet has as many nodes on this machine as that limit requires for --streams
(--nodes 0, the default: ceil(streams * 4 / (hard limit - 4,096))), or --nodes N. Each node runs with
--max-connections above the streams (one HTTP connection, and one node thread, per open stream; the default of
1024 would answer the rest 503) and the client with max_in_flight above them (its default of 1024 would hold the
rest back). The busybox test layer is built into a temporary root that every node's root links to; nothing is
left behind (sandboxes destroyed, then every node stopped, which destroys any left). Progress goes to stderr,
one line per step; the last line of stdout is one JSON object.

usage: bench/aio-scale.py [--sandboxes N] [--sleep S] [--streams N] [--nodes N] [--threads N] [--rounds N]
                          [--build DIR] [--stall S] [--open-within S]
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


def find_binary(name: str, subdir: str, env: str, build: Optional[str]) -> str:
    candidates = [os.environ.get(env)]
    candidates += [os.path.join(d, subdir, name) for d in ([build] if build else []) + [os.path.join(SRC, "build")]]
    candidates.append(shutil.which(name))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise SystemExit(f"aio-scale: cannot find the {name} binary: build it (tests/build.sh), pass --build DIR or set "
                     f"{env}")


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


FILES_PER_STREAM = 4  # a node's open files per open exec stream (3.8 measured), rounded up
FILES_SPARE = 4096  # a node's open files kept free of streams: its sandboxes, the gateway's and the bench's requests


def nodes_for(streams: int, nofile_hard: int) -> int:
    """How many node agents hold `streams` open streams, each under the RLIMIT_NOFILE hard limit it inherits."""
    per_node = max(1, (nofile_hard - FILES_SPARE) // FILES_PER_STREAM)
    return max(1, -(-streams // per_node))


def get_json(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


class Fleet:
    """A fleet of `count` node agents on this machine: g0 (`dsec-launch --no-mpi`, which also starts the gateway)
    and g1.. (`dsec-launch --join`), each with a root of its own linking to one layer store, in a temporary base
    directory with its own HOME (the fleet file). stop() leaves nothing behind, also after a failed start."""

    def __init__(self, launch: str, dsec: str, count: int, max_connections: int):
        self.base = tempfile.mkdtemp(prefix="dsec-aio-scale-")
        self.procs: Dict[str, subprocess.Popen] = {}
        self.logs: List[Any] = []
        self.name = f"aio-scale-{os.getpid()}"
        self.endpoint = ""
        self.token = ""
        self.node_endpoints: Dict[str, str] = {}
        home = os.path.join(self.base, "home")
        rootfs = os.path.join(self.base, "rootfs")
        os.makedirs(home)
        self.env = dict(os.environ, HOME=home)
        try:
            busybox_rootfs(rootfs)
            store = os.path.join(self.base, "store")
            say(f"building layer {LAYER} into {store}")
            subprocess.run([dsec, "layer", "build", LAYER, "--from-dir", rootfs, "--root", store], env=self.env,
                           check=True, stdout=subprocess.DEVNULL)
            common = ["--address", "127.0.0.1", "--fncall-workers", "0", "--max-connections", str(max_connections)]
            for i in range(count):
                node = f"g{i}"
                root = os.path.join(self.base, "roots", node)
                os.makedirs(root)
                os.symlink(os.path.join(store, "layers"), os.path.join(root, "layers"))
                if i == 0:
                    args = ["--no-mpi", "--fleet", self.name]
                else:
                    args = ["--join", self.name, "--drain-timeout", "5"]
                say(f"starting node {node} ({'with the gateway' if i == 0 else 'joining'}) "
                    f"--max-connections {max_connections}")
                self._start(node, [launch, *args, "--root", root, "--node-name", node, *common])
                if i == 0:
                    doc = self._until("the fleet file", lambda: self._read(os.path.join(
                        home, ".dsec", "fleets", f"{self.name}.json")))
                    self.endpoint, self.token = doc["endpoint"], doc["token"]
                self._until(f"node {node} healthy in the gateway's node table",
                            lambda: self._healthy(node))
        except BaseException:
            self.stop()
            raise

    def _start(self, node: str, argv: List[str]) -> None:
        log = open(os.path.join(self.base, f"{node}.log"), "wb")
        self.logs.append(log)
        self.procs[node] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    @staticmethod
    def _read(path: str) -> Any:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _healthy(self, node: str) -> bool:
        try:
            nodes = get_json(self.endpoint + "/v1/fleet/nodes", self.token)["nodes"]
        except (OSError, ValueError, KeyError):
            return False
        for n in nodes:
            if n.get("name") == node and n.get("state") == "healthy":
                self.node_endpoints[node] = n["endpoint"]
                return True
        return False

    def _until(self, what: str, check: Any, deadline: float = 90.0) -> Any:
        end = time.monotonic() + deadline
        while True:
            value = check()
            if value:
                return value
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > end:
                raise SystemExit(f"aio-scale: {what}: " + (f"{dead[0]} exited" if dead else f"not within {deadline} s")
                                 + f"; logs in {self.base}")
            time.sleep(0.1)

    def pid(self, node: str) -> int:
        return self.procs[node].pid

    def stop(self) -> None:
        """SIGTERM to the joined nodes, then g0 (and its gateway); a node destroys the sandboxes it still holds.
        SIGKILL of a process group that has not exited after 90 s. The base directory goes unless mounts are
        left under it."""
        for node in sorted(self.procs, key=lambda n: n == "g0"):
            proc = self.procs[node]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for node in sorted(self.procs, key=lambda n: n == "g0"):
            proc = self.procs[node]
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                say(f"node {node} did not stop within 90 s: SIGKILL")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in self.logs:
            log.close()
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


def node_fds(pid: int) -> Dict[str, int]:
    """A node agent's open files and its limit on them."""
    out: Dict[str, int] = {}
    try:
        out["open_fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    out["rlimit_nofile"] = int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return out


def node_of(sandbox_id: str) -> str:
    return sandbox_id.rpartition("-")[0]


def node_connections(fleet: Fleet) -> Dict[str, Optional[float]]:
    """Each node's open HTTP connections (its /metrics, asked directly)."""
    out: Dict[str, Optional[float]] = {}
    for node, endpoint in sorted(fleet.node_endpoints.items()):
        req = urllib.request.Request(endpoint + "/metrics", headers={"Authorization": f"Bearer {fleet.token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                out[node] = metric(r.read().decode(), "dsec_http_connections")
        except OSError:
            out[node] = None
    return out


async def hold_streams(client: pydsec.aio.Client, sandboxes: List[pydsec.aio.Sandbox], count: int,
                       stall: float, within: float, fleet: Fleet) -> Dict[str, Any]:
    """Up to count streams open at once (each has read its first line), spread evenly over the nodes, measured,
    then closed.

    A node needs a few open files per stream (its socket, the command's pipes) and, at its RLIMIT_NOFILE, can no
    longer accept a connection, not even the destroys that would free them: the first streams measure what one
    costs each node, and the bench opens no more than fit every node with 2,048 files to spare (reported as a node
    limit; the fleet was sized to hold them all, so this only bites a smaller --nodes). Opening also stops when
    none more opened for `stall` seconds, or after `within` seconds."""
    by_node: Dict[str, List[pydsec.aio.Sandbox]] = {}
    for sb in sandboxes:
        by_node.setdefault(node_of(sb.id), []).append(sb)
    nodes = sorted(by_node)
    opened = 0
    refused = 0
    opened_on: Dict[str, int] = {n: 0 for n in nodes}
    reasons: Dict[str, int] = {}
    release = asyncio.Event()
    tasks: List["asyncio.Task[None]"] = []

    async def one(i: int) -> None:
        nonlocal opened, refused
        node = nodes[i % len(nodes)]
        on_node = by_node[node]
        s = on_node[(i // len(nodes)) % len(on_node)].exec_stream(["sh", "-c", "echo ready; exec sleep 600"],
                                                                 timeout=660)
        try:
            await s.__anext__()
        except (pydsec.CapacityError, pydsec.UnavailableError) as e:  # a node limit: counted and reported
            refused += 1
            reason = f"{e.code}: {e.message}"
            reasons[reason] = reasons.get(reason, 0) + 1
            return
        opened += 1
        opened_on[node] += 1
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
    fds_before = {n: node_fds(fleet.pid(n)) for n in nodes}
    t0 = time.perf_counter()
    probe = min(200 * len(nodes), count)
    await open_up_to(probe, t0)
    target = count
    per_stream: Dict[str, float] = {}
    for n in nodes:
        fds = node_fds(fleet.pid(n))
        per_stream[n] = (fds.get("open_fds", 0) - fds_before[n].get("open_fds", 0)) / max(opened_on[n], 1)
        limit = fds.get("rlimit_nofile")
        if limit and per_stream[n] > 0:
            room = int((limit - fds["open_fds"] - 2048) / per_stream[n])  # more streams this node can take
            node_target = max(probe, opened + room * len(nodes))  # streams go to the nodes in turn
            if node_target < target:
                target = node_target
                say(f"node {n}'s RLIMIT_NOFILE {limit} holds about {opened_on[n] + room} streams at "
                    f"{per_stream[n]:.1f} open files each: opening {target} in all (start the bench with more "
                    f"--nodes, or run the nodes with CAP_SYS_RESOURCE so that they raise it to fs.nr_open)")
    await open_up_to(target, t0)
    open_s = time.perf_counter() - t0
    failed = [t for t in tasks if t.done() and t.exception() is not None]
    gc.collect()
    peak = rss_kib()
    loop = asyncio.get_running_loop()
    connections = await loop.run_in_executor(None, node_connections, fleet)
    fds_peak = {n: node_fds(fleet.pid(n)) for n in nodes}
    result = {"streams": count, "streams_target": target, "streams_open": opened, "streams_open_s": round(open_s, 2),
              "streams_refused": refused, "streams_failed": len(failed),
              "refusals": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:3]),
              "streams_open_per_node": opened_on,
              "node_fds_per_stream": {n: round(v, 2) for n, v in per_stream.items()},
              "node_open_fds_at_peak": {n: v.get("open_fds") for n, v in fds_peak.items()},
              "node_rlimit_nofile": {n: v.get("rlimit_nofile") for n, v in fds_peak.items()},
              "node_http_connections_at_peak": connections,
              "client_in_flight_at_peak": client.in_flight,
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


async def main_async(args: argparse.Namespace, fleet: Fleet) -> Dict[str, Any]:
    out: Dict[str, Any] = {"bench": "aio-scale", "sleep_s": args.sleep, "threads": args.threads,
                           "nodes": len(fleet.procs)}
    max_in_flight = max(pydsec.aio.DEFAULT_MAX_IN_FLIGHT, args.streams + 64)
    # direct=True: each sandbox's exec goes straight to its node (the gateway only creates and destroys).
    async with pydsec.aio.Client(endpoint=fleet.endpoint, token=fleet.token, max_in_flight=max_in_flight,
                                 timeout=120, direct=True) as client:
        out["max_in_flight"] = max_in_flight
        t0 = time.perf_counter()
        sandboxes = await create_all(client, args.sandboxes)
        out["sandboxes_asked"] = args.sandboxes
        out["sandboxes"] = len(sandboxes)
        per_node: Dict[str, int] = {}
        for sb in sandboxes:
            per_node[node_of(sb.id)] = per_node.get(node_of(sb.id), 0) + 1
        out["sandboxes_per_node"] = dict(sorted(per_node.items()))
        say(f"{len(sandboxes)} of {args.sandboxes} sandboxes created in {time.perf_counter() - t0:.1f} s "
            f"({', '.join(f'{n}: {c}' for n, c in sorted(per_node.items()))})")
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
                say(f"opening {args.streams} exec streams over {len(sandboxes)} sandboxes on {len(per_node)} nodes")
                streams = await hold_streams(client, sandboxes, args.streams, args.stall, args.open_within, fleet)
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
    ap.add_argument("--nodes", type=int, default=0,
                    help="node agents in the local fleet (default 0: as many as their RLIMIT_NOFILE requires for "
                         "--streams)")
    ap.add_argument("--threads", type=int, default=64, help="threads of the sync client's pool (default 64)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--build", default=os.environ.get("DSEC_BUILD"), help="build directory (default ./build)")
    args = ap.parse_args()
    if args.sandboxes < 1 or args.threads < 1 or args.rounds < 1 or args.streams < 0 or args.nodes < 0:
        ap.error("--sandboxes, --threads and --rounds must be >= 1, --streams and --nodes >= 0")
    if os.geteuid() != 0:
        raise SystemExit("aio-scale: run as root (sandboxes need namespaces, mounts and cgroups)")
    # One socket per open stream, plus the pool's: raise the soft limit on open files to the hard one.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.streams + args.sandboxes + 256 > hard:
        raise SystemExit(f"aio-scale: RLIMIT_NOFILE {hard} is too low for {args.streams} streams")
    # The nodes inherit this hard limit (and may raise it only with CAP_SYS_RESOURCE).
    nodes = args.nodes or nodes_for(args.streams, hard)
    launch = find_binary("dsec-launch", "launcher", "DSEC_LAUNCH_BIN", args.build)
    dsec = find_binary("dsec", "cli", "DSEC_BIN", args.build)
    max_connections = max(1024, args.streams + 512)
    say(f"{nodes} node agents for {args.streams} streams (RLIMIT_NOFILE hard limit {hard}, about "
        f"{FILES_PER_STREAM} open files per stream)")

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the cleanup below

    signal.signal(signal.SIGTERM, stop)
    fleet = Fleet(launch, dsec, nodes, max_connections)
    try:
        out = asyncio.run(main_async(args, fleet))
    finally:
        say(f"stopping {len(fleet.procs)} node agents")
        fleet.stop()
    out["node_max_connections"] = max_connections
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
