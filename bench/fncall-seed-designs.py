#!/usr/bin/python3
"""What a fresh hash seed per function call would cost: calls per second of two process designs for running
`print(sum(range(1000)))` on this host, measured back to back under the same load.

  fork    one warm interpreter per worker (the fncall zygote: standard library preloaded) forks a child
          per call; every child shares the zygote's hash seed.
  fresh   a pool of pre-started single-use interpreters, refilled in the background: each call runs in
          an interpreter started for it alone, so each call has a seed of its own. `--preload` makes
          each of them import the zygote's modules before it waits for its call (what a call finds
          loaded in a zygote); without it a call pays only for the interpreter's start.

No sandboxes and no HTTP: this isolates the cost of the process design (docs/fncall.md, "hash seed").
Usage: bench/fncall-seed-designs.py [--calls N] [--concurrency C] [--pool K] [--python PATH] [--preload]
"""
import argparse
import os
import queue
import resource
import struct
import sys
import threading
import time

CODE = b"print(sum(range(1000)))"
EXPECTED = b"499500\n"
PRELOAD = ("array bisect collections contextlib copy decimal fractions functools heapq itertools json math "
           "operator random re string struct weakref zlib")

# A zygote: reads a 4-byte length and code on stdin, forks a child that runs it with stdout on a pipe,
# answers with a 4-byte length and the child's output.
ZYGOTE = r"""
import gc, os, struct, sys, types, builtins, importlib
for m in %r.split():
    importlib.import_module(m)
gc.collect(); gc.freeze()
inp, out = sys.stdin.buffer.raw, sys.stdout.buffer.raw
def read(n):
    b = b''
    while len(b) < n:
        c = inp.read(n - len(b))
        if not c: sys.exit(0)
        b += c
    return b
while True:
    code = read(struct.unpack('>I', read(4))[0])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1); os.close(r); os.close(w)
        main = types.ModuleType('__main__'); main.__dict__['__builtins__'] = builtins
        sys.stdout = open(1, 'w', closefd=False)
        exec(compile(code, '<string>', 'exec'), main.__dict__)
        sys.stdout.flush(); os._exit(0)
    os.close(w)
    data = b''
    while True:
        c = os.read(r, 65536)
        if not c: break
        data += c
    os.close(r); os.waitpid(pid, 0)
    out.write(struct.pack('>I', len(data)) + data)
""" % PRELOAD

# A single-use interpreter: optionally preloads, then reads its code on stdin until EOF and runs it.
FRESH = r"""
import sys, importlib
for m in %r.split():
    importlib.import_module(m)
code = sys.stdin.buffer.read()
exec(compile(code, '<string>', 'exec'), {'__name__': '__main__'})
"""


def spawn(python, script):
    """Starts `python -I -S -B -c script` with pipes; returns (pid, stdin write end, stdout read end)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
               (os.POSIX_SPAWN_CLOSE, in_w), (os.POSIX_SPAWN_CLOSE, out_r)]
    pid = os.posix_spawn(python, [python, "-I", "-S", "-B", "-c", script], {}, file_actions=actions)
    os.close(in_r)
    os.close(out_w)
    return pid, in_w, out_r


def read_all(fd):
    parts = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            return b"".join(parts)
        parts.append(b)


def read_exact(fd, n):
    b = b""
    while len(b) < n:
        c = os.read(fd, n - len(b))
        if not c:
            raise EOFError
        b += c
    return b


def run_fork(args):
    zygotes = queue.Queue()
    procs = []
    for _ in range(args.concurrency):
        p = spawn(args.python, ZYGOTE)
        procs.append(p)
        zygotes.put(p)
    for p in procs:  # warm: one call each
        os.write(p[1], struct.pack(">I", len(CODE)) + CODE)
        read_exact(p[2], struct.unpack(">I", read_exact(p[2], 4))[0])

    def one_call():
        p = zygotes.get()
        os.write(p[1], struct.pack(">I", len(CODE)) + CODE)
        data = read_exact(p[2], struct.unpack(">I", read_exact(p[2], 4))[0])
        zygotes.put(p)
        return data

    result = drive(args, one_call, [p[0] for p in procs])
    for pid, w, r in procs:
        os.close(w)
        os.close(r)
        os.waitpid(pid, 0)
    return result


def run_fresh(args):
    script = FRESH % (PRELOAD if args.preload else "")
    ready = queue.Queue()
    stop = threading.Event()
    wanted = threading.Semaphore(args.pool)

    def refill():
        while not stop.is_set():
            if not wanted.acquire(timeout=0.1):
                continue
            ready.put(spawn(args.python, script))

    refillers = [threading.Thread(target=refill, daemon=True) for _ in range(2)]
    for t in refillers:
        t.start()
    while ready.qsize() < args.pool:
        time.sleep(0.01)

    def one_call():
        pid, w, r = ready.get()
        wanted.release()
        os.write(w, CODE)
        os.close(w)
        data = read_all(r)
        os.close(r)
        os.waitpid(pid, 0)
        return data

    result = drive(args, one_call)
    stop.set()
    for t in refillers:
        t.join()
    while not ready.empty():
        pid, w, r = ready.get()
        os.close(w)
        os.close(r)
        os.waitpid(pid, 0)
    return result


def process_cpu(pids):
    """CPU seconds of live processes and of their reaped children (/proc/PID/stat utime..cstime)."""
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def drive(args, one_call, live=()):
    left = [args.calls]
    lock = threading.Lock()
    failures = [0]

    def client():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            if one_call() != EXPECTED:
                with lock:
                    failures[0] += 1

    before = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    live_before = process_cpu(live)
    start = time.monotonic()
    clients = [threading.Thread(target=client) for _ in range(args.concurrency)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    cpu = [(a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime) for a, b in zip(after, before)]
    cpu[0] += process_cpu(live) - live_before
    return {"calls_per_second": round(args.calls / wall, 1), "failures": failures[0],
            "children_cpu_ms_per_call": round(cpu[0] * 1000 / args.calls, 2),
            "driver_cpu_ms_per_call": round(cpu[1] * 1000 / args.calls, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pool", type=int, default=8, help="pre-started interpreters kept ready (fresh)")
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--preload", action="store_true", help="fresh interpreters import the zygote's modules")
    parser.add_argument("design", choices=("fork", "fresh"))
    args = parser.parse_args()
    result = run_fork(args) if args.design == "fork" else run_fresh(args)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print({"design": args.design, "preload": args.preload, "calls": args.calls, "concurrency": args.concurrency,
           "load_avg_1m": load, **result})
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
