#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Fault.h"
#include "dsec/common/Process.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

TEST(RunCommand, CapturesOutputAndExitCode) {
  auto r = runCommand({"sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_OK(r);
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_NE(r->output.find("out"), std::string::npos);
  EXPECT_NE(r->output.find("err"), std::string::npos);
}

TEST(RunCommand, CheckedTurnsFailureIntoAnErrorWithOutput) {
  auto r = runCommandChecked({"sh", "-c", "echo broken-thing; exit 1"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("broken-thing"), std::string::npos);
  auto ok = runCommandChecked({"true"});
  ASSERT_OK(ok);
}

TEST(RunCommand, TimeoutKillsTheWholeProcessGroup) {
  testing::TempDir dir;
  std::string marker = dir.path() + "/late";
  CommandOptions options;
  options.timeout_seconds = 0.3;
  auto r = runCommand({"sh", "-c", "(sleep 1; touch " + marker + ") & sleep 30"}, options);
  ASSERT_ERROR(r, ErrorCode::kTimeout);
  ::usleep(1500 * 1000);
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "the background child survived the timeout";
}

TEST(RunCommand, EachLineReachesOnLineAsItComesAndTheOutputIsStillKept) {
  CommandOptions options;
  std::vector<std::string> lines;
  options.on_line = [&lines](std::string_view line) { lines.emplace_back(line); };
  auto r = runCommand({"/bin/sh", "-c", "echo I: one; printf 'two\\n\\nthree'; sleep 0.1; echo ' four'"}, options);
  ASSERT_TRUE(r.ok()) << r.error().toString();
  EXPECT_EQ(lines, (std::vector<std::string>{"I: one", "two", "", "three four"}));
  EXPECT_EQ(r->output, "I: one\ntwo\n\nthree four\n");
}

TEST(RunCommand, MissingProgramIsAnError) { ASSERT_FALSE(runCommand({"/nonexistent/prog"}).ok()); }

TEST(Process, StartTimeAndPidfd) {
  auto t = processStartTime(::getpid());
  ASSERT_OK(t);
  EXPECT_GT(*t, 0u);
  auto fd = pidfdOpen(::getpid());
  ASSERT_OK(fd);
  ASSERT_FALSE(processStartTime(999999999).ok());
  EXPECT_FALSE(findProgram("sh").empty());
  EXPECT_TRUE(findProgram("no-such-program-dsec").empty());
}

TEST(Fault, ArmedPointFailsOthersPass) {
  armFault("step.two");
  EXPECT_OK(checkFault("step.one"));
  auto st = checkFault("step.two");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("step.two"), std::string::npos);
  armFault("");
  EXPECT_OK(checkFault("step.two"));
}

}  // namespace
}  // namespace dsec
