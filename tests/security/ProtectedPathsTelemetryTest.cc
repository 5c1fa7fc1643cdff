// Refused writes to protected paths are recorded (the file watch: backends/container/src/FileWatch.h): each denied
// attack shows up in the sandbox's violations as kind "file" with the path inside the sandbox it aimed at, and
// nothing else does (denied writes elsewhere, dsec's own file API, sandboxes without protection). Events arrive
// asynchronously: every check polls with a deadline, and "nothing recorded" is checked once a later marker refusal
// of the same sandbox has come through (events of one sandbox are delivered in order).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <string>

#include "../backends/container/ContainerTestSupport.h"
#include "FileWatch.h"

namespace dsec::testing {
namespace {

using backends::Violation;
using backends::ViolationKind;

constexpr double kDeadlineSeconds = 30;

std::vector<Violation> fileViolations(backends::Sandbox& sb) {
  std::vector<Violation> out;
  auto all = sb.violations();
  EXPECT_TRUE(all.ok()) << all.error().message();
  if (!all.ok()) return out;
  for (auto& v : *all) {
    if (v.kind == ViolationKind::kFile) out.push_back(v);
  }
  return out;
}

// Polls until a file violation with this target is recorded at index >= from; returns it.
std::optional<Violation> waitForTarget(backends::Sandbox& sb, const std::string& target, size_t from = 0) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kDeadlineSeconds);
  while (std::chrono::steady_clock::now() < deadline) {
    auto list = fileViolations(sb);
    for (size_t i = from; i < list.size(); ++i) {
      if (list[i].target == target) return list[i];
    }
    usleep(20000);
  }
  return std::nullopt;
}

class ProtectedPathsTelemetry : public ContainerTest {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped()) return;
    auto probe = backends::FileWatch::start();
    if (!probe.ok()) GTEST_SKIP() << "the file watch cannot run here: " << probe.error().message();
  }

  // A workspace whose protected directory has one file per attack, protected with /bin.
  backends::Sandbox& protectedSandbox() {
    auto& sb = create();
    auto r = sh(sb,
                "mkdir -p /workspace/tests/tree && cd /workspace/tests && "
                "for f in overwrite mv-over symlinked hardlinked chmod relative tree/leaf marker flood; do "
                "echo original > $f.py; done");
    EXPECT_EQ(r.exit_code, 0) << r.stderr_data;
    EXPECT_OK(sb.setProtectedPaths({"/workspace/tests", "/bin"}));
    return sb;
  }
  // A refused write to a protected file, and its record: what later "nothing recorded" checks wait for.
  void marker(backends::Sandbox& sb, const std::string& file = "/workspace/tests/marker.py") {
    const size_t before = fileViolations(sb).size();
    EXPECT_NE(sh(sb, "echo evil > " + file).exit_code, 0);
    EXPECT_TRUE(waitForTarget(sb, file, before)) << "the marker refusal was not recorded";
  }
};

TEST_F(ProtectedPathsTelemetry, EveryDeniedAttackIsRecordedWithItsProtectedTarget) {
  auto& sb = protectedSandbox();
  const uint64_t total_before = backends::violationsTotal(ViolationKind::kFile);
  struct Attack {
    std::string command;
    std::string target;     // the path inside the sandbox the record names
    std::string call_hint;  // part of the detail ("" = any call)
  };
  const Attack attacks[] = {
      {"echo evil > /workspace/tests/overwrite.py", "/workspace/tests/overwrite.py", "open"},
      {"rm -rf /workspace/tests/tree", "/workspace/tests/tree/leaf.py", ""},
      {"echo evil > /tmp/f && mv -f /tmp/f /workspace/tests/mv-over.py", "/workspace/tests/mv-over.py", ""},
      {"ln -s /workspace/tests/symlinked.py /tmp/sym && echo evil > /tmp/sym", "/workspace/tests/symlinked.py", ""},
      {"ln /workspace/tests/hardlinked.py /workspace/late-hardlink", "/workspace/tests/hardlinked.py", "link"},
      {"chmod 777 /workspace/tests/chmod.py", "/workspace/tests/chmod.py", "chmod"},
      {"touch /workspace/tests/new.py", "/workspace/tests/new.py", ""},
      {"mkdir /workspace/tests/sub", "/workspace/tests/sub", "mkdir"},
      {"cp /bin/busybox /tmp/bb && mv /tmp/bb /bin/busybox", "/bin/busybox", ""},
      {"mv /workspace /workspace-old", "/workspace", "rename"},
  };
  for (const auto& attack : attacks) {
    SCOPED_TRACE(attack.command);
    const size_t before = fileViolations(sb).size();
    EXPECT_NE(sh(sb, attack.command).exit_code, 0);
    auto v = waitForTarget(sb, attack.target, before);
    ASSERT_TRUE(v) << "no file violation for " << attack.target;
    EXPECT_NE(v->detail.find(attack.call_hint), std::string::npos) << v->detail;
    EXPECT_NE(v->detail.find(attack.target == "/workspace" ? "parent of protected path" : "(protected path)"),
              std::string::npos)
        << v->detail;
    EXPECT_GT(v->time_unix, 0);
  }
  // A path relative to the caller's working directory, resolved while the caller lives.
  ASSERT_EQ(sh(sb,
               "cd /workspace/tests && (echo evil > relative.py; while [ ! -e /tmp/seen ]; do usleep 10000; done) "
               ">/dev/null 2>&1 & echo started")
                .stdout_data,
            "started\n");
  EXPECT_TRUE(waitForTarget(sb, "/workspace/tests/relative.py"));
  sh(sb, "touch /tmp/seen");
  for (const auto& v : fileViolations(sb)) {
    EXPECT_TRUE(v.target == "/workspace" || v.target == "/bin/busybox" || v.target.rfind("/workspace/tests/", 0) == 0)
        << v.target << ": " << v.detail;
  }
  // The metric counts them (other tests of this process may add more, never fewer).
  EXPECT_GE(backends::violationsTotal(ViolationKind::kFile) - total_before, std::size(attacks) + 1);
}

TEST_F(ProtectedPathsTelemetry, DeniedWritesElsewhereAndTheFileApiAreNotRecorded) {
  auto& sb = protectedSandbox();
  // Refused, but not by protection and not on a protected path.
  EXPECT_NE(sh(sb, "echo x > /proc/sys/kernel/hostname").exit_code, 0);
  EXPECT_NE(sh(sb, "mount -t tmpfs none /workspace/tests").exit_code, 0);  // seccomp: never reaches the tracepoints
  EXPECT_NE(sh(sb, "umount /workspace/tests").exit_code, 0);
  // dsec's own file API writes and removes protected files.
  {
    auto fd = sb.openForWrite("/workspace/tests/overwrite.py", 0644);
    ASSERT_OK(fd);
    ASSERT_EQ(::write(fd->get(), "new\n", 4), 4);
  }
  ASSERT_OK(sb.remove("/workspace/tests/chmod.py", false));
  marker(sb);
  auto list = fileViolations(sb);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].target, "/workspace/tests/marker.py");
  EXPECT_EQ(sh(sb, "cat /workspace/tests/overwrite.py").stdout_data, "new\n");
}

TEST_F(ProtectedPathsTelemetry, SandboxesWithoutProtectionRecordNothing) {
  auto& watched = protectedSandbox();
  auto& plain = create();
  EXPECT_NE(sh(plain, "echo x > /proc/sys/kernel/hostname").exit_code, 0);
  EXPECT_NE(sh(plain, "mkdir -p /workspace/tests && chmod 777 /proc/sys/kernel/hostname").exit_code, 0);
  marker(watched);
  EXPECT_TRUE(fileViolations(plain).empty());
  // Protection lifted: the sandbox is no longer watched (and its writes succeed).
  ASSERT_OK(watched.setProtectedPaths({}));
  EXPECT_EQ(sh(watched, "echo evil > /workspace/tests/overwrite.py").exit_code, 0);
  ASSERT_OK(watched.setProtectedPaths({"/workspace/tests"}));
  marker(watched, "/workspace/tests/flood.py");
  EXPECT_EQ(fileViolations(watched).size(), 2u);
}

TEST_F(ProtectedPathsTelemetry, AnAdoptedSandboxIsWatchedAgain) {
  auto spec = makeSpec();
  spec.protected_paths = {"/etc"};
  nlohmann::json state;
  {
    auto sb = backend_->create(spec);
    ASSERT_OK(sb);
    state = (*sb)->persistentState();
  }  // the handle goes (the sandbox lives on), then the agent's backend
  backend_.reset();
  backend_ = newBackend();
  auto adopted = backend_->adopt(nlohmann::json::parse(state.dump()));
  ASSERT_OK(adopted);
  marker(**adopted, "/etc/passwd");
  ASSERT_OK((*adopted)->destroy());
}

TEST_F(ProtectedPathsTelemetry, ALoopOfDeniedWritesIsRateBound) {
  auto& sb = protectedSandbox();
  constexpr int kTries = 5000;
  const auto started = std::chrono::steady_clock::now();
  auto r = sh(sb,
              "i=0; while [ $i -lt " + std::to_string(kTries) +
                  " ]; do echo x 2>/dev/null > /workspace/tests/flood.py; i=$((i+1)); done; echo $i",
              120);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(r.stdout_data, std::to_string(kTries) + "\n");
  // At most 64 events per sandbox per second leave the kernel (DSEC_FW_EVENTS_PER_SECOND).
  ASSERT_TRUE(waitForTarget(sb, "/workspace/tests/flood.py"));
  const auto recorded = fileViolations(sb).size();
  EXPECT_LE(recorded, 64 * (static_cast<size_t>(std::ceil(elapsed)) + 2));
  // The next refusal that gets through says how many were left out.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kDeadlineSeconds);
  bool counted = false;  // the refusals a window left out are counted on the first event of a later one
  while (!counted && std::chrono::steady_clock::now() < deadline) {
    sh(sb, "echo x > /workspace/tests/marker.py");
    for (const auto& v : fileViolations(sb)) counted = counted || v.detail.find("not reported") != std::string::npos;
  }
  if (recorded < static_cast<size_t>(kTries)) {
    EXPECT_TRUE(counted) << "no count of the refusals left out";
  }
}

}  // namespace
}  // namespace dsec::testing
