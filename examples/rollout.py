#!/usr/bin/python3
"""An example RL rollout on dsec, through pydsec.aio.

A "policy" proposed candidate patches for a small repository whose unit tests fail. For every candidate we
create a container sandbox from the layered image debian:12+python:3.11+ws-demo:1, apply the patch, run the
repository's tests and turn the result into a reward (the fraction of tests that pass; 0 if the patch does
not apply) with a grader that runs as a stateless function call (`client.call`, the fncall backend). All sandboxes are created concurrently; the table at the end shows each one and the summary line
gives the create latency (client side, call to return) and the wall time.

    /usr/bin/python3 examples/rollout.py [--count 32] [--concurrency 32] [--root /var/lib/dsec] [--fleet default]
                                         [--store DIR]

Needs a running `dsec serve` (its fleet file ~/.dsec/fleets/<fleet>.json, or DSEC_ENDPOINT/DSEC_TOKEN) and the
`dsec` binary ($DSEC_BIN, else PATH) to build the image layers once; later runs reuse them.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

try:
    import pydsec
    import pydsec.aio
except ImportError:  # running from a checkout without `pip install ./pydsec`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pydsec"))
    import pydsec
    import pydsec.aio

BASE = "debian:12"
TOOLKIT = "python:3.11"
WORKSPACE = "ws-demo:1"
IMAGE = f"{BASE}+{TOOLKIT}+{WORKSPACE}"
REPO = "/workspace/repo"
TOOLKIT_CMD = ("apt-get update && apt-get install -y --no-install-recommends python3 patch && apt-get clean && "
               "rm -rf /var/lib/apt/lists/*")

# ---------------------------------------------------------------------------------------------------------
# The workspace: a small repository with two bugs and a unittest suite.
# ---------------------------------------------------------------------------------------------------------
CALC = textwrap.dedent('''\
    """A tiny calculator with bugs, for the dsec rollout demo."""


    def add(a, b):
        return a - b


    def mul(a, b):
        return a * b


    def is_even(n):
        return n % 2 == 1


    def clamp(x, lo, hi):
        return max(lo, min(x, hi))
    ''')

TESTS = textwrap.dedent('''\
    import unittest

    from calc import add, clamp, is_even, mul


    class CalcTest(unittest.TestCase):
        def test_add_positive(self):
            self.assertEqual(add(2, 3), 5)

        def test_add_negative(self):
            self.assertEqual(add(-2, -3), -5)

        def test_add_zero(self):
            self.assertEqual(add(7, 0), 7)

        def test_mul(self):
            self.assertEqual(mul(4, 5), 20)

        def test_mul_zero(self):
            self.assertEqual(mul(4, 0), 0)

        def test_is_even_true(self):
            self.assertTrue(is_even(4))

        def test_is_even_false(self):
            self.assertFalse(is_even(7))

        def test_clamp(self):
            self.assertEqual(clamp(5, 0, 3), 3)
            self.assertEqual(clamp(-1, 0, 3), 0)


    if __name__ == "__main__":
        unittest.main()
    ''')
N_TESTS = 8


@dataclass
class Candidate:
    name: str
    diff: str
    expected_reward: float  # what a correct platform must report for it


def _diff(new_calc: str) -> str:
    return "".join(difflib.unified_diff(CALC.splitlines(keepends=True), new_calc.splitlines(keepends=True),
                                        "a/calc.py", "b/calc.py"))


def make_candidates() -> List[Candidate]:
    fix_add = CALC.replace("return a - b", "return a + b")
    fix_even = CALC.replace("return n % 2 == 1", "return n % 2 == 0")
    both = fix_add.replace("return n % 2 == 1", "return n % 2 == 0")
    # Written against another version of calc.py (add(x, y)): well-formed, but its context does not match.
    other = CALC.replace("def add(a, b):\n    return a - b", "def add(x, y):\n    return x - y")
    stale = "".join(difflib.unified_diff(other.splitlines(keepends=True),
                                         other.replace("return x - y", "return x + y").splitlines(keepends=True),
                                         "a/calc.py", "b/calc.py"))
    return [
        Candidate("fix-both", _diff(both), 1.0),
        Candidate("fix-add", _diff(fix_add), 6 / N_TESTS),
        Candidate("fix-even", _diff(fix_even), 6 / N_TESTS),
        Candidate("abs-add+even", _diff(both.replace("return a + b", "return abs(a) + abs(b)")), 7 / N_TESTS),
        Candidate("off-by-one", _diff(CALC.replace("return a - b", "return a + b + 1")), 3 / N_TESTS),
        Candidate("comment-only", _diff(CALC.replace('"""\n', '"""\n# TODO: fix add\n', 1)), 4 / N_TESTS),
        Candidate("syntax-error", _diff(CALC.replace("return a - b", "return a +")), 0.0),
        Candidate("stale-context", stale, 0.0),
    ]


# ---------------------------------------------------------------------------------------------------------
# The image: built once with the dsec CLI, then reused.
# ---------------------------------------------------------------------------------------------------------
def find_dsec() -> str:
    candidates = [os.environ.get("DSEC_BIN"), shutil.which("dsec")]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates += [os.path.join(here, "..", d, "cli", "dsec") for d in ("build", "build-release")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise SystemExit("rollout: cannot find the dsec binary: set DSEC_BIN or put dsec on PATH")


def make_workspace_dir(parent: str) -> str:
    root = os.path.join(parent, "ws")
    repo = os.path.join(root, "workspace", "repo")
    os.makedirs(repo)
    for path in (root, os.path.join(root, "workspace"), repo):
        os.chmod(path, 0o755)
    with open(os.path.join(repo, "calc.py"), "w") as f:
        f.write(CALC)
    with open(os.path.join(repo, "test_calc.py"), "w") as f:
        f.write(TESTS)
    git = ["git", "-C", repo, "-c", "user.name=dsec demo", "-c", "user.email=demo@dsec.invalid",
           "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "calc.py", "test_calc.py"], ["commit", "-q", "-m", "calc with a failing test"]):
        subprocess.run(git + args, check=True, stdout=subprocess.DEVNULL)
    return root


def store_layers(store: str) -> set:
    """NAME:VERSION of every layer in the shared layer store at `store`."""
    out = subprocess.run([find_dsec(), "layer", "ls", "--store", store, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"rollout: cannot list the shared store {store}: {out.stderr.strip()}")
    return {f"{m['name']}:{m['version']}" for m in json.loads(out.stdout)["layers"]}


def ensure_image(client: pydsec.Client, root: str, store: Optional[str] = None) -> Tuple[List[str], List[str]]:
    """Make sure the three layers exist: in the node's store, or with `store`, in the shared layer store (built in
    `root` and pushed). Returns (built, reused)."""
    if store:
        return ensure_image_in_store(root, store)
    have = {f"{m.get('name')}:{m.get('version')}" for m in client.layers()}
    wanted = [
        (BASE, ["--debootstrap", "bookworm"]),
        (TOOLKIT, ["--on", BASE, "--run", TOOLKIT_CMD]),
        (WORKSPACE, None),  # --from-dir, made below
    ]
    built, reused = [], []
    dsec = None
    for layer, args in wanted:
        if layer in have:
            reused.append(layer)
            continue
        dsec = dsec or find_dsec()
        with tempfile.TemporaryDirectory(prefix="dsec-rollout-") as tmp:
            if args is None:
                args = ["--from-dir", make_workspace_dir(tmp)]
            cmd = [dsec, "layer", "build", layer, *args, "--root", root]
            print(f"rollout: building layer {layer}: {' '.join(cmd[1:])}", flush=True)
            t0 = time.monotonic()
            proc = subprocess.run(cmd)
        if proc.returncode != 0:
            # Another rollout may have built it meanwhile (409 conflict): accept it if it is there now.
            now = {f"{m.get('name')}:{m.get('version')}" for m in client.layers()}
            if layer not in now:
                raise SystemExit(f"rollout: building layer {layer} failed (exit {proc.returncode})")
        print(f"rollout: layer {layer} ready in {time.monotonic() - t0:.1f} s", flush=True)
        built.append(layer)
    if built:
        seen = {f"{m.get('name')}:{m.get('version')}" for m in client.layers()}
        missing = [layer for layer, _ in wanted if layer not in seen]
        if missing:
            raise SystemExit(f"rollout: the node does not see {', '.join(missing)} after building them into {root}: "
                             "is --root the root that `dsec serve` uses?")
    return built, reused


def ensure_image_in_store(root: str, store: str) -> Tuple[List[str], List[str]]:
    """The three layers in the shared store: pushed from `root` when built there already, else built there and
    pushed (`--store`). The node reads them on demand; it needs no copy of its own."""
    dsec = find_dsec()
    wanted = [(BASE, ["--debootstrap", "bookworm"]), (TOOLKIT, ["--on", BASE, "--run", TOOLKIT_CMD]), (WORKSPACE, None)]
    in_store = store_layers(store)
    built, reused = [], []
    for layer, args in wanted:
        if layer in in_store:
            reused.append(layer)
            continue
        name, version = layer.split(":")
        if os.path.exists(os.path.join(root, "layers", name, version, "manifest.json")):
            cmd = [dsec, "layer", "push", layer, "--root", root, "--store", store]
        else:
            with tempfile.TemporaryDirectory(prefix="dsec-rollout-") as tmp:
                if args is None:
                    args = ["--from-dir", make_workspace_dir(tmp)]
                cmd = [dsec, "layer", "build", layer, *args, "--root", root, "--store", store]
                print(f"rollout: building layer {layer} into the shared store: {' '.join(cmd[1:])}", flush=True)
                if subprocess.run(cmd).returncode != 0:
                    raise SystemExit(f"rollout: building layer {layer} failed")
                built.append(layer)
                continue
        print(f"rollout: pushing layer {layer} to the shared store {store}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"rollout: pushing layer {layer} failed")
        built.append(layer)
    return built, reused


def default_root(fleet: Optional[str]) -> str:
    """$DSEC_ROOT, else the root recorded in the fleet file by `dsec serve`, else /var/lib/dsec."""
    if os.environ.get("DSEC_ROOT"):
        return os.environ["DSEC_ROOT"]
    try:
        from pydsec._config import fleet_file_path

        with open(fleet_file_path(fleet or os.environ.get("DSEC_FLEET") or "default")) as f:
            root = json.load(f).get("root")
        if isinstance(root, str) and root:
            return root
    except (OSError, ValueError, ImportError):
        pass
    return "/var/lib/dsec"


# ---------------------------------------------------------------------------------------------------------
# One rollout step per sandbox.
# ---------------------------------------------------------------------------------------------------------
# The grader is reward code: stateless, so it runs as a function call (a warm fncall worker, a fresh process
# per call, in the node's default image debian:12+python:3.11) and not inside the sandbox whose tests the
# policy's patch could have rigged. It reads the `python3 -m unittest -v` log on stdin and prints
# "passed total"; a suite that does not import counts as 0 passed.
GRADER = r"""
import re, sys
log = sys.stdin.read()
line = re.compile(r"^(test\w+) \(.*\)\s*(?:\n.*?)?\.\.\. (ok|FAIL|ERROR|skipped|expected failure|"
                  r"unexpected success)", re.M)
ran = re.search(r"^Ran (\d+) tests? in", log, re.M)
passed = sum(1 for m in line.finditer(log) if m.group(2) == "ok")
print(passed, max(N_TESTS, int(ran.group(1)) if ran else 0))
""".replace("N_TESTS", str(N_TESTS))


async def grade(client: pydsec.aio.Client, test_log: str) -> Tuple[int, int]:
    """(passed, total) of a test log, computed by GRADER as a function call."""
    for attempt in range(5):
        try:
            r = await client.call(GRADER, stdin=test_log, timeout=30)
            break
        except pydsec.CapacityError as e:  # every warm worker is busy right now: back off as the node asks
            if attempt == 4:
                raise
            await asyncio.sleep(e.retry_after or 1.0)
    if r.exit_code != 0 or r.timed_out:
        raise RuntimeError(f"grader failed: {r!r}")
    passed, total = (int(x) for x in r.stdout.split())
    return passed, total


@dataclass
class Outcome:
    index: int
    candidate: Candidate
    sandbox_id: str = "-"
    create_ms: Optional[float] = None
    applied: bool = False
    passed: int = 0
    total: int = N_TESTS
    reward: float = 0.0
    error: Optional[str] = None
    masked: bool = False  # lost to the platform (pydsec.InfraError): left out of the reward statistics

    @property
    def as_expected(self) -> bool:
        return self.error is None and math.isclose(self.reward, self.candidate.expected_reward, abs_tol=1e-9)


async def create_with_retry(client: pydsec.aio.Client, labels: Dict[str, str]) -> pydsec.aio.Sandbox:
    for attempt in range(5):
        try:
            return await client.create(image=IMAGE, memory="512M", pids=512, timeout=600, labels=labels)
        except pydsec.CapacityError as e:  # the node is full right now: back off as it asks
            if attempt == 4:
                raise
            await asyncio.sleep(e.retry_after or 1.0)
    raise AssertionError("unreachable")


async def rollout_one(client: pydsec.aio.Client, out: Outcome, run_id: str, sem: asyncio.Semaphore) -> Outcome:
    async with sem:
        sb = None
        try:
            t0 = time.perf_counter()
            sb = await create_with_retry(client, {"app": "rollout", "rollout": run_id,
                                                  "candidate": out.candidate.name})
            out.create_ms = (time.perf_counter() - t0) * 1000
            out.sandbox_id = sb.id
            await sb.write_file("/tmp/candidate.patch", out.candidate.diff)
            patch = await sb.exec(["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch",
                                   "-i", "/tmp/candidate.patch"], cwd=REPO, timeout=30)
            if patch.exit_code not in (0, 1) or patch.timed_out:  # 2 = patch itself is in trouble
                raise RuntimeError(f"patch failed: {patch!r}")
            out.applied = patch.exit_code == 0
            if out.applied:
                tests = await sb.exec(["python3", "-m", "unittest", "-v"], cwd=REPO, timeout=120,
                                      env={"PYTHONDONTWRITEBYTECODE": "1"})
                if tests.timed_out or tests.exit_code not in (0, 1):
                    raise RuntimeError(f"test run failed: {tests!r}")
                out.passed, out.total = await grade(client, tests.stderr + tests.stdout)
                out.reward = out.passed / out.total
        except pydsec.InfraError as e:  # the platform lost this rollout: mask it, never score it 0
            out.masked = True
            out.error = f"masked ({type(e).__name__}): {e}"
        except Exception as e:  # reported in the table; the run exits non-zero
            out.error = f"{type(e).__name__}: {e}"
        finally:
            if sb is not None:
                try:
                    await asyncio.shield(sb.destroy())
                except Exception as e:
                    out.error = out.error or f"destroy failed: {e}"
    return out


def percentile(values: List[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


async def run_rollout(client: pydsec.aio.Client, count: int, concurrency: int) -> Tuple[List[Outcome], float, List[str]]:
    candidates = make_candidates()
    run_id = uuid.uuid4().hex[:12]
    sem = asyncio.Semaphore(concurrency)
    outcomes = [Outcome(i, candidates[i % len(candidates)]) for i in range(count)]
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(rollout_one(client, o, run_id, sem) for o in outcomes))
    finally:
        wall = time.perf_counter() - t0
        # Nothing may be left behind, whatever happened above.
        leftovers = await client.list(labels={"rollout": run_id})
        for sb in leftovers:
            await sb.destroy()
    return outcomes, wall, [sb.id for sb in leftovers]


def print_table(outcomes: List[Outcome]) -> None:
    header = f"{'#':>3}  {'sandbox':<22} {'candidate':<14} {'applied':<8} {'tests':>6} {'reward':>7} {'create ms':>10}"
    print(header)
    print("-" * len(header))
    for o in outcomes:
        tests = f"{o.passed}/{o.total}" if o.applied else "-"
        create = f"{o.create_ms:.1f}" if o.create_ms is not None else "-"
        flag = "" if o.as_expected else f"  !! expected {o.candidate.expected_reward:.3f}"
        print(f"{o.index:>3}  {o.sandbox_id:<22} {o.candidate.name:<14} {'yes' if o.applied else 'no':<8} "
              f"{tests:>6} {o.reward:>7.3f} {create:>10}{flag}")
        if o.error:
            print(f"     error: {o.error}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=32, help="number of sandboxes (default 32)")
    ap.add_argument("--concurrency", type=int, default=32, help="sandboxes in flight at once (default 32)")
    ap.add_argument("--root", default=None,
                    help="dsec root to build layers in: the one `dsec serve` uses (default $DSEC_ROOT, else the "
                         "root in the fleet file, else /var/lib/dsec)")
    ap.add_argument("--fleet", default=None, help="fleet name (default $DSEC_FLEET or 'default')")
    ap.add_argument("--store", default=os.environ.get("DSEC_STORE"),
                    help="a shared layer store (docs/layer-store.md): the layers are built in --root and pushed "
                         "there, and the fleet's nodes (started with --store) read them on demand (default $DSEC_STORE)")
    args = ap.parse_args()
    if args.count < 1 or args.concurrency < 1:
        ap.error("--count and --concurrency must be >= 1")
    if args.root is None:
        args.root = default_root(args.fleet)

    with pydsec.Client(fleet=args.fleet) as sync_client:
        health = sync_client.health()
        print(f"rollout: fleet {health.get('fleet')} at {sync_client.endpoint}, node {health.get('node')}")
        t0 = time.monotonic()
        built, reused = ensure_image(sync_client, args.root, args.store)
        print(f"rollout: image {IMAGE} ready in {time.monotonic() - t0:.1f} s "
              f"(built: {', '.join(built) or 'none'}; reused: {', '.join(reused) or 'none'})", flush=True)

    async def go():
        # pydsec.aio's own asyncio transport: no thread per request; at most max_in_flight requests at once.
        async with pydsec.aio.Client(fleet=args.fleet, max_in_flight=max(64, 4 * args.concurrency)) as client:
            return await run_rollout(client, args.count, args.concurrency)

    outcomes, wall, leftovers = asyncio.run(go())
    print_table(outcomes)
    creates = [o.create_ms for o in outcomes if o.create_ms is not None]
    scored = [o for o in outcomes if not o.masked]
    mean_reward = sum(o.reward for o in scored) / len(scored) if scored else float("nan")
    masked = len(outcomes) - len(scored)
    print(f"rollout: {len(outcomes)} sandboxes ({masked} masked as lost to the platform), mean reward {mean_reward:.3f} "
          f"over the rest, create p50 {percentile(creates, 50):.1f} "
          f"ms p99 {percentile(creates, 99):.1f} ms, wall {wall:.2f} s")
    failed = [o for o in outcomes if o.error is not None]
    wrong = [o for o in outcomes if o.error is None and not o.as_expected]
    if leftovers:
        print(f"rollout: ERROR: {len(leftovers)} sandboxes were left behind and destroyed now: {leftovers}")
    if failed:
        print(f"rollout: ERROR: {len(failed)} sandboxes failed unexpectedly")
    if wrong:
        print(f"rollout: ERROR: {len(wrong)} rewards differ from what the candidates must score")
    return 1 if failed or wrong or leftovers else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except pydsec.DsecError as e:
        print(f"rollout: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
