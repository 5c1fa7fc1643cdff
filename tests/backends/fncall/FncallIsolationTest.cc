// Isolation and limits: nothing one call does is seen by the next on the same worker; timeout, memory,
// output cap, fork bombs, no network, calls attacking their worker.
#include <unistd.h>

#include <algorithm>

#include "FncallTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// Prints the zygote's pid (the call's parent): the same value in two calls means the same worker.
constexpr const char* kWorkerPid = "import os; print('worker', os.getppid())\n";

std::string workerOf(const backends::ExecResult& r) {
  for (const auto& line : split(r.stdout_data, '\n')) {
    if (startsWith(line, "worker ")) return line;
  }
  return "?";
}

class FncallIsolationTest : public FncallTest {
 protected:
  void SetUp() override {
    FncallTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    options_.max_workers = 1;  // every call on the same worker
    startService();
  }
};

TEST_F(FncallIsolationTest, NothingACallLeavesIsSeenByTheNext) {
  auto first = py(std::string(kWorkerPid) + R"(
import builtins, ctypes, os, subprocess, sys, time
open('in-cwd.txt', 'w').write('x')
open('/tmp/in-tmp.txt', 'w').write('x')
os.mkdir('/tmp/dir'); open('/tmp/dir/f', 'w').write('x'); open('/tmp/.hidden', 'w').write('x')
open('/dev/shm/in-shm', 'w').write('x')
builtins.LEAKED = 1
sys.modules['json'].LEAKED = 1
os.environ['LEAKED'] = '1'
subprocess.Popen(['sleep', '1000'], start_new_session=True)
if os.fork() == 0:  # a daemon that escaped its session and its parent
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
libc = ctypes.CDLL(None)
print('shm', libc.shmget(1234, 4096, 0o1600))
mq = libc.mq_open(b'/leak', 0o100 | 0o2, 0o600, None)
print('mq', mq >= 0)
print('done')
)");
  EXPECT_NE(first.stdout_data.find("done"), std::string::npos) << first.stdout_data << first.stderr_data;
  EXPECT_NE(first.stdout_data.find("mq True"), std::string::npos) << first.stdout_data << first.stderr_data;
  auto second = py(std::string(kWorkerPid) + R"(
import builtins, json, os
print('cwd', sorted(os.listdir('.')))
print('tmp', sorted(os.listdir('/tmp')))
print('shm', sorted(os.listdir('/dev/shm')))
print('mqueue', sorted(os.listdir('/dev/mqueue')))
print('builtins', hasattr(builtins, 'LEAKED'), hasattr(json, 'LEAKED'))
print('env', 'LEAKED' in os.environ)
others = []
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) != os.getpid():
        try:
            uid = [l for l in open('/proc/%s/status' % p) if l.startswith('Uid:')][0].split()[1]
        except OSError:
            continue
        if uid == '65534':
            others.append(p)
print('procs', others)
print('sysv', open('/proc/sysvipc/shm').read().count('\n') - 1)
print('calls', sorted(os.listdir('/work')))
)");
  EXPECT_EQ(workerOf(first), workerOf(second)) << "both calls must run on the same worker";
  const std::string& out = second.stdout_data;
  EXPECT_NE(out.find("cwd []"), std::string::npos) << out << second.stderr_data;
  EXPECT_NE(out.find("tmp []"), std::string::npos) << out;
  EXPECT_NE(out.find("shm []"), std::string::npos) << out;
  EXPECT_NE(out.find("mqueue []"), std::string::npos) << out;
  EXPECT_NE(out.find("builtins False False"), std::string::npos) << out;
  EXPECT_NE(out.find("env False"), std::string::npos) << out;
  EXPECT_NE(out.find("procs []"), std::string::npos) << out;
  EXPECT_NE(out.find("sysv 0"), std::string::npos) << out;
  auto calls = split(out.substr(out.find("calls ")), '\n')[0];
  EXPECT_EQ(std::count(calls.begin(), calls.end(), ','), 0) << "only this call's dir in /work: " << calls;
}

TEST_F(FncallIsolationTest, RootIsReadOnlyAndZygoteIsOutOfReach) {
  auto r = py(std::string(kWorkerPid) + R"(
import os, signal
for path in ('/x', '/usr/lib/python3.11/os.py', '/work/x', '/etc/passwd'):
    try:
        open(path, 'a').write('x'); print('wrote', path)
    except OSError as e:
        print('denied', path, e.errno)
for pid in (os.getppid(), 1):
    try:
        os.kill(pid, signal.SIGKILL); print('killed', pid)
    except OSError as e:
        print('cannot kill', pid, e.errno)
try:
    open('/proc/%d/mem' % os.getppid(), 'rb').read(1); print('read zygote memory')
except OSError as e:
    print('zygote memory closed')
os.kill(-1, signal.SIGKILL)  # every process the call may signal (its own, not itself)
print('still here')
)");
  EXPECT_EQ(r.stdout_data.find("wrote"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("killed"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("zygote memory closed"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("still here"), std::string::npos) << r.stdout_data << r.stderr_data;
  auto next = py(kWorkerPid);
  EXPECT_EQ(workerOf(next), workerOf(r)) << "the worker survived its call";
  EXPECT_EQ(service().stats().workers_replaced, 0u);
}

TEST_F(FncallIsolationTest, TimeoutKillsTheCallAndEverythingItStarted) {
  auto req = python(std::string(kWorkerPid) +
                    "import subprocess, sys\nsys.stdout.flush()\n"
                    "subprocess.Popen(['sleep', '1000'])\nwhile True: pass");
  req.timeout_seconds = 1;
  const double start = monotonicSeconds();
  auto r = run(req);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_LT(monotonicSeconds() - start, 30);
  EXPECT_NE(r.stdout_data.find("worker"), std::string::npos) << "output before the timeout is kept";
  auto next = py(std::string(kWorkerPid) + "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))");
  EXPECT_EQ(workerOf(next), workerOf(r));
  EXPECT_NE(next.stdout_data.find("\n3\n"), std::string::npos)
      << "init, zygote and the call only: " << next.stdout_data;
  // A shell call too.
  auto sh = bash("sleep 100 & sleep 100");
  sh.timeout_seconds = 1;
  EXPECT_TRUE(run(sh).timed_out);
}

TEST_F(FncallIsolationTest, MemoryLimitKillsTheCallNotTheWorker) {
  auto req =
      python(std::string(kWorkerPid) + "import sys; sys.stdout.flush()\nb = bytearray(300 << 20)\nprint('survived')");
  req.memory_bytes = 64 << 20;
  auto r = run(req);
  EXPECT_TRUE(r.oom_killed) << r.stdout_data << r.stderr_data;
  EXPECT_EQ(r.signal, 9);
  EXPECT_EQ(r.stdout_data.find("survived"), std::string::npos);
  auto next = py(std::string(kWorkerPid) + "b = bytearray(100 << 20); print('fine')");  // default 256M
  EXPECT_NE(next.stdout_data.find("fine"), std::string::npos) << next.stderr_data;
  EXPECT_FALSE(next.oom_killed);
  EXPECT_EQ(workerOf(next), workerOf(r));
  // Memory in tmpfs counts too.
  auto fill = bash("dd if=/dev/zero of=/dev/shm/fill bs=1M count=200 2>&1; echo exit $?");
  fill.memory_bytes = 48 << 20;
  auto f = run(fill);
  EXPECT_TRUE(f.oom_killed || f.stdout_data.find("exit 0") == std::string::npos) << f.stdout_data;
  EXPECT_EQ(py("print('ok')").stdout_data, "ok\n");
}

TEST_F(FncallIsolationTest, OutputIsCappedAndTheRestDrained) {
  auto req = python("import sys\nsys.stdout.write('o' * 3000000)\nsys.stderr.write('e' * 3000000)\nprint('end')");
  req.output_cap = 1000;
  auto r = run(req);
  EXPECT_EQ(r.stdout_data, std::string(1000, 'o'));
  EXPECT_EQ(r.stderr_data, std::string(1000, 'e'));
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.exit_code, 0);
  auto small = py("print('x' * 10)");
  EXPECT_FALSE(small.truncated);
  EXPECT_EQ(small.stdout_data, std::string(10, 'x') + "\n");
}

TEST_F(FncallIsolationTest, ForkBombIsContained) {
  auto req = python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n");
  req.timeout_seconds = 3;
  auto r = run(req);
  EXPECT_TRUE(r.timed_out);
  auto sh = bash("f() { f | f & }; f; sleep 3");
  sh.timeout_seconds = 3;
  run(sh);
  auto next = py("import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))");
  EXPECT_EQ(next.stdout_data, "3\n") << next.stderr_data;
  EXPECT_LE(options_.worker_pids, 64);
}

TEST_F(FncallIsolationTest, NoNetwork) {
  auto r = py(R"(
import socket
print(sorted(n for _, n in socket.if_nameindex()))
for host in ('1.1.1.1', '10.0.0.1'):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, 53)); print('connected', host)
    except OSError as e:
        print('refused', host)
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()
c = socket.create_connection(srv.getsockname(), timeout=2); print('loopback ok')
)");
  EXPECT_NE(r.stdout_data.find("['lo']"), std::string::npos) << r.stdout_data << r.stderr_data;
  EXPECT_EQ(r.stdout_data.find("connected"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("loopback ok"), std::string::npos) << r.stdout_data << r.stderr_data;
}

TEST_F(FncallIsolationTest, GlobalsAndRandomStateAreFresh) {
  auto a = py("import random\nx = 1\nprint(random.random())");
  auto b = py("import random\nprint('x' in globals(), random.random())");
  EXPECT_NE(b.stdout_data.find("False"), std::string::npos) << b.stdout_data << b.stderr_data;
  EXPECT_NE(a.stdout_data, split(b.stdout_data, ' ').back()) << "each call has its own random state";
}

}  // namespace
}  // namespace dsec::testing
