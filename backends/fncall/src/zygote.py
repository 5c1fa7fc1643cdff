# The fncall zygote, a fork server: runs as root (reduced capabilities) inside a worker sandbox whose root is
# read-only, and forks one child per call that drops to uid 65534. Embedded into the library at build time
# (ZygoteScript.cc) and started as `python3 -B -c <this> <language>`: nothing needs to be in the image but
# python3.
#
# It never holds a call's data. The agent makes three pipes per call and passes the zygote only the child's
# ends: the read end of the request pipe (the child reads its code, files and stdin from it after the fork)
# and the write ends of stdout and stderr (the agent reads them and enforces the output cap). The zygote
# forks, closes its copies, waits for the child (killing everything at the timeout), kills what the call
# left, has everything it wrote removed by a short-lived helper process, and reports the exit status. So no
# byte of any call's code, stdin, files or output is ever in this process's memory, and no later call can
# find one there (every call is forked from it).
#
# Handshake (at start): this process makes a unix socketpair (the control channel), writes to its stdout a
# 4-byte big-endian length and the JSON {"ready": true, "pid": n, "control_fd": fd}; the agent takes its
# own copy of that fd with pidfd_getfd(2) and sends "hello"; the zygote closes its copy of the agent's end,
# answers "ok" and from then on speaks only on the control socket (SOCK_SEQPACKET: one message each way per
# call, big-endian):
#   agent -> zygote: REQUEST (timeout in seconds) with SCM_RIGHTS [request read end, stdout write end,
#       stderr write end]
#   zygote -> agent: ANSWER (exit code, signal, timed out, clean, duration), once the call and everything
#       it started are dead and everything it left is removed
# The request stream the child reads (big-endian): CALL (code length, number of files, flags), per file FILE_ENTRY
# (path length, data length) and the path, then the code, then each file's data; the rest is the call's stdin.
# EOF on the control socket ends the zygote.
#
# Every page the zygote writes after a fork is a write-protect fault, and every page the child writes a copy:
# the per-call path below is kept short in Python work and in syscalls (see docs/fncall.md, "what a call costs").
import _socket
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
    # Each call's code is compiled in its child (the zygote never sees it). The compiler builds some state
    # lazily on first use; built here, it is shared by every child instead of built (and its pages copied)
    # in each: ~160 fewer page faults per call.
    compile("import sys\nx = [i * 2 for i in range(3)]\nprint(sum(x), len('a'), file=sys.stderr)\n", "<warm-up>",
            "exec")

SHELL = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
# Where a call can write (the root is read-only): emptied after every call.
SCRATCH_DIRS = ("/tmp", "/dev/shm", "/dev/mqueue")
SYSV_FILES = ("/proc/sysvipc/shm", "/proc/sysvipc/msg", "/proc/sysvipc/sem")
REQUEST = struct.Struct(">d")
ANSWER = struct.Struct(">iiBBd")
CALL = struct.Struct(">QII")
CALL_FRESH_INTERPRETER = 1  # flag: run the Python code in an interpreter started for this call alone
FILE_ENTRY = struct.Struct(">IQ")
FD_BYTES = struct.Struct("=3i")
CONTROL_ANCILLARY = _socket.CMSG_SPACE(FD_BYTES.size)
DEVNULL = os.open("/dev/null", os.O_RDWR)


def mount_types():
    """Mount point -> file system type, from /proc/self/mountinfo."""
    types_ = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) > 4 and right:
                types_[fields[4]] = right.split()[0]
    return types_


# tmpfs and mqueue count a directory's entries in its size (st_size grows by a fixed amount per entry), so
# "is it empty?" is one stat() that reads no name a call chose. Elsewhere the helper checks (slower, same
# result).
_MOUNTS = mount_types()
SIZE_COUNTS_ENTRIES = {d: _MOUNTS.get(d) in ("tmpfs", "mqueue") for d in SCRATCH_DIRS}
EMPTY_SIZE = {}  # measured at start, with the directories empty
SYSV_EMPTY_BYTES = {}  # length of each /proc/sysvipc file with no object (its header line)


def read_small(path, limit):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


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


def wipe(path):
    """Empties a directory (reads the names in it: only at start, before any call, and in the helper)."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
        except FileNotFoundError:
            pass


def remove_sysv_as_owner():
    """SysV IPC objects outlive processes; only their owner (UID) may remove them. Helper only."""
    import ctypes  # only here: loading it in the zygote would make every fork dearer

    found = []
    for path in SYSV_FILES:
        try:
            with open(path, "rb") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        kind = path.rsplit("/", 1)[1]
        found += [(kind, int(line.split()[1])) for line in lines if len(line.split()) > 1]
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


def clean_in_helper(sysv):
    """Removes what a call left in a forked helper: listing and removing reads names the call chose, which
    must never be in the zygote's memory. The helper's memory dies with it."""
    pid = os.fork()
    if pid == 0:
        try:
            shutil.rmtree(CALL_DIR, ignore_errors=True)
            for d in SCRATCH_DIRS:
                wipe(d)
            if sysv:
                remove_sysv_as_owner()
        except BaseException as e:  # noqa: B036
            os.write(2, ("fncall: cleaning up after a call: %r\n" % (e,)).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def sysv_objects_left():
    for path in SYSV_FILES:
        empty = SYSV_EMPTY_BYTES.get(path)
        if empty is not None:
            text = read_small(path, empty + 1)  # the header, and one byte of an object if there is one
            if text is not None and len(text) > empty:
                return True
    return False


def scratch_dirty():
    """Whether the call left its directory or anything in a scratch directory (reads no names)."""
    try:
        os.rmdir(CALL_DIR)  # the common case: the call wrote nothing in its directory
    except FileNotFoundError:
        pass
    except OSError:
        return True
    for d in SCRATCH_DIRS:
        if not SIZE_COUNTS_ENTRIES[d] or os.stat(d).st_size != EMPTY_SIZE[d]:
            return True
    return False


def clean_after():
    """Removes everything the call left, with every process of it dead (kill_leftovers returned True).
    Returns whether all of it is gone."""
    dirty = scratch_dirty()
    sysv = sysv_objects_left()
    if not dirty and not sysv:
        return True
    clean_in_helper(sysv)
    if os.path.lexists(CALL_DIR) or sysv_objects_left():
        return False
    for d in SCRATCH_DIRS:
        if SIZE_COUNTS_ENTRIES[d]:
            if os.stat(d).st_size != EMPTY_SIZE[d]:
                return False
        elif os.listdir(d):  # the worker is replaced when this finds anything: no later call forks from us
            return False
    return True


def run_python(code):
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
        exec(compile(code, "<string>", "exec"), main.__dict__)
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


# Run by a fresh interpreter as `python3 -B -c FRESH_BOOTSTRAP`: the call's code is on fd 3 (a memfd: code may
# be longer than one argument can be). Runs it as `python3 -c code` would, in __main__ with sys.argv ['-c'],
# and reports an uncaught exception without this frame.
FRESH_BOOTSTRAP = """
def _run():
    import sys
    with open(3, "rb") as f:
        source = f.read()
    main = sys.modules["__main__"].__dict__
    del main["_run"]
    try:
        exec(compile(source, "<string>", "exec"), main)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)
_run()
"""


def exec_fresh_python(code):
    """Replaces the child with an interpreter of its own: a hash seed and state no other call shares."""
    fd = os.memfd_create("call", 0)  # not close-on-exec: the new interpreter reads it as fd 3
    view = memoryview(code)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    if fd != 3:
        os.dup2(fd, 3)
        os.close(fd)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    os.execv(sys.executable, [sys.executable, "-B", "-c", FRESH_BOOTSTRAP])


def read_exact(n):
    """n bytes of the request (fd 0); never more, so what follows the request stays for the call's stdin."""
    parts = []
    while n:
        b = os.read(0, min(n, 1 << 20))
        if not b:
            raise EOFError("the request ended early")
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def read_request():
    """Reads the request from fd 0, writes its files into the working directory, returns the code."""
    code_n, nfiles, flags = CALL.unpack(read_exact(CALL.size))
    entries = []
    for _ in range(nfiles):
        path_n, data_n = FILE_ENTRY.unpack(read_exact(FILE_ENTRY.size))
        entries.append((read_exact(path_n), data_n))
    code = read_exact(code_n)
    for path, n in entries:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            while n:
                b = os.read(0, min(n, 1 << 20))
                if not b:
                    raise EOFError("the request ended early")
                n -= len(b)
                while b:
                    b = b[os.write(fd, b):]
        finally:
            os.close(fd)
    return code, flags


def child(request_fd, out_fd, err_fd):
    try:
        os.setsid()
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)  # the OOM killer takes the call, not the zygote
        os.write(fd, b"1000")
        os.close(fd)
        os.dup2(request_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.closerange(3, 65536)  # one close_range(2): the control socket too
        os.setgroups([])
        os.setresgid(UID, UID, UID)
        os.setresuid(UID, UID, UID)
        os.chdir(CALL_DIR)
        code, flags = read_request()
        # The environment is the zygote's, which is CALL_ENV.
        if LANGUAGE == "bash":
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execv(SHELL, [SHELL, "-c", code.decode("utf-8", "surrogateescape")])
        if flags & CALL_FRESH_INTERPRETER:
            exec_fresh_python(code)
        run_python(code)
    except BaseException as e:  # noqa: B036
        try:
            os.write(2, ("fncall: cannot start the call: %r\n" % (e,)).encode())
        finally:
            os._exit(126)


POLLER = select.poll()


def run_call(timeout, request_fd, out_fd, err_fd):
    os.mkdir(CALL_DIR, 0o700)
    os.chown(CALL_DIR, UID, UID)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(request_fd, out_fd, err_fd)
    # From here only the child (and what it starts) holds the call's pipes.
    os.close(request_fd)
    os.close(out_fd)
    os.close(err_fd)
    pidfd = os.pidfd_open(pid)
    POLLER.register(pidfd, select.POLLIN)
    deadline = start + timeout
    timed_out = False
    while not POLLER.poll(max(0, int((deadline - time.monotonic()) * 1000) + 1) if not timed_out else 1000):
        if not timed_out and time.monotonic() >= deadline:
            timed_out = True
            try:
                os.kill(-1, signal.SIGKILL)  # the call and everything it started
            except ProcessLookupError:
                pass
    POLLER.unregister(pidfd)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    duration = time.monotonic() - start
    # With every process of the call dead, the output pipes have no writer left: the agent has all of it.
    clean = kill_leftovers()
    clean = clean_after() and clean
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code = 128 + sig
    else:
        sig = 0
        code = os.WEXITSTATUS(status)
    if timed_out:
        code = 137
    return ANSWER.pack(code, sig, timed_out, clean, duration)


def receive(control):
    """The next call's timeout and pipe ends; None when the agent closed the channel."""
    data, ancillary, flags, _ = control.recvmsg(REQUEST.size, CONTROL_ANCILLARY)
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += struct.unpack("=%di" % (usable // 4), payload[:usable])
    if not data and not fds:
        return None
    if len(data) != REQUEST.size or len(fds) != 3 or flags & (_socket.MSG_CTRUNC | _socket.MSG_TRUNC):
        for fd in fds:
            os.close(fd)
        raise RuntimeError("bad request from the agent")
    return REQUEST.unpack(data)[0], fds


def handshake():
    """Hands the agent its end of the control socket (see the top); returns ours."""
    control, agent_end = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    ready = json.dumps({"ready": True, "pid": os.getpid(), "control_fd": agent_end.fileno()}).encode()
    data = struct.pack(">I", len(ready)) + ready
    while data:
        data = data[os.write(1, data):]
    if control.recv(16) != b"hello":
        raise RuntimeError("no hello from the agent")
    agent_end.close()  # only the agent holds that end now
    control.send(b"ok")
    # The startup pipes are done with: 0 and 1 become /dev/null. stderr stays (failures show in the agent's
    # log); a call's child puts its own pipes on all three.
    os.dup2(DEVNULL, 0)
    os.dup2(DEVNULL, 1)
    return control


def main():
    # Start from empty scratch (a zygote restarted in the same sandbox never is, but be safe), and measure
    # what "empty" looks like.
    for d in SCRATCH_DIRS + ("/work",):
        wipe(d)
    for d in SCRATCH_DIRS:
        EMPTY_SIZE[d] = os.stat(d).st_size
    for path in SYSV_FILES:
        text = read_small(path, CHUNK)
        if text is not None:
            SYSV_EMPTY_BYTES[path] = len(text.splitlines(keepends=True)[0]) if text else 0
    control = handshake()
    # Objects loaded so far are never collected or touched by a child's collector (fewer copied pages per fork).
    gc.collect()
    gc.freeze()
    while True:
        request = receive(control)
        if request is None:
            return  # the agent is done with this worker
        timeout, (request_fd, out_fd, err_fd) = request
        control.send(run_call(timeout, request_fd, out_fd, err_fd))


main()
