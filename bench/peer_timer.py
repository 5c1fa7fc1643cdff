#!/usr/bin/python3
"""Times one sandbox lifetime per iteration for bench/create-vs-peers, the same way for every runtime.

Each iteration is timed with time.perf_counter around: a fresh tmpfs + overlay over the shared rootfs (mounted
here through libc, so no helper process is counted), the runtime's whole process running /bin/true in new
namespaces, and the overlay teardown. `ours-process` instead times a whole dsec-bench-create-loop process doing
one iteration (its own backend start-up included). Prints one JSON object: {"mode", "samples_ms"}.
"""
import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
MNT_DETACH = 2


def mount(source, target, fstype, data):
    if libc.mount(source.encode(), target.encode(), fstype.encode(), 0, data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def umount(target):
    if libc.umount2(target.encode(), 0) != 0:
        libc.umount2(target.encode(), MNT_DETACH)


class Overlay:
    """tmpfs (the size-limited writable layer, as ours) + overlay of the rootfs, mounted at `merged`."""

    def __init__(self, scratch, rootfs, merged):
        self.scratch, self.rootfs, self.merged = scratch, rootfs, merged

    def __enter__(self):
        mount("tmpfs", self.scratch, "tmpfs", "size=1g,mode=0755")
        os.mkdir(self.scratch + "/upper")
        os.mkdir(self.scratch + "/work")
        opts = f"lowerdir={self.rootfs},upperdir={self.scratch}/upper,workdir={self.scratch}/work"
        mount("overlay", self.merged, "overlay", opts)
        return self

    def __exit__(self, *exc):
        umount(self.merged)
        umount(self.scratch)


def write_crun_bundle(bundle):
    """`crun spec` defaults, running /bin/true with the same namespaces and limits as ours."""
    os.makedirs(bundle + "/rootfs", exist_ok=True)
    subprocess.run(["crun", "spec"], cwd=bundle, check=True)
    with open(bundle + "/config.json") as f:
        config = json.load(f)
    config["process"]["args"] = ["/bin/true"]
    config["process"]["terminal"] = False
    config["root"] = {"path": "rootfs", "readonly": False}
    config["hostname"] = "peer"
    linux = config.setdefault("linux", {})
    linux["namespaces"] = [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")]
    linux["resources"] = {"memory": {"limit": 512 << 20}, "pids": {"limit": 1024},
                          "cpu": {"quota": 100000, "period": 100000}}
    with open(bundle + "/config.json", "w") as f:
        json.dump(config, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["crun", "bwrap", "ours-process"])
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--loop", help="dsec-bench-create-loop (ours-process)")
    ap.add_argument("--init", default="", help="dsec-sandbox-init (ours-process)")
    args = ap.parse_args()

    scratch = os.path.join(args.work, f"scratch-{args.mode}")
    os.makedirs(scratch, exist_ok=True)
    devnull = subprocess.DEVNULL
    if args.mode == "crun":
        bundle = os.path.join(args.work, "crun-bundle")
        shutil.rmtree(bundle, ignore_errors=True)
        write_crun_bundle(bundle)
        merged = bundle + "/rootfs"
    else:
        merged = os.path.join(args.work, "merged-bwrap")
        os.makedirs(merged, exist_ok=True)

    def one(i):
        if args.mode == "ours-process":
            cmd = [args.loop, "--lower", args.rootfs, "--iterations", "1", "--warmup", "0", "--quiet"]
            if args.init:
                cmd += ["--init", args.init]
            start = time.perf_counter()
            subprocess.run(cmd, stdin=devnull, stdout=devnull, check=True)
            return time.perf_counter() - start
        if args.mode == "crun":
            cmd = ["crun", "run", "--bundle", bundle, f"peer-{os.getpid()}-{i}"]
        else:
            cmd = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup",
                   "--bind", merged, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                   "--hostname", "peer", "--die-with-parent", "/bin/true"]
        start = time.perf_counter()
        with Overlay(scratch, args.rootfs, merged):
            r = subprocess.run(cmd, stdin=devnull, stdout=devnull, stderr=subprocess.PIPE)
        elapsed = time.perf_counter() - start
        if r.returncode != 0:
            sys.exit(f"peer_timer: {args.mode} failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
        return elapsed

    samples = []
    for i in range(args.warmup + args.iterations):
        elapsed = one(i)
        if i >= args.warmup:
            samples.append(round(elapsed * 1000.0, 4))
    print(json.dumps({"mode": args.mode, "samples_ms": samples}))


if __name__ == "__main__":
    main()
