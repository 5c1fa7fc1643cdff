// Attack: a call asks for a small memory limit and uses far more. Through a real node (POST /v1/call), a
// call with memory "64M" allocates 400 MiB, in the interpreter and in tmpfs. It must not succeed: the call
// is OOM-killed (and reported as such) or refused; the same node still runs a call within its limit. This
// once succeeded: the node's worker wrapper dropped setMemoryLimit and the worker only logged it.
#include <gtest/gtest.h>

#include "FncallNodeFixture.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

TEST_F(FncallNodeAttack, CallCannotAllocateBeyondItsMemoryLimit) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  const std::string attack =
      "import sys\n"
      "print('start', flush=True)\n"
      "hog = bytearray(400 << 20)  # every page written (zero-filled)\n"
      "for i in range(0, len(hog), 4096): hog[i] = 1\n"
      "print('allocated', len(hog) >> 20, 'MiB')\n";
  for (int round = 0; round < 2; ++round) {  // the second time on a worker that already ran a call
    HttpReply reply = post({{"code", attack}, {"memory", "64M"}, {"timeout", 60}});
    if (reply.status != 200) {  // refused: acceptable, as long as it says why
      EXPECT_GE(reply.status, 400) << reply.body;
      EXPECT_FALSE(reply.errorCode().empty()) << reply.body;
      continue;
    }
    json r = reply.json();
    EXPECT_EQ(r["stdout"].get<std::string>().find("allocated"), std::string::npos)
        << "a 64M call held 400 MiB: " << r.dump();
    EXPECT_NE(r["exit_code"], 0) << r.dump();
    EXPECT_EQ(r["oom_killed"], true) << "the kill must be reported as an OOM kill: " << r.dump();
    EXPECT_EQ(r["timed_out"], false) << r.dump();
  }
  // Within its limit the same kind of call runs.
  json ok = call({{"code", "hog = bytearray(100 << 20)\nprint('allocated', len(hog) >> 20)"},
                  {"memory", "256M"},
                  {"timeout", 60}});
  EXPECT_EQ(ok["stdout"], "allocated 100\n") << ok.dump();
  EXPECT_EQ(ok["oom_killed"], false) << ok.dump();
}

TEST_F(FncallNodeAttack, CallCannotFillTmpfsBeyondItsMemoryLimit) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  // tmpfs pages are the call's memory too: 400 MiB written to /dev/shm and then kept must not fit in 64M.
  const std::string attack =
      "import os\n"
      "chunk = b'x' * (1 << 20)\n"
      "with open('/dev/shm/hog', 'wb') as f:\n"
      "    for _ in range(400): f.write(chunk)\n"
      "print('stored', os.stat('/dev/shm/hog').st_size >> 20, 'MiB')\n";
  HttpReply reply = post({{"code", attack}, {"memory", "64M"}, {"timeout", 60}});
  if (reply.status == 200) {
    json r = reply.json();
    EXPECT_EQ(r["stdout"].get<std::string>().find("stored 400"), std::string::npos)
        << "a 64M call kept 400 MiB in tmpfs: " << r.dump();
    EXPECT_NE(r["exit_code"], 0) << r.dump();
  } else {
    EXPECT_GE(reply.status, 400) << reply.body;
  }
  json ok = call({{"code", "print('fine')"}, {"memory", "64M"}});
  EXPECT_EQ(ok["stdout"], "fine\n") << ok.dump();
}

}  // namespace
}  // namespace dsec::testing
