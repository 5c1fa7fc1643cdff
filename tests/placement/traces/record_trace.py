#!/usr/bin/python3
"""Records a memory-pressure trace on this machine for the density controller's replay tests.

A memory hog runs in its own memory-limited cgroup (v1 memory controller, or v2 where the host is pure v2)
that is also a cgroup2 directory, so its PSI is its own and not the host's. The hog goes through phases
(calm, anonymous fill, page-cache thrashing, an OOM kill of a child, release) while this script samples
/proc/meminfo, /proc/pressure/{memory,cpu}, the cgroup's memory.pressure, usage, limit and OOM kills every
--interval seconds. Output: one text line per sample (see the header it writes). Needs root.

    sudo /usr/bin/python3 record_trace.py --scenario thrash-oom --limit-mb 256 > thrash-oom.trace
"""
import argparse
import os
import signal
import sys
import time

V1_MEM = "/sys/fs/cgroup/memory"
UNIFIED = "/sys/fs/cgroup/unified"
MB = 1 << 20


def read(path):
    with open(path) as f:
        return f.read()


def psi(text, kind):
    """(avg10, total_usec) of the 'some' or 'full' line of a PSI file."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == kind:
            kv = dict(f.split("=") for f in fields[1:])
            return float(kv["avg10"]), int(kv["total"])
    return 0.0, 0


def meminfo():
    out = {}
    for line in read("/proc/meminfo").splitlines():
        key, rest = line.split(":", 1)
        out[key] = int(rest.split()[0])
    return out


class Cg:
    def __init__(self, name, limit):
        self.pure_v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        if self.pure_v2:
            self.mem = self.psi_dir = os.path.join("/sys/fs/cgroup", name)
            os.mkdir(self.mem)
            with open(os.path.join(self.mem, "memory.max"), "w") as f:
                f.write(str(limit))
        else:
            self.mem = os.path.join(V1_MEM, name)
            os.mkdir(self.mem)
            with open(os.path.join(self.mem, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit))
            self.psi_dir = os.path.join(UNIFIED, name)
            os.mkdir(self.psi_dir)

    def join(self, pid):
        dirs = [self.mem] if self.pure_v2 else [self.mem, self.psi_dir]
        for d in dirs:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    def sample(self):
        if self.pure_v2:
            usage = int(read(os.path.join(self.mem, "memory.current")))
            limit = int(read(os.path.join(self.mem, "memory.max")))
            ev = dict(l.split() for l in read(os.path.join(self.mem, "memory.events")).splitlines())
            ooms = int(ev.get("oom_kill", 0))
            stat = dict(l.split() for l in read(os.path.join(self.mem, "memory.stat")).splitlines())
            inactive_file = int(stat.get("inactive_file", 0))
        else:
            usage = int(read(os.path.join(self.mem, "memory.usage_in_bytes")))
            limit = int(read(os.path.join(self.mem, "memory.limit_in_bytes")))
            oc = dict(l.split() for l in read(os.path.join(self.mem, "memory.oom_control")).splitlines())
            ooms = int(oc.get("oom_kill", 0))
            stat = dict(l.split() for l in read(os.path.join(self.mem, "memory.stat")).splitlines())
            inactive_file = int(stat.get("total_inactive_file", 0))
        # The working set (what kubelet calls it): usage less the inactive file cache, which goes first.
        return usage, limit, max(0, usage - inactive_file), ooms, read(os.path.join(self.psi_dir, "memory.pressure"))

    def remove(self):
        for d in {self.mem, self.psi_dir}:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def hog(cmd_r, limit, workdir):
    """The hog: reads commands ('anon N', 'thrash N', 'stop', 'oom N') from a pipe and runs them."""
    anon = []
    thrash_pid = 0
    path = os.path.join(workdir, "thrash.dat")

    def stop_thrash():
        nonlocal thrash_pid
        if thrash_pid:
            os.kill(thrash_pid, signal.SIGKILL)
            os.waitpid(thrash_pid, 0)
            thrash_pid = 0

    f = os.fdopen(cmd_r)
    for line in f:
        op, arg = (line.split() + ["0"])[:2]
        n = int(arg)
        if op == "anon":
            anon = []
            for _ in range(n):
                anon.append(bytearray(b"\x01" * MB))  # touched pages: really resident
        elif op == "thrash":
            stop_thrash()
            pid = os.fork()
            if pid == 0:
                # Write a file of n MB (its cache is charged to this cgroup), then read it over and over: once
                # it no longer fits under the limit next to the anonymous memory, every pass reclaims and refaults.
                block = b"\x02" * MB
                with open(path, "wb") as out:
                    for _ in range(n):
                        out.write(block)
                while True:
                    with open(path, "rb", buffering=0) as inp:
                        while inp.read(MB):
                            pass
            thrash_pid = pid
        elif op == "stop":
            stop_thrash()
        elif op == "oom":
            pid = os.fork()
            if pid == 0:
                with open("/proc/self/oom_score_adj", "w") as adj:
                    adj.write("1000")  # the victim is this child, not the hog
                hold = []
                while True:
                    hold.append(bytearray(b"\x03" * MB))
            os.waitpid(pid, 0)
        elif op == "exit":
            break
    stop_thrash()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os._exit(0)


SCENARIOS = {
    # (time offset s, command, phase label); sizes in percent of the limit.
    "thrash-oom": [
        (0, "anon 5", "calm"),
        (8, "anon 30", "fill"),
        (14, "anon 55", "fill"),
        (20, "thrash 80", "thrash"),
        (42, "oom", "oom"),
        (48, "stop", "release"),
        (50, "anon 5", "release"),
        (80, None, "end"),
    ],
    "slow-ramp": [
        (0, "anon 5", "calm"),
        (6, "anon 40", "fill"),
        (12, "thrash 50", "thrash-light"),
        (24, "thrash 70", "thrash-medium"),
        (36, "thrash 100", "thrash-heavy"),
        (50, "thrash 50", "thrash-light"),
        (60, "stop", "release"),
        (62, "anon 5", "release"),
        (90, None, "end"),
    ],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    ap.add_argument("--limit-mb", type=int, default=256)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--workdir", default="/var/tmp")
    args = ap.parse_args()
    limit = args.limit_mb * MB
    name = "dsec-trace-%d" % os.getpid()
    workdir = os.path.join(args.workdir, name)
    os.mkdir(workdir)
    cg = Cg(name, limit)
    cmd_r, cmd_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(cmd_w)
        hog(cmd_r, limit, workdir)
    os.close(cmd_r)
    cg.join(pid)
    cmds = os.fdopen(cmd_w, "w", buffering=1)
    out = sys.stdout
    uname = os.uname()
    out.write("# dsec memory-pressure trace: scenario %s, cgroup limit %d MiB, interval %.1f s\n"
              % (args.scenario, args.limit_mb, args.interval))
    out.write("# recorded %s on %s %s (%d CPUs, %s)\n" % (time.strftime("%Y-%m-%d"), uname.sysname, uname.release,
                                                         os.cpu_count(), "cgroup v2" if cg.pure_v2 else "cgroup v1+v2 hybrid"))
    out.write("# t phase mem_total_kb mem_available_kb cg_usage_bytes cg_limit_bytes cg_workingset_bytes cg_oom_kills "
              "cg_some_avg10 cg_full_avg10 cg_some_total_us cg_full_total_us "
              "host_mem_some_avg10 host_mem_full_avg10 host_cpu_some_avg10\n")
    script = SCENARIOS[args.scenario]
    start = time.monotonic()
    step = 0
    phase = script[0][2]
    try:
        tick = 0
        while True:
            now = time.monotonic() - start
            while step < len(script) and script[step][0] <= now:
                _, cmd, phase = script[step]
                if cmd is None:
                    raise StopIteration
                if cmd.split()[0] in ("anon", "thrash"):
                    op, pct = cmd.split()
                    cmd = "%s %d" % (op, limit * int(pct) // 100 // MB)
                cmds.write(cmd + "\n")
                step += 1
            mi = meminfo()
            usage, lim, wset, ooms, cg_psi = cg.sample()
            host_mem = read("/proc/pressure/memory")
            host_cpu = read("/proc/pressure/cpu")
            some, some_total = psi(cg_psi, "some")
            full, full_total = psi(cg_psi, "full")
            out.write("%.1f %s %d %d %d %d %d %d %.2f %.2f %d %d %.2f %.2f %.2f\n" % (
                now, phase, mi["MemTotal"], mi["MemAvailable"], usage, lim, wset, ooms, some, full, some_total,
                full_total, psi(host_mem, "some")[0], psi(host_mem, "full")[0], psi(host_cpu, "some")[0]))
            out.flush()
            tick += 1
            time.sleep(max(0.0, start + tick * args.interval - time.monotonic()))
    except StopIteration:
        pass
    finally:
        try:
            cmds.write("exit\n")
            cmds.close()
        except OSError:
            pass
        time.sleep(0.5)
        for _ in range(100):  # everything left in the cgroup (the hog and its children) goes
            procs = [int(p) for p in read(os.path.join(cg.mem, "cgroup.procs")).split()]
            if not procs:
                break
            for p in procs:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        os.waitpid(pid, 0)
        for f in os.listdir(workdir):
            os.unlink(os.path.join(workdir, f))
        os.rmdir(workdir)
        cg.remove()


if __name__ == "__main__":
    main()
