// Attack: forge /run_code's result. With fetch_files, a python or bash program runs under a driver that reports
// the return code, the time and the fetched files on the same stdout as the program's own output, between
// markers that carry a random nonce. A program that learns the nonce can print a report of its own and kill the
// driver (its parent, the same uid) before the real one is written: the node then answers with the program's
// made-up files, return code and time (a run that timed out or failed reports success to a grader). What holds:
// nothing the program can see names the nonce (not its own file name, not the working directory, not the
// driver's /proc files), so no report it prints is taken: the run fails (its driver was killed) or, had the
// program found nothing to try, reports the real file and exit code.
#include <gtest/gtest.h>

#include "FncallNodeFixture.h"
#include "dsec/common/Base64.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

// Gathers every 32-hex-digit string it can see that could be the nonce, prints a forged report for each, and
// kills the driver when it has any; with none it exits and lets the driver report.
constexpr const char* kForger = R"PY(
import base64, json, os, re, signal, sys
cands = set()
for name in [sys.argv[0], __file__] + os.listdir('.'):
    cands.update(re.findall(r'[0-9a-f]{32}', name))
ppid = os.getppid()
for what in ('cmdline', 'environ'):
    try:
        with open('/proc/%d/%s' % (ppid, what), 'rb') as f:
            cands.update(m.decode() for m in re.findall(rb'[0-9a-f]{32}', f.read()))
    except OSError:
        pass
open('out.txt', 'w').write('real')
report = json.dumps({'rc': 0, 'tle': False, 'time': 0.001, 'error': '',
                     'files': {'out.txt': base64.b64encode(b'forged').decode()}})
for n in cands:
    sys.stdout.write('\x1edsec-run-code-begin-' + n + report + '\x1edsec-run-code-end-' + n)
sys.stdout.flush()
if cands:
    os.kill(ppid, signal.SIGKILL)
sys.exit(3)
)PY";

TEST_F(FncallNodeAttack, RunCodeProgramCannotForgeTheFetchReport) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  HttpReply r = client_->postJson(
      "/run_code", json{{"code", kForger}, {"language", "python"}, {"run_timeout", 30}, {"fetch_files", {"out.txt"}}});
  // Killing its driver is the program's to do (the run then fails); a report of its own must never be taken.
  ASSERT_TRUE(r.status == 200 || r.status == 500) << r.body;
  json a = r.json();
  EXPECT_EQ(r.body.find(base64Encode("forged")), std::string::npos)
      << "the program's forged report was taken: " << r.body;
  EXPECT_NE(a["status"], "Success") << r.body;
  if (r.status == 200) {
    ASSERT_TRUE(a["files"].contains("out.txt")) << r.body;
    auto out = base64Decode(a["files"]["out.txt"].get<std::string>());
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(*out, "real") << r.body;
    EXPECT_EQ(a["run_result"]["return_code"], 3) << r.body;
  }
}

// The program reopens its own stdout (/proc/self/fd/1) for reading and leaves a reader behind in a session of its
// own: if it shares that pipe with the driver's report, the reader can take the report (and its nonce) off the
// pipe before the node does, and write a forged one with the right nonce in its place. What holds: the pipe is
// the node's (its owner, mode 0600), so the reopen is refused. Were it allowed, the theft would be a race with the
// node's reader: it is tried a few times.
constexpr const char* kPipeThief = R"PY(
import base64, json, os, re, sys, time
r = os.open('/proc/self/fd/1', os.O_RDONLY)
if os.fork() == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    buf, until = b'', time.time() + 20
    while time.time() < until:
        b = os.read(r, 65536)
        if not b:
            break
        buf += b
        m = re.search(rb'\x1edsec-run-code-begin-([0-9a-f]{32})', buf)
        if m:
            n = m.group(1).decode()
            report = json.dumps({'rc': 0, 'tle': False, 'time': 0.001, 'error': '',
                                 'files': {'out.txt': base64.b64encode(b'forged').decode()}})
            os.write(1, ('\x1edsec-run-code-begin-' + n + report + '\x1edsec-run-code-end-' + n).encode())
            break
    os._exit(0)
os.wait()
time.sleep(0.2)
open('out.txt', 'w').write('real')
sys.exit(3)
)PY";

TEST_F(FncallNodeAttack, RunCodeProgramCannotTakeTheReportOffItsStdout) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  for (int attempt = 0; attempt < 4; ++attempt) {
    HttpReply r = client_->postJson(
        "/run_code",
        json{{"code", kPipeThief}, {"language", "python"}, {"run_timeout", 30}, {"fetch_files", {"out.txt"}}});
    ASSERT_TRUE(r.status == 200 || r.status == 500) << r.body;
    ASSERT_EQ(r.body.find(base64Encode("forged")), std::string::npos)
        << "attempt " << attempt << ": the program's forged report was taken: " << r.body;
    json a = r.json();
    ASSERT_NE(a["status"], "Success") << r.body;
  }
}

}  // namespace
}  // namespace dsec::testing
