# The fncall zygote: runs as root (reduced capabilities) inside a worker sandbox whose root is read-only, and
# forks one child per call that drops to uid 65534. Embedded into the library at build time (ZygoteScript.cc)
# and started as `python3 -B -c <this> <language>`: nothing needs to be in the image but python3.
#
# Protocol over the process's stdin/stdout (all integers big-endian; fixed binary headers: encoding and parsing
# JSON per call was a measurable part of the zygote's work):
#   zygote -> agent, once: a 4-byte length and the JSON {"ready": true, "pid": n}
#   agent -> zygote, per call: REQUEST (timeout, output cap, code length, stdin length, number of files), then
#       per file FILE_ENTRY (path length, data length) and the path, then the code, stdin and file data
#   zygote -> agent, per call: ANSWER (exit code, signal, timed out, truncated, clean, duration, stdout length,
#       stderr length), then stdout and stderr
# EOF on stdin ends the zygote.
#
# Every page the zygote writes after a fork is a write-protect fault, and every page the child writes a copy:
# the per-call path below is kept short in Python work and in syscalls (see docs/fncall.md, "what a call costs").
import gc
import json
import os
import select
import shutil
import signal
import struct
import sys
import time

LANGUAGE = sys.argv[1] if len(sys.argv) > 1 else "python"
UID = 65534
CHUNK = 65536
# Every call runs in this directory: made empty (and owned by UID) before each call, removed after it. A
# constant path keeps the calls' environment constant, so it is set once here instead of in every child
# (rebuilding os.environ in a child cost ~0.5 ms of copy-on-write faults).
CALL_DIR = "/work/call"
CALL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": CALL_DIR, "PWD": CALL_DIR, "TMPDIR": "/tmp",
            "LANG": "C.UTF-8"}
os.environ.clear()
os.environ.update(CALL_ENV)

# The protocol fds move out of 0/1 (non-inheritable copies) so a call can never reach them; 0/1 become
# /dev/null. stderr stays: zygote failures show in the agent's log.
PROTO_IN = os.dup(0)
PROTO_OUT = os.dup(1)
DEVNULL = os.open("/dev/null", os.O_RDWR)
os.dup2(DEVNULL, 0)
os.dup2(DEVNULL, 1)

if LANGUAGE == "python":
    # The standard library a typical snippet uses, imported once so children start with it loaded.
    import builtins
    import importlib
    import io  # noqa: F401
    import types

    # Every page the zygote has mapped makes each fork dearer (~0.1 ms of CPU per MB here): modules that
    # pull in big libraries or many dependencies (hashlib/OpenSSL, typing, dataclasses, unittest, pathlib,
    # subprocess, ctypes) and the less common bigger ones (datetime, statistics, csv, base64) are left for
    # the calls that need them. Not threading (nor queue, which imports it): its fork handler rebuilds its
    # locks and thread table in every child, ~110 copied pages (~0.3 ms) per call; a call imports it itself.
    for _name in (
        "array", "bisect", "collections", "contextlib", "copy", "decimal", "fractions", "functools", "heapq",
        "itertools", "json", "math", "operator", "random", "re", "string", "struct", "weakref", "zlib",
    ):
        try:
            importlib.import_module(_name)
        except ImportError:
            pass

SHELL = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
# What every call has had a chance to write: wiped after each call (the root is read-only).
SCRATCH_DIRS = ("/tmp", "/dev/shm")
POLL_HUP = select.POLLHUP | select.POLLERR
REQUEST = struct.Struct(">dQQQI")
FILE_ENTRY = struct.Struct(">IQ")
ANSWER = struct.Struct(">iiBBBdQQ")

# stdout and stderr of the calls: two pipes made once. The zygote keeps both ends, so a read never sees EOF:
# a call's output is complete once the call and everything it started are dead (checked before the last
# drain), and the drain empties the pipes, so nothing of one call is left in them for the next.
OUT_R, OUT_W = os.pipe()
ERR_R, ERR_W = os.pipe()
os.set_blocking(OUT_R, False)
os.set_blocking(ERR_R, False)
# One poller for all calls: the output pipes stay registered, each call adds its pidfd (and stdin pipe).
POLLER = select.poll()
POLLER.register(OUT_R, select.POLLIN)
POLLER.register(ERR_R, select.POLLIN)


class Input:
    """Buffered reads of the protocol stream (a whole request usually arrives in one read)."""

    def __init__(self):
        self.buf = b""
        self.pos = 0

    def read(self, n):
        """n bytes; EOFError when the agent closed the stream first."""
        buf, pos = self.buf, self.pos
        if len(buf) - pos >= n:
            self.pos = pos + n
            return buf[pos:pos + n]
        parts = [buf[pos:]]
        have = len(buf) - pos
        while have < n:
            b = os.read(PROTO_IN, max(CHUNK, n - have))
            if not b:
                raise EOFError
            parts.append(b)
            have += len(b)
        data = b"".join(parts)
        self.buf, self.pos = data, n
        return data[:n]


def write_all(fd, data):
    n = os.write(fd, data)
    if n < len(data):  # a large answer: the agent reads as we write
        view = memoryview(data)[n:]
        while view:
            view = view[os.write(fd, view):]


def send_json(header):
    h = json.dumps(header).encode()
    write_all(PROTO_OUT, struct.pack(">I", len(h)) + h)


def others():
    """Processes of the sandbox other than its init and this zygote (all of them left by calls)."""
    me = str(os.getpid())
    return [p for p in os.listdir("/proc") if p.isdigit() and p != "1" and p != me]


def kill_leftovers():
    """Kills every process a call left (as root inside: calls run as UID and cannot shield themselves)."""
    deadline = None
    while True:
        try:
            # Everything in the pid namespace but init and ourselves; ESRCH: there is nothing (not even a
            # zombie) left, which is the common case and costs this one syscall.
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # some process we may not signal: only /proc can tell whether it is ours
        if not others():  # killed ones are reaped by init
            return True
        if deadline is None:
            deadline = time.monotonic() + 5
        elif time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def sysv_leftovers():
    found = []
    for kind in ("shm", "msg", "sem"):
        try:
            fd = os.open("/proc/sysvipc/" + kind, os.O_RDONLY)
        except OSError:
            continue
        try:
            text = os.read(fd, CHUNK)
            if text.count(b"\n") > 1:  # a header line and at least one object: read the rest
                parts = [text]
                while text:
                    text = os.read(fd, CHUNK)
                    parts.append(text)
                for line in b"".join(parts).splitlines()[1:]:
                    fields = line.split()
                    if len(fields) > 1:
                        found.append((kind, int(fields[1])))
        finally:
            os.close(fd)
    return found


def remove_sysv(found):
    """SysV IPC objects outlive processes; only their owner (UID) may remove them, so a helper does it."""
    pid = os.fork()
    if pid == 0:
        try:
            import ctypes  # only here: loading it in the zygote would make every fork dearer

            libc = ctypes.CDLL(None)
            os.setgroups([])
            os.setresgid(UID, UID, UID)
            os.setresuid(UID, UID, UID)
            for kind, ident in found:
                if kind == "shm":
                    libc.shmctl(ident, 0, None)
                elif kind == "msg":
                    libc.msgctl(ident, 0, None)
                else:
                    libc.semctl(ident, 0, 0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return not sysv_leftovers()


def wipe(path):
    """Empties a directory; returns whether it had anything in it."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return False
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
        except FileNotFoundError:
            pass
    return bool(entries)


def clean_after():
    """Removes everything the call left, with every process of it dead (kill_leftovers returned True)."""
    clean = True
    try:
        os.rmdir(CALL_DIR)  # the common case: the call wrote nothing in its directory
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(CALL_DIR, ignore_errors=True)
        clean = not os.path.lexists(CALL_DIR)
    # No process of the call is alive, so a directory found empty stays empty: only those that had
    # something are checked again.
    for d in SCRATCH_DIRS:
        if wipe(d) and os.listdir(d):
            clean = False
    try:
        for name in os.listdir("/dev/mqueue"):
            os.unlink("/dev/mqueue/" + name)
    except FileNotFoundError:
        pass
    found = sysv_leftovers()
    if found:
        clean = remove_sysv(found) and clean
    return clean


def run_python(code, code_obj):
    # The zygote's objects are never collected by the child: without this a collection in the call would walk
    # (and so copy) every page holding them.
    gc.freeze()
    # A fresh __main__ for the snippet, as `python3 -c` would have; fresh random state (the zygote's was
    # seeded once and every child would otherwise repeat it).
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    # Imports from the call's directory need a fresh finder for '' (the cwd changed). Not
    # importlib.invalidate_caches(): on 3.11 it imports importlib.metadata, ~10 ms per call.
    sys.path_importer_cache.pop("", None)
    # (random reseeds itself in every forked child: os.register_at_fork in random.py)
    rc = 0
    try:
        exec(code_obj if code_obj is not None else compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            rc = 0
        elif isinstance(e.code, int):
            rc = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            rc = 1
    except BaseException as e:  # noqa: B036 - report like the interpreter does, without our frame
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        rc = 1
    threading = sys.modules.get("threading")  # only there when the call imported it
    if threading is not None:
        try:
            threading._shutdown()  # non-daemon threads finish first, as at interpreter exit
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            rc = 120
    os._exit(rc)


def child(code, code_obj, stdin_r, files):
    try:
        os.setsid()
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)  # the OOM killer takes the call, not the zygote
        os.write(fd, b"1000")
        os.close(fd)
        if stdin_r is not None:
            os.dup2(stdin_r, 0)
        os.dup2(OUT_W, 1)
        os.dup2(ERR_W, 2)
        os.closerange(3, 65536)  # one close_range(2)
        os.setgroups([])
        os.setresgid(UID, UID, UID)
        os.setresuid(UID, UID, UID)
        os.chdir(CALL_DIR)
        for path, data in files:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        # The environment is the zygote's, which is CALL_ENV.
        if LANGUAGE == "bash":
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execv(SHELL, [SHELL, "-c", code.decode("utf-8", "surrogateescape")])
        run_python(code, code_obj)
    except BaseException as e:  # noqa: B036
        try:
            os.write(2, ("fncall: cannot start the call: %r\n" % (e,)).encode())
        finally:
            os._exit(126)


class Output:
    """One call's stdout or stderr: keeps at most cap bytes, drops (and notes) the rest."""

    def __init__(self, cap):
        self.parts = []
        self.room = cap
        self.truncated = False

    def pump(self, fd):
        """Reads what the pipe holds now (one read); returns False once it is empty."""
        try:
            b = os.read(fd, CHUNK)
        except BlockingIOError:
            return False
        n = len(b)
        if n <= self.room:
            self.parts.append(b)
            self.room -= n
        else:
            if self.room > 0:
                self.parts.append(b[:self.room])
                self.room = 0
            self.truncated = True
        return n > 0


def run_call(timeout, cap, code, stdin_data, files):
    os.mkdir(CALL_DIR, 0o700)
    os.chown(CALL_DIR, UID, UID)
    stdin_r = stdin_w = None
    if stdin_data:
        stdin_r, stdin_w = os.pipe()
    # Compiled here, before the fork: in the child every page the compiler touches would be a copy-on-write
    # fault (it was the dearest part of a small call). A compile error is left for the child to raise.
    code_obj = None
    if LANGUAGE == "python":
        try:
            code_obj = compile(code, "<string>", "exec")
        except BaseException:  # noqa: B036
            code_obj = None
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(code, code_obj, stdin_r, files)
    pidfd = os.pidfd_open(pid)
    clean = True
    status = 0
    deadline = start + timeout
    out = Output(cap)
    err = Output(cap)
    poller = POLLER
    poller.register(pidfd, select.POLLIN)
    stdin_off = 0
    if stdin_w is not None:
        os.close(stdin_r)
        os.set_blocking(stdin_w, False)
        poller.register(stdin_w, select.POLLOUT)
    timed_out = False
    while True:
        wait_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1) if not timed_out else 1000
        events = poller.poll(wait_ms)
        if not timed_out and time.monotonic() >= deadline:
            timed_out = True
            try:
                os.kill(-1, signal.SIGKILL)  # the call and everything it started
            except ProcessLookupError:
                pass
        exited = False
        for fd, ev in events:
            if fd == pidfd:
                exited = True
            elif fd == OUT_R:
                out.pump(fd)
            elif fd == ERR_R:
                err.pump(fd)
            else:  # stdin_w
                try:
                    stdin_off += os.write(stdin_w, stdin_data[stdin_off:stdin_off + CHUNK])
                    done = stdin_off >= len(stdin_data)
                except (BrokenPipeError, BlockingIOError) as e:
                    done = isinstance(e, BrokenPipeError)
                if done or ev & POLL_HUP:
                    poller.unregister(stdin_w)
                    os.close(stdin_w)
                    stdin_w = None
        if exited:
            break
    poller.unregister(pidfd)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    if stdin_w is not None:
        poller.unregister(stdin_w)
        os.close(stdin_w)
    # Leftover processes may still write: kill them, then what the pipes hold is all the call's output.
    clean = kill_leftovers()
    # Drained until poll finds both empty (a bounded number of rounds when a writer could not be killed:
    # the worker is replaced anyway).
    for _ in range(1 << 30 if clean else 16):
        events = poller.poll(0)
        if not events:
            break
        for fd, _ev in events:
            (out if fd == OUT_R else err).pump(fd)
    duration = time.monotonic() - start
    clean = clean_after() and clean
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code_ = 128 + sig
    else:
        sig = 0
        code_ = os.WEXITSTATUS(status)
    if timed_out:
        code_ = 137
    o = b"".join(out.parts)
    e = b"".join(err.parts)
    write_all(PROTO_OUT, b"".join((ANSWER.pack(code_, sig, timed_out, out.truncated or err.truncated, clean, duration,
                                               len(o), len(e)), o, e)))


def main():
    # A call that failed half way may have left its dir (a zygote restarted in the same sandbox never is, but
    # be safe): start from empty scratch.
    for d in SCRATCH_DIRS + ("/work",):
        wipe(d)
    send_json({"ready": True, "pid": os.getpid()})
    inp = Input()
    while True:
        try:
            raw = inp.read(REQUEST.size)
        except EOFError:
            return  # the agent is done with this worker
        timeout, cap, code_n, stdin_n, nfiles = REQUEST.unpack(raw)
        sizes = []
        for _ in range(nfiles):
            path_n, data_n = FILE_ENTRY.unpack(inp.read(FILE_ENTRY.size))
            sizes.append((inp.read(path_n), data_n))
        code = inp.read(code_n)
        stdin_data = inp.read(stdin_n)
        files = [(path, inp.read(n)) for path, n in sizes]
        run_call(timeout, cap, code, stdin_data, files)


# Objects loaded so far are never collected or touched by a child's collector (fewer copied pages per fork).
gc.collect()
gc.freeze()
main()
